//! The checkpoint coordinator: the controller's side of the protocol in
//! [`crate::checkpoint`]. It decides when barrier `e` starts, collects every driver's
//! slice, has the [`Checkpointer`](crate::checkpoint::Checkpointer) persist and publish
//! the manifest, and only then commits the sinks.
//!
//! Rules it keeps:
//! - One epoch in flight at a time; epochs strictly increase, from one past the restored
//!   epoch.
//! - A driver that finished (its lanes ended) before acking the epoch in flight
//!   contributes its final slice to that epoch; one that had acked it contributes to the
//!   next (its end-of-input output came after the barrier). Its lanes' final positions
//!   join every later manifest, below any position a live driver reported.
//! - Sink records of an epoch whose checkpoint failed stay uncommitted and ride along in
//!   the next manifest, so staged output is never orphaned; they are committed, in epoch
//!   order, right after that manifest is published.
//! - Once every driver acked, the slice goes to the *writer*, a thread of its own that
//!   encodes the state copies and has the [`Checkpointer`](crate::checkpoint::Checkpointer)
//!   write and publish them, so the controller keeps answering drivers, stop requests
//!   and deadlines meanwhile. The result comes back through [`Coordinator::results`];
//!   the next barrier starts only after it (one checkpoint at a time, from barrier to
//!   commit).
//! - A stop requested while a checkpoint is in flight or being written starts the final
//!   checkpoint as soon as that one completes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use sluice_types::{Epoch, ErrorKind, SluiceError, panic_message};

use crate::checkpoint::{CheckpointOptions, Checkpointer, LanePosition, ManifestSlice, SinkRecord, commit_in_order};
use crate::controller::CONTROL_ARGUMENT;
use crate::driver::Control;
use crate::mailbox::{Posted, post};
use crate::metrics::Metrics;
use crate::plan::SinkFactory;

struct InFlight {
    epoch: Epoch,
    waiting: BTreeSet<u32>,
    slice: ManifestSlice,
    /// Sink records produced before this barrier but not yet in a published manifest.
    carried: Vec<SinkRecord>,
    final_epoch: bool,
    started: Instant,
    /// When the next `timeout` without every ack expires.
    deadline: Instant,
    /// The barrier was not acknowledged in time: the checkpoint failed, and is dropped
    /// (its sink records carried on) once the late acks are in.
    timed_out: bool,
}

/// A checkpoint whose slice the writer has.
struct Writing {
    epoch: Epoch,
    /// Every sink record in the manifest being written, committed once it is published.
    records: Vec<SinkRecord>,
    final_epoch: bool,
    started: Instant,
    pause_ms: u64,
}

/// The writer's answer for one checkpoint: the bytes of state written, or the failure.
#[derive(Debug)]
pub(crate) struct Written {
    epoch: Epoch,
    result: Result<u64, SluiceError>,
}

#[derive(Debug)]
struct WriteRequest {
    epoch: Epoch,
    slice: ManifestSlice,
    final_epoch: bool,
}

/// Why the writer's two channels (capacity 1) never fill: a request is sent only when no
/// checkpoint is being written (`Coordinator::writing` is empty), and the writer answers
/// each request once, before taking the next.
const WRITER_ARGUMENT: &str = "one checkpoint is written at a time";

/// The writer thread: encodes each slice's state copies, then writes and publishes it.
/// It ends when the coordinator (the request sender) is gone.
fn spawn_writer(mut checkpointer: Box<dyn Checkpointer>) -> (Sender<WriteRequest>, Receiver<Written>) {
    let (requests, incoming) = bounded::<WriteRequest>(1);
    let (answers, results) = bounded::<Written>(1);
    let spawned = std::thread::Builder::new().name("sluice-checkpoint".into()).spawn(move || {
        for WriteRequest { epoch, mut slice, final_epoch } in incoming {
            // A panic (a bug in a snapshot job or the checkpointer) fails the run with its
            // message, never leaves the controller waiting for an answer.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                slice.encode_deferred().and_then(|()| {
                    sluice_types::failpoint!("checkpoint.after_encode");
                    let state_bytes = slice.states.iter().map(|s| s.bytes.len() as u64).sum();
                    checkpointer.checkpoint(epoch, slice, final_epoch).map(|()| state_bytes)
                })
            }))
            .unwrap_or_else(|panic| {
                let message = format!("the checkpoint writer panicked: {}", panic_message(&*panic));
                Err(SluiceError::internal("run.panic", message).with_kind(ErrorKind::Panic))
            });
            // One checkpoint at a time: the answer channel holds the one answer.
            if post(&answers, Written { epoch, result }, WRITER_ARGUMENT) == Posted::ReceiverGone {
                return;
            }
        }
    });
    // Without the thread every request fails at once (its channel is closed), which the
    // coordinator reports as a failed checkpoint.
    if let Err(error) = spawned {
        tracing::error!(%error, "the checkpoint writer thread could not start");
    }
    (requests, results)
}

