//! `/graph`: the dataflow the job runs (what `sluice explain` prints) as nodes and
//! edges, with the live counters and rates on them.
//!
//! Nodes: one per source, one per segment of each flow (operators fused between two
//! exchanges) and one per sink. Edges: a source's table scanned into a flow's first
//! segment, the exchanges between segments, the last segment into its sink. Counters
//! exist per source, per sink and per driver thread (segments share the threads, so a
//! segment node has no counters of its own; backpressure is per thread).
//!
//! Bounds: as large as the explanation; built from atomics read once and the sampler's
//! latest rates.

use std::sync::atomic::Ordering;

use serde::Serialize;
use sluice_engine::{JobHandle, Metrics, Status};
use utoipa::ToSchema;

use crate::sampler::{Rates, now_ms};

/// The whole graph.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Graph {
    /// `[pipeline] name`.
    pub(crate) pipeline: String,
    /// The job's state (see `/status`).
    pub(crate) state: crate::status::State,
    /// Driver threads of this worker.
    pub(crate) threads: u32,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NodeKind {
    Source,
    Segment,
    Sink,
}

/// A source, a segment of operators, or a sink.
#[derive(Debug, Serialize, ToSchema)]
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
    /// The source's watermark (its slowest lane), in milliseconds since the Unix epoch.
    pub(crate) watermark_ms: Option<i64>,
    /// How far the watermark is behind the wall clock, in milliseconds.
    pub(crate) watermark_lag_ms: Option<i64>,
    /// Rows of the source that could not be decoded.
    pub(crate) bad_rows: Option<u64>,
}

/// What an edge carries rows through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EdgeKind {
    /// In the same thread (a scan, a sink's input).
    Forward,
    /// Across threads and workers, by key or to all.
    Exchange,
}

/// From one node to another.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Edge {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) kind: EdgeKind,
    /// e.g. `scan bid`, or the exchange's description (`hash by auction`).
    pub(crate) description: String,
}

/// One driver thread's backpressure.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ThreadPressure {
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
        vnodes: explanation.vnodes,
        rate_interval_ms: rates.interval_ms,
        nodes,
        edges,
        backpressure: pressure(&metrics, rates),
    }
}

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
    let (source, table) = flow.scan.split_once('.').unwrap_or((flow.scan.as_str(), ""));
    let mut previous = (source_id(source), EdgeKind::Forward, format!("scan {table}"));
    for (j, segment) in flow.segments.iter().enumerate() {
        let id = format!("flow:{i}:segment:{j}");
        let (from, kind, description) = previous;
        edges.push(Edge { from, to: id.clone(), kind, description });
        nodes.push(segment_node(&id, j, segment));
        previous = match &segment.exchange {
            Some(exchange) => (id, EdgeKind::Exchange, exchange.clone()),
            None => (id, EdgeKind::Forward, "write".to_string()),
        };
    }
    let mut number = flow.segments.len();
    for side in &flow.sides {
        let (source, table) = side.scan.split_once('.').unwrap_or((side.scan.as_str(), ""));
        let mut previous = (source_id(source), EdgeKind::Forward, format!("scan {table}"));
        for segment in &side.segments {
            let id = format!("flow:{i}:segment:{number}");
            let (from, kind, description) = previous;
            edges.push(Edge { from, to: id.clone(), kind, description });
            nodes.push(segment_node(&id, number, segment));
            previous = (id, EdgeKind::Exchange, segment.exchange.clone().unwrap_or_default());
            number += 1;
        }
        let (from, kind, description) = previous;
        let to = format!("flow:{i}:segment:{}", side.into);
        edges.push(Edge { from, to, kind, description: format!("{description} (input {})", side.port) });
    }
    let sink_id = format!("sink:{}", flow.sink);
    let (from, kind, description) = previous;
    edges.push(Edge { from, to: sink_id.clone(), kind, description });
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
        watermark_lag_ms: None,
        bad_rows: None,
    }
}

fn pressure(metrics: &Metrics, rates: &Rates) -> Vec<ThreadPressure> {
    metrics
        .threads
        .iter()
        .enumerate()
        .map(|(i, thread)| ThreadPressure {
            thread: u32::try_from(i).unwrap_or(u32::MAX),
            blocked: thread.blocked.load(Ordering::Relaxed),
            blocked_seconds: thread.backpressure_ns.load(Ordering::Relaxed) as f64 / 1e9,
            blocked_ratio: rates.backpressure.get(i).copied(),
        })
        .collect()
}
