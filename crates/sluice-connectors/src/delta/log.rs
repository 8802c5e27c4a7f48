//! The Delta transaction log as this sink writes and reads it: pure functions, no I/O.
//!
//! A table is a directory of Parquet data files and a log, `_delta_log/`, of commits
//! `{version:020}.json`, each a file of JSON actions, one per line. Version `v` exists
//! once its file does; a writer makes version `v + 1` by creating that file only if it
//! does not exist (the store's create-only write), so two writers never both make one
//! version. The actions written here:
//!
//! - `protocol` (version 0 only): reader 1 and writer 2; reader 3 and writer 7 with the
//!   `timestampNtz` feature when a column is a timestamp without time zone.
//! - `metaData` (version 0 only): the table's id, its schema (`schemaString`, a JSON
//!   struct of the columns: name, Delta type, nullable), `partitionColumns`, Parquet.
//! - `add`: a data file (path relative to the table, URI-encoded; its partition values as
//!   strings; size; modification time; `dataChange: true`; `stats` with `numRecords`).
//! - `txn`: an application's id and its last committed version. This sink's `appId` is
//!   `sluice/{pipeline}/{sink}/{slot}` and its `version` the epoch (see `sink`).
//! - `commitInfo`: the operation and time, for people reading the history.
//!
//! Reading a log ([`LogState::apply`] per commit, [`LogState::apply_action`] per action,
//! which a log checkpoint's rows go through as well: `checkpoint_read`) keeps what the
//! sink needs: the latest version, the schema and partition columns of the newest
//! `metaData`, every application's newest `txn` version and, when kept, the live actions
//! (`add`s, ended by `remove`s). Any other action (a `cdc`, a `domainMetadata`) is read
//! past.

use std::collections::BTreeMap;

use arrow::datatypes::{DataType, TimeUnit};
use serde_json::{Map, Value, json};

/// The log's directory inside the table.
pub const LOG_DIR: &str = "_delta_log";
/// The largest commit file read (a commit of this sink holds an epoch's file list).
pub const COMMIT_BYTES_MAX: u64 = 256 << 20;
/// The writer features a table needs for timestamps without time zone.
pub const TIMESTAMP_NTZ: &str = "timestampNtz";
/// The table feature of V2 log checkpoints (named by a UUID, or holding a
/// `checkpointMetadata` row, their files possibly in sidecars), which this sink neither
/// reads nor writes.
pub const V2_CHECKPOINT: &str = "v2Checkpoint";

/// The name of commit `version`, relative to the table.
pub fn commit_path(version: u64) -> String {
    format!("{LOG_DIR}/{version:020}.json")
}

/// The version of a log entry's name when it is a commit (`_delta_log/{v:020}.json`).
pub fn commit_version(relative: &str) -> Option<u64> {
    let name = relative.strip_prefix(LOG_DIR)?.strip_prefix('/')?.strip_suffix(".json")?;
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.parse().ok())?
}

/// One column of a table's schema, as the log states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// The Delta type: a primitive's name (`long`, `decimal(10,2)`), or the compact JSON
    /// of a nested type (never one this sink writes).
    pub delta_type: String,
    pub nullable: bool,
}

/// A table's schema and partitioning, from its newest `metaData`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMetadata {
    pub columns: Vec<Column>,
    pub partition_columns: Vec<String>,
    /// The columns with an invariant (`delta.invariants`), which this sink does not check.
    pub invariants: Vec<String>,
}

/// A table's newest `protocol` action: what a reader and a writer must support.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protocol {
    pub min_writer_version: u64,
    pub writer_features: Vec<String>,
    pub reader_features: Vec<String>,
}

/// The fix of a table with the `v2Checkpoint` feature, which this sink refuses.
pub fn v2_checkpoint_fix() -> String {
    format!(
        "write this view to a new Delta table path: this sink neither reads nor writes V2 log checkpoints (or drop \
         the table's {V2_CHECKPOINT} feature with an engine that supports it, e.g. ALTER TABLE ... DROP FEATURE \
         {V2_CHECKPOINT})"
    )
}

