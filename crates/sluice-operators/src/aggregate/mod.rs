//! The event-time window aggregate; the non-windowed, updating aggregate is in [`group`],
//! the session window aggregate (windows that merge) in [`session`].
//!
//! Input rows carry `window_start` and `window_end` (from window assignment) plus the key
//! columns and aggregate arguments. State is, per open window (ordered by end), a table of
//! group ids and the groups in flat columns ([`Groups`]): the keys (in the project's key
//! encoding, [`sluice_types::key`], back to back), each key's placement hash (the
//! exchange's, so its vnode), and one
//! accumulator column per aggregate. Flat columns make a checkpoint's copy a handful of
//! memory copies on the driver; writing the copy's records happens on another thread
//! (see `state`). Once checkpoints are taken, each window also keeps which of its older
//! groups changed since the previous snapshot (a bit per group, set as rows are folded),
//! so that a checkpoint copies and writes only those and the groups added since. A
//! window is emitted once, when the watermark reaches `window_end - 1` (the window's last
//! millisecond, as in Flink), then dropped. A row whose window was already emitted (or
//! would be, at the current watermark) is late: counted and dropped. End of input emits
//! every open window.
//!
//! **Beyond the memory budget** (given a [`SpillSpace`]), the windows' groups count in
//! the worker's space (keys, fixed columns, COUNT(DISTINCT) values and text). When a
//! batch ends over the budget, the largest windows are evicted whole, enough to bring
//! the space an eighth of its budget under it, into one `crate::cold` run of their
//! checkpoint records, and start again empty: a window's flat columns take no removal
//! of single groups, and the keys a window still needs come back one by one. A row
//! whose key is not in memory in a window that was evicted looks for it in the runs (a
//! bloom filter per run over the key's hash and the window's end, then one block) and
//! reads its accumulators back. Emitting such a window emits its groups in memory, then
//! streams the runs' records of that window (only the blocks of each vnode that hold
//! its end: `sluice_state::Merge::within`), a batch at a time, but those shadowed by a
//! copy read back. A window most of whose groups came back from the runs is not
//! evicted again (its hot keys alone exceed the budget); the run of the next eviction
//! deletes, by range, the windows emitted since, and once no open window was evicted
//! the runs are dropped.
//!
//! Output: one row per (window, key) with the columns in `GROUP BY` order followed by the
//! aggregates, cast to the planner's declared output types. A watermark (or the end of
//! input) that closes many windows emits them in parts ([`Operator::has_more`]): each part
//! about a batch of rows, at least one window's groups in memory or one batch of an
//! evicted window's, the next once the previous one left the thread; so what a watermark
//! emits is never held whole, whatever it closes.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use datafusion_common::hash_utils::RandomState;
use hashbrown::HashTable;
use sluice_runtime::{Operator, Snapshot};
use sluice_state::{Merge, MergeMode, StateSource};
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, SluiceError, TimestampMs};

use crate::cold::ColdStore;
use crate::counter::LazyCounter;
use crate::spill::SpillSpace;

pub mod group;
pub mod local;
pub mod session;
mod state;

pub use group::{GROUP_STATE_VERSION, GroupAggregate, GroupAggregateSpec};
pub use session::{SESSION_STATE_VERSION, SessionAggregate};
pub use state::WINDOW_STATE_VERSION;

/// The aggregate functions the window aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    /// `COUNT(*)`: rows.
    CountRows,
    /// `COUNT(x)`: non-null values.
    Count,
    CountDistinct,
    Sum,
    Min,
    Max,
    Avg,
}

/// One aggregate of the output.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    pub function: AggregateFunction,
    /// The input column of the argument (None for `COUNT(*)`).
    pub argument: Option<usize>,
    /// The input column (BOOLEAN) of its `FILTER (WHERE …)` condition: only rows where
    /// it is true count. None: every row counts.
    pub filter: Option<usize>,
}

/// One output column of the `GROUP BY` part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupColumn {
    WindowStart,
    WindowEnd,
    /// The i-th key column.
    Key(usize),
}

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct WindowAggregateSpec {
    pub window_start: usize,
    pub window_end: usize,
    /// Input columns of the keys (group-by columns other than the window's).
    pub keys: Vec<usize>,
    /// The group-by output columns, in order.
    pub groups: Vec<GroupColumn>,
    pub aggregates: Vec<AggregateSpec>,
    /// Group columns then aggregates.
    pub output: SchemaRef,
    /// Most rows per output batch.
    pub batch_size: usize,
    /// The input column (BIGINT) that says how many input rows each row stands for, when
    /// rows are partials ([`local`]): a late row counts that many late rows. None: one.
    pub late_weights: Option<usize>,
}

/// One aggregate's accumulators, one slot per group of a window.
#[derive(Clone)]
enum Accumulators {
    Count(Vec<i64>),
    SumInt(Vec<Option<i64>>),
    SumFloat(Vec<Option<f64>>),
    MinMaxInt { values: Vec<Option<i64>>, max: bool },
    MinMaxFloat { values: Vec<Option<f64>>, max: bool },
    MinMaxString { values: Vec<Option<String>>, max: bool },
    Avg { sums: Vec<f64>, counts: Vec<i64> },
    Distinct(Vec<HashSet<Box<[u8]>, RandomState>>),
}

/// How an argument column is read: its values cast once per batch.
enum Argument {
    None,
    Int(Int64Array),
    Float(Float64Array),
    Text(StringArray),
    /// Key encodings of the values, and the column (for its validity).
    Encoded(KeyRows, ArrayRef),
}

/// A window's groups in flat columns, group `g` at position `g` of each: what a
/// checkpoint copies.
#[derive(Clone, Default)]
struct Groups {
    /// Keys in the key encoding, back to back; group `g`'s ends at `key_ends[g]`.
    key_bytes: Vec<u8>,
    key_ends: Vec<usize>,
    /// Each key's placement hash (0 without keys): its vnode, and its slot in the index.
    hashes: Vec<u64>,
    accumulators: Vec<Accumulators>,
}

impl Groups {
    fn len(&self) -> usize {
        self.key_ends.len()
    }

    fn key(&self, group: usize) -> &[u8] {
        key_of(&self.key_bytes, &self.key_ends, group)
    }

