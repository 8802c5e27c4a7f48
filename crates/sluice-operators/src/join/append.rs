//! The stored rows of a side that only appends and never loses a row: a regular join's
//! append-only input without a state TTL or an expiry, whose rows the join never pads
//! with NULLs (an inner join's side, or the side facing an outer join's preserved one).
//!
//! Such rows are never removed nor looked up by their content, and their match counts
//! are never read (only a preserved side's are: they decide its padding), so the side
//! keeps per row only where its bytes start and the previous row of its join key, a
//! 12-byte [`Entry`] (the general [`super::store::Store`] keeps a 48-byte slot and an
//! index entry by row). Rows are appended to the log in the order of their entries, so
//! a row ends where the next entry's starts, or at the end of its chunk (a chunk is never
//! appended to once a later one exists). Equal rows are kept apart, each with its weight (a snapshot
//! merges them into one, as it does for an expiring side), and a snapshot writes their
//! match counts as 0.
//!
//! - The rows' bytes go to a [`SpillLog`] and their entries to [`SpillPages`]: beyond
//!   the pipeline's state memory budget (`crate::spill`) the older ones are in files on
//!   local disk, read back when a probe finds them. NEXMark q20 keeps every bid this way
//!   (at 100 M events, about 92 million entries: 1.1 GB).
//! - `by_key`: a hash table of join keys ([`Head`]s in pages, the key inline when short,
//!   the table holding only their numbers: its spare room costs 4 bytes a slot, not a
//!   head's 32) to each key's newest row; each entry links to the key's previous row, so an insert writes only
//!   the new entry and the key's head, and a probe walks the key's rows newest first
//!   (and returns them oldest first, the order they came in). The heads and the table
//!   stay in memory, counted in the budget (so that the rows spill sooner), as the
//!   entries' pages in memory are.
//! - Weights: every row's is 1 until a row arrives with another, then one per row.
//! - Snapshots ([`AppendStore::changes`]): rows never change once stored, so a delta is
//!   the rows stored since the previous snapshot, each under an arrival number that
//!   keeps counting across snapshots and restores; the key hash of each of those rows is
//!   kept until the snapshot takes them (the entries do not hold one).

use std::sync::Arc;

use hashbrown::HashTable;
use sluice_types::SluiceError;

use super::store::RowRef;
use crate::bytes::SmallBytes;
use crate::counter::LazyCounter;
use crate::pages::Pages;
use crate::same_bytes;
use crate::spill::{SharedChunk, SpillLog, SpillSpace};
use crate::spill_pages::{Fixed, SpillPages};

/// No row: the end of a key's list.
const NONE: u32 = u32::MAX;

/// One stored row.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The row starts at `start` in chunk `chunk` of the log: the whole row in the
    /// project's key encoding (the side's columns in order), ending where the next
    /// entry's row starts or its chunk ends ([`AppendStore::range`]).
    chunk: u32,
    start: u32,
    /// The key's row before this one, or [`NONE`].
    older: u32,
}

impl Fixed for Entry {
    const BYTES: usize = 12;

    fn encode(&self, out: &mut Vec<u8>) {
        for field in [self.chunk, self.start, self.older] {
            out.extend_from_slice(&field.to_le_bytes());
        }
    }

    fn decode(bytes: &[u8]) -> Entry {
        let field = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        Entry { chunk: field(0), start: field(4), older: field(8) }
    }
}

