//! The exactly-once file sink: stage each epoch's rows, make them visible on commit.
//!
//! A file sink opened with `staged = true` writes nothing visible. Its files:
//!
//! ```text
//! directory mode (PATH is the output directory)       file mode (PATH = PARENT/NAME)
//!   PATH/.staging/part-{slot}-{token}.inprogress        PARENT/.NAME.staging/part-0-{token}.inprogress
//!   PATH/.staging/epoch-{e:020}-part-{slot}.{ext}       PARENT/.NAME.staging/epoch-{e:020}-part-0.{ext}
//!   PATH/part-{e:020}-{slot}.{ext}        (visible)     PARENT/NAME                 (visible, appended)
//! ```
//!
//! (The staging directories stay, empty, after a run; hidden names keep them out of
//! the output.)
//!
//! - **Writing.** The rows of the current epoch go to an *in-progress* file, created
//!   at the epoch's first row under a name unique to this writer (`token` is made of
//!   the time, the process id and a counter), so a restarted run never appends to a
//!   file a dead run left behind.
//! - **Pre-commit** (barrier `e`): flush and fsync the in-progress file, rename it to
//!   its *staged* name for `(e, slot)`, fsync the staging directory, and return a
//!   [`StagedRecord`] naming the staged file and its size. An epoch without rows leaves
//!   no file and returns an empty record (file mode: a length marker).
//! - **Commit** (`e`, every writer's records): directory mode renames each staged file
//!   to its visible part name; file mode appends the staged file to the target at the
//!   recorded `length_before` and then removes it. Both fsync what they changed.
//! - **Discard** (recovery, after the restored epoch was committed again): removes
//!   every in-progress file and every staged file of a later epoch, and visible output
//!   of later epochs (committed before recovery fell back past a damaged newer
//!   checkpoint): directory mode removes their parts; file mode cuts the target back to
//!   its length after the restored epoch, which every file-mode record carries (an epoch
//!   without rows pre-commits a *length marker*: no file, only that length). With no
//!   restored epoch it removes all staged work *and* the visible output of an earlier
//!   run, so a fresh run replaces the output, as an unstaged run does.
//!
//! The CSV header: in directory mode each staged file, hence each visible part, starts
//! with it; in file mode only the epoch whose bytes start the target (`length_before`
//! is 0) carries it, so the target holds it once.
//!
//! # Why output is visible iff its epoch is committed
//!
//! Rows reach a visible name only through `commit(e)`, which the runtime calls only
//! after manifest `e` is durable; before that they live in the hidden staging
//! directory. When `commit(e)` returns, the renames or the append and the directory
//! entries are fsynced, so the output survives a crash. Recovery commits the restored
//! epoch's staged files again (a no-op where that already happened) and discards every
//! later staged file and every in-progress file: those epochs were never committed, and
//! the restarted run writes them again. A staged file the runtime asks to commit that
//! is neither staged nor visible is lost data: `commit` fails loudly
//! (`sink.staged_missing`) instead of committing less.
//!
//! # Why commit is idempotent
//!
//! *Directory mode*: a rename is atomic, so each record's file is either still staged
//! (commit renames it) or already at its visible name with the recorded size (commit
//! skips it). A commit interrupted between two records resumes with the rest.
//!
//! *File mode*: an append is not atomic, so the record carries `length_before`, the
//! target's length once every earlier epoch is committed (epochs commit in order).
//! The staged file is removed only after the append is fsynced. So if it still exists,
//! the append did not complete or was not cleaned up: commit cuts the target back to
//! `length_before` and appends again. If it is gone, the append completed, and the
//! target is at least `length_before + size` long (longer once later epochs are
//! appended). A target shorter than that, or shorter than `length_before`, was changed
//! outside the sink: a loud error.
//!
//! Records are JSON objects with a version (see [`StagedRecord`]).

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::FileFormat;
use crate::sinks::FileMode;
use serde_json::Value;
use sluice_formats::{Encoder, OutputFormat};
use sluice_runtime::SinkWriter;
use sluice_types::{Batch, Epoch, SluiceError};

use super::{FileSink, open_error, path_error, write_error};

/// The version written in every record; a record of another version is refused.
const RECORD_VERSION: u64 = 1;
const IN_PROGRESS_SUFFIX: &str = ".inprogress";

