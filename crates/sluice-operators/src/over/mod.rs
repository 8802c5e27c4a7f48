//! OVER aggregates over event time: `AGG(x) OVER (PARTITION BY k ORDER BY ts ROWS|RANGE
//! BETWEEN … PRECEDING AND CURRENT ROW)`, as Flink's event-time over aggregate computes
//! them.
//!
//! Every input row is emitted exactly once, with one value per aggregate appended, when
//! the watermark reaches its event time: until then it waits in its partition's pending
//! rows (ordered by time, then arrival). When the watermark `w` arrives, each partition
//! with pending rows at or below `w` takes them in that order and computes each row's
//! frame:
//! - `ROWS n PRECEDING`: the row and the `n` rows before it in the partition (ties in time
//!   in arrival order); `ROWS UNBOUNDED PRECEDING`: every row up to it.
//! - `RANGE d PRECEDING`: the rows whose time is in `[ts - d, ts]`, rows of equal time
//!   being peers: each sees all of them, itself included; `RANGE UNBOUNDED PRECEDING`:
//!   every row whose time is at most `ts`.
//!
//! A row whose time is at or below the watermark when it arrives (or NULL) is late:
//! counted and dropped. End of input emits every pending row, in the same order. What a
//! watermark (or the end) releases goes out in parts of about a batch of rows, whole
//! partitions each ([`Operator::has_more`]), the watermark with the last.
//!
//! Output rows are emitted before the watermark that released them is forwarded, and
//! each has a time above the previous watermark forwarded (rows at or below it were
//! emitted then, or were late on arrival): the output keeps the input's event time.
//!
//! State per partition (keyed by the PARTITION BY columns in the project's key
//! encoding, [`sluice_types::key`], and placed by its hash as the exchange places rows):
//! the pending rows (whole rows in the key encoding), and what later frames still need:
//! for `ROWS n` the argument values of the last `n` rows, for `RANGE d` those of the rows
//! within `d` of the newest time any future row can have (freed as the watermark moves,
//! through an expiry entry per partition), for `UNBOUNDED` one running accumulator per
//! aggregate (no retractions, so MIN/MAX keep a single value). A bounded frame's
//! aggregates are recomputed over the frame for each row (each group of peers), exactly,
//! so a restored run computes the same values as one that was never interrupted.
//! Snapshots and their records: `state` (a record per partition; once checkpoints are
//! taken, a bit per partition marks the ones changed since the previous snapshot, and
//! the keys of partitions freed since are kept, so that a checkpoint writes only those).
//!
//! Beyond the memory budget (`[pipeline] state_memory_mib`, [`OverAggregate::with_spill`])
//! each partition's bytes count in the worker's space, and when a batch or a watermark
//! ends over budget the partitions that wait for nothing (no pending row, and no RANGE
//! history whose expiry is due: an unbounded frame's running accumulators, a `ROWS n`
//! frame's last rows) and that no row reached since the clock's hand passed them are
//! evicted whole to `crate::cold` runs in their checkpoint record encoding; the
//! partition's next row reads it back. A partition waiting for the watermark stays in
//! memory: its rows are the ones the watermark will emit.

mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use hashbrown::HashTable;
use sluice_runtime::{Operator, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, SluiceError, TimestampMs};

use crate::aggregate::{AggregateFunction, AggregateSpec, is_float, is_text};
use crate::cold::{ColdStore, FROM_COLD, Keys, RECENT};
use crate::counter::LazyCounter;
use crate::partition::placement_hash;
use crate::spill::SpillSpace;

pub use state::OVER_STATE_VERSION;

/// The largest `n` of `ROWS n PRECEDING`; larger frames are refused when planned.
pub const OVER_ROWS_MAX: usize = 100_000;

/// The frame of every aggregate of one OVER window (`… AND CURRENT ROW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverFrame {
    /// `ROWS BETWEEN n PRECEDING` (None: `UNBOUNDED PRECEDING`).
    Rows(Option<usize>),
    /// `RANGE BETWEEN d PRECEDING`, `d` in milliseconds (None: `UNBOUNDED PRECEDING`).
    Range(Option<i64>),
}

impl OverFrame {
    fn unbounded(self) -> bool {
        matches!(self, OverFrame::Rows(None) | OverFrame::Range(None))
    }
}

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct OverSpec {
    /// The input column of the event time (a TIMESTAMP).
    pub time: usize,
    /// Input columns of `PARTITION BY` (none: one partition).
    pub partition: Vec<usize>,
    /// The first `passthrough` input columns are the output's first columns.
    pub passthrough: usize,
    /// COUNT(*), COUNT, SUM, MIN, MAX or AVG, without FILTER.
    pub aggregates: Vec<AggregateSpec>,
    pub frame: OverFrame,
    /// The passthrough columns, then one column per aggregate.
    pub output: SchemaRef,
    /// Most rows per output batch.
    pub batch_size: usize,
}

