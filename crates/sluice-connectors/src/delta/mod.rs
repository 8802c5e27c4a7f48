//! The Delta Lake sink, `connector = "delta"`: a view's rows as a Delta table (Parquet
//! data files and a transaction log), exactly once through the log's own `txn` actions.
//!
//! - `log`: the actions this sink writes and reads, as pure functions (golden-tested).
//! - `table`: the table in an object directory (local, `s3://`, `az://`, `gs://`, through
//!   the checkpoint store's configuration): the log read incrementally, created on first
//!   use, committed to with the create-only write of the next version.
//! - `writer`: rows into Parquet files, rolled at the target size, and the versioned
//!   pre-commit record naming an epoch's files.
//! - `sink`: setup (create, or check the columns of an existing table), the commit of an
//!   epoch in one Delta commit with a `txn` per slot, recovery and fencing; its module doc
//!   carries the correctness argument.
//! - `compact`: small files of a partition merged into one (`compact_files`).
//! - `checkpoint`: a log checkpoint (the table's state in one Parquet file) every
//!   `checkpoint_interval` versions, so readers need not read every commit.
//! - `log_start`: the first read of the log, from its newest log checkpoint (read by
//!   `checkpoint_read`) and the commits after it, past a missing, stale or damaged one.
//!
//! The log is written here, against the Delta protocol, rather than through the
//! `deltalake` crate: see ARCHITECTURE.md ("Delta Lake sink") for why.
//!
//! Append-only views append. An updating view is written as a changelog table: each row
//! with an `op` column first (`+I`, `-U`, `+U`, `-D`, as the `file` sink's changelog), so
//! a reader integrates it (the newest row per key, without the deleted ones).

mod checkpoint;
mod checkpoint_read;
mod compact;
mod log;
mod log_start;
#[cfg(test)]
mod log_start_tests;
mod shared;
mod sink;
mod table;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use sluice_checkpoint::ObjectDir;
use sluice_config::{ConfigError, SinkConfig};
use sluice_runtime::SinkFactory;
use sluice_types::SluiceError;

use crate::connector::{ConfiguredSink, OptionDoc, SinkConnector, SinkContext, column_names, forbid_item};
pub use log::{AddFile, Column, LogState, TableMetadata};
pub use shared::Layout;
pub use sink::{DeltaSink, check_schema};
pub use writer::{PARTITION_FILES_OPEN_MAX, PreparedFiles};

/// The default target size of a data file.
pub const TARGET_FILE_MIB_DEFAULT: u64 = 64;
/// The largest target size of a data file (a writer holds its open files in memory).
pub const TARGET_FILE_MIB_MAX: i64 = 1024;
/// The default versions between two log checkpoints.
pub const CHECKPOINT_INTERVAL_DEFAULT: u64 = 100;
/// The default rows of a Parquet row group.
pub const ROW_GROUP_ROWS_DEFAULT: usize = 1 << 20;

/// How rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaMode {
    /// Each row appended as it is; only append-only views.
    Append,
    /// Each row appended after its `op` (`+I`, `-U`, `+U`, `-D`).
    Changelog,
}

/// `[sink.options]` of a Delta sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaOptions {
    /// The table's URL or local path (relative to the pipeline file).
    pub path: String,
    pub partition_by: Vec<String>,
    /// None: append for an append-only view, changelog for an updating one.
    pub mode: Option<DeltaMode>,
    pub target_file_bytes: usize,
    pub row_group_rows: usize,
    /// Object-store options over the environment (`aws_endpoint`, ...).
    pub storage: Vec<(String, String)>,
    /// A log checkpoint every this many versions (0: none).
    pub checkpoint_interval: u64,
    /// Compact a partition's small files once it has this many (0: never).
    pub compact_files: usize,
}

const OPTIONS: &[OptionDoc] = &[
    OptionDoc {
        key: "path",
        kind: "string",
        default: "required",
        doc: "the table: a local directory, s3://bucket/prefix, az://container/prefix or gs://bucket/prefix",
    },
    OptionDoc {
        key: "partition_by",
        kind: "string or array of strings",
        default: "none",
        doc: "partition columns (BOOLEAN, integer, VARCHAR or DATE columns of the view)",
    },
    OptionDoc {
        key: "mode",
        kind: "\"append\" or \"changelog\"",
        default: "append for an append-only view, changelog for an updating one",
        doc: "append rows, or append each change with an op column first (+I, -U, +U, -D)",
    },
    OptionDoc {
        key: "target_file_size_mib",
        kind: "integer 1..=1024",
        default: "64",
        doc: "a data file is finished once it reaches this size (and at every checkpoint)",
    },
    OptionDoc {
        key: "row_group_rows",
        kind: "integer 1..=16777216",
        default: "1048576",
        doc: "the most rows of one Parquet row group",
    },
    OptionDoc {
        key: "checkpoint_interval",
        kind: "integer 0..=1000000",
        default: "100",
        doc: "a log checkpoint (the table's state in one Parquet file) every this many versions; 0: none",
    },
    OptionDoc {
        key: "compact_files",
        kind: "integer 0..=10000",
        default: "0 (never)",
        doc: "after a commit, merge a partition's small files (under half the target size) once it has this many",
    },
    OptionDoc {
        key: "storage",
        kind: "table of strings",
        default: "none",
        doc: "object-store settings over the AWS_*/AZURE_*/GOOGLE_* environment, e.g. aws_endpoint",
    },
];

