//! TopN and deduplication: `ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) <= N`.
//!
//! Over an append-only input a row that falls out of its partition's first N can never
//! come back, so the state per partition is just its first N rows, in order: each with
//! its order values and the whole row in the project's key encoding
//! ([`sluice_types::key`], which also makes it persistable; floats are kept with -0.0 as
//! 0.0 and one NaN). Ties in the order are broken by arrival, the earlier first, as
//! Flink's ROW_NUMBER does: a row goes after the rows of equal order values already held,
//! so the partition's order among those is their arrival order and no arrival number is
//! kept.
//!
//! A window TopN ([`TopNSpec::window_end`]: the partition includes a window's bounds, over
//! an append-only input, as Flink's window TopN) frees a window's partitions once the
//! watermark passes its end (`window_end - 1`): no row of that window can follow. A row
//! of a window already freed is late: counted (`view NAME: late rows`) and dropped.
//!
//! Over an updating input ([`TopNSpec::retracting`]) a retraction of a row in the first N
//! lets the next row in, so every row of the partition is kept (as Flink's retracting
//! TopN does; state grows with the input like a group aggregate's): a row with weight
//! `w > 0` is inserted `w` times, one with `w < 0` removes `-w` copies of itself (a
//! retraction of a row that is not held is ignored and counted in `view NAME: ignored
//! retractions`). A re-inserted row (an update's `+U`) arrives anew: among ties it ranks
//! after the rows that were there before it.
//!
//! Output rows are the input's columns followed by the rank (BIGINT UNSIGNED, 1 for the
//! first), emitted per input batch for each partition the batch changed, comparing its
//! first N before and after the batch:
//! - when the rank is visible downstream (`rank_in_output`): for each rank whose row
//!   changed, the old row with that rank (weight -1) directly followed by the new one
//!   (+1), a `-U`/`+U` pair of the upsert key (partition, rank); a rank that appears is
//!   `+I`, one that disappears cannot (append-only input never shrinks a partition);
//! - otherwise: each row that left the first N (-1), then each row that entered (+1); a
//!   deduplication (N = 1) thus sends a change of the partition's row as a pair, whose
//!   upsert key is the partition.

mod state;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, UInt32Array, UInt64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use arrow::record_batch::RecordBatch;
use hashbrown::HashTable;
use sluice_runtime::{Operator, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, SluiceError};

pub use state::TOPN_STATE_VERSION;

use crate::bytes::SmallBytes;
use crate::cold::{FROM_COLD, RECENT};
use crate::counter::LazyCounter;
use crate::pages::Pages;
use crate::partition::placement_hash;
use crate::row_log::{RowAt, RowLog};
use crate::spill::SpillSpace;

/// The most rows a TopN keeps per partition (N); larger limits are refused when planned.
pub const TOPN_LIMIT_MAX: usize = 100_000;

/// One `ORDER BY` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortColumn {
    pub column: usize,
    pub descending: bool,
    pub nulls_first: bool,
}

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct TopNSpec {
    /// Input columns of `PARTITION BY`.
    pub partition: Vec<usize>,
    pub order: Vec<SortColumn>,
    /// N: the rows kept per partition (1..=[`TOPN_LIMIT_MAX`]).
    pub limit: usize,
    /// The input's columns, then the rank.
    pub output: SchemaRef,
    /// Whether the rank is read downstream (see the module documentation).
    pub rank_in_output: bool,
    /// The input is updating: keep every row, take retractions (see the module doc).
    pub retracting: bool,
    /// The input column of the window end among the partition columns (a window TopN):
    /// partitions are freed as the watermark passes it (see the module doc).
    pub window_end: Option<usize>,
}

/// A value of an `ORDER BY` column, as compared: 16 bytes (text behind one thin
/// pointer), as every kept row holds one.
#[derive(Debug, Clone, PartialEq)]
enum SortValue {
    Null,
    Int(i64),
    Float(f64),
    #[allow(clippy::box_collection, reason = "a thin pointer keeps every kept row's value at 16 bytes")]
    Text(Box<Box<str>>),
}

/// A row's order values, one per `ORDER BY` column: inline for one (most TopNs order
/// by one column, so a row's values need no allocation of their own), boxed behind one
/// thin pointer for more; 16 bytes either way.
#[derive(Debug, Clone)]
enum OrderValues {
    /// One column's value ([`SortValue::Null`] without `ORDER BY`).
    One(SortValue),
    #[allow(clippy::box_collection, reason = "a thin pointer keeps every kept row's values at 16 bytes")]
    Many(Box<Box<[SortValue]>>),
}

impl OrderValues {
    fn iter(&self) -> std::slice::Iter<'_, SortValue> {
        match self {
            OrderValues::One(value) => std::slice::from_ref(value).iter(),
            OrderValues::Many(values) => values.iter(),
        }
    }
}

