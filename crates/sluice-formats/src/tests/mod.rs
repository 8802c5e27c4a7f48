//! Tests of the crate, data-driven through [`check`]: decode an input whole and again
//! through a [`LineChunker`] cutting it into many chunks, and compare the good rows (as
//! a pretty table) and the bad line numbers with the expected ones.
//!
//! Tests named after a defect they pin down (`..._regression`) failed before its fix.

mod chunker;
mod decode;
mod encode;
mod exact;
mod fast_csv;
mod outside_bytes;
mod props;

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;

use crate::{BadRow, Decoder, DecoderOptions, LineChunker, RowFormat};

pub(crate) const CSV: RowFormat = RowFormat::Csv { header: false, delimiter: b',' };
pub(crate) const CSV_HEADER: RowFormat = RowFormat::Csv { header: true, delimiter: b',' };
pub(crate) const JSON: RowFormat = RowFormat::Json;

pub(crate) fn ts_ms() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, None)
}

/// `id BIGINT NOT NULL, name VARCHAR, ts TIMESTAMP(3)`.
pub(crate) fn small_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", ts_ms(), true),
    ]))
}

/// The NEXMark bid: `auction, bidder, price, channel, url, dateTime, extra`.
pub(crate) use crate::fast_json::differential::bid_schema;

pub(crate) fn decoder(format: RowFormat, schema: &SchemaRef, batch_size: usize) -> Decoder {
    match Decoder::new(DecoderOptions { schema: schema.clone(), format, batch_size }) {
        Ok(decoder) => decoder,
        Err(error) => panic!("decoder: {error}"),
    }
}

/// Decodes `input` as one chunk.
pub(crate) fn decode_whole(
    format: RowFormat,
    schema: &SchemaRef,
    input: &[u8],
    batch_size: usize,
) -> (Vec<RecordBatch>, Vec<BadRow>) {
    let mut decoder = decoder(format, schema, batch_size);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    if let Err(error) = decoder.decode(input, 1, &mut out, &mut bad) {
        panic!("decode: {error}");
    }
    (out, bad)
}

/// Decodes `input` through a [`LineChunker`] of `format` with a `capacity`-byte buffer.
pub(crate) fn decode_chunked(
    format: RowFormat,
    schema: &SchemaRef,
    input: &[u8],
    capacity: usize,
    batch_size: usize,
) -> (Vec<RecordBatch>, Vec<BadRow>) {
    let mut decoder = decoder(format, schema, batch_size);
    let mut chunker = LineChunker::for_format(input, capacity, format);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    loop {
        match chunker.next_chunk() {
            Ok(Some((chunk, first_line))) => {
                if let Err(error) = decoder.decode(chunk, first_line, &mut out, &mut bad) {
                    panic!("decode: {error}");
                }
            }
            Ok(None) => break,
            Err(error) => panic!("read: {error}"),
        }
        bad.extend(chunker.take_bad_rows());
    }
    assert_eq!(chunker.bytes_read(), input.len() as u64, "every byte is read");
    (out, bad)
}

/// The rows of `batches` as a pretty table, or `""` without rows.
pub(crate) fn table(batches: &[RecordBatch]) -> String {
    if batches.iter().all(|batch| batch.num_rows() == 0) {
        return String::new();
    }
    match arrow::util::pretty::pretty_format_batches(batches) {
        Ok(table) => table.to_string(),
        Err(error) => panic!("pretty: {error}"),
    }
}

/// `text` with each line trimmed and blank lines dropped, for indented expectations.
pub(crate) fn unindent(text: &str) -> String {
    text.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join("\n")
}

/// The length of the longest record of `input` (at least 1).
pub(crate) fn longest_record(format: RowFormat, input: &[u8]) -> usize {
    match format {
        RowFormat::Csv { delimiter, .. } => {
            crate::csv_records::csv_record_ranges(input, delimiter).iter().map(|range| range.len()).max()
        }
        RowFormat::Json => input.split_inclusive(|b| *b == b'\n').map(<[u8]>::len).max(),
    }
    .unwrap_or(1)
}

/// Decodes `input` whole, and in chunks just large enough for its longest record with
/// batches of 2 rows; both must give the `expected` table and the `expected_bad` lines,
/// with batches of exactly `schema`.
pub(crate) fn check(
    format: RowFormat,
    schema: SchemaRef,
    input: impl AsRef<[u8]>,
    expected: &str,
    expected_bad: &[u64],
) -> Vec<BadRow> {
    let input = input.as_ref();
    let whole = decode_whole(format, &schema, input, 1024);
    let longest = longest_record(format, input);
    let chunked = decode_chunked(format, &schema, input, longest, 2);
    for ((batches, bad), how) in [(&whole, "whole"), (&chunked, "chunked")] {
        for batch in batches {
            assert_eq!(batch.schema(), schema, "{how}: the batch schema");
            assert!(batch.num_rows() > 0, "{how}: no empty batch");
        }
        assert_eq!(unindent(&table(batches)), unindent(expected), "{how}: the good rows");
        let lines: Vec<u64> = bad.iter().map(|row| row.line).collect();
        assert_eq!(lines, expected_bad, "{how}: the bad lines; bad rows: {bad:#?}");
    }
    assert!(chunked.0.iter().all(|batch| batch.num_rows() <= 2), "batch size 2 is respected");
    assert_eq!(whole.1, chunked.1, "the same bad rows whole and in chunks");
    whole.1
}
