//! The join: its changes row by row for each kind, an oracle (a nested-loop join of the
//! integrated inputs) over random weighted input on both sides with snapshots and
//! restores (from deltas over checkpoints) onto split and merged instances, and its
//! state records. Expiry (interval and window joins) in `expiry_tests`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion_expr::Operator as BinaryOperator;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::{BinaryExpr, Column};
use proptest::prelude::*;
use sluice_runtime::{Metrics, Operator, OperatorContext, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, Weights, vnode};

use super::{JoinKind, JoinOperator, JoinSpec, output_is_append_only};
use crate::spill::SpillSpace;
use crate::testing;

pub(super) const VNODES: u32 = 16;
const KINDS: [JoinKind; 4] = [JoinKind::Inner, JoinKind::Left, JoinKind::Right, JoinKind::Full];

/// Left input: key `lk`, value `lv`.
fn left_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("lk", DataType::Int64, true), Field::new("lv", DataType::Int64, false)]))
}

/// Right input: key `rk`, value `rv`, text `rs`.
fn right_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("rk", DataType::Int64, true),
        Field::new("rv", DataType::Int64, false),
        Field::new("rs", DataType::Utf8, true),
    ]))
}

fn output_schema(kind: JoinKind) -> SchemaRef {
    let left_nullable = matches!(kind, JoinKind::Right | JoinKind::Full);
    let right_nullable = matches!(kind, JoinKind::Left | JoinKind::Full);
    let fields = left_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(f.is_nullable() || left_nullable))
        .chain(
            right_schema().fields().iter().map(|f| f.as_ref().clone().with_nullable(f.is_nullable() || right_nullable)),
        )
        .collect::<Vec<_>>();
    Arc::new(Schema::new(fields))
}

/// `lv < rv`, over the output columns.
fn less_than() -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(Arc::new(Column::new("lv", 1)), BinaryOperator::Lt, Arc::new(Column::new("rv", 3))))
}

fn spec(kind: JoinKind, residual: bool) -> JoinSpec {
    JoinSpec {
        kind,
        left_schema: left_schema(),
        right_schema: right_schema(),
        output_schema: output_schema(kind),
        left_keys: vec![0],
        right_keys: vec![0],
        residual: residual.then(less_than),
        vnodes: VNODES,
        expiry: [None, None],
        late_rows: "view j: late rows".into(),
        append_only: [false, false],
        spill: None,
    }
}

pub(super) fn context() -> OperatorContext {
    OperatorContext {
        thread: 0,
        threads: 1,
        vnodes: VNODES,
        metrics: Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)),
    }
}

fn join(kind: JoinKind, residual: bool) -> JoinOperator {
    JoinOperator::new(spec(kind, residual), &context()).expect("join")
}

/// A join of two append-only inputs: the sides it never pads keep their rows appended,
/// spilling every chunk but the newest of 64 bytes into `space`.
fn appending_join(kind: JoinKind, residual: bool, space: &Arc<SpillSpace>) -> JoinOperator {
    let spec = JoinSpec { append_only: [true, true], spill: Some(Arc::clone(space)), ..spec(kind, residual) };
    JoinOperator::new(spec, &context()).expect("join")
}

/// A join whose stored rows spill within `space` (every chunk but the newest of 64
/// bytes on disk): over updating inputs, each side's rows kept by row.
fn spilling_join(kind: JoinKind, residual: bool, space: &Arc<SpillSpace>) -> JoinOperator {
    let spec = JoinSpec { spill: Some(Arc::clone(space)), ..spec(kind, residual) };
    JoinOperator::new(spec, &context()).expect("join")
}

type LeftRow = (Option<i64>, i64);
type RightRow = (Option<i64>, i64, Option<&'static str>);

fn left_batch(rows: &[(LeftRow, i64)]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0.0))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0.1))),
    ];
    let batch = RecordBatch::try_new(left_schema(), columns).expect("batch");
    Batch::with_weights(batch, Int64Array::from_iter_values(rows.iter().map(|r| r.1)))
}

fn right_batch(rows: &[(RightRow, i64)]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0.0))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0.1))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.0.2))),
    ];
    let batch = RecordBatch::try_new(right_schema(), columns).expect("batch");
    Batch::with_weights(batch, Int64Array::from_iter_values(rows.iter().map(|r| r.1)))
}

/// Each output row as `±weight cell,cell,…` in output order.
pub(super) fn lines(out: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = batch
                .rows
                .columns()
                .iter()
                .map(|c| arrow::util::display::array_value_to_string(c, row).expect("format"))
                .map(|cell| if cell.is_empty() { "∅".into() } else { cell })
                .collect();
            lines.push(format!("{:+} {}", batch.weight(row), cells.join(",")));
        }
    }
    lines
}

fn left(operator: &mut JoinOperator, rows: &[(LeftRow, i64)]) -> Vec<String> {
    let mut out = Vec::new();
    operator.on_port_data(0, left_batch(rows), &mut out).expect("left rows");
    lines(&out)
}

fn right(operator: &mut JoinOperator, rows: &[(RightRow, i64)]) -> Vec<String> {
    let mut out = Vec::new();
    operator.on_port_data(1, right_batch(rows), &mut out).expect("right rows");
    lines(&out)
}