    /// Makes `self` a copy of `other`'s groups `ids` (in that order), then of its groups
    /// from `from` on, reusing `self`'s buffers: a checkpoint copies into the previous
    /// checkpoint's buffers, whose pages are already mapped. Every group (`ids` empty,
    /// `from` 0) is a handful of memory copies; the groups added since the previous
    /// snapshot (`from` on) are one copy per column too, and only the older groups a row
    /// changed since are gathered one by one.
    fn copy_selected(&mut self, other: &Groups, ids: &[u32], from: usize) {
        assert!(from <= other.len(), "the groups copied exist");
        self.key_bytes.clear();
        self.key_ends.clear();
        self.hashes.clear();
        let suffix_start = if from == 0 { 0 } else { other.key_ends[from - 1] };
        let gathered: usize = ids.iter().map(|&group| other.key(group as usize).len()).sum();
        let groups = ids.len() + other.len() - from;
        make_room(&mut self.key_bytes, gathered + other.key_bytes.len() - suffix_start);
        make_room(&mut self.key_ends, groups);
        make_room(&mut self.hashes, groups);
        for &group in ids {
            self.key_bytes.extend_from_slice(other.key(group as usize));
            self.key_ends.push(self.key_bytes.len());
            self.hashes.push(other.hashes[group as usize]);
        }
        let base = self.key_bytes.len();
        self.key_ends.extend(other.key_ends[from..].iter().map(|end| end - suffix_start + base));
        self.key_bytes.extend_from_slice(&other.key_bytes[suffix_start..]);
        self.hashes.extend_from_slice(&other.hashes[from..]);
        if self.accumulators.len() != other.accumulators.len() {
            self.accumulators = other.accumulators.iter().map(Accumulators::empty_like).collect();
        }
        for (target, source) in self.accumulators.iter_mut().zip(&other.accumulators) {
            target.copy_selected(source, ids, from);
        }
    }

    /// Readies a copy's buffers for the next, larger copy (see [`warm`]).
    fn warm(&mut self) {
        warm(&mut self.key_bytes);
        warm(&mut self.key_ends);
        warm(&mut self.hashes);
        self.accumulators.iter_mut().for_each(Accumulators::warm);
    }
}

/// Whether `value` replaces `current` as MIN (`max` false) or MAX.
pub(crate) fn beats<T: PartialOrd + ?Sized>(value: &T, current: &T, max: bool) -> bool {
    if max { value > current } else { value < current }
}

/// Keeps the MIN (`max` false) or MAX of a group's slot and `value`.
#[inline]
fn keep_extreme<T: PartialOrd + Copy>(slot: &mut Option<T>, value: T, max: bool) {
    if slot.is_none_or(|current| beats(&value, &current, max)) {
        *slot = Some(value);
    }
}

/// Adds `value` to a group's BIGINT SUM (wrapping, as the SUM's BIGINT result does).
#[inline]
fn add_int(sum: &mut Option<i64>, value: i64) {
    let sum = sum.get_or_insert(0);
    *sum = sum.wrapping_add(value);
}

/// An empty column with room for `values`, or without room if the system refuses it.
fn reserved<T>(values: usize) -> Vec<T> {
    let mut column = Vec::new();
    let _ = column.try_reserve_exact(values);
    column
}

/// Makes `target` (cleared, its buffer kept) `source`'s values at `ids`, then those
/// from `from` on.
fn select<T: Clone>(target: &mut Vec<T>, source: &[T], ids: &[u32], from: usize) {
    target.clear();
    make_room(target, ids.len() + source.len() - from);
    target.extend(ids.iter().map(|&id| source[id as usize].clone()));
    target.extend_from_slice(&source[from..]);
}

/// Writes the memory for half as many values again past `values`' length once, so the
/// operating system maps its pages now (off the driver) rather than during the next copy.
fn warm<T: Copy + Default>(values: &mut Vec<T>) {
    let length = values.len();
    make_room(values, length / 2);
    values.resize(length + length / 2, T::default());
    values.truncate(length);
}

/// Bytes past which a column stops doubling and reserves [`JUMP_FACTOR`] times its size
/// at once (4 MiB to 1 GiB of address space: a column moves once more only past that).
const JUMP_BYTES: usize = 4 << 20;
const JUMP_FACTOR: usize = 256;

/// Makes room for `additional` more values. A `Vec` grows by doubling, which copies the
/// whole column and maps as many fresh pages: at millions of groups one push stalls the
/// driver for a second or more (and delays any barrier behind it). Past [`JUMP_BYTES`] a
/// column instead reserves [`JUMP_FACTOR`] times its size in one step: only address
/// space, as pages are mapped when first written, so it costs one copy of the column
/// and no further moves for a long while. Where the reservation is refused (a system
/// that does not overcommit), it falls back to doubling.
fn make_room<T>(values: &mut Vec<T>, additional: usize) {
    if values.capacity() - values.len() >= additional {
        return;
    }
    if values.capacity() * size_of::<T>() >= JUMP_BYTES {
        let target = values.capacity().saturating_mul(JUMP_FACTOR).max(values.len() + additional);
        if values.try_reserve_exact(target - values.len()).is_ok() {
            return;
        }
    }
    values.reserve(additional);
}

fn push_value<T>(values: &mut Vec<T>, value: T) {
    make_room(values, 1);
    values.push(value);
}

fn key_of<'a>(bytes: &'a [u8], ends: &[usize], group: usize) -> &'a [u8] {
    let start = if group == 0 { 0 } else { ends[group - 1] };
    &bytes[start..ends[group]]
}

