//! The sinks: `stdout`, `file` and `blackhole`.
//!
//! - **stdout** ([`SinkParallelism::Single`]): a pretty table per batch, or JSON lines.
//!   Each batch is encoded into a buffer and written with one locked write, then
//!   flushed, so output appears as soon as a batch is done. A closed standard output
//!   (`sluice run ... | head`) is an External `sink.stdout_closed` error, never a panic.
//! - **file**, `mode = "file"` ([`SinkParallelism::Single`]): everything goes to `path`
//!   (parent directories are created; an existing file is replaced).
//! - **file**, `mode = "directory"` ([`SinkParallelism::PerThread`]): slot `i` writes
//!   `path/part-{i}.jsonl` or `path/part-{i}.csv` (the directory is created). Slot 0
//!   also removes the parts `part-{k}` with `k >= slots` left by an earlier run with
//!   more threads, so the directory holds exactly this run's output.
//!
//!   Files are JSON lines or CSV with a header line, written through a buffer; `close`
//!   flushes and fsyncs. Opening fails at once, naming the path, the OS reason and the
//!   fix, when the location cannot be written; [`check_sink`] makes the same check
//!   without creating anything but a probe file it removes at once.
//! - **blackhole** ([`SinkParallelism::PerThread`]): writes nothing (the runtime counts
//!   the rows).
//!
//! # Exactly-once (staged) file output
//!
//! The file sink is the one exactly-once sink ([`SinkFactory::exactly_once`]). Opened
//! with `staged = true` it stages each epoch's rows in a hidden directory and makes
//! them visible only on [`SinkFactory::commit`] (the `staging` module has the file names
//! and the correctness argument):
//!
//! - `mode = "directory"`: one visible part per epoch and slot that wrote rows,
//!   `path/part-{epoch:020}-{slot}.{ext}` (e.g. `part-00000000000000000003-1.csv`),
//!   each CSV part with its header; staged work lives in `path/.staging/`.
//! - `mode = "file"`: each committed epoch is appended to `path`, the CSV header once
//!   at its start; staged work lives in `.NAME.staging/` beside it.
//!
//! A fresh start (`discard_after(None)`) removes staged work and the earlier run's
//! visible output, as an unstaged run replaces it. stdout and blackhole cannot stage:
//! opened with `staged = true` they behave as unstaged (at-least-once).
//!
//! When the sink's input is *updating* (it can carry retractions), every row is written
//! with an op column first, Flink's changelog: `+I` for an insert, `-D` for a
//! retraction, and `-U`/`+U` for the old and new version of a row whose upsert key
//! the stream has (see [`sluice_formats::encode`]). An append-only input is written
//! without it.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_config::{ConfigError, SinkConfig};
use sluice_formats::{Encoder, OutputFormat};
use sluice_runtime::{SinkFactory, SinkParallelism, SinkWriter};
use sluice_types::{Batch, Epoch, ErrorKind, SluiceError};

use crate::FileFormat;
use crate::connector::{ConfiguredSink, OptionDoc, SinkConnector, SinkContext, forbid_item, format_choice, resolve};

mod staging;

/// How the stdout sink prints rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StdoutFormat {
    /// Aligned tables, for people.
    #[default]
    Pretty,
    /// One JSON object per line, for programs.
    Json,
}

/// Whether a file sink's path is one file or a directory of files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileMode {
    /// Everything goes to the one file at `path`.
    File,
    /// Files are written inside the directory at `path`.
    Directory,
}

impl FileMode {
    /// The default for a path: a directory if it ends with `/` or has no extension,
    /// a file otherwise.
    pub fn default_for(path: &str) -> Self {
        let has_extension = Path::new(path).extension().is_some();
        if path.ends_with('/') || !has_extension { Self::Directory } else { Self::File }
    }
}

/// `[sink.options]` of a file sink, and its `format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSinkOptions {
    /// As written; relative paths are relative to the pipeline file's directory.
    pub path: PathBuf,
    /// How rows are encoded (default json).
    pub format: FileFormat,
    /// One file, or a directory of files (default: from the path's shape).
    pub mode: FileMode,
}

/// The `stdout` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct StdoutConnector;