/// Where a staged file sink keeps its files (see the module docs).
#[derive(Debug, Clone)]
struct Layout {
    target: Target,
    /// `PATH/.staging` or `PARENT/.NAME.staging`.
    staging: PathBuf,
    extension: &'static str,
}

#[derive(Debug, Clone)]
enum Target {
    /// The output directory, holding one visible part per (epoch, slot).
    Directory(PathBuf),
    /// The one output file, appended to epoch by epoch.
    File(PathBuf),
}

impl Layout {
    fn of(sink: &FileSink) -> Result<Layout, SluiceError> {
        let extension = sink.extension();
        match sink.mode {
            FileMode::Directory => Ok(Layout {
                target: Target::Directory(sink.path.clone()),
                staging: sink.path.join(".staging"),
                extension,
            }),
            FileMode::File => {
                let name = sink.path.file_name().ok_or_else(|| {
                    path_error(&sink.path, "names no file")
                        .with_fix("name a file in `path`, or set mode = \"directory\"")
                })?;
                let parent = parent_of(&sink.path);
                let staging = parent.join(format!(".{}.staging", name.to_string_lossy()));
                Ok(Layout { target: Target::File(sink.path.clone()), staging, extension })
            }
        }
    }

    fn staged_name(&self, epoch: Epoch, slot: u32) -> String {
        format!("epoch-{:020}-part-{slot}.{}", epoch.0, self.extension)
    }

    fn visible_part(&self, directory: &Path, epoch: Epoch, slot: u32) -> PathBuf {
        directory.join(format!("part-{:020}-{slot}.{}", epoch.0, self.extension))
    }
}

/// What a writer's pre-commit returns for an epoch with rows; its encoding is a JSON
/// object `{"v":1,"epoch":E,"slot":S,"file":"epoch-…","size":N}`, plus
/// `"length_before":L` in file mode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StagedRecord {
    epoch: u64,
    slot: u32,
    /// The staged file's name inside the staging directory.
    file: String,
    /// The staged file's length in bytes.
    size: u64,
    /// File mode: the target's length before this epoch's append.
    length_before: Option<u64>,
}

impl StagedRecord {
    /// File mode, an epoch without rows: no file, only the target's committed length
    /// (`file` is empty, `size` 0).
    fn length_marker(epoch: u64, length: u64) -> StagedRecord {
        StagedRecord { epoch, slot: 0, file: String::new(), size: 0, length_before: Some(length) }
    }

    fn is_length_marker(&self) -> bool {
        self.file.is_empty()
    }

    /// File mode: the target's length once this record's epoch is committed.
    fn length_after(&self) -> Option<u64> {
        self.length_before.map(|length| length + self.size)
    }