/// An argument value, as aggregated.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
    Text(Box<str>),
}

/// How an aggregate's argument is read (and what its values may be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// COUNT(*): no value.
    None,
    Int,
    Float,
    Text,
}

impl Kind {
    fn admits(self, value: &Value) -> bool {
        matches!(
            (self, value),
            (_, Value::Null)
                | (Kind::Int, Value::Int(_))
                | (Kind::Float, Value::Float(_))
                | (Kind::Text, Value::Text(_))
        )
    }
}

/// One aggregate's accumulator; the fields a function does not use stay at their start.
#[derive(Debug, Clone, PartialEq)]
struct Accumulator {
    /// Rows (COUNT(*)), non-null values (COUNT, SUM, AVG).
    count: i64,
    /// The sum of integer values (SUM and AVG of integers; SUM wraps as a BIGINT).
    int: i128,
    /// The sum of float values.
    float: f64,
    /// MIN or MAX so far.
    best: Value,
}

impl Accumulator {
    const EMPTY: Accumulator = Accumulator { count: 0, int: 0, float: 0.0, best: Value::Null };

    fn update(&mut self, function: AggregateFunction, value: &Value) {
        match (function, value) {
            (AggregateFunction::CountRows, _) => self.count = self.count.saturating_add(1),
            (_, Value::Null) => {}
            (AggregateFunction::Count | AggregateFunction::CountDistinct, _) => {
                self.count = self.count.saturating_add(1);
            }
            (AggregateFunction::Min | AggregateFunction::Max, value) => {
                let max = function == AggregateFunction::Max;
                let replace = match (&self.best, value) {
                    (Value::Null, _) => true,
                    (Value::Int(current), Value::Int(new)) => {
                        if max {
                            new > current
                        } else {
                            new < current
                        }
                    }
                    (Value::Float(current), Value::Float(new)) => {
                        if max {
                            new > current
                        } else {
                            new < current
                        }
                    }
                    (Value::Text(current), Value::Text(new)) => {
                        if max {
                            new > current
                        } else {
                            new < current
                        }
                    }
                    _ => false,
                };
                if replace {
                    self.best = value.clone();
                }
            }
            (_, value) => {
                self.count = self.count.saturating_add(1);
                match value {
                    Value::Int(v) => self.int = self.int.wrapping_add(i128::from(*v)),
                    Value::Float(v) => self.float += v,
                    _ => {}
                }
            }
        }
    }

    fn finish(&self, function: AggregateFunction, kind: Kind) -> Value {
        match function {
            AggregateFunction::CountRows | AggregateFunction::Count | AggregateFunction::CountDistinct => {
                Value::Int(self.count)
            }
            AggregateFunction::Min | AggregateFunction::Max => self.best.clone(),
            _ if self.count <= 0 => Value::Null,
            AggregateFunction::Sum if kind == Kind::Float => Value::Float(self.float),
            // SUM of integers wraps as a BIGINT does.
            AggregateFunction::Sum => Value::Int(self.int as i64),
            AggregateFunction::Avg if kind == Kind::Float => Value::Float(self.float / self.count as f64),
            // AVG of integers is an integer, truncated toward zero (Flink's).
            AggregateFunction::Avg => Value::Int((self.int / i128::from(self.count)) as i64),
        }
    }
}

/// One partition's rows and frame state.
#[derive(Debug, Clone)]
struct Partition {
    key: Box<[u8]>,
    hash: u64,
    /// Rows not emitted yet, by (time, arrival): whole rows in the key encoding.
    pending: BTreeMap<(TimestampMs, u64), Box<[u8]>>,
    /// Bounded frames: emitted rows a later frame may still hold, oldest first, as
    /// (time, one argument value per aggregate).
    history: VecDeque<(TimestampMs, Vec<Value>)>,
    /// Unbounded frames: one running accumulator per aggregate (empty otherwise).
    running: Vec<Accumulator>,
}

/// A row the watermark released: its time and the whole row in the key encoding.
type Ready = (TimestampMs, Box<[u8]>);

/// The memory a pending row takes besides its bytes (a tree entry and its box), about.
const PENDING_ROW_BYTES: usize = 64;

/// The memory partition `partition` takes, about: its key, each pending row, each
/// history row (a text value counted as 32 bytes), each running accumulator.
fn partition_bytes(partition: &Partition) -> usize {
    const PARTITION_BYTES: usize = 160;
    const VALUE_BYTES: usize = 32;
    let pending: usize = partition.pending.values().map(|row| row.len() + PENDING_ROW_BYTES).sum();
    let history: usize = partition.history.iter().map(|(_, values)| 32 + values.len() * VALUE_BYTES).sum();
    PARTITION_BYTES + partition.key.len() + pending + history + partition.running.len() * 64
}

