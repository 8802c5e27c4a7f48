//! Filters and projections: DataFusion physical expressions evaluated per batch.
//!
//! The fast path evaluates each expression once on the whole batch. When that fails (an
//! integer division by zero, a failing CAST), the batch alone is evaluated again row by
//! row, and each failing row follows the source's `on_error` policy through
//! [`RowErrors`]: skipped rows are dropped and counted, `fail` stops the pipeline with the
//! view, the expression text and the row's values. Batches that evaluate are untouched.
//!
//! Stack: evaluating an expression recurses once per level of nesting, so the thread
//! that evaluates needs a stack that grows with the planner's expression depth limit
//! (measured in `crates/sluice-sql/src/stack.rs`).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, UInt32Array};
use arrow::compute::{concat, filter, filter_record_batch, prep_null_mask_filter};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion_common::DataFusionError;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::Literal;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError, Weights};

use crate::row_errors::RowErrors;

/// The longest batch whose literal columns a [`Project`] keeps (128 Ki rows): a longer
/// one (a join's burst of matches) gets its own, freed with it.
const MAX_CACHED_LITERAL_ROWS: usize = 1 << 17;

/// An expression's value on every row of `rows`.
fn evaluate(expression: &dyn PhysicalExpr, rows: &RecordBatch) -> Result<ArrayRef, DataFusionError> {
    expression.evaluate(rows).and_then(|value| value.into_array(rows.num_rows()))
}

fn as_mask(value: &ArrayRef) -> Result<&BooleanArray, SluiceError> {
    value
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| SluiceError::internal("sql.filter_type", format!("filter predicate is {}", value.data_type())))
}

/// Keeps the rows for which the predicate is true (NULL counts as false).
pub struct Filter {
    predicate: Arc<dyn PhysicalExpr>,
    /// The predicate as written, for messages.
    text: String,
    errors: RowErrors,
}

impl Filter {
    pub fn new(predicate: Arc<dyn PhysicalExpr>, text: impl Into<String>, errors: RowErrors) -> Filter {
        Filter { predicate, text: text.into(), errors }
    }

    /// The mask of a batch whose evaluation failed: failing rows are handled and false.
    fn mask_row_by_row(&mut self, rows: &RecordBatch) -> Result<BooleanArray, SluiceError> {
        let mut keep = Vec::with_capacity(rows.num_rows());
        for row in 0..rows.num_rows() {
            match evaluate(self.predicate.as_ref(), &rows.slice(row, 1)) {
                Ok(value) => {
                    let mask = as_mask(&value)?;
                    keep.push(mask.is_valid(0) && mask.value(0));
                }
                Err(error) => {
                    self.errors.failed(&self.text, rows, row, &error)?;
                    keep.push(false);
                }
            }
        }
        Ok(BooleanArray::from(keep))
    }
}

impl Operator for Filter {
    fn name(&self) -> &str {
        "filter"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let mask = match evaluate(self.predicate.as_ref(), &batch.rows) {
            Ok(value) => as_mask(&value)?.clone(),
            Err(_) => self.mask_row_by_row(&batch.rows)?,
        };
        let mask = if mask.null_count() > 0 { prep_null_mask_filter(&mask) } else { mask };
        let selected = mask.true_count();
        if selected == 0 {
            return Ok(());
        }
        if selected == batch.num_rows() {
            out.push(Message::Data(batch));
            return Ok(());
        }
        out.push(Message::Data(filter_batch(&batch, &mask)?));
        Ok(())
    }
}

/// Applies a boolean mask to rows and weights alike.
pub fn filter_batch(batch: &Batch, mask: &BooleanArray) -> Result<Batch, SluiceError> {
    let rows = filter_record_batch(&batch.rows, mask)?;
    Ok(match &batch.weights {
        Weights::Inserts => Batch::inserts(rows),
        Weights::Column(weights) => {
            let kept = filter(weights.as_ref(), mask)?;
            let kept = kept.as_any().downcast_ref::<Int64Array>().expect("weights are Int64").clone();
            Batch::with_weights(rows, kept)
        }
    })
}

