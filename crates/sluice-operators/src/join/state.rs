//! Snapshots of the join's state as records (`sluice_state`), by the vnode of each row's
//! join key hash (the hash the exchange routes both inputs by), so a restore onto any
//! number of threads gives each row to the thread its key's future rows go to.
//!
//! At a barrier each side's store hands over what the snapshot takes, sharing the rows'
//! bytes (chunks are reference-counted, a chunk a snapshot shares is not appended to,
//! and one the side spills meanwhile is read back from its file, not held in memory):
//! in full, every row; as a delta, what changed since the previous snapshot (see each
//! store's module: rows marked or removed by row, rows arrived since when appended or
//! expiring, and how far rows expired). The snapshot's job, on the checkpoint
//! writer's thread, gathers the records (reading spilled rows back one chunk at a time)
//! and writes them in key order. When both sides only append, their rows go to the sink
//! as they arrived, without a sort: keyed by arrival, each vnode's come in key order, so
//! the run writer takes them with vnodes interleaved (`StateSink::interleave`), and each
//! row is written once. So do an expiring side's rows (keyed by expiry, then arrival):
//! in arrival order when, within each vnode, they expire in that order (a stream in
//! event-time order), else ordered by expiry alone (a sort of the snapshot's expiry
//! times, not of its records). A side kept by row has its records sorted
//! (`crate::records`, in batches spilled to scratch files).
//!
//! # Records, version [`JOIN_STATE_VERSION`]
//!
//! A record's key starts with the side (`u8`: 0 left, 1 right), then depends on how the
//! side keeps its rows (a function of the plan, which the manifest's fingerprint pins):
//!
//! ```text
//! by row (a multiset, `store`)     key: side, the row              value: weight, matches
//! appended (`append`)              key: side, arrival (u64 BE)     value: weight, the row
//! expiring (`expiring`)            key: side, expiry (i64 BE, sign bit flipped),
//!                                       arrival (u64 BE)            value: weight, the row
//! ```
//!
//! A row is its columns in order in the key encoding of [`sluice_types::key`]; weight and
//! matches are zigzag varints (`crate::blob::put_signed`); a weight is never 0, and
//! positive but on a side kept by row; matches is the summed weight of the other side's
//! rows it joins with, written only for a side an outer join pads (0 elsewhere, where it
//! is never read). An arrival number orders the rows of a key as they arrived and keeps
//! counting across snapshots and restores, so a delta never reuses a key. Rows that
//! expired by watermark `w` are one range delete per vnode of the instance, from
//! `side, expiry(i64::MIN)` to `side, expiry(w + 1)`.
//!
//! The join key, its hash and a row's expiry are recomputed from the row when restored.
//! Restoring checks every key and value against its layout, every row against its
//! side's schema and canonical encoding, and an expiring row's expiry against its key: a
//! record from another plan or a damaged one is refused (`state.corrupt`), never
//! misread, and never panics.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::key::KeyRows;
use sluice_types::{SluiceError, vnode};

use super::append::AppendChanges;
use super::expiring::{ExpiringChanges, ExpiringRow};
use super::store::{ByRowChanges, NEVER, RowRef};
use super::{JoinOperator, Rows, expiry_times};
use crate::blob::{Reader, Records, from_ordered_i64, ordered_i64, put_signed};
use crate::partition::encode_keys;
use crate::spill::{HeldChunk, LogChunk};

/// The record layout this build writes and reads.
pub const JOIN_STATE_VERSION: u32 = 2;

/// Rows restored per decoded batch.
const RESTORE_BATCH_ROWS: usize = 4096;

/// What a snapshot takes of one side.
enum SideChanges {
    ByRow(ByRowChanges),
    Append(AppendChanges),
    Expiring(ExpiringChanges),
}

