//! The records of a chunk: lines for JSON lines, RFC 4180 records for CSV.
//!
//! A chunk always starts at a record start and ends at a record end (or at the end of
//! the file). Blank records (only whitespace: `\n`, `\r\n`, `  \n`) are skipped by the
//! decoder and are not bad rows. A record's number is the file line number of its first
//! line, counting every line break before it, inside quotes or not.

use crate::csv_records::{CsvRecordFinder, csv_record_ranges};
use crate::decode::RowFormat;

/// A non-blank record of a chunk: its byte range (with its line break) and the number
/// of its first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub start: usize,
    pub end: usize,
    pub number: u64,
}

/// The CSV delimiter of `format` when records may span lines: a CSV chunk holding a
/// quote. Without a quote no field is quoted, and records are lines.
fn multi_line_delimiter(chunk: &[u8], format: RowFormat) -> Option<u8> {
    match format {
        RowFormat::Csv { delimiter, .. } if memchr::memchr(b'"', chunk).is_some() => Some(delimiter),
        _ => None,
    }
}

/// A record with only whitespace, which is skipped.
pub(crate) fn is_blank(record: &[u8]) -> bool {
    record.iter().all(u8::is_ascii_whitespace)
}

/// The number of non-blank records of `chunk`: the rows it holds when none is bad.
pub(crate) fn count_records(chunk: &[u8], format: RowFormat) -> usize {
    if let Some(delimiter) = multi_line_delimiter(chunk, format) {
        let mut finder = CsvRecordFinder::new(delimiter);
        let (mut start, mut records) = (0, 0);
        while start < chunk.len() {
            let end = finder.find_record_end(&chunk[start..]).map_or(chunk.len(), |length| start + length);
            records += usize::from(!is_blank(&chunk[start..end]));
            start = end;
        }
        return records;
    }
    let mut start = 0;
    let mut records = 0;
    for line_break in memchr::memchr_iter(b'\n', chunk) {
        records += usize::from(!is_blank_line(&chunk[start..line_break]));
        start = line_break + 1;
    }
    records + usize::from(!is_blank_line(&chunk[start..]))
}

/// [`is_blank`], quick for the common line that starts with data.
fn is_blank_line(line: &[u8]) -> bool {
    match line.first() {
        None => true,
        Some(first) if !first.is_ascii_whitespace() => false,
        Some(_) => is_blank(line),
    }
}

/// The non-blank records of `chunk`, whose first line is line `first_line`.
pub(crate) fn split_records(chunk: &[u8], first_line: u64, format: RowFormat) -> Vec<Record> {
    let ranges: Vec<std::ops::Range<usize>> = match multi_line_delimiter(chunk, format) {
        Some(delimiter) => csv_record_ranges(chunk, delimiter),
        None => {
            let mut start = 0;
            chunk
                .split_inclusive(|b| *b == b'\n')
                .map(|line| {
                    start += line.len();
                    start - line.len()..start
                })
                .collect()
        }
    };
    let mut records = Vec::with_capacity(ranges.len());
    let mut number = first_line;
    for range in ranges {
        let bytes = &chunk[range.clone()];
        if !is_blank(bytes) {
            records.push(Record { start: range.start, end: range.end, number });
        }
        number += crate::count_line_breaks(bytes) as u64;
    }
    records
}

/// The length of the first record of `chunk` (with its line break), and the number of
/// line breaks in it.
pub(crate) fn first_record(chunk: &[u8], format: RowFormat) -> (usize, u64) {
    let length = match format {
        RowFormat::Csv { delimiter, .. } => CsvRecordFinder::new(delimiter).find_record_end(chunk),
        RowFormat::Json => memchr::memchr(b'\n', chunk).map(|index| index + 1),
    }
    .unwrap_or(chunk.len());
    (length, crate::count_line_breaks(&chunk[..length]) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: RowFormat = RowFormat::Csv { header: false, delimiter: b',' };

    fn numbered(chunk: &str, format: RowFormat) -> Vec<(&str, u64)> {
        split_records(chunk.as_bytes(), 7, format).iter().map(|r| (&chunk[r.start..r.end], r.number)).collect()
    }

    #[test]
    fn records_are_numbered_by_their_first_line_and_blank_ones_dropped() {
        assert_eq!(numbered("a\n\n  \nbb\r\n", RowFormat::Json), [("a\n", 7), ("bb\r\n", 10)]);
        let chunk = "1,\"x\n\ny\"\n\n2,\"\"\"\"\n3,\"z\r\n\"";
        assert_eq!(numbered(chunk, CSV), [("1,\"x\n\ny\"\n", 7), ("2,\"\"\"\"\n", 11), ("3,\"z\r\n\"", 12)]);
        // Without quotes, CSV records are lines.
        assert_eq!(numbered("1,a\n\n2,b", CSV), [("1,a\n", 7), ("2,b", 9)]);
    }

    #[test]
    fn records_are_counted_without_blank_ones() {
        assert_eq!(count_records(b"", RowFormat::Json), 0);
        assert_eq!(count_records(b"a\n", RowFormat::Json), 1);
        assert_eq!(count_records(b"\na\n\r\n \t\nb", RowFormat::Json), 2);
        assert_eq!(count_records(b"1,\"a\n\n\"\n\n2,b\n", CSV), 2);
        assert_eq!(count_records(b"1,\"a\nb\n", CSV), 1, "an unterminated quote runs to the end");
    }

    #[test]
    fn the_first_record_may_span_lines() {
        assert_eq!(first_record(b"a,\"b\nc\"\nd\n", CSV), (8, 2));
        assert_eq!(first_record(b"a,\"b\nc\"\nd\n", RowFormat::Json), (5, 1));
        assert_eq!(first_record(b"id,name", CSV), (7, 0));
    }
}
