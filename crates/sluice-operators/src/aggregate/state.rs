//! Snapshots of the window aggregate's state as records (`sluice_state`): one per group
//! of each open window, under the vnode of the group key's placement hash (the hash the
//! exchange routes by), so a restore onto any number of threads gives each group to the
//! thread its future rows go to.
//!
//! # What a snapshot takes
//!
//! In full (the first snapshot, the first after a snapshot that was not written, or
//! once every window was emitted): every group of every open window. As a delta, what
//! changed since the previous snapshot: in each open window, the groups added since (a
//! window's groups are only appended, so these are the ones past the count it had then)
//! and the older groups a row updated since (a bit per group, set as rows are folded:
//! one comparison per row, and one bit test for a row of an older group); and, if
//! windows were emitted since, one range delete per vnode the instance's runs may hold
//! (see below) of every window ending at or before the last one emitted. No open window
//! ends there: a row of such a window is late, and emission goes in end order.
//!
//! Groups evicted beyond the memory budget (see the module documentation of
//! `crate::aggregate`) are in cold runs of these same records: a full snapshot merges in
//! the runs' records of the windows still open (a group read back since is added again
//! from memory, after, and wins). An eviction also writes the records of the groups it
//! takes that changed since the previous snapshot to the next delta's records (sorted
//! in a bounded batch, beyond it in scratch files in `state_dir`), which leaves out
//! those of the windows emitted by then. A restore evicts as it loads.
//!
//! # The copy at the barrier
//!
//! The driver copies what the snapshot takes out of each window's flat columns
//! ([`Groups`]) into the previous snapshot's buffers, handed back by its job (the
//! largest buffers to the largest copies): the groups added since are one memory copy
//! per column, the older changed ones gathered one by one, a full snapshot's are copies
//! of whole columns. The job, on the checkpoint writer's thread, writes the copy's
//! records, then grows the buffers by half and touches the new pages (so the next copy
//! neither reallocates nor page-faults on the driver unless it is larger than that),
//! and hands them back. Processing resumes right after the copy. Version 2 copied every
//! window whole at each checkpoint (only a window's new keys were skipped for a window
//! copied before); a delta makes that trick moot, but a delta still copies columns of
//! millions of values when a window fills between two checkpoints (a tumbling window
//! as long as the interval), which is what reusing warm buffers keeps cheap: it stays.
//!
//! # Records, version [`WINDOW_STATE_VERSION`]
//!
//! ```text
//! key    window end (8 bytes: the i64 big-endian with its sign bit flipped, so that
//!        byte order is time order), then the group key in the key encoding of
//!        [`sluice_types::key`] (the GROUP BY columns other than the window's, in order;
//!        empty without them)
//! value  i64 window start (little-endian), then one accumulator per aggregate, in the
//!        aggregates' order: a tag byte and its value (little-endian)
//!          0 NULL   (nothing)              SUM, MIN, MAX of no value yet
//!          1 INT    i64                    COUNT, COUNT(*); SUM, MIN, MAX of integers
//!          2 FLOAT  f64                    SUM, MIN, MAX of floats
//!          3 TEXT   u32 length + UTF-8     MIN, MAX of text
//!          4 AVG    f64 sum + i64 count    AVG
//!          5 SET    u32 count, then each value (u32 length + its bytes in the key
//!                   encoding of the argument's type), in increasing byte order
//!                                          COUNT(DISTINCT)
//! vnode  of the group key's placement hash (`crate::partition::placement_hash`: the
//!        key's hash, 0 without keys)
//! ```
//!
//! Windows emitted by watermark `w` are deleted by range: for each vnode from the lowest
//! to the highest of the groups a snapshot of the instance took or its restore loaded
//! (a contiguous part of the instance's vnodes, since a thread owns a range of them:
//! every vnode that may hold one of its records), from `end(i64::MIN)` to `end(e + 1)`,
//! `e` the end of the last window emitted. A window ending at `i64::MAX` leaves no such
//! bound: once it is emitted, every window is, and the next snapshot is full (and
//! empty).
//!
//! Version 2 was a blob per vnode: `u32 version`, `u32 windows`, then per window `i64
//! end`, `i64 start`, `u32 groups`, then per group its key (`u32 length` + bytes) and the
//! accumulators as above. Restoring checks every length against the remaining bytes,
//! every tag against its aggregate, the vnode against the key, the key against the
//! GROUP BY columns' canonical key encoding, a window's start against its other groups'
//! and its end, and a set's values' order: a record from another plan or a damaged one
//! is refused (`state.corrupt`), never misread, and never panics.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, vnode};