/// Takes each side's changes (everything unless `delta` and both sides kept them) and
/// returns the snapshot writing them.
pub(super) fn snapshot(join: &mut JoinOperator, delta: bool) -> Result<Snapshot, SluiceError> {
    let full = !delta || join.sides.iter().any(|side| !side.store.tracking());
    let changes: Vec<SideChanges> = join
        .sides
        .iter_mut()
        .map(|side| {
            Ok(match &mut side.store {
                Rows::ByRow(store) => SideChanges::ByRow(store.changes(full)),
                Rows::Append(store) => SideChanges::Append(store.changes(full)?),
                Rows::Expiring(store) => SideChanges::Expiring(store.changes(full)),
            })
        })
        .collect::<Result<_, SluiceError>>()?;
    let preserved = [join.kind.preserves(0), join.kind.preserves(1)];
    let (vnodes, owned) = (join.vnodes, join.owned.clone());
    let appended_only = changes.iter().all(|side| matches!(side, SideChanges::Append(_)));
    let kind = match (full, appended_only) {
        (true, _) => SnapshotKind::Full,
        (false, true) => SnapshotKind::Additions,
        (false, false) => SnapshotKind::Delta,
    };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        if !changes.iter().any(|side| matches!(side, SideChanges::ByRow(_))) {
            return interleaved(sink, changes, vnodes, &owned);
        }
        let mut records = Records::for_sink(sink);
        for (side, changes) in changes.into_iter().enumerate() {
            let side = side as u8;
            match changes {
                SideChanges::ByRow(changes) => by_row(&mut records, side, changes, preserved[side as usize], vnodes)?,
                SideChanges::Append(changes) => appended(&mut adding(&mut records), side, changes, vnodes)?,
                SideChanges::Expiring(changes) => {
                    expiring(&mut adding(&mut records), side, &changes, Box::new(changes.rows()), vnodes)?;
                    if let Some(watermark) = changes.expired_through {
                        let (start, end) = expired_range(side, watermark);
                        for vnode in owned.clone() {
                            records.delete_range(vnode, start.clone(), end.clone());
                        }
                    }
                }
            }
        }
        records.write(sink)
    });
    Ok(Snapshot { kind, job })
}

/// Writes sides that only append or expire as their rows come, vnodes interleaved, each
/// vnode's in key order (appended rows in arrival order; expiring ones in arrival order
/// too when they expire in that order, else ordered by expiry:
/// `ExpiringChanges::rows_in_key_order`), each row once, never sorted through scratch
/// files. Every range delete goes first (side 0's, then side 1's: each vnode's in order
/// of their starts), then each side's rows (side 0's keys are below side 1's).
fn interleaved(
    sink: &mut dyn StateSink,
    changes: Vec<SideChanges>,
    vnodes: u32,
    owned: &std::ops::Range<u32>,
) -> Result<(), SluiceError> {
    sink.interleave();
    for (side, changes) in changes.iter().enumerate() {
        if let SideChanges::Expiring(ExpiringChanges { expired_through: Some(watermark), .. }) = changes {
            let (start, end) = expired_range(side as u8, *watermark);
            for vnode in owned.clone() {
                sink.delete_range(vnode, &start, &end)?;
            }
        }
    }
    let mut put = |vnode, key: &[u8], value: &[u8]| sink.put(vnode, key, value);
    for (side, changes) in changes.into_iter().enumerate() {
        match changes {
            SideChanges::Append(changes) => appended(&mut put, side as u8, changes, vnodes)?,
            SideChanges::Expiring(changes) => {
                expiring(&mut put, side as u8, &changes, changes.rows_in_key_order(vnodes), vnodes)?
            }
            SideChanges::ByRow(_) => unreachable!("a side kept by row is written sorted"),
        }
    }
    Ok(())
}

fn by_row(
    records: &mut Records,
    side: u8,
    changes: ByRowChanges,
    preserved: bool,
    vnodes: u32,
) -> Result<(), SluiceError> {
    let mut read_back = Vec::new();
    // Rows come in slot order, mostly chunk by chunk.
    let mut held = HeldChunk::default();
    for row in &changes.rows {
        let bytes = match held.of(&changes.chunks, row.chunk) {
            LogChunk::Resident(bytes) => &bytes[row.range.clone()],
            LogChunk::Spilled(spilled) => {
                read_back.clear();
                spilled.read_range(row.range.clone(), &mut read_back)?;
                &read_back[..]
            }
        };
        let key = |out: &mut Vec<u8>| {
            out.push(side);
            out.extend_from_slice(bytes);
        };
        let matches = if preserved { row.matches } else { 0 };
        let value = |out: &mut Vec<u8>| {
            put_signed(out, row.weight);
            put_signed(out, matches);
        };
        records.add(vnode::of_hash(row.key_hash, vnodes), key, Some(&value));
    }
    for (key_hash, row) in &changes.removed {
        let key = |out: &mut Vec<u8>| {
            out.push(side);
            out.extend_from_slice(row);
        };
        records.add(vnode::of_hash(*key_hash, vnodes), key, None);
    }
    Ok(())
}