/// What completing a checkpoint led to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    Nothing,
    /// A regular checkpoint was published (or failed and will be retried).
    Checkpoint,
    /// The final checkpoint was published and committed: drivers may exit.
    Final,
}

pub(crate) struct Coordinator {
    interval: Duration,
    timeout: Duration,
    /// Where each driver's barrier waits, for the timeout's message.
    metrics: Arc<Metrics>,
    exactly_once: bool,
    max_failed: u32,
    sinks: Vec<Arc<dyn SinkFactory>>,
    next_epoch: Epoch,
    next_due: Instant,
    in_flight: Option<InFlight>,
    writing: Option<Writing>,
    requests: Sender<WriteRequest>,
    results: Receiver<Written>,
    finished_positions: Vec<LanePosition>,
    uncommitted: Vec<SinkRecord>,
    failed_in_a_row: u32,
    stopping: bool,
    final_started: bool,
    final_done: bool,
    pub stats: CheckpointStats,
}

/// What the report says about checkpoints.
#[derive(Debug, Clone, Default)]
pub struct CheckpointStats {
    pub published: u64,
    pub failed: u64,
    pub last_epoch: u64,
    /// Bytes of operator state in the largest published checkpoint.
    pub max_state_bytes: u64,
    /// Longest time from barrier injection to the last driver's ack (alignment and state
    /// copies: the pause processing sees).
    pub max_pause_ms: u64,
    /// Longest time from barrier injection to the manifest published.
    pub max_duration_ms: u64,
    /// Each published checkpoint, oldest first (the first [`HISTORY_KEPT`]).
    pub history: Vec<CheckpointRecord>,
}

/// One published checkpoint in [`CheckpointStats::history`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub epoch: u64,
    pub state_bytes: u64,
    pub pause_ms: u64,
    pub duration_ms: u64,
}

/// Most checkpoints [`CheckpointStats::history`] keeps (a day of checkpoints every 10 s).
pub const HISTORY_KEPT: usize = 8_640;

impl CheckpointStats {
    /// The `percent`-th percentile of the recorded pauses (nearest rank), if any.
    pub fn pause_percentile(&self, percent: f64) -> Option<u64> {
        let mut sorted: Vec<u64> = self.history.iter().map(|record| record.pause_ms).collect();
        sorted.sort_unstable();
        let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
    }
}

impl Coordinator {
    pub(crate) fn new(
        options: CheckpointOptions,
        sinks: Vec<Arc<dyn SinkFactory>>,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Coordinator {
        let CheckpointOptions { interval, timeout, exactly_once, restored_epoch, max_failed, checkpointer } = options;
        let (requests, results) = spawn_writer(checkpointer);
        Coordinator {
            interval,
            timeout,
            metrics,
            exactly_once,
            max_failed,
            sinks,
            next_epoch: Epoch(restored_epoch + 1),
            next_due: now + interval,
            in_flight: None,
            writing: None,
            requests,
            results,
            finished_positions: Vec::new(),
            uncommitted: Vec::new(),
            failed_in_a_row: 0,
            stopping: false,
            final_started: false,
            final_done: false,
            stats: CheckpointStats::default(),
        }
    }

    /// The writer's answers, for the controller to wait on with its other events.
    pub(crate) fn results(&self) -> &Receiver<Written> {
        &self.results
    }

    /// No checkpoint between its barrier and its commit.
    fn idle(&self) -> bool {
        self.in_flight.is_none() && self.writing.is_none()
    }

    pub(crate) fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    pub(crate) fn first_epoch(&self) -> u64 {
        self.next_epoch.0
    }

    /// When the next regular barrier is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        (self.idle() && !self.stopping).then_some(self.next_due)
    }

