//! A driver thread: polls its lanes and runs its instance of every segment.
//!
//! # Scheduling and backpressure
//!
//! Each loop turn, for every flow, from the last segment to the first: flush the
//! segment's outbox into its exchange channels (never blocking), then, if the outbox is
//! empty, feed the segment a burst of messages from its exchange input. Lanes are polled
//! last, and only those whose source feeds no segment 0 with a non-empty outbox.
//!
//! Why this cannot deadlock: a driver never blocks while holding work; a full channel
//! leaves the message in the outbox and the driver moves on to other segments.
//! (Exchange inputs hold some senders' channels while they align a barrier, or at the
//! start of a restored run until every sender spoke; each hold ends with a message every
//! sender sends, the barrier or end-of-data, so the argument below applies between them.) The last
//! segment of a flow writes a sink, never an exchange, so it can always consume; hence
//! the channels into it drain, hence the segment before it can flush, and so on back to
//! segment 0 (induction on the segment index). Why a full queue reaches the source: a
//! segment with a non-empty outbox reads no input, and segment 0's input is the lanes,
//! which are not polled while it is blocked. Every queue is bounded (channel capacity);
//! an outbox holds at most the output of one input message (of a barrier or end-of-data:
//! with the mini-batches its operators held, bounded by their own row bounds).
//!
//! # Fan-out
//!
//! A segment tapped by later flows (`plan::Tap`, a view computed once for several
//! readers) routes every message it emits to each tap's exchange as well as to its own
//! output, rows, watermarks, barriers and end-of-data alike, so each reader sees the
//! same stream and aligns the same barriers. It reads no input while any of them holds
//! messages, so the slowest reader holds it back and nothing is dropped. The argument
//! above still holds: a tap feeds the first segment of a flow ending in its own sink,
//! and no flow reads back into the flow it taps, so the waits form no cycle.
//!
//! # Mini-batches and watermark alignment
//!
//! Operators that fold several batches into one output ([`crate::Operator::on_flush`])
//! are flushed when a turn makes no progress (before the driver waits), every
//! [`MINI_BATCH_LATENCY`] while it is busy (a segment whose outbox is full is flushed
//! once it has room), and before each barrier's snapshot. A lane more than its source's
//! `max_watermark_drift` ahead of the slowest live lane this worker reads is skipped
//! (and told so, as a blocked one is) until that lane catches up or ends.
//!
//! When a turn makes no progress, the driver waits on a `Select` over the control channel,
//! the inputs it could read and the channels it is blocked on, until the earliest lane
//! wake-up (at most 1 ms while a lane is held for alignment: the slowest lane's progress
//! on another thread does not wake this one): it is woken by events, it does not spin.
//!
//! # Barriers
//!
//! On `Barrier(e)` the driver records every lane's position, then feeds the barrier into
//! segment 0 of every live flow. Each segment, when the barrier reaches its input (aligned
//! by the exchange), copies its chain's state (encoded later, off this thread), forwards
//! the barrier, and (at a sink) pre-commits.
//! When every segment that was live at injection has passed `e` (or ended), the driver
//! acks with its slice. `FinalBarrier(e)` does the same but first pauses every lane, so
//! nothing follows the barrier; the driver then waits for `Exit` (a stop that keeps open
//! windows in the checkpoint instead of flushing them).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};
use sluice_types::{Batch, Epoch, ErrorKind, Message, SluiceError, TimestampMs, failpoint, panic_message};

use crate::chain::Chain;
use crate::checkpoint::{DeferredState, LanePosition, ManifestSlice, SinkRecord};
use crate::exchange::{ExchangeInput, ExchangeOutput};
use crate::mailbox::post;
use crate::metrics::{Metrics, NO_WATERMARK};
use crate::place::{SegmentPlace, operator_id};
use crate::plan::{LaneContext, LanePoll, LaneReader, SinkParallelism, SinkWriter};

/// Messages from the controller. `Stop` may be sent more than once; `Abort` and `Exit`
/// are final. `Barrier(e)` is never sent while barrier `e - 1` is unacknowledged, and
/// never after `FinalBarrier`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    /// Stop polling sources: every lane ends, the chains and sinks drain (windows flush).
    Stop,
    /// Take checkpoint `e`.
    Barrier(Epoch),
    /// Pause every lane, then take checkpoint `e`; wait for `Exit` afterwards.
    FinalBarrier(Epoch),
    /// Leave now, cleanly (after a final checkpoint was committed).
    Exit,
    /// Leave at once, dropping everything in flight.
    Abort,
}

/// Capacity of each driver's control channel. Enough because at most three messages can
/// wait in it: one barrier (`Barrier` or `FinalBarrier`: the next is sent only after the
/// driver acked the previous or finished), at most one `Stop` (sent once, and only without
/// checkpoints), one `Exit` (sent once, after the final checkpoint the driver acked) and
/// one `Abort` (the run's outcome is then set, and nothing more is sent).
pub(crate) const CONTROL_CAPACITY: usize = 4;
pub(crate) const CONTROL_ARGUMENT: &str =
    "a driver's control channel holds at most one barrier, one stop, one exit and one abort";

/// Room per driver in the events channel. Enough because a driver has at most two events
/// outstanding: the ack of the one barrier in flight (the next barrier comes only after
/// the controller handled it) and its one final event (`Finished`, `Fatal` or `Aborted`).
pub(crate) const EVENTS_PER_DRIVER: usize = 4;
pub(crate) const EVENTS_ARGUMENT: &str = "a driver has at most one ack and one final event outstanding";

/// What a driver tells the controller: any number of `Acked`, then exactly one of the
/// others.
#[derive(Debug)]
pub(crate) enum DriverEvent {
    /// Every live segment passed barrier `epoch`.
    Acked {
        thread: u32,
        epoch: Epoch,
        slice: ManifestSlice,
    },
    /// Every flow ended; `slice` holds the final lane positions and the sinks' last
    /// pre-commit records (empty when checkpoints are off).
    Finished {
        thread: u32,
        slice: ManifestSlice,
    },
    Fatal {
        thread: u32,
        component: String,
        error: SluiceError,
    },
    Aborted {
        thread: u32,
    },
}

/// Most messages a segment takes from its input per turn, so one busy segment cannot
/// starve the others (a message on the control channel ends a burst early).
const INPUT_BURST_MESSAGES: usize = 64;
/// Longest idle wait when nothing else bounds it; the Select wakes earlier on any event.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(100);

/// How soon a driver whose sources are held back looks again whether they still are.
const HELD_RECHECK: Duration = Duration::from_millis(5);
/// Longest idle wait while a lane is held for watermark alignment (the slowest lane may
/// be on another thread, whose progress does not wake this one).
const ALIGNMENT_RECHECK: Duration = Duration::from_millis(1);
/// Longest time a busy thread goes without flushing its operators' mini-batches
/// ([`crate::Operator::on_flush`]); an idle thread flushes before it waits.
pub const MINI_BATCH_LATENCY: Duration = Duration::from_millis(100);
/// Longest wait, once every flow ended, for the checkpoint still writing an ended
/// segment's last snapshot: its state is then taken again as a delta of that snapshot
/// (or not at all) instead of whole. Past it, the final checkpoint takes it whole.
const FINAL_SNAPSHOT_WAIT_MAX: Duration = Duration::from_secs(60);
/// How often that wait looks at the snapshots' flags (it wakes at once on a control
/// message).
const FINAL_SNAPSHOT_RECHECK: Duration = Duration::from_millis(2);

