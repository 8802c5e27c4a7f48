//! Snapshots of the group aggregate's state as records (`sluice_state`): one per
//! group, and one per value of each COUNT(DISTINCT) set, under the vnode of the group
//! key's placement hash (the hash the exchange routes by), so a restore onto any number
//! of threads gives each group to the thread its future rows go to.
//!
//! At a barrier the driver copies what the snapshot takes and returns a job that writes
//! it on the checkpoint writer's thread: every live group with its sets (a full
//! snapshot), or (a delta) the groups changed since the previous snapshot (every group a
//! mini-batch touched since) without their sets, only each set's logged changes
//! ([`super::distinct::SetLog`]: a set written whole only when it churned or started
//! over), and deletes for each group dropped since. Rows after the barrier change the
//! live groups, never the copy. So a checkpoint of NEXMark q16, whose every group gains
//! bidders each second, writes the new values, not the millions it holds.
//!
//! # Records, version [`GROUP_STATE_VERSION`]
//!
//! `G` is the group's key in the key encoding of [`sluice_types::key`] (empty without
//! `GROUP BY` keys; a key of the plan's key columns is never a prefix of another, so `G`
//! is read back by walking its columns' tags).
//!
//! ```text
//! group   key: G, 0x00                       value: the group's row count and accumulators
//! value   key: G, 0x01, share (u8), value    value: over an append-only input, the members
//!                                                   that saw it (u8, bit m for member m);
//!                                                   otherwise i64 count per member (LE)
//! ```
//!
//! A share is a set of COUNT(DISTINCT)s of one column (at most four, its members, in the
//! order of the aggregates); the value is in the key encoding. A value gone (its counts
//! all 0) is a delete of its record; a set written whole is a range delete of
//! `G 0x01 share` to `G 0x01 share+1` and its values; a group dropped is a delete of its
//! record and a range delete of `G 0x01` to `G 0x02`.
//!
//! The group's value (little-endian): `i64 rows` (the weighted row count), then one
//! accumulator per aggregate: a tag byte, then
//! - `TAG_COUNT`: `i64 count`;
//! - `TAG_SUM_INT`, `TAG_AVG_INT`: `i64 sum`, `i64 count`;
//! - `TAG_SUM_FLOAT`, `TAG_AVG_FLOAT`: `f64 sum`, `i64 count`;
//! - `TAG_MIN_*`, `TAG_MAX_*` (INT, FLOAT, TEXT): `u32 entries`, then per entry in
//!   increasing value order the value (`i64`, `f64`, or `u32 length` + UTF-8) and its
//!   `i64 count`;
//! - `TAG_DISTINCT`: nothing (its values are the value records; its result, the number
//!   of its members' values, is counted again when restored).
//!
//! Version 2 kept a COUNT(DISTINCT)'s values in the group's value (`TAG_DISTINCT`,
//! `u32 entries`, then each value and its count), so a group whose set changed wrote
//! the whole set again; version 1 was a blob per vnode.
//!
//! Decoding checks every length against the remaining bytes and every tag against the
//! operator's aggregates, each group's vnode against its key, and each value record
//! against its group and share: a record from another plan is refused, never misread.

use std::collections::BTreeMap;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, vnode};

use crate::blob::{Reader, Records};

use super::accumulator::{Accumulator, Counts, Multiset, OrderedFloat};
use super::distinct::{DistinctSet, DistinctValues, Listed, SetLog, ValueState};
use super::{Group, GroupAggregate};
use crate::bytes::SmallBytes;
use crate::partition::placement_hash;

/// The record layout this build writes and reads.
pub const GROUP_STATE_VERSION: u32 = 3;

/// The byte after `G` of a group's record, and of its values' records.
pub(super) const GROUP: u8 = 0x00;
pub(super) const VALUE: u8 = 0x01;