    fn encode(&self) -> Vec<u8> {
        let file = Value::from(self.file.as_str());
        let mut text = format!(
            r#"{{"v":{RECORD_VERSION},"epoch":{},"slot":{},"file":{file},"size":{}"#,
            self.epoch, self.slot, self.size
        );
        if let Some(length_before) = self.length_before {
            text.push_str(&format!(r#","length_before":{length_before}"#));
        }
        text.push('}');
        text.into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<StagedRecord, SluiceError> {
        let bad = |what: &str| {
            let text = String::from_utf8_lossy(bytes);
            SluiceError::internal("sink.record", format!("file sink pre-commit record {text:?}: {what}"))
        };
        let value: Value = serde_json::from_slice(bytes).map_err(|error| bad(&error.to_string()))?;
        let number = |key: &str| value.get(key).and_then(Value::as_u64);
        let version = number("v").ok_or_else(|| bad("no version"))?;
        if version != RECORD_VERSION {
            return Err(bad(&format!("version {version} is not the supported {RECORD_VERSION}")));
        }
        let epoch = number("epoch").ok_or_else(|| bad("no epoch"))?;
        let slot = number("slot").and_then(|s| u32::try_from(s).ok()).ok_or_else(|| bad("no slot"))?;
        let size = number("size").ok_or_else(|| bad("no size"))?;
        let file = value.get("file").and_then(Value::as_str).ok_or_else(|| bad("no file"))?.to_string();
        let length_before = match value.get("length_before") {
            None => None,
            Some(length) => Some(length.as_u64().ok_or_else(|| bad("length_before is no length"))?),
        };
        Ok(StagedRecord { epoch, slot, file, size, length_before })
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A name no other writer of any run uses.
fn unique_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{count:x}", std::process::id())
}

/// Makes the entries of `directory` (renames, creations, removals) durable.
fn sync_directory(directory: &Path) -> Result<(), SluiceError> {
    File::open(directory).and_then(|d| d.sync_all()).map_err(|error| io_error(directory, &error))
}

fn io_error(path: &Path, error: &io::Error) -> SluiceError {
    write_error(&path.display().to_string(), error)
}

/// The length of `path`, or `None` if it does not exist.
fn length_of(path: &Path) -> Result<Option<u64>, SluiceError> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Some(metadata.len())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io_error(path, &error)),
    }
}

/// The rows of the current epoch, in their in-progress file.
struct EpochFile {
    file: BufWriter<File>,
    encoder: Encoder,
    size: u64,
}

/// A staging writer of one slot (see the module docs).
pub(super) struct StagedWriter {
    layout: Layout,
    slot: u32,
    in_progress: PathBuf,
    format: FileFormat,
    schema: arrow::datatypes::SchemaRef,
    updating: bool,
    upsert_key: Option<Vec<usize>>,
    current: Option<EpochFile>,
    /// File mode: the target's length once every epoch pre-committed so far is committed.
    committed_length: u64,
    buffer: Vec<u8>,
    /// Bytes staged since [`SinkWriter::take_bytes`] last asked.
    encoded: u64,
}

impl StagedWriter {
    /// Opens the writer of `slot`; the runtime has already committed the restored
    /// epoch and discarded later work, so the target's length is the committed length.
    pub(super) fn open(sink: &FileSink, slot: u32) -> Result<StagedWriter, SluiceError> {
        let layout = Layout::of(sink)?;
        fs::create_dir_all(&layout.staging).map_err(|error| open_error(&layout.staging, &error))?;
        let committed_length = match &layout.target {
            Target::Directory(_) => 0,
            Target::File(target) => {
                if slot != 0 {
                    let message = format!("a single-file sink has one writer (slot 0), asked for slot {slot}");
                    return Err(SluiceError::internal("sink.slot", message));
                }
                let file = File::options().create(true).append(true).open(target);
                let file = file.map_err(|error| open_error(target, &error))?;
                file.metadata().map_err(|error| open_error(target, &error))?.len()
            }
        };
        let in_progress = layout.staging.join(format!("part-{slot}-{}{IN_PROGRESS_SUFFIX}", unique_token()));
        Ok(StagedWriter {
            layout,
            slot,
            in_progress,
            format: sink.format,
            schema: sink.schema.clone(),
            updating: sink.updating,
            upsert_key: sink.upsert_key.clone(),
            current: None,
            committed_length,
            buffer: Vec::new(),
            encoded: 0,
        })
    }

    /// Starts the epoch's in-progress file at its first row.
    fn start_epoch(&self) -> Result<EpochFile, SluiceError> {
        let file = File::options().write(true).create_new(true).open(&self.in_progress);
        let file = file.map_err(|error| open_error(&self.in_progress, &error))?;
        let header = match self.layout.target {
            Target::Directory(_) => true,
            Target::File(_) => self.committed_length == 0,
        };
        let format = match self.format {
            FileFormat::Json => OutputFormat::JsonLines,
            FileFormat::Csv => OutputFormat::Csv { header },
        };
        let encoder =
            Encoder::new(format, self.schema.clone(), self.updating).with_upsert_key(self.upsert_key.as_deref());
        Ok(EpochFile { file: BufWriter::with_capacity(1 << 20, file), encoder, size: 0 })
    }