#[test]
fn a_full_join_pads_retracts_the_padding_and_brings_it_back() {
    let mut operator = join(JoinKind::Full, false);
    assert_eq!(left(&mut operator, &[((Some(1), 10), 1)]), ["+1 1,10,∅,∅,∅"]);
    // The first match: the padded left row is retracted before the joined row.
    assert_eq!(right(&mut operator, &[((Some(1), 20, Some("x")), 1)]), ["-1 1,10,∅,∅,∅", "+1 1,10,1,20,x"]);
    assert_eq!(right(&mut operator, &[((Some(2), 5, Some("y")), 1)]), ["+1 ∅,∅,2,5,y"]);
    // The last match goes: the joined row is retracted before the padding returns.
    assert_eq!(left(&mut operator, &[((Some(1), 10), -1)]), ["-1 1,10,1,20,x", "+1 ∅,∅,1,20,x"]);
    // NULL keys match nothing, not even each other, and are padded.
    assert_eq!(left(&mut operator, &[((None, 3), 1)]), ["+1 ∅,3,∅,∅,∅"]);
    assert_eq!(right(&mut operator, &[((None, 4, None), 1)]), ["+1 ∅,∅,∅,4,∅"]);
    assert_eq!(operator.state_rows(), 4);
}

#[test]
fn each_kind_pads_only_its_preserved_sides() {
    let expected: [(JoinKind, &[&str], &[&str]); 4] = [
        (JoinKind::Inner, &[], &["+1 1,10,1,20,x"]),
        (JoinKind::Left, &["+1 1,10,∅,∅,∅"], &["-1 1,10,∅,∅,∅", "+1 1,10,1,20,x"]),
        (JoinKind::Right, &[], &["+1 1,10,1,20,x"]),
        (JoinKind::Full, &["+1 1,10,∅,∅,∅"], &["-1 1,10,∅,∅,∅", "+1 1,10,1,20,x"]),
    ];
    for (kind, first, second) in expected {
        let mut operator = join(kind, false);
        assert_eq!(left(&mut operator, &[((Some(1), 10), 1)]), first, "{kind:?}");
        assert_eq!(right(&mut operator, &[((Some(1), 20, Some("x")), 1)]), second, "{kind:?}");
        // An unmatched right row: padded by RIGHT and FULL only.
        let padded = right(&mut operator, &[((Some(7), 1, None), 1)]);
        let expected: &[&str] =
            if matches!(kind, JoinKind::Right | JoinKind::Full) { &["+1 ∅,∅,7,1,∅"] } else { &[] };
        assert_eq!(padded, expected, "{kind:?}");
    }
}

#[test]
fn weights_multiply_and_the_residual_filters_pairs() {
    let mut operator = join(JoinKind::Left, true);
    assert_eq!(right(&mut operator, &[((Some(1), 5, None), 2), ((Some(1), 50, Some("z")), 1)]), Vec::<String>::new());
    // 10 < 50 joins, 10 < 5 does not; the left row has a match, so it is not padded.
    assert_eq!(left(&mut operator, &[((Some(1), 10), 3)]), ["+3 1,10,1,50,z"]);
    // 1 < 5 and 1 < 50: both join, the first twice per copy.
    assert_eq!(left(&mut operator, &[((Some(1), 1), 1)]), ["+2 1,1,1,5,∅", "+1 1,1,1,50,z"]);
    // 60 matches nothing through the residual: padded.
    assert_eq!(left(&mut operator, &[((Some(1), 60), 1)]), ["+1 1,60,∅,∅,∅"]);
    // The right row 50 leaves: the left row 10 loses its only match and is padded
    // again (after its joined row's retraction); the left row 1 keeps the row 5.
    assert_eq!(
        right(&mut operator, &[((Some(1), 50, Some("z")), -1)]),
        ["-3 1,10,1,50,z", "+3 1,10,∅,∅,∅", "-1 1,1,1,50,z"]
    );
}

#[test]
fn a_left_row_losing_its_last_match_is_padded_again() {
    let mut operator = join(JoinKind::Left, false);
    left(&mut operator, &[((Some(1), 10), 1)]);
    right(&mut operator, &[((Some(1), 20, None), 1)]);
    assert_eq!(right(&mut operator, &[((Some(1), 20, None), -1)]), ["-1 1,10,1,20,∅", "+1 1,10,∅,∅,∅"]);
    // An insert and its retraction in one batch leave the integral unchanged.
    let out = right(&mut operator, &[((Some(1), 30, None), 1), ((Some(1), 30, None), -1)]);
    assert_eq!(out, ["-1 1,10,∅,∅,∅", "+1 1,10,1,30,∅", "-1 1,10,1,30,∅", "+1 1,10,∅,∅,∅"]);
    assert_eq!(operator.state_rows(), 1);
}

#[test]
fn output_of_inserts_only_carries_no_weight_column() {
    let mut operator = join(JoinKind::Inner, false);
    let mut out = Vec::new();
    operator.on_port_data(0, left_batch(&[((Some(1), 10), 1)]), &mut out).expect("left");
    assert!(out.is_empty(), "nothing to join yet");
    operator.on_port_data(1, right_batch(&[((Some(1), 20, None), 1)]), &mut out).expect("right");
    let [Message::Data(batch)] = out.as_slice() else { panic!("one batch: {out:?}") };
    assert!(matches!(batch.weights, Weights::Inserts));
    let mut out = Vec::new();
    operator.on_port_data(1, right_batch(&[((Some(1), 20, None), -1)]), &mut out).expect("right");
    let [Message::Data(batch)] = out.as_slice() else { panic!("one batch: {out:?}") };
    assert!(matches!(batch.weights, Weights::Column(_)));
}