/// Rows a partition's vector grows by one at a time (it holds exactly its rows), so that
/// a deduplication's or a small TopN's partition holds no spare capacity.
const EXACT_ROWS: usize = 16;

/// One kept row.
#[derive(Debug, Clone)]
struct Entry {
    order: OrderValues,
    /// The whole input row in the key encoding, in [`TopN::rows`]. Also the row's
    /// identity while a batch is compared with the state before it: no two kept rows
    /// share a place (every encoded row has at least one byte, and the log only grows
    /// until it is compacted between batches).
    row: RowAt,
}

/// One partition's first N rows, in rank order. Millions are kept (NEXMark q18 keeps one
/// per bidder and auction), so a partition is its key and its row, both inline when it
/// holds one (56 bytes); its placement hash is computed again from the key when needed.
#[derive(Debug, Clone)]
struct Partition {
    /// Inline when short (every key of integers, dates and timestamps up to 22 bytes).
    key: SmallBytes,
    rows: Rows,
}

/// A partition's rows, in rank order: one inline, more in a vector of their own.
#[derive(Debug, Clone, Default)]
enum Rows {
    #[default]
    None,
    One(Entry),
    Many(Vec<Entry>),
}

impl std::ops::Deref for Rows {
    type Target = [Entry];

    fn deref(&self) -> &[Entry] {
        match self {
            Rows::None => &[],
            Rows::One(entry) => std::slice::from_ref(entry),
            Rows::Many(entries) => entries,
        }
    }
}

impl std::ops::DerefMut for Rows {
    fn deref_mut(&mut self) -> &mut [Entry] {
        match self {
            Rows::None => &mut [],
            Rows::One(entry) => std::slice::from_mut(entry),
            Rows::Many(entries) => entries,
        }
    }
}

impl From<Vec<Entry>> for Rows {
    fn from(mut entries: Vec<Entry>) -> Rows {
        match entries.len() {
            0 => Rows::None,
            1 => Rows::One(entries.pop().expect("one entry")),
            _ => {
                entries.shrink_to_fit();
                Rows::Many(entries)
            }
        }
    }
}

impl Rows {
    /// The rows it has room for without allocating.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        match self {
            Rows::None | Rows::One(_) => 1,
            Rows::Many(entries) => entries.capacity(),
        }
    }

    /// Inserts `entry` at `index`; a vector grows by one row at a time up to
    /// [`EXACT_ROWS`], so a small TopN's partition holds no spare room.
    fn insert(&mut self, index: usize, entry: Entry) {
        match std::mem::take(self) {
            Rows::None => *self = Rows::One(entry),
            Rows::One(held) => {
                let mut entries = Vec::with_capacity(2);
                entries.push(held);
                entries.insert(index, entry);
                *self = Rows::Many(entries);
            }
            Rows::Many(mut entries) => {
                if entries.len() == entries.capacity() && entries.len() < EXACT_ROWS {
                    entries.reserve_exact(1);
                }
                entries.insert(index, entry);
                *self = Rows::Many(entries);
            }
        }
    }

    /// Removes and returns the row at `index`; a last row left goes back inline.
    fn remove(&mut self, index: usize) -> Entry {
        match std::mem::take(self) {
            Rows::None => panic!("a row {index} of an empty partition"),
            Rows::One(held) => {
                assert_eq!(index, 0, "the one row of a partition");
                held
            }
            Rows::Many(mut entries) => {
                // A vector holds two rows or more.
                let removed = entries.remove(index);
                *self = match entries.len() {
                    1 => Rows::One(entries.pop().expect("one row left")),
                    _ => Rows::Many(entries),
                };
                removed
            }
        }
    }
}

/// About the bytes of memory a partition takes (its slot, index entry and marks), and
/// each row it keeps beyond the first (an entry of its vector); the rows' bytes are the
/// row log's.
const PARTITION_BYTES: usize = 72;
const ENTRY_BYTES: usize = 40;

/// Partitions beyond the memory budget ([`crate::cold`]): where they go, and what is
/// kept to count, choose and find them.
struct Spilling {
    store: crate::cold::ColdStore,
    /// Per partition id: [`RECENT`], [`FROM_COLD`] and its age (`crate::cold::passes`),
    /// moved with their partition.
    marks: Vec<u8>,
    /// The clock's hand: the next partition id it looks at.
    hand: usize,
    /// Partitions evicted while changed since the previous snapshot: the next delta
    /// writes them again from their run.
    evicted_dirty: crate::cold::Keys,
}

