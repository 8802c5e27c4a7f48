//! One lane of a file source: the lines that start inside one byte range of one file.
//!
//! The byte-range rule (see the [parent module](super)): a lane whose range starts at
//! `start > 0` seeks to `start - 1` and skips through the first line break (so a line
//! starting exactly at `start` is kept, and a line that began before it is left to the
//! previous lane); it then reads up to `end` and on through the next line break, to
//! finish the last line that started before `end`.
//!
//! Line numbers: the chunker numbers a lane's lines from 1. A lane starting at byte 0
//! uses those numbers as they are. A lane starting mid-file hands the decoder its
//! numbers plus one (so no mid-file line is ever taken for the CSV header, which is
//! line 1), and turns them into file line numbers only when it reports a bad row, by
//! counting the line breaks before its first line once.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use arrow::record_batch::RecordBatch;
use sluice_config::OnError;
use sluice_formats::{BadRow, Decoder, DecoderOptions, LineChunker};
use sluice_runtime::metrics::SourceMetrics;
use sluice_runtime::{LaneContext, LanePoll, LaneReader};
use sluice_types::{SluiceError, TimestampMs};

use super::{LaneRange, Shared, read_error};

/// Bad rows of one source logged in full; later ones are only counted.
pub const LOGGED_BAD_ROWS: u64 = 5;

/// The buffer used to skip a partial line and to count line breaks.
const SCAN_BYTES: usize = 1 << 20;

/// A lane reading one byte range of one file.
pub struct FileLane {
    shared: Arc<Shared>,
    path: PathBuf,
    /// `None` once the lane is exhausted (or when it has nothing to read).
    chunker: Option<LineChunker<RangeReader>>,
    decoder: Decoder,
    lines: LineNumbers,
    metrics: Arc<SourceMetrics>,
    max_event_time: Option<TimestampMs>,
    /// Decoded batches not yet handed out: one per poll, each followed by its watermark,
    /// so the watermark advances batch by batch (bounded by one decoded chunk).
    pending: VecDeque<RecordBatch>,
}

impl FileLane {
    /// Opens the lane reading `range`: opens the file and finds the lane's first line.
    pub(crate) fn open(shared: Arc<Shared>, range: LaneRange, context: LaneContext) -> Result<FileLane, SluiceError> {
        let path = shared.files.get(range.file).cloned().ok_or_else(|| {
            SluiceError::internal("source.lane", format!("source `{}` has no file {}", shared.name, range.file))
        })?;
        let decoder = Decoder::new(DecoderOptions {
            schema: shared.schema.clone(),
            format: shared.format,
            batch_size: context.batch_size.max(1),
        })?;
        let needed = context.tables_needed.first().copied().unwrap_or(false);
        let opened = if needed { open_range(&path, &range) } else { Ok(None) };
        let opened = opened.map_err(|error| read_error(&path, &error))?;
        let body_start = opened.as_ref().map_or(range.start, |reader| reader.pos);
        let chunker = opened.map(|reader| LineChunker::with_capacity(reader, shared.chunk_bytes));
        Ok(FileLane {
            lines: LineNumbers { body_start, guard: u64::from(body_start > 0), base: None },
            shared,
            path,
            chunker,
            decoder,
            metrics: context.metrics,
            max_event_time: None,
            pending: VecDeque::new(),
        })
    }

    /// Handles one bad row, numbered as the decoder numbers this lane's lines.
    fn bad_row(&mut self, row: BadRow) -> Result<(), SluiceError> {
        let previous = self.metrics.bad_rows.fetch_add(1, Ordering::Relaxed);
        let source = &self.shared.name;
        match self.shared.on_error {
            OnError::Skip => {
                if previous < LOGGED_BAD_ROWS {
                    let line = self.lines.file_line(row.line, &self.path).map_err(|e| read_error(&self.path, &e))?;
                    tracing::warn!(source = %source, "{}:{line}: {}: {}", self.path.display(), row.reason, row.text);
                    if previous + 1 == LOGGED_BAD_ROWS {
                        tracing::warn!(source = %source, "source `{source}`: further bad rows are counted, not logged");
                    }
                }
                Ok(())
            }
            OnError::Fail => {
                let line = self.lines.file_line(row.line, &self.path).map_err(|e| read_error(&self.path, &e))?;
                Err(SluiceError::user(
                    "source.bad_row",
                    format!("bad row at {}:{line}: {}: {}", self.path.display(), row.reason, row.text),
                )
                .with_fix("fix the row, or set on_error = \"skip\" to count and skip bad rows"))
            }
        }
    }

    /// The watermark after `batches`, when the source has event time.
    fn watermark(&mut self, batches: &[RecordBatch]) -> Option<TimestampMs> {
        let column = self.shared.event_time?;
        for batch in batches {
            let batch_max = max_timestamp_ms(batch.column(column));
            self.max_event_time = self.max_event_time.max(batch_max);
        }
        self.max_event_time.map(|max| max.saturating_sub(self.shared.watermark_delay_ms))
    }
}

impl LaneReader for FileLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        while self.pending.is_empty() {
            let Some(chunker) = self.chunker.as_mut() else { return Ok(LanePoll::Exhausted) };
            let mut batches = Vec::new();
            let mut bad = Vec::new();
            let next = chunker.next_chunk().map_err(|error| read_error(&self.path, &error))?;
            let Some((chunk, chunk_line)) = next else {
                self.chunker = None;
                return Ok(LanePoll::Exhausted);
            };
            self.decoder
                .decode(chunk, chunk_line + self.lines.guard, &mut batches, &mut bad)
                .map_err(|error| error.context(self.path.display()))?;
            let too_long = chunker.take_bad_rows();
            for mut row in too_long {
                row.line += self.lines.guard;
                self.bad_row(row)?;
            }
            for row in bad {
                self.bad_row(row)?;
            }
            self.pending.extend(batches.into_iter().filter(|b| b.num_rows() > 0));
        }
        let batch = self.pending.pop_front().expect("loop ends with a pending batch");
        let watermark = self.watermark(std::slice::from_ref(&batch));
        Ok(LanePoll::Data { batches: vec![(0, batch)], watermark })
    }
}

