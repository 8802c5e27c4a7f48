//! Expiry: rows freed exactly when the watermark reaches their expiry, late rows counted
//! and dropped, expiry surviving snapshots, and an oracle (a nested-loop join of every
//! input row) over random input that respects the watermark, with restores onto split
//! and merged instances.
//!
//! The join here is an interval join: `lk = rk AND rt BETWEEN lt - 5 ms AND lt + 10 ms`,
//! so a left row can match right rows up to 10 ms later (it expires at `lt + 10`) and a
//! right row left rows up to 5 ms later (it expires at `rt + 5`).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use datafusion_common::ScalarValue;
use datafusion_expr::Operator as BinaryOperator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use proptest::prelude::*;
use sluice_runtime::{Metrics, Operator, OperatorContext};
use sluice_state::StateModel;
use sluice_types::{Batch, Message};

use super::tests::{Table, VNODES, context, integrate, lines, vnode_of};
use super::{Expiry, JoinKind, JoinOperator, JoinSpec};
use crate::spill::SpillSpace;

const LATE: &str = "view j: late rows";
/// How much later than a left row a right row may be, and the other way round.
const RIGHT_AFTER: i64 = 10;
const LEFT_AFTER: i64 = 5;

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, None)
}

fn left_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("lk", DataType::Int64, true), Field::new("lt", timestamp(), true)]))
}

fn right_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("rk", DataType::Int64, true), Field::new("rt", timestamp(), true)]))
}

/// `CAST(a AS BIGINT) - CAST(b AS BIGINT) <= bound`, over the output columns.
fn at_most(a: (&str, usize), b: (&str, usize), bound: i64) -> Arc<dyn PhysicalExpr> {
    let int = |(name, index): (&str, usize)| -> Arc<dyn PhysicalExpr> {
        Arc::new(CastExpr::new(Arc::new(Column::new(name, index)), DataType::Int64, None))
    };
    let difference = Arc::new(BinaryExpr::new(int(a), BinaryOperator::Minus, int(b)));
    Arc::new(BinaryExpr::new(difference, BinaryOperator::LtEq, Arc::new(Literal::new(ScalarValue::Int64(Some(bound))))))
}

fn spec(kind: JoinKind) -> JoinSpec {
    let fields: Vec<Field> =
        left_schema().fields().iter().chain(right_schema().fields().iter()).map(|f| f.as_ref().clone()).collect();
    let residual = Arc::new(BinaryExpr::new(
        at_most(("rt", 3), ("lt", 1), RIGHT_AFTER),
        BinaryOperator::And,
        at_most(("lt", 1), ("rt", 3), LEFT_AFTER),
    ));
    JoinSpec {
        kind,
        left_schema: left_schema(),
        right_schema: right_schema(),
        output_schema: Arc::new(Schema::new(fields)),
        left_keys: vec![0],
        right_keys: vec![0],
        residual: Some(residual),
        vnodes: VNODES,
        expiry: [Some(Expiry { column: 1, offset_ms: RIGHT_AFTER }), Some(Expiry { column: 1, offset_ms: LEFT_AFTER })],
        late_rows: LATE.into(),
        append_only: [true, true],
        spill: None,
    }
}

/// An interval join and the metrics its late rows are counted in.
fn interval_join() -> (JoinOperator, Arc<Metrics>) {
    interval_join_in(None)
}

/// An interval join whose sides' rows spill within `space` when given.
fn interval_join_in(space: Option<&Arc<SpillSpace>>) -> (JoinOperator, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let context = OperatorContext { metrics: Arc::clone(&metrics), ..context() };
    let spec = JoinSpec { spill: space.cloned(), ..spec(JoinKind::Inner) };
    (JoinOperator::new(spec, &context).expect("join"), metrics)
}

fn late_rows(metrics: &Metrics) -> u64 {
    metrics.counters().iter().find(|(name, _)| name == LATE).map_or(0, |(_, value)| *value)
}

