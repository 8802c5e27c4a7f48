//! Snapshots of the window aggregate's state, split by vnode.
//!
//! At a barrier the driver only copies each open window's flat columns ([`Groups`]) into
//! the previous snapshot's buffers (for a window the previous snapshot already copied,
//! only the groups added since, plus the accumulators) and returns a job; the checkpoint
//! writer thread runs it. The job encodes the copy into blobs, grows the buffers by half
//! and touches the new pages (so the next copy neither reallocates nor page-faults unless
//! state grew faster than that), and gives them back. Processing resumes right after the
//! copy.
//!
//! A blob holds, for one vnode, every open window's groups whose key hashes to that vnode
//! (the same hash the exchange routes by, so after a restore onto any number of threads
//! each group lands on the thread its future rows go to). Each group keeps its placement
//! hash, so neither the copy nor the encoding rehashes keys.
//!
//! Layout, version [`WINDOW_STATE_VERSION`] (little-endian): `u32 version`, `u32 windows`,
//! then per window `i64 end`, `i64 start`, `u32 groups`, then per group the key (`u32
//! length` + its bytes in the key encoding of [`sluice_types::key`]) and one accumulator
//! value per aggregate: a tag byte, then the value (see `write_value`; a COUNT(DISTINCT)
//! set holds its values in the key encoding too).
//! Decoding checks every length against the remaining bytes and every tag against the
//! operator's aggregates: a blob from another plan is refused, never misread.

use std::sync::Arc;

use sluice_runtime::BlobJob;
use sluice_types::{SluiceError, vnode};

use crate::blob::Reader;

use super::{Accumulators, Groups, WindowAggregate, WindowGroups, index_part, table_hash};

/// The blob layout this build writes and reads. Version 2: keys and COUNT(DISTINCT)
/// values in the project's key encoding ([`sluice_types::key`]); version 1 held Arrow's
/// row format.
pub const WINDOW_STATE_VERSION: u32 = 2;
const VERSION: u32 = WINDOW_STATE_VERSION;

/// One window's groups as copied at a barrier.
#[derive(Default)]
pub(super) struct Frozen {
    end: i64,
    start: i64,
    groups: Groups,
}

