//! The typed, validated form of `pipeline.toml`.
//!
//! Paths are kept exactly as written: a relative path stays relative, and the caller
//! resolves it against the directory of the pipeline file.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Located, Position};

/// Default `[pipeline] vnodes`.
pub const DEFAULT_VNODES: u32 = 256;
/// Default `[pipeline] shutdown_timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `[pipeline] batch_size` (rows per batch).
pub const DEFAULT_BATCH_SIZE: usize = 8192;
/// Default `[pipeline] queue_batches` (capacity of each exchange queue, in batches).
pub const DEFAULT_QUEUE_BATCHES: usize = 16;
/// Default nexmark `first_event_rate` (events per second of event time).
pub const DEFAULT_FIRST_EVENT_RATE: u64 = 10_000;
/// The tables a nexmark source provides to SQL, whatever the source's name.
pub const NEXMARK_TABLES: [&str; 3] = ["person", "auction", "bid"];

/// A whole pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// `[pipeline]`.
    pub pipeline: PipelineSection,
    /// `[checkpoint]`; None: no checkpoints.
    pub checkpoint: Option<CheckpointSection>,
    /// `[[source]]`, in file order (at least one).
    pub sources: Vec<SourceConfig>,
    /// `[[view]]`, in file order (possibly none).
    pub views: Vec<ViewConfig>,
    /// `[[sink]]`, in file order (at least one).
    pub sinks: Vec<SinkConfig>,
}

/// `[pipeline]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSection {
    /// The pipeline's name: letters, digits, `_` and `-`.
    pub name: String,
    /// Driver threads per worker (default: the number of cores).
    pub threads: u32,
    /// Key-space partitions; fixed for the life of the pipeline's state.
    pub vnodes: u32,
    /// How long a graceful shutdown may take; never zero.
    pub shutdown_timeout: Duration,
    /// Rows per batch.
    pub batch_size: usize,
    /// Capacity, in batches, of each exchange queue.
    pub queue_batches: usize,
}

/// One `[[source]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    /// The source's name: a SQL identifier. For a file source it is the SQL table
    /// name; for a nexmark source it is only its name in reports (see [`Self::tables`]).
    pub name: String,
    /// The connector and its validated options.
    pub connector: SourceConnector,
    /// The column list of a file source, e.g. `"id BIGINT, ts TIMESTAMP(3)"`,
    /// unparsed; `None` for nexmark (fixed schemas).
    pub schema: Option<Located<String>>,
    /// The event-time column, if any.
    pub event_time: Option<String>,
    /// How far the watermark trails the largest event time seen (default 0s).
    pub watermark_delay: Duration,
    /// What to do with a malformed input row.
    pub on_error: OnError,
    /// Position of the `[[source]]` header.
    pub position: Position,
}

impl SourceConfig {
    /// The SQL tables this source provides: `person`, `auction` and `bid` for a
    /// nexmark source, its own name for a file source.
    pub fn tables(&self) -> Vec<&str> {
        match self.connector {
            SourceConnector::Nexmark { .. } => NEXMARK_TABLES.to_vec(),
            SourceConnector::File { .. } => vec![self.name.as_str()],
        }
    }
}

/// A source connector with its options.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConnector {
    /// The NEXMark generator. Provides tables `person`, `auction` and `bid`.
    Nexmark {
        /// Stop after this many events; `None`: unbounded.
        events: Option<u64>,
        /// Wall-clock rate limit in events per second; `None`: as fast as possible.
        rate: Option<f64>,
        /// Generator seed (default 0).
        seed: u64,
        /// Event-time spacing: events per second of event time (default: `rate` when
        /// set, so event time keeps pace with the wall clock, else 10000).
        first_event_rate: u64,
    },
    /// A file, or every file in a directory.
    File {
        /// As written; relative paths are relative to the pipeline file's directory.
        path: PathBuf,
        /// How rows are encoded.
        format: FileFormat,
        /// CSV: the first line is a header (default true).
        header: bool,
        /// CSV: the field delimiter (default `,`).
        delimiter: u8,
        /// Replay at most this many rows per second, over all lanes (default: full speed).
        rate: Option<f64>,
    },
}

impl SourceConnector {
    /// The connector's name as written in the file.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nexmark { .. } => "nexmark",
            Self::File { .. } => "file",
        }
    }
}

/// Row encoding of a file source or sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// One JSON object per line.
    Json,
    /// Comma-separated (or another delimiter) values.
    Csv,
}

/// What a source does with a row it cannot decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnError {
    /// Count it, report it with its position, and go on.
    #[default]
    Skip,
    /// Stop the pipeline.
    Fail,
}

/// One `[[view]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewConfig {
    /// The view's name: a SQL identifier, unique among sources and views.
    pub name: String,
    /// The query; its position is the first character of the SQL text, so SQL errors
    /// can point into the file with [`Located::locate`].
    pub sql: Located<String>,
    /// Position of the `[[view]]` header.
    pub position: Position,
}

/// One `[[sink]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// The sink's name, unique among sinks.
    pub name: String,
    /// The table or view it writes (its existence is checked by the SQL layer).
    pub from: String,
    /// The connector and its options.
    pub connector: SinkConnector,
    /// Position of the `[[sink]]` header.
    pub position: Position,
}

/// A sink connector with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConnector {
    /// Standard output.
    Stdout {
        /// How rows are printed (default pretty).
        format: StdoutFormat,
    },
    /// A file, or a directory of files.
    File {
        /// As written; relative paths are relative to the pipeline file's directory.
        path: PathBuf,
        /// How rows are encoded (default json).
        format: FileFormat,
        /// One file, or a directory of files.
        mode: FileMode,
    },
    /// Discards everything (for benchmarks).
    Blackhole,
}

impl SinkConnector {
    /// The connector's name as written in the file.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout { .. } => "stdout",
            Self::File { .. } => "file",
            Self::Blackhole => "blackhole",
        }
    }
}

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
        let has_extension = std::path::Path::new(path).extension().is_some();
        if path.ends_with('/') || !has_extension { Self::Directory } else { Self::File }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSection {
    pub interval: Duration,
    /// An object-store URL; `file://./x` is relative to the pipeline file's directory.
    pub store: String,
    pub guarantee: Guarantee,
    /// Committed checkpoints kept.
    pub retain: u32,
    /// Consecutive failed checkpoints before the pipeline fails.
    pub max_failed_checkpoints: u32,
}

/// What a crash may do to the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// Barriers align and sinks commit with checkpoints: output as if no crash happened.
    ExactlyOnce,
    /// Barriers do not align: after a crash some output may repeat, none is lost.
    AtLeastOnce,
}
