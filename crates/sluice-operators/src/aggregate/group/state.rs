//! Snapshots of the group aggregate's state, split by vnode.
//!
//! At a barrier the driver clones the live groups (keys, placement hashes, row counts
//! and accumulators) and returns a job; the checkpoint writer thread encodes the copy
//! into one blob per vnode that holds groups, the vnode of each group's placement hash
//! (the hash the exchange routes by), so a restore onto any number of threads gives each
//! group to the thread its future rows go to. Rows after the barrier change the live
//! groups, never the copy.
//!
//! Layout, version [`GROUP_STATE_VERSION`] (little-endian): `u32 version`, `u32 groups`,
//! then per group, in increasing key order: the key (`u32 length` + its bytes in the key
//! encoding of [`sluice_types::key`]), `i64 rows` (the weighted row count), and one
//! accumulator per aggregate: a tag byte, then
//! - `TAG_COUNT`: `i64 count`;
//! - `TAG_SUM_INT`, `TAG_AVG_INT`: `i64 sum`, `i64 count`;
//! - `TAG_SUM_FLOAT`, `TAG_AVG_FLOAT`: `f64 sum`, `i64 count`;
//! - `TAG_MIN_*`, `TAG_MAX_*` (INT, FLOAT, TEXT): `u32 entries`, then per entry in
//!   increasing value order the value (`i64`, `f64`, or `u32 length` + UTF-8) and its
//!   `i64 count`;
//! - `TAG_DISTINCT`: `u32 entries`, then per entry in increasing byte order the value in
//!   the key encoding (`u32 length` + bytes) and its `i64 count`.
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
//! operator's aggregates: a blob from another plan is refused, never misread.

use std::collections::BTreeMap;

use sluice_runtime::BlobJob;
use sluice_types::SluiceError;

use crate::blob::{BlobWriter, Reader};

use super::accumulator::{Accumulator, Counts, Multiset, OrderedFloat};
use super::distinct::{DistinctValues, Listed};
use super::{Group, GroupAggregate};
use crate::partition::{in_vnode_order, placement_hash};

/// The blob layout this build writes and reads.
pub const GROUP_STATE_VERSION: u32 = 1;
const VERSION: u32 = GROUP_STATE_VERSION;

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

/// Copies the live groups and returns the job that encodes them; None without state.
pub(super) fn snapshot(aggregate: &GroupAggregate) -> Option<BlobJob> {
    let copy: Vec<Group> = aggregate.groups.iter().flatten().cloned().collect();
    if copy.is_empty() {
        return None;
    }
    let (vnodes, no_keys) = (aggregate.vnodes, aggregate.spec.keys.is_empty());
    let member_of = aggregate.member_of.clone();
    Some(Box::new(move || encode(copy, vnodes, no_keys, &member_of)))
}

/// One blob per vnode holding groups, in vnode order, each group in increasing key
/// order ([`BlobWriter::encode_by_vnode`]). `member_of`: each aggregate's shared
/// COUNT(DISTINCT) set and member there.
fn encode(
    groups: Vec<Group>,
    vnodes: u32,
    no_keys: bool,
    member_of: &[Option<(usize, usize)>],
) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
    let groups = in_vnode_order(groups, vnodes, no_keys, |group| group.key.get());
    BlobWriter::encode_by_vnode(VERSION, groups, |group, bytes| {
        write_bytes(bytes, group.key.get());
        bytes.extend_from_slice(&group.rows.to_le_bytes());
        for (accumulator, member) in group.accumulators.iter().zip(member_of) {
            match member {
                Some((share, member)) => write_distinct(&group.distinct[*share].entries(*member), bytes),
                None => write_accumulator(accumulator, bytes),
            }
        }
        Ok(())
    })
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

/// Loads the groups of `blobs` (of the vnodes this instance owns) into `aggregate`.
pub(super) fn restore(aggregate: &mut GroupAggregate, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    let no_keys = aggregate.spec.keys.is_empty();
    for blob in blobs {
        let mut reader = Reader::new(&blob, STATE);
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        let count = reader.u32()?;
        for _ in 0..count {
            let key = reader.bytes()?;
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
            let id = aggregate.group_of(key, placement_hash(no_keys, key));
            let group = aggregate.groups[id as usize].as_mut().expect("group_of returns a live group");
            if group.rows != 0 {
                return Err(corrupt("a key appears twice (in two vnodes)"));
            }
            group.rows = rows;
            group.accumulators = accumulators.into_boxed_slice();
            group.distinct = distinct;
        }
        reader.finish()?;
    }
    Ok(())
}