/// Copies the open windows and returns the job that encodes them; None without state.
pub(super) fn snapshot(aggregate: &mut WindowAggregate) -> Option<BlobJob> {
    if aggregate.windows.is_empty() {
        return None;
    }
    let mut spare = std::mem::take(&mut *aggregate.spare.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    let mut frozen: Vec<Frozen> = Vec::with_capacity(aggregate.windows.len());
    // Windows still open since the last checkpoint continue their earlier copy (both
    // lists are in end order); the others get the largest spare buffers left.
    let mut unmatched: Vec<(&i64, &WindowGroups)> = Vec::new();
    let mut leftover: Vec<Frozen> = Vec::new();
    let mut earlier = spare.drain(..).peekable();
    for (end, window) in &aggregate.windows {
        while let Some(copy) = earlier.next_if(|copy| copy.end < *end) {
            leftover.push(copy);
        }
        match earlier.next_if(|copy| copy.end == *end && copy.start == window.start) {
            Some(mut copy) => {
                copy.groups.copy_from(&window.groups, true);
                frozen.push(copy);
            }
            None => unmatched.push((end, window)),
        }
    }
    leftover.extend(earlier);
    leftover.sort_by_key(|copy| std::cmp::Reverse(copy.groups.key_bytes.capacity()));
    unmatched.sort_by_key(|(_, window)| std::cmp::Reverse(window.groups.key_bytes.len()));
    leftover.truncate(unmatched.len());
    leftover.resize_with(unmatched.len(), Frozen::default);
    for ((end, window), mut copy) in unmatched.into_iter().zip(leftover) {
        copy.end = *end;
        copy.start = window.start;
        copy.groups.copy_from(&window.groups, false);
        frozen.push(copy);
    }
    frozen.sort_by_key(|copy| copy.end);
    let vnodes = aggregate.vnodes;
    let spare = Arc::clone(&aggregate.spare);
    Some(Box::new(move || {
        let mut frozen = frozen;
        let blobs = encode(&frozen, vnodes);
        // State grows between checkpoints: map the next copy's memory here, not on the
        // driver.
        frozen.iter_mut().for_each(|copy| copy.groups.warm());
        *spare.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = frozen;
        Ok(blobs)
    }))
}

/// The blobs of `windows` (in increasing end order), one per vnode with state, written in
/// a single pass over the groups.
fn encode(windows: &[Frozen], vnodes: u32) -> Vec<(u32, Vec<u8>)> {
    let mut blobs: Vec<Option<Blob>> = (0..vnodes).map(|_| None).collect();
    let mut touched: Vec<usize> = Vec::new();
    for window in windows {
        let groups = &window.groups;
        for group in 0..groups.len() {
            let vnode = vnode::of_hash(groups.hashes[group], vnodes) as usize;
            let blob = blobs[vnode].get_or_insert_with(Blob::default);
            if blob.window_end != Some(window.end) {
                blob.open_window(window.end, window.start);
                touched.push(vnode);
            }
            blob.groups += 1;
            let key = groups.key(group);
            blob.bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
            blob.bytes.extend_from_slice(key);
            for accumulators in &groups.accumulators {
                write_value(accumulators, group, &mut blob.bytes);
            }
        }
        for vnode in touched.drain(..) {
            if let Some(blob) = blobs[vnode].as_mut() {
                blob.close_window();
            }
        }
    }
    blobs.into_iter().enumerate().filter_map(|(vnode, blob)| blob.map(|blob| (vnode as u32, blob.finish()))).collect()
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

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "window aggregate";

pub(super) fn restore(aggregate: &mut WindowAggregate, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    for blob in blobs {
        let mut reader = Reader::new(&blob, STATE);
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        let windows = reader.u32()?;
        for _ in 0..windows {
            let end = reader.i64()?;
            let start = reader.i64()?;
            let count = reader.u32()?;
            if !aggregate.windows.contains_key(&end) {
                let window = WindowGroups::new(start, aggregate.new_accumulators());
                aggregate.windows.insert(end, window);
            }
            let groups = &mut aggregate.windows.get_mut(&end).expect("inserted above").groups;
            for _ in 0..count {
                let group = groups.len();
                groups.key_bytes.extend_from_slice(reader.bytes()?);
                groups.key_ends.push(groups.key_bytes.len());
                for accumulators in &mut groups.accumulators {
                    accumulators.push_group();
                    read_value(accumulators, group, &mut reader)?;
                }
            }
        }
        reader.finish()?;
    }
    // The new groups' placement hashes are their keys' hashes; then they are indexed.
    let no_keys = aggregate.spec.keys.is_empty();
    for window in aggregate.windows.values_mut() {
        let from = window.groups.hashes.len();
        for group in from..window.groups.len() {
            let hash = crate::partition::placement_hash(no_keys, window.groups.key(group));
            window.groups.hashes.push(hash);
        }
        let WindowGroups { index, groups, .. } = window;
        for group in from..groups.len() {
            let hash = table_hash(groups.hashes[group]);
            let key = groups.key(group);
            let part = &mut index[index_part(hash)];
            if part.find(hash, |&g| crate::same_bytes(groups.key(g as usize), key)).is_some() {
                return Err(corrupt("a key appears twice (in two vnodes)"));
            }
            part.insert_unique(hash, group as u32, |&g| table_hash(groups.hashes[g as usize]));
        }
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
                AggregateSpec { function: AggregateFunction::CountRows, argument: None, filter: None },
                AggregateSpec { function: AggregateFunction::Sum, argument: Some(3), filter: None },
                AggregateSpec { function: AggregateFunction::CountDistinct, argument: Some(3), filter: None },
            ],
            output,
            batch_size: 1024,
            late_weights: None,
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
                // Cells without the padding, which depends on the batch's widest value.
                let rows = text.lines().filter(|l| l.starts_with("| ") && !l.contains(" k "));
                lines.extend(rows.map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")));
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
        let blobs = original.snapshot().expect("snapshot").expect("state")().expect("encode");
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

    /// Restores `blobs` into a fresh aggregate and returns what it emits.
    fn restored(blobs: Vec<(u32, Vec<u8>)>) -> Vec<String> {
        let mut fresh = aggregate();
        fresh.restore(blobs.into_iter().map(|(_, b)| b).collect()).expect("restore");
        emitted(&mut fresh)
    }

    #[test]
    fn a_snapshot_holds_the_state_at_the_barrier_while_processing_goes_on() {
        let before: &[(i64, &str, Option<i64>)] = &[(0, "a", Some(1)), (0, "b", Some(2))];
        let after: &[(i64, &str, Option<i64>)] = &[(0, "a", Some(7)), (0, "d", None), (10, "c", Some(3))];
        let all: Vec<_> = before.iter().chain(after).copied().collect();
        let mut original = aggregate_with(before);
        let first = original.snapshot().expect("snapshot").expect("state");
        // Rows after the barrier change the live state, not the copy being encoded.
        original.on_data(rows(after), &mut Vec::new()).expect("data");
        assert_eq!(restored(first().expect("encode")), emitted(&mut aggregate_with(before)));
        // The next snapshot reuses the first one's buffers and sees the later rows.
        let second = original.snapshot().expect("snapshot").expect("state")().expect("encode");
        assert_eq!(restored(second), emitted(&mut aggregate_with(&all)));
        assert_eq!(emitted(&mut original), emitted(&mut aggregate_with(&all)));
    }

    #[test]
    fn many_groups_survive_snapshots_that_copy_only_what_changed() {
        let names: Vec<String> = (0..50_000).map(|i| format!("key-{i}")).collect();
        let input = |range: std::ops::Range<usize>, value: i64| -> Vec<(i64, &str, Option<i64>)> {
            range.map(|i| (0, names[i].as_str(), Some(value))).collect()
        };
        let first = input(0..30_000, 1);
        let second = input(20_000..50_000, 2);
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        let mut original = aggregate_with(&first);
        let early = original.snapshot().expect("snapshot").expect("state")().expect("encode");
        assert_eq!(restored(early), emitted(&mut aggregate_with(&first)));
        original.on_data(rows(&second), &mut Vec::new()).expect("data");
        let late = original.snapshot().expect("snapshot").expect("state")().expect("encode");
        let expected = emitted(&mut aggregate_with(&all));
        assert_eq!(expected.len(), 50_000);
        assert_eq!(restored(late), expected);
        assert_eq!(emitted(&mut original), expected);
    }

    fn aggregate_with(input: &[(i64, &str, Option<i64>)]) -> WindowAggregate {
        let mut aggregate = aggregate();
        aggregate.on_data(rows(input), &mut Vec::new()).expect("data");
        aggregate
    }

    #[test]
    fn damaged_blobs_are_refused() {
        let mut original = aggregate();
        original.on_data(rows(&[(0, "a", Some(1))]), &mut Vec::new()).expect("data");
        let blob = original.snapshot().expect("snapshot").expect("state")().expect("encode").remove(0).1;
        for cut in [0, 3, blob.len() - 1] {
            let error = aggregate().restore(vec![blob[..cut].to_vec()]).expect_err("truncated");
            assert_eq!(error.code, "state.corrupt");
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(aggregate().restore(vec![longer]).is_err(), "trailing bytes");
    }

    /// A golden vector: state blobs are persisted, so their layout (and the key encoding
    /// and hash inside) must not change silently; a change fails here and bumps
    /// `WINDOW_STATE_VERSION`.
    #[test]
    fn a_snapshot_blob_is_pinned_byte_for_byte() {
        let mut aggregate = aggregate();
        aggregate.on_data(rows(&[(100, "ab", Some(5)), (100, "ab", Some(5))]), &mut Vec::new()).expect("data");
        let job = super::snapshot(&mut aggregate).expect("state");
        let blobs = job().expect("encode");
        let [(vnode, bytes)] = blobs.as_slice() else { panic!("one vnode holds the one group: {blobs:?}") };
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let expected = concat!(
            "02000000",
            "01000000", // version 2, 1 window
            "6e00000000000000",
            "6400000000000000", // end 110, start 100
            "01000000",         // 1 group
            "07000000",
            "06020000006162", // key: 7 bytes, VARCHAR "ab"
            "01",
            "0200000000000000", // COUNT(*) = 2
            "01",
            "0a00000000000000", // SUM(v) = 10
            "05",
            "01000000",
            "09000000",
            "020500000000000000", // COUNT(DISTINCT v): {5}
        );
        assert_eq!(hex, expected);
        let hash = sluice_types::key::hash(&[0x06, 2, 0, 0, 0, b'a', b'b']);
        assert_eq!(*vnode, sluice_types::vnode::of_hash(hash, VNODES));
    }
}