const KEYS: &[&str] = &[
    "path",
    "partition_by",
    "mode",
    "target_file_size_mib",
    "row_group_rows",
    "checkpoint_interval",
    "compact_files",
    "storage",
];

/// The `delta` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct DeltaSinkConnector;

impl SinkConnector for DeltaSinkConnector {
    fn name(&self) -> &'static str {
        "delta"
    }

    fn options(&self) -> &'static [OptionDoc] {
        OPTIONS
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredDelta { name: config.name.clone(), options: options_of(config)? }))
    }
}

/// The validated options of a `connector = "delta"` sink, or every problem.
pub fn options_of(config: &SinkConfig) -> Result<DeltaOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let found = config.format.as_ref().map(|f| format!("\"{}\"", f.value)).unwrap_or_default();
    let why = "a Delta table's data files are Parquet";
    forbid_item(config.format.as_ref(), "format", &found, options, why, "remove `format`", &mut errors);
    let mut reader = options.read();
    reader.check_keys(KEYS);
    let path = reader.string(
        "path",
        "a non-empty path or URL",
        "e.g. path = \"out/bids\" or path = \"s3://bucket/tables/bids\"",
        |s| !s.trim().is_empty(),
    );
    let path = reader.required("path", path, "add path = \"<table directory or URL>\" under [sink.options]");
    let example = "e.g. partition_by = \"day\" or partition_by = [\"day\", \"region\"]";
    let partition_by = column_names(&mut reader, "partition_by", example, true);
    let mode = reader.choice("mode", &[("append", DeltaMode::Append), ("changelog", DeltaMode::Changelog)]);
    let target =
        reader.integer::<u64>("target_file_size_mib", 1..=TARGET_FILE_MIB_MAX, "e.g. target_file_size_mib = 64");
    let row_group_rows = reader.integer::<usize>("row_group_rows", 1..=(1 << 24), "e.g. row_group_rows = 1048576");
    let checkpoint_interval =
        reader.integer::<u64>("checkpoint_interval", 0..=1_000_000, "e.g. checkpoint_interval = 100 (0: none)");
    let compact_files = reader.integer::<usize>("compact_files", 0..=10_000, "e.g. compact_files = 10 (0: never)");
    let storage = reader.string_table(
        "storage",
        "an object-store setting in lower case, e.g. aws_endpoint",
        "e.g. [sink.options.storage] aws_endpoint = \"http://127.0.0.1:9000\"",
        |name| !name.is_empty(),
    );
    let parsed = (|| {
        Some(DeltaOptions {
            path: path?.value,
            partition_by: partition_by.or(Vec::new())?,
            mode: mode.optional()?,
            target_file_bytes: usize::try_from(target.or(TARGET_FILE_MIB_DEFAULT)? << 20).ok()?,
            row_group_rows: row_group_rows.or(ROW_GROUP_ROWS_DEFAULT)?,
            storage: storage.or(Vec::new())?,
            checkpoint_interval: checkpoint_interval.or(CHECKPOINT_INTERVAL_DEFAULT)?,
            compact_files: compact_files.or(0)?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// A validated Delta sink.
#[derive(Debug, Clone)]
pub struct ConfiguredDelta {
    /// The sink's name, for messages.
    pub name: String,
    pub options: DeltaOptions,
}

impl ConfiguredDelta {
    /// The table's directory. Its errors do not name the sink: the engine names it in
    /// front of every check and build error.
    fn open(&self, base_dir: &Path) -> Result<ObjectDir, SluiceError> {
        ObjectDir::open(&self.options.path, base_dir, &self.options.storage, "Delta table", "sink.delta_io")
    }
}

impl ConfiguredSink for ConfiguredDelta {
    /// A table in a local directory given as a plain path (for overlap checks).
    fn output_paths(&self, base_dir: &Path) -> Vec<PathBuf> {
        if self.options.path.contains("://") {
            return Vec::new();
        }
        vec![crate::connector::resolve(base_dir, Path::new(&self.options.path))]
    }

    /// The path or URL and the storage settings resolve (no I/O).
    fn check(&self, base_dir: &Path) -> Result<(), SluiceError> {
        self.open(base_dir).map(drop)
    }

    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        let name = &context.config.name;
        let mode = match (self.options.mode, context.updating) {
            (Some(DeltaMode::Append), true) => {
                return Err(SluiceError::user(
                    "sink.delta_updating",
                    "its view is updating (rows may be retracted), and mode = \"append\" would \
                         keep every retracted row in the Delta table".to_string(),
                )
                .with_fix("set mode = \"changelog\" (or remove `mode`): each change is appended with an op column (+I, -U, +U, -D)"));
            }
            (Some(mode), _) => mode,
            (None, true) => DeltaMode::Changelog,
            (None, false) => DeltaMode::Append,
        };
        let updating = mode == DeltaMode::Changelog;
        let layout = layout_of(&context.schema, updating, &self.options.partition_by)?;
        let dir = self.open(context.base_dir)?;
        let options = &self.options;
        let table = table::Table::new(name, dir, options.checkpoint_interval, options.compact_files > 0);
        let shared = shared::Shared::new(
            name,
            context.pipeline,
            table,
            layout,
            self.options.clone(),
            shared::Input { schema: context.schema.clone(), updating, upsert_key: context.upsert_key.clone() },
        );
        Ok(Arc::new(DeltaSink::new(shared, context.exactly_once)))
    }
}

/// The stored columns of a view of `schema` (after `op` when `changelog`), each a type a
/// Delta table holds, and the partition columns among them.
pub fn layout_of(schema: &Schema, changelog: bool, partition_by: &[String]) -> Result<Layout, SluiceError> {
    let mut fields: Vec<Field> = Vec::new();
    if changelog {
        if schema.fields().iter().any(|f| f.name() == sluice_formats::encode::OP_COLUMN) {
            return Err(SluiceError::user(
                "sink.delta_op_column",
                "the view has a column named `op`, the name of a changelog table's op column".to_string(),
            )
            .with_fix("rename the view's column `op` (e.g. SELECT op AS operation, ...)"));
        }
        fields.push(Field::new(sluice_formats::encode::OP_COLUMN, DataType::Utf8, false));
    }
    fields.extend(schema.fields().iter().map(|f| f.as_ref().clone()));
    let mut columns = Vec::with_capacity(fields.len());
    let mut stored = Vec::with_capacity(fields.len());
    for field in &fields {
        let Some((delta_type, written)) = log::delta_type(field.data_type()) else {
            return Err(SluiceError::user(
                "sink.delta_type",
                format!("column `{}` has type {}, which a Delta table cannot hold", field.name(), field.data_type()),
            )
            .with_fix(format!(
                "CAST `{}` in the view to BIGINT, DOUBLE, DECIMAL, VARCHAR, DATE or TIMESTAMP",
                field.name()
            )));
        };
        columns.push(Column { name: field.name().clone(), delta_type, nullable: field.is_nullable() });
        stored.push(Field::new(field.name(), written, field.is_nullable()));
    }
    let mut partition_columns = Vec::with_capacity(partition_by.len());
    for name in partition_by {
        let Some(index) = stored.iter().position(|f| f.name() == name) else {
            let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(SluiceError::user(
                "sink.delta_partition",
                format!("partition_by names `{name}`, which is not a column of the view ({})", known.join(", ")),
            )
            .with_fix("name columns of the view in partition_by"));
        };
        let partitionable = matches!(
            stored[index].data_type(),
            DataType::Boolean
                | DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Utf8
                | DataType::Date32
        );
        if !partitionable {
            return Err(SluiceError::user(
                "sink.delta_partition",
                format!("partition column `{name}` has type {}, and partitions are by BOOLEAN, integer, VARCHAR or DATE values", stored[index].data_type()),
            )
            .with_fix(format!("partition by a column derived in the view, e.g. CAST(`{name}` AS DATE) AS day")));
        }
        partition_columns.push(index);
    }
    if partition_columns.len() == stored.len() {
        return Err(SluiceError::user(
            "sink.delta_partition",
            "partition_by names every column, which leaves data files without columns".to_string(),
        )
        .with_fix("leave at least one column out of partition_by"));
    }
    let data_columns: Vec<usize> = (0..stored.len()).filter(|i| !partition_columns.contains(i)).collect();
    let data_schema = Arc::new(Schema::new(data_columns.iter().map(|&i| stored[i].clone()).collect::<Vec<_>>()));
    Ok(Layout {
        table_schema: Arc::new(Schema::new(stored)),
        data_columns,
        data_schema,
        partition_names: partition_by.to_vec(),
        partition_columns,
        metadata: TableMetadata { columns, partition_columns: partition_by.to_vec(), invariants: Vec::new() },
    })
}