/// A join key's newest row. Its hash is the key hash of `key`, computed again when the
/// table grows and for snapshots.
#[derive(Debug)]
struct Head {
    newest: u32,
    key: SmallBytes,
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct AppendStore {
    entries: SpillPages<Entry>,
    /// Per row, its weight; empty while every weight is 1.
    weights: Vec<i64>,
    heads: Pages<Head>,
    /// Head numbers by their key's hash.
    by_key: HashTable<u32>,
    log: SpillLog,
    /// The encoded rows' bytes.
    bytes: usize,
    /// What [`AppendStore::counts_mut`] hands out as a row's match count (never read).
    matches: i64,
    /// Entries below this are in the runs: a snapshot took them.
    snapshotted: u32,
    /// The arrival number of entry `snapshotted` (the next one a snapshot gives).
    next_arrival: u64,
    /// The key hash of each entry from `snapshotted` on, once a snapshot or a restore
    /// started keeping them (`tracking`): a run without checkpoints keeps none.
    fresh_hashes: Vec<u64>,
    tracking: bool,
    /// Where the heads and the key table are counted (None: nowhere).
    space: Option<Arc<SpillSpace>>,
    /// The bytes of the heads and the key table, as counted in the space.
    index_bytes: usize,
}

/// A row a snapshot takes: its arrival number, key hash and weight, and where its bytes
/// are: `range` of chunk `chunk` of the snapshot's chunks.
#[derive(Debug, Clone)]
pub(super) struct AppendedRow {
    pub(super) arrival: u64,
    pub(super) key_hash: u64,
    pub(super) weight: i64,
    pub(super) chunk: u32,
    pub(super) range: std::ops::Range<usize>,
}

/// The rows a snapshot takes: their entries, copied a page at a time (12 bytes a row,
/// so the barrier's copy of a delta of millions of rows is one memory copy of a few
/// tens of MB), their key hashes (handed over, not copied) and weights, and the chunks
/// holding their bytes (shared, not copied: a chunk a snapshot shares is not appended
/// to, so a row's bytes end where the next entry's start or at its chunk's end).
#[derive(Debug, Default)]
pub(super) struct AppendChanges {
    entries: Vec<Entry>,
    key_hashes: Vec<u64>,
    /// Per row its weight; empty while every weight is 1.
    weights: Vec<i64>,
    first_arrival: u64,
    /// The log's number of `chunks[0]`.
    first_chunk: u32,
    chunks: Vec<SharedChunk>,
}

impl AppendChanges {
    /// The chunks holding the rows' bytes (a row's `chunk` numbers them).
    pub(super) fn chunks(&self) -> &[SharedChunk] {
        &self.chunks
    }

    /// The rows, in arrival order.
    pub(super) fn rows(&self) -> impl Iterator<Item = AppendedRow> + '_ {
        self.entries.iter().enumerate().map(|(index, entry)| {
            let chunk = entry.chunk - self.first_chunk;
            let end = match self.entries.get(index + 1) {
                Some(next) if next.chunk == entry.chunk => next.start as usize,
                _ => self.chunks[chunk as usize].len(),
            };
            AppendedRow {
                arrival: self.first_arrival + index as u64,
                key_hash: self.key_hashes[index],
                weight: self.weights.get(index).copied().unwrap_or(1),
                chunk,
                range: entry.start as usize..end,
            }
        })
    }
}

impl AppendStore {
    /// A store whose rows spill within `space` (None: all in memory), the bytes written
    /// counted in `written`.
    pub(super) fn new(space: Option<Arc<SpillSpace>>, written: Option<LazyCounter>) -> AppendStore {
        let entries = SpillPages::new(space.clone(), written.as_ref().map(LazyCounter::again));
        AppendStore::with_log(SpillLog::new(space.clone()).counting(written), entries, space)
    }

    fn with_log(log: SpillLog, entries: SpillPages<Entry>, space: Option<Arc<SpillSpace>>) -> AppendStore {
        AppendStore {
            entries,
            weights: Vec::new(),
            heads: Pages::default(),
            by_key: HashTable::new(),
            log,
            bytes: 0,
            matches: 0,
            snapshotted: 0,
            next_arrival: 0,
            fresh_hashes: Vec::new(),
            tracking: false,
            space,
            index_bytes: 0,
        }
    }

    /// Counts the heads, the key table and the key hashes kept for the next delta in the
    /// space again (after a key was added, or the hashes' vector grew or was taken): the
    /// heads by 1,024 at a time, the table by its capacity (a number and a control byte a
    /// bucket), the hashes by their vector's capacity, so that the space's shared count
    /// changes only now and then.
    fn count_index(&mut self) {
        let heads = self.heads.len().next_multiple_of(1024) * size_of::<Head>();
        let bytes =
            heads + self.by_key.capacity() * (size_of::<u32>() + 1) + self.fresh_hashes.capacity() * size_of::<u64>();
        if bytes != self.index_bytes {
            SpillSpace::recount(self.space.as_deref(), &mut self.index_bytes, bytes);
        }
    }