/// Rows `(key, time)` of either side (both have that shape).
fn batch(side: usize, rows: &[(Option<i64>, Option<i64>)]) -> Batch {
    let schema = if side == 0 { left_schema() } else { right_schema() };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
        Arc::new(TimestampMillisecondArray::from_iter(rows.iter().map(|r| r.1))),
    ];
    Batch::inserts(RecordBatch::try_new(schema, columns).expect("batch"))
}

fn send(operator: &mut JoinOperator, side: usize, rows: &[(Option<i64>, Option<i64>)]) -> Vec<String> {
    let mut out = Vec::new();
    operator.on_port_data(side, batch(side, rows), &mut out).expect("rows");
    lines(&out)
}

fn watermark(operator: &mut JoinOperator, watermark: i64) {
    let mut out = Vec::new();
    operator.on_watermark(watermark, &mut out).expect("watermark");
    assert!(matches!(out.as_slice(), [Message::Watermark(w)] if *w == watermark), "forwarded: {out:?}");
}

fn cell(time: i64) -> String {
    arrow::util::display::array_value_to_string(&TimestampMillisecondArray::from(vec![time]), 0).expect("format")
}

#[test]
fn rows_are_freed_exactly_when_the_watermark_reaches_their_expiry() {
    let (mut operator, metrics) = interval_join();
    assert!(send(&mut operator, 0, &[(Some(1), Some(100))]).is_empty());
    assert_eq!(send(&mut operator, 1, &[(Some(1), Some(100))]), [format!("+1 1,{},1,{}", cell(100), cell(100))]);
    assert_eq!(operator.state_rows(), 2);
    watermark(&mut operator, 104);
    assert_eq!(operator.state_rows(), 2);
    watermark(&mut operator, 105);
    assert_eq!(operator.state_rows(), 1, "the right row (expiry 100 + 5) is freed");
    // The left row still joins right rows up to its expiry.
    assert_eq!(send(&mut operator, 1, &[(Some(1), Some(110))]), [format!("+1 1,{},1,{}", cell(100), cell(110))]);
    watermark(&mut operator, 109);
    assert_eq!(operator.state_rows(), 2);
    watermark(&mut operator, 110);
    assert_eq!(operator.state_rows(), 1, "the left row (expiry 100 + 10) is freed");
    watermark(&mut operator, 115);
    assert_eq!(operator.state_rows(), 0);
    assert_eq!(late_rows(&metrics), 0);

    // The state falls as the watermark passes: a thousand rows per side, half freed.
    let rows: Vec<(Option<i64>, Option<i64>)> = (0..1000).map(|i| (Some(i % 7), Some(1000 + i))).collect();
    send(&mut operator, 0, &rows);
    send(&mut operator, 1, &rows);
    assert_eq!(operator.state_rows(), 2000);
    let before = operator.state_bytes();
    watermark(&mut operator, 1499);
    assert_eq!(operator.state_rows(), 510 + 505, "left rows up to 1489 and right rows up to 1494 are freed");
    assert!(operator.state_bytes() < before);
    watermark(&mut operator, i64::MAX);
    assert_eq!((operator.state_rows(), operator.state_bytes()), (0, 0));
}

#[test]
fn late_rows_are_counted_and_dropped() {
    let (mut operator, metrics) = interval_join();
    assert_eq!(late_rows(&metrics), 0, "registered at once: the report shows 0");
    watermark(&mut operator, 200);
    // Expiry 190 + 10 = 200 is at the watermark: late. 195 + 10 is not, though its time
    // is below the watermark. A NULL time matches nothing: dropped, not late.
    send(&mut operator, 0, &[(Some(1), Some(190)), (Some(1), Some(195)), (Some(1), None)]);
    assert_eq!(late_rows(&metrics), 1);
    assert_eq!(operator.state_rows(), 1);
    // The right row joins the kept left row only; its own expiry (196 + 5) is ahead.
    assert_eq!(send(&mut operator, 1, &[(Some(1), Some(196))]), [format!("+1 1,{},1,{}", cell(195), cell(196))]);
    // A late right row (expiry 195 + 5 <= 200) joins nothing, even the left row 195.
    assert!(send(&mut operator, 1, &[(Some(1), Some(195))]).is_empty());
    assert_eq!(late_rows(&metrics), 2);
    assert_eq!(operator.state_rows(), 2);
    // A watermark below the highest seen changes nothing.
    watermark(&mut operator, 150);
    send(&mut operator, 0, &[(Some(1), Some(189))]);
    assert_eq!(late_rows(&metrics), 3);
}

