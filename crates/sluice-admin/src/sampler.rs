//! Live rates and the checkpoint history: the job's counters are cumulative, so a rate
//! needs two readings. The server samples them every [`SAMPLE_EVERY`] on its own runtime
//! (`server::run`); `/graph` and the page read the latest rates from here, never
//! waiting for a sample.
//!
//! Bounds: one sample kept (the previous reading), one rate per source, sink and thread,
//! and at most [`HISTORY`] committed checkpoints (the oldest dropped first).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sluice_engine::{Metrics, Status};

/// How often the counters are read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Committed checkpoints kept for the history.
pub const HISTORY: usize = 256;

/// The rates between the last two readings (empty before the second).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rates {
    /// The time between the two readings, in milliseconds (0: no rate yet).
    pub(crate) interval_ms: u64,
    /// Rows per second read by each source, in the order of [`Metrics::sources`].
    pub(crate) sources: Vec<f64>,
    /// Rows per second written by each sink, in the order of [`Metrics::sinks`].
    pub(crate) sinks: Vec<f64>,
    /// The share of the interval each driver thread spent blocked on a full output queue
    /// (0 to 1).
    pub(crate) backpressure: Vec<f64>,
}

/// A committed checkpoint as this server saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Commit {
    pub(crate) epoch: u64,
    /// When it was first seen committed, in milliseconds since the Unix epoch.
    pub(crate) seen_at_ms: i64,
    /// Milliseconds since the previous commit was seen (None for the first).
    pub(crate) since_previous_ms: Option<u64>,
    /// Its figures, where this worker published it.
    pub(crate) record: Option<sluice_engine::CheckpointRecord>,
}

/// One reading of the cumulative counters.
struct Reading {
    at: Instant,
    /// Which counters were read (a cluster's are replaced once it formed).
    metrics: Arc<Metrics>,
    sources: Vec<u64>,
    sinks: Vec<u64>,
    backpressure_ns: Vec<u64>,
}

impl Reading {
    fn take(metrics: &Arc<Metrics>, at: Instant) -> Reading {
        Reading {
            at,
            metrics: Arc::clone(metrics),
            sources: metrics.sources.iter().map(|s| s.rows.load(Ordering::Relaxed)).collect(),
            sinks: metrics.sinks.iter().map(|s| s.rows.load(Ordering::Relaxed)).collect(),
            backpressure_ns: metrics.threads.iter().map(|t| t.backpressure_ns.load(Ordering::Relaxed)).collect(),
        }
    }
}

#[derive(Default)]
struct Inner {
    last: Option<Reading>,
    rates: Rates,
    commits: VecDeque<Commit>,
    last_commit_at: Option<Instant>,
}

/// The latest rates and the checkpoint history, shared by the sampling task and the
/// handlers.
#[derive(Default)]
pub(crate) struct Sampler {
    inner: Mutex<Inner>,
}

impl Sampler {
    /// Reads `metrics` at `at` (wall clock `now_ms`) and records a commit `status` shows
    /// for the first time.
    pub(crate) fn sample(&self, metrics: &Arc<Metrics>, status: &Status, at: Instant, now_ms: i64) {
        let reading = Reading::take(metrics, at);
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = &inner.last
            && Arc::ptr_eq(&last.metrics, metrics)
            && at > last.at
        {
            inner.rates = rates(last, &reading);
        } else if inner.last.as_ref().is_some_and(|last| !Arc::ptr_eq(&last.metrics, metrics)) {
            // Other counters (the cluster formed): no rate across the two.
            inner.rates = Rates::default();
        }
        inner.last = Some(reading);
        let Some(epoch) = status.last_committed_epoch else {
            return;
        };
        if inner.commits.back().is_some_and(|commit| commit.epoch == epoch) {
            return;
        }
        let since_previous_ms = inner.last_commit_at.map(|previous| millis(at.saturating_duration_since(previous)));
        if inner.commits.len() == HISTORY {
            inner.commits.pop_front();
        }
        let record = status.last_checkpoint.filter(|record| record.epoch == epoch);
        inner.commits.push_back(Commit { epoch, seen_at_ms: now_ms, since_previous_ms, record });
        inner.last_commit_at = Some(at);
    }

