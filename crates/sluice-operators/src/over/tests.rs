//! The OVER aggregate: frames row by row, a reference over random input (rows, watermarks,
//! batch splits, checkpoints (deltas when they can be) and restores onto split and merged
//! instances), and its state records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_runtime::{Operator, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, vnode};

use super::{OverAggregate, OverFrame, OverSpec};
use crate::aggregate::{AggregateFunction, AggregateSpec};
use crate::spill::SpillSpace;
use crate::testing::{self, whole};

const VNODES: u32 = 16;

/// A record: vnode, key, value.
type Record = (u32, Vec<u8>, Vec<u8>);

/// Input: partition `p`, event time `ts`, value `v` (nullable), row name `s`.
fn input_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("p", DataType::Utf8, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, false),
    ]))
}

const FUNCTIONS: [(AggregateFunction, &str); 6] = [
    (AggregateFunction::CountRows, "n"),
    (AggregateFunction::Count, "c"),
    (AggregateFunction::Sum, "sum"),
    (AggregateFunction::Min, "min"),
    (AggregateFunction::Max, "max"),
    (AggregateFunction::Avg, "avg"),
];

/// Every aggregate of `v` over `frame`, partitioned by `p` (or not), ordered by `ts`.
fn over(frame: OverFrame, partitioned: bool, late: &Arc<AtomicU64>) -> OverAggregate {
    let mut fields: Vec<Field> = input_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut aggregates = Vec::new();
    for (function, name) in FUNCTIONS {
        let argument = (function != AggregateFunction::CountRows).then_some(2);
        aggregates.push(AggregateSpec { function, argument, filter: None });
        fields.push(Field::new(name, DataType::Int64, true));
    }
    let spec = OverSpec {
        time: 1,
        partition: if partitioned { vec![0] } else { Vec::new() },
        passthrough: 4,
        aggregates,
        frame,
        output: Arc::new(Schema::new(fields)),
        batch_size: 3,
    };
    OverAggregate::new(spec, &input_schema(), Arc::clone(late), VNODES).expect("over")
}

type Row = (&'static str, Option<i64>, Option<i64>, String);

fn batch(rows: &[Row]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(TimestampMillisecondArray::from_iter(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3.as_str()))),
    ];
    Batch::inserts(RecordBatch::try_new(input_schema(), columns).expect("batch"))
}

fn row(p: &'static str, ts: i64, v: Option<i64>, s: &str) -> Row {
    (p, Some(ts), v, s.to_string())
}

/// Output rows as `s: n,c,sum,min,max,avg` (empty for NULL), and watermarks as `wm W`.
fn lines(out: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        match message {
            Message::Data(batch) => {
                assert!(batch.is_append_only());
                for index in 0..batch.num_rows() {
                    let cell = |c: usize| {
                        arrow::util::display::array_value_to_string(batch.rows.column(c), index).expect("format")
                    };
                    let aggregates: Vec<String> = (4..10).map(cell).collect();
                    lines.push(format!("{}: {}", cell(3), aggregates.join(",")));
                }
            }
            Message::Watermark(w) => lines.push(format!("wm {w}")),
            _ => {}
        }
    }
    lines
}

fn data(operator: &mut OverAggregate, rows: &[Row]) {
    let mut out = Vec::new();
    operator.on_data(batch(rows), &mut out).expect("data");
    assert!(out.is_empty(), "rows wait for the watermark");
}

fn watermark(operator: &mut OverAggregate, w: i64) -> Vec<String> {
    let mut out = Vec::new();
    operator.on_watermark(w, &mut out).expect("watermark");
    whole(operator, &mut out);
    lines(&out)
}

