//! The non-windowed (updating) group aggregate: `GROUP BY keys` without a window.
//!
//! Input rows carry the key columns, the aggregate arguments and each aggregate's
//! `FILTER (WHERE …)` condition (a boolean column), and a weight: +1 inserts, -1
//! retractions (any other value is a multiplicity), so the input may itself be updating.
//! State is one entry per group: its key (in the project's key encoding,
//! [`sluice_types::key`]; its placement hash, the exchange's, is computed from it), the
//! weighted count of its rows, one retractable accumulator per aggregate
//! ([`accumulator`]), and for each column that COUNT(DISTINCT) aggregates, its values
//! with a count per such aggregate ([`distinct`]: the FILTERed variants of one column
//! share one set; the planner projects equal arguments to one column).
//!
//! Output is a changelog, emitted per mini-batch (a group touched by several rows of one
//! mini-batch changes once). A mini-batch ends once `mini_batch_rows` input rows arrived
//! since the last one ([`GroupAggregate::with_mini_batch`]; by default after every input
//! batch), when the driver flushes ([`Operator::on_flush`]: its thread ran out of input,
//! or a while passed, or a barrier is about to be snapshotted), and at the end. For each
//! group the mini-batch touched, in the order first touched,
//! - a group that appeared: its row with weight +1 (`+I`);
//! - a group whose rows were all retracted: its previous row with weight -1 (`-D`), and
//!   the group is dropped (a later row starts it afresh, as in Flink; within one
//!   mini-batch its accumulators start afresh as soon as its last row is retracted);
//! - a group whose result changed: the previous row with weight -1 immediately followed
//!   by the new row with weight +1, the pair a sink writes as `-U`/`+U`;
//! - a group whose result did not change: nothing.
//!
//! Over an input the planner knows to be append-only, MIN and MAX keep only the extreme
//! (nothing can retract it).
//!
//! A retraction of more rows than a group holds (input that retracts what it never
//! inserted, which a consistent upstream never sends) is ignored and counted.
//!
//! Output columns: the keys in `GROUP BY` order, then the aggregates, cast to the
//! planner's declared output types. One mini-batch gives at most two rows per input row,
//! in one output batch.

mod accumulator;
mod distinct;
mod state;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use arrow::record_batch::RecordBatch;
use hashbrown::HashTable;
use sluice_runtime::{Operator, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Epoch, Message, SluiceError, TimestampMs, vnode};

use super::{AggregateFunction, AggregateSpec, is_float, is_text, table_hash};
use crate::bytes::SmallBytes;
use crate::cold::{FROM_COLD, RECENT};
use crate::counter::LazyCounter;
use crate::partition::placement_hash;
use accumulator::{Accumulator, Argument, Value, ValueKind};
use distinct::{DistinctSet, DistinctValues, MEMBERS_MAX};

pub use state::GROUP_STATE_VERSION;

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct GroupAggregateSpec {
    /// Input columns of the `GROUP BY` keys, in order.
    pub keys: Vec<usize>,
    pub aggregates: Vec<AggregateSpec>,
    /// The keys, then the aggregates.
    pub output: SchemaRef,
    /// The input never retracts (the planner knows): MIN and MAX then keep only their
    /// extreme instead of every value.
    pub append_only_input: bool,
}

/// One group's state: 64 bytes and its accumulators (NEXMark q4 and q17 keep hundreds
/// of thousands of groups). The key's placement hash is computed again from the key
/// when needed ([`placement_hash`]).
#[derive(Debug, Clone)]
struct Group {
    /// Inline when short (every key of up to two integers, dates or timestamps).
    key: SmallBytes,
    /// The weighted count of the group's rows: the group exists while it is positive.
    rows: i64,
    /// Exactly one per aggregate (a boxed slice: no spare capacity, no length twice).
    accumulators: Box<[Accumulator]>,
    /// One set per [`Share`] (none allocated without COUNT(DISTINCT)).
    distinct: Box<[DistinctSet]>,
}

impl Group {
    fn values(&self) -> Vec<Value> {
        self.accumulators.iter().map(Accumulator::value).collect()
    }

    /// About the bytes of memory the group takes: its slot, its index entry and flags,
    /// its key when not inline, its accumulators and their values, its sets' values.
    fn bytes(&self) -> usize {
        const SLOT: usize = std::mem::size_of::<Option<Group>>() + 8;
        let key = self.key.get().len();
        let key = if key > 22 { key + 16 } else { 0 };
        let accumulators: usize = self
            .accumulators
            .iter()
            .map(|accumulator| std::mem::size_of::<Accumulator>() + accumulator.heap_bytes())
            .sum();
        let sets: usize =
            self.distinct.iter().map(|set| std::mem::size_of::<DistinctSet>() + set.values.heap_bytes()).sum();
        SLOT + key + accumulators + sets
    }
}

