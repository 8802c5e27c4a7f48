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

use super::{LocalWindowAggregate, can_split, merging_spec, partial_schema};
use crate::aggregate::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregate, WindowAggregateSpec};

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
    for operator in operators.iter_mut() {
        let mut out = Vec::new();
        for message in messages {
            match message {
                Message::Data(batch) => operator.on_data(batch, &mut out).expect("data"),
                Message::Watermark(w) => operator.on_watermark(w, &mut out).expect("watermark"),
                Message::EndOfData => operator.on_end(&mut out).expect("end"),
                Message::Barrier(_) => unreachable!("no barriers here"),
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
    assert!(local.snapshot().expect("snapshot").is_none());
}

#[test]
fn avg_and_count_distinct_are_not_split() {
    let with = |function| vec![AggregateSpec { function, argument: Some(3), filter: None }];
    assert!(can_split(&with(AggregateFunction::Sum)));
    assert!(!can_split(&with(AggregateFunction::Avg)));
    assert!(!can_split(&with(AggregateFunction::CountDistinct)));
}
