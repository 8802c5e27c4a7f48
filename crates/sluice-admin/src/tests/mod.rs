//! The admin API over real HTTP against a real job: an endless rate-limited NEXMark
//! source into a blackhole, served on 127.0.0.1:0, called with a hand-written HTTP/1.1
//! client. Every wait waits on an event (a status change, a response) with a deadline.

mod graph;
mod guards;
mod http;
mod openapi;
mod query;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_engine::{Engine, Job, JobState, Overrides, StartOptions};

const PIPELINE: &str = r#"
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

const DEADLINE: Duration = Duration::from_secs(60);

/// A running job and its admin API; stops and waits for the job when dropped.
struct Served {
    job: Option<Job>,
    server: Option<crate::AdminServer>,
    dir: tempfile::TempDir,
}

impl Served {
    fn start(token: Option<&str>) -> Served {
        Served::start_pipeline(PIPELINE, token)
    }

    fn start_pipeline(text: &str, token: Option<&str>) -> Served {
        Served::start_with_files(text, &[], token)
    }

    /// Starts `text` in a directory holding `files` (name, content).
    fn start_with_files(text: &str, files: &[(&str, &str)], token: Option<&str>) -> Served {
        Served::start_limited(text, files, token, crate::Limits::default())
    }

    /// Starts `text` with `limits` on the API's connections.
    fn start_limited(text: &str, files: &[(&str, &str)], token: Option<&str>, limits: crate::Limits) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).expect("write");
        }
        let pipeline = Engine::default().parse(text, "p.toml", dir.path(), Overrides::default()).expect("valid");
        let job = Job::start(&pipeline, StartOptions::default()).expect("starts");
        let bind: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let server = crate::AdminListener::bind(bind, token.map(str::to_string))
            .and_then(|listener| listener.with_limits(limits).serve(job.handle()))
            .expect("serves");
        Served { job: Some(job), server: Some(server), dir }
    }

    fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("server").addr()
    }

    fn job(&self) -> &Job {
        self.job.as_ref().expect("job")
    }

    /// Waits on the job's status stream until `state`.
    fn wait_for(&self, state: JobState) {
        let mut changes = self.job().subscribe();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the job did not reach {state:?}: {:?}", self.job().status());
            if changes.next_timeout(left).is_some_and(|status| status.state == state) {
                return;
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
        if let Some(job) = self.job.take() {
            job.stop();
            job.wait();
        }
    }
}

#[test]
fn healthz_and_readyz_follow_the_job() {
    let served = Served::start(None);
    let health = http::get(served.addr(), "/healthz");
    assert_eq!((health.code, health.body.trim()), (200, "ok"));
    let early = http::get(served.addr(), "/readyz");
    if early.code == 503 {
        assert_eq!(early.json()["state"], "starting", "{}", early.body);
        assert!(early.json()["reason"].as_str().is_some_and(|r| !r.is_empty()), "{}", early.body);
    } else {
        assert_eq!(early.code, 200, "{}", early.body);
    }
    served.wait_for(JobState::Running);
    let ready = http::get(served.addr(), "/readyz");
    assert_eq!(ready.code, 200, "{}", ready.body);
    assert_eq!(ready.json()["state"], "running");
    served.job().stop();
    served.wait_for(JobState::Completed);
    let ended = http::get(served.addr(), "/readyz");
    assert_eq!(ended.code, 503, "{}", ended.body);
    assert_eq!(ended.json()["state"], "completed");
}

#[test]
fn status_names_the_state_and_every_source_and_sink() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let reply = http::get(served.addr(), "/status");
    assert_eq!(reply.code, 200, "{}", reply.body);
    assert!(reply.header("content-type").is_some_and(|t| t.starts_with("application/json")), "{reply:?}");
    let status = reply.json();
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["pipeline"], "watched");
    for key in ["last_committed_epoch", "resumed_from", "failure", "worker"] {
        assert!(status[key].is_null(), "{key} is null for a solo run without checkpoints: {status}");
    }
    let source = &status["sources"][0];
    assert_eq!(source["name"], "nexmark", "{status}");
    assert!(source["rows_in"].is_u64() && source["bad_rows"].is_u64(), "{status}");
    let sink = &status["sinks"][0];
    assert_eq!(sink["name"], "out", "{status}");
    assert!(sink["rows_out"].is_u64(), "{status}");
}