pub(crate) struct LaneSetup {
    pub source: usize,
    pub lane: u32,
}

pub(crate) enum OutputSetup {
    Exchange(ExchangeOutput),
    Sink { sink: usize },
}

pub(crate) struct SegmentSetup {
    /// Where the segment sits in the plan (its operators' state ids).
    pub place: SegmentPlace,
    pub chain: Chain,
    pub input: Option<ExchangeInput>,
    pub output: OutputSetup,
    /// The taps of later flows reading this segment's output (`plan::Tap`).
    pub taps: Vec<ExchangeOutput>,
}

/// An input of a flow: the segment that reads one table's rows from the lanes.
pub(crate) struct EntrySetup {
    pub source: usize,
    pub table: usize,
    pub segment: usize,
}

/// One thread's instance of a flow: every segment (numbered as in `plan::Flow`) and the
/// entries, the trunk's first.
pub(crate) struct FlowSetup {
    pub entries: Vec<EntrySetup>,
    pub name: String,
    pub segments: Vec<SegmentSetup>,
}

/// Everything a driver thread owns.
pub(crate) struct Driver {
    pub thread: u32,
    pub threads: u32,
    pub batch_size: usize,
    pub plan: crate::plan::Plan,
    pub lanes: Vec<LaneSetup>,
    pub flows: Vec<FlowSetup>,
    pub control: Receiver<Control>,
    pub events: Sender<DriverEvent>,
    pub metrics: Arc<Metrics>,
    /// Where each lane resumes, from a restored checkpoint.
    pub start_positions: Arc<HashMap<(usize, u32), Vec<u8>>>,
    /// Sinks stage their output per epoch (checkpoints are on, either guarantee).
    pub staged: bool,
    /// Checkpoints are on: lanes report positions and sinks pre-commit at the end.
    pub checkpoints: bool,
    /// The first epoch this run may use (one past the restored one).
    pub first_epoch: u64,
    /// While set, no lane is polled (an operator paused the job); rows in flight still
    /// drain and barriers still pass.
    pub paused: Arc<std::sync::atomic::AtomicBool>,
    /// While set, no lane is polled either: state that only a checkpoint's commit frees
    /// is over its share of the memory budget ([`crate::StopHandle::hold_sources`]).
    pub held: Arc<std::sync::atomic::AtomicBool>,
}

struct LaneRun {
    source: usize,
    lane: u32,
    /// See [`crate::SourceFactory::max_watermark_drift`].
    max_drift: Option<TimestampMs>,
    /// Not polled last turn: too far ahead of the source's slowest lane.
    aligning: bool,
    reader: Box<dyn LaneReader>,
    wait_until: Option<Instant>,
    exhausted: bool,
    /// Not polled any more, but not ended: a final barrier was taken after it.
    paused: bool,
    /// Not polled until this driver injects the next barrier (the
    /// `source.barrier_after_batch` failpoint: one epoch per batch, for crash tests whose
    /// number of checkpoints must not depend on timing).
    held: bool,
}

enum Output {
    Exchange(ExchangeOutput),
    Sink {
        sink: usize,
        writer: Option<Box<dyn SinkWriter>>,
        /// The writer stages its output per epoch: its rows count as out when committed.
        staged: bool,
        /// Rows written since the writer's last pre-commit (staged writers only).
        staged_rows: u64,
    },
}

struct SegmentRun {
    place: SegmentPlace,
    /// The flow's entry this segment reads from the lanes (None: fed by an exchange).
    entry: Option<usize>,
    chain: Chain,
    input: Option<ExchangeInput>,
    output: Output,
    /// Further outputs: the taps of the flows sharing this segment's stream, each sent
    /// every message the output is sent.
    taps: Vec<ExchangeOutput>,
    /// The last barrier that passed this segment.
    barrier_passed: Option<Epoch>,
    /// End-of-data passed this segment.
    ended: bool,
    /// Whether the chain's state was snapshotted after end-of-data passed it (see
    /// [`DriverState::snapshot_ended`]).
    end_snapshot: EndSnapshot,
}

impl SegmentRun {
    /// Whether the segment may take a message or a flush: its outputs are empty and its
    /// chain holds no output to come.
    fn can_accept(&self) -> bool {
        self.outputs_empty() && !self.chain.has_more()
    }

    /// Whether everything the segment emitted left it (its exchange and taps are empty).
    fn outputs_empty(&self) -> bool {
        let output = match &self.output {
            Output::Exchange(exchange) => exchange.is_empty(),
            Output::Sink { .. } => true,
        };
        output && self.taps.iter().all(ExchangeOutput::is_empty)
    }

    /// Every exchange this segment writes: its output's, then its taps.
    fn exchanges(&self) -> impl Iterator<Item = &ExchangeOutput> {
        let output = match &self.output {
            Output::Exchange(exchange) => Some(exchange),
            Output::Sink { .. } => None,
        };
        output.into_iter().chain(&self.taps)
    }
}

/// Whether a segment's state was snapshotted after end-of-data passed it, and into which
/// barrier's slice (None: the driver's final slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndSnapshot {
    NotTaken,
    TakenInto(Option<Epoch>),
}

/// An input of a flow on this thread.
struct Entry {
    source: usize,
    table: usize,
    /// The segment its rows enter.
    segment: usize,
    /// The segment received end-of-data from the lanes.
    input_ended: bool,
    watermark: TimestampMs,
}

struct FlowRun {
    name: String,
    segments: Vec<SegmentRun>,
    entries: Vec<Entry>,
    /// The sink's writer closed: this flow is done on this thread.
    finished: bool,
}

impl FlowRun {
    /// Whether segment `index` may still take part in a barrier: an entry segment until
    /// its lanes ended, any other until end-of-data passed it.
    fn is_live(&self, index: usize) -> bool {
        let segment = &self.segments[index];
        match segment.entry {
            // Until its chain emitted the end too (it may hold a part of the end's output).
            Some(entry) => !self.entries[entry].input_ended || !segment.ended,
            None => !segment.ended,
        }
    }
}

