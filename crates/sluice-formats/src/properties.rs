//! Properties of the decoders of outside bytes that hold for any input: checked by the
//! crate's property tests (`src/tests/outside_bytes.rs`) and by the fuzz targets
//! (`fuzz/`), which call these functions. Each check panics when a property fails.
//!
//! - [`check_csv_records`]: the CSV record finder cuts any bytes into contiguous
//!   records ending at line breaks, the same whether fed whole, in pieces, or after a
//!   [`CsvRecordFinder::skip`].
//! - [`check_chunker`]: the [`LineChunker`] hands out every byte once, in chunks of
//!   whole records within its buffer, with the file's line numbers, and skips exactly
//!   the records longer than its buffer, each as one bad row.
//! - [`check_chunker_scans`]: the [`LineChunker`] hands out the same chunks, line numbers
//!   and bad rows whatever the size of the blocks it searches, and with or without its
//!   search of CSV blocks that hold no quote.
//! - [`check_decoder`]: the [`Decoder`] never fails and never panics on any bytes
//!   (short of a CSV header it must refuse); every non-blank record is one good row or
//!   one bad row, in line order, in batches of exactly the schema; a good CSV row holds
//!   its decimal and its timestamp exactly as written; and the decoder gives the same
//!   rows and bad rows whole as through a chunker whose buffer holds every record.
//! - [`check_fast_path`]: the [`Decoder`] gives the same rows, bad rows, outcome and
//!   slow chunks with its one-pass CSV fast path on and off.
//! - [`check_json_fast_path`]: the JSON fast path gives what the decoder gives without it.
//! - [`check_changelog_envelopes`]: a Debezium event or an upsert message of any bytes
//!   gives rows or a reason, never a panic; rows are one-line JSON objects, their kinds
//!   as the envelope's `op` says (one `+I`, a `+U` after at most one `-U`, one `-D`).
//!
//! Compiled for the crate's tests and with the `fuzzing` feature.

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::compute::kernels::cast_utils::string_to_datetime;
use arrow::datatypes::{DataType, Decimal128Type, Field, Schema, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;

use crate::csv_records::{CsvRecordFinder, csv_record_ranges};
use crate::exact::{fraction_misfit, same_number};
use crate::header::UTF8_BOM;
use crate::records::is_blank;
use crate::{BadRow, Decoder, DecoderOptions, LineChunker, RowFormat};

pub use crate::fast_json::differential::check_json_fast_path;

/// The header line of the inputs with a header: the names of [`schema`].
pub const HEADER_LINE: &[u8] = b"id,name,ts,d\n";

/// The schema of the decoded inputs: a column of each kind of check (a NOT NULL
/// integer, text, a timestamp, a decimal).
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("d", DataType::Decimal128(10, 2), true),
    ]))
}

/// The CSV record finder on `bytes` with `delimiter` (not a quote or a line break),
/// fed whole and in pieces of `piece_bytes` bytes.
pub fn check_csv_records(bytes: &[u8], delimiter: u8, piece_bytes: usize) {
    assert!(!matches!(delimiter, b'\n' | b'\r' | b'"'), "the decoder refuses the delimiter {delimiter}");
    let piece_bytes = piece_bytes.max(1);
    let ranges = csv_record_ranges(bytes, delimiter);
    let mut start = 0;
    for range in &ranges {
        assert_eq!(range.start, start, "records are contiguous: {ranges:?}");
        assert!(range.end > range.start, "no record is empty: {ranges:?}");
        start = range.end;
    }
    assert_eq!(start, bytes.len(), "the records cover the input");
    let mut finder = CsvRecordFinder::new(delimiter);
    let mut ends = Vec::new();
    while let Some(length) = finder.find_record_end(&bytes[ends.last().copied().unwrap_or(0)..]) {
        let end = ends.last().copied().unwrap_or(0) + length;
        assert_eq!(bytes[end - 1], b'\n', "a record ends at a line break");
        assert!(!finder.in_quotes(), "no quoted field is open at a record end");
        ends.push(end);
    }
    assert_eq!(finder.offset(), bytes.len() as u64, "every byte is fed");
    let range_ends: Vec<usize> = ranges.iter().map(|range| range.end).collect();
    assert_eq!(range_ends[..ends.len()], ends[..], "the ranges end where the finder does");
    assert!(range_ends.len() <= ends.len() + 1, "only the last record may run to the end unterminated");
    assert_eq!(ends_in_pieces(bytes, delimiter, piece_bytes), ends, "fed in pieces of {piece_bytes} bytes");
    for skipped in (0..=bytes.len()).step_by(piece_bytes).take(32) {
        let mut finder = CsvRecordFinder::new(delimiter);
        finder.skip(&bytes[..skipped]);
        assert_eq!(finder.offset(), skipped as u64);
        let next = finder.find_record_end(&bytes[skipped..]).map(|length| skipped + length);
        let expected = ends.iter().copied().find(|end| *end > skipped);
        assert_eq!(next, expected, "the first record end after skipping {skipped} bytes");
    }
}

