//! The decoder with the JSON fast path on against the decoder with it off (the
//! reference): the same batches, bad rows, errors and slow chunks on any bytes. Run by
//! the property tests of `tests.rs` and by the fuzz target `decode_json_fast` (`fuzz/`,
//! through [`crate::properties::check_json_fast_path`]).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;

use crate::{BadRow, Decoder, DecoderOptions, LineChunker, RowFormat};

/// The decoder with and without the fast path on `bytes`, of the NEXMark bid and of a
/// schema with a column of each type the fast path reads: whole, and through a chunker
/// with a `capacity`-byte buffer (when not 0), in batches of `batch_size` rows. Panics
/// on any difference.
pub fn check_json_fast_path(bytes: &[u8], capacity: usize, batch_size: usize) {
    let batch_size = batch_size.max(1);
    for schema in [bid_schema(), kinds_schema()] {
        check_same(&schema, bytes, 0, batch_size);
        if capacity > 0 {
            check_same(&schema, bytes, capacity, batch_size);
        }
    }
}

pub(crate) fn ts(unit: TimeUnit) -> DataType {
    DataType::Timestamp(unit, None)
}

/// The NEXMark bid.
pub(crate) fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("dateTime", ts(TimeUnit::Millisecond), false),
        Field::new("extra", DataType::Utf8, true),
    ]))
}

/// A column of each type the fast path takes.
pub(crate) fn kinds_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", ts(TimeUnit::Millisecond), true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("tiny", DataType::Int8, true),
        Field::new("u", DataType::UInt32, true),
        Field::new("big", DataType::UInt64, true),
        Field::new("s", ts(TimeUnit::Second), true),
        Field::new("us", ts(TimeUnit::Microsecond), true),
        Field::new("ns", ts(TimeUnit::Nanosecond), true),
    ]))
}

/// What a decode gave: the outcome, the rows, the bad rows and the slow chunks.
pub(crate) type Outcome = (Result<(), String>, Vec<RecordBatch>, Vec<BadRow>, u64);

/// Decodes `input` with the fast path on or off: whole when `capacity` is 0, else
/// through a chunker with a `capacity`-byte buffer. Also gives the fast path's chunks.
pub(crate) fn decode(
    schema: &SchemaRef,
    input: &[u8],
    capacity: usize,
    batch_size: usize,
    fast: bool,
) -> (Outcome, u64) {
    let options = DecoderOptions { schema: schema.clone(), format: RowFormat::Json, batch_size };
    let mut decoder = Decoder::new(options).unwrap_or_else(|error| panic!("decoder: {error}"));
    decoder.set_fast_path(fast);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let mut result = Ok(());
    if capacity == 0 {
        result = decoder.decode(input, 1, &mut out, &mut bad).map_err(|error| error.to_string());
    } else {
        let mut chunker = LineChunker::for_format(input, capacity, RowFormat::Json);
        while let Ok(Some((chunk, first_line))) = chunker.next_chunk() {
            result = decoder.decode(chunk, first_line, &mut out, &mut bad).map_err(|error| error.to_string());
            if result.is_err() {
                break;
            }
            bad.extend(chunker.take_bad_rows());
        }
    }
    ((result, out, bad, decoder.slow_chunks()), decoder.fast_json_chunks())
}

/// The decoder with the fast path gives what it gives without; returns the chunks the
/// fast path decoded.
pub(crate) fn check_same(schema: &SchemaRef, input: &[u8], capacity: usize, batch_size: usize) -> u64 {
    let (reference, none) = decode(schema, input, capacity, batch_size, false);
    assert_eq!(none, 0, "the fast path is off");
    let (fast, chunks) = decode(schema, input, capacity, batch_size, true);
    let input = String::from_utf8_lossy(input);
    assert_eq!(fast.0, reference.0, "the outcome of {input:?}");
    assert_eq!(fast.1, reference.1, "the rows of {input:?}");
    assert_eq!(fast.2, reference.2, "the bad rows of {input:?}");
    assert_eq!(fast.3, reference.3, "the slow chunks of {input:?}");
    chunks
}
