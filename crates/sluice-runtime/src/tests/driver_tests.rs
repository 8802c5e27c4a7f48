//! The driver's scheduling: lanes spread over threads, rows routed through the exchange,
//! a full queue stops the lanes that feed it (backpressure), barriers record positions,
//! held mini-batches leave when a thread runs out of input, a lane too far ahead of
//! the slowest waits (watermark alignment), and restored lanes' watermarks go out first.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_types::{Batch, Message, SluiceError};

use crate::checkpoint::{CheckpointOptions, Restore};
use crate::plan::SinkParallelism;
use crate::{Checkpointing, Metrics, RunOutcome, stop_handle};

use super::support::{CollectSink, Recording, VecSource, options, plan, run};

/// Checkpoints every `interval` from scratch, each published into `published`.
fn recorded(
    interval: Duration,
    exactly_once: bool,
    published: &Arc<Mutex<Vec<super::support::Published>>>,
) -> Checkpointing {
    Checkpointing {
        options: CheckpointOptions {
            interval,
            timeout: Duration::from_secs(60),
            exactly_once,
            restored_epoch: 0,
            max_failed: 3,
            checkpointer: Box::new(Recording::new(Arc::clone(published))),
        },
        restore: Restore::default(),
    }
}

#[test]
fn every_row_of_every_lane_reaches_the_sink_of_the_thread_its_value_routes_to() {
    let lanes = vec![vec![vec![1, 2], vec![3]], vec![vec![4, 5, 6]], vec![vec![7], vec![8], vec![9]]];
    let sink = Arc::new(CollectSink::new(SinkParallelism::PerThread));
    let collected = Arc::clone(&sink.collected);
    let plan = plan(VecSource::new(lanes), sink, true);
    let (report, _) = run(&plan, &options(2, 4), None, stop_handle());
    assert_eq!(report.outcome, RunOutcome::Completed);
    let mut written = collected.written.lock().expect("lock").clone();
    written.sort_by_key(|(_, value)| *value);
    let expected: Vec<(u32, i64)> = (1..=9).map(|v| ((v % 2) as u32, v)).collect();
    assert_eq!(written, expected, "each value on slot value % 2, each exactly once");
    assert_eq!((report.metrics.rows_in(), report.metrics.rows_out()), (9, 9));
}

#[test]
fn a_full_queue_stops_the_lanes_that_feed_it_until_the_consumer_makes_room() {
    // One lane of 40 one-row batches on thread 0; every row goes to thread 1, whose sink
    // writes a row only when given a token. With a queue of one batch, thread 0 may run
    // ahead of the sink by the queue, its outbox and the batch in hand, never more.
    let lane: Vec<Vec<i64>> = (0..40).map(|i| vec![2 * i + 1]).collect();
    let (tokens, gate) = crossbeam_channel::unbounded();
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.gate = Some(gate);
    let collected = Arc::clone(&sink.collected);
    let mut source = VecSource::new(vec![lane]);
    source.watching = Some(Arc::clone(&collected));
    let seen_at_polls = Arc::clone(&source.seen_at_polls);
    let plan = plan(source, Arc::new(sink), true);
    // A slow consumer, paced by events: each token waits until thread 0 is blocked on the
    // full queue with three batches the sink has not written (one held by the sink, one
    // queued, one that cannot be sent), or until the lane has handed out every batch.
    let metrics = Arc::new(Metrics::for_plan(&plan, 2));
    let (pace_polls, pace_metrics) = (Arc::clone(&seen_at_polls), Arc::clone(&metrics));
    let releaser = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        for sent in 0..40 {
            loop {
                let polls = pace_polls.lock().expect("lock").len();
                let blocked = pace_metrics.threads[0].blocked.load(Ordering::Relaxed);
                if polls >= 40 || (polls >= sent + 3 && blocked) {
                    break;
                }
                assert!(Instant::now() < deadline, "thread 0 stopped at {polls} polls with {sent} tokens given");
                std::thread::yield_now();
            }
            tokens.send(()).expect("token");
        }
    });
    let report = crate::run(&plan, &options(2, 1), None, stop_handle(), metrics, &mut |_| {});
    releaser.join().expect("releaser");
    assert_eq!(report.outcome, RunOutcome::Completed);
    assert_eq!(collected.written.lock().expect("lock").len(), 40, "nothing was dropped");
    let seen = seen_at_polls.lock().expect("lock");
    for (poll, written) in seen.iter().enumerate() {
        assert!(poll - written.min(&poll) <= 4, "poll {poll} came with only {written} rows written: {seen:?}");
    }
    assert!(report.metrics.threads[0].backpressure_ns.load(Ordering::Relaxed) > 0, "thread 0 was blocked");
    // ... on the one exchange, whose edge counts the same waits.
    let edges = report.metrics.edges_blocked();
    assert_eq!(edges.len(), 1, "{edges:?}");
    assert!(edges[0].1 > 0, "the exchange's edge was full: {edges:?}");
    assert!(edges[0].1 >= report.metrics.threads[0].backpressure_ns.load(Ordering::Relaxed), "{edges:?}");
}