/// The index's hash of a placement hash. Placement uses the hash's high bits (vnodes are
/// ranges of it), so on one thread those bits vary little; the table's tag bits are high
/// bits too. Mixing spreads every bit over the high ones, keeping the low ones.
fn table_hash(placement: u64) -> u64 {
    (placement ^ (placement >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The index of a window is split in this many tables by hash, so growing one rehashes
/// a 64th of the groups (a single table of millions stalls the driver while it doubles).
const INDEX_PARTS: usize = 64;

/// The index table of a table hash: bits the tables' own bucket (low) and tag (top 7)
/// bits do not use.
fn index_part(table_hash: u64) -> usize {
    (table_hash >> 40) as usize % INDEX_PARTS
}

/// How many groups, and bytes of keys, a window held (capped, for the next window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sizes {
    groups: usize,
    key_bytes: usize,
}

impl Sizes {
    fn of(groups: &Groups) -> Sizes {
        Sizes {
            groups: groups.len().min(MAX_PRESIZED_GROUPS),
            key_bytes: groups.key_bytes.len().min(MAX_PRESIZED_KEY_BYTES),
        }
    }
}

/// A new window reserves room for at most this many groups and bytes of keys (the last
/// emitted window's, capped), and grows past them as it fills.
const MAX_PRESIZED_GROUPS: usize = 1 << 20;
const MAX_PRESIZED_KEY_BYTES: usize = 32 << 20;

struct WindowGroups {
    start: TimestampMs,
    /// Group ids, hashed with `table_hash` of each group's placement hash, in
    /// [`INDEX_PARTS`] tables chosen by [`index_part`].
    index: Vec<HashTable<u32>>,
    groups: Groups,
    /// For deltas (`state`): the groups below `written` were in the previous snapshot
    /// (or restored); those of them a row changed since have their bit set in
    /// `changed_bits` and are listed in `changed`, once. Groups from `written` on are new
    /// since. Without change tracking `written` stays 0, so nothing is marked.
    written: usize,
    changed_bits: Vec<u64>,
    changed: Vec<u32>,
    /// The bytes of its groups as counted in the memory budget (see [`GROUP_BYTES`]).
    bytes: usize,
    /// The fixed bytes of one group: its key's end, hash, index slot and accumulators.
    group_bytes: usize,
    /// Whether some of its groups were evicted to cold runs (`WindowAggregate::cold`).
    cold: bool,
    /// The groups read back from cold runs, whose older copies there they shadow.
    from_cold: Vec<u32>,
}

/// The bytes of a group besides its key and accumulators: the key's end and placement
/// hash, and its slot in the index (with the index's spare room).
const GROUP_BYTES: usize = 8 + 8 + 8;

impl WindowGroups {
    fn new(start: TimestampMs, accumulators: Vec<Accumulators>) -> WindowGroups {
        WindowGroups::sized(start, accumulators, Sizes::default())
    }

    /// A window whose index and key columns have room for `sizes` (the last emitted
    /// window's) and an eighth more, so that a stream of similar windows does not grow
    /// each from nothing. A column whose room the system refuses starts empty, as
    /// [`make_room`] falls back.
    fn sized(start: TimestampMs, accumulators: Vec<Accumulators>, sizes: Sizes) -> WindowGroups {
        let room = |size: usize| size + size / 8;
        let part = room(sizes.groups) / INDEX_PARTS;
        let index = (0..INDEX_PARTS).map(|_| HashTable::with_capacity(part)).collect();
        let groups = Groups {
            key_bytes: reserved(room(sizes.key_bytes)),
            key_ends: reserved(room(sizes.groups)),
            hashes: reserved(room(sizes.groups)),
            accumulators,
        };
        let group_bytes = GROUP_BYTES + groups.accumulators.iter().map(Accumulators::fixed_bytes).sum::<usize>();
        WindowGroups {
            start,
            index,
            groups,
            written: 0,
            changed_bits: Vec::new(),
            changed: Vec::new(),
            bytes: 0,
            group_bytes,
            cold: false,
            from_cold: Vec::new(),
        }
    }

    /// Marks `group` changed since the previous snapshot: for a group that snapshot
    /// took, one bit (a group added since is taken whole anyway).
    #[inline]
    fn mark(&mut self, group: usize) {
        if group < self.written {
            let (word, bit) = (group / 64, 1u64 << (group % 64));
            if self.changed_bits[word] & bit == 0 {
                self.changed_bits[word] |= bit;
                self.changed.push(group as u32);
            }
        }
    }

    /// Forgets what changed: every group is in the snapshot just taken (or restored).
    fn clear_changes(&mut self) {
        for &group in &self.changed {
            self.changed_bits[group as usize / 64] = 0;
        }
        self.changed.clear();
        self.written = self.groups.len();
        self.changed_bits.resize(self.written.div_ceil(64), 0);
    }

    /// The group of `key` (whose placement hash is `hash`), added if new.
    fn group_of(&mut self, key: &[u8], hash: u64) -> usize {
        let Groups { key_bytes, key_ends, hashes, accumulators } = &mut self.groups;
        let table = table_hash(hash);
        let index = &mut self.index[index_part(table)];
        if let Some(&group) =
            index.find(table, |&group| crate::same_bytes(key_of(key_bytes, key_ends, group as usize), key))
        {
            return group as usize;
        }
        let group = key_ends.len();
        assert!(group < u32::MAX as usize, "a window holds fewer than 2^32 groups");
        make_room(key_bytes, key.len());
        key_bytes.extend_from_slice(key);
        push_value(key_ends, key_bytes.len());
        push_value(hashes, hash);
        index.insert_unique(table, group as u32, |&g| table_hash(hashes[g as usize]));
        accumulators.iter_mut().for_each(Accumulators::push_group);
        self.bytes += key.len() + self.group_bytes;
        group
    }

    /// The groups a snapshot has not taken since they changed: those changed since the
    /// previous one, then those added since.
    fn unwritten(&self) -> impl Iterator<Item = usize> + '_ {
        self.changed.iter().map(|&group| group as usize).chain(self.written..self.groups.len())
    }
}

/// See the module documentation.
pub struct WindowAggregate {
    spec: WindowAggregateSpec,
    key_encoder: KeyEncoder,
    /// The current batch's keys (reused buffer).
    key_rows: KeyRows,
    /// For each aggregate, the encoder of a COUNT(DISTINCT) argument's values.
    distinct_encoders: Vec<Option<KeyEncoder>>,
    windows: BTreeMap<TimestampMs, WindowGroups>,
    watermark: TimestampMs,
    late_rows: Arc<AtomicU64>,
    input_types: Vec<DataType>,
    vnodes: u32,
    /// The copy of the previous checkpoint, handed back by its job for the next copy to
    /// reuse.
    spare: Arc<Mutex<Vec<state::Frozen>>>,
    /// The last emitted window's sizes (capped), for the next new window.
    last_sizes: Sizes,
    /// Whether windows keep their changes for deltas (from the first snapshot or a
    /// restore on: a run without checkpoints keeps none).
    tracking: bool,
    /// The end of the last window emitted since the previous snapshot (tracking only).
    emitted_through: Option<TimestampMs>,
    /// The lowest and highest placement hash of the groups a snapshot took or a restore
    /// loaded: the vnodes between theirs are those the instance's runs may hold.
    written_hashes: Option<(u64, u64)>,
    /// Windows' groups beyond the memory budget (see the module documentation).
    cold: Option<Spilling>,
    /// What the last watermark (or the end) closed and is not emitted yet.
    emitting: Option<Emitting>,
}

/// The output of a watermark or of the end still to emit, in parts
/// ([`WindowAggregate::emit_part`]).
struct Emitting {
    /// Windows whose last millisecond is at or before it close.
    until: TimestampMs,
    /// What goes out after the last window: the watermark or end-of-data.
    then: Message,
    /// The closing window whose groups are being read from the cold runs.
    cold: Option<ColdWindow>,
    /// Whether a window was emitted.
    emitted: bool,
}

/// A closing window's groups in the cold runs, read a batch at a time.
struct ColdWindow {
    end: TimestampMs,
    start: TimestampMs,
    /// The keys read back into memory, emitted with the window's groups in memory.
    shadow: HashSet<Vec<u8>>,
    /// The runs' records of the window.
    merge: Merge,
}

/// Groups beyond the memory budget ([`crate::cold`]): where they go, and what the
/// snapshots need to know of them.
struct Spilling {
    store: ColdStore,
    /// The spill counter, for the store that replaces this one once its runs are dropped.
    written: LazyCounter,
    /// The records of the groups evicted while changed since the previous snapshot,
    /// written as they were evicted: the next delta writes them (but those of windows
    /// emitted since), then the groups in memory, whose newer copies win.
    evicted_dirty: Option<crate::records::Records>,
    /// The end of the last window emitted since the last run was written: the next
    /// run deletes the records of the windows up to it.
    emitted: Option<TimestampMs>,
    /// The lowest and highest placement hash of the groups written to runs.
    hashes: Option<(u64, u64)>,
}

/// The bloom hash of a group in cold runs: its key's placement hash mixed with its
/// window's end, so that a key's groups in other windows do not pass the filter.
fn cold_hash(placement: u64, end: TimestampMs) -> u64 {
    placement ^ (end as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// A group's record key: its window's end (ordered), then its key.
fn record_key(end: TimestampMs, key: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&crate::blob::ordered_i64(end));
    out.extend_from_slice(key);
}

/// Reads the group `group` of `window` (ending at `end`), just added for `key` (placement
/// hash `hash`), back from the cold runs if they hold it.
fn load_cold(
    spilling: &mut Spilling,
    end: TimestampMs,
    window: &mut WindowGroups,
    group: usize,
    key: &[u8],
    hash: u64,
    vnodes: u32,
) -> Result<(), SluiceError> {
    let mut full_key = Vec::with_capacity(8 + key.len());
    record_key(end, key, &mut full_key);
    let vnode = sluice_types::vnode::of_hash(hash, vnodes);
    let Some(found) = spilling.store.runs().find(vnode, &full_key, cold_hash(hash, end), &|_| false)? else {
        return Ok(());
    };
    state::read_group(&mut window.groups.accumulators, group, &found.value)?;
    window.bytes += window.groups.accumulators.iter().map(|a| a.variable_bytes(group)).sum::<usize>();
    window.from_cold.push(group as u32);
    // The group is new in memory: the next delta takes it whole, after (and over) its
    // evicted record.
    Ok(())
}

pub(crate) fn is_float(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Decimal128(..))
}

pub(crate) fn is_text(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

impl WindowAggregate {
    /// `input` is the schema of the rows the operator receives.
    /// `vnodes` is the pipeline's vnode count: snapshots split state by the vnode of each key.
    pub fn new(
        spec: WindowAggregateSpec,
        input: &SchemaRef,
        late_rows: Arc<AtomicU64>,
        vnodes: u32,
    ) -> Result<WindowAggregate, SluiceError> {
        let key_encoder = KeyEncoder::new(spec.keys.iter().map(|&k| input.field(k).data_type().clone()).collect())?;
        let distinct_encoders = distinct_encoders(&spec.aggregates, input)?;
        let input_types = input.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(WindowAggregate {
            spec,
            key_encoder,
            key_rows: KeyRows::default(),
            distinct_encoders,
            windows: BTreeMap::new(),
            watermark: i64::MIN,
            late_rows,
            input_types,
            vnodes,
            spare: Arc::new(Mutex::new(Vec::new())),
            last_sizes: Sizes::default(),
            tracking: false,
            emitted_through: None,
            written_hashes: None,
            cold: None,
            emitting: None,
        })
    }

    /// Counts the windows' groups in `space`'s memory budget and evicts windows to disk
    /// beyond it; `written` counts the bytes written there.
    pub fn with_spill(mut self, space: Arc<SpillSpace>, written: LazyCounter) -> WindowAggregate {
        let store = ColdStore::new(space, written.again());
        self.cold = Some(Spilling { store, written, evicted_dirty: None, emitted: None, hashes: None });
        self
    }

    fn new_accumulators(&self) -> Vec<Accumulators> {
        accumulators_for(&self.spec.aggregates, &self.input_types)
    }

    fn arguments(&self, rows: &RecordBatch) -> Result<Vec<Argument>, SluiceError> {
        read_arguments(&self.spec.aggregates, &self.distinct_encoders, rows)
    }

    /// Starts emitting the windows closed at `until` (their last millisecond at or before
    /// it), then `then`, and emits the first part.
    fn close_until(&mut self, until: TimestampMs, then: Message, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.emitting.is_none(), "a watermark while the previous one's output is held");
        self.emitting = Some(Emitting { until, then, cold: None, emitted: false });
        self.emit_part(out)
    }

    /// Emits the next part of what is closing ([`Emitting`]): windows in memory and
    /// batches of evicted windows' groups until a batch's rows went out (a window in
    /// memory whole), and after the last window the watermark or end-of-data.
    fn emit_part(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let Some(mut emitting) = self.emitting.take() else { return Ok(()) };
        let mut rows = 0;
        while rows < self.spec.batch_size.max(1) {
            let before = out.len();
            if let Some(cold) = emitting.cold.as_mut() {
                if self.emit_cold_batch(cold, out)? {
                    let end = cold.end;
                    emitting.cold = None;
                    self.emitted_cold(end);
                }
            } else if let Some(end) = self.windows.keys().next().copied().filter(|end| end - 1 <= emitting.until) {
                let groups = self.windows.remove(&end).expect("the first window");
                emitting.emitted = true;
                self.last_sizes = Sizes::of(&groups.groups);
                if self.tracking {
                    self.emitted_through = Some(end);
                }
                let (start, cold) = (groups.start, groups.cold);
                let shadow: HashSet<Vec<u8>> = if cold {
                    groups.from_cold.iter().map(|&group| groups.groups.key(group as usize).to_vec()).collect()
                } else {
                    HashSet::new()
                };
                self.emit(end, groups, out)?;
                match self.cold.as_ref().filter(|_| cold) {
                    Some(spilling) => {
                        let prefix = crate::blob::ordered_i64(end).to_vec();
                        let next = end.checked_add(1).map(|next| crate::blob::ordered_i64(next).to_vec());
                        let merge = Merge::new(spilling.store.runs().inputs(), 0..u32::MAX, MergeMode::Live)
                            .within(prefix, next);
                        emitting.cold = Some(ColdWindow { end, start, shadow, merge });
                    }
                    None => self.emitted_cold(end),
                }
            } else {
                if emitting.emitted {
                    self.drop_unused_runs();
                    self.recount();
                }
                out.push(emitting.then);
                return Ok(());
            }
            rows +=
                out[before..].iter().map(|m| if let Message::Data(b) = m { b.num_rows() } else { 0 }).sum::<usize>();
        }
        self.emitting = Some(emitting);
        Ok(())
    }

    /// The window ending at `end` was emitted whole: the next run deletes its records.
    fn emitted_cold(&mut self, end: TimestampMs) {
        if let Some(spilling) = self.cold.as_mut().filter(|spilling| spilling.hashes.is_some()) {
            spilling.emitted = Some(end);
        }
    }

    /// Emits the next batch of the closing window's groups in the cold runs, but those
    /// whose key its shadow holds (read back, so emitted from memory); returns whether
    /// the window's records are done.
    fn emit_cold_batch(&self, cold: &mut ColdWindow, out: &mut Vec<Message>) -> Result<bool, SluiceError> {
        let prefix = crate::blob::ordered_i64(cold.end);
        let no_keys = self.spec.keys.is_empty();
        let mut part = WindowGroups::new(cold.start, self.new_accumulators());
        while let Some(record) = cold.merge.next_record()? {
            let Some(key) = record.key.strip_prefix(&prefix[..]) else { continue };
            if cold.shadow.contains(key) {
                continue;
            }
            let group = part.group_of(key, crate::partition::placement_hash(no_keys, key));
            state::read_group(&mut part.groups.accumulators, group, record.value)?;
            if part.groups.len() == self.spec.batch_size {
                self.emit(cold.end, part, out)?;
                return Ok(false);
            }
        }
        self.emit(cold.end, part, out)?;
        Ok(true)
    }

    /// Counts the windows' groups in the space as their bytes now.
    fn recount(&mut self) {
        if let Some(spilling) = self.cold.as_mut() {
            spilling.store.set_entry_bytes(self.windows.values().map(|window| window.bytes).sum());
        }
    }

    /// Whether the windows' groups, counted in the space, bring it over its budget.
    fn over_budget(&mut self) -> bool {
        self.recount();
        self.cold.as_ref().is_some_and(|spilling| spilling.store.space().over_budget())
    }

    /// Drops the cold runs once no open window has groups in them.
    fn drop_unused_runs(&mut self) {
        let Some(spilling) = self.cold.as_mut() else { return };
        if spilling.hashes.is_none() || self.windows.values().any(|window| window.cold) {
            return;
        }
        let space = Arc::clone(spilling.store.space());
        spilling.store = ColdStore::new(space, spilling.written.again());
        (spilling.hashes, spilling.emitted) = (None, None);
    }

    /// When the space is over its budget, evicts the largest windows whole (those most
    /// of whose groups came back from the runs aside), enough to bring the space an
    /// eighth of its budget under it, into one cold run.
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        self.recount();
        let Some(spilling) = self.cold.as_mut() else { return Ok(()) };
        let Some(goal) = spilling.store.eviction_goal() else { return Ok(()) };
        let mut candidates: Vec<(usize, TimestampMs)> = (self.windows.iter())
            .filter(|(_, window)| window.groups.len() > 0 && window.from_cold.len() * 2 <= window.groups.len())
            .map(|(end, window)| (window.bytes, *end))
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let (mut chosen, mut freed, mut groups) = (Vec::new(), 0usize, 0usize);
        for (bytes, end) in candidates {
            if freed >= goal {
                break;
            }
            chosen.push(end);
            freed += bytes;
            groups += self.windows[&end].groups.len();
        }
        // Every window was a candidate: an eviction short of its goal looked at all.
        if chosen.is_empty() {
            spilling.store.evicted(0, goal, 1, 1);
            return Ok(());
        }
        let (vnodes, no_keys) = (self.vnodes, self.spec.keys.is_empty());
        let mut records = crate::records::Records::new(Some(spilling.store.space().dir()));
        for end in &chosen {
            let window = &self.windows[end];
            state::write_groups(&mut records, *end, window.start, &window.groups, 0..window.groups.len(), vnodes);
            for &hash in &window.groups.hashes {
                spilling.hashes = state::widen(spilling.hashes, hash);
            }
        }
        if let (Some(through), Some((low, high))) = (spilling.emitted.take(), spilling.hashes) {
            // The windows emitted since the last run: their older records are garbage.
            if let Some(bound) = through.checked_add(1) {
                let (start, bound) =
                    (crate::blob::ordered_i64(i64::MIN).to_vec(), crate::blob::ordered_i64(bound).to_vec());
                for vnode in sluice_types::vnode::of_hash(low, vnodes)..=sluice_types::vnode::of_hash(high, vnodes) {
                    records.delete_range(vnode, start.clone(), bound.clone());
                }
            }
        }
        let hash_of = move |key: &[u8]| {
            let (end, key) = key.split_at_checked(8)?;
            let end = crate::blob::from_ordered_i64(end.try_into().expect("8 bytes"));
            Some(cold_hash(crate::partition::placement_hash(no_keys, key), end))
        };
        spilling.store.add(records, groups, freed, hash_of)?;
        for end in chosen {
            let window = self.windows.get_mut(&end).expect("a chosen window");
            if self.tracking {
                // Their changes go with the next delta.
                let dir = spilling.store.space().dir();
                let dirty = spilling.evicted_dirty.get_or_insert_with(|| crate::records::Records::new(Some(dir)));
                state::write_groups(dirty, end, window.start, &window.groups, window.unwritten(), vnodes);
            }
            let accumulators = accumulators_for(&self.spec.aggregates, &self.input_types);
            *window = WindowGroups::new(window.start, accumulators);
            window.cold = true;
        }
        self.recount();
        if let Some(spilling) = self.cold.as_mut() {
            spilling.store.evicted(freed, goal, 1, 1);
        }
        Ok(())
    }

    fn emit(&self, end: TimestampMs, groups: WindowGroups, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let WindowGroups { start, groups, .. } = groups;
        let count = groups.len();
        if count == 0 {
            return Ok(());
        }
        let key_columns = if self.spec.keys.is_empty() {
            Vec::new()
        } else {
            self.key_encoder.decode((0..count).map(|group| groups.key(group)))?
        };
        let timestamp = |value: i64| -> ArrayRef { Arc::new(TimestampMillisecondArray::from(vec![value; count])) };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.spec.output.fields().len());
        for group in &self.spec.groups {
            columns.push(match group {
                GroupColumn::WindowStart => timestamp(start),
                GroupColumn::WindowEnd => timestamp(end),
                GroupColumn::Key(index) => Arc::clone(&key_columns[*index]),
            });
        }
        for accumulators in groups.accumulators {
            columns.push(finish(accumulators));
        }
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?;
        let mut offset = 0;
        while offset < count {
            let length = self.spec.batch_size.min(count - offset);
            out.push(Message::Data(Batch::inserts(rows.slice(offset, length))));
            offset += length;
        }
        Ok(())
    }
}