const TAG_COUNT: u8 = 1;
const TAG_SUM_INT: u8 = 2;
const TAG_SUM_FLOAT: u8 = 3;
const TAG_AVG_INT: u8 = 4;
const TAG_AVG_FLOAT: u8 = 5;
const TAG_MIN_INT: u8 = 6;
const TAG_MAX_INT: u8 = 7;
const TAG_MIN_FLOAT: u8 = 8;
const TAG_MAX_FLOAT: u8 = 9;
const TAG_MIN_TEXT: u8 = 10;
const TAG_MAX_TEXT: u8 = 11;
const TAG_DISTINCT: u8 = 12;

/// What a snapshot takes of one set.
enum SetCopy {
    /// Nothing changed.
    Same,
    /// Its values that changed.
    Log(Box<SetLog>),
    /// Every value (a full snapshot, or a set to be written whole).
    Whole(DistinctValues),
}

/// What a snapshot takes of one group.
struct GroupCopy {
    key: SmallBytes,
    rows: i64,
    accumulators: Box<[Accumulator]>,
    sets: Vec<SetCopy>,
}

impl GroupCopy {
    /// All of `group` (a full snapshot).
    fn whole(group: &Group) -> GroupCopy {
        let sets = group.distinct.iter().map(|set| SetCopy::Whole(set.values.clone())).collect();
        GroupCopy { key: group.key.clone(), rows: group.rows, accumulators: group.accumulators.clone(), sets }
    }

    /// What changed of `group` since the previous snapshot, its sets' logs taken.
    fn changes(group: &mut Group) -> GroupCopy {
        let sets = group
            .distinct
            .iter_mut()
            .map(|set| match set.log.take() {
                None => SetCopy::Same,
                Some(log) if log.rewrite => SetCopy::Whole(set.values.clone()),
                Some(log) => SetCopy::Log(log),
            })
            .collect();
        GroupCopy { key: group.key.clone(), rows: group.rows, accumulators: group.accumulators.clone(), sets }
    }
}

