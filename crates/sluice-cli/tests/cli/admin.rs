//! `sluice run`'s admin API: the line that names its address, requests to it while a
//! rate-limited pipeline runs, `POST /stop` ending the run cleanly, and the refusals.
//! Every wait has a deadline and waits on an event (a line on stderr, a response).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::harness::{Scratch, assert_fails_with, sluice_command, stderr};

pub(crate) const PIPELINE: &str = r#"
[pipeline]
name = "watched"
threads = 1

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 1000

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"
"#;

pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// A `sluice run` child whose stderr lines arrive on a channel (read on a thread).
pub(crate) struct Running {
    child: Child,
    addr: Option<SocketAddr>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    pub(crate) fn start(scratch: &Scratch, args: &[&str]) -> Running {
        Running::start_with(scratch, args, &[])
    }

    /// [`Running::start`] with environment variables set.
    pub(crate) fn start_with(scratch: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = sluice_command(scratch.dir.path())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        let err = child.stderr.take().expect("stderr");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, addr: None, lines, seen: Vec::new() }
    }

    /// The next stderr line, None at its end; panics past the deadline.
    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("no line in time; stderr so far:\n{}", self.seen.join("\n")),
        }
    }

    /// The address from `sluice: admin API on http://ADDR`.
    pub(crate) fn admin_addr(&mut self) -> SocketAddr {
        let deadline = Instant::now() + DEADLINE;
        while let Some(line) = self.next_line(deadline) {
            if let Some(addr) = line.strip_prefix("sluice: admin API on http://") {
                let addr = addr.parse().expect("an address");
                self.addr = Some(addr);
                return addr;
            }
        }
        panic!("no admin line; stderr:\n{}", self.seen.join("\n"));
    }

    /// Reads stderr lines until one contains `needle`; returns it.
    pub(crate) fn until(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        while let Some(line) = self.next_line(deadline) {
            if line.contains(needle) {
                return line;
            }
        }
        panic!("no line with {needle:?}; stderr:\n{}", self.seen.join("\n"));
    }

    /// Kills the process (SIGKILL) and waits for its end.
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("wait");
    }

    /// The address [`Running::admin_addr`] read.
    pub(crate) fn admin_addr_known(&self) -> SocketAddr {
        self.addr.expect("admin_addr was read first")
    }

    /// Reads stderr to its end, then the exit code.
    pub(crate) fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + DEADLINE;
        while self.next_line(deadline).is_some() {}
        let status = self.child.wait().expect("wait");
        (status.code(), self.seen.join("\n"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed test must not leave an endless run behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request (`Connection: close`); the status code and the raw rest.
pub(crate) fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    request_with(addr, method, path, None)
}

/// The JSON body of a response [`request`] returned.
pub(crate) fn json_body(response: &str) -> serde_json::Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_else(|| panic!("no body in {response}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// [`request`] with `Authorization: Bearer TOKEN` when `token` is given.
pub(crate) fn request_with(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = open(addr, method, path, token);
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let code = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{response}"));
    (code, response)
}

fn open(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let auth = token.map_or_else(String::new, |token| format!("Authorization: Bearer {token}\r\n"));
    // Every POST is JSON, as the API requires (an empty body where it takes none).
    let json = if method == "POST" { "Content-Type: application/json\r\n" } else { "" };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}{json}Connection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("send");
    stream
}

/// Reads the status stream's lines until one has `"state":"running"` (chunk-size lines
/// of the chunked framing are skipped: they are never JSON).
/// Stops `run` through `POST /stop` and checks it exits cleanly.
pub(crate) fn stop(run: Running, addr: SocketAddr) {
    let (code, answer) = request(addr, "POST", "/stop");
    assert_eq!(code, 202, "{answer}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "{text}");
}

pub(crate) fn wait_running(addr: SocketAddr) {
    let reader = BufReader::new(open(addr, "GET", "/status/stream", None));
    for line in reader.lines() {
        let line = line.expect("a line of the status stream");
        if line.contains("\"state\":\"running\"") {
            return;
        }
        assert!(!line.contains("\"state\":\"failed\""), "{line}");
    }
    panic!("the status stream ended before the run was running");
}

#[test]
fn run_serves_the_admin_api_and_post_stop_ends_the_run_cleanly() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    let mut run = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = run.admin_addr();
    assert!(addr.ip().is_loopback(), "loopback by default: {addr}");
    let (code, health) = request(addr, "GET", "/healthz");
    assert_eq!(code, 200, "{health}");
    wait_running(addr);
    let (code, status) = request(addr, "GET", "/status");
    assert_eq!(code, 200, "{status}");
    assert!(status.contains("\"state\":\"running\"") && status.contains("\"rows_in\""), "{status}");
    let (code, metrics) = request(addr, "GET", "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("sluice_source_rows_total{source=\"nexmark\"}"), "{metrics}");
    let (code, stop) = request(addr, "POST", "/stop");
    assert_eq!(code, 202, "{stop}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "stderr:\n{text}");
    assert!(text.contains("stopped and drained"), "{text}");
}

#[test]
fn a_non_loopback_admin_address_without_a_token_is_refused_before_the_run() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    let run = scratch.sluice(&["run", "pipeline.toml", "--admin-bind", "0.0.0.0:0"]);
    assert_fails_with(&run, &["0.0.0.0:0", "--admin-token-file"]);
    assert!(!stderr(&run).contains("running pipeline"), "{}", stderr(&run));
}

#[test]
fn admin_off_prints_no_admin_line() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &PIPELINE.replace("rate = 1000", "events = 100"));
    let run = scratch.sluice(&["run", "pipeline.toml", "--admin-bind", "off"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert!(!stderr(&run).contains("admin API"), "{}", stderr(&run));
}

/// `POST /checkpoint` takes a checkpoint at once (the interval is an hour) and answers
/// once it is committed, with its epoch; `/status` then shows it committed. Without a
/// `[checkpoint]` section the answer is 409 with the fix.
#[test]
fn post_checkpoint_answers_with_the_committed_epoch() {
    let scratch = Scratch::new();
    let pipeline = PIPELINE.replacen(
        "\n[[source]]",
        "\n[checkpoint]\ninterval = \"1h\"\nstore = \"file://./state\"\n\n[[source]]",
        1,
    );
    scratch.write("pipeline.toml", &pipeline);
    let mut running = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = running.admin_addr();
    let epoch = |response: &str| -> u64 {
        let json = json_body(response);
        json["epoch"].as_u64().unwrap_or_else(|| panic!("no epoch in {json}"))
    };
    let (code, first) = request(addr, "POST", "/checkpoint");
    assert_eq!(code, 200, "{first}");
    let (code, second) = request(addr, "POST", "/checkpoint");
    assert_eq!(code, 200, "{second}");
    assert!(epoch(&second) > epoch(&first), "a later request is answered by a later checkpoint");
    let (_, status) = request(addr, "GET", "/status");
    assert!(status.contains(&format!("\"last_committed_epoch\":{}", epoch(&second))), "{status}");
    // The history (sampled every second) shows the checkpoint with its figures.
    let deadline = Instant::now() + DEADLINE;
    let wanted = format!("\"epoch\":{},", epoch(&second));
    let history = loop {
        let (_, status) = request(addr, "GET", "/status");
        let json = json_body(&status);
        let seen = json["checkpoints"].as_array().cloned().unwrap_or_default();
        if let Some(seen) = seen.into_iter().find(|c| c["epoch"].as_u64() == Some(epoch(&second))) {
            break seen;
        }
        assert!(Instant::now() < deadline, "checkpoint {wanted} never in the history: {json}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(history["duration_ms"].is_u64() && history["pause_ms"].is_u64(), "{history}");
    assert!(history["state_bytes"].is_u64(), "{history}");
    stop(running, addr);

    let plain = Scratch::new();
    plain.write("pipeline.toml", PIPELINE);
    let mut running = Running::start(&plain, &["run", "pipeline.toml"]);
    let addr = running.admin_addr();
    let (code, refused) = request(addr, "POST", "/checkpoint");
    assert_eq!(code, 409, "{refused}");
    assert!(refused.contains("takes no checkpoints") && refused.contains("[checkpoint]"), "{refused}");
}

/// `/metrics` shows each operator's rows and, once a checkpoint is published, its state
/// bytes and the checkpoint's figures.
#[test]
fn metrics_show_each_operators_rows_and_state_and_the_checkpoints() {
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        r#"
[pipeline]
name = "metered"
threads = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 20000

[[view]]
name = "by_auction"
sql = "SELECT auction, COUNT(*) AS bids FROM bid GROUP BY auction"

[[sink]]
name = "out"
from = "by_auction"
connector = "blackhole"

[checkpoint]
interval = "1h"
store = "file://./state"
"#,
    );
    let mut running = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = running.admin_addr();
    wait_running(addr);
    // Rows have reached the aggregate once its state is not empty: checkpoint until so.
    let deadline = Instant::now() + DEADLINE;
    let (samples, text) = loop {
        assert_eq!(request(addr, "POST", "/checkpoint").0, 200);
        let (code, text) = request(addr, "GET", "/metrics");
        assert_eq!(code, 200, "{text}");
        let samples: Vec<(String, f64)> = text
            .lines()
            .filter(|line| line.starts_with("sluice_"))
            .filter_map(|line| {
                line.rsplit_once(' ').map(|(series, value)| (series.to_string(), value.parse().unwrap_or(-1.0)))
            })
            .collect();
        let state = samples.iter().find(|(series, _)| {
            series.starts_with("sluice_operator_state_bytes{operator=\"sink out, segment ")
                && series.contains("group_aggregate")
        });
        if state.is_some_and(|(_, bytes)| *bytes > 0.0) {
            break (samples, text);
        }
        assert!(Instant::now() < deadline, "the aggregate's state never showed:\n{text}");
    };
    let value = |wanted: &dyn Fn(&str) -> bool| {
        samples
            .iter()
            .find(|(series, _)| wanted(series))
            .map(|(_, value)| *value)
            .unwrap_or_else(|| panic!("missing in:\n{text}"))
    };
    let aggregate = |family: &str| {
        let prefix = format!("{family}{{operator=\"sink out, segment ");
        value(&|series: &str| series.starts_with(&prefix) && series.contains("group_aggregate"))
    };
    assert!(aggregate("sluice_operator_rows_in_total") > 0.0, "{text}");
    assert!(aggregate("sluice_operator_rows_out_total") > 0.0, "{text}");
    assert!(aggregate("sluice_operator_bytes_in_total") > 0.0, "{text}");
    assert!(aggregate("sluice_operator_bytes_out_total") > 0.0, "{text}");
    assert!(value(&|s: &str| s == "sluice_checkpoints_total{outcome=\"published\"}") >= 1.0, "{text}");
    assert_eq!(value(&|s: &str| s == "sluice_checkpoints_total{outcome=\"failed\"}"), 0.0, "{text}");
    assert!(value(&|s: &str| s == "sluice_checkpoint_state_bytes") > 0.0, "{text}");
    assert!(value(&|s: &str| s == "sluice_checkpoint_duration_seconds") >= 0.0, "{text}");
    assert!(text.contains("# TYPE sluice_source_watermark_lag_seconds gauge"), "{text}");
    let edge = "sluice_exchange_backpressure_seconds_total{segment=\"sink out, segment 0\"}";
    assert!(value(&|s: &str| s == edge) >= 0.0, "{text}");
    // The aggregate's segment is fed by an exchange from both threads: a gauge per thread.
    for thread in 0..2 {
        let series =
            format!("sluice_exchange_queue_capacity_messages{{segment=\"sink out, segment 1\",thread=\"{thread}\"}}");
        assert!(value(&|s: &str| s == series) > 0.0, "{text}");
        let queued = format!("sluice_exchange_queued_messages{{segment=\"sink out, segment 1\",thread=\"{thread}\"}}");
        assert!(value(&|s: &str| s == queued) >= 0.0, "{text}");
    }
    stop(running, addr);
}

/// In a cluster, `POST /checkpoint` asked of the follower is the leader's checkpoint, and
/// `POST /pause` asked of the follower pauses every worker's sources until `POST
/// /resume`, asked of the leader, reads them again everywhere.
#[test]
fn a_clusters_follower_takes_checkpoints_and_pauses_every_worker() {
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        r#"
[pipeline]
name = "paused-cluster"
threads = 1

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 5000

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"

[checkpoint]
interval = "1h"
store = "file://./state"
"#,
    );
    let (leader, leader_addr, follower, follower_addr) = crate::query::start_cluster(&scratch);
    let checkpoint = |addr: SocketAddr| -> u64 {
        let (code, answer) = request(addr, "POST", "/checkpoint");
        assert_eq!(code, 200, "{answer}");
        json_body(&answer)["epoch"].as_u64().unwrap_or_else(|| panic!("no epoch: {answer}"))
    };
    let first = checkpoint(follower_addr);
    assert!(checkpoint(leader_addr) > first, "the follower's checkpoint was the leader's");
    let status = |addr: SocketAddr| json_body(&request(addr, "GET", "/status").1);
    // Each worker's own rows (`/status` adds up the cluster's).
    let rows_in = |addr: SocketAddr| {
        let own = json_body(&request(addr, "POST", "/internal/status").1);
        own["sources"][0]["rows_in"].as_u64().expect("rows_in")
    };
    let wait_for_state = |addr: SocketAddr, wanted: &str| {
        let deadline = Instant::now() + DEADLINE;
        while status(addr)["state"] != wanted {
            assert!(Instant::now() < deadline, "{addr} never {wanted}: {}", status(addr));
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // A document asked for again (every 100 ms, within DEADLINE) until `done` holds of it.
    let ask_until = |ask: &dyn Fn() -> serde_json::Value, done: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let document = ask();
            if done(&document) || Instant::now() >= deadline {
                break document;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let all_answered = |document: &serde_json::Value| {
        document["members"].as_array().is_some_and(|all| all.iter().all(|m| m["state"].is_string()))
    };

    // Either worker's /status lists both, each with its own state and counters (asked of
    // the other within 2 s: on a loaded machine, asked again until both answered).
    let members = ask_until(&|| status(follower_addr), &all_answered)["members"].clone();
    assert_eq!(members.as_array().map(Vec::len), Some(2), "{members}");
    assert_eq!((members[0]["id"].as_u64(), members[0]["this_worker"].as_bool()), (Some(0), Some(false)), "{members}");
    assert_eq!((members[1]["id"].as_u64(), members[1]["this_worker"].as_bool()), (Some(1), Some(true)), "{members}");
    for member in [&members[0], &members[1]] {
        assert_eq!(member["state"], "running", "{members}");
        assert!(member["rows_in"].as_u64().is_some_and(|rows| rows > 0), "{members}");
    }

    let (code, paused) = request(follower_addr, "POST", "/pause");
    assert_eq!(code, 200, "{paused}");
    wait_for_state(leader_addr, "paused");
    wait_for_state(follower_addr, "paused");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let members = status(leader_addr)["members"].clone();
        if members.as_array().into_iter().flatten().all(|m| m["state"] == "paused") {
            break;
        }
        assert!(Instant::now() < deadline, "not every member shows paused: {members}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both paused before this checkpoint's barrier: no lane is read since, on either.
    checkpoint(follower_addr);
    let held = (rows_in(leader_addr), rows_in(follower_addr));
    checkpoint(leader_addr);
    assert_eq!((rows_in(leader_addr), rows_in(follower_addr)), held, "no row is read while paused");

    // Either worker's /status and /graph add up both workers' counters (while paused
    // they hold still).
    let summed = ask_until(&|| status(leader_addr), &all_answered);
    assert_eq!(summed["sources"][0]["rows_in"].as_u64(), Some(held.0 + held.1), "{summed}");
    assert_eq!(summed["sinks"][0]["rows_out"].as_u64(), Some(held.0 + held.1), "{summed}");
    let graph = ask_until(&|| json_body(&request(follower_addr, "GET", "/graph").1), &|graph| {
        graph["workers"] == serde_json::json!([0, 1])
    });
    assert_eq!(graph["workers"], serde_json::json!([0, 1]), "{graph}");
    let nodes = graph["nodes"].as_array().expect("nodes");
    let source = nodes.iter().find(|node| node["id"] == "source:nexmark").expect("the source's node");
    assert_eq!(source["rows"].as_u64(), Some(held.0 + held.1), "{graph}");
    assert!(source["watermark_ms"].is_i64(), "every lane's watermark, from both workers: {graph}");
    let threads: Vec<(u64, u64)> = graph["backpressure"]
        .as_array()
        .expect("backpressure")
        .iter()
        .map(|t| (t["worker"].as_u64().unwrap_or(99), t["thread"].as_u64().unwrap_or(99)))
        .collect();
    assert_eq!(threads, [(0, 0), (1, 1)], "each worker's own thread, by slot: {graph}");
    let own = json_body(&request(follower_addr, "POST", "/internal/graph").1);
    let own_source =
        own["nodes"].as_array().and_then(|nodes| nodes.iter().find(|n| n["id"] == "source:nexmark").cloned());
    let lanes = own_source.map(|source| source["lane_watermarks_ms"].clone()).unwrap_or_default();
    assert_eq!(lanes.as_array().map(|lanes| lanes.iter().filter(|w| w.is_i64()).count()), Some(1), "{own}");
    let metrics = request(leader_addr, "GET", "/metrics").1;
    assert!(metrics.contains("sluice_source_watermark_lag_seconds{source=\"nexmark\"} "), "its own lane's: {metrics}");
    assert!(metrics.contains("sluice_exchange_bytes_sent_total{peer=\"1\"} "), "{metrics}");
    assert!(metrics.contains("sluice_exchange_credit_stalls_total{peer=\"1\"} "), "{metrics}");

    let (code, resumed) = request(leader_addr, "POST", "/resume");
    assert_eq!(code, 200, "{resumed}");
    wait_for_state(follower_addr, "running");
    let deadline = Instant::now() + DEADLINE;
    while rows_in(follower_addr) == held.1 || rows_in(leader_addr) == held.0 {
        assert!(Instant::now() < deadline, "the sources were not read again after the resume");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Dropping them kills both: the stop of a cluster is tested elsewhere.
    drop((leader, follower));
}

/// Rows of the file `a_clusters_status_stream_carries_every_workers_counters` reads.
const STREAMED_ROWS: u64 = 6000;

/// In a cluster the status stream's lines carry the whole cluster's counters, read from
/// the follower and from the leader: a file's rows, split into lanes both workers read,
/// add up to the whole file once read (a rate-limited nexmark keeps the run going, its
/// checkpoints make the lines). Each wait is for the next line of a stream.
#[test]
fn a_clusters_status_stream_carries_every_workers_counters() {
    let scratch = Scratch::new();
    let events: String = (0..STREAMED_ROWS).map(|i| format!("{{\"k\": \"k{}\", \"v\": {i}}}\n", i % 7)).collect();
    scratch.write("events.jsonl", &events);
    scratch.write(
        "pipeline.toml",
        r#"
[pipeline]
name = "streamed-cluster"
threads = 1

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT"
[source.options]
path = "events.jsonl"
split_bytes = 4096

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 500

[[sink]]
name = "copied"
from = "events"
connector = "blackhole"

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"

[checkpoint]
interval = "200ms"
store = "file://./state"
"#,
    );
    let (leader, leader_addr, follower, follower_addr) = crate::query::start_cluster(&scratch);
    let named = |document: &serde_json::Value, list: &str, name: &str, field: &str| -> Option<u64> {
        let items = document[list].as_array()?;
        items.iter().find(|item| item["name"] == name)?[field].as_u64()
    };
    for addr in [follower_addr, leader_addr] {
        // The stream's lines until one counts every row of the file (never more).
        let reader = BufReader::new(open(addr, "GET", "/status/stream", None));
        let mut whole = None;
        for line in reader.lines() {
            let line = line.expect("a line of the status stream (within the read timeout)");
            // The chunked framing's size lines are not objects (some parse as numbers).
            let document = serde_json::from_str::<serde_json::Value>(line.trim()).unwrap_or_default();
            if !document.is_object() || document["heartbeat"] == true {
                continue;
            }
            assert_eq!(document["state"], "running", "{document}");
            let rows = named(&document, "sources", "events", "rows_in").expect("the file's rows_in");
            assert!(rows <= STREAMED_ROWS, "never more than the file's rows: {document}");
            if rows == STREAMED_ROWS {
                whole = Some(document);
                break;
            }
        }
        let whole = whole.unwrap_or_else(|| panic!("{addr}'s stream ended before it counted the whole file"));
        assert_eq!(named(&whole, "sinks", "copied", "rows_out"), Some(STREAMED_ROWS), "{whole}");
        let members = whole["members"].as_array().expect("members");
        let ids: Vec<_> = members.iter().map(|m| (m["id"].as_u64(), m["this_worker"].as_bool())).collect();
        let me = u64::from(addr == follower_addr);
        assert_eq!(ids, [(Some(0), Some(me == 0)), (Some(1), Some(me == 1))], "{whole}");
        for member in members {
            assert!(member["error"].is_null() && member["rows_in"].as_u64().is_some(), "{whole}");
            assert_eq!(member["asked_at_ms"].is_i64(), member["this_worker"] == false, "{whole}");
        }
    }
    // Both workers read some of the file: each stream added the other's rows.
    let own = |addr: SocketAddr| {
        let (code, answer) = request(addr, "POST", "/internal/status");
        assert_eq!(code, 200, "{answer}");
        named(&json_body(&answer), "sources", "events", "rows_in").expect("rows_in")
    };
    let (leaders, followers) = (own(leader_addr), own(follower_addr));
    assert_eq!(leaders + followers, STREAMED_ROWS);
    assert!(leaders > 0 && followers > 0, "each worker reads lanes of the file: {leaders} and {followers}");
    // Dropping them kills both: the stop of a cluster is tested elsewhere.
    drop((leader, follower));
}

/// `POST /pause` stops reading the sources: once a checkpoint taken after it is
/// committed, the rows read stay the same through another checkpoint; `POST /resume`
/// reads them again. Both answer with the state.
#[test]
fn post_pause_holds_the_sources_until_post_resume() {
    let scratch = Scratch::new();
    let pipeline = PIPELINE.replacen(
        "\n[[source]]",
        "\n[checkpoint]\ninterval = \"1h\"\nstore = \"file://./state\"\n\n[[source]]",
        1,
    );
    scratch.write("pipeline.toml", &pipeline);
    let mut running = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = running.admin_addr();
    let rows_in = || -> u64 {
        let (_, status) = request(addr, "GET", "/status");
        let json = json_body(&status);
        json["sources"][0]["rows_in"].as_u64().unwrap_or_else(|| panic!("no rows in {json}"))
    };
    // Running first (a pause asked for while starting holds too, but answers `starting`).
    let deadline = Instant::now() + DEADLINE;
    while request(addr, "GET", "/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "the job never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, paused) = request(addr, "POST", "/pause");
    assert_eq!(code, 200, "{paused}");
    assert!(paused.contains("\"paused\":true") && paused.contains("\"state\":\"paused\""), "{paused}");
    // Every driver took this checkpoint's barrier after the pause: no lane is read since.
    assert_eq!(request(addr, "POST", "/checkpoint").0, 200);
    let held = rows_in();
    assert_eq!(request(addr, "POST", "/checkpoint").0, 200);
    assert_eq!(rows_in(), held, "no row is read while paused");
    let (code, resumed) = request(addr, "POST", "/resume");
    assert_eq!(code, 200, "{resumed}");
    assert!(resumed.contains("\"state\":\"running\""), "{resumed}");
    let deadline = Instant::now() + DEADLINE;
    while rows_in() == held {
        assert!(Instant::now() < deadline, "no row read after the resume");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(running, addr);
}
