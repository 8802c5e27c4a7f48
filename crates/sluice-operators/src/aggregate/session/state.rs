//! Snapshots of the session aggregate's open sessions as records (`sluice_state`): one
//! per key, under the vnode of the key's placement hash (the hash the exchange routes
//! by), so a restore onto any number of threads gives each key to the thread its future
//! rows go to.
//!
//! At a barrier the driver clones the keys the snapshot takes and returns a job that
//! writes them on the checkpoint writer's thread: every key with open sessions (a full
//! snapshot), or the keys whose sessions changed since the previous snapshot (a row
//! merged into one, or one was emitted while others stay open) and a delete for each key
//! whose sessions all closed since (a delta). Rows after the barrier change the live
//! sessions, never the copy. Keys evicted beyond the memory budget (`crate::cold`) are
//! in runs of these same records: a full snapshot merges the runs in (but the keys whose
//! newer copy is in memory or that were dropped), and a delta writes again, from their
//! runs, the keys evicted while changed. A restore evicts as it loads.
//!
//! # Records, version [`SESSION_STATE_VERSION`]
//!
//! ```text
//! key    the key in the key encoding of [`sluice_types::key`] (the GROUP BY columns
//!        other than the window's, in order; empty without them)
//! value  u32 sessions (at least 1), then per session, in start order: i64 start, i64
//!        end, and one partial result per aggregate, in the aggregates' order: a tag
//!        byte and its value (little-endian)
//!          0 NULL   (nothing)              SUM, MIN, MAX of no value yet
//!          1 INT    i64                    COUNT, COUNT(*); SUM, MIN, MAX of integers
//!          2 FLOAT  f64                    SUM, MIN, MAX of floats
//!          3 TEXT   u32 length + UTF-8     MIN, MAX of text
//!          4 AVG    f64 sum + i64 count    AVG
//!          5 SET    u32 count, then each value (u32 length + its bytes in the key
//!                   encoding of the argument's type), in increasing byte order
//!                                          COUNT(DISTINCT)
//! vnode  of the key's placement hash (`crate::partition::placement_hash`: the key's
//!        hash, 0 without keys)
//! ```
//!
//! A key whose sessions all closed is a delete. Version 1 was a blob per vnode: `u32
//! version`, `u32 keys`, then per key (in key byte order) the key (`u32 length` + bytes)
//! and this value. Restoring checks every length against the remaining bytes, every tag
//! against its aggregate, the vnode against the key, the key against the GROUP BY
//! columns' canonical key encoding, that each session is not empty and comes after the
//! previous one without touching it, and a set's values' order: a record from another
//! plan or a damaged one is refused (`state.corrupt`), never misread, and never panics.

use std::collections::BTreeSet;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, vnode};

use crate::blob::{Reader, Records, check_keys};
use crate::partition::placement_hash;

use super::{KeySessions, Partial, Session, SessionAggregate, key_bytes};
use crate::cold::{ColdRuns, FROM_COLD, Keys};

/// The record layout this build writes and reads.
pub const SESSION_STATE_VERSION: u32 = 2;

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;
const TAG_AVG: u8 = 4;
const TAG_SET: u8 = 5;