#[test]
fn a_restored_join_frees_its_rows_as_the_watermark_passes() {
    let (mut operator, _) = interval_join();
    send(&mut operator, 0, &[(Some(1), Some(100)), (Some(2), Some(120))]);
    send(&mut operator, 1, &[(Some(1), Some(101))]);
    let (_, records) = crate::testing::snapshot(&mut operator, false);
    let (mut restored, metrics) = interval_join();
    restored.restore_state(&mut records.into_source()).expect("restore");
    assert_eq!(restored.state_rows(), 3);
    // The watermark is not restored: nothing is late until the first one arrives.
    assert_eq!(send(&mut restored, 1, &[(Some(1), Some(99))]), [format!("+1 1,{},1,{}", cell(100), cell(99))]);
    assert_eq!(late_rows(&metrics), 0);
    watermark(&mut restored, 106);
    assert_eq!(restored.state_rows(), 2, "both right rows (expiries 104 and 106) are freed");
    watermark(&mut restored, 110);
    assert_eq!(restored.state_rows(), 1);
    watermark(&mut restored, 130);
    assert_eq!(restored.state_rows(), 0);
}

#[test]
fn only_inner_joins_on_millisecond_timestamps_expire() {
    for kind in [JoinKind::Left, JoinKind::Right, JoinKind::Full] {
        let error = JoinOperator::new(spec(kind), &context()).err().expect("an outer join with expiry");
        assert_eq!(error.code, "join.spec", "{kind:?}");
    }
    let mut bad = spec(JoinKind::Inner);
    bad.expiry[1] = Some(Expiry { column: 0, offset_ms: 0 });
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("a BIGINT time").code, "join.spec");
    let mut bad = spec(JoinKind::Inner);
    bad.expiry[0] = Some(Expiry { column: 2, offset_ms: 0 });
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("no such column").code, "join.spec");
    // Without expiry no late-rows counter is registered.
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let mut plain = spec(JoinKind::Inner);
    plain.expiry = [None, None];
    JoinOperator::new(plain, &OperatorContext { metrics: Arc::clone(&metrics), ..context() }).expect("join");
    assert!(metrics.counters().is_empty());
}

/// A sink that notes whether a snapshot wrote its records as they came, vnodes
/// interleaved, rather than sorted.
#[derive(Default)]
struct Watched {
    records: sluice_state::CollectedState,
    interleaved: bool,
}

impl sluice_state::StateSink for Watched {
    fn interleave(&mut self) {
        self.interleaved = true;
        self.records.interleave();
    }

    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), sluice_types::SluiceError> {
        self.records.delete_range(vnode, start, end)
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), sluice_types::SluiceError> {
        self.records.put(vnode, key, value)
    }

    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), sluice_types::SluiceError> {
        self.records.delete(vnode, key)
    }
}

/// A delta of `operator` applied to `runs` (one instance of every vnode); whether it was
/// written interleaved.
fn delta_into(operator: &mut JoinOperator, runs: &mut StateModel) -> bool {
    let snapshot = operator.snapshot_state(true).expect("a snapshot").expect("the join's snapshot");
    let mut sink = Watched::default();
    (snapshot.job)(&mut sink).expect("the snapshot's records");
    runs.apply(0..super::tests::VNODES, !snapshot.kind.is_delta(), sink.records);
    sink.interleaved
}

