//! What the runtime executes: sources, and per sink one flow of segments.
//!
//! A [`Flow`] reads one table of one source and ends in one sink. It is cut into
//! [`Segment`]s wherever rows must move between threads: segment 0 runs on the thread
//! that reads the lane; segment k > 0 reads from the exchange that segment k-1 writes
//! (rows routed by a [`Partitioner`], usually a key hash → vnode → thread). Every thread
//! runs one instance of every segment; the operators inside a segment are fused.
//!
//! Sources are shared by flows: a lane's batch is offered to every flow that reads one
//! of its tables, so a source is read once however many sinks use it.
//!
//! Flows can share more than a source: a flow with a [`Tap`] does not read its table
//! itself, it reads the output of another flow's trunk segment (the stream of a view
//! that both compute), through an exchange of its own; that segment then writes its
//! output to every tap as well as to its own next segment or sink (a fan-out). So a
//! view read by several sinks is computed, and its state kept, once.

use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use sluice_types::{Batch, Epoch, SluiceError, TimestampMs};

use crate::chain::Operator;
use crate::metrics::{Metrics, SinkMetrics, SourceMetrics};
use crate::place::{SegmentPlace, parse_operator_id};

/// A table a source provides (a nexmark source provides three).
#[derive(Debug, Clone)]
pub struct TableDef {
    pub name: String,
    pub schema: SchemaRef,
    /// The event-time column, whose lane watermarks the source reports.
    pub event_time: Option<String>,
    /// Set when the table is a changelog (a source with a changelog format and a
    /// `primary_key`): each batch of it then carries one column after `schema`'s,
    /// [`sluice_types::ROW_KIND_COLUMN`] (`Int8`, a [`sluice_types::RowKind`] per row),
    /// which the planner's normalization reads and drops. None: append-only rows.
    pub changelog: Option<SourceChangelog>,
}

/// How a changelog table's rows are to be read (see [`TableDef::changelog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceChangelog {
    /// The primary key's columns (positions in the table's schema), never empty.
    pub primary_key: Vec<usize>,
    /// Upsert rows (Flink's upsert-kafka): a `+U` replaces the key's row, with no `-U`
    /// before it, and a `-D` carries only the key. Otherwise rows are full images, a `-U`
    /// or `-D` the row as it was (Debezium, a changelog file).
    pub upsert: bool,
    /// The format's name, for `explain` and messages (e.g. `debezium-json`).
    pub format: String,
}

/// What a lane reader is given when it opens.
pub struct LaneContext {
    pub lane: u32,
    /// Rows per batch the reader should aim for.
    pub batch_size: usize,
    /// Which of the source's tables some flow reads: the reader may skip the others.
    pub tables_needed: Vec<bool>,
    pub metrics: Arc<SourceMetrics>,
    /// Where to resume (a [`LaneReader::position`] from a checkpoint); None: the start.
    pub start: Option<Vec<u8>>,
}

