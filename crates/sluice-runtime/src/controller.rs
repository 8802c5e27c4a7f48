//! The controller: starts the drivers, owns the shutdown deadline, tells its caller of
//! the run's state changes ([`RunEvent`]), and turns the drivers' events into one
//! [`RunReport`].
//!
//! Shutdown order: without checkpoints a stop request sends `Stop` to every driver,
//! which ends its lanes; end-of-data then flows through every chain and exchange, windows
//! flush, and each sink closes when its input ended. With checkpoints a stop takes a final
//! checkpoint instead (`FinalBarrier`: every lane pauses, open windows stay in the
//! checkpoint, sinks commit), then sends `Exit`. Either way the controller waits for every
//! driver until `shutdown_timeout`; past it the run fails, naming what it still waited
//! for. A fatal error on one driver aborts the others at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, never};
use sluice_state::{Merge, MergeMode};
use sluice_types::{ErrorKind, SluiceError, TimestampMs};

use crate::chain::Chain;
use crate::checkpoint::{CheckpointOptions, Restore};
pub use crate::coordinator::{CheckpointRecord, CheckpointStats};
use crate::coordinator::{Cluster, Completed, Coordinator};
use crate::driver::{
    CONTROL_ARGUMENT, CONTROL_CAPACITY, Control, Driver, DriverEvent, EVENTS_PER_DRIVER, EntrySetup, FlowSetup,
    LaneSetup, OutputSetup, SegmentSetup,
};
use crate::duration::humanize;
use crate::exchange::{ExchangeInput, ExchangeOutput, cluster_mesh};
use crate::mailbox::post;
use crate::metrics::Metrics;
use crate::peers::Peers;
use crate::place::{SegmentPlace, operator_id};
use crate::plan::{OperatorContext, Plan, SegmentOutput};
use crate::writer::{Written, writer_gone};
use sluice_cluster::link::{LinkMetrics, Network, NetworkBuilder};
use sluice_types::vnode::SlotLayout;

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub threads: u32,
    pub vnodes: u32,
    pub batch_size: usize,
    /// Capacity of each exchange channel, in batches.
    pub queue_batches: usize,
    /// How long the drain may take after a stop request.
    pub shutdown_timeout: Duration,
}

/// What the controller tells its caller while a run goes on (a status, not a log: the
/// caller keeps the latest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEvent {
    /// Every driver thread started.
    Started,
    /// A stop was requested: the sources stop (or the final checkpoint starts).
    Stopping,
    /// Checkpoint `epoch` was published and every sink committed it; `record` has its
    /// figures where this worker published it (alone, or leading a cluster).
    Committed { epoch: u64, record: Option<CheckpointRecord> },
}

/// Requests a graceful stop of a running plan from another thread (a signal handler).
#[derive(Clone)]
pub struct StopHandle {
    requested: Arc<AtomicBool>,
    /// Why the run must end now, without draining (a lost peer: its data is gone).
    aborted: Arc<std::sync::Mutex<Option<SluiceError>>>,
    /// Checkpoint requests waiting for the controller, each answered with the epoch
    /// whose commit satisfies it (at most [`MAX_CHECKPOINT_REQUESTS`]).
    checkpoints: Arc<std::sync::Mutex<Vec<Sender<u64>>>>,
    /// While set, the drivers poll no lane (see [`StopHandle::pause`]).
    paused: Arc<AtomicBool>,
    /// While set, the drivers poll no lane either (see [`StopHandle::hold_sources`]).
    held: Arc<AtomicBool>,
    wake: Sender<()>,
}

/// Most checkpoint requests that may wait for the controller at once.
pub const MAX_CHECKPOINT_REQUESTS: usize = 64;

impl StopHandle {
    /// Asks the run to stop its sources and drain. Idempotent.
    pub fn stop(&self) {
        if !self.requested.swap(true, Ordering::SeqCst) {
            // The flag is the request; the channel only wakes the controller.
            self.wake_controller();
        }
    }

    /// Wakes the controller to look at the flags and requests. Full: a wake-up is
    /// already pending. Closed: the run is over. Either way nothing is lost.
    fn wake_controller(&self) {
        match self.wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The stop request as a flag, for waits before the run starts (a forming cluster's
    /// rendezvous gives up when it is set).
    pub fn requested_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.requested)
    }

    /// Ends the run at once, without draining: every driver is aborted and the run fails
    /// with `error` (a peer worker was lost, so no drain could complete). Idempotent: the
    /// first reason wins.
    pub fn abort(&self, error: SluiceError) {
        self.aborted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(error);
        self.wake_controller();
    }

    /// Asks for a checkpoint now (an operator's request). The receiver gets the epoch
    /// whose commit answers it (the first that starts after the request), or is closed
    /// without an answer when the run takes no checkpoints, follows a leader, or ended.
    /// None when [`MAX_CHECKPOINT_REQUESTS`] requests already wait.
    pub fn request_checkpoint(&self) -> Option<Receiver<u64>> {
        let (answer, answered) = bounded(1);
        {
            let mut waiting = self.checkpoints.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if waiting.len() >= MAX_CHECKPOINT_REQUESTS {
                return None;
            }
            waiting.push(answer);
        }
        self.wake_controller();
        Some(answered)
    }

