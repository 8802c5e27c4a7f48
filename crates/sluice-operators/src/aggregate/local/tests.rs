//! Two phases give one phase's answer: random batches of windowed rows, with watermarks
//! between them, through the window aggregate alone and through the local aggregate
//! then the merging one, give the same windows, values and late rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use proptest::prelude::*;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message};

use super::{LocalWindowAggregate, can_slice, can_split, merging_spec, partial_schema};
use crate::aggregate::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregate, WindowAggregateSpec};
use crate::counter::LazyCounter;
use crate::window::{WindowAssign, WindowKind};
use sluice_runtime::Metrics;

const VNODES: u32 = 16;
const SIZE: i64 = 10;

fn input_schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
        Field::new("k", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("keep", DataType::Boolean, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// `window_start, window_end, KEY, COUNT(*), COUNT(v), SUM(v), MIN(v), MAX(f),
/// COUNT(*) FILTER (WHERE keep), SUM(v) FILTER (WHERE keep), MIN(name), MAX(v)`, grouped
/// by the input column `key` (`k`, a VARCHAR, or `v`, a BIGINT), or by the window alone.
fn spec(key: Option<usize>) -> WindowAggregateSpec {
    let keyless = key.is_none();
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    let mut fields = vec![Field::new("window_start", ts.clone(), false), Field::new("window_end", ts, false)];
    if let Some(key) = key {
        fields.push(input_schema().field(key).clone());
    }
    for (name, data_type) in [
        ("rows", DataType::Int64),
        ("values", DataType::Int64),
        ("total", DataType::Int64),
        ("low", DataType::Int64),
        ("high", DataType::Float64),
        ("kept", DataType::Int64),
        ("kept_total", DataType::Int64),
        ("first_name", DataType::Utf8),
        ("top", DataType::Int64),
    ] {
        fields.push(Field::new(name, data_type, true));
    }
    let aggregate = |function, argument, filter| AggregateSpec { function, argument, filter };
    let mut groups = vec![GroupColumn::WindowStart, GroupColumn::WindowEnd];
    if !keyless {
        groups.push(GroupColumn::Key(0));
    }
    WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: key.into_iter().collect(),
        groups,
        aggregates: vec![
            aggregate(AggregateFunction::CountRows, None, None),
            aggregate(AggregateFunction::Count, Some(3), None),
            aggregate(AggregateFunction::Sum, Some(3), None),
            aggregate(AggregateFunction::Min, Some(3), None),
            aggregate(AggregateFunction::Max, Some(4), None),
            aggregate(AggregateFunction::CountRows, None, Some(5)),
            aggregate(AggregateFunction::Sum, Some(3), Some(5)),
            aggregate(AggregateFunction::Min, Some(6), None),
            aggregate(AggregateFunction::Max, Some(3), None),
        ],
        output: Arc::new(Schema::new(fields)),
        batch_size: 5,
        late_weights: None,
    }
}

/// A row: event time, key, value, float (integral, so any order sums it exactly), the
/// filter, a name.
type Row = (i64, Option<u8>, Option<i64>, Option<i8>, Option<bool>, Option<u8>);

fn batch(rows: &[Row]) -> Batch {
    let start = |ts: i64| ts.div_euclid(SIZE) * SIZE;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| start(r.0)))),
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| start(r.0) + SIZE))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.map(|k| format!("k{k}"))))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.3.map(f64::from)))),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| r.4))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.5.map(|n| format!("n{n}"))))),
    ];
    Batch::inserts(RecordBatch::try_new(input_schema(), columns).expect("batch"))
}

/// Feeds `steps` (a batch, then a watermark) to `operators` chained, then the end; the
/// output rows as sorted text lines.
fn run(operators: &mut [Box<dyn Operator>], steps: &[(Vec<Row>, i64)]) -> Vec<String> {
    let mut messages: Vec<Message> = Vec::new();
    for (rows, watermark) in steps {
        messages.push(Message::Data(batch(rows)));
        messages.push(Message::Watermark(*watermark));
    }
    messages.push(Message::EndOfData);
    pass(operators, messages)
}