/// Computes each output column from an expression over the input row.
pub struct Project {
    expressions: Vec<Arc<dyn PhysicalExpr>>,
    /// Each expression as written, for messages.
    texts: Vec<String>,
    schema: SchemaRef,
    errors: RowErrors,
    /// Each literal expression's column for the longest batch so far, up to
    /// [`MAX_CACHED_LITERAL_ROWS`] (the NULLs standing for a table column nothing reads, a
    /// constant): a batch no longer takes a slice of it instead of filling a new one.
    constants: Vec<Option<ArrayRef>>,
}

impl Project {
    pub fn new(
        expressions: Vec<Arc<dyn PhysicalExpr>>,
        texts: Vec<String>,
        schema: SchemaRef,
        errors: RowErrors,
    ) -> Project {
        assert_eq!(expressions.len(), schema.fields().len(), "one expression per output column");
        assert_eq!(expressions.len(), texts.len(), "one text per expression");
        let constants = vec![None; expressions.len()];
        Project { expressions, texts, schema, errors, constants }
    }

    /// Output column `index` over `rows`, in the declared type.
    fn column(&mut self, index: usize, rows: &RecordBatch) -> Result<ArrayRef, DataFusionError> {
        let literal = self.expressions[index].is::<Literal>();
        if literal
            && let Some(constant) = &self.constants[index]
            && constant.len() >= rows.num_rows()
        {
            return Ok(constant.slice(0, rows.num_rows()));
        }
        let mut column = evaluate(self.expressions[index].as_ref(), rows)?;
        let data_type = self.schema.field(index).data_type();
        if column.data_type() != data_type {
            column = arrow::compute::cast(&column, data_type)?;
        }
        if literal && rows.num_rows() <= MAX_CACHED_LITERAL_ROWS {
            self.constants[index] = Some(Arc::clone(&column));
        }
        Ok(column)
    }

    fn output(&self, columns: Vec<ArrayRef>, rows: usize, weights: Weights) -> Result<Batch, SluiceError> {
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let projected = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        Ok(Batch { rows: projected, weights })
    }

    /// The projection of a batch whose evaluation failed: failing rows are handled and
    /// dropped; None when no row is left.
    fn project_row_by_row(&mut self, batch: &Batch) -> Result<Option<Batch>, SluiceError> {
        let mut kept: Vec<u32> = Vec::new();
        let mut parts: Vec<Vec<ArrayRef>> = vec![Vec::new(); self.expressions.len()];
        'rows: for row in 0..batch.num_rows() {
            let slice = batch.rows.slice(row, 1);
            let mut columns = Vec::with_capacity(self.expressions.len());
            for index in 0..self.expressions.len() {
                match self.column(index, &slice) {
                    Ok(column) => columns.push(column),
                    Err(error) => {
                        self.errors.failed(&self.texts[index], &batch.rows, row, &error)?;
                        continue 'rows;
                    }
                }
            }
            kept.push(row as u32);
            parts.iter_mut().zip(columns).for_each(|(part, column)| part.push(column));
        }
        if kept.is_empty() {
            return Ok(None);
        }
        let columns = parts
            .iter()
            .map(|part| concat(&part.iter().map(|column| column.as_ref()).collect::<Vec<_>>()))
            .collect::<Result<Vec<_>, _>>()?;
        let weights = match &batch.weights {
            Weights::Inserts => Weights::Inserts,
            Weights::Column(weights) => {
                let taken = arrow::compute::take(weights.as_ref(), &UInt32Array::from(kept.clone()), None)?;
                let taken = taken.as_any().downcast_ref::<Int64Array>().expect("weights are Int64").clone();
                Weights::Column(Arc::new(taken))
            }
        };
        self.output(columns, kept.len(), weights).map(Some)
    }
}

impl Operator for Project {
    fn name(&self) -> &str {
        "project"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let columns: Result<Vec<ArrayRef>, _> =
            (0..self.expressions.len()).map(|index| self.column(index, &batch.rows)).collect();
        let projected = match columns {
            Ok(columns) => Some(self.output(columns, batch.num_rows(), batch.weights)?),
            Err(_) => self.project_row_by_row(&batch)?,
        };
        if let Some(projected) = projected {
            out.push(Message::Data(projected));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