/// The writer features this sink honours on a table of writer version 7: the types it
/// writes, and append-only (it never rewrites a file).
pub const WRITER_FEATURES: &[&str] = &[TIMESTAMP_NTZ, "appendOnly"];

impl Protocol {
    /// Why this sink must not write a table of this protocol, if it must not: a writer
    /// version above 2 (before 7) asks for constraints, generated or identity columns,
    /// column mapping or a change feed, which this sink does not maintain; at 7, a writer
    /// feature it does not know. A reader feature it does not know is refused too (the
    /// protocol lists each among the writer features as well, so this only catches a
    /// table that breaks that rule): `v2Checkpoint` changes how the log itself is read.
    pub fn unsupported(&self) -> Option<String> {
        let unknown = |features: &[String]| -> Vec<String> {
            let unknown = features.iter().filter(|feature| !WRITER_FEATURES.contains(&feature.as_str()));
            unknown.cloned().collect()
        };
        let mut parts = match self.min_writer_version {
            0..=2 => Vec::new(),
            7 => {
                let writer = unknown(&self.writer_features);
                if writer.is_empty() { Vec::new() } else { vec![format!("the writer features {}", writer.join(", "))] }
            }
            version => vec![format!("writer version {version}")],
        };
        let reader: Vec<String> =
            unknown(&self.reader_features).into_iter().filter(|f| !self.writer_features.contains(f)).collect();
        if !reader.is_empty() {
            parts.push(format!("the reader features {}", reader.join(", ")));
        }
        (!parts.is_empty()).then(|| parts.join(" and "))
    }

    /// Whether the protocol names `feature` (a reader or a writer feature).
    pub fn requires(&self, feature: &str) -> bool {
        self.writer_features.iter().chain(&self.reader_features).any(|named| named == feature)
    }
}

/// The actions that make a table's state at a version: its newest protocol and metaData
/// and every live file's `add` (by path; a `remove` ends one). Each `txn` is in
/// [`LogState::transactions`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveActions {
    pub protocol: Option<Value>,
    pub metadata: Option<Value>,
    pub files: BTreeMap<String, Value>,
}

/// What the sink knows of a table's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// The newest version read; `None`: no commit yet (no table).
    pub version: Option<u64>,
    pub metadata: Option<TableMetadata>,
    pub protocol: Option<Protocol>,
    /// The live state as actions, for a log checkpoint (`checkpoint`): kept only when
    /// `Some` at the first commit read (a sink that writes checkpoints).
    pub actions: Option<LiveActions>,
    /// Each application's newest `txn` version.
    pub transactions: BTreeMap<String, u64>,
}

impl LogState {
    /// An empty state (no version read) that keeps the live actions when `keep_actions`.
    pub fn new(keep_actions: bool) -> LogState {
        LogState { actions: keep_actions.then(LiveActions::default), ..LogState::default() }
    }

    /// Applies the actions of commit `version`, which must be the one after
    /// [`LogState::version`]; the reason when the text is not a Delta commit.
    pub fn apply(&mut self, version: u64, text: &[u8]) -> Result<(), String> {
        assert_eq!(version, self.version.map_or(0, |v| v + 1), "commits are applied in order");
        let text = std::str::from_utf8(text).map_err(|_| "it is not UTF-8".to_string())?;
        for (index, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let action: Value =
                serde_json::from_str(line).map_err(|error| format!("line {} is not JSON: {error}", index + 1))?;
            self.apply_action(&action).map_err(|why| format!("line {}: {why}", index + 1))?;
        }
        self.version = Some(version);
        Ok(())
    }

