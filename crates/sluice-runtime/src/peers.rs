//! The other workers of a cluster, as a worker's controller sees them for checkpoints:
//! the leader decides every epoch, every worker writes its own state, the leader alone
//! publishes (see the protocol in [`crate::checkpoint`]).
//!
//! The engine owns the control session; it hands the controller a way to send and a
//! channel of what arrived. Messages of the cluster's wire (`sluice_cluster::wire`):
//!
//! - leader → worker: `Barrier { e, final_epoch }` (inject barrier `e`, pausing every lane
//!   if final), `Commit { e, final_epoch }` (manifest `e` is published: commit every
//!   record of epoch `e` or earlier; leave after a final one);
//! - worker → leader: `Acked { e, part }` (every local driver passed `e` and this worker's
//!   state objects are durable; `part` names them), `DriversFinished` (every local driver
//!   reached the end of its input), `StopRequested`.
//!
//! # Why the channels never overflow
//!
//! The leader sends `Barrier(e + 1)` only after epoch `e` was committed or failed, and
//! `Commit(e)` only after every worker acked `e`. So a worker has at most one barrier
//! and one commit unread ([`FOLLOWER_EVENTS`] leaves room for a stop and an abort as
//! well). A worker acks each barrier once, says `DriversFinished` once and
//! `StopRequested` at most once, and the leader takes the next barrier's acks only after
//! it read every ack of the previous one: at most three messages per worker are unread
//! ([`LEADER_EVENTS_PER_WORKER`]). A peer that sends more breaks the protocol: the
//! engine then fails the run naming it, instead of blocking or growing a queue.

use crossbeam_channel::Receiver;
use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_types::SluiceError;

/// Sends one command to worker `id` (an error: that worker is unreachable).
pub type SendToWorker = Box<dyn Fn(u32, ToWorker) -> Result<(), SluiceError> + Send>;
/// Sends one report to the leader.
pub type SendToLeader = Box<dyn Fn(ToLeader) -> Result<(), SluiceError> + Send>;

/// Room in the leader's channel per other worker (see the module doc).
pub const LEADER_EVENTS_PER_WORKER: usize = 4;
/// Room in a worker's channel of the leader's commands (see the module doc).
pub const FOLLOWER_EVENTS: usize = 4;

/// This worker's side of a cluster's checkpoints.
pub enum Peers {
    /// This worker leads: it decides the epochs and publishes the manifests.
    Lead {
        /// The other workers' ids.
        others: Vec<u32>,
        send: SendToWorker,
        /// `(worker, report)` as they arrive.
        events: Receiver<(u32, ToLeader)>,
    },
    /// This worker follows the leader's epochs.
    Follow { send: SendToLeader, events: Receiver<ToWorker> },
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peers::Lead { others, .. } => f.debug_struct("Lead").field("others", others).finish_non_exhaustive(),
            Peers::Follow { .. } => f.debug_struct("Follow").finish_non_exhaustive(),
        }
    }
}
