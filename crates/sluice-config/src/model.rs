//! The typed, validated form of `pipeline.toml`.
//!
//! Connector-specific parts (`connector`, `format`, `schema`, `[source.options]`,
//! `[sink.options]`) are kept as written, with their positions, for the connector to
//! validate; paths inside options stay relative, and the connector resolves them against
//! the directory of the pipeline file.

use std::time::Duration;

use crate::error::{Located, Position};
use crate::options::Options;

/// Default `[pipeline] vnodes`.
pub const DEFAULT_VNODES: u32 = 256;
/// Default `[pipeline] shutdown_timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `[pipeline] batch_size` (rows per batch).
pub const DEFAULT_BATCH_SIZE: usize = 8192;
/// Default `[pipeline] queue_batches` (capacity of each exchange queue, in batches).
pub const DEFAULT_QUEUE_BATCHES: usize = 16;
/// Default `[pipeline] windows_per_row_max`: the most windows one row may fall into
/// (a HOP window's size / slide).
pub const DEFAULT_WINDOWS_PER_ROW_MAX: u32 = 1000;
/// Default `[pipeline] mini_batch_rows` (Flink's NEXMark setup holds 50,000 rows).
pub const DEFAULT_MINI_BATCH_ROWS: usize = 50_000;
/// `[pipeline] state_memory_mib` when not given: 1 GiB per worker. Rows spill at any
/// budget for little cost, but groups, TopN partitions and changelog keys evicted from a
/// budget their working set exceeds come back over and over (BENCHMARKS.md, "State within
/// the memory budget"); 1 GiB holds every NEXMark query's state at 10 M events.
pub const DEFAULT_STATE_MEMORY_MIB: u32 = 1024;

/// A whole pipeline file.
#[derive(Debug, Clone)]
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
    /// The most windows one row may fall into (a HOP window's size / slide).
    pub windows_per_row_max: u32,
    /// State time-to-live of every view's regular joins, running aggregates and TopN
    /// (Flink's `table.exec.state.ttl`): a key (a join row, a group, a partition) not
    /// touched for this long may be dropped. None: kept forever.
    pub state_ttl: Option<Duration>,
    /// Window aggregates in two phases (Flink's `table.optimizer.agg-phase-strategy`
    /// `TWO_PHASE`): each batch folded per window and key before the exchange, where
    /// the aggregates allow it (COUNT, SUM, MIN, MAX). False: one phase.
    pub local_aggregation: bool,
    /// Input rows a running aggregate folds into one output of changes (Flink's
    /// `table.exec.mini-batch.size`): a group changed by several of them changes once.
    /// Held changes also leave when the thread runs out of input, every 100 ms (once the
    /// downstream queue has room), at each checkpoint and at the end. 1: after every
    /// input batch.
    pub mini_batch_rows: usize,
    /// MiB of state held in memory per worker before the rest spills to files in
    /// `state_dir` (today: the rows of regular joins' append-only inputs and of TopN).
    pub state_memory_mib: u32,
    /// This worker's local state directory, relative to the pipeline file: spilled
    /// state, and the runs a checkpoint writes before their upload (`spill_dir`, its
    /// older name, is read too); None: the system's temporary directory (`TMPDIR`, else
    /// `/tmp`).
    pub state_dir: Option<String>,
}

impl PipelineSection {
    /// The defaults, with `name` (a pipeline built in code).
    pub fn named(name: &str) -> PipelineSection {
        PipelineSection {
            name: name.to_owned(),
            threads: crate::pipeline::default_threads(),
            vnodes: DEFAULT_VNODES,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            batch_size: DEFAULT_BATCH_SIZE,
            queue_batches: DEFAULT_QUEUE_BATCHES,
            windows_per_row_max: DEFAULT_WINDOWS_PER_ROW_MAX,
            state_ttl: None,
            local_aggregation: true,
            mini_batch_rows: DEFAULT_MINI_BATCH_ROWS,
            state_memory_mib: DEFAULT_STATE_MEMORY_MIB,
            state_dir: None,
        }
    }
}

/// One `[[source]]`.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The source's name: a SQL identifier. For most connectors it is also the SQL
    /// table name; a connector may provide other tables (nexmark provides three).
    pub name: String,
    /// The connector's name as written, e.g. `file`, at its key; the connector registry
    /// knows it.
    pub connector: Located<String>,
    /// `format`, for connectors that decode bytes (e.g. `json`, `csv`), at its key.
    pub format: Option<Located<String>>,
    /// The declared column list, e.g. `"id BIGINT, ts TIMESTAMP(3)"`, unparsed.
    pub schema: Option<Located<String>>,
    /// The event-time column, if any.
    pub event_time: Option<String>,
    /// How far the watermark trails the largest event time seen (default 0s).
    pub watermark_delay: Duration,
    /// Watermark alignment: how far (in event time) a lane may run ahead of the
    /// source's slowest lane before it waits (None: the connector's default, which is
    /// no alignment except for `nexmark`).
    pub max_watermark_drift: Option<Duration>,
    /// What to do with a malformed input row.
    pub on_error: OnError,
    /// `[source.options]`, validated by the connector.
    pub options: Options,
    /// Where `materialized = true` is written, if it is: every table of the source keeps
    /// its rows, for ad-hoc queries at committed checkpoints.
    pub materialized: Option<Position>,
    /// `primary_key = ["id", …]`, at its key: the columns identifying a row of a
    /// changelog source (checked against the schema by the connector).
    pub primary_key: Option<Located<Vec<String>>>,
    /// Position of the `[[source]]` header.
    pub position: Position,
}