/// Empty accumulators of `aggregates` over input columns of `input_types`.
fn accumulators_for(aggregates: &[AggregateSpec], input_types: &[DataType]) -> Vec<Accumulators> {
    aggregates
        .iter()
        .map(|aggregate| {
            let argument_type = aggregate.argument.map(|c| &input_types[c]);
            let max = aggregate.function == AggregateFunction::Max;
            match (aggregate.function, argument_type) {
                (AggregateFunction::CountRows | AggregateFunction::Count, _) => Accumulators::Count(Vec::new()),
                (AggregateFunction::CountDistinct, _) => Accumulators::Distinct(Vec::new()),
                (AggregateFunction::Avg, _) => Accumulators::Avg { sums: Vec::new(), counts: Vec::new() },
                (AggregateFunction::Sum, Some(t)) if is_float(t) => Accumulators::SumFloat(Vec::new()),
                (AggregateFunction::Sum, _) => Accumulators::SumInt(Vec::new()),
                (_, Some(t)) if is_float(t) => Accumulators::MinMaxFloat { values: Vec::new(), max },
                (_, Some(t)) if is_text(t) => Accumulators::MinMaxString { values: Vec::new(), max },
                _ => Accumulators::MinMaxInt { values: Vec::new(), max },
            }
        })
        .collect()
}

