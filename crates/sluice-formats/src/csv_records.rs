//! Where CSV records end: at a line break outside quoted fields (RFC 4180).
//!
//! A quoted field may hold line breaks (LF or CRLF), delimiters and doubled quotes, so
//! a record may span several lines and a line break ends a record only outside quotes.
//! Whether a byte is inside quotes depends on every quote before it since the start of
//! the file: a [`CsvRecordFinder`] carries that state across the buffers fed to it.
//!
//! # Which quotes count
//!
//! Quotes are read exactly as Arrow's CSV decoder (csv-core) reads them, so the records
//! found here are the records it decodes:
//! - a quote opens a quoted field only at the start of a field: at the start of the
//!   input or right after a delimiter, `\n` or `\r`; elsewhere (`5" screen`) it is data;
//! - inside a quoted field, a doubled quote (`""`) is one quote of data, and a single
//!   quote closes the field; what follows up to the next delimiter is unquoted data.
//!
//! For a file that follows RFC 4180 this is plain quote parity. The scan only visits
//! quotes and line breaks (with memchr), so a file without quotes costs one memchr pass.

use std::ops::Range;

/// The state of the scan at the next byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    /// Outside quoted fields: a `\n` ends the record.
    Outside,
    /// Inside a quoted field.
    Inside,
    /// Inside a quoted field right after a quote at this offset: the field is closed
    /// unless the byte at the next offset is another quote (a doubled quote).
    QuoteAt(u64),
}

/// Finds the ends of CSV records in a byte stream fed in pieces, from a record start.
#[derive(Debug, Clone)]
pub struct CsvRecordFinder {
    delimiter: u8,
    quoting: Quoting,
    /// The offset of the next byte fed, counted from where the finder started.
    offset: u64,
    /// The byte before the next one fed (`\n` at the start: a field starts there).
    previous: u8,
}

impl CsvRecordFinder {
    /// A finder positioned at the start of a record (the start of a file, or right
    /// after a record's line break), for fields separated by `delimiter`.
    pub fn new(delimiter: u8) -> CsvRecordFinder {
        CsvRecordFinder { delimiter, quoting: Quoting::Outside, offset: 0, previous: b'\n' }
    }

    /// Feeds a UTF-8 byte order mark at the start of a file. The decoder skips it, so it
    /// is no part of a field: a quote right after it opens a quoted field.
    pub(crate) fn skip_byte_order_mark(&mut self) {
        debug_assert_eq!(self.offset, 0, "a byte order mark is skipped only at the start of a file");
        self.offset += crate::UTF8_BOM.len() as u64;
    }

    /// The bytes fed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the next byte fed would be inside a quoted field.
    pub fn in_quotes(&self) -> bool {
        match self.quoting {
            Quoting::Outside => false,
            Quoting::Inside => true,
            // A quote that ends the input so far closes its field unless a quote follows.
            Quoting::QuoteAt(_) => false,
        }
    }

    /// Feeds `bytes` up to and including the first line break that ends a record, and
    /// returns the index just after it; feeds all of `bytes` and returns `None` when
    /// no record ends in them.
    pub fn find_record_end(&mut self, bytes: &[u8]) -> Option<usize> {
        for index in memchr::memchr2_iter(b'"', b'\n', bytes) {
            let at = self.offset + index as u64;
            if bytes[index] == b'"' {
                self.on_quote(at, self.byte_before(bytes, index));
                continue;
            }
            self.settle(at);
            if self.quoting == Quoting::Outside {
                self.offset += index as u64 + 1;
                self.previous = b'\n';
                return Some(index + 1);
            }
        }
        self.feed_end(bytes);
        None
    }

    /// Feeds all of `bytes`, looking only at quotes: the cheapest way to carry the
    /// state over bytes where no record end is wanted.
    pub fn skip(&mut self, bytes: &[u8]) {
        for index in memchr::memchr_iter(b'"', bytes) {
            self.on_quote(self.offset + index as u64, self.byte_before(bytes, index));
        }
        self.feed_end(bytes);
    }

    /// Feeds `bytes`, which hold no quote, as [`Self::skip`] would without searching them
    /// again: a caller that has just searched them for quotes pays one pass, not two.
    pub(crate) fn skip_unquoted(&mut self, bytes: &[u8]) {
        debug_assert!(memchr::memchr(b'"', bytes).is_none(), "the bytes hold no quote");
        self.feed_end(bytes);
    }

    /// The byte before `bytes[index]`, which may be the last byte of an earlier feed.
    fn byte_before(&self, bytes: &[u8], index: usize) -> u8 {
        match index.checked_sub(1) {
            Some(before) => bytes[before],
            None => self.previous,
        }
    }

    fn feed_end(&mut self, bytes: &[u8]) {
        if let Some(last) = bytes.last() {
            self.previous = *last;
            self.offset += bytes.len() as u64;
        }
    }

