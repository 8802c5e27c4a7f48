//! Snapshots of the TopN operator's state, split by vnode.
//!
//! At a barrier the driver clones the partitions (their keys and first N rows' places) and shares the chunks holding the rows' bytes ([`super::rows`]), and
//! returns a job; the checkpoint writer thread encodes the copy (reading the spilled
//! rows' bytes back one by one, straight into the blob) into one blob
//! per vnode holding partitions, the vnode of each partition key's placement hash (the
//! exchange's), so a restore onto any number of threads gives each partition to the
//! thread its future rows go to.
//!
//! Layout, version [`TOPN_STATE_VERSION`] (little-endian): `u32 version`, `u32
//! partitions`, then per partition, in increasing key order: the key (`u32 length` + its
//! bytes in the key encoding of [`sluice_types::key`]), `u32 rows`, then per row in rank
//! order `u64 tie` and the whole row (`u32 length` + its bytes in the key encoding, the
//! input's columns in order). The order values are recomputed from the rows when
//! restored; rows of equal order values rank by their `tie`, the smaller first. This
//! build writes each row's rank - 1 as its tie; earlier builds wrote arrival numbers,
//! which rank rows alike. Decoding checks every length against the remaining bytes, and every row
//! must decode as a row of the operator's input: a blob from another plan is refused.

use sluice_runtime::BlobJob;
use sluice_types::SluiceError;

use crate::blob::{BlobWriter, Reader};

use super::rows::SharedRows;
use super::{Entry, Partition, TopN};
use crate::partition::{in_vnode_order, placement_hash};

/// The blob layout this build writes and reads.
pub const TOPN_STATE_VERSION: u32 = 1;
const VERSION: u32 = TOPN_STATE_VERSION;

/// Copies the partitions and returns the job that encodes them; None without state.
pub(super) fn snapshot(topn: &TopN) -> Option<BlobJob> {
    let copy: Vec<Partition> = topn.partitions.iter().filter(|p| !p.rows.is_empty()).cloned().collect();
    if copy.is_empty() {
        return None;
    }
    let (rows, vnodes, no_keys) = (topn.rows.shared(), topn.vnodes, topn.spec.partition.is_empty());
    Some(Box::new(move || encode(copy, &rows, vnodes, no_keys)))
}

fn write_bytes(bytes: &mut Vec<u8>, value: &[u8]) {
    let length = u32::try_from(value.len()).expect("a key or row shorter than 4 GiB");
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(value);
}

/// One blob per vnode holding partitions, in vnode order, each partition in increasing
/// key order ([`BlobWriter::encode_by_vnode`]).
fn encode(
    partitions: Vec<Partition>,
    shared: &SharedRows,
    vnodes: u32,
    no_keys: bool,
) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
    let partitions = in_vnode_order(partitions, vnodes, no_keys, |partition| partition.key.get());
    BlobWriter::encode_by_vnode(VERSION, partitions, |partition, bytes| {
        write_bytes(bytes, partition.key.get());
        let rows = u32::try_from(partition.rows.len()).expect("fewer than 2^32 rows per partition");
        bytes.extend_from_slice(&rows.to_le_bytes());
        for (rank, entry) in partition.rows.iter().enumerate() {
            bytes.extend_from_slice(&(rank as u64).to_le_bytes());
            let length = u32::try_from(entry.row.len()).expect("a row shorter than 4 GiB");
            bytes.extend_from_slice(&length.to_le_bytes());
            shared.read_into(entry.row, bytes)?;
        }
        Ok(())
    })
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "TopN";

/// Loads the partitions of `blobs` (of the vnodes this instance owns) into `topn`.
pub(super) fn restore(topn: &mut TopN, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    let no_keys = topn.spec.partition.is_empty();
    for blob in blobs {
        let mut reader = Reader::new(&blob, STATE);
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        for _ in 0..reader.u32()? {
            let key = reader.bytes()?;
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
            let columns =
                topn.row_encoder.decode(rows.iter().copied()).map_err(|_| corrupt("a row of another plan"))?;
            let order = topn.order_columns(&columns)?;
            let mut entries = Vec::with_capacity(count);
            for (row, bytes) in rows.iter().enumerate() {
                let at = topn.rows.append(bytes)?;
                entries.push((Entry { order: TopN::order_of(&order, row), row: at }, ties[row]));
            }
            entries.sort_by(|(a, a_tie), (b, b_tie)| topn.compare(&a.order, &b.order).then(a_tie.cmp(b_tie)));
            let partition = topn.partition_of(key, placement_hash(no_keys, key));
            if !topn.partitions[partition].rows.is_empty() {
                return Err(corrupt("a partition appears twice (in two vnodes)"));
            }
            topn.partitions[partition].rows = entries.into_iter().map(|(entry, _)| entry).collect::<Vec<_>>().into();
        }
        reader.finish()?;
    }
    Ok(())
}