    fn take_checkpoint_requests(&self) -> Vec<Sender<u64>> {
        std::mem::take(&mut *self.checkpoints.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Pauses the sources: no lane is polled until [`StopHandle::resume`]; rows in flight
    /// still reach the sinks and checkpoints go on. Idempotent; noticed within a
    /// driver's idle wait.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Polls the lanes again after [`StopHandle::pause`]. Idempotent.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Holds the sources back (or lets them go on): no lane is polled while `held`,
    /// rows in flight still reach the sinks, and checkpoints start back to back (each
    /// as soon as the previous one ends, without waiting for the interval; a cluster's
    /// follower waits for the checkpoints its leader starts). For state
    /// that only a checkpoint's commit frees, once it is over its share of the memory
    /// budget: the input waits for the commit rather than memory growing. Unlike a
    /// pause, the job's state stays `running`.
    pub fn hold_sources(&self, held: bool) {
        if !self.held.swap(held, Ordering::SeqCst) && held {
            // The controller starts a checkpoint.
            self.wake_controller();
        }
    }

    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Forgets the reason of an abort, so that the handle serves a new run (a cluster
    /// that re-forms after losing a worker); a stop request stays.
    pub fn rearm(&self) {
        self.aborted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }

    fn abort_reason(&self) -> Option<SluiceError> {
        self.aborted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Completed,
    /// `component` (a thread, a source lane, a sink, `checkpoint`, `shutdown`) failed.
    Failed {
        component: String,
        error: SluiceError,
    },
}

/// The exit report.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: RunOutcome,
    pub elapsed: Duration,
    /// Whether the run ended because a stop was requested (rather than end of input).
    pub stopped: bool,
    pub metrics: Arc<Metrics>,
    /// Checkpoint figures, when checkpoints were on.
    pub checkpoints: Option<CheckpointStats>,
}

impl RunReport {
    /// The final watermark of each lane of each source (None where a lane had none).
    pub fn lane_watermarks(&self) -> Vec<(String, Vec<Option<TimestampMs>>)> {
        self.metrics
            .sources
            .iter()
            .map(|source| {
                let lanes = source
                    .lane_watermarks
                    .iter()
                    .map(|w| Some(w.load(Ordering::Relaxed)).filter(|w| *w != crate::metrics::NO_WATERMARK))
                    .collect();
                (source.name.clone(), lanes)
            })
            .collect()
    }
}

/// Creates the handle before the run starts, so a signal handler can hold it.
pub fn stop_handle() -> (StopHandle, Receiver<()>) {
    let (wake, woken) = bounded(1);
    let handle = StopHandle {
        requested: Arc::new(AtomicBool::new(false)),
        aborted: Arc::default(),
        checkpoints: Arc::default(),
        paused: Arc::default(),
        held: Arc::default(),
        wake,
    };
    (handle, woken)
}

/// This worker's part of a cluster run: the slots of every worker, which of them are
/// this worker's, and the links to the others.
pub struct ClusterRun {
    pub layout: SlotLayout,
    pub worker: u32,
    /// The peers, with no channel registered yet: the run registers every remote
    /// channel of the plan on it, then opens the links with `connect`.
    pub network: NetworkBuilder,
    /// Opens the links (the caller holds the exchange listener and the secret).
    pub connect: Box<dyn FnOnce(NetworkBuilder) -> Result<Network, SluiceError> + Send>,
    /// The other workers' side of checkpoints (when the run checkpoints).
    pub peers: Option<Peers>,
}

/// Checkpoints for a run: how to take them, and the state restored from the last one.
pub struct Checkpointing {
    pub options: CheckpointOptions,
    pub restore: Restore,
}

/// Runs `plan` to completion, failure or stop, counting into `metrics` (made with
/// [`Metrics::for_plan`]); `observe` hears of the run's state changes as they happen.
pub fn run(
    plan: &Plan,
    options: &RunOptions,
    checkpointing: Option<Checkpointing>,
    stop: (StopHandle, Receiver<()>),
    metrics: Arc<Metrics>,
    observe: &mut dyn FnMut(RunEvent),
) -> RunReport {
    run_part(plan, options, checkpointing, None, stop, metrics, observe)
}

/// Runs this worker's part of `plan`: its slots' drivers, whose exchanges reach the
/// other workers' slots through `cluster`'s links. `options.threads` is the cluster's
/// slot count, and `metrics` are made for it (the other workers' slots stay at zero).
/// With checkpoints, `cluster.peers` carries the epochs between the workers.
///
/// The steps: place this worker (`WorkerPart::of`), start the coordinator, build the
/// drivers, open the links, spawn the drivers, supervise until an outcome
/// (`Supervisor::supervise`), wind down (`wind_down`) and report.
pub fn run_part(
    plan: &Plan,
    options: &RunOptions,
    checkpointing: Option<Checkpointing>,
    cluster: Option<ClusterRun>,
    stop: (StopHandle, Receiver<()>),
    metrics: Arc<Metrics>,
    observe: &mut dyn FnMut(RunEvent),
) -> RunReport {
    plan.assert_well_formed();
    assert!(options.threads > 0, "at least one driver thread");
    assert_eq!(metrics.threads.len(), options.threads as usize, "metrics made for this plan and thread count");
    let WorkerPart { layout, worker, mut network, connect, role, lead_events, follow_events } =
        WorkerPart::of(cluster, options, checkpointing.is_some());
    let local = layout.slots_of(worker);
    metrics.set_local_threads(&layout, worker);
    let started = Instant::now();
    let (stop_handle, stop_woken) = stop;
    let (events_sender, events) = bounded(local.len() * EVENTS_PER_DRIVER);
    let (coordinator, restore) = start_coordinator(plan, checkpointing, &metrics, started, role, local.start);
    let shape = DriverShape {
        checkpoints: coordinator.is_some(),
        exactly_once: coordinator.as_ref().is_none_or(Coordinator::exactly_once),
        first_epoch: coordinator.as_ref().map_or(1, Coordinator::first_epoch),
        paused: Arc::clone(&stop_handle.paused),
        held: Arc::clone(&stop_handle.held),
    };
    let place = Placement { layout: &layout, worker };
    let drivers = build_drivers(plan, options, &place, network.as_mut(), &metrics, &events_sender, &restore, &shape);
    let drivers = match drivers {
        Ok(drivers) => drivers,
        Err(failure) => return failed_to_start(failure, started, metrics),
    };
    let network = match open_links(network, connect) {
        Ok(network) => network,
        Err(failure) => return failed_to_start(failure, started, metrics),
    };
    let link_counters = link_counters(network.as_ref(), &metrics, worker);
    let (controls, handles) = match spawn_drivers(drivers) {
        Ok(spawned) => spawned,
        Err(failure) => return failed_to_start(failure, started, metrics),
    };
    drop(events_sender);
    observe(RunEvent::Started);
    let written = coordinator.as_ref().map_or_else(never, |c| c.results().clone());
    let inbox = Inbox { events, written, lead_events, follow_events, stop_woken };
    let mut supervisor = Supervisor {
        controls,
        running: local.clone().collect(),
        deadline: None,
        outcome: None,
        coordinator,
        echo: None,
        observe,
        metrics: Arc::clone(&metrics),
        reported_epoch: None,
        shutdown_timeout: options.shutdown_timeout,
        exited: false,
    };
    supervisor.supervise(&inbox, &stop_handle, &link_counters);
    publish_link_counters(&link_counters);
    // Requests that came too late are closed unanswered.
    drop(stop_handle.take_checkpoint_requests());
    let outcome = supervisor.outcome.take().expect("loop ends with an outcome");
    let exited = supervisor.exited;
    let outcome = wind_down(outcome, handles, network.as_ref(), exited, &inbox.events, options.shutdown_timeout);
    let checkpoints = supervisor.coordinator.as_ref().map(|coordinator| checkpoint_stats(plan, coordinator));
    RunReport { outcome, elapsed: started.elapsed(), stopped: stop_handle.is_requested(), metrics, checkpoints }
}

/// Opens the links to the other workers (the caller holds the exchange listener and the secret).
type Connect = Box<dyn FnOnce(NetworkBuilder) -> Result<Network, SluiceError> + Send>;

/// This worker's place in the run and its ends of the channels to the other workers
/// (a worker alone has none: its slots are the run's, its peer channels never answer).
struct WorkerPart {
    layout: SlotLayout,
    worker: u32,
    network: Option<NetworkBuilder>,
    connect: Option<Connect>,
    /// Leading or following the other workers' checkpoints.
    role: Option<Cluster>,
    /// The other workers' reports, when leading.
    lead_events: Receiver<(u32, sluice_cluster::wire::ToLeader)>,
    /// The leader's commands, when following.
    follow_events: Receiver<sluice_cluster::wire::ToWorker>,
}

impl WorkerPart {
    fn of(cluster: Option<ClusterRun>, options: &RunOptions, checkpoints: bool) -> WorkerPart {
        let (layout, worker, network, connect, peers) = match cluster {
            Some(ClusterRun { layout, worker, network, connect, peers }) => {
                (layout, worker, Some(network), Some(connect), peers)
            }
            None => (SlotLayout::solo(options.threads), 0, None, None, None),
        };
        assert_eq!(layout.slots(), options.threads, "options.threads counts every worker's slots");
        assert!(
            layout.workers() == 1 || !checkpoints || peers.is_some(),
            "checkpoints across workers need the peers' channels"
        );
        let (role, lead_events, follow_events) = match peers {
            Some(Peers::Lead { others, send, events }) => (Some(Cluster::Lead { others, send }), events, never()),
            Some(Peers::Follow { send, events }) => (Some(Cluster::Follow { send }), never(), events),
            None => (None, never(), never()),
        };
        WorkerPart { layout, worker, network, connect, role, lead_events, follow_events }
    }
}

/// The coordinator of this worker's checkpoints, and the state they restore (nothing
/// without checkpoints).
fn start_coordinator(
    plan: &Plan,
    checkpointing: Option<Checkpointing>,
    metrics: &Arc<Metrics>,
    started: Instant,
    role: Option<Cluster>,
    first_slot: u32,
) -> (Option<Coordinator>, Restore) {
    match checkpointing {
        Some(Checkpointing { options: checkpoint, restore }) => {
            let sinks = plan.flows.iter().map(|f| Arc::clone(&f.sink)).collect();
            (
                Some(
                    Coordinator::new(checkpoint, sinks, Arc::clone(metrics), started, role, first_slot)
                        .with_sources(plan.sources.clone()),
                ),
                restore,
            )
        }
        None => (None, Restore::default()),
    }
}

/// Opens the links once every remote channel of the plan is registered, before any
/// driver sends (a worker alone has none).
fn open_links(network: Option<NetworkBuilder>, connect: Option<Connect>) -> Result<Option<Network>, Failure> {
    match (network, connect) {
        (Some(network), Some(connect)) => match connect(network) {
            Ok(network) => Ok(Some(network)),
            Err(error) => Err(("exchange links".into(), error)),
        },
        _ => Ok(None),
    }
}

/// The control channel of each driver thread started, and its handle.
type Spawned = (Vec<Sender<Control>>, Vec<JoinHandle<()>>);

/// Starts a thread per driver. When one cannot start, the drivers already started are
/// aborted and the run fails.
fn spawn_drivers(drivers: Vec<(Driver, Sender<Control>)>) -> Result<Spawned, Failure> {
    let mut controls = Vec::new();
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    for (driver, control) in drivers {
        let thread = driver.thread;
        controls.push(control);
        let spawned = std::thread::Builder::new()
            .name(format!("sluice-driver-{thread}"))
            .stack_size(DRIVER_STACK_BYTES)
            .spawn(move || driver.run());
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                for control in &controls {
                    // A driver that already ended needs no abort.
                    let _gone = post(control, Control::Abort, CONTROL_ARGUMENT);
                }
                return Err((format!("driver {thread}"), SluiceError::external("run.thread", error.to_string())));
            }
        }
    }
    Ok((controls, handles))
}

/// The report of a run that failed before its drivers ran.
fn failed_to_start((component, error): Failure, started: Instant, metrics: Arc<Metrics>) -> RunReport {
    let outcome = RunOutcome::Failed { component, error };
    RunReport { outcome, elapsed: started.elapsed(), stopped: false, metrics, checkpoints: None }
}

/// After the supervisor's loop. Completed: joins the drivers, then waits until the links
/// delivered the ends of every channel (unless the drivers left on `Exit`). Failed: gives
/// the aborted drivers a bounded moment to close their sinks.
fn wind_down(
    mut outcome: RunOutcome,
    handles: Vec<JoinHandle<()>>,
    network: Option<&Network>,
    exited: bool,
    events: &Receiver<DriverEvent>,
    shutdown_timeout: Duration,
) -> RunOutcome {
    if outcome == RunOutcome::Completed {
        for handle in handles {
            let _ = handle.join();
        }
        // The local drivers ended every channel they send on; wait until the links
        // delivered those ends and the peers ended theirs. After a stop's final
        // checkpoint the drivers left on `Exit` instead: every row before the final
        // barrier was processed and committed, nothing followed it, so the links are
        // simply closed (on drop).
        if let Some(network) = network
            && !exited
            && let Err(error) = network.drain(shutdown_timeout)
        {
            outcome = RunOutcome::Failed { component: "exchange links".into(), error };
        }
    } else {
        // Aborted drivers leave promptly; wait a little so their sinks close, but never
        // past a bound: the report matters more than a stuck thread.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && handles.iter().any(|h| !h.is_finished()) {
            let _ = events.recv_timeout(Duration::from_millis(20));
        }
    }
    outcome
}