    fn error(&self, error: &io::Error) -> SluiceError {
        io_error(&self.in_progress, error)
    }
}

impl SinkWriter for StagedWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        sluice_types::failpoint!("sink.write");
        let mut current = match self.current.take() {
            Some(current) => current,
            None => self.start_epoch()?,
        };
        self.buffer.clear();
        let encoded = current.encoder.encode(batch, &mut self.buffer);
        let written = encoded.and_then(|()| current.file.write_all(&self.buffer).map_err(|error| self.error(&error)));
        if written.is_ok() {
            current.size += self.buffer.len() as u64;
            self.encoded += self.buffer.len() as u64;
        }
        self.current = Some(current);
        written
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        let Some(current) = self.current.take() else {
            return Ok(match self.layout.target {
                Target::Directory(_) => Vec::new(),
                // The target's committed length still belongs in the manifest: recovery
                // cuts the file back to it (see `discard_after`).
                Target::File(_) => StagedRecord::length_marker(epoch.0, self.committed_length).encode(),
            });
        };
        let file = current.file.into_inner().map_err(|error| self.error(error.error()))?;
        file.sync_all().map_err(|error| self.error(&error))?;
        drop(file);
        let name = self.layout.staged_name(epoch, self.slot);
        let staged = self.layout.staging.join(&name);
        fs::rename(&self.in_progress, &staged).map_err(|error| self.error(&error))?;
        sync_directory(&self.layout.staging)?;
        sluice_types::failpoint!("sink.file.after_pre_commit");
        let length_before = match self.layout.target {
            Target::Directory(_) => None,
            Target::File(_) => Some(self.committed_length),
        };
        self.committed_length += current.size;
        let record = StagedRecord { epoch: epoch.0, slot: self.slot, file: name, size: current.size, length_before };
        Ok(record.encode())
    }

    /// Releases the in-progress file. Rows written after the last pre-commit belong to
    /// no epoch and can never become visible: that is an error, never a silent loss.
    fn close(&mut self) -> Result<(), SluiceError> {
        let Some(current) = self.current.take() else { return Ok(()) };
        drop(current.file);
        let message = format!(
            "the file sink writer of slot {} closed with {} bytes of rows written after its last \
             pre-commit; they belong to no epoch and are not written",
            self.slot, current.size
        );
        Err(SluiceError::internal("sink.unstaged_rows", message))
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.encoded)
    }
}

/// Makes epoch `epoch`'s staged files visible (see the module docs); idempotent.
pub(super) fn commit(sink: &FileSink, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
    let layout = Layout::of(sink)?;
    let mut staged = Vec::new();
    for bytes in records.iter().filter(|bytes| !bytes.is_empty()) {
        let record = StagedRecord::decode(bytes)?;
        let expected = layout.staged_name(Epoch(record.epoch), record.slot);
        if record.epoch == epoch.0 && record.is_length_marker() {
            continue;
        }
        if record.epoch != epoch.0 || record.file != expected {
            let message =
                format!("commit of epoch {} got the record of {} (epoch {})", epoch.0, record.file, record.epoch);
            return Err(SluiceError::internal("sink.record", message));
        }
        staged.push(record);
    }
    if staged.is_empty() {
        return Ok(());
    }
    match &layout.target {
        Target::Directory(directory) => commit_parts(&layout, directory, epoch, &staged),
        Target::File(target) => match staged.as_slice() {
            [record] => commit_append(&layout, target, record),
            _ => {
                let message = format!("a single-file sink got {} records for epoch {}, not one", staged.len(), epoch.0);
                Err(SluiceError::internal("sink.record", message))
            }
        },
    }
}

/// A staged file that is neither staged nor committed: its rows are lost.
fn staged_missing(staged: &Path, visible: &Path, epoch: u64, detail: &str) -> SluiceError {
    let message = format!(
        "the staged output of committed epoch {epoch}, {}, is missing and {} {detail}",
        staged.display(),
        visible.display()
    );
    SluiceError::external("sink.staged_missing", message).with_fix(
        "files under the sink's staging directory were removed or changed outside Sluice; restore them, \
         or remove the output and the checkpoints and run again",
    )
}

/// Checks that the staged file of `record` has the recorded size.
fn check_staged_size(staged: &Path, record: &StagedRecord, length: u64) -> Result<(), SluiceError> {
    if length == record.size {
        return Ok(());
    }
    let message = format!("{} is {length} bytes, its pre-commit recorded {}", staged.display(), record.size);
    Err(SluiceError::external("sink.staged_corrupt", message)
        .with_fix("the staged file was changed outside Sluice; remove the output and the checkpoints and run again"))
}