use crate::blob::{Reader, Records, check_keys, from_ordered_i64, ordered_i64};
use crate::cold::ColdRuns;
use crate::partition::placement_hash;

use super::{Accumulators, Groups, WindowAggregate, WindowGroups};

/// The record layout this build writes and reads. Version 3: records per group (see
/// the module doc); version 2: a blob per vnode with keys and COUNT(DISTINCT) values in
/// the key encoding; version 1 held Arrow's row format.
pub const WINDOW_STATE_VERSION: u32 = 3;

/// One window's groups as a snapshot copied them.
#[derive(Default)]
pub(super) struct Frozen {
    end: i64,
    start: i64,
    groups: Groups,
}

/// Copies what the snapshot takes (everything unless `delta` and the windows kept their
/// changes) and returns the snapshot writing it.
pub(super) fn snapshot(aggregate: &mut WindowAggregate, delta: bool) -> Snapshot {
    let full = !delta || !aggregate.tracking || aggregate.emitted_through == Some(i64::MAX);
    let mut spare = std::mem::take(&mut *aggregate.spare.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    let mut selections: Vec<(i64, &WindowGroups, &[u32], usize)> = (aggregate.windows.iter())
        .map(|(end, window)| {
            let (ids, from) = selection(window, full);
            (*end, window, ids, from)
        })
        .filter(|(_, window, ids, from)| !ids.is_empty() || *from < window.groups.len())
        .collect();
    selections.sort_by_key(|(_, window, ids, from)| Reverse(ids.len() + window.groups.len() - from));
    spare.sort_by_key(|copy| Reverse(copy.groups.key_bytes.capacity()));
    spare.truncate(selections.len());
    let mut spare = spare.into_iter();
    let mut frozen: Vec<Frozen> = Vec::with_capacity(selections.len());
    let mut written_hashes = aggregate.written_hashes;
    for (end, window, ids, from) in selections {
        let mut copy = spare.next().unwrap_or_default();
        (copy.end, copy.start) = (end, window.start);
        copy.groups.copy_selected(&window.groups, ids, from);
        for &hash in &copy.groups.hashes {
            written_hashes = widen(written_hashes, hash);
        }
        frozen.push(copy);
    }
    // Groups in cold runs: a full snapshot merges the runs' records of the open windows
    // in (a group read back since has its copy in memory added after its run's, and the
    // last put added wins: `crate::records`); a delta the records of the groups evicted
    // while changed since the previous snapshot, written as they were evicted, but those
    // of the windows emitted since (likewise overwritten by the copies in memory).
    let cold: Option<ColdShare> = aggregate.cold.as_mut().and_then(|cold| {
        written_hashes = cold.hashes.map_or(written_hashes, |(low, high)| widen(widen(written_hashes, low), high));
        let dirty = cold.evicted_dirty.take();
        if full {
            let open = aggregate.windows.iter().filter(|(_, window)| window.cold).map(|(end, _)| *end).collect();
            (!cold.store.runs().is_empty()).then(|| ColdShare::Full { runs: cold.store.runs().clone(), open })
        } else {
            let open = aggregate.windows.keys().copied().collect();
            dirty.map(|dirty| ColdShare::Delta { dirty, open })
        }
    });
    let emitted = aggregate.emitted_through.take().filter(|_| !full);
    let vnodes = aggregate.vnodes;
    // The vnodes whose runs may hold the emitted windows' records.
    let deletes = emitted.zip(written_hashes).map(|(through, (low, high))| {
        let end = through.checked_add(1).expect("a full snapshot follows a window ending at i64::MAX");
        (end, vnode::of_hash(low, vnodes)..vnode::of_hash(high, vnodes) + 1)
    });
    aggregate.windows.values_mut().for_each(WindowGroups::clear_changes);
    (aggregate.tracking, aggregate.written_hashes) = (true, written_hashes);
    let spare = Arc::clone(&aggregate.spare);
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut frozen = frozen;
        let mut records = Records::for_sink(sink);
        match cold {
            Some(ColdShare::Full { runs, open }) => runs.add_live(&mut records, |key| {
                Ok(key.len() < 8 || !open.contains(&from_ordered_i64(key[..8].try_into().expect("8 bytes"))))
            })?,
            Some(ColdShare::Delta { dirty, open }) => {
                dirty.write(&mut Into { records: &mut records, open: &open })?;
            }
            None => {}
        }
        for copy in &frozen {
            write_window(&mut records, copy, vnodes);
        }
        if let Some((end, vnodes)) = deletes {
            let (start, end) = (ordered_i64(i64::MIN).to_vec(), ordered_i64(end).to_vec());
            for vnode in vnodes {
                records.delete_range(vnode, start.clone(), end.clone());
            }
        }
        records.write(sink)?;
        // State grows between checkpoints: map the next copy's memory here, not on the
        // driver.
        frozen.iter_mut().for_each(|copy| copy.groups.warm());
        *spare.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = frozen;
        Ok(())
    });
    Snapshot { kind, job }
}