/// Whether a partition of `frame` holding `pending` rows and `history` waits for the
/// watermark: a pending row, or a RANGE frame's history, has an entry in `due`.
fn waits<P, H>(frame: OverFrame, pending: &BTreeMap<(TimestampMs, u64), P>, history: &VecDeque<H>) -> bool {
    !pending.is_empty() || (matches!(frame, OverFrame::Range(Some(_))) && !history.is_empty())
}

/// Partitions beyond the memory budget ([`crate::cold`]): where they go, and what the
/// operator keeps to count, choose and find them.
struct Spilling {
    store: ColdStore,
    /// Per partition id: [`RECENT`], [`FROM_COLD`] and its age (`crate::cold::passes`),
    /// and its bytes as counted in the space.
    marks: Vec<u8>,
    counted: Vec<usize>,
    /// The clock's hand: the next partition id it looks at.
    hand: usize,
    /// Partitions evicted while changed since the previous snapshot: the next delta
    /// writes them again from their run.
    evicted_dirty: Keys,
    /// Partitions freed from memory whose older copy may still be in a run: the next run
    /// writes their deletes.
    dropped: Keys,
}

/// See the module documentation.
pub struct OverAggregate {
    spec: OverSpec,
    kinds: Vec<Kind>,
    partition_encoder: KeyEncoder,
    row_encoder: KeyEncoder,
    /// Partitions by id; a freed id is reused.
    partitions: Vec<Option<Partition>>,
    free: Vec<u32>,
    index: HashTable<u32>,
    /// (time, partition) for each pending row's time, and for a RANGE frame's oldest
    /// history row the time past which it expires: the partitions a watermark concerns.
    due: BTreeSet<(TimestampMs, u32)>,
    next_arrival: u64,
    watermark: TimestampMs,
    late_rows: Arc<AtomicU64>,
    vnodes: u32,
    /// For snapshots (`state`): per partition id a bit, changed since the previous
    /// snapshot, and the ids marked (each once while its bit is set); the keys of
    /// partitions freed since; whether changes are kept (from the first snapshot or a
    /// restore on: a run without checkpoints keeps none).
    changed: crate::changed::ChangedIds,
    freed: Vec<Box<[u8]>>,
    tracking: bool,
    cold: Option<Spilling>,
    /// What the last watermark (or the end) released and is not emitted yet.
    emitting: Option<Emitting>,
}

/// The rows a watermark (or the end) released, still to emit in parts.
struct Emitting {
    /// The watermark (None: the end): each partition's pending rows at or below it.
    until: Option<TimestampMs>,
    /// The partitions still to emit, in id order.
    ids: std::collections::VecDeque<u32>,
    /// What goes out after them: the watermark or end-of-data.
    then: Message,
}

