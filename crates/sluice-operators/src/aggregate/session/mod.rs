//! The session window aggregate: Flink's `SESSION` windows, merged per key as rows arrive.
//!
//! Input rows carry a proto-window `[ts, ts + gap)` in `window_start` / `window_end` (from
//! window assignment), the key columns and the aggregate arguments. Per key the operator
//! keeps its open sessions, disjoint intervals each with one partial result per aggregate.
//! A row's proto-window merges with every open session of its key that it intersects
//! (touching counts: `start <= other.end && end >= other.start`, so rows exactly `gap`
//! apart share a session, as in Flink); the merged session takes the union of the
//! intervals and the merge of the partial results. A session is emitted once, when the
//! watermark reaches its `window_end - 1`, and then forgotten; end of input emits every
//! open session. What a watermark (or the end) closes goes out a batch at a time, each
//! batch a part of its own ([`Operator::has_more`]), the watermark with the last.
//!
//! Late rows: a row whose merged session would already be due (`end - 1 <=` the
//! watermark) is counted and dropped; a row older than the watermark that still merges
//! into a session not yet due is taken (it changes nothing already emitted).
//!
//! Bound: state is the open sessions; each is freed when the watermark passes its end.
//!
//! State is per key, placed by the key's hash (the exchange's) in its vnode; once
//! checkpoints are taken, the keys whose sessions changed or all closed since the
//! previous snapshot are kept too, so that a checkpoint writes only those: see `state`.
//!
//! Beyond the memory budget (`[pipeline] state_memory_mib`, [`SessionAggregate::with_spill`])
//! each key's sessions count in the worker's space, and when a batch ends over budget
//! the keys no row touched since the clock's hand passed them are evicted whole to
//! `crate::cold` runs in their checkpoint record encoding; a key's next row, or its
//! session falling due, reads it back. The due order (a session's end and its key) stays
//! in memory, so the watermark finds evicted sessions without reading the runs.

mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
};
use arrow::compute::cast;
use arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use indexmap::IndexMap;
use sluice_runtime::{Operator, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, SluiceError, TimestampMs};

use super::{AggregateFunction, Argument, GroupColumn, WindowAggregateSpec, is_float, is_text};
use crate::cold::{ColdStore, FROM_COLD, Keys, RECENT};
use crate::counter::LazyCounter;
use crate::partition::placement_hash;
use crate::spill::SpillSpace;

pub use state::SESSION_STATE_VERSION;

/// One aggregate's partial result over the rows of one session.
#[derive(Debug, Clone, PartialEq)]
enum Partial {
    Count(i64),
    SumInt(Option<i64>),
    SumFloat(Option<f64>),
    ExtremeInt(Option<i64>),
    ExtremeFloat(Option<f64>),
    ExtremeText(Option<String>),
    Avg(f64, i64),
    Distinct(BTreeSet<Box<[u8]>>),
}

/// The better of two optional values for MIN (`max` false) or MAX.
fn extreme<T: PartialOrd>(current: Option<T>, value: Option<T>, max: bool) -> Option<T> {
    match (current, value) {
        (Some(current), Some(value)) => Some(if super::beats(&value, &current, max) { value } else { current }),
        (current, value) => current.or(value),
    }
}