    pub(crate) fn rates(&self) -> Rates {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).rates.clone()
    }

    /// The commits seen, oldest first.
    pub(crate) fn commits(&self) -> Vec<Commit> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).commits.iter().copied().collect()
    }
}

fn rates(before: &Reading, after: &Reading) -> Rates {
    let interval = after.at - before.at;
    let seconds = interval.as_secs_f64();
    let per_second = |a: &[u64], b: &[u64]| -> Vec<f64> {
        a.iter().zip(b).map(|(a, b)| b.saturating_sub(*a) as f64 / seconds).collect()
    };
    let nanos = interval.as_nanos() as f64;
    Rates {
        interval_ms: millis(interval),
        sources: per_second(&before.sources, &after.sources),
        sinks: per_second(&before.sinks, &after.sinks),
        backpressure: before
            .backpressure_ns
            .iter()
            .zip(&after.backpressure_ns)
            .map(|(a, b)| (b.saturating_sub(*a) as f64 / nanos).min(1.0))
            .collect(),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Both figures added; either alone when the other is unknown.
pub(crate) fn sum<T: std::ops::Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use sluice_runtime::metrics::{SinkMetrics, SourceMetrics};

    use super::*;

    fn metrics() -> Arc<Metrics> {
        let sink = SinkMetrics::new("out");
        Arc::new(Metrics::new(vec![SourceMetrics::new("in", 1)], vec![sink], 2))
    }

    fn status(epoch: Option<u64>) -> Status {
        let state = sluice_engine::JobState::Running;
        Status {
            state,
            last_committed_epoch: epoch,
            last_checkpoint: None,
            resumed_from: None,
            failure: None,
            worker: None,
        }
    }

    #[test]
    fn rates_are_the_counters_difference_over_the_time_between_readings() {
        let sampler = Sampler::default();
        let metrics = metrics();
        let start = Instant::now();
        sampler.sample(&metrics, &status(None), start, 0);
        assert_eq!(sampler.rates(), Rates::default(), "no rate from one reading");
        metrics.sources[0].rows.store(500, Ordering::Relaxed);
        metrics.sinks[0].rows.store(250, Ordering::Relaxed);
        metrics.threads[1].backpressure_ns.store(125_000_000, Ordering::Relaxed);
        sampler.sample(&metrics, &status(None), start + Duration::from_millis(500), 500);
        let rates = sampler.rates();
        assert_eq!(rates.interval_ms, 500);
        assert_eq!((rates.sources, rates.sinks), (vec![1000.0], vec![500.0]));
        assert_eq!(rates.backpressure, vec![0.0, 0.25]);
        // Counters replaced (a cluster formed): no rate across them.
        sampler.sample(&super::tests::metrics(), &status(None), start + Duration::from_secs(1), 1000);
        assert_eq!(sampler.rates(), Rates::default());
    }

    #[test]
    fn each_commit_is_recorded_once_and_the_history_is_bounded() {
        let sampler = Sampler::default();
        let metrics = metrics();
        let start = Instant::now();
        for tick in 0..(HISTORY as u64 + 10) {
            let at = start + Duration::from_secs(tick);
            // Two readings per epoch: the second sees no new commit.
            sampler.sample(&metrics, &status(Some(tick / 2 + 1)), at, tick as i64 * 1000);
        }
        let commits = sampler.commits();
        assert_eq!(commits.len(), HISTORY / 2 + 5);
        assert_eq!(commits[0], Commit { epoch: 1, seen_at_ms: 0, since_previous_ms: None, record: None });
        assert_eq!(commits[1], Commit { epoch: 2, seen_at_ms: 2000, since_previous_ms: Some(2000), record: None });
        for tick in 0..(HISTORY as u64) {
            let at = start + Duration::from_secs(1000 + tick);
            sampler.sample(&metrics, &status(Some(1000 + tick)), at, 0);
        }
        let commits = sampler.commits();
        assert_eq!(commits.len(), HISTORY, "bounded");
        assert_eq!(commits[HISTORY - 1].epoch, 1000 + HISTORY as u64 - 1, "newest kept");
    }
}
