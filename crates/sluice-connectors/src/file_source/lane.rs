//! One lane of a file source: the records that start inside one byte range of one file.
//!
//! The byte-range rule (see the [parent module](super)):
//! - CSV: planning moved every range start to a record start
//!   ([`csv_plan`](super::csv_plan)), so a lane reads exactly `[start, end)`, `end`
//!   being the next lane's start (a line break that ends a record precedes it) or the
//!   file's end. The lane checks that the byte before its start is a line break.
//! - JSON lines: a lane whose range starts at `start > 0` seeks to `start - 1` and
//!   skips through the first line break (so a line starting exactly at `start` is kept,
//!   and a line that began before it is left to the previous lane); it then reads up to
//!   `end` and on through the next line break, to finish the last line that started
//!   before `end`.
//!
//! The lane reading byte 0 starts after a UTF-8 byte order mark, if the file has one.
//!
//! A file that is not regular (a pipe, a device) is read by one lane from its start to
//! its end of file, without seeking ([`LaneInput::Stream`]); such a lane cannot resume
//! from a position.
//!
//! Line numbers: the chunker numbers a lane's lines from 1. A lane starting at the
//! file's first record uses those numbers as they are. A lane starting mid-file hands
//! the decoder its numbers plus one (so no mid-file line is ever taken for the CSV
//! header, which is line 1), and turns them into file line numbers only when it reports
//! a bad row, by counting the line breaks before its first line once.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow::array::{Array, BooleanArray, StringArray};
use arrow::record_batch::RecordBatch;
use sluice_config::OnError;
use sluice_formats::{BadRow, Decoder, DecoderOptions, LineChunker, RowFormat};
use sluice_runtime::metrics::SourceMetrics;
use sluice_runtime::{LaneContext, LanePoll, LaneReader};
use sluice_types::{SluiceError, TimestampMs};

use super::csv_plan::{BOM, bom_length};
use super::envelopes::EnvelopeLines;
use super::{FileChangelog, LaneRange, Shared, read_error};
use crate::lanes::{LOGGED_BAD_ROWS, max_timestamp_ms};

/// The buffer used to skip a partial line and to count line breaks.
const SCAN_BYTES: usize = 1 << 20;

/// A lane reading one byte range of one file.
pub struct FileLane {
    shared: Arc<Shared>,
    path: PathBuf,
    /// `None` once the lane is exhausted (or when it has nothing to read).
    chunker: Option<LineChunker<LaneInput>>,
    decoder: Decoder,
    /// `debezium-json`: the events of each chunk into rows with their kinds, in place of
    /// `decoder`.
    envelopes: Option<EnvelopeLines>,
    lines: LineNumbers,
    metrics: Arc<SourceMetrics>,
    max_event_time: Option<TimestampMs>,
    /// Decoded batches not yet handed out: one per poll, each followed by its watermark,
    /// so the watermark advances batch by batch (bounded by one decoded chunk).
    pending: VecDeque<RecordBatch>,
    /// Where the reader started (the lane's first line, or a resumed position).
    read_start: u64,
    /// The file offset of the chunk the pending batches come from.
    chunk_start: u64,
    /// Good rows of that chunk already handed out (or skipped on resume).
    chunk_rows: u64,
    /// Good rows still to skip after a resume.
    skip_rows: u64,
    /// A resumed lane first reports the watermark it had.
    announce_watermark: bool,
    /// With a rate: when the lane started and the rows it handed out since.
    paced_since: Option<(Instant, u64)>,
}

/// A file lane's position: the offset of a line start, the good rows after it already
/// handed out, and the watermark (`i64::MIN` for none). Resuming reads from the offset and
/// skips that many good rows, so chunk boundaries need not match the first run's.
fn encode_position(offset: u64, rows: u64, watermark: Option<TimestampMs>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(24);
    bytes.extend_from_slice(&offset.to_le_bytes());
    bytes.extend_from_slice(&rows.to_le_bytes());
    bytes.extend_from_slice(&watermark.unwrap_or(i64::MIN).to_le_bytes());
    bytes
}

