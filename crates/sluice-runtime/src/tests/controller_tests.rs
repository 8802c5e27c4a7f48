//! The controller: a run ends with one outcome, whatever happens on its threads; a stop
//! drains; a failure names its component; a panic on any thread fails the run.

use std::sync::Arc;

use crate::plan::SinkParallelism;
use crate::{RunEvent, RunOutcome, stop_handle};

use super::support::{CollectSink, VecSource, options, plan, run};

#[test]
fn a_stop_drains_an_endless_run_and_completes() {
    let mut source = VecSource::new(vec![vec![vec![1], vec![2]], vec![vec![3]]]);
    source.endless = true;
    let (wrote, writes) = crossbeam_channel::unbounded();
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.wrote = Some(wrote);
    let collected = Arc::clone(&sink.collected);
    let plan = plan(source, Arc::new(sink), true);
    let (stop, woken) = stop_handle();
    let handle = stop.clone();
    let runner = std::thread::spawn(move || run(&plan, &options(2, 4), None, (stop, woken)));
    // The stop comes once every row was written (an event): then the lanes only wait.
    for _ in 0..3 {
        writes.recv().expect("a write");
    }
    handle.stop();
    let (report, events) = runner.join().expect("run");
    assert_eq!(report.outcome, RunOutcome::Completed);
    assert!(report.stopped);
    assert_eq!(events, [RunEvent::Started, RunEvent::Stopping]);
    assert_eq!(collected.written.lock().expect("lock").len(), 3);
}

#[test]
fn a_failing_lane_fails_the_run_naming_the_lane_and_the_cause() {
    let mut source = VecSource::new(vec![vec![vec![1]], vec![vec![2]]]);
    source.failing_lane = Some(1);
    let plan = plan(source, Arc::new(CollectSink::new(SinkParallelism::PerThread)), true);
    let (report, _) = run(&plan, &options(2, 4), None, stop_handle());
    match report.outcome {
        RunOutcome::Failed { component, error } => {
            assert_eq!(component, "source numbers lane 1");
            assert_eq!(error.code, "test.lane");
        }
        other => panic!("the run should fail: {other:?}"),
    }
}

#[test]
fn a_panic_on_one_thread_fails_the_run_while_the_other_could_go_on() {
    // Thread 0's lane never ends; thread 1's sink panics on its first row. Without an
    // exchange between them, thread 0 alone would run forever.
    let mut source = VecSource::new(vec![vec![vec![2]], vec![vec![1]]]);
    source.endless = true;
    let mut sink = CollectSink::new(SinkParallelism::PerThread);
    sink.panic_on_slot = Some(1);
    let plan = plan(source, Arc::new(sink), false);
    let (report, _) = run(&plan, &options(2, 4), None, stop_handle());
    match report.outcome {
        RunOutcome::Failed { component, error } => {
            assert_eq!(component, "driver 1");
            assert_eq!(error.kind, sluice_types::ErrorKind::Panic);
            assert!(error.message.contains("a bug in the sink of slot 1"), "{}", error.message);
        }
        other => panic!("the run should fail: {other:?}"),
    }
}