/// What a watermark releases goes out in parts of whole partitions, about a batch (3
/// rows) each, the watermark with the last; the rows it leaves pending stay.
#[test]
fn a_watermark_releasing_many_partitions_emits_them_in_parts() {
    const KEYS: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = over(OverFrame::Rows(Some(1)), true, &late);
    let rows: Vec<Row> = KEYS
        .iter()
        .flat_map(|k| [row(k, 1, Some(1), &format!("{k}1")), row(k, 2, Some(2), &format!("{k}2"))])
        .chain([row("a", 9, Some(9), "a9")])
        .collect();
    data(&mut operator, &rows);
    let mut first = Vec::new();
    operator.on_watermark(5, &mut first).expect("watermark");
    let parts = testing::parts(&mut operator, first);
    let shape: Vec<(usize, bool)> = parts
        .iter()
        .map(|part| {
            let rows = testing::data_rows(part);
            (rows, matches!(part.last(), Some(Message::Watermark(5))))
        })
        .collect();
    assert_eq!(shape, [(4, false), (4, false), (4, false), (4, false), (4, true)]);
    let released: Vec<String> = lines(&parts.concat()).into_iter().map(|line| line[..2].to_string()).collect();
    let expected: Vec<String> =
        KEYS.iter().flat_map(|k| [format!("{k}1"), format!("{k}2")]).chain(["wm".into()]).collect();
    assert_eq!(released, expected, "each partition's rows in time order, partitions in id order");
    let mut out = Vec::new();
    operator.on_end(&mut out).expect("end");
    whole(&mut operator, &mut out);
    assert_eq!(lines(&out).len(), 1, "a9 was left pending: {:?}", lines(&out));
}

#[test]
fn rows_wait_for_the_watermark_and_see_the_n_rows_before_them() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = over(OverFrame::Rows(Some(1)), true, &late);
    data(&mut operator, &[row("a", 5, Some(10), "r1"), row("a", 3, Some(4), "r2"), row("b", 4, None, "r3")]);
    // r2 (ts 3) precedes r1 (ts 5) in time; b's NULL is counted by COUNT(*) only.
    assert_eq!(watermark(&mut operator, 4), ["r2: 1,1,4,4,4,4", "r3: 1,0,,,,", "wm 4"]);
    data(&mut operator, &[row("a", 4, Some(1), "late"), row("a", 6, Some(-7), "r4")]);
    assert_eq!(late.load(Ordering::Relaxed), 1, "a row at the watermark is late");
    // ROWS 1: r1 sees r2; r4 sees r1, not r2. AVG(10, -7) = 1 (truncated).
    assert_eq!(watermark(&mut operator, 10), ["r1: 2,2,14,4,10,7", "r4: 2,2,3,-7,10,1", "wm 10"]);
    let mut out = Vec::new();
    operator.on_end(&mut out).expect("end");
    assert!(matches!(out.as_slice(), [Message::EndOfData]));
}

#[test]
fn range_peers_see_each_other_and_rows_ties_go_by_arrival() {
    let late = Arc::new(AtomicU64::new(0));
    let rows =
        [row("a", 1, Some(1), "x"), row("a", 2, Some(2), "y"), row("a", 2, Some(3), "z"), row("a", 4, Some(4), "w")];
    let mut range = over(OverFrame::Range(Some(1)), false, &late);
    data(&mut range, &rows);
    // RANGE 1: [ts - 1, ts]; y and z are peers.
    assert_eq!(
        watermark(&mut range, 9),
        ["x: 1,1,1,1,1,1", "y: 3,3,6,1,3,2", "z: 3,3,6,1,3,2", "w: 1,1,4,4,4,4", "wm 9"]
    );
    let mut unbounded = over(OverFrame::Range(None), false, &late);
    data(&mut unbounded, &rows);
    assert_eq!(watermark(&mut unbounded, 9)[1..3], ["y: 3,3,6,1,3,2", "z: 3,3,6,1,3,2"]);
    let mut running = over(OverFrame::Rows(None), false, &late);
    data(&mut running, &rows);
    assert_eq!(watermark(&mut running, 9)[1..3], ["y: 2,2,3,1,2,1", "z: 3,3,6,1,3,2"]);
}

#[test]
fn state_is_freed_as_the_frame_moves() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = over(OverFrame::Range(Some(10)), true, &late);
    data(&mut operator, &[row("a", 1, Some(1), "x"), row("b", 2, Some(1), "y")]);
    watermark(&mut operator, 5);
    assert_eq!(operator.partitions.iter().flatten().map(|p| p.history.len()).sum::<usize>(), 2);
    // Rows still to come are above 11: nothing at 1 or below can be in their frames.
    watermark(&mut operator, 11);
    assert_eq!(operator.partitions.iter().flatten().map(|p| p.history.len()).collect::<Vec<_>>(), [1], "a's row freed");
    watermark(&mut operator, 12);
    assert!(operator.partitions.iter().all(Option::is_none), "both partitions freed");
    assert!(operator.due.is_empty());
    let mut rows = over(OverFrame::Rows(Some(2)), true, &late);
    data(&mut rows, &(0..10).map(|i| row("a", i, Some(i), "r")).collect::<Vec<_>>());
    watermark(&mut rows, 20);
    assert_eq!(rows.partitions.iter().flatten().map(|p| p.history.len()).collect::<Vec<_>>(), [2]);
}

