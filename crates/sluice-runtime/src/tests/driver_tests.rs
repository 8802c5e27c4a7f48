//! The driver's scheduling: lanes spread over threads, rows routed through the exchange,
//! a full queue stops the lanes that feed it (backpressure), barriers record positions.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointOptions, Restore};
use crate::plan::SinkParallelism;
use crate::{Checkpointing, Metrics, RunOutcome, stop_handle};

use super::support::{CollectSink, Recording, VecSource, options, plan, run};

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
}

#[test]
fn positions_in_a_checkpoint_are_those_of_the_rows_before_its_barrier() {
    let lanes = vec![(0..20).map(|i| vec![i]).collect::<Vec<_>>(), vec![vec![100]]];
    let published = Arc::new(Mutex::new(Vec::new()));
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.exactly_once = true;
    let collected = Arc::clone(&sink.collected);
    let plan = plan(VecSource::new(lanes), Arc::new(sink), false);
    let checkpointing = Checkpointing {
        options: CheckpointOptions {
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(60),
            exactly_once: true,
            restored_epoch: 0,
            max_failed: 3,
            checkpointer: Box::new(Recording::new(Arc::clone(&published))),
        },
        restore: Restore::default(),
    };
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