/// Takes a record: `(vnode, key, value)`.
type Put<'a> = dyn FnMut(u32, &[u8], &[u8]) -> Result<(), SluiceError> + 'a;

/// A [`Put`] adding each record to `records`, to be sorted.
fn adding(records: &mut Records) -> impl FnMut(u32, &[u8], &[u8]) -> Result<(), SluiceError> + '_ {
    |vnode, key, value| {
        records.add(vnode, |out| out.extend_from_slice(key), Some(&|out: &mut Vec<u8>| out.extend_from_slice(value)));
        Ok(())
    }
}

/// Puts each appended row, in arrival order, through `put(vnode, key, value)`.
fn appended(put: &mut Put<'_>, side: u8, changes: AppendChanges, vnodes: u32) -> Result<(), SluiceError> {
    // Rows come in arrival order, so each spilled chunk is read back once.
    let mut read_back: Option<(u32, Vec<u8>)> = None;
    let mut held = HeldChunk::default();
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for row in changes.rows() {
        let bytes = match held.of(changes.chunks(), row.chunk) {
            LogChunk::Resident(bytes) => &bytes[row.range.clone()],
            LogChunk::Spilled(spilled) => {
                if read_back.as_ref().is_none_or(|(held, _)| *held != row.chunk) {
                    read_back = Some((row.chunk, spilled.read()?));
                }
                &read_back.as_ref().expect("the row's chunk was just read").1[row.range.clone()]
            }
        };
        key.clear();
        key.push(side);
        key.extend_from_slice(&row.arrival.to_be_bytes());
        value.clear();
        put_signed(&mut value, row.weight);
        value.extend_from_slice(bytes);
        put(vnode::of_hash(row.key_hash, vnodes), &key, &value)?;
    }
    Ok(())
}

/// Puts each row of `rows` (of `changes`) through `put(vnode, key, value)`. Rows come in
/// arrival order, or nearly: each spilled chunk is read back whole when the rows reach
/// it, and a row of an earlier chunk than the one read last (a row sorted ahead of
/// rows that arrived before it) alone.
fn expiring(
    put: &mut Put<'_>,
    side: u8,
    changes: &ExpiringChanges,
    rows: Box<dyn Iterator<Item = ExpiringRow> + '_>,
    vnodes: u32,
) -> Result<(), SluiceError> {
    let mut read_back: Option<(usize, Vec<u8>)> = None;
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for row in rows {
        key.clear();
        key.push(side);
        key.extend_from_slice(&ordered_i64(row.expires));
        key.extend_from_slice(&row.arrival.to_be_bytes());
        value.clear();
        put_signed(&mut value, row.weight);
        match &changes.chunks()[row.chunk] {
            LogChunk::Resident(bytes) => value.extend_from_slice(&bytes[row.range.clone()]),
            LogChunk::Spilled(spilled) => match &read_back {
                Some((held, bytes)) if *held == row.chunk => value.extend_from_slice(&bytes[row.range.clone()]),
                Some((held, _)) if *held > row.chunk => spilled.read_range(row.range.clone(), &mut value)?,
                _ => {
                    let bytes = spilled.read()?;
                    value.extend_from_slice(&bytes[row.range.clone()]);
                    read_back = Some((row.chunk, bytes));
                }
            },
        }
        put(vnode::of_hash(row.key_hash, vnodes), &key, &value)?;
    }
    Ok(())
}