/// The coordinator's figures, with operator ids turned into the operators as `explain`
/// shows them.
fn checkpoint_stats(plan: &Plan, coordinator: &Coordinator) -> CheckpointStats {
    let mut stats = coordinator.stats.clone();
    for (id, _) in stats.state_by_operator.iter_mut().flat_map(|(_, operators)| operators) {
        if let Some(name) = plan.operator_name(id) {
            *id = name;
        }
    }
    stats
}

/// Each link's counters with the run's named counters they are copied to (the exit
/// report and the admin API show those), named by direction so that the leader's report,
/// which adds every worker's counters, keeps them apart: bytes sent and credit stalls
/// (times a channel had a message and no credit) from this worker to each peer.
type LinkCounters = Vec<(Arc<LinkMetrics>, Arc<AtomicU64>, Arc<AtomicU64>)>;

fn link_counters(network: Option<&Network>, metrics: &Metrics, me: u32) -> LinkCounters {
    let Some(network) = network else { return Vec::new() };
    metrics.set_links(network.metrics());
    let named = |peer: u32, what: &str| metrics.counter(&format!("exchange worker {me} to {peer}: {what}"));
    network
        .metrics()
        .into_iter()
        .map(|(peer, link)| (link, named(peer, "bytes sent"), named(peer, "credit stalls")))
        .collect()
}