/// The record ends found by one finder fed `bytes` in pieces of `piece_bytes`.
fn ends_in_pieces(bytes: &[u8], delimiter: u8, piece_bytes: usize) -> Vec<usize> {
    let mut finder = CsvRecordFinder::new(delimiter);
    let mut ends = Vec::new();
    for (index, piece) in bytes.chunks(piece_bytes).enumerate() {
        let mut at = 0;
        while let Some(length) = finder.find_record_end(&piece[at..]) {
            at += length;
            ends.push(index * piece_bytes + at);
        }
    }
    ends
}

/// The records of `input` as the chunker and the decoder read them: contiguous byte
/// ranges, each with its line break, the first holding a leading byte order mark.
fn record_ranges(format: RowFormat, input: &[u8]) -> Vec<Range<usize>> {
    let skip = if input.starts_with(UTF8_BOM) { UTF8_BOM.len() } else { 0 };
    let body = &input[skip..];
    let ranges = match format {
        RowFormat::Csv { delimiter, .. } => csv_record_ranges(body, delimiter),
        RowFormat::Json => {
            let mut start = 0;
            (body.split_inclusive(|byte| *byte == b'\n'))
                .map(|line| {
                    start += line.len();
                    start - line.len()..start
                })
                .collect()
        }
    };
    let mut ranges: Vec<Range<usize>> = ranges.into_iter().map(|range| range.start + skip..range.end + skip).collect();
    match ranges.first_mut() {
        Some(first) => first.start = 0,
        None if skip > 0 => ranges.push(0..skip),
        None => {}
    }
    ranges
}

/// Whether record `index` of `input` at `range` is blank (a byte order mark at the
/// start of the input is no part of it).
fn blank(input: &[u8], index: usize, range: &Range<usize>) -> bool {
    let bytes = &input[range.clone()];
    is_blank(if index == 0 { bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes) } else { bytes })
}

/// A reader handing out at most `step` bytes per read, like a pipe.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let length = self.step.min(buf.len()).min(self.data.len());
        buf[..length].copy_from_slice(&self.data[..length]);
        self.data = &self.data[length..];
        Ok(length)
    }
}

/// A [`LineChunker`] of `format` with a `capacity`-byte buffer on `bytes`, read at most
/// `read_bytes` at a time.
pub fn check_chunker(format: RowFormat, bytes: &[u8], capacity: usize, read_bytes: usize) {
    let capacity = capacity.max(1);
    let ranges = record_ranges(format, bytes);
    let lines_before = |offset: usize| 1 + crate::count_line_breaks(&bytes[..offset]) as u64;
    let reader = Trickle { data: bytes, step: read_bytes.max(1) };
    let mut chunker = LineChunker::for_format(reader, capacity, format);
    let mut offset = 0;
    loop {
        let (length, first_line) = match chunker.next_chunk() {
            Ok(Some((chunk, first_line))) => (chunk.len(), first_line),
            Ok(None) => break,
            Err(error) => panic!("reading from memory: {error}"),
        };
        let bad = chunker.take_bad_rows();
        let consumed = chunker.consumed() as usize;
        let record = ranges.iter().find(|range| range.start == offset);
        let Some(record) = record else { panic!("byte {offset} is no record start: {ranges:?}") };
        if bad.is_empty() {
            assert!(length > 0 && length <= capacity, "a chunk of {length} bytes from a {capacity}-byte buffer");
            assert_eq!(consumed - length, offset, "chunks follow each other");
            assert!(ranges.iter().any(|range| range.end == consumed), "chunk ends at byte {consumed}: {ranges:?}");
            assert_eq!(first_line, lines_before(offset), "the chunk at byte {offset}");
        } else {
            assert_eq!((bad.len(), length), (1, 0), "an over-long record is one bad row and an empty chunk");
            assert!(record.len() > capacity, "the record {record:?} fits the {capacity}-byte buffer");
            assert_eq!(consumed, record.end, "only the over-long record is skipped");
            assert_eq!(bad[0].line, lines_before(offset), "the bad row at byte {offset}");
        }
        offset = consumed;
    }
    assert_eq!(offset, bytes.len(), "every byte is handed out or skipped");
    assert_eq!(chunker.bytes_read(), bytes.len() as u64);
}

