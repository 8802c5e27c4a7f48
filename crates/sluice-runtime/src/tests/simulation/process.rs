//! A simulated worker process: its local part ([`Run`]) and what the engine's control
//! thread does around it (`sluice_engine::cluster::supervise`): it routes the
//! checkpoint messages to the controller, turns a stop into `Stop` for every worker (the
//! leader) or `StopRequested` (a worker), and treats a lost peer, a worker's `Failed`,
//! the leader's `Abort` or `Rejoin` as the end of the run everywhere (`end_now`); the
//! leader that lost a worker tells the others to `Rejoin`. A worker
//! reports its end and exits; the leader exits once every worker reported its end, or
//! `shutdown_timeout` after its own part ended. A crash ends the process at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_types::{ErrorKind, SluiceError};

use crate::coordinator::Cluster;

use super::network::Frame;
use super::run::{Outcome, Routed, Run};

/// Where a process is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Life {
    Running,
    /// The leader's part ended; it waits for every worker's end until `until_ms`.
    Waiting {
        until_ms: u64,
    },
    Exited(Outcome),
    Crashed,
}

/// Frames the coordinator and the control thread send, until the event loop puts them
/// on the sessions.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub frames: Vec<(u32, Frame)>,
    /// Peers whose session this process knows is lost (sending fails).
    lost: BTreeSet<u32>,
}

impl Outbox {
    fn send(&mut self, peer: u32, frame: Frame) -> Result<(), SluiceError> {
        if self.lost.contains(&peer) {
            return Err(SluiceError::external("cluster.peer_lost", format!("the session with {peer} is lost"))
                .with_kind(ErrorKind::LostPeer));
        }
        self.frames.push((peer, frame));
        Ok(())
    }
}

pub(super) type SharedOutbox = Arc<Mutex<Outbox>>;

pub(super) fn outbox(shared: &SharedOutbox) -> std::sync::MutexGuard<'_, Outbox> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) struct Process {
    pub id: u32,
    workers: u32,
    pub life: Life,
    pub run: Option<Run>,
    pub outbox: SharedOutbox,
    stop_requested: bool,
    stop_sent: bool,
    /// Why the run must end now (`StopHandle::abort`).
    abort: Option<SluiceError>,
    /// The cluster's failure, as the control thread saw it.
    failure: Option<String>,
    /// Workers whose end the leader heard of (a report or their loss).
    ended_peers: BTreeSet<u32>,
    /// The leader told the others to rejoin (a worker was lost).
    rejoin: bool,
    shutdown_ms: u64,
}

impl Process {
    pub(super) fn new(id: u32, workers: u32, shutdown_ms: u64) -> Process {
        Process {
            id,
            workers,
            life: Life::Running,
            run: None,
            outbox: SharedOutbox::default(),
            stop_requested: false,
            stop_sent: false,
            abort: None,
            failure: None,
            ended_peers: BTreeSet::new(),
            rejoin: false,
            shutdown_ms,
        }
    }

    /// This process's side of the cluster for its coordinator.
    pub(super) fn cluster(&self) -> Option<Cluster> {
        if self.workers == 1 {
            return None;
        }
        let shared = Arc::clone(&self.outbox);
        if self.id == 0 {
            let others = (1..self.workers).collect();
            let send = Box::new(move |worker, message| outbox(&shared).send(worker, Frame::ToWorker(message)));
            Some(Cluster::Lead { others, send })
        } else {
            let send = Box::new(move |message| outbox(&shared).send(0, Frame::ToLeader(message)));
            Some(Cluster::Follow { send })
        }
    }

    pub(super) fn alive(&self) -> bool {
        matches!(self.life, Life::Running | Life::Waiting { .. })
    }

    /// A signal asks this process to stop.
    pub(super) fn signal_stop(&mut self) {
        self.stop_requested = true;
    }

    pub(super) fn crash(&mut self) {
        self.life = Life::Crashed;
        self.run = None;
    }

    fn end_now(&mut self) {
        let error = SluiceError::external("cluster.peer_lost", "stopped at once: another worker was lost or failed")
            .with_kind(ErrorKind::LostPeer);
        self.abort.get_or_insert(error);
    }

    /// A frame from `peer` arrived; true when it was routed to the controller.
    pub(super) fn on_frame(&mut self, peer: u32, frame: Frame) -> bool {
        match frame {
            Frame::Close => {
                self.on_lost(peer);
                false
            }
            Frame::ToLeader(report) => {
                assert_eq!(self.id, 0, "a worker's report reached worker {}", self.id);
                self.leader_hears(peer, report)
            }
            Frame::ToWorker(command) => {
                assert_ne!(self.id, 0, "the leader's command reached the leader");
                self.worker_hears(command)
            }
        }
    }

    fn leader_hears(&mut self, peer: u32, report: ToLeader) -> bool {
        match report {
            ToLeader::Acked { .. } | ToLeader::DriversFinished => {
                return self.route(Routed::FromWorker(peer, report));
            }
            ToLeader::StopRequested => self.stop_requested = true,
            ToLeader::Finished { .. } => {
                self.ended_peers.insert(peer);
            }
            ToLeader::Failed { message } => {
                self.ended_peers.insert(peer);
                self.failure.get_or_insert(format!("worker {peer} failed: {message}"));
                self.end_now();
            }
            // The simulation never pauses.
            ToLeader::Heartbeat | ToLeader::PauseRequested { .. } => {}
        }
        false
    }

