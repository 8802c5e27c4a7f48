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
    /// Bytes of input the lanes read (a file's bytes, Kafka messages' keys and values;
    /// the generator reads none).
    pub bytes: AtomicU64,
    pub bad_rows: AtomicU64,
    /// The last watermark of each lane, [`NO_WATERMARK`] before the first.
    pub lane_watermarks: Vec<AtomicI64>,
    /// Each lane that ended (its watermark no longer holds other lanes back).
    pub lane_ended: Vec<std::sync::atomic::AtomicBool>,
    /// In a cluster, which lanes this worker reads (None: every lane).
    local_lanes: Mutex<Option<Vec<bool>>>,
}

impl SourceMetrics {
    pub fn new(name: &str, lanes: u32) -> SourceMetrics {
        SourceMetrics {
            name: name.to_string(),
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            bad_rows: AtomicU64::new(0),
            lane_watermarks: (0..lanes).map(|_| AtomicI64::new(NO_WATERMARK)).collect(),
            lane_ended: (0..lanes).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            local_lanes: Mutex::new(None),
        }
    }

    /// Per lane, whether this worker reads it (every lane alone).
    pub fn local_lane_mask(&self) -> Vec<bool> {
        let local = self.local_lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        local.clone().unwrap_or_else(|| vec![true; self.lane_watermarks.len()])
    }

    /// The lowest watermark of the lanes this worker reads (the source's, alone), or None
    /// before every one of them has one.
    pub fn watermark(&self) -> Option<TimestampMs> {
        let local = self.local_lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let lowest = self
            .lane_watermarks
            .iter()
            .enumerate()
            .filter(|(lane, _)| local.as_ref().is_none_or(|local| local.get(*lane).copied().unwrap_or(false)))
            .map(|(_, w)| w.load(Ordering::Relaxed))
            .min()?;
        (lowest != NO_WATERMARK).then_some(lowest)
    }
}

/// The counters of one sink.
#[derive(Debug)]
pub struct SinkMetrics {
    pub name: String,
    /// Rows out: written (a writer that reports acknowledgements: acknowledged, see
    /// [`crate::plan::SinkWriter::take_acknowledged_rows`]) or, staged, committed.
    pub rows: AtomicU64,
    /// Bytes the sink's writers encoded, as they encode them (an exactly-once sink's
    /// staged bytes count before their epoch commits, unlike `rows`); see
    /// [`crate::plan::SinkWriter::take_bytes`].
    pub bytes: AtomicU64,
}

impl SinkMetrics {
    pub fn new(name: &str) -> SinkMetrics {
        SinkMetrics { name: name.to_string(), rows: AtomicU64::new(0), bytes: AtomicU64::new(0) }
    }
}

/// The traffic of this worker's exchange link to another worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTraffic {
    pub peer: u32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Times one of its channels had a message ready and no credit for it.
    pub credit_stalls: u64,
}

/// The counters of one operator of the plan, shared by its instances on every thread.
#[derive(Debug)]
pub struct OperatorMetrics {
    /// Its checkpoint id (`flow{F}/segment{S}/operator{O}`, see `crate::checkpoint`).
    pub id: String,
    /// As `explain` shows it: `sink NAME, segment S: LINE`.
    pub name: String,
    /// Rows of the data batches it was given (every weight counts once).
    pub rows_in: AtomicU64,
    /// Rows of the data batches it emitted.
    pub rows_out: AtomicU64,
    /// Bytes of the rows it was given: the Arrow buffers their columns occupy (of a
    /// slice, only the slice's part; see `chain::data_bytes`), weights not counted.
    pub bytes_in: AtomicU64,
    /// Bytes of the rows it emitted, counted the same way.
    pub bytes_out: AtomicU64,
    /// Bytes of its encoded state in the last published checkpoint that held state, on
    /// every worker (only the publisher knows: alone, or leading a cluster; 0 before
    /// the first, and on a cluster's followers).
    pub state_bytes: AtomicU64,
}

/// The queue into one segment instance from an exchange: messages waiting in its
/// channels from every sender (sampled every 16th time the segment polls its input).
#[derive(Debug)]
pub struct QueueMetrics {
    /// The segment, as `explain` shows it: `sink NAME, segment S`.
    pub segment: String,
    /// The driver thread (slot) of the receiving instance.
    pub thread: u32,
    pub queued: AtomicU64,
    /// How many messages its channels from threads of this worker hold at most
    /// (channels from other workers are bounded by credit, in bytes, not counted here).
    pub capacity: u64,
}

/// The checkpoints this worker published or failed (a cluster's leader publishes them;
/// a follower's stay 0).
#[derive(Debug, Default)]
pub struct CheckpointMetrics {
    pub published: AtomicU64,
    pub failed: AtomicU64,
    /// The last published checkpoint's figures.
    pub last_epoch: AtomicU64,
    pub last_duration_ms: AtomicU64,
    pub last_pause_ms: AtomicU64,
    pub last_state_bytes: AtomicU64,
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
    pub checkpoints: CheckpointMetrics,
    counters: Mutex<Vec<(String, Arc<AtomicU64>)>>,
    /// Registered as the chains are built, in plan order.
    operators: Mutex<Vec<Arc<OperatorMetrics>>>,
    /// Registered as the exchanges are built.
    queues: Mutex<Vec<Arc<QueueMetrics>>>,
    /// Each exchange's backpressure (see [`Metrics::edge_blocked`]).
    edges: Mutex<Vec<(String, Arc<AtomicU64>)>>,
    /// The exchange links to the other workers, set once they are connected.
    links: Mutex<Vec<(u32, Arc<sluice_cluster::link::LinkMetrics>)>>,
    /// The threads (slots) this worker runs; `threads` has every worker's slots.
    local_threads: Mutex<Option<std::ops::Range<u32>>>,
}