#[test]
fn only_an_inner_join_of_append_only_inputs_is_append_only() {
    assert!(output_is_append_only(JoinKind::Inner, true, true));
    assert!(!output_is_append_only(JoinKind::Inner, true, false));
    assert!(!output_is_append_only(JoinKind::Inner, false, true));
    for kind in [JoinKind::Left, JoinKind::Right, JoinKind::Full] {
        assert!(!output_is_append_only(kind, true, true));
    }
}

#[test]
fn specs_the_join_cannot_run_are_refused() {
    let mut bad = spec(JoinKind::Inner, false);
    bad.right_keys = vec![2];
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("key types differ").code, "join.spec");
    let mut bad = spec(JoinKind::Inner, false);
    bad.left_keys = Vec::new();
    bad.right_keys = Vec::new();
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("no keys").code, "join.spec");
    let mut bad = spec(JoinKind::Inner, false);
    bad.vnodes = VNODES + 1;
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("other vnodes").code, "join.spec");
    let mut bad = spec(JoinKind::Inner, false);
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    bad.left_schema = Arc::new(Schema::new(vec![Field::new("lk", DataType::Int64, true), Field::new("l", list, true)]));
    assert_eq!(JoinOperator::new(bad, &context()).err().expect("a list column").code, "join.column_type");
    let mut operator = join(JoinKind::Inner, false);
    assert!(operator.on_port_data(2, left_batch(&[((Some(1), 1), 1)]), &mut Vec::new()).is_err());
}

// ---------------------------------------------------------------------------------
// The oracle.

/// An integrated input: row → multiplicity (no zero entries).
pub(super) type Table<R> = BTreeMap<R, i64>;

fn show(value: Option<i64>) -> String {
    value.map_or("∅".to_string(), |v| v.to_string())
}

fn left_cells(row: &LeftRow) -> String {
    format!("{},{}", show(row.0), row.1)
}

fn right_cells(row: &RightRow) -> String {
    format!("{},{},{}", show(row.0), row.1, row.2.unwrap_or("∅"))
}

/// A nested-loop join of the integrated inputs, as the integrated output must be.
fn reference(kind: JoinKind, residual: bool, lefts: &Table<LeftRow>, rights: &Table<RightRow>) -> Table<String> {
    let joins = |l: &LeftRow, r: &RightRow| l.0.is_some() && l.0 == r.0 && (!residual || l.1 < r.1);
    let mut result: Table<String> = BTreeMap::new();
    let mut add = |row: String, weight: i64| {
        let entry = result.entry(row.clone()).or_insert(0);
        *entry += weight;
        if *entry == 0 {
            result.remove(&row);
        }
    };
    for (l, &m) in lefts {
        let mut matched = 0;
        for (r, &n) in rights {
            if joins(l, r) {
                add(format!("{},{}", left_cells(l), right_cells(r)), m * n);
                matched += n;
            }
        }
        if kind.preserves(0) && matched == 0 {
            add(format!("{},∅,∅,∅", left_cells(l)), m);
        }
    }
    for (r, &n) in rights {
        let matched: i64 = lefts.iter().filter(|(l, _)| joins(l, r)).map(|(_, m)| m).sum();
        if kind.preserves(1) && matched == 0 {
            add(format!("∅,∅,{}", right_cells(r)), n);
        }
    }
    result
}

/// Applies output lines to the integrated output, asserting that no row's count ever
/// goes below zero (a retraction comes after what it retracts).
pub(super) fn integrate(table: &mut Table<String>, lines: Vec<String>) -> Result<(), TestCaseError> {
    for line in lines {
        let (weight, row) = line.split_once(' ').expect("weight and row");
        let weight: i64 = weight.parse().expect("weight");
        let count = table.entry(row.to_string()).or_insert(0);
        *count += weight;
        prop_assert!(*count >= 0, "a retraction of a row not in the output: {}", row);
        if *count == 0 {
            table.remove(row);
        }
    }
    Ok(())
}

fn apply<R: Ord + Clone>(table: &mut Table<R>, row: &R, weight: i64) {
    let entry = table.entry(row.clone()).or_insert(0);
    *entry += weight;
    if *entry == 0 {
        table.remove(row);
    }
}

const TEXTS: [&str; 2] = ["x", "y"];

/// One step of random input: `weight` copies of a new row on a side, or the
/// retraction of an earlier insert (all its copies).
#[derive(Debug, Clone)]
enum Step {
    Insert { side: usize, key: Option<i64>, value: i64, text: Option<usize>, weight: i64 },
    Retract { side: usize, pick: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let weight = prop_oneof![4 => Just(1i64), 1 => Just(2i64)];
    let insert = (0..2usize, prop::option::weighted(0.85, 0..4i64), 0..5i64, prop::option::of(0..TEXTS.len()), weight)
        .prop_map(|(side, key, value, text, weight)| Step::Insert { side, key, value, text, weight });
    let retract = (0..2usize, any::<usize>()).prop_map(|(side, pick)| Step::Retract { side, pick });
    prop::collection::vec(prop_oneof![3 => insert, 2 => retract], 1..80)
}

/// An input row of either side with its weight.
#[derive(Debug, Clone)]
enum Event {
    Left(LeftRow, i64),
    Right(RightRow, i64),
}

impl Event {
    fn side(&self) -> usize {
        match self {
            Event::Left(..) => 0,
            Event::Right(..) => 1,
        }
    }