/// The range delete, in every vnode, of side `side`'s rows expired by `watermark`.
fn expired_range(side: u8, watermark: i64) -> (Vec<u8>, Vec<u8>) {
    let start = [&[side][..], &ordered_i64(i64::MIN)].concat();
    let end = match watermark.checked_add(1) {
        Some(after) => [&[side][..], &ordered_i64(after)].concat(),
        None => vec![side + 1],
    };
    (start, end)
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "join";

/// A record's row, read and owned until its batch is loaded: its vnode, the row's
/// bytes, weight, matches, and (an expiring side) the expiry its key names.
struct ReadRow {
    vnode: u32,
    row: Vec<u8>,
    weight: i64,
    matches: i64,
    expires: Option<i64>,
}

/// Loads the records of `state` (of the vnodes this instance owns) into `join`.
pub(super) fn restore(join: &mut JoinOperator, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let mut pending: [Vec<ReadRow>; 2] = [Vec::new(), Vec::new()];
    let mut last_arrival: [Option<u64>; 2] = [None, None];
    while let Some(record) = state.next_record()? {
        let (&side, key) = record.key.split_first().ok_or_else(|| corrupt("an empty key"))?;
        let side = usize::from(side);
        let store = &join.sides.get(side).ok_or_else(|| corrupt("a side other than left or right"))?.store;
        let mut key = Reader::new(key, STATE);
        let mut value = Reader::new(record.value, STATE);
        let weight = value.signed()?;
        if weight == 0 {
            return Err(corrupt("a row of weight 0"));
        }
        let read = match store {
            Rows::ByRow(_) => {
                let matches = value.signed()?;
                value.finish()?;
                ReadRow { vnode: record.vnode, row: key.rest().to_vec(), weight, matches, expires: None }
            }
            Rows::Append(_) | Rows::Expiring(_) => {
                let expires = match store {
                    Rows::Expiring(_) => Some(from_ordered_i64(key.take(8)?.try_into().expect("8 bytes"))),
                    _ => None,
                };
                let arrival = key.u64_be()?;
                key.finish()?;
                if weight < 0 {
                    return Err(corrupt("a retracted row on a side that only appends"));
                }
                last_arrival[side] = Some(last_arrival[side].map_or(arrival, |last| last.max(arrival)));
                ReadRow { vnode: record.vnode, row: value.rest().to_vec(), weight, matches: 0, expires }
            }
        };
        pending[side].push(read);
        if pending[side].len() == RESTORE_BATCH_ROWS {
            load(join, side, &std::mem::take(&mut pending[side]))?;
        }
    }
    for (side, rows) in pending.iter().enumerate() {
        load(join, side, rows)?;
    }
    for (side, last) in join.sides.iter_mut().zip(last_arrival) {
        side.store.restored(last)?;
    }
    Ok(())
}

/// Adds `rows` to side `side`'s store, after checking they are rows of its schema in
/// their canonical encoding, under their join key's vnode (and an expiring row's expiry
/// is its key's).
fn load(join: &mut JoinOperator, side: usize, rows: &[ReadRow]) -> Result<(), SluiceError> {
    if rows.is_empty() {
        return Ok(());
    }
    let vnodes = join.vnodes;
    let state = &mut join.sides[side];
    let another_plan = |_| corrupt("a row of another plan");
    let columns = state.row_encoder.decode(rows.iter().map(|r| r.row.as_slice())).map_err(another_plan)?;
    let batch =
        RecordBatch::try_new(Arc::clone(&state.schema), columns).map_err(|_| corrupt("a row of another plan"))?;
    let mut encoded = KeyRows::default();
    state.row_encoder.encode(batch.columns(), &mut encoded).map_err(another_plan)?;
    let mut keys = KeyRows::default();
    encode_keys(&batch, &state.keys, &mut state.key_encoder, &mut keys).map_err(another_plan)?;
    // The time index is rebuilt from the rows (a row without a time, never stored by a
    // join with an expiry, goes at the first watermark).
    let expires = expiry_times(&batch, state.expiry);
    for (index, read) in rows.iter().enumerate() {
        if encoded.row(index) != read.row.as_slice() {
            return Err(corrupt("a row not in its canonical encoding"));
        }
        if vnode::of_hash(keys.hash(index), vnodes) != read.vnode {
            return Err(corrupt("a row under another vnode than its join key's"));
        }
        let expires = expires.as_ref().map_or(NEVER, |e| e[index].unwrap_or(i64::MIN));
        if read.expires.is_some_and(|keyed| keyed != expires) {
            return Err(corrupt("a row under another expiry than its time gives"));
        }
        let row =
            RowRef { row: &read.row, row_hash: encoded.hash(index), key: keys.row(index), key_hash: keys.hash(index) };
        state.store.apply(&row, read.weight, read.matches, expires)?;
    }
    Ok(())
}
