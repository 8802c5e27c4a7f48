//! Log checkpoints: a table's state at a version as one Parquet file, so that a reader
//! reads it and the commits after it rather than every commit from version 0.
//!
//! The sink writes `_delta_log/{v:020}.checkpoint.parquet` after its own commit of a
//! version `v` that is a multiple of `checkpoint_interval`, then points
//! `_delta_log/_last_checkpoint` (`{"version": v, "size": rows}`) at it. A checkpoint is
//! an optimisation for readers, this sink's first read of the log included (`log_start`,
//! which reads them with `checkpoint_read`): the commits stay (this sink never deletes
//! one), a reader that finds no checkpoint or an older one reads the commits, and a crash
//! between the two writes leaves `_last_checkpoint` at the previous one (stale: a reader
//! that lists the log finds the newer file). Both are plain writes: two writers
//! checkpointing one version write the same state.
//!
//! Also here: the names of checkpoint files as other writers make them ([`checkpoint_name`]:
//! single-file, multi-part, V2 by UUID) and `_last_checkpoint` read back
//! ([`parse_last_checkpoint`]).
//!
//! The file holds one row per action (columns `txn`, `add`, `metaData`, `protocol`, each
//! null but in its own rows): the newest protocol and metaData, every application's
//! newest `txn`, and an `add` (with `dataChange: false`) per live file. No `remove`
//! tombstones (the state needs none; a compaction's removed files are found unreferenced
//! by a vacuum), and none are read back (`checkpoint_read`).
//!
//! Memory: the live actions (`log::LiveActions`) hold one `add` per live file of the
//! table, a few hundred bytes each, from the first read of the log on; a sink without
//! checkpoints or compaction keeps none.
//!
//! The rows are built as the actions' JSON, decoded by Arrow's JSON reader against the
//! checkpoint schema ([`schema`]), so each value is converted once, by one reader.

use std::io::Cursor;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::{Value, json};

use super::log::{LOG_DIR, LogState};

/// Rows decoded at a time.
const BATCH_ROWS: usize = 8192;

/// The name of the checkpoint of `version`, relative to the table.
pub fn checkpoint_path(version: u64) -> String {
    format!("{LOG_DIR}/{version:020}.checkpoint.parquet")
}

/// The name of the pointer to the newest checkpoint.
pub fn last_checkpoint_path() -> String {
    format!("{LOG_DIR}/_last_checkpoint")
}

fn string(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

fn long(name: &str) -> Field {
    Field::new(name, DataType::Int64, true)
}

fn strings(name: &str) -> Field {
    Field::new(name, DataType::List(Arc::new(string("element", true))), true)
}

fn string_map(name: &str) -> Field {
    let entries = Fields::from(vec![string("key", false), string("value", true)]);
    let entries = Field::new("key_value", DataType::Struct(entries), false);
    Field::new(name, DataType::Map(Arc::new(entries), false), true)
}

fn object(name: &str, fields: Vec<Field>) -> Field {
    Field::new(name, DataType::Struct(Fields::from(fields)), true)
}

/// The columns of a checkpoint this sink writes.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        object("txn", vec![string("appId", false), long("version"), long("lastUpdated")]),
        object(
            "add",
            vec![
                string("path", false),
                string_map("partitionValues"),
                long("size"),
                long("modificationTime"),
                Field::new("dataChange", DataType::Boolean, true),
                string("stats", true),
            ],
        ),
        object(
            "metaData",
            vec![
                string("id", false),
                string("name", true),
                string("description", true),
                object("format", vec![string("provider", false), string_map("options")]),
                string("schemaString", true),
                strings("partitionColumns"),
                string_map("configuration"),
                long("createdTime"),
            ],
        ),
        object(
            "protocol",
            vec![
                Field::new("minReaderVersion", DataType::Int32, true),
                Field::new("minWriterVersion", DataType::Int32, true),
                strings("readerFeatures"),
                strings("writerFeatures"),
            ],
        ),
    ]))
}