impl Partial {
    /// Adds row `row` of `argument`.
    fn update(&mut self, max: bool, argument: &Argument, row: usize) {
        match (self, argument) {
            (Partial::Count(count), Argument::None) => *count += 1,
            (Partial::Count(count), Argument::Int(values)) => *count += i64::from(values.is_valid(row)),
            (Partial::SumInt(sum), Argument::Int(values)) if values.is_valid(row) => {
                *sum = Some(sum.unwrap_or(0).wrapping_add(values.value(row)));
            }
            (Partial::SumFloat(sum), Argument::Float(values)) if values.is_valid(row) => {
                *sum = Some(sum.unwrap_or(0.0) + values.value(row));
            }
            (Partial::ExtremeInt(slot), Argument::Int(values)) if values.is_valid(row) => {
                *slot = extreme(*slot, Some(values.value(row)), max);
            }
            (Partial::ExtremeFloat(slot), Argument::Float(values)) if values.is_valid(row) => {
                *slot = extreme(*slot, Some(values.value(row)), max);
            }
            (Partial::ExtremeText(slot), Argument::Text(values)) if values.is_valid(row) => {
                *slot = extreme(slot.take(), Some(values.value(row).to_string()), max);
            }
            (Partial::Avg(sum, count), Argument::Float(values)) if values.is_valid(row) => {
                *sum += values.value(row);
                *count += 1;
            }
            (Partial::Distinct(set), Argument::Encoded(values, column)) if column.is_valid(row) => {
                let value = values.row(row);
                if !set.contains(value) {
                    set.insert(value.into());
                }
            }
            _ => {}
        }
    }

    /// Takes in `other`, the same aggregate's partial result over other rows.
    fn merge(&mut self, max: bool, other: Partial) {
        match (self, other) {
            (Partial::Count(a), Partial::Count(b)) => *a += b,
            (Partial::SumInt(a), Partial::SumInt(b)) => {
                *a = match (*a, b) {
                    (Some(a), Some(b)) => Some(a.wrapping_add(b)),
                    (a, b) => a.or(b),
                }
            }
            (Partial::SumFloat(a), Partial::SumFloat(b)) => {
                *a = match (*a, b) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                }
            }
            (Partial::ExtremeInt(a), Partial::ExtremeInt(b)) => *a = extreme(*a, b, max),
            (Partial::ExtremeFloat(a), Partial::ExtremeFloat(b)) => *a = extreme(*a, b, max),
            (Partial::ExtremeText(a), Partial::ExtremeText(b)) => *a = extreme(a.take(), b, max),
            (Partial::Avg(sum, count), Partial::Avg(other_sum, other_count)) => {
                *sum += other_sum;
                *count += other_count;
            }
            (Partial::Distinct(a), Partial::Distinct(b)) => a.extend(b),
            (a, b) => unreachable!("one aggregate's partials are of one kind: {a:?} and {b:?}"),
        }
    }
}

/// A batch's aggregate arguments and `FILTER (WHERE …)` conditions, one per aggregate.
struct Inputs {
    arguments: Vec<Argument>,
    filters: Vec<Option<BooleanArray>>,
}

/// One open session of a key: `[start, end)` and a partial result per aggregate.
#[derive(Debug, Clone, PartialEq)]
struct Session {
    start: TimestampMs,
    end: TimestampMs,
    partials: Vec<Partial>,
}

/// A key's open sessions (disjoint, not touching) and its placement hash.
#[derive(Debug, Clone, Default)]
struct KeySessions {
    hash: u64,
    sessions: Vec<Session>,
    /// Changed since the previous snapshot (its key is then in `SessionAggregate::changed`).
    changed: bool,
    /// Beyond the budget: [`RECENT`], [`FROM_COLD`] and its age (`crate::cold::passes`),
    /// and its bytes as counted in the space.
    marks: u8,
    bytes: usize,
}

/// The memory a key and its sessions take, about: the key (in the map and in the due
/// order), each session's bounds and partial results, a COUNT(DISTINCT) value
/// [`DISTINCT_VALUE_BYTES`] (a short value in a tree of boxed slices).
fn key_bytes(key: &[u8], sessions: &[Session]) -> usize {
    const KEY_OVERHEAD: usize = 96;
    const SESSION_OVERHEAD: usize = 64;
    const DISTINCT_VALUE_BYTES: usize = 56;
    let partial = |partial: &Partial| {
        std::mem::size_of::<Partial>()
            + match partial {
                Partial::Distinct(set) => set.len() * DISTINCT_VALUE_BYTES,
                Partial::ExtremeText(Some(text)) => text.len(),
                _ => 0,
            }
    };
    let sessions: usize = sessions
        .iter()
        .map(|session| SESSION_OVERHEAD + key.len() + session.partials.iter().map(partial).sum::<usize>())
        .sum();
    KEY_OVERHEAD + key.len() + sessions
}

