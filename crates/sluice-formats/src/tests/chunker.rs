//! The line chunker: whole lines, line numbers across chunks, over-long lines.

use std::io::Read;

use super::*;

/// The chunks of `input` with a `capacity`-byte buffer, as text, with their first lines,
/// and the over-long lines reported after each.
fn chunks(input: &str, capacity: usize) -> (Vec<(String, u64)>, Vec<BadRow>) {
    let mut chunker = LineChunker::with_capacity(input.as_bytes(), capacity);
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
        [(2, "line longer than the 16-byte read buffer")]
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
