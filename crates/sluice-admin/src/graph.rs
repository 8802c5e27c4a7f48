//! `/graph`: the dataflow the job runs (what `sluice explain` prints) as nodes and
//! edges, with the live counters and rates on them.
//!
//! Nodes: one per source, one per segment of each flow (operators fused between two
//! exchanges) and one per sink. Edges: a source's table scanned into a flow's first
//! segment, the exchanges between segments, the last segment into its sink. Counters
//! exist per source, per sink and per driver thread (segments share the threads, so a
//! segment node has no counters of its own; backpressure is per thread).
//!
//! In a cluster the graph answers for every worker: the worker asked reads the others'
//! own graphs (`POST /internal/graph`, in parallel, each within the time `routes` gives
//! it) and adds their counters to its own ([`Graph::add`]): rows, rates and bad rows are
//! summed, a source's watermark is its slowest worker's, and every worker's threads are
//! listed under backpressure. A worker that did not answer is named in `unanswered`.
//!
//! Bounds: as large as the explanation (times the workers, for backpressure); built from
//! atomics read once and the sampler's latest rates.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use sluice_engine::{JobHandle, Metrics, Status};
use utoipa::ToSchema;

use crate::sampler::{Rates, now_ms, sum};

/// The whole graph.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Graph {
    /// `[pipeline] name`.
    pub(crate) pipeline: String,
    /// The job's state (see `/status`).
    pub(crate) state: crate::status::State,
    /// Driver threads of this worker (every worker of a cluster runs its own; nodes'
    /// `parallelism` too is per worker).
    pub(crate) threads: u32,
    /// The worker that answered (0 alone).
    pub(crate) worker: u32,
    /// The workers whose counters the nodes and backpressure sum: this one alone, or
    /// in a cluster every worker that answered.
    pub(crate) workers: Vec<u32>,
    /// The workers of the cluster whose counters are missing, and why.
    pub(crate) unanswered: Vec<Unanswered>,
    /// Virtual nodes keyed state is spread over.
    pub(crate) vnodes: u32,
    /// The time the rates are measured over, in milliseconds (0: no rate yet).
    pub(crate) rate_interval_ms: u64,
    pub(crate) nodes: Vec<Node>,
    pub(crate) edges: Vec<Edge>,
    /// Each driver thread's backpressure.
    pub(crate) backpressure: Vec<ThreadPressure>,
}

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NodeKind {
    Source,
    Segment,
    Sink,
}

/// A source, a segment of operators, or a sink.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Node {
    /// Unique in the graph: `source:NAME`, `flow:I:segment:J`, `sink:NAME`.
    pub(crate) id: String,
    pub(crate) kind: NodeKind,
    /// The source's or sink's name; `segment J` of a flow.
    pub(crate) name: String,
    /// The connector and its options (sources and sinks), e.g. `blackhole`.
    pub(crate) describe: Option<String>,
    /// The operators, one line each (segments); the tables read (sources).
    pub(crate) operators: Vec<String>,
    /// Threads it runs on.
    pub(crate) parallelism: u32,
    /// Keyed state held here (segments), e.g. `windows by auction`.
    pub(crate) keyed_state: Option<String>,
    /// Rows read (sources) or written (sinks) so far.
    pub(crate) rows: Option<u64>,
    /// Rows per second over the last sampling interval.
    pub(crate) rows_per_second: Option<f64>,
    /// The source's watermark (its slowest lane), in milliseconds since the Unix epoch;
    /// unknown until every lane has one.
    pub(crate) watermark_ms: Option<i64>,
    /// Each lane's last watermark (sources; in a cluster, this worker knows only the
    /// lanes it reads until the others' graphs are added).
    pub(crate) lane_watermarks_ms: Vec<Option<i64>>,
    /// How far the watermark is behind the wall clock, in milliseconds.
    pub(crate) watermark_lag_ms: Option<i64>,
    /// Rows of the source that could not be decoded.
    pub(crate) bad_rows: Option<u64>,
}

/// What an edge carries rows through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EdgeKind {
    /// In the same thread (a scan, a sink's input).
    Forward,
    /// Across threads and workers, by key or to all.
    Exchange,
}

/// From one node to another.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Edge {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) kind: EdgeKind,
    /// e.g. `scan bid`, or the exchange's description (`hash by auction`).
    pub(crate) description: String,
    /// Exchanges: the time threads waited while it was full (its receivers behind), in
    /// seconds, summed over the threads (and workers) that send into it.
    pub(crate) blocked_seconds: Option<f64>,
}

/// A worker whose counters a cluster's graph lacks.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Unanswered {
    pub(crate) worker: u32,
    /// Why: unreachable, no admin API, a bad answer.
    pub(crate) reason: String,
}

/// One driver thread's backpressure.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ThreadPressure {
    /// The worker the thread runs on (0 alone).
    pub(crate) worker: u32,
    /// Its slot: a cluster numbers every worker's threads in member order.
    pub(crate) thread: u32,
    /// Blocked on a full output queue right now.
    pub(crate) blocked: bool,
    /// Total time blocked so far, in seconds.
    pub(crate) blocked_seconds: f64,
    /// The share of the last sampling interval spent blocked (0 to 1).
    pub(crate) blocked_ratio: Option<f64>,
}

