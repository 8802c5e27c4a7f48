//! Filters and projections: DataFusion physical expressions evaluated per batch.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray, Int64Array};
use arrow::compute::{filter, filter_record_batch, prep_null_mask_filter};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion_physical_expr::PhysicalExpr;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError, Weights};

use crate::evaluation_error;

/// Keeps the rows for which the predicate is true (NULL counts as false).
pub struct Filter {
    predicate: Arc<dyn PhysicalExpr>,
}

impl Filter {
    pub fn new(predicate: Arc<dyn PhysicalExpr>) -> Filter {
        Filter { predicate }
    }
}

impl Operator for Filter {
    fn name(&self) -> &str {
        "filter"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let mask = self
            .predicate
            .evaluate(&batch.rows)
            .and_then(|value| value.into_array(batch.num_rows()))
            .map_err(|e| evaluation_error("filter", e))?;
        let Some(mask) = mask.as_any().downcast_ref::<BooleanArray>() else {
            return Err(SluiceError::internal("sql.filter_type", format!("filter predicate is {}", mask.data_type())));
        };
        let mask = if mask.null_count() > 0 { prep_null_mask_filter(mask) } else { mask.clone() };
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
    schema: SchemaRef,
}

impl Project {
    pub fn new(expressions: Vec<Arc<dyn PhysicalExpr>>, schema: SchemaRef) -> Project {
        assert_eq!(expressions.len(), schema.fields().len(), "one expression per output column");
        Project { expressions, schema }
    }
}

impl Operator for Project {
    fn name(&self) -> &str {
        "project"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let rows = batch.num_rows();
        let mut columns = Vec::with_capacity(self.expressions.len());
        for (expression, field) in self.expressions.iter().zip(self.schema.fields()) {
            let column = expression
                .evaluate(&batch.rows)
                .and_then(|value| value.into_array(rows))
                .map_err(|e| evaluation_error("projection", e))?;
            let column = if column.data_type() == field.data_type() {
                column
            } else {
                arrow::compute::cast(&column, field.data_type())?
            };
            columns.push(column);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let projected = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        out.push(Message::Data(Batch { rows: projected, weights: batch.weights }));
        Ok(())
    }
}