#[test]
fn metrics_are_prometheus_text_with_each_source_sink_and_thread() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let reply = http::get(served.addr(), "/metrics");
    assert_eq!(reply.code, 200, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let mut typed: Vec<String> = Vec::new();
    let mut samples: Vec<String> = Vec::new();
    for line in reply.body.lines() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            assert!(help.split_once(' ').is_some_and(|(_, text)| !text.is_empty()), "{line}");
        } else if let Some(kind) = line.strip_prefix("# TYPE ") {
            let (name, kind) = kind.split_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(["counter", "gauge"].contains(&kind), "{line}");
            typed.push(name.to_string());
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample: {line}"));
            value.parse::<f64>().unwrap_or_else(|e| panic!("{line}: {e}"));
            let name = series.split('{').next().unwrap_or_default();
            assert!(typed.last().is_some_and(|t| t == name), "a sample after its # TYPE: {line}");
            samples.push(series.to_string());
        }
    }
    for expected in [
        "sluice_source_rows_total{source=\"nexmark\"}",
        "sluice_source_bad_rows_total{source=\"nexmark\"}",
        "sluice_sink_rows_total{sink=\"out\"}",
        "sluice_thread_backpressure_seconds_total{thread=\"0\"}",
        "sluice_job_state{state=\"running\"}",
    ] {
        assert!(samples.iter().any(|s| s == expected), "{expected} missing:\n{}", reply.body);
    }
    for family in ["sluice_lane_watermark_milliseconds", "sluice_counter_total"] {
        assert!(typed.iter().any(|t| t == family), "{family} missing:\n{}", reply.body);
    }
}

/// A file source's bytes are the file's, a file sink's bytes are what it wrote, and a
/// window aggregate's late rows have their own family, per view.
#[test]
fn metrics_count_the_bytes_read_and_written_and_the_late_rows() {
    // One lane and a row per batch: the watermark (latest time - 2 s) passes the first
    // window before the row at :09 arrives, so exactly that row is late.
    let events = concat!(
        "{\"k\": \"a\", \"ts\": \"2026-01-01 00:00:01\"}\n",
        "{\"k\": \"a\", \"ts\": \"2026-01-01 00:00:13\"}\n",
        "{\"k\": \"a\", \"ts\": \"2026-01-01 00:00:09\"}\n",
        "{\"k\": \"a\", \"ts\": \"2026-01-01 00:00:12\"}\n",
    );
    let pipeline = r#"
[pipeline]
name = "bytes"
batch_size = 1

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, ts TIMESTAMP(3)"
event_time = "ts"
watermark_delay = "2s"
[source.options]
path = "events.jsonl"
split_bytes = 1048576

[[view]]
name = "counts"
sql = """
SELECT k, COUNT(*) AS n, window_start
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '10' SECOND))
GROUP BY k, window_start, window_end
"""

[[sink]]
name = "out"
from = "counts"
connector = "file"
format = "json"
[sink.options]
path = "out.jsonl"
"#;
    let served = Served::start_with_files(pipeline, &[("events.jsonl", events)], None);
    served.wait_for(JobState::Completed);
    let written = std::fs::metadata(served.dir.path().join("out.jsonl")).expect("the sink's file").len();
    let reply = http::get(served.addr(), "/metrics");
    assert_eq!(reply.code, 200, "{}", reply.body);
    let sample = |series: &str| {
        reply
            .body
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing:\n{}", reply.body))
            .to_string()
    };
    assert_eq!(sample("sluice_source_bytes_total{source=\"events\"}"), events.len().to_string());
    assert!(written > 0, "two windows were written");
    assert_eq!(sample("sluice_sink_bytes_total{sink=\"out\"}"), written.to_string());
    assert_eq!(sample("sluice_late_rows_total{view=\"counts\"}"), "1");
    assert!(reply.body.contains("# TYPE sluice_exchange_bytes_sent_total counter"), "{}", reply.body);
    assert!(!reply.body.contains("sluice_exchange_bytes_sent_total{"), "no peers alone: {}", reply.body);
}