#[test]
fn positions_in_a_checkpoint_are_those_of_the_rows_before_its_barrier() {
    let lanes = vec![(0..20).map(|i| vec![i]).collect::<Vec<_>>(), vec![vec![100]]];
    let published = Arc::new(Mutex::new(Vec::new()));
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.exactly_once = true;
    let collected = Arc::clone(&sink.collected);
    let plan = plan(VecSource::new(lanes), Arc::new(sink), false);
    let checkpointing = recorded(Duration::from_millis(1), true, &published);
    let (report, _) = run(&plan, &options(2, 4), Some(checkpointing), stop_handle());
    assert_eq!(report.outcome, RunOutcome::Completed);
    let published = published.lock().expect("lock");
    let (_, positions, final_epoch) = published.last().expect("a final checkpoint");
    assert!(*final_epoch);
    let batches = |lane: u32| {
        let bytes = &positions.iter().find(|(_, l, _)| *l == lane).expect("every lane's position").2;
        u64::from_le_bytes(bytes.as_slice().try_into().expect("8 bytes"))
    };
    assert_eq!((batches(0), batches(1)), (20, 1), "the last checkpoint is after every batch");
    let mut epochs: Vec<u64> = published.iter().map(|(epoch, _, _)| *epoch).collect();
    epochs.dedup();
    assert_eq!(epochs.len(), published.len(), "each epoch once");
    assert!(epochs.windows(2).all(|pair| pair[0] < pair[1]), "epochs increase: {epochs:?}");
    // A record is labelled with the epoch its writer was in; a thread that ends before a
    // barrier reaches it labels its last record with that barrier's epoch, so the final
    // checkpoint may commit an earlier label, or nothing when it carries no record.
    let committed: Vec<u64> = collected.commits.lock().expect("lock").iter().map(|(epoch, _)| *epoch).collect();
    assert!(!committed.is_empty(), "the staged rows were committed");
    assert!(committed.windows(2).all(|pair| pair[0] <= pair[1]), "commits in epoch order: {committed:?}");
    assert!(committed.last() <= epochs.last(), "nothing committed past the last publish: {committed:?} {epochs:?}");
    assert_eq!(report.metrics.rows_out(), 21, "every staged row counted once, at its commit");
}

/// Adds a million to the rows of port 1, so a test sees which input each row came from.
struct MarkPort;

impl crate::Operator for MarkPort {
    fn name(&self) -> &str {
        "mark_port"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.on_port_data(0, batch, out)
    }

    fn on_port_data(&mut self, port: usize, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let offset = if port == 1 { 1_000_000 } else { 0 };
        let values: Vec<i64> = super::support::values(&batch).iter().map(|v| v + offset).collect();
        out.push(Message::Data(Batch::inserts(super::support::batch(&values))));
        Ok(())
    }
}

/// Two sources into one flow: `left` is the trunk, `right` a side entering the trunk's
/// second segment as port 1; both routed by value.
fn two_input_plan(left: VecSource, right: VecSource, sink: Arc<dyn crate::SinkFactory>) -> crate::Plan {
    use crate::plan::{Flow, PartitionerFactory, Segment, SegmentOutput, SideInput};
    let by_value = || {
        let partitioner: PartitionerFactory = Arc::new(|_| Box::new(super::support::ByValue));
        SegmentOutput::Exchange { partitioner, description: "by value".into() }
    };
    let mark: crate::OperatorFactory = Arc::new(|_| Ok(Box::new(MarkPort)));
    let trunk = vec![
        Segment { operators: Vec::new(), state: None, output: by_value() },
        Segment { operators: vec![("mark".into(), mark)], state: None, output: SegmentOutput::Sink },
    ];
    let side = SideInput {
        source: 1,
        table: 0,
        segments: vec![Segment { operators: Vec::new(), state: None, output: by_value() }],
        into: 1,
        port: 1,
    };
    let flow = Flow { source: 0, table: 0, segments: trunk, sides: vec![side], sink, sink_slot: 0, tap: None };
    let plan = crate::Plan { sources: vec![Arc::new(left), Arc::new(right)], flows: vec![flow] };
    plan.assert_well_formed();
    plan
}

