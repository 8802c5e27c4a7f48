//! The coordinator alone: timeouts, a stop during a checkpoint, pause percentiles.
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_types::{Epoch, SluiceError};

use super::{CheckpointRecord, CheckpointStats, Completed, Coordinator};
use crate::checkpoint::{CheckpointOptions, Checkpointer, ManifestSlice, SinkRecord};
use crate::driver::Control;

/// Records the epochs it publishes.
struct Recording(Arc<Mutex<Vec<(u64, bool)>>>);

impl Checkpointer for Recording {
    fn write_part(&mut self, _epoch: Epoch, _slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        Ok(Vec::new())
    }

    fn publish(&mut self, epoch: Epoch, parts: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError> {
        assert_eq!(parts, [Vec::<u8>::new()], "one worker's part");
        self.0.lock().expect("lock").push((epoch.0, final_epoch));
        Ok(0)
    }
}

/// Acks `epoch` for the only driver and waits for the writer's answer.
fn ack_and_write(coordinator: &mut Coordinator, epoch: u64) -> Completed {
    let submitted = coordinator.on_ack(0, Epoch(epoch), ManifestSlice::default()).expect("ack");
    assert_eq!(submitted, Completed::Nothing, "the write happens on the writer thread");
    let written = coordinator.results().recv_timeout(Duration::from_secs(30)).expect("the writer answers");
    coordinator.on_written(written).expect("written")
}

/// A coordinator of one driver thread, checkpointing every hour (ticks decide).
fn coordinator(published: &Arc<Mutex<Vec<(u64, bool)>>>, max_failed: u32, now: Instant) -> Coordinator {
    let options = CheckpointOptions {
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(60),
        exactly_once: true,
        restored_epoch: 0,
        max_failed,
        checkpointer: Box::new(Recording(Arc::clone(published))),
    };
    let metrics = Arc::new(crate::metrics::Metrics::new(Vec::new(), Vec::new(), 1));
    Coordinator::new(options, Vec::new(), metrics, now, None, 0)
}

#[test]
fn a_barrier_not_acknowledged_in_time_fails_the_checkpoint_naming_the_thread_and_where_it_waits() {
    let published = Arc::new(Mutex::new(Vec::new()));
    let now = Instant::now();
    let mut coordinator = coordinator(&published, 2, now);
    let (control, controls) = crossbeam_channel::unbounded();
    let senders = [control];
    let running = BTreeSet::from([0]);
    let due = now + Duration::from_secs(3600);
    assert_eq!(coordinator.tick(due, &running, &senders), Ok(Completed::Nothing));
    assert!(matches!(controls.try_recv(), Ok(Control::Barrier(Epoch(1)))));
    coordinator.metrics.threads[0].set_barrier_at(Some("waits at flow to sink `out`, segment 1 (slow)".into()));
    // Before the timeout nothing happens; at it the checkpoint fails, once.
    assert_eq!(coordinator.tick(due + Duration::from_secs(59), &running, &senders), Ok(Completed::Nothing));
    assert_eq!(coordinator.tick(due + Duration::from_secs(60), &running, &senders), Ok(Completed::Checkpoint));
    assert_eq!((coordinator.stats.failed, coordinator.stats.published), (1, 0));
    assert!(controls.try_recv().is_err(), "no second barrier while the first is unanswered");
    // The late ack completes nothing: the checkpoint was abandoned, its records carried on.
    let mut slice = ManifestSlice::default();
    let record = SinkRecord { flow: 0, epoch: 1, record: b"record".to_vec(), rows: 3 };
    slice.sink_records.push(record.clone());
    assert_eq!(coordinator.on_ack(0, Epoch(1), slice).expect("late ack"), Completed::Checkpoint);
    assert_eq!(coordinator.uncommitted, [record]);
    assert!(published.lock().expect("lock").is_empty());
    // A second barrier that is never answered reaches max_failed_checkpoints = 2.
    let later = Instant::now() + Duration::from_secs(7200);
    assert_eq!(coordinator.tick(later, &running, &senders), Ok(Completed::Nothing));
    assert!(matches!(controls.try_recv(), Ok(Control::Barrier(Epoch(2)))));
    let error = coordinator.tick(later + Duration::from_secs(60), &running, &senders).expect_err("fails the run");
    assert_eq!(error.code, "checkpoint.timeout");
    let text = error.to_string();
    assert!(text.contains("checkpoint 2 was not acknowledged within timeout = 60s"), "{text}");
    assert!(text.contains("thread 0 waits at flow to sink `out`, segment 1 (slow)"), "{text}");
    assert!(text.contains("max_failed_checkpoints = 2") && text.contains("fix:"), "{text}");
}

#[test]
fn a_stop_during_a_checkpoint_takes_the_final_one_right_after() {
    let published = Arc::new(Mutex::new(Vec::new()));
    let now = Instant::now();
    let mut coordinator = coordinator(&published, 3, now);
    let (control, controls) = crossbeam_channel::unbounded();
    let senders = [control];
    let running = BTreeSet::from([0]);
    assert_eq!(coordinator.tick(now + Duration::from_secs(3600), &running, &senders), Ok(Completed::Nothing));
    assert!(matches!(controls.try_recv(), Ok(Control::Barrier(Epoch(1)))));
    // The stop arrives while epoch 1 is in flight: no second barrier yet.
    coordinator.request_stop(&running, &senders);
    assert!(controls.try_recv().is_err());
    assert_eq!(ack_and_write(&mut coordinator, 1), Completed::Checkpoint);
    // As soon as epoch 1 is committed, the final checkpoint starts.
    coordinator.request_stop(&running, &senders);
    assert!(matches!(controls.try_recv(), Ok(Control::FinalBarrier(Epoch(2)))));
    assert_eq!(ack_and_write(&mut coordinator, 2), Completed::Final);
    assert_eq!(*published.lock().expect("lock"), [(1, false), (2, true)]);
    assert_eq!(coordinator.stats.published, 2);
}

fn with_pauses(pauses: impl IntoIterator<Item = u64>) -> CheckpointStats {
    let history = pauses
        .into_iter()
        .enumerate()
        .map(|(i, pause_ms)| CheckpointRecord {
            epoch: i as u64 + 1,
            state_bytes: 0,
            written_bytes: 0,
            pause_ms,
            duration_ms: 0,
        })
        .collect();
    CheckpointStats { history, ..CheckpointStats::default() }
}

#[test]
fn pause_percentiles_take_the_nearest_rank() {
    let hundred = with_pauses((1..=100).rev());
    assert_eq!(hundred.pause_percentile(50.0), Some(50));
    assert_eq!(hundred.pause_percentile(99.0), Some(99));
    assert_eq!(hundred.pause_percentile(100.0), Some(100));
    assert_eq!(hundred.pause_percentile(0.0), Some(1));
    assert_eq!(with_pauses([7]).pause_percentile(99.0), Some(7));
    assert_eq!(CheckpointStats::default().pause_percentile(99.0), None);
}