/// One step of a random run.
#[derive(Debug, Clone)]
enum Step {
    Rows(Vec<(usize, i64, Option<i64>)>),
    Watermark(i64),
    /// A checkpoint of every instance (a delta when it can be).
    Checkpoint,
    /// A checkpoint, then a restart from the runs: onto two instances splitting the
    /// vnodes there when one runs, else back onto one.
    Restart(u32),
}

const PARTITIONS: [&str; 3] = ["a", "b", "c"];

fn partition_vnode(key: &str) -> u32 {
    let mut rows = sluice_types::key::KeyRows::default();
    let encoder = sluice_types::key::KeyEncoder::new(vec![DataType::Utf8]).expect("encoder");
    let column: ArrayRef = Arc::new(StringArray::from(vec![key]));
    encoder.encode(&[column], &mut rows).expect("encode");
    vnode::of_hash(rows.hash(0), VNODES)
}

/// The expected lines of accepted rows (partition, time, value, name, arrival).
fn reference(rows: &[(&str, i64, Option<i64>, String, usize)], frame: OverFrame, partitioned: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let groups: &[&str] = if partitioned { &PARTITIONS } else { &["all"] };
    for &partition in groups {
        let mut mine: Vec<_> = rows.iter().filter(|r| !partitioned || r.0 == partition).collect();
        mine.sort_by_key(|r| (r.1, r.4));
        for (position, current) in mine.iter().enumerate() {
            let in_frame: Vec<Option<i64>> = mine
                .iter()
                .enumerate()
                .filter(|(other, r)| match frame {
                    OverFrame::Rows(None) => *other <= position,
                    OverFrame::Rows(Some(n)) => *other <= position && position - other <= n,
                    OverFrame::Range(None) => r.1 <= current.1,
                    OverFrame::Range(Some(d)) => r.1 <= current.1 && r.1 >= current.1 - d,
                })
                .map(|(_, r)| r.2)
                .collect();
            let values: Vec<i64> = in_frame.iter().flatten().copied().collect();
            let show = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
            let count = values.len() as i64;
            let sum = (count > 0).then(|| values.iter().sum::<i64>());
            let cells = [
                in_frame.len().to_string(),
                count.to_string(),
                show(sum),
                show(values.iter().min().copied()),
                show(values.iter().max().copied()),
                show(sum.map(|s| s / count)),
            ];
            lines.push(format!("{}: {}", current.3, cells.join(",")));
        }
    }
    lines.sort();
    lines
}

fn frame_strategy() -> impl Strategy<Value = OverFrame> {
    prop_oneof![
        Just(OverFrame::Rows(None)),
        (0usize..4).prop_map(|n| OverFrame::Rows(Some(n))),
        Just(OverFrame::Range(None)),
        (0i64..6).prop_map(|d| OverFrame::Range(Some(d))),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec((0..PARTITIONS.len(), 0i64..30, prop::option::weighted(0.8, -5i64..20)), 1..6)
            .prop_map(Step::Rows),
        2 => (0i64..4).prop_map(Step::Watermark),
        1 => Just(Step::Checkpoint),
        1 => (1u32..VNODES).prop_map(Step::Restart),
    ]
}

/// Instances of the aggregate and the runs their checkpoints wrote: `ranges[i]` are the
/// vnodes of `instances[i]`.
struct Running {
    instances: Vec<OverAggregate>,
    ranges: Vec<std::ops::Range<u32>>,
    runs: StateModel,
}

impl Running {
    fn checkpoint(&mut self) {
        for (instance, vnodes) in self.instances.iter_mut().zip(&self.ranges) {
            testing::checkpoint(instance, &mut self.runs, vnodes.clone(), true);
        }
    }

    /// A checkpoint, then instances owning `ranges` made by `make` and restored from the
    /// runs.
    fn restart(&mut self, ranges: Vec<std::ops::Range<u32>>, make: &dyn Fn() -> OverAggregate) {
        self.checkpoint();
        self.ranges = ranges;
        self.instances = (self.ranges.iter())
            .map(|vnodes| {
                let mut instance = make();
                testing::restore(&mut instance, &self.runs, vnodes.clone()).expect("restore");
                instance
            })
            .collect();
    }
}