/// `messages` through `operators` chained; the output rows as sorted text lines.
fn pass(operators: &mut [Box<dyn Operator>], mut messages: Vec<Message>) -> Vec<String> {
    for operator in operators.iter_mut() {
        let mut out = Vec::new();
        for message in messages {
            match message {
                Message::Data(batch) => operator.on_data(batch, &mut out).expect("data"),
                Message::Watermark(w) => operator.on_watermark(w, &mut out).expect("watermark"),
                Message::EndOfData => operator.on_end(&mut out).expect("end"),
                Message::Barrier(_) => unreachable!("no barriers here"),
            }
            while operator.has_more() {
                operator.on_resume(&mut out).expect("resume");
            }
        }
        messages = out;
    }
    let batches: Vec<RecordBatch> = messages
        .into_iter()
        .filter_map(|m| match m {
            Message::Data(batch) => Some(batch.rows),
            _ => None,
        })
        .collect();
    let mut lines = Vec::new();
    if let Some(first) = batches.first() {
        let all = concat_batches(&first.schema(), &batches).expect("concat");
        for row in 0..all.num_rows() {
            let values: Vec<String> = all
                .columns()
                .iter()
                .map(|c| if c.is_null(row) { "∅".into() } else { array_value_to_string(c, row).expect("text") })
                .collect();
            lines.push(values.join(","));
        }
    }
    lines.sort();
    lines
}

fn one_phase(key: Option<usize>, late: &Arc<AtomicU64>) -> Vec<Box<dyn Operator>> {
    let aggregate = WindowAggregate::new(spec(key), &input_schema(), Arc::clone(late), VNODES).expect("one phase");
    vec![Box::new(aggregate)]
}

fn two_phases(key: Option<usize>, late: &Arc<AtomicU64>) -> Vec<Box<dyn Operator>> {
    let spec = spec(key);
    let partials = partial_schema(&spec, &input_schema());
    let local = LocalWindowAggregate::new(spec.clone(), &input_schema()).expect("local");
    let merging = WindowAggregate::new(merging_spec(&spec), &partials, Arc::clone(late), VNODES).expect("merging");
    vec![Box::new(local), Box::new(merging)]
}

fn row() -> impl Strategy<Value = Row> {
    (
        0i64..60,
        proptest::option::weighted(0.9, 0u8..4),
        proptest::option::weighted(0.8, -5i64..5),
        proptest::option::weighted(0.8, -20i8..20),
        proptest::option::weighted(0.9, any::<bool>()),
        proptest::option::weighted(0.7, 0u8..5),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn two_phases_give_the_answer_and_late_rows_of_one(
        steps in proptest::collection::vec((proptest::collection::vec(row(), 0..12), 0i64..70), 1..8),
        key in proptest::option::of(2usize..4),
    ) {
        let (late_one, late_two) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let expected = run(&mut one_phase(key, &late_one), &steps);
        let got = run(&mut two_phases(key, &late_two), &steps);
        prop_assert_eq!(got, expected);
        prop_assert_eq!(late_two.load(Ordering::Relaxed), late_one.load(Ordering::Relaxed));
    }
}

#[test]
fn a_batch_becomes_one_partial_row_per_window_and_key_in_order_of_first_appearance() {
    let spec = spec(Some(2));
    let mut local = LocalWindowAggregate::new(spec.clone(), &input_schema()).expect("local");
    let rows = [
        (1, Some(1), Some(5), None, Some(true), Some(2)),
        (12, Some(1), Some(7), Some(3), Some(false), None),
        (3, Some(1), Some(9), Some(4), None, Some(1)),
        (4, None, Some(2), None, Some(true), None),
    ];
    let mut out = Vec::new();
    local.on_data(batch(&rows), &mut out).expect("data");
    let [Message::Data(partials)] = out.as_slice() else { panic!("one batch: {out:?}") };
    assert_eq!(partials.rows.schema(), partial_schema(&spec, &input_schema()));
    let column = |i: usize| partials.rows.column(i).clone();
    let ints = |i: usize| -> Vec<Option<i64>> {
        column(i).as_any().downcast_ref::<Int64Array>().expect("BIGINT").iter().collect()
    };
    // Groups: (window 0, k1) rows 0 and 2; (window 10, k1) row 1; (window 0, NULL) row 3.
    assert_eq!(ints(3), [Some(2), Some(1), Some(1)], "COUNT(*)");
    assert_eq!(ints(4), [Some(2), Some(1), Some(1)], "COUNT(v)");
    assert_eq!(ints(5), [Some(14), Some(7), Some(2)], "SUM(v)");
    assert_eq!(ints(8), [Some(1), Some(0), Some(1)], "COUNT(*) FILTER");
    assert_eq!(ints(9), [Some(5), None, Some(2)], "SUM(v) FILTER: NULL without a row");
    assert_eq!(ints(6), [Some(5), Some(7), Some(2)], "MIN(v)");
    assert_eq!(ints(11), [Some(9), Some(7), Some(2)], "MAX(v)");
    assert_eq!(ints(12), [Some(2), Some(1), Some(1)], "__rows");
    // Barriers, watermarks and the end pass through; nothing is held between batches.
    assert!(local.snapshot_state(false).expect("snapshot").is_none());
}

#[test]
fn floating_point_sums_are_not_sliced() {
    // `spec` sums `v` (BIGINT) and takes MAX of `f` (DOUBLE): sliced.
    assert!(can_slice(&spec(Some(2)), &input_schema()));
    let mut summing_floats = spec(Some(2));
    summing_floats.aggregates.push(AggregateSpec { function: AggregateFunction::Sum, argument: Some(4), filter: None });
    assert!(!can_slice(&summing_floats, &input_schema()), "the rounding depends on the order of the additions");
}

#[test]
fn avg_and_count_distinct_are_not_split() {
    let with = |function| vec![AggregateSpec { function, argument: Some(3), filter: None }];
    assert!(can_split(&with(AggregateFunction::Sum)));
    assert!(!can_split(&with(AggregateFunction::Avg)));
    assert!(!can_split(&with(AggregateFunction::CountDistinct)));
}

/// The rows before their windows: `ts` then the input's `k, v, f, keep, name`.
fn timed_schema() -> SchemaRef {
    let mut fields = vec![Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true)];
    fields.extend(input_schema().fields().iter().skip(2).map(|f| f.as_ref().clone()));
    Arc::new(Schema::new(fields))
}