impl Driver {
    /// Runs until every flow finished, a failure, or an abort; reports exactly one event.
    /// A panic (a bug in an operator, a connector or here) is caught and reported as a
    /// fatal error with its message: the run fails at once instead of going on without
    /// this thread.
    pub(crate) fn run(self) {
        let thread = self.thread;
        let events = self.events.clone();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start_and_run()));
        let event = match ran {
            Ok(Ok(Some(slice))) => {
                tracing::debug!(thread, "driver finished");
                DriverEvent::Finished { thread, slice }
            }
            Ok(Ok(None)) => DriverEvent::Aborted { thread },
            Ok(Err((component, error))) => DriverEvent::Fatal { thread, component, error },
            Err(panic) => {
                let message = format!("driver thread {thread} panicked: {}", panic_message(&*panic));
                let error = SluiceError::internal("run.panic", message).with_kind(ErrorKind::Panic);
                DriverEvent::Fatal { thread, component: format!("driver {thread}"), error }
            }
        };
        // The controller outlives the drivers; if it is gone there is no one to tell.
        let _gone = post(&events, event, EVENTS_ARGUMENT);
    }

    fn start_and_run(self) -> Result<Option<ManifestSlice>, (String, SluiceError)> {
        let mut lanes = Vec::new();
        for setup in &self.lanes {
            let source = &self.plan.sources[setup.source];
            let tables_needed = (0..source.tables().len())
                .map(|table| {
                    self.flows.iter().flat_map(|f| &f.entries).any(|e| e.source == setup.source && e.table == table)
                })
                .collect();
            let context = LaneContext {
                lane: setup.lane,
                batch_size: self.batch_size,
                tables_needed,
                metrics: Arc::clone(&self.metrics.sources[setup.source]),
                start: self.start_positions.get(&(setup.source, setup.lane)).cloned(),
            };
            let reader = source
                .open_lane(context)
                .map_err(|error| (format!("source {} lane {}", source.name(), setup.lane), error))?;
            lanes.push(LaneRun {
                source: setup.source,
                lane: setup.lane,
                max_drift: source.max_watermark_drift(),
                aligning: false,
                reader,
                wait_until: None,
                exhausted: false,
                paused: false,
                held: false,
            });
        }
        let mut flows = Vec::new();
        for flow in self.flows {
            let mut segments = Vec::new();
            for (index, segment) in flow.segments.into_iter().enumerate() {
                let output = match segment.output {
                    OutputSetup::Exchange(exchange) => Output::Exchange(exchange),
                    OutputSetup::Sink { sink } => {
                        let factory = &self.plan.flows[sink].sink;
                        let open = factory.parallelism() == SinkParallelism::PerThread
                            || self.thread == self.plan.flows[sink].sink_slot;
                        let staged = self.staged && factory.exactly_once();
                        let writer = if open {
                            Some(
                                factory
                                    .open(self.thread, self.threads, staged)
                                    .map_err(|e| (format!("sink {}", factory.name()), e))?,
                            )
                        } else {
                            None
                        };
                        Output::Sink { sink, writer, staged, staged_rows: 0 }
                    }
                };
                segments.push(SegmentRun {
                    place: segment.place,
                    entry: flow.entries.iter().position(|entry| entry.segment == index),
                    chain: segment.chain,
                    input: segment.input,
                    output,
                    taps: segment.taps,
                    barrier_passed: None,
                    ended: false,
                    end_snapshot: EndSnapshot::NotTaken,
                });
            }
            let entries = flow
                .entries
                .iter()
                .map(|entry| Entry {
                    source: entry.source,
                    table: entry.table,
                    segment: entry.segment,
                    input_ended: false,
                    watermark: NO_WATERMARK,
                })
                .collect();
            flows.push(FlowRun { name: flow.name, segments, entries, finished: false });
        }
        let local_lanes = self.metrics.sources.iter().map(|source| source.local_lane_mask()).collect();
        let mut state = DriverState {
            local_lanes,
            thread: self.thread,
            lanes,
            flows,
            metrics: self.metrics,
            scratch: Vec::new(),
            events: self.events,
            pending: None,
            checkpoints: self.checkpoints,
            next_epoch: Epoch(self.first_epoch),
            final_records: Vec::new(),
            stopping: false,
            control: self.control,
            longest_step_us: 0,
            last_flush: Instant::now(),
            paused: self.paused,
            held: self.held,
            restored: !self.start_positions.is_empty(),
            final_wait: None,
            waiting_control: VecDeque::new(),
        };
        state.run()
    }
}

/// A barrier travelling through this driver's segments. It can reach a segment fed by
/// an exchange before this driver's own `Barrier` control message arrives (another
/// driver injected first): the pending barrier then exists before it is injected here.
struct PendingBarrier {
    epoch: Epoch,
    /// This driver recorded its lanes' positions and injected the barrier.
    injected: bool,
    slice: ManifestSlice,
}

struct DriverState {
    /// Set while the job is paused: lanes are not polled.
    paused: Arc<std::sync::atomic::AtomicBool>,
    /// Set while the sources are held back for memory: lanes are not polled.
    held: Arc<std::sync::atomic::AtomicBool>,
    thread: u32,
    lanes: Vec<LaneRun>,
    flows: Vec<FlowRun>,
    metrics: Arc<Metrics>,
    scratch: Vec<Message>,
    events: Sender<DriverEvent>,
    pending: Option<PendingBarrier>,
    checkpoints: bool,
    /// The epoch after the last barrier seen: what a sink pre-commits at end-of-data.
    next_epoch: Epoch,
    /// The sinks' pre-commit records taken at end-of-data.
    final_records: Vec<SinkRecord>,
    /// A final barrier was taken: drivers leave on `Exit` in any order, so a sender that
    /// disappears without ending its output is expected, not a failure.
    stopping: bool,
    /// The control channel, also watched during input bursts: a waiting barrier cuts
    /// the burst short, so the pause it measures does not include a whole turn.
    control: Receiver<Control>,
    /// The longest step so far, published to the metrics only when it grows.
    longest_step_us: u64,
    /// When the operators' mini-batches were last flushed.
    last_flush: Instant,
    /// Per source, the lanes this worker reads: only they take part in watermark
    /// alignment (the leader's metrics also receive finished workers' lanes).
    local_lanes: Vec<Vec<bool>>,
    /// The run resumed from a checkpoint.
    restored: bool,
    /// Since when the final slice waits for an ended segment's snapshot in flight.
    final_wait: Option<Instant>,
    /// Barriers and stops received while a segment fed by the lanes still held a
    /// watermark's output ([`Chain::has_more`]): they go in after it, in order (the
    /// controller sends one barrier at a time, so a few at most).
    waiting_control: VecDeque<Control>,
}

type Failure = (String, SluiceError);