    /// Applies one action, of a commit or of a log checkpoint's row (a checkpoint's
    /// actions are applied through here too, so that both reads keep the same state); the
    /// reason when it is malformed. Does not move [`LogState::version`].
    pub fn apply_action(&mut self, action: &Value) -> Result<(), String> {
        if let Some(live) = &mut self.actions {
            live.apply(action);
        }
        if let Some(txn) = action.get("txn") {
            let app = txn.get("appId").and_then(Value::as_str);
            let app_version = txn.get("version").and_then(Value::as_u64);
            let (Some(app), Some(app_version)) = (app, app_version) else {
                return Err("a txn action without appId or version".to_string());
            };
            let newest = self.transactions.entry(app.to_string()).or_insert(app_version);
            *newest = (*newest).max(app_version);
        } else if let Some(protocol) = action.get("protocol") {
            let strings = |key: &str| {
                let values = protocol.get(key).and_then(Value::as_array);
                values.map(|v| v.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default()
            };
            let min_writer_version = protocol.get("minWriterVersion").and_then(Value::as_u64).unwrap_or(0);
            self.protocol = Some(Protocol {
                min_writer_version,
                writer_features: strings("writerFeatures"),
                reader_features: strings("readerFeatures"),
            });
        } else if let Some(metadata) = action.get("metaData") {
            self.metadata = Some(parse_metadata(metadata)?);
        }
        Ok(())
    }
}

impl LiveActions {
    fn apply(&mut self, action: &Value) {
        if let Some(protocol) = action.get("protocol") {
            self.protocol = Some(protocol.clone());
        } else if let Some(metadata) = action.get("metaData") {
            self.metadata = Some(metadata.clone());
        } else if let Some(add) = action.get("add") {
            if let Some(path) = add.get("path").and_then(Value::as_str) {
                let mut add = add.clone();
                // A checkpoint's adds are the state, not a change.
                add["dataChange"] = Value::Bool(false);
                self.files.insert(path.to_string(), add);
            }
        } else if let Some(path) = action.get("remove").and_then(|r| r.get("path")).and_then(Value::as_str) {
            self.files.remove(path);
        }
    }
}

fn parse_metadata(metadata: &Value) -> Result<TableMetadata, String> {
    let schema = metadata.get("schemaString").and_then(Value::as_str).ok_or("metaData without schemaString")?;
    let schema: Value = serde_json::from_str(schema).map_err(|error| format!("schemaString is not JSON: {error}"))?;
    let fields = schema.get("fields").and_then(Value::as_array).ok_or("schemaString without fields")?;
    let mut columns = Vec::with_capacity(fields.len());
    let mut invariants = Vec::new();
    for field in fields {
        let name = field.get("name").and_then(Value::as_str).ok_or("a schema field without a name")?;
        let delta_type = match field.get("type") {
            Some(Value::String(primitive)) => primitive.clone(),
            Some(nested) => nested.to_string(),
            None => return Err(format!("schema field {name:?} without a type")),
        };
        let nullable = field.get("nullable").and_then(Value::as_bool).unwrap_or(true);
        if field.get("metadata").and_then(|m| m.get("delta.invariants")).is_some() {
            invariants.push(name.to_string());
        }
        columns.push(Column { name: name.to_string(), delta_type, nullable });
    }
    let partition_columns = metadata
        .get("partitionColumns")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    Ok(TableMetadata { columns, partition_columns, invariants })
}

/// The Delta type of an Arrow column this sink writes, and the Arrow type its Parquet
/// column is written as; `None` for a type a Delta table cannot hold.
pub fn delta_type(data_type: &DataType) -> Option<(String, DataType)> {
    let same = |name: &str| Some((name.to_string(), data_type.clone()));
    match data_type {
        DataType::Boolean => same("boolean"),
        DataType::Int8 => same("byte"),
        DataType::Int16 => same("short"),
        DataType::Int32 => same("integer"),
        DataType::Int64 => same("long"),
        DataType::Float32 => same("float"),
        DataType::Float64 => same("double"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(("string".into(), DataType::Utf8)),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Some(("binary".into(), DataType::Binary)),
        DataType::Date32 | DataType::Date64 => Some(("date".into(), DataType::Date32)),
        DataType::Timestamp(_, None) => {
            Some(("timestamp_ntz".into(), DataType::Timestamp(TimeUnit::Microsecond, None)))
        }
        DataType::Timestamp(_, Some(_)) => {
            Some(("timestamp".into(), DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))))
        }
        DataType::Decimal128(precision, scale) if *precision <= 38 && *scale >= 0 => {
            same(&format!("decimal({precision},{scale})"))
        }
        _ => None,
    }
}