    fn weight(&self) -> i64 {
        match self {
            Event::Left(_, weight) | Event::Right(_, weight) => *weight,
        }
    }

    fn key(&self) -> Option<i64> {
        match self {
            Event::Left(row, _) => row.0,
            Event::Right(row, _) => row.0,
        }
    }
}

/// The input events of `steps` (retractions of rows inserted before on that side).
fn events(steps: &[Step]) -> Vec<Event> {
    let mut live_left: Vec<(LeftRow, i64)> = Vec::new();
    let mut live_right: Vec<(RightRow, i64)> = Vec::new();
    let mut events = Vec::new();
    for step in steps {
        match *step {
            Step::Insert { side: 0, key, value, weight, .. } => {
                live_left.push(((key, value), weight));
                events.push(Event::Left((key, value), weight));
            }
            Step::Insert { key, value, text, weight, .. } => {
                let row = (key, value, text.map(|t| TEXTS[t]));
                live_right.push((row, weight));
                events.push(Event::Right(row, weight));
            }
            Step::Retract { side: 0, pick } if !live_left.is_empty() => {
                let (row, weight) = live_left.swap_remove(pick % live_left.len());
                events.push(Event::Left(row, -weight));
            }
            Step::Retract { side: 1, pick } if !live_right.is_empty() => {
                let (row, weight) = live_right.swap_remove(pick % live_right.len());
                events.push(Event::Right(row, -weight));
            }
            Step::Retract { .. } => {}
        }
    }
    events
}

/// Batches of consecutive events of one side, at most `size` rows each.
fn batches(events: &[Event], size: usize) -> Vec<Vec<Event>> {
    let mut batches: Vec<Vec<Event>> = Vec::new();
    for event in events {
        match batches.last_mut() {
            Some(last) if last.len() < size && last[0].side() == event.side() => last.push(event.clone()),
            _ => batches.push(vec![event.clone()]),
        }
    }
    batches
}

/// The vnode of a key, as the exchange computes it for either input.
pub(super) fn vnode_of(key: Option<i64>) -> u32 {
    let mut rows = sluice_types::key::KeyRows::default();
    let encoder = sluice_types::key::KeyEncoder::new(vec![DataType::Int64]).expect("encoder");
    let column: ArrayRef = Arc::new(Int64Array::from(vec![key]));
    encoder.encode(&[column], &mut rows).expect("encode");
    vnode::of_hash(rows.hash(0), VNODES)
}

fn feed(operator: &mut JoinOperator, events: &[Event]) -> Vec<String> {
    if events.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if events[0].side() == 0 {
        let rows: Vec<(LeftRow, i64)> =
            events.iter().map(|e| if let Event::Left(r, w) = e { (*r, *w) } else { unreachable!() }).collect();
        operator.on_port_data(0, left_batch(&rows), &mut out).expect("left rows");
    } else {
        let rows: Vec<(RightRow, i64)> =
            events.iter().map(|e| if let Event::Right(r, w) = e { (*r, *w) } else { unreachable!() }).collect();
        operator.on_port_data(1, right_batch(&rows), &mut out).expect("right rows");
    }
    lines(&out)
}

/// The vnodes of `count` instances (1 or 2) splitting them at `split`.
pub(super) fn ranges(count: usize, split: u32) -> Vec<std::ops::Range<u32>> {
    let bounds = if count == 1 { vec![0, VNODES] } else { vec![0, split, VNODES] };
    bounds.windows(2).map(|pair| pair[0]..pair[1]).collect()
}

/// Instances of a join and the runs their checkpoints wrote: `ranges[i]` are the vnodes
/// of `instances[i]`.
struct Running {
    instances: Vec<JoinOperator>,
    ranges: Vec<std::ops::Range<u32>>,
    runs: StateModel,
}

impl Running {
    fn new(make: &impl Fn() -> JoinOperator) -> Running {
        Running { instances: vec![make()], ranges: ranges(1, 0), runs: StateModel::default() }
    }

    /// A checkpoint: every instance's snapshot (a delta when it can) into the runs.
    fn checkpoint(&mut self) {
        for (instance, vnodes) in self.instances.iter_mut().zip(&self.ranges) {
            testing::checkpoint(instance, &mut self.runs, vnodes.clone(), true);
        }
    }

