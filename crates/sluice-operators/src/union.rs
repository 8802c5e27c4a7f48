//! `UNION ALL`: the rows of every input port, as they come, under the union's schema.
//!
//! The inputs' columns already have the union's types (the planner casts them); the
//! names and nullability of the output are the union's. Weights pass unchanged, so a
//! union of updating inputs is updating. Watermarks, barriers and end-of-data are merged
//! over every input by the exchange before they reach this operator.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError};

pub struct Union {
    schema: SchemaRef,
    inputs: usize,
}

impl Union {
    pub fn new(schema: SchemaRef, inputs: usize) -> Union {
        Union { schema, inputs }
    }
}

impl Operator for Union {
    fn name(&self) -> &str {
        "union"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.on_port_data(0, batch, out)
    }

    fn on_port_data(&mut self, port: usize, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(port < self.inputs, "union of {} inputs received rows on port {port}", self.inputs);
        let rows = RecordBatch::try_new(std::sync::Arc::clone(&self.schema), batch.rows.columns().to_vec())?;
        out.push(Message::Data(Batch { rows, weights: batch.weights }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, Int64Array, Int64Builder};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn rows_of_every_port_pass_with_their_weights_under_the_union_schema() {
        let input = |name: &str| Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, false)]));
        let union_schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let mut union = Union::new(Arc::clone(&union_schema), 2);
        let mut out = Vec::new();
        let left = RecordBatch::try_new(input("a"), vec![Arc::new(Int64Array::from(vec![1, 2]))]).expect("batch");
        let right = RecordBatch::try_new(input("b"), vec![Arc::new(Int64Array::from(vec![3]))]).expect("batch");
        let mut weights = Int64Builder::new();
        weights.append_value(-1);
        union.on_port_data(0, Batch::inserts(left), &mut out).expect("left");
        union.on_port_data(1, Batch::with_weights(right, weights.finish()), &mut out).expect("right");
        let batches: Vec<&Batch> =
            out.iter().map(|m| if let Message::Data(b) = m { b } else { panic!("data only") }).collect();
        assert!(batches.iter().all(|b| b.rows.schema() == union_schema), "named as the union");
        let values = |b: &Batch| {
            let column = b.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64").clone();
            column.values().to_vec()
        };
        assert_eq!((values(batches[0]), values(batches[1])), (vec![1, 2], vec![3]));
        assert_eq!(batches[1].weight(0), -1, "a retraction stays one");
        assert_eq!(batches[1].rows.column(0).null_count(), 0);
    }
}