/// What a chunker handed out, call by call: each chunk, its first line, the bad rows
/// reported after it, the bytes consumed and the next line number.
type ChunkTrace = Vec<(Vec<u8>, u64, Vec<BadRow>, u64, u64)>;

/// The [`ChunkTrace`] of a [`LineChunker`] of `format` on `bytes` read `read_bytes` at a
/// time, searching `block_bytes` at a time, with or without its `quote_free_search`.
fn chunk_trace(
    format: RowFormat,
    bytes: &[u8],
    capacity: usize,
    read_bytes: usize,
    block_bytes: usize,
    quote_free_search: bool,
) -> ChunkTrace {
    let reader = Trickle { data: bytes, step: read_bytes.max(1) };
    let mut chunker = LineChunker::for_format(reader, capacity.max(1), format);
    chunker.set_scan(block_bytes, quote_free_search);
    let mut trace = Vec::new();
    loop {
        let (chunk, first_line) = match chunker.next_chunk() {
            Ok(Some((chunk, first_line))) => (chunk.to_vec(), first_line),
            Ok(None) => break,
            Err(error) => panic!("reading from memory: {error}"),
        };
        trace.push((chunk, first_line, chunker.take_bad_rows(), chunker.consumed(), chunker.next_line()));
    }
    trace
}

/// A [`LineChunker`] of `format` with a `capacity`-byte buffer on `bytes`, read at most
/// `read_bytes` at a time, gives the same chunks, line numbers and bad rows searching
/// its buffer `block_bytes` at a time, with and without the search of CSV blocks that
/// hold no quote, as searching the whole buffer at once through the CSV finder alone.
pub fn check_chunker_scans(format: RowFormat, bytes: &[u8], capacity: usize, read_bytes: usize, block_bytes: usize) {
    let reference = chunk_trace(format, bytes, capacity, read_bytes, usize::MAX, false);
    for quote_free_search in [true, false] {
        for block in [block_bytes, usize::MAX] {
            let trace = chunk_trace(format, bytes, capacity, read_bytes, block, quote_free_search);
            assert_eq!(trace, reference, "searching {block} bytes at a time, quote-free search {quote_free_search}");
        }
    }
}

/// What a decode gave: the good rows and the bad rows.
type Decoded = (Vec<RecordBatch>, Vec<BadRow>);

