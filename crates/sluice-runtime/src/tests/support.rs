//! Test doubles for the runtime's tests: an in-memory source whose lanes hand out given
//! values, a sink that collects what it receives (and can be gated, fail or panic), a
//! partitioner by value, and a checkpointer that records what it is given.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, Int64Array};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use crossbeam_channel::Receiver;
use sluice_types::{Batch, Epoch, SluiceError};

use crate::checkpoint::{Checkpointer, ManifestSlice};
use crate::plan::{
    Flow, LaneContext, LanePoll, LaneReader, Partitioner, PartitionerFactory, Plan, Segment, SegmentOutput,
    SinkFactory, SinkParallelism, SinkWriter, SourceFactory, TableDef,
};
use crate::{Metrics, RunEvent, RunOptions, RunReport};

pub(crate) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
}

pub(crate) fn batch(values: &[i64]) -> RecordBatch {
    RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(values.to_vec()))]).expect("batch")
}

/// The values of a batch's only column.
pub(crate) fn values(batch: &Batch) -> Vec<i64> {
    batch.rows.column(0).as_primitive::<Int64Type>().values().to_vec()
}

/// A source of one table `v`: lane `l` hands out `lanes[l]`, one batch per poll, then
/// ends (or, `endless`, waits forever). Positions are the number of batches handed out.
pub(crate) struct VecSource {
    pub tables: Vec<TableDef>,
    pub lanes: Vec<Vec<Vec<i64>>>,
    pub endless: bool,
    /// A lane that fails at its first poll.
    pub failing_lane: Option<u32>,
    /// Polls of every lane.
    pub polls: Arc<AtomicU64>,
    /// When set, each poll records how many rows this sink had written by then.
    pub watching: Option<Arc<Collected>>,
    pub seen_at_polls: Arc<Mutex<Vec<usize>>>,
    /// Each batch comes with its largest value as the lane's watermark.
    pub watermarks: bool,
    /// See `SourceFactory::max_watermark_drift`.
    pub max_drift: Option<i64>,
    /// Turns on which the driver skipped a lane and told it (`LaneReader::blocked`).
    pub skipped: Arc<AtomicU64>,
    /// A lane resumed at its end says so without a poll (`LaneReader::resumed`).
    pub tells_end_on_resume: bool,
}

impl VecSource {
    pub(crate) fn new(lanes: Vec<Vec<Vec<i64>>>) -> VecSource {
        let tables = vec![TableDef { name: "t".into(), schema: schema(), event_time: None, changelog: None }];
        VecSource {
            tables,
            lanes,
            endless: false,
            failing_lane: None,
            polls: Arc::default(),
            watching: None,
            seen_at_polls: Arc::default(),
            watermarks: false,
            max_drift: None,
            skipped: Arc::default(),
            tells_end_on_resume: true,
        }
    }
}

impl SourceFactory for VecSource {
    fn name(&self) -> &str {
        "numbers"
    }

    fn tables(&self) -> &[TableDef] {
        &self.tables
    }

    fn lanes(&self) -> u32 {
        self.lanes.len() as u32
    }

    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError> {
        let resumed_from = context.start.is_some();
        let skip = context.start.map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")));
        let batches: VecDeque<Vec<i64>> =
            self.lanes[context.lane as usize].iter().skip(skip as usize).cloned().collect();
        // With watermarks, a resumed lane had the largest value handed out before.
        let resumed = resumed_from.then(|| {
            let watermark = self.lanes[context.lane as usize].iter().take(skip as usize).flatten().copied().max();
            (watermark.filter(|_| self.watermarks), self.tells_end_on_resume)
        });
        Ok(Box::new(VecLane {
            batches,
            handed_out: skip,
            endless: self.endless,
            failing: self.failing_lane == Some(context.lane),
            polls: Arc::clone(&self.polls),
            watching: self.watching.clone(),
            seen_at_polls: Arc::clone(&self.seen_at_polls),
            watermarks: self.watermarks,
            resumed,
            skipped: Arc::clone(&self.skipped),
        }))
    }