#[test]
fn a_flow_with_two_inputs_gets_each_row_on_its_port_and_checkpoints_across_both() {
    // The right source has one lane: the second thread sends it nothing (an idle sender
    // of port 1 that must not hold back the end or the barriers).
    let left = VecSource::new(vec![(0..30).map(|i| vec![2 * i]).collect(), vec![vec![1, 3], vec![5]]]);
    let right = VecSource::new(vec![(0..25).map(|i| vec![i, i + 100]).collect()]);
    let published = Arc::new(Mutex::new(Vec::new()));
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.exactly_once = true;
    let collected = Arc::clone(&sink.collected);
    let plan = two_input_plan(left, right, Arc::new(sink));
    let checkpointing = recorded(Duration::from_millis(1), true, &published);
    let (report, _) = run(&plan, &options(2, 2), Some(checkpointing), stop_handle());
    assert_eq!(report.outcome, RunOutcome::Completed, "{report:?}");
    let mut written: Vec<i64> = collected.written.lock().expect("lock").iter().map(|(_, v)| *v).collect();
    written.sort_unstable();
    let mut expected: Vec<i64> = (0..30).map(|i| 2 * i).chain([1, 3, 5]).collect();
    expected.extend((0..25).flat_map(|i| [1_000_000 + i, 1_000_100 + i]));
    expected.sort_unstable();
    assert_eq!(written, expected, "every row of both inputs once, marked by its port");
    let published = published.lock().expect("lock");
    let (_, positions, final_epoch) = published.last().expect("a final checkpoint");
    assert!(*final_epoch);
    let batches = |source: usize, lane: u32| {
        let bytes = &positions.iter().find(|(s, l, _)| (*s, *l) == (source, lane)).expect("every lane's position").2;
        u64::from_le_bytes(bytes.as_slice().try_into().expect("8 bytes"))
    };
    assert_eq!((batches(0, 0), batches(0, 1), batches(1, 0)), (30, 2, 25), "positions of both sources' lanes");
    assert_eq!(report.metrics.rows_out(), 83);
}

/// Holds every row it receives until flushed (a mini-batch without a row bound); counts
/// the rows it held when a snapshot was taken.
pub(crate) struct HoldAll {
    pub held: Vec<i64>,
    pub held_at_snapshots: Arc<Mutex<Vec<usize>>>,
}

impl crate::Operator for HoldAll {
    fn name(&self) -> &str {
        "hold_all"
    }

    fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.held.extend(super::support::values(&batch));
        Ok(())
    }

    fn on_flush(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if !self.held.is_empty() {
            let rows = super::support::batch(&std::mem::take(&mut self.held));
            out.push(Message::Data(Batch::inserts(rows)));
        }
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.on_flush(out)?;
        out.push(Message::EndOfData);
        Ok(())
    }

    fn snapshot_state(&mut self, _delta: bool) -> Result<Option<crate::Snapshot>, SluiceError> {
        self.held_at_snapshots.lock().expect("lock").push(self.held.len());
        Ok(Some(crate::Snapshot::empty()))
    }
}

/// One flow from `source` through an exchange by value into a segment that holds its
/// rows ([`HoldAll`]) and writes `sink`.
fn holding_plan(
    source: VecSource,
    sink: Arc<dyn crate::SinkFactory>,
    snapshots: Arc<Mutex<Vec<usize>>>,
) -> crate::Plan {
    use crate::plan::{Flow, PartitionerFactory, Segment, SegmentOutput};
    let partitioner: PartitionerFactory = Arc::new(|_| Box::new(super::support::ByValue));
    let hold: crate::OperatorFactory =
        Arc::new(move |_| Ok(Box::new(HoldAll { held: Vec::new(), held_at_snapshots: Arc::clone(&snapshots) })));
    let segments = vec![
        Segment {
            operators: Vec::new(),
            state: None,
            output: SegmentOutput::Exchange { partitioner, description: "by value".into() },
        },
        Segment {
            operators: vec![("hold".into(), hold)],
            state: Some("held rows".into()),
            output: SegmentOutput::Sink,
        },
    ];
    let plan = crate::Plan {
        sources: vec![Arc::new(source)],
        flows: vec![Flow { source: 0, table: 0, segments, sides: Vec::new(), sink, sink_slot: 0, tap: None }],
    };
    plan.assert_well_formed();
    plan
}