/// See the module documentation.
pub struct TopN {
    spec: TopNSpec,
    partition_encoder: KeyEncoder,
    row_encoder: KeyEncoder,
    partitions: Pages<Partition>,
    index: HashTable<u32>,
    /// The kept rows' bytes ([`rows`]), and a buffer for those read back from disk.
    rows: RowLog,
    spilled: Vec<u8>,
    vnodes: u32,
    /// Retractions of rows not held (updating input only).
    ignored: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// Partitions not written for a while are dropped (see `crate::ttl`).
    ttl: Option<crate::ttl::Ttl>,
    /// A window TopN: window end → the keys of its partitions, freed in `on_watermark`;
    /// the watermark so far; rows of freed windows.
    windows: std::collections::BTreeMap<i64, Vec<Box<[u8]>>>,
    watermark: sluice_types::TimestampMs,
    late: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// A batch's encoded partition keys and rows, reused: a buffer made anew per batch
    /// grew by doubling into freshly faulted memory every batch (NEXMark q9's rows carry
    /// an auction's and a bid's text).
    keys: KeyRows,
    encoded: KeyRows,
    /// For snapshots (`state`): per partition id a bit, changed since the previous
    /// snapshot, and the ids marked (an id may be listed again, or be gone: its bit
    /// decides); the keys of partitions removed since; whether changes are kept (from
    /// the first snapshot or a restore on).
    changed: crate::changed::ChangedIds,
    removed: Vec<Vec<u8>>,
    tracking: bool,
    /// Rows kept, over every partition.
    entries: usize,
    /// Partitions beyond the memory budget (None: every partition stays in memory).
    cold: Option<Spilling>,
}

/// A row to insert: its bytes, or its place in the batch being processed.
enum RowSource<'a> {
    Bytes(&'a [u8]),
    Pending(u32),
}

/// How an `ORDER BY` column is read: cast once per batch.
enum SortColumnValues {
    Int(Int64Array),
    Float(arrow::array::Float64Array),
    Text(arrow::array::StringArray),
}

fn compare_values(left: &SortValue, right: &SortValue, column: &SortColumn) -> Ordering {
    let ordering = match (left, right) {
        (SortValue::Null, SortValue::Null) => return Ordering::Equal,
        (SortValue::Null, _) => return if column.nulls_first { Ordering::Less } else { Ordering::Greater },
        (_, SortValue::Null) => return if column.nulls_first { Ordering::Greater } else { Ordering::Less },
        (SortValue::Int(a), SortValue::Int(b)) => a.cmp(b),
        (SortValue::Float(a), SortValue::Float(b)) => a.total_cmp(b),
        (SortValue::Text(a), SortValue::Text(b)) => a.cmp(b),
        _ => unreachable!("one column holds one kind of value"),
    };
    if column.descending { ordering.reverse() } else { ordering }
}

