//! One worker's local part in the simulation: a real [`Coordinator`] (alone, leading or
//! following), its simulated drivers, its checkpoint writer run inline, and the
//! controller's loop around them, which mirrors `crate::controller`'s `Supervisor`
//! step for step (`after_checkpoint`, `check_end`, `on_stop`, `tick`, the shutdown
//! deadline) but on the simulated clock.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_types::SluiceError;

use crate::checkpoint::{CheckpointOptions, Checkpointer};
use crate::coordinator::{Cluster, Completed, Coordinator};
use crate::driver::{CONTROL_ARGUMENT, CONTROL_CAPACITY, Control};
use crate::mailbox::post;
use crate::metrics::{Metrics, SinkMetrics};
use crate::plan::SinkFactory;
use crate::writer::{WriteRequest, Written, write};

use super::driver::SimDriver;
use super::world::{SimCheckpointer, SimSink, WriteFate, lock};

/// How a local part (or a process) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Completed,
    Failed(String),
}

/// The checkpoint settings of a simulated cluster.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub max_failed: u32,
    pub shutdown_ms: u64,
}

/// A message of the control session handed to the controller (the engine's route).
#[derive(Debug)]
pub(super) enum Routed {
    FromWorker(u32, ToLeader),
    FromLeader(ToWorker),
}

/// What a driver does next, for the event loop to schedule.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DriverNext {
    Nothing,
    /// Its barrier passed: the acknowledgement reaches the controller later.
    Ack,
    /// It leaves now (on `Exit`: true); its `Finished` reaches the controller later.
    Leave(bool),
}

/// Where this worker is, for building it.
pub(super) struct Place {
    pub worker: u32,
    pub slots: std::ops::Range<u32>,
    pub total_slots: u32,
    pub base: Instant,
    pub now_ms: u64,
}

pub(super) struct Run {
    worker: u32,
    coordinator: Coordinator,
    pub drivers: Vec<SimDriver>,
    controls: Vec<Sender<Control>>,
    /// `None` once the driver left (its channel is closed then).
    control_ends: Vec<Option<Receiver<Control>>>,
    /// The final slice of each driver that left, until its `Finished` is delivered.
    finished: Vec<Option<crate::checkpoint::ManifestSlice>>,
    /// Control messages a read is already scheduled for, per driver.
    pub reads_scheduled: Vec<usize>,
    running: BTreeSet<u32>,
    deadline_ms: Option<u64>,
    pub outcome: Option<Outcome>,
    requests: Receiver<WriteRequest>,
    /// Keeps the answers' channel open (answers are handed over directly).
    _answers: Sender<Written>,
    checkpointer: Box<dyn Checkpointer>,
    /// The checkpoint the writer has, until its simulated write is done.
    pub write: Option<WriteRequest>,
    pub inbox: VecDeque<Routed>,
    pub inbox_capacity: usize,
    settings: Settings,
    base: Instant,
}

