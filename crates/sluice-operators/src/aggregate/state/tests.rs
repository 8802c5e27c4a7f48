//! The window aggregate's snapshots: an oracle (a from-scratch aggregation of the rows
//! not late) over random input with checkpoints, deltas when they can be, and restores
//! onto split and merged instances; what a delta holds; the records pinned byte for
//! byte; damaged records refused.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use proptest::prelude::*;
use sluice_runtime::{Operator, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, vnode};

use super::super::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregate, WindowAggregateSpec};
use crate::blob::ordered_i64;
use crate::spill::SpillSpace;
use crate::testing::{self, whole};

const VNODES: u32 = 16;

/// A record: vnode, key, value.
type Record = (u32, Vec<u8>, Vec<u8>);
/// Windows are tumbling, this long.
const SIZE: i64 = 10;

fn input_schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// `window_end, [k,] COUNT(*), SUM(v), MAX(v), COUNT(DISTINCT v), MIN(name), AVG(v)`,
/// grouped by the window and `k` (`keyed`) or by the window alone.
fn aggregate_of(keyed: bool, late: &Arc<AtomicU64>) -> WindowAggregate {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    let mut fields = vec![Field::new("end", ts, false)];
    let mut groups = vec![GroupColumn::WindowEnd];
    if keyed {
        fields.push(Field::new("k", DataType::Utf8, false));
        groups.push(GroupColumn::Key(0));
    }
    for (name, data_type) in [
        ("n", DataType::Int64),
        ("total", DataType::Int64),
        ("top", DataType::Int64),
        ("kinds", DataType::Int64),
        ("first", DataType::Utf8),
        ("mean", DataType::Float64),
    ] {
        fields.push(Field::new(name, data_type, true));
    }
    let aggregate = |function, argument| AggregateSpec { function, argument, filter: None };
    let spec = WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: if keyed { vec![2] } else { Vec::new() },
        groups,
        aggregates: vec![
            aggregate(AggregateFunction::CountRows, None),
            aggregate(AggregateFunction::Sum, Some(3)),
            aggregate(AggregateFunction::Max, Some(3)),
            aggregate(AggregateFunction::CountDistinct, Some(3)),
            aggregate(AggregateFunction::Min, Some(4)),
            aggregate(AggregateFunction::Avg, Some(3)),
        ],
        output: Arc::new(Schema::new(fields)),
        batch_size: 4,
        late_weights: None,
    };
    WindowAggregate::new(spec, &input_schema(), Arc::clone(late), VNODES).expect("aggregate")
}

fn aggregate() -> WindowAggregate {
    aggregate_of(true, &Arc::new(AtomicU64::new(0)))
}

/// A row: event time, key, value, name. Its window is `[ts - ts % SIZE, + SIZE)`.
type Row<'a> = (i64, &'a str, Option<i64>, Option<&'a str>);

fn rows(rows: &[Row<'_>]) -> Batch {
    let start = |ts: i64| ts.div_euclid(SIZE) * SIZE;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| start(r.0)))),
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| start(r.0) + SIZE))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
    ];
    Batch::inserts(RecordBatch::try_new(input_schema(), columns).expect("batch"))
}

fn aggregate_with(input: &[Row<'_>]) -> WindowAggregate {
    let mut aggregate = aggregate();
    aggregate.on_data(rows(input), &mut Vec::new()).expect("data");
    aggregate
}

/// The output rows of `out` as `end,[k,]n,total,top,kinds,first,mean` (∅ for NULL).
fn lines(out: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        let rows = &batch.rows;
        for row in 0..rows.num_rows() {
            let cells: Vec<String> = rows
                .columns()
                .iter()
                .map(|column| match column.as_any().downcast_ref::<TimestampMillisecondArray>() {
                    Some(times) => times.value(row).to_string(),
                    None if column.is_null(row) => "∅".to_string(),
                    None => array_value_to_string(column, row).expect("display"),
                })
                .collect();
            lines.push(cells.join(","));
        }
    }
    lines.sort();
    lines
}

