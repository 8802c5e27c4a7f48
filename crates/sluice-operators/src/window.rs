//! Window assignment for Flink's window table functions.
//!
//! `TUMBLE(TABLE t, DESCRIPTOR(ts), size)` puts each row in the one window
//! `[floor(ts / size) * size, … + size)`; `HOP(TABLE t, DESCRIPTOR(ts), slide, size)` puts
//! it in every window of length `size` starting at a multiple of `slide` that contains
//! `ts` (size / slide windows when slide divides size). The output is the input row
//! followed by `window_start`, `window_end` and `window_time` (= `window_end` - 1 ms, the
//! row time of the window, as in Flink), all `TIMESTAMP(3)`.
//!
//! Windows are aligned to the Unix epoch. Rows without an event time (NULL) belong to no
//! window and are counted under `rows without event time`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, TimestampMillisecondArray, UInt32Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError};

/// A window table function's shape, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Tumble { size_ms: i64 },
    Hop { slide_ms: i64, size_ms: i64 },
}

impl WindowKind {
    pub fn size_ms(&self) -> i64 {
        match *self {
            WindowKind::Tumble { size_ms } | WindowKind::Hop { size_ms, .. } => size_ms,
        }
    }

    fn slide_ms(&self) -> i64 {
        match *self {
            WindowKind::Tumble { size_ms } => size_ms,
            WindowKind::Hop { slide_ms, .. } => slide_ms,
        }
    }

    /// The start of every window containing `ts`, latest first.
    pub fn starts(&self, ts: i64, mut each: impl FnMut(i64)) {
        let slide = self.slide_ms();
        let mut start = ts - ts.rem_euclid(slide);
        while start > ts - self.size_ms() {
            each(start);
            start -= slide;
        }
    }

    /// The columns the assignment appends.
    pub fn output_fields() -> [Field; 3] {
        let timestamp = DataType::Timestamp(TimeUnit::Millisecond, None);
        [
            Field::new("window_start", timestamp.clone(), false),
            Field::new("window_end", timestamp.clone(), false),
            Field::new("window_time", timestamp, false),
        ]
    }
}

/// Appends the window columns, replicating a row once per window it belongs to.
pub struct WindowAssign {
    time_column: usize,
    kind: WindowKind,
    schema: SchemaRef,
    rows_without_time: Arc<AtomicU64>,
}

impl WindowAssign {
    /// `schema` is the input schema followed by [`WindowKind::output_fields`].
    pub fn new(
        time_column: usize,
        kind: WindowKind,
        schema: SchemaRef,
        rows_without_time: Arc<AtomicU64>,
    ) -> WindowAssign {
        assert!(kind.size_ms() > 0 && kind.slide_ms() > 0, "window size and slide are positive");
        WindowAssign { time_column, kind, schema, rows_without_time }
    }
}

impl Operator for WindowAssign {
    fn name(&self) -> &str {
        "window_assign"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let times = cast(batch.rows.column(self.time_column), &DataType::Timestamp(TimeUnit::Millisecond, None))?;
        let times = times.as_any().downcast_ref::<TimestampMillisecondArray>().expect("cast to ms timestamps");
        let one_window_each = matches!(self.kind, WindowKind::Tumble { .. }) && times.null_count() == 0;
        let (batch, starts) = if one_window_each {
            let size = self.kind.size_ms();
            let starts: Vec<i64> = times.values().iter().map(|ts| ts - ts.rem_euclid(size)).collect();
            (batch, starts)
        } else {
            let mut indices = Vec::with_capacity(times.len());
            let mut starts = Vec::with_capacity(times.len());
            for row in 0..times.len() {
                if times.is_null(row) {
                    self.rows_without_time.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.kind.starts(times.value(row), |start| {
                    indices.push(row as u32);
                    starts.push(start);
                });
            }
            (crate::partition::take_rows(&batch, &UInt32Array::from(indices))?, starts)
        };
        if starts.is_empty() {
            return Ok(());
        }
        let size = self.kind.size_ms();
        let ends: Vec<i64> = starts.iter().map(|start| start + size).collect();
        let row_times: Vec<i64> = ends.iter().map(|end| end - 1).collect();
        let mut columns: Vec<ArrayRef> = batch.rows.columns().to_vec();
        columns.push(Arc::new(TimestampMillisecondArray::from(starts)));
        columns.push(Arc::new(TimestampMillisecondArray::from(ends)));
        columns.push(Arc::new(TimestampMillisecondArray::from(row_times)));
        let rows = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        out.push(Message::Data(Batch { rows, weights: batch.weights }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(kind: WindowKind, ts: i64) -> Vec<i64> {
        let mut all = Vec::new();
        kind.starts(ts, |start| all.push(start));
        all
    }

    #[test]
    fn tumble_and_hop_windows_contain_the_timestamp() {
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 25), [20]);
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 20), [20], "start is inclusive");
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 19), [10], "end is exclusive");
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, -1), [-10], "before the epoch");
        assert_eq!(starts(WindowKind::Hop { slide_ms: 5, size_ms: 10 }, 12), [10, 5]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 5, size_ms: 10 }, 10), [10, 5]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 4, size_ms: 10 }, 9), [8, 4, 0]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 10, size_ms: 5 }, 7), Vec::<i64>::new(), "a gap between windows");
    }
}