    /// Rows held (equal rows counted apart).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The bytes of the rows held, in their encoding (the entries and the key table not
    /// counted).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends to `out` the ids of the rows whose join key is `key` (placement hash
    /// `hash`), in the order they were stored.
    pub(super) fn probe(&self, key: &[u8], hash: u64, out: &mut Vec<u64>) -> Result<(), SluiceError> {
        let heads = &self.heads;
        let Some(&head) = self.by_key.find(hash, |&h| same_bytes(heads[h as usize].key.get(), key)) else {
            return Ok(());
        };
        let before = out.len();
        let mut id = self.heads[head as usize].newest;
        while id != NONE {
            out.push(u64::from(id));
            id = self.entries.get(id as usize)?.older;
        }
        out[before..].reverse();
        Ok(())
    }

    /// Where row `id`'s bytes are in its chunk (see the module documentation), given
    /// its entry and the next one's (None: the last).
    fn range_of(&self, entry: &Entry, next: Option<&Entry>) -> std::ops::Range<usize> {
        let end = match next {
            Some(next) if next.chunk == entry.chunk => next.start as usize,
            _ => self.log.chunk_len(entry.chunk),
        };
        entry.start as usize..end
    }

    /// Row `id`'s entry and its bytes' place, from memory or the entries' file.
    fn place(&self, id: u32) -> Result<(Entry, std::ops::Range<usize>), SluiceError> {
        let entry = self.entries.get(id as usize)?;
        let next = id as usize + 1;
        let next = if next < self.entries.len() { Some(self.entries.get(next)?) } else { None };
        Ok((entry, self.range_of(&entry, next.as_ref())))
    }

    fn weight(&self, id: u32) -> i64 {
        self.weights.get(id as usize).copied().unwrap_or(1)
    }

    /// The weight of row `id`, and a match count to add to that nobody reads (see the
    /// module documentation).
    pub(super) fn counts_mut(&mut self, id: u32) -> (i64, &mut i64) {
        self.matches = 0;
        (self.weight(id), &mut self.matches)
    }

    /// The bytes of row `id` if they are in memory.
    pub(super) fn resident_row(&self, id: u32) -> Option<&[u8]> {
        let entry = self.entries.resident(id as usize)?;
        let next = id as usize + 1;
        let next = if next < self.entries.len() { Some(self.entries.resident(next)?) } else { None };
        self.log.get(entry.chunk, self.range_of(entry, next))
    }

    /// Appends the bytes of row `id` to `out`, from memory or from the spill files.
    pub(super) fn read_row(&self, id: u32, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        let (entry, range) = self.place(id)?;
        self.log.read_into(entry.chunk, range, out)
    }

    /// Stores `weight` copies of `row`; an append-only side never retracts.
    pub(super) fn push(&mut self, row: &RowRef<'_>, weight: i64) -> Result<(), SluiceError> {
        if weight == 0 {
            return Ok(());
        }
        if weight < 0 {
            return Err(SluiceError::internal(
                "join.append_only",
                format!("a retraction (weight {weight}) reached a join input planned as append-only"),
            ));
        }
        assert!(self.entries.len() < NONE as usize, "fewer than 2^32 - 1 rows per side and thread");
        let id = self.entries.len() as u32;
        assert!(!row.row.is_empty(), "an encoded row has a byte per column at least");
        let (chunk, start) = self.log.append(row.row)?;
        let hash = row.key_hash;
        let heads = &self.heads;
        let older = match self.by_key.find(hash, |&h| same_bytes(heads[h as usize].key.get(), row.key)) {
            Some(&head) => std::mem::replace(&mut self.heads[head as usize].newest, id),
            None => {
                let head = u32::try_from(self.heads.len()).expect("fewer join keys than rows");
                self.heads.push(Head { newest: id, key: SmallBytes::new(row.key) });
                let heads = &self.heads;
                self.by_key.insert_unique(hash, head, |&h| sluice_types::key::hash(heads[h as usize].key.get()));
                self.count_index();
                NONE
            }
        };
        self.entries.push(Entry { chunk, start, older })?;
        if self.tracking {
            let capacity = self.fresh_hashes.capacity();
            self.fresh_hashes.push(hash);
            if self.fresh_hashes.capacity() != capacity {
                self.count_index();
            }
        }
        if weight != 1 || !self.weights.is_empty() {
            self.weights.resize(self.entries.len(), 1);
            self.weights[id as usize] = weight;
        }
        self.bytes += row.row.len();
        Ok(())
    }

