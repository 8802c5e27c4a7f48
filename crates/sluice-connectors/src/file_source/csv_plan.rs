//! Planning a CSV file source: the header of each file, and lane ranges that start at
//! record starts.
//!
//! # Headers
//!
//! The first record of every file is read at planning time ([`check_first_records`]).
//! With `header = true`, it is checked against the schema ([`check_csv_header`]): a
//! file whose header names other columns, or whose first line is a data row (which
//! would be skipped as the header), fails planning with `source.csv_header`, naming the
//! file and the column. With `header = false` (the default), a first record that is
//! exactly the column names ([`check_csv_first_row`]) fails planning with the same
//! code: the user forgot `header = true`, and the line would be read as a bad row (or,
//! with VARCHAR columns, as data). An empty file passes: it has no row to lose.
//!
//! # Record starts
//!
//! A CSV record may span several lines (a quoted field may hold line breaks), so the
//! first line break after an arbitrary byte is not necessarily a record end: it may be
//! inside a quoted field. Whether a byte is inside quotes depends on every quote before
//! it since the start of the file. So for each CSV file split into more than one lane,
//! [`align_to_record_starts`] reads the file from its start up to its last split point
//! with a [`CsvRecordFinder`] (which visits only the quotes, with memchr) and moves each
//! split point to the first record start at or after it. A lane then reads exactly its
//! range `[start, end)`: every record is read by exactly one lane. A file read by one
//! lane is not scanned, and JSON lines need no scan (a JSON string cannot hold a raw
//! line break).
//!
//! Cost, measured on two 1.0 GB CSV files in the page cache (11.4 M records of 88
//! bytes with one quoted field each; 12.2 M records of 82 bytes without quotes), timing
//! `FileSource::new` with 2 and 16 threads:
//!
//! ```text
//!                                      2 lanes   16 lanes (scan to 15/16 of the file)
//! debug build (cargo test), quoted     3.8 s     7.2 s
//! debug build (cargo test), no quotes  0.7 s     1.4 s
//! optimised, quoted                    0.15 s    0.29 s
//! optimised, no quotes                 0.07 s    0.12 s
//! ```
//!
//! The optimised rows time the same finder, driven by an equivalent read loop, built with
//! `--release` alone; a debug build runs memchr unoptimised. The scan is paid once per
//! run, at planning, only for CSV files large enough to be split.
//!
//! A UTF-8 byte order mark at byte 0 is not part of the first record: the scan starts
//! after it, as the lane reading byte 0 does.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow::datatypes::Schema;
use sluice_formats::{CsvRecordFinder, check_csv_first_row, check_csv_header};
use sluice_types::SluiceError;

use super::{LaneRange, read_error};

/// The buffer used to scan a file for record starts.
const SCAN_BYTES: usize = 1 << 20;

/// The UTF-8 byte order mark.
pub(crate) const BOM: &[u8] = sluice_formats::UTF8_BOM;

/// Checks the first record of each of `files`: the header against `schema` when
/// `header`, else that it is not the column names; reads at most `limit_bytes` of each.
/// A streaming file (a pipe) is skipped: reading ahead would take its data; its first
/// record is checked when its lane reads it (by the decoder).
pub(crate) fn check_first_records(
    files: &[PathBuf],
    streaming: &[bool],
    schema: &Schema,
    header: bool,
    delimiter: u8,
    limit_bytes: usize,
) -> Result<(), SluiceError> {
    for (path, _) in files.iter().zip(streaming).filter(|(_, streaming)| !**streaming) {
        let record = first_record(path, delimiter, limit_bytes).map_err(|error| read_error(path, &error))?;
        match record {
            Some(record) if record.is_empty() => Ok(()),
            Some(record) if header => check_csv_header(&record, schema, delimiter),
            Some(record) => check_csv_first_row(&record, schema, delimiter),
            // A record this long is data, not the names of the columns.
            None if !header => Ok(()),
            None => Err(SluiceError::user(
                "source.csv_header",
                format!("line 1 is longer than {limit_bytes} bytes, so it is no header"),
            )
            .with_fix("set header = false if the file has no header line")),
        }
        .map_err(|error| error.context(path.display()))?;
    }
    Ok(())
}

