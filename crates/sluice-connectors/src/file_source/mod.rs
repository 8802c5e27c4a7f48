//! The file source: one file, or every file of a directory, as JSON lines or CSV, or as
//! the changes of a table (a changelog format, see below).
//!
//! # Files
//!
//! `path` is a file, or a directory whose regular files (not hidden ones, whose names
//! start with `.`; not subdirectories) are read, in name order. A missing path or an
//! empty directory is an error at planning time that names the resolved path.
//!
//! A `path` that is not a regular file (a named pipe, `/dev/stdin`, a device) has no
//! size and cannot seek: it is read as one *streaming* lane, from its start to its end
//! of file, and planning reads nothing from it (its CSV header is checked when the lane
//! reads it). A position in it cannot be resumed after a restart:
//! [`FileSource::is_streaming`] tells, so that checkpoints of such a source can be
//! refused, and a streaming lane refuses to resume from a position.
//!
//! # Lanes
//!
//! A file of at most `split_bytes` (8 MiB) is one lane. When there are fewer files than
//! threads, the larger files are split into contiguous byte ranges `[start, end)` so
//! that there are about `max(threads, files)` lanes in all (never pieces under an eighth
//! of `split_bytes`). The layout (files, their identities, ranges) is recorded in every
//! checkpoint, and a resumed run lays its lanes out the same way, refusing an input that
//! changed other than by appending (see the `layout` module).
//!
//! A lane reads exactly the records that *start* inside its range, so every record is
//! read by exactly one lane whatever the split:
//! - a CSV record may span lines (a quoted field may hold line breaks), so planning
//!   moves the split points of a CSV file read by several lanes to record starts (a
//!   scan of the file's quotes from its start, see [`csv_plan`]), and each lane reads
//!   exactly its range;
//! - a JSON record is a line: a lane that does not start at byte 0 seeks to
//!   `start - 1` and skips through the first line break, and every lane reads past
//!   `end` to finish its last line.
//!
//! A CSV header is only the first record of a file, read (and skipped) by the lane
//! starting at byte 0. At planning time, every file's first record is checked (see
//! [`csv_plan`]): with `header = true`, the header against the schema; with
//! `header = false`, that it is not exactly the column names (a forgotten
//! `header = true`).
//!
//! Line numbers are those of the file: a lane that starts mid-file counts the line
//! breaks before its first line, once, the first time it needs a line number (to
//! report a bad row), so a clean input never pays for the count.
//!
//! # Changelog formats
//!
//! `changelog-json` and `changelog-csv` read the `op` column the file sink writes for an
//! updating stream; `debezium-json` reads one Debezium change event per line, as the
//! Kafka source reads a message of that format (the `envelopes` module: a line `null`,
//! `kafka-console-consumer`'s tombstone, and a blank line give no row). Their rows carry
//! their kinds and are read by `primary_key` (`crate::changelog`). A key's changes must
//! reach the normalization in order, so a changelog file is never split (`split_bytes`
//! is refused), and the files of a directory are read by one lane, one after another in
//! name order (the `chain` module): a key's changes may span files whose names sort in
//! the order the changes were made, as the `file` sink's parts (`part-{epoch}-{slot}`)
//! do. Lanes on different threads could not keep that order, even read one after the
//! other: nothing orders what two threads send.
//!
//! # Rows, watermarks, bad rows
//!
//! Each lane reads through a [`LineChunker`](sluice_formats::LineChunker) (a bounded
//! buffer) and decodes with a [`Decoder`](sluice_formats::Decoder), one chunk per
//! poll. With an `event_time` column, the lane's watermark after each poll is the
//! largest event time it has read (timestamps of any unit, in ms) minus
//! `watermark_delay`.
//!
//! A bad row (see [`sluice_formats`] for what makes one) is handled per `on_error`:
//! - `skip`: counted in the source's `bad_rows`; the first 5 of the source are logged
//!   in full (`file:line: reason: text`), later ones only counted (the exit report
//!   prints the count).
//! - `fail`: the lane fails with a `source.bad_row` error naming the file, line,
//!   reason and text.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef};
use sluice_config::{ConfigError, OnError, SourceConfig};
use sluice_formats::{Decoder, DecoderOptions, RowFormat};
use sluice_runtime::{LaneContext, LaneReader, SourceFactory, TableDef};
use sluice_types::SluiceError;

