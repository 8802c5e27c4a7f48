//! A writer of the Delta sink: one per thread, rows into Parquet data files.
//!
//! Rows are expanded as the `file` sink's changelog expands them (`Encoder::expand`: an
//! `op` column first in `changelog` mode), cast to the types the table stores
//! (`log::delta_type`), split by partition values, and appended to an open Parquet file
//! per partition (row groups of `row_group_rows`). A file is finished and uploaded as soon
//! as it reaches `target_file_size_mib`, and at every barrier; at most
//! [`PARTITION_FILES_OPEN_MAX`] files are open at once (beyond, the largest is finished
//! early), so a writer holds at most that many files of at most the target size, however
//! long an epoch is.
//!
//! Data file names are unique to the writer (`part-{token}-{slot}-{sequence}`; the token is
//! the time, the process id and a counter), so a restarted run never overwrites a file a
//! dead run left, committed or not.
//!
//! - **Staged** (exactly-once): a finished file is uploaded but referenced by nothing;
//!   `pre_commit(e)` finishes the open files and returns a [`PreparedFiles`] record naming
//!   them, which the sink commits in one Delta commit once checkpoint `e` is durable.
//! - **Unstaged**: the writer commits its finished files itself, at every barrier, at
//!   close and every [`UNSTAGED_FILES_PER_COMMIT`] files (at-least-once output).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_formats::Encoder;
use sluice_runtime::SinkWriter;
use sluice_types::{Batch, Epoch, SluiceError};

use super::log::{self, AddFile};
use super::shared::Shared;

/// The most Parquet files a writer keeps open (one per partition value seen in the
/// epoch); beyond, the largest is finished early.
pub const PARTITION_FILES_OPEN_MAX: usize = 16;
/// An unstaged writer commits at least every this many finished files.
pub const UNSTAGED_FILES_PER_COMMIT: usize = 16;

const RECORD_VERSION: u8 = 1;

/// The pre-commit record of one writer and epoch: the data files it wrote.
///
/// Version 1 layout, little endian: `u8 version = 1, u64 epoch, u32 slot, u32 files`,
/// then per file `u32 path length, path (UTF-8, relative to the table), u64 size, u64
/// rows, i64 modification time (ms), u32 values`, then per partition value (the table's
/// partition columns in order) `u8 present` and, when 1, `u32 length, value (UTF-8)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedFiles {
    pub epoch: u64,
    pub slot: u32,
    /// Each file with its partition values only (the names are the table's).
    pub files: Vec<(AddFile, Vec<Option<String>>)>,
}

fn put_u32(bytes: &mut Vec<u8>, value: usize) {
    bytes.extend_from_slice(&u32::try_from(value).expect("a length below 4 GiB").to_le_bytes());
}

fn put_text(bytes: &mut Vec<u8>, text: &str) {
    put_u32(bytes, text.len());
    bytes.extend_from_slice(text.as_bytes());
}

impl PreparedFiles {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![RECORD_VERSION];
        bytes.extend_from_slice(&self.epoch.to_le_bytes());
        bytes.extend_from_slice(&self.slot.to_le_bytes());
        put_u32(&mut bytes, self.files.len());
        for (file, values) in &self.files {
            put_text(&mut bytes, &file.path);
            bytes.extend_from_slice(&file.size.to_le_bytes());
            bytes.extend_from_slice(&file.rows.to_le_bytes());
            bytes.extend_from_slice(&file.modification_time_ms.to_le_bytes());
            put_u32(&mut bytes, values.len());
            for value in values {
                match value {
                    None => bytes.push(0),
                    Some(value) => {
                        bytes.push(1);
                        put_text(&mut bytes, value);
                    }
                }
            }
        }
        bytes
    }

    /// Decodes a record of sink `sink`; a damaged one is an internal error (the
    /// checkpoint's own checksums passed, so the bytes are what a writer encoded).
    pub fn decode(sink: &str, bytes: &[u8]) -> Result<PreparedFiles, SluiceError> {
        let damaged = || SluiceError::internal("sink.record", format!("sink `{sink}`: a damaged Delta sink record"));
        let mut reader = Reader { bytes };
        if reader.take(1).ok_or_else(damaged)? != [RECORD_VERSION] {
            return Err(damaged());
        }
        let epoch = reader.u64().ok_or_else(damaged)?;
        let slot = reader.u32().ok_or_else(damaged)?;
        let count = reader.u32().ok_or_else(damaged)?;
        let mut files = Vec::new();
        for _ in 0..count {
            let path = reader.text().ok_or_else(damaged)?;
            let size = reader.u64().ok_or_else(damaged)?;
            let rows = reader.u64().ok_or_else(damaged)?;
            let modification_time_ms = reader.u64().ok_or_else(damaged)? as i64;
            let value_count = reader.u32().ok_or_else(damaged)?;
            let mut values = Vec::new();
            for _ in 0..value_count {
                values.push(match reader.take(1).ok_or_else(damaged)? {
                    [0] => None,
                    [1] => Some(reader.text().ok_or_else(damaged)?),
                    _ => return Err(damaged()),
                });
            }
            let add = AddFile { path, partition_values: Vec::new(), size, modification_time_ms, rows };
            files.push((add, values));
        }
        if !reader.bytes.is_empty() {
            return Err(damaged());
        }
        Ok(PreparedFiles { epoch, slot, files })
    }
}