impl DriverState {
    /// Runs the loop; returns the final slice when every flow ended (or on `Exit`), None
    /// on an abort.
    fn run(&mut self) -> Result<Option<ManifestSlice>, Failure> {
        self.end_sources_without_lanes()?;
        if self.restored {
            // The lanes' restored watermark goes out before anything else, a barrier
            // already waiting on the control channel included (see `exchange`): first
            // what the lanes answer without reading input (their watermark, or that
            // they had ended), even while the job is paused; then, unless it is, one
            // poll of each other lane (one that had ended says so before any lane's
            // rows go out; one that reads rows had no watermark, nor had the thread).
            let answered = self.take_resumed_answers()?;
            if !self.lanes_stopped() {
                for index in (0..self.lanes.len()).filter(|&index| !answered[index]) {
                    self.poll_lane(index)?;
                }
            }
        }
        loop {
            match self.control.try_recv() {
                Ok(Control::Exit) => return Ok(Some(ManifestSlice::default())),
                Ok(Control::Abort) | Err(TryRecvError::Disconnected) => return Ok(None),
                Ok(control) => self.waiting_control.push_back(control),
                Err(TryRecvError::Empty) => {}
            }
            // A barrier or a stop goes into the lanes' segments after the output they
            // still hold: it must follow every row of the input before it.
            let mut progressed = false;
            if !self.waiting_control.is_empty() && !self.entries_hold_output() {
                progressed = true;
                match self.waiting_control.pop_front().expect("checked above") {
                    Control::Stop => self.stop_lanes()?,
                    Control::Barrier(epoch) => self.inject_barrier(epoch)?,
                    Control::FinalBarrier(epoch) => {
                        self.lanes.iter_mut().for_each(|lane| lane.paused = true);
                        self.stopping = true;
                        self.inject_barrier(epoch)?;
                    }
                    Control::Exit | Control::Abort => unreachable!("acted on when received"),
                }
            }
            progressed |= self.run_segments()?;
            progressed |= self.poll_lanes()?;
            if self.flows.iter().all(|flow| flow.finished) && self.outboxes_empty() && self.pending.is_none() {
                if self.awaits_snapshot_in_flight() {
                    continue;
                }
                return self.final_slice().map(Some);
            }
            // Held mini-batches leave before the thread waits for input, and at least
            // every MINI_BATCH_LATENCY while it is busy.
            if !progressed || self.last_flush.elapsed() >= MINI_BATCH_LATENCY {
                self.last_flush = Instant::now();
                progressed |= self.flush_segments()?;
            }
            if !progressed {
                self.wait_idle();
            }
        }
    }

    /// Whether the final slice waits a little longer: an ended segment's last snapshot
    /// is still being written by the checkpoint before. Taken now, its state would be
    /// taken whole (a delta follows only a written snapshot); once that checkpoint has
    /// written it, the segment needs nothing more, and if it fails, the final slice
    /// takes it whole as before. Waits at most [`FINAL_SNAPSHOT_WAIT_MAX`] in all, in
    /// steps that a control message (an abort, a barrier) ends at once.
    fn awaits_snapshot_in_flight(&mut self) -> bool {
        let in_flight = self.checkpoints
            && self.flows.iter().flat_map(|flow| &flow.segments).any(|segment| segment.chain.snapshot_in_flight());
        if !in_flight {
            return false;
        }
        let since = *self.final_wait.get_or_insert_with(Instant::now);
        if since.elapsed() >= FINAL_SNAPSHOT_WAIT_MAX {
            return false;
        }
        let mut select = Select::new();
        select.recv(&self.control);
        let _ = select.ready_timeout(FINAL_SNAPSHOT_RECHECK);
        true
    }

    /// The lanes' final positions, the sinks' end-of-data records and the final state of
    /// the segments whose last snapshot is not written yet.
    fn final_slice(&mut self) -> Result<ManifestSlice, Failure> {
        let mut slice = ManifestSlice::default();
        if self.checkpoints {
            slice.positions = self.positions();
            slice.sink_records = std::mem::take(&mut self.final_records);
            slice.deferred = self.snapshot_ended(None).map_err(|e| ("the final checkpoint's state".to_string(), e))?;
        }
        Ok(slice)
    }

    /// The state of each segment that end-of-data passed, for a slice whose positions are
    /// taken after that (a barrier in flight that the segment never passed, the next
    /// barrier, or the final slice): such a segment passes no barrier any more, yet the
    /// rows it took after its last barrier are in its state, and the manifests after it
    /// hold its lanes' final positions. Its state no longer changes, so it is taken once,
    /// and again, into a later slice (`into`, None for the final one), only while the
    /// last one taken is not written (a failed checkpoint: the chain's next snapshot is
    /// then full). A segment that passed `into`'s barrier before it ended is left to the
    /// next slice.
    fn snapshot_ended(&mut self, into: Option<Epoch>) -> Result<Vec<DeferredState>, SluiceError> {
        let mut states = Vec::new();
        for flow in &mut self.flows {
            for segment in &mut flow.segments {
                let due = match segment.end_snapshot {
                    EndSnapshot::NotTaken => true,
                    // Once per slice: two snapshots of one instance in one epoch would be
                    // written to one object.
                    EndSnapshot::TakenInto(taken) => !segment.chain.all_written() && (taken != into || into.is_none()),
                };
                // A segment that passed this slice's barrier before it ended holds rows
                // after the barrier: its state is the next slice's.
                let passed = into.is_some() && segment.barrier_passed == into;
                if !segment.ended || !due || passed {
                    continue;
                }
                segment.end_snapshot = EndSnapshot::TakenInto(into);
                let vnodes = segment.chain.vnodes();
                for (operator, snapshot, guard) in segment.chain.snapshot()? {
                    let operator = operator_id(segment.place, operator);
                    states.push(DeferredState { operator, vnodes: vnodes.clone(), snapshot, guard });
                }
            }
        }
        Ok(states)
    }

    fn positions(&self) -> Vec<LanePosition> {
        self.lanes
            .iter()
            .map(|lane| LanePosition { source: lane.source, lane: lane.lane, bytes: lane.reader.position() })
            .collect()
    }

    /// Records every lane's position, then sends barrier `epoch` into every live flow.
    fn inject_barrier(&mut self, epoch: Epoch) -> Result<(), Failure> {
        self.next_epoch = Epoch(epoch.0 + 1);
        self.lanes.iter_mut().for_each(|lane| lane.held = false);
        let positions = self.positions();
        let pending = self.pending_for(epoch)?;
        assert!(!pending.injected, "barrier {epoch:?} injected twice");
        pending.injected = true;
        pending.slice.positions = positions;
        for index in 0..self.flows.len() {
            for entry in 0..self.flows[index].entries.len() {
                let entry = &self.flows[index].entries[entry];
                if !entry.input_ended {
                    let segment = entry.segment;
                    self.feed_segment(index, segment, Some((0, Message::Barrier(epoch))))?;
                }
            }
        }
        self.maybe_ack();
        Ok(())
    }

    /// The pending barrier of `epoch`, created on first sight.
    fn pending_for(&mut self, epoch: Epoch) -> Result<&mut PendingBarrier, Failure> {
        if let Some(pending) = &self.pending {
            assert_eq!(pending.epoch, epoch, "one barrier in flight at a time");
        } else {
            // Its positions are taken at its injection, after every end seen so far.
            let ended = if self.checkpoints {
                self.snapshot_ended(Some(epoch)).map_err(|e| (format!("checkpoint {}'s state", epoch.0), e))?
            } else {
                Vec::new()
            };
            let slice = ManifestSlice { deferred: ended, ..ManifestSlice::default() };
            self.pending = Some(PendingBarrier { epoch, injected: false, slice });
        }
        Ok(self.pending.as_mut().expect("set above"))
    }