impl SinkConnector for StdoutConnector {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn options(&self) -> &'static [OptionDoc] {
        &[]
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredStdout { format: stdout_format_of(config)? }))
    }
}

/// The validated format of a `connector = "stdout"` sink, or every problem.
pub fn stdout_format_of(config: &SinkConfig) -> Result<StdoutFormat, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let formats = [("pretty", StdoutFormat::Pretty), ("json", StdoutFormat::Json)];
    let format = format_choice(config.format.as_ref(), &config.options, config.position, &formats, false, &mut errors);
    let mut reader = config.options.read();
    reader.check_keys(&[]);
    crate::connector::finish(reader, errors)?;
    Ok(format.unwrap_or_default())
}

#[derive(Debug, Clone, Copy)]
struct ConfiguredStdout {
    format: StdoutFormat,
}

impl ConfiguredSink for ConfiguredStdout {
    fn writes_stdout(&self) -> bool {
        true
    }

    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        Ok(Arc::new(StdoutSink {
            name: context.config.name.clone(),
            format: self.format,
            schema: Arc::clone(&context.schema),
            updating: context.updating,
            upsert_key: context.upsert_key.clone(),
        }))
    }
}

const FILE_OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "path", kind: "string", default: "required", doc: "a file, or a directory of parts" },
    OptionDoc {
        key: "mode",
        kind: "\"file\" or \"directory\"",
        default: "directory when the path ends with / or has no extension",
        doc: "one file, or one part per thread and epoch",
    },
];

/// The `file` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct FileSinkConnector;

impl SinkConnector for FileSinkConnector {
    fn name(&self) -> &'static str {
        "file"
    }

    fn options(&self) -> &'static [OptionDoc] {
        FILE_OPTIONS
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredFileSink { options: file_options_of(config)? }))
    }
}

/// The validated options of a `connector = "file"` sink, or every problem.
pub fn file_options_of(config: &SinkConfig) -> Result<FileSinkOptions, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let format = format_choice(
        config.format.as_ref(),
        &config.options,
        config.position,
        crate::FILE_FORMATS,
        false,
        &mut errors,
    );
    let mut reader = config.options.read();
    reader.check_keys(&["path", "mode"]);
    let path = reader.string(
        "path",
        "a non-empty file or directory path",
        "set path to a file or a directory, e.g. path = \"out/hot_items\"",
        |s| !s.is_empty(),
    );
    let path = reader.required(
        "path",
        path,
        "add path = \"<file or directory>\" under [sink.options] \
         (relative paths are relative to the pipeline file)",
    );
    let mode = reader.choice("mode", &[("file", FileMode::File), ("directory", FileMode::Directory)]);
    let format_valid = config.format.is_none() || format.is_some();
    let parsed = (|| {
        let path = path?;
        let mode = mode.or_else(|| FileMode::default_for(&path.value))?;
        format_valid.then_some(())?;
        Some(FileSinkOptions { path: PathBuf::from(path.value), format: format.unwrap_or(FileFormat::Json), mode })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// A validated file sink.
#[derive(Debug, Clone)]
pub struct ConfiguredFileSink {
    pub options: FileSinkOptions,
}

impl ConfiguredSink for ConfiguredFileSink {
    fn output_paths(&self, base_dir: &Path) -> Vec<PathBuf> {
        vec![resolve(base_dir, &self.options.path)]
    }

    fn check(&self, base_dir: &Path) -> Result<(), SluiceError> {
        check_sink(&self.options, base_dir)
    }

    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        Ok(Arc::new(
            FileSink::new(&context.config.name, &self.options, context.base_dir, &context.schema, context.updating)
                .with_upsert_key(context.upsert_key.clone()),
        ))
    }
}

/// The `blackhole` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct BlackholeConnector;

impl SinkConnector for BlackholeConnector {
    fn name(&self) -> &'static str {
        "blackhole"
    }

    fn options(&self) -> &'static [OptionDoc] {
        &[]
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let found = config.format.as_ref().map(|f| format!("\"{}\"", f.value)).unwrap_or_default();
        forbid_item(
            config.format.as_ref(),
            "format",
            &found,
            &config.options,
            "the blackhole connector discards rows",
            "remove `format`",
            &mut errors,
        );
        let mut reader = config.options.read();
        reader.check_keys(&[]);
        crate::connector::finish(reader, errors)?;
        Ok(Box::new(ConfiguredBlackhole))
    }
}