    /// The rows a snapshot takes: every row (`full`, numbered from 0 in arrival order)
    /// or those stored since the previous snapshot (numbered on from the previous
    /// snapshot's). Either way the rows taken are in the runs afterwards.
    pub(super) fn changes(&mut self, full: bool) -> Result<AppendChanges, SluiceError> {
        assert!(full || self.tracking, "a delta of a store that kept no changes");
        let (first, first_arrival) = if full { (0, 0) } else { (self.snapshotted, self.next_arrival) };
        let key_hashes = if full { self.hashes()? } else { std::mem::take(&mut self.fresh_hashes) };
        let (first, end) = (first as usize, self.entries.len());
        let entries = self.entries.copy_range(first..end)?;
        assert_eq!(key_hashes.len(), entries.len(), "a key hash per row taken");
        let weights = if self.weights.is_empty() { Vec::new() } else { self.weights[first..end].to_vec() };
        let (first_chunk, chunks) = match (entries.first(), entries.last()) {
            (Some(oldest), Some(newest)) => (oldest.chunk, self.log.share(oldest.chunk..newest.chunk + 1)),
            _ => (0, Vec::new()),
        };
        self.snapshotted = end as u32;
        self.next_arrival = first_arrival + entries.len() as u64;
        self.fresh_hashes.clear();
        self.tracking = true;
        self.count_index();
        Ok(AppendChanges { entries, key_hashes, weights, first_arrival, first_chunk, chunks })
    }

    /// Whether a snapshot may take only what changed (changes are kept).
    pub(super) fn tracking(&self) -> bool {
        self.tracking
    }

    /// The key hash of every entry, in entry order: each head's to its newest entry,
    /// then each entry's to the older one it links, newest first (a page at a time, so
    /// spilled entries are read in order, not one by one along each key's list): an
    /// entry is a key's newest or the older of a newer one, which came before it.
    fn hashes(&self) -> Result<Vec<u64>, SluiceError> {
        let mut hashes = vec![0; self.entries.len()];
        for head in self.heads.iter() {
            hashes[head.newest as usize] = sluice_types::key::hash(head.key.get());
        }
        self.entries.for_each_page(0..self.entries.len(), true, |first, entries| {
            for (offset, entry) in entries.iter().enumerate().rev() {
                if entry.older != NONE {
                    hashes[entry.older as usize] = hashes[first + offset];
                }
            }
        })?;
        Ok(hashes)
    }

    /// After a restore: every row stored is in the runs, and the highest arrival number
    /// there was `last_arrival` (None: no row).
    pub(super) fn restored(&mut self, last_arrival: Option<u64>) {
        self.snapshotted = self.entries.len() as u32;
        self.next_arrival = last_arrival.map_or(0, |last| last + 1);
        self.fresh_hashes.clear();
        self.tracking = true;
    }
}