    fn describe(&self) -> String {
        "numbers".into()
    }

    fn max_watermark_drift(&self) -> Option<sluice_types::TimestampMs> {
        self.max_drift
    }
}

struct VecLane {
    batches: VecDeque<Vec<i64>>,
    handed_out: u64,
    endless: bool,
    failing: bool,
    polls: Arc<AtomicU64>,
    watching: Option<Arc<Collected>>,
    seen_at_polls: Arc<Mutex<Vec<usize>>>,
    watermarks: bool,
    /// Resumed from a position: the watermark it had, and whether it tells its end.
    resumed: Option<(Option<i64>, bool)>,
    skipped: Arc<AtomicU64>,
}

impl LaneReader for VecLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        if let Some(collected) = &self.watching {
            let written = collected.written.lock().expect("lock").len();
            self.seen_at_polls.lock().expect("lock").push(written);
        }
        if self.failing {
            return Err(SluiceError::external("test.lane", "the disk went away"));
        }
        match self.batches.pop_front() {
            Some(values) => {
                self.handed_out += 1;
                let watermark = values.iter().copied().max().filter(|_| self.watermarks);
                Ok(LanePoll::Data { batches: vec![(0, batch(&values))], watermark })
            }
            None if self.endless => Ok(LanePoll::Wait(Instant::now() + Duration::from_secs(3600))),
            None => Ok(LanePoll::Exhausted),
        }
    }

    fn position(&self) -> Vec<u8> {
        self.handed_out.to_le_bytes().to_vec()
    }

    fn blocked(&mut self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    fn resumed(&mut self) -> Option<LanePoll> {
        let (watermark, tells_end) = self.resumed.take()?;
        if tells_end && self.batches.is_empty() && !self.endless {
            return Some(LanePoll::Exhausted);
        }
        watermark.map(|watermark| LanePoll::Data { batches: Vec::new(), watermark: Some(watermark) })
    }
}

/// What a [`CollectSink`] saw, shared with the test.
#[derive(Default)]
pub(crate) struct Collected {
    /// Values written, by slot.
    pub written: Mutex<Vec<(u32, i64)>>,
    /// (epoch, records) of every commit, in order.
    pub commits: Mutex<Vec<(u64, usize)>>,
}

/// A sink collecting its rows. With `gate`, each write first takes one token from it;
/// `panic_on_slot` panics in that slot's first write.
pub(crate) struct CollectSink {
    pub parallelism: SinkParallelism,
    pub collected: Arc<Collected>,
    pub gate: Option<Receiver<()>>,
    pub panic_on_slot: Option<u32>,
    pub exactly_once: bool,
    /// Told of every row written.
    pub wrote: Option<crossbeam_channel::Sender<()>>,
}

impl CollectSink {
    pub(crate) fn new(parallelism: SinkParallelism) -> CollectSink {
        CollectSink {
            parallelism,
            collected: Arc::default(),
            gate: None,
            panic_on_slot: None,
            exactly_once: false,
            wrote: None,
        }
    }
}

impl SinkFactory for CollectSink {
    fn name(&self) -> &str {
        "collect"
    }

    fn parallelism(&self) -> SinkParallelism {
        self.parallelism
    }

    fn open(&self, slot: u32, _slots: u32, _staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        Ok(Box::new(CollectWriter {
            slot,
            collected: Arc::clone(&self.collected),
            gate: self.gate.clone(),
            panics: self.panic_on_slot == Some(slot),
            wrote: self.wrote.clone(),
        }))
    }

    fn describe(&self) -> String {
        "collect".into()
    }

    fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    fn commit(&self, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        self.collected.commits.lock().expect("lock").push((epoch.0, records.len()));
        Ok(())
    }
}