/// The checkpoint of `state` (which must keep its live actions): the Parquet file and its
/// rows; the reason when it cannot be built.
pub fn encode(state: &LogState) -> Result<(Vec<u8>, usize), String> {
    let live = state.actions.as_ref().ok_or("the live actions were not kept")?;
    let mut lines = String::new();
    let mut push = |action: Value| {
        lines.push_str(&action.to_string());
        lines.push('\n');
    };
    if let Some(protocol) = &live.protocol {
        push(json!({"protocol": protocol}));
    }
    if let Some(metadata) = &live.metadata {
        push(json!({"metaData": metadata}));
    }
    for (app, version) in &state.transactions {
        push(json!({"txn": {"appId": app, "version": version}}));
    }
    for add in live.files.values() {
        push(json!({"add": add}));
    }
    let schema = schema();
    let reader = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(BATCH_ROWS)
        .build(Cursor::new(lines.into_bytes()))
        .map_err(|error| error.to_string())?;
    let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(properties)).map_err(|error| error.to_string())?;
    let mut rows = 0;
    for batch in reader {
        let batch = batch.map_err(|error| error.to_string())?;
        rows += batch.num_rows();
        writer.write(&batch).map_err(|error| error.to_string())?;
    }
    let bytes = writer.into_inner().map_err(|error| error.to_string())?;
    Ok((bytes, rows))
}

/// The contents of `_last_checkpoint` for a checkpoint of `version` with `rows` rows.
pub fn last_checkpoint(version: u64, rows: usize) -> Vec<u8> {
    json!({"version": version, "size": rows}).to_string().into_bytes()
}

/// The largest `_last_checkpoint` read: a few dozen bytes as this sink writes it, a few
/// hundred as other writers do (with `sizeInBytes`, `numOfAddFiles`, a checksum or the
/// checkpoint's schema).
pub const LAST_CHECKPOINT_BYTES_MAX: u64 = 1 << 20;

/// What `_last_checkpoint` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastCheckpoint {
    pub version: u64,
    /// The checkpoint's rows, when stated.
    pub size: Option<u64>,
    /// The number of parts of a multi-part checkpoint.
    pub parts: Option<u64>,
    /// A V2 checkpoint (`v2Checkpoint` is set).
    pub v2: bool,
}

/// `_last_checkpoint` read; the reason when it is not one.
pub fn parse_last_checkpoint(bytes: &[u8]) -> Result<LastCheckpoint, String> {
    let pointer: Value = serde_json::from_slice(bytes).map_err(|error| format!("it is not JSON: {error}"))?;
    let version = pointer.get("version").and_then(Value::as_u64).ok_or("it has no version")?;
    let parts = pointer.get("parts").and_then(Value::as_u64);
    if parts == Some(0) {
        return Err("it states 0 parts".to_string());
    }
    let size = pointer.get("size").and_then(Value::as_u64);
    let v2 = pointer.get("v2Checkpoint").is_some_and(|v2| !v2.is_null());
    Ok(LastCheckpoint { version, size, parts, v2 })
}

/// The name of part `part` (from 1) of a checkpoint of `version` in `parts` parts.
pub fn part_path(version: u64, part: u64, parts: u64) -> String {
    format!("{LOG_DIR}/{version:020}.checkpoint.{part:010}.{parts:010}.parquet")
}

/// A checkpoint file, as its name in `_delta_log/` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointName {
    /// `{v:020}.checkpoint.parquet`: a single-file (classic) checkpoint, the kind this
    /// sink and delta-rs write (possibly a V2 checkpoint with sidecars: its rows tell).
    Single { version: u64 },
    /// `{v:020}.checkpoint.{part:010}.{parts:010}.parquet`: one part of a multi-part one.
    Part { version: u64, part: u64, parts: u64 },
    /// `{v:020}.checkpoint.{uuid}.json|parquet`: a V2 checkpoint.
    Uuid { version: u64 },
}

impl CheckpointName {
    pub fn version(self) -> u64 {
        match self {
            CheckpointName::Single { version }
            | CheckpointName::Part { version, .. }
            | CheckpointName::Uuid { version } => version,
        }
    }
}

/// The checkpoint a log entry's name (relative to the table) is a file of, if any.
pub fn checkpoint_name(relative: &str) -> Option<CheckpointName> {
    let name = relative.strip_prefix(LOG_DIR)?.strip_prefix('/')?;
    let digits = |text: &str, width: usize| {
        (text.len() == width && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse::<u64>().ok())?
    };
    let (version, rest) = name.split_once(".checkpoint.")?;
    let version = digits(version, 20)?;
    if rest == "parquet" {
        return Some(CheckpointName::Single { version });
    }
    if let Some(numbers) = rest.strip_suffix(".parquet")
        && let Some((part, parts)) = numbers.split_once('.')
        && let (Some(part), Some(parts)) = (digits(part, 10), digits(parts, 10))
    {
        return (1..=parts).contains(&part).then_some(CheckpointName::Part { version, part, parts });
    }
    let unique = rest.strip_suffix(".parquet").or_else(|| rest.strip_suffix(".json"))?;
    (!unique.is_empty() && !unique.contains('/')).then_some(CheckpointName::Uuid { version })
}