/// The [`Decoder`] of `format` on `bytes` (after [`HEADER_LINE`] for CSV with a
/// header), with batches of `batch_size` rows: whole, and through a chunker with a
/// `capacity`-byte buffer.
pub fn check_decoder(format: RowFormat, bytes: &[u8], capacity: usize, batch_size: usize) {
    let (capacity, batch_size) = (capacity.max(1), batch_size.max(1));
    let header = matches!(format, RowFormat::Csv { header: true, .. });
    let input = if header { [HEADER_LINE, bytes].concat() } else { bytes.to_vec() };
    let whole = match decode_whole(format, &input, batch_size) {
        Ok(whole) => whole,
        Err(error) if !header && error.code == "source.csv_header" => return,
        Err(error) => panic!("a decode of any bytes fails only on a header: {error}"),
    };
    let chunked = decode_chunked(format, &input, capacity, batch_size)
        .unwrap_or_else(|error| panic!("a chunked decode fails where a whole one did not: {error}"));
    let ranges = record_ranges(format, &input);
    let records = |fits: &dyn Fn(&Range<usize>) -> bool| -> usize {
        (ranges.iter().enumerate())
            .map(|(index, range)| match fits(range) {
                false => 1,
                true if header && index == 0 => 0,
                true => usize::from(!blank(&input, index, range)),
            })
            .sum()
    };
    for (decoded, how) in [(&whole, "whole"), (&chunked, "chunked")] {
        check_batches(&decoded.0, batch_size);
        let lines: Vec<u64> = decoded.1.iter().map(|row| row.line).collect();
        assert!(lines.windows(2).all(|pair| pair[0] < pair[1]), "{how}: bad rows in line order: {lines:?}");
    }
    assert_eq!(rows(&whole.0) + whole.1.len(), records(&|_| true), "whole: a row or a bad row per record");
    if let RowFormat::Csv { delimiter, .. } = format {
        check_exact_values(&good_records(&input, &ranges, header, &whole.1), delimiter, &concat(&whole.0));
    }
    let fits = |range: &Range<usize>| range.len() <= capacity;
    assert_eq!(rows(&chunked.0) + chunked.1.len(), records(&fits), "chunked: over-long records are bad rows");
    if ranges.iter().all(fits) {
        assert_eq!(concat(&whole.0), concat(&chunked.0), "the same rows whole and in chunks");
        assert_eq!(whole.1, chunked.1, "the same bad rows whole and in chunks");
    }
}

/// The records of `input` decoded into rows (neither blank, nor the header, nor bad), in
/// order, without a leading byte order mark.
fn good_records<'a>(input: &'a [u8], ranges: &[Range<usize>], header: bool, bad: &[BadRow]) -> Vec<&'a [u8]> {
    let line_of = |offset: usize| 1 + crate::count_line_breaks(&input[..offset]) as u64;
    (ranges.iter().enumerate())
        .filter(|(index, range)| (!header || *index > 0) && !blank(input, *index, range))
        .filter(|(_, range)| !bad.iter().any(|row| row.line == line_of(range.start)))
        .map(|(index, range)| {
            let bytes = &input[range.clone()];
            if index == 0 { bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes) } else { bytes }
        })
        .collect()
}

/// Each of the good CSV `records` is a row of `batch` holding its decimal and its
/// timestamp exactly as written: never rounded or truncated.
fn check_exact_values(records: &[&[u8]], delimiter: u8, batch: &RecordBatch) {
    assert_eq!(batch.num_rows(), records.len(), "a row per good record");
    if records.is_empty() {
        return;
    }
    let mut text = Vec::new();
    for record in records {
        text.extend_from_slice(record);
        if !record.ends_with(b"\n") {
            text.push(b'\n');
        }
    }
    let texts = csv_texts(&text, delimiter, records.len());
    let (written_times, written_decimals) = (texts.column(2).as_string::<i32>(), texts.column(3).as_string::<i32>());
    let times = batch.column(2).as_primitive::<TimestampMillisecondType>();
    let decimals = batch.column(3).as_primitive::<Decimal128Type>();
    for row in 0..batch.num_rows() {
        assert_eq!(
            written_decimals.is_null(row),
            decimals.is_null(row),
            "row {row}: a NULL decimal from an empty field"
        );
        if written_decimals.is_valid(row) {
            let (written, read) = (written_decimals.value(row), decimals.value_as_string(row));
            assert!(same_number(written.as_bytes(), read.as_bytes()), "{written:?} was read as {read}");
        }
        assert_eq!(written_times.is_null(row), times.is_null(row), "row {row}: a NULL timestamp from an empty field");
        if written_times.is_valid(row) {
            let written = written_times.value(row);
            let parsed = string_to_datetime(&utc(), written).unwrap_or_else(|error| panic!("{written:?}: {error}"));
            let nanos = i128::from(parsed.timestamp()) * 1_000_000_000 + i128::from(parsed.timestamp_subsec_nanos());
            let read = i128::from(times.value(row)) * 1_000_000;
            let exact = read == nanos && fraction_misfit(written.as_bytes(), 9).is_none();
            assert!(exact, "{written:?} was read as {read} ns since the epoch");
        }
    }
}