/// For each aggregate, the encoder of a COUNT(DISTINCT) argument's values.
fn distinct_encoders(aggregates: &[AggregateSpec], input: &SchemaRef) -> Result<Vec<Option<KeyEncoder>>, SluiceError> {
    let mut encoders = Vec::new();
    for aggregate in aggregates {
        let encoder = match (aggregate.function, aggregate.argument) {
            (AggregateFunction::CountDistinct, Some(column)) => {
                Some(KeyEncoder::new(vec![input.field(column).data_type().clone()])?)
            }
            _ => None,
        };
        encoders.push(encoder);
    }
    Ok(encoders)
}

/// Each aggregate's argument column of `rows`, cast once for the batch.
fn read_arguments(
    aggregates: &[AggregateSpec],
    distinct_encoders: &[Option<KeyEncoder>],
    rows: &RecordBatch,
) -> Result<Vec<Argument>, SluiceError> {
    let mut arguments = Vec::with_capacity(aggregates.len());
    for (index, aggregate) in aggregates.iter().enumerate() {
        let Some(column) = aggregate.argument else {
            arguments.push(Argument::None);
            continue;
        };
        let array = rows.column(column);
        let argument = if let Some(encoder) = &distinct_encoders[index] {
            let mut values = KeyRows::default();
            encoder.encode(std::slice::from_ref(array), &mut values)?;
            Argument::Encoded(values, Arc::clone(array))
        } else if aggregate.function == AggregateFunction::Count {
            Argument::Int(Int64Array::from_iter((0..array.len()).map(|i| array.is_valid(i).then_some(1))))
        } else if is_float(array.data_type()) || aggregate.function == AggregateFunction::Avg {
            Argument::Float(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
        } else if is_text(array.data_type()) {
            Argument::Text(cast(array, &DataType::Utf8)?.as_string::<i32>().clone())
        } else {
            Argument::Int(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone())
        };
        arguments.push(argument);
    }
    Ok(arguments)
}

fn finish(accumulators: Accumulators) -> ArrayRef {
    match accumulators {
        Accumulators::Count(counts) => Arc::new(Int64Array::from(counts)),
        Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => Arc::new(Int64Array::from(values)),
        Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => {
            Arc::new(Float64Array::from(values))
        }
        Accumulators::MinMaxString { values, .. } => Arc::new(StringArray::from(values)),
        Accumulators::Avg { sums, counts } => Arc::new(Float64Array::from_iter(
            sums.iter().zip(&counts).map(|(sum, count)| (*count > 0).then(|| sum / *count as f64)),
        )),
        Accumulators::Distinct(sets) => Arc::new(Int64Array::from_iter_values(sets.iter().map(|s| s.len() as i64))),
    }
}

impl Accumulators {
    /// Makes `self` a copy of `other`'s groups `ids`, then of those from `from` on (see
    /// [`Groups::copy_selected`]), reusing its buffers.
    fn copy_selected(&mut self, other: &Accumulators, ids: &[u32], from: usize) {
        match (&mut *self, other) {
            (Accumulators::Count(target), Accumulators::Count(source)) => select(target, source, ids, from),
            (Accumulators::SumInt(target), Accumulators::SumInt(source)) => select(target, source, ids, from),
            (Accumulators::SumFloat(target), Accumulators::SumFloat(source)) => select(target, source, ids, from),
            (Accumulators::MinMaxInt { values: target, .. }, Accumulators::MinMaxInt { values: source, .. }) => {
                select(target, source, ids, from)
            }
            (Accumulators::MinMaxFloat { values: target, .. }, Accumulators::MinMaxFloat { values: source, .. }) => {
                select(target, source, ids, from)
            }
            (Accumulators::MinMaxString { values: target, .. }, Accumulators::MinMaxString { values: source, .. }) => {
                select(target, source, ids, from)
            }
            (Accumulators::Avg { sums: target_sums, counts: target_counts }, Accumulators::Avg { sums, counts }) => {
                select(target_sums, sums, ids, from);
                select(target_counts, counts, ids, from);
            }
            (Accumulators::Distinct(target), Accumulators::Distinct(source)) => select(target, source, ids, from),
            (target, source) => {
                *target = source.empty_like();
                target.copy_selected(source, ids, from);
            }
        }
    }

    /// Accumulators of the same aggregate, for no group.
    fn empty_like(&self) -> Accumulators {
        match self {
            Accumulators::Count(_) => Accumulators::Count(Vec::new()),
            Accumulators::SumInt(_) => Accumulators::SumInt(Vec::new()),
            Accumulators::SumFloat(_) => Accumulators::SumFloat(Vec::new()),
            Accumulators::MinMaxInt { max, .. } => Accumulators::MinMaxInt { values: Vec::new(), max: *max },
            Accumulators::MinMaxFloat { max, .. } => Accumulators::MinMaxFloat { values: Vec::new(), max: *max },
            Accumulators::MinMaxString { max, .. } => Accumulators::MinMaxString { values: Vec::new(), max: *max },
            Accumulators::Avg { .. } => Accumulators::Avg { sums: Vec::new(), counts: Vec::new() },
            Accumulators::Distinct(_) => Accumulators::Distinct(Vec::new()),
        }
    }

    fn warm(&mut self) {
        match self {
            Accumulators::Count(values) => warm(values),
            Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => warm(values),
            Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => warm(values),
            Accumulators::Avg { sums, counts } => {
                warm(sums);
                warm(counts);
            }
            Accumulators::MinMaxString { .. } | Accumulators::Distinct(_) => {}
        }
    }

    fn push_group(&mut self) {
        match self {
            Accumulators::Count(counts) => push_value(counts, 0),
            Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => push_value(values, None),
            Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => push_value(values, None),
            Accumulators::MinMaxString { values, .. } => push_value(values, None),
            Accumulators::Avg { sums, counts } => {
                push_value(sums, 0.0);
                push_value(counts, 0);
            }
            Accumulators::Distinct(sets) => push_value(sets, HashSet::with_hasher(RandomState::with_seed(0))),
        }
    }

    /// [`Accumulators::update`] for every row of a batch: row `r` goes to group
    /// `groups[r]`, if `filter` (a FILTER clause's column) passes it. The common cases
    /// loop without choosing the case per row.
    fn update_rows(&mut self, groups: &[u32], argument: &Argument, filter: Option<&arrow::array::BooleanArray>) {
        match (&mut *self, argument, filter) {
            (Accumulators::Count(counts), Argument::None, None) => {
                for &group in groups {
                    counts[group as usize] += 1;
                }
            }
            (Accumulators::Count(counts), Argument::Int(values), None) => {
                for (row, &group) in groups.iter().enumerate() {
                    counts[group as usize] += i64::from(values.is_valid(row));
                }
            }
            (Accumulators::SumInt(sums), Argument::Int(values), None) => {
                for (row, &group) in groups.iter().enumerate() {
                    if values.is_valid(row) {
                        add_int(&mut sums[group as usize], values.value(row));
                    }
                }
            }
            (Accumulators::MinMaxInt { values, max }, Argument::Int(input), None) => {
                let max = *max;
                for (row, &group) in groups.iter().enumerate() {
                    if input.is_valid(row) {
                        keep_extreme(&mut values[group as usize], input.value(row), max);
                    }
                }
            }
            _ => {
                for (row, &group) in groups.iter().enumerate() {
                    if filter.is_none_or(|f| f.is_valid(row) && f.value(row)) {
                        self.update(group as usize, argument, row);
                    }
                }
            }
        }
    }

    /// Folds row `row` into group `group`; returns the bytes its state grew by.
    fn update(&mut self, group: usize, argument: &Argument, row: usize) -> usize {
        match (self, argument) {
            (Accumulators::Count(counts), Argument::None) => counts[group] += 1,
            (Accumulators::Count(counts), Argument::Int(values)) => counts[group] += i64::from(values.is_valid(row)),
            (Accumulators::SumInt(sums), Argument::Int(values)) if values.is_valid(row) => {
                add_int(&mut sums[group], values.value(row));
            }
            (Accumulators::SumFloat(sums), Argument::Float(values)) if values.is_valid(row) => {
                *sums[group].get_or_insert(0.0) += values.value(row);
            }
            (Accumulators::MinMaxInt { values, max }, Argument::Int(input)) if input.is_valid(row) => {
                keep_extreme(&mut values[group], input.value(row), *max);
            }
            (Accumulators::MinMaxFloat { values, max }, Argument::Float(input)) if input.is_valid(row) => {
                keep_extreme(&mut values[group], input.value(row), *max);
            }
            (Accumulators::MinMaxString { values, max }, Argument::Text(input)) if input.is_valid(row) => {
                let value = input.value(row);
                let slot = &mut values[group];
                if slot.as_deref().is_none_or(|current| beats(value, current, *max)) {
                    let grown = value.len().saturating_sub(slot.as_ref().map_or(0, String::len));
                    *slot = Some(value.to_string());
                    return grown;
                }
            }
            (Accumulators::Avg { sums, counts }, Argument::Float(values)) if values.is_valid(row) => {
                sums[group] += values.value(row);
                counts[group] += 1;
            }
            // A NULL argument is not counted (COUNT(DISTINCT) skips NULLs).
            (Accumulators::Distinct(sets), Argument::Encoded(values, column)) if column.is_valid(row) => {
                let value = values.row(row);
                if !sets[group].contains(value) {
                    sets[group].insert(value.into());
                    return value.len() + DISTINCT_VALUE_BYTES;
                }
            }
            _ => {}
        }
        0
    }

    /// The bytes of one group's accumulator of this aggregate besides its text or
    /// COUNT(DISTINCT) values ([`Accumulators::variable_bytes`]).
    fn fixed_bytes(&self) -> usize {
        match self {
            Accumulators::Count(_) => 8,
            Accumulators::SumInt(_)
            | Accumulators::MinMaxInt { .. }
            | Accumulators::SumFloat(_)
            | Accumulators::MinMaxFloat { .. }
            | Accumulators::Avg { .. } => 16,
            Accumulators::MinMaxString { .. } => 24,
            Accumulators::Distinct(_) => 48,
        }
    }

    /// The bytes of group `group`'s text or COUNT(DISTINCT) values.
    fn variable_bytes(&self, group: usize) -> usize {
        match self {
            Accumulators::MinMaxString { values, .. } => values[group].as_ref().map_or(0, String::len),
            Accumulators::Distinct(sets) => sets[group].iter().map(|value| value.len() + DISTINCT_VALUE_BYTES).sum(),
            _ => 0,
        }
    }
}

/// The bytes of a COUNT(DISTINCT) value in its set besides its own: its box and its
/// slot in the table, with the table's spare room.
const DISTINCT_VALUE_BYTES: usize = 32;

impl Operator for WindowAggregate {
    fn name(&self) -> &str {
        "window_aggregate"
    }

    fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(batch.is_append_only(), "the planner rejects window aggregates over updating input");
        assert!(self.emitting.is_none(), "rows while a watermark's output is held");
        let rows = &batch.rows;
        let starts = rows.column(self.spec.window_start).as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        let ends = rows.column(self.spec.window_end).as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        let key_columns: Vec<ArrayRef> = self.spec.keys.iter().map(|&k| Arc::clone(rows.column(k))).collect();
        let mut keys = std::mem::take(&mut self.key_rows);
        self.key_encoder.encode(&key_columns, &mut keys)?;
        let arguments = self.arguments(rows)?;
        let filters: Vec<Option<arrow::array::BooleanArray>> =
            self.spec.aggregates.iter().map(|a| a.filter.map(|f| rows.column(f).as_boolean().clone())).collect();
        let mut late = 0u64;
        let template = self.new_accumulators();
        let mut template = Some(template);
        let weights = self.spec.late_weights.map(|c| rows.column(c).as_primitive::<Int64Type>().clone());
        for row in 0..rows.num_rows() {
            let end = ends.value(row);
            if end - 1 <= self.watermark {
                late += weights.as_ref().map_or(1, |w| w.value(row).max(0) as u64);
                continue;
            }
            let window = match self.windows.get_mut(&end) {
                Some(window) => window,
                None => {
                    let accumulators = template.take().unwrap_or_else(|| self.new_accumulators());
                    let sizes = self.last_sizes;
                    self.windows.entry(end).or_insert(WindowGroups::sized(starts.value(row), accumulators, sizes))
                }
            };
            // Without key columns all rows share the empty key (and hash 0, vnode 0).
            let (key, hash): (&[u8], u64) =
                if self.spec.keys.is_empty() { (&[], 0) } else { (keys.row(row), keys.hash(row)) };
            let fresh = window.groups.len();
            let group = window.group_of(key, hash);
            if group == fresh
                && window.cold
                && let Some(spilling) = self.cold.as_mut()
            {
                load_cold(spilling, end, window, group, key, hash, self.vnodes)?;
            }
            window.mark(group);
            for ((accumulators, argument), filter) in
                window.groups.accumulators.iter_mut().zip(&arguments).zip(&filters)
            {
                if filter.as_ref().is_none_or(|f| f.is_valid(row) && f.value(row)) {
                    window.bytes += accumulators.update(group, argument, row);
                }
            }
        }
        self.key_rows = keys;
        if late > 0 {
            self.late_rows.fetch_add(late, Ordering::Relaxed);
        }
        self.evict_over_budget()
    }

    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if watermark > self.watermark {
            self.watermark = watermark;
            return self.close_until(watermark, Message::Watermark(watermark), out);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.close_until(i64::MAX, Message::EndOfData, out)
    }

    fn has_more(&self) -> bool {
        self.emitting.is_some()
    }

    fn on_resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.emitting.is_some(), "window_aggregate resumed without held output");
        self.emit_part(out)
    }

    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        assert!(self.emitting.is_none(), "a snapshot while a watermark's output is held");
        Ok(Some(state::snapshot(self, delta)))
    }

    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        state::restore(self, state)
    }
}

