//! Snapshots of the OVER aggregate's state, split by vnode.
//!
//! At a barrier the driver clones the partitions that hold state and returns a job; the
//! checkpoint writer thread encodes the copy into one blob per vnode holding partitions,
//! the vnode of each partition key's placement hash (the exchange's; 0 without PARTITION
//! BY), so a restore onto any number of threads gives each partition to the thread its
//! future rows go to.
//!
//! Layout, version [`OVER_STATE_VERSION`] (little-endian): `u32 version`, `u32
//! partitions`, then per partition, in increasing key order:
//! - the key: `u32 length` + its bytes in the key encoding of [`sluice_types::key`];
//! - `u32 pending`, then per pending row, in (time, arrival) order: `u64 arrival` and the
//!   whole input row (`u32 length` + its bytes in the key encoding, the input's columns
//!   in order; its time is read back from its event-time column);
//! - `u32 history`, then per row of a bounded frame's history, oldest first: `i64 time`
//!   and one value per aggregate;
//! - `u8 running` (1 for an unbounded frame, else 0), then, if 1, per aggregate: `i64
//!   count`, `i128 integer sum`, `f64 float sum` (its bits), and the MIN/MAX value.
//!
//! A value is a tag byte and its bytes: `0` NULL; `1` an integer (`i64`); `2` a float
//! (`f64` bits); `3` text (`u32 length` + UTF-8). Decoding checks every length against
//! the remaining bytes, every row against the operator's input, every value against its
//! aggregate's kind, the history's length against `ROWS n` and its times' order, and the
//! running flag against the frame: a blob from another plan is refused, never misread.

use std::collections::{BTreeMap, VecDeque};

use arrow::array::Array;

use sluice_runtime::BlobJob;
use sluice_types::{SluiceError, vnode};

use crate::blob::{BlobWriter, Reader};

use super::{Accumulator, Kind, OverAggregate, OverFrame, Partition, Value};

/// The blob layout this build writes and reads.
pub const OVER_STATE_VERSION: u32 = 1;
const VERSION: u32 = OVER_STATE_VERSION;

/// The state's name in errors.
const STATE: &str = "OVER aggregate";

const TAG_NULL: u8 = 0;
const TAG_INT: u8 = 1;
const TAG_FLOAT: u8 = 2;
const TAG_TEXT: u8 = 3;

/// Copies the partitions and returns the job that encodes them; None without state.
pub(super) fn snapshot(over: &OverAggregate) -> Option<BlobJob> {
    let copy: Vec<Partition> = over.partitions.iter().flatten().cloned().collect();
    if copy.is_empty() {
        return None;
    }
    let vnodes = over.vnodes;
    Some(Box::new(move || Ok(encode(copy, vnodes))))
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

fn encode(mut partitions: Vec<Partition>, vnodes: u32) -> Vec<(u32, Vec<u8>)> {
    partitions.sort_by(|a, b| a.key.cmp(&b.key));
    let mut blobs = BlobWriter::new(VERSION);
    for partition in &partitions {
        let bytes = blobs.entry(vnode::of_hash(partition.hash, vnodes));
        write_bytes(bytes, &partition.key);
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
    blobs.finish()
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

/// Loads the partitions of `blobs` (of the vnodes this instance owns) into `over`.
pub(super) fn restore(over: &mut OverAggregate, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    let no_keys = over.spec.partition.is_empty();
    let aggregates = over.spec.aggregates.len();
    for blob in blobs {
        let mut reader = Reader::new(&blob, STATE);
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        for _ in 0..reader.u32()? {
            let key = reader.bytes()?;
            if no_keys && !key.is_empty() {
                return Err(corrupt("a partition key without PARTITION BY"));
            }
            if !no_keys {
                over.partition_encoder.decode(std::iter::once(key)).map_err(|_| corrupt("a key of another plan"))?;
            }
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
                let columns =
                    over.row_encoder.decode(rows.iter().copied()).map_err(|_| corrupt("a row of another plan"))?;
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
            let history_length = reader.u32()? as usize;
            let bound = match over.spec.frame {
                OverFrame::Rows(Some(n)) => n,
                OverFrame::Range(Some(_)) => usize::MAX,
                OverFrame::Rows(None) | OverFrame::Range(None) => 0,
            };
            if history_length > bound || history_length > reader.remaining() / 8 {
                return Err(corrupt("a history longer than the frame or the bytes"));
            }
            let mut history = VecDeque::with_capacity(history_length);
            for _ in 0..history_length {
                let time = reader.i64()?;
                if history.back().is_some_and(|(last, _)| *last > time) {
                    return Err(corrupt("a history out of time order"));
                }
                let values = over.kinds.iter().map(|kind| read_value(&mut reader, *kind)).collect::<Result<_, _>>()?;
                history.push_back((time, values));
            }
            let running = match reader.u8()? {
                0 if !over.spec.frame.unbounded() => Vec::new(),
                1 if over.spec.frame.unbounded() => {
                    let mut running = Vec::with_capacity(aggregates);
                    for kind in &over.kinds {
                        let count = reader.i64()?;
                        let int = i128::from_le_bytes(reader.take(16)?.try_into().expect("16 bytes"));
                        let float = reader.f64()?;
                        let best = read_value(&mut reader, *kind)?;
                        if count < 0 {
                            return Err(corrupt("a negative count"));
                        }
                        running.push(Accumulator { count, int, float, best });
                    }
                    running
                }
                _ => return Err(corrupt("running accumulators of another frame")),
            };
            let hash = crate::partition::placement_hash(no_keys, key);
            let id = over.partition_of(key, hash);
            let partition = over.partitions[id as usize].as_mut().expect("just found");
            let fresh = partition.pending.is_empty()
                && partition.history.is_empty()
                && partition.running.iter().all(|a| *a == Accumulator::EMPTY);
            if !fresh {
                return Err(corrupt("a partition appears twice (in two vnodes)"));
            }
            let newest = arrivals.iter().max().map_or(0, |a| a.saturating_add(1));
            over.next_arrival = over.next_arrival.max(newest);
            for (time, _) in entries.keys() {
                over.due.insert((*time, id));
            }
            if let (OverFrame::Range(Some(preceding)), Some((oldest, _))) = (over.spec.frame, history.front()) {
                over.due.insert((oldest.saturating_add(preceding), id));
            }
            partition.pending = entries;
            partition.history = history;
            if !running.is_empty() {
                partition.running = running;
            }
        }
        reader.finish()?;
    }
    Ok(())
}
