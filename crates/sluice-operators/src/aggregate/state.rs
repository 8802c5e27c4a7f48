//! Snapshots of the window aggregate's state, split by vnode.
//!
//! A blob holds, for one vnode, every open window's groups whose key hashes to that vnode
//! (the same hash the exchange routes by, so after a restore onto any number of threads
//! each group lands on the thread its future rows go to). Vnodes are computed at snapshot
//! time from the stored keys, so the hot path pays nothing for them.
//!
//! Layout (little-endian): `u32 version`, `u32 windows`, then per window `i64 end`,
//! `i64 start`, `u32 groups`, then per group the key (`u32 length` + bytes) and one
//! accumulator value per aggregate: a tag byte, then the value (see `write_value`).
//! Decoding checks every length against the remaining bytes and every tag against the
//! operator's aggregates: a blob from another plan is refused, never misread.

use std::collections::HashMap;

use datafusion_common::hash_utils::RandomState;
use sluice_types::{SluiceError, vnode};

use super::{Accumulators, WindowAggregate, WindowGroups};

const VERSION: u32 = 1;

pub(super) fn snapshot(aggregate: &WindowAggregate) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
    // One buffer per vnode with state, written in a single pass over the groups.
    let mut blobs: Vec<Option<Blob>> = (0..aggregate.vnodes).map(|_| None).collect();
    let mut touched: Vec<usize> = Vec::new();
    for (end, window) in &aggregate.windows {
        for group in 0..window.keys.len() {
            let vnode = usize::from(window.vnodes[group]);
            let blob = blobs[vnode].get_or_insert_with(Blob::default);
            if blob.window_end != Some(*end) {
                blob.open_window(*end, window.start);
                touched.push(vnode);
            }
            blob.groups += 1;
            let key = &window.keys[group];
            blob.bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
            blob.bytes.extend_from_slice(key);
            for accumulators in &window.accumulators {
                write_value(accumulators, group, &mut blob.bytes);
            }
        }
        for vnode in touched.drain(..) {
            if let Some(blob) = blobs[vnode].as_mut() {
                blob.close_window();
            }
        }
    }
    Ok(blobs
        .into_iter()
        .enumerate()
        .filter_map(|(vnode, blob)| blob.map(|blob| (vnode as u32, blob.finish())))
        .collect())
}

/// A vnode's blob being written: the body, and where the open window's group count goes.
#[derive(Default)]
struct Blob {
    bytes: Vec<u8>,
    windows: u32,
    window_end: Option<i64>,
    count_at: usize,
    groups: u32,
}

