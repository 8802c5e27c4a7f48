//! Reading a file in chunks of whole records, with a bounded buffer.
//!
//! A [`LineChunker`] reads into one fixed buffer and hands out the longest run of whole
//! records it holds, with the line number of the first one, ready for
//! [`Decoder::decode`](crate::Decoder::decode). A record is a line, or for CSV (see
//! [`LineChunker::for_format`]) a record as RFC 4180 defines it, which may span several
//! lines when a quoted field holds line breaks (see [`crate::csv_records`]). A record
//! longer than the buffer is skipped and reported as a [`BadRow`] numbered by its first
//! line: memory stays bounded whatever the input.
//!
//! Line numbers count every line break of the input, inside quotes or not, so they are
//! the file's line numbers.
//!
//! The decoder skips a UTF-8 byte order mark at the start of line 1, so a CSV chunker
//! reads the input's first record from after such a mark: a quote right after it opens
//! a quoted field, whose line breaks do not end the record.

use std::io::{self, Read};

use crate::csv_records::CsvRecordFinder;
use crate::decode::{BadRow, RowFormat, count_line_breaks, row_text};
use crate::header::UTF8_BOM;

/// The default buffer size: 4 MiB.
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

/// New bytes are searched for record ends and counted for line breaks a block at a
/// time, so the count reads a block the search has just brought into the cache.
const SCAN_BLOCK_BYTES: usize = 64 << 10;

/// Where the chunker may cut: after any line break, or only after one that ends a CSV
/// record.
#[derive(Debug, Clone)]
enum Cuts {
    Lines,
    CsvRecords(CsvRecordFinder),
}

/// Cuts a byte stream into chunks of whole records, tracking line numbers.
///
/// ```text
/// while let Some((chunk, first_line)) = chunker.next_chunk()? {
///     decoder.decode(chunk, first_line, &mut batches, &mut bad)?;
///     bad.extend(chunker.take_bad_rows());
/// }
/// ```
pub struct LineChunker<R: Read> {
    reader: R,
    /// The buffer; its length is the bound and never changes.
    buf: Vec<u8>,
    /// `buf[start..end]` is read and not yet handed out: a partial record, or whole
    /// records left after an over-long record.
    start: usize,
    end: usize,
    cuts: Cuts,
    /// `buf[..scanned]` has been searched for record ends (and fed to the CSV finder).
    scanned: usize,
    /// The line breaks in `buf[start..scanned]`.
    scanned_lines: u64,
    /// The bytes searched at a time ([`SCAN_BLOCK_BYTES`]).
    scan_block: usize,
    /// CSV: whether a block without a quote is searched for its last line break alone
    /// rather than fed to the finder line by line (always, but in the tests comparing
    /// the two).
    quote_free_search: bool,
    /// Just after the last record end found in `buf[start..scanned]`.
    last_end: Option<usize>,
    /// The number of the line starting at `buf[start]`.
    line: u64,
    /// CSV: whether a byte order mark at the start of the input is still to be looked
    /// for (see the module doc).
    mark_pending: bool,
    /// The bytes of such a mark seen at the start of the input while a buffer shorter
    /// than a mark was skipped as an over-long record.
    mark_seen: usize,
    bytes_read: u64,
    eof: bool,
    bad: Vec<BadRow>,
}

impl<R: Read> std::fmt::Debug for LineChunker<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineChunker")
            .field("capacity", &self.buf.len())
            .field("cuts", &self.cuts)
            .field("line", &self.line)
            .field("bytes_read", &self.bytes_read)
            .finish_non_exhaustive()
    }
}

impl<R: Read> LineChunker<R> {
    /// A chunker of lines with a [`DEFAULT_CHUNK_BYTES`] buffer.
    pub fn new(reader: R) -> Self {
        Self::with_capacity(reader, DEFAULT_CHUNK_BYTES)
    }

    /// A chunker of lines whose buffer holds `capacity` bytes: no line longer than that
    /// (with its line break) is decoded.
    pub fn with_capacity(reader: R, capacity: usize) -> Self {
        assert!(capacity > 0, "a line chunker needs a buffer of at least one byte");
        LineChunker {
            reader,
            buf: vec![0; capacity],
            start: 0,
            end: 0,
            cuts: Cuts::Lines,
            scanned: 0,
            scanned_lines: 0,
            scan_block: SCAN_BLOCK_BYTES,
            quote_free_search: true,
            last_end: None,
            line: 1,
            mark_pending: false,
            mark_seen: 0,
            bytes_read: 0,
            eof: false,
            bad: Vec::new(),
        }
    }