/// Copies the groups the snapshot takes (every live one unless `delta` and the
/// aggregate kept its changes) and returns the snapshot writing them.
pub(super) fn snapshot(aggregate: &mut GroupAggregate, delta: bool) -> Snapshot {
    let full = !delta || !aggregate.tracking;
    let copy: Vec<GroupCopy> = if full {
        let copy = aggregate.groups.iter().flatten().map(GroupCopy::whole).collect();
        for group in aggregate.groups.iter_mut().flatten() {
            group.distinct.iter_mut().for_each(|set| set.log = None);
        }
        copy
    } else {
        let changed = aggregate.changed.take();
        changed.into_iter().filter_map(|id| aggregate.groups[id as usize].as_mut().map(GroupCopy::changes)).collect()
    };
    let removed = if full { Vec::new() } else { std::mem::take(&mut aggregate.removed) };
    // Groups in cold runs: a full snapshot merges every run (but the groups whose newer
    // copy is in memory, or that were dropped); a delta the groups evicted while changed.
    // Values spilled from sets whose groups stayed in memory: a full snapshot merges
    // them in before the groups in memory, whose copies of a value win (they hold every
    // member the spilled one does, and any added since); a delta has them in the sets'
    // logs already.
    let spilled_values = (aggregate.cold.as_ref())
        .filter(|cold| full && !cold.values.runs().is_empty())
        .map(|cold| cold.values.runs().clone());
    let cold = aggregate.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()).map(|cold| {
        let runs = cold.store.runs().clone();
        if full {
            cold.evicted_dirty.clear();
            let mut shadow = cold.dropped.clone();
            for (id, group) in aggregate.groups.iter().enumerate() {
                if let Some(group) = group.as_ref().filter(|_| cold.marks[id] & super::FROM_COLD != 0) {
                    shadow.insert(group.key.get().to_vec());
                }
            }
            (runs, shadow)
        } else {
            (runs, std::mem::take(&mut cold.evicted_dirty))
        }
    });
    aggregate.clear_changes();
    let columns = aggregate.spec.keys.len();
    let (vnodes, no_keys) = (aggregate.vnodes, aggregate.spec.keys.is_empty());
    let member_of = aggregate.member_of.clone();
    let share_members: Vec<usize> = aggregate.shares.iter().map(|share| share.members.len()).collect();
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        let vnode_of = |key: &[u8]| vnode::of_hash(placement_hash(no_keys, key), vnodes);
        match &cold {
            Some((runs, shadow)) if full => runs.add_live(&mut records, |key| {
                let length =
                    key_length(key, columns).ok_or_else(|| corrupt("a spilled key not of the group's columns"))?;
                Ok(shadow.contains(&key[..length]))
            })?,
            Some((runs, dirty)) => {
                for g in dirty {
                    let (hash, vnode) = (placement_hash(no_keys, g), vnode_of(g));
                    let Some(found) = runs.find(vnode, &group_record_key(g), hash, &follows(g))? else { continue };
                    records.delete_range(vnode, values_start(g), values_end(g));
                    let group = |bytes: &mut Vec<u8>| bytes.extend_from_slice(&found.value);
                    records.add(vnode, |k| group_key(k, g), Some(&group));
                    for (key, state) in &found.following {
                        let value = |bytes: &mut Vec<u8>| bytes.extend_from_slice(state);
                        records.add(vnode, |k| k.extend_from_slice(key), Some(&value));
                    }
                }
            }
            None => {}
        }
        if let Some(runs) = &spilled_values {
            runs.add_live(&mut records, |_| Ok(false))?;
        }
        for group in &copy {
            let (g, vnode) = (group.key.get(), vnode_of(group.key.get()));
            let group_value = |bytes: &mut Vec<u8>| write_group(group, &member_of, bytes);
            records.add(vnode, |k| group_key(k, g), Some(&group_value));
            for (share, set) in group.sets.iter().enumerate() {
                let entries = match set {
                    SetCopy::Same => continue,
                    // A seen set's entries are puts only, the last of a value
                    // winning in `Records` too; a counted value may be put, then gone.
                    SetCopy::Log(log) if log.has_deletes() => last_of_each(log.entries().collect()),
                    SetCopy::Log(log) => log.entries().collect(),
                    SetCopy::Whole(values) => {
                        if !full {
                            records.delete_range(vnode, value_key(g, share, &[]), value_key(g, share + 1, &[]));
                        }
                        values.records()
                    }
                };
                for (value, state) in entries {
                    let key = |k: &mut Vec<u8>| k.extend_from_slice(&value_key(g, share, value.get()));
                    match state {
                        ValueState::Counts(counts) if counts.iter().all(|count| *count == 0) => {
                            records.add(vnode, key, None)
                        }
                        state => {
                            let members = share_members[share];
                            records.add(vnode, key, Some(&|bytes: &mut Vec<u8>| write_state(state, members, bytes)))
                        }
                    }
                }
            }
        }
        for key in &removed {
            add_dropped(&mut records, vnode_of(key), key);
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

/// Where the value records of group `g` start.
fn values_start(g: &[u8]) -> Vec<u8> {
    let mut start = g.to_vec();
    start.push(VALUE);
    start
}

/// Where the value records of group `g` end (exclusive).
fn values_end(g: &[u8]) -> Vec<u8> {
    let mut end = g.to_vec();
    end.push(VALUE + 1);
    end
}

/// The records of group `g` dropped: a delete of its record and of its values.
pub(super) fn add_dropped(records: &mut Records, vnode: u32, g: &[u8]) {
    records.add(vnode, |k| group_key(k, g), None);
    records.delete_range(vnode, values_start(g), values_end(g));
}

/// The records of all of `group` (of vnode `vnode`), as a full snapshot writes them;
/// `stale`: an older copy of it may hold values it no longer has (a range delete of its
/// values comes first).
pub(super) fn add_whole(
    records: &mut Records,
    vnode: u32,
    group: &Group,
    stale: bool,
    member_of: &[Option<(usize, usize)>],
    share_members: &[usize],
) {
    let g = group.key.get();
    if stale {
        records.delete_range(vnode, values_start(g), values_end(g));
    }
    let copy = GroupCopy::whole(group);
    records.add(vnode, |k| group_key(k, g), Some(&|bytes: &mut Vec<u8>| write_group(&copy, member_of, bytes)));
    for (share, set) in copy.sets.iter().enumerate() {
        let SetCopy::Whole(values) = set else { unreachable!("a whole copy holds whole sets") };
        for (value, state) in values.records() {
            let key = |k: &mut Vec<u8>| k.extend_from_slice(&value_key(g, share, value.get()));
            let members = share_members[share];
            records.add(vnode, key, Some(&|bytes: &mut Vec<u8>| write_state(state, members, bytes)));
        }
    }
}

/// The placement hash of the group of a record's key, when it is a group's record (of a
/// plan of `columns` key columns).
pub(super) fn group_hash(columns: usize, no_keys: bool) -> impl Fn(&[u8]) -> Option<u64> {
    move |key: &[u8]| {
        let length = key_length(key, columns)?;
        (key.len() == length + 1 && key[length] == GROUP).then(|| placement_hash(no_keys, &key[..length]))
    }
}

/// The key of group `g`'s record.
pub(super) fn group_record_key(g: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(g.len() + 1);
    group_key(&mut key, g);
    key
}

/// Whether a record's key is one of group `g`'s values (which follow its record).
pub(super) fn follows(g: &[u8]) -> impl Fn(&[u8]) -> bool + '_ {
    move |key: &[u8]| key.len() > g.len() && key.starts_with(g) && key[g.len()] == VALUE
}