#[test]
fn a_held_mini_batch_leaves_when_its_thread_runs_out_of_input() {
    // The lanes hand out their rows, then wait for an hour: the rows reach the sink
    // before any end, stop or barrier, because each driver flushes before it waits.
    let mut source = VecSource::new(vec![vec![vec![1, 2], vec![3]], vec![vec![4, 5]]]);
    source.endless = true;
    let (wrote, writes) = crossbeam_channel::unbounded();
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.wrote = Some(wrote);
    let collected = Arc::clone(&sink.collected);
    let snapshots = Arc::new(Mutex::new(Vec::new()));
    let plan = holding_plan(source, Arc::new(sink), snapshots);
    let (stop, woken) = stop_handle();
    let handle = stop.clone();
    let runner = std::thread::spawn(move || run(&plan, &options(2, 4), None, (stop, woken)));
    for written in 0..5 {
        let got = writes.recv_timeout(Duration::from_secs(120));
        assert!(got.is_ok(), "only {written} of 5 rows left their mini-batches");
    }
    handle.stop();
    let (report, _) = runner.join().expect("run");
    assert_eq!(report.outcome, RunOutcome::Completed);
    let mut written: Vec<i64> = collected.written.lock().expect("lock").iter().map(|(_, v)| *v).collect();
    written.sort_unstable();
    assert_eq!(written, [1, 2, 3, 4, 5], "each row once");
}

/// The order in which one thread's two lanes hand out their batches: lane 0 jumps ahead
/// in event time, lane 1 creeps (each batch's value is its watermark); and the turns on
/// which a lane was skipped.
fn lane_order(max_drift: Option<i64>) -> (Vec<i64>, u64) {
    let lanes = vec![vec![vec![100], vec![200], vec![300]], (1..=6).map(|i| vec![i]).collect()];
    let mut source = VecSource::new(lanes);
    source.watermarks = true;
    source.max_drift = max_drift;
    let skipped = Arc::clone(&source.skipped);
    let sink = CollectSink::new(SinkParallelism::PerThread);
    let collected = Arc::clone(&sink.collected);
    let plan = plan(source, Arc::new(sink), false);
    let (report, _) = run(&plan, &options(1, 4), None, stop_handle());
    assert_eq!(report.outcome, RunOutcome::Completed);
    let written = collected.written.lock().expect("lock");
    (written.iter().map(|(_, value)| *value).collect(), skipped.load(Ordering::Relaxed))
}

#[test]
fn a_lane_too_far_ahead_of_the_slowest_waits_until_it_catches_up_or_ends() {
    // Unaligned, the driver polls the lanes in turn.
    assert_eq!(lane_order(None), (vec![100, 1, 200, 2, 300, 3, 4, 5, 6], 0));
    // Within 50 ms of the slowest: lane 0 is polled first (no lane had a watermark),
    // then waits while lane 1 is more than 50 ms behind, and goes on once lane 1 ended.
    // A held lane is told, as a blocked one is (a Kafka lane stops prefetching).
    let (order, skipped) = lane_order(Some(50));
    assert_eq!(order, [100, 1, 2, 3, 4, 5, 6, 200, 300]);
    assert!(skipped >= 5, "lane 0 was skipped on each of lane 1's turns: {skipped}");
    // Within 98 ms: lane 0 goes on once lane 1 reached 2 (100 - 2 <= 98), then waits
    // again at 200.
    assert_eq!(lane_order(Some(98)).0, [100, 1, 2, 200, 3, 4, 5, 6, 300]);
}

/// A plan of one flow: `source`'s rows through `segments` into `sink`.
fn one_flow(source: VecSource, segments: Vec<crate::plan::Segment>, sink: CollectSink) -> crate::Plan {
    let flow = crate::plan::Flow {
        source: 0,
        table: 0,
        segments,
        sides: Vec::new(),
        sink: Arc::new(sink),
        sink_slot: 0,
        tap: None,
    };
    let plan = crate::Plan { sources: vec![Arc::new(source)], flows: vec![flow] };
    plan.assert_well_formed();
    plan
}