/// A snapshot's share of the cold runs (see [`snapshot`]).
enum ColdShare {
    /// Every live record of the windows `open`.
    Full { runs: ColdRuns, open: BTreeSet<i64> },
    /// The records of groups evicted while changed, but those of windows not in `open`.
    Delta { dirty: Records, open: BTreeSet<i64> },
}

/// A sink adding the puts of the windows `open` to `records`.
struct Into<'a> {
    records: &'a mut Records,
    open: &'a BTreeSet<i64>,
}

impl StateSink for Into<'_> {
    fn interleave(&mut self) {}

    fn delete_range(&mut self, _: u32, _: &[u8], _: &[u8]) -> Result<(), SluiceError> {
        unreachable!("evicted groups are puts")
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError> {
        let end = from_ordered_i64(key[..8].try_into().expect("a group's key starts with its window's end"));
        if self.open.contains(&end) {
            self.records.add(vnode, |k| k.extend_from_slice(key), Some(&|v: &mut Vec<u8>| v.extend_from_slice(value)));
        }
        Ok(())
    }

    fn delete(&mut self, _: u32, _: &[u8]) -> Result<(), SluiceError> {
        unreachable!("evicted groups are puts")
    }
}

/// What a snapshot takes of `window`: its older groups changed since the previous
/// snapshot, and where the groups added since start (`full`: every group).
fn selection(window: &WindowGroups, full: bool) -> (&[u32], usize) {
    if full { (&[], 0) } else { (&window.changed, window.written) }
}

/// The lowest and highest of `span` and `hash`.
pub(super) fn widen(span: Option<(u64, u64)>, hash: u64) -> Option<(u64, u64)> {
    Some(span.map_or((hash, hash), |(low, high)| (low.min(hash), high.max(hash))))
}

/// The records of one window's copied groups.
fn write_window(records: &mut Records, copy: &Frozen, vnodes: u32) {
    write_groups(records, copy.end, copy.start, &copy.groups, 0..copy.groups.len(), vnodes);
}

/// The records of `groups`' groups `range`, of the window `[start, end)`.
pub(super) fn write_groups(
    records: &mut Records,
    end: i64,
    start: i64,
    groups: &Groups,
    ids: impl IntoIterator<Item = usize>,
    vnodes: u32,
) {
    for group in ids {
        let key = |out: &mut Vec<u8>| super::record_key(end, groups.key(group), out);
        let value = |out: &mut Vec<u8>| {
            out.extend_from_slice(&start.to_le_bytes());
            for accumulators in &groups.accumulators {
                write_value(accumulators, group, out);
            }
        };
        records.add(vnode::of_hash(groups.hashes[group], vnodes), key, Some(&value));
    }
}

/// Reads a group's record value (its window's start aside) into `group` of
/// `accumulators`.
pub(super) fn read_group(accumulators: &mut [Accumulators], group: usize, value: &[u8]) -> Result<(), SluiceError> {
    let mut reader = Reader::new(value, STATE);
    reader.i64()?;
    for accumulators in accumulators {
        read_value(accumulators, group, &mut reader)?;
    }
    reader.finish()
}

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;
const TAG_AVG: u8 = 4;
const TAG_SET: u8 = 5;