/// Clones the keys the snapshot takes (every one unless `delta` and the aggregate kept
/// its changes) and returns the snapshot writing them.
pub(super) fn snapshot(aggregate: &mut SessionAggregate, delta: bool) -> Snapshot {
    let full = !delta || !aggregate.tracking;
    let copy: Vec<(Box<[u8]>, KeySessions)> = if full {
        aggregate.keys.iter().map(|(key, sessions)| (key.clone(), sessions.clone())).collect()
    } else {
        let mut copy = Vec::with_capacity(aggregate.changed.len());
        for key in std::mem::take(&mut aggregate.changed) {
            // A key closed since and back again may be listed twice: taken once.
            if let Some(entry) = aggregate.keys.get_mut(&key).filter(|entry| entry.changed) {
                entry.changed = false;
                copy.push((key, entry.clone()));
            }
        }
        copy
    };
    let closed = if full { Vec::new() } else { std::mem::take(&mut aggregate.closed) };
    // Keys in cold runs: a full snapshot merges every run (but the keys whose newer copy
    // is in memory, or that were dropped); a delta the keys evicted while changed.
    let cold: Option<(ColdRuns, Keys)> =
        aggregate.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()).map(|cold| {
            let runs = cold.store.runs().clone();
            if full {
                cold.evicted_dirty.clear();
                let mut shadow = cold.dropped.clone();
                for (key, entry) in &aggregate.keys {
                    if entry.marks & FROM_COLD != 0 {
                        shadow.insert(key.to_vec());
                    }
                }
                (runs, shadow)
            } else {
                (runs, std::mem::take(&mut cold.evicted_dirty))
            }
        });
    aggregate.clear_changes();
    let (vnodes, no_keys) = (aggregate.vnodes, aggregate.spec.keys.is_empty());
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        if let Some((runs, keys)) = &cold {
            runs.add_to_snapshot(&mut records, full, keys, &|key| placement_hash(no_keys, key), vnodes)?;
        }
        for (key, sessions) in &copy {
            let value = |bytes: &mut Vec<u8>| write_sessions(&sessions.sessions, bytes);
            records.add(vnode::of_hash(sessions.hash, vnodes), |k| k.extend_from_slice(key), Some(&value));
        }
        for key in &closed {
            records.add(vnode::of_hash(placement_hash(no_keys, key), vnodes), |k| k.extend_from_slice(key), None);
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

/// A key's value: its sessions, each with its partial results.
pub(super) fn write_sessions(sessions: &[Session], bytes: &mut Vec<u8>) {
    bytes.extend_from_slice(&u32::try_from(sessions.len()).expect("fewer than 2^32 sessions per key").to_le_bytes());
    for session in sessions {
        bytes.extend_from_slice(&session.start.to_le_bytes());
        bytes.extend_from_slice(&session.end.to_le_bytes());
        session.partials.iter().for_each(|partial| write_partial(partial, bytes));
    }
}

fn write_partial(partial: &Partial, bytes: &mut Vec<u8>) {
    let int = |value: Option<i64>, bytes: &mut Vec<u8>| match value {
        Some(value) => {
            bytes.push(TAG_INT);
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        None => bytes.push(TAG_NULL),
    };
    match partial {
        Partial::Count(count) => int(Some(*count), bytes),
        Partial::SumInt(value) | Partial::ExtremeInt(value) => int(*value, bytes),
        Partial::SumFloat(value) | Partial::ExtremeFloat(value) => match value {
            Some(value) => {
                bytes.push(TAG_FLOAT);
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Partial::ExtremeText(value) => match value {
            Some(text) => {
                bytes.push(TAG_TEXT);
                bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Partial::Avg(sum, count) => {
            bytes.push(TAG_AVG);
            bytes.extend_from_slice(&sum.to_le_bytes());
            bytes.extend_from_slice(&count.to_le_bytes());
        }
        Partial::Distinct(set) => {
            bytes.push(TAG_SET);
            bytes.extend_from_slice(&(set.len() as u32).to_le_bytes());
            for value in set {
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
const STATE: &str = "session aggregate";

/// Records restored between two checks of their keys (and evictions beyond the budget).
const RESTORE_CHECK_RECORDS: usize = 4096;

/// Loads the keys of `state` (of the vnodes this instance owns) into `aggregate`.
pub(super) fn restore(aggregate: &mut SessionAggregate, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = aggregate.spec.keys.is_empty();
    let mut unchecked: Vec<Box<[u8]>> = Vec::new();
    let check = |aggregate: &mut SessionAggregate, unchecked: &mut Vec<Box<[u8]>>| -> Result<(), SluiceError> {
        check_keys(&aggregate.key_encoder, unchecked.iter().map(|key| &key[..]), STATE, "a key")?;
        unchecked.clear();
        // Beyond the memory budget, restored keys go to cold runs.
        aggregate.evict_over_budget()
    };
    while let Some(record) = state.next_record()? {
        let hash = placement_hash(no_keys, record.key);
        if vnode::of_hash(hash, aggregate.vnodes) != record.vnode {
            return Err(corrupt("a key under another vnode than its own"));
        }
        let sessions = read_sessions(&aggregate.empty, record.value)?;
        let key: Box<[u8]> = record.key.into();
        for session in &sessions {
            aggregate.due.insert((session.end, key.clone()));
        }
        let bytes = match aggregate.cold.as_mut() {
            Some(cold) => {
                let bytes = key_bytes(&key, &sessions);
                cold.store.charge(bytes);
                bytes
            }
            None => 0,
        };
        unchecked.push(key.clone());
        aggregate.keys.insert(key, KeySessions { hash, sessions, changed: false, marks: 0, bytes });
        if unchecked.len() == RESTORE_CHECK_RECORDS {
            check(aggregate, &mut unchecked)?;
        }
    }
    check(aggregate, &mut unchecked)?;
    aggregate.clear_changes();
    Ok(())
}

/// A key's sessions from its record's value, checked (see the module documentation);
/// `empty` holds an empty partial of each aggregate.
pub(super) fn read_sessions(empty: &[Partial], value: &[u8]) -> Result<Vec<Session>, SluiceError> {
    let mut reader = Reader::new(value, STATE);
    let count = reader.u32()? as usize;
    // A session takes 16 bytes at least: a count beyond that is damage.
    if count == 0 || count > reader.remaining() / 16 {
        return Err(corrupt("a key with no sessions, or more than its bytes"));
    }
    let mut sessions: Vec<Session> = Vec::with_capacity(count);
    for _ in 0..count {
        let (start, end) = (reader.i64()?, reader.i64()?);
        if start >= end {
            return Err(corrupt("an empty session"));
        }
        if sessions.last().is_some_and(|last| last.end >= start) {
            return Err(corrupt("sessions out of order or touching"));
        }
        let mut partials = Vec::with_capacity(empty.len());
        for kind in empty {
            partials.push(read_partial(kind, &mut reader)?);
        }
        sessions.push(Session { start, end, partials });
    }
    reader.finish()?;
    Ok(sessions)
}

/// A partial of the kind of `kind` (an empty partial of the aggregate).
fn read_partial(kind: &Partial, reader: &mut Reader<'_>) -> Result<Partial, SluiceError> {
    let tag = reader.u8()?;
    Ok(match (kind, tag) {
        (Partial::Count(_), TAG_INT) => Partial::Count(reader.i64()?),
        (Partial::SumInt(_), TAG_INT) => Partial::SumInt(Some(reader.i64()?)),
        (Partial::ExtremeInt(_), TAG_INT) => Partial::ExtremeInt(Some(reader.i64()?)),
        (Partial::SumFloat(_), TAG_FLOAT) => Partial::SumFloat(Some(reader.f64()?)),
        (Partial::ExtremeFloat(_), TAG_FLOAT) => Partial::ExtremeFloat(Some(reader.f64()?)),
        (Partial::ExtremeText(_), TAG_TEXT) => {
            let text = std::str::from_utf8(reader.bytes()?).map_err(|_| corrupt("text is not UTF-8"))?;
            Partial::ExtremeText(Some(text.to_string()))
        }
        (Partial::Avg(..), TAG_AVG) => Partial::Avg(reader.f64()?, reader.i64()?),
        (Partial::Distinct(_), TAG_SET) => {
            let mut set = BTreeSet::new();
            for _ in 0..reader.u32()? {
                let value: Box<[u8]> = reader.bytes()?.into();
                if set.last().is_some_and(|last| *last >= value) {
                    return Err(corrupt("a set's values out of order"));
                }
                set.insert(value);
            }
            Partial::Distinct(set)
        }
        (
            Partial::SumInt(_)
            | Partial::ExtremeInt(_)
            | Partial::SumFloat(_)
            | Partial::ExtremeFloat(_)
            | Partial::ExtremeText(_),
            TAG_NULL,
        ) => kind.clone(),
        _ => return Err(corrupt("a partial result of another kind")),
    })
}