    /// Sends the ack once the barrier was injected here and every live segment passed it
    /// (a segment that ended without it has nothing more to contribute).
    fn maybe_ack(&mut self) {
        let Some(pending) = &self.pending else { return };
        let epoch = pending.epoch;
        let passed = self.flows.iter().all(|flow| {
            flow.segments
                .iter()
                .enumerate()
                .all(|(index, segment)| !flow.is_live(index) || segment.barrier_passed == Some(epoch))
        });
        let metrics = &self.metrics.threads[self.thread as usize];
        if !(pending.injected && passed) {
            metrics.set_barrier_at(Some(self.barrier_location(epoch, pending.injected)));
        }
        if pending.injected && passed {
            metrics.set_barrier_at(None);
            let pending = self.pending.take().expect("checked above");
            // The controller outlives the drivers; a closed channel means it gave up.
            let acked = DriverEvent::Acked { thread: self.thread, epoch: pending.epoch, slice: pending.slice };
            let _gone = post(&self.events, acked, EVENTS_ARGUMENT);
        }
    }

    /// Where barrier `epoch` waits on this thread, in words, for a timeout's message.
    fn barrier_location(&self, epoch: Epoch, injected: bool) -> String {
        if !injected {
            return format!("has not injected barrier {} into its lanes yet", epoch.0);
        }
        for flow in &self.flows {
            for (index, segment) in flow.segments.iter().enumerate() {
                if flow.is_live(index) && segment.barrier_passed != Some(epoch) {
                    let what = if segment.entry.is_some() {
                        "its lanes' output"
                    } else {
                        "an exchange (a sender not aligned)"
                    };
                    return format!(
                        "waits at flow to sink `{}`, segment {index} ({}), fed by {what}",
                        flow.name,
                        segment.chain.describe()
                    );
                }
            }
        }
        "passed every segment".to_string()
    }

    /// Flows whose source has no lane on this thread end at once, so they hold back no
    /// watermark and the exchanges after them see this thread's end-of-data.
    fn end_sources_without_lanes(&mut self) -> Result<(), Failure> {
        let mut sources: Vec<usize> = self.flows.iter().flat_map(|f| &f.entries).map(|e| e.source).collect();
        sources.sort_unstable();
        sources.dedup();
        for source in sources {
            if !self.lanes.iter().any(|lane| lane.source == source) {
                self.end_source(source)?;
            }
        }
        Ok(())
    }

    fn stop_lanes(&mut self) -> Result<(), Failure> {
        let mut sources = Vec::new();
        for lane in &mut self.lanes {
            if !lane.exhausted {
                lane.exhausted = true;
                self.metrics.sources[lane.source].lane_ended[lane.lane as usize].store(true, Ordering::Relaxed);
                sources.push(lane.source);
            }
        }
        sources.sort_unstable();
        sources.dedup();
        for source in sources {
            self.end_source(source)?;
        }
        Ok(())
    }

    /// One pass over every segment, downstream first. Returns whether anything moved.
    fn run_segments(&mut self) -> Result<bool, Failure> {
        let mut progressed = false;
        for flow in 0..self.flows.len() {
            for index in (0..self.flows[flow].segments.len()).rev() {
                let component = |name: &str| format!("flow to {name} (segment {index})");
                let segment = &mut self.flows[flow].segments[index];
                if let Output::Exchange(exchange) = &mut segment.output {
                    let flushed = exchange.flush().map_err(|e| (component(&self.flows[flow].name), e))?;
                    progressed |= flushed;
                }
                let run = &mut self.flows[flow];
                for tap in &mut run.segments[index].taps {
                    progressed |= tap.flush().map_err(|e| (component(&run.name), e))?;
                }
                // Held output goes on a part at a time, each once the previous one left.
                let segment = &self.flows[flow].segments[index];
                if segment.chain.has_more() && segment.outputs_empty() {
                    progressed = true;
                    self.feed_segment(flow, index, None)?;
                    continue;
                }
                for _ in 0..INPUT_BURST_MESSAGES {
                    let segment = &mut self.flows[flow].segments[index];
                    if !segment.can_accept() || !self.control.is_empty() {
                        break;
                    }
                    let Some(input) = segment.input.as_mut() else { break };
                    let polled = match input.poll() {
                        Err(error) if self.stopping && error.kind == ErrorKind::LostPeer => Ok(None),
                        other => other,
                    };
                    let polled = polled.map_err(|e| (component(&self.flows[flow].name), e))?;
                    let Some((port, message)) = polled else { break };
                    progressed = true;
                    self.feed_segment(flow, index, Some((port, message)))?;
                }
            }
        }
        Ok(progressed)
    }

    /// Pushes a message, from input `port`, through segment `index` of flow `flow` (None:
    /// the next part of the output its chain holds) and accounts for what passed: the
    /// sink closing, end-of-data, a barrier's snapshot and record.
    fn feed_segment(&mut self, flow: usize, index: usize, input: Option<(usize, Message)>) -> Result<(), Failure> {
        if input.is_some() {
            // The held output goes first, whole: what feeds a segment by the lanes waits
            // until its chain holds none (`can_accept`, `waiting_control`), so this is
            // only a lane's answer at a restore right after another lane's watermark.
            while self.flows[flow].segments[index].chain.has_more() {
                self.feed_segment(flow, index, None)?;
            }
        }
        let run = &mut self.flows[flow];
        let segment = &mut run.segments[index];
        // The epoch a sink's last rows are staged under: after every barrier this
        // segment passed. A barrier can pass it before this driver took that barrier from
        // its controller (its own input ended, so the exchange aligned on the others'
        // barriers); `next_epoch` alone would then stage the last rows under an epoch the
        // sink already pre-committed, and a file sink's second staged file of that epoch
        // would replace the first.
        let end_epoch = Epoch(self.next_epoch.0.max(segment.barrier_passed.map_or(0, |passed| passed.0 + 1)));
        let started = Instant::now();
        let fed = feed(segment, input, &mut self.scratch, &self.metrics, self.checkpoints, end_epoch)
            .map_err(|e| (format!("flow to {} (segment {index})", run.name), e))?;
        let step_us = started.elapsed().as_micros() as u64;
        if step_us > self.longest_step_us {
            self.longest_step_us = step_us;
            self.metrics.threads[self.thread as usize].longest_step_us.store(step_us, Ordering::Relaxed);
        }
        run.finished |= fed.finished;
        if fed.chain_ended {
            segment.ended = true;
            if let Some(record) = fed.end_record {
                self.final_records.push(SinkRecord { flow, epoch: end_epoch.0, record: record.0, rows: record.1 });
            }
        }
        if fed.chain_ended && self.checkpoints {
            // A barrier in flight here that this segment never passed (every input of it
            // ended first) has positions at or past the end: the final state is its.
            let unpassed =
                self.pending.as_ref().is_some_and(|p| self.flows[flow].segments[index].barrier_passed != Some(p.epoch));
            if unpassed {
                let epoch = self.pending.as_ref().map(|p| p.epoch);
                let states = self
                    .snapshot_ended(epoch)
                    .map_err(|e| (format!("flow to {} (segment {index})", self.flows[flow].name), e))?;
                self.pending.as_mut().expect("checked above").slice.deferred.extend(states);
            }
        }
        let barrier = fed.barrier.is_some() || fed.chain_ended;
        if let Some((epoch, states, record)) = fed.barrier {
            self.flows[flow].segments[index].barrier_passed = Some(epoch);
            let place = self.flows[flow].segments[index].place;
            let vnodes = self.flows[flow].segments[index].chain.vnodes();
            let pending = self.pending_for(epoch)?;
            for (operator, snapshot, guard) in states {
                let (operator, vnodes) = (operator_id(place, operator), vnodes.clone());
                pending.slice.deferred.push(DeferredState { operator, vnodes, snapshot, guard });
            }
            if let Some(record) = record {
                let (record, rows) = record;
                pending.slice.sink_records.push(SinkRecord { flow, epoch: pending.epoch.0, record, rows });
            }
        }
        if barrier {
            self.maybe_ack();
        }
        Ok(())
    }

