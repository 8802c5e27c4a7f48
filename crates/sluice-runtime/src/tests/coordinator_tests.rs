//! The coordinator's protocol in one worker's hands, step by step: regressions the
//! simulation (`simulation`) found, each pinned here as a plain sequence of calls.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_types::{Epoch, SluiceError};

use crate::checkpoint::{CheckpointOptions, Checkpointer, ManifestSlice};
use crate::coordinator::{Cluster, Completed, Coordinator};
use crate::driver::Control;
use crate::metrics::Metrics;
use crate::peers::SendToWorker;

/// Writes nothing, publishes everything.
struct Accepting;

impl Checkpointer for Accepting {
    fn write_part(&mut self, _epoch: Epoch, _slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        Ok(Vec::new())
    }

    fn publish(&mut self, _epoch: Epoch, _parts: Vec<Vec<u8>>, _final_epoch: bool) -> Result<u64, SluiceError> {
        Ok(0)
    }
}

/// A leader of worker 1, with one driver thread of its own; what it sends to worker 1
/// lands in the returned list.
fn leader() -> (Coordinator, Arc<Mutex<Vec<ToWorker>>>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&sent);
    let send: SendToWorker = Box::new(move |_worker, message| {
        log.lock().expect("lock").push(message);
        Ok(())
    });
    let options = CheckpointOptions {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(60),
        exactly_once: true,
        restored_epoch: 0,
        max_failed: 1,
        checkpointer: Box::new(Accepting),
    };
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 2));
    let cluster = Some(Cluster::Lead { others: vec![1], send });
    (Coordinator::new(options, Vec::new(), metrics, Instant::now(), cluster, 0), sent)
}

#[test]
fn after_a_stops_final_checkpoint_the_leader_does_not_wait_for_workers_the_stop_paused() {
    let (mut coordinator, sent) = leader();
    let (control, controls) = crossbeam_channel::unbounded();
    let running = BTreeSet::from([0]);
    coordinator.request_stop(&running, &[control]);
    assert!(matches!(controls.try_recv(), Ok(Control::FinalBarrier(Epoch(1)))));
    assert_eq!(coordinator.on_ack(0, Epoch(1), ManifestSlice::default()), Ok(Completed::Nothing));
    let acked = ToLeader::Acked { epoch: 1, part: Vec::new() };
    assert_eq!(coordinator.on_worker(1, acked), Ok(Completed::Nothing));
    let written = coordinator.results().recv_timeout(Duration::from_secs(30)).expect("the writer answers");
    assert_eq!(coordinator.on_written(written), Ok(Completed::Final));
    assert!(sent.lock().expect("lock").contains(&ToWorker::Commit { epoch: 1, final_epoch: true }));
    // Worker 1's lanes were paused, not ended: it never says DriversFinished. Once this
    // worker's drivers left, the run is complete all the same (the seed-8 regression:
    // the leader waited until shutdown_timeout failed the run).
    assert!(coordinator.others_finished());
    assert_eq!(coordinator.end_of_input(Instant::now()), Ok(Completed::Final));
}

/// A coordinator alone, checkpointing every `interval`, created at `at`.
fn alone(interval: Duration, at: Instant) -> Coordinator {
    let options = CheckpointOptions {
        interval,
        timeout: Duration::from_secs(60),
        exactly_once: true,
        restored_epoch: 0,
        max_failed: 1,
        checkpointer: Box::new(Accepting),
    };
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    Coordinator::new(options, Vec::new(), metrics, at, None, 0)
}

/// Runs the checkpoint that is due at `at` to its commit.
fn checkpoint_at(coordinator: &mut Coordinator, at: Instant, epoch: u64) {
    let (control, controls) = crossbeam_channel::unbounded();
    let running = BTreeSet::from([0]);
    assert_eq!(coordinator.tick(at, &running, &[control]), Ok(Completed::Nothing));
    assert!(matches!(controls.try_recv(), Ok(Control::Barrier(Epoch(e))) if e == epoch));
    assert_eq!(coordinator.on_ack(0, Epoch(epoch), ManifestSlice::default()), Ok(Completed::Nothing));
    let written = coordinator.results().recv_timeout(Duration::from_secs(30)).expect("the writer answers");
    assert_eq!(coordinator.on_written(written), Ok(Completed::Checkpoint));
}

/// As Flink's checkpoint interval: from one checkpoint's start to the next one's, so a
/// checkpoint's duration does not stretch the input the next one writes; one that took
/// longer than the interval is followed at once.
#[test]
fn the_next_checkpoint_is_due_an_interval_after_the_previous_one_started() {
    let interval = Duration::from_secs(3600);
    let start = Instant::now();
    let mut coordinator = alone(interval, start);
    assert_eq!(coordinator.next_due(), Some(start + interval));
    checkpoint_at(&mut coordinator, start + interval, 1);
    assert_eq!(coordinator.next_due(), Some(start + 2 * interval), "due an interval after the first started");

    // A checkpoint started 10 s ago, with a 1 s interval, is followed at once.
    let interval = Duration::from_secs(1);
    let long_ago = Instant::now().checked_sub(Duration::from_secs(11)).expect("a monotonic clock 11 s past its start");
    let mut coordinator = alone(interval, long_ago);
    checkpoint_at(&mut coordinator, long_ago + interval, 1);
    let due = coordinator.next_due().expect("a checkpoint is due");
    assert!(due <= Instant::now(), "due at once after a checkpoint longer than the interval");
}