/// Records what reaches it: `w` and a watermark, `r` and a row.
struct Seen(Arc<Mutex<Vec<String>>>);

impl crate::Operator for Seen {
    fn name(&self) -> &str {
        "seen"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let seen = super::support::values(&batch).into_iter().map(|value| format!("r{value}"));
        self.0.lock().expect("lock").extend(seen);
        out.push(Message::Data(batch));
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.0.lock().expect("lock").push(format!("w{watermark}"));
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}

/// Runs one thread's two lanes restored from a checkpoint: lane 0 after its first batch
/// (5, its watermark then), lane 1 at its end, having had no rows (so no watermark).
/// `paused`: the job starts paused and is resumed once something reached the operator
/// (then the lanes must not have been polled). Returns what reached the operator.
fn restored_two_lanes(paused: bool, tells_end_on_resume: bool) -> Vec<String> {
    let mut source = VecSource::new(vec![vec![vec![5], vec![9]], Vec::new()]);
    source.watermarks = true;
    source.tells_end_on_resume = tells_end_on_resume;
    let polls = Arc::clone(&source.polls);
    let sink = CollectSink::new(SinkParallelism::PerThread);
    let collected = Arc::clone(&sink.collected);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = Arc::clone(&seen);
    let record: crate::OperatorFactory = Arc::new(move |_| Ok(Box::new(Seen(Arc::clone(&recorder)))));
    let segments = vec![crate::plan::Segment {
        operators: vec![("seen".into(), record)],
        state: None,
        output: crate::plan::SegmentOutput::Sink,
    }];
    let plan = one_flow(source, segments, sink);
    let position = |batches: u64| batches.to_le_bytes().to_vec();
    let checkpointing = Checkpointing {
        options: CheckpointOptions {
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(60),
            exactly_once: false,
            restored_epoch: 1,
            max_failed: 3,
            checkpointer: Box::new(Recording::new(Arc::default())),
        },
        restore: Restore { positions: [((0, 0), position(1)), ((0, 1), position(0))].into(), state: None },
    };
    let (stop, woken) = stop_handle();
    if paused {
        stop.pause();
    }
    let handle = stop.clone();
    let runner = std::thread::spawn(move || run(&plan, &options(1, 4), Some(checkpointing), (stop, woken)));
    if paused {
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.lock().expect("lock").is_empty() {
            assert!(Instant::now() < deadline, "nothing went out while paused");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(polls.load(Ordering::Relaxed), 0, "a paused job polls no lane");
        handle.resume();
    }
    let (report, _) = runner.join().expect("run");
    assert_eq!(report.outcome, RunOutcome::Completed);
    let written: Vec<i64> = collected.written.lock().expect("lock").iter().map(|(_, v)| *v).collect();
    assert_eq!(written, [9], "the rows after the positions, once");
    seen.lock().expect("lock").clone()
}

#[test]
fn a_restored_thread_s_watermark_goes_out_before_its_rows_even_while_the_job_is_paused() {
    // Operators do not checkpoint their watermark: every edge's first message after a
    // restore is the thread's watermark at the checkpoint (see `exchange`), that of its
    // lanes that had not ended, less one (rows at a lane's watermark may follow). A
    // job paused when it resumes polls no lane, yet a barrier may pass meanwhile: what
    // the lanes tell without reading goes out at once.
    let seen = restored_two_lanes(true, true);
    assert_eq!(seen.first().map(String::as_str), Some("w4"), "{seen:?}");
    assert!(seen.iter().position(|s| s == "r9") > Some(0), "{seen:?}");
    // A lane that tells its end only when polled (a file range): unpaused, it is polled
    // before any lane's rows go out.
    let seen = restored_two_lanes(false, false);
    assert_eq!(seen.first().map(String::as_str), Some("w4"), "{seen:?}");
}

/// Every row to one slot.
struct ToSlot(u32);

impl crate::Partitioner for ToSlot {
    fn partition(&mut self, batch: Batch, _slots: u32, out: &mut Vec<(u32, Batch)>) -> Result<(), SluiceError> {
        out.push((self.0, batch));
        Ok(())
    }
}

#[test]
fn a_segment_tapped_by_another_flow_sends_it_every_row_and_waits_while_the_tap_is_full() {
    // One lane of 40 one-row batches of even values on thread 0: flow 0 routes them by
    // value to its segment 1 on thread 0, which writes its own sink there and taps every
    // row to flow 1 on thread 1, whose sink writes a row only when given a token. With
    // queues of one batch, the full tap holds segment 1 back, and with it flow 0's own
    // sink and the lane: the slowest reader sets the pace, and nothing is dropped.
    let lane: Vec<Vec<i64>> = (0..40).map(|i| vec![2 * i]).collect();
    let first = CollectSink::new(SinkParallelism::PerThread);
    let (tokens, gate) = crossbeam_channel::unbounded();
    let mut second = CollectSink::new(SinkParallelism::PerThread);
    second.gate = Some(gate);
    let (written_first, written_second) = (Arc::clone(&first.collected), Arc::clone(&second.collected));
    let mut plan = plan(VecSource::new(vec![lane]), Arc::new(first), true);
    let to_thread_1: crate::PartitionerFactory = Arc::new(|_| Box::new(ToSlot(1)));
    let tap = crate::Tap { flow: 0, segment: 1, partitioner: to_thread_1, description: "to thread 1".into() };
    let sink = crate::Segment { operators: Vec::new(), state: None, output: crate::SegmentOutput::Sink };
    plan.flows.push(crate::Flow {
        source: 0,
        table: 0,
        segments: vec![sink],
        sides: Vec::new(),
        sink: Arc::new(second),
        sink_slot: 0,
        tap: Some(tap),
    });
    plan.assert_well_formed();
    let metrics = Arc::new(Metrics::for_plan(&plan, 2));
    let (pace_metrics, pace_first) = (Arc::clone(&metrics), Arc::clone(&written_first));
    let releaser = std::thread::spawn(move || {
        // Waits until thread 0 is blocked on a full output, then lets the second sink go.
        let deadline = Instant::now() + Duration::from_secs(120);
        while !pace_metrics.threads[0].blocked.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "thread 0 never waited for the tap");
            std::thread::yield_now();
        }
        let ahead = pace_first.written.lock().expect("lock").len();
        for _ in 0..40 {
            tokens.send(()).expect("token");
        }
        ahead
    });
    let report = crate::run(&plan, &options(2, 1), None, stop_handle(), metrics, &mut |_| {});
    let ahead = releaser.join().expect("releaser");
    assert_eq!(report.outcome, RunOutcome::Completed, "{report:?}");
    // The first sink ran ahead of the held one by the tap's queue, its outbox and the
    // rows in hand, never by the whole input.
    assert!(ahead <= 4, "flow 0's sink wrote {ahead} rows while the tap's reader wrote none");
    let rows = |collected: &super::support::Collected| {
        let mut rows = collected.written.lock().expect("lock").clone();
        rows.sort_unstable();
        rows
    };
    assert_eq!(rows(&written_first), (0..40).map(|i| (0, 2 * i)).collect::<Vec<_>>(), "every row once");
    assert_eq!(rows(&written_second), (0..40).map(|i| (1, 2 * i)).collect::<Vec<_>>(), "every row once, tapped");
    let edges = report.metrics.edges_blocked();
    let tap = edges.iter().find(|(edge, _)| edge == "sink collect, segment 1 → sink collect");
    assert!(tap.is_some_and(|(_, ns)| *ns > 0), "the tap's edge was full: {edges:?}");
}