    /// Flushes the mini-batches held in every live segment that can take output
    /// ([`Chain::flush`]). Returns whether anything was emitted.
    fn flush_segments(&mut self) -> Result<bool, Failure> {
        let mut emitted = false;
        for flow in 0..self.flows.len() {
            for index in 0..self.flows[flow].segments.len() {
                if self.flows[flow].finished || !self.flows[flow].is_live(index) {
                    continue;
                }
                let run = &mut self.flows[flow];
                let component = |e| (format!("flow to {} (segment {index})", run.name), e);
                let segment = &mut run.segments[index];
                if !segment.can_accept() {
                    continue;
                }
                segment.chain.flush(&mut self.scratch).map_err(component)?;
                if self.scratch.is_empty() {
                    continue;
                }
                emitted = true;
                let (scratch, fed) = (&mut self.scratch, &mut Fed::default());
                route(segment, scratch, &self.metrics, fed, self.checkpoints, self.next_epoch).map_err(component)?;
            }
        }
        Ok(emitted)
    }

    /// Whether every message this thread produced left it (end-of-data included), so
    /// exiting loses nothing.
    fn outboxes_empty(&self) -> bool {
        self.flows.iter().flat_map(|f| &f.segments).all(|segment| segment.can_accept())
    }

    /// Whether a segment fed by the lanes holds output to come ([`Chain::has_more`]).
    fn entries_hold_output(&self) -> bool {
        self.flows
            .iter()
            .flat_map(|flow| &flow.segments)
            .any(|segment| segment.entry.is_some() && segment.chain.has_more())
    }

    fn source_blocked(&self, source: usize) -> bool {
        self.flows.iter().any(|flow| {
            flow.entries.iter().any(|entry| entry.source == source && !flow.segments[entry.segment].can_accept())
        })
    }

    fn poll_lanes(&mut self) -> Result<bool, Failure> {
        if self.lanes_stopped() {
            // Resuming is noticed within an idle wait (bounded).
            self.lanes.iter_mut().for_each(|lane| lane.aligning = false);
            return Ok(false);
        }
        let mut progressed = false;
        let now = Instant::now();
        for index in 0..self.lanes.len() {
            self.lanes[index].aligning = false;
            let lane = &self.lanes[index];
            if lane.exhausted || lane.paused || lane.held || lane.wait_until.is_some_and(|until| until > now) {
                continue;
            }
            if self.source_blocked(lane.source) {
                self.lanes[index].reader.blocked();
                continue;
            }
            if self.ahead_of_slowest_lane(index) {
                self.lanes[index].aligning = true;
                self.lanes[index].reader.blocked();
                continue;
            }
            progressed = true;
            self.poll_lane(index)?;
        }
        Ok(progressed)
    }

    /// Whether lane `index` is further ahead of its source's slowest live lane on this
    /// worker than the source allows ([`crate::SourceFactory::max_watermark_drift`]).
    fn ahead_of_slowest_lane(&self, index: usize) -> bool {
        let lane = &self.lanes[index];
        let Some(drift) = lane.max_drift else { return false };
        let metrics = &self.metrics.sources[lane.source];
        let own = metrics.lane_watermarks[lane.lane as usize].load(Ordering::Relaxed);
        if own == NO_WATERMARK {
            return false;
        }
        let local = &self.local_lanes[lane.source];
        let slowest = (metrics.lane_watermarks.iter().zip(&metrics.lane_ended).zip(local))
            .filter(|((_, ended), local)| **local && !ended.load(Ordering::Relaxed))
            .map(|((watermark, _), _)| watermark.load(Ordering::Relaxed))
            .filter(|&watermark| watermark != NO_WATERMARK)
            .min();
        slowest.is_some_and(|slowest| own > slowest.saturating_add(drift))
    }

    fn poll_lane(&mut self, index: usize) -> Result<(), Failure> {
        let lane = &mut self.lanes[index];
        let poll = lane.reader.poll();
        let poll =
            poll.map_err(|e| (format!("source {} lane {}", self.metrics.sources[lane.source].name, lane.lane), e))?;
        self.take_answer(index, poll)
    }

    /// Sends on what lane `index` answered.
    fn take_answer(&mut self, index: usize, poll: LanePoll) -> Result<(), Failure> {
        let lane = &mut self.lanes[index];
        let source = lane.source;
        match poll {
            LanePoll::Data { batches, watermark } => {
                lane.wait_until = None;
                let rows: usize = batches.iter().map(|(_, batch)| batch.num_rows()).sum();
                self.metrics.sources[source].rows.fetch_add(rows as u64, Ordering::Relaxed);
                lane.held = rows > 0 && self.checkpoints && failpoint::triggered("source.barrier_after_batch");
                if let Some(watermark) = watermark {
                    self.metrics.sources[source].lane_watermarks[lane.lane as usize]
                        .store(watermark, Ordering::Relaxed);
                }
                for (table, batch) in batches {
                    self.feed_flows(source, Some(table), Message::Data(Batch::inserts(batch)))?;
                }
                if watermark.is_some() {
                    self.advance_source_watermark(source)?;
                }
            }
            LanePoll::Wait(until) => lane.wait_until = Some(until),
            LanePoll::Exhausted => {
                lane.exhausted = true;
                self.metrics.sources[source].lane_ended[lane.lane as usize].store(true, Ordering::Relaxed);
                if self.lanes.iter().filter(|l| l.source == source).all(|l| l.exhausted) {
                    self.end_source(source)?;
                } else {
                    self.advance_source_watermark(source)?;
                }
            }
        }
        Ok(())
    }

    /// Takes what every lane resumed from a position answers without reading input
    /// ([`crate::plan::LaneReader::resumed`]); returns which lanes answered.
    fn take_resumed_answers(&mut self) -> Result<Vec<bool>, Failure> {
        let mut answered = vec![false; self.lanes.len()];
        for (index, answered) in answered.iter_mut().enumerate() {
            if let Some(answer) = self.lanes[index].reader.resumed() {
                *answered = true;
                self.take_answer(index, answer)?;
            }
        }
        Ok(answered)
    }

