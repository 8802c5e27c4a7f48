//! Test helpers: snapshots and restores through the state records, and a model of the
//! runs they become (`sluice_state::StateModel`).

use std::ops::Range;

use sluice_runtime::{Operator, SnapshotKind};
use sluice_state::{CollectedState, MemoryState, StateModel};
use sluice_types::{Message, SluiceError};

/// The records a snapshot of `operator` writes (a delta when `delta` and it can), and
/// the snapshot's kind.
pub(crate) fn snapshot(operator: &mut dyn Operator, delta: bool) -> (SnapshotKind, CollectedState) {
    let snapshot = operator.snapshot_state(delta).expect("a snapshot").expect("a stateful operator's snapshot");
    let mut records = CollectedState::default();
    (snapshot.job)(&mut records).expect("the snapshot's records");
    (snapshot.kind, records)
}

/// Takes a snapshot of the instance owning `vnodes` into `model`, as a checkpoint writes
/// it into the instance's runs (a delta when `delta` and it can).
pub(crate) fn checkpoint(operator: &mut dyn Operator, model: &mut StateModel, vnodes: Range<u32>, delta: bool) {
    let (kind, records) = snapshot(operator, delta);
    model.apply(vnodes, !kind.is_delta(), records);
}

/// Restores `operator` from `model`'s records of `vnodes`.
pub(crate) fn restore(operator: &mut dyn Operator, model: &StateModel, vnodes: Range<u32>) -> Result<(), SluiceError> {
    operator.restore_state(&mut model.source(vnodes))
}

/// Restores `operator` from `records` alone.
pub(crate) fn restore_records(
    operator: &mut dyn Operator,
    records: Vec<(u32, Vec<u8>, Vec<u8>)>,
) -> Result<(), SluiceError> {
    operator.restore_state(&mut MemoryState::new(records))
}

/// The puts of a snapshot, as `(vnode, key, value)`.
pub(crate) fn puts(records: &CollectedState) -> Vec<(u32, Vec<u8>, Vec<u8>)> {
    records.points.iter().filter_map(|(vnode, key, value)| Some((*vnode, key.clone(), value.clone()?))).collect()
}

/// The vnode ranges of one instance owning all `vnodes`.
pub(crate) fn one_instance(vnodes: u32) -> Vec<Range<u32>> {
    std::iter::once(0..vnodes).collect()
}

/// The rest of what `operator` holds of a watermark's (or the end's) output, every part
/// of it, appended to `out`.
pub(crate) fn whole(operator: &mut dyn Operator, out: &mut Vec<Message>) {
    while operator.has_more() {
        operator.on_resume(out).expect("resume");
    }
}

/// A watermark's (or the end's) output part by part: `first`, what the operator emitted
/// at once, then each part it held.
pub(crate) fn parts(operator: &mut dyn Operator, first: Vec<Message>) -> Vec<Vec<Message>> {
    let mut parts = vec![first];
    while operator.has_more() {
        let mut part = Vec::new();
        operator.on_resume(&mut part).expect("resume");
        parts.push(part);
    }
    parts
}

/// The rows of the data messages among `messages`.
pub(crate) fn data_rows(messages: &[Message]) -> usize {
    messages.iter().map(|m| if let Message::Data(batch) = m { batch.num_rows() } else { 0 }).sum()
}
