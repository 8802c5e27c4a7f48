//! What a Delta sink's writers share with it: the table, where each stored column goes,
//! the options, and the table's setup and fence. Its behaviour lives with the sink
//! (`sink`: setup, commits, fencing), so that `writer` and `compact` read it without
//! importing the sink.

use std::collections::BTreeMap;
use std::sync::Mutex;

use arrow::datatypes::SchemaRef;

use super::DeltaOptions;
use super::log::TableMetadata;
use super::table::Table;

/// Where each column of the stored rows goes.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Every column as stored (the `op` column first in changelog mode), after casts.
    pub table_schema: SchemaRef,
    /// The columns of `table_schema` written into data files (all but the partitions').
    pub data_columns: Vec<usize>,
    pub data_schema: SchemaRef,
    /// The partition columns' indices in `table_schema`, and their names.
    pub partition_columns: Vec<usize>,
    pub partition_names: Vec<String>,
    /// The table's schema and partitioning as the log states them.
    pub metadata: TableMetadata,
}

/// The stream a sink writes.
pub struct Input {
    /// The view's columns.
    pub schema: SchemaRef,
    /// Whether rows are written after their op (changelog mode).
    pub updating: bool,
    /// The columns identifying a live row, for `-U`/`+U` pairs.
    pub upsert_key: Option<Vec<usize>>,
}

/// What the sink's writers share with it.
pub struct Shared {
    pub name: String,
    pub pipeline: String,
    pub table: Table,
    pub layout: Layout,
    pub options: DeltaOptions,
    pub input_schema: SchemaRef,
    pub updating: bool,
    pub upsert_key: Option<Vec<usize>>,
    /// `sluice/{pipeline}/{sink}/`: the `appId` of slot `s` is this followed by `s`.
    pub app_prefix: String,
    pub(super) control: Mutex<Control>,
}

/// The table's setup and the fence.
#[derive(Default)]
pub(super) struct Control {
    /// Whether the table was created or checked.
    pub(super) ready: bool,
    /// Whether `discard_after` ran: from then on `fence` is checked at every commit.
    pub(super) recovered: bool,
    /// Each of this sink's `appId`s and the `txn` version this run expects in the log.
    pub(super) fence: BTreeMap<String, u64>,
}