#[derive(Debug, Clone, Copy)]
struct ConfiguredBlackhole;

impl ConfiguredSink for ConfiguredBlackhole {
    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        Ok(Arc::new(BlackholeSink { name: context.config.name.clone() }))
    }
}

/// Checks that a file sink can write where it is told to, creating nothing: the
/// output's directory must exist or be creatable, and be writable.
pub fn check_sink(options: &FileSinkOptions, base_dir: &Path) -> Result<(), SluiceError> {
    let FileSinkOptions { path, mode, .. } = options;
    let resolved = resolve(base_dir, path);
    let directory = match mode {
        FileMode::File => {
            if resolved.is_dir() {
                return Err(path_error(&resolved, "is a directory")
                    .with_fix("name a file in `path`, or set mode = \"directory\""));
            }
            if resolved.is_file() {
                // Opening for writing without truncating changes nothing.
                File::options().write(true).open(&resolved).map_err(|error| open_error(&resolved, &error))?;
            }
            resolved.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        }
        FileMode::Directory => resolved.clone(),
    };
    check_directory(&directory)
}

/// Checks that `directory` exists or can be created, and is writable.
fn check_directory(directory: &Path) -> Result<(), SluiceError> {
    let fix = "choose a `path` in a writable directory, or fix the permissions";
    let existing = directory.ancestors().find(|a| a.as_os_str().is_empty() || a.exists());
    let existing = match existing {
        Some(a) if a.as_os_str().is_empty() => Path::new("."),
        Some(a) => a,
        None => return Err(path_error(directory, "has no existing parent directory").with_fix(fix)),
    };
    if !existing.is_dir() {
        let reason = format!("cannot be created: {} is not a directory", existing.display());
        return Err(path_error(directory, &reason).with_fix(fix));
    }
    let probe = existing.join(format!(".sluice-write-check-{}", std::process::id()));
    match File::options().write(true).create_new(true).open(&probe) {
        Ok(file) => {
            drop(file);
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => {
            let reason = format!("is not writable ({} cannot be written: {error})", existing.display());
            Err(path_error(directory, &reason).with_fix(fix))
        }
    }
}

/// A sink path problem, for the user to fix.
fn path_error(path: &Path, reason: &str) -> SluiceError {
    SluiceError::user("sink.path", format!("path {} {reason}", path.display()))
}

/// A failure opening `path` for writing.
fn open_error(path: &Path, error: &io::Error) -> SluiceError {
    SluiceError::user("sink.path", format!("cannot write {}: {error}", path.display()))
        .with_fix("choose a `path` in a writable directory (it is created if missing), or fix the permissions")
}

/// A failure writing to `what` after it was opened.
/// How `describe` says that a sink writes a changelog: `, changelog (op column, upsert
/// key auction)`; nothing for an append-only input.
fn changelog_note(updating: bool, upsert_key: Option<&[usize]>, schema: &SchemaRef) -> String {
    if !updating {
        return String::new();
    }
    match upsert_key {
        Some(key) if !key.is_empty() => {
            let names: Vec<&str> = key.iter().map(|&c| schema.field(c).name().as_str()).collect();
            format!(", changelog (op column, upsert key {})", names.join(", "))
        }
        Some(_) => ", changelog (op column, one row)".to_string(),
        None => ", changelog (op column)".to_string(),
    }
}

fn write_error(what: &str, error: &io::Error) -> SluiceError {
    SluiceError::external("sink.io", format!("cannot write {what}: {error}"))
        .with_fix("check the free space and the health of the file system")
}

/// The standard-output sink.
#[derive(Debug)]
pub struct StdoutSink {
    name: String,
    format: StdoutFormat,
    schema: SchemaRef,
    updating: bool,
    /// The stream's upsert key: a change of one row is written `-U`/`+U`.
    upsert_key: Option<Vec<usize>>,
}

impl StdoutSink {
    /// A writer to any byte stream, encoded as this sink encodes (for tests and tools).
    pub fn writer_to(&self, target: Box<dyn Write + Send>) -> Box<dyn SinkWriter> {
        let format = match self.format {
            StdoutFormat::Pretty => OutputFormat::Pretty,
            StdoutFormat::Json => OutputFormat::JsonLines,
        };
        Box::new(StreamWriter {
            target,
            encoder: Encoder::new(format, self.schema.clone(), self.updating)
                .with_upsert_key(self.upsert_key.as_deref()),
            buffer: Vec::new(),
            encoded: 0,
        })
    }
}

impl SinkFactory for StdoutSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::Single
    }

    /// Standard output cannot stage: `staged` is ignored (at-least-once).
    fn open(&self, _slot: u32, _slots: u32, _staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        // `Stdout` locks once per `write_all`: a batch is never interleaved with other output.
        Ok(self.writer_to(Box::new(io::stdout())))
    }

    fn describe(&self) -> String {
        let format = match self.format {
            StdoutFormat::Pretty => "pretty",
            StdoutFormat::Json => "json",
        };
        format!("stdout({format}{})", changelog_note(self.updating, self.upsert_key.as_deref(), &self.schema))
    }
}

