//! Rows into messages, shared by both writers: the value in the sink's format (with the
//! changelog's op column, or upserts and tombstones in upsert mode), the key from its
//! columns, the headers from options and a column (docs/connectors/kafka.md, "Keys,
//! modes and headers").

use std::collections::HashMap;
use std::ops::Range;

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::DataType;
use rdkafka::message::{Header, OwnedHeaders};
use sluice_formats::{CsvRecordFinder, Encoder};
use sluice_types::{Batch, SluiceError};

/// The key columns of a sink and their encoder.
pub(super) struct KeyEncoder {
    pub(super) columns: Vec<usize>,
    pub(super) encoder: Encoder,
}

/// Encoding rows as messages, shared by both writers.
pub(super) struct Output {
    pub(super) sink: String,
    pub(super) brokers: String,
    pub(super) topic: String,
    pub(super) encoder: Encoder,
    pub(super) keys: Option<KeyEncoder>,
    /// The columns of values, when not all (`headers_column` is left out).
    pub(super) value_columns: Option<Vec<usize>>,
    /// Headers of every message.
    pub(super) headers: Vec<(String, String)>,
    pub(super) headers_column: Option<usize>,
    pub(super) csv: bool,
    pub(super) upsert: bool,
    pub(super) updating: bool,
    pub(super) buffer: Vec<u8>,
    pub(super) key_buffer: Vec<u8>,
    /// Bytes of keys and values handed to the producer since the writer last told the
    /// runtime ([`SinkWriter::take_bytes`]).
    pub(super) encoded: u64,
}

/// The byte ranges of the records of `buffer`: JSON lines, or CSV records (either
/// without its line end); fails unless there are exactly `expected`.
pub(super) fn records(buffer: &[u8], csv: bool, expected: usize) -> Result<Vec<Range<usize>>, SluiceError> {
    let mut ranges = Vec::with_capacity(expected);
    let mut start = 0;
    let mut finder = CsvRecordFinder::new(b',');
    while start < buffer.len() {
        let end = match csv {
            true => finder.find_record_end(&buffer[start..]).map(|length| start + length),
            false => memchr::memchr(b'\n', &buffer[start..]).map(|at| start + at + 1),
        };
        let end = end.ok_or_else(|| SluiceError::internal("sink.kafka", "the encoder wrote an unfinished record"))?;
        ranges.push(start..end - 1);
        start = end;
    }
    if ranges.len() != expected {
        return Err(SluiceError::internal(
            "sink.kafka",
            format!("the encoder wrote {} records for {expected} messages", ranges.len()),
        ));
    }
    Ok(ranges)
}

/// What upsert mode writes for the rows of one batch, in order: `(row, true)` the row
/// as the value of its key, `(row, false)` a tombstone of its key. A retraction is
/// dropped when a later row of the batch with the same key has a positive weight (that
/// row's value replaces it); a row of weight 0 writes nothing, and a row of weight
/// `w > 1` one upsert (its key has one value).
pub(crate) fn upsert_actions(weights: &[i64], keys: &[&[u8]]) -> Vec<(usize, bool)> {
    let mut last_upsert: HashMap<&[u8], usize> = HashMap::new();
    for (row, key) in keys.iter().enumerate() {
        if weights[row] > 0 {
            last_upsert.insert(key, row);
        }
    }
    (0..weights.len())
        .filter_map(|row| match weights[row] {
            w if w > 0 => Some((row, true)),
            w if w < 0 => last_upsert.get(keys[row]).is_none_or(|later| *later <= row).then_some((row, false)),
            _ => None,
        })
        .collect()
}

impl Output {
    /// The encoded key of every row of `rows`, into `key_buffer`; empty without keys.
    pub(super) fn keys(&mut self, rows: &RecordBatch) -> Result<Vec<Range<usize>>, SluiceError> {
        self.key_buffer.clear();
        let Some(keys) = &mut self.keys else { return Ok(Vec::new()) };
        let projected = rows
            .project(&keys.columns)
            .map_err(|e| SluiceError::internal("sink.kafka_key", format!("key columns: {e}")))?;
        keys.encoder.encode(&Batch::inserts(projected), &mut self.key_buffer)?;
        records(&self.key_buffer, self.csv, rows.num_rows())
    }

    /// The value columns of `rows`.
    pub(super) fn values(&self, rows: &RecordBatch) -> Result<RecordBatch, SluiceError> {
        match &self.value_columns {
            Some(columns) => {
                rows.project(columns).map_err(|e| SluiceError::internal("sink.kafka", format!("value columns: {e}")))
            }
            None => Ok(rows.clone()),
        }
    }

    /// The `headers_column` of `rows` as text, if the sink has one.
    pub(super) fn header_texts(&self, rows: &RecordBatch) -> Result<Option<arrow::array::ArrayRef>, SluiceError> {
        let Some(column) = self.headers_column else { return Ok(None) };
        let texts = arrow::compute::cast(rows.column(column), &DataType::Utf8)
            .map_err(|e| SluiceError::internal("sink.kafka_headers", format!("headers as text: {e}")))?;
        Ok(Some(texts))
    }

