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
//! leaves the message in the outbox and the driver moves on to other segments. The last
//! segment of a flow writes a sink, never an exchange, so it can always consume; hence
//! the channels into it drain, hence the segment before it can flush, and so on back to
//! segment 0 (induction on the segment index). Why a full queue reaches the source: a
//! segment with a non-empty outbox reads no input, and segment 0's input is the lanes,
//! which are not polled while it is blocked. Every queue is bounded (channel capacity);
//! an outbox holds at most the output of one input message.
//!
//! When a turn makes no progress, the driver waits on a `Select` over the control channel,
//! the inputs it could read and the channels it is blocked on, until the earliest lane
//! wake-up: it is woken by events, it does not spin.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};
use sluice_types::{Batch, Message, SluiceError, TimestampMs};

use crate::chain::Chain;
use crate::exchange::{ExchangeInput, ExchangeOutput};
use crate::metrics::{Metrics, NO_WATERMARK};
use crate::plan::{LaneContext, LanePoll, LaneReader, SinkParallelism, SinkWriter};

/// Messages from the controller. `Stop` may be sent more than once; `Abort` is final.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    /// Stop polling sources: every lane ends, the chains and sinks drain.
    Stop,
    /// Leave at once, dropping everything in flight.
    Abort,
}

/// What a driver tells the controller. Each driver sends exactly one.
#[derive(Debug)]
pub(crate) enum DriverEvent {
    Finished { thread: u32 },
    Fatal { thread: u32, component: String, error: SluiceError },
    Aborted { thread: u32 },
}

/// Most messages a segment takes from its input per turn, so one busy segment cannot
/// starve the others or the control channel.
const INPUT_BURST_MESSAGES: usize = 64;
/// Longest idle wait when nothing else bounds it; the Select wakes earlier on any event.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(100);

pub(crate) struct LaneSetup {
    pub source: usize,
    pub lane: u32,
}

pub(crate) enum OutputSetup {
    Exchange(ExchangeOutput),
    Sink { sink: usize },
}

pub(crate) struct SegmentSetup {
    pub chain: Chain,
    pub input: Option<ExchangeInput>,
    pub output: OutputSetup,
}

pub(crate) struct FlowSetup {
    pub source: usize,
    pub table: usize,
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
}

struct LaneRun {
    source: usize,
    lane: u32,
    reader: Box<dyn LaneReader>,
    wait_until: Option<Instant>,
    exhausted: bool,
}

enum Output {
    Exchange(ExchangeOutput),
    Sink { sink: usize, writer: Option<Box<dyn SinkWriter>> },
}

struct SegmentRun {
    chain: Chain,
    input: Option<ExchangeInput>,
    output: Output,
}

impl SegmentRun {
    fn can_accept(&self) -> bool {
        match &self.output {
            Output::Exchange(exchange) => exchange.is_empty(),
            Output::Sink { .. } => true,
        }
    }
}

struct FlowRun {
    source: usize,
    table: usize,
    name: String,
    segments: Vec<SegmentRun>,
    /// Segment 0 received end-of-data.
    input_ended: bool,
    /// The sink's writer closed: this flow is done on this thread.
    finished: bool,
    watermark: TimestampMs,
}

impl Driver {
    /// Runs until every flow finished, a failure, or an abort; reports exactly one event.
    pub(crate) fn run(self) {
        let thread = self.thread;
        let events = self.events.clone();
        let event = match self.start_and_run() {
            Ok(true) => {
                tracing::debug!(thread, "driver finished");
                DriverEvent::Finished { thread }
            }
            Ok(false) => DriverEvent::Aborted { thread },
            Err((component, error)) => DriverEvent::Fatal { thread, component, error },
        };
        // The controller outlives the drivers; if it is gone there is no one to tell.
        let _ = events.send(event);
    }

