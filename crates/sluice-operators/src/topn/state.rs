//! Snapshots of the TopN operator's state as records (`sluice_state`): one per
//! partition, under the vnode of its key's placement hash (the exchange's), so a restore
//! onto any number of threads gives each partition to the thread its future rows go to.
//!
//! At a barrier the driver clones the partitions the snapshot takes (their keys and
//! kept rows' places) and shares the chunks holding the rows' bytes ([`super::rows`]):
//! every partition (a full snapshot), or those a batch touched since the previous
//! snapshot and a delete for each partition removed since (a delta). The job, on the
//! checkpoint writer's thread, reads the spilled rows' bytes back one by one, straight
//! into the records.
//!
//! # Records, version [`TOPN_STATE_VERSION`]
//!
//! The key is the partition's key in the key encoding of [`sluice_types::key`] (empty
//! without `PARTITION BY`). The value (little-endian): `u32 rows`, then per row in rank
//! order `u64 tie` and the whole row (`u32 length` + its bytes in the key encoding, the
//! input's columns in order). A partition holding no row (every one retracted) is a
//! delete. The order values are recomputed from the rows when restored; rows of equal
//! order values rank by their `tie`, the smaller first (each row's rank - 1). Version 1
//! was a blob per vnode: `u32 version`, `u32 partitions`, then per partition its key
//! (`u32 length` + bytes) and this value. Restoring checks every length against the
//! remaining bytes, every row against the operator's input and the vnode against the
//! key: a record from another plan is refused.

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, vnode};

use crate::blob::{Reader, Records};

use super::{Entry, Partition, TopN};
use crate::partition::placement_hash;
use crate::row_log::SharedRows;

/// The record layout this build writes and reads.
pub const TOPN_STATE_VERSION: u32 = 2;