fn publish_link_counters(counters: &LinkCounters) {
    for (link, bytes_sent, credit_stalls) in counters {
        bytes_sent.store(link.bytes_sent.load(Ordering::Relaxed), Ordering::Relaxed);
        credit_stalls.store(link.credit_stalls.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The stack of each driver thread: evaluating an expression as deep as the SQL layer
/// allows takes up to 2 MiB (measured in a debug build, see crates/sluice-sql/src/stack.rs,
/// whose `EVALUATION_STACK_BYTES` this mirrors: the runtime does not depend on the SQL
/// layer), a default thread's whole stack.
pub(crate) const DRIVER_STACK_BYTES: usize = 8 << 20;

/// The longest the controller sleeps when nothing is due (it wakes on every event).
const IDLE_WAKE: Duration = Duration::from_millis(500);

struct Supervisor<'o> {
    controls: Vec<Sender<Control>>,
    running: BTreeSet<u32>,
    deadline: Option<Instant>,
    outcome: Option<RunOutcome>,
    coordinator: Option<Coordinator>,
    /// A failure that is only the echo of another (a peer thread vanished): reported if
    /// no root cause arrives within [`ROOT_CAUSE_WAIT`].
    echo: Option<(RunOutcome, Instant)>,
    observe: &'o mut dyn FnMut(RunEvent),
    /// The run's counters, whose checkpoint figures the supervisor keeps.
    metrics: Arc<Metrics>,
    /// The last commit told to `observe`.
    reported_epoch: Option<u64>,
    /// Bounds the drain after a stop, and the final checkpoint at the end of input.
    shutdown_timeout: Duration,
    /// The drivers were told to `Exit` after a stop's final checkpoint: they leave
    /// without ending their outputs (nothing follows the final barrier), so the links
    /// have nothing left to deliver and are closed without a drain.
    exited: bool,
}

/// How long an echo failure waits for the failure that caused it.
const ROOT_CAUSE_WAIT: Duration = Duration::from_millis(500);

/// What the supervisor waits on, besides its deadlines.
struct Inbox {
    /// The local drivers' events.
    events: Receiver<DriverEvent>,
    /// The checkpoint writer's answers (never, without checkpoints).
    written: Receiver<Written>,
    /// The other workers' reports, when leading.
    lead_events: Receiver<(u32, sluice_cluster::wire::ToLeader)>,
    /// The leader's commands, when following.
    follow_events: Receiver<sluice_cluster::wire::ToWorker>,
    /// Wakes on a stop request, an abort or a checkpoint request.
    stop_woken: Receiver<()>,
}

impl Supervisor<'_> {
    /// Serves the drivers, the checkpoint writer, the other workers and `stop` until the
    /// run has an outcome.
    fn supervise(&mut self, inbox: &Inbox, stop: &StopHandle, link_counters: &LinkCounters) {
        let no_events = never();
        while self.outcome.is_none() {
            let now = Instant::now();
            let wake = self.next_wake(now);
            // Once every local driver left, their channel only says so; the run may still
            // wait for the writer or the other workers.
            let driver_events = if self.running.is_empty() { &no_events } else { &inbox.events };
            crossbeam_channel::select! {
                recv(driver_events) -> event => self.on_event(event.ok()),
                recv(inbox.written) -> answer => self.on_written(answer.ok()),
                recv(inbox.lead_events) -> report => self.on_worker(report.ok()),
                recv(inbox.follow_events) -> command => self.on_leader(command.ok()),
                // The wake-up also comes with an abort, which is no stop request (handled below).
                recv(inbox.stop_woken) -> _ => if stop.is_requested() {
                    self.on_stop(self.shutdown_timeout)
                },
                default(wake.saturating_duration_since(now)) => {}
            }
            if let Some(error) = stop.abort_reason()
                && self.outcome.is_none()
            {
                self.abort();
                self.outcome = Some(RunOutcome::Failed { component: "run".into(), error });
                break;
            }
            if stop.is_requested() && self.deadline.is_none() {
                self.on_stop(self.shutdown_timeout);
            }
            self.answer_checkpoint_requests(stop);
            self.tick();
            self.check_end();
            self.check_deadline(self.shutdown_timeout);
            publish_link_counters(link_counters);
        }
    }

    /// When the loop must wake even if nothing arrives: the stop's deadline, an echo's
    /// wait, the next checkpoint or barrier timeout, or [`IDLE_WAKE`] from `now`.
    fn next_wake(&self, now: Instant) -> Instant {
        let mut wake = self.deadline.unwrap_or(now + IDLE_WAKE);
        if let Some((_, until)) = self.echo {
            wake = wake.min(until);
        }
        if let Some(due) = self.coordinator.as_ref().and_then(Coordinator::next_due) {
            wake = wake.min(due);
        }
        if let Some(due) = self.coordinator.as_ref().and_then(Coordinator::next_timeout) {
            wake = wake.min(due);
        }
        wake
    }

    fn answer_checkpoint_requests(&mut self, stop: &StopHandle) {
        // Held sources wait for a commit: the next checkpoint is due now.
        if stop.is_held()
            && let Some(coordinator) = self.coordinator.as_mut()
        {
            coordinator.request_now(Instant::now());
        }
        for answer in stop.take_checkpoint_requests() {
            // Without a coordinator that decides, the request is dropped: the requester
            // sees its answer channel closed.
            if let Some(epoch) = self.coordinator.as_mut().and_then(|c| c.request_now(Instant::now())) {
                let _ = answer.try_send(epoch);
            }
        }
    }

    fn on_event(&mut self, event: Option<DriverEvent>) {
        match event {
            Some(DriverEvent::Acked { thread, epoch, slice }) => {
                let Some(coordinator) = self.coordinator.as_mut() else { return };
                let completed = coordinator.on_ack(thread, epoch, slice);
                self.after_checkpoint(completed);
            }
            Some(DriverEvent::Finished { thread, slice }) => {
                tracing::debug!(thread, "driver reported finished");
                self.running.remove(&thread);
                if let Some(coordinator) = self.coordinator.as_mut() {
                    let completed = coordinator.on_finished(thread, slice);
                    self.after_checkpoint(completed);
                }
                self.check_end();
            }
            Some(DriverEvent::Fatal { thread, component, error }) => {
                tracing::debug!(thread, %component, "driver failed");
                let lost_peer = error.kind == ErrorKind::LostPeer;
                let failed = RunOutcome::Failed { component, error };
                // A thread that failed drops its queues before its report arrives, so a
                // peer may report "lost sender" first: wait a little for the real cause.
                if lost_peer {
                    self.echo.get_or_insert((failed, Instant::now() + ROOT_CAUSE_WAIT));
                } else {
                    self.abort();
                    self.outcome = Some(failed);
                }
            }
            Some(DriverEvent::Aborted { thread }) => {
                self.abort();
                self.outcome = Some(RunOutcome::Failed {
                    component: format!("driver {thread}"),
                    error: SluiceError::internal("run.aborted", "aborted"),
                });
            }
            // Every driver is gone. One that failed because a peer went away (another
            // worker, whose own report is elsewhere) reported that: it is the outcome.
            None => {
                self.outcome = Some(self.echo.take().map_or_else(
                    || RunOutcome::Failed {
                        component: "runtime".into(),
                        error: SluiceError::internal(
                            "run.panic",
                            "every driver thread exited without reporting (a panic)",
                        ),
                    },
                    |(echo, _)| echo,
                ))
            }
        }
    }

    /// The checkpoint writer answered (None: it is gone).
    fn on_written(&mut self, answer: Option<Written>) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let completed = match answer {
            Some(written) => coordinator.on_written(written),
            None => Err(writer_gone()),
        };
        self.after_checkpoint(completed);
    }

    /// Every local driver left: without checkpoints the run is complete; with them the
    /// last checkpoint records the end and commits (alone or leading, once every other
    /// worker's drivers left too; a follower waits for the leader's final commit). Bounded
    /// by `shutdown_timeout` alone or leading, from the start of that last checkpoint: a
    /// checkpoint still being written when the input ended is waited for as a running
    /// job waits for it (a large state's delta, or a merge it waits for, may take longer
    /// than a stop's drain; NEXMark q20 over 100 M events waited 84 s), and a stop
    /// request meanwhile still sets its own deadline. A follower's own end sets no deadline: the
    /// other workers may read on for longer than that, and a deadline would turn its next
    /// checkpoint into a stop request for the whole cluster (`after_checkpoint`); the
    /// leader's deadline bounds the final checkpoint, and the leader's loss ends the run.
    fn check_end(&mut self) {
        if !self.running.is_empty() || self.outcome.is_some() {
            return;
        }
        let Some(coordinator) = self.coordinator.as_mut() else {
            self.outcome = Some(RunOutcome::Completed);
            return;
        };
        if !coordinator.others_finished() {
            return;
        }
        let completed = coordinator.end_of_input(Instant::now());
        if !coordinator.follows() && coordinator.final_started() {
            self.deadline.get_or_insert_with(|| Instant::now() + self.shutdown_timeout);
        }
        self.after_checkpoint(completed);
    }

    /// Another worker reported (None: the engine's session ended; its loss aborts the run).
    fn on_worker(&mut self, report: Option<(u32, sluice_cluster::wire::ToLeader)>) {
        let (Some((worker, report)), Some(coordinator)) = (report, self.coordinator.as_mut()) else { return };
        let completed = coordinator.on_worker(worker, report);
        self.after_checkpoint(completed);
    }

    /// The leader's command (None: the session ended; its loss aborts the run).
    fn on_leader(&mut self, command: Option<sluice_cluster::wire::ToWorker>) {
        let (Some(command), Some(coordinator)) = (command, self.coordinator.as_mut()) else { return };
        let completed = coordinator.on_leader(command, &self.running, &self.controls);
        self.after_checkpoint(completed);
    }

    /// Lets the coordinator start a due checkpoint or time out the one in flight.
    fn tick(&mut self) {
        if self.outcome.is_some() {
            return;
        }
        if let Some(coordinator) = self.coordinator.as_mut() {
            let ticked = coordinator.tick(Instant::now(), &self.running, &self.controls);
            if ticked != Ok(Completed::Nothing) {
                self.after_checkpoint(ticked);
            }
        }
    }

    /// Tells the observer of a newly committed checkpoint, and the metrics of every
    /// published or failed one.
    fn report_commit(&mut self) {
        let Some(coordinator) = self.coordinator.as_ref() else { return };
        let stats = &coordinator.stats;
        let checkpoints = &self.metrics.checkpoints;
        // A follower commits what the leader published: its figures are the leader's.
        if !stats.followed {
            checkpoints.failed.store(stats.failed, Ordering::Relaxed);
        }
        if !stats.followed && checkpoints.published.swap(stats.published, Ordering::Relaxed) != stats.published {
            if let Some(last) = stats.last {
                checkpoints.last_epoch.store(last.epoch, Ordering::Relaxed);
                checkpoints.last_duration_ms.store(last.duration_ms, Ordering::Relaxed);
                checkpoints.last_pause_ms.store(last.pause_ms, Ordering::Relaxed);
                checkpoints.last_state_bytes.store(last.state_bytes, Ordering::Relaxed);
            }
            if let Some((_, by_operator)) = &stats.state_by_operator {
                self.metrics.set_state_bytes(by_operator);
            }
        }
        let epoch = coordinator.stats.last_epoch;
        if coordinator.stats.published > 0 && self.reported_epoch != Some(epoch) {
            self.reported_epoch = Some(epoch);
            let record = coordinator.stats.last.filter(|record| record.epoch == epoch);
            (self.observe)(RunEvent::Committed { epoch, record });
        }
    }

    fn after_checkpoint(&mut self, completed: Result<Completed, SluiceError>) {
        self.report_commit();
        match completed {
            // Every driver already left (the end of input): the run is complete.
            Ok(Completed::Final) if self.running.is_empty() => {
                if self.outcome.is_none() {
                    self.outcome = Some(RunOutcome::Completed);
                }
            }
            Ok(Completed::Final) => {
                self.exited = true;
                for control in &self.controls {
                    // A driver that already ended needs no exit.
                    let _gone = post(control, Control::Exit, CONTROL_ARGUMENT);
                }
            }
            Ok(Completed::Nothing | Completed::Checkpoint) => {
                if let Some(coordinator) = self.coordinator.as_mut()
                    && self.deadline.is_some()
                {
                    coordinator.request_stop(&self.running, &self.controls);
                }
            }
            Err(error) => {
                self.abort();
                self.outcome = Some(RunOutcome::Failed { component: "checkpoint".into(), error });
            }
        }
    }

    fn on_stop(&mut self, timeout: Duration) {
        if self.deadline.is_some() {
            return;
        }
        (self.observe)(RunEvent::Stopping);
        self.deadline = Some(Instant::now() + timeout);
        match self.coordinator.as_mut() {
            // Keep open windows in a final checkpoint rather than flushing them.
            Some(coordinator) => coordinator.request_stop(&self.running, &self.controls),
            None => {
                for control in &self.controls {
                    // A driver that already ended has nothing to stop.
                    let _gone = post(control, Control::Stop, CONTROL_ARGUMENT);
                }
            }
        }
    }

    fn check_deadline(&mut self, timeout: Duration) {
        if self.outcome.is_some() {
            return;
        }
        if let Some((_, until)) = &self.echo
            && Instant::now() >= *until
        {
            self.abort();
            self.outcome = self.echo.take().map(|(outcome, _)| outcome);
            return;
        }
        if let Some(deadline) = self.deadline
            && Instant::now() >= deadline
        {
            self.abort();
            let mut waiting: Vec<String> =
                self.coordinator.as_ref().and_then(Coordinator::pending_work).into_iter().collect();
            let limit = humanize(timeout);
            waiting.push(match self.running.len() {
                0 => format!("not done after shutdown_timeout = {limit}"),
                draining => format!(
                    "{draining} thread(s) still draining after shutdown_timeout = {limit}; their in-flight rows were \
                     abandoned"
                ),
            });
            self.outcome = Some(RunOutcome::Failed {
                component: "shutdown".into(),
                error: SluiceError::external("run.shutdown_timeout", waiting.join("; "))
                    .with_fix("raise [pipeline] shutdown_timeout, or find the sink or store that does not answer"),
            });
        }
    }

    fn abort(&self) {
        for control in &self.controls {
            // A driver that already ended needs no abort.
            let _gone = post(control, Control::Abort, CONTROL_ARGUMENT);
        }
    }
}

