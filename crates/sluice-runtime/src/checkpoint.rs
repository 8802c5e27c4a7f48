//! The runtime's side of checkpoints: what drivers report at a barrier, what the
//! controller hands to the store, and what a restored run starts from.
//!
//! Protocol (leader/worker-shaped even in one process):
//! 1. The controller sends `Barrier(e)` to every driver. Each driver records the position
//!    of every lane it owns *before* injecting the barrier into its flows, so the
//!    positions are exactly those after the last row that precedes the barrier
//!    (invariant 3).
//! 2. Each segment that receives the barrier (aligned across its senders in exactly-once
//!    mode) copies its operators' state (a [`Snapshot`]'s job holds the copy: everything,
//!    or what changed since the instance's previous snapshot); each sink writer
//!    pre-commits. Writing the copies as records happens later, off the drivers.
//! 3. When every segment of a driver has passed barrier `e`, the driver acks with its
//!    [`ManifestSlice`].
//! 4. When every driver acked (the pause processing saw ends here), the controller hands
//!    the merged slice to the checkpoint writer thread, whose [`Checkpointer`] runs the
//!    snapshot jobs into state runs, writes them, waits until they are durable, and only
//!    then publishes manifest `e` (invariant 1). The controller meanwhile goes on
//!    answering drivers and stop requests.
//! 5. Only after the manifest is published does the controller call each sink's
//!    `commit(e, records)` (invariant 2).
//!
//! In a cluster (see `crate::peers`) the leader's controller sends `Barrier(e)` to the
//! other workers as well; each of them runs steps 1-4 for its own drivers but only
//! writes its state objects (`Checkpointer::write_part`) and sends its part to the
//! leader. The leader publishes manifest `e` once it has every worker's part and its
//! own, commits its sinks, and sends `Commit(e)`, on which each worker commits its own
//! sinks. So a manifest names only objects that are durable on every worker, and no
//! sink anywhere commits an epoch before its manifest is published.
//!
//! A checkpoint that fails (store error) is abandoned: nothing was published, sinks stay
//! uncommitted, and the next interval tries a new epoch. Its sinks' pre-commit records
//! ride along in the next manifest and are committed, epoch by epoch, once that one is
//! published (see `Coordinator::on_written`). A checkpoint whose barrier is not
//! acknowledged by every driver within `timeout` fails the same way; the next barrier
//! still waits for the late acknowledgements (one barrier at a time), and each further
//! `timeout` without them counts as one more failure.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use sluice_state::merge::MergeInput;
use sluice_types::{Epoch, SluiceError};

use crate::chain::{Snapshot, SnapshotGuard};
use crate::plan::SinkFactory;

/// The position of one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePosition {
    pub source: usize,
    pub lane: u32,
    pub bytes: Vec<u8>,
}

/// One operator instance's state copy, taken at the barrier, still to be written.
#[derive(Debug)]
pub struct DeferredState {
    /// The operator's stable id (see [`operator_id`](crate::place::operator_id)).
    pub operator: String,
    /// The vnodes the instance owns: its records lie there, and a full snapshot is the
    /// whole state of exactly these vnodes.
    pub vnodes: Range<u32>,
    pub snapshot: Snapshot,
    /// Marked once the records are written into a run the next checkpoint names.
    pub guard: SnapshotGuard,
}

/// A sink writer's pre-commit record for one epoch, and how many rows it stages (which
/// become visible, and count as "rows out", only when the epoch is committed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// The flow (hence the sink) of the writer.
    pub flow: usize,
    pub epoch: u64,
    pub record: Vec<u8>,
    pub rows: u64,
}

/// What one driver contributes to manifest `e`.
#[derive(Debug, Default)]
pub struct ManifestSlice {
    pub positions: Vec<LanePosition>,
    /// State copied at the barrier and not written yet: drivers hand these over so the
    /// writing happens off their threads, by the [`Checkpointer`].
    pub deferred: Vec<DeferredState>,
    /// The pre-commit record of each sink writer on the driver. A manifest may carry
    /// records of earlier epochs whose own checkpoint failed.
    pub sink_records: Vec<SinkRecord>,
}