/// The UTC time zone of Arrow's parser.
fn utc() -> arrow::array::timezone::Tz {
    "+00:00".parse().unwrap_or_else(|error| panic!("the UTC offset: {error}"))
}

/// The fields of `rows` CSV records as text, read by Arrow's CSV decoder.
fn csv_texts(text: &[u8], delimiter: u8, rows: usize) -> RecordBatch {
    let fields: Vec<Field> =
        schema().fields().iter().map(|field| Field::new(field.name(), DataType::Utf8, true)).collect();
    let text_schema = Arc::new(Schema::new(fields));
    let mut decoder = arrow::csv::ReaderBuilder::new(text_schema.clone())
        .with_header(false)
        .with_delimiter(delimiter)
        .with_batch_size(rows)
        .build_decoder();
    let mut batches = Vec::new();
    let mut rest = text;
    // Arrow's decoder stops when a batch is full, before a blank record after it.
    while !rest.is_empty() || batches.is_empty() {
        let read = decoder.decode(rest).unwrap_or_else(|error| panic!("good records as text: {error}"));
        rest = &rest[read..];
        match decoder.flush() {
            Ok(Some(batch)) => batches.push(batch),
            Ok(None) => assert!(read > 0, "the good records are read whole"),
            Err(error) => panic!("good records as text: {error}"),
        }
    }
    let batch =
        arrow::compute::concat_batches(&text_schema, &batches).unwrap_or_else(|error| panic!("concat: {error}"));
    assert_eq!(batch.num_rows(), rows, "the good records as text");
    batch
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    arrow::compute::concat_batches(&schema(), batches).unwrap_or_else(|error| panic!("concat: {error}"))
}

fn check_batches(batches: &[RecordBatch], batch_size: usize) {
    for batch in batches {
        assert_eq!(batch.schema(), schema(), "a batch has exactly the schema");
        assert!(batch.num_rows() > 0 && batch.num_rows() <= batch_size, "{} rows", batch.num_rows());
    }
}

fn decoder(format: RowFormat, batch_size: usize) -> Decoder {
    let options = DecoderOptions { schema: schema(), format, batch_size };
    Decoder::new(options).unwrap_or_else(|error| panic!("decoder: {error}"))
}

fn decode_whole(format: RowFormat, input: &[u8], batch_size: usize) -> Result<Decoded, sluice_types::SluiceError> {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    decoder(format, batch_size).decode(input, 1, &mut out, &mut bad)?;
    Ok((out, bad))
}

fn decode_chunked(
    format: RowFormat,
    input: &[u8],
    capacity: usize,
    batch_size: usize,
) -> Result<Decoded, sluice_types::SluiceError> {
    let mut decoder = decoder(format, batch_size);
    let mut chunker = LineChunker::for_format(input, capacity, format);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    loop {
        match chunker.next_chunk() {
            Ok(Some((chunk, first_line))) => decoder.decode(chunk, first_line, &mut out, &mut bad)?,
            Ok(None) => break,
            Err(error) => panic!("reading from memory: {error}"),
        }
        bad.extend(chunker.take_bad_rows());
    }
    Ok((out, bad))
}

/// A column of every type the CSV decoder's fast path reads, for [`check_fast_path`].
pub fn fast_path_schema() -> SchemaRef {
    let ts = |unit| DataType::Timestamp(unit, None);
    Arc::new(Schema::new(vec![
        Field::new("i8", DataType::Int8, true),
        Field::new("i16", DataType::Int16, true),
        Field::new("i32", DataType::Int32, false),
        Field::new("i64", DataType::Int64, true),
        Field::new("u8", DataType::UInt8, true),
        Field::new("u16", DataType::UInt16, true),
        Field::new("u32", DataType::UInt32, true),
        Field::new("u64", DataType::UInt64, true),
        Field::new("f32", DataType::Float32, true),
        Field::new("f64", DataType::Float64, true),
        Field::new("d", DataType::Decimal128(10, 2), true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("name", DataType::Utf8, false),
        Field::new("s", ts(TimeUnit::Second), true),
        Field::new("ms", ts(TimeUnit::Millisecond), true),
        Field::new("us", ts(TimeUnit::Microsecond), true),
        Field::new("ns", ts(TimeUnit::Nanosecond), true),
        Field::new("utc", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), true),
    ]))
}

