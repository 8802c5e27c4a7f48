//! The line chunker: whole lines or CSV records, line numbers across chunks, over-long
//! lines and records.

use std::io::Read;

use super::*;

/// The chunks of `input` with a `capacity`-byte buffer, as text, with their first lines,
/// and the over-long lines reported after each.
fn chunks(input: &str, capacity: usize) -> (Vec<(String, u64)>, Vec<BadRow>) {
    format_chunks(JSON, input, capacity)
}

/// [`chunks`] of the records of `format`.
fn format_chunks(format: RowFormat, input: &str, capacity: usize) -> (Vec<(String, u64)>, Vec<BadRow>) {
    let mut chunker = LineChunker::for_format(input.as_bytes(), capacity, format);
    let (mut chunks, mut bad) = (Vec::new(), Vec::new());
    loop {
        match chunker.next_chunk() {
            Ok(Some((chunk, line))) => chunks.push((String::from_utf8_lossy(chunk).into_owned(), line)),
            Ok(None) => break,
            Err(error) => panic!("read: {error}"),
        }
        bad.extend(chunker.take_bad_rows());
    }
    assert_eq!(chunker.bytes_read(), input.len() as u64);
    (chunks, bad)
}

fn owned(chunks: &[(&str, u64)]) -> Vec<(String, u64)> {
    chunks.iter().map(|(text, line)| (text.to_string(), *line)).collect()
}

#[test]
fn chunks_hold_whole_lines_with_their_numbers() {
    let (got, bad) = chunks("a\nbb\nccc\n\ndddd\n", 6);
    assert_eq!(got, owned(&[("a\nbb\n", 1), ("ccc\n\n", 3), ("dddd\n", 5)]));
    assert!(bad.is_empty());
    let (got, _) = chunks("a\nbb\nccc\n\ndddd\n", 1 << 20);
    assert_eq!(got, owned(&[("a\nbb\nccc\n\ndddd\n", 1)]));
    let (got, _) = chunks("a\nbb", 4);
    assert_eq!(got, owned(&[("a\n", 1), ("bb", 2)]));
    let (got, _) = chunks("", 4);
    assert!(got.is_empty());
}

#[test]
fn a_line_filling_the_buffer_at_the_end_of_input_fits() {
    let (got, bad) = chunks("ab\ncdef", 4);
    assert_eq!(got, owned(&[("ab\n", 1), ("cdef", 2)]));
    assert!(bad.is_empty());
}

#[test]
fn an_over_long_line_is_a_bad_row_and_reading_goes_on() {
    let (got, bad) = chunks("a\nbbbbbbbbbb\ncc\nddddd\ne", 4);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), [2, 4]);
    assert_eq!(bad[0].reason, "line longer than the 4-byte read buffer");
    assert_eq!(bad[0].text, "bbbb");
    let non_empty: Vec<(String, u64)> = got.into_iter().filter(|(text, _)| !text.is_empty()).collect();
    assert_eq!(non_empty, owned(&[("a\n", 1), ("cc\n", 3), ("e", 5)]));
    // A line of exactly the buffer size plus its line break does not fit.
    let (_, bad) = chunks("abcd\nef\n", 4);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), [1]);
    // An over-long last line without a line break.
    let (got, bad) = chunks("ab\ncdefgh", 4);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), [2]);
    assert_eq!(got.iter().filter(|(text, _)| !text.is_empty()).count(), 1);
}

#[test]
fn over_long_lines_decode_around() {
    let input = format!("1,a,\n2,{},\n3,b,\n4,c,\n", "x".repeat(100));
    let (batches, bad) = decode_chunked(CSV, &small_schema(), input.as_bytes(), 16, 8);
    assert_eq!(
        bad.iter().map(|row| (row.line, row.reason.as_str())).collect::<Vec<_>>(),
        [(2, "record longer than the 16-byte read buffer")]
    );
    let expected = "
        +----+------+----+
        | id | name | ts |
        +----+------+----+
        | 1  | a    |    |
        | 3  | b    |    |
        | 4  | c    |    |
        +----+------+----+";
    assert_eq!(unindent(&table(&batches)), unindent(expected));
}

#[test]
fn csv_chunks_end_only_at_record_ends_regression() {
    let input = "1,\"a\nb\"\n2,c\n3,\"d\r\ne\r\nf\"\r\n4,g\n";
    let (got, bad) = format_chunks(CSV, input, 13);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(got, owned(&[("1,\"a\nb\"\n2,c\n", 1), ("3,\"d\r\ne\r\nf\"\r\n", 4), ("4,g\n", 7)]));
    // Line chunks would cut inside the quoted field.
    let (got, _) = chunks(input, 6);
    assert_eq!(got[0], ("1,\"a\n".to_string(), 1));
}

#[test]
fn an_over_long_csv_record_is_one_bad_row_and_later_lines_keep_their_numbers() {
    let input = "1,a\n2,\"bbbb\nbbbb\nbbbb\nbb\"\n3,c\n4,\"d\nd\"\n";
    let (got, bad) = format_chunks(CSV, input, 10);
    assert_eq!(
        bad.iter().map(|row| (row.line, row.reason.as_str())).collect::<Vec<_>>(),
        [(2, "record longer than the 10-byte read buffer")]
    );
    assert_eq!(bad[0].text, "2,\"bbbb\nbb");
    let non_empty: Vec<(String, u64)> = got.into_iter().filter(|(text, _)| !text.is_empty()).collect();
    assert_eq!(non_empty, owned(&[("1,a\n", 1), ("3,c\n", 6), ("4,\"d\nd\"\n", 7)]));
    // The quoted line break right after the buffer is not the record's end.
    let (got, bad) = format_chunks(CSV, "\"abcdefgh\nx\"\ny\n", 10);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), [1]);
    assert_eq!(got.into_iter().filter(|(text, _)| !text.is_empty()).collect::<Vec<_>>(), owned(&[("y\n", 3)]));
}

/// A reader that hands out at most `step` bytes per read, like a pipe.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn short_reads_still_give_whole_lines() {
    let input = "1,a,\n22,bb,\n333,ccc,\n";
    let mut chunker = LineChunker::with_capacity(Trickle { data: input.as_bytes(), step: 3 }, 64);
    let mut seen = String::new();
    let mut lines = Vec::new();
    while let Ok(Some((chunk, line))) = chunker.next_chunk() {
        let text = String::from_utf8_lossy(chunk).into_owned();
        assert!(text.ends_with('\n'), "a chunk ends at a line break: {text:?}");
        seen.push_str(&text);
        lines.push(line);
    }
    assert_eq!(seen, input);
    assert_eq!(lines, [1, 2, 3]);
    assert_eq!(chunker.next_line(), 4);
}
