//! Decoding chunks of whole records into Arrow record batches, isolating bad rows.
//!
//! A record is a line of JSON lines, or a CSV record as RFC 4180 defines it (a quoted
//! field may hold line breaks, see [`crate::csv_records`]). The fast path hands a whole
//! chunk to Arrow's CSV or JSON decoder and checks that it produced one row per
//! non-blank record. Only when that fails is the chunk decoded again: blocks of records
//! first, and the records of a failing block one by one, so that each bad row is
//! reported with the line number of its record's first line and a reason while the good
//! rows are kept. The good records are then decoded together, so a chunk's batches are
//! always full-size.
//!
//! Before all this, a chunk is offered to a fast path that decodes it in one pass,
//! straight into arrays, when it is sure of every record, and otherwise leaves it to the
//! above: `fast_csv` for a chunk of plain CSV records, `fast_json` for JSON lines.

use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use sluice_types::SluiceError;

use crate::csv_audit::CsvAudit;
use crate::fast_csv::FastCsv;
use crate::fast_json::FastJson;
use crate::header::{UTF8_BOM, check_csv_first_row, check_csv_header};
use crate::json_numbers::NumberAudit;
use crate::{diagnose, records, temporal};

/// The text of a [`BadRow`] is cut to this many characters.
pub const MAX_BAD_ROW_CHARS: usize = 200;

/// Records validated together on the slow path before going one by one.
const BLOCK_RECORDS: usize = 64;

/// The syntax of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    /// One JSON object per line.
    Json,
    /// CSV records (RFC 4180: a quoted field may span lines); `header` means the first
    /// record of the file names the columns.
    Csv { header: bool, delimiter: u8 },
}

/// What a [`Decoder`] produces and from what.
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// The schema of every batch produced; CSV columns are matched by position, JSON
    /// keys by name.
    pub schema: SchemaRef,
    pub format: RowFormat,
    /// The most rows in one batch.
    pub batch_size: usize,
}

/// A row that could not be decoded; it is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// The 1-based line number in the file (of the first line of a CSV record that
    /// spans several lines).
    pub line: u64,
    /// Why, e.g. ``column `price`: expected BIGINT, found "abc"``.
    pub reason: String,
    /// The row, cut to [`MAX_BAD_ROW_CHARS`] characters.
    pub text: String,
}

impl BadRow {
    /// A bad row from the raw bytes of its record (the final line break is dropped).
    pub fn new(line: u64, reason: impl Into<String>, bytes: &[u8]) -> BadRow {
        BadRow { line, reason: reason.into(), text: row_text(bytes) }
    }
}

/// The printable text of a record: without its final line break, lossy UTF-8, cut to
/// [`MAX_BAD_ROW_CHARS`] characters.
pub(crate) fn row_text(bytes: &[u8]) -> String {
    let bytes = trim_line_break(bytes);
    // A character is at most 4 bytes, so this prefix holds the characters kept.
    let prefix = &bytes[..bytes.len().min(MAX_BAD_ROW_CHARS * 4)];
    String::from_utf8_lossy(prefix).chars().take(MAX_BAD_ROW_CHARS).collect()
}