/// Every output row of `aggregate` once its input ends, sorted.
fn emitted(aggregate: &mut WindowAggregate) -> Vec<String> {
    let mut out = Vec::new();
    aggregate.on_end(&mut out).expect("end");
    whole(aggregate, &mut out);
    lines(&out)
}

/// The vnode of key `k`'s group.
/// A watermark that closes many windows, some of them evicted, emits them in parts:
/// each about a batch of rows (a window in memory whole, an evicted one's groups a batch
/// at a time), the watermark only with the last; together the rows of one emission.
#[test]
fn a_watermark_closing_many_windows_emits_them_in_parts() {
    const WINDOWS: i64 = 12;
    const KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    let input: Vec<Row<'static>> = (0..WINDOWS)
        .flat_map(|window| KEYS.iter().enumerate().map(move |(v, k)| (window * SIZE + 1, *k, Some(v as i64), None)))
        .collect();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let space = SpillSpace::new(dir.path().to_path_buf(), 0);
    let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
    let mut spilling = aggregate().with_spill(Arc::clone(&space), crate::spill::spilled_bytes(&metrics));
    // A budget of 0: each batch's windows are evicted as it ends, and the second batch
    // brings two keys of each window back into memory.
    spilling.on_data(rows(&input), &mut Vec::new()).expect("data");
    let again: Vec<Row<'static>> = input.iter().filter(|row| row.1 < "c").copied().collect();
    spilling.on_data(rows(&again), &mut Vec::new()).expect("data");
    assert!(space.spilled() > 0, "the windows were evicted");
    let mut first = Vec::new();
    spilling.on_watermark(WINDOWS * SIZE, &mut first).expect("watermark");
    let parts = testing::parts(&mut spilling, first);
    assert!(parts.len() > 2, "{} parts", parts.len());
    for (index, part) in parts.iter().enumerate() {
        let rows = testing::data_rows(part);
        // Fewer than a batch (4), then one window's groups in memory (2) or a batch; the
        // last part may hold the watermark alone.
        let least = usize::from(index + 1 < parts.len());
        assert!((least..=3 + 4).contains(&rows), "part {index}: {rows} rows");
        let controls: Vec<&Message> = part.iter().filter(|m| !matches!(m, Message::Data(_))).collect();
        if index + 1 == parts.len() {
            assert!(matches!(controls[..], [Message::Watermark(w)] if *w == WINDOWS * SIZE), "{controls:?}");
            assert!(matches!(part.last(), Some(Message::Watermark(_))), "the watermark goes last");
        } else {
            assert!(controls.is_empty(), "part {index}: {controls:?}");
        }
    }
    let mut whole_input = input.clone();
    whole_input.extend(again);
    assert_eq!(lines(&parts.concat()), emitted(&mut aggregate_with(&whole_input)));
    assert!(spilling.windows.is_empty(), "every window closed");
    assert!(emitted(&mut spilling).is_empty(), "nothing emitted twice");
}

fn key_vnode(k: &str) -> u32 {
    vnode::of_hash(sluice_types::key::hash(&key_bytes(k)), VNODES)
}

/// `k` in the key encoding.
fn key_bytes(k: &str) -> Vec<u8> {
    [&[0x06][..], &(k.len() as u32).to_le_bytes(), k.as_bytes()].concat()
}