/// Bounds-checked reads of a record.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.bytes.split_at_checked(count)?;
        self.bytes = rest;
        Some(taken)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn text(&mut self) -> Option<String> {
        let length = self.u32()? as usize;
        String::from_utf8(self.take(length)?.to_vec()).ok()
    }
}

/// Rows of one partition: its values and its data columns.
type Part = (Vec<Option<String>>, RecordBatch);

/// A Parquet file being written, of one partition.
struct OpenFile {
    values: Vec<Option<String>>,
    writer: ArrowWriter<Vec<u8>>,
    rows: u64,
}

impl OpenFile {
    fn size(&self) -> usize {
        self.writer.bytes_written() + self.writer.in_progress_size()
    }
}

static TOKENS: AtomicU64 = AtomicU64::new(0);

/// A token unique to this writer instance among every run's.
pub(crate) fn unique_token() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}-{}", std::process::id(), TOKENS.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The writer of one slot.
pub(crate) struct DeltaWriter {
    shared: Arc<Shared>,
    slot: u32,
    staged: bool,
    encoder: Encoder,
    token: String,
    sequence: u64,
    open: Vec<OpenFile>,
    /// Files finished since the last pre-commit (staged) or commit (unstaged).
    finished: Vec<(AddFile, Vec<Option<String>>)>,
    bytes: u64,
}

impl DeltaWriter {
    pub(crate) fn new(shared: Arc<Shared>, slot: u32, staged: bool) -> DeltaWriter {
        let encoder =
            Encoder::new(sluice_formats::OutputFormat::JsonLines, shared.input_schema.clone(), shared.updating)
                .with_upsert_key(shared.upsert_key.as_deref());
        DeltaWriter {
            shared,
            slot,
            staged,
            encoder,
            token: unique_token(),
            sequence: 0,
            open: Vec::new(),
            finished: Vec::new(),
            bytes: 0,
        }
    }

    fn error(&self, action: &str, error: impl std::fmt::Display) -> SluiceError {
        SluiceError::internal(
            "sink.delta_parquet",
            format!("sink `{}`: {action} for Delta table {}: {error}", self.shared.name, self.shared.table.url()),
        )
    }

    /// The rows of `batch` as the table stores them (op column, casts), all columns.
    fn table_rows(&self, batch: &Batch) -> Result<RecordBatch, SluiceError> {
        let rows = self.encoder.expand(batch)?;
        let layout = &self.shared.layout;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(rows.num_columns());
        for (column, field) in rows.columns().iter().zip(layout.table_schema.fields()) {
            columns.push(if column.data_type() == field.data_type() {
                column.clone()
            } else {
                arrow::compute::cast(column, field.data_type()).map_err(|e| self.error("casting a column", e))?
            });
        }
        RecordBatch::try_new(layout.table_schema.clone(), columns).map_err(|e| self.error("building rows", e))
    }