use crate::FileFormat;
use crate::connector::{ConfiguredSource, OptionDoc, SourceConnector, SourceContext, format_choice, resolve};

mod chain;
mod csv_plan;
mod envelopes;
mod lane;
mod layout;

#[cfg(test)]
mod debezium_tests;
#[cfg(test)]
mod tests;

use chain::ChainedLane;
pub use lane::FileLane;

/// Files larger than this are split into several lanes when there are threads to spare.
pub const SPLIT_ABOVE_BYTES: u64 = 8 << 20;
/// The smallest byte range a split produces.
const MIN_PIECE_BYTES: u64 = 1 << 20;
/// Batch size used to check the schema at planning time.
const CHECK_BATCH_SIZE: usize = 1024;

/// A byte range of one file, read by one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneRange {
    /// Index into the source's file list.
    pub file: usize,
    /// For CSV, 0 or the start of a record.
    pub start: u64,
    /// Exclusive; the file's size for its last range.
    pub end: u64,
}

/// How reading is tuned (fixed in production; small values let tests split tiny files).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    pub split_above_bytes: u64,
    pub min_piece_bytes: u64,
    pub chunk_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            split_above_bytes: SPLIT_ABOVE_BYTES,
            min_piece_bytes: MIN_PIECE_BYTES,
            chunk_bytes: sluice_formats::DEFAULT_CHUNK_BYTES,
        }
    }
}

/// What every lane of one source shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub name: String,
    pub files: Vec<PathBuf>,
    /// The schema decoded: the declared one, after the `op` column for a changelog.
    pub schema: SchemaRef,
    /// A changelog's output schema: the declared columns and the row kinds.
    pub kinds_schema: Option<SchemaRef>,
    /// How the rows are changes, for a changelog format.
    pub changelog: Option<FileChangelog>,
    pub format: RowFormat,
    /// Index of the event-time column.
    pub event_time: Option<usize>,
    pub watermark_delay_ms: i64,
    /// See `SourceFactory::max_watermark_drift`.
    pub max_watermark_drift_ms: Option<i64>,
    pub on_error: OnError,
    pub chunk_bytes: usize,
    /// Rows per second per lane, when the source replays at a rate.
    pub lane_rate: Option<f64>,
    /// For each file, whether it is not a regular file (a pipe, a device): read whole,
    /// without seeking, by one lane.
    pub streaming: Vec<bool>,
}

/// `[source.options]` of a file source, and its `format`.
#[derive(Debug, Clone, PartialEq)]
pub struct FileOptions {
    /// As written; relative paths are relative to the pipeline file's directory.
    pub path: PathBuf,
    pub format: FileFormat,
    /// CSV: the first line of each file is a header (default false, as in Flink).
    pub header: bool,
    /// CSV: the field delimiter (default `,`).
    pub delimiter: u8,
    /// Replay at most this many rows per second, over all lanes (default: full speed).
    pub rate: Option<f64>,
    /// Files larger than this are split into several lanes (pieces of at least an eighth
    /// of it) when there are threads to spare (default 8 MiB).
    pub split_bytes: Option<u64>,
    /// A changelog format (`changelog-json`, `changelog-csv`, `debezium-json`): the rows
    /// are changes of a table, read by `primary_key`.
    pub changelog: Option<FileChangelog>,
}

/// How the rows of a changelog file are changes of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChangelog {
    /// `changelog-json`, `changelog-csv`: each row has an `op` (`+I`, `-U`, `+U`, `-D`),
    /// as the file sink writes an updating stream.
    OpColumn,
    /// `debezium-json`: each line is a Debezium change event, read as the Kafka source
    /// reads one (the `envelopes` module).
    Debezium,
}