/// The mixing of a placement hash for the index (see the window aggregate's).
fn table_hash(placement: u64) -> u64 {
    (placement ^ (placement >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl TopN {
    /// `input` is the schema of the rows the operator receives; `vnodes` the pipeline's.
    pub fn new(spec: TopNSpec, input: &SchemaRef, vnodes: u32) -> Result<TopN, SluiceError> {
        assert!((1..=TOPN_LIMIT_MAX).contains(&spec.limit), "the planner bounds N");
        let types = |columns: &mut dyn Iterator<Item = usize>| -> Vec<DataType> {
            columns.map(|c| input.field(c).data_type().clone()).collect()
        };
        let partition_encoder = KeyEncoder::new(types(&mut spec.partition.iter().copied()))?;
        let row_encoder = KeyEncoder::new(types(&mut (0..input.fields().len())))?;
        Ok(TopN {
            spec,
            partition_encoder,
            row_encoder,
            partitions: Pages::default(),
            index: HashTable::new(),
            rows: RowLog::new(None, None),
            spilled: Vec::new(),
            vnodes,
            ignored: None,
            ttl: None,
            windows: std::collections::BTreeMap::new(),
            watermark: i64::MIN,
            late: None,
            keys: KeyRows::default(),
            encoded: KeyRows::default(),
            changed: crate::changed::ChangedIds::default(),
            removed: Vec::new(),
            tracking: false,
            entries: 0,
            cold: None,
        })
    }

    /// Whether partition `id` changed since the previous snapshot.
    fn is_marked(&self, id: u32) -> bool {
        self.changed.contains(id)
    }

    /// Marks partition `id` changed since the previous snapshot.
    fn mark(&mut self, id: u32) {
        if self.tracking {
            self.changed.mark(id);
        }
    }

    fn unmark(&mut self, id: u32) {
        self.changed.unmark(id);
    }

    /// Forgets what changed (a snapshot took it, or a restore loaded the runs); changes
    /// are kept from now on.
    fn clear_changes(&mut self) {
        self.changed.clear();
        self.removed.clear();
        self.tracking = true;
    }

    /// Keeps the rows' bytes within `space`'s memory budget, the rest on disk, the bytes
    /// written counted in `written` (see `crate::spill::spilled_bytes`).
    /// Partitions too count in the budget and, but for a window TopN's (freed as the
    /// watermark passes), are evicted to cold runs beyond it ([`crate::cold`]).
    pub fn with_spill(mut self, space: Arc<SpillSpace>, written: LazyCounter) -> TopN {
        assert!(self.partitions.is_empty(), "spilling is chosen before any row is kept");
        if self.spec.window_end.is_none() {
            let store = crate::cold::ColdStore::new(Arc::clone(&space), written.again());
            let evicted_dirty = crate::cold::Keys::default();
            self.cold = Some(Spilling { store, marks: Vec::new(), hand: 0, evicted_dirty });
        }
        self.rows = RowLog::new(Some(space), Some(written));
        self
    }

    /// Counts the rows of windows already freed in `late` (a window TopN).
    pub fn with_late_counter(mut self, late: Arc<std::sync::atomic::AtomicU64>) -> TopN {
        self.late = Some(late);
        self
    }

    /// The window end of each input row (a window TopN), as milliseconds.
    fn window_ends(&self, rows: &RecordBatch) -> Result<Option<Int64Array>, SluiceError> {
        let Some(column) = self.spec.window_end else { return Ok(None) };
        Ok(Some(cast(rows.column(column), &DataType::Int64)?.as_primitive::<Int64Type>().clone()))
    }

    /// Frees the partitions of windows that ended at or before the watermark.
    fn free_windows(&mut self, watermark: sluice_types::TimestampMs) {
        let kept = self.windows.split_off(&watermark.saturating_add(2));
        for key in std::mem::replace(&mut self.windows, kept).into_values().flatten() {
            let hash = sluice_types::key::hash(&key);
            let partitions = &self.partitions;
            let found = self.index.find(table_hash(hash), |&p| partitions[p as usize].key.get() == &*key).copied();
            if let Some(id) = found {
                self.remove_partition(id);
            }
        }
    }

    /// Removes partition `id`; the last partition takes its place (ids stay dense), in
    /// the index and in the TTL schedule.
    fn remove_partition(&mut self, id: u32) {
        let removed = self.take_partition(id);
        if self.tracking {
            self.removed.push(removed.key.get().to_vec());
        }
    }

    /// Takes partition `id` out (removed, or evicted), its rows forgotten; the last
    /// partition takes its place (ids stay dense), in the index, the TTL schedule, the
    /// changed bits and the marks.
    fn take_partition(&mut self, id: u32) -> Partition {
        let no_keys = self.spec.partition.is_empty();
        let removed = self.partitions.swap_remove(id as usize);
        for entry in removed.rows.iter() {
            self.rows.forget(entry.row);
        }
        self.entries -= removed.rows.len();
        if let Some(cold) = self.cold.as_mut() {
            cold.marks.swap_remove(id as usize);
        }
        let hash = table_hash(placement_hash(no_keys, removed.key.get()));
        let entry = self.index.find_entry(hash, |&p| p == id).expect("an indexed partition");
        entry.remove();
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.forget(id);
        }
        let last = self.partitions.len() as u32;
        // The partition moved into `id` is changed if it was.
        let moved_marked = id != last && self.is_marked(last);
        self.unmark(id);
        self.unmark(last);
        if moved_marked {
            self.mark(id);
        }
        if id != last {
            let hash = table_hash(placement_hash(no_keys, self.partitions[id as usize].key.get()));
            let slot = self.index.find_mut(hash, |&p| p == last).expect("an indexed partition");
            *slot = id;
            if let Some(ttl) = self.ttl.as_mut() {
                ttl.moved(last, id);
            }
        }
        removed
    }

    /// Drops partitions not written for the TTL (`crate::ttl`): their rows stay downstream.
    /// Its partitions stay in memory (an evicted one would outlive the TTL).
    pub fn with_ttl(mut self, ttl: crate::ttl::Ttl) -> TopN {
        assert!(self.partitions.is_empty(), "a TTL is chosen before any row is kept");
        self.cold = None;
        self.ttl = Some(ttl);
        self
    }

    /// Drops the partitions whose TTL passed. The last partition takes a dropped one's
    /// place (ids stay dense), in the index and in the TTL schedule.
    fn expire(&mut self) {
        let Some(ttl) = self.ttl.as_mut() else { return };
        let mut expired = ttl.expired();
        // Highest ids first: moving the last partition never moves one about to go.
        expired.sort_unstable_by(|a, b| b.cmp(a));
        for id in expired {
            self.remove_partition(id);
        }
    }

    /// Counts retractions of rows not held in `counter` (updating input).
    pub fn with_ignored_counter(mut self, counter: Arc<std::sync::atomic::AtomicU64>) -> TopN {
        self.ignored = Some(counter);
        self
    }

    /// The `ORDER BY` columns of the input columns `columns`, read for comparing.
    fn order_columns(&self, columns: &[ArrayRef]) -> Result<Vec<SortColumnValues>, SluiceError> {
        let mut order = Vec::with_capacity(self.spec.order.len());
        for sort in &self.spec.order {
            let array = &columns[sort.column];
            order.push(match array.data_type() {
                t if super::aggregate::is_float(t) => {
                    SortColumnValues::Float(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
                }
                t if super::aggregate::is_text(t) => {
                    SortColumnValues::Text(cast(array, &DataType::Utf8)?.as_string::<i32>().clone())
                }
                _ => SortColumnValues::Int(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone()),
            });
        }
        Ok(order)
    }

    /// Row `row`'s order values.
    fn order_of(columns: &[SortColumnValues], row: usize) -> OrderValues {
        let value = |column: &SortColumnValues| match column {
            SortColumnValues::Int(values) if values.is_valid(row) => SortValue::Int(values.value(row)),
            // As the key encoding keeps them (-0.0 as 0.0, one NaN), so that a row's order
            // values are the same live and restored from its bytes.
            SortColumnValues::Float(values) if values.is_valid(row) => {
                let value = values.value(row);
                SortValue::Float(if value == 0.0 {
                    0.0
                } else if value.is_nan() {
                    f64::NAN
                } else {
                    value
                })
            }
            SortColumnValues::Text(values) if values.is_valid(row) => {
                SortValue::Text(Box::new(values.value(row).into()))
            }
            _ => SortValue::Null,
        };
        match columns {
            [] => OrderValues::One(SortValue::Null),
            [column] => OrderValues::One(value(column)),
            columns => OrderValues::Many(Box::new(columns.iter().map(value).collect())),
        }
    }

    /// The order of two rows' order values (ties are broken by arrival, by the caller).
    fn compare(&self, left: &OrderValues, right: &OrderValues) -> Ordering {
        for ((a, b), column) in left.iter().zip(right.iter()).zip(&self.spec.order) {
            let ordering = compare_values(a, b, column);
            if ordering != Ordering::Equal {
                return ordering;
            }
        }
        Ordering::Equal
    }

    /// The index of the partition of `key` (placement hash `hash`): in memory, else read
    /// back from the cold runs, else added empty.
    fn partition_of(&mut self, key: &[u8], hash: u64) -> Result<usize, SluiceError> {
        if let Some(id) = self.find_partition(key, hash) {
            if let Some(cold) = self.cold.as_mut() {
                cold.marks[id] |= RECENT;
            }
            return Ok(id);
        }
        let Some(cold) = self.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) else {
            return Ok(self.add_partition(key, hash));
        };
        let vnode = sluice_types::vnode::of_hash(hash, self.vnodes);
        let Some(found) = cold.store.runs().find(vnode, key, hash, &|_| false)? else {
            return Ok(self.add_partition(key, hash));
        };
        let dirty = cold.evicted_dirty.remove(key);
        let id = state::load_partition(self, key, hash, &found.value)?;
        if let Some(cold) = self.cold.as_mut() {
            cold.marks[id] |= FROM_COLD;
        }
        if dirty {
            // Its change since the previous snapshot is in no checkpoint yet.
            self.mark(id as u32);
        }
        Ok(id)
    }

    /// The index of the partition of `key` in memory.
    fn find_partition(&self, key: &[u8], hash: u64) -> Option<usize> {
        let partitions = &self.partitions;
        let same = |&id: &u32| crate::same_bytes(partitions[id as usize].key.get(), key);
        self.index.find(table_hash(hash), same).map(|&id| id as usize)
    }

    /// Adds the empty partition of `key` (not in memory); returns its index.
    fn add_partition(&mut self, key: &[u8], hash: u64) -> usize {
        assert!(self.partitions.len() < u32::MAX as usize, "fewer than 2^32 partitions per thread");
        self.partitions.push(Partition { key: SmallBytes::new(key), rows: Rows::None });
        let id = (self.partitions.len() - 1) as u32;
        let (partitions, no_keys) = (&self.partitions, self.spec.partition.is_empty());
        self.index.insert_unique(table_hash(hash), id, |&p| {
            table_hash(placement_hash(no_keys, partitions[p as usize].key.get()))
        });
        if let Some(cold) = self.cold.as_mut() {
            cold.marks.push(RECENT);
        }
        id as usize
    }

    /// Counts the partitions and their rows in the space (while spilling).
    fn recount(&mut self) {
        let Some(cold) = self.cold.as_mut() else { return };
        let now = self.partitions.len() * PARTITION_BYTES + self.entries * ENTRY_BYTES;
        cold.store.set_entry_bytes(now);
    }

    /// When the space is over its budget, evicts partitions no row reached since the
    /// clock's hand last passed them, enough to bring the space an eighth of its budget
    /// under it, into one cold run ([`crate::cold`]), as their checkpoint records.
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        const SCAN_MAX: usize = 1 << 17;
        self.recount();
        let Some(cold) = self.cold.as_mut() else { return Ok(()) };
        let space = Arc::clone(cold.store.space());
        if self.partitions.is_empty() {
            return Ok(());
        }
        let Some(goal) = cold.store.eviction_goal() else { return Ok(()) };
        let (mut chosen, mut freed) = (Vec::new(), 0usize);
        let count = self.partitions.len();
        let mut looked = 0;
        for _ in 0..count.min(SCAN_MAX) {
            if freed >= goal {
                break;
            }
            looked += 1;
            let id = cold.hand % count;
            cold.hand = id + 1;
            let partition = &self.partitions[id];
            let bytes = PARTITION_BYTES + partition.rows.len() * (ENTRY_BYTES + 64);
            if !crate::cold::passes(&mut cold.marks[id], bytes, space.budget()) {
                continue;
            }
            freed += bytes;
            chosen.push(id as u32);
        }
        if chosen.is_empty() {
            cold.store.evicted(0, goal, looked, count);
            return Ok(());
        }
        let shared = self.rows.shared();
        let (vnodes, no_keys) = (self.vnodes, self.spec.partition.is_empty());
        let mut records = crate::records::Records::new(Some(space.dir()));
        // In the order of their rows in the log, so that rows spilled read ahead
        // (`SharedRows`); the run sorts the records by key anyway.
        let first_row = |id: u32| self.partitions[id as usize].rows.first().map(|entry| entry.row.place());
        chosen.sort_unstable_by_key(|&id| first_row(id));
        for &id in &chosen {
            let partition = &self.partitions[id as usize];
            let key = partition.key.get();
            let vnode = sluice_types::vnode::of_hash(placement_hash(no_keys, key), vnodes);
            if partition.rows.is_empty() {
                records.add(vnode, |k| k.extend_from_slice(key), None);
            } else {
                records.try_put(vnode, key, |bytes| state::write_rows(partition, &shared, bytes))?;
            }
        }
        drop(shared);
        let hash = move |key: &[u8]| Some(placement_hash(no_keys, key));
        cold.store.add(records, chosen.len(), freed, hash)?;
        // Highest ids first: moving the last partition never moves one about to go.
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        for id in chosen {
            let dirty = self.tracking && self.is_marked(id);
            let partition = self.take_partition(id);
            if dirty && let Some(cold) = self.cold.as_mut() {
                cold.evicted_dirty.insert(partition.key.get().to_vec());
            }
        }
        self.recount();
        if let Some(cold) = self.cold.as_mut() {
            cold.store.evicted(freed, goal, looked, count);
        }
        Ok(())
    }

    /// Puts a row (its order values and bytes) in its partition: anywhere when
    /// retracting, else only if it ranks among the first N (its bytes are kept only then;
    /// a pending row's once the batch is done, see [`TopN::store_pending`]).
    fn insert(&mut self, partition: usize, order: OrderValues, row: RowSource<'_>) -> Result<(), SluiceError> {
        let mut entry = Entry { order, row: RowAt::NONE };
        let rows = &self.partitions[partition].rows;
        // After every row held of equal order values: those arrived earlier.
        let position = rows.partition_point(|kept| self.compare(&kept.order, &entry.order) != Ordering::Greater);
        if !self.spec.retracting && position >= self.spec.limit {
            return Ok(());
        }
        entry.row = match row {
            RowSource::Bytes(bytes) => self.rows.append(bytes)?,
            RowSource::Pending(row) => RowAt::pending(row),
        };
        let rows = &mut self.partitions[partition].rows;
        // A full partition's last row leaves first, so that its vector never grows past
        // N (a deduplication's row replaced would otherwise leave room for two).
        if !self.spec.retracting && rows.len() == self.spec.limit {
            let left = rows.remove(rows.len() - 1);
            self.rows.forget(left.row);
            self.entries -= 1;
        }
        rows.insert(position, entry);
        self.entries += 1;
        Ok(())
    }

    /// Removes one copy of the row `row` (order values `order`) from its partition;
    /// false if none is held.
    fn remove(&mut self, partition: usize, order: &OrderValues, row: &[u8]) -> Result<bool, SluiceError> {
        let equal_order = |entry: &Entry| {
            entry
                .order
                .iter()
                .zip(order.iter())
                .zip(&self.spec.order)
                .all(|((a, b), c)| compare_values(a, b, c).is_eq())
        };
        let rows = &self.partitions[partition].rows;
        let less = |entry: &Entry| {
            for ((a, b), column) in entry.order.iter().zip(order.iter()).zip(&self.spec.order) {
                let ordering = compare_values(a, b, column);
                if ordering != Ordering::Equal {
                    return ordering == Ordering::Less;
                }
            }
            false
        };
        let start = rows.partition_point(less);
        let mut found = None;
        let mut scratch = Vec::new();
        for (offset, entry) in rows[start..].iter().take_while(|entry| equal_order(entry)).enumerate() {
            let held = match self.rows.get(entry.row) {
                Some(bytes) => bytes,
                None => {
                    scratch.clear();
                    self.rows.read_into(entry.row, &mut scratch)?;
                    &scratch[..]
                }
            };
            if held == row {
                found = Some(offset);
                break;
            }
        }
        match found {
            Some(offset) => {
                let removed = self.partitions[partition].rows.remove(start + offset);
                self.rows.forget(removed.row);
                self.entries -= 1;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Stores the bytes of the rows of `batch` still kept after it (in `touched`
    /// partitions: every partition the batch reached), encoding only those.
    fn store_pending(
        &mut self,
        batch: &RecordBatch,
        touched: &[(usize, Vec<Entry>)],
        encoded: &mut KeyRows,
    ) -> Result<(), SluiceError> {
        let mut places: Vec<(usize, usize)> = Vec::new();
        let mut batch_rows: Vec<u32> = Vec::new();
        for (partition, _) in touched {
            for (index, entry) in self.partitions[*partition].rows.iter().enumerate() {
                if let Some(row) = entry.row.pending_row() {
                    places.push((*partition, index));
                    batch_rows.push(row);
                }
            }
        }
        if places.is_empty() {
            return Ok(());
        }
        let indices = UInt32Array::from(batch_rows);
        let columns = batch
            .columns()
            .iter()
            .map(|column| arrow::compute::take(column, &indices, None))
            .collect::<Result<Vec<_>, _>>()?;
        self.row_encoder.encode(&columns, encoded)?;
        for (kept, (partition, index)) in places.into_iter().enumerate() {
            let at = self.rows.append(encoded.row(kept))?;
            self.partitions[partition].rows[index].row = at;
        }
        Ok(())
    }

    /// The changes of one partition between `before` and its rows now, as (row, rank,
    /// weight) in emission order.
    fn diff(&self, before: &[Entry], after: &[Entry], out: &mut Vec<(RowAt, u64, i64)>) {
        if self.spec.rank_in_output {
            for rank in 0..before.len().max(after.len()) {
                let (old, new) = (before.get(rank), after.get(rank));
                if old.map(|e| e.row) == new.map(|e| e.row) {
                    continue;
                }
                if let Some(old) = old {
                    out.push((old.row, rank as u64 + 1, -1));
                }
                if let Some(new) = new {
                    out.push((new.row, rank as u64 + 1, 1));
                }
            }
            return;
        }
        let kept = |rows: &[Entry], entry: &Entry| rows.iter().any(|e| e.row == entry.row);
        for (rank, old) in before.iter().enumerate() {
            if !kept(after, old) {
                out.push((old.row, rank as u64 + 1, -1));
            }
        }
        for (rank, new) in after.iter().enumerate() {
            if !kept(before, new) {
                out.push((new.row, rank as u64 + 1, 1));
            }
        }
    }

    /// Output rows: the decoded input rows and their ranks.
    fn build(&mut self, changes: &[(RowAt, u64, i64)]) -> Result<Batch, SluiceError> {
        let mut spilled = std::mem::take(&mut self.spilled);
        let rows = self.rows.gather(changes.iter().map(|(row, _, _)| *row), &mut spilled)?;
        let mut columns: Vec<ArrayRef> = self.row_encoder.decode(rows.into_iter())?;
        self.spilled = spilled;
        columns.push(Arc::new(UInt64Array::from_iter_values(changes.iter().map(|(_, rank, _)| *rank))));
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?;
        Ok(Batch::with_weights(rows, Int64Array::from_iter_values(changes.iter().map(|(_, _, weight)| *weight))))
    }
}

impl Operator for TopN {
    fn name(&self) -> &str {
        "topn"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.spec.retracting || batch.is_append_only(), "the planner marks TopN over an updating stream");
        let rows = &batch.rows;
        let partition_columns: Vec<ArrayRef> =
            self.spec.partition.iter().map(|&c| Arc::clone(rows.column(c))).collect();
        let mut keys = std::mem::take(&mut self.keys);
        self.partition_encoder.encode(&partition_columns, &mut keys)?;
        let mut encoded = std::mem::take(&mut self.encoded);
        // Over an append-only input a row is encoded only if it is still kept once the
        // batch is done (most rows of a TopN never rank: NEXMark q9 keeps one bid of each
        // auction); a retraction is matched by its bytes, so those are encoded first.
        let pending = !self.spec.retracting;
        if !pending {
            self.row_encoder.encode(rows.columns(), &mut encoded)?;
        }
        let order = self.order_columns(rows.columns())?;
        // Each partition the batch touches, with its rows before the batch.
        let mut touched: Vec<(usize, Vec<Entry>)> = Vec::new();
        let mut touched_ids: std::collections::HashSet<usize> = std::collections::HashSet::new();
        self.expire();
        let window_ends = self.window_ends(rows)?;
        let mut late = 0u64;
        for row in 0..rows.num_rows() {
            let (key, hash): (&[u8], u64) =
                if self.spec.partition.is_empty() { (&[], 0) } else { (keys.row(row), keys.hash(row)) };
            if let Some(ends) = &window_ends
                && ends.is_valid(row)
            {
                let end = ends.value(row);
                // The window is complete once the watermark reaches its end - 1.
                if end.saturating_sub(1) <= self.watermark {
                    late += 1;
                    continue;
                }
                let partitions = &self.partitions;
                if self.index.find(table_hash(hash), |&p| partitions[p as usize].key.get() == key).is_none() {
                    self.windows.entry(end).or_default().push(key.into());
                }
            }
            let partition = self.partition_of(key, hash)?;
            if touched_ids.insert(partition) {
                // Only the first N can change what is emitted.
                let rows = &self.partitions[partition].rows;
                touched.push((partition, rows[..rows.len().min(self.spec.limit)].to_vec()));
            }
            let weight = batch.weight(row);
            if let Some(ttl) = self.ttl.as_mut() {
                ttl.written(partition as u32);
            }
            for _ in 0..weight {
                let source = if pending { RowSource::Pending(row as u32) } else { RowSource::Bytes(encoded.row(row)) };
                self.insert(partition, Self::order_of(&order, row), source)?;
            }
            if weight < 0 {
                let values = Self::order_of(&order, row);
                for _ in 0..weight.unsigned_abs() {
                    if !self.remove(partition, &values, encoded.row(row))?
                        && let Some(ignored) = &self.ignored
                    {
                        ignored.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }
        self.keys = keys;
        if let (Some(counter), true) = (&self.late, late > 0) {
            counter.fetch_add(late, std::sync::atomic::Ordering::Relaxed);
        }
        if pending {
            self.store_pending(rows, &touched, &mut encoded)?;
        }
        self.encoded = encoded;
        for (partition, _) in &touched {
            self.mark(*partition as u32);
        }
        let mut changes = Vec::new();
        for (partition, before) in &touched {
            let rows = &self.partitions[*partition].rows;
            self.diff(before, &rows[..rows.len().min(self.spec.limit)], &mut changes);
        }
        if !changes.is_empty() {
            out.push(Message::Data(self.build(&changes)?));
        }
        // Only between batches: the rows before this one were read until now.
        self.evict_over_budget()?;
        if self.rows.is_sparse() {
            self.rows.compact(self.partitions.iter_mut().flat_map(|p| p.rows.iter_mut().map(|e| &mut e.row)))?;
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark: sluice_types::TimestampMs,
        out: &mut Vec<Message>,
    ) -> Result<(), SluiceError> {
        self.expire();
        if self.spec.window_end.is_some() && watermark > self.watermark {
            self.watermark = watermark;
            self.free_windows(watermark);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        Ok(Some(state::snapshot(self, delta)))
    }

    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        state::restore(self, state)?;
        // A window TopN frees each restored window's partitions as the watermark passes.
        if let Some(column) = self.spec.window_end {
            for partition in self.partitions.iter() {
                let Some(entry) = partition.rows.first() else { continue };
                let mut row = Vec::new();
                self.rows.read_into(entry.row, &mut row)?;
                let columns = self.row_encoder.decode(std::iter::once(&row[..]))?;
                let ends = cast(&columns[column], &DataType::Int64)?;
                let ends = ends.as_primitive::<Int64Type>();
                if ends.is_valid(0) {
                    self.windows.entry(ends.value(0)).or_default().push(partition.key.get().into());
                }
            }
        }
        // Write times are not checkpointed: every restored partition gets a full TTL.
        if let Some(ttl) = self.ttl.as_mut() {
            (0..self.partitions.len() as u32).for_each(|id| ttl.written(id));
        }
        Ok(())
    }
}