    /// A chunker of the records of `format`, reading from the start of a record (of a
    /// file, or a record start found by [`CsvRecordFinder`]): lines for JSON, RFC 4180
    /// records for CSV.
    pub fn for_format(reader: R, capacity: usize, format: RowFormat) -> Self {
        let mut chunker = Self::with_capacity(reader, capacity);
        if let RowFormat::Csv { delimiter, .. } = format {
            chunker.cuts = Cuts::CsvRecords(CsvRecordFinder::new(delimiter));
            chunker.mark_pending = true;
        }
        chunker
    }

    /// The next chunk of whole records and the number of its first line; `None` at the
    /// end.
    ///
    /// The last record of the input may lack its line break. A chunk may be empty:
    /// after an over-long record was skipped, [`Self::take_bad_rows`] then yields it
    /// before any later record is handed out.
    pub fn next_chunk(&mut self) -> io::Result<Option<(&[u8], u64)>> {
        debug_assert!(self.last_end.is_none_or(|end| end <= self.start), "the last chunk ended at the last cut");
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.scanned -= self.start;
        self.start = 0;
        self.last_end = None;
        self.fill()?;
        if self.end == 0 {
            return Ok(None);
        }
        self.scan();
        let first_line = self.line;
        let length = match self.last_end {
            Some(length) => length,
            None if self.eof => self.end,
            None => {
                // The buffer is full with no record end: unless the input ends right
                // here, the record is longer than the buffer.
                let mut probe = [0u8; 1];
                let read = read_retrying(&mut self.reader, &mut probe)?;
                self.bytes_read += read as u64;
                if read == 0 {
                    self.eof = true;
                    // A buffer holding the start of a byte order mark was not scanned.
                    self.scan();
                    self.end
                } else {
                    self.skip_long_record(probe[0])?;
                    return Ok(Some((&self.buf[..0], self.line)));
                }
            }
        };
        // The bytes after the chunk are scanned already: a part of one record.
        let left = count_line_breaks(&self.buf[length..self.scanned]) as u64;
        let chunk = &self.buf[..length];
        self.line += self.scanned_lines - left + u64::from(!chunk.ends_with(b"\n"));
        self.scanned_lines = left;
        self.start = length;
        Ok(Some((chunk, first_line)))
    }

    /// Searches `block_bytes` at a time, and CSV blocks without a quote through the
    /// finder too unless `quote_free_search`: the same chunks either way, which the
    /// property tests check.
    #[cfg(any(test, feature = "fuzzing"))]
    #[doc(hidden)]
    pub fn set_scan(&mut self, block_bytes: usize, quote_free_search: bool) {
        self.scan_block = block_bytes.max(1);
        self.quote_free_search = quote_free_search;
    }

    /// The records skipped for being longer than the buffer, since the last call.
    pub fn take_bad_rows(&mut self) -> Vec<BadRow> {
        std::mem::take(&mut self.bad)
    }

    /// The bytes read from the input so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The bytes handed out in chunks or skipped as over-long records: the offset, from
    /// the start of the input, of the next byte a chunk will begin with.
    pub fn consumed(&self) -> u64 {
        self.bytes_read - (self.end - self.start) as u64
    }

    /// The number of the next line to be handed out (1 before the first chunk).
    pub fn next_line(&self) -> u64 {
        self.line
    }

    /// Reads until the buffer holds a record end, is full, or the input ends.
    fn fill(&mut self) -> io::Result<()> {
        while !self.eof && self.end < self.buf.len() {
            self.scan();
            if self.last_end.is_some() {
                break;
            }
            let read = self.read_at(self.end)?;
            self.end += read;
        }
        Ok(())
    }

    /// Searches `buf[scanned..end]` for record ends, updating `last_end`, and counts its
    /// line breaks.
    fn scan(&mut self) {
        if self.mark_pending && !self.skip_byte_order_mark() {
            return;
        }
        while self.scanned < self.end {
            let from = self.scanned;
            let to = self.end.min(from.saturating_add(self.scan_block));
            let bytes = &self.buf[from..to];
            match &mut self.cuts {
                Cuts::Lines => {
                    if let Some(index) = memchr::memrchr(b'\n', bytes) {
                        self.last_end = Some(from + index + 1);
                    }
                }
                // Without a quote, every line break outside a quoted field ends a record.
                Cuts::CsvRecords(finder)
                    if self.quote_free_search && !finder.in_quotes() && memchr::memchr(b'"', bytes).is_none() =>
                {
                    if let Some(index) = memchr::memrchr(b'\n', bytes) {
                        self.last_end = Some(from + index + 1);
                    }
                    finder.skip_unquoted(bytes);
                }
                Cuts::CsvRecords(finder) => {
                    let mut at = 0;
                    while let Some(length) = finder.find_record_end(&bytes[at..]) {
                        at += length;
                        self.last_end = Some(from + at);
                    }
                }
            }
            self.scanned_lines += count_line_breaks(bytes) as u64;
            self.scanned = to;
        }
    }