/// Loads group `g` (placement hash `hash`) from its records `found` in a cold run;
/// returns its id.
pub(super) fn load_cold(
    aggregate: &mut GroupAggregate,
    g: &[u8],
    hash: u64,
    found: &crate::cold::ColdEntry,
) -> Result<u32, SluiceError> {
    let (id, bytes) = restore_group(aggregate, g, hash, &found.value)?;
    for (key, state) in &found.following {
        let [VALUE, share, value @ ..] = &key[g.len()..] else {
            return Err(corrupt("a spilled record of neither a group nor a value"));
        };
        restore_value(aggregate, id, usize::from(*share), value, state)?;
    }
    complete(aggregate, id, bytes);
    Ok(id)
}

/// Group `id`, whose records are all loaded: each COUNT(DISTINCT)'s result (the number
/// of its values: those in memory added to those counted before they spilled,
/// [`bank_values`]), and its bytes counted again (`bytes` were counted when it was added).
fn complete(aggregate: &mut GroupAggregate, id: u32, bytes: usize) {
    bank_values(aggregate, id, false);
    let now = aggregate.groups[id as usize].as_ref().expect("a restored group is live").bytes();
    if let Some(cold) = aggregate.cold.as_mut() {
        cold.store.charge(now);
        cold.store.release(bytes);
    }
}

/// Adds the values in memory of group `id`, being restored, to its COUNT(DISTINCT)s'
/// results (which start at 0): at its end, or (`spilling`: only the sets that spill)
/// before its sets spill mid-restore.
fn bank_values(aggregate: &mut GroupAggregate, id: u32, spilling: bool) {
    let group = aggregate.groups[id as usize].as_mut().expect("a restored group is live");
    for (accumulator, member) in group.accumulators.iter_mut().zip(&aggregate.member_of) {
        if let (Accumulator::Distinct { positive }, Some((share, member))) = (accumulator, member) {
            let set = &group.distinct[*share];
            if !spilling || set.may_spill() {
                *positive += set.values.positive(*member);
            }
        }
    }
}

/// Writes the values of the seen set `values` (of share `share` of group `g`, of vnode
/// `vnode`) to `sink` as their records, in key order.
pub(super) fn write_spilled(
    sink: &mut dyn StateSink,
    vnode: u32,
    g: &[u8],
    share: usize,
    values: &DistinctValues,
) -> Result<(), SluiceError> {
    let mut key = value_key(g, share, &[]);
    let prefix = key.len();
    values.each_seen_in_order(|value, members| {
        key.truncate(prefix);
        key.extend_from_slice(value);
        sink.put(vnode, &key, &[members])
    })
}