/// Runs `steps` through OVER aggregates of `frame` (partitions spilling within `space`
/// when given) and checks every row is emitted once with the reference frame's values.
fn check_frames(
    steps: Vec<Step>,
    frame: OverFrame,
    partitioned: bool,
    space: Option<&Arc<SpillSpace>>,
) -> Result<(), TestCaseError> {
    let late = Arc::new(AtomicU64::new(0));
    let make = || {
        let over = over(frame, partitioned, &late);
        match space {
            Some(space) => {
                let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
                over.with_spill(Arc::clone(space), crate::spill::spilled_bytes(&metrics))
            }
            None => over,
        }
    };
    let mut running =
        Running { instances: vec![make()], ranges: testing::one_instance(VNODES), runs: StateModel::default() };
    let mut current = i64::MIN;
    let mut accepted = Vec::new();
    let mut expected_late = 0u64;
    let mut emitted = Vec::new();
    let mut arrival = 0;
    for step in steps {
        match step {
            Step::Rows(rows) => {
                let rows: Vec<Row> = rows
                    .into_iter()
                    .map(|(p, ts, v)| {
                        arrival += 1;
                        (PARTITIONS[p], Some(ts), v, format!("r{arrival}"))
                    })
                    .collect();
                let mut parts: Vec<Vec<Row>> = vec![Vec::new(); running.instances.len()];
                for r in rows {
                    if r.1.expect("time") <= current {
                        expected_late += 1;
                    } else {
                        accepted.push((r.0, r.1.expect("time"), r.2, r.3.clone(), arrival));
                    }
                    let vnode = if partitioned { partition_vnode(r.0) } else { vnode::of_hash(0, VNODES) };
                    let owner = running.ranges.iter().position(|range| range.contains(&vnode)).expect("owned");
                    parts[owner].push(r);
                }
                for (instance, part) in running.instances.iter_mut().zip(parts) {
                    if !part.is_empty() {
                        data(instance, &part);
                    }
                }
            }
            Step::Watermark(delta) => {
                let previous = current;
                current = if current == i64::MIN { delta } else { current + delta };
                for instance in &mut running.instances {
                    for line in watermark(instance, current) {
                        if let Some((name, _)) = line.split_once(": ") {
                            let ts = accepted.iter().find(|r| r.3 == name).expect("an accepted row").1;
                            prop_assert!(ts <= current && ts > previous, "{name} at {ts} emitted at {current}");
                            emitted.push(line);
                        }
                    }
                }
            }
            Step::Checkpoint => running.checkpoint(),
            Step::Restart(split) => {
                let bounds = if running.instances.len() == 1 { vec![0, split, VNODES] } else { vec![0, VNODES] };
                running.restart(bounds.windows(2).map(|pair| pair[0]..pair[1]).collect(), &make);
                if current != i64::MIN {
                    for instance in &mut running.instances {
                        prop_assert_eq!(watermark(instance, current), vec![format!("wm {current}")]);
                    }
                }
            }
        }
    }
    for instance in &mut running.instances {
        let mut out = Vec::new();
        instance.on_end(&mut out).expect("end");
        whole(instance, &mut out);
        emitted.extend(lines(&out).into_iter().filter(|l| !l.starts_with("wm ")));
    }
    emitted.sort();
    prop_assert_eq!(emitted, reference(&accepted, frame, partitioned));
    prop_assert_eq!(late.load(Ordering::Relaxed), expected_late);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every accepted row is emitted once, with its frame's aggregates, never before
    /// the watermark passes it and always above the watermark forwarded before it; late
    /// rows are counted. Checkpoints write deltas into runs; a restart moves the state
    /// from them onto two instances splitting the vnodes, or back onto one.
    #[test]
    fn every_row_is_emitted_once_with_the_reference_frame(
        steps in prop::collection::vec(step_strategy(), 1..40),
        frame in frame_strategy(),
        partitioned in any::<bool>(),
    ) {
        check_frames(steps, frame, partitioned, None)?;
    }

    /// The same with a memory budget of 0: every partition that waits for nothing and
    /// no row reached since the clock last passed it is evicted after each batch and
    /// watermark, and read back by its next row, by deltas and by full snapshots.
    #[test]
    fn evicted_partitions_give_the_same_rows(
        steps in prop::collection::vec(step_strategy(), 1..40),
        frame in frame_strategy(),
        partitioned in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 0);
        check_frames(steps, frame, partitioned, Some(&space))?;
        prop_assert_eq!((space.resident(), space.spilled()), (0, 0), "dropped instances count nothing");
    }

    /// Any bytes, and any damage to a valid record, give an error or a state, never a
    /// panic, whatever follows.
    #[test]
    fn arbitrary_records_never_panic(
        key in prop::collection::vec(any::<u8>(), 0..16),
        value in prop::collection::vec(any::<u8>(), 0..200),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        frame in frame_strategy(),
    ) {
        let late = Arc::new(AtomicU64::new(0));
        let vnode = vnode::of_hash(sluice_types::key::hash(&key), VNODES);
        let _ = testing::restore_records(&mut over(frame, true, &late), vec![(vnode, key, value)]);
        let mut record = one_partition(&late);
        for (at, byte) in edits {
            let field = if at % 3 == 0 { &mut record.1 } else { &mut record.2 };
            if !field.is_empty() {
                let at = at % field.len();
                field[at] = byte;
            }
        }
        let mut operator = over(OverFrame::Rows(Some(1)), true, &late);
        if testing::restore_records(&mut operator, vec![record]).is_ok() {
            data(&mut operator, &[row("a", 100, Some(1), "x")]);
            let mut out = Vec::new();
            let mut ok = operator.on_watermark(50, &mut out).is_ok();
            while ok && operator.has_more() {
                ok = operator.on_resume(&mut out).is_ok();
            }
            if ok {
                let _ = operator.on_end(&mut out);
            }
        }
    }
}