#[test]
fn the_status_stream_gives_the_current_state_then_each_change_until_the_end() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let (code, mut lines) = http::stream(served.addr(), "/status/stream");
    assert_eq!(code, 200);
    let first: serde_json::Value = serde_json::from_str(&lines.next_line().expect("a first line")).expect("JSON");
    assert_eq!(first["state"], "running", "the current state first: {first}");
    let stop = http::request(served.addr(), "POST", "/stop", &[]);
    assert_eq!(stop.code, 202, "{}", stop.body);
    assert_eq!(stop.json()["stopping"], true);
    let mut states = Vec::new();
    while let Some(line) = lines.next_line() {
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
        if value["heartbeat"] == true {
            continue;
        }
        states.push(value["state"].as_str().expect("a state").to_string());
    }
    assert_eq!(states.last().map(String::as_str), Some("completed"), "ends on the final state: {states:?}");
    assert!(states.iter().all(|s| s == "stopping" || s == "completed"), "{states:?}");
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused() {
    let served = Served::start(None);
    let anywhere: SocketAddr = "0.0.0.0:0".parse().expect("addr");
    let error = crate::serve(served.job().handle(), anywhere, None).expect_err("refused");
    assert_eq!(error.code, "admin.token");
    assert!(error.message.contains("0.0.0.0:0"), "names the address: {error:?}");
    assert!(error.fix.is_some_and(|fix| fix.contains("--admin-token-file")));
}

#[test]
fn with_a_token_only_the_right_bearer_gets_in() {
    let served = Served::start(Some("s3cret-token"));
    let addr = served.addr();
    assert_eq!(http::get(addr, "/status").code, 401, "no token");
    let wrong = http::request(addr, "GET", "/status", &[("Authorization", "Bearer s3cret-tokex")]);
    assert_eq!(wrong.code, 401, "a wrong token");
    let short = http::request(addr, "POST", "/stop", &[("Authorization", "Bearer s3cret")]);
    assert_eq!(short.code, 401, "a prefix of the token");
    let state = served.job().status().state;
    assert!(!matches!(state, JobState::Stopping | JobState::Completed), "not stopped: {state:?}");
    assert_eq!(http::get(addr, "/healthz").code, 200, "probes need no token");
    assert!(matches!(http::get(addr, "/readyz").code, 200 | 503), "probes need no token");
    let right = http::request(addr, "GET", "/status", &[("Authorization", "Bearer s3cret-token")]);
    assert_eq!(right.code, 200, "{}", right.body);
    let basic = http::request(addr, "GET", "/metrics", &[("Authorization", "Basic s3cret-token")]);
    assert_eq!(basic.code, 401, "another scheme");
}

#[test]
fn an_idle_status_stream_sends_a_heartbeat_line() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let (code, mut lines) = http::stream(served.addr(), "/status/stream");
    assert_eq!(code, 200);
    let first = lines.next_line().expect("the current status");
    assert!(first.contains("\"state\":\"running\""), "{first}");
    // Nothing changes while a job without checkpoints runs: the next line is a heartbeat.
    let started = Instant::now();
    assert_eq!(lines.next_line().as_deref(), Some("{\"heartbeat\":true}"));
    assert!(started.elapsed() >= crate::HEARTBEAT / 2, "not before the heartbeat interval");
}

#[test]
fn shutdown_ends_open_streams_within_its_grace() {
    let mut served = Served::start(None);
    served.wait_for(JobState::Running);
    let (_, mut lines) = http::stream(served.addr(), "/status/stream");
    assert!(lines.next_line().is_some_and(|line| line.contains("running")));
    // Returns (its grace is bounded; a hang here would be the failure).
    served.server.take().expect("server").shutdown();
    while let Some(line) = lines.next_line() {
        assert!(line.contains("heartbeat"), "nothing but heartbeats after the shutdown: {line}");
    }
    assert_eq!(served.job().status().state, JobState::Running, "the job goes on without its API");
}

#[test]
fn clients_that_go_away_free_their_streams() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let mut open = Vec::new();
    for _ in 0..crate::MAX_STREAMS {
        let (code, mut lines) = http::stream(served.addr(), "/status/stream");
        assert_eq!(code, 200);
        assert!(lines.next_line().is_some_and(|line| line.contains("running")));
        open.push(lines);
    }
    let (code, _) = http::try_stream(served.addr(), "/status/stream");
    assert_eq!(code, 503, "at most MAX_STREAMS streams are open at once");
    drop(open);
    // The server notices the closed connections without writing to them: a new stream
    // is accepted again (retried until then, within the deadline).
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (code, _) = http::try_stream(served.addr(), "/status/stream");
        if code == 200 {
            break;
        }
        assert_eq!(code, 503);
        assert!(Instant::now() < deadline, "closed streams were never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}