#[test]
fn expiring_rows_are_written_as_they_come_in_or_out_of_expiry_order() {
    let (mut operator, _) = interval_join();
    let mut runs = StateModel::default();
    // Keys 1 and 2, each key's rows in time order (so in expiry order within a vnode),
    // the two keys' times interleaved.
    send(&mut operator, 0, &[(Some(1), Some(100)), (Some(2), Some(95)), (Some(1), Some(101))]);
    send(&mut operator, 1, &[(Some(2), Some(96)), (Some(1), Some(102))]);
    assert!(delta_into(&mut operator, &mut runs), "the first snapshot, whole, in order");
    watermark(&mut operator, 99);
    send(&mut operator, 0, &[(Some(2), Some(99)), (Some(1), Some(103))]);
    assert!(delta_into(&mut operator, &mut runs), "a delta with a range delete, in order");
    // A row of key 1 expiring before one that arrived earlier: ordered by expiry, and
    // still written as they come.
    send(&mut operator, 0, &[(Some(1), Some(104)), (Some(1), Some(100))]);
    assert!(delta_into(&mut operator, &mut runs), "out of expiry order within its vnode");
    watermark(&mut operator, 104);
    send(&mut operator, 1, &[(Some(1), Some(105))]);
    assert!(delta_into(&mut operator, &mut runs), "in order again after the range delete");
    // The runs hold exactly the rows not expired at watermark 104: left rows expiring
    // after it (time + 10 > 104: 100 twice, 101, 103, 104; 95 and 99 of key 2 expire
    // at 105 and 109) and right rows (time + 5 > 104: 102 and 105).
    let (mut restored, _) = interval_join();
    restored.restore_state(&mut runs.source(0..super::tests::VNODES)).expect("restore");
    assert_eq!(restored.state_rows(), operator.state_rows());
    assert_eq!(restored.state_rows(), 7 + 2);
    watermark(&mut restored, 104);
    let mut joined = send(&mut restored, 1, &[(Some(1), Some(106))]);
    joined.sort();
    let expected: Vec<String> =
        [100, 100, 101, 103, 104].iter().map(|&time| format!("+1 1,{},1,{}", cell(time), cell(106))).collect();
    assert_eq!(joined, expected);
}

// ---------------------------------------------------------------------------------
// The oracle.