    /// CSV, before the first scan: feeds a byte order mark at the start of the input to
    /// the finder as one (see the module doc). Returns `false` while the buffer holds
    /// a part of one and may hold more.
    fn skip_byte_order_mark(&mut self) -> bool {
        debug_assert!(self.scanned == 0 && self.start == 0, "the buffer starts at the start of the input");
        let head = &self.buf[..self.end];
        if head.len() < UTF8_BOM.len() && UTF8_BOM.starts_with(head) && !self.eof {
            // The buffer may grow, or is full and so skipped as an over-long record,
            // which goes on looking for the rest of the mark.
            return false;
        }
        self.mark_pending = false;
        if let (true, Cuts::CsvRecords(finder)) = (head.starts_with(UTF8_BOM), &mut self.cuts) {
            finder.skip_byte_order_mark();
            self.scanned = UTF8_BOM.len();
        }
        true
    }

    /// Feeds `bytes`, which follow all bytes scanned so far, up to the first record end;
    /// returns the index just after it. While the input's first bytes are the start of
    /// a byte order mark, the bytes that go on with it complete the mark instead.
    fn find_end(&mut self, bytes: &[u8]) -> Option<usize> {
        let Cuts::CsvRecords(finder) = &mut self.cuts else {
            return memchr::memchr(b'\n', bytes).map(|index| index + 1);
        };
        let mut skipped = 0;
        if self.mark_pending {
            while skipped < bytes.len() && self.mark_seen < UTF8_BOM.len() && bytes[skipped] == UTF8_BOM[self.mark_seen]
            {
                skipped += 1;
                self.mark_seen += 1;
            }
            if self.mark_seen == UTF8_BOM.len() {
                finder.skip_byte_order_mark();
            } else if skipped < bytes.len() {
                // No mark after all: what looked like one is a part of the first field.
                let ended = finder.find_record_end(&UTF8_BOM[..self.mark_seen]);
                debug_assert!(ended.is_none(), "a part of a byte order mark ends no record");
            } else {
                return None;
            }
            self.mark_pending = false;
        }
        finder.find_record_end(&bytes[skipped..]).map(|length| skipped + length)
    }

    /// One read into `buf[at..]`; sets `eof` on a read of zero bytes.
    fn read_at(&mut self, at: usize) -> io::Result<usize> {
        let read = read_retrying(&mut self.reader, &mut self.buf[at..])?;
        self.eof = read == 0;
        self.bytes_read += read as u64;
        Ok(read)
    }

    /// Reports the record filling the whole (scanned) buffer as bad and discards it up
    /// to its end, `probe` being the byte read after the buffer; keeps what follows.
    fn skip_long_record(&mut self, probe: u8) -> io::Result<()> {
        let unit = if matches!(self.cuts, Cuts::Lines) { "line" } else { "record" };
        let reason = format!("{unit} longer than the {}-byte read buffer", self.buf.len());
        self.bad.push(BadRow { line: self.line, reason, text: row_text(&self.buf) });
        let mut lines = count_line_breaks(&self.buf) as u64;
        if self.mark_pending {
            self.mark_seen = self.buf.len();
        }
        self.start = 0;
        self.end = 0;
        self.scanned = 0;
        self.scanned_lines = 0;
        let ended = self.find_end(&[probe]).is_some();
        lines += u64::from(probe == b'\n');
        if !ended {
            lines += self.discard_to_record_end()?;
        }
        // The next record starts on the line after the last line break skipped.
        self.line += lines.max(1);
        Ok(())
    }

    /// Reads and discards up to the end of the record in progress, keeping what follows
    /// it in the buffer; returns the line breaks discarded.
    fn discard_to_record_end(&mut self) -> io::Result<u64> {
        let mut lines = 0;
        loop {
            let read = self.read_at(0)?;
            if read == 0 {
                return Ok(lines);
            }
            let buf = std::mem::take(&mut self.buf);
            let found = self.find_end(&buf[..read]);
            self.buf = buf;
            if let Some(length) = found {
                self.start = length;
                self.end = read;
                self.scanned = length;
                self.scanned_lines = 0;
                return Ok(lines + count_line_breaks(&self.buf[..length]) as u64);
            }
            lines += count_line_breaks(&self.buf[..read]) as u64;
        }
    }
}

/// One `read`, retried when interrupted.
fn read_retrying(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            result => return result,
        }
    }
}