/// The first record of the file at `path` (after a byte order mark), empty for an
/// empty file; `None` when it is longer than `limit_bytes`.
fn first_record(path: &Path, delimiter: u8, limit_bytes: usize) -> io::Result<Option<Vec<u8>>> {
    let mut file = File::open(path)?;
    let skip = bom_length(&mut file)?;
    file.seek(SeekFrom::Start(skip))?;
    let mut finder = CsvRecordFinder::new(delimiter);
    let mut record = Vec::new();
    let mut piece = vec![0u8; limit_bytes.clamp(1, 64 << 10)];
    while record.len() < limit_bytes {
        let wanted = piece.len().min(limit_bytes - record.len());
        let read = match file.read(&mut piece[..wanted]) {
            Ok(0) => return Ok(Some(record)),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if let Some(length) = finder.find_record_end(&piece[..read]) {
            record.extend_from_slice(&piece[..length]);
            return Ok(Some(record));
        }
        record.extend_from_slice(&piece[..read]);
    }
    Ok(None)
}

/// Moves every split point of a file read by several lanes to the first record start
/// at or after it. `ranges` are the contiguous ranges of [`super::split`], grouped by
/// file in file order; a lane range may become empty (a record longer than a piece).
pub(crate) fn align_to_record_starts(
    files: &[PathBuf],
    mut ranges: Vec<LaneRange>,
    delimiter: u8,
) -> Result<Vec<LaneRange>, SluiceError> {
    let mut first = 0;
    while first < ranges.len() {
        let file = ranges[first].file;
        let count = ranges[first..].iter().take_while(|range| range.file == file).count();
        if count > 1 {
            let pieces = &mut ranges[first..first + count];
            let points: Vec<u64> = pieces[1..].iter().map(|range| range.start).collect();
            let path = &files[file];
            let starts = record_starts(path, &points, delimiter).map_err(|error| read_error(path, &error))?;
            for (index, start) in starts.into_iter().enumerate() {
                pieces[index].end = start;
                pieces[index + 1].start = start;
            }
        }
        first += count;
    }
    Ok(ranges)
}

/// For each of the ascending split points `points` (all above 0), the first record
/// start at or after it (the file's size when no record starts there).
fn record_starts(path: &Path, points: &[u64], delimiter: u8) -> io::Result<Vec<u64>> {
    let mut scan = Scan::open(path, delimiter)?;
    let first_record = scan.position();
    let mut starts = Vec::with_capacity(points.len());
    for &point in points {
        debug_assert!(point > 0, "a split point is inside the file");
        let start = if scan.position() >= point {
            // The scan stands at a record start (the first, or one found for an earlier
            // point) and none starts between `point` and it.
            scan.position()
        } else {
            // A record start at or after `point` follows a record end at or after
            // `point - 1`.
            scan.skip_to(point - 1)?;
            scan.next_record_start()?
        };
        // The first record, after a byte order mark, is read by the lane from byte 0.
        starts.push(if start == first_record { 0 } else { start });
    }
    Ok(starts)
}

/// A sequential read of a file that feeds every byte to a [`CsvRecordFinder`].
struct Scan {
    file: File,
    finder: CsvRecordFinder,
    /// `buf[at..filled]` is read and not yet fed.
    buf: Vec<u8>,
    at: usize,
    filled: usize,
    /// The file offset of `buf[0]`.
    buf_offset: u64,
}

impl Scan {
    /// Opens `path` at its first record: after a byte order mark, if any.
    fn open(path: &Path, delimiter: u8) -> io::Result<Scan> {
        let mut file = File::open(path)?;
        let skip = bom_length(&mut file)?;
        file.seek(SeekFrom::Start(skip))?;
        Ok(Scan {
            file,
            finder: CsvRecordFinder::new(delimiter),
            buf: vec![0; SCAN_BYTES],
            at: 0,
            filled: 0,
            buf_offset: skip,
        })
    }

    /// The file offset of the next byte to feed.
    fn position(&self) -> u64 {
        self.buf_offset + self.at as u64
    }

    /// Refills the buffer once everything in it is fed; `false` at the end of the file.
    fn refill(&mut self) -> io::Result<bool> {
        if self.at < self.filled {
            return Ok(true);
        }
        self.buf_offset += self.filled as u64;
        self.at = 0;
        self.filled = 0;
        loop {
            match self.file.read(&mut self.buf) {
                Ok(read) => {
                    self.filled = read;
                    return Ok(read > 0);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Feeds the bytes up to file offset `target` (or the end of the file).
    fn skip_to(&mut self, target: u64) -> io::Result<()> {
        while self.position() < target && self.refill()? {
            let wanted = usize::try_from(target - self.position()).unwrap_or(usize::MAX);
            let end = self.filled.min(self.at.saturating_add(wanted));
            self.finder.skip(&self.buf[self.at..end]);
            self.at = end;
        }
        Ok(())
    }

    /// Feeds bytes through the next record end and returns the offset after it (the
    /// next record start), or the file's size when no record ends before it.
    fn next_record_start(&mut self) -> io::Result<u64> {
        while self.refill()? {
            match self.finder.find_record_end(&self.buf[self.at..self.filled]) {
                Some(length) => {
                    self.at += length;
                    return Ok(self.position());
                }
                None => self.at = self.filled,
            }
        }
        Ok(self.position())
    }
}

/// The length of the byte order mark at the start of `file` (0 or 3); reads from the
/// current position, which must be the start.
pub(crate) fn bom_length(file: &mut impl Read) -> io::Result<u64> {
    let mut head = [0u8; 3];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(if head[..filled] == *BOM { BOM.len() as u64 } else { 0 })
}