/// One step of random input: a row on a side, its time a little above the watermark
/// (input that respects the watermark), or the watermark advancing.
#[derive(Debug, Clone)]
enum Step {
    Row { side: usize, key: Option<i64>, ahead: i64 },
    Watermark { advance: i64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let row = (0..2usize, prop::option::weighted(0.9, 0..3i64), 1..16i64).prop_map(|(side, key, ahead)| Step::Row {
        side,
        key,
        ahead,
    });
    let watermark = (0..8i64).prop_map(|advance| Step::Watermark { advance });
    prop::collection::vec(prop_oneof![3 => row, 1 => watermark], 1..120)
}

type Row = (Option<i64>, i64);

fn show(row: &Row) -> String {
    format!("{},{}", row.0.map_or("∅".to_string(), |k| k.to_string()), cell(row.1))
}

/// A nested-loop join of every input row.
fn reference(lefts: &Table<Row>, rights: &Table<Row>) -> Table<String> {
    let mut result = BTreeMap::new();
    for (l, m) in lefts {
        for (r, n) in rights {
            if l.0.is_some() && l.0 == r.0 && r.1 - l.1 <= RIGHT_AFTER && l.1 - r.1 <= LEFT_AFTER {
                *result.entry(format!("{},{}", show(l), show(r))).or_insert(0) += m * n;
            }
        }
    }
    result
}

/// A checkpoint: each instance's snapshot (a delta when it can) into `runs`, as the
/// instance owning `ranges[i]`.
fn checkpoint(instances: &mut [JoinOperator], ranges: &[std::ops::Range<u32>], runs: &mut StateModel) {
    for (instance, vnodes) in instances.iter_mut().zip(ranges) {
        crate::testing::checkpoint(instance, runs, vnodes.clone(), true);
    }
}

/// A checkpoint, then `count` fresh instances restored from `runs`, the vnodes below
/// `split` to the first.
fn restart(
    instances: &mut Vec<JoinOperator>,
    ranges: &mut Vec<std::ops::Range<u32>>,
    runs: &mut StateModel,
    count: usize,
    split: u32,
    space: Option<&Arc<SpillSpace>>,
) {
    checkpoint(instances, ranges, runs);
    *ranges = super::tests::ranges(count, split);
    *instances = (ranges.iter())
        .map(|vnodes| {
            let mut instance = interval_join_in(space).0.owning(vnodes.clone());
            crate::testing::restore(&mut instance, runs, vnodes.clone()).expect("restore");
            instance
        })
        .collect();
}

/// Runs `steps` through an interval join (rows spilled within `space` when given),
/// moving its state onto two instances at `split_at` and back onto one at `merge_at`,
/// and checks after every step that the integrated output equals a join of every row
/// so far and that the state holds exactly the rows not yet expired.
fn check_freeing(
    steps: &[Step],
    split_at: usize,
    merge_at: usize,
    split: u32,
    space: Option<&Arc<SpillSpace>>,
) -> Result<(), TestCaseError> {
    let mut instances = vec![interval_join_in(space).0];
    let (mut ranges, mut runs) = (super::tests::ranges(1, 0), StateModel::default());
    let mut output: Table<String> = BTreeMap::new();
    let mut inputs: [Table<Row>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut current = 0i64;
    for (index, step) in steps.iter().enumerate() {
        if index == split_at && instances.len() == 1 {
            restart(&mut instances, &mut ranges, &mut runs, 2, split, space);
        } else if index == merge_at && instances.len() == 2 {
            restart(&mut instances, &mut ranges, &mut runs, 1, split, space);
        } else if index % 5 == 2 {
            checkpoint(&mut instances, &ranges, &mut runs);
        }
        match *step {
            Step::Row { side, key, ahead } => {
                let row = (key, current + ahead);
                let owner = if instances.len() == 1 || vnode_of(key) < split { 0 } else { 1 };
                integrate(&mut output, send(&mut instances[owner], side, &[(row.0, Some(row.1))]))?;
                *inputs[side].entry(row).or_insert(0) += 1;
            }
            Step::Watermark { advance } => {
                current += advance;
                for instance in &mut instances {
                    watermark(instance, current);
                }
            }
        }
        prop_assert_eq!(&output, &reference(&inputs[0], &inputs[1]), "after step {}", index);
        // An expiring side keeps each arrival of a row apart: rows count with their
        // multiplicity.
        let live = |side: usize, offset: i64| -> usize {
            inputs[side].iter().filter(|(r, _)| r.1 + offset > current).map(|(_, &n)| n as usize).sum()
        };
        let held: usize = instances.iter().map(JoinOperator::state_rows).sum();
        // Rows expired but not yet freed: only on fresh instances, which have seen no
        // watermark yet (they free them at the next one).
        if instances.iter().all(|i| i.watermark == current) {
            prop_assert_eq!(held, live(0, RIGHT_AFTER) + live(1, LEFT_AFTER), "after step {}", index);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Over input that respects the watermark (every row's time above it), freeing rows
    /// loses no match: after every step the integrated output equals a join of every
    /// row so far, and the state holds exactly the rows not yet expired. At
    /// `split_at` the state moves onto two instances splitting the vnodes, at `merge_at`
    /// back onto one (the watermark starts over after each).
    #[test]
    fn freeing_expired_rows_loses_no_match(
        steps in steps(),
        split_at in 0usize..60,
        merge_at in 0usize..120,
        split in 1u32..VNODES,
    ) {
        check_freeing(&steps, split_at, merge_at, split, None)?;
    }

    /// The same with every chunk of rows but the newest spilled (a budget of 0, chunks
    /// of 64 bytes): probes, indexing, snapshots and the restore's sort read them back,
    /// and dropped instances leave nothing counted in the space.
    #[test]
    fn spilled_expiring_rows_lose_no_match(
        steps in steps(),
        split_at in 0usize..60,
        merge_at in 0usize..120,
        split in 1u32..VNODES,
    ) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 64);
        check_freeing(&steps, split_at, merge_at, split, Some(&space))?;
        prop_assert_eq!((space.resident(), space.spilled()), (0, 0), "dropped instances count nothing");
    }
}