/// Reads back from the spilled `runs` the encoded `value` (hash `hash`) of share `share`
/// of group `g` (of vnode `vnode`), when they hold it, into `set` with its members.
pub(super) fn load_spilled(
    runs: &crate::cold::ColdRuns,
    vnode: u32,
    g: &SmallBytes,
    share: usize,
    value: &[u8],
    hash: u64,
    set: &mut DistinctSet,
) -> Result<(), SluiceError> {
    let Some(state) = runs.find_unfiltered(vnode, &value_key(g.get(), share, value))? else { return Ok(()) };
    let [members] = state[..] else { return Err(corrupt("a spilled value's members are one byte")) };
    set.load_seen(value, hash, members);
    Ok(())
}

/// The last entry of each value of a log (a value logged put, then gone, is gone:
/// `Records` would keep the put).
fn last_of_each<'a>(mut entries: Vec<(Listed<'a>, ValueState<'a>)>) -> Vec<(Listed<'a>, ValueState<'a>)> {
    // Stable: a value's entries stay in the order they were logged.
    entries.sort_by(|a, b| a.0.get().cmp(b.0.get()));
    let mut last: Vec<(Listed<'a>, ValueState<'a>)> = Vec::with_capacity(entries.len());
    for entry in entries {
        match last.last_mut() {
            Some(previous) if previous.0.get() == entry.0.get() => *previous = entry,
            _ => last.push(entry),
        }
    }
    last
}

/// The key of group `g`'s record.
fn group_key(out: &mut Vec<u8>, g: &[u8]) {
    out.extend_from_slice(g);
    out.push(GROUP);
}

/// The key of `value` of share `share` of group `g` (no value: where the share's records
/// start).
fn value_key(g: &[u8], share: usize, value: &[u8]) -> Vec<u8> {
    let share = u8::try_from(share).expect("fewer than 256 COUNT(DISTINCT) shares");
    let mut key = Vec::with_capacity(g.len() + 2 + value.len());
    key.extend_from_slice(g);
    key.push(VALUE);
    key.push(share);
    key.extend_from_slice(value);
    key
}

/// A value record's value: its members (a seen set), or its count per member of the
/// share's `members`.
fn write_state(state: ValueState<'_>, members: usize, bytes: &mut Vec<u8>) {
    match state {
        ValueState::Members(seen) => bytes.push(seen),
        ValueState::Counts(counts) => {
            counts[..members].iter().for_each(|count| bytes.extend_from_slice(&count.to_le_bytes()))
        }
    }
}

/// A group's value: its row count and accumulators (a COUNT(DISTINCT) is only its tag).
fn write_group(group: &GroupCopy, member_of: &[Option<(usize, usize)>], bytes: &mut Vec<u8>) {
    bytes.extend_from_slice(&group.rows.to_le_bytes());
    for (accumulator, member) in group.accumulators.iter().zip(member_of) {
        match member {
            Some(_) => bytes.push(TAG_DISTINCT),
            None => write_accumulator(accumulator, bytes),
        }
    }
}

fn write_bytes(bytes: &mut Vec<u8>, value: &[u8]) {
    let length = u32::try_from(value.len()).expect("a key or value shorter than 4 GiB");
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(value);
}

fn write_entries<K: Ord>(bytes: &mut Vec<u8>, map: &Counts<K>, mut write: impl FnMut(&K, &mut Vec<u8>)) {
    let entries = u32::try_from(map.len()).expect("fewer than 2^32 distinct values in a group");
    bytes.extend_from_slice(&entries.to_le_bytes());
    for (value, count) in map.iter() {
        write(value, bytes);
        bytes.extend_from_slice(&count.to_le_bytes());
    }
}

/// An extreme kept alone, as the entries of its multiset: none while `count` is 0.
fn write_one(bytes: &mut Vec<u8>, value: [u8; 8], count: i64) {
    let entries = u32::from(count != 0);
    bytes.extend_from_slice(&entries.to_le_bytes());
    if count != 0 {
        bytes.extend_from_slice(&value);
        bytes.extend_from_slice(&count.to_le_bytes());
    }
}

