//! Small-file compaction (`compact_files`): a streaming sink writes a file per thread,
//! partition and checkpoint, so a table fills with small files that every reader opens.
//!
//! After each of its commits, the sink looks for a partition holding at least
//! `compact_files` live files smaller than half the target size; it reads up to a target
//! size of them (oldest names first), writes their rows into one new file, and commits,
//! in one version without `txn`, a `remove` of each (with `dataChange: false`) and an
//! `add` of the new one (`dataChange: false`): readers of later versions see the same
//! rows, readers of earlier ones the old files. The commit is decided against the newest
//! log: if another writer removed one of the files first, nothing is committed (the new
//! file stays unreferenced). Files whose columns are not exactly the sink's data columns
//! (another writer's) are left alone. At most one compaction follows a commit, so the
//! work per checkpoint is bounded by the target size; a failure is logged, never fails the
//! durable commit before it.

use std::collections::BTreeMap;

use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value, json};
use sluice_types::SluiceError;

use super::log::{self, AddFile};
use super::shared::Shared;
use super::table::Decision;
use super::writer::{now_ms, unique_token};

/// A live file the log names: its path as stored (URI-encoded) and its `add`.
struct Candidate {
    encoded_path: String,
    size: u64,
    add: Value,
}

/// Compacts one partition's small files, if one has `compact_files` of them.
pub fn compact(shared: &Shared) -> Result<(), SluiceError> {
    let minimum = shared.options.compact_files;
    if minimum == 0 {
        return Ok(());
    }
    let target = shared.options.target_file_bytes as u64;
    let state = shared.table.latest()?;
    let Some(live) = &state.actions else { return Ok(()) };
    let mut groups: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    for (path, add) in &live.files {
        let size = add.get("size").and_then(Value::as_u64).unwrap_or(u64::MAX);
        if size < target / 2 {
            let partition = add.get("partitionValues").map_or_else(String::new, Value::to_string);
            groups.entry(partition).or_default().push(Candidate { encoded_path: path.clone(), size, add: add.clone() });
        }
    }
    let Some(group) = groups.into_values().find(|group| group.len() >= minimum) else { return Ok(()) };
    let mut chosen = Vec::new();
    let mut total = 0;
    for candidate in group {
        if chosen.len() >= 2 && total + candidate.size > target {
            break;
        }
        total += candidate.size;
        chosen.push(candidate);
    }
    merge(shared, chosen)
}

fn parquet_error(shared: &Shared, action: &str, error: impl std::fmt::Display) -> SluiceError {
    SluiceError::internal(
        "sink.delta_compact",
        format!("sink `{}`: compacting Delta table {}: {action}: {error}", shared.name, shared.table.url()),
    )
}

/// Writes `chosen`'s rows into one file and commits the exchange.
fn merge(shared: &Shared, chosen: Vec<Candidate>) -> Result<(), SluiceError> {
    let data_schema = shared.layout.data_schema.clone();
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(shared.options.row_group_rows))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), data_schema.clone(), Some(properties))
        .map_err(|e| parquet_error(shared, "opening", e))?;
    let mut rows = 0u64;
    for candidate in &chosen {
        let relative = log::uri_decode(&candidate.encoded_path);
        let size_max = candidate.size.max(1);
        let Some(bytes) = shared.table.dir.get(&relative, size_max)? else {
            return Err(parquet_error(shared, &format!("reading {relative}"), "the file is gone"));
        };
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .map_err(|e| parquet_error(shared, &format!("reading {relative}"), e))?;
        if reader.schema().fields() != data_schema.fields() {
            tracing::debug!(sink = %shared.name, "delta sink: {relative} has other columns; not compacted");
            return Ok(());
        }
        for batch in reader.build().map_err(|e| parquet_error(shared, &format!("reading {relative}"), e))? {
            let batch = batch.map_err(|e| parquet_error(shared, &format!("reading {relative}"), e))?;
            rows += batch.num_rows() as u64;
            writer.write(&batch).map_err(|e| parquet_error(shared, "writing", e))?;
        }
    }
    let bytes = writer.into_inner().map_err(|e| parquet_error(shared, "finishing", e))?;
    let partition: Map<String, Value> =
        chosen[0].add.get("partitionValues").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut path = String::new();
    for name in &shared.layout.partition_names {
        let value = partition.get(name).and_then(Value::as_str);
        path.push_str(&log::partition_directory(name, value));
        path.push('/');
    }
    path.push_str(&format!("part-{}-compacted.snappy.parquet", unique_token()));
    let size = bytes.len() as u64;
    shared.table.dir.put(&path, Bytes::from(bytes))?;
    let now = now_ms();
    let partition_values = shared
        .layout
        .partition_names
        .iter()
        .map(|name| (name.clone(), partition.get(name).and_then(Value::as_str).map(str::to_string)))
        .collect();
    let mut add =
        log::add_action(&AddFile { path: path.clone(), partition_values, size, modification_time_ms: now, rows });
    add["add"]["dataChange"] = Value::Bool(false);
    let version = shared.table.commit(|state| {
        let live = state.actions.as_ref().map(|live| &live.files);
        if !chosen.iter().all(|c| live.is_some_and(|files| files.contains_key(&c.encoded_path))) {
            return Ok(Decision::Skip);
        }
        let mut actions: Vec<Value> = chosen
            .iter()
            .map(|c| {
                json!({"remove": {"path": c.encoded_path, "deletionTimestamp": now, "dataChange": false,
                    "extendedFileMetadata": true, "partitionValues": c.add.get("partitionValues").cloned()
                        .unwrap_or_else(|| json!({})), "size": c.size}})
            })
            .collect();
        actions.push(add.clone());
        let mut parameters = Map::new();
        parameters.insert("sink".into(), json!(shared.name));
        parameters.insert("files".into(), json!(chosen.len().to_string()));
        actions.push(log::commit_info("OPTIMIZE", now, parameters));
        Ok(Decision::Commit(actions))
    })?;
    match version {
        Some(version) => {
            tracing::info!(sink = %shared.name, version, files = chosen.len(), rows, "delta sink: compacted small files")
        }
        None => {
            tracing::debug!(sink = %shared.name, "delta sink: files removed by another writer first; no compaction")
        }
    }
    Ok(())
}