    fn worker_hears(&mut self, command: ToWorker) -> bool {
        match command {
            ToWorker::Barrier { .. } | ToWorker::Commit { .. } => return self.route(Routed::FromLeader(command)),
            ToWorker::Stop => self.stop_requested = true,
            ToWorker::Abort { reason } => {
                self.failure.get_or_insert(format!("the leader failed: {reason}"));
                self.end_now();
            }
            ToWorker::Rejoin { reason } => {
                self.failure.get_or_insert(format!("rejoining: {reason}"));
                self.end_now();
            }
            ToWorker::Heartbeat | ToWorker::Resume { .. } | ToWorker::Pause { .. } => {}
        }
        false
    }

    /// The engine's `route_to_leader` / `route_to_worker`: into the controller's bounded
    /// channel, which the protocol promises never to fill (`crate::peers`).
    fn route(&mut self, routed: Routed) -> bool {
        let Some(run) = self.run.as_mut().filter(|run| run.outcome.is_none()) else { return false };
        assert!(
            run.inbox.len() < run.inbox_capacity,
            "worker {}: {routed:?} found the controller's channel full ({} unread), which peers.rs argues cannot happen",
            self.id,
            run.inbox.len()
        );
        run.inbox.push_back(routed);
        true
    }

    /// The session with `peer` is lost (reset, closed, or silent too long).
    pub(super) fn on_lost(&mut self, peer: u32) {
        if !self.alive() {
            return;
        }
        outbox(&self.outbox).lost.insert(peer);
        if self.id != 0 {
            self.failure.get_or_insert("lost the leader".into());
            self.end_now();
        } else if self.ended_peers.insert(peer) {
            // The engine's rejoin round: the others stop, and every worker restores the
            // newest manifest in the next run (here, the next generation).
            if self.failure.is_none() && !self.stop_requested {
                self.rejoin = true;
                self.broadcast(&ToWorker::Rejoin { reason: format!("worker {peer} was lost") });
            }
            self.failure.get_or_insert(format!("lost worker {peer}"));
            self.end_now();
        }
    }

    /// What follows any event at this process: the controller's loop tail, the leader's
    /// stop broadcast, the report of a local end, the leader's exit; true when the
    /// process exited now.
    pub(super) fn after(&mut self, now_ms: u64) -> bool {
        if self.life == Life::Running {
            let run = self.run.as_mut().expect("a running process has its part");
            run.tail(now_ms, self.stop_requested, self.abort.as_ref());
            let outcome = run.outcome.clone();
            if self.id == 0 && self.stop_requested && !self.stop_sent {
                self.stop_sent = true;
                self.broadcast(&ToWorker::Stop);
            }
            if let Some(outcome) = outcome {
                self.local_done(now_ms, outcome);
            }
        }
        match self.life {
            Life::Waiting { until_ms } if self.ended_peers.len() as u32 + 1 == self.workers || now_ms >= until_ms => {
                if self.ended_peers.len() as u32 + 1 < self.workers {
                    self.failure.get_or_insert("workers did not report their end within shutdown_timeout".into());
                }
                self.exit();
                true
            }
            Life::Exited(_) => true,
            _ => false,
        }
    }

    fn broadcast(&self, command: &ToWorker) {
        let mut outbox = outbox(&self.outbox);
        for worker in 1..self.workers {
            // A lost worker is already counted as ended.
            let _lost = outbox.send(worker, Frame::ToWorker(command.clone()));
        }
    }

    fn local_done(&mut self, now_ms: u64, outcome: Outcome) {
        if self.workers == 1 {
            self.exit();
        } else if self.id != 0 {
            let report = match &outcome {
                Outcome::Completed => ToLeader::Finished { report: Vec::new() },
                Outcome::Failed(message) => ToLeader::Failed { message: message.clone() },
            };
            // A lost leader does not hear it.
            let _lost = outbox(&self.outbox).send(0, Frame::ToLeader(report));
            self.exit();
        } else {
            if let Outcome::Failed(reason) = outcome
                && !self.rejoin
            {
                self.broadcast(&ToWorker::Abort { reason });
            }
            self.life = Life::Waiting { until_ms: now_ms + self.shutdown_ms };
        }
    }

    fn exit(&mut self) {
        let local = self.run.as_ref().and_then(|run| run.outcome.clone()).expect("exits after its part ended");
        let outcome = match (&self.failure, local) {
            (Some(failure), _) => Outcome::Failed(failure.clone()),
            (None, local) => local,
        };
        self.life = Life::Exited(outcome);
    }

    /// When this process must wake up next, if anything is due.
    pub(super) fn next_wake_ms(&self) -> Option<u64> {
        match self.life {
            Life::Running => self.run.as_ref().and_then(Run::next_wake_ms),
            Life::Waiting { until_ms } => Some(until_ms),
            _ => None,
        }
    }

    /// What this process still waits for, for a hang's report.
    pub(super) fn describe(&self) -> String {
        let pending = self.run.as_ref().and_then(Run::pending_work).unwrap_or_default();
        format!("worker {}: {:?}, {pending}", self.id, self.life)
    }
}
