//! How many ad-hoc queries execute at once in this process, so that they never take
//! more than their share of the CPU from the pipeline (whose checkpoints wait for every
//! thread): each query executes on one thread (DataFusion's `target_partitions` is 1, on
//! a runtime of one thread) and at most [`EXECUTIONS_MAX`] execute at once. A query
//! waits for its turn within its own deadline (then `query.timeout`), or until it is
//! cancelled. A turn covers reading the tables and executing; it ends when the
//! execution's streams and runtime are dropped, so [`Counts::running`] counts the
//! queries still using a thread, also after their client was answered.
//!
//! Every query of the process shares [`Executions::shared`] (the CPU is the process's);
//! a test may give a query a gate of its own (`PreparedQuery::with_executions`).

use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use sluice_types::SluiceError;

use super::interrupt::{Interrupt, Stop};

/// Queries that execute at once in one process; the others wait for their turn.
pub const EXECUTIONS_MAX: usize = 1;

/// How often a waiting query looks at its interrupt (a turn given back wakes it at once).
const CANCEL_CHECK: Duration = Duration::from_millis(20);

/// Queries executing and waiting to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub running: usize,
    pub waiting: usize,
}

/// The bound on queries executing at once (see the module docs).
#[derive(Debug)]
pub struct Executions {
    max: usize,
    counts: Mutex<Counts>,
    changed: Condvar,
}

impl Executions {
    /// A gate letting `max` (at least 1) queries execute at once.
    pub fn new(max: usize) -> Arc<Executions> {
        assert!(max >= 1, "a gate that lets no query execute");
        Arc::new(Executions { max, counts: Mutex::new(Counts::default()), changed: Condvar::new() })
    }

    /// The process's gate, of [`EXECUTIONS_MAX`].
    pub fn shared() -> &'static Arc<Executions> {
        static SHARED: OnceLock<Arc<Executions>> = OnceLock::new();
        SHARED.get_or_init(|| Executions::new(EXECUTIONS_MAX))
    }

    pub fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits, at most `timeout`, until `done(counts)`; returns whether it came.
    pub fn wait_until(&self, done: impl Fn(Counts) -> bool, timeout: Duration) -> bool {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (counts, _) = self
            .changed
            .wait_timeout_while(counts, timeout, |counts| !done(*counts))
            .unwrap_or_else(PoisonError::into_inner);
        done(*counts)
    }

    /// Waits for a turn, until the interrupt fires (its deadline passes: `Err(Deadline)`,
    /// or it is cancelled).
    pub(crate) fn enter(self: &Arc<Executions>, interrupt: &Interrupt) -> Result<Turn, Stop> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.waiting += 1;
        self.changed.notify_all();
        let outcome = loop {
            if counts.running < self.max {
                break Ok(());
            }
            if let Some(stop) = interrupt.fired() {
                break Err(stop);
            }
            let left = interrupt.deadline().saturating_duration_since(Instant::now());
            counts =
                self.changed.wait_timeout(counts, left.min(CANCEL_CHECK)).unwrap_or_else(PoisonError::into_inner).0;
        };
        counts.waiting -= 1;
        if outcome.is_ok() {
            counts.running += 1;
        }
        assert!(counts.running <= self.max, "more queries execute than the gate lets");
        self.changed.notify_all();
        outcome.map(|()| Turn { executions: Arc::clone(self) })
    }
}

/// A query's turn to execute; given back when dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    executions: Arc<Executions>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut counts = self.executions.counts.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(counts.running >= 1, "a turn given back twice");
        counts.running -= 1;
        self.executions.changed.notify_all();
    }
}

/// The error of a query that stopped.
pub(crate) fn stop_error(stop: Stop, timeout: Duration) -> SluiceError {
    match stop {
        Stop::Deadline => super::timed_out(timeout),
        Stop::Cancelled => SluiceError::external("query.cancelled", "the query was cancelled (its client went away)")
            .with_fix("ask again"),
    }
}
