//! The session aggregate against a from-scratch sessionization (with checkpoints, deltas
//! when they can be, and restores onto split and merged instances), its late rows, and
//! its state records (what a delta holds, pinned byte for byte, damage refused).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_runtime::{Operator, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, vnode};

use super::SessionAggregate;
use crate::aggregate::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregateSpec};
use crate::spill::SpillSpace;
use crate::testing::{self, whole};

const VNODES: u32 = 16;

/// A record: vnode, key, value.
type Record = (u32, Vec<u8>, Vec<u8>);

fn input_schema() -> Arc<Schema> {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

/// `k, window_start, window_end, COUNT(*), SUM(v), MAX(v), COUNT(DISTINCT v)`.
fn aggregate(late: Arc<AtomicU64>) -> SessionAggregate {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    let output = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("window_start", ts.clone(), false),
        Field::new("window_end", ts, false),
        Field::new("n", DataType::Int64, false),
        Field::new("total", DataType::Int64, true),
        Field::new("top", DataType::Int64, true),
        Field::new("kinds", DataType::Int64, false),
    ]));
    let spec = |function, argument| AggregateSpec { function, argument, filter: None };
    let spec = WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: vec![2],
        groups: vec![GroupColumn::Key(0), GroupColumn::WindowStart, GroupColumn::WindowEnd],
        aggregates: vec![
            spec(AggregateFunction::CountRows, None),
            spec(AggregateFunction::Sum, Some(3)),
            spec(AggregateFunction::Max, Some(3)),
            spec(AggregateFunction::CountDistinct, Some(3)),
        ],
        output,
        batch_size: 7,
        late_weights: None,
    };
    SessionAggregate::new(spec, &input_schema(), late, VNODES).expect("aggregate")
}

/// Rows `(ts, key, value)` with their proto-windows `[ts, ts + gap)`.
fn rows(gap: i64, rows: &[(i64, &str, Option<i64>)]) -> Batch {
    let starts = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0));
    let ends = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0 + gap));
    let keys = StringArray::from_iter_values(rows.iter().map(|r| r.1));
    let values = Int64Array::from_iter(rows.iter().map(|r| r.2));
    let columns: Vec<arrow::array::ArrayRef> = vec![Arc::new(starts), Arc::new(ends), Arc::new(keys), Arc::new(values)];
    Batch::inserts(RecordBatch::try_new(input_schema(), columns).expect("batch"))
}

/// Output rows as `k start end n total top kinds`, in emission order.
fn lines(out: Vec<Message>) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        let rows = &batch.rows;
        let text = |column: usize, row: usize| {
            let array = rows.column(column);
            arrow::util::display::array_value_to_string(array, row).expect("display")
        };
        for row in 0..rows.num_rows() {
            let starts = rows.column(1).as_any().downcast_ref::<TimestampMillisecondArray>().expect("ts");
            let ends = rows.column(2).as_any().downcast_ref::<TimestampMillisecondArray>().expect("ts");
            lines.push(format!(
                "{} {} {} {} {} {} {}",
                text(0, row),
                starts.value(row),
                ends.value(row),
                text(3, row),
                text(4, row),
                text(5, row),
                text(6, row)
            ));
        }
    }
    lines
}