/// Keys beyond the memory budget ([`crate::cold`]): where they go, and what the
/// aggregate keeps to choose and find them.
struct Spilling {
    store: ColdStore,
    /// The clock's hand: the next position in the key map it looks at.
    hand: usize,
    /// Keys evicted while changed since the previous snapshot: the next delta writes
    /// them again from their run.
    evicted_dirty: Keys,
    /// Keys dropped from memory (their sessions all closed) whose older copy may still
    /// be in a run: the next run writes their deletes.
    dropped: Keys,
}

/// See the module documentation. Its spec is the window aggregate's.
pub struct SessionAggregate {
    spec: WindowAggregateSpec,
    key_encoder: KeyEncoder,
    key_rows: KeyRows,
    distinct_encoders: Vec<Option<sluice_types::key::KeyEncoder>>,
    /// For each aggregate, whether it is MAX (MIN otherwise; unused by the others).
    maxes: Vec<bool>,
    /// The partials of an empty session.
    empty: Vec<Partial>,
    /// The keys in memory (an evicted key's sessions are in `cold`'s runs), in an order
    /// the eviction clock walks.
    keys: IndexMap<Box<[u8]>, KeySessions>,
    /// Every open session by `(end, key)`: the order they become due.
    due: BTreeSet<(TimestampMs, Box<[u8]>)>,
    watermark: TimestampMs,
    late_rows: Arc<AtomicU64>,
    vnodes: u32,
    /// For snapshots (`state`): the keys whose sessions changed since the previous
    /// snapshot (each listed once while its `changed` flag is up; a key listed may be
    /// gone since), the keys whose sessions all closed since, and whether changes are
    /// kept (from the first snapshot or a restore on: a run without checkpoints keeps
    /// none).
    changed: Vec<Box<[u8]>>,
    closed: Vec<Box<[u8]>>,
    tracking: bool,
    cold: Option<Spilling>,
    /// What the last watermark (or the end) closed and is not emitted yet: sessions due
    /// at the first, then the second (the watermark or end-of-data).
    emitting: Option<(TimestampMs, Message)>,
}

impl SessionAggregate {
    /// `input` is the schema of the rows the operator receives; `vnodes` the pipeline's.
    pub fn new(
        spec: WindowAggregateSpec,
        input: &SchemaRef,
        late_rows: Arc<AtomicU64>,
        vnodes: u32,
    ) -> Result<SessionAggregate, SluiceError> {
        let key_encoder = KeyEncoder::new(spec.keys.iter().map(|&k| input.field(k).data_type().clone()).collect())?;
        let distinct_encoders = super::distinct_encoders(&spec.aggregates, input)?;
        let maxes = spec.aggregates.iter().map(|a| a.function == AggregateFunction::Max).collect();
        let empty = spec
            .aggregates
            .iter()
            .map(|aggregate| {
                let argument = aggregate.argument.map(|column| input.field(column).data_type());
                match (aggregate.function, argument) {
                    (AggregateFunction::CountRows | AggregateFunction::Count, _) => Partial::Count(0),
                    (AggregateFunction::CountDistinct, _) => Partial::Distinct(BTreeSet::new()),
                    (AggregateFunction::Avg, _) => Partial::Avg(0.0, 0),
                    (AggregateFunction::Sum, Some(t)) if is_float(t) => Partial::SumFloat(None),
                    (AggregateFunction::Sum, _) => Partial::SumInt(None),
                    (_, Some(t)) if is_float(t) => Partial::ExtremeFloat(None),
                    (_, Some(t)) if is_text(t) => Partial::ExtremeText(None),
                    _ => Partial::ExtremeInt(None),
                }
            })
            .collect();
        Ok(SessionAggregate {
            spec,
            key_encoder,
            key_rows: KeyRows::default(),
            distinct_encoders,
            maxes,
            empty,
            keys: IndexMap::new(),
            due: BTreeSet::new(),
            watermark: i64::MIN,
            late_rows,
            vnodes,
            changed: Vec::new(),
            closed: Vec::new(),
            tracking: false,
            cold: None,
            emitting: None,
        })
    }