/// The rows a sink wrote, and a list of lags to add to.
type Watch = (Arc<super::support::Collected>, Arc<Mutex<Vec<usize>>>);

/// At each watermark `w` holds `parts` rows (-1000 × (w + 1), less 0, 1, ...), emitted
/// one a part ([`crate::Operator::has_more`]), then the watermark.
struct Burst {
    parts: i64,
    held: std::collections::VecDeque<Message>,
    /// When set: the rows a sink wrote, and at each resume the rows this operator
    /// emitted that the sink had not written yet.
    watch: Option<Watch>,
    emitted: usize,
}

impl crate::Operator for Burst {
    fn name(&self) -> &str {
        "burst"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.emitted += batch.num_rows();
        out.push(Message::Data(batch));
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let rows = (0..self.parts)
            .map(|part| Message::Data(Batch::inserts(super::support::batch(&[-1000 * (watermark + 1) - part]))));
        self.held.extend(rows);
        self.held.push_back(Message::Watermark(watermark));
        self.on_resume(out)
    }

    fn has_more(&self) -> bool {
        !self.held.is_empty()
    }

    fn on_resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if let Some((collected, lags)) = &self.watch {
            let written = collected.written.lock().expect("lock").len();
            lags.lock().expect("lock").push(self.emitted - written);
        }
        self.emitted += 1;
        out.push(self.held.pop_front().expect("held output"));
        if let Some(Message::Watermark(_)) = self.held.front() {
            out.push(self.held.pop_front().expect("the watermark"));
        }
        Ok(())
    }
}