/// What a watermark closes goes out a batch (7 sessions) a part, the watermark with the
/// last part; the sessions it leaves open stay.
#[test]
fn a_watermark_closing_many_sessions_emits_them_a_batch_at_a_time() {
    let keys: Vec<String> = (0..20).map(|k| format!("k{k:02}")).collect();
    let input: Vec<(i64, &str, Option<i64>)> = keys.iter().map(|k| (0, k.as_str(), Some(1))).collect();
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    operator.on_data(rows(10, &input), &mut Vec::new()).expect("data");
    operator.on_data(rows(10, &[(50, "late", Some(2))]), &mut Vec::new()).expect("data");
    let mut first = Vec::new();
    operator.on_watermark(20, &mut first).expect("watermark");
    let parts = testing::parts(&mut operator, first);
    let shape: Vec<(usize, bool)> = parts
        .iter()
        .map(|part| {
            let rows = testing::data_rows(part);
            (rows, matches!(part.last(), Some(Message::Watermark(20))))
        })
        .collect();
    assert_eq!(shape, [(7, false), (7, false), (6, true)]);
    let mut closed = lines(parts.concat());
    closed.sort();
    let expected: Vec<String> = keys.iter().map(|k| format!("{k} 0 10 1 1 1 1")).collect();
    assert_eq!(closed, expected);
    assert_eq!(ended(&mut operator), ["late 50 60 1 2 2 1"]);
}

fn ended(aggregate: &mut SessionAggregate) -> Vec<String> {
    let mut out = Vec::new();
    aggregate.on_end(&mut out).expect("end");
    whole(aggregate, &mut out);
    let mut lines = lines(out);
    lines.sort();
    lines
}

/// From scratch: per key, rows in time order; a row more than `gap` after the session's
/// latest row starts a new session; a session ends `gap` after its latest row.
fn sessionize(gap: i64, rows: &[(i64, &str, Option<i64>)]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for &(ts, key, value) in rows {
        by_key.entry(key).or_default().push((ts, value));
    }
    let mut lines = Vec::new();
    for (key, mut rows) in by_key {
        rows.sort();
        let mut sessions: Vec<Vec<(i64, Option<i64>)>> = Vec::new();
        for row in rows {
            match sessions.last_mut() {
                Some(session) if row.0 <= session.last().expect("non-empty").0 + gap => session.push(row),
                _ => sessions.push(vec![row]),
            }
        }
        for session in sessions {
            let values: Vec<i64> = session.iter().filter_map(|r| r.1).collect();
            let distinct: std::collections::BTreeSet<i64> = values.iter().copied().collect();
            let show = |value: Option<i64>| value.map_or(String::new(), |v| v.to_string());
            lines.push(format!(
                "{key} {} {} {} {} {} {}",
                session[0].0,
                session.last().expect("non-empty").0 + gap,
                session.len(),
                show((!values.is_empty()).then(|| values.iter().sum())),
                show(values.iter().max().copied()),
                distinct.len()
            ));
        }
    }
    lines.sort();
    lines
}

fn row_strategy() -> impl Strategy<Value = (i64, &'static str, Option<i64>)> {
    (0i64..300, prop::sample::select(vec!["a", "b", "c"]), prop::option::of(0i64..4))
}

/// The vnode of key `k`'s sessions.
fn key_vnode(k: &str) -> u32 {
    vnode::of_hash(sluice_types::key::hash(&key_bytes(k)), VNODES)
}

/// `k` in the key encoding.
fn key_bytes(k: &str) -> Vec<u8> {
    [&[0x06][..], &(k.len() as u32).to_le_bytes(), k.as_bytes()].concat()
}

/// Instances of the aggregate and the runs their checkpoints wrote: `ranges[i]` are the
/// vnodes of `instances[i]`.
struct Running {
    instances: Vec<SessionAggregate>,
    ranges: Vec<std::ops::Range<u32>>,
    runs: StateModel,
    /// Where the instances' keys spill beyond its budget, if anywhere.
    space: Option<Arc<SpillSpace>>,
}

/// An aggregate whose keys spill within `space` when given.
fn aggregate_in(late: Arc<AtomicU64>, space: Option<&Arc<SpillSpace>>) -> SessionAggregate {
    let aggregate = aggregate(late);
    match space {
        Some(space) => {
            let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
            aggregate.with_spill(Arc::clone(space), crate::spill::spilled_bytes(&metrics))
        }
        None => aggregate,
    }
}

impl Running {
    /// A checkpoint: every instance's snapshot (a delta when it can) into the runs.
    fn checkpoint(&mut self) {
        for (instance, vnodes) in self.instances.iter_mut().zip(&self.ranges) {
            testing::checkpoint(instance, &mut self.runs, vnodes.clone(), true);
        }
    }