fn write_accumulator(accumulator: &Accumulator, bytes: &mut Vec<u8>) {
    let pair = |tag: u8, first: [u8; 8], count: i64, bytes: &mut Vec<u8>| {
        bytes.push(tag);
        bytes.extend_from_slice(&first);
        bytes.extend_from_slice(&count.to_le_bytes());
    };
    match accumulator {
        Accumulator::Count(count) => {
            bytes.push(TAG_COUNT);
            bytes.extend_from_slice(&count.to_le_bytes());
        }
        Accumulator::SumInt { sum, count } => pair(TAG_SUM_INT, sum.to_le_bytes(), *count, bytes),
        Accumulator::AvgInt { sum, count } => pair(TAG_AVG_INT, sum.to_le_bytes(), *count, bytes),
        Accumulator::SumFloat { sum, count } => pair(TAG_SUM_FLOAT, sum.to_le_bytes(), *count, bytes),
        Accumulator::AvgFloat { sum, count } => pair(TAG_AVG_FLOAT, sum.to_le_bytes(), *count, bytes),
        Accumulator::OneInt { value, count, max } => {
            bytes.push(if *max { TAG_MAX_INT } else { TAG_MIN_INT });
            write_one(bytes, value.to_le_bytes(), *count);
        }
        Accumulator::OneFloat { value, count, max } => {
            bytes.push(if *max { TAG_MAX_FLOAT } else { TAG_MIN_FLOAT });
            write_one(bytes, value.to_le_bytes(), *count);
        }
        Accumulator::Extreme { values, max } => match values.as_ref() {
            Multiset::Int(map) => {
                bytes.push(if *max { TAG_MAX_INT } else { TAG_MIN_INT });
                write_entries(bytes, map, |v, b| b.extend_from_slice(&v.to_le_bytes()));
            }
            Multiset::Float(map) => {
                bytes.push(if *max { TAG_MAX_FLOAT } else { TAG_MIN_FLOAT });
                write_entries(bytes, map, |v, b| b.extend_from_slice(&v.0.to_le_bytes()));
            }
            Multiset::Text(map) => {
                bytes.push(if *max { TAG_MAX_TEXT } else { TAG_MIN_TEXT });
                write_entries(bytes, map, |v, b| write_bytes(b, v.as_bytes()));
            }
        },
        Accumulator::Distinct { .. } => unreachable!("a COUNT(DISTINCT) is written from its shared values"),
    }
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "group aggregate";

/// `u32 entries` then each entry's value (read by `value`) and count. Every entry
/// takes at least 9 bytes, so a count the blob cannot hold is refused before any
/// allocation.
fn entries<'a, K: Ord>(
    reader: &mut Reader<'a>,
    mut value: impl FnMut(&mut Reader<'a>) -> Result<K, SluiceError>,
) -> Result<BTreeMap<K, i64>, SluiceError> {
    let entries = reader.u32()? as usize;
    if entries > reader.remaining() / 9 {
        return Err(corrupt("more entries than bytes"));
    }
    let mut map = BTreeMap::new();
    for _ in 0..entries {
        let key = value(reader)?;
        let count = reader.i64()?;
        if count == 0 || map.insert(key, count).is_some() {
            return Err(corrupt("an entry of count 0, or a value twice"));
        }
    }
    Ok(map)
}

/// Reads one accumulator into `accumulator` (an empty one of the expected kind).
fn read_accumulator(accumulator: &mut Accumulator, reader: &mut Reader<'_>) -> Result<(), SluiceError> {
    let tag = reader.u8()?;
    let text = |reader: &mut Reader<'_>| -> Result<std::sync::Arc<str>, SluiceError> {
        std::str::from_utf8(reader.bytes()?).map(Into::into).map_err(|_| corrupt("text is not UTF-8"))
    };
    match (accumulator, tag) {
        (Accumulator::Count(count), TAG_COUNT) => *count = reader.i64()?,
        (Accumulator::SumInt { sum, count }, TAG_SUM_INT) | (Accumulator::AvgInt { sum, count }, TAG_AVG_INT) => {
            *sum = reader.i64()?;
            *count = reader.i64()?;
        }
        (Accumulator::SumFloat { sum, count }, TAG_SUM_FLOAT)
        | (Accumulator::AvgFloat { sum, count }, TAG_AVG_FLOAT) => {
            *sum = reader.f64()?;
            *count = reader.i64()?;
        }
        (Accumulator::OneInt { value, count, max }, TAG_MIN_INT | TAG_MAX_INT) if *max == (tag == TAG_MAX_INT) => {
            // The extreme of what was written (an append-only input's blob holds one).
            let map = entries(reader, Reader::i64)?;
            let extreme = if *max { map.last_key_value() } else { map.first_key_value() };
            (*value, *count) = extreme.map_or((0, 0), |(v, c)| (*v, *c));
        }
        (Accumulator::OneFloat { value, count, max }, TAG_MIN_FLOAT | TAG_MAX_FLOAT)
            if *max == (tag == TAG_MAX_FLOAT) =>
        {
            let map = entries(reader, |r| r.f64().map(OrderedFloat))?;
            let extreme = if *max { map.last_key_value() } else { map.first_key_value() };
            (*value, *count) = extreme.map_or((0.0, 0), |(v, c)| (v.0, *c));
        }
        (Accumulator::Extreme { values, max }, _) => match (values.as_mut(), tag) {
            (Multiset::Int(map), TAG_MIN_INT | TAG_MAX_INT) if *max == (tag == TAG_MAX_INT) => {
                *map = Counts::from_map(entries(reader, Reader::i64)?);
            }
            (Multiset::Float(map), TAG_MIN_FLOAT | TAG_MAX_FLOAT) if *max == (tag == TAG_MAX_FLOAT) => {
                *map = Counts::from_map(entries(reader, |r| r.f64().map(OrderedFloat))?);
            }
            (Multiset::Text(map), TAG_MIN_TEXT | TAG_MAX_TEXT) if *max == (tag == TAG_MAX_TEXT) => {
                *map = Counts::from_map(entries(reader, text)?);
            }
            _ => return Err(corrupt("an accumulator of another kind")),
        },
        _ => return Err(corrupt("an accumulator of another kind")),
    }
    Ok(())
}

