//! Snapshots of the OVER aggregate's state as records (`sluice_state`): one per
//! partition, under the vnode of its key's placement hash (the exchange's; 0 without
//! PARTITION BY), so a restore onto any number of threads gives each partition to the
//! thread its future rows go to.
//!
//! At a barrier the driver clones the partitions the snapshot takes and returns a job
//! that writes them on the checkpoint writer's thread: every partition (a full
//! snapshot), or the partitions changed since the previous snapshot (a row arrived, or a
//! watermark emitted rows or freed history of it) and a delete for each partition freed
//! since (a delta). Rows after the barrier change the live partitions, never the copy.
//! Partitions evicted beyond the memory budget (`crate::cold`) are in runs of these same
//! records: a full snapshot merges the runs in (but the partitions whose newer copy is
//! in memory or that were freed), and a delta writes again, from their runs, the
//! partitions evicted while changed. A restore evicts as it loads.
//!
//! # Records, version [`OVER_STATE_VERSION`]
//!
//! The key is the partition's key in the key encoding of [`sluice_types::key`] (the
//! PARTITION BY columns in order; empty without them). The value (little-endian):
//! - `u32 pending`, then per pending row, in (time, arrival) order: `u64 arrival` and the
//!   whole input row (`u32 length` + its bytes in the key encoding, the input's columns
//!   in order; its time is read back from its event-time column);
//! - `u32 history`, then per row of a bounded frame's history, oldest first: `i64 time`
//!   and one value per aggregate;
//! - `u8 running` (1 for an unbounded frame, else 0), then, if 1, per aggregate: `i64
//!   count`, `i128 integer sum`, `f64 float sum` (its bits), and the MIN/MAX value.
//!
//! A value is a tag byte and its bytes: `0` NULL; `1` an integer (`i64`); `2` a float
//! (`f64` bits); `3` text (`u32 length` + UTF-8). A partition freed (a bounded frame's,
//! once it holds no pending row and no history) is a delete; an unbounded frame's
//! partitions are never freed. Arrival numbers order a partition's pending rows of equal
//! time; a restore counts on from the highest restored. Version 1 was a blob per vnode:
//! `u32 version`, `u32 partitions`, then per partition its key (`u32 length` + bytes)
//! and this value. Restoring checks every length against the remaining bytes, the key
//! against the PARTITION BY columns' canonical key encoding and the vnode against it,
//! every row against the operator's input, every value against its aggregate's kind,
//! the history's length against `ROWS n` and its times' order, and the running flag
//! against the frame: a record from another plan or a damaged one is refused
//! (`state.corrupt`), never misread, and never panics.

use std::collections::{BTreeMap, VecDeque};

use arrow::array::Array;

use sluice_runtime::{Snapshot, SnapshotKind};
use sluice_state::{StateSink, StateSource};
use sluice_types::{SluiceError, TimestampMs, vnode};

use crate::blob::{Reader, Records, check_keys};
use crate::partition::placement_hash;

use super::{Accumulator, Kind, OverAggregate, OverFrame, Partition, Value};
use crate::cold::{ColdRuns, FROM_COLD, Keys};

/// The record layout this build writes and reads.
pub const OVER_STATE_VERSION: u32 = 2;

/// The state's name in errors.
const STATE: &str = "OVER aggregate";

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;

/// Clones the partitions the snapshot takes (every one unless `delta` and the operator
/// kept its changes) and returns the snapshot writing them.
pub(super) fn snapshot(over: &mut OverAggregate, delta: bool) -> Snapshot {
    let full = !delta || !over.tracking;
    let copy: Vec<Partition> = if full {
        over.partitions.iter().flatten().cloned().collect()
    } else {
        let ids = over.changed.take();
        let mut copy = Vec::with_capacity(ids.len());
        copy.extend(ids.into_iter().filter_map(|id| over.partitions[id as usize].clone()));
        copy
    };
    let freed = if full { Vec::new() } else { std::mem::take(&mut over.freed) };
    // Partitions in cold runs: a full snapshot merges every run (but the partitions whose
    // newer copy is in memory, or that were freed); a delta those evicted while changed.
    let cold: Option<(ColdRuns, Keys)> = match over.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) {
        Some(cold) => {
            let runs = cold.store.runs().clone();
            if full {
                cold.evicted_dirty.clear();
                let mut shadow = cold.dropped.clone();
                for (id, partition) in over.partitions.iter().enumerate() {
                    let from_cold = cold.marks.get(id).is_some_and(|marks| marks & FROM_COLD != 0);
                    if let Some(partition) = partition.as_ref().filter(|_| from_cold) {
                        shadow.insert(partition.key.to_vec());
                    }
                }
                Some((runs, shadow))
            } else {
                Some((runs, std::mem::take(&mut cold.evicted_dirty)))
            }
        }
        None => None,
    };
    over.clear_changes();
    let (vnodes, no_keys) = (over.vnodes, over.spec.partition.is_empty());
    let kind = if full { SnapshotKind::Full } else { SnapshotKind::Delta };
    let job = Box::new(move |sink: &mut dyn StateSink| {
        let mut records = Records::for_sink(sink);
        if let Some((runs, keys)) = &cold {
            runs.add_to_snapshot(&mut records, full, keys, &|key| placement_hash(no_keys, key), vnodes)?;
        }
        for partition in &copy {
            let value = |bytes: &mut Vec<u8>| write_partition(partition, bytes);
            records.add(vnode::of_hash(partition.hash, vnodes), |k| k.extend_from_slice(&partition.key), Some(&value));
        }
        for key in &freed {
            records.add(vnode::of_hash(placement_hash(no_keys, key), vnodes), |k| k.extend_from_slice(key), None);
        }
        records.write(sink)
    });
    Snapshot { kind, job }
}

