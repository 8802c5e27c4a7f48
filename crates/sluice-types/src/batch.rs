//! A batch of rows with a weight per row.

use std::sync::Arc;

use arrow::array::{Array, Int64Array};
use arrow::record_batch::RecordBatch;

/// The weight of each row of a [`Batch`].
#[derive(Debug, Clone)]
pub enum Weights {
    /// Every row has weight +1 (the append-only case; no column is stored).
    Inserts,
    /// One weight per row: +1 inserts, -1 retracts (other values are multiplicities).
    Column(Arc<Int64Array>),
}

/// An Arrow record batch whose rows each carry a weight.
#[derive(Debug, Clone)]
pub struct Batch {
    pub rows: RecordBatch,
    pub weights: Weights,
}

impl Batch {
    /// A batch of inserts.
    pub fn inserts(rows: RecordBatch) -> Batch {
        Batch { rows, weights: Weights::Inserts }
    }

    /// A batch with explicit weights; the weight column has one entry per row.
    pub fn with_weights(rows: RecordBatch, weights: Int64Array) -> Batch {
        assert_eq!(rows.num_rows(), weights.len(), "one weight per row");
        assert_eq!(weights.null_count(), 0, "weights are never null");
        Batch { rows, weights: Weights::Column(Arc::new(weights)) }
    }

    pub fn num_rows(&self) -> usize {
        self.rows.num_rows()
    }

    /// True when every row is an insert (no retraction is possible in this batch).
    pub fn is_append_only(&self) -> bool {
        match &self.weights {
            Weights::Inserts => true,
            Weights::Column(weights) => weights.values().iter().all(|w| *w > 0),
        }
    }

    /// The weight of row `index`.
    pub fn weight(&self, index: usize) -> i64 {
        match &self.weights {
            Weights::Inserts => 1,
            Weights::Column(weights) => weights.value(index),
        }
    }
}