fn decode_position(bytes: &[u8]) -> Result<(u64, u64, Option<TimestampMs>), SluiceError> {
    if bytes.len() != 24 {
        return Err(SluiceError::internal(
            "source.position",
            format!("a file position has 24 bytes, not {}", bytes.len()),
        ));
    }
    let word = |i: usize| <[u8; 8]>::try_from(&bytes[i * 8..i * 8 + 8]).expect("8 bytes");
    let watermark = i64::from_le_bytes(word(2));
    Ok((u64::from_le_bytes(word(0)), u64::from_le_bytes(word(1)), (watermark != i64::MIN).then_some(watermark)))
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
        let envelopes = match (shared.changelog, &shared.kinds_schema) {
            (Some(FileChangelog::Debezium), Some(kinds_schema)) => {
                Some(EnvelopeLines::new(shared.schema.clone(), kinds_schema.clone(), context.batch_size)?)
            }
            _ => None,
        };
        let needed = context.tables_needed.first().copied().unwrap_or(false);
        let resume = context.start.as_deref().map(decode_position).transpose()?;
        let streaming = shared.streaming.get(range.file).copied().unwrap_or(false);
        if streaming && resume.is_some() {
            return Err(SluiceError::user(
                "source.not_resumable",
                format!(
                    "source `{}` reads {}, which is not a regular file (a pipe or a device): it cannot resume from a checkpoint",
                    shared.name,
                    path.display()
                ),
            )
            .with_fix("start the pipeline without restoring the checkpoint, or read a regular file"));
        }
        let opened = match (needed, resume) {
            (false, _) => Ok(None),
            (true, None) if streaming => open_stream(&path),
            (true, None) => open_range(&path, &range, shared.format),
            (true, Some((offset, _, _))) => open_at(&path, offset, range.end),
        };
        let opened = opened.map_err(|error| read_error(&path, &error))?;
        let body_start = opened.as_ref().map_or(range.start, |(input, _)| input.start());
        let first_record = opened.as_ref().is_some_and(|(_, first_record)| *first_record);
        let (skip_rows, max_event_time) = resume.map_or((0, None), |(_, rows, watermark)| {
            (rows, watermark.map(|w| w.saturating_add(shared.watermark_delay_ms)))
        });
        let chunker = opened.map(|(reader, _)| LineChunker::for_format(reader, shared.chunk_bytes, shared.format));
        Ok(FileLane {
            lines: LineNumbers { body_start, guard: u64::from(!first_record), base: None },
            shared,
            path,
            chunker,
            decoder,
            envelopes,
            metrics: context.metrics,
            max_event_time,
            pending: VecDeque::new(),
            read_start: body_start,
            chunk_start: body_start,
            chunk_rows: 0,
            skip_rows,
            announce_watermark: resume.is_some_and(|(_, _, watermark)| watermark.is_some()),
            paced_since: None,
        })
    }

    /// Handles one bad row, numbered as the decoder numbers this lane's lines.
    fn bad_row(&mut self, row: BadRow) -> Result<(), SluiceError> {
        let previous = self.metrics.bad_rows.fetch_add(1, Ordering::Relaxed);
        let source = &self.shared.name;
        match self.shared.on_error {
            // Dead-letter is refused for this source when it is configured (registry.rs).
            OnError::Skip | OnError::DeadLetter => {
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

    /// A changelog file's decoded rows (their `op` first) as the declared columns and
    /// the row kinds; a row whose op is none of Flink's is a bad row (named by the chunk's
    /// byte offset and its values: decoded rows carry no line number). Deterministic, so
    /// a resumed lane skips the same rows.
    fn changes(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>, SluiceError> {
        if self.shared.changelog != Some(FileChangelog::OpColumn) {
            return Ok(Some(batch));
        }
        let Some(schema) = self.shared.kinds_schema.clone() else { return Ok(Some(batch)) };
        let ops = batch.column(0).as_any().downcast_ref::<StringArray>().ok_or_else(|| {
            SluiceError::internal(
                "source.changelog",
                format!("source `{}`: an op column of other than text", self.shared.name),
            )
        })?;
        let (kinds, bad) = sluice_formats::changelog::op_kinds(ops);
        for (row, reason) in &bad {
            self.bad_op(&batch, *row, reason)?;
        }
        let declared = batch
            .project(&(1..batch.num_columns()).collect::<Vec<_>>())
            .map_err(|e| SluiceError::internal("source.changelog", format!("source `{}`: {e}", self.shared.name)))?;
        let rows = crate::changelog::with_kinds(&declared, kinds, &schema)?;
        if bad.is_empty() {
            return Ok(Some(rows));
        }
        let keep = BooleanArray::from_iter((0..rows.num_rows()).map(|row| Some(!bad.iter().any(|(b, _)| *b == row))));
        let rows = arrow::compute::filter_record_batch(&rows, &keep)
            .map_err(|e| SluiceError::internal("source.changelog", format!("source `{}`: {e}", self.shared.name)))?;
        Ok((rows.num_rows() > 0).then_some(rows))
    }

    /// Handles a changelog row whose op is bad, as [`Self::bad_row`] does.
    fn bad_op(&mut self, batch: &RecordBatch, row: usize, reason: &str) -> Result<(), SluiceError> {
        let previous = self.metrics.bad_rows.fetch_add(1, Ordering::Relaxed);
        let values: Vec<String> = (batch.schema().fields().iter().zip(batch.columns()))
            .map(|(field, column)| {
                let value = arrow::util::display::array_value_to_string(column, row).unwrap_or_default();
                format!("{}={value}", field.name())
            })
            .collect();
        let at = format!("{} (a row of the chunk from byte {})", self.path.display(), self.chunk_start);
        let text = values.join(", ");
        match self.shared.on_error {
            OnError::Skip | OnError::DeadLetter => {
                if previous < LOGGED_BAD_ROWS {
                    tracing::warn!(source = %self.shared.name, "{at}: {reason}: {text}");
                }
                Ok(())
            }
            OnError::Fail => Err(SluiceError::user("source.bad_row", format!("bad row at {at}: {reason}: {text}"))
                .with_fix("write the op as +I, -U, +U or -D, or set on_error = \"skip\" to count and skip bad rows")),
        }
    }

    /// The watermark after `batches`, when the source has event time.
    fn watermark(&mut self, batches: &[RecordBatch]) -> Option<TimestampMs> {
        let column = self.shared.event_time?;
        for batch in batches {
            let batch_max = max_timestamp_ms(batch.column(column));
            self.max_event_time = self.max_event_time.max(batch_max);
        }
        self.current_watermark()
    }

    /// The newest event time read so far, less the source's delay.
    fn current_watermark(&self) -> Option<TimestampMs> {
        self.max_event_time.map(|max| max.saturating_sub(self.shared.watermark_delay_ms))
    }
}

impl FileLane {
    /// With a rate: cuts the next batch to about 100 ms worth of rows, and returns the
    /// instant to come back when the lane is ahead of its schedule.
    fn pace(&mut self) -> Option<Instant> {
        let rate = self.shared.lane_rate?;
        let now = Instant::now();
        let (start, emitted) = *self.paced_since.get_or_insert((now, 0));
        let due = start + Duration::from_secs_f64(emitted as f64 / rate);
        if due > now {
            return Some(due);
        }
        let most = ((rate * 0.1) as usize).max(1);
        let front = self.pending.front_mut().expect("called with a pending batch");
        if front.num_rows() > most {
            let rest = front.slice(most, front.num_rows() - most);
            *front = front.slice(0, most);
            self.pending.insert(1, rest);
        }
        None
    }

    /// Drops the rows a resumed lane had already handed out before the checkpoint.
    fn skip_resumed_rows(&mut self) {
        while self.skip_rows > 0 {
            let Some(front) = self.pending.front_mut() else { return };
            let rows = front.num_rows() as u64;
            if rows <= self.skip_rows {
                self.skip_rows -= rows;
                self.chunk_rows += rows;
                self.pending.pop_front();
            } else {
                *front = front.slice(self.skip_rows as usize, (rows - self.skip_rows) as usize);
                self.chunk_rows += self.skip_rows;
                self.skip_rows = 0;
            }
        }
    }
}

impl LaneReader for FileLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        sluice_types::failpoint!("source.poll");
        if let Some(answer) = self.resumed() {
            return Ok(answer);
        }
        while self.pending.is_empty() {
            let Some(chunker) = self.chunker.as_mut() else { return Ok(LanePoll::Exhausted) };
            let mut batches = Vec::new();
            let mut bad = Vec::new();
            let next = chunker.next_chunk().map_err(|error| read_error(&self.path, &error))?;
            let Some((chunk, chunk_line)) = next else {
                self.chunker = None;
                return Ok(LanePoll::Exhausted);
            };
            let chunk_len = chunk.len() as u64;
            self.metrics.bytes.fetch_add(chunk_len, Ordering::Relaxed);
            let first_line = chunk_line + self.lines.guard;
            match self.envelopes.as_mut() {
                Some(envelopes) => envelopes.decode(chunk, first_line, &mut batches, &mut bad),
                None => self.decoder.decode(chunk, first_line, &mut batches, &mut bad),
            }
            .map_err(|error| error.context(self.path.display()))?;
            if self.skip_rows == 0 {
                self.chunk_start = self.read_start + chunker.consumed() - chunk_len;
                self.chunk_rows = 0;
            }
            let too_long = chunker.take_bad_rows();
            for mut row in too_long {
                row.line += self.lines.guard;
                self.bad_row(row)?;
            }
            for row in bad {
                self.bad_row(row)?;
            }
            for batch in batches.into_iter().filter(|b| b.num_rows() > 0) {
                if let Some(batch) = self.changes(batch)? {
                    self.pending.push_back(batch);
                }
            }
            self.skip_resumed_rows();
        }
        if let Some(until) = self.pace() {
            return Ok(LanePoll::Wait(until));
        }
        let batch = self.pending.pop_front().expect("loop ends with a pending batch");
        self.chunk_rows += batch.num_rows() as u64;
        if let Some((_, emitted)) = self.paced_since.as_mut() {
            *emitted += batch.num_rows() as u64;
        }
        let watermark = self.watermark(std::slice::from_ref(&batch));
        Ok(LanePoll::Data { batches: vec![(0, batch)], watermark })
    }

    fn position(&self) -> Vec<u8> {
        encode_position(self.chunk_start, self.chunk_rows + self.skip_rows, self.current_watermark())
    }

    fn resumed(&mut self) -> Option<LanePoll> {
        // Whether it had ended needs a read: its polls tell.
        let watermark = std::mem::take(&mut self.announce_watermark).then(|| self.current_watermark()).flatten()?;
        Some(LanePoll::Data { batches: Vec::new(), watermark: Some(watermark) })
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

/// A lane's input and whether it starts at the file's first record.
type Opened = Option<(LaneInput, bool)>;

/// What a lane reads: a byte range of a regular file, or a whole streaming file.
pub(crate) enum LaneInput {
    Range(RangeReader),
    /// A file that is not regular, read from its start (`start` bytes of it skipped: a
    /// byte order mark) to its end of file; `head` holds bytes read while looking for
    /// the mark that are data.
    Stream {
        head: io::Cursor<Vec<u8>>,
        file: File,
        start: u64,
    },
}

impl LaneInput {
    /// The file offset where the lane's first record starts.
    fn start(&self) -> u64 {
        match self {
            LaneInput::Range(reader) => reader.pos,
            LaneInput::Stream { start, .. } => *start,
        }
    }
}

impl Read for LaneInput {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            LaneInput::Range(reader) => reader.read(buf),
            LaneInput::Stream { head, file, .. } => match head.read(buf)? {
                0 => file.read(buf),
                read => Ok(read),
            },
        }
    }
}

/// Opens a file that is not regular for reading from its start, without seeking: a
/// byte order mark is skipped, other first bytes kept.
fn open_stream(path: &Path) -> io::Result<Opened> {
    let mut file = File::open(path)?;
    let mut head = Vec::with_capacity(BOM.len());
    (&mut file).take(BOM.len() as u64).read_to_end(&mut head)?;
    let start = if head == BOM {
        head.clear();
        BOM.len() as u64
    } else {
        0
    };
    Ok(Some((LaneInput::Stream { head: io::Cursor::new(head), file, start }, true)))
}

/// Opens `path` positioned at the first record starting in `range`; `None` if none
/// does.
fn open_range(path: &Path, range: &LaneRange, format: RowFormat) -> io::Result<Opened> {
    let mut file = File::open(path)?;
    let body_start = if range.start == 0 {
        bom_length(&mut file)?
    } else if let RowFormat::Csv { .. } = format {
        check_record_start(&mut file, range.start)?;
        range.start
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
    let reader = RangeReader { file, pos: body_start, end: range.end, done: false };
    Ok(Some((LaneInput::Range(reader), range.start == 0)))
}

/// Fails unless the byte before `start` is a line break: planning put a CSV lane's
/// start at a record start, and the file changed since, or the plan is wrong.
fn check_record_start(file: &mut File, start: u64) -> io::Result<()> {
    let mut before = [0u8; 1];
    file.seek(SeekFrom::Start(start - 1))?;
    file.read_exact(&mut before)?;
    if before[0] == b'\n' {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "byte {start} is not the start of a CSV record as planned (the file changed while the pipeline started?)"
    )))
}

/// Opens `path` at `offset`, a record start recorded in a position, reading to `end`.
fn open_at(path: &Path, offset: u64, end: u64) -> io::Result<Opened> {
    if offset >= end {
        return Ok(None);
    }
    let mut file = File::open(path)?;
    // The first record starts after a byte order mark.
    let first_record = offset == 0 || offset == bom_length(&mut file)?;
    file.seek(SeekFrom::Start(offset))?;
    Ok(Some((LaneInput::Range(RangeReader { file, pos: offset, end, done: false }), first_record)))
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