    /// When the barrier in flight times out, if one is in flight.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.in_flight.as_ref().map(|in_flight| in_flight.deadline)
    }

    /// Starts a regular checkpoint when one is due, or the final one once a stop was
    /// requested and no checkpoint is under way; fails the checkpoint in flight when its
    /// barrier was not acknowledged within `timeout`.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        running: &BTreeSet<u32>,
        controls: &[Sender<Control>],
    ) -> Result<Completed, SluiceError> {
        if self.in_flight.as_ref().is_some_and(|in_flight| now >= in_flight.deadline) {
            return self.time_out(now);
        }
        self.start_due(now, running, controls);
        Ok(Completed::Nothing)
    }

    /// Starts the checkpoint that is due, if no checkpoint is under way.
    fn start_due(&mut self, now: Instant, running: &BTreeSet<u32>, controls: &[Sender<Control>]) {
        if !self.idle() || running.is_empty() {
            return;
        }
        if self.stopping {
            if !self.final_started && !self.final_done {
                self.final_started = true;
                self.start(running, controls, true, now);
            }
        } else if now >= self.next_due {
            self.start(running, controls, false, now);
        }
    }

    /// The barrier in flight was not acknowledged within `timeout`: the checkpoint fails,
    /// naming every thread that did not answer and where its barrier waits.
    fn time_out(&mut self, now: Instant) -> Result<Completed, SluiceError> {
        let in_flight = self.in_flight.as_mut().expect("a timeout needs a barrier in flight");
        in_flight.timed_out = true;
        in_flight.deadline = now + self.timeout;
        self.stats.failed += 1;
        self.failed_in_a_row += 1;
        let waiting: Vec<String> = in_flight
            .waiting
            .iter()
            .map(|&thread| format!("thread {thread} {}", self.metrics.threads[thread as usize].barrier_at()))
            .collect();
        let error = SluiceError::external(
            "checkpoint.timeout",
            format!(
                "checkpoint {} was not acknowledged within timeout = {}: {}",
                in_flight.epoch.0,
                crate::controller::humanize(self.timeout),
                waiting.join("; ")
            ),
        )
        .with_fix("find what holds that thread back (a slow sink, a long step), or raise [checkpoint] timeout");
        tracing::warn!(%error, "checkpoint timed out; the next one waits for its late acknowledgements");
        if in_flight.final_epoch || self.failed_in_a_row >= self.max_failed {
            return Err(error.context(format!(
                "{} checkpoint(s) failed in a row (max_failed_checkpoints = {})",
                self.failed_in_a_row, self.max_failed
            )));
        }
        Ok(Completed::Checkpoint)
    }

    fn start(&mut self, running: &BTreeSet<u32>, controls: &[Sender<Control>], final_epoch: bool, now: Instant) {
        let epoch = self.next_epoch;
        self.next_epoch = Epoch(epoch.0 + 1);
        for thread in running {
            let control = if final_epoch { Control::FinalBarrier(epoch) } else { Control::Barrier(epoch) };
            // A driver that already left reports Finished; it is no longer waited for then.
            let _gone = post(&controls[*thread as usize], control, CONTROL_ARGUMENT);
        }
        tracing::debug!(epoch = epoch.0, final_epoch, "checkpoint started");
        let carried = std::mem::take(&mut self.uncommitted);
        self.in_flight = Some(InFlight {
            epoch,
            waiting: running.clone(),
            slice: ManifestSlice::default(),
            carried,
            final_epoch,
            started: now,
            deadline: now + self.timeout,
            timed_out: false,
        });
    }

    /// A stop was requested: the next checkpoint is the final one (pausing every lane),
    /// started now or as soon as the one under way completes.
    pub(crate) fn request_stop(&mut self, running: &BTreeSet<u32>, controls: &[Sender<Control>]) {
        self.stopping = true;
        self.start_due(Instant::now(), running, controls);
    }

    pub(crate) fn on_ack(&mut self, thread: u32, epoch: Epoch, slice: ManifestSlice) -> Result<Completed, SluiceError> {
        let in_flight = self.in_flight.as_mut().expect("an ack only answers a barrier");
        assert_eq!(in_flight.epoch, epoch, "acks arrive for the epoch in flight");
        in_flight.waiting.remove(&thread);
        in_flight.slice.merge(slice);
        self.complete_if_ready()
    }

    /// A driver finished: its final positions join every later manifest, its records the
    /// next one, and it is no longer waited for.
    pub(crate) fn on_finished(&mut self, thread: u32, slice: ManifestSlice) -> Result<Completed, SluiceError> {
        self.finished_positions.extend(slice.positions.iter().cloned());
        let awaited = self.in_flight.as_mut().is_some_and(|in_flight| in_flight.waiting.remove(&thread));
        match self.in_flight.as_mut() {
            Some(in_flight) if awaited => in_flight.slice.merge(slice),
            _ => self.uncommitted.extend(slice.sink_records),
        }
        self.complete_if_ready()
    }

    /// Every driver ended on its own (end of input): the last checkpoint records the end
    /// positions and commits the sinks' last rows. Waits for the writer.
    pub(crate) fn finish(&mut self, timeout: Duration) -> Result<(), SluiceError> {
        let deadline = Instant::now() + timeout;
        self.wait_for_writer(deadline, timeout)?;
        if self.final_done {
            return Ok(());
        }
        let epoch = self.next_epoch;
        self.next_epoch = Epoch(epoch.0 + 1);
        let carried = std::mem::take(&mut self.uncommitted);
        let now = Instant::now();
        self.in_flight = Some(InFlight {
            epoch,
            waiting: BTreeSet::new(),
            slice: ManifestSlice::default(),
            carried,
            final_epoch: true,
            started: now,
            deadline: now + self.timeout,
            timed_out: false,
        });
        self.complete_if_ready()?;
        match self.wait_for_writer(deadline, timeout)? {
            Completed::Final => Ok(()),
            _ => Err(SluiceError::external("checkpoint.final", "the final checkpoint could not be written")),
        }
    }

    /// Waits, until `deadline` at most, for the checkpoint being written (if any).
    fn wait_for_writer(&mut self, deadline: Instant, timeout: Duration) -> Result<Completed, SluiceError> {
        let Some(writing) = &self.writing else { return Ok(Completed::Nothing) };
        let epoch = writing.epoch.0;
        let written = self.results.recv_deadline(deadline).map_err(|error| match error {
            crossbeam_channel::RecvTimeoutError::Timeout => SluiceError::external(
                "checkpoint.final_timeout",
                format!(
                    "the final checkpoint (epoch {epoch}) was not written within shutdown_timeout = {}",
                    crate::controller::humanize(timeout)
                ),
            )
            .with_fix("check that the checkpoint store answers, or raise [pipeline] shutdown_timeout"),
            crossbeam_channel::RecvTimeoutError::Disconnected => writer_gone(),
        })?;
        self.on_written(written)
    }

    /// What a run that is stopping still waits for, for the shutdown deadline's message.
    pub(crate) fn pending_work(&self) -> Option<String> {
        if let Some(in_flight) = &self.in_flight {
            let threads: Vec<String> = in_flight.waiting.iter().map(u32::to_string).collect();
            return Some(format!(
                "checkpoint {} waits for the barrier acknowledgement of thread(s) {}",
                in_flight.epoch.0,
                threads.join(", ")
            ));
        }
        self.writing
            .as_ref()
            .map(|writing| format!("checkpoint {} is still being written to the store", writing.epoch.0))
    }

    /// All acks are in: the slice goes to the writer; the pause processing saw ends here.
    fn complete_if_ready(&mut self) -> Result<Completed, SluiceError> {
        if !self.in_flight.as_ref().is_some_and(|f| f.waiting.is_empty()) {
            return Ok(Completed::Nothing);
        }
        let in_flight = self.in_flight.take().expect("checked above");
        if in_flight.timed_out {
            // Already counted as failed: its state is dropped, its sinks' records ride
            // along with the next checkpoint (sorted by epoch when committed).
            self.uncommitted.extend(in_flight.carried);
            self.uncommitted.extend(in_flight.slice.sink_records);
            self.next_due = Instant::now() + self.interval;
            return Ok(Completed::Checkpoint);
        }
        // Every driver copied its state and went on: encoding and writing overlap
        // processing.
        let pause_ms = in_flight.started.elapsed().as_millis() as u64;
        let mut slice = in_flight.slice;
        for finished in &self.finished_positions {
            if !slice.positions.iter().any(|p| p.source == finished.source && p.lane == finished.lane) {
                slice.positions.push(finished.clone());
            }
        }
        let mut records = in_flight.carried;
        records.append(&mut slice.sink_records);
        slice.sink_records = records.clone();
        let epoch = in_flight.epoch;
        let final_epoch = in_flight.final_epoch;
        self.writing = Some(Writing { epoch, records, final_epoch, started: in_flight.started, pause_ms });
        if post(&self.requests, WriteRequest { epoch, slice, final_epoch }, WRITER_ARGUMENT) == Posted::ReceiverGone {
            let written = Written { epoch, result: Err(writer_gone()) };
            return self.on_written(written);
        }
        Ok(Completed::Nothing)
    }

    /// The writer finished checkpoint `epoch`: on success commit the sinks, else count the
    /// failure and carry the records to the next checkpoint.
    pub(crate) fn on_written(&mut self, written: Written) -> Result<Completed, SluiceError> {
        let Written { epoch, result } = written;
        let writing = self.writing.take().expect("an answer only follows a request");
        assert_eq!(writing.epoch, epoch, "the writer answers the epoch it was given");
        let Writing { mut records, final_epoch, started, pause_ms, .. } = writing;
        match result {
            Ok(state_bytes) => {
                self.stats.published += 1;
                self.stats.last_epoch = epoch.0;
                self.stats.max_state_bytes = self.stats.max_state_bytes.max(state_bytes);
                self.stats.max_pause_ms = self.stats.max_pause_ms.max(pause_ms);
                let duration_ms = started.elapsed().as_millis() as u64;
                self.stats.max_duration_ms = self.stats.max_duration_ms.max(duration_ms);
                if self.stats.history.len() < HISTORY_KEPT {
                    self.stats.history.push(CheckpointRecord { epoch: epoch.0, state_bytes, pause_ms, duration_ms });
                }
                self.failed_in_a_row = 0;
                tracing::info!(epoch = epoch.0, millis = duration_ms, "checkpoint published");
                sluice_types::failpoint!("checkpoint.after_publish");
                self.commit(records)?;
                sluice_types::failpoint!("checkpoint.after_commit");
                self.next_due = Instant::now() + self.interval;
                if final_epoch {
                    self.final_done = true;
                    return Ok(Completed::Final);
                }
                Ok(Completed::Checkpoint)
            }
            Err(error) if error.kind == ErrorKind::Panic => Err(error),
            Err(error) => {
                self.stats.failed += 1;
                self.failed_in_a_row += 1;
                records.append(&mut self.uncommitted);
                self.uncommitted = records;
                tracing::warn!(epoch = epoch.0, %error, "checkpoint failed; the next interval tries again");
                if final_epoch || self.failed_in_a_row >= self.max_failed {
                    return Err(error.context(format!(
                        "checkpoint {} failed ({} in a row, max_failed_checkpoints = {})",
                        epoch.0, self.failed_in_a_row, self.max_failed
                    )));
                }
                self.next_due = Instant::now() + self.interval;
                Ok(Completed::Checkpoint)
            }
        }
    }

    /// Commits every record of a published manifest, sink by sink, epoch by epoch.
    /// The rows of the committed records become visible: they count as rows out now.
    fn commit(&self, records: Vec<SinkRecord>) -> Result<(), SluiceError> {
        for (flow, sink) in self.sinks.iter().enumerate() {
            let mine: Vec<(u64, Vec<u8>)> =
                records.iter().filter(|r| r.flow == flow).map(|r| (r.epoch, r.record.clone())).collect();
            commit_in_order(sink.as_ref(), mine)?;
            let rows: u64 = records.iter().filter(|r| r.flow == flow).map(|r| r.rows).sum();
            self.metrics.sinks[flow].rows.fetch_add(rows, Ordering::Relaxed);
            sluice_types::failpoint!("checkpoint.after_sink_commit");
        }
        Ok(())
    }
}

pub(crate) fn writer_gone() -> SluiceError {
    SluiceError::internal("checkpoint.writer", "the checkpoint writer thread is gone")
}

#[cfg(test)]
mod tests {
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
        fn checkpoint(&mut self, epoch: Epoch, _slice: ManifestSlice, final_epoch: bool) -> Result<(), SluiceError> {
            self.0.lock().expect("lock").push((epoch.0, final_epoch));
            Ok(())
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
        Coordinator::new(options, Vec::new(), metrics, now)
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
            .map(|(i, pause_ms)| CheckpointRecord { epoch: i as u64 + 1, state_bytes: 0, pause_ms, duration_ms: 0 })
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
}