    /// A checkpoint, then new instances owning `ranges` restored from the runs, given
    /// the watermark `watermark` first (as a restored driver sends its lanes').
    fn restart(&mut self, ranges: Vec<std::ops::Range<u32>>, watermark: Option<i64>, late: &Arc<AtomicU64>) {
        self.checkpoint();
        self.ranges = ranges;
        self.instances = (self.ranges.iter())
            .map(|vnodes| {
                let mut instance = aggregate_in(Arc::clone(late), self.space.as_ref());
                testing::restore(&mut instance, &self.runs, vnodes.clone()).expect("restore");
                if let Some(watermark) = watermark {
                    let mut out = Vec::new();
                    instance.on_watermark(watermark, &mut out).expect("watermark");
                    whole(&mut instance, &mut out);
                    assert!(lines(out).is_empty(), "a restored session was emitted before the checkpoint");
                }
                instance
            })
            .collect();
    }

    /// The instance owning key `k`'s sessions.
    fn owner(&self, k: &str) -> usize {
        let vnode = key_vnode(k);
        self.ranges.iter().position(|range| range.contains(&vnode)).expect("every vnode is owned")
    }
}

/// One run of the property below: the rows `input` (sorted by time first when
/// `in_time_order`) with proto-windows of `gap`, in batches cut at `cuts`, moved onto two
/// instances splitting the vnodes at `split` at batch `split_at` and back onto one at
/// `merge_at`.
#[derive(Debug, Clone)]
struct Case {
    gap: i64,
    input: Vec<(i64, &'static str, Option<i64>)>,
    in_time_order: bool,
    cuts: Vec<usize>,
    split_at: usize,
    merge_at: usize,
    split: u32,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1i64..40,
        prop::collection::vec(row_strategy(), 0..120),
        any::<bool>(),
        prop::collection::vec(0usize..120, 0..12),
        0usize..13,
        0usize..13,
        1u32..VNODES,
    )
        .prop_map(|(gap, input, in_time_order, cuts, split_at, merge_at, split)| Case {
            gap,
            input,
            in_time_order,
            cuts,
            split_at,
            merge_at,
            split,
        })
}

/// Runs `case`, the keys spilling within `space` when given: the sessions emitted must
/// be the from-scratch ones.
fn check_sessions(case: Case, space: Option<&Arc<SpillSpace>>) -> Result<(), TestCaseError> {
    let Case { gap, mut input, in_time_order, cuts, split_at, merge_at, split } = case;
    if in_time_order {
        input.sort_by_key(|row| row.0);
    }
    let late = Arc::new(AtomicU64::new(0));
    let mut running = Running {
        instances: vec![aggregate_in(Arc::clone(&late), space)],
        ranges: testing::one_instance(VNODES),
        runs: StateModel::default(),
        space: space.cloned(),
    };
    let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
    cuts.push(input.len());
    cuts.sort();
    let (mut from, mut out, mut watermark) = (0, Vec::new(), None);
    for (index, cut) in cuts.into_iter().enumerate() {
        if index == split_at {
            let ranges = [0, split, VNODES].windows(2).map(|pair| pair[0]..pair[1]).collect();
            running.restart(ranges, watermark, &late);
        } else if index == merge_at {
            running.restart(testing::one_instance(VNODES), watermark, &late);
        } else if index % 2 == 1 {
            running.checkpoint();
        }
        let mut parts = vec![Vec::new(); running.instances.len()];
        for row in &input[from..cut] {
            parts[running.owner(row.1)].push(*row);
        }
        for (instance, part) in running.instances.iter_mut().zip(parts) {
            instance.on_data(rows(gap, &part), &mut out).expect("data");
        }
        from = cut;
        if let Some(earliest) = input[from..].iter().map(|r| r.0).min() {
            let next = earliest - gap - 1;
            if watermark.is_none_or(|watermark| next > watermark) {
                watermark = Some(next);
                for instance in &mut running.instances {
                    instance.on_watermark(next, &mut out).expect("watermark");
                    whole(instance, &mut out);
                }
            }
        }
    }
    for instance in &mut running.instances {
        instance.on_end(&mut out).expect("end");
        whole(instance, &mut out);
    }
    let mut got = lines(out);
    got.sort();
    prop_assert_eq!(got, sessionize(gap, &input));
    prop_assert_eq!(late.load(Ordering::Relaxed), 0);
    Ok(())
}