/// `bytes` without a trailing `\n` or `\r\n`.
pub(crate) fn trim_line_break(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

/// Decodes chunks of whole records into record batches of one schema.
///
/// Each decode builds Arrow's decoder afresh (which costs little next to a chunk): a
/// decoder that failed, or stopped inside a quoted field, is never reused.
pub struct Decoder {
    options: DecoderOptions,
    /// Checks the values of the columns Arrow would read changed.
    audit: Option<ValueAudit>,
    /// The timestamp columns, whose values must lie in the years 0000-9999.
    timestamp_columns: Vec<usize>,
    /// JSON: the columns whose i64::MIN or i64::MAX calls for the exact audit.
    extreme_columns: Vec<usize>,
    /// Chunks that took the record-by-record path.
    slow_chunks: u64,
    /// Whether chunks go to a fast path first (see [`Decoder::set_fast_path`]).
    fast_path: bool,
    /// CSV: the one-pass decoder of plain chunks (`crate::fast_csv`).
    fast_csv: Option<FastCsv>,
    /// JSON lines: the fast path, when it takes the schema (`crate::fast_json`).
    fast_json: Option<FastJson>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("format", &self.options.format)
            .field("batch_size", &self.options.batch_size)
            .field("schema", &self.options.schema)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for `options`; fails on a zero batch size, an unusable CSV delimiter
    /// or a column type the format cannot decode.
    pub fn new(options: DecoderOptions) -> Result<Self, SluiceError> {
        if options.batch_size == 0 {
            return Err(SluiceError::user("format.batch_size", "batch_size = 0 is not allowed")
                .with_fix("set batch_size to 1 or more"));
        }
        if let RowFormat::Csv { delimiter, .. } = options.format {
            if matches!(delimiter, b'\n' | b'\r' | b'"') {
                return Err(SluiceError::user(
                    "format.csv_delimiter",
                    format!("CSV delimiter {:?} is not allowed", char::from(delimiter)),
                )
                .with_fix("use a delimiter other than a quote or a line break"));
            }
            check_csv_types(&options.schema)?;
        }
        ArrowDecoder::build(&options, options.batch_size).map_err(|error| {
            SluiceError::user("format.unsupported_type", format!("cannot decode the schema: {error}"))
        })?;
        let audit = match options.format {
            RowFormat::Json => NumberAudit::new(&options.schema).map(ValueAudit::Json),
            RowFormat::Csv { delimiter, .. } => CsvAudit::new(&options.schema, delimiter).map(ValueAudit::Csv),
        };
        let timestamp_columns = (options.schema.fields().iter().enumerate())
            .filter(|(_, field)| matches!(field.data_type(), DataType::Timestamp(_, _)))
            .map(|(index, _)| index)
            .collect();
        let extreme_columns = match &audit {
            Some(ValueAudit::Json(_)) => (options.schema.fields().iter().enumerate())
                .filter(|(_, field)| NumberAudit::checks_extremes(field.data_type()))
                .map(|(index, _)| index)
                .collect(),
            Some(ValueAudit::Csv(_)) | None => Vec::new(),
        };
        let fast_csv = match options.format {
            RowFormat::Csv { delimiter, .. } => FastCsv::new(&options.schema, delimiter),
            RowFormat::Json => None,
        };
        let fast_json = FastJson::new(&options.schema).filter(|_| options.format == RowFormat::Json);
        Ok(Decoder {
            options,
            audit,
            timestamp_columns,
            extreme_columns,
            slow_chunks: 0,
            fast_path: true,
            fast_csv,
            fast_json,
        })
    }

    /// How many chunks were decoded again record by record: those with a bad row or two
    /// records on one line. A clean input keeps it at 0.
    pub fn slow_chunks(&self) -> u64 {
        self.slow_chunks
    }

    /// Turns every fast path on (the default) or off; off, each chunk takes the
    /// reference path (Arrow's decoder with the audits), which gives the same rows and
    /// bad rows.
    pub fn set_fast_path(&mut self, on: bool) {
        self.fast_path = on;
    }

    /// How many chunks the JSON fast path decoded.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn fast_json_chunks(&self) -> u64 {
        self.fast_json.as_ref().map_or(0, FastJson::chunks)
    }

    /// The options this decoder was built with.
    pub fn options(&self) -> &DecoderOptions {
        &self.options
    }

    /// Decodes a chunk of whole records (the chunk starts at a record start and ends at
    /// a record end, or at the end of the file), whose first line is line `first_line`
    /// of its file.
    ///
    /// Good rows are appended to `out` as batches of at most `batch_size` rows with
    /// exactly the schema; bad rows are appended to `bad`, in line order, and skipped.
    /// A UTF-8 byte order mark at the start of line 1 is skipped; anywhere else it makes
    /// its row bad.
    /// The header record of a CSV file (`first_line == 1` with a header) is checked
    /// against the schema ([`check_csv_header`]: a mismatch fails the decode) and
    /// skipped. Without a header, a first record that is exactly the column names
    /// fails the decode ([`check_csv_first_row`]): the file has a header the options
    /// do not declare.
    pub fn decode(
        &mut self,
        chunk: &[u8],
        first_line: u64,
        out: &mut Vec<RecordBatch>,
        bad: &mut Vec<BadRow>,
    ) -> Result<(), SluiceError> {
        // A byte order mark at the start of the file is no part of its first record.
        let chunk = match first_line {
            1 => chunk.strip_prefix(UTF8_BOM).unwrap_or(chunk),
            _ => chunk,
        };
        let (chunk, first_line) = match self.options.format {
            RowFormat::Csv { header: true, delimiter } if first_line == 1 && !chunk.is_empty() => {
                let (length, line_breaks) = records::first_record(chunk, self.options.format);
                check_csv_header(&chunk[..length], &self.options.schema, delimiter)?;
                (&chunk[length..], 1 + line_breaks)
            }
            RowFormat::Csv { header: false, delimiter } if first_line == 1 && !chunk.is_empty() => {
                let (length, _) = records::first_record(chunk, self.options.format);
                check_csv_first_row(&chunk[..length], &self.options.schema, delimiter)?;
                (chunk, first_line)
            }
            _ => (chunk, first_line),
        };
        if chunk.is_empty() {
            return Ok(());
        }
        if !chunk.ends_with(b"\n") {
            // The last record of a file without a final line break.
            let mut owned = Vec::with_capacity(chunk.len() + 1);
            owned.extend_from_slice(chunk);
            owned.push(b'\n');
            return self.decode_terminated(&owned, first_line, out, bad);
        }
        self.decode_terminated(chunk, first_line, out, bad)
    }

    /// [`Self::decode`] for a chunk that ends with a line break.
    fn decode_terminated(
        &mut self,
        chunk: &[u8],
        first_line: u64,
        out: &mut Vec<RecordBatch>,
        bad: &mut Vec<BadRow>,
    ) -> Result<(), SluiceError> {
        // The fast paths decode the chunk whole, or emit nothing.
        if self.fast_path && self.fast_csv.as_mut().is_some_and(|fast| fast.decode(chunk, self.options.batch_size, out))
        {
            return Ok(());
        }
        if self.fast_path
            && let Some(fast) = &mut self.fast_json
            && fast.decode(chunk, self.options.batch_size, out)
        {
            return Ok(());
        }
        let records = records::count_records(chunk, self.options.format);
        let start = out.len();
        match self.run(chunk, self.options.batch_size, out) {
            // One row per non-blank record (both decoders skip blank ones, and a blank
            // record never yields a row): no bad row, no two records on one line.
            Ok(rows) if rows == records => return Ok(()),
            Ok(_) | Err(_) => out.truncate(start),
        }
        self.slow_chunks += 1;
        self.decode_record_by_record(chunk, first_line, out, bad)
    }

    /// The slow path: finds the bad records, then decodes the good ones together.
    fn decode_record_by_record(
        &self,
        chunk: &[u8],
        first_line: u64,
        out: &mut Vec<RecordBatch>,
        bad: &mut Vec<BadRow>,
    ) -> Result<(), SluiceError> {
        let records = records::split_records(chunk, first_line, self.options.format);
        let mut good = Vec::with_capacity(chunk.len());
        let mut good_rows = 0;
        let mut scratch = Vec::new();
        for block in records.chunks(BLOCK_RECORDS) {
            let (Some(first), Some(last)) = (block.first(), block.last()) else {
                continue;
            };
            let bytes = &chunk[first.start..last.end];
            if self.validate(bytes, block.len(), &mut scratch).is_ok() {
                good.extend_from_slice(bytes);
                good_rows += block.len();
                continue;
            }
            for record in block {
                let bytes = &chunk[record.start..record.end];
                match self.validate(bytes, 1, &mut scratch) {
                    Ok(()) => {
                        good.extend_from_slice(bytes);
                        good_rows += 1;
                    }
                    Err(arrow_reason) => {
                        let reason = diagnose::reason(&self.options, bytes, &arrow_reason);
                        bad.push(BadRow::new(record.number, reason, bytes));
                    }
                }
            }
        }
        let start = out.len();
        match self.run(&good, self.options.batch_size, out) {
            Ok(rows) if rows == good_rows => Ok(()),
            outcome => {
                out.truncate(start);
                let detail = match outcome {
                    Ok(rows) => format!("{rows} rows instead of {good_rows}"),
                    Err(reason) => reason,
                };
                Err(SluiceError::internal(
                    "format.revalidate",
                    format!("the good records from line {first_line} on decoded alone but not together: {detail}"),
                ))
            }
        }
    }

    /// Whether `bytes` decodes into exactly `rows` rows; on failure, the reason.
    fn validate(&self, bytes: &[u8], rows: usize, scratch: &mut Vec<RecordBatch>) -> Result<(), String> {
        scratch.clear();
        // Batches of `rows` rows: the decoder buffers no more than needed.
        match self.run(bytes, rows.max(1), scratch) {
            Ok(decoded) if decoded == rows => Ok(()),
            Ok(decoded) => Err(format!("the record holds {decoded} rows")),
            Err(reason) => Err(reason),
        }
    }

    /// Decodes `bytes` (whole records) into batches of at most `batch_size` rows appended
    /// to `out`; returns the number of rows. Fails on what Arrow rejects, and on what it
    /// would accept changed: a value that does not fit its column exactly (see
    /// [`ValueAudit`]), a timestamp outside the years 0000-9999. On error, some batches
    /// may have been appended.
    fn run(&self, bytes: &[u8], batch_size: usize, out: &mut Vec<RecordBatch>) -> Result<usize, String> {
        if memchr::memmem::find(bytes, UTF8_BOM).is_some() {
            return Err(diagnose::BOM_REASON.to_string());
        }
        let audit = self.audit.as_ref();
        if let Some(reason) = audit.filter(|audit| audit.may_misfit(bytes)).and_then(|audit| audit.first_misfit(bytes))
        {
            return Err(reason);
        }
        let start = out.len();
        let rows = ArrowDecoder::build(&self.options, batch_size)
            .and_then(|mut decoder| decoder.decode_all(bytes, out))
            .map_err(|error| error.to_string())?;
        let batches = &out[start..];
        if let Some(ValueAudit::Json(audit)) = audit
            && batches.iter().any(|batch| self.holds_extreme(batch))
            && let Some(reason) = audit.first_misfit(bytes)
        {
            return Err(reason);
        }
        for batch in batches {
            for &index in &self.timestamp_columns {
                if let Some((_, value)) = temporal::first_outside_years(batch.column(index)) {
                    let name = self.options.schema.field(index).name();
                    return Err(format!("column `{name}`: timestamp {value} is outside the years 0000-9999"));
                }
            }
        }
        Ok(rows)
    }

    /// Whether a BIGINT or timestamp column of `batch` holds i64::MIN or i64::MAX,
    /// which Arrow's JSON decoder also produces by rounding or saturating.
    fn holds_extreme(&self, batch: &RecordBatch) -> bool {
        self.extreme_columns.iter().any(|index| temporal::holds_i64_extreme(batch.column(*index)))
    }
}

