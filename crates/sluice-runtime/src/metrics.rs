//! Counters shared by the threads of a run, read by the progress line and the exit report.
//!
//! Everything here is an atomic updated with relaxed ordering: the values are reports, not
//! synchronisation. Registration (named counters) happens while operators are built.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_types::TimestampMs;

/// "No watermark yet".
pub const NO_WATERMARK: TimestampMs = i64::MIN;

/// The counters of one source.
#[derive(Debug)]
pub struct SourceMetrics {
    pub name: String,
    pub rows: AtomicU64,
    pub bad_rows: AtomicU64,
    /// The last watermark of each lane, [`NO_WATERMARK`] before the first.
    pub lane_watermarks: Vec<AtomicI64>,
}

impl SourceMetrics {
    pub fn new(name: &str, lanes: u32) -> SourceMetrics {
        SourceMetrics {
            name: name.to_string(),
            rows: AtomicU64::new(0),
            bad_rows: AtomicU64::new(0),
            lane_watermarks: (0..lanes).map(|_| AtomicI64::new(NO_WATERMARK)).collect(),
        }
    }

    /// The lowest lane watermark (the source's), or None before every lane has one.
    pub fn watermark(&self) -> Option<TimestampMs> {
        let lowest = self.lane_watermarks.iter().map(|w| w.load(Ordering::Relaxed)).min()?;
        (lowest != NO_WATERMARK).then_some(lowest)
    }
}

/// The counters of one sink.
#[derive(Debug)]
pub struct SinkMetrics {
    pub name: String,
    pub rows: AtomicU64,
}

/// The counters of one driver thread.
#[derive(Debug, Default)]
pub struct ThreadMetrics {
    /// Nanoseconds this thread spent blocked, waiting for room in a full output queue
    /// (its consumer downstream is slower): time it could not work at all.
    pub backpressure_ns: AtomicU64,
    /// Whether the thread is blocked right now, waiting for room in a full output queue
    /// (`backpressure_ns` counts such a wait only once it ends).
    pub blocked: AtomicBool,
    /// The longest time one message took through a segment (its operators and output),
    /// in microseconds: how long the thread was unavailable at once (e.g. to a barrier).
    pub longest_step_us: AtomicU64,
    /// Where this thread's barrier in flight waits (set by the driver at barrier events
    /// only), for the message of a checkpoint that times out.
    pub barrier_waits_at: Mutex<Option<String>>,
}

impl ThreadMetrics {
    /// Where the thread's barrier waits, in words: "has not taken barrier 7 yet (busy)",
    /// or "waits at flow to sink `out`, segment 1 (window_aggregate)".
    pub fn barrier_at(&self) -> String {
        let at = self.barrier_waits_at.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        at.clone().unwrap_or_else(|| "has not taken the barrier yet (busy in a step, or blocked)".to_string())
    }

    pub(crate) fn set_barrier_at(&self, at: Option<String>) {
        *self.barrier_waits_at.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = at;
    }
}

/// All counters of a run.
#[derive(Debug)]
pub struct Metrics {
    pub sources: Vec<Arc<SourceMetrics>>,
    pub sinks: Vec<SinkMetrics>,
    pub threads: Vec<ThreadMetrics>,
    counters: Mutex<Vec<(String, Arc<AtomicU64>)>>,
}

impl Metrics {
    pub fn new(sources: Vec<SourceMetrics>, sinks: Vec<SinkMetrics>, threads: u32) -> Metrics {
        Metrics {
            sources: sources.into_iter().map(Arc::new).collect(),
            sinks,
            threads: (0..threads).map(|_| ThreadMetrics::default()).collect(),
            counters: Mutex::new(Vec::new()),
        }
    }

    /// Zeroed counters for every source, sink and thread of `plan`.
    pub fn for_plan(plan: &crate::plan::Plan, threads: u32) -> Metrics {
        let sources = plan.sources.iter().map(|s| SourceMetrics::new(s.name(), s.lanes())).collect();
        let sinks = plan
            .flows
            .iter()
            .map(|f| SinkMetrics { name: f.sink.name().to_string(), rows: Default::default() })
            .collect();
        Metrics::new(sources, sinks, threads)
    }

    /// The counter named `name`, created at zero the first time; every thread that asks
    /// for the same name shares it (e.g. `view hot_items: late rows`).
    pub fn counter(&self, name: &str) -> Arc<AtomicU64> {
        let mut counters = self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, counter)) = counters.iter().find(|(existing, _)| existing == name) {
            return Arc::clone(counter);
        }
        let counter = Arc::new(AtomicU64::new(0));
        counters.push((name.to_string(), Arc::clone(&counter)));
        counter
    }

    /// Every named counter with its value, in registration order.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let counters = self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        counters.iter().map(|(name, value)| (name.clone(), value.load(Ordering::Relaxed))).collect()
    }

    pub fn rows_in(&self) -> u64 {
        self.sources.iter().map(|s| s.rows.load(Ordering::Relaxed)).sum()
    }

    pub fn rows_out(&self) -> u64 {
        self.sinks.iter().map(|s| s.rows.load(Ordering::Relaxed)).sum()
    }

    /// The longest single step of any thread (see [`ThreadMetrics::longest_step_us`]).
    pub fn longest_step_us(&self) -> u64 {
        self.threads.iter().map(|t| t.longest_step_us.load(Ordering::Relaxed)).max().unwrap_or(0)
    }

    pub fn backpressure_ns(&self) -> u64 {
        self.threads.iter().map(|t| t.backpressure_ns.load(Ordering::Relaxed)).sum()
    }

    /// The lowest watermark over all sources that have one.
    pub fn watermark(&self) -> Option<TimestampMs> {
        self.sources.iter().filter_map(|source| source.watermark()).min()
    }
}