    /// Resolves a pending quote before an event at offset `at` that is not a quote
    /// doubling it: the quoted field was closed.
    fn settle(&mut self, at: u64) {
        if let Quoting::QuoteAt(quote) = self.quoting {
            debug_assert!(at > quote, "events are fed in order");
            self.quoting = Quoting::Outside;
        }
    }

    /// A quote at offset `at`, after the byte `before`.
    fn on_quote(&mut self, at: u64, before: u8) {
        self.quoting = match self.quoting {
            Quoting::Inside => Quoting::QuoteAt(at),
            // A doubled quote inside a quoted field.
            Quoting::QuoteAt(quote) if at == quote + 1 => Quoting::Inside,
            Quoting::QuoteAt(_) | Quoting::Outside => {
                if before == self.delimiter || before == b'\n' || before == b'\r' {
                    Quoting::Inside
                } else {
                    Quoting::Outside
                }
            }
        };
    }
}

/// The byte ranges of the CSV records of `bytes`, which starts at a record start; each
/// range holds its line break, and the last one runs to the end of `bytes` when no line
/// break ends it (at the end of a file, or in an unterminated quoted field).
pub(crate) fn csv_record_ranges(bytes: &[u8], delimiter: u8) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut finder = CsvRecordFinder::new(delimiter);
    while start < bytes.len() {
        let end = match finder.find_record_end(&bytes[start..]) {
            Some(length) => start + length,
            None => bytes.len(),
        };
        ranges.push(start..end);
        start = end;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of `text` as strings, fed whole and one byte at a time.
    fn records(text: &str) -> Vec<String> {
        let whole: Vec<String> =
            csv_record_ranges(text.as_bytes(), b',').into_iter().map(|r| text[r].to_string()).collect();
        let mut finder = CsvRecordFinder::new(b',');
        let mut ends = Vec::new();
        for (index, byte) in text.as_bytes().iter().enumerate() {
            if finder.find_record_end(std::slice::from_ref(byte)).is_some() {
                ends.push(index + 1);
            }
        }
        let mut start = 0;
        let mut bytewise = Vec::new();
        for end in ends.into_iter().chain((start < text.len()).then_some(text.len())) {
            if end > start {
                bytewise.push(text[start..end].to_string());
                start = end;
            }
        }
        assert_eq!(whole, bytewise, "the same records whole and byte by byte");
        whole
    }

    #[test]
    fn quoted_line_breaks_do_not_end_records() {
        assert_eq!(records("a,b\nc,d\n"), ["a,b\n", "c,d\n"]);
        assert_eq!(records("1,\"x\ny\",2\n3,z,4"), ["1,\"x\ny\",2\n", "3,z,4"]);
        assert_eq!(records("1,\"x\r\n\r\ny\"\r\n2\r\n"), ["1,\"x\r\n\r\ny\"\r\n", "2\r\n"]);
        assert_eq!(records("\"a\"\"\nb\"\n"), ["\"a\"\"\nb\"\n"]);
        assert_eq!(records("\"\"\n\"\"\"\"\n"), ["\"\"\n", "\"\"\"\"\n"]);
    }

    #[test]
    fn quotes_count_only_at_field_starts_as_csv_core_reads_them() {
        // A quote inside an unquoted field is data.
        assert_eq!(records("1,5\" screen,2\n3,x,4\n"), ["1,5\" screen,2\n", "3,x,4\n"]);
        // Data after a closing quote is unquoted, so its quote is data too.
        assert_eq!(records("\"a\"b\"c\nd\n"), ["\"a\"b\"c\n", "d\n"]);
        // An unterminated quoted field runs to the end.
        assert_eq!(records("1,\"a\n2,b\n"), ["1,\"a\n2,b\n"]);
    }

    #[test]
    fn skipping_carries_the_state() {
        let mut finder = CsvRecordFinder::new(b';');
        finder.skip(b"1;\"open\n");
        assert!(finder.in_quotes());
        finder.skip(b"\"");
        assert!(!finder.in_quotes(), "a quote at the end of a feed closes unless doubled");
        assert_eq!(finder.find_record_end(b"\"still\nquoted\";x\nnext\n"), Some(17));
        assert_eq!(finder.offset(), 9 + 17);
    }

    #[test]
    fn a_custom_delimiter_opens_quotes() {
        let mut finder = CsvRecordFinder::new(b'\t');
        assert_eq!(finder.find_record_end(b"a\t\"b\nc\"\td\ne\n"), Some(10));
        let mut finder = CsvRecordFinder::new(b'\t');
        // After a comma that is not the delimiter, a quote is data.
        assert_eq!(finder.find_record_end(b"a,\"b\nc\"\td\ne\n"), Some(5));
    }
}