/// The check of the values Arrow would read changed, per format: JSON numbers and
/// timestamp strings ([`crate::json_numbers`]), CSV decimal and timestamp fields
/// ([`crate::csv_audit`]).
enum ValueAudit {
    Json(NumberAudit),
    Csv(CsvAudit),
}

impl ValueAudit {
    /// The quick, complete test: `false` when no value of `bytes` can be misread.
    fn may_misfit(&self, bytes: &[u8]) -> bool {
        match self {
            ValueAudit::Json(audit) => audit.may_misfit(bytes),
            ValueAudit::Csv(audit) => audit.may_misfit(bytes),
        }
    }

    /// The reason of a value of `bytes` that does not fit its column, if any.
    fn first_misfit(&self, bytes: &[u8]) -> Option<String> {
        match self {
            ValueAudit::Json(audit) => audit.first_misfit(bytes),
            ValueAudit::Csv(audit) => audit.first_misfit(bytes),
        }
    }
}

/// The number of `\n` bytes in `bytes`.
pub fn count_line_breaks(bytes: &[u8]) -> usize {
    // memchr's SIMD search: a plain filter-count was 12% of a CSV pass-through query.
    memchr::memchr_iter(b'\n', bytes).count()
}

/// Arrow's push decoder of the configured format.
enum ArrowDecoder {
    Csv(Box<arrow::csv::reader::Decoder>),
    Json(arrow::json::reader::Decoder),
}

