//! Snapshots of the group aggregate's state as records (`sluice_state`): one per
//! group, under the vnode of its key's placement hash (the hash the exchange routes by),
//! so a restore onto any number of threads gives each group to the thread its future
//! rows go to.
//!
//! At a barrier the driver clones the groups the snapshot takes and returns a job that
//! writes them on the checkpoint writer's thread: every live group (a full snapshot), or
//! the groups changed since the previous snapshot (every group a mini-batch touched
//! since) and a delete for each group dropped since (a delta). Rows after the barrier
//! change the live groups, never the copy.
//!
//! # Records, version [`GROUP_STATE_VERSION`]
//!
//! The key is the group's key in the key encoding of [`sluice_types::key`] (empty without
//! `GROUP BY` keys). The value (little-endian): `i64 rows` (the weighted row count), then
//! one accumulator per aggregate: a tag byte, then
//! - `TAG_COUNT`: `i64 count`;
//! - `TAG_SUM_INT`, `TAG_AVG_INT`: `i64 sum`, `i64 count`;
//! - `TAG_SUM_FLOAT`, `TAG_AVG_FLOAT`: `f64 sum`, `i64 count`;
//! - `TAG_MIN_*`, `TAG_MAX_*` (INT, FLOAT, TEXT): `u32 entries`, then per entry in
//!   increasing value order the value (`i64`, `f64`, or `u32 length` + UTF-8) and its
//!   `i64 count`;
//! - `TAG_DISTINCT`: `u32 entries`, then per entry in increasing byte order the value in
//!   the key encoding (`u32 length` + bytes) and its `i64 count`.
//!
//! Version 1 was a blob per vnode: `u32 version`, `u32 groups`, then per group its key
//! (`u32 length` + bytes) and this value. A COUNT(DISTINCT)'s values are in the group's
//! value, so a group whose set changed writes its whole set again (a set of millions, as
//! NEXMark q16 keeps, costs its size at each checkpoint that touches it).
//!
//! COUNT(DISTINCT) aggregates of one column share one set of values per group in memory
//! ([`super::distinct`]); each still writes its own entries (the values of nonzero count
//! for it), so the layout is the one it was when each kept its own map. Over an
//! append-only input (the plan says so, and the plan's fingerprint is in the manifest)
//! a COUNT(DISTINCT) keeps only whether it saw each value: it writes a count of 1, and
//! reads any positive count (an earlier build wrote the number of rows) as seen; the
//! result, the number of values, is the same either way.
//!
//! Decoding checks every length against the remaining bytes and every tag against the
//! operator's aggregates, and each group's vnode against its key: a record from another
//! plan is refused, never misread.

use std::collections::BTreeMap;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, vnode};

use crate::blob::{Reader, Records};

use super::accumulator::{Accumulator, Counts, Multiset, OrderedFloat};
use super::distinct::{DistinctValues, Listed};
use super::{Group, GroupAggregate};
use crate::partition::placement_hash;

/// The record layout this build writes and reads.
pub const GROUP_STATE_VERSION: u32 = 2;

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

