//! The store against examples, and against a reference model (an ordered multiset of
//! rows) over random inserts, retractions, probes, expiry, TTL and snapshots.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use proptest::prelude::*;

use super::*;
use crate::pages::PAGE_ENTRIES;

fn row<'a>(row: &'a [u8], key: &'a [u8]) -> RowRef<'a> {
    RowRef { row, row_hash: sluice_types::key::hash(row), key, key_hash: sluice_types::key::hash(key) }
}

/// The rows of `key` with their weights, sorted.
fn weights(store: &Store, key: &[u8]) -> Vec<(Vec<u8>, i64)> {
    let mut slots = Vec::new();
    store.probe(key, sluice_types::key::hash(key), &mut slots);
    let mut rows: Vec<_> = slots
        .iter()
        .map(|&s| {
            let slot = s as u32;
            (store.row(slot).to_vec(), store.slots[slot as usize].weight)
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_slot_and_a_keys_entry_keep_their_sizes() {
    // The module documentation and BENCHMARKS.md count on these.
    assert_eq!(std::mem::size_of::<Slot>(), 48);
    assert_eq!(std::mem::size_of::<Head>(), 40);
}

#[test]
fn equal_rows_accumulate_and_leave_at_zero() {
    let mut store = Store::default();
    store.apply(&row(b"a1", b"a"), 1, 0, NEVER).expect("apply");
    store.apply(&row(b"a2", b"a"), 2, 0, NEVER).expect("apply");
    store.apply(&row(b"a1", b"a"), 1, 0, NEVER).expect("apply");
    store.apply(&row(b"b1", b"b"), 1, 0, NEVER).expect("apply");
    assert_eq!(store.len(), 3);
    assert_eq!(store.bytes(), 6);
    assert_eq!(weights(&store, b"a"), [(b"a1".to_vec(), 2), (b"a2".to_vec(), 2)]);
    store.apply(&row(b"a1", b"a"), -2, 0, NEVER).expect("apply");
    assert_eq!(weights(&store, b"a"), [(b"a2".to_vec(), 2)]);
    store.apply(&row(b"a2", b"a"), -2, 0, NEVER).expect("apply");
    assert!(weights(&store, b"a").is_empty());
    assert_eq!(store.len(), 1);
    assert_eq!(store.bytes(), 2);
    // Slots are reused; the key went with its last row.
    store.apply(&row(b"c1", b"c"), 1, 0, NEVER).expect("apply");
    assert_eq!(store.slots.len(), 3);
    assert_eq!(store.by_key.len(), 2);
    assert_eq!(weights(&store, b"c"), [(b"c1".to_vec(), 1)]);
    assert_eq!(weights(&store, b"b"), [(b"b1".to_vec(), 1)]);
}

#[test]
fn slots_beyond_the_first_page_link_find_and_free_as_the_first_pages_do() {
    let mut store = Store::default();
    let rows: Vec<Vec<u8>> = (0..PAGE_ENTRIES as u32 * 2 + 10).map(|i| i.to_le_bytes().to_vec()).collect();
    // Two keys, their rows alternating, so each key's list crosses every page.
    for (i, r) in rows.iter().enumerate() {
        store.apply(&row(r, if i % 2 == 0 { b"even" } else { b"odd" }), 1, 0, NEVER).expect("apply");
    }
    assert_eq!((store.slots.len(), store.slots.pages().len()), (rows.len(), 3));
    assert!(store.slots.pages()[..2].iter().all(|page| page.len() == PAGE_ENTRIES));
    let mut slots = Vec::new();
    store.probe(b"odd", sluice_types::key::hash(b"odd"), &mut slots);
    let odd: Vec<&[u8]> = slots.iter().map(|&s| store.row(s as u32)).collect();
    let expected: Vec<&[u8]> = rows.iter().skip(1).step_by(2).map(Vec::as_slice).collect();
    assert_eq!(odd, expected);
    // A row on the last page leaves and its slot is reused; the rest stay found.
    let last = rows.last().expect("a row");
    store.apply(&row(last, b"odd"), -1, 0, NEVER).expect("apply");
    store.apply(&row(b"new", b"odd"), 2, 0, NEVER).expect("apply");
    assert_eq!(store.slots.len(), rows.len());
    assert_eq!(store.find(last, sluice_types::key::hash(last)).expect("find"), None);
    let middle = &rows[PAGE_ENTRIES + 1];
    let slot = store.find(middle, sluice_types::key::hash(middle)).expect("find").expect("a row of the second page");
    assert_eq!(store.row(slot), middle.as_slice());
    assert_eq!(store.rows().count(), rows.len());
}

#[test]
fn a_probe_gives_a_keys_rows_in_insertion_order_after_removals_in_the_middle() {
    let mut store = Store::default();
    for r in [&b"a1"[..], b"a2", b"a3", b"a4"] {
        store.apply(&row(r, b"a"), 1, 0, NEVER).expect("apply");
    }
    store.apply(&row(b"a2", b"a"), -1, 0, NEVER).expect("apply");
    store.apply(&row(b"a4", b"a"), -1, 0, NEVER).expect("apply");
    store.apply(&row(b"a5", b"a"), 1, 0, NEVER).expect("apply");
    let mut slots = Vec::new();
    store.probe(b"a", sluice_types::key::hash(b"a"), &mut slots);
    let rows: Vec<&[u8]> = slots.iter().map(|&s| store.row(s as u32)).collect();
    assert_eq!(rows, [&b"a1"[..], b"a3", b"a5"]);
}

#[test]
fn rows_expire_by_time_and_stale_index_entries_are_skipped() {
    let mut store = Store::default();
    store.apply(&row(b"a1", b"a"), 1, 0, 10).expect("apply");
    store.apply(&row(b"a2", b"a"), 1, 0, 20).expect("apply");
    store.apply(&row(b"b1", b"b"), 1, 0, NEVER).expect("apply");
    // a1 is retracted; its slot is reused by a row expiring later.
    store.apply(&row(b"a1", b"a"), -1, 0, 10).expect("apply");
    store.apply(&row(b"c1", b"c"), 1, 0, 30).expect("apply");
    assert_eq!(store.expire(9).expect("expire"), 0);
    assert_eq!(store.expire(10).expect("expire"), 0, "a1's stale entry leaves c1, now in its slot, alone");
    assert_eq!(store.len(), 3);
    assert_eq!(store.expire(25).expect("expire"), 1);
    assert!(weights(&store, b"a").is_empty());
    assert_eq!(store.expire(i64::MAX).expect("expire"), 1);
    assert_eq!(store.len(), 1, "b1 never expires");
    assert!(store.by_time.is_empty());
}

#[test]
fn removed_rows_bytes_are_reclaimed_once_they_outnumber_the_live_ones() {
    let mut store = Store::with_chunk_bytes(64);
    let rows: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 10]).collect();
    for r in &rows {
        store.apply(&row(r, &r[..1]), 1, 0, NEVER).expect("apply");
    }
    let held = |store: &Store| store.held_bytes();
    assert_eq!(held(&store), 1000);
    for r in &rows[..90] {
        store.apply(&row(r, &r[..1]), -1, 0, NEVER).expect("apply");
    }
    assert_eq!(store.bytes(), 100);
    assert!(held(&store) <= 2 * store.bytes() + 64, "chunks hold {} bytes for {}", held(&store), store.bytes());
    for r in &rows[90..] {
        assert_eq!(weights(&store, &r[..1]), [(r.clone(), 1)]);
    }
}

#[test]
fn a_snapshots_chunks_are_neither_appended_to_nor_changed_by_a_compaction() {
    let mut store = Store::with_chunk_bytes(64);
    store.apply(&row(b"a1", b"a"), 1, 0, NEVER).expect("apply");
    let shared: Vec<(Chunk, std::ops::Range<usize>)> = store.rows().map(|s| (Arc::clone(s.chunk), s.range)).collect();
    let before: Vec<u8> = shared[0].0.to_vec();
    for i in 0..100u8 {
        let r = [b'x', i, i, i, i, i, i, i];
        store.apply(&row(&r, b"x"), 1, 0, NEVER).expect("apply");
        store.apply(&row(&r, b"x"), -1, 0, NEVER).expect("apply");
    }
    assert_eq!(*shared[0].0, before);
    assert_eq!(&shared[0].0[shared[0].1.clone()], b"a1");
    assert_eq!(weights(&store, b"a"), [(b"a1".to_vec(), 1)]);
}

/// One step of a random run over rows `r0..r7` of keys `k0..k2`.
#[derive(Debug, Clone)]
enum Step {
    /// Add `weight` copies of row `row`; a new row expires at `expires` (None: never).
    Apply {
        row: u8,
        weight: i64,
        expires: Option<i64>,
    },
    /// Add to the match counts of key `key`'s rows.
    Match {
        key: u8,
        by: i64,
    },
    Expire {
        watermark: i64,
    },
    /// Move the TTL's clock on by `ms` and drop the rows not written for the TTL.
    Tick {
        ms: u64,
    },
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..8, -2i64..=2, prop::option::of(0i64..50))
            .prop_map(|(row, weight, expires)| Step::Apply { row, weight, expires }),
        1 => (0u8..3, -2i64..=2).prop_map(|(key, by)| Step::Match { key, by }),
        1 => (0i64..60).prop_map(|watermark| Step::Expire { watermark }),
        1 => (0u64..40).prop_map(|ms| Step::Tick { ms }),
        1 => Just(Step::Snapshot),
    ]
}

