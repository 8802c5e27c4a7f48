//! Encoding weighted batches as bytes for sinks.
//!
//! # Formats
//!
//! - **JSON lines** ([`OutputFormat::JsonLines`]): one object per row, one row per
//!   line, keys in schema order; NULL is `null`, floats are JSON numbers, timestamps are
//!   strings.
//! - **CSV** ([`OutputFormat::Csv`]): comma separated, quoted where needed; NULL is an
//!   empty field. With `header`, the column names are written once, before the rows of
//!   the first encoded batch.
//! - **Pretty** ([`OutputFormat::Pretty`]): an aligned table per batch, NULL shown as
//!   `NULL`; a batch without rows writes nothing.
//!
//! # Timestamps
//!
//! A timestamp is written as `2026-01-01 00:00:10.000` (`%Y-%m-%d %H:%M:%S%.3f`, see
//! [`TIMESTAMP_FORMAT`]), in UTC; a timestamp with a time zone gets its offset appended
//! (`2026-01-01 01:00:10.000+01:00`). When the schema holds a microsecond or
//! nanosecond timestamp, every timestamp is written with 6 or 9 fraction digits.
//!
//! A date or time value that cannot be formatted (outside the dates chrono represents,
//! or a time of day past midnight, which a query can compute) fails the batch with
//! `format.value_out_of_range` before anything of it is written.
//!
//! # The op column of an updating stream
//!
//! A stream that can carry retractions is encoded with `updating = true`: each row then
//! starts with an explicit op column, the JSON key `"op"` (the first key) or the CSV and
//! table column `op` (the first column), holding Flink's short row kinds:
//!
//! ```text
//! {"op":"+I","auction":1,"price":100}     weight +1: an insert
//! {"op":"-D","auction":1,"price":100}     weight -1: a retraction (delete)
//! {"op":"-U","auction":2,"price":100}     weight -1, then weight +1 with the same
//! {"op":"+U","auction":2,"price":150}     upsert key: an update (before, after)
//! ```
//!
//! A stream with an upsert key ([`Encoder::with_upsert_key`]) sends a row's change as
//! its retraction immediately followed by its new version; a retraction (weight -1)
//! directly followed in the same batch by an insert (weight +1) of the same key is
//! written as `-U` then `+U`. Every other retraction is `-D`, every other insert `+I`
//! (so a stream without an upsert key, or a change split by a filter, writes only those;
//! integrating the changelog gives the same table either way).
//! A row of weight `w` with `|w| > 1` is written `|w|` times; weight 0 writes nothing.
//! With `updating = false` no op column is written, a row of weight `w > 1` is written
//! `w` times, and a negative weight is a bug upstream (an assertion).

use std::io::Write;
use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::FormatOptions;
use sluice_types::{Batch, SluiceError, Weights};

use crate::diagnose::sql_type;
use crate::temporal;

/// How a millisecond timestamp is written: `2026-01-01 00:00:10.000`.
pub const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.3f";

/// The name of the op column of an updating stream.
pub const OP_COLUMN: &str = "op";
/// The op of a row of positive weight.
pub const OP_INSERT: &str = "+I";
/// The op of a row of negative weight.
pub const OP_DELETE: &str = "-D";
/// The op of the retracted version of a changed row (weight -1, its new version follows).
pub const OP_UPDATE_BEFORE: &str = "-U";
/// The op of the new version of a changed row (weight +1, after its `-U`).
pub const OP_UPDATE_AFTER: &str = "+U";

/// The byte format of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    JsonLines,
    Csv { header: bool },
    Pretty,
}

/// Appends the rows of batches to a byte buffer in one [`OutputFormat`].
#[derive(Debug)]
pub struct Encoder {
    format: OutputFormat,
    /// The schema written: the sink's, after the op column when updating.
    schema: SchemaRef,
    updating: bool,
    /// The upsert key's columns (of the sink's schema), when the stream has one.
    upsert_key: Option<Vec<usize>>,
    header_written: bool,
    timestamp_format: &'static str,
    timestamp_tz_format: &'static str,
}