proptest! {
    /// Rows in any order (or in time order, so that sessions close along the way) and
    /// batches, with watermarks that leave no row late (each at least `gap` behind every
    /// later row), give exactly the from-scratch sessions. A checkpoint follows every
    /// other batch (deltas); at `split_at` the sessions move onto two instances
    /// splitting the vnodes at `split` (rows routed by key, as the exchange does), at
    /// `merge_at` back onto one, as after restarts.
    #[test]
    fn sessions_match_a_from_scratch_sessionization(case in case()) {
        check_sessions(case, None)?;
    }

    /// The same with a memory budget of 0: every key no row touched since the clock
    /// last passed it is evicted at the end of each batch and watermark, and read back by
    /// its next row, by its session falling due, by deltas and by full snapshots.
    #[test]
    fn evicted_keys_give_the_same_sessions(case in case()) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 0);
        check_sessions(case, Some(&space))?;
        prop_assert_eq!((space.resident(), space.spilled()), (0, 0), "dropped instances count nothing");
    }
}

#[test]
fn a_session_is_emitted_when_the_watermark_passes_its_end_and_late_rows_are_dropped() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = aggregate(Arc::clone(&late));
    let mut out = Vec::new();
    operator.on_data(rows(10, &[(0, "a", Some(1)), (10, "a", Some(2)), (40, "a", Some(5))]), &mut out).expect("data");
    operator.on_watermark(18, &mut out).expect("watermark");
    whole(&mut operator, &mut out);
    assert!(lines(std::mem::take(&mut out)).is_empty(), "[0, 20) is due at 19");
    operator.on_watermark(19, &mut out).expect("watermark");
    whole(&mut operator, &mut out);
    assert_eq!(lines(std::mem::take(&mut out)), ["a 0 20 2 3 2 2"]);
    // 5 would make [5, 15): due already. 35 merges into [40, 50): not due, so taken.
    operator.on_data(rows(10, &[(5, "a", Some(9)), (35, "a", Some(7))]), &mut out).expect("data");
    assert_eq!(late.load(Ordering::Relaxed), 1);
    assert_eq!(ended(&mut operator), ["a 35 50 2 12 7 2"]);
}

#[test]
fn a_row_bridging_two_sessions_merges_them() {
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    let input = rows(10, &[(0, "a", Some(1)), (20, "a", Some(2)), (10, "a", Some(1)), (0, "b", None)]);
    operator.on_data(input, &mut Vec::new()).expect("data");
    assert_eq!(ended(&mut operator), ["a 0 30 3 4 2 2", "b 0 10 1   0"]);
}

