//! The checkpoint coordinator: the controller's side of the protocol in
//! [`crate::checkpoint`]. Alone or leading a cluster, it decides when barrier `e`
//! starts, collects every driver's slice (and every other worker's part), has the
//! [`Checkpointer`](crate::checkpoint::Checkpointer) persist and publish the manifest,
//! and only then commits the sinks (and tells the other workers to commit theirs).
//! Following a leader, it takes each barrier and commit from the leader instead and
//! sends its part back (see [`crate::peers`]).
//!
//! Rules it keeps:
//! - One epoch in flight at a time; epochs strictly increase, from one past the restored
//!   epoch (a follower takes the leader's numbers).
//! - A driver that finished (its lanes ended) before acking the epoch in flight
//!   contributes its final slice to that epoch; one that had acked it contributes to the
//!   next (its end-of-input output came after the barrier). Its lanes' final positions
//!   join every later manifest, below any position a live driver reported. A worker whose
//!   drivers all finished still acks every barrier (with those positions and its records).
//!   Its final slice holds the state of its segments that end-of-data passed after their
//!   last barrier (`driver::DriverState::snapshot_ended`), which no later checkpoint can
//!   hold: a checkpoint carrying it that fails fails the run.
//! - Sink records of an epoch whose checkpoint failed stay uncommitted and ride along in
//!   the next manifest, so staged output is never orphaned; they are committed, in epoch
//!   order, right after that manifest is published. A follower keeps every record it has
//!   not committed in each part it sends, and commits on the leader's `Commit(e)` every
//!   record of epoch `e` or earlier.
//! - Once every driver (and every other worker) acked, the slice goes to the *writer*
//!   (`crate::writer`), so the controller keeps answering drivers, stop requests and
//!   deadlines meanwhile. The result comes back through [`Coordinator::results`]; the
//!   next barrier starts only after it (one checkpoint at a time, from barrier to
//!   commit).
//! - A stop requested while a checkpoint is in flight or being written starts the final
//!   checkpoint as soon as that one completes; so does the end of every worker's input.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_types::{Epoch, ErrorKind, SluiceError};

use crate::checkpoint::{CheckpointOptions, LanePosition, ManifestSlice, SinkRecord, commit_in_order};
use crate::driver::{CONTROL_ARGUMENT, Control};
use crate::duration::humanize;
use crate::mailbox::{Posted, post};
use crate::metrics::Metrics;
use crate::peers::{SendToLeader, SendToWorker};
use crate::plan::{SinkFactory, SourceFactory};
use crate::writer::{WRITER_ARGUMENT, WriteOutcome, WriteRequest, Written, spawn_writer, writer_gone};

struct InFlight {
    epoch: Epoch,
    waiting: BTreeSet<u32>,
    /// Other workers whose part of this epoch has not arrived (leader only).
    waiting_workers: BTreeSet<u32>,
    slice: ManifestSlice,
    /// The other workers' parts that arrived.
    parts: Vec<Vec<u8>>,
    /// Sink records produced before this barrier but not yet in a published manifest.
    carried: Vec<SinkRecord>,
    final_epoch: bool,
    started: Instant,
    /// When the next `timeout` without every ack expires.
    deadline: Instant,
    /// The barrier was not acknowledged in time: the checkpoint failed, and is dropped
    /// (its sink records carried on) once the late acks are in.
    timed_out: bool,
    /// It holds the final state of a driver that finished (which takes no snapshot
    /// again): should it fail, that state is lost, and so is the run.
    finished_state: bool,
}

/// A checkpoint whose slice the writer has.
struct Writing {
    epoch: Epoch,
    /// Every sink record in the manifest being written, committed once it is published.
    records: Vec<SinkRecord>,
    /// This worker's lane positions in it, told to the sources once it is committed.
    positions: Vec<LanePosition>,
    final_epoch: bool,
    /// See [`InFlight::finished_state`].
    finished_state: bool,
    started: Instant,
    pause_ms: u64,
}

/// What completing a checkpoint led to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    Nothing,
    /// A regular checkpoint was published (or failed and will be retried).
    Checkpoint,
    /// The final checkpoint was published and committed: drivers may exit.
    Final,
}

/// Who decides the epochs.
enum Role {
    /// This worker: alone (`others` is empty) or leading `others`.
    Lead {
        others: Vec<u32>,
        /// Other workers whose drivers have not all finished.
        running: BTreeSet<u32>,
        send: Option<SendToWorker>,
    },
    /// The leader, whose commands arrive through [`Coordinator::on_leader`].
    Follow { send: SendToLeader, drivers_finished_sent: bool, stop_sent: bool },
}