/// A row's bytes (long enough to fill small chunks) and its key.
fn bytes_of(row: u8) -> (Vec<u8>, Vec<u8>) {
    let key = vec![b'k', row % 3];
    let mut bytes = key.clone();
    bytes.extend(std::iter::repeat_n(row, 6 + row as usize));
    (bytes, key)
}

/// What the store should hold: row → (key, weight, matches, expires, last write).
type Model = BTreeMap<Vec<u8>, (Vec<u8>, i64, i64, i64, u64)>;

const TTL_MS: u64 = 50;

fn check(store: &Store, model: &Model) {
    assert_eq!(store.len(), model.len());
    assert_eq!(store.bytes(), model.keys().map(Vec::len).sum::<usize>());
    let mut held: Vec<(Vec<u8>, i64, i64)> =
        store.rows().map(|s| (s.chunk[s.range.clone()].to_vec(), s.weight, s.matches)).collect();
    held.sort();
    let expected: Vec<(Vec<u8>, i64, i64)> = model.iter().map(|(r, v)| (r.clone(), v.1, v.2)).collect();
    assert_eq!(held, expected);
    for key in 0..3u8 {
        let key = vec![b'k', key];
        let mut slots = Vec::new();
        store.probe(&key, sluice_types::key::hash(&key), &mut slots);
        let mut probed: Vec<Vec<u8>> = slots.iter().map(|&s| store.row(s as u32).to_vec()).collect();
        probed.sort();
        let expected: Vec<Vec<u8>> = model.iter().filter(|(_, v)| v.0 == key).map(|(r, _)| r.clone()).collect();
        assert_eq!(probed, expected);
    }
    let chunk_bytes: usize = store.held_bytes();
    assert!(
        chunk_bytes <= 2 * store.bytes() + 2 * store.log.chunk_bytes(),
        "{chunk_bytes} bytes held for {}",
        store.bytes()
    );
}