impl ArrowDecoder {
    fn build(options: &DecoderOptions, batch_size: usize) -> Result<ArrowDecoder, ArrowError> {
        let schema = options.schema.clone();
        Ok(match options.format {
            RowFormat::Csv { delimiter, .. } => ArrowDecoder::Csv(Box::new(
                arrow::csv::ReaderBuilder::new(schema)
                    .with_header(false)
                    .with_delimiter(delimiter)
                    .with_batch_size(batch_size)
                    .build_decoder(),
            )),
            RowFormat::Json => {
                ArrowDecoder::Json(arrow::json::ReaderBuilder::new(schema).with_batch_size(batch_size).build_decoder()?)
            }
        })
    }

    fn decode(&mut self, bytes: &[u8]) -> Result<usize, ArrowError> {
        match self {
            ArrowDecoder::Csv(decoder) => decoder.decode(bytes),
            ArrowDecoder::Json(decoder) => decoder.decode(bytes),
        }
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        match self {
            ArrowDecoder::Csv(decoder) => decoder.flush(),
            ArrowDecoder::Json(decoder) => decoder.flush(),
        }
    }

    /// Decodes all of `bytes` (whole records) into `out`; returns the number of rows.
    fn decode_all(&mut self, bytes: &[u8], out: &mut Vec<RecordBatch>) -> Result<usize, ArrowError> {
        let mut rest = bytes;
        let mut rows = 0;
        loop {
            let read = self.decode(rest)?;
            rest = &rest[read..];
            if rest.is_empty() {
                break;
            }
            // Arrow's decoders stop reading when a batch is full.
            let flushed = self.flush_into(out)?;
            if read == 0 && flushed == 0 {
                return Err(ArrowError::ComputeError("the decoder made no progress".to_string()));
            }
            rows += flushed;
        }
        rows += self.flush_into(out)?;
        Ok(rows)
    }