pub(crate) struct Coordinator {
    interval: Duration,
    timeout: Duration,
    /// Where each driver's barrier waits, for the timeout's message.
    metrics: Arc<Metrics>,
    exactly_once: bool,
    max_failed: u32,
    sinks: Vec<Arc<dyn SinkFactory>>,
    /// The sources, told of each committed checkpoint's positions.
    sources: Vec<Arc<dyn SourceFactory>>,
    /// A follower's positions of the epochs it acked, until the leader commits them.
    acked_positions: Vec<(u64, Vec<LanePosition>)>,
    role: Role,
    /// This worker's first slot: `controls[t - first_slot]` reaches the driver of slot `t`.
    first_slot: u32,
    next_epoch: Epoch,
    next_due: Instant,
    /// When the newest checkpoint started: the next is due an interval later.
    last_started: Instant,
    in_flight: Option<InFlight>,
    writing: Option<Writing>,
    requests: Sender<WriteRequest>,
    results: Receiver<Written>,
    finished_positions: Vec<LanePosition>,
    /// The final state of drivers that finished when no checkpoint awaited them: it goes
    /// into the next one.
    finished_states: Vec<crate::checkpoint::DeferredState>,
    uncommitted: Vec<SinkRecord>,
    failed_in_a_row: u32,
    stopping: bool,
    final_started: bool,
    final_done: bool,
    /// A checkpoint was asked for (`request_now`) and has not started yet.
    asked: bool,
    pub stats: CheckpointStats,
}

/// What the report says about checkpoints.
#[derive(Debug, Clone, Default)]
pub struct CheckpointStats {
    /// Checkpoints published (on a follower of a cluster: committed as the leader told).
    pub published: u64,
    /// This worker followed a leader: it committed checkpoints the leader published, and
    /// knows neither their state size nor their duration.
    pub followed: bool,
    pub failed: u64,
    pub last_epoch: u64,
    /// Bytes of operator state in the largest published checkpoint.
    pub max_state_bytes: u64,
    /// Bytes every published checkpoint wrote to the store, summed.
    pub written_bytes: u64,
    /// Longest time from barrier injection to the last driver's ack (alignment and state
    /// copies: the pause processing sees).
    pub max_pause_ms: u64,
    /// Longest time from barrier injection to the manifest published.
    pub max_duration_ms: u64,
    /// Each published checkpoint, oldest first (the first [`HISTORY_KEPT`]).
    pub history: Vec<CheckpointRecord>,
    /// The last published checkpoint.
    pub last: Option<CheckpointRecord>,
    /// The last published checkpoint that held state (its epoch), and the bytes of state
    /// of each operator (by operator id) in it, when the checkpointer tells.
    pub state_by_operator: Option<(u64, Vec<(String, u64)>)>,
}

/// One published checkpoint in [`CheckpointStats::history`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub epoch: u64,
    pub state_bytes: u64,
    /// The bytes this checkpoint wrote to the store (what changed, and merges).
    pub written_bytes: u64,
    pub pause_ms: u64,
    pub duration_ms: u64,
}

/// Most checkpoints [`CheckpointStats::history`] keeps (a day of checkpoints every 10 s).
pub const HISTORY_KEPT: usize = 8_640;

impl CheckpointStats {
    /// The `percent`-th percentile of the recorded pauses (nearest rank), if any.
    pub fn pause_percentile(&self, percent: f64) -> Option<u64> {
        let mut sorted: Vec<u64> = self.history.iter().map(|record| record.pause_ms).collect();
        sorted.sort_unstable();
        let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
    }
}

/// A cluster's side of a coordinator: lead `others`, or follow the leader.
pub(crate) enum Cluster {
    Lead { others: Vec<u32>, send: SendToWorker },
    Follow { send: SendToLeader },
}

/// The writer's two ends, as [`Coordinator::with_writer`] starts it.
pub(crate) type WriterEnds = (Sender<WriteRequest>, Receiver<Written>);

/// The coordinator's clock: the system's, except where the simulation tests
/// (`crate::tests::simulation`) set a simulated time for their thread, so that a seed
/// replays exactly. Production code has no such override.
fn now() -> Instant {
    #[cfg(test)]
    if let Some(now) = SIMULATED_NOW.get() {
        return now;
    }
    Instant::now()
}