    /// The watermark of a source on this thread: the lowest of its live lanes.
    fn advance_source_watermark(&mut self, source: usize) -> Result<(), Failure> {
        let metrics = &self.metrics.sources[source];
        let lowest = self
            .lanes
            .iter()
            .filter(|lane| lane.source == source && !lane.exhausted)
            .map(|lane| metrics.lane_watermarks[lane.lane as usize].load(Ordering::Relaxed))
            .min();
        let Some(lowest) = lowest else { return Ok(()) };
        if lowest == NO_WATERMARK {
            return Ok(());
        }
        // Lanes promise nothing below their watermark; the stream's watermark promises
        // nothing at or below it (plan.rs, `LanePoll::Data`).
        let watermark = lowest.saturating_sub(1);
        for index in 0..self.flows.len() {
            for entry in 0..self.flows[index].entries.len() {
                let entry = &mut self.flows[index].entries[entry];
                if entry.source == source && !entry.input_ended && watermark > entry.watermark {
                    entry.watermark = watermark;
                    let segment = entry.segment;
                    self.feed_segment(index, segment, Some((0, Message::Watermark(watermark))))?;
                }
            }
        }
        Ok(())
    }

    fn end_source(&mut self, source: usize) -> Result<(), Failure> {
        for index in 0..self.flows.len() {
            for entry in 0..self.flows[index].entries.len() {
                let entry = &mut self.flows[index].entries[entry];
                if entry.source == source && !entry.input_ended {
                    entry.input_ended = true;
                    let segment = entry.segment;
                    self.feed_segment(index, segment, Some((0, Message::EndOfData)))?;
                }
            }
        }
        Ok(())
    }

    fn feed_flows(&mut self, source: usize, table: Option<usize>, message: Message) -> Result<(), Failure> {
        for index in 0..self.flows.len() {
            for entry in 0..self.flows[index].entries.len() {
                let entry = &self.flows[index].entries[entry];
                if entry.source == source && table.is_none_or(|t| entry.table == t) {
                    let segment = entry.segment;
                    self.feed_segment(index, segment, Some((0, message.clone())))?;
                }
            }
        }
        Ok(())
    }

    /// No lane is polled now: the job is paused, or its sources are held back.
    fn lanes_stopped(&self) -> bool {
        self.paused.load(Ordering::Relaxed) || self.held.load(Ordering::Relaxed)
    }

    fn wait_idle(&self) {
        let now = Instant::now();
        let wake = self
            .lanes
            .iter()
            .filter(|lane| !lane.exhausted && !lane.paused && !lane.held)
            .filter_map(|lane| lane.wait_until)
            .min();
        let mut timeout = wake.map_or(IDLE_WAIT_MAX, |wake| wake.saturating_duration_since(now).min(IDLE_WAIT_MAX));
        if self.lanes.iter().any(|lane| lane.aligning && !lane.exhausted && !lane.paused) {
            timeout = timeout.min(ALIGNMENT_RECHECK);
        }
        // A hold ends at a commit, which nothing here is woken by: look again soon.
        if self.held.load(Ordering::Relaxed) {
            timeout = timeout.min(HELD_RECHECK);
        }
        let mut select = Select::new();
        select.recv(&self.control);
        for flow in &self.flows {
            for segment in &flow.segments {
                for exchange in segment.exchanges() {
                    exchange.register(&mut select);
                }
                if let Some(input) = &segment.input
                    && segment.can_accept()
                    && !input.is_finished()
                {
                    input.register(&mut select);
                }
            }
        }
        // Waiting while an output queue is full is backpressure: this thread is blocked by
        // a slower consumer downstream (time waiting for input or a rate limit is not).
        let blocked = !self.outboxes_empty();
        let metrics = &self.metrics.threads[self.thread as usize];
        if blocked {
            metrics.blocked.store(true, Ordering::Relaxed);
        }
        let started = Instant::now();
        let _ = select.ready_timeout(timeout);
        if blocked {
            let waited = started.elapsed().as_nanos() as u64;
            metrics.backpressure_ns.fetch_add(waited, Ordering::Relaxed);
            metrics.blocked.store(false, Ordering::Relaxed);
            // The edges it waited on: every exchange output still holding messages.
            for segment in self.flows.iter().flat_map(|flow| &flow.segments) {
                for exchange in segment.exchanges().filter(|exchange| !exchange.is_empty()) {
                    exchange.count_blocked(waited);
                }
            }
        }
    }
}

/// What happened when a message went through a segment.
#[derive(Default)]
struct Fed {
    /// The sink closed: the flow is done on this thread.
    finished: bool,
    /// A staging sink's record for the rows since the last barrier, taken at end-of-data.
    end_record: Option<Staged>,
    /// A barrier passed: the chain's state by operator position, and the sink's record.
    barrier: Option<(Epoch, ChainStates, Option<Staged>)>,
    /// End-of-data passed the whole chain: its state is final.
    chain_ended: bool,
}

type ChainStates = crate::chain::ChainSnapshot;
/// A sink writer's pre-commit record and the number of rows it stages.
type Staged = (Vec<u8>, u64);

/// Pushes one message through a segment and routes what comes out. A barrier is
/// snapshotted at the segment's input (everything before it has been processed), then
/// forwarded; at a sink it becomes a pre-commit. At end-of-data a sink with checkpoints
/// pre-commits its last rows as epoch `next_epoch` before closing.
fn feed(
    segment: &mut SegmentRun,
    input: Option<(usize, Message)>,
    scratch: &mut Vec<Message>,
    metrics: &Metrics,
    checkpoints: bool,
    next_epoch: Epoch,
) -> Result<Fed, SluiceError> {
    let mut fed = Fed::default();
    match input {
        Some((port, message)) => {
            if let Message::Barrier(epoch) = message {
                // What the operators hold for a mini-batch leaves before the barrier: the
                // snapshot covers no change that was not emitted in this epoch.
                segment.chain.flush(scratch)?;
                fed.barrier = Some((epoch, segment.chain.snapshot()?, None));
            }
            segment.chain.push_from(port, message, scratch)?;
        }
        None => segment.chain.resume(scratch)?,
    }
    fed.chain_ended = scratch.iter().any(|m| matches!(m, Message::EndOfData));
    route(segment, scratch, metrics, &mut fed, checkpoints, next_epoch)?;
    Ok(fed)
}