impl Drop for AppendStore {
    fn drop(&mut self) {
        if let Some(space) = &self.space {
            space.release(self.index_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_ref<'a>(row: &'a [u8], key: &'a [u8]) -> RowRef<'a> {
        RowRef { row, row_hash: 0, key, key_hash: sluice_types::key::hash(key) }
    }

    fn rows_of(store: &AppendStore, key: &[u8]) -> Vec<(Vec<u8>, i64)> {
        let mut ids = Vec::new();
        store.probe(key, sluice_types::key::hash(key), &mut ids).expect("probe");
        ids.into_iter()
            .map(|id| {
                let mut bytes = Vec::new();
                store.read_row(id as u32, &mut bytes).expect("read");
                if let Some(resident) = store.resident_row(id as u32) {
                    assert_eq!(resident, &bytes[..]);
                }
                (bytes, store.weight(id as u32))
            })
            .collect()
    }

    /// Rows of three keys, some repeated, some heavier, through a log small enough to
    /// spill: probes give each key's rows in arrival order, from memory or the file.
    #[test]
    fn probes_find_every_row_of_a_key_in_arrival_order_spilled_or_not() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for space in [None, Some(SpillSpace::new(dir.path().to_path_buf(), 0))] {
            let spills = space.is_some();
            let entries = SpillPages::with_page_entries(space.clone(), None, 16);
            let mut store =
                AppendStore::with_log(SpillLog::with_chunk_bytes(space.clone(), 100), entries, space.clone());
            let mut expected: [Vec<(Vec<u8>, i64)>; 3] = Default::default();
            // Each row's key hash, in arrival order.
            let mut arrivals = Vec::new();
            for i in 0..300usize {
                let key = [b'k', (i % 3) as u8];
                let row = format!("row {i} of key {}", i % 3).into_bytes();
                let weight = if i % 7 == 0 { 2 } else { 1 };
                store.push(&row_ref(&row, &key), weight).expect("push");
                expected[i % 3].push((row, weight));
                arrivals.push(sluice_types::key::hash(&key));
                if i % 5 == 0 {
                    // An equal row is kept apart.
                    store.push(&row_ref(&expected[i % 3].last().expect("row").0.clone(), &key), 1).expect("push");
                    let again = (expected[i % 3].last().expect("row").0.clone(), 1);
                    expected[i % 3].push(again);
                    arrivals.push(sluice_types::key::hash(&key));
                }
            }
            for (k, rows) in expected.iter().enumerate() {
                assert_eq!(&rows_of(&store, &[b'k', k as u8]), rows, "key {k}, spilled: {spills}");
            }
            assert!(rows_of(&store, b"absent").is_empty());
            assert_eq!(store.len(), expected.iter().map(Vec::len).sum::<usize>());
            assert_eq!(store.bytes(), expected.iter().flatten().map(|(r, _)| r.len()).sum::<usize>());
            assert_eq!(space.as_ref().is_some_and(|s| s.spilled() > 0), spills);
            if spills {
                assert!(store.entries.resident(0).is_none(), "the oldest entries spilled too");
            }
            let changes = store.changes(true).expect("a full snapshot");
            let snapshot: usize = changes.rows().map(|r| r.range.len()).sum();
            assert_eq!(snapshot, store.bytes(), "a snapshot sees every row once");
            let hashes: Vec<u64> = changes.rows().map(|r| r.key_hash).collect();
            assert_eq!(hashes, arrivals, "every row under its key's hash, spilled: {spills}");
            drop(changes);
            drop(store);
            if let Some(space) = &space {
                assert_eq!((space.resident(), space.spilled()), (0, 0), "a dropped store gives its bytes back");
            }
        }
    }

    #[test]
    fn an_entry_takes_12_bytes_and_a_key_32() {
        // Millions are kept (NEXMark q20 keeps every bid): where the row starts and the
        // key's row before it; the row's length comes from the next entry.
        assert_eq!(std::mem::size_of::<Entry>(), 12);
        // A key: its newest row and the key inline when short, in pages; the hash table
        // holds 4-byte head numbers.
        assert_eq!(std::mem::size_of::<Head>(), 32);
    }

    /// The key hashes a delta will take count in the budget while they wait for it, and
    /// stop counting once it took them.
    #[test]
    fn the_key_hashes_kept_for_the_next_delta_count_in_the_budget() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 1 << 30);
        let mut store = AppendStore::new(Some(Arc::clone(&space)), None);
        let key = b"one key";
        store.push(&row_ref(b"first", key), 1).expect("push");
        drop(store.changes(true).expect("a full snapshot: deltas from now on"));
        let before = space.resident();
        for i in 0..10_000u32 {
            store.push(&row_ref(&i.to_le_bytes(), key), 1).expect("push");
        }
        let hashes = store.fresh_hashes.capacity() * 8;
        assert!(hashes >= 80_000);
        let during = space.resident();
        assert!(during >= before + hashes, "{during} resident, {before} before");
        let delta = store.changes(false).expect("a delta");
        assert_eq!(delta.rows().count(), 10_000);
        assert_eq!(space.resident(), during - hashes, "the hashes the delta took no longer count");
        drop(delta);
        drop(store);
        assert_eq!(space.resident(), 0);
    }

    #[test]
    fn a_retraction_is_refused_not_stored() {
        let mut store = AppendStore::new(None, None);
        store.push(&row_ref(b"row", b"key"), 1).expect("insert");
        let error = store.push(&row_ref(b"row", b"key"), -1).expect_err("a retraction");
        assert!(error.to_string().contains("append-only"), "{error}");
        assert_eq!(store.len(), 1);
    }
}