/// Records what reaches it as [`Seen`] does, and `b` and a barrier's epoch.
struct SeenWithBarriers(Seen);

impl crate::Operator for SeenWithBarriers {
    fn name(&self) -> &str {
        "seen"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.0.on_data(batch, out)
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.0.on_watermark(watermark, out)
    }

    fn on_barrier(&mut self, epoch: sluice_types::Epoch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.0.0.lock().expect("lock").push(format!("b{}", epoch.0));
        out.push(Message::Barrier(epoch));
        Ok(())
    }
}

#[test]
fn a_watermark_s_output_held_in_parts_goes_out_whole_before_any_row_or_barrier_after_it() {
    // One lane of 30 one-row batches, a watermark after each, and a checkpoint due every
    // millisecond: each watermark's 40 held rows leave a part a turn, and the rows and
    // barriers that arrive meanwhile wait until its last part and the watermark left.
    const PARTS: i64 = 40;
    let mut source = VecSource::new(vec![(1..=30).map(|i| vec![i]).collect()]);
    source.watermarks = true;
    let sink = CollectSink::new(SinkParallelism::PerThread);
    let collected = Arc::clone(&sink.collected);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = Arc::clone(&seen);
    let burst: crate::OperatorFactory =
        Arc::new(|_| Ok(Box::new(Burst { parts: PARTS, held: Default::default(), watch: None, emitted: 0 })));
    let record: crate::OperatorFactory = Arc::new(move |_| Ok(Box::new(SeenWithBarriers(Seen(Arc::clone(&recorder))))));
    let segments = vec![crate::plan::Segment {
        operators: vec![("burst".into(), burst), ("seen".into(), record)],
        state: None,
        output: crate::plan::SegmentOutput::Sink,
    }];
    let plan = one_flow(source, segments, sink);
    let published = Arc::new(Mutex::new(Vec::new()));
    let checkpointing = recorded(Duration::from_millis(1), false, &published);
    let (report, _) = run(&plan, &options(1, 4), Some(checkpointing), stop_handle());
    assert_eq!(report.outcome, RunOutcome::Completed);
    let seen = seen.lock().expect("lock").clone();
    // From a watermark's first held row to the watermark, nothing else.
    let mut index = 0;
    let mut watermarks = 0;
    while index < seen.len() {
        let Some(held) = seen[index].strip_prefix("r-") else {
            index += 1;
            continue;
        };
        let watermark = held.parse::<i64>().expect("a value") / 1000 - 1;
        let expected: Vec<String> = (0..PARTS)
            .map(|part| format!("r-{}", 1000 * (watermark + 1) + part))
            .chain([format!("w{watermark}")])
            .collect();
        let end = (index + expected.len()).min(seen.len());
        assert_eq!(seen[index..end], expected[..], "at {index}: {seen:?}");
        index = end;
        watermarks += 1;
    }
    assert!(watermarks >= 1, "{seen:?}");
    let rows = collected.written.lock().expect("lock").len() as i64;
    assert_eq!(rows, 30 + watermarks * PARTS, "every row and every held row reached the sink once");
    assert!(!published.lock().expect("lock").is_empty(), "checkpoints were taken");
}

