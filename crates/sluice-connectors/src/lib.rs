//! Sources and sinks: the NEXMark generator, files and Kafka in; standard output, files,
//! Kafka, PostgreSQL, Delta Lake tables and a blackhole out.
//!
//! Every connector is registered in the [`Registry`] (see [`registry`] for the two
//! steps, configure and build): it validates its own options and becomes the runtime's
//! [`SourceFactory`](sluice_runtime::SourceFactory) or
//! [`SinkFactory`](sluice_runtime::SinkFactory). A configured file sink's `check` is
//! what `sluice validate` runs to know it can write where it is told to, without
//! writing anything.
//!
//! Relative paths in the configuration are resolved against `base_dir`, the directory
//! of the pipeline file, so a pipeline behaves the same from any working directory.
//!
//! - [`nexmark`]: tables `person`, `auction`, `bid`; one lane per thread; optional
//!   wall-clock rate limit.
//! - [`file_source`]: a file or a directory of JSON-lines or CSV files (or changelogs:
//!   an `op` column, or Debezium events), large files split into byte ranges read in
//!   parallel (a changelog file never); bad rows skipped (counted, the first ones
//!   logged with their file and line) or fatal, per `on_error`.
//! - [`kafka`] (cargo feature `kafka`): topics in (one lane per partition, offsets in checkpoints, bounded
//!   reads, metadata columns) and out (one message per row; exactly-once through Kafka
//!   transactions).
//! - [`changelog`]: what sources with a changelog format (Kafka's `debezium-json` and
//!   `upsert`, the file source's `debezium-json` and `changelog-json`/`changelog-csv`)
//!   share: the primary key checked against the schema, JSON envelopes into rows kept
//!   whole per message, the row kinds column after the declared ones.
//! - [`sinks`]: `stdout` (pretty tables or JSON lines), `file` (one file, or a
//!   directory with one part per thread; JSON lines or CSV), `blackhole`.
//! - [`postgres_cdc`] (cargo feature `postgres`): the tables of a PostgreSQL database in (a snapshot, then their
//!   changes from a logical replication slot; updating tables keyed by their primary
//!   keys; exactly once, the slot confirmed after each committed checkpoint).
//! - [`postgres`] (cargo feature `postgres`): rows into a table (appended, or upserted and deleted by key);
//!   exactly-once through prepared transactions (two-phase commit).
//! - [`delta`] (cargo feature `delta`): rows into a Delta Lake table
//!   (Parquet files and the transaction log), local or in an object store; exactly-once
//!   through the log's `txn` actions, one Delta commit per checkpoint.
//!
//! A connector behind a feature this build leaves out is still a name the registry knows:
//! a pipeline naming it is refused with the feature that builds it
//! ([`registry::LeftOut`]).
//!
//! An *updating* sink input (one that can carry retractions) is written with an op
//! column first (`+I` / `-D`, see [`sluice_formats::encode`]); an append-only input is
//! written as plain rows.

pub mod changelog;
pub mod connector;
#[cfg(feature = "delta")]
pub mod delta;
pub mod file_source;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod lanes;
pub mod nexmark;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub mod postgres_cdc;
pub mod registry;
pub mod sinks;

pub use connector::{
    ConfiguredSink, ConfiguredSource, OptionDoc, SinkConnector, SinkContext, SourceConnector, SourceContext,
};
pub use file_source::{FileConnector, FileOptions, FileSource};
pub use nexmark::{NexmarkConnector, NexmarkOptions, NexmarkSource};
pub use registry::Registry;
pub use sinks::{BlackholeSink, FileMode, FileSink, FileSinkOptions, StdoutFormat, StdoutSink};

/// Row encoding of a file source or sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// One JSON object per line.
    Json,
    /// Comma-separated (or another delimiter) values.
    Csv,
}

/// `format = "…"` of file sources and sinks.
pub(crate) const FILE_FORMATS: &[(&str, FileFormat)] = &[("json", FileFormat::Json), ("csv", FileFormat::Csv)];