/// A source as planned: its tables and how it splits into lanes.
pub trait SourceFactory: Send + Sync {
    fn name(&self) -> &str;
    fn tables(&self) -> &[TableDef];
    /// How many lanes (independently readable splits) the source has.
    fn lanes(&self) -> u32;
    /// Opens one lane on the thread that will poll it.
    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError>;
    /// One line for `explain`, e.g. `nexmark(events=1000000, lanes=2)`.
    fn describe(&self) -> String;
    /// How the lanes are laid out (for a file source: its files, their identities and
    /// byte ranges), recorded in every manifest beside the lanes' positions; opaque to
    /// the runtime. Empty when the source's lanes need no description.
    fn layout(&self) -> Vec<u8> {
        Vec::new()
    }
    /// What every worker of a cluster must agree on about the input, each reading its
    /// own copy (for a file source: each file's size and the hashes of its first and
    /// last bytes, not its path or time, which differ between hosts). Empty when the
    /// source reads no local input.
    fn content_identity(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Whether a lane can resume from a position after a restart (false for a pipe or a
    /// device): the engine refuses checkpoints of a pipeline with a source that cannot.
    fn resumable(&self) -> bool {
        true
    }
    /// Checkpoint `epoch`, holding `positions` (lane, [`LaneReader::position`]) of this
    /// process's lanes of the source, is published and its sinks committed: every row
    /// read before those positions is acknowledged by every sink (exactly-once sinks made
    /// it visible, the others flushed it at the barrier). A source may tell its upstream
    /// (a Kafka source commits the offsets to its consumer group). Called once per
    /// checkpoint, in epoch order, on the controller's thread; a failure is the
    /// source's to log (the checkpoint stands).
    fn checkpoint_committed(&self, _epoch: Epoch, _positions: &[(u32, &[u8])]) {}
    /// Watermark alignment (Flink's `scan.watermark.alignment.max-drift`): a lane whose
    /// watermark is more than this many milliseconds ahead of the slowest live lane that
    /// this worker reads is not polled until that lane catches up (the slowest is never
    /// held, so the source always progresses; lanes of other workers are not seen). It bounds the state that event
    /// time operators keep for a lane that ran ahead, and costs nothing when the lanes
    /// carry the same span of time (the generator's interleaved lanes). A lane that
    /// stops producing before its end holds the others back. None: lanes run freely.
    fn max_watermark_drift(&self) -> Option<TimestampMs> {
        None
    }
}

/// The answer of one poll of a lane.
pub enum LanePoll {
    /// Rows for some tables (by index into [`SourceFactory::tables`]), and the lane's
    /// watermark after them, if the source has event time: no row with an event time
    /// *below* it will follow from this lane (rows at it may: the newest rows' time
    /// minus a delay). The driver makes the stream's watermark one millisecond lower
    /// ([`sluice_types::Message::Watermark`] excludes rows at it), so a row sharing
    /// the newest time of the batch before it is never late, wherever batches split.
    Data { batches: Vec<(usize, RecordBatch)>, watermark: Option<TimestampMs> },
    /// Nothing now (a rate limit, an idle input); poll again at the instant.
    Wait(Instant),
    /// The lane ended; it will never produce again.
    Exhausted,
}

/// One lane of a source, owned and polled by one driver thread.
pub trait LaneReader: Send {
    /// Produces the next rows. Bad input is handled by the reader per its error policy:
    /// skipped rows are counted in its metrics, a `fail` policy returns the error.
    /// A lane resumed from a position first reports the watermark it had there (a
    /// `Data` with no batch, unless [`LaneReader::resumed`] took it), so lateness after a
    /// restore matches an unbroken run.
    fn poll(&mut self) -> Result<LanePoll, SluiceError>;

    /// What a lane resumed from a position answers without reading input, once:
    /// [`LanePoll::Exhausted`] when it had ended there, else a `Data` with no batch and
    /// the watermark it had there; None when it had neither, or cannot tell without
    /// reading (its polls answer then). The driver of a restored run takes every lane's
    /// before anything else, even while the job is paused, so that each edge's first
    /// message is the watermark the thread had at the checkpoint (see `exchange`). A
    /// lane with event time implements it: otherwise its watermark goes out only with its
    /// first poll, which a paused job does not make, so a barrier may pass first.
    fn resumed(&mut self) -> Option<LanePoll> {
        None
    }

    /// The position after the last rows returned, from which a lane opened with it as
    /// [`LaneContext::start`] continues with exactly the next rows (and the watermark
    /// reached so far). Opaque to the runtime; stored in checkpoints.
    fn position(&self) -> Vec<u8>;

    /// The driver skipped polling the lane because its downstream is full or it is too
    /// far ahead of its source's slowest lane ([`SourceFactory::max_watermark_drift`])
    /// (called at every skipped turn, on the lane's thread, until the next
    /// [`LaneReader::poll`]).
    /// A reader may stop prefetching meanwhile; the next poll comes when there is room.
    fn blocked(&mut self) {}
}

/// Where a sink's writers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkParallelism {
    /// One writer per thread (a directory of parts, a blackhole).
    PerThread,
    /// One writer, on thread 0: the plan must gather rows to slot 0 before it.
    Single,
}

/// A sink as planned.
///
/// Exactly-once contract (when [`SinkFactory::exactly_once`] is true and checkpoints are
/// on): each writer stages what it receives between two barriers and, at barrier `e`,
/// makes it durable but invisible ([`SinkWriter::pre_commit`], which returns a record
/// describing the staged work). Only after manifest `e` (holding every record) is
/// durable does [`SinkFactory::commit`] make epoch `e`'s output visible. `commit` is
/// idempotent: recovery calls it again with the records of the newest committed
/// manifest, then [`SinkFactory::discard_after`] removes everything staged later.
/// Epochs are committed in increasing order, never twice with different records.
pub trait SinkFactory: Send + Sync {
    fn name(&self) -> &str;
    fn parallelism(&self) -> SinkParallelism;
    /// Opens the writer of `slot` (only slot 0 for a [`SinkParallelism::Single`] sink).
    /// `staged` asks for exactly-once staging (checkpoints on, exactly-once guarantee).
    fn open(&self, slot: u32, slots: u32, staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError>;
    fn describe(&self) -> String;
    /// Whether the sink can stage and commit (file sinks); stdout and blackhole cannot.
    fn exactly_once(&self) -> bool {
        false
    }
    /// Makes the staged work of epoch `epoch` visible; `records` are every writer's
    /// pre-commit records for that epoch. Idempotent.
    fn commit(&self, _epoch: Epoch, _records: &[Vec<u8>]) -> Result<(), SluiceError> {
        Ok(())
    }
    /// At recovery, after `commit` of the restored epoch: removes work staged for any
    /// later epoch (it was never committed), and any output of later epochs that is
    /// visible (committed before recovery fell back past a damaged newer checkpoint).
    /// `records` are the restored manifest's records of this sink. `None`: no
    /// checkpoint, remove all staged work.
    fn discard_after(&self, _epoch: Option<Epoch>, _records: &[Vec<u8>]) -> Result<(), SluiceError> {
        Ok(())
    }
    /// Whether [`SinkFactory::discard_after`] reads the records. When it does not,
    /// recovery reads only the records this worker commits: a sink's records may be
    /// large (the Kafka sink's keep a copy of their epoch's messages), and every worker
    /// reading every worker's would hold them all at once.
    fn discard_reads_records(&self) -> bool {
        true
    }
}

/// Writes rows out. `close` is called once, after the last batch, when the input ended.
pub trait SinkWriter: Send {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError>;
    /// Barrier `epoch`: everything written since the previous barrier belongs to it.
    /// A staging writer makes it durable but invisible and returns the record that
    /// commits it; others flush and return an empty record.
    fn pre_commit(&mut self, _epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        Ok(Vec::new())
    }
    /// Flushes buffered output and releases the resource. A staging writer stages its
    /// last rows as the final epoch through `pre_commit` before `close`.
    fn close(&mut self) -> Result<(), SluiceError>;
    /// The bytes it encoded since the last call (for the sink's byte counter; a writer
    /// that encodes nothing, e.g. the blackhole, counts none).
    fn take_bytes(&mut self) -> u64 {
        0
    }
    /// For a writer that learns later which rows reached their destination (a Kafka
    /// producer's delivery reports): the rows acknowledged since the last call, which
    /// the sink's row counter counts when the writer does not stage. `None` (the
    /// default): a row counts when `write` returns, or, staged, when its epoch commits.
    fn take_acknowledged_rows(&mut self) -> Option<u64> {
        None
    }
}

/// Routes rows to the threads of the next segment.
pub trait Partitioner: Send {
    /// Splits `batch` by destination slot (0..slots), appending one batch per slot that
    /// receives rows.
    fn partition(&mut self, batch: Batch, slots: u32, out: &mut Vec<(u32, Batch)>) -> Result<(), SluiceError>;
}

/// What an operator instance knows of where it runs.
pub struct OperatorContext {
    pub thread: u32,
    pub threads: u32,
    pub vnodes: u32,
    pub metrics: Arc<Metrics>,
}

pub type OperatorFactory = Arc<dyn Fn(&OperatorContext) -> Result<Box<dyn Operator>, SluiceError> + Send + Sync>;
pub type PartitionerFactory = Arc<dyn Fn(&OperatorContext) -> Box<dyn Partitioner> + Send + Sync>;

/// How a segment's output leaves it.
#[derive(Clone)]
pub enum SegmentOutput {
    /// To the next segment through an exchange; `description` is for `explain`
    /// (e.g. `hash(auction) → 256 vnodes`).
    Exchange { partitioner: PartitionerFactory, description: String },
    /// To the flow's sink.
    Sink,
}

/// Fused operators between two exchanges.
#[derive(Clone)]
pub struct Segment {
    /// Each operator with its `explain` line (e.g. `filter: auction % 123 = 0`).
    pub operators: Vec<(String, OperatorFactory)>,
    /// Keyed state held by the segment's operators, for `explain` (e.g. `windows by auction`).
    pub state: Option<String>,
    pub output: SegmentOutput,
}

/// From one table of one source to one sink, joined or merged with other tables on the
/// way ([`SideInput`]).
///
/// Segments are numbered (for checkpoints' operator ids and `explain`) trunk first,
/// then each side's in order: side `i`'s segment `j` is number
/// `segments.len() + (segments of sides before i) + j` ([`Flow::segment_count`]).
#[derive(Clone)]
pub struct Flow {
    pub source: usize,
    pub table: usize,
    /// The trunk: from the flow's own table to the sink.
    pub segments: Vec<Segment>,
    /// Further inputs, each entering a trunk segment through an exchange.
    pub sides: Vec<SideInput>,
    pub sink: Arc<dyn SinkFactory>,
    /// The slot whose thread runs a [`SinkParallelism::Single`] sink's writer (the plan
    /// gathers the rows there).
    pub sink_slot: u32,
    /// Set when the trunk's first segment reads another flow's segment through an
    /// exchange instead of the lanes of `source`'s `table` (which that flow reads).
    pub tap: Option<Tap>,
}

/// Where a flow's trunk reads from when it shares the computation of an earlier flow:
/// the output of trunk segment `segment` of flow `flow` (an earlier one, itself without
/// a tap), routed by `partitioner` into the tapping flow's trunk segment 0. The
/// segment at the tap writes everything it emits (rows, watermarks, barriers,
/// end-of-data) to each tap as well as to its own output; a full tap holds the segment
/// back as a full exchange does, so the slowest reader sets the pace (bounded, nothing
/// dropped).
#[derive(Clone)]
pub struct Tap {
    pub flow: usize,
    pub segment: usize,
    pub partitioner: PartitionerFactory,
    /// For `explain`, e.g. `forward (same thread)`.
    pub description: String,
}

/// Another input of a flow (a join's right side, a union's further input): rows of one
/// table through segments of their own, the last of which routes them through an
/// exchange into trunk segment `into`, as input port `port` of that segment's first
/// operator (port 0 is the trunk's own previous segment; the sides entering one segment
/// take ports 1, 2, … in order).
#[derive(Clone)]
pub struct SideInput {
    pub source: usize,
    pub table: usize,
    pub segments: Vec<Segment>,
    pub into: usize,
    pub port: usize,
}

impl Flow {
    /// Segment `number` (numbered as in [`Flow`]).
    pub fn segment(&self, number: usize) -> Option<&Segment> {
        let mut rest = number;
        for segments in std::iter::once(&self.segments).chain(self.sides.iter().map(|side| &side.segments)) {
            if rest < segments.len() {
                return Some(&segments[rest]);
            }
            rest -= segments.len();
        }
        None
    }