/// Groups beyond the memory budget ([`crate::cold`]): where they go, and what the aggregate
/// keeps to count, choose and find them.
struct Spilling {
    store: crate::cold::ColdStore,
    /// Over an append-only input, the COUNT(DISTINCT) values that sets too large for
    /// the budget spilled while their groups stayed in memory (`spill_values`): a record
    /// per value, as `state` writes it, in compressed runs without filters (each set's
    /// range filters the lookups instead, [`distinct::DistinctSet::may_be_spilled`]).
    values: crate::cold::ColdStore,
    /// Per group id: [`RECENT`] (a row touched it since the clock's hand passed it),
    /// [`FROM_COLD`] and its age (`crate::cold::passes`).
    marks: Vec<u8>,
    /// The clock's hand: the next group id it looks at.
    hand: usize,
    /// Where `spill_values` looks for large sets next (it looks at [`SETS_LOOKED_MAX`]
    /// groups a call at most).
    sets_hand: usize,
    /// Groups evicted while changed since the previous snapshot: the next delta writes
    /// them again from their run.
    evicted_dirty: crate::cold::Keys,
    /// Groups dropped from memory whose older copy may still be in a run: the next run
    /// writes their deletes.
    dropped: crate::cold::Keys,
}

/// The most groups `spill_values` looks at per call for sets to spill.
const SETS_LOOKED_MAX: usize = 1 << 17;

/// COUNT(DISTINCT) aggregates of one argument column (at most [`MEMBERS_MAX`]; a column
/// with more has several shares), sharing one set of values per group.
#[derive(Debug, Clone)]
struct Share {
    column: usize,
    /// Encodes the column's values.
    encoder: KeyEncoder,
    /// The aggregates (their positions), in order: the set's members.
    members: Vec<usize>,
}

/// A batch's values of one shared COUNT(DISTINCT) column.
enum DistinctColumn {
    /// Over an append-only input, a BIGINT column's integers as they are (see
    /// [`DistinctValues::update_int`]).
    Ints(Int64Array),
    /// Any other column's values encoded, with their hashes.
    Encoded(KeyRows),
}

/// A group the current mini-batch touched, with its row before the mini-batch (None: it
/// did not exist).
struct Touched {
    group: u32,
    before: Option<Vec<Value>>,
    /// Its bytes before (counted only while spilling).
    bytes: usize,
}

/// See the module documentation.
pub struct GroupAggregate {
    spec: GroupAggregateSpec,
    key_encoder: KeyEncoder,
    key_rows: KeyRows,
    /// Per aggregate: how its argument is read (None for COUNT(*)).
    kinds: Vec<Option<ValueKind>>,
    /// The COUNT(DISTINCT) aggregates by argument column, and per aggregate its share and
    /// member there (None for the other aggregates).
    shares: Vec<Share>,
    member_of: Vec<Option<(usize, usize)>>,
    /// Groups by id; a dropped group's slot is reused (`free`).
    groups: crate::pages::Pages<Option<Group>>,
    free: Vec<u32>,
    /// Group ids, hashed with `table_hash` of each group's placement hash.
    index: HashTable<u32>,
    /// Whether each group id was touched by the current mini-batch.
    touched_flags: Vec<bool>,
    /// The groups the current mini-batch touched, in the order first touched.
    pending: Vec<Touched>,
    /// Input rows of the current mini-batch, and how many end it.
    pending_rows: usize,
    mini_batch_rows: usize,
    /// Retractions of rows a group did not hold, ignored.
    ignored_retractions: LazyCounter,
    vnodes: u32,
    /// Groups not written for a while are dropped (see `crate::ttl`).
    ttl: Option<crate::ttl::Ttl>,
    /// For snapshots (`state`): the groups changed since the previous snapshot; the keys of groups dropped since; whether changes are kept
    /// (from the first snapshot or a restore on: a run without checkpoints keeps none).
    changed: crate::changed::ChangedIds,
    removed: Vec<Vec<u8>>,
    tracking: bool,
    /// Groups beyond the memory budget (None: every group stays in memory).
    cold: Option<Spilling>,
}