impl FileOptions {
    /// `path` in `format` with the defaults.
    pub fn new(path: impl Into<PathBuf>, format: FileFormat) -> FileOptions {
        FileOptions {
            path: path.into(),
            format,
            header: false,
            delimiter: b',',
            rate: None,
            split_bytes: None,
            changelog: None,
        }
    }
}

const OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "path", kind: "string", default: "required", doc: "a file or a directory of files" },
    OptionDoc { key: "header", kind: "boolean", default: "false", doc: "csv: the first line names the columns" },
    OptionDoc { key: "delimiter", kind: "one ASCII character", default: "\",\"", doc: "csv: the field delimiter" },
    OptionDoc { key: "rate", kind: "number > 0", default: "unlimited", doc: "rows per second, over all lanes" },
    OptionDoc {
        key: "split_bytes",
        kind: "integer >= 1",
        default: "8388608 (8 MiB)",
        doc: "files larger than this are read by several lanes when there are threads to spare \
              (refused with a changelog format: each of its files is one lane)",
    },
];

/// The `file` source connector.
#[derive(Debug, Clone, Copy)]
pub struct FileConnector;

impl SourceConnector for FileConnector {
    fn name(&self) -> &'static str {
        "file"
    }

    fn options(&self) -> &'static [OptionDoc] {
        OPTIONS
    }

    fn configure(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredFile { table: config.name.clone(), options: options_of(config)? }))
    }
}

/// `format = "…"` of a file source: the row format, and how rows are changes of a table
/// (an `op` column, what the file sink writes for an updating stream, or Debezium events).
const SOURCE_FORMATS: &[(&str, (FileFormat, Option<FileChangelog>))] = &[
    ("json", (FileFormat::Json, None)),
    ("csv", (FileFormat::Csv, None)),
    ("changelog-json", (FileFormat::Json, Some(FileChangelog::OpColumn))),
    ("changelog-csv", (FileFormat::Csv, Some(FileChangelog::OpColumn))),
    ("debezium-json", (FileFormat::Json, Some(FileChangelog::Debezium))),
];