/// What a decode gave, with the fast path on or off: the outcome, the rows, the bad
/// rows, the slow chunks.
type DecodedWithFastPath = (Result<(), String>, Vec<RecordBatch>, Vec<BadRow>, u64);

/// `input` decoded by a decoder with the fast path on or off: whole (`capacity` 0) or
/// through a chunker with a `capacity`-byte buffer.
fn decode_with_fast_path(options: &DecoderOptions, fast: bool, input: &[u8], capacity: usize) -> DecodedWithFastPath {
    let mut decoder = match Decoder::new(options.clone()) {
        Ok(decoder) => decoder,
        Err(error) => panic!("decoder: {error}"),
    };
    decoder.set_fast_path(fast);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let result = if capacity == 0 {
        decoder.decode(input, 1, &mut out, &mut bad)
    } else {
        let mut chunker = LineChunker::for_format(input, capacity, options.format);
        loop {
            match chunker.next_chunk() {
                Ok(Some((chunk, first_line))) => {
                    if let Err(error) = decoder.decode(chunk, first_line, &mut out, &mut bad) {
                        break Err(error);
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => panic!("read: {error}"),
            }
            bad.extend(chunker.take_bad_rows());
        }
    };
    (result.map_err(|error| format!("{error:?}")), out, bad, decoder.slow_chunks())
}

/// The [`Decoder`] of `format` and `schema` on `input` (whole with `capacity` 0, else
/// through a chunker with a `capacity`-byte buffer) gives the same batches, bad rows,
/// outcome and slow chunks with its one-pass CSV fast path on and off.
pub fn check_fast_path(schema: &SchemaRef, format: RowFormat, input: &[u8], capacity: usize, batch_size: usize) {
    let options = DecoderOptions { schema: schema.clone(), format, batch_size };
    let slow = decode_with_fast_path(&options, false, input, capacity);
    let fast = decode_with_fast_path(&options, true, input, capacity);
    assert_eq!(fast.0, slow.0, "the outcome");
    assert_eq!(fast.2, slow.2, "the bad rows");
    assert_eq!(fast.1, slow.1, "the batches");
    assert_eq!(fast.3, slow.3, "the slow chunks");
}

/// Any `bytes` as a Debezium event, and split at their first NUL byte into an upsert
/// message's key and value (no NUL: no value, a tombstone): rows or a reason, never a
/// panic; each row a JSON object on one line; the kinds one `+I`, one `-D`, or a `+U`
/// after at most one `-U`; an upsert one `+U` with a value, one `-D` without.
pub fn check_changelog_envelopes(bytes: &[u8]) {
    use sluice_types::RowKind;

    use crate::changelog::{ChangeRow, debezium_json, upsert_json};
    let one_object = |row: &ChangeRow| {
        assert!(!row.row.contains(&b'\n'), "a row is one line");
        let value: serde_json::Value = serde_json::from_slice(&row.row).expect("a row is JSON");
        assert!(value.is_object(), "a row is a JSON object");
    };
    if let Ok(rows) = debezium_json(bytes) {
        rows.iter().for_each(one_object);
        let kinds: Vec<RowKind> = rows.iter().map(|row| row.kind).collect();
        let allowed: [&[RowKind]; 4] = [
            &[RowKind::Insert],
            &[RowKind::Delete],
            &[RowKind::UpdateAfter],
            &[RowKind::UpdateBefore, RowKind::UpdateAfter],
        ];
        assert!(allowed.contains(&kinds.as_slice()), "kinds {kinds:?}");
    }
    let (key, value) = match bytes.iter().position(|b| *b == 0) {
        Some(at) => (&bytes[..at], Some(&bytes[at + 1..])),
        None => (bytes, None),
    };
    if let Ok(row) = upsert_json(Some(key), value) {
        one_object(&row);
        let expected = if value.is_some() { RowKind::UpdateAfter } else { RowKind::Delete };
        assert_eq!(row.kind, expected);
    }
}