    /// A checkpoint, then `count` new instances restored from the runs, the vnodes below
    /// `split` to the first (all of them when `count` is 1), as after a restart on
    /// another number of threads.
    fn restart(&mut self, count: usize, split: u32, make: &impl Fn() -> JoinOperator) {
        self.checkpoint();
        self.ranges = ranges(count, split);
        self.instances = (self.ranges.iter())
            .map(|vnodes| {
                let mut instance = make().owning(vnodes.clone());
                testing::restore(&mut instance, &self.runs, vnodes.clone()).expect("restore");
                instance
            })
            .collect();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// For every kind, with and without a residual: after every batch the integrated
    /// output equals a nested-loop join of the integrated inputs. At `split_at` the
    /// state moves onto two instances that split the vnodes (rows routed by key, as the
    /// exchange does), at `merge_at` back onto one, as after restarts with other thread
    /// counts.
    #[test]
    fn the_integrated_output_equals_a_join_of_the_integrated_inputs(
        steps in steps(),
        size in 1usize..6,
        split_at in 0usize..30,
        merge_at in 0usize..40,
        split in 1u32..VNODES,
    ) {
        check_against_the_reference(&events(&steps), size, split_at, merge_at, split, None)?;
    }

    /// The same with every side's rows spilled (every chunk but the newest on disk):
    /// probes, lookups of equal rows, removals, compactions and snapshots read them back.
    #[test]
    fn spilled_rows_kept_by_row_join_as_the_reference_does(
        steps in steps(),
        size in 1usize..6,
        split_at in 0usize..30,
        merge_at in 0usize..40,
        split in 1u32..VNODES,
    ) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 64);
        check_against_the_reference(&events(&steps), size, split_at, merge_at, split, Some((&space, false)))?;
        prop_assert_eq!(space.spilled(), 0, "dropped instances leave no spill file");
    }

    /// The same over append-only inputs, whose unpadded sides keep their rows appended
    /// and spilled (every chunk but the newest on disk).
    #[test]
    fn appended_and_spilled_sides_join_as_the_reference_does(
        steps in steps(),
        size in 1usize..6,
        split_at in 0usize..30,
        merge_at in 0usize..40,
        split in 1u32..VNODES,
    ) {
        let inserts: Vec<Event> = events(&steps).into_iter().filter(|e| e.weight() > 0).collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 64);
        check_against_the_reference(&inserts, size, split_at, merge_at, split, Some((&space, true)))?;
    }
}