#[test]
fn a_restored_aggregate_emits_what_the_original_would_split_by_vnode_across_instances() {
    let input = [(0, "a", Some(1)), (3, "b", Some(2)), (30, "a", None), (7, "c", Some(5)), (9, "a", Some(1))];
    let mut original = aggregate(Arc::new(AtomicU64::new(0)));
    original.on_data(rows(10, &input), &mut Vec::new()).expect("data");
    let mut runs = StateModel::default();
    testing::checkpoint(&mut original, &mut runs, 0..VNODES, false);
    let mut restored = Vec::new();
    for vnodes in [0..VNODES / 2, VNODES / 2..VNODES] {
        let mut instance = aggregate(Arc::new(AtomicU64::new(0)));
        testing::restore(&mut instance, &runs, vnodes).expect("restore");
        // Rows after the restore still merge with the restored sessions.
        instance.on_data(rows(10, &[(20, "a", Some(4))]), &mut Vec::new()).expect("data");
        restored.extend(ended(&mut instance).into_iter().filter(|line| !line.starts_with("a 20 30")));
    }
    restored.sort();
    original.on_data(rows(10, &[(20, "a", Some(4))]), &mut Vec::new()).expect("data");
    assert_eq!(restored, ended(&mut original));
    assert_eq!(restored, ["a 0 19 2 2 1 1", "a 20 40 2 4 4 1", "b 3 13 1 2 2 1", "c 7 17 1 5 5 1"]);
}

/// A delta holds the keys whose sessions changed since the previous snapshot, and a
/// delete for each key whose sessions all closed since.
#[test]
fn a_delta_holds_the_keys_changed_and_a_delete_for_each_key_closed_since() {
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    let input = [(0, "a", Some(1)), (30, "a", Some(1)), (0, "b", Some(2)), (0, "c", Some(3)), (40, "d", None)];
    operator.on_data(rows(10, &input), &mut Vec::new()).expect("data");
    assert_eq!(testing::snapshot(&mut operator, true).0, SnapshotKind::Full, "the first snapshot is full");
    // The watermark closes [0, 10) of a (which keeps [30, 40)), b's and c's only
    // sessions; c comes back; d is untouched.
    let mut out = Vec::new();
    operator.on_watermark(9, &mut out).expect("watermark");
    whole(&mut operator, &mut out);
    assert_eq!(lines(out).len(), 3);
    operator.on_data(rows(10, &[(12, "c", Some(4))]), &mut Vec::new()).expect("data");
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    let mut written: Vec<(u32, Vec<u8>, bool)> =
        delta.points.iter().map(|(vnode, key, value)| (*vnode, key.clone(), value.is_some())).collect();
    written.sort();
    let mut expected: Vec<(u32, Vec<u8>, bool)> =
        [("a", true), ("b", false), ("c", true)].iter().map(|(k, put)| (key_vnode(k), key_bytes(k), *put)).collect();
    expected.sort();
    assert_eq!(written, expected);
    let (kind, nothing) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert!(nothing.points.is_empty(), "nothing changed since");
    assert_eq!(testing::snapshot(&mut operator, false).0, SnapshotKind::Full, "after a snapshot not written");
}

/// The one record of a full snapshot of `operator`.
fn the_record(operator: &mut SessionAggregate) -> Record {
    let puts = testing::puts(&testing::snapshot(operator, false).1);
    let [record] = puts.as_slice() else { panic!("one key: {puts:?}") };
    record.clone()
}

fn one_key() -> Record {
    let mut original = aggregate(Arc::new(AtomicU64::new(0)));
    original.on_data(rows(10, &[(0, "a", Some(1)), (30, "a", None)]), &mut Vec::new()).expect("data");
    the_record(&mut original)
}