impl Blob {
    fn open_window(&mut self, end: i64, start: i64) {
        if self.bytes.is_empty() {
            self.bytes.extend_from_slice(&VERSION.to_le_bytes());
            self.bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        self.windows += 1;
        self.window_end = Some(end);
        self.bytes.extend_from_slice(&end.to_le_bytes());
        self.bytes.extend_from_slice(&start.to_le_bytes());
        self.count_at = self.bytes.len();
        self.bytes.extend_from_slice(&0u32.to_le_bytes());
        self.groups = 0;
    }

    fn close_window(&mut self) {
        self.bytes[self.count_at..self.count_at + 4].copy_from_slice(&self.groups.to_le_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.bytes[4..8].copy_from_slice(&self.windows.to_le_bytes());
        self.bytes
    }
}

/// The vnode of every group of `window`, from its key's placement hash.
fn group_vnodes(
    aggregate: &WindowAggregate,
    window: &WindowGroups,
    hashes: &mut Vec<u64>,
) -> Result<Vec<u32>, SluiceError> {
    if aggregate.spec.keys.is_empty() {
        return Ok(vec![0; window.keys.len()]);
    }
    let parser = aggregate.key_converter.parser();
    let columns = aggregate.key_converter.convert_rows(window.keys.iter().map(|key| parser.parse(key)))?;
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(
        columns
            .iter()
            .enumerate()
            .map(|(i, c)| arrow::datatypes::Field::new(format!("k{i}"), c.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let rows = arrow::record_batch::RecordBatch::try_new(schema, columns)?;
    let keys: Vec<usize> = (0..rows.num_columns()).collect();
    crate::partition::key_hashes(&rows, &keys, hashes)?;
    Ok(hashes.iter().map(|hash| vnode::of_hash(*hash, aggregate.vnodes)).collect())
}

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;
const TAG_AVG: u8 = 4;
const TAG_SET: u8 = 5;

fn write_value(accumulators: &Accumulators, group: usize, bytes: &mut Vec<u8>) {
    let int = |value: Option<i64>, bytes: &mut Vec<u8>| match value {
        Some(value) => {
            bytes.push(TAG_INT);
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        None => bytes.push(TAG_NULL),
    };
    match accumulators {
        Accumulators::Count(counts) => int(Some(counts[group]), bytes),
        Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => int(values[group], bytes),
        Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => match values[group] {
            Some(value) => {
                bytes.push(TAG_FLOAT);
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Accumulators::MinMaxString { values, .. } => match &values[group] {
            Some(text) => {
                bytes.push(TAG_TEXT);
                bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
            None => bytes.push(TAG_NULL),
        },
        Accumulators::Avg { sums, counts } => {
            bytes.push(TAG_AVG);
            bytes.extend_from_slice(&sums[group].to_le_bytes());
            bytes.extend_from_slice(&counts[group].to_le_bytes());
        }
        Accumulators::Distinct(sets) => {
            bytes.push(TAG_SET);
            bytes.extend_from_slice(&(sets[group].len() as u32).to_le_bytes());
            let mut values: Vec<&Box<[u8]>> = sets[group].iter().collect();
            values.sort();
            for value in values {
                bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
                bytes.extend_from_slice(value);
            }
        }
    }
}

/// A bounds-checked reader over a blob.
struct Reader<'a> {
    bytes: &'a [u8],
}

fn corrupt(what: &str) -> SluiceError {
    SluiceError::internal("state.corrupt", format!("window aggregate state is damaged or from another plan: {what}"))
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], SluiceError> {
        if self.bytes.len() < count {
            return Err(corrupt("truncated"));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, SluiceError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, SluiceError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Result<i64, SluiceError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn f64(&mut self) -> Result<f64, SluiceError> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], SluiceError> {
        let length = self.u32()? as usize;
        self.take(length)
    }
}

pub(super) fn restore(aggregate: &mut WindowAggregate, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    for blob in blobs {
        let mut reader = Reader { bytes: &blob };
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        let windows = reader.u32()?;
        for _ in 0..windows {
            let end = reader.i64()?;
            let start = reader.i64()?;
            let groups = reader.u32()?;
            if !aggregate.windows.contains_key(&end) {
                let accumulators = aggregate.new_accumulators();
                let index = HashMap::with_hasher(RandomState::with_seed(0));
                let groups = WindowGroups { start, index, keys: Vec::new(), vnodes: Vec::new(), accumulators };
                aggregate.windows.insert(end, groups);
            }
            let window = aggregate.windows.get_mut(&end).expect("inserted above");
            for _ in 0..groups {
                let key: Box<[u8]> = reader.bytes()?.into();
                if window.index.contains_key(&key) {
                    return Err(corrupt("a key appears in two vnodes"));
                }
                let group = window.keys.len();
                window.index.insert(key.clone(), group as u32);
                window.keys.push(key);
                for accumulators in &mut window.accumulators {
                    accumulators.push_group();
                    read_value(accumulators, group, &mut reader)?;
                }
            }
        }
        if !reader.bytes.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
    }
    // Restores are rare: recompute every group's vnode from its key.
    let mut hashes = Vec::new();
    let ends: Vec<i64> = aggregate.windows.keys().copied().collect();
    for end in ends {
        let vnodes = group_vnodes(aggregate, &aggregate.windows[&end], &mut hashes)?;
        let window = aggregate.windows.get_mut(&end).expect("listed above");
        window.vnodes = vnodes.into_iter().map(|v| v as u16).collect();
    }
    Ok(())
}

fn read_value(accumulators: &mut Accumulators, group: usize, reader: &mut Reader<'_>) -> Result<(), SluiceError> {
    let tag = reader.u8()?;
    match (accumulators, tag) {
        (Accumulators::Count(counts), TAG_INT) => counts[group] = reader.i64()?,
        (Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. }, TAG_INT) => {
            values[group] = Some(reader.i64()?)
        }
        (Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. }, TAG_FLOAT) => {
            values[group] = Some(reader.f64()?)
        }
        (Accumulators::MinMaxString { values, .. }, TAG_TEXT) => {
            let text = std::str::from_utf8(reader.bytes()?).map_err(|_| corrupt("text is not UTF-8"))?;
            values[group] = Some(text.to_string());
        }
        (Accumulators::Avg { sums, counts }, TAG_AVG) => {
            sums[group] = reader.f64()?;
            counts[group] = reader.i64()?;
        }
        (Accumulators::Distinct(sets), TAG_SET) => {
            let count = reader.u32()?;
            for _ in 0..count {
                sets[group].insert(reader.bytes()?.into());
            }
        }
        (
            Accumulators::SumInt(_)
            | Accumulators::MinMaxInt { .. }
            | Accumulators::SumFloat(_)
            | Accumulators::MinMaxFloat { .. }
            | Accumulators::MinMaxString { .. },
            TAG_NULL,
        ) => {}
        _ => return Err(corrupt("an accumulator of another kind")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use arrow::record_batch::RecordBatch;
    use sluice_runtime::Operator;
    use sluice_types::{Batch, Message};

    use super::super::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregate, WindowAggregateSpec};

    const VNODES: u32 = 16;

    fn aggregate() -> WindowAggregate {
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        let input = Arc::new(Schema::new(vec![
            Field::new("start", ts.clone(), false),
            Field::new("end", ts.clone(), false),
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let output = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("end", ts, false),
            Field::new("n", DataType::Int64, false),
            Field::new("total", DataType::Int64, true),
            Field::new("kinds", DataType::Int64, false),
        ]));
        let spec = WindowAggregateSpec {
            window_start: 0,
            window_end: 1,
            keys: vec![2],
            groups: vec![GroupColumn::Key(0), GroupColumn::WindowEnd],
            aggregates: vec![
                AggregateSpec { function: AggregateFunction::CountRows, argument: None },
                AggregateSpec { function: AggregateFunction::Sum, argument: Some(3) },
                AggregateSpec { function: AggregateFunction::CountDistinct, argument: Some(3) },
            ],
            output,
            batch_size: 1024,
        };
        WindowAggregate::new(spec, &input, Arc::new(AtomicU64::new(0)), VNODES).expect("aggregate")
    }

    fn rows(rows: &[(i64, &str, Option<i64>)]) -> Batch {
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        let input = Arc::new(Schema::new(vec![
            Field::new("start", ts.clone(), false),
            Field::new("end", ts, false),
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let starts = TimestampMillisecondArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
        let ends = TimestampMillisecondArray::from(rows.iter().map(|r| r.0 + 10).collect::<Vec<_>>());
        let keys = StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
        let values = Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>());
        let batch =
            RecordBatch::try_new(input, vec![Arc::new(starts), Arc::new(ends), Arc::new(keys), Arc::new(values)]);
        Batch::inserts(batch.expect("batch"))
    }

    /// Every output row as text, sorted.
    fn emitted(aggregate: &mut WindowAggregate) -> Vec<String> {
        let mut out = Vec::new();
        aggregate.on_end(&mut out).expect("end");
        let mut lines = Vec::new();
        for message in out {
            if let Message::Data(batch) = message {
                let text = arrow::util::pretty::pretty_format_batches(&[batch.rows]).expect("format").to_string();
                lines.extend(text.lines().filter(|l| l.starts_with("| ") && !l.contains(" k ")).map(str::to_string));
            }
        }
        lines.sort();
        lines
    }

    #[test]
    fn a_restored_aggregate_emits_what_the_original_would_split_by_vnode_across_instances() {
        let input =
            rows(&[(0, "a", Some(1)), (0, "b", Some(2)), (10, "a", None), (0, "a", Some(1)), (10, "c", Some(5))]);
        let mut original = aggregate();
        original.on_data(input.clone(), &mut Vec::new()).expect("data");
        let blobs = original.snapshot().expect("snapshot");
        assert!(blobs.iter().all(|(vnode, _)| *vnode < VNODES));
        assert!(blobs.len() > 1, "three keys spread over vnodes");
        // Restore onto two instances owning half the vnodes each, as after rescaling.
        let (low, high): (Vec<_>, Vec<_>) = blobs.into_iter().partition(|(vnode, _)| *vnode < VNODES / 2);
        let mut first = aggregate();
        first.restore(low.into_iter().map(|(_, b)| b).collect()).expect("restore");
        let mut second = aggregate();
        second.restore(high.into_iter().map(|(_, b)| b).collect()).expect("restore");
        let mut restored = emitted(&mut first);
        restored.extend(emitted(&mut second));
        restored.sort();
        assert_eq!(restored, emitted(&mut original));
        assert_eq!(restored.len(), 4, "(a,0) (b,0) (a,10) (c,10)");
    }

    #[test]
    fn damaged_blobs_are_refused() {
        let mut original = aggregate();
        original.on_data(rows(&[(0, "a", Some(1))]), &mut Vec::new()).expect("data");
        let blob = original.snapshot().expect("snapshot").remove(0).1;
        for cut in [0, 3, blob.len() - 1] {
            let error = aggregate().restore(vec![blob[..cut].to_vec()]).expect_err("truncated");
            assert_eq!(error.code, "state.corrupt");
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(aggregate().restore(vec![longer]).is_err(), "trailing bytes");
    }
}