type Failure = (String, SluiceError);

/// How drivers take part in checkpoints.
struct DriverShape {
    checkpoints: bool,
    exactly_once: bool,
    first_epoch: u64,
    paused: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
}

/// Which slots of which layout this worker runs.
struct Placement<'a> {
    layout: &'a SlotLayout,
    worker: u32,
}

/// Builds this worker's drivers: their lanes, their chain instances (restored from
/// `restore`) and their ends of the exchanges (registering remote ends on `network`).
#[allow(clippy::too_many_arguments)]
fn build_drivers(
    plan: &Plan,
    options: &RunOptions,
    place: &Placement<'_>,
    mut network: Option<&mut NetworkBuilder>,
    metrics: &Arc<Metrics>,
    events: &Sender<DriverEvent>,
    restore: &Restore,
    shape: &DriverShape,
) -> Result<Vec<(Driver, Sender<Control>)>, Failure> {
    let local = place.layout.slots_of(place.worker);
    let local_count = local.len();
    // per_thread[t - local.start] = the flows of local slot t.
    let mut per_thread: Vec<Vec<FlowSetup>> = (0..local_count).map(|_| Vec::new()).collect();
    let mut exchange = 0u32;
    // The receivers of each tap (by the tapping flow), built with the flow it taps, which
    // comes earlier in the plan.
    let mut tap_tails: HashMap<usize, Tail> = HashMap::new();
    for (flow_index, flow) in plan.flows.iter().enumerate() {
        let mut builder = PathBuilder {
            plan,
            options,
            place,
            network: network.as_deref_mut(),
            metrics,
            restore,
            shape,
            flow: flow_index,
            exchange: &mut exchange,
        };
        // Sides first: their last exchanges feed trunk segments as further ports. Every
        // worker numbers exchanges and segments the same way (the plan's order).
        let mut side_segments: Vec<Vec<Vec<SegmentSetup>>> = Vec::new();
        let mut side_tails = Vec::new();
        for (number, side) in flow.sides.iter().enumerate() {
            let path = PathInput { source: side.source, tap: None, taps: Vec::new() };
            let (segments, tail, _) = builder.path(path, &side.segments, Some(number), Vec::new())?;
            side_segments.push(segments);
            side_tails.push((side.into, tail.expect("a side ends in an exchange")));
        }
        let tap = flow.tap.as_ref().map(|_| tap_tails.remove(&flow_index).expect("a tap is built with its flow"));
        let taps = (plan.flows.iter().enumerate())
            .filter_map(|(reader, other)| other.tap.as_ref().filter(|t| t.flow == flow_index).map(|t| (reader, t)))
            .collect();
        let path = PathInput { source: flow.source, tap, taps };
        let (trunk, _sink, tails) = builder.path(path, &flow.segments, None, side_tails)?;
        tap_tails.extend(tails);
        for (index, mut segments) in trunk.into_iter().enumerate() {
            let mut entries = Vec::new();
            if flow.tap.is_none() {
                entries.push(EntrySetup { source: flow.source, table: flow.table, segment: 0 });
            }
            let mut first = flow.segments.len();
            for (side, built) in flow.sides.iter().zip(side_segments.iter_mut()) {
                entries.push(EntrySetup { source: side.source, table: side.table, segment: first });
                first += side.segments.len();
                segments.append(&mut built[index]);
            }
            per_thread[index].push(FlowSetup { entries, name: flow.sink.name().to_string(), segments });
        }
    }
    let start_positions: Arc<HashMap<(usize, u32), Vec<u8>>> = Arc::new(restore.positions.clone());
    let mut drivers = Vec::new();
    for (index, flows) in per_thread.into_iter().enumerate() {
        let thread = local.start + index as u32;
        let lanes = plan
            .sources
            .iter()
            .enumerate()
            .flat_map(|(source, factory)| (0..factory.lanes()).map(move |lane| LaneSetup { source, lane }))
            .filter(|setup| place.layout.slot_of_lane(setup.lane) == thread)
            .collect();
        let (control_sender, control) = bounded(CONTROL_CAPACITY);
        let driver = Driver {
            thread,
            threads: options.threads,
            batch_size: options.batch_size,
            plan: plan.clone(),
            lanes,
            flows,
            control,
            events: events.clone(),
            metrics: Arc::clone(metrics),
            start_positions: Arc::clone(&start_positions),
            staged: shape.checkpoints,
            checkpoints: shape.checkpoints,
            first_epoch: shape.first_epoch,
            paused: Arc::clone(&shape.paused),
            held: Arc::clone(&shape.held),
        };
        drivers.push((driver, control_sender));
    }
    Ok(drivers)
}