/// Directory mode: renames each staged file to its visible part.
fn commit_parts(layout: &Layout, directory: &Path, epoch: Epoch, records: &[StagedRecord]) -> Result<(), SluiceError> {
    for record in records {
        let staged = layout.staging.join(&record.file);
        let visible = layout.visible_part(directory, epoch, record.slot);
        match length_of(&staged)? {
            Some(length) => {
                check_staged_size(&staged, record, length)?;
                fs::rename(&staged, &visible).map_err(|error| io_error(&visible, &error))?;
                sluice_types::failpoint!("sink.file.mid_commit");
            }
            None => match length_of(&visible)? {
                Some(length) if length == record.size => {}
                Some(length) => {
                    let detail = format!("is {length} bytes, not the recorded {}", record.size);
                    return Err(staged_missing(&staged, &visible, record.epoch, &detail));
                }
                None => return Err(staged_missing(&staged, &visible, record.epoch, "does not exist")),
            },
        }
    }
    sync_directory(directory)?;
    sync_directory(&layout.staging)
}

/// File mode: appends the staged file to the target at `length_before`, then removes it.
fn commit_append(layout: &Layout, target: &Path, record: &StagedRecord) -> Result<(), SluiceError> {
    let staged = layout.staging.join(&record.file);
    let Some(length_before) = record.length_before else {
        let message = format!("the file-mode record of {} has no length_before", record.file);
        return Err(SluiceError::internal("sink.record", message));
    };
    let end = length_before + record.size;
    let Some(staged_length) = length_of(&staged)? else {
        return match length_of(target)? {
            Some(length) if length >= end => Ok(()),
            length => {
                let detail = format!("is {} bytes, short of the {end} it holds once committed", length.unwrap_or(0));
                Err(staged_missing(&staged, target, record.epoch, &detail))
            }
        };
    };
    check_staged_size(&staged, record, staged_length)?;
    let output = File::options().create(true).write(true).truncate(false).open(target);
    let mut output = output.map_err(|error| io_error(target, &error))?;
    let length = output.metadata().map_err(|error| io_error(target, &error))?.len();
    if length < length_before {
        let message = format!(
            "{} is {length} bytes, shorter than the {length_before} bytes committed before epoch {}",
            target.display(),
            record.epoch
        );
        return Err(SluiceError::external("sink.target_truncated", message)
            .with_fix("the output file was changed outside Sluice; remove it and the checkpoints and run again"));
    }
    let appended = (|| {
        output.set_len(length_before)?;
        output.seek(SeekFrom::Start(length_before))?;
        io::copy(&mut File::open(&staged)?, &mut output)?;
        output.flush()?;
        output.sync_all()
    })();
    appended.map_err(|error| io_error(target, &error))?;
    if length_before == 0 {
        sync_directory(parent_of(target))?;
    }
    fs::remove_file(&staged).map_err(|error| io_error(&staged, &error))?;
    sync_directory(&layout.staging)
}

/// At recovery: removes in-progress files and the staged files of epochs after
/// `epoch`, and visible output of those epochs (`records`: the restored manifest's);
/// with `None`, all staged work and the visible output of an earlier run.
pub(super) fn discard_after(sink: &FileSink, epoch: Option<Epoch>, records: &[Vec<u8>]) -> Result<(), SluiceError> {
    let layout = Layout::of(sink)?;
    let Some(epoch) = epoch else { return discard_all(&layout) };
    let mut committed_length = None;
    for bytes in records.iter().filter(|bytes| !bytes.is_empty()) {
        let record = StagedRecord::decode(bytes)?;
        committed_length = committed_length.max(record.length_after());
    }
    let entries = match fs::read_dir(&layout.staging) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error(&layout.staging, &error)),
    };
    for entry in entries {
        let entry = entry.map_err(|error| io_error(&layout.staging, &error))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let later = staged_epoch(&name).is_some_and(|staged| staged > epoch.0);
        if later || name.ends_with(IN_PROGRESS_SUFFIX) {
            remove_if_present(&entry.path())?;
        }
    }
    sync_directory(&layout.staging)?;
    match &layout.target {
        Target::Directory(directory) => discard_parts_after(directory, epoch),
        Target::File(target) => match committed_length {
            Some(length) => cut_back(target, epoch, length),
            // A manifest from before length markers whose epoch had no rows: the length
            // is unknown, and the target is left as it is.
            None => Ok(()),
        },
    }
}

