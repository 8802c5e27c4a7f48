//! Reading a file in chunks of whole lines, with a bounded buffer.
//!
//! A [`LineChunker`] reads into one fixed buffer and hands out the longest run of whole
//! lines it holds, with the number of the first one, ready for
//! [`Decoder::decode`](crate::Decoder::decode). A line longer than the buffer is skipped
//! and reported as a [`BadRow`]: memory stays bounded whatever the input.

use std::io::{self, Read};

use crate::decode::{BadRow, count_line_breaks, row_text};

/// The default buffer size: 4 MiB.
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

/// Cuts a byte stream into chunks of whole lines, tracking line numbers.
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
    /// `buf[start..end]` is read and not yet handed out: a partial line, or whole lines
    /// left after an over-long line.
    start: usize,
    end: usize,
    /// The number of the line starting at `buf[start]`.
    line: u64,
    bytes_read: u64,
    eof: bool,
    bad: Vec<BadRow>,
}

impl<R: Read> std::fmt::Debug for LineChunker<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineChunker")
            .field("capacity", &self.buf.len())
            .field("line", &self.line)
            .field("bytes_read", &self.bytes_read)
            .finish_non_exhaustive()
    }
}

impl<R: Read> LineChunker<R> {
    /// A chunker with a [`DEFAULT_CHUNK_BYTES`] buffer.
    pub fn new(reader: R) -> Self {
        Self::with_capacity(reader, DEFAULT_CHUNK_BYTES)
    }

    /// A chunker whose buffer holds `capacity` bytes: no line longer than that (with its
    /// line break) is decoded.
    pub fn with_capacity(reader: R, capacity: usize) -> Self {
        assert!(capacity > 0, "a line chunker needs a buffer of at least one byte");
        LineChunker {
            reader,
            buf: vec![0; capacity],
            start: 0,
            end: 0,
            line: 1,
            bytes_read: 0,
            eof: false,
            bad: Vec::new(),
        }
    }

    /// The next chunk of whole lines and the number of its first line; `None` at the end.
    ///
    /// The last line of the input may lack its line break. A chunk may be empty: after
    /// an over-long line was skipped, [`Self::take_bad_rows`] then yields it before any
    /// later line is handed out.
    pub fn next_chunk(&mut self) -> io::Result<Option<(&[u8], u64)>> {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        self.fill()?;
        if self.end == 0 {
            return Ok(None);
        }
        let first_line = self.line;
        let filled = &self.buf[..self.end];
        let length = match filled.iter().rposition(|b| *b == b'\n') {
            Some(last_break) => last_break + 1,
            None if self.eof => self.end,
            None => {
                // The buffer is full with no line break: unless the input ends right
                // here, the line is longer than the buffer.
                let mut probe = [0u8; 1];
                let read = read_retrying(&mut self.reader, &mut probe)?;
                self.bytes_read += read as u64;
                if read == 0 {
                    self.eof = true;
                    self.end
                } else {
                    self.skip_long_line(probe[0] == b'\n')?;
                    return Ok(Some((&self.buf[..0], self.line)));
                }
            }
        };
        let chunk = &self.buf[..length];
        let lines = count_line_breaks(chunk) + usize::from(!chunk.ends_with(b"\n"));
        self.line += lines as u64;
        self.start = length;
        Ok(Some((chunk, first_line)))
    }

    /// The lines skipped for being longer than the buffer, since the last call.
    pub fn take_bad_rows(&mut self) -> Vec<BadRow> {
        std::mem::take(&mut self.bad)
    }

    /// The bytes read from the input so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The bytes handed out in chunks or skipped as over-long lines: the offset, from
    /// the start of the input, of the next byte a chunk will begin with.
    pub fn consumed(&self) -> u64 {
        self.bytes_read - (self.end - self.start) as u64
    }

    /// The number of the next line to be handed out (1 before the first chunk).
    pub fn next_line(&self) -> u64 {
        self.line
    }

    /// Reads until the buffer holds a line break, is full, or the input ends.
    fn fill(&mut self) -> io::Result<()> {
        let mut scanned = 0;
        while !self.eof && self.end < self.buf.len() {
            if self.buf[scanned..self.end].contains(&b'\n') {
                break;
            }
            scanned = self.end;
            let read = self.read_at(self.end)?;
            self.end += read;
        }
        Ok(())
    }

    /// One read into `buf[at..]`; sets `eof` on a read of zero bytes.
    fn read_at(&mut self, at: usize) -> io::Result<usize> {
        let read = read_retrying(&mut self.reader, &mut self.buf[at..])?;
        self.eof = read == 0;
        self.bytes_read += read as u64;
        Ok(read)
    }

    /// Reports the line filling the whole buffer as bad and discards it up to its line
    /// break (already read when `ended`), keeping what follows.
    fn skip_long_line(&mut self, ended: bool) -> io::Result<()> {
        let reason = format!("line longer than the {}-byte read buffer", self.buf.len());
        self.bad.push(BadRow { line: self.line, reason, text: row_text(&self.buf) });
        self.line += 1;
        self.start = 0;
        self.end = 0;
        if ended {
            return Ok(());
        }
        loop {
            let read = self.read_at(0)?;
            if read == 0 {
                return Ok(());
            }
            if let Some(line_break) = self.buf[..read].iter().position(|b| *b == b'\n') {
                self.start = line_break + 1;
                self.end = read;
                return Ok(());
            }
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