/// The graph of `job` in state `status`, with `rates` (the sampler's latest).
pub(crate) fn build(job: &JobHandle, status: &Status, rates: &Rates) -> Graph {
    let worker = status.worker.map_or(0, |(id, _)| id);
    let explanation = job.explanation();
    let metrics = job.metrics();
    let now = now_ms();
    let mut nodes = Vec::new();
    for (i, source) in explanation.sources.iter().enumerate() {
        let live = metrics.sources.get(i).filter(|live| live.name == source.name);
        let watermark = live.and_then(|live| live.watermark());
        nodes.push(Node {
            id: source_id(&source.name),
            kind: NodeKind::Source,
            name: source.name.clone(),
            describe: Some(source.describe.clone()),
            operators: source.tables.iter().map(|table| format!("table {table}")).collect(),
            parallelism: source.threads,
            keyed_state: None,
            rows: live.map(|live| live.rows.load(Ordering::Relaxed)),
            rows_per_second: live.and(rates.sources.get(i).copied()),
            watermark_ms: watermark,
            lane_watermarks_ms: live.map_or_else(Vec::new, |live| {
                live.lane_watermarks
                    .iter()
                    .map(|w| Some(w.load(Ordering::Relaxed)).filter(|w| *w != NO_WATERMARK))
                    .collect()
            }),
            watermark_lag_ms: watermark.map(|w| now.saturating_sub(w)),
            bad_rows: live.map(|live| live.bad_rows.load(Ordering::Relaxed)),
        });
    }
    let mut edges = Vec::new();
    for (i, flow) in explanation.flows.iter().enumerate() {
        flow_nodes(i, flow, &metrics, rates, &mut nodes, &mut edges);
    }
    Graph {
        pipeline: explanation.pipeline.clone(),
        state: status.state.into(),
        threads: explanation.threads,
        worker,
        workers: vec![worker],
        unanswered: Vec::new(),
        vnodes: explanation.vnodes,
        rate_interval_ms: rates.interval_ms,
        nodes,
        edges,
        backpressure: pressure(worker, &metrics, rates),
    }
}

impl Graph {
    /// Adds another worker's own graph (its answer to `/internal/graph`) to this one:
    /// each node's rows, rate and bad rows summed with the node of the same id, the
    /// slowest watermark kept, the other worker's threads appended to backpressure.
    /// Nodes the other graph lacks keep this worker's figures (every worker runs the
    /// same plan, so both have the same nodes).
    pub(crate) fn add(&mut self, other: Graph) {
        for theirs in other.nodes {
            let Some(ours) = self.nodes.iter_mut().find(|node| node.id == theirs.id) else { continue };
            ours.rows = sum(ours.rows, theirs.rows);
            ours.rows_per_second = sum(ours.rows_per_second, theirs.rows_per_second);
            ours.bad_rows = sum(ours.bad_rows, theirs.bad_rows);
            if theirs.lane_watermarks_ms.len() == ours.lane_watermarks_ms.len() && !ours.lane_watermarks_ms.is_empty() {
                // Each lane is read by one worker: the others never saw its watermark.
                for (mine, other) in ours.lane_watermarks_ms.iter_mut().zip(theirs.lane_watermarks_ms) {
                    *mine = match (*mine, other) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    };
                }
                let lowest = ours.lane_watermarks_ms.iter().copied().min().flatten();
                ours.watermark_ms = lowest;
                ours.watermark_lag_ms = lowest.map(|w| now_ms().saturating_sub(w));
            }
        }
        for theirs in other.edges {
            let ours = self.edges.iter_mut().find(|edge| edge.from == theirs.from && edge.to == theirs.to);
            if let Some(ours) = ours {
                ours.blocked_seconds = sum(ours.blocked_seconds, theirs.blocked_seconds);
            }
        }
        self.backpressure.extend(other.backpressure);
        self.backpressure.sort_by_key(|thread| (thread.worker, thread.thread));
        self.workers.push(other.worker);
        self.workers.sort_unstable();
    }
}

/// A lane without a watermark yet (`sluice_runtime::metrics::NO_WATERMARK`, in
/// crates/sluice-runtime/src/metrics.rs).
const NO_WATERMARK: i64 = i64::MIN;

fn source_id(name: &str) -> String {
    format!("source:{name}")
}