impl ManifestSlice {
    pub fn merge(&mut self, other: ManifestSlice) {
        self.positions.extend(other.positions);
        self.deferred.extend(other.deferred);
        self.sink_records.extend(other.sink_records);
    }
}

/// Persists checkpoints. Implemented above the runtime (the store lives there).
///
/// A checkpoint is written in two steps, so that in a cluster every worker writes its
/// own state and only the leader publishes: [`Checkpointer::write_part`] (every worker,
/// for its own slice) and [`Checkpointer::publish`] (the leader, with every worker's
/// part). One worker alone does both, in that order.
pub trait Checkpointer: Send {
    /// Writes the state of `slice` (this worker's drivers, merged: each deferred state
    /// run into a state run, its guard marked once written), waits until it is durable,
    /// and returns this worker's part of manifest `epoch`: its lane positions, its
    /// operators' runs and its sinks' records, in an encoding of the implementer's (it
    /// crosses to the leader).
    fn write_part(&mut self, epoch: Epoch, slice: ManifestSlice) -> Result<Vec<u8>, SluiceError>;

    /// Publishes manifest `epoch` atomically from every worker's part (each written by
    /// `write_part` for this epoch and durable); returns the bytes of state it names.
    /// `final_epoch` marks the checkpoint taken when the run stops or ends.
    fn publish(&mut self, epoch: Epoch, parts: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError>;

    /// The bytes of state of each operator (by [`operator_id`](crate::place::operator_id)) in the manifest the last
    /// `publish` made, over every worker; empty when the checkpointer does not know.
    fn published_by_operator(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The bytes the last `publish`'s checkpoint wrote to the store (its new state
    /// objects, over every worker: the runs of what changed, merges, large sink
    /// records); 0 when the checkpointer does not know.
    fn published_written_bytes(&self) -> u64 {
        0
    }
}

/// When and how checkpoints are taken.
pub struct CheckpointOptions {
    pub interval: Duration,
    /// How long every driver may take to acknowledge a barrier before that checkpoint
    /// fails (and counts toward `max_failed`); the message names each thread that did not
    /// answer and where its barrier waits.
    pub timeout: Duration,
    /// Exactly-once: segments align barriers and sinks stage; at-least-once: neither.
    pub exactly_once: bool,
    /// The highest epoch published in the store, the restored one or a newer damaged one
    /// (0 when starting fresh); this run's first epoch is one more.
    pub restored_epoch: u64,
    /// Consecutive failed checkpoints before the run fails.
    pub max_failed: u32,
    pub checkpointer: Box<dyn Checkpointer>,
}

/// Where a restore reads operators' state: their runs, in the checkpoint store.
pub trait RestoredState: Send + Sync {
    /// Whether the checkpoint holds state of operator `operator` (by [`operator_id`](crate::place::operator_id)).
    fn has(&self, operator: &str) -> bool;

    /// The runs of `operator` serving any of `vnodes`, oldest first, opened (their
    /// indexes read and checked), for a merge of those vnodes.
    fn open(&self, operator: &str, vnodes: Range<u32>) -> Result<Vec<MergeInput>, SluiceError>;
}

/// What a restored run starts from.
#[derive(Default)]
pub struct Restore {
    /// (source, lane) → position.
    pub positions: HashMap<(usize, u32), Vec<u8>>,
    /// The operators' state, when there is some.
    pub state: Option<Arc<dyn RestoredState>>,
}

impl std::fmt::Debug for Restore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restore").field("positions", &self.positions).field("state", &self.state.is_some()).finish()
    }
}

/// Commits a sink's pre-commit records epoch by epoch, in increasing order (the order the
/// sink contract requires, after a publish and again at recovery).
pub fn commit_in_order(sink: &dyn SinkFactory, mut records: Vec<(u64, Vec<u8>)>) -> Result<(), SluiceError> {
    records.sort_by_key(|(epoch, _)| *epoch);
    let mut index = 0;
    while index < records.len() {
        let epoch = records[index].0;
        let group: Vec<Vec<u8>> =
            records[index..].iter().take_while(|(e, _)| *e == epoch).map(|(_, record)| record.clone()).collect();
        index += group.len();
        sink.commit(Epoch(epoch), &group)
            .map_err(|e| e.context(format!("sink {} commit of epoch {epoch}", sink.name())))?;
    }
    Ok(())
}