fn run(steps: &[Step], with_ttl: bool) {
    let mut store = Store::with_chunk_bytes(32);
    let (clock, now) = crate::ttl::manual_clock(0);
    if with_ttl {
        store.set_ttl(crate::ttl::Ttl::new(std::time::Duration::from_millis(TTL_MS), clock));
    }
    let mut model = Model::new();
    let mut snapshots = Vec::new();
    for step in steps {
        let time = now.load(Ordering::Relaxed);
        match *step {
            Step::Apply { row: r, weight, expires } => {
                let (bytes, key) = bytes_of(r);
                let expires = expires.unwrap_or(NEVER);
                store.apply(&row(&bytes, &key), weight, 7, expires).expect("apply");
                if weight != 0 {
                    let entry = model.entry(bytes.clone()).or_insert((key, 0, 7, expires, time));
                    entry.1 += weight;
                    entry.4 = time;
                    if entry.1 == 0 {
                        model.remove(&bytes);
                    }
                }
            }
            Step::Match { key, by } => {
                let key = vec![b'k', key];
                let mut slots = Vec::new();
                store.probe(&key, sluice_types::key::hash(&key), &mut slots);
                for slot in slots {
                    *store.counts_mut(slot as u32).1 += by;
                }
                for value in model.values_mut().filter(|v| v.0 == key) {
                    value.2 += by;
                }
            }
            Step::Expire { watermark } => {
                let expected = model.values().filter(|v| v.3 <= watermark).count();
                assert_eq!(store.expire(watermark).expect("expire"), expected);
                model.retain(|_, v| v.3 > watermark);
            }
            Step::Tick { ms } => {
                let time = now.fetch_add(ms, Ordering::Relaxed) + ms;
                let freed = store.expire_ttl().expect("expire");
                if with_ttl {
                    let expected = model.values().filter(|v| v.4 + TTL_MS <= time).count();
                    assert_eq!(freed, expected);
                    model.retain(|_, v| v.4 + TTL_MS > time);
                } else {
                    assert_eq!(freed, 0);
                }
            }
            Step::Snapshot => {
                let copy: Vec<(Chunk, std::ops::Range<usize>, i64)> =
                    store.rows().map(|s| (Arc::clone(s.chunk), s.range, s.weight)).collect();
                let expected: Vec<(Vec<u8>, i64)> = model.iter().map(|(r, v)| (r.clone(), v.1)).collect();
                snapshots.push((copy, expected));
            }
        }
        check(&store, &model);
    }
    // A copy taken at a snapshot still reads what was held then.
    for (copy, expected) in snapshots {
        let mut read: Vec<(Vec<u8>, i64)> = copy.iter().map(|(c, range, w)| (c[range.clone()].to_vec(), *w)).collect();
        read.sort();
        assert_eq!(read, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_store_holds_what_a_multiset_of_rows_holds(steps in prop::collection::vec(step(), 0..120)) {
        run(&steps, false);
    }

    #[test]
    fn with_a_ttl_the_store_holds_the_rows_written_within_it(steps in prop::collection::vec(step(), 0..120)) {
        run(&steps, true);
    }
}