/// The nodes and edges of flow `i`: its segments, its sink, and the edges from its
/// source's table to the sink.
fn flow_nodes(
    i: usize,
    flow: &sluice_engine::FlowNode,
    metrics: &Metrics,
    rates: &Rates,
    nodes: &mut Vec<Node>,
    edges: &mut Vec<Edge>,
) {
    let blocked = metrics.edges_blocked();
    // The backpressure of the exchange out of segment `number` (as the runtime names it).
    let blocked_out_of = |kind: EdgeKind, number: usize| {
        let name = format!("sink {}, segment {number}", flow.sink);
        let found = blocked.iter().find(|(segment, _)| *segment == name);
        (kind == EdgeKind::Exchange).then(|| found.map_or(0.0, |(_, ns)| *ns as f64 / 1e9))
    };
    let edge = |from: String, to: String, kind: EdgeKind, description: String, number: Option<usize>| Edge {
        blocked_seconds: number.and_then(|number| blocked_out_of(kind, number)),
        from,
        to,
        kind,
        description,
    };
    let (source, table) = flow.scan.split_once('.').unwrap_or((flow.scan.as_str(), ""));
    // The edge into the next segment: from the scan, or, for a flow sharing another's
    // segment, from that segment's node (the tapped flow's: one node, several readers).
    let mut previous = match &flow.tap {
        None => Some((source_id(source), EdgeKind::Forward, format!("scan {table}"), None)),
        Some(tap) => {
            let name = format!("sink {}, segment {} → sink {}", tap.sink, tap.segment, flow.sink);
            let found = blocked.iter().find(|(segment, _)| *segment == name);
            edges.push(Edge {
                blocked_seconds: Some(found.map_or(0.0, |(_, ns)| *ns as f64 / 1e9)),
                from: format!("flow:{}:segment:{}", tap.flow, tap.segment),
                to: format!("flow:{i}:segment:0"),
                kind: EdgeKind::Exchange,
                description: format!("{} (shared)", tap.exchange),
            });
            None
        }
    };
    for (j, segment) in flow.segments.iter().enumerate() {
        let id = format!("flow:{i}:segment:{j}");
        if let Some((from, kind, description, out_of)) = previous.take() {
            edges.push(edge(from, id.clone(), kind, description, out_of));
        }
        nodes.push(segment_node(&id, j, segment));
        previous = Some(match &segment.exchange {
            Some(exchange) => (id, EdgeKind::Exchange, exchange.clone(), Some(j)),
            None => (id, EdgeKind::Forward, "write".to_string(), None),
        });
    }
    let mut number = flow.segments.len();
    for side in &flow.sides {
        let (source, table) = side.scan.split_once('.').unwrap_or((side.scan.as_str(), ""));
        let mut previous = (source_id(source), EdgeKind::Forward, format!("scan {table}"), None);
        for segment in &side.segments {
            let id = format!("flow:{i}:segment:{number}");
            let (from, kind, description, out_of) = previous;
            edges.push(edge(from, id.clone(), kind, description, out_of));
            nodes.push(segment_node(&id, number, segment));
            previous = (id, EdgeKind::Exchange, segment.exchange.clone().unwrap_or_default(), Some(number));
            number += 1;
        }
        let (from, kind, description, out_of) = previous;
        let to = format!("flow:{i}:segment:{}", side.into);
        edges.push(edge(from, to, kind, format!("{description} (input {})", side.port), out_of));
    }
    let sink_id = format!("sink:{}", flow.sink);
    let (from, kind, description, out_of) = previous.expect("a flow has a segment");
    edges.push(edge(from, sink_id.clone(), kind, description, out_of));
    let live = metrics.sinks.get(i).filter(|live| live.name == flow.sink);
    nodes.push(Node {
        id: sink_id,
        kind: NodeKind::Sink,
        name: flow.sink.clone(),
        describe: Some(flow.sink_describe.clone()),
        operators: Vec::new(),
        parallelism: flow.segments.last().map_or(1, |segment| segment.parallelism),
        keyed_state: None,
        rows: live.map(|live| live.rows.load(Ordering::Relaxed)),
        rows_per_second: live.and(rates.sinks.get(i).copied()),
        watermark_ms: None,
        lane_watermarks_ms: Vec::new(),
        watermark_lag_ms: None,
        bad_rows: None,
    });
}

fn segment_node(id: &str, number: usize, segment: &sluice_engine::SegmentNode) -> Node {
    Node {
        id: id.to_string(),
        kind: NodeKind::Segment,
        name: format!("segment {number}"),
        describe: None,
        operators: segment.operators.clone(),
        parallelism: segment.parallelism,
        keyed_state: segment.state.clone(),
        rows: None,
        rows_per_second: None,
        watermark_ms: None,
        lane_watermarks_ms: Vec::new(),
        watermark_lag_ms: None,
        bad_rows: None,
    }
}

fn pressure(worker: u32, metrics: &Metrics, rates: &Rates) -> Vec<ThreadPressure> {
    metrics
        .local_threads()
        .filter_map(|slot| {
            let thread = metrics.threads.get(slot as usize)?;
            Some(ThreadPressure {
                worker,
                thread: slot,
                blocked: thread.blocked.load(Ordering::Relaxed),
                blocked_seconds: thread.backpressure_ns.load(Ordering::Relaxed) as f64 / 1e9,
                blocked_ratio: rates.backpressure.get(slot as usize).copied(),
            })
        })
        .collect()
}