/// Copies the partitions the snapshot takes (every one unless `delta` and the operator
/// kept its changes) and returns the snapshot writing them.
pub(super) fn snapshot(topn: &mut TopN, delta: bool) -> Snapshot {
    let full = !delta || !topn.tracking;
    let copy: Vec<Partition> = if full {
        topn.partitions.iter().filter(|p| !p.rows.is_empty()).cloned().collect()
    } else {
        // Sized once: millions of partitions may change between two snapshots.
        let ids = topn.changed.take();
        let mut copy = Vec::with_capacity(ids.len());
        let live = ids.into_iter().filter(|&id| (id as usize) < topn.partitions.len());
        copy.extend(live.map(|id| topn.partitions[id as usize].clone()));
        copy
    };
    let removed = if full { Vec::new() } else { std::mem::take(&mut topn.removed) };
    // Partitions in cold runs: a full snapshot merges every run (but the partitions whose
    // newer copy is in memory); a delta the partitions evicted while changed.
    let cold = topn.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()).map(|cold| {
        let runs = cold.store.runs().clone();
        if full {
            cold.evicted_dirty.clear();
            let shadow: crate::cold::Keys = (topn.partitions.iter().zip(&cold.marks))
                .filter(|(_, marks)| **marks & super::FROM_COLD != 0)
                .map(|(partition, _)| partition.key.get().to_vec())
                .collect();
            (runs, shadow)
        } else {
            (runs, std::mem::take(&mut cold.evicted_dirty))
        }
    });
    topn.clear_changes();
    let (rows, vnodes, no_keys) = (topn.rows.shared(), topn.vnodes, topn.spec.partition.is_empty());
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        let vnode_of = |key: &[u8]| vnode::of_hash(placement_hash(no_keys, key), vnodes);
        match &cold {
            Some((runs, shadow)) if full => runs.add_live(&mut records, |key| Ok(shadow.contains(key)))?,
            Some((runs, dirty)) => {
                for key in dirty {
                    let (hash, vnode) = (placement_hash(no_keys, key), vnode_of(key));
                    match runs.find(vnode, key, hash, &|_| false)? {
                        Some(found) => {
                            let value = |v: &mut Vec<u8>| v.extend_from_slice(&found.value);
                            records.add(vnode, |k| k.extend_from_slice(key), Some(&value));
                        }
                        // Evicted with no row: a delete.
                        None => records.add(vnode, |k| k.extend_from_slice(key), None),
                    }
                }
            }
            None => {}
        }
        for partition in &copy {
            let key = partition.key.get();
            if partition.rows.is_empty() {
                records.add(vnode_of(key), |k| k.extend_from_slice(key), None);
            } else {
                records.try_put(vnode_of(key), key, |bytes| write_rows(partition, &rows, bytes))?;
            }
        }
        for key in &removed {
            records.add(vnode_of(key), |k| k.extend_from_slice(key), None);
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

/// A partition's value: its kept rows in rank order, each with its tie.
pub(super) fn write_rows(partition: &Partition, shared: &SharedRows, bytes: &mut Vec<u8>) -> Result<(), SluiceError> {
    let rows = u32::try_from(partition.rows.len()).expect("fewer than 2^32 rows per partition");
    bytes.extend_from_slice(&rows.to_le_bytes());
    for (rank, entry) in partition.rows.iter().enumerate() {
        bytes.extend_from_slice(&(rank as u64).to_le_bytes());
        let length = u32::try_from(entry.row.len()).expect("a row shorter than 4 GiB");
        bytes.extend_from_slice(&length.to_le_bytes());
        shared.read_into(entry.row, bytes)?;
    }
    Ok(())
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "TopN";

/// Loads the partitions of `state` (of the vnodes this instance owns) into `topn`.
pub(super) fn restore(topn: &mut TopN, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = topn.spec.partition.is_empty();
    let mut loaded = 0usize;
    while let Some(record) = state.next_record()? {
        let key = record.key;
        let hash = placement_hash(no_keys, key);
        if vnode::of_hash(hash, topn.vnodes) != record.vnode {
            return Err(corrupt("a partition under another vnode than its key's"));
        }
        if topn.find_partition(key, hash).is_some() {
            return Err(corrupt("a partition twice"));
        }
        load_partition(topn, key, hash, record.value)?;
        loaded += 1;
        if loaded.is_multiple_of(4096) {
            // Beyond the memory budget, restored partitions go to cold runs.
            topn.evict_over_budget()?;
        }
    }
    topn.clear_changes();
    topn.evict_over_budget()
}

/// Adds the partition of `key` (placement hash `hash`, not in memory) from its record's
/// `value`; returns its index.
pub(super) fn load_partition(topn: &mut TopN, key: &[u8], hash: u64, value: &[u8]) -> Result<usize, SluiceError> {
    {
        let mut reader = Reader::new(value, STATE);
        let count = reader.u32()? as usize;
        if count == 0 || (count > topn.spec.limit && !topn.spec.retracting) {
            return Err(corrupt("a partition with no rows or more than N"));
        }
        // A row takes 12 bytes at least (tie and length): refused before allocating.
        if count > reader.remaining() / 12 {
            return Err(corrupt("more rows than bytes"));
        }
        let mut ties = Vec::with_capacity(count);
        let mut rows: Vec<&[u8]> = Vec::with_capacity(count);
        for _ in 0..count {
            ties.push(reader.u64()?);
            rows.push(reader.bytes()?);
        }
        reader.finish()?;
        let columns = topn.row_encoder.decode(rows.iter().copied()).map_err(|_| corrupt("a row of another plan"))?;
        let order = topn.order_columns(&columns)?;
        let mut entries = Vec::with_capacity(count);
        for (row, bytes) in rows.iter().enumerate() {
            let at = topn.rows.append(bytes)?;
            entries.push((Entry { order: TopN::order_of(&order, row), row: at }, ties[row]));
        }
        entries.sort_by(|(a, a_tie), (b, b_tie)| topn.compare(&a.order, &b.order).then(a_tie.cmp(b_tie)));
        let partition = topn.add_partition(key, hash);
        topn.entries += entries.len();
        topn.partitions[partition].rows = entries.into_iter().map(|(entry, _)| entry).collect::<Vec<_>>().into();
        Ok(partition)
    }
}