#[test]
fn a_restored_aggregate_emits_what_the_original_would_split_by_vnode_across_instances() {
    let input = [(0, "a", Some(1), None), (0, "b", Some(2), Some("x")), (10, "a", None, None), (0, "a", Some(1), None)];
    let mut original = aggregate_with(&input);
    original.on_data(rows(&[(10, "c", Some(5), Some("y"))]), &mut Vec::new()).expect("data");
    let mut runs = StateModel::default();
    testing::checkpoint(&mut original, &mut runs, 0..VNODES, false);
    assert!(runs.records().keys().map(|(vnode, _)| vnode).collect::<std::collections::BTreeSet<_>>().len() > 1);
    // Restore onto two instances owning half the vnodes each, as after rescaling.
    let mut restored = Vec::new();
    for vnodes in [0..VNODES / 2, VNODES / 2..VNODES] {
        let mut instance = aggregate();
        testing::restore(&mut instance, &runs, vnodes).expect("restore");
        restored.extend(emitted(&mut instance));
    }
    restored.sort();
    assert_eq!(restored, emitted(&mut original));
    assert_eq!(restored.len(), 4, "(a,0) (b,0) (a,10) (c,10)");
}

/// Restores the records of `runs` into a fresh aggregate and returns what it emits.
fn restored(runs: &StateModel) -> Vec<String> {
    let mut fresh = aggregate();
    testing::restore(&mut fresh, runs, 0..VNODES).expect("restore");
    emitted(&mut fresh)
}

