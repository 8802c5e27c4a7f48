//! A job's status, and the stream of its changes.
//!
//! The status is a value, not a log: [`StatusCell`] holds the latest one with a version
//! number. Publishing never blocks and never queues (a slow watcher cannot hold the run
//! back or grow memory); a [`StatusStream`] wakes on every change and returns the latest
//! status, so a watcher that falls behind skips intermediate states but always ends on
//! the current one.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for every worker of its cluster to join (the leader), or for the leader's
    /// welcome (a worker).
    Coordination,
    /// Recovering and starting its threads.
    Starting,
    Running,
    /// An operator paused its sources (`JobHandle::pause`): no lane is read until it
    /// resumes; rows in flight drain and checkpoints go on.
    Paused,
    /// A stop was requested: sources stop, chains drain (or the final checkpoint runs).
    Stopping,
    /// Ended cleanly: end of input, or a stop that drained.
    Completed,
    Failed,
}

impl JobState {
    /// Whether the job will change no more.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed)
    }

    /// The lowercase name, e.g. `running`.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Coordination => "coordination",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::Stopping => "stopping",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
        }
    }
}

/// A job's status at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub state: JobState,
    /// The epoch of the last checkpoint committed by this run.
    pub last_committed_epoch: Option<u64>,
    /// That checkpoint's figures (state bytes, pause, duration), where this worker
    /// published it (alone, or leading a cluster).
    pub last_checkpoint: Option<sluice_runtime::controller::CheckpointRecord>,
    /// The checkpoint this run resumed from.
    pub resumed_from: Option<u64>,
    /// Why the job failed: the component and the reason.
    pub failure: Option<String>,
    /// In a cluster, once it formed: this worker's id and the number of workers.
    pub worker: Option<(u32, usize)>,
}

impl Status {
    pub(crate) fn starting(resumed_from: Option<u64>) -> Status {
        Status {
            state: JobState::Starting,
            last_committed_epoch: None,
            last_checkpoint: None,
            resumed_from,
            failure: None,
            worker: None,
        }
    }

    pub(crate) fn coordination() -> Status {
        Status { state: JobState::Coordination, ..Status::starting(None) }
    }
}

/// The latest status and its version; shared by the job and its watchers.
#[derive(Debug)]
pub(crate) struct StatusCell {
    current: Mutex<(u64, Status)>,
    changed: Condvar,
}

impl StatusCell {
    pub(crate) fn new(status: Status) -> Arc<StatusCell> {
        Arc::new(StatusCell { current: Mutex::new((0, status)), changed: Condvar::new() })
    }

    pub(crate) fn get(&self) -> Status {
        self.lock().1.clone()
    }

    /// Applies `change`; wakes the watchers if the status changed. A final status is
    /// never changed again.
    pub(crate) fn update(&self, change: impl FnOnce(&mut Status)) {
        let mut current = self.lock();
        if current.1.state.is_final() {
            return;
        }
        let before = current.1.clone();
        change(&mut current.1);
        if current.1 != before {
            current.0 += 1;
            self.changed.notify_all();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Status)> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The changes of a job's status, as seen by one watcher.
#[derive(Debug)]
pub struct StatusStream {
    cell: Arc<StatusCell>,
    /// The version last returned.
    seen: Option<u64>,
}

impl StatusStream {
    pub(crate) fn new(cell: Arc<StatusCell>) -> StatusStream {
        StatusStream { cell, seen: None }
    }

    /// The next status this watcher has not seen (the current one on the first call),
    /// waiting at most `timeout`; None when nothing changed in that time.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Status> {
        let deadline = Instant::now() + timeout;
        let mut current = self.cell.lock();
        loop {
            if self.seen != Some(current.0) {
                self.seen = Some(current.0);
                return Some(current.1.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            current = self.cell.changed.wait_timeout(current, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_sees_the_current_status_then_each_change_and_nothing_after_the_end() {
        let cell = StatusCell::new(Status::starting(None));
        let mut stream = StatusStream::new(Arc::clone(&cell));
        assert_eq!(stream.next_timeout(Duration::ZERO).map(|s| s.state), Some(JobState::Starting));
        assert_eq!(stream.next_timeout(Duration::ZERO), None, "nothing new");
        cell.update(|s| s.state = JobState::Running);
        cell.update(|s| s.last_committed_epoch = Some(3));
        let latest = stream.next_timeout(Duration::ZERO).expect("a change");
        assert_eq!((latest.state, latest.last_committed_epoch), (JobState::Running, Some(3)), "the latest");
        cell.update(|s| s.state = JobState::Running);
        assert_eq!(stream.next_timeout(Duration::ZERO), None, "no change, no wake-up");
        cell.update(|s| s.state = JobState::Completed);
        cell.update(|s| s.state = JobState::Failed);
        assert_eq!(stream.next_timeout(Duration::ZERO).map(|s| s.state), Some(JobState::Completed), "final");
        let waiter = {
            let mut stream = StatusStream::new(Arc::clone(&cell));
            std::thread::spawn(move || {
                stream.next_timeout(Duration::ZERO);
                stream.next_timeout(Duration::from_millis(10))
            })
        };
        assert_eq!(waiter.join().expect("join"), None);
    }
}
