//! Row formats: bytes to Arrow for sources, Arrow to bytes for sinks.
//!
//! # Decoding
//!
//! A [`Decoder`] turns chunks of whole records (JSON lines or CSV) into record batches
//! with exactly the configured schema. A [`LineChunker`] cuts a file into such chunks
//! with a bounded buffer and tracks line numbers.
//!
//! A JSON record is one line. A CSV record follows RFC 4180: it ends at a line break
//! outside quotes, so a quoted field may hold line breaks (LF or CRLF), delimiters and
//! doubled quotes, and a record may span several lines ([`csv_records`] says exactly
//! which quotes count). A bad row never fails the stream: it is reported as a
//! [`BadRow`] (the 1-based line number of its record's first line, the reason, its text
//! cut to 200 characters) and skipped, and the good rows around it are kept. A clean
//! chunk is decoded in one pass (a CSV chunk of plain records by the crate's own
//! `fast_csv`, JSON lines of the usual column types by its `fast_json`, any other by
//! Arrow's own CSV or JSON decoder); only a chunk that
//! fails is decoded again record by record to isolate its bad rows. Blank lines (empty
//! or only whitespace) are skipped and are not bad rows.
//!
//! What makes a row bad:
//! - malformed syntax (invalid JSON, invalid UTF-8, an unterminated CSV quote, which
//!   runs to the end of the file or of the chunker's buffer);
//! - a value that does not parse as its column's type (`"abc"` in a BIGINT column, an
//!   unparseable timestamp, a number in a VARCHAR column of a JSON row);
//! - a missing or NULL value in a NOT NULL column (a missing JSON key, an empty CSV
//!   field);
//! - a CSV row with the wrong number of fields;
//! - a line holding more than one record (two JSON objects on one line);
//! - a record longer than the [`LineChunker`]'s buffer;
//! - a number that does not fit its column exactly: a fraction or an out-of-range value
//!   for an integer column (`5.5` or `1e30` for BIGINT, `300` for TINYINT), more
//!   decimal places than a DECIMAL's scale (`1.239` for DECIMAL(10, 2); `1.230` fits)
//!   or more digits before the decimal point than its precision minus its scale
//!   (`123456789` for DECIMAL(10, 2)), text that is no number for a DECIMAL, a JSON
//!   number for a timestamp that is not a whole number of its unit; a value is never
//!   rounded or truncated (the `json_numbers`, `csv_audit` and `exact` modules explain
//!   why Arrow alone would);
//! - timestamp text with a finer fraction of seconds than its column holds (see below);
//! - a timestamp outside the years 0000-9999 (UTC), as a number or as text;
//! - a UTF-8 byte order mark (U+FEFF) anywhere but at the start of the file, where it
//!   is skipped.
//!
//! A CSV file with a header has its header record checked against the schema
//! ([`check_csv_header`]): the names must be the schema's, in order. A CSV file read
//! without a header (the default, as in Flink) whose first record is exactly the
//! schema's names has a header the options do not declare: the decode fails with
//! `source.csv_header` ([`check_csv_first_row`]) rather than reading it as a row.
//!
//! JSON rows may carry extra keys (ignored) and omit nullable columns (NULL). As in
//! Flink, a JSON string holding a number is accepted for a numeric column (`"42"` for
//! BIGINT); a number written with a fraction or an exponent fits an integer column when
//! its value is an integer (`42.0`, `4.2e1`). A CSV empty field is NULL. CSV fields may
//! be quoted with `"` (a quote inside a quoted field is doubled); a quoted field may
//! contain line breaks.
//!
//! Timestamp columns accept, in both formats:
//!
//! ```text
//! 2026-01-01 00:00:00.123        space separated, optional fraction, read as UTC
//! 2026-01-01T00:00:00Z           RFC 3339, any offset
//! 2026-01-01T00:00:00.123+02:00
//! 2026-01-01                     a date alone is midnight
//! ```
//!
//! and, in JSON only, an integer number counted in the column's unit since the Unix
//! epoch: epoch milliseconds for a `TIMESTAMP(3)` (Timestamp(Millisecond)) column. Either
//! way the timestamp must lie within the years 0000-9999 (UTC).
//!
//! The fraction of seconds may have any number of digits, but no finer one than the
//! column's precision: into a `TIMESTAMP(p)` (`p` = 0, 3, 6 or 9 for seconds,
//! milliseconds, microseconds, nanoseconds), every digit after the `p`-th must be `0`.
//! `2026-01-01 00:00:00.1230` fits a `TIMESTAMP(3)`; `2026-01-01 00:00:00.1239` is a bad
//! row whose reason names the precision (`more than 3 digits of fractional seconds`),
//! as is `.1234567891` in a `TIMESTAMP(9)`. Flink's CSV and JSON formats do not hold
//! the fraction to the column's precision (and its `CAST` to `TIMESTAMP(p)` truncates
//! it); here that would be a silently changed value, so the rule is the one of decimal
//! places.
//!
//! # Changelog envelopes
//!
//! [`changelog`]: a Debezium change event, an upsert message or a changelog file's `op`
//! column into rows with Flink's row kinds (`+I`, `-U`, `+U`, `-D`).
//!
//! # Encoding
//!
//! An [`Encoder`] appends the rows of a [`sluice_types::Batch`] to a byte buffer as JSON
//! lines, CSV or a pretty table; see the [`encode`] module for the exact output.

pub mod changelog;
pub mod chunker;
mod csv_audit;
pub mod csv_records;
pub mod decode;
mod diagnose;
pub mod encode;
mod exact;
mod fast_csv;
mod fast_json;
mod header;
mod json_numbers;
#[cfg(any(test, feature = "fuzzing"))]
pub mod properties;
mod records;
mod temporal;

pub use chunker::{DEFAULT_CHUNK_BYTES, LineChunker};
pub use csv_records::CsvRecordFinder;
pub use decode::{BadRow, Decoder, DecoderOptions, MAX_BAD_ROW_CHARS, RowFormat, count_line_breaks};
pub use encode::{
    Encoder, OP_COLUMN, OP_DELETE, OP_INSERT, OP_UPDATE_AFTER, OP_UPDATE_BEFORE, OutputFormat, TIMESTAMP_FORMAT,
};
pub use header::{UTF8_BOM, check_csv_first_row, check_csv_header};

#[cfg(test)]
mod tests;
