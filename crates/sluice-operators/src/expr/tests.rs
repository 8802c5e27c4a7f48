//! Filter and Project on batches where an expression fails on some rows.

use std::sync::Arc;

use arrow::array::{Int64Array, StringArray};
use arrow::compute::CastOptions;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::FormatOptions;
use datafusion_physical_expr::expressions::{CastExpr, col, is_not_null};
use sluice_runtime::Metrics;

use super::*;
use crate::row_errors::OnRowError;

const FAILING: &str = "view v: rows failing an expression";

/// `CAST(s AS BIGINT)`, failing on texts that are no number (as SQL's CAST does).
fn cast_s(schema: &Schema) -> Arc<dyn PhysicalExpr> {
    let options = CastOptions { safe: false, format_options: FormatOptions::default() };
    Arc::new(CastExpr::new(col("s", schema).expect("column s"), DataType::Int64, Some(options)))
}

fn input() -> (Arc<Schema>, Batch) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("s", DataType::Utf8, true)]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
        Arc::new(StringArray::from(vec![Some("10"), Some("ten"), None, Some("40")])),
    ];
    let rows = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
    (schema, Batch::with_weights(rows, Int64Array::from(vec![1, 1, 1, -1])))
}

fn counter(metrics: &Metrics) -> Option<u64> {
    metrics.counters().into_iter().find(|(name, _)| name == FAILING).map(|(_, value)| value)
}

/// Runs `operator` on `batch`: its output rows' first column and weights, or its error.
fn run(mut operator: Box<dyn Operator>, batch: Batch) -> Result<(Vec<Option<i64>>, Vec<i64>), SluiceError> {
    let mut out = Vec::new();
    operator.on_data(batch, &mut out)?;
    let mut values = Vec::new();
    let mut weights = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { panic!("only data expected") };
        let column = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64").clone();
        values.extend(column.iter());
        weights.extend((0..batch.num_rows()).map(|row| batch.weight(row)));
    }
    Ok((values, weights))
}

fn project(schema: &Schema, on_error: OnRowError, metrics: &Arc<Metrics>) -> Box<dyn Operator> {
    let output = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
    let errors = RowErrors::new("v", on_error, Arc::clone(metrics));
    Box::new(Project::new(vec![cast_s(schema)], vec!["CAST(s AS BIGINT) AS n".into()], output, errors))
}

fn filter(schema: &Schema, on_error: OnRowError, metrics: &Arc<Metrics>) -> Box<dyn Operator> {
    let predicate = is_not_null(cast_s(schema)).expect("predicate");
    let errors = RowErrors::new("v", on_error, Arc::clone(metrics));
    Box::new(Filter::new(predicate, "CAST(s AS BIGINT) IS NOT NULL", errors))
}

#[test]
fn skip_drops_and_counts_only_the_failing_rows() {
    let (schema, batch) = input();
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let projected = run(project(&schema, OnRowError::Skip, &metrics), batch.clone()).expect("skip");
    assert_eq!(projected, (vec![Some(10), None, Some(40)], vec![1, 1, -1]));
    assert_eq!(counter(&metrics), Some(1));
    let filtered = run(filter(&schema, OnRowError::Skip, &metrics), batch).expect("skip");
    assert_eq!(filtered, (vec![Some(1), Some(4)], vec![1, -1]), "k of the rows whose s is a number");
    assert_eq!(counter(&metrics), Some(2));
}

#[test]
fn fail_names_the_view_the_expression_and_the_row() {
    let (schema, batch) = input();
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    for operator in [project(&schema, OnRowError::Fail, &metrics), filter(&schema, OnRowError::Fail, &metrics)] {
        let error = run(operator, batch.clone()).expect_err("fail").to_string();
        assert!(error.starts_with("view `v`: the expression `CAST(s AS BIGINT)"), "{error}");
        assert!(error.contains("failed on the row (k = 2, s = ten)"), "{error}");
        assert!(error.contains("on_error = \"skip\""), "{error}");
    }
    assert_eq!(counter(&metrics), None, "fail counts nothing");
}

#[test]
fn batches_that_evaluate_register_no_counter() {
    let (schema, batch) = input();
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let good = batch.rows.slice(0, 1);
    let projected = run(project(&schema, OnRowError::Fail, &metrics), Batch::inserts(good)).expect("evaluates");
    assert_eq!(projected, (vec![Some(10)], vec![1]));
    assert_eq!(counter(&metrics), None);
}

#[test]
fn shown_rows_are_bounded() {
    let value = "x".repeat(1000);
    let schema =
        Arc::new(Schema::new((0..40).map(|i| Field::new(format!("c{i}"), DataType::Utf8, false)).collect::<Vec<_>>()));
    let columns: Vec<ArrayRef> =
        (0..40).map(|_| Arc::new(StringArray::from(vec![value.as_str()])) as ArrayRef).collect();
    let rows = RecordBatch::try_new(schema, columns).expect("batch");
    let text = crate::row_errors::row_text(&rows, 0);
    assert!(text.len() < 2_000, "{} characters", text.len());
    assert!(text.ends_with("… 24 more columns"), "{text}");
}

/// A literal's column (a NULL standing for an unread column, a constant) is built once
/// for the longest batch and sliced for the others: every batch still gets its length.
#[test]
fn literal_columns_have_each_batch_s_length_and_values() {
    use datafusion_common::ScalarValue;
    let output = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("nothing", DataType::Utf8, true),
        Field::new("one", DataType::Int64, false),
    ]));
    let input = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let expressions: Vec<Arc<dyn PhysicalExpr>> = vec![
        col("k", &input).expect("column k"),
        Arc::new(Literal::new(ScalarValue::Utf8(None))),
        // An Int32 literal, cast to the declared BIGINT.
        Arc::new(Literal::new(ScalarValue::Int32(Some(1)))),
    ];
    let texts = vec!["k".into(), "NULL".into(), "1".into()];
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let errors = RowErrors::new("v", OnRowError::Skip, Arc::clone(&metrics));
    let mut project = Project::new(expressions, texts, output, errors);
    let longest = MAX_CACHED_LITERAL_ROWS as i64 + 1;
    let mut kept_so_far = 0;
    for length in [5, 3, 0, 8, 2, longest, 7] {
        let keys = Int64Array::from((0..length).collect::<Vec<i64>>());
        let rows = RecordBatch::try_new(Arc::clone(&input), vec![Arc::new(keys)]).expect("batch");
        let mut out = Vec::new();
        project.on_data(Batch::inserts(rows), &mut out).expect("projects");
        let Some(Message::Data(batch)) = out.pop() else { panic!("a batch of {length} rows") };
        assert_eq!(batch.num_rows(), length as usize);
        let nothing = batch.rows.column(1);
        assert_eq!((nothing.len(), nothing.null_count()), (length as usize, length as usize));
        assert_eq!(nothing.data_type(), &DataType::Utf8);
        let one = batch.rows.column(2).as_any().downcast_ref::<Int64Array>().expect("cast to BIGINT").clone();
        assert_eq!(one.iter().collect::<Vec<_>>(), vec![Some(1); length as usize]);
        if length < longest {
            kept_so_far = kept_so_far.max(length as usize);
        }
        let kept = project.constants.iter().flatten().map(|column| column.len()).max().unwrap_or(0);
        assert_eq!(kept, kept_so_far, "the longest batch up to the bound is kept, not a longer one");
    }
}