fn write_bytes(bytes: &mut Vec<u8>, value: &[u8]) {
    let length = u32::try_from(value.len()).expect("a key, row or text shorter than 4 GiB");
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(value);
}

fn write_count(bytes: &mut Vec<u8>, count: usize) {
    bytes.extend_from_slice(&u32::try_from(count).expect("fewer than 2^32 rows per partition").to_le_bytes());
}

fn write_value(bytes: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => bytes.push(TAG_NULL),
        Value::Int(v) => {
            bytes.push(TAG_INT);
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Value::Float(v) => {
            bytes.push(TAG_FLOAT);
            bytes.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        Value::Text(v) => {
            bytes.push(TAG_TEXT);
            write_bytes(bytes, v.as_bytes());
        }
    }
}

/// A partition's value: its pending rows, history and running accumulators.
pub(super) fn write_partition(partition: &Partition, bytes: &mut Vec<u8>) {
    write_count(bytes, partition.pending.len());
    for ((_, arrival), row) in &partition.pending {
        bytes.extend_from_slice(&arrival.to_le_bytes());
        write_bytes(bytes, row);
    }
    write_count(bytes, partition.history.len());
    for (time, values) in &partition.history {
        bytes.extend_from_slice(&time.to_le_bytes());
        values.iter().for_each(|value| write_value(bytes, value));
    }
    bytes.push(u8::from(!partition.running.is_empty()));
    for accumulator in &partition.running {
        bytes.extend_from_slice(&accumulator.count.to_le_bytes());
        bytes.extend_from_slice(&accumulator.int.to_le_bytes());
        bytes.extend_from_slice(&accumulator.float.to_bits().to_le_bytes());
        write_value(bytes, &accumulator.best);
    }
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

fn read_value(reader: &mut Reader<'_>, kind: Kind) -> Result<Value, SluiceError> {
    let value = match reader.u8()? {
        TAG_NULL => Value::Null,
        TAG_INT => Value::Int(reader.i64()?),
        TAG_FLOAT => Value::Float(reader.f64()?),
        TAG_TEXT => {
            let text = std::str::from_utf8(reader.bytes()?).map_err(|_| corrupt("text that is not UTF-8"))?;
            Value::Text(text.into())
        }
        _ => return Err(corrupt("an unknown value tag")),
    };
    if !kind.admits(&value) {
        return Err(corrupt("a value of another type than its aggregate's"));
    }
    Ok(value)
}

/// Pending rows by (time, arrival), as a partition keeps them.
type Pending = BTreeMap<(TimestampMs, u64), Box<[u8]>>;

/// A partition's pending rows, history and running accumulators, as a partition keeps
/// them.
type Parts = (Pending, VecDeque<(TimestampMs, Vec<Value>)>, Vec<Accumulator>);

/// A partition's parts from its record's `value`, checked (see the module
/// documentation).
pub(super) fn read_partition(over: &OverAggregate, value: &[u8]) -> Result<Parts, SluiceError> {
    let mut reader = Reader::new(value, STATE);
    let pending = read_pending(over, &mut reader)?;
    let history = read_history(over, &mut reader)?;
    let running = read_running(over, &mut reader)?;
    reader.finish()?;
    if running.is_empty() && pending.is_empty() && history.is_empty() {
        return Err(corrupt("a partition that holds nothing"));
    }
    Ok((pending, history, running))
}

/// Records restored between two checks of their keys (and evictions beyond the budget).
const RESTORE_CHECK_RECORDS: usize = 4096;

/// Loads the partitions of `state` (of the vnodes this instance owns) into `over`.
pub(super) fn restore(over: &mut OverAggregate, state: &mut dyn StateSource) -> Result<(), SluiceError> {
    let no_keys = over.spec.partition.is_empty();
    let mut unchecked: Vec<Box<[u8]>> = Vec::new();
    let check = |over: &mut OverAggregate, unchecked: &mut Vec<Box<[u8]>>| -> Result<(), SluiceError> {
        check_keys(&over.partition_encoder, unchecked.iter().map(|key| &key[..]), STATE, "a partition key")?;
        unchecked.clear();
        // Beyond the memory budget, restored partitions go to cold runs.
        over.evict_over_budget()
    };
    while let Some(record) = state.next_record()? {
        let key = record.key;
        let hash = placement_hash(no_keys, key);
        if vnode::of_hash(hash, over.vnodes) != record.vnode {
            return Err(corrupt("a partition under another vnode than its key's"));
        }
        let (pending, history, running) = read_partition(over, record.value)?;
        let id = over.find_or_add(key, hash);
        let partition = over.partitions[id as usize].as_mut().expect("just found");
        let fresh = partition.pending.is_empty()
            && partition.history.is_empty()
            && partition.running.iter().all(|a| *a == Accumulator::EMPTY);
        if !fresh {
            return Err(corrupt("a partition appears twice (in two vnodes)"));
        }
        let newest = pending.keys().map(|(_, arrival)| arrival.saturating_add(1)).max().unwrap_or(0);
        over.next_arrival = over.next_arrival.max(newest);
        for (time, _) in pending.keys() {
            over.due.insert((*time, id));
        }
        if let (OverFrame::Range(Some(preceding)), Some((oldest, _))) = (over.spec.frame, history.front()) {
            over.due.insert((oldest.saturating_add(preceding), id));
        }
        partition.pending = pending;
        partition.history = history;
        if !running.is_empty() {
            partition.running = running;
        }
        over.recount(id);
        unchecked.push(key.into());
        if unchecked.len() == RESTORE_CHECK_RECORDS {
            check(over, &mut unchecked)?;
        }
    }
    check(over, &mut unchecked)?;
    over.clear_changes();
    Ok(())
}

/// A partition's pending rows, each a row of the operator's input with an event time.
fn read_pending(over: &OverAggregate, reader: &mut Reader<'_>) -> Result<Pending, SluiceError> {
    // Each entry takes at least 12 bytes: a count beyond that is damage.
    let pending = reader.u32()? as usize;
    if pending > reader.remaining() / 12 {
        return Err(corrupt("more pending rows than bytes"));
    }
    let mut arrivals = Vec::with_capacity(pending);
    let mut rows: Vec<&[u8]> = Vec::with_capacity(pending);
    for _ in 0..pending {
        let arrival = reader.u64()?;
        if arrival > u64::MAX / 2 {
            return Err(corrupt("an arrival number past any run's"));
        }
        arrivals.push(arrival);
        rows.push(reader.bytes()?);
    }
    let mut entries = BTreeMap::new();
    if pending > 0 {
        let columns = over.row_encoder.decode(rows.iter().copied()).map_err(|_| corrupt("a row of another plan"))?;
        let times = super::times(&columns[over.spec.time])?;
        for (row, (arrival, bytes)) in arrivals.iter().zip(&rows).enumerate() {
            if !times.is_valid(row) {
                return Err(corrupt("a pending row without event time"));
            }
            if entries.insert((times.value(row), *arrival), Box::<[u8]>::from(*bytes)).is_some() {
                return Err(corrupt("a pending row twice"));
            }
        }
    }
    Ok(entries)
}

/// A bounded frame's history: at most `n` rows for `ROWS n`, in time order.
fn read_history(
    over: &OverAggregate,
    reader: &mut Reader<'_>,
) -> Result<VecDeque<(TimestampMs, Vec<Value>)>, SluiceError> {
    let length = reader.u32()? as usize;
    let bound = match over.spec.frame {
        OverFrame::Rows(Some(n)) => n,
        OverFrame::Range(Some(_)) => usize::MAX,
        OverFrame::Rows(None) | OverFrame::Range(None) => 0,
    };
    if length > bound || length > reader.remaining() / 8 {
        return Err(corrupt("a history longer than the frame or the bytes"));
    }
    let mut history = VecDeque::with_capacity(length);
    for _ in 0..length {
        let time = reader.i64()?;
        if history.back().is_some_and(|(last, _)| *last > time) {
            return Err(corrupt("a history out of time order"));
        }
        let values = over.kinds.iter().map(|kind| read_value(reader, *kind)).collect::<Result<_, _>>()?;
        history.push_back((time, values));
    }
    Ok(history)
}

/// An unbounded frame's running accumulators (none for a bounded frame).
fn read_running(over: &OverAggregate, reader: &mut Reader<'_>) -> Result<Vec<Accumulator>, SluiceError> {
    match reader.u8()? {
        0 if !over.spec.frame.unbounded() => Ok(Vec::new()),
        1 if over.spec.frame.unbounded() => {
            let mut running = Vec::with_capacity(over.kinds.len());
            for kind in &over.kinds {
                let count = reader.i64()?;
                let int = i128::from_le_bytes(reader.take(16)?.try_into().expect("16 bytes"));
                let float = reader.f64()?;
                let best = read_value(reader, *kind)?;
                if count < 0 {
                    return Err(corrupt("a negative count"));
                }
                running.push(Accumulator { count, int, float, best });
            }
            Ok(running)
        }
        _ => Err(corrupt("running accumulators of another frame")),
    }
}