/// File mode: cuts the target back to `length`, its length once `epoch` was committed.
/// Longer, it holds epochs after `epoch`, committed before recovery fell back past a
/// damaged newer checkpoint; the replay from `epoch` appends their rows again.
fn cut_back(target: &Path, epoch: Epoch, length: u64) -> Result<(), SluiceError> {
    let Some(current) = length_of(target)? else { return Ok(()) };
    if current < length {
        let message = format!(
            "{} is {current} bytes, shorter than the {length} bytes committed up to epoch {}",
            target.display(),
            epoch.0
        );
        return Err(SluiceError::external("sink.target_truncated", message)
            .with_fix("the output file was changed outside Sluice; remove it and the checkpoints and run again"));
    }
    if current > length {
        let output = File::options().write(true).open(target).map_err(|error| io_error(target, &error))?;
        let cut = output.set_len(length).and_then(|()| output.sync_all());
        cut.map_err(|error| io_error(target, &error))?;
        tracing::warn!(
            target = %target.display(),
            epoch = epoch.0,
            bytes = current - length,
            "removed output of epochs after the restored checkpoint; the run writes it again"
        );
    }
    Ok(())
}

/// Directory mode: removes visible parts of epochs after `epoch`. They exist only when
/// recovery fell back past a damaged newer checkpoint whose epochs were committed; the
/// replay from `epoch` writes those rows again.
fn discard_parts_after(directory: &Path, epoch: Epoch) -> Result<(), SluiceError> {
    let entries = match fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error(directory, &error)),
    };
    let mut removed = false;
    for entry in entries {
        let entry = entry.map_err(|error| io_error(directory, &error))?;
        let name = entry.file_name();
        let visible_epoch = name.to_string_lossy().strip_prefix("part-").and_then(|rest| {
            let digits = rest.get(..20)?;
            digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse::<u64>().ok())?
        });
        if visible_epoch.is_some_and(|visible| visible > epoch.0) {
            remove_if_present(&entry.path())?;
            removed = true;
        }
    }
    if removed { sync_directory(directory) } else { Ok(()) }
}

/// The epoch of a staged file's name (`epoch-{e:020}-part-…`).
fn staged_epoch(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("epoch-")?.get(..20)?;
    digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok())?
}

/// Removes a file another worker sharing the directory may have removed first (every
/// worker of a cluster discards before any of them writes: see the engine's recovery).
fn remove_if_present(path: &Path) -> Result<(), SluiceError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io_error(path, &error)),
    }
}

/// A fresh start: removes the staging directory and the visible output. Workers sharing
/// the directory may remove the same entries at once: a removal that fails while the
/// directory is still there is tried again, a bounded number of times.
fn discard_all(layout: &Layout) -> Result<(), SluiceError> {
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        match fs::remove_dir_all(&layout.staging) {
            Ok(()) => break,
            Err(error) if error.kind() == io::ErrorKind::NotFound => break,
            Err(error) if attempt == ATTEMPTS || !layout.staging.exists() => {
                if layout.staging.exists() {
                    return Err(io_error(&layout.staging, &error));
                }
                break;
            }
            Err(_) => {}
        }
    }
    let (directory, removed) = match &layout.target {
        Target::File(target) => {
            let removed = match fs::remove_file(target) {
                Ok(()) => true,
                Err(error) if error.kind() == io::ErrorKind::NotFound => false,
                Err(error) => return Err(io_error(target, &error)),
            };
            (parent_of(target).to_path_buf(), removed)
        }
        Target::Directory(directory) => (directory.clone(), remove_visible_parts(directory, layout.extension)?),
    };
    if removed { sync_directory(&directory) } else { Ok(()) }
}

/// Removes `part-{slot}.{ext}` and `part-{epoch}-{slot}.{ext}` files; whether any was.
fn remove_visible_parts(directory: &Path, extension: &str) -> Result<bool, SluiceError> {
    let entries = match fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(io_error(directory, &error)),
    };
    let suffix = format!(".{extension}");
    let mut removed = false;
    for entry in entries {
        let entry = entry.map_err(|error| io_error(directory, &error))?;
        let name = entry.file_name();
        let Some(middle) = name.to_str().and_then(|n| n.strip_prefix("part-")?.strip_suffix(suffix.as_str())) else {
            continue;
        };
        let numbers: Vec<&str> = middle.split('-').collect();
        if numbers.len() <= 2 && numbers.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            remove_if_present(&entry.path())?;
            removed = true;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod property_tests;
