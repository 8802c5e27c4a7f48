//! Snapshots of the changelog normalization's state as records (`sluice_state`): one per
//! live key, under the vnode of the key's placement hash (the exchange's by the primary
//! key), so a restore onto any number of threads gives each key to the thread its future
//! changes go to.
//!
//! At a barrier the driver copies the keys the snapshot takes, with where their rows are:
//! every live key (a full snapshot), or each key changed since the previous snapshot
//! with its row now, or a delete when it has none (a delta), and the row log's chunks
//! as they are. The job reads the rows from those chunks (a spilled one from its file)
//! and writes the records on the checkpoint writer's thread; rows after the barrier
//! change the live map and fresh chunks, never the copy.
//!
//! # Records, version [`NORMALIZE_STATE_VERSION`]
//!
//! ```text
//! key    the primary key's columns, in order, in the key encoding of [`sluice_types::key`]
//! value  the key's current row: the declared columns, in order, in the same encoding
//! vnode  of `sluice_types::key::hash` of the key
//! ```
//!
//! Restoring checks the vnode against the key, the key and the row against their
//! canonical encodings (decoded and encoded again, they give their own bytes), and that
//! the row's key columns are the record's key: a record from another plan or a damaged
//! one is refused (`state.corrupt`), never misread, and never panics.

use std::sync::Arc;

use arrow::array::ArrayRef;
use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::key::KeyRows;
use sluice_types::{SluiceError, vnode};

use crate::blob::{Records, corrupt};
use crate::row_log::RowAt;

use super::ChangelogNormalize;

/// The record layout this build writes and reads.
pub const NORMALIZE_STATE_VERSION: u32 = 1;

/// The state's name in errors.
const STATE: &str = "changelog normalization";

/// A key, encoded, and where its row is (None: the key has none, a delete).
type KeyRow = (Box<[u8]>, Option<RowAt>);
/// A restored record: key and row.
type Restored = (Box<[u8]>, Box<[u8]>);

/// Records restored per check.
const RESTORE_BATCH_RECORDS: usize = 4096;

/// Copies the keys the snapshot takes and returns the snapshot writing them.
pub(super) fn snapshot(normalize: &mut ChangelogNormalize, delta: bool) -> Snapshot {
    let full = !delta || !normalize.tracking;
    let copy: Vec<KeyRow> = if full {
        normalize.changed.clear();
        normalize.rows.iter().map(|(key, kept)| (key.clone(), Some(kept.at))).collect()
    } else {
        let changed = std::mem::take(&mut normalize.changed);
        let rows = &normalize.rows;
        changed
            .into_iter()
            .map(|key| {
                let at = rows.get(&key).map(|kept| kept.at);
                (key, at)
            })
            .collect()
    };
    // Keys in cold runs: a full snapshot merges every run (but the keys whose newer copy
    // is in memory, or that were deleted); a delta the keys evicted while changed.
    let cold = normalize.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()).map(|cold| {
        let runs = cold.store.runs().clone();
        if full {
            cold.evicted_dirty.clear();
            let mut shadow = cold.dropped.clone();
            for (key, kept) in &normalize.rows {
                if kept.marks & super::FROM_COLD != 0 {
                    shadow.insert(key.to_vec());
                }
            }
            (runs, shadow)
        } else {
            (runs, std::mem::take(&mut cold.evicted_dirty))
        }
    });
    // The rows are read on the writer's thread from the log's chunks as they are now:
    // the operator appends to fresh chunks and compacts into a fresh log meanwhile.
    let shared = normalize.log.shared();
    normalize.tracking = true;
    let vnodes = normalize.spec.vnodes;
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        match &cold {
            Some((runs, shadow)) if full => runs.add_live(&mut records, |key| Ok(shadow.contains(key)))?,
            Some((runs, dirty)) => {
                for key in dirty {
                    let hash = sluice_types::key::hash(key);
                    let vnode = vnode::of_hash(hash, vnodes);
                    if let Some(found) = runs.find(vnode, key, hash, &|_| false)? {
                        let value = |v: &mut Vec<u8>| v.extend_from_slice(&found.value);
                        records.add(vnode, |k| k.extend_from_slice(key), Some(&value));
                    }
                }
            }
            None => {}
        }
        let mut row = Vec::new();
        for (key, at) in &copy {
            let vnode = vnode::of_hash(sluice_types::key::hash(key), vnodes);
            match at {
                Some(at) => {
                    row.clear();
                    shared.read_into(*at, &mut row)?;
                    records.add(vnode, |k| k.extend_from_slice(key), Some(&|v: &mut Vec<u8>| v.extend_from_slice(&row)))
                }
                None => records.add(vnode, |k| k.extend_from_slice(key), None),
            }
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

/// Loads the keys of `state` (of the vnodes this instance owns).
pub(super) fn restore(normalize: &mut ChangelogNormalize, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let mut pending: Vec<Restored> = Vec::with_capacity(RESTORE_BATCH_RECORDS);
    while let Some(record) = state.next_record()? {
        if vnode::of_hash(sluice_types::key::hash(record.key), normalize.spec.vnodes) != record.vnode {
            return Err(corrupt(STATE, "a key under another vnode than its own"));
        }
        pending.push((record.key.into(), record.value.into()));
        if pending.len() == RESTORE_BATCH_RECORDS {
            load(normalize, &mut pending)?;
            // Beyond the memory budget, restored keys go to cold runs.
            normalize.evict_over_budget()?;
        }
    }
    load(normalize, &mut pending)?;
    normalize.changed.clear();
    normalize.tracking = false;
    normalize.evict_over_budget()
}

/// Checks `records` (their keys and rows canonical, each row holding its key) and moves
/// them into the live map.
fn load(normalize: &mut ChangelogNormalize, records: &mut Vec<Restored>) -> Result<(), SluiceError> {
    if records.is_empty() {
        return Ok(());
    }
    let another_plan = |_| corrupt(STATE, "a row of another table");
    let columns = normalize.row_encoder.decode(records.iter().map(|(_, row)| &row[..])).map_err(another_plan)?;
    let mut rows = KeyRows::default();
    normalize.row_encoder.encode(&columns, &mut rows).map_err(another_plan)?;
    let key_columns: Vec<ArrayRef> = normalize.spec.key.iter().map(|&i| Arc::clone(&columns[i])).collect();
    let mut keys = KeyRows::default();
    normalize.key_encoder.encode(&key_columns, &mut keys).map_err(another_plan)?;
    for (index, (key, row)) in records.iter().enumerate() {
        if rows.row(index) != &row[..] {
            return Err(corrupt(STATE, "a row not in its canonical encoding"));
        }
        if keys.row(index) != &key[..] {
            return Err(corrupt(STATE, "a row under another key than its own"));
        }
    }
    for (key, row) in records.drain(..) {
        let at = normalize.log.append(&row)?;
        let bytes = super::key_bytes(&key);
        match normalize.rows.insert(key, super::Kept { at, marks: super::RECENT }) {
            Some(previous) => normalize.log.forget(previous.at),
            None => {
                if let Some(cold) = normalize.cold.as_mut() {
                    cold.store.charge(bytes);
                }
            }
        }
    }
    Ok(())
}