/// The length of the key of `columns` key columns at the start of `key` (each column a
/// tag and its bytes, `sluice_types::key`); None when `key` does not start with one.
fn key_length(key: &[u8], columns: usize) -> Option<usize> {
    let mut at = 0;
    for _ in 0..columns {
        let tag = *key.get(at)?;
        at += 1;
        at += match tag {
            0x00 => 0,
            0x01 => 1,
            0x02..=0x04 => 8,
            0x05 => 16,
            0x06 | 0x07 => {
                let length = key.get(at..at + 4)?;
                4 + u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize
            }
            _ => return None,
        };
    }
    (at <= key.len()).then_some(at)
}

/// Loads the groups of `state` (of the vnodes this instance owns) into `aggregate`: each
/// group's record, then its values' records (they follow it in key order).
pub(super) fn restore(aggregate: &mut GroupAggregate, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = aggregate.spec.keys.is_empty();
    let columns = aggregate.spec.keys.len();
    // The group the value records that come belong to: its key, id and bytes counted
    // when it was added.
    let mut current: Option<(Vec<u8>, u32, usize)> = None;
    // Values loaded into the current group since its sets last could spill.
    let mut loaded = 0usize;
    while let Some(record) = state.next_record()? {
        let length = key_length(record.key, columns).ok_or_else(|| corrupt("a key not of the group's columns"))?;
        let (g, rest) = record.key.split_at(length);
        if vnode::of_hash(placement_hash(no_keys, g), aggregate.vnodes) != record.vnode {
            return Err(corrupt("a group under another vnode than its key's"));
        }
        match rest {
            [GROUP] => {
                if let Some((_, id, bytes)) = current.take() {
                    complete(aggregate, id, bytes);
                    // Beyond the memory budget, restored groups go to cold runs.
                    aggregate.evict_over_budget()?;
                }
                let (id, bytes) = restore_group(aggregate, g, placement_hash(no_keys, g), record.value)?;
                current = Some((g.to_vec(), id, bytes));
            }
            [VALUE, share, value @ ..] => {
                let Some((_, id, _)) = current.as_ref().filter(|(key, _, _)| key.as_slice() == g) else {
                    return Err(corrupt("a COUNT(DISTINCT) value without its group"));
                };
                let id = *id;
                restore_value(aggregate, id, usize::from(*share), value, record.value)?;
                loaded += 1;
                if loaded.is_multiple_of(RESTORE_CHECK_VALUES) {
                    spill_restoring(aggregate, id)?;
                }
            }
            _ => return Err(corrupt("a record of neither a group nor a value")),
        }
    }
    if let Some((_, id, bytes)) = current {
        complete(aggregate, id, bytes);
    }
    aggregate.clear_changes();
    aggregate.evict_over_budget()
}