/// The one record of a full snapshot of `operator`: vnode, key, value.
fn the_record(operator: &mut OverAggregate) -> Record {
    let puts = testing::puts(&testing::snapshot(operator, false).1);
    let [record] = puts.as_slice() else { panic!("one partition: {puts:?}") };
    record.clone()
}

/// Partition "a" of `ROWS 1`: a pending row at 5 and one at 1 in its history.
fn one_partition(late: &Arc<AtomicU64>) -> Record {
    let mut operator = over(OverFrame::Rows(Some(1)), true, late);
    data(&mut operator, &[row("a", 1, Some(1), "x"), row("a", 5, Some(2), "y")]);
    watermark(&mut operator, 2);
    the_record(&mut operator)
}

#[test]
fn damaged_records_are_refused() {
    let late = Arc::new(AtomicU64::new(0));
    let record = one_partition(&late);
    let damaged = |frame: OverFrame, change: &dyn Fn(&mut Record)| {
        let mut damaged = record.clone();
        change(&mut damaged);
        let restored = testing::restore_records(&mut over(frame, true, &late), vec![damaged]);
        restored.map(|_| ()).map_err(|error| error.code)
    };
    let (corrupt, rows_1) = (Err("state.corrupt"), OverFrame::Rows(Some(1)));
    for cut in [0, 3, 9, record.2.len() - 1] {
        assert_eq!(damaged(rows_1, &|r| r.2.truncate(cut)), corrupt, "a value cut at {cut}");
    }
    assert_eq!(damaged(rows_1, &|r| r.2.push(0)), corrupt, "trailing bytes");
    assert_eq!(damaged(rows_1, &|r| r.0 = (r.0 + 1) % VNODES), corrupt, "under another vnode than its key's");
    assert_eq!(damaged(OverFrame::Rows(Some(0)), &|_| {}), corrupt, "history beyond n");
    assert_eq!(damaged(OverFrame::Rows(None), &|_| {}), corrupt, "another frame");
    let rekeyed = |r: &mut Record| {
        // The key of a BIGINT 1 (another plan's), under its own vnode.
        r.1 = vec![0x02, 1, 0, 0, 0, 0, 0, 0, 0];
        r.0 = vnode::of_hash(sluice_types::key::hash(&r.1), VNODES);
    };
    assert_eq!(damaged(rows_1, &rekeyed), corrupt, "a key of another type");
    // No pending row, no history: a freed partition is a delete, never such a record.
    let empty = |r: &mut Record| r.2 = vec![0; 9];
    assert_eq!(damaged(rows_1, &empty), corrupt, "a partition holding nothing");
}