/// Writes each encoded batch to a stream at once.
struct StreamWriter {
    target: Box<dyn Write + Send>,
    encoder: Encoder,
    buffer: Vec<u8>,
    /// Bytes written since [`SinkWriter::take_bytes`] last asked.
    encoded: u64,
}

impl StreamWriter {
    fn stream_error(&self, error: &io::Error) -> SluiceError {
        if error.kind() == io::ErrorKind::BrokenPipe {
            SluiceError::external("sink.stdout_closed", "standard output was closed by its reader (broken pipe)")
                .with_fix("keep the reader of the output running, or write to a file sink")
                .with_kind(ErrorKind::OutputClosed)
        } else {
            write_error("standard output", error)
        }
    }
}

impl SinkWriter for StreamWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        self.buffer.clear();
        self.encoder.encode(batch, &mut self.buffer)?;
        if self.buffer.is_empty() {
            return Ok(());
        }
        let written = self.target.write_all(&self.buffer).and_then(|()| self.target.flush());
        written.map_err(|error| self.stream_error(&error))?;
        self.encoded += self.buffer.len() as u64;
        Ok(())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        self.target.flush().map_err(|error| self.stream_error(&error))
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.encoded)
    }
}

/// The file sink: one file, or a directory of one part per thread.
#[derive(Debug)]
pub struct FileSink {
    name: String,
    /// As written, for `describe`.
    written_path: PathBuf,
    path: PathBuf,
    format: FileFormat,
    mode: FileMode,
    schema: SchemaRef,
    updating: bool,
    /// The stream's upsert key: a change of one row is written `-U`/`+U`.
    upsert_key: Option<Vec<usize>>,
}

impl FileSink {
    /// The file sink named `name` writing rows of `schema` as `options` say.
    pub fn new(name: &str, options: &FileSinkOptions, base_dir: &Path, schema: &SchemaRef, updating: bool) -> FileSink {
        FileSink {
            name: name.to_owned(),
            written_path: options.path.clone(),
            path: resolve(base_dir, &options.path),
            format: options.format,
            mode: options.mode,
            schema: Arc::clone(schema),
            updating,
            upsert_key: None,
        }
    }

    /// Writes a change of one row of the stream keyed by `upsert_key` as `-U`/`+U`.
    pub fn with_upsert_key(mut self, upsert_key: Option<Vec<usize>>) -> FileSink {
        self.upsert_key = upsert_key;
        self
    }

