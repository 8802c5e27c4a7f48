//! Reading a log checkpoint: a checkpoint Parquet file's rows applied to a [`LogState`],
//! so that the first read of a log starts at its newest checkpoint (`log_start`).
//!
//! A checkpoint (this sink's, delta-rs's, Spark's) holds one row per action, each in its
//! own struct column (`protocol`, `metaData`, `txn`, `add`, `remove`, ...), the others null.
//! Only the columns the sink keeps are decoded (`add` only when the state keeps the live
//! actions); each non-null value becomes the action's JSON ([`json_at`]) and goes through
//! [`LogState::apply_action`], the function the commits go through, so a state read from
//! a checkpoint is the state read from the commits it covers (`tests.rs` checks it on
//! random logs and on a checkpoint written by delta-rs). `remove` rows are tombstones of
//! files already gone, not changes, and are not read. A struct's null fields are left out
//! of its JSON (as commits leave them out); a map's null values are kept (a partition
//! value may be NULL).
//!
//! Refused (the caller then tries an older checkpoint or the commits): a file that is not
//! Parquet or whose action columns have other types, and a V2 checkpoint ([`Unread::V2`]):
//! one with a `checkpointMetadata` row (what makes a checkpoint a V2 one, in a table with
//! the `v2Checkpoint` feature, whose writers this sink is not) or `sidecar` rows (files
//! holding its `add`s elsewhere). Such a file is refused before any of its actions is
//! trusted: the state it gives is never used.
//!
//! Bounds: the caller reads at most [`CHECKPOINT_BYTES_MAX`] bytes of checkpoint files per
//! read; decoding holds the file's bytes and one batch of rows at a time, besides the
//! state, which holds one `add` per live file anyway when it keeps them.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use bytes::Bytes;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Number, Value};

use super::log::LogState;

/// The most bytes of checkpoint files (a single file, or all parts of one) read at a first
/// read of the log. A checkpoint of this sink takes some 100 bytes per live file, so this
/// is millions of files, whose `add`s the state then holds (a few hundred bytes each); a
/// larger checkpoint is passed over for an older one or the commits, and the table is
/// refused only if those are gone too (see `log_start`).
pub const CHECKPOINT_BYTES_MAX: u64 = 512 << 20;

/// Rows decoded at a time.
const BATCH_ROWS: usize = 8192;

/// The action columns read, in the order their rows are applied.
const ACTIONS: [&str; 4] = ["protocol", "metaData", "txn", "add"];

/// Columns whose values make a V2 checkpoint: its metadata, and the sidecar files that
/// keep its `add`s elsewhere.
const V2_COLUMNS: [&str; 2] = ["checkpointMetadata", "sidecar"];

/// Why a checkpoint is not read here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// A V2 checkpoint (the `v2Checkpoint` table feature): named by a UUID, or holding a
    /// `checkpointMetadata` or `sidecar` row.
    V2(String),
    /// Any other reason: not Parquet, columns of other types, a malformed action, a part
    /// missing, too large, gone.
    Other(String),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::V2(why) | Unread::Other(why) => formatter.write_str(why),
        }
    }
}

/// What one checkpoint file held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileRows {
    /// Rows with an action read (protocol, metaData, txn, add).
    pub actions: u64,
    /// Every row of the file.
    pub rows: u64,
}

/// Applies the actions of one checkpoint file (a single-file checkpoint, or one part of
/// a multi-part one) to `state`; its rows, or the reason it is not a checkpoint read here
/// (then `state` holds part of the file's actions and must be dropped).
/// Does not move [`LogState::version`]: the caller sets it once every part is read.
pub fn apply_file(state: &mut LogState, bytes: Bytes) -> Result<FileRows, Unread> {
    let other = Unread::Other;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|error| other(format!("not Parquet: {error}")))?;
    let keep_adds = state.actions.is_some();
    let wanted = |name: &str| (ACTIONS.contains(&name) && (name != "add" || keep_adds)) || V2_COLUMNS.contains(&name);
    let roots: Vec<usize> = builder
        .parquet_schema()
        .root_schema()
        .get_fields()
        .iter()
        .enumerate()
        .filter(|(_, field)| wanted(field.name()))
        .map(|(index, _)| index)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|error| other(format!("not readable: {error}")))?;
    let mut found = FileRows::default();
    for batch in reader {
        let batch = batch.map_err(|error| other(format!("not readable: {error}")))?;
        for name in V2_COLUMNS {
            if batch.column_by_name(name).is_some_and(|column| column.null_count() < column.len()) {
                return Err(Unread::V2(format!(
                    "a V2 checkpoint (a `{name}` row; the {} table feature), which this sink does not read",
                    super::log::V2_CHECKPOINT
                )));
            }
        }
        found.rows += batch.num_rows() as u64;
        for name in ACTIONS {
            let Some(column) = batch.column_by_name(name) else { continue };
            if !matches!(column.data_type(), DataType::Struct(_)) {
                return Err(other(format!("its `{name}` column is a {}, not a struct", column.data_type())));
            }
            for row in (0..column.len()).filter(|&row| column.is_valid(row)) {
                let mut action = Map::with_capacity(1);
                action.insert(name.to_string(), json_at(column.as_ref(), row));
                state.apply_action(&Value::Object(action)).map_err(|why| other(format!("a `{name}` row: {why}")))?;
                found.actions += 1;
            }
        }
    }
    Ok(found)
}

/// The JSON of `array`'s value at `row`: structs as objects without their null fields,
/// maps as objects (string keys) with their null values, lists as arrays. Other types
/// (only in statistics columns such as `stats_parsed`, which the sink does not use) as
/// their display text.
pub fn json_at(array: &dyn Array, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(row)),
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(row).to_string()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(row).to_string()),
        DataType::Utf8View => Value::String(array.as_string_view().value(row).to_string()),
        DataType::Struct(_) => {
            let object = array.as_struct();
            let mut fields = Map::new();
            for (field, column) in object.fields().iter().zip(object.columns()) {
                if column.is_valid(row) {
                    fields.insert(field.name().clone(), json_at(column.as_ref(), row));
                }
            }
            Value::Object(fields)
        }
        DataType::Map(_, _) => {
            let entries = array.as_map().value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            let mut object = Map::new();
            for entry in 0..entries.len() {
                let key = match json_at(keys.as_ref(), entry) {
                    Value::String(key) => key,
                    other => other.to_string(),
                };
                object.insert(key, json_at(values.as_ref(), entry));
            }
            Value::Object(object)
        }
        DataType::List(_) => list(array.as_list::<i32>().value(row).as_ref()),
        DataType::LargeList(_) => list(array.as_list::<i64>().value(row).as_ref()),
        DataType::Float32 => float(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(row)),
        _ => arrow::util::display::array_value_to_string(array, row).map_or(Value::Null, Value::String),
    }
}

/// A finite float as a JSON number; NaN and infinities (which JSON lacks) as null.
fn float(value: f64) -> Value {
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

fn list(values: &dyn Array) -> Value {
    Value::Array((0..values.len()).map(|index| json_at(values, index)).collect())
}
