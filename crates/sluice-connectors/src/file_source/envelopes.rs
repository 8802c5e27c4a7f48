//! `format = "debezium-json"`: each line of a file is one Debezium change event, read as
//! the Kafka source reads a message of that format: opened into the rows it changes by
//! [`crate::changelog::open_envelopes`] (`sluice_formats::changelog::debezium_json`), the
//! rows decoded into the declared columns as the `json` format decodes a line, and kept
//! whole per event by [`crate::changelog::whole_messages`].
//!
//! # A line is a message
//!
//! - A line that is JSON `null` is a tombstone: `kafka-console-consumer` prints a message
//!   without a value (the tombstone Debezium sends after a delete) as `null`. It gives no
//!   row and is no bad row, as the Kafka source and Flink skip a tombstone.
//! - A blank line (spaces, tabs, a `\r` only) is skipped, as the Kafka source skips an
//!   empty value and the `json` format a blank line.
//! - Any other line is an envelope: its rows, or, if the envelope or any of its rows is
//!   bad, no row at all and one bad row, numbered by the line, with the reason and the
//!   line's text (handled per `on_error` by the lane).
//!
//! The rows of a chunk are a function of its lines only, so a lane resumed at a chunk's
//! start that skips the rows it had handed out hands out exactly the rest.

use arrow::array::Int8Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use sluice_formats::{BadRow, Decoder, DecoderOptions, RowFormat};
use sluice_types::SluiceError;

use crate::changelog::{DEBEZIUM_JSON, open_envelopes, whole_messages};

/// The line number the rows' chunk starts at: not 1, so no row is ever taken for a
/// header (line numbers of the rows are otherwise only mapped back to envelopes).
const ROWS_FIRST_LINE: u64 = 2;

/// Debezium events, one per line, into rows of the declared columns with their kinds.
pub(crate) struct EnvelopeLines {
    /// The row images into the declared columns.
    decoder: Decoder,
    /// The declared columns and the row kinds.
    kinds_schema: SchemaRef,
}

impl EnvelopeLines {
    /// A reader of events into `schema` (the declared columns), in batches of at most
    /// `batch_size` rows, with the kinds under `kinds_schema`.
    pub(crate) fn new(schema: SchemaRef, kinds_schema: SchemaRef, batch_size: usize) -> Result<Self, SluiceError> {
        let options = DecoderOptions { schema, format: RowFormat::Json, batch_size: batch_size.max(1) };
        Ok(EnvelopeLines { decoder: Decoder::new(options)?, kinds_schema })
    }

    /// The rows of the events of `chunk` (whole lines, the first numbered `first_line`)
    /// into `batches`, with their kinds; each bad event once into `bad`, in line order.
    pub(crate) fn decode(
        &mut self,
        chunk: &[u8],
        first_line: u64,
        batches: &mut Vec<RecordBatch>,
        bad: &mut Vec<BadRow>,
    ) -> Result<(), SluiceError> {
        let lines: Vec<&[u8]> = lines_of(chunk).collect();
        let number = |index: usize| first_line + index as u64;
        let opened = open_envelopes(DEBEZIUM_JSON, lines.iter().map(|line| (None, message(line))));
        let mut bad_lines: Vec<(usize, String)> = opened.bad;
        let mut rows = Vec::with_capacity(chunk.len() + chunk.len() / 2);
        for (_, change) in &opened.changes {
            // A row is one line of the rows' chunk (JSON allows line breaks only as space).
            rows.extend(change.row.iter().map(|b| if matches!(b, b'\n' | b'\r') { b' ' } else { *b }));
            rows.push(b'\n');
        }
        let mut decoded = Vec::new();
        let mut bad_rows = Vec::new();
        if !rows.is_empty() {
            self.decoder.decode(&rows, ROWS_FIRST_LINE, &mut decoded, &mut bad_rows)?;
        }
        let mut bad_changes = vec![false; opened.changes.len()];
        for row in bad_rows {
            let change = usize::try_from(row.line.saturating_sub(ROWS_FIRST_LINE)).unwrap_or(usize::MAX);
            let (index, _) = opened.changes.get(change).ok_or_else(|| rows_mismatch("a bad row past the rows"))?;
            bad_changes[change] = true;
            bad_lines.push((*index, row.reason));
        }
        bad_lines.sort_by_key(|(index, _)| *index);
        bad_lines.dedup_by_key(|(index, _)| *index);
        bad.extend(bad_lines.iter().map(|(index, reason)| BadRow::new(number(*index), reason.clone(), lines[*index])));
        // The good rows, in order: every change but those the decoder found bad.
        let good: Vec<usize> = (0..opened.changes.len()).filter(|change| !bad_changes[*change]).collect();
        if decoded.iter().map(RecordBatch::num_rows).sum::<usize>() != good.len() {
            return Err(rows_mismatch("the decoded rows are not the good rows one to one"));
        }
        let bad_messages: Vec<usize> = bad_lines.iter().map(|(index, _)| *index).collect();
        let mut next = 0;
        for rows in decoded {
            let of = &good[next..next + rows.num_rows()];
            next += rows.num_rows();
            let messages: Vec<usize> = of.iter().map(|&change| opened.changes[change].0).collect();
            let kinds = Int8Array::from_iter_values(of.iter().map(|&change| opened.changes[change].1.kind as i8));
            if let Some(rows) = whole_messages(&rows, &messages, kinds, &bad_messages, &self.kinds_schema)? {
                batches.push(rows);
            }
        }
        Ok(())
    }
}

/// The lines of a chunk of whole lines, without their line breaks (the last one may
/// lack its own, at the end of the input).
fn lines_of(chunk: &[u8]) -> impl Iterator<Item = &[u8]> {
    let lines = if chunk.is_empty() {
        0
    } else {
        sluice_formats::count_line_breaks(chunk) + usize::from(!chunk.ends_with(b"\n"))
    };
    chunk.split(|b| *b == b'\n').take(lines)
}

/// The message a line is: None for a tombstone (`null`) or a blank line, which give no
/// row (see the module doc).
fn message(line: &[u8]) -> Option<&[u8]> {
    let text = line.trim_ascii();
    (!text.is_empty() && text != b"null").then_some(line)
}

/// An internal error: the decoder's rows do not match the events' rows.
fn rows_mismatch(what: &str) -> SluiceError {
    SluiceError::internal("source.debezium_rows", format!("decoding Debezium events' rows: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_splits_into_its_lines() {
        let lines = |chunk: &str| {
            lines_of(chunk.as_bytes()).map(|l| String::from_utf8_lossy(l).into_owned()).collect::<Vec<_>>()
        };
        assert_eq!(lines("a\nb\n"), ["a", "b"]);
        assert_eq!(lines("a\n\nb"), ["a", "", "b"]);
        assert_eq!(lines(""), Vec::<String>::new());
        assert_eq!(lines("\n"), [""]);
        assert_eq!(lines("\n\n"), ["", ""]);
    }
}
