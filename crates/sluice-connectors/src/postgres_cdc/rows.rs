//! Changes into record batches: each value, the server's text, converted to its
//! column's Arrow type; consecutive rows of one table in one batch, in order, with their
//! row kinds after the columns.

use std::sync::Arc;

use arrow::array::{Array, Int8Array};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use sluice_types::{RowKind, SluiceError};

use super::catalog::CapturedTable;
use super::position::format_lsn;
use super::values::TextColumn;

/// One change's row, its values as the server's text.
pub struct Change {
    pub table: usize,
    pub kind: RowKind,
    pub values: Vec<Option<Bytes>>,
}

/// The captured tables, for building their batches.
pub struct Tables<'a> {
    pub source: &'a str,
    pub captured: &'a [CapturedTable],
    /// Each table's schema with the row kinds column.
    pub schemas: &'a [SchemaRef],
}

impl Tables<'_> {
    /// `changes` as batches: consecutive rows of one table together, in order. `lsn`
    /// names where they were read, in messages.
    pub fn batches(&self, changes: &[Change], lsn: u64) -> Result<Vec<(usize, RecordBatch)>, SluiceError> {
        let mut batches = Vec::new();
        let mut start = 0;
        while start < changes.len() {
            let table = changes[start].table;
            let end = changes[start..].iter().position(|c| c.table != table).map_or(changes.len(), |n| start + n);
            batches.push((table, self.batch(table, &changes[start..end], lsn)?));
            start = end;
        }
        Ok(batches)
    }

    fn batch(&self, table: usize, changes: &[Change], lsn: u64) -> Result<RecordBatch, SluiceError> {
        let captured = &self.captured[table];
        let mut columns: Vec<TextColumn> =
            captured.columns.iter().map(|c| TextColumn::new(c.data_type.clone())).collect();
        for change in changes {
            for (column, value) in columns.iter_mut().zip(&change.values) {
                let text = match value {
                    Some(bytes) => Some(std::str::from_utf8(bytes).map_err(|_| {
                        self.bad_value(captured, lsn, "a value that is not UTF-8 (set the database's encoding to UTF8)")
                    })?),
                    None => None,
                };
                column.append(text);
            }
        }
        let mut arrays = Vec::with_capacity(columns.len() + 1);
        for (i, column) in columns.iter_mut().enumerate() {
            arrays.push(column.finish().map_err(|bad| {
                let what = format!(
                    "column `{}` holds `{}`, which does not fit: {}",
                    captured.columns[i].name, bad.value, bad.reason
                );
                self.bad_value(captured, lsn, &what)
            })?);
        }
        let kinds: Int8Array = changes.iter().map(|c| Some(c.kind as i8)).collect();
        arrays.push(Arc::new(kinds));
        for (i, column) in captured.columns.iter().enumerate() {
            if captured.key.contains(&i) && arrays[i].null_count() > 0 {
                let what = format!("a row without its key column `{}`", column.name);
                return Err(self.bad_value(captured, lsn, &what));
            }
        }
        RecordBatch::try_new(Arc::clone(&self.schemas[table]), arrays).map_err(|e| {
            SluiceError::internal("source.postgres_cdc.batch", format!("rows of {}: {e}", captured.qualified()))
        })
    }

    fn bad_value(&self, table: &CapturedTable, lsn: u64, what: &str) -> SluiceError {
        SluiceError::user(
            "source.postgres_cdc.value",
            format!("source `{}`: table {} (before LSN {}): {what}", self.source, table.qualified(), format_lsn(lsn)),
        )
        .with_fix("change the value or the column's type in the database; the run stops rather than change a row")
    }
}
