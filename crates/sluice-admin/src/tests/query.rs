//! `POST /query`'s timeout holds: a CPU-bound query answers 504 at its deadline and its
//! execution stops (the process's gate counts no query running afterwards), also for
//! several at once, which execute one at a time. Every wait is on an event (an answer,
//! the gate's counts) with a deadline that only catches a hang.

use serde_json::json;
use sluice_engine::JobState;
use sluice_engine::query::{Counts, Executions};

use super::{DEADLINE, Served, http};

/// A sorted cross join of 10^12 rows (four copies of 1000 values): without an
/// interruption inside the sort's poll it runs for hours.
fn endless() -> String {
    let values: Vec<String> = (1..=1000).map(|v| format!("({v})")).collect();
    format!(
        "WITH t(v) AS (VALUES {}) SELECT a.v + b.v + c.v + d.v AS s FROM t a CROSS JOIN t b CROSS JOIN t c \
         CROSS JOIN t d ORDER BY s DESC LIMIT 3",
        values.join(", ")
    )
}

/// The finding: with `timeout_ms: 3000` a sorted cross join answered 504 after 23–30 s
/// (when it ended by itself), four at once after 138–152 s, starving the checkpoints.
#[test]
fn queries_past_their_timeout_answer_504_and_stop_executing() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let addr = served.addr();
    let body = json!({ "sql": endless(), "timeout_ms": 300 }).to_string();
    let replies: Vec<http::Reply> = std::thread::scope(|scope| {
        let asked: Vec<_> = (0..4).map(|_| scope.spawn(|| http::post(addr, "/query", &body))).collect();
        asked.into_iter().map(|asked| asked.join().expect("no panic")).collect()
    });
    for reply in &replies {
        assert_eq!(reply.code, 504, "{}", reply.body);
        assert!(reply.json()["error"].as_str().is_some_and(|e| e.contains("longer than 300 ms")), "{}", reply.body);
    }
    let executions = Executions::shared();
    assert!(
        executions.wait_until(|counts| counts == Counts::default(), DEADLINE),
        "an execution ran on after its 504: {:?}",
        executions.counts()
    );
    let metrics = http::get(addr, "/metrics").body;
    assert!(metrics.lines().any(|line| line == "sluice_queries_running 0"), "{metrics}");
    let next = http::post(addr, "/query", &json!({ "sql": "SELECT 1 AS one" }).to_string());
    assert_eq!((next.code, next.body.trim()), (200, r#"{"one":1}"#));
    assert_eq!(served.job().status().state, JobState::Running);
}
