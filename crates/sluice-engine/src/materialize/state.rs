//! Snapshots of a materialized table's slice as records (`sluice_state`): one per
//! distinct row, under the vnode of the row's placement hash (the hash of its key
//! encoding, as the exchange before the operator places it), so a restore onto any
//! number of threads gives each row to the thread its future retractions go to.
//!
//! At a barrier the [`Integrate`](super::Integrate) operator shares (does not copy) its
//! slice's parts (its runs on disk, its base and deltas in memory), and the open delta
//! it takes then: the rows received since
//! the previous snapshot (each snapshot takes the open delta, so it holds exactly
//! those). The job, on the checkpoint writer's thread, writes every row of the slice
//! with its weight (a full snapshot), or each row of that open delta with its weight
//! now, summed over the runs, the base and every delta, and a delete for a row whose weight is 0
//! now (a delta). Rows retracted to their weight before within the delta are left out
//! when it is taken: their records stand.
//!
//! # Records, version [`MATERIALIZED_STATE_VERSION`]
//!
//! ```text
//! key    the whole row in the key encoding of [`sluice_types::key`] (the table's
//!        columns in order)
//! value  i64 weight (little-endian; never 0: a row of weight w stands for w equal rows)
//! vnode  of `sluice_types::key::hash` of the key
//! ```
//!
//! Version 1 was a blob per vnode: `u32 version`, `u32 rows`, then per row, in increasing
//! byte order, the row (`u32 length` + bytes) and its weight. Restoring checks each
//! value's length and weight, the vnode against the row, and that every row is a row of
//! the table in its canonical encoding (decoded and encoded again, it gives its own
//! bytes): a record from another plan or a damaged one is refused (`state.corrupt`),
//! never misread, and never panics.

use std::sync::Arc;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{SluiceError, vnode};

use super::Multiset;
use super::read::{Parts, Walk};

/// The record layout this build writes and reads.
pub const MATERIALIZED_STATE_VERSION: u32 = 2;

/// Rows restored per decoding.
pub(super) const RESTORE_BATCH_ROWS: usize = 4096;

/// The snapshot writing `parts` in full, or (`changed`: the rows received since the
/// previous snapshot) only the rows whose weight changed since. The parts and the
/// changed rows are sorted by vnode, then row ([`super::keyed`]): the records go out in
/// that order, read from the runs block by block, so the job holds no copy of the slice.
pub(super) fn snapshot(parts: Parts, changed: Option<Arc<Multiset>>) -> Snapshot {
    let kind = if changed.is_some() { SnapshotKind::Delta } else { SnapshotKind::Full };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let record = |sink: &mut dyn StateSink, key: &[u8], weight: i64| {
            let (vnode, row) = super::split(key);
            if weight == 0 { sink.delete(vnode, row) } else { sink.put(vnode, row, &weight.to_le_bytes()) }
        };
        match &changed {
            None => {
                let mut failed = Ok(());
                Walk::default().step(&parts, &mut |key, weight| {
                    if weight != 0 {
                        failed = record(sink, key, weight);
                    }
                    failed.is_ok()
                })?;
                failed
            }
            Some(changed) => {
                for key in changed.keys() {
                    record(sink, key, parts.weight(key)?)?;
                }
                Ok(())
            }
        }
    });
    Snapshot { kind, job }
}

fn corrupt(what: &str) -> SluiceError {
    SluiceError::internal("state.corrupt", format!("materialized table state is damaged or from another plan: {what}"))
}

/// The rows of `state` (of the vnodes of one thread), each a row of `encoder`'s columns.
/// The largest weight a restored row may have: a count of equal rows no stream reaches,
/// far enough below `i64::MAX` that no sum of a stream's weights overflows it.
const WEIGHT_MAX: u64 = 1 << 53;

/// Restored rows under their keys ([`super::keyed`]), with their weights.
pub(super) type Restored = Vec<(Box<[u8]>, i64)>;

pub(super) fn restore(
    state: &mut dyn StateSource,
    encoder: &KeyEncoder,
    vnodes: u32,
    into: &mut dyn FnMut(&mut Restored) -> Result<(), SluiceError>,
) -> Result<(), SluiceError> {
    let mut pending: Restored = Vec::with_capacity(RESTORE_BATCH_ROWS);
    while let Some(record) = state.next_record()? {
        let weight =
            i64::from_le_bytes(record.value.try_into().map_err(|_| corrupt("a weight of other than 8 bytes"))?);
        if weight == 0 {
            return Err(corrupt("a row of weight 0"));
        }
        // More equal rows than any stream gives: damage, which would overflow the sums.
        if weight.unsigned_abs() > WEIGHT_MAX {
            return Err(corrupt("a weight past 2^53 rows"));
        }
        if vnode::of_hash(sluice_types::key::hash(record.key), vnodes) != record.vnode {
            return Err(corrupt("a row under another vnode than its own"));
        }
        pending.push((super::keyed(record.vnode, record.key), weight));
        if pending.len() == RESTORE_BATCH_ROWS {
            check(&pending, encoder)?;
            into(&mut pending)?;
            pending.clear();
        }
    }
    check(&pending, encoder)?;
    into(&mut pending)
}

/// Checks that each of `rows` is a row of `encoder`'s columns in its canonical
/// encoding.
fn check(rows: &[(Box<[u8]>, i64)], encoder: &KeyEncoder) -> Result<(), SluiceError> {
    if rows.is_empty() {
        return Ok(());
    }
    let another_table = |_| corrupt("a row of another table");
    let columns = encoder.decode(rows.iter().map(|(key, _)| super::split(key).1)).map_err(another_table)?;
    let mut encoded = KeyRows::default();
    encoder.encode(&columns, &mut encoded).map_err(another_table)?;
    if encoded.len() != rows.len()
        || rows.iter().enumerate().any(|(index, (key, _))| encoded.row(index) != super::split(key).1)
    {
        return Err(corrupt("a row not in its canonical encoding"));
    }
    Ok(())
}