/// A row whose event time may be NULL.
type TimedRow = (Option<i64>, Option<u8>, Option<i64>, Option<i8>, Option<bool>, Option<u8>);

fn timed_batch(rows: &[TimedRow]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMillisecondArray::from_iter(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.map(|k| format!("k{k}"))))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.3.map(f64::from)))),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| r.4))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.5.map(|n| format!("n{n}"))))),
    ];
    Batch::inserts(RecordBatch::try_new(timed_schema(), columns).expect("batch"))
}

/// The window assignment's output (`ts, k, v, f, keep, name, window_start, window_end,
/// window_time`) as the aggregates' input ([`input_schema`]).
struct ToInput;
impl Operator for ToInput {
    fn name(&self) -> &str {
        "to_input"
    }
    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), sluice_types::SluiceError> {
        let columns = [6, 7, 1, 2, 3, 4, 5].iter().map(|&i| Arc::clone(batch.rows.column(i))).collect();
        out.push(Message::Data(Batch::inserts(RecordBatch::try_new(input_schema(), columns)?)));
        Ok(())
    }
}

fn assign(kind: WindowKind, metrics: &Arc<Metrics>) -> Box<dyn Operator> {
    let mut fields: Vec<Field> = timed_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.extend(WindowKind::output_fields());
    let outside = LazyCounter::new(Arc::clone(metrics), "outside");
    let schema = Arc::new(Schema::new(fields));
    Box::new(WindowAssign::new(0, kind, schema, metrics.counter("without time"), outside))
}

fn sliced_assign(hop: WindowKind, metrics: &Arc<Metrics>) -> Box<dyn Operator> {
    let mut fields: Vec<Field> = timed_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.extend(WindowKind::output_fields());
    let outside = LazyCounter::new(Arc::clone(metrics), "outside");
    let schema = Arc::new(Schema::new(fields));
    Box::new(WindowAssign::new(0, hop, schema, metrics.counter("without time"), outside).sliced())
}