/// The values a group being restored loads between two looks at the budget.
const RESTORE_CHECK_VALUES: usize = 1 << 16;

/// Over an append-only input, spills the sets of group `id`, being restored, when its
/// values grew the space past its budget (NEXMark q16's hot groups hold millions): their
/// results so far banked first ([`bank_values`]).
fn spill_restoring(aggregate: &mut GroupAggregate, id: u32) -> Result<(), SluiceError> {
    let Some(cold) = aggregate.cold.as_ref().filter(|_| aggregate.spec.append_only_input) else { return Ok(()) };
    let space = cold.store.space();
    // Counted in the space only once complete: its bytes now are all growth but a slot.
    let grown = aggregate.groups[id as usize].as_ref().expect("the current group is live").bytes();
    if space.resident().saturating_add(grown) <= space.budget() {
        return Ok(());
    }
    bank_values(aggregate, id, true);
    aggregate.spill_group_values(&[id])?;
    Ok(())
}

/// Restores the group of key `g` (placement hash `hash`) from its record's `value`;
/// returns its id and the bytes counted when it was added.
fn restore_group(
    aggregate: &mut GroupAggregate,
    g: &[u8],
    hash: u64,
    value: &[u8],
) -> Result<(u32, usize), SluiceError> {
    let mut reader = Reader::new(value, STATE);
    let rows = reader.i64()?;
    if rows <= 0 {
        return Err(corrupt("a group without rows"));
    }
    let mut accumulators = aggregate.new_accumulators();
    for (accumulator, member) in accumulators.iter_mut().zip(&aggregate.member_of) {
        match member {
            Some(_) if reader.u8()? == TAG_DISTINCT => {}
            Some(_) => return Err(corrupt("an accumulator of another kind")),
            None => read_accumulator(accumulator, &mut reader)?,
        }
    }
    reader.finish()?;
    let distinct = aggregate.new_distinct();
    if aggregate.find(g, hash).is_some() {
        return Err(corrupt("a group twice"));
    }
    let id = aggregate.insert(g, hash);
    let group = aggregate.groups[id as usize].as_mut().expect("insert returns a live group");
    let bytes = group.bytes();
    group.rows = rows;
    group.accumulators = accumulators.into_boxed_slice();
    group.distinct = distinct;
    Ok((id, bytes))
}

/// Loads `value` of share `share` into group `id`, its state read from `state`.
fn restore_value(
    aggregate: &mut GroupAggregate,
    id: u32,
    share: usize,
    value: &[u8],
    state: &[u8],
) -> Result<(), SluiceError> {
    let members = aggregate.shares.get(share).ok_or_else(|| corrupt("a value of no COUNT(DISTINCT)"))?.members.len();
    let group = aggregate.groups[id as usize].as_mut().expect("the current group is live");
    let set = &mut group.distinct[share].values;
    let hash = sluice_types::key::hash(value);
    let loaded = if aggregate.spec.append_only_input {
        let [seen] = state else { return Err(corrupt("a value's members are one byte")) };
        *seen != 0
            && *seen >> members == 0
            && (0..members).filter(|m| seen & (1 << m) != 0).all(|m| set.load(m, value, hash, 1))
    } else {
        if state.len() != 8 * members {
            return Err(corrupt("a value's counts are one per member"));
        }
        let counts: Vec<i64> =
            state.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        counts.iter().any(|count| *count != 0)
            && counts.iter().enumerate().filter(|(_, c)| **c != 0).all(|(m, c)| set.load(m, value, hash, *c))
    };
    if !loaded {
        return Err(corrupt("a value twice, or one no member holds"));
    }
    Ok(())
}