/// `schemaString` of `columns`.
pub fn schema_string(columns: &[Column]) -> String {
    let fields: Vec<Value> = columns
        .iter()
        .map(|c| json!({"name": c.name, "type": c.delta_type, "nullable": c.nullable, "metadata": {}}))
        .collect();
    json!({"type": "struct", "fields": fields}).to_string()
}

/// The actions of version 0: protocol, metaData and commitInfo.
pub fn create_actions(table_id: &str, metadata: &TableMetadata, now_ms: i64) -> Vec<Value> {
    let timestamp_ntz = metadata.columns.iter().any(|c| c.delta_type == "timestamp_ntz");
    let protocol = if timestamp_ntz {
        json!({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": [TIMESTAMP_NTZ], "writerFeatures": [TIMESTAMP_NTZ]}})
    } else {
        json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
    };
    let meta = json!({"metaData": {
        "id": table_id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_string(&metadata.columns),
        "partitionColumns": metadata.partition_columns,
        "configuration": {},
        "createdTime": now_ms,
    }});
    vec![protocol, meta, commit_info("CREATE TABLE", now_ms, Map::new())]
}

/// A data file of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddFile {
    /// Relative to the table, as stored (not URI-encoded).
    pub path: String,
    /// Each partition column's value as a string (`None`: NULL), in the table's order.
    pub partition_values: Vec<(String, Option<String>)>,
    pub size: u64,
    pub modification_time_ms: i64,
    pub rows: u64,
}

/// The `add` action of `file`.
pub fn add_action(file: &AddFile) -> Value {
    let values: Map<String, Value> = file
        .partition_values
        .iter()
        .map(|(name, value)| (name.clone(), value.as_ref().map_or(Value::Null, |v| Value::String(v.clone()))))
        .collect();
    json!({"add": {
        "path": uri_encode(&file.path),
        "partitionValues": values,
        "size": file.size,
        "modificationTime": file.modification_time_ms,
        "dataChange": true,
        "stats": json!({"numRecords": file.rows}).to_string(),
    }})
}

/// The `txn` action of application `app_id` at `version`.
pub fn txn_action(app_id: &str, version: u64, now_ms: i64) -> Value {
    json!({"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}})
}

/// The `commitInfo` action of `operation`, with `parameters`.
pub fn commit_info(operation: &str, now_ms: i64, parameters: Map<String, Value>) -> Value {
    json!({"commitInfo": {"timestamp": now_ms, "operation": operation,
        "operationParameters": parameters, "engineInfo": concat!("sluice/", env!("CARGO_PKG_VERSION"))}})
}

/// Actions as a commit file: one JSON object per line.
pub fn encode_commit(actions: &[Value]) -> Vec<u8> {
    let mut text = String::new();
    for action in actions {
        text.push_str(&action.to_string());
        text.push('\n');
    }
    text.into_bytes()
}

/// `path` as a relative URI: every byte outside the unreserved set and `/` escaped.
pub fn uri_encode(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'/' | b'-' | b'_' | b'.' | b'~' | b'=') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The relative path a URI-encoded `path` names (`%XX` decoded; a malformed escape kept
/// as written).
pub fn uri_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes.get(index + 1..index + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[index], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                index += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// A partition value as a directory name part: Hive's escaping (`%XX` for every byte
/// outside letters, digits, `-`, `_`, `.` and space), `__HIVE_DEFAULT_PARTITION__`
/// for NULL.
pub fn partition_directory(column: &str, value: Option<&str>) -> String {
    let escape = |text: &str| {
        let mut escaped = String::with_capacity(text.len());
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b' ') {
                escaped.push(byte as char);
            } else {
                escaped.push_str(&format!("%{byte:02X}"));
            }
        }
        escaped
    };
    format!("{}={}", escape(column), value.map_or_else(|| "__HIVE_DEFAULT_PARTITION__".to_string(), escape))
}
