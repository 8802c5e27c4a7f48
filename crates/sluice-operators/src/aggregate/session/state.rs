//! Snapshots of the session aggregate's open sessions, one blob per vnode.
//!
//! At a barrier the driver clones the open sessions; the checkpoint writer thread encodes
//! the clone. A key's sessions go to the vnode of the key's placement hash (the hash the
//! exchange routes by), so after a restore onto any number of threads or workers each key
//! lands on the thread its future rows go to.
//!
//! Layout, version [`SESSION_STATE_VERSION`] (little-endian): `u32 version`, `u32 keys`,
//! then per key (in key byte order) the key (`u32 length` + its bytes in the key encoding
//! of [`sluice_types::key`]), `u32 sessions`, then per session (in start order) `i64
//! start`, `i64 end` and one partial result per aggregate: a tag byte and its value
//! (`NULL` 0; `INT` 1 + i64; `FLOAT` 2 + f64; `TEXT` 3 + u32 length + UTF-8; `AVG` 4 +
//! f64 sum + i64 count; `SET` 5 + u32 count + each value as u32 length + bytes, sorted).
//! Decoding checks every length against the remaining bytes, every tag against the
//! operator's aggregates, and that a session is not empty: a blob from another plan is
//! refused, never misread.

use std::collections::BTreeSet;

use sluice_runtime::BlobJob;
use sluice_types::{SluiceError, vnode};

use crate::blob::Reader;

use super::{KeySessions, Partial, Session, SessionAggregate};

/// The blob layout this build writes and reads.
pub const SESSION_STATE_VERSION: u32 = 1;

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;
const TAG_AVG: u8 = 4;
const TAG_SET: u8 = 5;

/// Clones the open sessions and returns the job that encodes them; None without state.
pub(super) fn snapshot(aggregate: &mut SessionAggregate) -> Option<BlobJob> {
    if aggregate.keys.is_empty() {
        return None;
    }
    let mut keys: Vec<(Box<[u8]>, KeySessions)> =
        aggregate.keys.iter().map(|(key, sessions)| (key.clone(), sessions.clone())).collect();
    let vnodes = aggregate.vnodes;
    Some(Box::new(move || {
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(encode(&keys, vnodes))
    }))
}

fn encode(keys: &[(Box<[u8]>, KeySessions)], vnodes: u32) -> Vec<(u32, Vec<u8>)> {
    let mut blobs: Vec<Option<(u32, Vec<u8>)>> = (0..vnodes).map(|_| None).collect();
    for (key, sessions) in keys {
        let vnode = vnode::of_hash(sessions.hash, vnodes) as usize;
        let (count, bytes) = blobs[vnode].get_or_insert_with(|| {
            let mut bytes = SESSION_STATE_VERSION.to_le_bytes().to_vec();
            bytes.extend_from_slice(&0u32.to_le_bytes());
            (0, bytes)
        });
        *count += 1;
        bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&(sessions.sessions.len() as u32).to_le_bytes());
        for session in &sessions.sessions {
            bytes.extend_from_slice(&session.start.to_le_bytes());
            bytes.extend_from_slice(&session.end.to_le_bytes());
            session.partials.iter().for_each(|partial| write_partial(partial, bytes));
        }
    }
    let finished = blobs.into_iter().enumerate().filter_map(|(vnode, blob)| {
        blob.map(|(count, mut bytes)| {
            bytes[4..8].copy_from_slice(&u32::to_le_bytes(count));
            (vnode as u32, bytes)
        })
    });
    finished.collect()
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

pub(super) fn restore(aggregate: &mut SessionAggregate, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    for blob in blobs {
        let mut reader = Reader::new(&blob, STATE);
        if reader.u32()? != SESSION_STATE_VERSION {
            return Err(corrupt("unknown version"));
        }
        for _ in 0..reader.u32()? {
            let key: Box<[u8]> = reader.bytes()?.into();
            let mut sessions = Vec::new();
            for _ in 0..reader.u32()? {
                let (start, end) = (reader.i64()?, reader.i64()?);
                if start >= end {
                    return Err(corrupt("an empty session"));
                }
                let mut partials = Vec::with_capacity(aggregate.empty.len());
                for kind in &aggregate.empty {
                    partials.push(read_partial(kind, &mut reader)?);
                }
                sessions.push(Session { start, end, partials });
            }
            let hash = crate::partition::placement_hash(aggregate.spec.keys.is_empty(), &key);
            for session in &sessions {
                aggregate.due.insert((session.end, key.clone()));
            }
            if aggregate.keys.insert(key, KeySessions { hash, sessions }).is_some() {
                return Err(corrupt("a key appears twice (in two vnodes)"));
            }
        }
        reader.finish()?;
    }
    Ok(())
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
                set.insert(reader.bytes()?.into());
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