/// Sends what a segment's chain emitted (`scratch`, drained) to its exchange or sink.
fn route(
    segment: &mut SegmentRun,
    scratch: &mut Vec<Message>,
    metrics: &Metrics,
    fed: &mut Fed,
    checkpoints: bool,
    next_epoch: Epoch,
) -> Result<(), SluiceError> {
    for message in scratch.drain(..) {
        // Rows are shared (Arrow buffers behind reference counts): a tap's copy is cheap.
        for tap in &mut segment.taps {
            tap.route(message.clone())?;
        }
        match &mut segment.output {
            Output::Exchange(exchange) => {
                exchange.route(message)?;
            }
            Output::Sink { sink, writer, staged, staged_rows } => match message {
                Message::Data(batch) => {
                    let writer = writer.as_mut().expect("a single-writer sink receives rows only on thread 0");
                    let written = writer.write(&batch);
                    let acknowledged = if *staged { None } else { writer.take_acknowledged_rows() };
                    // What the destination acknowledged counts even when this write failed.
                    if let Some(rows) = acknowledged {
                        metrics.sinks[*sink].rows.fetch_add(rows, Ordering::Relaxed);
                    }
                    written?;
                    metrics.sinks[*sink].bytes.fetch_add(writer.take_bytes(), Ordering::Relaxed);
                    let rows = batch.num_rows() as u64;
                    if *staged {
                        *staged_rows += rows;
                    } else if acknowledged.is_none() {
                        metrics.sinks[*sink].rows.fetch_add(rows, Ordering::Relaxed);
                    }
                }
                Message::Barrier(epoch) => {
                    if let (Some(writer), Some(barrier)) = (writer.as_mut(), fed.barrier.as_mut()) {
                        barrier.2 = Some((writer.pre_commit(epoch)?, std::mem::take(staged_rows)));
                        metrics.sinks[*sink].bytes.fetch_add(writer.take_bytes(), Ordering::Relaxed);
                    }
                }
                Message::EndOfData => {
                    if let Some(writer) = writer.as_mut() {
                        if checkpoints {
                            fed.end_record = Some((writer.pre_commit(next_epoch)?, std::mem::take(staged_rows)));
                        }
                        writer.close()?;
                        metrics.sinks[*sink].bytes.fetch_add(writer.take_bytes(), Ordering::Relaxed);
                        // What the close flushed and the destination acknowledged.
                        if let Some(rows) = writer.take_acknowledged_rows().filter(|_| !*staged) {
                            metrics.sinks[*sink].rows.fetch_add(rows, Ordering::Relaxed);
                        }
                    }
                    fed.finished = true;
                }
                Message::Watermark(_) => {}
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use sluice_types::{Batch, Epoch, Message, SluiceError};

    use super::{EndSnapshot, Output, SegmentRun, feed};
    use crate::chain::Chain;
    use crate::metrics::{Metrics, SinkMetrics};
    use crate::place::SegmentPlace;
    use crate::plan::SinkWriter;
    use crate::tests::driver_tests::HoldAll;
    use crate::tests::support::{batch, values};

    /// Records, in order, each row written and each pre-commit.
    struct Log(Arc<Mutex<Vec<String>>>);

    impl SinkWriter for Log {
        fn write(&mut self, rows: &Batch) -> Result<(), SluiceError> {
            self.0.lock().expect("lock").extend(values(rows).iter().map(|v| format!("row {v}")));
            Ok(())
        }
        fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
            self.0.lock().expect("lock").push(format!("pre-commit {}", epoch.0));
            Ok(Vec::new())
        }
        fn close(&mut self) -> Result<(), SluiceError> {
            Ok(())
        }
    }

    #[test]
    fn a_barrier_flushes_the_held_mini_batch_before_the_snapshot_and_the_sinks_pre_commit() {
        let snapshots = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let hold = HoldAll { held: Vec::new(), held_at_snapshots: Arc::clone(&snapshots) };
        let mut segment = SegmentRun {
            place: SegmentPlace { flow: 0, side: None, segment: 0 },
            entry: None,
            chain: Chain::new(vec![Box::new(hold)]),
            input: None,
            output: Output::Sink {
                sink: 0,
                writer: Some(Box::new(Log(Arc::clone(&log)))),
                staged: true,
                staged_rows: 0,
            },
            taps: Vec::new(),
            barrier_passed: None,
            ended: false,
            end_snapshot: EndSnapshot::NotTaken,
        };
        let metrics = Metrics::new(Vec::new(), vec![SinkMetrics::new("log")], 1);
        let mut scratch = Vec::new();
        for message in [Message::Data(Batch::inserts(batch(&[1, 2]))), Message::Data(Batch::inserts(batch(&[3])))] {
            feed(&mut segment, Some((0, message)), &mut scratch, &metrics, true, Epoch(1)).expect("data");
        }
        assert!(log.lock().expect("lock").is_empty(), "the rows are held");
        let fed = feed(&mut segment, Some((0, Message::Barrier(Epoch(1)))), &mut scratch, &metrics, true, Epoch(1))
            .expect("barrier");
        assert_eq!(*snapshots.lock().expect("lock"), [0], "the snapshot came after the flush");
        assert_eq!(*log.lock().expect("lock"), ["row 1", "row 2", "row 3", "pre-commit 1"]);
        let (epoch, states, record) = fed.barrier.expect("a barrier passed");
        assert_eq!((epoch, states.len(), record.map(|r| r.1)), (Epoch(1), 1, Some(3)), "three rows staged in epoch 1");
    }

    /// Acknowledges each batch's rows one write late, and the rest once closed (as a
    /// producer's delivery reports come after its sends).
    #[derive(Default)]
    struct Late {
        written: u64,
        acknowledged: u64,
    }

    impl SinkWriter for Late {
        fn write(&mut self, rows: &Batch) -> Result<(), SluiceError> {
            self.acknowledged += std::mem::replace(&mut self.written, rows.num_rows() as u64);
            match rows.num_rows() {
                4 => Err(SluiceError::external("late.lost", "the destination is lost")),
                _ => Ok(()),
            }
        }
        fn close(&mut self) -> Result<(), SluiceError> {
            self.acknowledged += std::mem::take(&mut self.written);
            Ok(())
        }
        fn take_acknowledged_rows(&mut self) -> Option<u64> {
            Some(std::mem::take(&mut self.acknowledged))
        }
    }

    /// A Kafka sink whose broker died counted every row it queued as out: a writer that
    /// reports acknowledgements counts only those.
    #[test]
    fn a_sink_that_reports_acknowledgements_counts_only_acknowledged_rows_out() {
        let mut segment = SegmentRun {
            place: SegmentPlace { flow: 0, side: None, segment: 0 },
            entry: None,
            chain: Chain::new(Vec::new()),
            input: None,
            output: Output::Sink { sink: 0, writer: Some(Box::new(Late::default())), staged: false, staged_rows: 0 },
            taps: Vec::new(),
            barrier_passed: None,
            ended: false,
            end_snapshot: EndSnapshot::NotTaken,
        };
        let metrics = Metrics::new(Vec::new(), vec![SinkMetrics::new("late")], 1);
        let rows_out = || metrics.sinks[0].rows.load(std::sync::atomic::Ordering::Relaxed);
        let mut scratch = Vec::new();
        let mut feed_one = |message| feed(&mut segment, Some((0, message)), &mut scratch, &metrics, false, Epoch(1));
        feed_one(Message::Data(Batch::inserts(batch(&[1, 2])))).expect("data");
        assert_eq!(rows_out(), 0, "nothing acknowledged yet");
        feed_one(Message::Data(Batch::inserts(batch(&[3])))).expect("data");
        assert_eq!(rows_out(), 2);
        assert!(feed_one(Message::Data(Batch::inserts(batch(&[4, 5, 6, 7])))).is_err(), "the write fails");
        assert_eq!(rows_out(), 3, "what was acknowledged before the failure counts");
        feed_one(Message::EndOfData).expect("end");
        assert_eq!(rows_out(), 7, "the close acknowledged the rest");
    }
}