impl Encoder {
    /// An encoder of batches with `schema`; `updating` adds the op column.
    pub fn new(format: OutputFormat, schema: SchemaRef, updating: bool) -> Self {
        let (timestamp_format, timestamp_tz_format) = timestamp_formats(&schema);
        let schema = if updating {
            let mut fields = vec![Arc::new(Field::new(OP_COLUMN, DataType::Utf8, false))];
            fields.extend(schema.fields().iter().cloned());
            Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
        } else {
            schema
        };
        Encoder {
            format,
            schema,
            updating,
            upsert_key: None,
            header_written: false,
            timestamp_format,
            timestamp_tz_format,
        }
    }

    /// Writes a change of one row (a retraction directly followed by an insert with the
    /// same `key` columns, of the sink's schema) as `-U`/`+U`; see the module docs.
    pub fn with_upsert_key(mut self, key: Option<&[usize]>) -> Self {
        self.upsert_key = key.map(<[usize]>::to_vec);
        self
    }

    /// The schema of the rows written, with the op column first when updating.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Appends the encoded rows of `batch` to `out`.
    ///
    /// Fails with `format.value_out_of_range`, writing nothing, when a date or time value
    /// cannot be formatted (see [`crate::temporal`]). Panics on a negative weight when
    /// the encoder is not updating.
    pub fn encode(&mut self, batch: &Batch, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        check_formattable(&batch.rows)?;
        let rows = self.expand(batch)?;
        match self.format {
            OutputFormat::JsonLines => self.write_json(&rows, out),
            OutputFormat::Csv { header } => self.write_csv(&rows, header, out),
            OutputFormat::Pretty => self.write_pretty(&rows, out),
        }
        .map_err(|error| SluiceError::internal("format.encode", format!("cannot encode a batch: {error}")))
    }

    /// The rows to write, of [`Encoder::output_schema`]: each row repeated `|weight|`
    /// times, after its op when updating (for a writer of a columnar format, which
    /// encodes the rows itself: the Delta Lake sink's changelog table).
    pub fn expand(&self, batch: &Batch) -> Result<RecordBatch, SluiceError> {
        let (indices, ops) = match &batch.weights {
            Weights::Column(weights) if weights.values().iter().any(|w| *w != 1) => {
                assert!(
                    self.updating || weights.values().iter().all(|w| *w >= 0),
                    "a retraction reached an encoder that is not updating"
                );
                let (indices, mut ops) = repeat_by_weight(weights.values());
                if let (true, Some(key)) = (self.updating, &self.upsert_key) {
                    mark_updates(&batch.rows, key, weights.values(), &mut ops)?;
                }
                (Some(indices), ops)
            }
            _ => (None, vec![OP_INSERT; batch.num_rows()]),
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        if self.updating {
            columns.push(Arc::new(StringArray::from(ops)));
        }
        for column in batch.rows.columns() {
            columns.push(match &indices {
                Some(indices) => arrow::compute::take(column.as_ref(), indices, None)?,
                None => column.clone(),
            });
        }
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|error| {
            SluiceError::internal(
                "format.schema_mismatch",
                format!("a batch does not match the sink schema {}: {error}", self.schema),
            )
        })
    }

    fn write_json(&self, rows: &RecordBatch, out: &mut Vec<u8>) -> Result<(), arrow::error::ArrowError> {
        let mut writer = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .with_timestamp_format(self.timestamp_format.to_string())
            .with_timestamp_tz_format(self.timestamp_tz_format.to_string())
            .build::<_, arrow::json::writer::LineDelimited>(out);
        writer.write(rows)?;
        writer.finish()
    }

    fn write_csv(
        &mut self,
        rows: &RecordBatch,
        header: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), arrow::error::ArrowError> {
        let mut writer = arrow::csv::WriterBuilder::new()
            .with_header(header && !self.header_written)
            .with_timestamp_format(self.timestamp_format.to_string())
            .with_timestamp_tz_format(self.timestamp_tz_format.to_string())
            .build(out);
        writer.write(rows)?;
        self.header_written = true;
        Ok(())
    }

    fn write_pretty(&self, rows: &RecordBatch, out: &mut Vec<u8>) -> Result<(), arrow::error::ArrowError> {
        if rows.num_rows() == 0 {
            return Ok(());
        }
        let options = FormatOptions::new()
            .with_null("NULL")
            .with_timestamp_format(Some(self.timestamp_format))
            .with_timestamp_tz_format(Some(self.timestamp_tz_format));
        let table = arrow::util::pretty::pretty_format_batches_with_options(std::slice::from_ref(rows), &options)?;
        writeln!(out, "{table}").map_err(|error| arrow::error::ArrowError::IoError(error.to_string(), error))
    }
}