fn write_value(accumulators: &Accumulators, group: usize, bytes: &mut Vec<u8>) {
    let int = |value: Option<i64>, bytes: &mut Vec<u8>| match value {
        Some(value) => {
            bytes.push(TAG_INT);
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        None => bytes.push(TAG_NULL),
    };
    match accumulators {
        Accumulators::Count(counts) => int(Some(counts[group]), bytes),
        Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => int(values[group], bytes),
        Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => match values[group] {
            Some(value) => {
                bytes.push(TAG_FLOAT);
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Accumulators::MinMaxString { values, .. } => match &values[group] {
            Some(text) => {
                bytes.push(TAG_TEXT);
                bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Accumulators::Avg { sums, counts } => {
            bytes.push(TAG_AVG);
            bytes.extend_from_slice(&sums[group].to_le_bytes());
            bytes.extend_from_slice(&counts[group].to_le_bytes());
        }
        Accumulators::Distinct(sets) => {
            bytes.push(TAG_SET);
            bytes.extend_from_slice(&(sets[group].len() as u32).to_le_bytes());
            let mut values: Vec<&Box<[u8]>> = sets[group].iter().collect();
            values.sort();
            for value in values {
                bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
                bytes.extend_from_slice(value);
            }
        }
    }
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "window aggregate";

/// Loads the groups of `state` (of the vnodes this instance owns) into `aggregate`.
pub(super) fn restore(aggregate: &mut WindowAggregate, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = aggregate.spec.keys.is_empty();
    let mut written_hashes: Option<(u64, u64)> = None;
    let mut unchecked = 0;
    while let Some(record) = state.next_record()? {
        if record.key.len() < 8 {
            return Err(corrupt("a key shorter than its window's end"));
        }
        let (end, key) = record.key.split_at(8);
        let end = from_ordered_i64(end.try_into().expect("8 bytes"));
        let hash = placement_hash(no_keys, key);
        if vnode::of_hash(hash, aggregate.vnodes) != record.vnode {
            return Err(corrupt("a group under another vnode than its key's"));
        }
        let mut reader = Reader::new(record.value, STATE);
        let start = reader.i64()?;
        if start >= end {
            return Err(corrupt("a window that ends before it starts"));
        }
        if !aggregate.windows.contains_key(&end) {
            let window = WindowGroups::new(start, aggregate.new_accumulators());
            aggregate.windows.insert(end, window);
        }
        let window = aggregate.windows.get_mut(&end).expect("inserted above");
        if window.start != start {
            return Err(corrupt("a window with two starts"));
        }
        let fresh = window.groups.len();
        let group = window.group_of(key, hash);
        if group != fresh {
            return Err(corrupt("a group twice in its window"));
        }
        for accumulators in &mut window.groups.accumulators {
            read_value(accumulators, group, &mut reader)?;
        }
        reader.finish()?;
        window.bytes += window.groups.accumulators.iter().map(|a| a.variable_bytes(group)).sum::<usize>();
        written_hashes = widen(written_hashes, hash);
        unchecked += 1;
        if unchecked == RESTORE_CHECK_RECORDS {
            unchecked = 0;
            if aggregate.over_budget() {
                // Beyond the memory budget, restored windows go to cold runs, checked first.
                check_groups(aggregate)?;
                aggregate.evict_over_budget()?;
            }
        }
    }
    check_groups(aggregate)?;
    aggregate.evict_over_budget()?;
    aggregate.windows.values_mut().for_each(WindowGroups::clear_changes);
    (aggregate.tracking, aggregate.emitted_through, aggregate.written_hashes) = (true, None, written_hashes);
    Ok(())
}

/// Restored records checked (and, beyond the budget, evicted) at a time.
const RESTORE_CHECK_RECORDS: usize = 4096;

/// Checks the keys of the groups in memory against the GROUP BY columns' encoding.
fn check_groups(aggregate: &WindowAggregate) -> Result<(), SluiceError> {
    for window in aggregate.windows.values() {
        let groups = &window.groups;
        check_keys(&aggregate.key_encoder, (0..groups.len()).map(|group| groups.key(group)), STATE, "a group key")?;
    }
    Ok(())
}

fn read_value(accumulators: &mut Accumulators, group: usize, reader: &mut Reader<'_>) -> Result<(), SluiceError> {
    let tag = reader.u8()?;
    match (accumulators, tag) {
        (Accumulators::Count(counts), TAG_INT) => counts[group] = reader.i64()?,
        (Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. }, TAG_INT) => {
            values[group] = Some(reader.i64()?)
        }
        (Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. }, TAG_FLOAT) => {
            values[group] = Some(reader.f64()?)
        }
        (Accumulators::MinMaxString { values, .. }, TAG_TEXT) => {
            let text = std::str::from_utf8(reader.bytes()?).map_err(|_| corrupt("text is not UTF-8"))?;
            values[group] = Some(text.to_string());
        }
        (Accumulators::Avg { sums, counts }, TAG_AVG) => {
            sums[group] = reader.f64()?;
            counts[group] = reader.i64()?;
        }
        (Accumulators::Distinct(sets), TAG_SET) => {
            let count = reader.u32()?;
            let mut previous: Option<&[u8]> = None;
            for _ in 0..count {
                let value = reader.bytes()?;
                if previous.is_some_and(|previous| previous >= value) {
                    return Err(corrupt("a set's values out of order"));
                }
                sets[group].insert(value.into());
                previous = Some(value);
            }
        }
        (
            Accumulators::SumInt(_)
            | Accumulators::MinMaxInt { .. }
            | Accumulators::SumFloat(_)
            | Accumulators::MinMaxFloat { .. }
            | Accumulators::MinMaxString { .. },
            TAG_NULL,
        ) => {}
        _ => return Err(corrupt("an accumulator of another kind")),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