/// The index's hash of a placement hash (see the window aggregate's).
fn table_hash(placement: u64) -> u64 {
    (placement ^ (placement >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Values of one argument column of a batch, cast once.
enum Column {
    None,
    Count(ArrayRef),
    Int(Int64Array),
    Float(arrow::array::Float64Array),
    Text(StringArray),
}

impl Column {
    fn value(&self, row: usize) -> Value {
        match self {
            Column::None => Value::Null,
            Column::Count(array) => {
                if array.is_valid(row) {
                    Value::Int(1)
                } else {
                    Value::Null
                }
            }
            Column::Int(values) if values.is_valid(row) => Value::Int(values.value(row)),
            Column::Float(values) if values.is_valid(row) => Value::Float(values.value(row)),
            Column::Text(values) if values.is_valid(row) => Value::Text(values.value(row).into()),
            _ => Value::Null,
        }
    }
}

/// The event times of `column` in milliseconds.
fn times(column: &ArrayRef) -> Result<Int64Array, SluiceError> {
    let millis = cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    Ok(cast(&millis, &DataType::Int64)?.as_primitive::<Int64Type>().clone())
}

impl OverAggregate {
    /// `input` is the schema of the rows the operator receives; `vnodes` the pipeline's.
    pub fn new(
        spec: OverSpec,
        input: &SchemaRef,
        late_rows: Arc<AtomicU64>,
        vnodes: u32,
    ) -> Result<OverAggregate, SluiceError> {
        if let OverFrame::Rows(Some(n)) = spec.frame {
            assert!(n <= OVER_ROWS_MAX, "the planner bounds ROWS n PRECEDING");
        }
        assert!(spec.passthrough <= input.fields().len(), "passthrough columns are input columns");
        let mut kinds = Vec::with_capacity(spec.aggregates.len());
        for aggregate in &spec.aggregates {
            assert!(aggregate.filter.is_none(), "the planner refuses FILTER in OVER aggregates");
            let argument = aggregate.argument.map(|c| input.field(c).data_type());
            kinds.push(match (aggregate.function, argument) {
                (AggregateFunction::CountRows, _) | (_, None) => Kind::None,
                (AggregateFunction::CountDistinct, _) => {
                    return Err(SluiceError::internal(
                        "over.aggregate",
                        "COUNT(DISTINCT) OVER is refused when planned",
                    ));
                }
                (AggregateFunction::Count, _) => Kind::Int,
                (_, Some(t)) if is_float(t) => Kind::Float,
                (AggregateFunction::Min | AggregateFunction::Max, Some(t)) if is_text(t) => Kind::Text,
                _ => Kind::Int,
            });
        }
        let types = |columns: &mut dyn Iterator<Item = usize>| -> Vec<DataType> {
            columns.map(|c| input.field(c).data_type().clone()).collect()
        };
        let partition_encoder = KeyEncoder::new(types(&mut spec.partition.iter().copied()))?;
        let row_encoder = KeyEncoder::new(types(&mut (0..input.fields().len())))?;
        Ok(OverAggregate {
            spec,
            kinds,
            partition_encoder,
            row_encoder,
            partitions: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            due: BTreeSet::new(),
            next_arrival: 0,
            watermark: i64::MIN,
            late_rows,
            vnodes,
            changed: crate::changed::ChangedIds::default(),
            freed: Vec::new(),
            tracking: false,
            cold: None,
            emitting: None,
        })
    }

    /// Counts the partitions in `space`'s memory budget and evicts them to disk beyond
    /// it; `written` counts the bytes written there.
    pub fn with_spill(mut self, space: Arc<SpillSpace>, written: LazyCounter) -> OverAggregate {
        self.cold = Some(Spilling {
            store: ColdStore::new(space, written),
            marks: Vec::new(),
            counted: Vec::new(),
            hand: 0,
            evicted_dirty: Keys::default(),
            dropped: Keys::default(),
        });
        self
    }

    /// Counts partition `id`'s bytes as `bytes` (its whole size, or its size plus what
    /// was added since it was counted).
    fn count(&mut self, id: u32, bytes: impl FnOnce(usize) -> usize) {
        let Some(cold) = self.cold.as_mut() else { return };
        let id = id as usize;
        if cold.counted.len() <= id {
            cold.counted.resize(id + 1, 0);
            cold.marks.resize(id + 1, 0);
        }
        let before = cold.counted[id];
        let after = bytes(before);
        cold.store.charge(after);
        cold.store.release(before);
        cold.counted[id] = after;
    }

    /// Counts partition `id` again from what it holds.
    fn recount(&mut self, id: u32) {
        if self.cold.is_none() {
            return;
        }
        let Some(bytes) = self.partitions[id as usize].as_ref().map(partition_bytes) else { return };
        self.count(id, |_| bytes);
    }

    /// Sets `bits` in partition `id`'s marks.
    fn set_mark(&mut self, id: u32, bits: u8) {
        self.count(id, |before| before);
        if let Some(cold) = self.cold.as_mut() {
            cold.marks[id as usize] |= bits;
        }
    }

    /// Whether partition `id` waits for nothing: no pending row and no RANGE history
    /// (no entry of `due` names it), so it may leave memory.
    fn evictable(&self, id: usize) -> bool {
        self.partitions[id]
            .as_ref()
            .is_some_and(|partition| !waits(self.spec.frame, &partition.pending, &partition.history))
    }

    /// The id of the partition of `key` (placement hash `hash`): in memory, else read
    /// back from the cold runs, else added empty.
    fn partition_of(&mut self, key: &[u8], hash: u64) -> Result<u32, SluiceError> {
        if let Some(id) = self.find(key, hash) {
            return Ok(id);
        }
        let Some(cold) = self.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) else {
            return Ok(self.add(key, hash));
        };
        if cold.dropped.remove(key) {
            // Freed since it was read back: its run's copy is stale.
            let id = self.add(key, hash);
            self.set_mark(id, FROM_COLD);
            return Ok(id);
        }
        let vnode = sluice_types::vnode::of_hash(hash, self.vnodes);
        let Some(found) = cold.store.runs().find(vnode, key, hash, &|_| false)? else {
            return Ok(self.add(key, hash));
        };
        let dirty = cold.evicted_dirty.remove(key);
        let (pending, history, running) = state::read_partition(self, &found.value)?;
        if waits(self.spec.frame, &pending, &history) {
            return Err(SluiceError::internal("over.cold", "an evicted partition was waiting for the watermark"));
        }
        let id = self.add(key, hash);
        let partition = self.partitions[id as usize].as_mut().expect("just added");
        partition.history = history;
        if !running.is_empty() {
            partition.running = running;
        }
        self.set_mark(id, FROM_COLD);
        self.recount(id);
        if dirty {
            // Its changes since the previous snapshot are in no checkpoint yet.
            self.mark(id);
        }
        Ok(id)
    }

    /// When the space is over its budget, evicts partitions that wait for nothing and
    /// that no row reached since the clock's hand last passed them, enough to bring the
    /// space an eighth of its budget under it (or all this instance may give), into one
    /// cold run. The hand looks at [`SCAN_MAX`] ids at most per call.
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        const SCAN_MAX: usize = 1 << 17;
        let Some(cold) = self.cold.as_mut() else { return Ok(()) };
        let space = Arc::clone(cold.store.space());
        if self.partitions.is_empty() {
            return Ok(());
        }
        let Some(goal) = cold.store.eviction_goal() else { return Ok(()) };
        let goal = goal.min(cold.store.entry_bytes());
        let slots = self.partitions.len();
        let (mut chosen, mut freed) = (Vec::new(), 0usize);
        let mut looked = 0;
        for _ in 0..slots.min(SCAN_MAX) {
            if freed >= goal {
                break;
            }
            looked += 1;
            let id = self.cold.as_ref().expect("spilling").hand % slots;
            let evictable = self.evictable(id);
            let cold = self.cold.as_mut().expect("spilling");
            cold.hand = id + 1;
            if !evictable || id >= cold.counted.len() {
                continue;
            }
            if !crate::cold::passes(&mut cold.marks[id], cold.counted[id], space.budget()) {
                continue;
            }
            freed += cold.counted[id];
            chosen.push(id as u32);
        }
        if chosen.is_empty() {
            self.cold.as_mut().expect("spilling").store.evicted(0, goal, looked, slots);
            return Ok(());
        }
        let (vnodes, no_keys) = (self.vnodes, self.spec.partition.is_empty());
        let mut records = crate::records::Records::new(Some(space.dir()));
        for &id in &chosen {
            let partition = self.partitions[id as usize].as_ref().expect("a chosen partition");
            let value = |bytes: &mut Vec<u8>| state::write_partition(partition, bytes);
            let vnode = sluice_types::vnode::of_hash(partition.hash, vnodes);
            records.add(vnode, |k| k.extend_from_slice(&partition.key), Some(&value));
        }
        let cold = self.cold.as_mut().expect("spilling");
        for key in cold.dropped.drain() {
            let vnode = sluice_types::vnode::of_hash(placement_hash(no_keys, &key), vnodes);
            records.add(vnode, |k| k.extend_from_slice(&key), None);
        }
        let hash_of = move |key: &[u8]| Some(placement_hash(no_keys, key));
        cold.store.add(records, chosen.len(), freed, hash_of)?;
        for id in chosen {
            let partition = self.partitions[id as usize].take().expect("a chosen partition");
            let table = table_hash(partition.hash);
            if let Ok(entry) = self.index.find_entry(table, |&p| p == id) {
                entry.remove();
            }
            self.free.push(id);
            let cold = self.cold.as_mut().expect("spilling");
            cold.store.release(std::mem::take(&mut cold.counted[id as usize]));
            cold.marks[id as usize] = 0;
            if self.tracking && self.changed.contains(id) {
                // Its changes go with the next delta, read back from its run.
                self.changed.unmark(id);
                cold.evicted_dirty.insert(partition.key.to_vec());
            }
        }
        self.cold.as_mut().expect("spilling").store.evicted(freed, goal, looked, slots);
        Ok(())
    }

    /// Marks partition `id` changed since the previous snapshot.
    fn mark(&mut self, id: u32) {
        if !self.tracking {
            return;
        }
        self.changed.mark(id);
    }

    /// Forgets what changed (a snapshot took it, or a restore loaded the runs); changes
    /// are kept from now on.
    fn clear_changes(&mut self) {
        self.changed.clear();
        self.freed.clear();
        self.tracking = true;
    }

    /// Each aggregate's argument column of `columns` (the input's), read as aggregated.
    fn argument_columns(&self, columns: &[ArrayRef]) -> Result<Vec<Column>, SluiceError> {
        let mut read = Vec::with_capacity(self.spec.aggregates.len());
        for (aggregate, kind) in self.spec.aggregates.iter().zip(&self.kinds) {
            let Some(column) = aggregate.argument else {
                read.push(Column::None);
                continue;
            };
            let array = &columns[column];
            read.push(match (aggregate.function, kind) {
                (AggregateFunction::CountRows, _) | (_, Kind::None) => Column::None,
                (AggregateFunction::Count, _) => Column::Count(Arc::clone(array)),
                (_, Kind::Float) => {
                    Column::Float(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
                }
                (_, Kind::Text) => Column::Text(cast(array, &DataType::Utf8)?.as_string::<i32>().clone()),
                (_, Kind::Int) => Column::Int(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone()),
            });
        }
        Ok(read)
    }

    /// The id of the partition of `key` (placement hash `hash`) in memory.
    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let partitions = &self.partitions;
        let found = self.index.find(table_hash(hash), |&id| {
            partitions[id as usize].as_ref().is_some_and(|p| crate::same_bytes(&p.key, key))
        });
        found.copied()
    }

    /// The id of the partition of `key` (placement hash `hash`) in memory, added empty
    /// if there is none.
    fn find_or_add(&mut self, key: &[u8], hash: u64) -> u32 {
        match self.find(key, hash) {
            Some(id) => id,
            None => self.add(key, hash),
        }
    }

    /// Adds an empty partition of `key` (placement hash `hash`), not in memory yet.
    fn add(&mut self, key: &[u8], hash: u64) -> u32 {
        let table = table_hash(hash);
        let running =
            if self.spec.frame.unbounded() { vec![Accumulator::EMPTY; self.spec.aggregates.len()] } else { Vec::new() };
        let partition =
            Partition { key: key.into(), hash, pending: BTreeMap::new(), history: VecDeque::new(), running };
        let id = match self.free.pop() {
            Some(id) => {
                self.partitions[id as usize] = Some(partition);
                id
            }
            None => {
                assert!(self.partitions.len() < u32::MAX as usize, "fewer than 2^32 partitions per thread");
                self.partitions.push(Some(partition));
                (self.partitions.len() - 1) as u32
            }
        };
        let partitions = &self.partitions;
        self.index.insert_unique(table, id, |&p| {
            table_hash(partitions[p as usize].as_ref().expect("indexed partitions exist").hash)
        });
        id
    }

    /// Frees partition `id`: it holds nothing a later row needs.
    fn remove(&mut self, id: u32) {
        let Some(partition) = self.partitions[id as usize].take() else { return };
        let table = table_hash(partition.hash);
        if let Ok(entry) = self.index.find_entry(table, |&p| p == id) {
            entry.remove();
        }
        self.free.push(id);
        if let Some(cold) = self.cold.as_mut().filter(|cold| (id as usize) < cold.counted.len()) {
            cold.store.release(std::mem::take(&mut cold.counted[id as usize]));
            if std::mem::take(&mut cold.marks[id as usize]) & FROM_COLD != 0 {
                cold.dropped.insert(partition.key.to_vec());
            }
        }
        if self.tracking {
            // A partition that takes the id later is marked when it changes.
            self.changed.unmark(id);
            self.freed.push(partition.key);
        }
    }

    /// Starts emitting every pending row at or below `watermark` (all of them for None),
    /// then `then`, and emits the first part.
    fn release(
        &mut self,
        watermark: Option<TimestampMs>,
        then: Message,
        out: &mut Vec<Message>,
    ) -> Result<(), SluiceError> {
        assert!(self.emitting.is_none(), "a watermark while the previous one's output is held");
        let ids = self.take_due(watermark).into();
        self.emitting = Some(Emitting { until: watermark, ids, then });
        self.emit_part(out)
    }

    /// Emits the next part of what was released: whole partitions until a batch's rows,
    /// and after the last the watermark (once what is over the budget left) or the end.
    fn emit_part(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let Some(emitting) = self.emitting.as_mut() else { return Ok(()) };
        let bound = emitting.until.and_then(|w| w.checked_add(1)).map(|next| (next, 0));
        let (mut part, mut rows) = (Vec::new(), 0);
        while rows < self.spec.batch_size.max(1) {
            let Some(id) = emitting.ids.pop_front() else { break };
            if let Some(partition) = self.partitions[id as usize].as_ref() {
                rows += match bound {
                    Some(bound) => partition.pending.range(..bound).count(),
                    None => partition.pending.len(),
                };
            }
            part.push(id);
        }
        let until = emitting.until;
        self.emit_partitions(&part, until, out)?;
        if self.emitting.as_ref().is_some_and(|emitting| emitting.ids.is_empty()) {
            let Emitting { until, then, .. } = self.emitting.take().expect("checked above");
            if until.is_some() {
                self.evict_over_budget()?;
            }
            out.push(then);
        }
        Ok(())
    }

    /// The partitions with pending rows at or below `watermark` (all for None), in id
    /// order, taken from the due order.
    fn take_due(&mut self, watermark: Option<TimestampMs>) -> Vec<u32> {
        let mut ids: Vec<u32> = Vec::new();
        match watermark {
            None => ids.extend(self.due.iter().map(|(_, id)| *id)),
            Some(watermark) => {
                while let Some(&(time, id)) = self.due.first() {
                    if time > watermark {
                        break;
                    }
                    self.due.pop_first();
                    ids.push(id);
                }
            }
        }
        if watermark.is_none() {
            self.due.clear();
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Emits the pending rows at or below `watermark` (all of them for None) of the
    /// partitions `ids`, and frees RANGE history the watermark expired.
    fn emit_partitions(
        &mut self,
        ids: &[u32],
        watermark: Option<TimestampMs>,
        out: &mut Vec<Message>,
    ) -> Result<(), SluiceError> {
        // Each partition's ready rows, in time then arrival order.
        let mut ready: Vec<(u32, Vec<Ready>)> = Vec::new();
        for &id in ids {
            let Some(partition) = self.partitions[id as usize].as_mut() else { continue };
            let rest = match watermark.and_then(|w| w.checked_add(1)) {
                Some(next) => partition.pending.split_off(&(next, 0)),
                None => BTreeMap::new(),
            };
            let taken = std::mem::replace(&mut partition.pending, rest);
            ready.push((id, taken.into_iter().map(|((time, _), row)| (time, row)).collect()));
        }
        let count: usize = ready.iter().map(|(_, rows)| rows.len()).sum();
        let mut results: Vec<Vec<Value>> = vec![Vec::with_capacity(count); self.spec.aggregates.len()];
        let mut columns = Vec::new();
        if count > 0 {
            columns = self.row_encoder.decode(ready.iter().flat_map(|(_, rows)| rows.iter().map(|(_, row)| &**row)))?;
            let arguments = self.argument_columns(&columns)?;
            let mut offset = 0;
            for (id, rows) in &ready {
                let values: Vec<Vec<Value>> = (offset..offset + rows.len())
                    .map(|row| arguments.iter().map(|column| column.value(row)).collect())
                    .collect();
                let times: Vec<TimestampMs> = rows.iter().map(|(time, _)| *time).collect();
                let partition = self.partitions[*id as usize].as_mut().expect("ready partitions exist");
                compute(&self.spec, &self.kinds, partition, &times, values, &mut results);
                offset += rows.len();
            }
        }
        // Free what no later row needs; a RANGE partition's oldest row expires later.
        for &id in ids {
            let Some(partition) = self.partitions[id as usize].as_mut() else { continue };
            if let (OverFrame::Range(Some(preceding)), Some(watermark)) = (self.spec.frame, watermark) {
                // Rows still to come have times above the watermark.
                let oldest_needed = watermark.saturating_add(1).saturating_sub(preceding);
                while partition.history.front().is_some_and(|(time, _)| *time < oldest_needed) {
                    partition.history.pop_front();
                }
            }
            if watermark.is_none() {
                partition.history.clear();
            }
            if let (OverFrame::Range(Some(preceding)), Some((oldest, _))) = (self.spec.frame, partition.history.front())
            {
                self.due.insert((oldest.saturating_add(preceding), id));
            }
            let idle = partition.pending.is_empty() && partition.history.is_empty();
            if idle && !self.spec.frame.unbounded() {
                self.remove(id);
            } else {
                self.mark(id);
                self.recount(id);
            }
        }
        if count > 0 {
            self.build(columns, results, out)?;
        }
        Ok(())
    }

    /// Output batches: the decoded rows' passthrough columns and the aggregates.
    fn build(
        &self,
        decoded: Vec<ArrayRef>,
        results: Vec<Vec<Value>>,
        out: &mut Vec<Message>,
    ) -> Result<(), SluiceError> {
        let mut columns: Vec<ArrayRef> = decoded.into_iter().take(self.spec.passthrough).collect();
        for (values, kind) in results.into_iter().zip(&self.kinds) {
            let column: ArrayRef = match kind {
                Kind::Text => Arc::new(StringArray::from_iter(values.iter().map(|v| match v {
                    Value::Text(text) => Some(&**text),
                    _ => None,
                }))),
                Kind::Float => Arc::new(Float64Array::from_iter(values.iter().map(|v| match v {
                    Value::Float(value) => Some(*value),
                    _ => None,
                }))),
                _ => Arc::new(Int64Array::from_iter(values.iter().map(|v| match v {
                    Value::Int(value) => Some(*value),
                    _ => None,
                }))),
            };
            columns.push(column);
        }
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?;
        let count = rows.num_rows();
        let mut offset = 0;
        while offset < count {
            let length = self.spec.batch_size.max(1).min(count - offset);
            out.push(Message::Data(Batch::inserts(rows.slice(offset, length))));
            offset += length;
        }
        Ok(())
    }
}

/// The aggregates of one partition's ready rows (`times` ascending, ties in arrival
/// order; `values` one argument value per aggregate per row), appended to `results`
/// (one list per aggregate); updates the partition's history or running accumulators.
fn compute(
    spec: &OverSpec,
    kinds: &[Kind],
    partition: &mut Partition,
    times: &[TimestampMs],
    values: Vec<Vec<Value>>,
    results: &mut [Vec<Value>],
) {
    let functions: Vec<AggregateFunction> = spec.aggregates.iter().map(|a| a.function).collect();
    let finish = |accumulators: &[Accumulator], results: &mut [Vec<Value>], copies: usize| {
        for ((accumulator, (function, kind)), result) in
            accumulators.iter().zip(functions.iter().zip(kinds)).zip(results.iter_mut())
        {
            let value = accumulator.finish(*function, *kind);
            result.extend(std::iter::repeat_n(value, copies));
        }
    };
    let fold = |history: &VecDeque<(TimestampMs, Vec<Value>)>| -> Vec<Accumulator> {
        let mut accumulators = vec![Accumulator::EMPTY; functions.len()];
        for (_, row) in history {
            for ((accumulator, function), value) in accumulators.iter_mut().zip(&functions).zip(row) {
                accumulator.update(*function, value);
            }
        }
        accumulators
    };
    // Rows of equal time: one group for RANGE (peers), one row each for ROWS.
    let peers = matches!(spec.frame, OverFrame::Range(_));
    let mut rows = values.into_iter().zip(times.iter().copied()).peekable();
    while let Some((first, time)) = rows.next() {
        let mut group = vec![first];
        while peers && rows.peek().is_some_and(|(_, next)| *next == time) {
            group.push(rows.next().expect("peeked").0);
        }
        let copies = group.len();
        match spec.frame {
            OverFrame::Rows(None) | OverFrame::Range(None) => {
                for row in &group {
                    for ((accumulator, function), value) in partition.running.iter_mut().zip(&functions).zip(row) {
                        accumulator.update(*function, value);
                    }
                }
                finish(&partition.running, results, copies);
            }
            OverFrame::Rows(Some(preceding)) => {
                partition.history.extend(group.into_iter().map(|row| (time, row)));
                finish(&fold(&partition.history), results, copies);
                while partition.history.len() > preceding {
                    partition.history.pop_front();
                }
            }
            OverFrame::Range(Some(preceding)) => {
                partition.history.extend(group.into_iter().map(|row| (time, row)));
                let oldest = time.saturating_sub(preceding);
                while partition.history.front().is_some_and(|(t, _)| *t < oldest) {
                    partition.history.pop_front();
                }
                finish(&fold(&partition.history), results, copies);
            }
        }
    }
}

impl Operator for OverAggregate {
    fn name(&self) -> &str {
        "over_aggregate"
    }

    fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(batch.is_append_only(), "the planner refuses OVER aggregates over an updating stream");
        assert!(self.emitting.is_none(), "rows while a watermark's output is held");
        let rows = &batch.rows;
        let times = times(rows.column(self.spec.time))?;
        let partition_columns: Vec<ArrayRef> =
            self.spec.partition.iter().map(|&c| Arc::clone(rows.column(c))).collect();
        let mut keys = KeyRows::default();
        self.partition_encoder.encode(&partition_columns, &mut keys)?;
        let mut encoded = KeyRows::default();
        self.row_encoder.encode(rows.columns(), &mut encoded)?;
        let mut late = 0u64;
        for row in 0..rows.num_rows() {
            if !times.is_valid(row) || times.value(row) <= self.watermark {
                late += 1;
                continue;
            }
            let time = times.value(row);
            // Without PARTITION BY all rows share the empty key (hash 0, vnode 0).
            let (key, hash): (&[u8], u64) =
                if self.spec.partition.is_empty() { (&[], 0) } else { (keys.row(row), keys.hash(row)) };
            let id = self.partition_of(key, hash)?;
            let arrival = self.next_arrival;
            self.next_arrival = self.next_arrival.saturating_add(1);
            let partition = self.partitions[id as usize].as_mut().expect("just found");
            let row_bytes = encoded.row(row);
            partition.pending.insert((time, arrival), row_bytes.into());
            self.due.insert((time, id));
            self.mark(id);
            if let Some(cold) = self.cold.as_ref() {
                // Counted whole when new, else by what the row adds.
                let counted = cold.counted.get(id as usize).copied().unwrap_or(0);
                let bytes = match counted {
                    0 => self.partitions[id as usize].as_ref().map_or(0, partition_bytes),
                    counted => counted + row_bytes.len() + PENDING_ROW_BYTES,
                };
                self.count(id, |_| bytes);
                self.set_mark(id, RECENT);
            }
        }
        if late > 0 {
            self.late_rows.fetch_add(late, Ordering::Relaxed);
        }
        self.evict_over_budget()
    }

    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if watermark > self.watermark {
            self.watermark = watermark;
            return self.release(Some(watermark), Message::Watermark(watermark), out);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.release(None, Message::EndOfData, out)
    }

    fn has_more(&self) -> bool {
        self.emitting.is_some()
    }

    fn on_resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.emitting.is_some(), "over_aggregate resumed without held output");
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