#[cfg(test)]
thread_local! {
    /// The simulated time of this thread's coordinators, when a simulation runs it.
    pub(crate) static SIMULATED_NOW: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

impl Coordinator {
    pub(crate) fn new(
        options: CheckpointOptions,
        sinks: Vec<Arc<dyn SinkFactory>>,
        metrics: Arc<Metrics>,
        now: Instant,
        cluster: Option<Cluster>,
        first_slot: u32,
    ) -> Coordinator {
        Coordinator::with_writer(options, sinks, metrics, now, cluster, first_slot, spawn_writer)
    }

    /// [`Coordinator::new`] with the checkpoint writer started by `writer`, which takes the
    /// checkpointer and returns the writer's ends. Production starts the writer's thread
    /// (`spawn_writer`); the simulation tests keep the checkpointer and answer each
    /// request themselves, inline, at its simulated time, so a seed replays exactly.
    pub(crate) fn with_writer(
        options: CheckpointOptions,
        sinks: Vec<Arc<dyn SinkFactory>>,
        metrics: Arc<Metrics>,
        now: Instant,
        cluster: Option<Cluster>,
        first_slot: u32,
        writer: impl FnOnce(Box<dyn crate::checkpoint::Checkpointer>) -> WriterEnds,
    ) -> Coordinator {
        let CheckpointOptions { interval, timeout, exactly_once, restored_epoch, max_failed, checkpointer } = options;
        let (requests, results) = writer(checkpointer);
        let role = match cluster {
            None => Role::Lead { others: Vec::new(), running: BTreeSet::new(), send: None },
            Some(Cluster::Lead { others, send }) => {
                Role::Lead { running: others.iter().copied().collect(), others, send: Some(send) }
            }
            Some(Cluster::Follow { send }) => Role::Follow { send, drivers_finished_sent: false, stop_sent: false },
        };
        Coordinator {
            interval,
            timeout,
            metrics,
            exactly_once,
            max_failed,
            sinks,
            sources: Vec::new(),
            acked_positions: Vec::new(),
            role,
            first_slot,
            next_epoch: Epoch(restored_epoch + 1),
            next_due: now + interval,
            last_started: now,
            in_flight: None,
            writing: None,
            requests,
            results,
            finished_positions: Vec::new(),
            finished_states: Vec::new(),
            uncommitted: Vec::new(),
            failed_in_a_row: 0,
            stopping: false,
            final_started: false,
            final_done: false,
            asked: false,
            stats: CheckpointStats::default(),
        }
    }

    /// Tells `sources` of every committed checkpoint (see
    /// [`SourceFactory::checkpoint_committed`]).
    pub(crate) fn with_sources(mut self, sources: Vec<Arc<dyn SourceFactory>>) -> Coordinator {
        self.sources = sources;
        self
    }

    /// Tells each source the positions of its lanes in committed checkpoint `epoch`.
    fn tell_sources(&self, epoch: u64, positions: &[LanePosition]) {
        for (index, source) in self.sources.iter().enumerate() {
            let mine: Vec<(u32, &[u8])> =
                positions.iter().filter(|p| p.source == index).map(|p| (p.lane, p.bytes.as_slice())).collect();
            if !mine.is_empty() {
                source.checkpoint_committed(Epoch(epoch), &mine);
            }
        }
    }

    /// The writer's answers, for the controller to wait on with its other events.
    pub(crate) fn results(&self) -> &Receiver<Written> {
        &self.results
    }

    /// No checkpoint between its barrier and its commit.
    fn idle(&self) -> bool {
        self.in_flight.is_none() && self.writing.is_none()
    }

    pub(crate) fn follows(&self) -> bool {
        matches!(self.role, Role::Follow { .. })
    }

    /// Whether the final checkpoint (the end of the input's, or a stop's) has started.
    pub(crate) fn final_started(&self) -> bool {
        self.final_started
    }

    pub(crate) fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    pub(crate) fn first_epoch(&self) -> u64 {
        self.next_epoch.0
    }

    /// When the next regular barrier is due (a follower's come from the leader).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        (self.idle() && !self.stopping && !self.follows()).then_some(self.next_due)
    }

    /// When the barrier in flight times out, if one is in flight (the leader's timeout
    /// covers a follower's drivers).
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.in_flight.as_ref().filter(|_| !self.follows()).map(|in_flight| in_flight.deadline)
    }

    /// Whether every other worker's drivers finished (true alone and for a follower,
    /// whose leader decides). True as well once the final checkpoint is committed: then
    /// every worker leaves, also one whose input had not ended (a stop paused it, and it
    /// never reports `DriversFinished`), so the leader must not wait for it.
    pub(crate) fn others_finished(&self) -> bool {
        if self.final_done {
            return true;
        }
        match &self.role {
            Role::Lead { running, .. } => running.is_empty(),
            Role::Follow { .. } => true,
        }
    }

    /// Starts a regular checkpoint when one is due, or the final one once a stop was
    /// requested and no checkpoint is under way; fails the checkpoint in flight when its
    /// barrier was not acknowledged within `timeout`.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        running: &BTreeSet<u32>,
        controls: &[Sender<Control>],
    ) -> Result<Completed, SluiceError> {
        if self.follows() {
            return Ok(Completed::Nothing);
        }
        if self.in_flight.as_ref().is_some_and(|in_flight| now >= in_flight.deadline) {
            return self.time_out(now);
        }
        self.start_due(now, running, controls);
        Ok(Completed::Nothing)
    }

    /// Starts the checkpoint that is due, if no checkpoint is under way.
    fn start_due(&mut self, now: Instant, running: &BTreeSet<u32>, controls: &[Sender<Control>]) {
        if !self.idle() || self.follows() || (running.is_empty() && self.others_finished()) {
            return;
        }
        if self.stopping {
            if !self.final_started && !self.final_done {
                self.final_started = true;
                self.start(running, controls, true, now);
            }
        } else if now >= self.next_due {
            self.start(running, controls, false, now);
        }
    }

    /// The barrier in flight was not acknowledged within `timeout`: the checkpoint fails,
    /// naming every thread (and worker) that did not answer and where its barrier waits.
    /// A barrier still unacknowledged one more timeout later counts again: otherwise a
    /// thread that never answers would hold the next checkpoint back forever.
    fn time_out(&mut self, now: Instant) -> Result<Completed, SluiceError> {
        let in_flight = self.in_flight.as_mut().expect("a timeout needs a barrier in flight");
        let again = std::mem::replace(&mut in_flight.timed_out, true);
        in_flight.deadline = now + self.timeout;
        self.stats.failed += 1;
        self.failed_in_a_row += 1;
        let mut waiting: Vec<String> = in_flight
            .waiting
            .iter()
            .map(|&thread| format!("thread {thread} {}", self.metrics.threads[thread as usize].barrier_at()))
            .collect();
        waiting.extend(in_flight.waiting_workers.iter().map(|worker| {
            format!("worker {worker} (its drivers have not all passed the barrier, or its state is not written yet)")
        }));
        let error = SluiceError::external(
            "checkpoint.timeout",
            format!(
                "checkpoint {} was not acknowledged within {}timeout = {}: {}",
                in_flight.epoch.0,
                if again { "another " } else { "" },
                humanize(self.timeout),
                waiting.join("; ")
            ),
        )
        .with_fix("find what holds that thread back (a slow sink, a long step), or raise [checkpoint] timeout");
        tracing::warn!(%error, "checkpoint timed out; the next one waits for its late acknowledgements");
        if in_flight.final_epoch || self.failed_in_a_row >= self.max_failed {
            return Err(error.context(format!(
                "{} checkpoint failures in a row (max_failed_checkpoints = {}; a checkpoint still \
                 unacknowledged counts again at each timeout)",
                self.failed_in_a_row, self.max_failed
            )));
        }
        Ok(Completed::Checkpoint)
    }

    fn start(&mut self, running: &BTreeSet<u32>, controls: &[Sender<Control>], final_epoch: bool, now: Instant) {
        self.asked = false;
        self.last_started = now;
        let epoch = self.next_epoch;
        self.next_epoch = Epoch(epoch.0 + 1);
        for thread in running {
            let control = if final_epoch { Control::FinalBarrier(epoch) } else { Control::Barrier(epoch) };
            // A driver that already left reports Finished; it is no longer waited for then.
            let _gone = post(&controls[(*thread - self.first_slot) as usize], control, CONTROL_ARGUMENT);
        }
        let mut waiting_workers = BTreeSet::new();
        if let Role::Lead { others, send: Some(send), .. } = &self.role {
            for &worker in others {
                // An unreachable worker is reported lost by the control session, which
                // ends the run; until then its ack is simply missing.
                if let Err(error) = send(worker, ToWorker::Barrier { epoch: epoch.0, final_epoch }) {
                    tracing::warn!(worker, %error, "a barrier did not reach a worker");
                }
                waiting_workers.insert(worker);
            }
        }
        tracing::debug!(epoch = epoch.0, final_epoch, "checkpoint started");
        // A follower keeps every record until the leader says it is committed.
        let carried = match self.role {
            Role::Lead { .. } => std::mem::take(&mut self.uncommitted),
            Role::Follow { .. } => self.uncommitted.clone(),
        };
        let finished_states = std::mem::take(&mut self.finished_states);
        let finished_state = !finished_states.is_empty();
        self.in_flight = Some(InFlight {
            epoch,
            waiting: running.clone(),
            waiting_workers,
            slice: ManifestSlice { deferred: finished_states, ..ManifestSlice::default() },
            parts: Vec::new(),
            carried,
            final_epoch,
            started: now,
            deadline: now + self.timeout,
            timed_out: false,
            finished_state,
        });
    }

    /// A checkpoint was asked for (an operator's request): the next one is due now, or as
    /// soon as the one under way completes. Returns the epoch whose commit answers the
    /// request (the first that starts from now on); None for a follower, whose leader
    /// decides.
    pub(crate) fn request_now(&mut self, at: Instant) -> Option<u64> {
        if self.follows() {
            return None;
        }
        self.asked = true;
        self.next_due = self.next_due.min(at);
        Some(self.next_epoch.0)
    }

    /// After a checkpoint: the next is due an interval after this one started (as
    /// Flink's checkpoint interval, without a minimum pause between checkpoints), so at
    /// once if this one took longer, or at once if one was asked for meanwhile. Then
    /// the input since a checkpoint, which the next one writes, is about an interval's,
    /// not an interval's plus a checkpoint's duration.
    fn schedule_next(&mut self) {
        let now = now();
        self.next_due = if self.asked { now } else { (self.last_started + self.interval).max(now) };
    }

    /// After a checkpoint failed or timed out: the next is due an interval from now (a
    /// store that refuses is not retried back to back), or at once if one was asked for.
    fn schedule_after_failure(&mut self) {
        self.next_due = if self.asked { now() } else { now() + self.interval };
    }

    /// A stop was requested: the next checkpoint is the final one (pausing every lane),
    /// started now or as soon as the one under way completes. A follower asks the
    /// leader, which stops every worker.
    pub(crate) fn request_stop(&mut self, running: &BTreeSet<u32>, controls: &[Sender<Control>]) {
        self.stopping = true;
        if let Role::Follow { send, stop_sent, .. } = &mut self.role {
            if !*stop_sent {
                *stop_sent = true;
                if let Err(error) = send(ToLeader::StopRequested) {
                    tracing::warn!(%error, "the stop request did not reach the leader");
                }
            }
            return;
        }
        self.start_due(now(), running, controls);
    }

    pub(crate) fn on_ack(&mut self, thread: u32, epoch: Epoch, slice: ManifestSlice) -> Result<Completed, SluiceError> {
        let in_flight = self.in_flight.as_mut().expect("an ack only answers a barrier");
        assert_eq!(in_flight.epoch, epoch, "acks arrive for the epoch in flight");
        in_flight.waiting.remove(&thread);
        in_flight.slice.merge(slice);
        self.complete_if_ready()
    }

    /// A driver finished: its final positions join every later manifest, its records the
    /// next one, and it is no longer waited for.
    pub(crate) fn on_finished(&mut self, thread: u32, slice: ManifestSlice) -> Result<Completed, SluiceError> {
        self.finished_positions.extend(slice.positions.iter().cloned());
        let awaited = self.in_flight.as_mut().is_some_and(|in_flight| in_flight.waiting.remove(&thread));
        match self.in_flight.as_mut() {
            Some(in_flight) if awaited => {
                in_flight.finished_state |= !slice.deferred.is_empty();
                in_flight.slice.merge(slice);
            }
            _ => {
                self.finished_states.extend(slice.deferred);
                self.uncommitted.extend(slice.sink_records);
            }
        }
        self.complete_if_ready()
    }

    /// Another worker reported (leader only; anything out of order breaks the protocol).
    pub(crate) fn on_worker(&mut self, worker: u32, report: ToLeader) -> Result<Completed, SluiceError> {
        let Role::Lead { running, .. } = &mut self.role else {
            return Err(protocol(format!("worker {worker} reported to a worker that does not lead")));
        };
        match report {
            ToLeader::DriversFinished => {
                running.remove(&worker);
                Ok(Completed::Nothing)
            }
            ToLeader::Acked { epoch, part } => {
                let Some(in_flight) = self.in_flight.as_mut().filter(|f| f.epoch.0 == epoch) else {
                    return Err(protocol(format!("worker {worker} acknowledged checkpoint {epoch}, not in flight")));
                };
                if !in_flight.waiting_workers.remove(&worker) {
                    return Err(protocol(format!("worker {worker} acknowledged checkpoint {epoch} twice")));
                }
                in_flight.parts.push(part);
                self.complete_if_ready()
            }
            other => Err(protocol(format!("worker {worker} sent {other:?} to the checkpoint coordinator"))),
        }
    }

    /// The leader's command (follower only; anything out of order breaks the protocol).
    pub(crate) fn on_leader(
        &mut self,
        command: ToWorker,
        running: &BTreeSet<u32>,
        controls: &[Sender<Control>],
    ) -> Result<Completed, SluiceError> {
        if !self.follows() {
            return Err(protocol(format!("the leader's {command:?} reached the leader")));
        }
        match command {
            ToWorker::Barrier { epoch, final_epoch } => {
                if !self.idle() || epoch < self.next_epoch.0 {
                    return Err(protocol(format!(
                        "the leader started checkpoint {epoch} while this worker {}",
                        match &self.in_flight {
                            Some(in_flight) => format!("still takes checkpoint {}", in_flight.epoch.0),
                            None => format!("expected checkpoint {} or later", self.next_epoch.0),
                        }
                    )));
                }
                self.next_epoch = Epoch(epoch);
                self.final_started |= final_epoch;
                self.start(running, controls, final_epoch, now());
                self.complete_if_ready()
            }
            ToWorker::Commit { epoch, final_epoch } => self.commit_as_told(epoch, final_epoch),
            other => Err(protocol(format!("the leader sent {other:?} to the checkpoint coordinator"))),
        }
    }

    /// A follower commits every record of `epoch` or earlier.
    fn commit_as_told(&mut self, epoch: u64, final_epoch: bool) -> Result<Completed, SluiceError> {
        if epoch >= self.next_epoch.0 {
            return Err(protocol(format!("the leader committed checkpoint {epoch}, which this worker never acked")));
        }
        let (now, later): (Vec<SinkRecord>, Vec<SinkRecord>) =
            std::mem::take(&mut self.uncommitted).into_iter().partition(|record| record.epoch <= epoch);
        self.uncommitted = later;
        self.stats.published += 1;
        self.stats.followed = true;
        self.stats.last_epoch = epoch;
        self.commit(now)?;
        let (committed, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.acked_positions).into_iter().partition(|(acked, _)| *acked <= epoch);
        self.acked_positions = later;
        for (acked, positions) in committed {
            self.tell_sources(acked, &positions);
        }
        if final_epoch {
            self.final_done = true;
            return Ok(Completed::Final);
        }
        Ok(Completed::Checkpoint)
    }

    /// Every local driver ended on its own (end of input). Alone or leading, once every
    /// other worker's drivers ended too, the last checkpoint records the end positions
    /// and commits the sinks' last rows: it starts now, or as soon as the checkpoint under
    /// way completes ([`Completed::Final`] follows from the writer). A follower tells
    /// the leader, once, and waits for its final commit.
    pub(crate) fn end_of_input(&mut self, now: Instant) -> Result<Completed, SluiceError> {
        if self.final_done {
            return Ok(Completed::Final);
        }
        if let Role::Follow { send, drivers_finished_sent, .. } = &mut self.role {
            if !*drivers_finished_sent {
                *drivers_finished_sent = true;
                send(ToLeader::DriversFinished).map_err(|e| e.context("telling the leader the input ended"))?;
            }
            return Ok(Completed::Nothing);
        }
        if !self.idle() || self.final_started || !self.others_finished() {
            return Ok(Completed::Nothing);
        }
        self.final_started = true;
        self.start(&BTreeSet::new(), &[], true, now);
        self.complete_if_ready()
    }

    /// What a run that is stopping still waits for, for the shutdown deadline's message.
    pub(crate) fn pending_work(&self) -> Option<String> {
        if let Some(in_flight) = &self.in_flight {
            let mut waiting: Vec<String> = in_flight.waiting.iter().map(|t| format!("thread {t}")).collect();
            waiting.extend(in_flight.waiting_workers.iter().map(|w| format!("worker {w}")));
            return Some(format!(
                "checkpoint {} waits for the barrier acknowledgement of {}",
                in_flight.epoch.0,
                waiting.join(", ")
            ));
        }
        if let Some(writing) = &self.writing {
            return Some(format!("checkpoint {} is still being written to the store", writing.epoch.0));
        }
        match &self.role {
            Role::Follow { drivers_finished_sent: true, .. } | Role::Follow { stop_sent: true, .. } => {
                Some("this worker waits for the leader's final commit".to_string())
            }
            Role::Lead { running, .. } if !running.is_empty() => {
                let workers: Vec<String> = running.iter().map(u32::to_string).collect();
                Some(format!("worker(s) {} have not finished their input", workers.join(", ")))
            }
            _ => None,
        }
    }

    /// All acks are in: the slice goes to the writer; the pause processing saw ends here.
    fn complete_if_ready(&mut self) -> Result<Completed, SluiceError> {
        if !self.in_flight.as_ref().is_some_and(|f| f.waiting.is_empty() && f.waiting_workers.is_empty()) {
            return Ok(Completed::Nothing);
        }
        let in_flight = self.in_flight.take().expect("checked above");
        if in_flight.timed_out && in_flight.finished_state {
            return Err(finished_state_lost(in_flight.epoch));
        }
        if in_flight.timed_out {
            // Already counted as failed: its state is dropped, its sinks' records ride
            // along with the next checkpoint (sorted by epoch when committed).
            if !self.follows() {
                self.uncommitted.extend(in_flight.carried);
            }
            self.uncommitted.extend(in_flight.slice.sink_records);
            self.schedule_after_failure();
            return Ok(Completed::Checkpoint);
        }
        // Every driver copied its state and went on: encoding and writing overlap
        // processing.
        let pause_ms = now().saturating_duration_since(in_flight.started).as_millis() as u64;
        let mut slice = in_flight.slice;
        for finished in &self.finished_positions {
            if !slice.positions.iter().any(|p| p.source == finished.source && p.lane == finished.lane) {
                slice.positions.push(finished.clone());
            }
        }
        if self.follows() {
            // Kept until the leader's commit says they are visible.
            self.uncommitted.extend(slice.sink_records.iter().cloned());
        }
        let mut records = in_flight.carried;
        records.append(&mut slice.sink_records);
        slice.sink_records = records.clone();
        let epoch = in_flight.epoch;
        let final_epoch = in_flight.final_epoch;
        let publish = (!self.follows()).then_some(in_flight.parts);
        let positions = slice.positions.clone();
        let finished_state = in_flight.finished_state;
        self.writing = Some(Writing {
            epoch,
            records,
            positions,
            final_epoch,
            finished_state,
            started: in_flight.started,
            pause_ms,
        });
        let request = WriteRequest { epoch, slice, final_epoch, publish };
        if post(&self.requests, request, WRITER_ARGUMENT) == Posted::ReceiverGone {
            let written = Written { epoch, result: Err(writer_gone()) };
            return self.on_written(written);
        }
        Ok(Completed::Nothing)
    }

    /// The writer finished checkpoint `epoch`: on success commit the sinks (a follower
    /// sends its part to the leader instead), else count the failure and carry the
    /// records to the next checkpoint.
    pub(crate) fn on_written(&mut self, written: Written) -> Result<Completed, SluiceError> {
        let Written { epoch, result } = written;
        let writing = self.writing.take().expect("an answer only follows a request");
        assert_eq!(writing.epoch, epoch, "the writer answers the epoch it was given");
        let Writing { mut records, positions, final_epoch, finished_state, started, pause_ms, .. } = writing;
        match result {
            Ok(WriteOutcome::Part(part)) => {
                let Role::Follow { send, .. } = &self.role else { unreachable!("only a follower writes a part alone") };
                self.stats.max_pause_ms = self.stats.max_pause_ms.max(pause_ms);
                self.acked_positions.push((epoch.0, positions));
                // A failure here is the leader's loss, which the control session reports.
                send(ToLeader::Acked { epoch: epoch.0, part }).map_err(|e| e.context("sending a checkpoint's part"))?;
                Ok(Completed::Nothing)
            }
            Ok(WriteOutcome::Published { state_bytes, written_bytes, by_operator }) => {
                if !by_operator.is_empty() {
                    self.stats.state_by_operator = Some((epoch.0, by_operator));
                }
                self.stats.published += 1;
                self.stats.last_epoch = epoch.0;
                self.stats.max_state_bytes = self.stats.max_state_bytes.max(state_bytes);
                self.stats.written_bytes = self.stats.written_bytes.saturating_add(written_bytes);
                self.stats.max_pause_ms = self.stats.max_pause_ms.max(pause_ms);
                let duration_ms = now().saturating_duration_since(started).as_millis() as u64;
                self.stats.max_duration_ms = self.stats.max_duration_ms.max(duration_ms);
                let record = CheckpointRecord { epoch: epoch.0, state_bytes, written_bytes, pause_ms, duration_ms };
                if self.stats.history.len() < HISTORY_KEPT {
                    self.stats.history.push(record);
                }
                self.stats.last = Some(record);
                self.failed_in_a_row = 0;
                tracing::info!(epoch = epoch.0, millis = duration_ms, "checkpoint published");
                sluice_types::failpoint!("checkpoint.after_publish");
                self.commit(records)?;
                self.tell_sources(epoch.0, &positions);
                self.tell_others_to_commit(epoch, final_epoch);
                sluice_types::failpoint!("checkpoint.after_commit");
                self.schedule_next();
                if final_epoch {
                    self.final_done = true;
                    return Ok(Completed::Final);
                }
                Ok(Completed::Checkpoint)
            }
            Err(error) if error.kind == ErrorKind::Panic => Err(error),
            Err(error) if finished_state => Err(error.context(finished_state_lost(epoch).message)),
            Err(error) => {
                self.stats.failed += 1;
                self.failed_in_a_row += 1;
                if !self.follows() {
                    records.append(&mut self.uncommitted);
                    self.uncommitted = records;
                }
                tracing::warn!(epoch = epoch.0, %error, "checkpoint failed; the next interval tries again");
                // A follower that cannot write its part fails the cluster's run at once
                // (the leader would otherwise wait out its timeout, more than once).
                if final_epoch || self.failed_in_a_row >= self.max_failed || self.follows() {
                    return Err(error.context(format!(
                        "checkpoint {} failed ({} in a row, max_failed_checkpoints = {})",
                        epoch.0, self.failed_in_a_row, self.max_failed
                    )));
                }
                self.schedule_after_failure();
                Ok(Completed::Checkpoint)
            }
        }
    }

    /// The leader's manifest `epoch` is published and its own sinks committed: every
    /// other worker commits its own.
    fn tell_others_to_commit(&self, epoch: Epoch, final_epoch: bool) {
        if let Role::Lead { others, send: Some(send), .. } = &self.role {
            for &worker in others {
                // A worker that cannot be told is lost; its records are in the manifest,
                // and recovery commits them.
                if let Err(error) = send(worker, ToWorker::Commit { epoch: epoch.0, final_epoch }) {
                    tracing::warn!(worker, %error, "a commit did not reach a worker");
                }
            }
        }
    }

    /// Commits every record of a published manifest, sink by sink, epoch by epoch.
    /// The rows of the committed records become visible: they count as rows out now.
    fn commit(&self, records: Vec<SinkRecord>) -> Result<(), SluiceError> {
        for (flow, sink) in self.sinks.iter().enumerate() {
            let mine: Vec<(u64, Vec<u8>)> =
                records.iter().filter(|r| r.flow == flow).map(|r| (r.epoch, r.record.clone())).collect();
            commit_in_order(sink.as_ref(), mine)?;
            let rows: u64 = records.iter().filter(|r| r.flow == flow).map(|r| r.rows).sum();
            self.metrics.sinks[flow].rows.fetch_add(rows, Ordering::Relaxed);
            sluice_types::failpoint!("checkpoint.after_sink_commit");
        }
        Ok(())
    }
}

/// A checkpoint holding the final state of a driver whose input ended failed: no later
/// checkpoint can hold it (that driver takes no snapshot again), so the run fails rather
/// than publish manifests without it.
fn finished_state_lost(epoch: Epoch) -> SluiceError {
    SluiceError::external(
        "checkpoint.final_state_lost",
        format!(
            "checkpoint {} failed, and it held the final state of threads whose input had ended, which no later \
             checkpoint can hold",
            epoch.0
        ),
    )
    .with_fix("fix what made the checkpoint fail (see the error before this one) and run the pipeline again: it resumes from the last published checkpoint")
}

/// A peer broke the checkpoint protocol (a bug, or a worker of another build).
fn protocol(message: String) -> SluiceError {
    SluiceError::internal("cluster.checkpoint_protocol", message)
        .with_fix("run the same sluice build on every worker; report this if they are")
}

#[cfg(test)]
mod tests;