    /// Splits `rows` by partition values: each part's values and its data columns.
    fn partitions(&self, rows: &RecordBatch) -> Result<Vec<Part>, SluiceError> {
        let layout = &self.shared.layout;
        let data = rows.project(&layout.data_columns).map_err(|e| self.error("projecting", e))?;
        if layout.partition_columns.is_empty() {
            return Ok(vec![(Vec::new(), data)]);
        }
        let texts = layout
            .partition_columns
            .iter()
            .map(|&index| arrow::compute::cast(rows.column(index), &arrow::datatypes::DataType::Utf8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error("formatting partition values", e))?;
        let texts: Vec<&arrow::array::StringArray> =
            texts.iter().map(|t| t.as_any().downcast_ref().expect("cast to Utf8 gives strings")).collect();
        let mut groups: HashMap<Vec<Option<String>>, Vec<u32>> = HashMap::new();
        let mut order = Vec::new();
        for row in 0..rows.num_rows() {
            let key: Vec<Option<String>> = texts
                .iter()
                .map(|t| (!arrow::array::Array::is_null(*t, row)).then(|| t.value(row).to_string()))
                .collect();
            let entry = groups.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                Vec::new()
            });
            entry.push(u32::try_from(row).expect("a batch holds fewer than 2^32 rows"));
        }
        let mut parts = Vec::with_capacity(order.len());
        for key in order {
            let indices = UInt32Array::from(groups.remove(&key).expect("grouped above"));
            let part =
                arrow::compute::take_record_batch(&data, &indices).map_err(|e| self.error("splitting rows", e))?;
            parts.push((key, part));
        }
        Ok(parts)
    }

    fn open_file(&self, values: Vec<Option<String>>) -> Result<OpenFile, SluiceError> {
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(self.shared.options.row_group_rows))
            .build();
        let schema: SchemaRef = self.shared.layout.data_schema.clone();
        let writer =
            ArrowWriter::try_new(Vec::new(), schema, Some(properties)).map_err(|e| self.error("opening a file", e))?;
        Ok(OpenFile { values, writer, rows: 0 })
    }

    /// Finishes open file `index` and uploads it; durable when this returns.
    fn finish(&mut self, index: usize) -> Result<(), SluiceError> {
        let file = self.open.swap_remove(index);
        let bytes = file.writer.into_inner().map_err(|e| self.error("finishing a file", e))?;
        let layout = &self.shared.layout;
        let mut path = String::new();
        for (name, value) in layout.partition_names.iter().zip(&file.values) {
            path.push_str(&log::partition_directory(name, value.as_deref()));
            path.push('/');
        }
        path.push_str(&format!("part-{}-{:05}-{:08}.snappy.parquet", self.token, self.slot, self.sequence));
        self.sequence += 1;
        let size = bytes.len() as u64;
        self.shared.table.dir.put(&path, Bytes::from(bytes))?;
        self.bytes += size;
        let partition_values =
            layout.partition_names.iter().cloned().zip(file.values.iter().cloned()).collect::<Vec<_>>();
        let add = AddFile { path, partition_values, size, modification_time_ms: now_ms(), rows: file.rows };
        self.finished.push((add, file.values));
        Ok(())
    }

    fn finish_all(&mut self) -> Result<(), SluiceError> {
        while !self.open.is_empty() {
            self.finish(self.open.len() - 1)?;
        }
        Ok(())
    }

    /// Unstaged: commits the finished files (no `txn`: at-least-once output).
    fn commit_unstaged(&mut self) -> Result<(), SluiceError> {
        if self.finished.is_empty() {
            return Ok(());
        }
        let files = std::mem::take(&mut self.finished);
        self.shared.commit_files(None, files.into_iter().map(|(add, _)| add).collect())
    }
}

impl SinkWriter for DeltaWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        sluice_types::failpoint!("sink.write");
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let rows = self.table_rows(batch)?;
        let target = self.shared.options.target_file_bytes;
        for (values, part) in self.partitions(&rows)? {
            let index = match self.open.iter().position(|f| f.values == values) {
                Some(index) => index,
                None => {
                    if self.open.len() == PARTITION_FILES_OPEN_MAX {
                        let largest = (0..self.open.len()).max_by_key(|&i| self.open[i].size()).expect("open files");
                        self.finish(largest)?;
                    }
                    let file = self.open_file(values)?;
                    self.open.push(file);
                    self.open.len() - 1
                }
            };
            let file = &mut self.open[index];
            file.writer.write(&part).map_err(|e| SluiceError::internal("sink.delta_parquet", e.to_string()))?;
            file.rows += part.num_rows() as u64;
            if file.size() >= target {
                self.finish(index)?;
            }
        }
        if !self.staged && self.finished.len() >= UNSTAGED_FILES_PER_COMMIT {
            self.commit_unstaged()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        self.finish_all()?;
        if !self.staged {
            self.commit_unstaged()?;
            return Ok(Vec::new());
        }
        let files = std::mem::take(&mut self.finished);
        Ok(PreparedFiles { epoch: epoch.0, slot: self.slot, files }.encode())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        self.finish_all()?;
        if self.staged {
            // The runtime staged the last rows through `pre_commit` before this; files
            // finished after it belong to no epoch and are left unreferenced.
            return Ok(());
        }
        self.commit_unstaged()
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.bytes)
    }
}
