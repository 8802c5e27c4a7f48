//! Snapshots of a materialized table's slice as records (`sluice_state`): one per
//! distinct row, under the vnode of the row's placement hash (the hash of its key
//! encoding, as the exchange before the operator places it), so a restore onto any
//! number of threads gives each row to the thread its future retractions go to.
//!
//! At a barrier the [`Integrate`](super::Integrate) operator shares (does not copy) its
//! slice's base and deltas, and the open delta it takes then: the rows received since
//! the previous snapshot (each snapshot takes the open delta, so it holds exactly
//! those). The job, on the checkpoint writer's thread, writes every row of the slice
//! with its weight (a full snapshot), or each row of that open delta with its weight
//! now, summed over the base and every delta, and a delete for a row whose weight is 0
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

use std::collections::HashMap;
use std::sync::Arc;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{SluiceError, vnode};

use super::Multiset;

/// The record layout this build writes and reads.
pub const MATERIALIZED_STATE_VERSION: u32 = 2;

/// Rows restored per decoding.
const RESTORE_BATCH_ROWS: usize = 4096;

/// A slice's multiset at a barrier, shared: its base and the deltas after it.
pub(super) struct SliceCopy {
    pub(super) base: Arc<Multiset>,
    pub(super) deltas: Vec<Arc<Multiset>>,
}

impl SliceCopy {
    /// The weight of `row`: its base weight and every delta's, summed.
    fn weight(&self, row: &[u8]) -> i64 {
        let deltas: i64 = self.deltas.iter().filter_map(|delta| delta.get(row)).sum();
        self.base.get(row).copied().unwrap_or(0) + deltas
    }

    /// Every row of nonzero weight, with it.
    fn rows(&self) -> Vec<(&[u8], i64)> {
        let mut changed: HashMap<&[u8], i64> = HashMap::new();
        for delta in &self.deltas {
            for (row, weight) in delta.iter() {
                *changed.entry(row).or_default() += weight;
            }
        }
        let mut rows: Vec<(&[u8], i64)> = Vec::with_capacity(self.base.len() + changed.len());
        for (row, weight) in self.base.iter() {
            rows.push((row, weight + changed.remove(row.as_ref()).unwrap_or(0)));
        }
        rows.extend(changed);
        rows.retain(|(_, weight)| *weight != 0);
        rows
    }
}

/// The snapshot writing `copy` in full, or (`changed`: the rows received since the
/// previous snapshot) only the rows whose weight changed since.
pub(super) fn snapshot(copy: SliceCopy, changed: Option<Arc<Multiset>>, vnodes: u32) -> Snapshot {
    let kind = if changed.is_some() { SnapshotKind::Delta } else { SnapshotKind::Full };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let vnode_of = |row: &[u8]| vnode::of_hash(sluice_types::key::hash(row), vnodes);
        let mut records: Vec<(u32, &[u8], i64)> = match &changed {
            None => copy.rows().into_iter().map(|(row, weight)| (vnode_of(row), row, weight)).collect(),
            Some(changed) => changed.keys().map(|row| (vnode_of(row), &row[..], copy.weight(row))).collect(),
        };
        records.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for (vnode, row, weight) in records {
            if weight == 0 {
                sink.delete(vnode, row)?;
            } else {
                sink.put(vnode, row, &weight.to_le_bytes())?;
            }
        }
        Ok(())
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

pub(super) fn restore(state: &mut dyn StateSource, encoder: &KeyEncoder, vnodes: u32) -> Result<Multiset, SluiceError> {
    let mut restored = Multiset::new();
    let mut pending: Vec<(Box<[u8]>, i64)> = Vec::with_capacity(RESTORE_BATCH_ROWS);
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
        pending.push((record.key.into(), weight));
        if pending.len() == RESTORE_BATCH_ROWS {
            load(&mut pending, encoder, &mut restored)?;
        }
    }
    load(&mut pending, encoder, &mut restored)?;
    Ok(restored)
}

/// Moves `rows` into `into` once each is a row of `encoder`'s columns in its canonical
/// encoding.
fn load(rows: &mut Vec<(Box<[u8]>, i64)>, encoder: &KeyEncoder, into: &mut Multiset) -> Result<(), SluiceError> {
    if rows.is_empty() {
        return Ok(());
    }
    let another_table = |_| corrupt("a row of another table");
    let columns = encoder.decode(rows.iter().map(|(row, _)| &row[..])).map_err(another_table)?;
    let mut encoded = KeyRows::default();
    encoder.encode(&columns, &mut encoded).map_err(another_table)?;
    if encoded.len() != rows.len() || rows.iter().enumerate().any(|(index, (row, _))| encoded.row(index) != &row[..]) {
        return Err(corrupt("a row not in its canonical encoding"));
    }
    into.extend(rows.drain(..));
    Ok(())
}