impl SourceConfig {
    /// A source built in code: `connector` with empty options and no schema.
    pub fn new(name: &str, connector: &str) -> SourceConfig {
        SourceConfig {
            name: name.to_owned(),
            connector: Located::new(connector.to_owned(), Position::new(1, 1)),
            format: None,
            schema: None,
            event_time: None,
            watermark_delay: Duration::ZERO,
            max_watermark_drift: None,
            on_error: OnError::Skip,
            options: Options::new("source", name),
            materialized: None,
            primary_key: None,
            position: Position::new(1, 1),
        }
    }
}

/// What a source does with a row it cannot decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnError {
    /// Count it, report it with its position, and go on.
    #[default]
    Skip,
    /// Stop the pipeline.
    Fail,
    /// As `Skip`, and also write the message as read, with the error, to a dead-letter
    /// topic (`dead_letter_topic`; the Kafka source only, which refuses it elsewhere).
    DeadLetter,
}

/// One `[[view]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewConfig {
    /// The view's name: a SQL identifier, unique among sources and views.
    pub name: String,
    /// The query; its position is the first character of the SQL text, so SQL errors
    /// can point into the file with [`Located::locate`].
    pub sql: Located<String>,
    /// Where `materialized = true` is written, if it is: the view's rows are kept (its
    /// changes integrated), for ad-hoc queries at committed checkpoints.
    pub materialized: Option<Position>,
    /// This view's state time-to-live, in place of `[pipeline] state_ttl`.
    pub state_ttl: Option<Duration>,
    /// Position of the `[[view]]` header.
    pub position: Position,
}

/// One `[[sink]]`.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The sink's name, unique among sinks.
    pub name: String,
    /// The table or view it writes (its existence is checked by the SQL layer).
    pub from: String,
    /// The connector's name as written, e.g. `stdout`.
    pub connector: Located<String>,
    /// `format`, for connectors that encode rows.
    pub format: Option<Located<String>>,
    /// `worker`: in a cluster, the worker that runs this sink when it has one writer
    /// (0, the leader, by default).
    pub worker: Option<u32>,
    /// `[sink.options]`, validated by the connector.
    pub options: Options,
    /// Position of the `[[sink]]` header.
    pub position: Position,
}

impl SinkConfig {
    /// A sink built in code: `connector` writing `from`, with empty options.
    pub fn new(name: &str, from: &str, connector: &str) -> SinkConfig {
        SinkConfig {
            name: name.to_owned(),
            from: from.to_owned(),
            connector: Located::new(connector.to_owned(), Position::new(1, 1)),
            format: None,
            worker: None,
            options: Options::new("sink", name),
            position: Position::new(1, 1),
        }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSection {
    pub interval: Duration,
    /// How long every thread may take to acknowledge a checkpoint's barrier before that
    /// checkpoint fails (and counts toward `max_failed_checkpoints`).
    pub timeout: Duration,
    /// An object-store URL; `file://./x` is relative to the pipeline file's directory.
    pub store: String,
    pub guarantee: Guarantee,
    /// Committed checkpoints kept.
    pub retain: u32,
    /// Consecutive failed checkpoints before the pipeline fails.
    pub max_failed_checkpoints: u32,
    /// How the state runs a checkpoint writes store their blocks.
    pub compression: Compression,
}

/// How a checkpoint's state runs store their blocks (`sluice_state::run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// The default: the runs a checkpoint adds are stored as they are, so the writer the
    /// checkpoint waits for spends no CPU on compression; merges, in the background,
    /// compress each block with LZ4 where that saves an eighth of it (copied blocks
    /// too), so long-lived state is kept compressed.
    Lz4Merged,
    /// Every run's blocks compressed with LZ4 where that saves an eighth of it, the
    /// checkpoint's new runs included: NEXMark q20's runs 2.3 times smaller, for the
    /// checkpoint writer's CPU (the fewest bytes uploaded to a remote store).
    Lz4,
    /// Blocks stored as they are.
    None,
}

impl Compression {
    /// Whether the runs a checkpoint adds compress their blocks.
    pub fn new_runs(self) -> bool {
        self == Compression::Lz4
    }

    /// Whether the runs merges write compress their blocks.
    pub fn merged_runs(self) -> bool {
        self != Compression::None
    }
}

/// What a crash may do to the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// Barriers align and sinks commit with checkpoints: output as if no crash happened.
    ExactlyOnce,
    /// Barriers do not align: after a crash some output may repeat, none is lost.
    AtLeastOnce,
}