impl GroupAggregate {
    /// `input` is the schema of the rows the operator receives; `vnodes` the pipeline's
    /// vnode count (snapshots split state by the vnode of each key).
    pub fn new(
        spec: GroupAggregateSpec,
        input: &SchemaRef,
        ignored_retractions: LazyCounter,
        vnodes: u32,
    ) -> Result<GroupAggregate, SluiceError> {
        let key_encoder = KeyEncoder::new(spec.keys.iter().map(|&k| input.field(k).data_type().clone()).collect())?;
        let mut kinds = Vec::new();
        let mut shares: Vec<Share> = Vec::new();
        let mut member_of = Vec::new();
        for (index, aggregate) in spec.aggregates.iter().enumerate() {
            let data_type = aggregate.argument.map(|column| input.field(column).data_type());
            kinds.push(data_type.map(|t| {
                if is_float(t) {
                    ValueKind::Float
                } else if is_text(t) {
                    ValueKind::Text
                } else {
                    ValueKind::Int
                }
            }));
            member_of.push(match (aggregate.function, aggregate.argument, data_type) {
                (AggregateFunction::CountDistinct, Some(column), Some(t)) => {
                    let open = |share: &Share| share.column == column && share.members.len() < MEMBERS_MAX;
                    let share = match shares.iter().position(open) {
                        Some(share) => share,
                        None => {
                            let encoder = KeyEncoder::new(vec![t.clone()])?;
                            shares.push(Share { column, encoder, members: Vec::new() });
                            shares.len() - 1
                        }
                    };
                    shares[share].members.push(index);
                    Some((share, shares[share].members.len() - 1))
                }
                _ => None,
            });
        }
        Ok(GroupAggregate {
            spec,
            key_encoder,
            key_rows: KeyRows::default(),
            kinds,
            shares,
            member_of,
            groups: crate::pages::Pages::default(),
            free: Vec::new(),
            index: HashTable::new(),
            touched_flags: Vec::new(),
            pending: Vec::new(),
            pending_rows: 0,
            mini_batch_rows: 1,
            ignored_retractions,
            vnodes,
            ttl: None,
            changed: crate::changed::ChangedIds::default(),
            removed: Vec::new(),
            tracking: false,
            cold: None,
        })
    }

    /// Counts the groups' bytes in `space`'s budget and evicts groups to its directory
    /// beyond it ([`crate::cold`]); `written` counts the bytes written there. Not with a TTL:
    /// an evicted group would outlive it.
    pub fn with_spill(mut self, space: Arc<crate::spill::SpillSpace>, written: LazyCounter) -> GroupAggregate {
        assert!(self.ttl.is_none(), "a group aggregate with a TTL keeps its groups in memory");
        let values = crate::cold::ColdStore::new(Arc::clone(&space), written.again()).compressed();
        let store = crate::cold::ColdStore::new(space, written);
        self.cold = Some(Spilling {
            store,
            values,
            marks: Vec::new(),
            hand: 0,
            sets_hand: 0,
            evicted_dirty: crate::cold::Keys::default(),
            dropped: crate::cold::Keys::default(),
        });
        self
    }