#[test]
fn a_watermark_s_held_output_leaves_a_part_at_a_time_as_a_slow_consumer_makes_room() {
    // Thread 0 reads one row and its watermark, whose 40 held rows all go to thread 1's
    // sink, which writes a row only when given a token, through a queue of one batch.
    // Each part leaves once the previous one left the thread: at each resume, at most
    // one row in the queue and one in the sink's hands are not written yet.
    const PARTS: i64 = 40;
    let mut source = VecSource::new(vec![vec![vec![1]]]);
    source.watermarks = true;
    let (tokens, gate) = crossbeam_channel::unbounded();
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.gate = Some(gate);
    let collected = Arc::clone(&sink.collected);
    let lags = Arc::new(Mutex::new(Vec::new()));
    let watch = (Arc::clone(&collected), Arc::clone(&lags));
    let burst: crate::OperatorFactory = Arc::new(move |context| {
        let watch = (context.thread == 0).then(|| watch.clone());
        Ok(Box::new(Burst { parts: PARTS, held: Default::default(), watch, emitted: 0 }))
    });
    let to_thread_1: crate::PartitionerFactory = Arc::new(|_| Box::new(ToSlot(1)));
    let segments = vec![
        crate::plan::Segment {
            operators: vec![("burst".into(), burst)],
            state: None,
            output: crate::plan::SegmentOutput::Exchange { partitioner: to_thread_1, description: "to 1".into() },
        },
        crate::plan::Segment { operators: Vec::new(), state: None, output: crate::plan::SegmentOutput::Sink },
    ];
    let plan = one_flow(source, segments, sink);
    let rows = 1 + PARTS as usize;
    let metrics = Arc::new(Metrics::for_plan(&plan, 2));
    let pace_lags = Arc::clone(&lags);
    // A slow consumer, paced by events: token k (the sink's k-th write) once the
    // operator resumed k + 2 times, so that a resume finds two rows unwritten (the
    // second does, with none written), until the last part, when the rest are given.
    let releaser = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        for sent in 0..rows {
            loop {
                let resumes = pace_lags.lock().expect("lock").len();
                if resumes >= sent + 2 || resumes >= PARTS as usize {
                    break;
                }
                assert!(Instant::now() < deadline, "the operator resumed {resumes} times with {sent} rows written");
                std::thread::yield_now();
            }
            tokens.send(()).expect("token");
        }
    });
    let report = crate::run(&plan, &options(2, 1), None, stop_handle(), metrics, &mut |_| {});
    releaser.join().expect("releaser");
    assert_eq!(report.outcome, RunOutcome::Completed);
    assert_eq!(collected.written.lock().expect("lock").len(), rows, "nothing was dropped");
    let lags = lags.lock().expect("lock").clone();
    assert_eq!(lags.len(), PARTS as usize, "a resume per part (the watermark emits the first)");
    assert!(lags.iter().all(|&lag| lag <= 2), "rows emitted but not written at each resume: {lags:?}");
    assert!(lags.contains(&2), "the queue was full: {lags:?}");
}

#[test]
fn held_sources_poll_no_lane_while_checkpoints_start_back_to_back_and_go_on_once_let_go() {
    // An operator's state that only a commit frees holds the sources back: no lane is
    // read, and checkpoints start one after another although the interval is an hour.
    // Let go, the lanes are read to their end, every row once.
    let lanes = vec![(0..10).map(|i| vec![i]).collect::<Vec<_>>()];
    let source = VecSource::new(lanes);
    let polls = Arc::clone(&source.polls);
    let published = Arc::new(Mutex::new(Vec::new()));
    let sink = CollectSink::new(SinkParallelism::PerThread);
    let collected = Arc::clone(&sink.collected);
    let plan = plan(source, Arc::new(sink), false);
    let checkpointing = recorded(Duration::from_secs(3600), false, &published);
    let (stop, woken) = stop_handle();
    stop.hold_sources(true);
    let handle = stop.clone();
    let runner = std::thread::spawn(move || run(&plan, &options(1, 4), Some(checkpointing), (stop, woken)));
    let deadline = Instant::now() + Duration::from_secs(60);
    while published.lock().expect("lock").len() < 3 {
        assert!(Instant::now() < deadline, "no checkpoints while held: {:?}", published.lock().expect("lock"));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(polls.load(Ordering::Relaxed), 0, "held sources poll no lane");
    assert!(handle.is_held() && !handle.is_paused(), "a hold is not a pause");
    handle.hold_sources(false);
    let (report, _) = runner.join().expect("run");
    assert_eq!(report.outcome, RunOutcome::Completed);
    let mut written: Vec<i64> = collected.written.lock().expect("lock").iter().map(|(_, v)| *v).collect();
    written.sort();
    assert_eq!(written, (0..10).collect::<Vec<_>>(), "every row once");
}