impl Metrics {
    pub fn new(sources: Vec<SourceMetrics>, sinks: Vec<SinkMetrics>, threads: u32) -> Metrics {
        Metrics {
            sources: sources.into_iter().map(Arc::new).collect(),
            sinks,
            threads: (0..threads).map(|_| ThreadMetrics::default()).collect(),
            checkpoints: CheckpointMetrics::default(),
            counters: Mutex::new(Vec::new()),
            operators: Mutex::new(Vec::new()),
            queues: Mutex::new(Vec::new()),
            edges: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            local_threads: Mutex::new(None),
        }
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

    /// The counters of operator `id` (named `name`), registered the first time; every
    /// thread's instance of it shares them.
    pub fn operator(&self, id: &str, name: &str) -> Arc<OperatorMetrics> {
        let mut operators = self.operators.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = operators.iter().find(|operator| operator.id == id) {
            return Arc::clone(found);
        }
        let operator = Arc::new(OperatorMetrics {
            id: id.to_string(),
            name: name.to_string(),
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            state_bytes: AtomicU64::new(0),
        });
        operators.push(Arc::clone(&operator));
        operator
    }

    /// The slots this worker's driver threads run (a cluster numbers every worker's
    /// threads in member order), and so the lanes it reads.
    pub(crate) fn set_local_threads(&self, layout: &sluice_types::vnode::SlotLayout, worker: u32) {
        let slots = layout.slots_of(worker);
        for source in &self.sources {
            let lanes = (0..source.lane_watermarks.len() as u32).map(|lane| slots.contains(&layout.slot_of_lane(lane)));
            *source.local_lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(lanes.collect());
        }
        *self.local_threads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(slots);
    }

    /// The slots of `threads` this worker runs: all of them alone, its own in a cluster.
    pub fn local_threads(&self) -> std::ops::Range<u32> {
        let local = self.local_threads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        local.unwrap_or(0..self.threads.len() as u32)
    }

    /// Keeps the exchange links' counters (each peer's) for [`Metrics::links`].
    pub(crate) fn set_links(&self, links: Vec<(u32, Arc<sluice_cluster::link::LinkMetrics>)>) {
        *self.links.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = links;
    }

    /// The traffic of each exchange link to another worker (none alone).
    pub fn links(&self) -> Vec<PeerTraffic> {
        let links = self.links.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        links
            .iter()
            .map(|(peer, link)| PeerTraffic {
                peer: *peer,
                bytes_sent: link.bytes_sent.load(Ordering::Relaxed),
                bytes_received: link.bytes_received.load(Ordering::Relaxed),
                credit_stalls: link.credit_stalls.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Every registered operator's counters, in plan order.
    pub fn operators(&self) -> Vec<Arc<OperatorMetrics>> {
        self.operators.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// A new queue gauge for the instance of `segment` on `thread`.
    pub fn queue(&self, segment: &str, thread: u32, capacity: u64) -> Arc<QueueMetrics> {
        let queue =
            Arc::new(QueueMetrics { segment: segment.to_string(), thread, queued: AtomicU64::new(0), capacity });
        self.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(Arc::clone(&queue));
        queue
    }

    /// The backpressure counter of the exchange out of segment `segment` (as `explain`
    /// names it): nanoseconds a thread waited while that output was full, on every thread
    /// of this worker; created at zero the first time.
    pub fn edge_blocked(&self, segment: &str) -> Arc<AtomicU64> {
        let mut edges = self.edges.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, counter)) = edges.iter().find(|(existing, _)| existing == segment) {
            return Arc::clone(counter);
        }
        let counter = Arc::new(AtomicU64::new(0));
        edges.push((segment.to_string(), Arc::clone(&counter)));
        counter
    }

    /// Each exchange's backpressure in nanoseconds, by the segment it leaves, in the order
    /// built.
    pub fn edges_blocked(&self) -> Vec<(String, u64)> {
        let edges = self.edges.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        edges.iter().map(|(segment, counter)| (segment.clone(), counter.load(Ordering::Relaxed))).collect()
    }

    /// Every exchange queue's gauge, in the order built.
    pub fn queues(&self) -> Vec<Arc<QueueMetrics>> {
        self.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Sets each operator's state bytes from a published checkpoint's (by operator id);
    /// an operator it does not name held no state in it.
    pub fn set_state_bytes(&self, by_operator: &[(String, u64)]) {
        for operator in self.operators() {
            let bytes = by_operator.iter().find(|(id, _)| *id == operator.id).map_or(0, |(_, bytes)| *bytes);
            operator.state_bytes.store(bytes, Ordering::Relaxed);
        }
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