impl Run {
    pub(super) fn new(
        place: &Place,
        settings: Settings,
        cluster: Option<Cluster>,
        drivers: Vec<SimDriver>,
        world: &super::world::Shared,
        restored_epoch: u64,
    ) -> Run {
        let worker = place.worker;
        let options = CheckpointOptions {
            interval: Duration::from_millis(settings.interval_ms),
            timeout: Duration::from_millis(settings.timeout_ms),
            exactly_once: true,
            restored_epoch,
            max_failed: settings.max_failed,
            checkpointer: Box::new(SimCheckpointer { worker, world: Arc::clone(world) }),
        };
        let sink: Arc<dyn SinkFactory> = Arc::new(SimSink { worker, world: Arc::clone(world) });
        let sinks = vec![SinkMetrics::new("simulated")];
        let metrics = Arc::new(Metrics::new(Vec::new(), sinks, place.total_slots));
        let inbox_capacity = match &cluster {
            Some(Cluster::Lead { others, .. }) => others.len() * crate::peers::LEADER_EVENTS_PER_WORKER,
            _ => crate::peers::FOLLOWER_EVENTS,
        };
        let (request_sender, requests) = bounded(1);
        let (answers, results) = bounded(1);
        let mut kept = None;
        let now = place.base + Duration::from_millis(place.now_ms);
        let coordinator =
            Coordinator::with_writer(options, vec![sink], metrics, now, cluster, place.slots.start, |checkpointer| {
                kept = Some(checkpointer);
                (request_sender, results)
            });
        let (controls, control_ends) = place
            .slots
            .clone()
            .map(|_| {
                let (sender, receiver) = bounded(CONTROL_CAPACITY);
                (sender, Some(receiver))
            })
            .unzip();
        Run {
            worker,
            coordinator,
            reads_scheduled: vec![0; drivers.len()],
            finished: drivers.iter().map(|_| None).collect(),
            drivers,
            controls,
            control_ends,
            running: place.slots.clone().collect(),
            deadline_ms: None,
            outcome: None,
            requests,
            _answers: answers,
            checkpointer: kept.expect("the coordinator starts its writer"),
            write: None,
            inbox: VecDeque::new(),
            inbox_capacity,
            settings,
            base: place.base,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn ms(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.base).as_millis() as u64
    }

    fn live(&self) -> bool {
        self.outcome.is_none()
    }

    /// Control messages waiting in driver `index`'s channel.
    pub(super) fn queued_controls(&self, index: usize) -> usize {
        self.control_ends[index].as_ref().map_or(0, Receiver::len)
    }

    /// A new request to the writer, if the coordinator posted one.
    pub(super) fn take_request(&mut self) -> bool {
        let Ok(request) = self.requests.try_recv() else { return false };
        assert!(self.write.is_none(), "a second checkpoint reached the writer while one is written");
        self.write = Some(request);
        true
    }

    /// Driver `index` reads its next control message.
    pub(super) fn driver_reads(&mut self, index: usize) -> DriverNext {
        self.reads_scheduled[index] -= 1;
        let Some(control) = self.control_ends[index].as_ref().and_then(|end| end.try_recv().ok()) else {
            return DriverNext::Nothing;
        };
        let driver = &mut self.drivers[index];
        match control {
            Control::Barrier(epoch) => driver.barrier(epoch, false),
            Control::FinalBarrier(epoch) => driver.barrier(epoch, true),
            Control::Exit => return DriverNext::Leave(true),
            Control::Abort => {
                driver.exited = true;
                self.control_ends[index] = None;
                return DriverNext::Nothing;
            }
            Control::Stop => panic!("Stop reached driver {} of a run that checkpoints", driver.slot),
        }
        DriverNext::Ack
    }

    /// Driver `index`'s acknowledgement reaches the controller.
    pub(super) fn driver_acks(&mut self, index: usize) -> DriverNext {
        let driver = &mut self.drivers[index];
        let (epoch, slice) = driver.take_ack().expect("an ack event follows a barrier");
        let (slot, done) = (driver.slot, driver.done());
        if self.live() {
            let completed = self.coordinator.on_ack(slot, epoch, slice);
            self.after_checkpoint(completed);
        }
        if done { DriverNext::Leave(false) } else { DriverNext::Nothing }
    }

    /// Driver `index` leaves now (as the real driver does, in the same step that ended
    /// its last flow or read `Exit`); its `Finished` reaches the controller later.
    pub(super) fn driver_leaves(&mut self, index: usize, exit: bool) {
        let slice = self.drivers[index].leave(exit);
        self.control_ends[index] = None;
        self.finished[index] = Some(slice);
    }

    /// Driver `index`'s `Finished` reaches the controller.
    pub(super) fn driver_finished(&mut self, index: usize, now_ms: u64) {
        let slice = self.finished[index].take().expect("a driver's Finished follows its leaving");
        if self.live() {
            let slot = self.drivers[index].slot;
            self.running.remove(&slot);
            let completed = self.coordinator.on_finished(slot, slice);
            self.after_checkpoint(completed);
            self.check_end(now_ms);
        }
    }

    /// The writer's simulated work on the checkpoint it has is done (inline, the real
    /// `write`); false when `fate` kills the process before it answers.
    pub(super) fn writer_done(&mut self, fate: WriteFate, world: &super::world::Shared) -> bool {
        let request = self.write.take().expect("a write event follows a request");
        let epoch = request.epoch;
        lock(world).fates.insert(self.worker, fate);
        let result = write(&mut *self.checkpointer, request);
        lock(world).fates.clear();
        if matches!(fate, WriteFate::CrashAfterPart | WriteFate::CrashAfterPublish) {
            return false;
        }
        if self.live() {
            let completed = self.coordinator.on_written(Written { epoch, result });
            self.after_checkpoint(completed);
        }
        true
    }

    /// The controller takes the next routed message of the control session.
    pub(super) fn take_routed(&mut self) {
        let Some(routed) = self.inbox.pop_front() else { return };
        if !self.live() {
            return;
        }
        let completed = match routed {
            Routed::FromWorker(worker, report) => self.coordinator.on_worker(worker, report),
            Routed::FromLeader(command) => self.coordinator.on_leader(command, &self.running, &self.controls),
        };
        self.after_checkpoint(completed);
    }

    /// `Supervisor::after_checkpoint`.
    fn after_checkpoint(&mut self, completed: Result<Completed, SluiceError>) {
        match completed {
            Ok(Completed::Final) if self.running.is_empty() => {
                self.outcome.get_or_insert(Outcome::Completed);
            }
            Ok(Completed::Final) => {
                for control in &self.controls {
                    let _gone = post(control, Control::Exit, CONTROL_ARGUMENT);
                }
            }
            Ok(Completed::Nothing | Completed::Checkpoint) => {
                if self.deadline_ms.is_some() {
                    self.coordinator.request_stop(&self.running, &self.controls);
                }
            }
            Err(error) => {
                self.abort_drivers();
                self.outcome = Some(Outcome::Failed(format!("checkpoint: {error}")));
            }
        }
    }

    fn abort_drivers(&self) {
        for control in &self.controls {
            let _gone = post(control, Control::Abort, CONTROL_ARGUMENT);
        }
    }

    /// `Supervisor::check_end`.
    fn check_end(&mut self, now_ms: u64) {
        if !self.running.is_empty() || !self.live() || !self.coordinator.others_finished() {
            return;
        }
        if !self.coordinator.follows() {
            let shutdown_ms = self.settings.shutdown_ms;
            self.deadline_ms.get_or_insert(now_ms + shutdown_ms);
        }
        let completed = self.coordinator.end_of_input(self.at(now_ms));
        self.after_checkpoint(completed);
    }

    /// What the controller's loop does after every wake-up: an abort ends the run, a stop
    /// request starts the shutdown, then `tick`, `check_end` and the deadline.
    pub(super) fn tail(&mut self, now_ms: u64, stop_requested: bool, abort: Option<&SluiceError>) {
        if !self.live() {
            return;
        }
        if let Some(error) = abort {
            self.abort_drivers();
            self.outcome = Some(Outcome::Failed(format!("run: {error}")));
            return;
        }
        if stop_requested && self.deadline_ms.is_none() {
            self.deadline_ms = Some(now_ms + self.settings.shutdown_ms);
            self.coordinator.request_stop(&self.running, &self.controls);
        }
        let ticked = self.coordinator.tick(self.at(now_ms), &self.running, &self.controls);
        if ticked != Ok(Completed::Nothing) {
            self.after_checkpoint(ticked);
        }
        self.check_end(now_ms);
        if self.live() && self.deadline_ms.is_some_and(|deadline| now_ms >= deadline) {
            self.abort_drivers();
            let pending = self.coordinator.pending_work().unwrap_or_default();
            self.outcome = Some(Outcome::Failed(format!("shutdown timeout: {pending}")));
        }
    }

    /// When the controller's loop must wake up next, if anything is due.
    pub(super) fn next_wake_ms(&self) -> Option<u64> {
        if !self.live() {
            return None;
        }
        let due = self.coordinator.next_due().map(|at| self.ms(at));
        let timeout = self.coordinator.next_timeout().map(|at| self.ms(at));
        [self.deadline_ms, due, timeout].into_iter().flatten().min()
    }

    pub(super) fn pending_work(&self) -> Option<String> {
        self.coordinator.pending_work()
    }
}