    fn extension(&self) -> &'static str {
        match self.format {
            FileFormat::Json => "jsonl",
            FileFormat::Csv => "csv",
        }
    }

    /// The file slot `slot` writes.
    pub fn file_of(&self, slot: u32) -> PathBuf {
        match self.mode {
            FileMode::File => self.path.clone(),
            FileMode::Directory => self.path.join(format!("part-{slot}.{}", self.extension())),
        }
    }

    /// Removes the parts of slots `slots..` left by an earlier, wider run.
    fn remove_stale_parts(&self, slots: u32) -> Result<(), SluiceError> {
        let entries = std::fs::read_dir(&self.path).map_err(|error| open_error(&self.path, &error))?;
        let suffix = format!(".{}", self.extension());
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(slot) = name.to_str().and_then(|n| n.strip_prefix("part-")?.strip_suffix(suffix.as_str())) else {
                continue;
            };
            if slot.parse::<u32>().is_ok_and(|slot| slot >= slots) {
                std::fs::remove_file(entry.path()).map_err(|error| open_error(&entry.path(), &error))?;
            }
        }
        Ok(())
    }
}

impl SinkFactory for FileSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        match self.mode {
            FileMode::File => SinkParallelism::Single,
            FileMode::Directory => SinkParallelism::PerThread,
        }
    }

    /// Unstaged: writes the file or part at once. Staged: see the `staging` module.
    fn open(&self, slot: u32, slots: u32, staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        if staged {
            return Ok(Box::new(staging::StagedWriter::open(self, slot)?));
        }
        let directory = match self.mode {
            FileMode::File => self.path.parent().map(Path::to_path_buf),
            FileMode::Directory => Some(self.path.clone()),
        };
        if let Some(directory) = directory.filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(&directory).map_err(|error| open_error(&directory, &error))?;
        }
        if self.mode == FileMode::Directory && slot == 0 {
            self.remove_stale_parts(slots)?;
        }
        let path = self.file_of(slot);
        let file = File::create(&path).map_err(|error| open_error(&path, &error))?;
        let format = match self.format {
            FileFormat::Json => OutputFormat::JsonLines,
            FileFormat::Csv => OutputFormat::Csv { header: true },
        };
        Ok(Box::new(FileWriter {
            path,
            file: BufWriter::with_capacity(1 << 20, file),
            encoder: Encoder::new(format, self.schema.clone(), self.updating)
                .with_upsert_key(self.upsert_key.as_deref()),
            buffer: Vec::new(),
            encoded: 0,
        }))
    }

    fn describe(&self) -> String {
        let format = match self.format {
            FileFormat::Json => "json",
            FileFormat::Csv => "csv",
        };
        let mode = match self.mode {
            FileMode::File => "file",
            FileMode::Directory => "directory",
        };
        let changelog = changelog_note(self.updating, self.upsert_key.as_deref(), &self.schema);
        format!("file(path={}, {format}, {mode}{changelog})", self.written_path.display())
    }

    fn exactly_once(&self) -> bool {
        true
    }

    fn commit(&self, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        staging::commit(self, epoch, records)
    }

    fn discard_after(&self, epoch: Option<Epoch>, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        staging::discard_after(self, epoch, records)
    }
}

/// Writes one output file.
struct FileWriter {
    path: PathBuf,
    file: BufWriter<File>,
    encoder: Encoder,
    buffer: Vec<u8>,
    /// Bytes written since [`SinkWriter::take_bytes`] last asked.
    encoded: u64,
}

impl FileWriter {
    fn error(&self, error: &io::Error) -> SluiceError {
        write_error(&self.path.display().to_string(), error)
    }
}

impl SinkWriter for FileWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        sluice_types::failpoint!("sink.write");
        self.buffer.clear();
        self.encoder.encode(batch, &mut self.buffer)?;
        self.file.write_all(&self.buffer).map_err(|error| self.error(&error))?;
        self.encoded += self.buffer.len() as u64;
        Ok(())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        self.file.flush().map_err(|error| self.error(&error))?;
        self.file.get_ref().sync_all().map_err(|error| self.error(&error))
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.encoded)
    }
}

/// Discards every row.
#[derive(Debug)]
pub struct BlackholeSink {
    name: String,
}

impl SinkFactory for BlackholeSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    /// Nothing to stage: `staged` is ignored.
    fn open(&self, _slot: u32, _slots: u32, _staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        Ok(Box::new(Blackhole))
    }

    fn describe(&self) -> String {
        "blackhole".to_string()
    }
}

struct Blackhole;

impl SinkWriter for Blackhole {
    fn write(&mut self, _batch: &Batch) -> Result<(), SluiceError> {
        Ok(())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