/// The output type of each aggregate over an argument of type `argument` (Flink's and
/// DataFusion's: COUNT → BIGINT, AVG → DOUBLE, SUM of integers → BIGINT, of floats → DOUBLE,
/// MIN/MAX → the argument's type).
pub fn output_type(function: AggregateFunction, argument: Option<&DataType>) -> DataType {
    match (function, argument) {
        (AggregateFunction::CountRows | AggregateFunction::Count | AggregateFunction::CountDistinct, _) => {
            DataType::Int64
        }
        (AggregateFunction::Avg, _) => DataType::Float64,
        (AggregateFunction::Sum, Some(t)) if is_float(t) => DataType::Float64,
        (AggregateFunction::Sum, _) => DataType::Int64,
        (_, Some(DataType::Timestamp(unit, zone))) => DataType::Timestamp(*unit, zone.clone()),
        (_, Some(t)) => t.clone(),
        (_, None) => DataType::Timestamp(TimeUnit::Millisecond, None),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Groups, INDEX_PARTS, JUMP_BYTES, JUMP_FACTOR, MAX_PRESIZED_GROUPS, MAX_PRESIZED_KEY_BYTES, Sizes, WindowGroups,
        index_part, make_room, push_value, table_hash,
    };

    /// What matters is that a large column is not copied again for a long while (a copy
    /// of millions of values stalls the driver), whatever `Vec` reports as its capacity:
    /// the column's address must stay put while it grows by as much again.
    #[test]
    fn a_large_column_moves_once_then_grows_in_place_and_keeps_its_values() {
        let mut values: Vec<u64> = Vec::new();
        let threshold = JUMP_BYTES / size_of::<u64>();
        for value in 0..threshold as u64 {
            push_value(&mut values, value);
        }
        let spare = values.capacity() - values.len();
        make_room(&mut values, spare + 1);
        let address = values.as_ptr();
        for value in 0..(4 * threshold) as u64 {
            push_value(&mut values, value);
            assert_eq!(values.as_ptr(), address, "value {value}: a {JUMP_FACTOR}-fold reservation moved");
        }
        let expected = (0..threshold as u64).chain(0..(4 * threshold) as u64);
        assert!(values.iter().copied().eq(expected), "every value kept, in order");
    }

    #[test]
    fn a_new_window_has_the_last_one_s_room_capped() {
        let sizes = Sizes { groups: 6_400, key_bytes: 57_600 };
        let window = WindowGroups::sized(0, Vec::new(), sizes);
        assert!(window.index.iter().all(|part| part.capacity() >= 6_400 * 9 / 8 / INDEX_PARTS));
        assert!(window.groups.key_ends.capacity() >= 7_200 && window.groups.hashes.capacity() >= 7_200);
        assert!(window.groups.key_bytes.capacity() >= 64_800);
        assert_eq!(window.groups.len(), 0, "room only: no group");
        let huge = Groups {
            key_bytes: vec![0; MAX_PRESIZED_KEY_BYTES + 1],
            key_ends: vec![0; MAX_PRESIZED_GROUPS + 1],
            ..Groups::default()
        };
        assert_eq!(Sizes::of(&huge), Sizes { groups: MAX_PRESIZED_GROUPS, key_bytes: MAX_PRESIZED_KEY_BYTES });
    }

    #[test]
    fn index_parts_spread_nearby_placement_hashes() {
        // One thread owns a narrow range of placement hashes (vnodes are its high bits).
        let mut counts = [0usize; INDEX_PARTS];
        for i in 0..64_000u64 {
            counts[index_part(table_hash((7 << 58) | i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 6))] += 1;
        }
        assert!(counts.iter().all(|&count| count > 500), "{counts:?}");
    }
}
