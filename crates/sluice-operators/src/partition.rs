//! Exchange routing: by key hash (→ vnode → thread), or everything to one thread.
//!
//! The key hash is the project's own ([`sluice_types::key`]: the canonical key encoding,
//! hashed with XXH3-64): placement must be the same in every process, every run and
//! every build, since state is stored by vnode.

use arrow::array::{ArrayRef, UInt32Array};
use arrow::compute::take;
use arrow::record_batch::RecordBatch;
use sluice_runtime::Partitioner;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, SluiceError, Weights, vnode};

/// Hashes rows by their key columns, maps the hash to a vnode and the vnode to a slot.
pub struct HashPartitioner {
    keys: Vec<usize>,
    vnodes: u32,
    /// Made for the key columns' types at the first batch.
    encoder: Option<KeyEncoder>,
    rows: KeyRows,
    indices: Vec<Vec<u32>>,
}

impl HashPartitioner {
    pub fn new(keys: Vec<usize>, vnodes: u32) -> HashPartitioner {
        HashPartitioner { keys, vnodes, encoder: None, rows: KeyRows::default(), indices: Vec::new() }
    }
}

/// The placement hash of an encoded key as the exchange routes it: its key hash, or 0
/// for the rows of an operator without keys (which all go to one thread). State saved by
/// vnode recomputes it from the key, so a restored key lands where its rows go.
pub fn placement_hash(no_keys: bool, key: &[u8]) -> u64 {
    if no_keys { 0 } else { sluice_types::key::hash(key) }
}

/// Encodes the key columns `keys` of `rows` into `out` (with each key's placement hash),
/// making `encoder` for their types on first use.
pub fn encode_keys(
    rows: &RecordBatch,
    keys: &[usize],
    encoder: &mut Option<KeyEncoder>,
    out: &mut KeyRows,
) -> Result<(), SluiceError> {
    let columns: Vec<ArrayRef> = keys.iter().map(|&k| std::sync::Arc::clone(rows.column(k))).collect();
    let encoder = match encoder {
        Some(encoder) => encoder,
        None => encoder.insert(KeyEncoder::new(columns.iter().map(|c| c.data_type().clone()).collect())?),
    };
    encoder.encode(&columns, out)
}

impl Partitioner for HashPartitioner {
    fn partition(&mut self, batch: Batch, slots: u32, out: &mut Vec<(u32, Batch)>) -> Result<(), SluiceError> {
        if slots == 1 || self.keys.is_empty() {
            out.push((0, batch));
            return Ok(());
        }
        encode_keys(&batch.rows, &self.keys, &mut self.encoder, &mut self.rows)?;
        self.indices.resize_with(slots as usize, Vec::new);
        for (row, hash) in self.rows.hashes().iter().enumerate() {
            let slot = vnode::slot_of(vnode::of_hash(*hash, self.vnodes), self.vnodes, slots);
            self.indices[slot as usize].push(row as u32);
        }
        for (slot, indices) in self.indices.iter_mut().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let part = if indices.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_rows(&batch, &UInt32Array::from(std::mem::take(indices)))?
            };
            indices.clear();
            out.push((slot as u32, part));
        }
        Ok(())
    }
}

/// Sends every row to one slot (a single-writer sink's).
pub struct GatherPartitioner(pub u32);

impl Partitioner for GatherPartitioner {
    fn partition(&mut self, batch: Batch, slots: u32, out: &mut Vec<(u32, Batch)>) -> Result<(), SluiceError> {
        assert!(self.0 < slots, "gathering to slot {} of {slots}", self.0);
        out.push((self.0, batch));
        Ok(())
    }
}

/// The rows at `indices`, with their weights.
pub fn take_rows(batch: &Batch, indices: &UInt32Array) -> Result<Batch, SluiceError> {
    let columns = batch
        .rows
        .columns()
        .iter()
        .map(|column| take(column.as_ref(), indices, None))
        .collect::<Result<Vec<_>, _>>()?;
    let rows = RecordBatch::try_new(batch.rows.schema(), columns)?;
    Ok(match &batch.weights {
        Weights::Inserts => Batch::inserts(rows),
        Weights::Column(weights) => {
            let taken = take(weights.as_ref(), indices, None)?;
            let taken = taken.as_any().downcast_ref::<arrow::array::Int64Array>().expect("Int64 weights").clone();
            Batch::with_weights(rows, taken)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn equal_keys_go_to_the_same_slot_and_no_row_is_lost() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let keys: Vec<i64> = (0..1000).map(|i| i % 37).collect();
        let rows = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(keys))]).expect("batch");
        let mut partitioner = HashPartitioner::new(vec![0], 256);
        let mut out = Vec::new();
        partitioner.partition(Batch::inserts(rows), 3, &mut out).expect("partition");
        let total: usize = out.iter().map(|(_, b)| b.num_rows()).sum();
        assert_eq!(total, 1000);
        let mut owner = std::collections::HashMap::new();
        for (slot, batch) in &out {
            let column = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64");
            for key in column.values() {
                assert_eq!(*owner.entry(*key).or_insert(*slot), *slot, "key {key} split across slots");
            }
        }
        assert!(out.len() > 1, "37 keys over 3 slots use more than one slot");
    }
}