    fn start_and_run(self) -> Result<bool, (String, SluiceError)> {
        let mut lanes = Vec::new();
        for setup in &self.lanes {
            let source = &self.plan.sources[setup.source];
            let tables_needed = (0..source.tables().len())
                .map(|table| self.flows.iter().any(|f| f.source == setup.source && f.table == table))
                .collect();
            let context = LaneContext {
                lane: setup.lane,
                batch_size: self.batch_size,
                tables_needed,
                metrics: Arc::clone(&self.metrics.sources[setup.source]),
            };
            let reader = source
                .open_lane(context)
                .map_err(|error| (format!("source {} lane {}", source.name(), setup.lane), error))?;
            lanes.push(LaneRun { source: setup.source, lane: setup.lane, reader, wait_until: None, exhausted: false });
        }
        let mut flows = Vec::new();
        for flow in self.flows {
            let mut segments = Vec::new();
            for segment in flow.segments {
                let output = match segment.output {
                    OutputSetup::Exchange(exchange) => Output::Exchange(exchange),
                    OutputSetup::Sink { sink } => {
                        let factory = &self.plan.flows[sink].sink;
                        let open = factory.parallelism() == SinkParallelism::PerThread || self.thread == 0;
                        let writer = if open {
                            Some(
                                factory
                                    .open(self.thread, self.threads, false)
                                    .map_err(|e| (format!("sink {}", factory.name()), e))?,
                            )
                        } else {
                            None
                        };
                        Output::Sink { sink, writer }
                    }
                };
                segments.push(SegmentRun { chain: segment.chain, input: segment.input, output });
            }
            flows.push(FlowRun {
                source: flow.source,
                table: flow.table,
                name: flow.name,
                segments,
                input_ended: false,
                finished: false,
                watermark: NO_WATERMARK,
            });
        }
        let mut state = DriverState { thread: self.thread, lanes, flows, metrics: self.metrics, scratch: Vec::new() };
        state.run(&self.control)
    }
}

struct DriverState {
    thread: u32,
    lanes: Vec<LaneRun>,
    flows: Vec<FlowRun>,
    metrics: Arc<Metrics>,
    scratch: Vec<Message>,
}

type Failure = (String, SluiceError);

impl DriverState {
    fn run(&mut self, control: &Receiver<Control>) -> Result<bool, Failure> {
        self.end_sources_without_lanes()?;
        loop {
            match control.try_recv() {
                Ok(Control::Stop) => self.stop_lanes()?,
                Ok(Control::Abort) | Err(TryRecvError::Disconnected) => return Ok(false),
                Err(TryRecvError::Empty) => {}
            }
            let mut progressed = self.run_segments()?;
            progressed |= self.poll_lanes()?;
            if self.flows.iter().all(|flow| flow.finished) && self.outboxes_empty() {
                return Ok(true);
            }
            if !progressed {
                self.wait_idle(control);
            }
        }
    }