    /// The headers of the message of `row`: the constant ones, then those of the row's
    /// `texts` (its `headers_column`).
    pub(super) fn headers_of(
        &self,
        texts: Option<&arrow::array::ArrayRef>,
        row: usize,
    ) -> Result<Option<OwnedHeaders>, SluiceError> {
        let from_row = match texts {
            Some(texts) if texts.is_valid(row) => {
                let text = texts.as_string::<i32>().value(row);
                match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(serde_json::Value::Object(object)) => Some(object),
                    _ => {
                        return Err(SluiceError::user(
                            "sink.kafka_headers",
                            format!("sink `{}`: its headers_column holds {text:?}, not a JSON object", self.sink),
                        )
                        .with_fix(
                            "make the column a JSON object of header names and values, e.g. '{\"trace\":\"t-1\"}'",
                        ));
                    }
                }
            }
            _ => None,
        };
        if self.headers.is_empty() && from_row.as_ref().is_none_or(|o| o.is_empty()) {
            return Ok(None);
        }
        let mut headers = OwnedHeaders::new_with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        for (name, value) in from_row.iter().flatten() {
            let text = match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(text) => Some(text.clone()),
                other => Some(other.to_string()),
            };
            headers = headers.insert(Header { key: name, value: text.as_deref().map(str::as_bytes) });
        }
        Ok(Some(headers))
    }

    /// Encodes `batch` and hands each message (value, key, headers, the rows it
    /// completes) to `deliver`; a tombstone has no value. A row's last message completes
    /// it and the rows before it that have none (a retraction an upsert of its key
    /// replaces, a row of weight 0), so that the rows of acknowledged messages are the
    /// rows out (see `delivery`). Returns the rows after the batch's last message, which
    /// need none.
    pub(super) fn messages(
        &mut self,
        batch: &Batch,
        mut deliver: impl FnMut(Option<&[u8]>, Option<&[u8]>, Option<OwnedHeaders>, usize) -> Result<(), SluiceError>,
    ) -> Result<usize, SluiceError> {
        let mut encoded = 0u64;
        // The rows completed by the messages handed out so far.
        let mut completed = 0usize;
        // `last_of`: the row this message is the last of, if it is.
        let mut send = |value: Option<&[u8]>, key: Option<&[u8]>, headers, last_of: Option<usize>| {
            encoded += (value.map_or(0, <[u8]>::len) + key.map_or(0, <[u8]>::len)) as u64;
            let rows = last_of.map_or(0, |row| (row + 1).saturating_sub(std::mem::replace(&mut completed, row + 1)));
            deliver(value, key, headers, rows)
        };
        let keys = self.keys(&batch.rows)?;
        let texts = self.header_texts(&batch.rows)?;
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        let key_of = |row: usize| keys.get(row).map(|range| &self.key_buffer[range.clone()]);
        if self.upsert {
            let weights: Vec<i64> = (0..batch.num_rows()).map(|row| batch.weight(row)).collect();
            let key_bytes: Vec<&[u8]> = (0..batch.num_rows()).map(|row| key_of(row).unwrap_or_default()).collect();
            let actions = upsert_actions(&weights, &key_bytes);
            let upserted: Vec<u32> = actions.iter().filter(|(_, upsert)| *upsert).map(|(row, _)| *row as u32).collect();
            let rows =
                arrow::compute::take_record_batch(&self.values(&batch.rows)?, &UInt32Array::from(upserted.clone()))
                    .map_err(|e| SluiceError::internal("sink.kafka", format!("upserted rows: {e}")))?;
            self.encoder.encode(&Batch::inserts(rows), &mut buffer)?;
            let values = records(&buffer, self.csv, upserted.len())?;
            let mut values = values.into_iter();
            for (row, upsert) in actions {
                let value = match upsert {
                    true => Some(&buffer[values.next().expect("one value per upsert")]),
                    false => None,
                };
                send(value, key_of(row), self.headers_of(texts.as_ref(), row)?, Some(row))?;
            }
        } else {
            let values = Batch { rows: self.values(&batch.rows)?, weights: batch.weights.clone() };
            self.encoder.encode(&values, &mut buffer)?;
            let copies: Vec<u64> = (0..batch.num_rows())
                .map(|row| {
                    let weight = batch.weight(row);
                    if self.updating { weight.unsigned_abs() } else { weight.max(0) as u64 }
                })
                .collect();
            let values = records(&buffer, self.csv, copies.iter().sum::<u64>() as usize)?;
            let mut values = values.into_iter();
            for (row, copies) in copies.into_iter().enumerate() {
                let headers = if copies > 0 { self.headers_of(texts.as_ref(), row)? } else { None };
                for copy in 1..=copies {
                    let value = values.next().expect("counted above");
                    send(Some(&buffer[value]), key_of(row), headers.clone(), (copy == copies).then_some(row))?;
                }
            }
        }
        self.buffer = buffer;
        self.encoded += encoded;
        Ok(batch.num_rows().saturating_sub(completed))
    }
}
