//! `/graph` against a running job with an exchange: every source, segment and sink of
//! the explanation is a node, the edges chain them (a view read twice through one shared
//! node), and the live rates appear.

use std::collections::HashSet;
use std::time::Instant;

use sluice_engine::JobState;

use super::{DEADLINE, Served, http};

/// Bids straight into one sink, and counted per auction (an exchange by key) into two
/// others, which share the count (`sluice_engine::share`).
const PIPELINE: &str = r#"
[pipeline]
name = "graphed"
threads = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 2000

[[view]]
name = "per_auction"
sql = """
SELECT auction, COUNT(*) AS bids, window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND))
GROUP BY auction, window_start, window_end
"""

[[sink]]
name = "all_bids"
from = "bid"
connector = "blackhole"

[[sink]]
name = "counts"
from = "per_auction"
connector = "blackhole"

[[sink]]
name = "counts_again"
from = "per_auction"
connector = "blackhole"
"#;

#[test]
fn the_graph_has_every_operator_of_the_explanation_chained_by_edges() {
    let served = Served::start_pipeline(PIPELINE, None);
    served.wait_for(JobState::Running);
    let reply = http::get(served.addr(), "/graph");
    assert_eq!(reply.code, 200, "{}", reply.body);
    let graph = reply.json();
    assert_eq!((graph["pipeline"].as_str(), graph["threads"].as_u64()), (Some("graphed"), Some(2)), "{graph}");
    let explanation = served.job().handle().explanation();
    let nodes = graph["nodes"].as_array().expect("nodes");
    let segments: usize = explanation.flows.iter().map(|flow| flow.segments.len()).sum();
    assert_eq!(nodes.len(), explanation.sources.len() + segments + explanation.flows.len(), "{graph}");
    // Every operator line of the explanation is on a segment node.
    let shown: Vec<&str> =
        nodes.iter().flat_map(|n| n["operators"].as_array().expect("operators")).filter_map(|o| o.as_str()).collect();
    for flow in &explanation.flows {
        for operator in flow.segments.iter().flat_map(|segment| &segment.operators) {
            assert!(shown.contains(&operator.as_str()), "{operator} missing: {graph}");
        }
    }
    let ids: HashSet<&str> = nodes.iter().filter_map(|n| n["id"].as_str()).collect();
    assert_eq!(ids.len(), nodes.len(), "ids are unique: {graph}");
    let edges = graph["edges"].as_array().expect("edges");
    for edge in edges {
        let (from, to) = (edge["from"].as_str().expect("from"), edge["to"].as_str().expect("to"));
        assert!(ids.contains(from) && ids.contains(to), "an edge between known nodes: {edge}");
    }
    // The count is one node, whose output also goes to the second reader's segment.
    let counts = |n: &&serde_json::Value| {
        n["operators"]
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o.as_str().is_some_and(|o| o.starts_with("window_aggregate:"))))
    };
    let counting = nodes.iter().filter(counts).count();
    assert_eq!(counting, 1, "{graph}");
    let shared = edges.iter().find(|e| e["from"] == "flow:1:segment:1" && e["to"] == "flow:2:segment:0");
    let shared = shared.unwrap_or_else(|| panic!("no edge from the shared count to its second reader: {graph}"));
    assert_eq!(
        (shared["kind"].as_str(), shared["description"].as_str()),
        (Some("exchange"), Some("forward (same thread) (shared)"))
    );
    // Every sink is reached from the source by following edges.
    for sink in ["sink:all_bids", "sink:counts", "sink:counts_again"] {
        let mut at = sink;
        let mut hops = 0;
        while let Some(edge) = edges.iter().find(|e| e["to"] == at) {
            at = edge["from"].as_str().expect("from");
            hops += 1;
            assert!(hops <= edges.len(), "a cycle: {graph}");
        }
        assert_eq!(at, "source:nexmark", "{sink} leads back to the source: {graph}");
    }
    assert!(edges.iter().any(|e| e["kind"] == "exchange"), "the GROUP BY exchanges by key: {graph}");
    for edge in edges {
        let exchange = edge["kind"] == "exchange";
        assert_eq!(edge["blocked_seconds"].as_f64().is_some_and(|s| s >= 0.0), exchange, "{edge}");
    }
    assert_eq!(graph["backpressure"].as_array().map(Vec::len), Some(2), "one entry per thread: {graph}");
}

#[test]
fn the_graph_carries_live_rates_once_two_samples_were_taken() {
    let served = Served::start_pipeline(PIPELINE, None);
    served.wait_for(JobState::Running);
    let deadline = Instant::now() + DEADLINE;
    // The sampler reads the counters every second: ask until a rate is there.
    let graph = loop {
        let graph = http::get(served.addr(), "/graph").json();
        let rate = |id: &str| {
            graph["nodes"]
                .as_array()
                .and_then(|n| n.iter().find(|n| n["id"] == id))
                .and_then(|n| n["rows_per_second"].as_f64())
        };
        if rate("source:nexmark").is_some_and(|r| r > 0.0) && rate("sink:all_bids").is_some_and(|r| r > 0.0) {
            break graph;
        }
        assert!(Instant::now() < deadline, "no rate in time: {graph}");
        std::thread::sleep(super::super::SAMPLE_EVERY / 4);
    };
    assert!(graph["rate_interval_ms"].as_u64().is_some_and(|ms| ms > 0), "{graph}");
    let source =
        graph["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == "source:nexmark")).expect("source");
    assert!(source["rows"].as_u64().is_some_and(|rows| rows > 0), "{source}");
}

#[test]
fn status_lists_the_checkpoints_committed_with_the_time_between_them() {
    let checkpointed = format!("{PIPELINE}\n[checkpoint]\ninterval = \"50ms\"\nstore = \"file://./state\"\n");
    let served = Served::start_pipeline(&checkpointed, None);
    let deadline = Instant::now() + DEADLINE;
    // The sampler sees commits once a second: ask until two were seen.
    let status = loop {
        let status = http::get(served.addr(), "/status").json();
        if status["checkpoints"].as_array().is_some_and(|seen| seen.len() >= 2) {
            break status;
        }
        assert!(Instant::now() < deadline, "no checkpoints in time: {status}");
        std::thread::sleep(super::super::SAMPLE_EVERY / 4);
    };
    let seen = status["checkpoints"].as_array().expect("checkpoints");
    let epochs: Vec<u64> = seen.iter().filter_map(|c| c["epoch"].as_u64()).collect();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "increasing epochs: {status}");
    assert!(seen[0]["since_previous_ms"].is_null() && seen[1]["since_previous_ms"].is_u64(), "{status}");
    assert!(seen[1]["seen_at_ms"].as_i64() >= seen[0]["seen_at_ms"].as_i64(), "{status}");
}