#[test]
fn damaged_records_are_refused() {
    let record = one_key();
    let damaged = |change: &dyn Fn(&mut Record)| {
        let mut damaged = record.clone();
        change(&mut damaged);
        let restored = testing::restore_records(&mut aggregate(Arc::new(AtomicU64::new(0))), vec![damaged]);
        restored.map(|_| ()).map_err(|error| error.code)
    };
    let corrupt = Err("state.corrupt");
    for cut in [0, 3, 9, 20, record.2.len() - 1] {
        assert_eq!(damaged(&|r| r.2.truncate(cut)), corrupt, "a value cut at {cut}");
    }
    assert_eq!(damaged(&|r| r.2.push(0)), corrupt, "trailing bytes");
    assert_eq!(damaged(&|r| r.0 = (r.0 + 1) % VNODES), corrupt, "under another vnode than its key's");
    assert_eq!(damaged(&|r| r.2[..4].copy_from_slice(&0u32.to_le_bytes())), corrupt, "no sessions");
    assert_eq!(damaged(&|r| r.2[..4].copy_from_slice(&u32::MAX.to_le_bytes())), corrupt, "more sessions than bytes");
    assert_eq!(damaged(&|r| r.2[20] = 2), corrupt, "a float where COUNT(*)'s integer belongs");
    assert_eq!(damaged(&|r| r.2[12..20].copy_from_slice(&0i64.to_le_bytes())), corrupt, "an empty session");
    // The second session ([30, 40)) moved to start where the first ([0, 10)) ends: after
    // the count, the first's bounds, COUNT(*), SUM and MAX, and its set of one value.
    let touching = |r: &mut Record| {
        let second = 4 + 16 + 3 * 9 + (1 + 4 + 4 + 9);
        r.2[second..second + 8].copy_from_slice(&10i64.to_le_bytes());
    };
    assert_eq!(damaged(&touching), corrupt, "sessions touching");
    let rekeyed = |r: &mut Record| {
        // The key of a BIGINT 1 (another plan's), under its own vnode.
        r.1 = vec![0x02, 1, 0, 0, 0, 0, 0, 0, 0];
        r.0 = vnode::of_hash(sluice_types::key::hash(&r.1), VNODES);
    };
    assert_eq!(damaged(&rekeyed), corrupt, "a key of another type");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes, and any damage to a valid record, give an error or a state, never a
    /// panic, whatever follows.
    #[test]
    fn arbitrary_records_never_panic(
        key in prop::collection::vec(any::<u8>(), 0..24),
        value in prop::collection::vec(any::<u8>(), 0..64),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let _ = testing::restore_records(&mut aggregate(Arc::new(AtomicU64::new(0))), vec![(0, key, value)]);
        let mut record = one_key();
        for (at, byte) in edits {
            let field = if at % 2 == 0 { &mut record.2 } else { &mut record.1 };
            if !field.is_empty() {
                let at = at % field.len();
                field[at] = byte;
            }
        }
        let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
        if testing::restore_records(&mut operator, vec![record]).is_ok() {
            let _ = operator.on_data(rows(10, &[(5, "a", Some(3))]), &mut Vec::new());
            let mut out = Vec::new();
            let mut ok = operator.on_watermark(20, &mut out).is_ok();
            while ok && operator.has_more() {
                ok = operator.on_resume(&mut out).is_ok();
            }
            if ok {
                let _ = operator.on_end(&mut out);
            }
        }
    }
}

/// A golden vector: records are persisted, so their layout (and the key encoding and
/// hash inside) must not change silently; a change fails here and bumps
/// `SESSION_STATE_VERSION`.
#[test]
fn a_snapshot_record_is_pinned_byte_for_byte() {
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    operator.on_data(rows(10, &[(100, "ab", Some(5)), (104, "ab", Some(5))]), &mut Vec::new()).expect("data");
    let (vnode, key, value) = the_record(&mut operator);
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    assert_eq!(hex(&key), "06020000006162", "VARCHAR \"ab\"");
    let expected = concat!(
        "01000000", // 1 session
        "6400000000000000",
        "7200000000000000", // start 100, end 114
        "01",
        "0200000000000000", // COUNT(*) = 2
        "01",
        "0a00000000000000", // SUM(v) = 10
        "01",
        "0500000000000000", // MAX(v) = 5
        "05",
        "01000000",
        "09000000",
        "020500000000000000", // COUNT(DISTINCT v): {5}
    );
    assert_eq!(hex(&value), expected);
    assert_eq!(vnode, key_vnode("ab"));
    let mut restored = aggregate(Arc::new(AtomicU64::new(0)));
    testing::restore_records(&mut restored, vec![(vnode, key, value)]).expect("restore");
    assert_eq!(ended(&mut restored), ["ab 100 114 2 10 5 1"]);
}