/// The receivers of one exchange on this worker (a row per local slot) and which sender
/// slots never send rows into it.
type Tail = (Vec<Vec<crate::exchange::Inbound>>, Vec<bool>);

/// A path's segments per local slot, the receivers of its last exchange (if it ends in
/// one) and of its taps (by tapping flow).
type PathBuilt = (Vec<Vec<SegmentSetup>>, Option<Tail>, Vec<(usize, Tail)>);

/// What feeds a path and what it feeds besides its own output.
struct PathInput<'p> {
    /// The source whose lanes feed the path's first segment, unless `tap` is set.
    source: usize,
    /// The receivers of the tap that feeds the path's first segment instead (a flow with
    /// a [`crate::plan::Tap`]).
    tap: Option<Tail>,
    /// The flows tapping this path (a trunk), each with its tap.
    taps: Vec<(usize, &'p crate::plan::Tap)>,
}

/// Builds the chain instances and exchange ends of one path of a flow (its trunk or a
/// side) for this worker's slots.
struct PathBuilder<'a, 'n> {
    plan: &'a Plan,
    options: &'a RunOptions,
    place: &'a Placement<'a>,
    network: Option<&'n mut NetworkBuilder>,
    metrics: &'a Arc<Metrics>,
    restore: &'a Restore,
    shape: &'a DriverShape,
    flow: usize,
    exchange: &'a mut u32,
}

