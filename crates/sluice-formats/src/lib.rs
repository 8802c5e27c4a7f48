//! Row formats: bytes to Arrow for sources, Arrow to bytes for sinks.
//!
//! # Decoding
//!
//! A [`Decoder`] turns chunks of whole lines (JSON lines or CSV) into record batches
//! with exactly the configured schema. A [`LineChunker`] cuts a file into such chunks
//! with a bounded buffer and tracks line numbers.
//!
//! Each record is one line. A bad row never fails the stream: it is reported as a
//! [`BadRow`] (its 1-based line number, the reason, its text cut to 200 characters) and
//! skipped, and the good rows around it are kept. A clean chunk is decoded in one pass
//! by Arrow's own CSV or JSON decoder; only a chunk that fails is decoded again line by
//! line to isolate its bad rows. Blank lines (empty or only whitespace) are skipped and
//! are not bad rows.
//!
//! What makes a row bad:
//! - malformed syntax (invalid JSON, an unterminated CSV quote, invalid UTF-8);
//! - a value that does not parse as its column's type (`"abc"` in a BIGINT column, an
//!   unparseable timestamp, a number in a VARCHAR column of a JSON row);
//! - a missing or NULL value in a NOT NULL column (a missing JSON key, an empty CSV
//!   field);
//! - a CSV row with the wrong number of fields;
//! - a line holding more than one record (two JSON objects on one line);
//! - a line longer than the [`LineChunker`]'s buffer.
//!
//! JSON rows may carry extra keys (ignored) and omit nullable columns (NULL). As in
//! Flink, a JSON string holding a number is accepted for a numeric column (`"42"` for
//! BIGINT), and a fractional number for an integer column is truncated toward zero.
//! A CSV empty field is NULL. CSV fields may be quoted with `"` (a quote inside a quoted
//! field is doubled); a quoted field must not contain a line break.
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
//! epoch: epoch milliseconds for a `TIMESTAMP(3)` (Timestamp(Millisecond)) column.
//!
//! # Encoding
//!
//! An [`Encoder`] appends the rows of a [`sluice_types::Batch`] to a byte buffer as JSON
//! lines, CSV or a pretty table; see the [`encode`] module for the exact output.

pub mod chunker;
pub mod decode;
mod diagnose;
pub mod encode;

pub use chunker::{DEFAULT_CHUNK_BYTES, LineChunker};
pub use decode::{BadRow, Decoder, DecoderOptions, MAX_BAD_ROW_CHARS, RowFormat, count_line_breaks};
pub use encode::{Encoder, OP_COLUMN, OP_DELETE, OP_INSERT, OutputFormat, TIMESTAMP_FORMAT};

#[cfg(test)]
mod tests;