    /// Counts the keys' sessions in `space`'s memory budget and evicts them to disk
    /// beyond it; `written` counts the bytes written there.
    pub fn with_spill(mut self, space: Arc<SpillSpace>, written: LazyCounter) -> SessionAggregate {
        self.cold = Some(Spilling {
            store: ColdStore::new(space, written),
            hand: 0,
            evicted_dirty: Keys::default(),
            dropped: Keys::default(),
        });
        self
    }

    /// Counts the bytes of the sessions of `key` again, after they changed.
    fn recount(&mut self, key: &[u8]) {
        let Some(cold) = self.cold.as_mut() else { return };
        let Some(entry) = self.keys.get_mut(key) else { return };
        let bytes = key_bytes(key, &entry.sessions);
        cold.store.charge(bytes);
        cold.store.release(entry.bytes);
        entry.bytes = bytes;
    }

    /// Drops `key`, whose sessions all closed, from memory.
    fn drop_key(&mut self, key: &[u8]) {
        let Some(entry) = self.keys.swap_remove(key) else { return };
        if let Some(cold) = self.cold.as_mut() {
            cold.store.release(entry.bytes);
            if entry.marks & FROM_COLD != 0 {
                cold.dropped.insert(key.to_vec());
            }
        }
    }

    /// Makes sure the sessions of `key` (placement hash `hash`) are in memory if it has
    /// any: read back from the cold runs when evicted.
    fn load(&mut self, key: &[u8], hash: u64) -> Result<(), SluiceError> {
        if self.keys.contains_key(key) {
            return Ok(());
        }
        let Some(cold) = self.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) else { return Ok(()) };
        if cold.dropped.contains(key) {
            // Its sessions closed after it was read back: its run's copy is stale.
            return Ok(());
        }
        let vnode = sluice_types::vnode::of_hash(hash, self.vnodes);
        let Some(found) = cold.store.runs().find(vnode, key, hash, &|_| false)? else { return Ok(()) };
        let sessions = state::read_sessions(&self.empty, &found.value)?;
        let dirty = cold.evicted_dirty.remove(key);
        let bytes = key_bytes(key, &sessions);
        cold.store.charge(bytes);
        let changed = dirty && self.tracking;
        if changed {
            // Its changes since the previous snapshot are in no checkpoint yet.
            self.changed.push(key.into());
        }
        self.keys.insert(key.into(), KeySessions { hash, sessions, changed, marks: FROM_COLD, bytes });
        Ok(())
    }

    /// When the space is over its budget, evicts keys no row touched since the clock's
    /// hand last passed them, enough to bring the space an eighth of its budget under it
    /// (or all this instance may give), into one cold run. The hand looks at
    /// [`SCAN_MAX`] keys at most per call.
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        const SCAN_MAX: usize = 1 << 17;
        let Some(cold) = self.cold.as_mut() else { return Ok(()) };
        let space = Arc::clone(cold.store.space());
        if self.keys.is_empty() {
            return Ok(());
        }
        let Some(goal) = cold.store.eviction_goal() else { return Ok(()) };
        let goal = goal.min(cold.store.entry_bytes());
        let slots = self.keys.len();
        let (mut chosen, mut freed) = (Vec::new(), 0usize);
        let mut looked = 0;
        for _ in 0..slots.min(SCAN_MAX) {
            if freed >= goal {
                break;
            }
            looked += 1;
            let position = cold.hand % slots;
            cold.hand = position + 1;
            let (_, entry) = self.keys.get_index_mut(position).expect("a position below the length");
            if !crate::cold::passes(&mut entry.marks, entry.bytes, space.budget()) {
                continue;
            }
            freed += entry.bytes;
            chosen.push(position);
        }
        if chosen.is_empty() {
            cold.store.evicted(0, goal, looked, slots);
            return Ok(());
        }
        let (vnodes, no_keys) = (self.vnodes, self.spec.keys.is_empty());
        let mut records = crate::records::Records::new(Some(space.dir()));
        for &position in &chosen {
            let (key, entry) = self.keys.get_index(position).expect("a chosen key");
            let value = |bytes: &mut Vec<u8>| state::write_sessions(&entry.sessions, bytes);
            records.add(sluice_types::vnode::of_hash(entry.hash, vnodes), |k| k.extend_from_slice(key), Some(&value));
        }
        for key in cold.dropped.drain() {
            records.add(
                sluice_types::vnode::of_hash(placement_hash(no_keys, &key), vnodes),
                |k| k.extend_from_slice(&key),
                None,
            );
        }
        let hash_of = move |key: &[u8]| Some(placement_hash(no_keys, key));
        cold.store.add(records, chosen.len(), freed, hash_of)?;
        // Removed from the highest position down: a swap-remove moves only the last key.
        chosen.sort_unstable();
        for position in chosen.into_iter().rev() {
            let (key, entry) = self.keys.swap_remove_index(position).expect("a chosen key");
            cold.store.release(entry.bytes);
            if self.tracking && entry.changed {
                // Its changes go with the next delta, read back from its run.
                cold.evicted_dirty.insert(key.to_vec());
            }
        }
        cold.store.evicted(freed, goal, looked, slots);
        Ok(())
    }

    /// Forgets what changed (a snapshot took it, or a restore loaded the runs); changes
    /// are kept from now on.
    fn clear_changes(&mut self) {
        for key in self.changed.drain(..) {
            if let Some(entry) = self.keys.get_mut(&key) {
                entry.changed = false;
            }
        }
        self.closed.clear();
        self.tracking = true;
    }

    /// Adds one row, whose proto-window is `[start, end)`, to the sessions of `key`.
    /// Returns false when the row is late (see the module documentation).
    fn add_row(
        &mut self,
        key: &[u8],
        hash: u64,
        [start, end]: [i64; 2],
        inputs: &Inputs,
        row: usize,
    ) -> Result<bool, SluiceError> {
        self.load(key, hash)?;
        let entry = self.keys.get(key);
        let touching = |session: &Session| session.start <= end && session.end >= start;
        let (mut merged_start, mut merged_end) = (start, end);
        for session in entry.iter().flat_map(|e| &e.sessions).filter(|s| touching(s)) {
            merged_start = merged_start.min(session.start);
            merged_end = merged_end.max(session.end);
        }
        if merged_end - 1 <= self.watermark {
            return Ok(false);
        }
        // One allocation per row: the key's copy in the due set (and in the map when new,
        // and in the changed list at its first change since a snapshot).
        let mut owned: Box<[u8]> = key.into();
        if !self.keys.contains_key(key) {
            // A key dropped after it was read back keeps its run's stale copy shadowed.
            let dropped = self.cold.as_mut().is_some_and(|cold| cold.dropped.remove(key));
            let marks = if dropped { FROM_COLD } else { 0 };
            let entry = KeySessions { hash, sessions: Vec::new(), changed: false, marks, bytes: 0 };
            self.keys.insert(owned.clone(), entry);
        }
        let entry = self.keys.get_mut(key).expect("inserted above");
        entry.marks |= RECENT;
        let sessions = &mut entry.sessions;
        let mut merged: Option<Session> = None;
        while let Some(index) = sessions.iter().position(touching) {
            let session = sessions.remove(index);
            let probe = (session.end, owned);
            self.due.remove(&probe);
            owned = probe.1;
            match &mut merged {
                None => merged = Some(session),
                Some(merged) => {
                    for ((partial, other), max) in merged.partials.iter_mut().zip(session.partials).zip(&self.maxes) {
                        partial.merge(*max, other);
                    }
                }
            }
        }
        let mut merged = merged.unwrap_or_else(|| Session { start, end, partials: self.empty.clone() });
        (merged.start, merged.end) = (merged_start, merged_end);
        for (index, partial) in merged.partials.iter_mut().enumerate() {
            // A row its FILTER (WHERE …) rejects is not counted by that aggregate.
            if inputs.filters[index].as_ref().is_none_or(|f| f.is_valid(row) && f.value(row)) {
                partial.update(self.maxes[index], &inputs.arguments[index], row);
            }
        }
        self.due.insert((merged.end, owned));
        let at = sessions.partition_point(|session| session.start < merged.start);
        sessions.insert(at, merged);
        if self.tracking && !entry.changed {
            entry.changed = true;
            self.changed.push(key.into());
        }
        self.recount(key);
        Ok(true)
    }

    /// Emits the next part of what is closing ([`SessionAggregate::emit_batch`]), and
    /// after the last session the watermark or end-of-data.
    fn emit_part(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let Some((until, _)) = &self.emitting else { return Ok(()) };
        if self.emit_batch(*until, out)? {
            let (_, then) = self.emitting.take().expect("checked above");
            if matches!(then, Message::Watermark(_)) {
                self.evict_over_budget()?;
            }
            out.push(then);
        }
        Ok(())
    }

    /// Emits, in end order, a batch (the spec's batch size) of the sessions due at
    /// `watermark`; returns whether none is left.
    fn emit_batch(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<bool, SluiceError> {
        let mut emitted: Vec<(Box<[u8]>, Session)> = Vec::new();
        let batch_size = self.spec.batch_size.max(1);
        let no_keys = self.spec.keys.is_empty();
        while let Some((end, _)) = self.due.first() {
            if end - 1 > watermark {
                break;
            }
            let (end, key) = self.due.pop_first().expect("checked above");
            self.load(&key, placement_hash(no_keys, &key))?;
            let Some(entry) = self.keys.get_mut(&key) else {
                return Err(SluiceError::internal("session.state", "a due session's key has no sessions"));
            };
            let Some(position) = entry.sessions.iter().position(|s| s.end == end) else {
                return Err(SluiceError::internal(
                    "session.state",
                    format!("no open session of its key ends at {end}"),
                ));
            };
            let session = entry.sessions.remove(position);
            if entry.sessions.is_empty() {
                self.drop_key(&key);
                if self.tracking {
                    self.closed.push(key.clone());
                }
            } else {
                if self.tracking && !entry.changed {
                    entry.changed = true;
                    self.changed.push(key.clone());
                }
                self.recount(&key);
            }
            emitted.push((key, session));
            if emitted.len() == batch_size {
                out.push(Message::Data(Batch::inserts(self.rows(&emitted)?)));
                return Ok(false);
            }
        }
        if !emitted.is_empty() {
            out.push(Message::Data(Batch::inserts(self.rows(&emitted)?)));
        }
        Ok(true)
    }

    /// The output rows of `sessions`.
    fn rows(&self, sessions: &[(Box<[u8]>, Session)]) -> Result<RecordBatch, SluiceError> {
        let key_columns = if self.spec.keys.is_empty() {
            Vec::new()
        } else {
            self.key_encoder.decode(sessions.iter().map(|(key, _)| &key[..]))?
        };
        let times = |bound: fn(&Session) -> i64| -> ArrayRef {
            Arc::new(TimestampMillisecondArray::from_iter_values(sessions.iter().map(|(_, s)| bound(s))))
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.spec.output.fields().len());
        for group in &self.spec.groups {
            columns.push(match group {
                GroupColumn::WindowStart => times(|s| s.start),
                GroupColumn::WindowEnd => times(|s| s.end),
                GroupColumn::Key(index) => Arc::clone(&key_columns[*index]),
            });
        }
        for index in 0..self.spec.aggregates.len() {
            columns.push(finish(sessions.iter().map(|(_, s)| &s.partials[index]), &self.empty[index]));
        }
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?)
    }
}

