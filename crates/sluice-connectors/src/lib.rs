//! Sources and sinks that need nothing else running: the NEXMark generator and files
//! in, standard output, files and a blackhole out.
//!
//! [`source`] turns a `[[source]]` of `pipeline.toml` into a
//! [`SourceFactory`](sluice_runtime::SourceFactory) (its tables and its lanes);
//! [`sink`] turns a `[[sink]]` into a [`SinkFactory`](sluice_runtime::SinkFactory).
//! [`check_sink`] is what `sluice validate` runs to know a sink can write where it is
//! told to, without writing anything.
//!
//! Relative paths in the configuration are resolved against `base_dir`, the directory
//! of the pipeline file, so a pipeline behaves the same from any working directory.
//!
//! - [`nexmark`]: tables `person`, `auction`, `bid`; one lane per thread; optional
//!   wall-clock rate limit.
//! - [`file_source`]: a file or a directory of JSON-lines or CSV files, large files
//!   split into byte ranges read in parallel; bad rows skipped (counted, the first ones
//!   logged with their file and line) or fatal, per `on_error`.
//! - [`sinks`]: `stdout` (pretty tables or JSON lines), `file` (one file, or a
//!   directory with one part per thread; JSON lines or CSV), `blackhole`.
//!
//! An *updating* sink input (one that can carry retractions) is written with an op
//! column first (`+I` / `-D`, see [`sluice_formats::encode`]); an append-only input is
//! written as plain rows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_config::{SinkConfig, SourceConfig, SourceConnector};
use sluice_runtime::{SinkFactory, SourceFactory};
use sluice_types::SluiceError;

pub mod file_source;
pub mod nexmark;
pub mod sinks;

pub use file_source::FileSource;
pub use nexmark::NexmarkSource;
pub use sinks::{BlackholeSink, FileSink, StdoutSink, check_sink};

/// Builds the source of `config`.
///
/// `threads` is the number of driver threads (the nexmark source has one lane per
/// thread; a file source splits its files into about that many lanes). `schema` is
/// the Arrow schema of a file source, parsed from its `schema` string by the SQL
/// layer (ignored by nexmark, whose schemas are fixed).
pub fn source(
    config: &SourceConfig,
    base_dir: &Path,
    threads: u32,
    schema: Option<SchemaRef>,
) -> Result<Arc<dyn SourceFactory>, SluiceError> {
    match &config.connector {
        SourceConnector::Nexmark { .. } => Ok(Arc::new(NexmarkSource::new(config, threads)?)),
        SourceConnector::File { .. } => {
            let schema = schema.ok_or_else(|| {
                SluiceError::user("source.schema_missing", "a file source needs a `schema`")
                    .with_fix("add `schema = \"col TYPE, ...\"` to the [[source]]")
            })?;
            Ok(Arc::new(FileSource::new(config, base_dir, threads, schema)?))
        }
    }
}

/// Builds the sink of `config`, writing rows of `schema`; `updating` means the input
/// can carry retractions, which are then written with an op column.
pub fn sink(
    config: &SinkConfig,
    base_dir: &Path,
    schema: SchemaRef,
    updating: bool,
) -> Result<Arc<dyn SinkFactory>, SluiceError> {
    sinks::build(config, base_dir, schema, updating)
}

/// `path` resolved against `base_dir` unless it is absolute.
pub(crate) fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) }
}