#[test]
fn a_snapshot_holds_the_state_at_the_barrier_while_processing_goes_on() {
    let before: &[Row<'_>] = &[(0, "a", Some(1), Some("p")), (0, "b", Some(2), None)];
    let after: &[Row<'_>] = &[(0, "a", Some(7), Some("o")), (0, "d", None, None), (10, "c", Some(3), None)];
    let all: Vec<Row<'_>> = before.iter().chain(after).copied().collect();
    let mut original = aggregate_with(before);
    let first = original.snapshot_state(true).expect("snapshot").expect("state");
    assert_eq!(first.kind, SnapshotKind::Full, "the first snapshot is full, even when a delta may be");
    // Rows after the barrier change the live state, not the copy being written.
    original.on_data(rows(after), &mut Vec::new()).expect("data");
    let mut records = sluice_state::CollectedState::default();
    (first.job)(&mut records).expect("records");
    let mut runs = StateModel::default();
    runs.apply(0..VNODES, true, records);
    assert_eq!(restored(&runs), emitted(&mut aggregate_with(before)));
    // The next snapshot, a delta reusing the first one's buffers, sees the later rows.
    testing::checkpoint(&mut original, &mut runs, 0..VNODES, true);
    assert_eq!(restored(&runs), emitted(&mut aggregate_with(&all)));
    assert_eq!(emitted(&mut original), emitted(&mut aggregate_with(&all)));
}

#[test]
fn many_groups_survive_deltas_that_copy_only_what_changed() {
    let names: Vec<String> = (0..50_000).map(|i| format!("key-{i}")).collect();
    let input = |range: Range<usize>, value: i64| -> Vec<Row<'_>> {
        range.map(|i| (0, names[i].as_str(), Some(value), None)).collect()
    };
    let first = input(0..30_000, 1);
    let second = input(20_000..50_000, 2);
    let all: Vec<Row<'_>> = first.iter().chain(&second).copied().collect();
    let mut original = aggregate_with(&first);
    let mut runs = StateModel::default();
    testing::checkpoint(&mut original, &mut runs, 0..VNODES, true);
    assert_eq!(restored(&runs), emitted(&mut aggregate_with(&first)));
    original.on_data(rows(&second), &mut Vec::new()).expect("data");
    let (kind, delta) = testing::snapshot(&mut original, true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert_eq!(delta.points.len(), 30_000, "10,000 groups changed and 20,000 new, not the 20,000 untouched");
    runs.apply(0..VNODES, false, delta);
    let expected = emitted(&mut aggregate_with(&all));
    assert_eq!(expected.len(), 50_000);
    assert_eq!(restored(&runs), expected);
    assert_eq!(emitted(&mut original), expected);
}

/// A delta holds, per open window, the groups added or updated since the previous
/// snapshot, and one range delete per vnode of the windows emitted since.
#[test]
fn a_delta_holds_the_groups_changed_and_a_range_delete_of_the_windows_emitted_since() {
    let mut operator = aggregate_with(&[(0, "a", Some(1), None), (0, "b", Some(2), None), (10, "a", Some(3), None)]);
    assert_eq!(testing::snapshot(&mut operator, true).0, SnapshotKind::Full, "the first snapshot is full");
    // Window 10 is emitted; in window 20, `a` changes and `c` is new; `b` of window 10
    // is gone with its window.
    operator.on_data(rows(&[(12, "a", Some(4), None), (15, "c", None, Some("z"))]), &mut Vec::new()).expect("data");
    let mut out = Vec::new();
    operator.on_watermark(9, &mut out).expect("watermark");
    whole(&mut operator, &mut out);
    assert_eq!(lines(&out).len(), 2, "window 10's groups");
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    let key = |end: i64, k: &str| [&ordered_i64(end)[..], &key_bytes(k)].concat();
    let mut written: Vec<(u32, Vec<u8>, bool)> =
        delta.points.iter().map(|(v, k, value)| (*v, k.clone(), value.is_some())).collect();
    written.sort();
    let mut expected = vec![(key_vnode("a"), key(20, "a"), true), (key_vnode("c"), key(20, "c"), true)];
    expected.sort();
    assert_eq!(written, expected);
    // The vnodes the instance's records may lie in: from the lowest of the groups'
    // written (a, b, c) to the highest.
    let vnodes = ["a", "b", "c"].map(key_vnode);
    let (low, high) = (vnodes.iter().min().copied().expect("3"), vnodes.iter().max().copied().expect("3"));
    let ranges: Vec<Record> =
        (low..=high).map(|vnode| (vnode, ordered_i64(i64::MIN).to_vec(), ordered_i64(11).to_vec())).collect();
    assert_eq!(delta.ranges, ranges, "every window ending at 10 or before");
    let (kind, nothing) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert!(nothing.points.is_empty() && nothing.ranges.is_empty(), "nothing changed since");
    // A delta may not follow a snapshot that was not written: a full one does.
    assert_eq!(testing::snapshot(&mut operator, false).0, SnapshotKind::Full);
}

/// The one record of a full snapshot of `operator`.
fn the_record(operator: &mut WindowAggregate) -> Record {
    let puts = testing::puts(&testing::snapshot(operator, false).1);
    let [record] = puts.as_slice() else { panic!("one group: {puts:?}") };
    record.clone()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

/// A golden vector: records are persisted, so their layout (and the key encoding and
/// hash inside) must not change silently; a change fails here and bumps
/// `WINDOW_STATE_VERSION`.
#[test]
fn a_snapshot_record_is_pinned_byte_for_byte() {
    let mut operator = aggregate_with(&[(100, "ab", Some(5), Some("x")), (104, "ab", Some(5), None)]);
    let (vnode, key, value) = the_record(&mut operator);
    assert_eq!(hex(&key), concat!("800000000000006e", "06020000006162"), "end 110, VARCHAR \"ab\"");
    let expected = concat!(
        "6400000000000000",   // start 100
        "01",                 // COUNT(*) = 2
        "0200000000000000",   //
        "01",                 // SUM(v) = 10
        "0a00000000000000",   //
        "01",                 // MAX(v) = 5
        "0500000000000000",   //
        "05",                 // COUNT(DISTINCT v): {5}
        "01000000",           //
        "09000000",           //
        "020500000000000000", //
        "03",                 // MIN(name) = "x"
        "01000000",           //
        "78",                 //
        "04",                 // AVG(v): sum 10.0, count 2
        "0000000000002440",   //
        "0200000000000000",   //
    );
    assert_eq!(hex(&value), expected);
    assert_eq!(vnode, key_vnode("ab"));
    let mut restored = aggregate();
    testing::restore_records(&mut restored, vec![(vnode, key.clone(), value.clone())]).expect("restore");
    assert_eq!(emitted(&mut restored), ["110,ab,2,10,5,1,x,5.0"]);
    // A set's values in increasing byte order, each once.
    let twice = expected
        .replace("0501000000", "0502000000")
        .replace("09000000020500000000000000", "0900000002050000000000000009000000020500000000000000");
    let error = testing::restore_records(&mut aggregate(), vec![(vnode, key, unhex(&twice))]).expect_err("twice");
    assert_eq!(error.code, "state.corrupt");
}

#[test]
fn damaged_records_are_refused() {
    let mut original = aggregate_with(&[(0, "a", Some(1), Some("n"))]);
    let record = the_record(&mut original);
    let damaged = |change: &dyn Fn(&mut Record)| {
        let mut damaged = record.clone();
        change(&mut damaged);
        testing::restore_records(&mut aggregate(), vec![damaged]).map(|_| ()).map_err(|error| error.code)
    };
    let corrupt = Err("state.corrupt");
    for cut in [0, 3, 8, 9, record.2.len() - 1] {
        assert_eq!(damaged(&|r| r.2.truncate(cut)), corrupt, "a value cut at {cut}");
    }
    assert_eq!(damaged(&|r| r.2.push(0)), corrupt, "trailing bytes");
    assert_eq!(damaged(&|r| r.1.truncate(5)), corrupt, "a key shorter than a window end");
    assert_eq!(damaged(&|r| r.0 = (r.0 + 1) % VNODES), corrupt, "under another vnode than its key's");
    assert_eq!(damaged(&|r| r.2[8] = 2), corrupt, "a float where COUNT(*)'s integer belongs");
    assert_eq!(damaged(&|r| r.2[8] = 9), corrupt, "an unknown tag");
    assert_eq!(damaged(&|r| r.2[..8].copy_from_slice(&SIZE.to_le_bytes())), corrupt, "a window ending at its start");
    let rekeyed = |r: &mut Record| {
        // The key of a BIGINT 1 (another plan's), under its own vnode.
        r.1.truncate(8);
        r.1.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0, 0, 1]);
        r.0 = vnode::of_hash(sluice_types::key::hash(&r.1[8..]), VNODES);
    };
    assert_eq!(damaged(&rekeyed), corrupt, "a key of another type");
    // Two groups of one window disagreeing on its start.
    let mut other = the_record(&mut aggregate_with(&[(0, "b", Some(1), None)]));
    other.2[..8].copy_from_slice(&1i64.to_le_bytes());
    let error = testing::restore_records(&mut aggregate(), vec![record.clone(), other]).expect_err("two starts");
    assert_eq!(error.code, "state.corrupt");
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
        let _ = testing::restore_records(&mut aggregate(), vec![(0, key, value)]);
        let mut record = the_record(&mut aggregate_with(&[(0, "a", Some(1), Some("n")), (3, "a", Some(2), None)]));
        for (at, byte) in edits {
            let field = if at % 2 == 0 { &mut record.2 } else { &mut record.1 };
            if !field.is_empty() {
                let at = at % field.len();
                field[at] = byte;
            }
        }
        let mut operator = aggregate();
        if testing::restore_records(&mut operator, vec![record]).is_ok() {
            let _ = operator.on_data(rows(&[(5, "a", Some(3), None)]), &mut Vec::new());
            let mut out = Vec::new();
            if operator.on_end(&mut out).is_ok() {
                while operator.has_more() && operator.on_resume(&mut out).is_ok() {}
            }
        }
    }
}