fn timed_row() -> impl Strategy<Value = TimedRow> {
    let ts = prop_oneof![8 => -30i64..90, 1 => i64::MAX - 40..=i64::MAX, 1 => i64::MIN..i64::MIN + 40];
    (proptest::option::weighted(0.95, ts), row()).prop_map(|(ts, row)| (ts, row.1, row.2, row.3, row.4, row.5))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Rows assigned to HOP slices and folded per slice give, once merged, what every
    /// row copied into each of its windows gives one phase: the same windows, values,
    /// late rows and rows outside the window range; including slides above the size
    /// (rows between windows), sizes the slide does not divide, and times at the limits
    /// of i64.
    #[test]
    fn sliced_hop_partials_give_the_answer_of_every_row_in_each_window(
        steps in proptest::collection::vec((proptest::collection::vec(timed_row(), 0..12), -40i64..100), 1..8),
        key in proptest::option::of(2usize..4),
        slide in 1i64..8,
        size in 1i64..25,
    ) {
        let hop = WindowKind::Hop { slide_ms: slide, size_ms: size };
        let slice = hop.slice_ms().expect("a HOP window has slices");
        prop_assert!(slide % slice == 0 && size % slice == 0);
        let mut messages: Vec<Message> = Vec::new();
        for (rows, watermark) in &steps {
            messages.push(Message::Data(timed_batch(rows)));
            messages.push(Message::Watermark(*watermark));
        }
        messages.push(Message::EndOfData);
        let (late_one, late_two) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (metrics_one, metrics_two) =
            (Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)));
        let mut one: Vec<Box<dyn Operator>> = vec![assign(hop, &metrics_one), Box::new(ToInput)];
        one.extend(one_phase(key, &late_one));
        let expected = pass(&mut one, messages.clone());
        let spec = spec(key);
        let local = LocalWindowAggregate::new(spec.clone(), &input_schema())
            .expect("local")
            .sliced(hop, LazyCounter::new(Arc::clone(&metrics_two), "outside"));
        let partials = partial_schema(&spec, &input_schema());
        let merging = WindowAggregate::new(merging_spec(&spec), &partials, Arc::clone(&late_two), VNODES);
        let mut two: Vec<Box<dyn Operator>> = vec![
            sliced_assign(hop, &metrics_two),
            Box::new(ToInput),
            Box::new(local),
            Box::new(merging.expect("merging")),
        ];
        let got = pass(&mut two, messages);
        prop_assert_eq!(got, expected);
        prop_assert_eq!(late_two.load(Ordering::Relaxed), late_one.load(Ordering::Relaxed));
        let counted = |metrics: &Metrics| {
            let mut counters = metrics.counters();
            counters.sort();
            counters
        };
        prop_assert_eq!(counted(&metrics_two), counted(&metrics_one));
    }
}

#[test]
fn a_slice_gives_its_partial_to_each_of_its_windows() {
    // HOP(slide 4, size 6): windows [-4, 2), [0, 6), [4, 10), …; slices of 2.
    let hop = WindowKind::Hop { slide_ms: 4, size_ms: 6 };
    assert_eq!(hop.slice_ms(), Some(2));
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let spec = spec(Some(3));
    let local = LocalWindowAggregate::new(spec.clone(), &input_schema())
        .expect("local")
        .sliced(hop, LazyCounter::new(Arc::clone(&metrics), "outside"));
    let mut chain: Vec<Box<dyn Operator>> = vec![sliced_assign(hop, &metrics), Box::new(ToInput), Box::new(local)];
    let rows = [
        (Some(1), Some(1), Some(5), None, Some(true), Some(2)),
        (Some(0), Some(1), Some(5), None, Some(true), Some(2)),
        (Some(2), Some(1), Some(5), None, Some(true), Some(2)),
        (Some(i64::MAX), Some(1), Some(5), None, Some(true), Some(2)),
        (None, Some(1), Some(5), None, Some(true), Some(2)),
    ];
    let lines = pass(&mut chain, vec![Message::Data(timed_batch(&rows))]);
    let time = |ms: i64| array_value_to_string(&TimestampMillisecondArray::from(vec![ms]), 0).expect("text");
    // (start, end, key v, SUM(v), __rows): slice [0, 2) (rows at 0 and 1) in [-4, 2) and
    // [0, 6); slice [2, 4) (the row at 2) in [0, 6) only.
    let mut got: Vec<String> = lines
        .iter()
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            [fields[0], fields[1], fields[2], fields[5], fields[fields.len() - 1]].join(",")
        })
        .collect();
    got.sort();
    let mut expected = vec![
        format!("{},{},5,10,2", time(-4), time(2)),
        format!("{},{},5,10,2", time(0), time(6)),
        format!("{},{},5,5,1", time(0), time(6)),
    ];
    expected.sort();
    assert_eq!(got, expected);
    // The row at i64::MAX has a window past i64, the last none.
    let mut counters = metrics.counters();
    counters.sort();
    assert_eq!(counters, [("outside".to_string(), 1), ("without time".to_string(), 1)]);
}
