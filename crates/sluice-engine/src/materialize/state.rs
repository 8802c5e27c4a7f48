//! Snapshots of a materialized table's slice, split by vnode.
//!
//! At a barrier the [`Integrate`](super::Integrate) operator shares (does not copy) its
//! slice's base and deltas; the checkpoint writer thread merges them into one multiset
//! and encodes one blob per vnode holding rows, the vnode of each row's placement hash
//! (the hash of its key encoding, as the exchange before the operator places it), so a
//! restore onto any number of threads gives each row to the thread its future
//! retractions go to.
//!
//! Layout, version [`MATERIALIZED_STATE_VERSION`] (little-endian): `u32 version`, `u32
//! rows`, then per row, in increasing byte order of the rows: the whole row (`u32
//! length` + its bytes in the key encoding of [`sluice_types::key`], the table's columns
//! in order) and `i64 weight` (never 0: a row of weight w stands for w equal rows).
//! Decoding checks every length against the remaining bytes, and every row must decode
//! as a row of the table: a blob from another plan is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sluice_types::key::KeyEncoder;
use sluice_types::{SluiceError, vnode};

use super::Multiset;

/// The blob layout this build writes and reads.
pub const MATERIALIZED_STATE_VERSION: u32 = 1;

/// The multiset `base` plus `deltas`, one blob per vnode of `vnodes` that holds rows.
pub(super) fn encode(base: &Multiset, deltas: &[Arc<Multiset>], vnodes: u32) -> Vec<(u32, Vec<u8>)> {
    let mut changed: HashMap<&[u8], i64> = HashMap::new();
    for delta in deltas {
        for (row, weight) in delta.iter() {
            *changed.entry(row).or_default() += weight;
        }
    }
    let mut rows: Vec<(&[u8], i64)> = Vec::with_capacity(base.len() + changed.len());
    for (row, weight) in base {
        rows.push((row, weight + changed.remove(row.as_ref()).unwrap_or(0)));
    }
    rows.extend(changed);
    rows.retain(|(_, weight)| *weight != 0);
    rows.sort_unstable();
    let mut blobs: BTreeMap<u32, (u32, Vec<u8>)> = BTreeMap::new();
    for (row, weight) in rows {
        let vnode = vnode::of_hash(sluice_types::key::hash(row), vnodes);
        let (count, bytes) = blobs.entry(vnode).or_insert_with(|| {
            let mut bytes = MATERIALIZED_STATE_VERSION.to_le_bytes().to_vec();
            bytes.extend_from_slice(&0u32.to_le_bytes());
            (0, bytes)
        });
        *count += 1;
        let length = u32::try_from(row.len()).expect("a row shorter than 4 GiB");
        bytes.extend_from_slice(&length.to_le_bytes());
        bytes.extend_from_slice(row);
        bytes.extend_from_slice(&weight.to_le_bytes());
    }
    blobs
        .into_iter()
        .map(|(vnode, (count, mut bytes))| {
            bytes[4..8].copy_from_slice(&count.to_le_bytes());
            (vnode, bytes)
        })
        .collect()
}

fn corrupt(what: &str) -> SluiceError {
    SluiceError::internal("state.corrupt", format!("materialized table state is damaged or from another plan: {what}"))
}

/// A bounds-checked cursor over a blob.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], SluiceError> {
        if self.0.len() < count {
            return Err(corrupt("truncated"));
        }
        let (head, tail) = self.0.split_at(count);
        self.0 = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, SluiceError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn i64(&mut self) -> Result<i64, SluiceError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// Adds the rows of `blob` to `into`; every row must be a row of `encoder`'s columns.
pub(super) fn decode(blob: &[u8], encoder: &KeyEncoder, into: &mut Multiset) -> Result<(), SluiceError> {
    let mut reader = Reader(blob);
    if reader.u32()? != MATERIALIZED_STATE_VERSION {
        return Err(corrupt("unknown version"));
    }
    let count = reader.u32()? as usize;
    // Each row takes at least 12 bytes: a count beyond that is damage, not a reservation.
    if count > blob.len() / 12 {
        return Err(corrupt("more rows than bytes"));
    }
    let mut rows: Vec<(&[u8], i64)> = Vec::with_capacity(count);
    for _ in 0..count {
        let length = reader.u32()? as usize;
        let row = reader.take(length)?;
        let weight = reader.i64()?;
        if weight == 0 {
            return Err(corrupt("a row of weight 0"));
        }
        rows.push((row, weight));
    }
    if !reader.0.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    encoder.decode(rows.iter().map(|(row, _)| *row)).map_err(|_| corrupt("a row of another table"))?;
    for (row, weight) in rows {
        *into.entry(row.into()).or_default() += weight;
    }
    into.retain(|_, weight| *weight != 0);
    Ok(())
}