/// Fails on the first date or time value of `rows` that cannot be formatted: Arrow's
/// JSON and table writers would write `ERROR: Cast error...` in its place, and its CSV
/// writer would fail halfway through the batch.
fn check_formattable(rows: &RecordBatch) -> Result<(), SluiceError> {
    for (field, column) in rows.schema().fields().iter().zip(rows.columns()) {
        let Some((row, value)) = temporal::first_unformattable(column) else { continue };
        let unit = match field.data_type() {
            DataType::Timestamp(unit, _) => format!("{} since 1970-01-01", unit_name(*unit)),
            DataType::Date32 => "days since 1970-01-01".to_string(),
            DataType::Date64 => "milliseconds since 1970-01-01".to_string(),
            DataType::Time32(unit) | DataType::Time64(unit) => format!("{} since midnight", unit_name(*unit)),
            other => other.to_string(),
        };
        return Err(SluiceError::user(
            "format.value_out_of_range",
            format!(
                "column `{}`, row {} of a batch: {} value {value} ({unit}) cannot be written as a date or time",
                field.name(),
                row + 1,
                sql_type(field.data_type()),
            ),
        )
        .with_fix("filter out such rows, or bring the value into range, in the query that feeds the sink"));
    }
    Ok(())
}

fn unit_name(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Second => "seconds",
        TimeUnit::Millisecond => "milliseconds",
        TimeUnit::Microsecond => "microseconds",
        TimeUnit::Nanosecond => "nanoseconds",
    }
}

/// The row index of each output row (row `i` repeated `|weights[i]|` times) and its op.
fn repeat_by_weight(weights: &[i64]) -> (UInt32Array, Vec<&'static str>) {
    let total: u64 = weights.iter().map(|w| w.unsigned_abs()).sum();
    let capacity = usize::try_from(total).unwrap_or(usize::MAX);
    let mut indices = Vec::with_capacity(capacity);
    let mut ops = Vec::with_capacity(capacity);
    for (index, weight) in weights.iter().enumerate() {
        let op = if *weight > 0 { OP_INSERT } else { OP_DELETE };
        let index = u32::try_from(index).expect("a batch holds fewer than 2^32 rows");
        for _ in 0..weight.unsigned_abs() {
            indices.push(index);
            ops.push(op);
        }
    }
    (UInt32Array::from(indices), ops)
}

/// Turns each retraction (weight -1) directly followed by an insert (weight +1) of the
/// same `key` into `-U`, `+U`. `ops` holds one op per written row (see
/// [`repeat_by_weight`]).
fn mark_updates(
    rows: &RecordBatch,
    key: &[usize],
    weights: &[i64],
    ops: &mut [&'static str],
) -> Result<(), SluiceError> {
    let comparators = key
        .iter()
        .map(|&column| {
            let column = rows.column(column);
            arrow::array::make_comparator(column.as_ref(), column.as_ref(), arrow::compute::SortOptions::default())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut written = 0;
    for row in 0..weights.len() {
        let next = row + 1;
        if weights[row] == -1
            && weights.get(next) == Some(&1)
            && comparators.iter().all(|compare| compare(row, next).is_eq())
        {
            ops[written] = OP_UPDATE_BEFORE;
            ops[written + 1] = OP_UPDATE_AFTER;
        }
        written += weights[row].unsigned_abs() as usize;
    }
    Ok(())
}

/// The timestamp formats (without and with a time zone) for the finest timestamp unit
/// of `schema`.
fn timestamp_formats(schema: &Schema) -> (&'static str, &'static str) {
    let finest = schema
        .fields()
        .iter()
        .filter_map(|field| match field.data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, _) => Some(6),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => Some(9),
            _ => None,
        })
        .max();
    match finest {
        Some(9) => ("%Y-%m-%d %H:%M:%S%.9f", "%Y-%m-%d %H:%M:%S%.9f%:z"),
        Some(_) => ("%Y-%m-%d %H:%M:%S%.6f", "%Y-%m-%d %H:%M:%S%.6f%:z"),
        None => (TIMESTAMP_FORMAT, "%Y-%m-%d %H:%M:%S%.3f%:z"),
    }
}