/// Feeds `events` in batches of at most `size` to each kind of join, with and without a
/// residual (rows spilled into `space` if given, appended where the join may):
/// after every batch the integrated
/// output equals a nested-loop join of the integrated inputs. At `split_at` the state
/// moves onto two instances that split the vnodes at `split` (rows routed by key, as the
/// exchange does), at `merge_at` back onto one.
fn check_against_the_reference(
    events: &[Event],
    size: usize,
    split_at: usize,
    merge_at: usize,
    split: u32,
    spill: Option<(&Arc<SpillSpace>, bool)>,
) -> Result<(), TestCaseError> {
    let space = spill.map(|(space, _)| space);
    let appended = spill.is_some_and(|(_, appended)| appended);
    let checkpoint_every = split as usize % 3;
    let batches = batches(events, size);
    for kind in KINDS {
        for residual in [false, true] {
            let make = || match space {
                Some(space) if appended => appending_join(kind, residual, space),
                Some(space) => spilling_join(kind, residual, space),
                None => join(kind, residual),
            };
            let mut running = Running::new(&make);
            let mut output: Table<String> = BTreeMap::new();
            let mut lefts: Table<LeftRow> = BTreeMap::new();
            let mut rights: Table<RightRow> = BTreeMap::new();
            for (index, batch) in batches.iter().enumerate() {
                if index == split_at && running.instances.len() == 1 {
                    running.restart(2, split, &make);
                } else if index == merge_at && running.instances.len() == 2 {
                    running.restart(1, split, &make);
                } else if index % 3 == checkpoint_every {
                    // A checkpoint with nothing restored: the next restart's runs are
                    // deltas over it.
                    running.checkpoint();
                }
                let instances = &mut running.instances;
                if instances.len() == 1 {
                    integrate(&mut output, feed(&mut instances[0], batch))?;
                } else {
                    let (low, high): (Vec<Event>, Vec<Event>) =
                        batch.iter().cloned().partition(|e| vnode_of(e.key()) < split);
                    integrate(&mut output, feed(&mut instances[0], &low))?;
                    integrate(&mut output, feed(&mut instances[1], &high))?;
                }
                for event in batch {
                    match event {
                        Event::Left(row, weight) => apply(&mut lefts, row, *weight),
                        Event::Right(row, weight) => apply(&mut rights, row, *weight),
                    }
                }
                prop_assert_eq!(
                    &output,
                    &reference(kind, residual, &lefts, &rights),
                    "{:?}, residual {}, after batch {}",
                    kind,
                    residual,
                    index
                );
            }
            // What the runs hold after one more checkpoint is the state held: restored,
            // it holds as many rows.
            running.checkpoint();
            let held: usize = running.instances.iter().map(JoinOperator::state_rows).sum();
            let mut restored = make();
            testing::restore(&mut restored, &running.runs, 0..VNODES).expect("restore");
            prop_assert_eq!(restored.state_rows(), held, "the runs hold the state");
            if !appended {
                prop_assert_eq!(held, lefts.len() + rights.len(), "state holds each distinct live row once");
            } else {
                // An appended side keeps equal rows apart.
                prop_assert!(held >= lefts.len() + rights.len() && held <= events.len());
            }
        }
    }
    if let Some(space) = space {
        prop_assert_eq!(space.resident(), 0, "dropped instances leave no memory counted");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// State blobs.

#[test]
fn a_snapshot_holds_the_state_at_the_barrier() {
    let mut operator = join(JoinKind::Inner, false);
    left(&mut operator, &[((Some(1), 10), 1)]);
    let snapshot = operator.snapshot_state(false).expect("snapshot").expect("state");
    left(&mut operator, &[((Some(1), 11), 1)]);
    let mut records = sluice_state::CollectedState::default();
    (snapshot.job)(&mut records).expect("records");
    let mut restored = join(JoinKind::Inner, false);
    restored.restore_state(&mut records.into_source()).expect("restore");
    assert_eq!(right(&mut restored, &[((Some(1), 20, None), 1)]), ["+1 1,10,1,20,∅"]);
}

#[test]
fn an_empty_join_writes_no_records() {
    let mut operator = join(JoinKind::Full, false);
    assert!(testing::snapshot(&mut operator, false).1.points.is_empty());
    left(&mut operator, &[((Some(1), 10), 1), ((Some(1), 10), -1)]);
    assert!(testing::snapshot(&mut operator, false).1.points.is_empty());
}

/// A delta holds only what changed since the previous snapshot: rows stored, reweighed,
/// matched on a padded side, and removed.
#[test]
fn a_delta_holds_what_changed_since_the_previous_snapshot() {
    let mut operator = join(JoinKind::Full, false);
    left(&mut operator, &[((Some(1), 10), 1), ((Some(2), 20), 1), ((Some(3), 30), 1)]);
    let (kind, first) = testing::snapshot(&mut operator, true);
    assert_eq!((kind, first.points.len()), (SnapshotKind::Full, 3), "the first snapshot is full");
    // Key 1's left row gains a match (the left side is padded: its count matters), key
    // 2's is removed, a new right row arrives; key 3 is untouched.
    right(&mut operator, &[((Some(1), 5, None), 1)]);
    left(&mut operator, &[((Some(2), 20), -1)]);
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    let written: Vec<(u8, bool)> = delta.points.iter().map(|(_, key, value)| (key[0], value.is_some())).collect();
    assert_eq!(written.len(), 3, "{delta:?}");
    assert_eq!(written.iter().filter(|(side, put)| *side == 0 && *put).count(), 1, "key 1's left row, matched");
    assert_eq!(written.iter().filter(|(side, put)| *side == 0 && !*put).count(), 1, "key 2's left row, removed");
    assert_eq!(written.iter().filter(|(side, _)| *side == 1).count(), 1, "the right row");
    let (_, nothing) = testing::snapshot(&mut operator, true);
    assert!(nothing.points.is_empty() && nothing.ranges.is_empty(), "nothing changed since");
    // Without checkpoints nothing is kept: a store starts keeping changes at its first
    // snapshot, so a delta asked before it is full.
    let mut fresh = join(JoinKind::Full, false);
    left(&mut fresh, &[((Some(1), 10), 1)]);
    assert_eq!(testing::snapshot(&mut fresh, true).0, SnapshotKind::Full);
}

/// The state of the golden vector: two copies of a left row and one right row, joined.
fn golden_state() -> JoinOperator {
    let mut operator = join(JoinKind::Full, false);
    left(&mut operator, &[((Some(1), 10), 2)]);
    right(&mut operator, &[((Some(1), 20, Some("x")), 1)]);
    operator
}

/// The golden records: (key, value) of each, both rows kept by row.
const GOLDEN: [(&str, &str); 2] = [
    // left (00), row: lk 1, lv 10 | weight 2 (04), matches 1 (02)
    ("00020100000000000000020a00000000000000", "0402"),
    // right (01), row: rk 1, rv 20, rs "x" | weight 1 (02), matches 2 (04)
    ("01020100000000000000021400000000000000060100000078", "0204"),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

fn golden_records() -> Vec<(u32, Vec<u8>, Vec<u8>)> {
    GOLDEN.iter().map(|(key, value)| (vnode_of(Some(1)), unhex(key), unhex(value))).collect()
}

/// A golden vector: state records are persisted, so their layout (and the key encoding
/// and hash inside) must not change silently; a change fails here and bumps
/// `JOIN_STATE_VERSION`.
#[test]
fn snapshot_records_are_pinned_byte_for_byte() {
    let (_, records) = testing::snapshot(&mut golden_state(), false);
    let written: Vec<(u32, String, String)> =
        testing::puts(&records).iter().map(|(v, k, x)| (*v, hex(k), hex(x))).collect();
    let expected: Vec<(u32, String, String)> =
        GOLDEN.iter().map(|(k, x)| (vnode_of(Some(1)), k.to_string(), x.to_string())).collect();
    assert_eq!(written, expected);
    let key_hash = sluice_types::key::hash(&[0x02, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(vnode_of(Some(1)), vnode::of_hash(key_hash, VNODES), "the exchange's vnode");
}

#[test]
fn the_golden_records_restore_to_their_state() {
    let mut operator = join(JoinKind::Full, false);
    testing::restore_records(&mut operator, golden_records()).expect("restore");
    assert_eq!(operator.state_rows(), 2);
    assert_eq!(operator.state_bytes(), 18 + 24);
    // The right row goes: both left copies lose their only match and are padded.
    assert_eq!(right(&mut operator, &[((Some(1), 20, Some("x")), -1)]), ["-2 1,10,1,20,x", "+2 1,10,∅,∅,∅"]);
    // A new left row meets nothing.
    assert_eq!(left(&mut operator, &[((Some(1), 10), -2)]), ["-2 1,10,∅,∅,∅"]);
    assert_eq!(operator.state_rows(), 0);
}

#[test]
fn damaged_records_are_refused() {
    type Record = (u32, Vec<u8>, Vec<u8>);
    let restore =
        |records: Vec<Record>| testing::restore_records(&mut join(JoinKind::Full, false), records).map_err(|e| e.code);
    assert_eq!(restore(golden_records()), Ok(()));
    let damaged = |change: &dyn Fn(&mut Record)| {
        let mut records = golden_records();
        change(&mut records[0]);
        restore(records)
    };
    let corrupt = Err("state.corrupt");
    assert_eq!(damaged(&|r| r.2.clear()), corrupt, "no weight");
    assert_eq!(damaged(&|r| r.2 = vec![0x00, 0x02]), corrupt, "weight 0");
    assert_eq!(damaged(&|r| r.2.push(0)), corrupt, "trailing bytes");
    assert_eq!(damaged(&|r| r.2 = vec![0x84, 0x00, 0x02]), corrupt, "a varint longer than needed");
    assert_eq!(damaged(&|r| r.1[0] = 2), corrupt, "a third side");
    assert_eq!(damaged(&|r| r.1.clear()), corrupt, "an empty key");
    assert_eq!(damaged(&|r| r.1[1] = 0x06), corrupt, "a string where an integer belongs");
    assert_eq!(damaged(&|r| r.1.truncate(5)), corrupt, "a truncated row");
    assert_eq!(damaged(&|r| r.0 = (r.0 + 1) % VNODES), corrupt, "under another vnode than its key's");
    // lv (not nullable) as NULL.
    assert_eq!(damaged(&|r| r.1.splice(10.., [0x00]).for_each(drop)), corrupt, "NULL in a NOT NULL column");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes, and any damage to valid records, give an error or a state, never a panic.
    #[test]
    fn arbitrary_records_never_panic(
        key in prop::collection::vec(any::<u8>(), 0..48),
        value in prop::collection::vec(any::<u8>(), 0..24),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let _ = testing::restore_records(&mut join(JoinKind::Full, true), vec![(0, key, value)]);
        let mut records = golden_records();
        for (at, byte) in edits {
            let record = &mut records[at % 2];
            let field = if at % 3 == 0 { &mut record.2 } else { &mut record.1 };
            if !field.is_empty() {
                let at = at % field.len();
                field[at] = byte;
            }
        }
        let mut operator = join(JoinKind::Full, true);
        if testing::restore_records(&mut operator, records).is_ok() {
            // Whatever was restored joins without panicking.
            let mut out = Vec::new();
            let _ = operator.on_port_data(1, right_batch(&[((Some(1), 20, Some("x")), 1)]), &mut out);
            let _ = operator.on_port_data(0, left_batch(&[((Some(1), 10), 1)]), &mut out);
        }
    }
}

#[test]
fn a_failing_residual_is_an_error_not_a_panic() {
    // `lv / (rv - rv) = lv`: a division by zero on every pair.
    let zero = Arc::new(BinaryExpr::new(
        Arc::new(Column::new("rv", 3)),
        BinaryOperator::Minus,
        Arc::new(Column::new("rv", 3)),
    ));
    let quotient = Arc::new(BinaryExpr::new(Arc::new(Column::new("lv", 1)), BinaryOperator::Divide, zero));
    let mut failing = spec(JoinKind::Inner, false);
    failing.residual = Some(Arc::new(BinaryExpr::new(quotient, BinaryOperator::Eq, Arc::new(Column::new("lv", 1)))));
    let mut operator = JoinOperator::new(failing, &context()).expect("join");
    left(&mut operator, &[((Some(1), 10), 1)]);
    let error = operator.on_port_data(1, right_batch(&[((Some(1), 20, None), 1)]), &mut Vec::new()).expect_err("fails");
    assert_eq!(error.code, "join.residual");
}

/// A composite key of a narrow integer and a string: rows meet by both columns, and
/// the state of a key lives in the vnode the exchange routes the key's rows to.
#[test]
fn composite_keys_join_and_are_placed_as_the_exchange_routes_them() {
    use crate::partition::HashPartitioner;
    use arrow::array::Int32Array;
    use sluice_runtime::Partitioner;

    let left_schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, false),
        Field::new("b", DataType::Utf8, false),
        Field::new("l", DataType::Int64, false),
    ]));
    let right_schema = Arc::new(Schema::new(vec![
        Field::new("r", DataType::Int64, false),
        Field::new("b", DataType::Utf8, false),
        Field::new("a", DataType::Int32, false),
    ]));
    let fields: Vec<Field> =
        left_schema.fields().iter().chain(right_schema.fields().iter()).map(|f| f.as_ref().clone()).collect();
    let spec = JoinSpec {
        kind: JoinKind::Inner,
        left_schema: Arc::clone(&left_schema),
        right_schema: Arc::clone(&right_schema),
        output_schema: Arc::new(Schema::new(fields)),
        left_keys: vec![0, 1],
        right_keys: vec![2, 1],
        residual: None,
        vnodes: VNODES,
        expiry: [None, None],
        late_rows: "view j: late rows".into(),
        append_only: [false, false],
        spill: None,
    };
    let mut operator = JoinOperator::new(spec, &context()).expect("join");
    let left_rows = RecordBatch::try_new(
        Arc::clone(&left_schema),
        vec![
            Arc::new(Int32Array::from(vec![1, 1, 2])),
            Arc::new(StringArray::from(vec!["p", "q", "p"])),
            Arc::new(Int64Array::from(vec![10, 11, 12])),
        ],
    )
    .expect("left");
    let right_rows = RecordBatch::try_new(
        Arc::clone(&right_schema),
        vec![
            Arc::new(Int64Array::from(vec![20, 21])),
            Arc::new(StringArray::from(vec!["q", "p"])),
            Arc::new(Int32Array::from(vec![1, 1])),
        ],
    )
    .expect("right");
    operator.on_port_data(0, Batch::inserts(left_rows.clone()), &mut Vec::new()).expect("left rows");
    let mut out = Vec::new();
    operator.on_port_data(1, Batch::inserts(right_rows), &mut out).expect("right rows");
    assert_eq!(lines(&out), ["+1 1,q,11,20,q,1", "+1 1,p,10,21,p,1"]);

    // With as many slots as vnodes, the exchange's slot of a row is its vnode.
    let mut routed = Vec::new();
    HashPartitioner::new(vec![0, 1], VNODES).partition(Batch::inserts(left_rows), VNODES, &mut routed).expect("route");
    let records = testing::puts(&testing::snapshot(&mut operator, false).1);
    for (slot, part) in routed {
        for row in 0..part.num_rows() {
            let l = part.rows.column(2).as_any().downcast_ref::<Int64Array>().expect("l").value(row);
            let (vnode, _, _) = records
                .iter()
                .find(|(_, key, _)| key.windows(9).any(|w| w == [&[0x02][..], &l.to_le_bytes()].concat()))
                .expect("a record holds the row");
            assert_eq!(*vnode, slot, "left row l = {l}");
        }
    }
}

/// Over a budget of 0 an inner join of append-only inputs spills every chunk of rows and
/// page of entries but the newest of each side, and joins, snapshots and restores as the
/// join held in memory.
#[test]
fn spilled_rows_join_snapshot_and_restore_as_rows_in_memory_do() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 64);
    let mut spilled = appending_join(JoinKind::Inner, true, &space);
    let mut kept = join(JoinKind::Inner, true);
    let lefts: Vec<(LeftRow, i64)> = (0..60).map(|i| ((Some(i % 5), i), 1 + i / 50)).collect();
    let rights: Vec<(RightRow, i64)> = (0..5).map(|k| ((Some(k), 30, Some("x")), 1)).collect();
    for operator in [&mut spilled, &mut kept] {
        assert!(left(operator, &lefts).is_empty());
    }
    // In memory: the newest chunk of rows (64 bytes), the last one spilled, kept to be
    // the next (64 bytes), and page of entries (five of 12 bytes), and the key table,
    // counted but never spilled (1,024 heads of 32 bytes at a time, and the hash table's
    // buckets).
    assert!(space.spilled() > 0 && space.resident() <= 2 * 64 + 60 + 1024 * 32 + 64, "{} resident", space.resident());
    let joined = right(&mut spilled, &rights);
    assert_eq!(joined.len(), 30, "each right row joins the left rows of its key with lv < 30");
    assert_eq!(joined, right(&mut kept, &rights));
    let (_, from_disk) = testing::snapshot(&mut spilled, false);
    let (_, from_memory) = testing::snapshot(&mut kept, false);
    assert_eq!(from_disk.points.len(), from_memory.points.len());
    let mut restored = appending_join(JoinKind::Inner, true, &space);
    restored.restore_state(&mut from_disk.into_source()).expect("restore");
    let more: Vec<(RightRow, i64)> = (0..5).map(|k| ((Some(k), 55, None), 1)).collect();
    assert_eq!(right(&mut restored, &more), right(&mut kept, &more));
    assert_eq!(restored.state_rows(), kept.state_rows());
}

#[test]
fn an_inner_joins_rows_not_written_for_the_ttl_are_dropped_and_match_no_more() {
    let (clock, now) = crate::ttl::manual_clock(0);
    let mut operator = join(JoinKind::Inner, false).with_ttl(std::time::Duration::from_secs(10), clock);
    let at = |ms: u64| now.store(ms, std::sync::atomic::Ordering::Relaxed);
    assert!(left(&mut operator, &[((Some(1), 10), 1), ((Some(2), 20), 1)]).is_empty());
    at(6_000);
    // A second copy of (2, 20) is a write: its clock starts again.
    assert!(left(&mut operator, &[((Some(2), 20), 1)]).is_empty());
    at(12_000);
    // (1, 10) was last written at 0: gone; (2, 20) twice, written at 6 s: kept.
    assert_eq!(right(&mut operator, &[((Some(1), 5, Some("x")), 1), ((Some(2), 6, Some("y")), 1)]), ["+2 2,20,2,6,y"]);
    assert_eq!(operator.state_rows(), 3);
    at(22_000);
    let mut out = Vec::new();
    operator.on_watermark(0, &mut out).expect("watermark");
    assert_eq!(operator.state_rows(), 0, "every row expired, the right ones (written at 12 s) too");
}