/// Copies the groups the snapshot takes (every live one unless `delta` and the
/// aggregate kept its changes) and returns the snapshot writing them.
pub(super) fn snapshot(aggregate: &mut GroupAggregate, delta: bool) -> Snapshot {
    let full = !delta || !aggregate.tracking;
    let copy: Vec<Group> = if full {
        aggregate.groups.iter().flatten().cloned().collect()
    } else {
        aggregate.changed.take().into_iter().filter_map(|id| aggregate.groups[id as usize].clone()).collect()
    };
    let removed = if full { Vec::new() } else { std::mem::take(&mut aggregate.removed) };
    aggregate.clear_changes();
    let (vnodes, no_keys) = (aggregate.vnodes, aggregate.spec.keys.is_empty());
    let member_of = aggregate.member_of.clone();
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        let vnode_of = |key: &[u8]| vnode::of_hash(placement_hash(no_keys, key), vnodes);
        for group in &copy {
            let value = |bytes: &mut Vec<u8>| write_group(group, &member_of, bytes);
            records.add(vnode_of(group.key.get()), |k| k.extend_from_slice(group.key.get()), Some(&value));
        }
        for key in &removed {
            records.add(vnode_of(key), |k| k.extend_from_slice(key), None);
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

/// A group's value: its row count and accumulators. `member_of`: each aggregate's shared
/// COUNT(DISTINCT) set and member there.
fn write_group(group: &Group, member_of: &[Option<(usize, usize)>], bytes: &mut Vec<u8>) {
    bytes.extend_from_slice(&group.rows.to_le_bytes());
    for (accumulator, member) in group.accumulators.iter().zip(member_of) {
        match member {
            Some((share, member)) => write_distinct(&group.distinct[*share].entries(*member), bytes),
            None => write_accumulator(accumulator, bytes),
        }
    }
}

/// A COUNT(DISTINCT)'s values of nonzero count, in increasing byte order.
fn write_distinct(entries: &[(Listed<'_>, i64)], bytes: &mut Vec<u8>) {
    bytes.push(TAG_DISTINCT);
    let count = u32::try_from(entries.len()).expect("fewer than 2^32 distinct values in a group");
    bytes.extend_from_slice(&count.to_le_bytes());
    for (value, count) in entries {
        write_bytes(bytes, value.get());
        bytes.extend_from_slice(&count.to_le_bytes());
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

/// Reads a COUNT(DISTINCT)'s entries into `member` of `values` (empty for it), and its
/// result into `accumulator`.
fn read_distinct(
    accumulator: &mut Accumulator,
    values: &mut DistinctValues,
    member: usize,
    reader: &mut Reader<'_>,
) -> Result<(), SluiceError> {
    if reader.u8()? != TAG_DISTINCT {
        return Err(corrupt("an accumulator of another kind"));
    }
    let entries = reader.u32()? as usize;
    if entries > reader.remaining() / 12 {
        return Err(corrupt("more entries than bytes"));
    }
    for _ in 0..entries {
        let value = reader.bytes()?;
        let count = reader.i64()?;
        if count == 0 || !values.load(member, value, sluice_types::key::hash(value), count) {
            return Err(corrupt("an entry of count 0, or a value twice"));
        }
    }
    let Accumulator::Distinct { positive } = accumulator else {
        return Err(SluiceError::internal("group.state", "a COUNT(DISTINCT) without its accumulator"));
    };
    *positive = values.positive(member);
    Ok(())
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

/// Loads the groups of `state` (of the vnodes this instance owns) into `aggregate`.
pub(super) fn restore(aggregate: &mut GroupAggregate, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = aggregate.spec.keys.is_empty();
    while let Some(record) = state.next_record()? {
        let key = record.key;
        if vnode::of_hash(placement_hash(no_keys, key), aggregate.vnodes) != record.vnode {
            return Err(corrupt("a group under another vnode than its key's"));
        }
        let mut reader = Reader::new(record.value, STATE);
        let rows = reader.i64()?;
        if rows <= 0 {
            return Err(corrupt("a group without rows"));
        }
        let mut accumulators = aggregate.new_accumulators();
        let mut distinct = aggregate.new_distinct();
        for (accumulator, member) in accumulators.iter_mut().zip(&aggregate.member_of) {
            match member {
                Some((share, member)) => read_distinct(accumulator, &mut distinct[*share], *member, &mut reader)?,
                None => read_accumulator(accumulator, &mut reader)?,
            }
        }
        reader.finish()?;
        let id = aggregate.group_of(key, placement_hash(no_keys, key));
        let group = aggregate.groups[id as usize].as_mut().expect("group_of returns a live group");
        group.rows = rows;
        group.accumulators = accumulators.into_boxed_slice();
        group.distinct = distinct;
    }
    aggregate.clear_changes();
    Ok(())
}