    /// Every segment of the flow: the trunk's, then each side's (see [`Flow`]).
    pub fn segment_count(&self) -> usize {
        self.segments.len() + self.sides.iter().map(|side| side.segments.len()).sum::<usize>()
    }

    /// The inputs of the flow as (source, table) that its lanes feed: the trunk's (unless
    /// it reads a [`Tap`]), then each side's.
    pub fn inputs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let trunk = self.tap.is_none().then_some((self.source, self.table));
        trunk.into_iter().chain(self.sides.iter().map(|side| (side.source, side.table)))
    }
}

/// Everything a run executes.
#[derive(Clone)]
pub struct Plan {
    pub sources: Vec<Arc<dyn SourceFactory>>,
    pub flows: Vec<Flow>,
}

impl Plan {
    /// The operator an [`crate::place::operator_id`] names, as `explain` shows it:
    /// `sink NAME, segment S: LINE`.
    pub fn operator_name(&self, id: &str) -> Option<String> {
        let (place, operator) = parse_operator_id(id)?;
        let (flow, number) = self.segment_number(place)?;
        let (line, _) = flow.segment(number)?.operators.get(operator)?;
        Some(format!("sink {}, segment {number}: {line}", flow.sink.name()))
    }

    /// The segment at `place` as `explain` shows it: `sink NAME, segment S`.
    pub fn segment_name(&self, place: SegmentPlace) -> Option<String> {
        let (flow, number) = self.segment_number(place)?;
        Some(format!("sink {}, segment {number}", flow.sink.name()))
    }