struct CollectWriter {
    slot: u32,
    collected: Arc<Collected>,
    gate: Option<Receiver<()>>,
    panics: bool,
    wrote: Option<crossbeam_channel::Sender<()>>,
}

impl SinkWriter for CollectWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        assert!(!self.panics, "a bug in the sink of slot {}", self.slot);
        if let Some(gate) = &self.gate {
            gate.recv().map_err(|_| SluiceError::internal("test.gate", "the gate closed"))?;
        }
        let rows = values(batch);
        self.collected.written.lock().expect("lock").extend(rows.iter().map(|v| (self.slot, *v)));
        if let Some(wrote) = &self.wrote {
            for _ in &rows {
                wrote.send(()).map_err(|_| SluiceError::internal("test.wrote", "the test stopped listening"))?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        Ok(epoch.0.to_le_bytes().to_vec())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        Ok(())
    }
}

/// Routes each row to slot `value % slots`.
pub(crate) struct ByValue;

impl Partitioner for ByValue {
    fn partition(&mut self, batch: Batch, slots: u32, out: &mut Vec<(u32, Batch)>) -> Result<(), SluiceError> {
        for value in values(&batch) {
            out.push(((value.rem_euclid(i64::from(slots))) as u32, Batch::inserts(self::batch(&[value]))));
        }
        Ok(())
    }
}

/// One flow from `source` to `sink`, through an exchange by value when `exchange`.
pub(crate) fn plan(source: VecSource, sink: Arc<dyn SinkFactory>, exchange: bool) -> Plan {
    let mut segments = Vec::new();
    if exchange {
        let partitioner: PartitionerFactory = Arc::new(|_| Box::new(ByValue));
        let output = SegmentOutput::Exchange { partitioner, description: "by value".into() };
        segments.push(Segment { operators: Vec::new(), state: None, output });
    }
    segments.push(Segment { operators: Vec::new(), state: None, output: SegmentOutput::Sink });
    Plan {
        sources: vec![Arc::new(source)],
        flows: vec![Flow { source: 0, table: 0, segments, sides: Vec::new(), sink, sink_slot: 0, tap: None }],
    }
}

pub(crate) fn options(threads: u32, queue_batches: usize) -> RunOptions {
    RunOptions { threads, vnodes: 16, batch_size: 1024, queue_batches, shutdown_timeout: Duration::from_secs(30) }
}

/// Runs `plan` to the end (or until `stop` asks), collecting the run's events.
pub(crate) fn run(
    plan: &Plan,
    options: &RunOptions,
    checkpointing: Option<crate::Checkpointing>,
    stop: (crate::StopHandle, Receiver<()>),
) -> (RunReport, Vec<RunEvent>) {
    let metrics = Arc::new(Metrics::for_plan(plan, options.threads));
    let mut events = Vec::new();
    let report = crate::run(plan, options, checkpointing, stop, metrics, &mut |event| events.push(event));
    (report, events)
}

/// One published checkpoint: its epoch, its (source, lane, position)s, whether final.
pub(crate) type Published = (u64, Vec<(usize, u32, Vec<u8>)>, bool);

/// A checkpointer that records each epoch's positions and whether it was the final one
/// (one worker: its part is kept here between writing and publishing).
pub(crate) struct Recording(pub Arc<Mutex<Vec<Published>>>, pub Vec<(usize, u32, Vec<u8>)>);

impl Recording {
    pub(crate) fn new(published: Arc<Mutex<Vec<Published>>>) -> Recording {
        Recording(published, Vec::new())
    }
}

impl Checkpointer for Recording {
    fn write_part(&mut self, _epoch: Epoch, slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        self.1 = slice.positions.into_iter().map(|p| (p.source, p.lane, p.bytes)).collect();
        Ok(Vec::new())
    }

    fn publish(&mut self, epoch: Epoch, _parts: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError> {
        let positions = std::mem::take(&mut self.1);
        self.0.lock().expect("lock").push((epoch.0, positions, final_epoch));
        Ok(0)
    }
}