impl PathBuilder<'_, '_> {
    /// `segments` of the trunk (`side` None) or of side input `side`, fed by `input`; `joins` are the
    /// sides' last exchanges, each entering segment `into` as its next port. Returns the
    /// segments per local slot, the receivers of the path's last exchange, if it ends
    /// in one, and the receivers of each tap out of the path (by tapping flow).
    fn path(
        &mut self,
        input: PathInput<'_>,
        segments: &[crate::plan::Segment],
        side: Option<usize>,
        mut joins: Vec<(usize, Tail)>,
    ) -> Result<PathBuilt, Failure> {
        let PathInput { source, tap, taps } = input;
        let threads = self.options.threads as usize;
        let local = self.place.layout.slots_of(self.place.worker);
        let local_count = local.len();
        let mut inputs: Vec<Option<ExchangeInput>> = (0..local_count).map(|_| None).collect();
        // Slots owning no lane of the source never send rows into the path's first
        // exchange (every later exchange may receive rows from any slot).
        let mut idle = vec![true; threads];
        for lane in 0..self.plan.sources[source].lanes() {
            idle[self.place.layout.slot_of_lane(lane) as usize] = false;
        }
        let mut built: Vec<Vec<SegmentSetup>> = (0..local_count).map(|_| Vec::new()).collect();
        // A tapping path's first segment reads the tap: every slot may send into it.
        if tap.is_some() {
            idle.iter_mut().for_each(|idle| *idle = false);
        }
        let mut pending: Option<Tail> = tap;
        let mut tails = Vec::new();
        for (position, segment) in segments.iter().enumerate() {
            let place = SegmentPlace { flow: self.flow, side, segment: position };
            // This segment's input: the previous exchange (port 0) and any sides joining here.
            if let Some((receivers, previous_idle)) = pending.take() {
                let mut ports: Vec<Vec<(Vec<crate::exchange::Inbound>, Vec<bool>)>> =
                    receivers.into_iter().map(|row| vec![(row, previous_idle.clone())]).collect();
                for (_, (side_receivers, side_idle)) in joins.extract_if(.., |(into, _)| *into == position) {
                    for (row, side_row) in ports.iter_mut().zip(side_receivers) {
                        row.push((side_row, side_idle.clone()));
                    }
                }
                let segment = self.plan.segment_name(place).unwrap_or_else(|| format!("{place:?}"));
                for (index, row) in ports.into_iter().enumerate() {
                    let thread = local.start + index as u32;
                    let mut input = ExchangeInput::merged(row, self.shape.exactly_once)
                        .gauged(self.options.queue_batches, |capacity| self.metrics.queue(&segment, thread, capacity));
                    if !self.restore.positions.is_empty() {
                        // Resumed lanes report their watermarks first: let them all
                        // arrive before rows pass (see `exchange`).
                        input = input.restored();
                    }
                    inputs[index] = Some(input);
                }
            }
            let mut senders = match &segment.output {
                SegmentOutput::Exchange { .. } => {
                    let mesh = cluster_mesh(
                        self.place.layout,
                        self.place.worker,
                        *self.exchange,
                        self.options.queue_batches,
                        self.network.as_deref_mut(),
                    );
                    *self.exchange += 1;
                    pending = Some((mesh.receivers, idle.clone()));
                    Some(mesh.senders.into_iter())
                }
                SegmentOutput::Sink => None,
            };
            // The taps out of this segment: an exchange each, numbered after its own.
            let mut tap_senders = Vec::new();
            for (reader, tap) in taps.iter().filter(|(_, tap)| tap.segment == position) {
                let mesh = cluster_mesh(
                    self.place.layout,
                    self.place.worker,
                    *self.exchange,
                    self.options.queue_batches,
                    self.network.as_deref_mut(),
                );
                *self.exchange += 1;
                tails.push((*reader, (mesh.receivers, idle.clone())));
                let edge = format!(
                    "{} → sink {}",
                    self.plan.segment_name(place).unwrap_or_else(|| format!("{place:?}")),
                    self.plan.flows[*reader].sink.name()
                );
                tap_senders.push((*tap, mesh.senders.into_iter(), self.metrics.edge_blocked(&edge)));
            }
            for thread in local.clone() {
                let index = (thread - local.start) as usize;
                let context = OperatorContext {
                    thread,
                    threads: self.options.threads,
                    vnodes: self.options.vnodes,
                    metrics: Arc::clone(self.metrics),
                };
                let mut operators = Vec::new();
                for (line, factory) in &segment.operators {
                    operators.push(factory(&context).map_err(|e| (format!("operator {line}"), e))?);
                }
                let counters = (0..segment.operators.len())
                    .map(|operator| {
                        let id = operator_id(place, operator);
                        let name = self.plan.operator_name(&id).unwrap_or_else(|| id.clone());
                        self.metrics.operator(&id, &name)
                    })
                    .collect();
                let owned = sluice_types::vnode::range_of(thread, self.options.vnodes, self.options.threads);
                let mut chain = Chain::new(operators).counted(counters).owning(owned.clone());
                if let Some(state) = &self.restore.state {
                    for operator in 0..segment.operators.len() {
                        let id = operator_id(place, operator);
                        if !state.has(&id) {
                            continue;
                        }
                        // The instance's vnodes only, merged from the runs that serve them,
                        // one block of each at a time.
                        let restored = state.open(&id, owned.clone()).and_then(|inputs| {
                            let mut merged = Merge::new(inputs, owned.clone(), MergeMode::Live);
                            chain.restore(operator, &mut merged)
                        });
                        restored.map_err(|e| (format!("restoring {}", segment.operators[operator].0), e))?;
                    }
                }
                let output = match &segment.output {
                    SegmentOutput::Exchange { partitioner, .. } => {
                        let senders = senders.as_mut().and_then(Iterator::next).expect("one sender row per local slot");
                        let edge = self.plan.segment_name(place).unwrap_or_else(|| format!("{place:?}"));
                        let blocked = self.metrics.edge_blocked(&edge);
                        OutputSetup::Exchange(ExchangeOutput::new(partitioner(&context), senders).measured(blocked))
                    }
                    SegmentOutput::Sink => OutputSetup::Sink { sink: self.flow },
                };
                let taps = (tap_senders.iter_mut())
                    .map(|(tap, senders, blocked)| {
                        let senders = senders.next().expect("one sender row per local slot");
                        ExchangeOutput::new((tap.partitioner)(&context), senders).measured(Arc::clone(blocked))
                    })
                    .collect();
                built[index].push(SegmentSetup { place, chain, input: inputs[index].take(), output, taps });
            }
            idle.iter_mut().for_each(|idle| *idle = false);
        }
        assert!(joins.is_empty(), "every side enters a segment of the trunk fed by an exchange");
        assert_eq!(tails.len(), taps.len(), "every tap out of the path taps one of its segments");
        Ok((built, pending, tails))
    }
}