/// One aggregate's results, a row per session; `kind` is an empty partial of it.
fn finish<'a>(partials: impl Iterator<Item = &'a Partial>, kind: &Partial) -> ArrayRef {
    let ints = |partials: &mut dyn Iterator<Item = &'a Partial>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(partials.map(|partial| match partial {
            Partial::Count(count) => Some(*count),
            Partial::SumInt(value) | Partial::ExtremeInt(value) => *value,
            Partial::Distinct(set) => Some(set.len() as i64),
            _ => None,
        })))
    };
    let mut partials = partials;
    match kind {
        Partial::Count(_) | Partial::SumInt(_) | Partial::ExtremeInt(_) | Partial::Distinct(_) => ints(&mut partials),
        Partial::SumFloat(_) | Partial::ExtremeFloat(_) | Partial::Avg(..) => {
            Arc::new(Float64Array::from_iter(partials.map(|partial| match partial {
                Partial::SumFloat(value) | Partial::ExtremeFloat(value) => *value,
                Partial::Avg(sum, count) => (*count > 0).then(|| sum / *count as f64),
                _ => None,
            })))
        }
        Partial::ExtremeText(_) => Arc::new(StringArray::from_iter(partials.map(|partial| match partial {
            Partial::ExtremeText(value) => value.clone(),
            _ => None,
        }))),
    }
}