    /// Marks group `id` changed since the previous snapshot.
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
        self.removed.clear();
        self.tracking = true;
    }

    /// Drops groups not written for the TTL (`crate::ttl`): their rows stay downstream.
    pub fn with_ttl(mut self, ttl: crate::ttl::Ttl) -> GroupAggregate {
        assert!(self.cold.is_none(), "a group aggregate that spills has no TTL");
        self.ttl = Some(ttl);
        self
    }

    /// Emits a mini-batch once it holds `rows` input rows or more (default 1: after
    /// every input batch). Flink's `table.exec.mini-batch.size`; the driver's flushes
    /// bound the time it holds changes.
    pub fn with_mini_batch(mut self, rows: usize) -> GroupAggregate {
        self.mini_batch_rows = rows.max(1);
        self
    }

    /// Drops the groups whose TTL passed (after emitting the mini-batch, if it touched
    /// one of them).
    fn expire(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let Some(ttl) = self.ttl.as_mut() else { return Ok(()) };
        let expired = ttl.expired();
        if expired.iter().any(|&id| self.touched_flags[id as usize]) {
            self.flush(out)?;
        }
        for id in expired {
            if self.groups[id as usize].is_some() {
                self.drop_group(id);
            }
        }
        Ok(())
    }

    /// Emits the current mini-batch's changes.
    fn flush(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.pending_rows = 0;
        if self.pending.is_empty() {
            return Ok(());
        }
        let touched = std::mem::take(&mut self.pending);
        if let Some(changes) = self.changes(touched)? {
            out.push(Message::Data(changes));
        }
        self.evict_over_budget()
    }

    /// A new group's accumulators (over an append-only input, MIN and MAX of numbers
    /// keep their one extreme inline from the start).
    fn new_accumulators(&self) -> Vec<Accumulator> {
        let new = |(aggregate, kind): (&AggregateSpec, &Option<ValueKind>)| {
            let mut accumulator = Accumulator::new(aggregate.function, *kind);
            if self.spec.append_only_input {
                accumulator.keep_only_extreme();
            }
            accumulator
        };
        self.spec.aggregates.iter().zip(&self.kinds).map(new).collect()
    }

    fn new_distinct(&self) -> Box<[DistinctSet]> {
        let new = if self.spec.append_only_input { DistinctValues::seen } else { DistinctValues::counted };
        self.shares.iter().map(|share| DistinctSet::new(new(share.members.len()))).collect()
    }

    /// Each aggregate's argument column of `rows`, cast once.
    fn arguments(&self, rows: &RecordBatch) -> Result<Vec<Argument>, SluiceError> {
        let mut arguments = Vec::with_capacity(self.spec.aggregates.len());
        for (index, aggregate) in self.spec.aggregates.iter().enumerate() {
            let Some(column) = aggregate.argument.filter(|_| self.member_of[index].is_none()) else {
                arguments.push(Argument::None);
                continue;
            };
            let array = rows.column(column);
            let argument = if aggregate.function == AggregateFunction::Count {
                Argument::Present(Arc::clone(array))
            } else {
                match self.kinds[index] {
                    Some(ValueKind::Float) => {
                        Argument::Float(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
                    }
                    Some(ValueKind::Text) => Argument::Text(cast(array, &DataType::Utf8)?.as_string::<i32>().clone()),
                    _ => Argument::Int(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone()),
                }
            };
            arguments.push(argument);
        }
        Ok(arguments)
    }

    /// Each aggregate's FILTER condition of `rows` (None: every row counts).
    fn filters(&self, rows: &RecordBatch) -> Vec<Option<BooleanArray>> {
        self.spec.aggregates.iter().map(|a| a.filter.map(|column| rows.column(column).as_boolean().clone())).collect()
    }

    /// The id of the group of `key` (placement hash `hash`): in memory, else read back
    /// from the cold runs, else added empty.
    fn group_of(&mut self, key: &[u8], hash: u64) -> Result<u32, SluiceError> {
        if let Some(id) = self.find(key, hash) {
            return Ok(id);
        }
        let Some(cold) = self.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) else {
            return Ok(self.insert(key, hash));
        };
        if cold.dropped.remove(key) {
            // Dropped since it was read back: its run's copy is stale.
            let id = self.insert(key, hash);
            self.set_mark(id, FROM_COLD);
            return Ok(id);
        }
        let vnode = vnode::of_hash(hash, self.vnodes);
        let (record, follows) = (state::group_record_key(key), state::follows(key));
        let Some(found) = cold.store.runs().find(vnode, &record, hash, &follows)? else {
            return Ok(self.insert(key, hash));
        };
        let dirty = cold.evicted_dirty.remove(key);
        let id = state::load_cold(self, key, hash, &found)?;
        self.set_mark(id, FROM_COLD);
        if dirty {
            // Its changes since the previous snapshot are in no checkpoint yet: the next
            // delta writes it whole.
            self.mark(id);
            if let Some(group) = self.groups[id as usize].as_mut() {
                group.distinct.iter_mut().for_each(DistinctSet::start_over);
            }
        }
        Ok(id)
    }

    /// The id of the group of `key` in memory.
    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let groups = &self.groups;
        let same = |&id: &u32| groups[id as usize].as_ref().is_some_and(|g| crate::same_bytes(g.key.get(), key));
        self.index.find(table_hash(hash), same).copied()
    }

    /// Sets `bits` of group `id`'s marks (while spilling).
    fn set_mark(&mut self, id: u32, bits: u8) {
        if let Some(cold) = self.cold.as_mut() {
            cold.marks[id as usize] |= bits;
        }
    }

    /// Adds the empty group of `key` (not in memory); returns its id.
    fn insert(&mut self, key: &[u8], hash: u64) -> u32 {
        let table = table_hash(hash);
        let group = Group {
            key: SmallBytes::new(key),
            rows: 0,
            accumulators: self.new_accumulators().into_boxed_slice(),
            distinct: self.new_distinct(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.groups[id as usize] = Some(group);
                id
            }
            None => {
                assert!(self.groups.len() < u32::MAX as usize, "fewer than 2^32 groups per thread");
                self.groups.push(Some(group));
                self.touched_flags.push(false);
                (self.groups.len() - 1) as u32
            }
        };
        let (groups, no_keys) = (&self.groups, self.spec.keys.is_empty());
        let rehash = |g: &u32| groups[*g as usize].as_ref().map_or(0, |g| placement_hash(no_keys, g.key.get()));
        self.index.insert_unique(table, id, |g| table_hash(rehash(g)));
        if let Some(cold) = self.cold.as_mut() {
            if cold.marks.len() <= id as usize {
                cold.marks.resize(id as usize + 1, 0);
            }
            cold.marks[id as usize] = RECENT;
            let bytes = self.groups[id as usize].as_ref().map_or(0, Group::bytes);
            cold.store.charge(bytes);
        }
        id
    }

    /// Drops group `id` (its rows were all retracted).
    fn drop_group(&mut self, id: u32) {
        let group = self.groups[id as usize].take().expect("a live group");
        if self.tracking {
            self.removed.push(group.key.get().to_vec());
        }
        if let Some(cold) = self.cold.as_mut() {
            cold.store.release(group.bytes());
            if std::mem::take(&mut cold.marks[id as usize]) & FROM_COLD != 0 {
                cold.dropped.insert(group.key.get().to_vec());
            }
        }
        let table = table_hash(placement_hash(self.spec.keys.is_empty(), group.key.get()));
        let entry = self.index.find_entry(table, |&g| g == id).expect("an indexed group");
        entry.remove();
        self.free.push(id);
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.forget(id);
        }
    }

    /// When the space is over its budget, evicts groups no row touched since the clock's
    /// hand last passed them, enough to bring the space an eighth of its budget under it
    /// (or all this instance may give), into one cold run ([`crate::cold`]). The hand looks at
    /// [`SCAN_MAX`] groups at most per call.
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        const SCAN_MAX: usize = 1 << 17;
        let Some(cold) = self.cold.as_mut() else { return Ok(()) };
        let space = Arc::clone(cold.store.space());
        if self.groups.is_empty() {
            return Ok(());
        }
        let Some(goal) = cold.store.eviction_goal() else { return Ok(()) };
        let goal = goal.min(cold.store.entry_bytes());
        let slots = self.groups.len();
        let (mut chosen, mut freed) = (Vec::new(), 0usize);
        let mut looked = 0;
        for _ in 0..slots.min(SCAN_MAX) {
            if freed >= goal {
                break;
            }
            looked += 1;
            let id = cold.hand;
            cold.hand = (cold.hand + 1) % slots;
            let Some(group) = self.groups[id].as_ref() else { continue };
            if group.distinct.iter().any(|set| set.spilled.is_some()) {
                // Its values' range lives in memory: it stays (only its values leave).
                continue;
            }
            let bytes = group.bytes();
            if !crate::cold::passes(&mut cold.marks[id], bytes, space.budget()) {
                continue;
            }
            freed += bytes;
            chosen.push(id as u32);
        }
        if !chosen.is_empty() {
            self.evict_groups(chosen, freed)?;
        }
        if freed < goal {
            freed += self.spill_values(goal - freed)?;
        }
        let cold = self.cold.as_mut().expect("spilling");
        cold.store.evicted(freed, goal, looked, slots);
        Ok(())
    }

    /// Writes groups `chosen` (of `freed` bytes) to a cold run and drops them from memory.
    fn evict_groups(&mut self, chosen: Vec<u32>, freed: usize) -> Result<(), SluiceError> {
        let cold = self.cold.as_mut().expect("spilling");
        let space = Arc::clone(cold.store.space());
        let mut records = crate::records::Records::new(Some(space.dir()));
        let (vnodes, columns, no_keys) = (self.vnodes, self.spec.keys.len(), self.spec.keys.is_empty());
        let share_members: Vec<usize> = self.shares.iter().map(|share| share.members.len()).collect();
        for &id in &chosen {
            let group = self.groups[id as usize].as_ref().expect("a chosen group is live");
            let vnode = vnode::of_hash(placement_hash(no_keys, group.key.get()), vnodes);
            let stale = cold.marks[id as usize] & FROM_COLD != 0;
            state::add_whole(&mut records, vnode, group, stale, &self.member_of, &share_members);
        }
        for key in cold.dropped.drain() {
            state::add_dropped(&mut records, vnode::of_hash(placement_hash(no_keys, &key), vnodes), &key);
        }
        let group_hash = state::group_hash(columns, no_keys);
        cold.store.add(records, chosen.len(), freed, group_hash)?;
        for id in chosen {
            let group = self.groups[id as usize].take().expect("a chosen group is live");
            if self.tracking && self.changed.contains(id) {
                // Its changes go with the next delta, read back from its run.
                self.changed.unmark(id);
                cold.evicted_dirty.insert(group.key.get().to_vec());
            }
            let table = table_hash(placement_hash(no_keys, group.key.get()));
            self.index.find_entry(table, |&g| g == id).expect("an indexed group").remove();
            self.free.push(id);
            cold.marks[id as usize] = 0;
            cold.store.release(group.bytes());
        }
        Ok(())
    }

    /// Over an append-only input, when evicting whole groups fell short (their rows keep
    /// coming: NEXMark q16's ten thousand channels each gain a bidder every few thousand
    /// rows, its four hot ones hold millions of values), spills the values of the
    /// largest COUNT(DISTINCT) sets, largest first, until about `goal` bytes are freed;
    /// returns the bytes freed.
    fn spill_values(&mut self, goal: usize) -> Result<usize, SluiceError> {
        let Some(cold) = self.cold.as_ref().filter(|_| self.spec.append_only_input && !self.shares.is_empty()) else {
            return Ok(0);
        };
        // Sets of a few hundred values stay (each spill of a set costs a range in
        // memory and lookups of the values in it): their group leaves whole once its
        // rows stop. Larger ones go even when small against the budget: NEXMark q16's
        // ten thousand channels each hold a few thousand values, over 100 MB in all at
        // 20 M events, and every channel gains a row in every mini-batch.
        let least = (cold.store.space().budget() / 1024).min(4 << 10);
        let set_bytes = |group: &Group| {
            group.distinct.iter().filter(|set| set.may_spill()).map(|set| set.values.heap_bytes()).sum::<usize>()
        };
        // Every group when there are few (q16's ten thousand), else the next
        // SETS_LOOKED_MAX from where the previous call stopped: a call costs no more
        // with millions of groups.
        let slots = self.groups.len();
        let looked = slots.min(SETS_LOOKED_MAX);
        let start = cold.sets_hand % slots.max(1);
        let mut sizes: Vec<(usize, u32)> = ((start..start + looked).map(|id| id % slots))
            .filter_map(|id| Some((set_bytes(self.groups[id].as_ref()?), id as u32)))
            .filter(|&(bytes, _)| bytes > least)
            .collect();
        let sets_hand = (start + looked) % slots.max(1);
        sizes.sort_unstable_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
        let mut chosen = Vec::new();
        let mut about = 0;
        for (bytes, id) in sizes {
            if about >= goal {
                break;
            }
            about += bytes;
            chosen.push(id);
        }
        let freed = self.spill_group_values(&chosen)?;
        if let Some(cold) = self.cold.as_mut() {
            cold.store.release(freed);
            cold.sets_hand = sets_hand;
        }
        Ok(freed)
    }

    /// Writes every value in memory of groups `ids`' sets to one run of the spilled
    /// values and empties the sets; returns the bytes the groups shrank by (for the
    /// caller to release where they were counted). The values go straight to the run in
    /// key order: groups by vnode and key (a group's key is never a prefix of another's,
    /// so its records follow the same order), each set's values sorted, 8 bytes a value
    /// while it is written (gathering them as records and sorting those took most of a
    /// spill's time: seconds for q16's 7 M values).
    fn spill_group_values(&mut self, ids: &[u32]) -> Result<usize, SluiceError> {
        let Some(cold) = self.cold.as_mut() else { return Ok(0) };
        let (groups, shares, vnodes) = (&mut self.groups, &self.shares, self.vnodes);
        let no_keys = self.spec.keys.is_empty();
        let spills = |set: &DistinctSet| set.may_spill() && set.values.len() > 0;
        let group = |id: u32| groups[id as usize].as_ref().expect("a chosen group is live");
        let mut ids: Vec<(u32, u32)> = (ids.iter())
            .filter(|&&id| group(id).distinct.iter().any(spills))
            .map(|&id| (vnode::of_hash(placement_hash(no_keys, group(id).key.get()), vnodes), id))
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        ids.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| group(a.1).key.get().cmp(group(b.1).key.get())));
        let about = (ids.iter())
            .flat_map(|&(_, id)| group(id).distinct.iter().filter(|set| spills(set)))
            .map(|set| set.values.heap_bytes())
            .sum();
        let mut freed = 0;
        cold.values.add_in_order(
            0,
            about,
            |_: &[u8]| None,
            |sink| {
                for &(vnode, id) in &ids {
                    let group = groups[id as usize].as_mut().expect("a chosen group is live");
                    let before = group.bytes();
                    let g = group.key.get();
                    for ((index, set), share) in group.distinct.iter_mut().enumerate().zip(shares) {
                        if spills(set) {
                            let values = set.spill(share.members.len());
                            state::write_spilled(sink, vnode, g, index, &values)?;
                        }
                    }
                    freed += before - group.bytes();
                }
                Ok(())
            },
        )?;
        Ok(freed)
    }

    /// The changes of the touched groups as one batch (None when nothing changed).
    fn changes(&mut self, touched: Vec<Touched>) -> Result<Option<Batch>, SluiceError> {
        let mut keys: Vec<u32> = Vec::new();
        let mut rows: Vec<Vec<Value>> = Vec::new();
        let mut weights: Vec<i64> = Vec::new();
        let mut dropped: Vec<u32> = Vec::new();
        let mut marked: Vec<u32> = Vec::new();
        let mut emit = |group: u32, values: Vec<Value>, weight: i64| {
            keys.push(group);
            rows.push(values);
            weights.push(weight);
        };
        for Touched { group: id, before, bytes } in touched {
            self.touched_flags[id as usize] = false;
            let group = self.groups[id as usize].as_ref().expect("a touched group lives until emitted");
            if let Some(cold) = self.cold.as_mut() {
                let after = group.bytes();
                cold.store.charge(after);
                cold.store.release(bytes);
            }
            let after = (group.rows > 0).then(|| group.values());
            if after.is_none() {
                dropped.push(id);
            } else {
                marked.push(id);
            }
            match (before, after) {
                (None, None) => {}
                (None, Some(after)) => emit(id, after, 1),
                (Some(before), None) => emit(id, before, -1),
                (Some(before), Some(after)) => {
                    if !before.iter().zip(&after).all(|(b, a)| b.same(a)) {
                        emit(id, before, -1);
                        emit(id, after, 1);
                    }
                }
            }
        }
        let batch = if weights.is_empty() { None } else { Some(self.build(&keys, &rows, weights)?) };
        for id in dropped {
            self.drop_group(id);
        }
        for id in marked {
            self.mark(id);
        }
        Ok(batch)
    }

    /// Output rows: the keys of groups `ids` and the aggregate values `rows`.
    fn build(&self, ids: &[u32], rows: &[Vec<Value>], weights: Vec<i64>) -> Result<Batch, SluiceError> {
        let group = |id: &u32| self.groups[*id as usize].as_ref().expect("a group being emitted");
        let mut columns: Vec<ArrayRef> = if self.spec.keys.is_empty() {
            Vec::new()
        } else {
            self.key_encoder.decode(ids.iter().map(|id| group(id).key.get()))?
        };
        let template = self.new_accumulators();
        for (index, accumulator) in template.iter().enumerate() {
            columns.push(accumulator::column(accumulator.result_kind(), rows.iter().map(|row| &row[index])));
        }
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?;
        Ok(Batch::with_weights(rows, Int64Array::from(weights)))
    }
}