    fn flush_into(&mut self, out: &mut Vec<RecordBatch>) -> Result<usize, ArrowError> {
        match self.flush()? {
            Some(batch) => {
                let rows = batch.num_rows();
                out.push(batch);
                Ok(rows)
            }
            None => Ok(0),
        }
    }
}

/// Fails on a column type that Arrow's CSV decoder cannot parse.
fn check_csv_types(schema: &SchemaRef) -> Result<(), SluiceError> {
    for field in schema.fields() {
        if !csv_supports(field.data_type()) {
            return Err(SluiceError::user(
                "format.unsupported_type",
                format!("CSV cannot hold column `{}` of type {}", field.name(), field.data_type()),
            )
            .with_fix("use JSON lines for nested or binary columns"));
        }
    }
    Ok(())
}

/// The types Arrow's CSV decoder parses.
fn csv_supports(data_type: &DataType) -> bool {
    use DataType::*;
    match data_type {
        Boolean | Null | Utf8 | Utf8View | Date32 | Date64 | Timestamp(_, _) => true,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => true,
        Float16 | Float32 | Float64 => true,
        Decimal32(_, _) | Decimal64(_, _) | Decimal128(_, _) | Decimal256(_, _) => true,
        Time32(unit) => matches!(unit, TimeUnit::Second | TimeUnit::Millisecond),
        Time64(unit) => matches!(unit, TimeUnit::Microsecond | TimeUnit::Nanosecond),
        Dictionary(key, value) => key.is_dictionary_key_type() && **value == Utf8,
        _ => false,
    }
}

#[cfg(test)]
mod count_tests {
    #[test]
    fn line_breaks_are_counted() {
        let bytes: Vec<u8> = (0..10_000).map(|i| if i % 7 == 0 { b'\n' } else { b'x' }).collect();
        assert_eq!(super::count_line_breaks(&bytes), 1429);
        assert_eq!(super::count_line_breaks(&[b'\n'; 600]), 600);
        assert_eq!(super::count_line_breaks(b""), 0);
    }
}