impl Operator for SessionAggregate {
    fn name(&self) -> &str {
        "session_aggregate"
    }

    fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(batch.is_append_only(), "the planner refuses session windows over updating input");
        assert!(self.emitting.is_none(), "rows while a watermark's output is held");
        let rows = &batch.rows;
        let starts = rows.column(self.spec.window_start).as_primitive::<TimestampMillisecondType>().clone();
        let ends = rows.column(self.spec.window_end).as_primitive::<TimestampMillisecondType>().clone();
        let key_columns: Vec<ArrayRef> = self.spec.keys.iter().map(|&k| Arc::clone(rows.column(k))).collect();
        let mut keys = std::mem::take(&mut self.key_rows);
        self.key_encoder.encode(&key_columns, &mut keys)?;
        let inputs = Inputs {
            arguments: super::read_arguments(&self.spec.aggregates, &self.distinct_encoders, rows)?,
            filters: self
                .spec
                .aggregates
                .iter()
                .map(|a| a.filter.map(|f| rows.column(f).as_boolean().clone()))
                .collect(),
        };
        let mut late = 0u64;
        for row in 0..rows.num_rows() {
            let (key, hash): (&[u8], u64) =
                if self.spec.keys.is_empty() { (&[], 0) } else { (keys.row(row), keys.hash(row)) };
            let added = self.add_row(key, hash, [starts.value(row), ends.value(row)], &inputs, row);
            match added {
                Ok(true) => {}
                Ok(false) => late += 1,
                Err(error) => {
                    self.key_rows = keys;
                    return Err(error);
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
            assert!(self.emitting.is_none(), "a watermark while the previous one's output is held");
            self.emitting = Some((watermark, Message::Watermark(watermark)));
            return self.emit_part(out);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.emitting.is_none(), "the end while a watermark's output is held");
        self.emitting = Some((i64::MAX, Message::EndOfData));
        self.emit_part(out)
    }

    fn has_more(&self) -> bool {
        self.emitting.is_some()
    }

    fn on_resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(self.emitting.is_some(), "session_aggregate resumed without held output");
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