/// The validated options of a `connector = "file"` source, or every problem.
pub fn options_of(config: &SourceConfig) -> Result<FileOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let format = format_choice(config.format.as_ref(), options, config.position, SOURCE_FORMATS, true, &mut errors);
    let changelog = format.and_then(|(_, changelog)| changelog);
    let format = format.map(|(format, _)| format);
    if config.schema.is_none() {
        errors.push(options.item_error(
            config.position,
            "missing required key `schema`",
            "add the columns and their SQL types, e.g. schema = \"id BIGINT, name VARCHAR\"",
        ));
    }
    let mut reader = options.read();
    reader.check_keys(&["path", "header", "delimiter", "rate", "split_bytes"]);
    let path = reader.string(
        "path",
        "a non-empty file or directory path",
        "set path to a file or a directory, e.g. path = \"data/bids.json\"",
        |s| !s.is_empty(),
    );
    let path = reader.required(
        "path",
        path,
        "add path = \"<file or directory>\" under [source.options] \
         (relative paths are relative to the pipeline file)",
    );
    let header = reader.boolean("header", "set header = true or header = false");
    let delimiter =
        reader.value("delimiter", "a single ASCII character such as \",\" or \"\\t\"", "e.g. delimiter = \";\"", |v| {
            match v.as_str()?.as_bytes() {
                [b] if b.is_ascii() && !matches!(b, b'\n' | b'\r' | b'"') => Some(*b),
                _ => None,
            }
        });
    let rate = reader
        .positive_number("rate", "set rate to rows per second, e.g. rate = 1000, or remove it to read at full speed");
    let split_bytes = reader.integer(
        "split_bytes",
        1..=i64::MAX,
        "set split_bytes to the file size above which a file is read by several lanes, e.g. split_bytes = 8388608",
    );
    if format == Some(FileFormat::Json) {
        for key in ["header", "delimiter"] {
            let fix = format!("remove `{key}`, or set format = \"csv\"");
            reader.forbid(key, "it applies to csv files only, and the format reads JSON lines", &fix);
        }
    }
    if changelog.is_some() {
        let why = "a changelog file is read by one lane, so that each key's changes arrive in order";
        reader.forbid("split_bytes", why, "remove `split_bytes`");
    }
    let parsed = (|| {
        Some(FileOptions {
            path: PathBuf::from(path?.value),
            format: format?,
            header: header.or(false)?,
            delimiter: delimiter.or(b',')?,
            rate: rate.optional()?,
            split_bytes: split_bytes.optional()?,
            changelog,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// A validated file source.
#[derive(Debug, Clone)]
pub struct ConfiguredFile {
    /// The table it provides: the source's name.
    pub table: String,
    pub options: FileOptions,
}

impl ConfiguredSource for ConfiguredFile {
    fn tables(&self) -> Vec<String> {
        vec![self.table.clone()]
    }

    fn reads_declared_schema(&self) -> bool {
        true
    }

    fn input_paths(&self, base_dir: &Path) -> Vec<PathBuf> {
        vec![resolve(base_dir, &self.options.path)]
    }

    fn build(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError> {
        let schema = context.schema.clone().ok_or_else(|| {
            SluiceError::user("source.schema_missing", "a file source needs a `schema`")
                .with_fix("add `schema = \"col TYPE, ...\"` to the [[source]]")
        })?;
        let source = FileSource::new(
            context.config,
            &self.options,
            context.base_dir,
            context.lane_threads,
            schema,
            context.layout.as_deref(),
        )?;
        Ok(Arc::new(source))
    }
}

/// A planned file source.
#[derive(Debug)]
pub struct FileSource {
    shared: Arc<Shared>,
    tables: Vec<TableDef>,
    ranges: Vec<LaneRange>,
    /// The files' identities, recorded with the ranges in every checkpoint.
    identities: Vec<layout::Identity>,
    /// `path` as written, for `describe`.
    written_path: PathBuf,
    /// A changelog directory of several files: one lane reads them all, in name order
    /// (the `chain` module).
    chained: bool,
}

impl FileSource {
    /// The source of a `connector = "file"` config, reading rows of `schema`, its lanes
    /// laid out for `threads`, or as `recorded` (the layout of the checkpoint a run
    /// resumes, see the `layout` module: the files must be those it read, or grown).
    pub fn new(
        config: &SourceConfig,
        options: &FileOptions,
        base_dir: &Path,
        threads: u32,
        schema: SchemaRef,
        recorded: Option<&[u8]>,
    ) -> Result<FileSource, SluiceError> {
        let mut tuning = Tuning::default();
        if let Some(bytes) = options.split_bytes {
            tuning.split_above_bytes = bytes;
            tuning.min_piece_bytes = (bytes / 8).max(1);
        }
        Self::with_tuning(config, options, base_dir, threads, schema, tuning, recorded)
    }

    pub(crate) fn with_tuning(
        config: &SourceConfig,
        options: &FileOptions,
        base_dir: &Path,
        threads: u32,
        schema: SchemaRef,
        tuning: Tuning,
        recorded: Option<&[u8]>,
    ) -> Result<FileSource, SluiceError> {
        let FileOptions { path, format, header, delimiter, rate, changelog, .. } = options;
        let format = match format {
            FileFormat::Json => RowFormat::Json,
            FileFormat::Csv => RowFormat::Csv { header: *header, delimiter: *delimiter },
        };
        let file_changelog = *changelog;
        let changelog_format = file_changelog.map(|changelog| match (changelog, format) {
            (FileChangelog::Debezium, _) => crate::changelog::DEBEZIUM_JSON,
            (FileChangelog::OpColumn, RowFormat::Json) => {
                crate::changelog::ChangelogFormat { name: "changelog-json", upsert: false }
            }
            (FileChangelog::OpColumn, RowFormat::Csv { .. }) => {
                crate::changelog::ChangelogFormat { name: "changelog-csv", upsert: false }
            }
        });
        let changelog = crate::changelog::source_changelog(config, &schema, changelog_format)?;
        // A changelog file's rows are decoded with their `op` first (CSV fields by position);
        // a Debezium event's rows are its images, JSON objects of the declared columns.
        let decoded = match file_changelog {
            Some(FileChangelog::OpColumn) => op_schema(&config.name, &schema)?,
            Some(FileChangelog::Debezium) | None => schema.clone(),
        };
        Decoder::new(DecoderOptions { schema: decoded.clone(), format, batch_size: CHECK_BATCH_SIZE })?;
        let event_time = event_time_index(config, &schema)?;
        let resolved = resolve(base_dir, path);
        let files = list_files(path, &resolved)?;
        let extents = files.iter().map(|file| file_extent(file)).collect::<Result<Vec<Option<u64>>, SluiceError>>()?;
        let streaming: Vec<bool> = extents.iter().map(Option::is_none).collect();
        if let RowFormat::Csv { header, delimiter } = format {
            csv_plan::check_first_records(&files, &streaming, &decoded, header, delimiter, tuning.chunk_bytes)?;
        }
        let ranges = match recorded {
            Some(bytes) => {
                layout::resume(&config.name, &layout::Layout::decode(&config.name, bytes)?, &files, &extents)?
            }
            // A key's changes must arrive in order: a changelog file is never split.
            None => plan_ranges(&files, &extents, format, if changelog.is_some() { 1 } else { threads }, tuning)?,
        };
        let identities = layout::identify(&files, &extents)?;
        let chained = changelog.is_some() && ranges.len() > 1;
        let lanes = if chained { 1 } else { ranges.len() };
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            files,
            schema: decoded,
            kinds_schema: changelog.as_ref().map(|_| crate::changelog::with_kinds_schema(&schema)),
            changelog: file_changelog,
            format,
            event_time,
            watermark_delay_ms: crate::lanes::duration_ms(config.watermark_delay),
            max_watermark_drift_ms: config.max_watermark_drift.map(crate::lanes::duration_ms),
            on_error: config.on_error,
            chunk_bytes: tuning.chunk_bytes,
            lane_rate: rate.map(|rate| rate / lanes.max(1) as f64),
            streaming,
        });
        let tables =
            vec![TableDef { name: config.name.clone(), schema, event_time: config.event_time.clone(), changelog }];
        Ok(FileSource { shared, tables, ranges, identities, written_path: path.clone(), chained })
    }

    /// The files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.shared.files
    }

    /// The byte range of each lane (`[0, u64::MAX)` for a streaming file).
    pub fn ranges(&self) -> &[LaneRange] {
        &self.ranges
    }

    /// Whether a file of the source is not a regular file (a pipe, `/dev/stdin`, a
    /// device): it is read as it streams, and a position in it cannot be resumed after
    /// a restart, so a checkpoint of this source cannot be restored.
    pub fn is_streaming(&self) -> bool {
        self.shared.streaming.iter().any(|streaming| *streaming)
    }
}

impl SourceFactory for FileSource {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn tables(&self) -> &[TableDef] {
        &self.tables
    }

    fn lanes(&self) -> u32 {
        if self.chained {
            return 1;
        }
        u32::try_from(self.ranges.len()).unwrap_or(u32::MAX)
    }

    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError> {
        if self.chained && context.lane == 0 {
            return Ok(Box::new(ChainedLane::open(Arc::clone(&self.shared), self.ranges.clone(), context)?));
        }
        let range = self.ranges.get(context.lane as usize).ok_or_else(|| {
            SluiceError::internal(
                "source.lane",
                format!("source `{}` has {} lanes, not lane {}", self.shared.name, self.ranges.len(), context.lane),
            )
        })?;
        Ok(Box::new(FileLane::open(Arc::clone(&self.shared), range.clone(), context)?))
    }

    /// The files' identities and the lanes' ranges (see the `layout` module).
    fn layout(&self) -> Vec<u8> {
        layout::Layout { files: self.identities.clone(), ranges: self.ranges.clone() }.encode()
    }

    fn content_identity(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.identities.len() * 24);
        for identity in &self.identities {
            for value in [identity.size, identity.head, identity.tail] {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        bytes
    }

    /// A pipe or a device cannot be read again from a position after a restart.
    fn resumable(&self) -> bool {
        !self.is_streaming()
    }

    fn describe(&self) -> String {
        let format = match (&self.tables[0].changelog, self.shared.format) {
            (Some(changelog), _) => crate::changelog::describe(changelog, &self.tables[0].schema),
            (None, RowFormat::Json) => "json".to_string(),
            (None, RowFormat::Csv { .. }) => "csv".to_string(),
        };
        let files = self.shared.files.len();
        let noun = if files == 1 { "file" } else { "files" };
        let streaming = if self.is_streaming() { ", streaming" } else { "" };
        format!("file(path={}, {format}, {files} {noun}{streaming})", self.written_path.display())
    }

    fn max_watermark_drift(&self) -> Option<sluice_types::TimestampMs> {
        self.shared.max_watermark_drift_ms
    }
}

/// The schema a changelog file is decoded with: `op` (VARCHAR NOT NULL), then the
/// declared columns; a declared column named `op` is refused (the changelog's).
fn op_schema(name: &str, schema: &Schema) -> Result<SchemaRef, SluiceError> {
    if schema.fields().iter().any(|f| f.name() == sluice_formats::OP_COLUMN) {
        return Err(SluiceError::user(
            "source.changelog_op",
            format!(
                "source `{name}`: a changelog file's `op` column holds each row's kind; the schema declares it too"
            ),
        )
        .with_fix("leave `op` out of `schema`: the source reads it"));
    }
    let mut fields =
        vec![arrow::datatypes::Field::new(sluice_formats::OP_COLUMN, arrow::datatypes::DataType::Utf8, false)];
    fields.extend(schema.fields().iter().map(|f| f.as_ref().clone()));
    Ok(Arc::new(Schema::new(fields)))
}

/// The index of the event-time column, which must be a timestamp.
pub(crate) fn event_time_index(config: &SourceConfig, schema: &SchemaRef) -> Result<Option<usize>, SluiceError> {
    let Some(column) = &config.event_time else { return Ok(None) };
    let index = schema.index_of(column).map_err(|_| {
        SluiceError::user("source.event_time", format!("event_time = \"{column}\" is not a column of its schema"))
            .with_fix("set event_time to one of the columns in `schema`")
    })?;
    match schema.field(index).data_type() {
        DataType::Timestamp(_, _) => Ok(Some(index)),
        other => Err(SluiceError::user(
            "source.event_time",
            format!("event_time column `{column}` has type {other}, not a timestamp"),
        )
        .with_fix(format!("declare `{column}` as TIMESTAMP(3) in `schema`"))),
    }
}

/// The files under `resolved`: itself, or its visible regular files by name.
fn list_files(written: &Path, resolved: &Path) -> Result<Vec<PathBuf>, SluiceError> {
    let metadata = std::fs::metadata(resolved).map_err(|error| {
        let kind = if error.kind() == std::io::ErrorKind::NotFound { "does not exist" } else { "cannot be read" };
        SluiceError::user(
            "source.path",
            format!(
                "path = \"{}\" ({}) {kind}: {error}",
                written.display(),
                resolved.display()
            ),
        )
        .with_fix("point `path` at an existing file or directory (a relative path is relative to the pipeline file's directory)")
    })?;
    if !metadata.is_dir() {
        return Ok(vec![resolved.to_path_buf()]);
    }
    let entries = std::fs::read_dir(resolved).map_err(|error| read_error(resolved, &error))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| read_error(resolved, &error))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links: a link to a file is read.
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => files.push(path),
            Ok(metadata) if metadata.is_dir() => {
                tracing::warn!("not reading {}: a directory source reads only its own files", path.display());
            }
            Ok(_) => tracing::warn!("not reading {}: not a regular file", path.display()),
            Err(error) => tracing::warn!("not reading {}: {error}", path.display()),
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(SluiceError::user(
            "source.path",
            format!("directory path = \"{}\" ({}) holds no data file", written.display(), resolved.display()),
        )
        .with_fix("put the input files in that directory (hidden files are skipped), or point `path` at a file"));
    }
    Ok(files)
}

/// The size of a regular file; `None` for a file that is not regular (a pipe, a device),
/// whose size is not known before it is read.
fn file_extent(file: &Path) -> Result<Option<u64>, SluiceError> {
    let metadata = std::fs::metadata(file).map_err(|error| read_error(file, &error))?;
    Ok(metadata.is_file().then_some(metadata.len()))
}

/// An I/O failure on `path`.
pub(crate) fn read_error(path: &Path, error: &std::io::Error) -> SluiceError {
    SluiceError::external("source.io", format!("cannot read {}: {error}", path.display()))
        .with_fix("check that the file exists and is readable")
}

/// The lane ranges of `files`: regular files split by [`split`] (CSV split points moved
/// to record starts), a streaming file (no extent) one range `[0, u64::MAX)`.
fn plan_ranges(
    files: &[PathBuf],
    extents: &[Option<u64>],
    format: RowFormat,
    threads: u32,
    tuning: Tuning,
) -> Result<Vec<LaneRange>, SluiceError> {
    // A streaming file counts as empty, so it is never split.
    let sizes: Vec<u64> = extents.iter().map(|extent| extent.unwrap_or(0)).collect();
    let mut ranges = split(&sizes, threads, tuning);
    if let RowFormat::Csv { delimiter, .. } = format {
        ranges = csv_plan::align_to_record_starts(files, ranges, delimiter)?;
    }
    for range in &mut ranges {
        if extents[range.file].is_none() {
            range.end = u64::MAX;
        }
    }
    Ok(ranges)
}

/// Splits files of the given sizes into about `max(threads, files)` lane ranges.
///
/// Each file starts as one range; spare lanes go one at a time to the splittable file
/// (larger than `split_above_bytes`) whose pieces are largest, while they stay at least
/// `min_piece_bytes`.
pub(crate) fn split(sizes: &[u64], threads: u32, tuning: Tuning) -> Vec<LaneRange> {
    let mut pieces = vec![1u64; sizes.len()];
    let spare = (threads as usize).saturating_sub(sizes.len());
    for _ in 0..spare {
        let candidate = sizes
            .iter()
            .zip(&pieces)
            .enumerate()
            .filter(|(_, (size, count))| {
                **size > tuning.split_above_bytes && **size / (**count + 1) >= tuning.min_piece_bytes.max(1)
            })
            .max_by_key(|(_, (size, count))| **size / **count)
            .map(|(index, _)| index);
        let Some(index) = candidate else { break };
        pieces[index] += 1;
    }
    let mut ranges = Vec::new();
    for (file, (&size, &count)) in sizes.iter().zip(&pieces).enumerate() {
        for piece in 0..count {
            let start = piece_bound(size, piece, count);
            let end = piece_bound(size, piece + 1, count);
            ranges.push(LaneRange { file, start, end });
        }
    }
    ranges
}

/// `size * piece / count` without overflow.
fn piece_bound(size: u64, piece: u64, count: u64) -> u64 {
    u64::try_from(u128::from(size) * u128::from(piece) / u128::from(count)).unwrap_or(size)
}