impl Operator for GroupAggregate {
    fn name(&self) -> &str {
        "group_aggregate"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(
            !self.spec.append_only_input || batch.is_append_only(),
            "the planner declared this aggregate's input append-only"
        );
        self.expire(out)?;
        let rows = &batch.rows;
        let key_columns: Vec<ArrayRef> = self.spec.keys.iter().map(|&k| Arc::clone(rows.column(k))).collect();
        let mut keys = std::mem::take(&mut self.key_rows);
        self.key_encoder.encode(&key_columns, &mut keys)?;
        let arguments = self.arguments(rows)?;
        let filters = self.filters(rows);
        // Each shared COUNT(DISTINCT) column's values, encoded once (unless read as
        // they are).
        let mut distinct_values = Vec::with_capacity(self.shares.len());
        for share in &self.shares {
            let column = rows.column(share.column);
            distinct_values.push(match column.data_type() {
                DataType::Int64 if self.spec.append_only_input => {
                    DistinctColumn::Ints(column.as_primitive::<Int64Type>().clone())
                }
                _ => {
                    let mut values = KeyRows::default();
                    share.encoder.encode(std::slice::from_ref(column), &mut values)?;
                    DistinctColumn::Encoded(values)
                }
            });
        }
        let counted_by = |members: &[usize], row: usize, counted: &mut Vec<bool>| {
            counted.clear();
            counted
                .extend(members.iter().map(|&a| filters[a].as_ref().is_none_or(|f| f.is_valid(row) && f.value(row))));
        };
        let (mut counted, mut changes) = (Vec::new(), Vec::new());
        let mut ignored = 0u64;
        for row in 0..rows.num_rows() {
            let weight = batch.weight(row);
            if weight == 0 {
                continue;
            }
            let (key, hash): (&[u8], u64) =
                if self.spec.keys.is_empty() { (&[], 0) } else { (keys.row(row), keys.hash(row)) };
            let id = self.group_of(key, hash)?;
            if let Some(cold) = self.cold.as_mut() {
                cold.marks[id as usize] |= RECENT;
            }
            let group = self.groups[id as usize].as_mut().expect("group_of returns a live group");
            if group.rows + weight < 0 {
                ignored += weight.unsigned_abs();
                if group.rows == 0 && !self.touched_flags[id as usize] {
                    self.drop_group(id);
                }
                continue;
            }
            if !self.touched_flags[id as usize] {
                self.touched_flags[id as usize] = true;
                let bytes = if self.cold.is_some() { group.bytes() } else { 0 };
                self.pending.push(Touched { group: id, before: (group.rows > 0).then(|| group.values()), bytes });
            }
            group.rows += weight;
            if let Some(ttl) = self.ttl.as_mut() {
                ttl.written(id);
            }
            for (index, accumulator) in group.accumulators.iter_mut().enumerate() {
                let counted = filters[index].as_ref().is_none_or(|f| f.is_valid(row) && f.value(row));
                if counted {
                    accumulator.update(&arguments[index], row, weight);
                    if self.spec.append_only_input {
                        // Text only: numbers keep their extreme alone already.
                        accumulator.keep_only_extreme();
                    }
                }
            }
            // A NULL is no value: COUNT(DISTINCT) skips it.
            let distinct = self.shares.iter().zip(&distinct_values).zip(group.distinct.iter_mut()).enumerate();
            for (share_index, ((share, values), set)) in distinct {
                if !rows.column(share.column).is_valid(row) {
                    continue;
                }
                counted_by(&share.members, row, &mut counted);
                changes.clear();
                changes.resize(share.members.len(), 0);
                let tracking = self.tracking;
                if set.spilled.is_some() {
                    // A value this set spilled comes back first, with its members.
                    let runs = self.cold.as_ref().expect("a set spills only while spilling").values.runs();
                    let vnode = vnode::of_hash(hash, self.vnodes);
                    match values {
                        DistinctColumn::Ints(values) => {
                            if let Some(encoded) = set.may_be_spilled_int(values.value(row)) {
                                let hash = sluice_types::key::hash(&encoded);
                                state::load_spilled(runs, vnode, &group.key, share_index, &encoded, hash, set)?;
                            }
                        }
                        DistinctColumn::Encoded(values) => {
                            let (value, hash) = (values.row(row), values.hash(row));
                            if set.may_be_spilled(value, hash) {
                                state::load_spilled(runs, vnode, &group.key, share_index, value, hash, set)?;
                            }
                        }
                    }
                }
                match values {
                    DistinctColumn::Ints(values) => {
                        set.update_int(values.value(row), &counted, weight, &mut changes, tracking)
                    }
                    DistinctColumn::Encoded(values) => {
                        set.update(values.row(row), values.hash(row), &counted, weight, &mut changes, tracking)
                    }
                }
                for (&member, change) in share.members.iter().zip(&changes) {
                    if let Accumulator::Distinct { positive } = &mut group.accumulators[member] {
                        *positive += change;
                    }
                }
            }
            if group.rows == 0 {
                // Every row retracted: the group goes on from nothing, as a dropped one
                // would (no rounding left by retracted floats in a SUM or AVG).
                let (accumulators, mut distinct) = (self.new_accumulators().into_boxed_slice(), self.new_distinct());
                if self.tracking {
                    // The records of its values so far go at the next snapshot.
                    distinct.iter_mut().for_each(DistinctSet::start_over);
                }
                let group = self.groups[id as usize].as_mut().expect("a live group");
                group.accumulators = accumulators;
                group.distinct = distinct;
            }
        }
        self.key_rows = keys;
        if ignored > 0 {
            self.ignored_retractions.add(ignored);
        }
        self.pending_rows = self.pending_rows.saturating_add(rows.num_rows());
        if self.pending_rows >= self.mini_batch_rows {
            self.flush(out)?;
        }
        Ok(())
    }

    /// The watermark passes the held mini-batch: no event-time operator reads an
    /// updating stream (the planner refuses one), so nothing downstream waits on it.
    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.expire(out)?;
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn on_flush(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.flush(out)
    }

    fn on_barrier(&mut self, epoch: Epoch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.flush(out)?;
        out.push(Message::Barrier(epoch));
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.flush(out)?;
        out.push(Message::EndOfData);
        Ok(())
    }

    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        assert!(self.pending.is_empty(), "the driver flushes a mini-batch before a snapshot (Chain::flush)");
        Ok(Some(state::snapshot(self, delta)))
    }

    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        state::restore(self, state)?;
        // Write times are not checkpointed: every restored group gets a full TTL.
        if let Some(ttl) = self.ttl.as_mut() {
            for (id, group) in self.groups.iter().enumerate() {
                if group.is_some() {
                    ttl.written(id as u32);
                }
            }
        }
        Ok(())
    }
}