/// Maps the decoder's line numbers of a lane to the file's.
#[derive(Debug)]
struct LineNumbers {
    /// The byte offset of the lane's first line.
    body_start: u64,
    /// 1 when the lane starts mid-file (its decoder numbers are one above the
    /// chunker's, so they never equal 1), else 0.
    guard: u64,
    /// The file line number of the lane's first line, once counted.
    base: Option<u64>,
}

impl LineNumbers {
    fn file_line(&mut self, decoder_line: u64, path: &Path) -> io::Result<u64> {
        if self.guard == 0 {
            return Ok(decoder_line);
        }
        let base = match self.base {
            Some(base) => base,
            None => {
                let base = count_line_breaks_before(path, self.body_start)? + 1;
                self.base = Some(base);
                base
            }
        };
        // Decoder line 2 is the lane's first line.
        Ok(base + decoder_line.saturating_sub(2))
    }
}

/// The number of `\n` in the first `limit` bytes of the file.
pub(crate) fn count_line_breaks_before(path: &Path, limit: u64) -> io::Result<u64> {
    let mut file = File::open(path)?.take(limit);
    let mut buf = vec![0u8; SCAN_BYTES];
    let mut count = 0;
    loop {
        let read = match file.read(&mut buf) {
            Ok(0) => return Ok(count),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        count += sluice_formats::count_line_breaks(&buf[..read]) as u64;
    }
}

/// Opens `path` positioned at the first line starting in `range`; `None` if none does.
fn open_range(path: &Path, range: &LaneRange) -> io::Result<Option<RangeReader>> {
    let mut file = File::open(path)?;
    let body_start = if range.start == 0 {
        0
    } else {
        match first_line_start(&mut file, range.start, range.end)? {
            Some(start) => start,
            None => return Ok(None),
        }
    };
    if body_start >= range.end {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(body_start))?;
    Ok(Some(RangeReader { file, pos: body_start, end: range.end, done: false }))
}

/// The offset just after the first `\n` at or after `start - 1` and before `end`:
/// the first line starting in `[start, end]`; `None` if there is none before `end`.
fn first_line_start(file: &mut File, start: u64, end: u64) -> io::Result<Option<u64>> {
    let mut pos = start - 1;
    file.seek(SeekFrom::Start(pos))?;
    let mut buf = vec![0u8; SCAN_BYTES];
    while pos < end {
        let want = usize::try_from(end - pos).unwrap_or(usize::MAX).min(buf.len());
        let read = match file.read(&mut buf[..want]) {
            Ok(0) => return Ok(None),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if let Some(index) = buf[..read].iter().position(|b| *b == b'\n') {
            return Ok(Some(pos + index as u64 + 1));
        }
        pos += read as u64;
    }
    Ok(None)
}

/// Reads from the first line of a lane to the end of the last line starting before
/// `end`.
pub(crate) struct RangeReader {
    file: File,
    /// The file offset of the next byte read.
    pos: u64,
    end: u64,
    done: bool,
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.pos < self.end {
            let want = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX).min(buf.len());
            let read = self.file.read(&mut buf[..want])?;
            self.pos += read as u64;
            // The input ended early, or the range ends right after a line break.
            self.done = read == 0 || (self.pos == self.end && buf[read - 1] == b'\n');
            return Ok(read);
        }
        // Past the range: finish the line in progress.
        let read = self.file.read(buf)?;
        self.pos += read as u64;
        match buf[..read].iter().position(|b| *b == b'\n') {
            Some(index) => {
                self.done = true;
                Ok(index + 1)
            }
            None => {
                self.done = read == 0;
                Ok(read)
            }
        }
    }
}

/// The largest value of a timestamp column, in ms; `None` when it has no value.
fn max_timestamp_ms(column: &ArrayRef) -> Option<TimestampMs> {
    let DataType::Timestamp(unit, _) = column.data_type() else { return None };
    if column.len() == column.null_count() {
        return None;
    }
    match unit {
        TimeUnit::Second => arrow::compute::max(column.as_primitive_opt::<TimestampSecondType>()?)
            .map(|seconds| seconds.saturating_mul(1000)),
        TimeUnit::Millisecond => arrow::compute::max(column.as_primitive_opt::<TimestampMillisecondType>()?),
        TimeUnit::Microsecond => arrow::compute::max(column.as_primitive_opt::<TimestampMicrosecondType>()?)
            .map(|micros| micros.div_euclid(1000)),
        TimeUnit::Nanosecond => arrow::compute::max(column.as_primitive_opt::<TimestampNanosecondType>()?)
            .map(|nanos| nanos.div_euclid(1_000_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_of_every_unit_become_milliseconds() {
        use arrow::array::{TimestampMicrosecondArray, TimestampSecondArray};
        let seconds: ArrayRef = Arc::new(TimestampSecondArray::from(vec![Some(3), None, Some(5)]));
        assert_eq!(max_timestamp_ms(&seconds), Some(5_000));
        let micros: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![-1_500, -2_500]));
        assert_eq!(max_timestamp_ms(&micros), Some(-2));
        let empty: ArrayRef = Arc::new(TimestampSecondArray::from(vec![None::<i64>]));
        assert_eq!(max_timestamp_ms(&empty), None);
    }
}