    /// Flows whose source has no lane on this thread end at once, so they hold back no
    /// watermark and the exchanges after them see this thread's end-of-data.
    fn end_sources_without_lanes(&mut self) -> Result<(), Failure> {
        let sources: Vec<usize> = self.flows.iter().map(|f| f.source).collect();
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
                sources.push(lane.source);
            }
        }
        sources.dedup();
        for source in sources {
            self.end_source(source)?;
        }
        Ok(())
    }

    /// One pass over every segment, downstream first. Returns whether anything moved.
    fn run_segments(&mut self) -> Result<bool, Failure> {
        let mut progressed = false;
        for flow in &mut self.flows {
            for index in (0..flow.segments.len()).rev() {
                let component = || format!("flow to {} (segment {index})", flow.name);
                let segment = &mut flow.segments[index];
                if let Output::Exchange(exchange) = &mut segment.output {
                    progressed |= exchange.flush().map_err(|e| (component(), e))?;
                }
                if segment.input.is_none() {
                    continue;
                }
                for _ in 0..INPUT_BURST_MESSAGES {
                    if !segment.can_accept() {
                        break;
                    }
                    let input = segment.input.as_mut().expect("checked above");
                    let Some(message) = input.poll().map_err(|e| (component(), e))? else { break };
                    progressed = true;
                    let finished =
                        feed(segment, message, &mut self.scratch, &self.metrics).map_err(|e| (component(), e))?;
                    flow.finished |= finished;
                }
            }
        }
        Ok(progressed)
    }

    /// Whether every message this thread produced left it (end-of-data included), so
    /// exiting loses nothing.
    fn outboxes_empty(&self) -> bool {
        self.flows.iter().flat_map(|f| &f.segments).all(|segment| segment.can_accept())
    }

    fn source_blocked(&self, source: usize) -> bool {
        self.flows.iter().any(|flow| flow.source == source && !flow.segments[0].can_accept())
    }

    fn poll_lanes(&mut self) -> Result<bool, Failure> {
        let mut progressed = false;
        let now = Instant::now();
        let started = Instant::now();
        let mut blocked_any = false;
        for index in 0..self.lanes.len() {
            let lane = &self.lanes[index];
            if lane.exhausted || lane.wait_until.is_some_and(|until| until > now) {
                continue;
            }
            if self.source_blocked(lane.source) {
                blocked_any = true;
                continue;
            }
            progressed = true;
            self.poll_lane(index)?;
        }
        if blocked_any {
            let elapsed = started.elapsed().as_nanos() as u64;
            self.metrics.threads[self.thread as usize].backpressure_ns.fetch_add(elapsed.max(1), Ordering::Relaxed);
        }
        Ok(progressed)
    }

    fn poll_lane(&mut self, index: usize) -> Result<(), Failure> {
        let lane = &mut self.lanes[index];
        let source = lane.source;
        let poll = lane.reader.poll();
        let poll = poll.map_err(|e| (format!("source {} lane {}", self.metrics.sources[source].name, lane.lane), e))?;
        match poll {
            LanePoll::Data { batches, watermark } => {
                lane.wait_until = None;
                let rows: usize = batches.iter().map(|(_, batch)| batch.num_rows()).sum();
                self.metrics.sources[source].rows.fetch_add(rows as u64, Ordering::Relaxed);
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
                if self.lanes.iter().filter(|l| l.source == source).all(|l| l.exhausted) {
                    self.end_source(source)?;
                } else {
                    self.advance_source_watermark(source)?;
                }
            }
        }
        Ok(())
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
        for index in 0..self.flows.len() {
            let flow = &mut self.flows[index];
            if flow.source == source && !flow.input_ended && lowest > flow.watermark {
                flow.watermark = lowest;
                self.feed_flow(index, Message::Watermark(lowest))?;
            }
        }
        Ok(())
    }

    fn end_source(&mut self, source: usize) -> Result<(), Failure> {
        for index in 0..self.flows.len() {
            if self.flows[index].source == source && !self.flows[index].input_ended {
                self.flows[index].input_ended = true;
                self.feed_flow(index, Message::EndOfData)?;
            }
        }
        Ok(())
    }

    fn feed_flows(&mut self, source: usize, table: Option<usize>, message: Message) -> Result<(), Failure> {
        let targets: Vec<usize> = (0..self.flows.len())
            .filter(|&i| self.flows[i].source == source && table.is_none_or(|t| self.flows[i].table == t))
            .collect();
        for index in targets {
            self.feed_flow(index, message.clone())?;
        }
        Ok(())
    }

    fn feed_flow(&mut self, index: usize, message: Message) -> Result<(), Failure> {
        let flow = &mut self.flows[index];
        let finished = feed(&mut flow.segments[0], message, &mut self.scratch, &self.metrics)
            .map_err(|e| (format!("flow to {} (segment 0)", flow.name), e))?;
        flow.finished |= finished;
        Ok(())
    }

    fn wait_idle(&self, control: &Receiver<Control>) {
        let now = Instant::now();
        let wake = self.lanes.iter().filter(|lane| !lane.exhausted).filter_map(|lane| lane.wait_until).min();
        let timeout = wake.map_or(IDLE_WAIT_MAX, |wake| wake.saturating_duration_since(now).min(IDLE_WAIT_MAX));
        let mut select = Select::new();
        select.recv(control);
        for flow in &self.flows {
            for segment in &flow.segments {
                if let Output::Exchange(exchange) = &segment.output {
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
        let _ = select.ready_timeout(timeout);
    }
}

/// Pushes one message through a segment and routes what comes out. Returns true when the
/// segment's sink closed (the flow is done on this thread).
fn feed(
    segment: &mut SegmentRun,
    message: Message,
    scratch: &mut Vec<Message>,
    metrics: &Metrics,
) -> Result<bool, SluiceError> {
    segment.chain.push(message, scratch)?;
    let mut finished = false;
    for message in scratch.drain(..) {
        match &mut segment.output {
            Output::Exchange(exchange) => exchange.route(message)?,
            Output::Sink { sink, writer } => match message {
                Message::Data(batch) => {
                    let writer = writer.as_mut().expect("a single-writer sink receives rows only on thread 0");
                    writer.write(&batch)?;
                    metrics.sinks[*sink].rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                }
                Message::EndOfData => {
                    if let Some(writer) = writer.as_mut() {
                        writer.close()?;
                    }
                    finished = true;
                }
                Message::Watermark(_) | Message::Barrier(_) => {}
            },
        }
    }
    Ok(finished)
}