/// Instances of the aggregate and the runs their checkpoints wrote: `ranges[i]` are the
/// vnodes of `instances[i]`.
struct Running {
    instances: Vec<WindowAggregate>,
    ranges: Vec<Range<u32>>,
    runs: StateModel,
}

impl Running {
    /// A checkpoint: every instance's snapshot (a delta when it can) into the runs.
    fn checkpoint(&mut self) {
        for (instance, vnodes) in self.instances.iter_mut().zip(&self.ranges) {
            testing::checkpoint(instance, &mut self.runs, vnodes.clone(), true);
        }
    }

    /// A checkpoint, then new instances owning `ranges` restored from the runs, given
    /// the watermark (as a restored driver sends its lanes' first).
    fn restart(&mut self, ranges: Vec<Range<u32>>, watermark: i64, make: &dyn Fn() -> WindowAggregate) {
        self.checkpoint();
        self.ranges = ranges;
        self.instances = self
            .ranges
            .iter()
            .map(|vnodes| {
                let mut instance = make();
                testing::restore(&mut instance, &self.runs, vnodes.clone()).expect("restore");
                if watermark > i64::MIN {
                    let mut out = Vec::new();
                    instance.on_watermark(watermark, &mut out).expect("watermark");
                    whole(&mut instance, &mut out);
                    assert!(lines(&out).is_empty(), "a restored window was emitted before the checkpoint");
                }
                instance
            })
            .collect();
    }