/// A delta holds the partitions changed since the previous snapshot (rows arrived, or
/// emitted), and a delete for each partition freed since.
#[test]
fn a_delta_holds_the_partitions_changed_and_a_delete_for_each_freed_since() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = over(OverFrame::Range(Some(2)), true, &late);
    data(&mut operator, &[row("a", 1, Some(1), "x"), row("b", 1, Some(2), "y"), row("c", 9, None, "z")]);
    assert_eq!(testing::snapshot(&mut operator, true).0, SnapshotKind::Full, "the first snapshot is full");
    // At 5 a's and b's rows are emitted and, past their frame, freed; b gets a new row.
    assert_eq!(watermark(&mut operator, 5).len(), 3);
    data(&mut operator, &[row("b", 7, Some(3), "w")]);
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    let key = |p: &str| [&[0x06][..], &(p.len() as u32).to_le_bytes(), p.as_bytes()].concat();
    let mut written: Vec<(u32, Vec<u8>, bool)> =
        delta.points.iter().map(|(vnode, key, value)| (*vnode, key.clone(), value.is_some())).collect();
    written.sort();
    let mut expected = vec![(partition_vnode("a"), key("a"), false), (partition_vnode("b"), key("b"), true)];
    expected.sort();
    assert_eq!(written, expected, "c untouched");
    let (kind, nothing) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert!(nothing.points.is_empty(), "nothing changed since");
    assert_eq!(testing::snapshot(&mut operator, false).0, SnapshotKind::Full, "after a snapshot not written");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Golden vectors: the record layout (and the key encoding inside) must not change
/// silently; a change fails here and bumps `OVER_STATE_VERSION`.
#[test]
fn snapshot_records_are_pinned_byte_for_byte() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = over(OverFrame::Rows(Some(1)), true, &late);
    data(&mut operator, &[row("ab", 1, Some(5), "x"), row("ab", 7, None, "y")]);
    watermark(&mut operator, 2);
    let (vnode, key, value) = the_record(&mut operator);
    assert_eq!(hex(&key), "06020000006162", "VARCHAR \"ab\"");
    let expected = concat!(
        "01000000", // 1 pending row:
        "0100000000000000",
        "17000000", // arrival 1, 23 bytes: ("ab", 7, NULL, "y")
        "06020000006162",
        "020700000000000000",
        "00",
        "060100000079",
        "01000000", // 1 history row:
        "0100000000000000",
        "00",                 // time 1, COUNT(*): NULL (no value),
        "010100000000000000", // COUNT(v): 1
        "010500000000000000", // SUM(v): 5
        "010500000000000000", // MIN(v)
        "010500000000000000", // MAX(v)
        "010500000000000000", // AVG(v)
        "00",                 // no running accumulators
    );
    assert_eq!(hex(&value), expected);
    assert_eq!(vnode, partition_vnode("ab"));
    let mut restored = over(OverFrame::Rows(Some(1)), true, &late);
    testing::restore_records(&mut restored, vec![(vnode, key, value)]).expect("restore");
    assert_eq!(watermark(&mut restored, 7), ["y: 2,1,5,5,5,5", "wm 7"]);

    // An unbounded frame keeps running accumulators instead of history.
    let mut running = over(OverFrame::Range(None), false, &late);
    data(&mut running, &[row("a", 1, Some(-3), "x")]);
    watermark(&mut running, 1);
    let (vnode, key, value) = the_record(&mut running);
    assert!(key.is_empty(), "the empty key (no PARTITION BY)");
    let accumulator = |count: &str, int: &str, best: &str| {
        format!(
            "{count}00000000000000{int}{}0000000000000000{best}",
            if int == "00" { "0".repeat(30) } else { "ff".repeat(15) }
        )
    };
    let expected = [
        "00000000".to_string(),                        // no pending rows
        "00000000".to_string(),                        // no history
        "01".to_string(),                              // running accumulators:
        accumulator("01", "00", "00"),                 // COUNT(*) 1
        accumulator("01", "00", "00"),                 // COUNT(v) 1
        accumulator("01", "fd", "00"),                 // SUM: -3 as i128
        accumulator("00", "00", "01fdffffffffffffff"), // MIN: -3
        accumulator("00", "00", "01fdffffffffffffff"), // MAX: -3
        accumulator("01", "fd", "00"),                 // AVG
    ]
    .concat();
    assert_eq!(hex(&value), expected);
    assert_eq!(vnode, vnode::of_hash(0, VNODES));
    let mut restored = over(OverFrame::Range(None), false, &late);
    testing::restore_records(&mut restored, vec![(vnode, key, value)]).expect("restore");
    data(&mut restored, &[row("a", 2, Some(4), "y")]);
    assert_eq!(watermark(&mut restored, 2), ["y: 2,2,1,-3,4,0", "wm 2"]);
}