    /// The flow of `place` and the segment's number as `explain` numbers segments: the
    /// trunk's, then each side's.
    fn segment_number(&self, place: SegmentPlace) -> Option<(&Flow, usize)> {
        let flow = self.flows.get(place.flow)?;
        let number = match place.side {
            None => place.segment,
            Some(side) => {
                flow.sides.get(side)?;
                flow.segments.len() + flow.sides[..side].iter().map(|s| s.segments.len()).sum::<usize>() + place.segment
            }
        };
        Some((flow, number))
    }

    /// Checks the shape the runtime relies on (a programmer error if it does not hold).
    pub fn assert_well_formed(&self) {
        for (index, flow) in self.flows.iter().enumerate() {
            assert!(flow.source < self.sources.len(), "flow {index} reads an unknown source");
            assert!(flow.table < self.sources[flow.source].tables().len(), "flow {index} reads an unknown table");
            assert!(!flow.segments.is_empty(), "flow {index} has no segment");
            if let Some(tap) = &flow.tap {
                assert!(tap.flow < index, "flow {index} taps flow {}, not an earlier one", tap.flow);
                let producer = &self.flows[tap.flow];
                assert!(producer.tap.is_none(), "flow {index} taps flow {}, which taps another", tap.flow);
                assert!(tap.segment < producer.segments.len(), "flow {index} taps a segment flow {} lacks", tap.flow);
            }
            let last = flow.segments.len() - 1;
            for (position, segment) in flow.segments.iter().enumerate() {
                let is_sink = matches!(segment.output, SegmentOutput::Sink);
                assert_eq!(is_sink, position == last, "flow {index}: only the last segment writes the sink");
            }
            for (number, side) in flow.sides.iter().enumerate() {
                assert!(side.source < self.sources.len(), "flow {index} side {number} reads an unknown source");
                assert!(
                    side.table < self.sources[side.source].tables().len(),
                    "flow {index} side {number} reads an unknown table"
                );
                assert!(!side.segments.is_empty(), "flow {index} side {number} has no segment");
                assert!(
                    side.segments.iter().all(|segment| matches!(segment.output, SegmentOutput::Exchange { .. })),
                    "flow {index} side {number}: every segment of a side ends in an exchange"
                );
                let first = if flow.tap.is_some() { 0 } else { 1 };
                assert!(
                    (first..flow.segments.len()).contains(&side.into),
                    "flow {index} side {number} enters segment {} (not one fed by an exchange)",
                    side.into
                );
                let before = flow.sides[..number].iter().filter(|other| other.into == side.into).count();
                assert_eq!(side.port, before + 1, "flow {index} side {number}: ports are numbered in order from 1");
            }
        }
    }
}

// Here rather than in `metrics`, which stays below the plan: the counters know names and
// counts only, the plan knows its sources and sinks.
impl Metrics {
    /// Zeroed counters for every source, sink and thread of `plan`.
    pub fn for_plan(plan: &Plan, threads: u32) -> Metrics {
        let sources = plan.sources.iter().map(|s| SourceMetrics::new(s.name(), s.lanes())).collect();
        let sinks = plan.flows.iter().map(|f| SinkMetrics::new(f.sink.name())).collect();
        Metrics::new(sources, sinks, threads)
    }
}