    /// The instance owning the group of `key` (vnode 0's without keys).
    fn owner(&self, key: Option<&str>) -> usize {
        let vnode = key.map_or(vnode::of_hash(0, VNODES), key_vnode);
        self.ranges.iter().position(|range| range.contains(&vnode)).expect("every vnode is owned")
    }
}

/// A row's value and name, as the reference keeps them.
type Cells = (Option<i64>, Option<&'static str>);

/// From scratch: the rows not late, by window end and key, and what each watermark
/// emits.
#[derive(Default)]
struct Reference {
    watermark: Option<i64>,
    open: BTreeMap<(i64, String), Vec<Cells>>,
    late: u64,
}

impl Reference {
    fn add(&mut self, rows: &[Row<'static>], keyed: bool) {
        for &(ts, key, value, name) in rows {
            let end = ts.div_euclid(SIZE) * SIZE + SIZE;
            if self.watermark.is_some_and(|watermark| end - 1 <= watermark) {
                self.late += 1;
            } else {
                let key = if keyed { key.to_string() } else { String::new() };
                self.open.entry((end, key)).or_default().push((value, name));
            }
        }
    }

    /// The lines of the windows due at `watermark` (all of them for None), taken out.
    fn emit(&mut self, watermark: Option<i64>, keyed: bool) -> Vec<String> {
        if let Some(watermark) = watermark {
            self.watermark = Some(watermark);
        }
        let due: Vec<(i64, String)> =
            self.open.keys().filter(|(end, _)| watermark.is_none_or(|w| end - 1 <= w)).cloned().collect();
        let mut lines = Vec::new();
        for (end, key) in due {
            let rows = self.open.remove(&(end, key.clone())).expect("due");
            let values: Vec<i64> = rows.iter().filter_map(|r| r.0).collect();
            let show = |value: Option<String>| value.unwrap_or_else(|| "∅".to_string());
            let sum = (!values.is_empty()).then(|| values.iter().sum::<i64>());
            let distinct: std::collections::BTreeSet<i64> = values.iter().copied().collect();
            let mean = sum.map(|sum| {
                let column: ArrayRef = Arc::new(Float64Array::from(vec![sum as f64 / values.len() as f64]));
                array_value_to_string(&column, 0).expect("display")
            });
            let mut cells = vec![end.to_string()];
            if keyed {
                cells.push(key);
            }
            cells.extend([
                rows.len().to_string(),
                show(sum.map(|s| s.to_string())),
                show(values.iter().max().map(i64::to_string)),
                distinct.len().to_string(),
                show(rows.iter().filter_map(|r| r.1).min().map(str::to_string)),
                show(mean),
            ]);
            lines.push(cells.join(","));
        }
        lines.sort();
        lines
    }
}

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

fn row_strategy() -> impl Strategy<Value = Row<'static>> {
    (
        0i64..60,
        prop::sample::select(KEYS.to_vec()),
        prop::option::weighted(0.8, -3i64..5),
        prop::option::weighted(0.7, prop::sample::select(vec!["p", "q", "r"])),
    )
}

/// One random run: batches of rows each followed by a watermark, whether the windows
/// are keyed, and when the instances split (at `split`) and merge back.
type Steps = Vec<(Vec<Row<'static>>, i64)>;

fn case() -> impl Strategy<Value = (Steps, bool, usize, usize, u32)> {
    (
        prop::collection::vec((prop::collection::vec(row_strategy(), 0..10), 0i64..70), 1..14),
        any::<bool>(),
        0usize..14,
        0usize..18,
        1u32..VNODES,
    )
}

/// After every step the windows emitted are the from-scratch aggregation's, with
/// checkpoints every few steps (deltas) and, at `split_at`, a restart from the runs onto
/// two instances splitting the vnodes at `split` (rows routed by key, as the exchange
/// does), at `merge_at` back onto one. With `space`, the instances' windows count in its
/// budget and spill beyond it.
fn check_windows(
    (steps, keyed, split_at, merge_at, split): (Steps, bool, usize, usize, u32),
    space: Option<&Arc<SpillSpace>>,
) -> Result<(), TestCaseError> {
    let late = Arc::new(AtomicU64::new(0));
    let make = || {
        let aggregate = aggregate_of(keyed, &late);
        match space {
            Some(space) => {
                let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
                aggregate.with_spill(Arc::clone(space), crate::spill::spilled_bytes(&metrics))
            }
            None => aggregate,
        }
    };
    let mut running =
        Running { instances: vec![make()], ranges: testing::one_instance(VNODES), runs: StateModel::default() };
    let mut reference = Reference::default();
    let mut watermark = i64::MIN;
    for (index, (batch, next)) in steps.iter().enumerate() {
        if index == split_at {
            running.restart([0, split, VNODES].windows(2).map(|pair| pair[0]..pair[1]).collect(), watermark, &make);
        } else if index == merge_at {
            running.restart(testing::one_instance(VNODES), watermark, &make);
        } else if index % 3 == 1 {
            running.checkpoint();
        }
        let mut parts: Vec<Vec<Row<'static>>> = vec![Vec::new(); running.instances.len()];
        for row in batch {
            parts[running.owner(keyed.then_some(row.1))].push(*row);
        }
        for (instance, part) in running.instances.iter_mut().zip(parts) {
            instance.on_data(rows(&part), &mut Vec::new()).expect("data");
        }
        reference.add(batch, keyed);
        watermark = watermark.max(*next);
        let mut out = Vec::new();
        for instance in &mut running.instances {
            instance.on_watermark(watermark, &mut out).expect("watermark");
            whole(instance, &mut out);
        }
        prop_assert_eq!(lines(&out), reference.emit(Some(watermark), keyed), "step {}", index);
    }
    let mut out = Vec::new();
    for instance in &mut running.instances {
        instance.on_end(&mut out).expect("end");
        whole(instance, &mut out);
    }
    prop_assert_eq!(lines(&out), reference.emit(None, keyed));
    prop_assert_eq!(late.load(Ordering::Relaxed), reference.late);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn windows_match_a_from_scratch_aggregation_across_checkpoints_and_restarts(case in case()) {
        check_windows(case, None)?;
    }

    /// The same with a memory budget of 0: the windows are evicted at the end of each
    /// batch (and as a restore loads them), their groups read back by their keys' next
    /// rows, by emission, by deltas and by full snapshots.
    #[test]
    fn evicted_windows_give_the_same_aggregates(case in case()) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 0);
        check_windows(case, Some(&space))?;
        prop_assert_eq!((space.resident(), space.spilled()), (0, 0), "dropped instances count nothing");
    }
}
