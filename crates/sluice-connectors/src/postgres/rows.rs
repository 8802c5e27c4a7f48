//! Weighted rows into the changes a writer applies, bounded, and their values as text
//! parameters.
//!
//! - **append**: every row with weight `w > 0` is `w` inserted rows, in order. A
//!   retraction cannot be appended (an updating stream is refused in this mode when the
//!   sink is planned), so one here is an internal error.
//! - **upsert**: the changes are kept per key, the last one winning: a row with a
//!   positive weight (`+I`, `+U`) upserts its key, one with a negative weight (`-D`,
//!   `-U`) deletes it. A `-U` directly followed by the `+U` of its key is therefore one
//!   upsert, and so is any run of changes of a key between two flushes. Within one
//!   flush the keys are distinct, so its deletes and upserts commute; flushes apply in
//!   order, so the table ends as the changelog integrates.
//!
//! A flush is due once [`Pending::len`] reaches the sink's `batch_rows`; it is checked
//! after each whole batch, so at most `batch_rows` plus one batch's rows are held.

use std::collections::HashMap;
use std::error::Error;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use bytes::BytesMut;
use postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};
use sluice_types::{Batch, SluiceError};

/// One row's values as text (None: NULL), in the stream's column order.
pub type TextRow = Vec<Option<String>>;

/// What a flush applies to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Insert the row, or update the row of its key.
    Upsert(TextRow),
    /// Delete the row of this key (the key's values only).
    Delete(TextRow),
}

/// The changes not yet written.
pub enum Pending {
    Append(Vec<TextRow>),
    Upsert { key: Vec<usize>, converter: RowConverter, changes: HashMap<Box<[u8]>, Change> },
}

impl Pending {
    /// Nothing pending, for rows of `schema`; upserting by `key` when given.
    pub fn new(schema: &SchemaRef, key: Option<&[usize]>) -> Result<Pending, SluiceError> {
        let Some(key) = key else { return Ok(Pending::Append(Vec::new())) };
        let fields = key.iter().map(|&k| SortField::new(schema.field(k).data_type().clone())).collect();
        let converter = RowConverter::new(fields)
            .map_err(|e| SluiceError::internal("sink.postgres_key", format!("key columns cannot be compared: {e}")))?;
        Ok(Pending::Upsert { key: key.to_vec(), converter, changes: HashMap::new() })
    }

    /// Rows (append) or keys (upsert) pending.
    pub fn len(&self) -> usize {
        match self {
            Pending::Append(rows) => rows.len(),
            Pending::Upsert { changes, .. } => changes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the rows of `batch`.
    pub fn add(&mut self, sink: &str, batch: &Batch) -> Result<(), SluiceError> {
        let columns = batch.rows.columns();
        let options = FormatOptions::default();
        let formatters: Vec<ArrayFormatter<'_>> = columns
            .iter()
            .map(|column| ArrayFormatter::try_new(column.as_ref(), &options))
            .collect::<Result<_, _>>()
            .map_err(|e| SluiceError::internal("sink.postgres_value", format!("sink `{sink}`: {e}")))?;
        let text = |row: usize, indices: &mut dyn Iterator<Item = usize>| -> TextRow {
            indices.map(|c| (!columns[c].is_null(row)).then(|| formatters[c].value(row).to_string())).collect()
        };
        match self {
            Pending::Append(rows) => {
                for row in 0..batch.num_rows() {
                    let weight = batch.weight(row);
                    if weight < 0 {
                        return Err(SluiceError::internal(
                            "sink.postgres_retraction",
                            format!("sink `{sink}`: a retraction reached a sink in append mode"),
                        ));
                    }
                    let values = text(row, &mut (0..columns.len()));
                    for _ in 1..weight {
                        rows.push(values.clone());
                    }
                    if weight > 0 {
                        rows.push(values);
                    }
                }
            }
            Pending::Upsert { key, converter, changes } => {
                let key_columns: Vec<ArrayRef> = key.iter().map(|&k| columns[k].clone()).collect();
                let keys = converter
                    .convert_columns(&key_columns)
                    .map_err(|e| SluiceError::internal("sink.postgres_key", format!("sink `{sink}`: {e}")))?;
                for row in 0..batch.num_rows() {
                    let change = match batch.weight(row) {
                        0 => continue,
                        w if w > 0 => Change::Upsert(text(row, &mut (0..columns.len()))),
                        _ => Change::Delete(text(row, &mut key.iter().copied())),
                    };
                    changes.insert(keys.row(row).as_ref().into(), change);
                }
            }
        }
        Ok(())
    }

    /// Takes what is pending: rows to insert (append) or to upsert, and keys to delete.
    pub fn take(&mut self) -> (Vec<TextRow>, Vec<TextRow>) {
        match self {
            Pending::Append(rows) => (std::mem::take(rows), Vec::new()),
            Pending::Upsert { changes, .. } => {
                let mut upserts = Vec::new();
                let mut deletes = Vec::new();
                for (_, change) in changes.drain() {
                    match change {
                        Change::Upsert(row) => upserts.push(row),
                        Change::Delete(key) => deletes.push(key),
                    }
                }
                (upserts, deletes)
            }
        }
    }
}

/// A value sent as text, parsed by the server as the parameter's type.
#[derive(Debug)]
pub struct Text<'a>(pub &'a str);

impl ToSql for Text<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// The parameters of `rows`, flattened in order.
pub fn parameters(rows: &[TextRow]) -> Vec<Option<Text<'_>>> {
    rows.iter().flat_map(|row| row.iter().map(|value| value.as_deref().map(Text))).collect()
}

/// A row for a message: `(a=1, b='x')`, long values cut.
pub fn show_row(names: &[&str], row: &TextRow) -> String {
    const SHOWN_CHARS: usize = 64;
    let values: Vec<String> = names
        .iter()
        .zip(row)
        .map(|(name, value)| match value {
            None => format!("{name}=NULL"),
            Some(text) if text.chars().count() > SHOWN_CHARS => {
                format!("{name}='{}…'", text.chars().take(SHOWN_CHARS).collect::<String>())
            }
            Some(text) => format!("{name}='{text}'"),
        })
        .collect();
    format!("({})", values.join(", "))
}
