//! Ad-hoc queries over materialized views of a running pipeline (`POST /query`,
//! `sluice query`): the three formats, the errors that list what exists, two views of
//! one input that never disagree at any checkpoint, and a lease that ends when its
//! client goes away. Every wait is on an event (a line, an answer) with a deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use serde_json::{Value, json};

use crate::admin::{DEADLINE, Running, json_body, request, stop, wait_running};
use crate::harness::Scratch;

/// Two running aggregates of the same bids, both materialized, and the source itself
/// not: every checkpoint must show the same number of bids in both.
const PIPELINE: &str = r#"
[pipeline]
name = "queried"
threads = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 20000

[[view]]
name = "by_auction"
sql = "SELECT auction, COUNT(*) AS bids, SUM(price) AS volume FROM bid GROUP BY auction"
materialized = true

[[view]]
name = "by_bidder"
sql = "SELECT bidder, COUNT(*) AS bids, SUM(price) AS volume FROM bid GROUP BY bidder"
materialized = true

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"

[checkpoint]
interval = "100ms"
store = "file://./state"
"#;

/// An answer: status code, headers (lower-case names) and body.
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// Sends `POST /query` with `body`; the connection is left open for the caller.
fn send(addr: SocketAddr, body: &Value) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let body = body.to_string();
    let head = format!(
        "POST /query HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).expect("send");
    stream
}

fn query(addr: SocketAddr, body: &Value) -> Answer {
    let mut stream = send(addr, body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("answer");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{head}"));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer { code, headers, body: raw[split + 4..].to_vec() }
}

/// Asks `sql` as JSON lines until its answer has a row (the first windows and
/// checkpoints take a moment); returns the rows.
fn rows_eventually(addr: SocketAddr, sql: &str) -> Vec<Value> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let answer = query(addr, &json!({ "sql": sql }));
        assert_eq!(answer.code, 200, "{}", answer.text());
        let rows: Vec<Value> = answer.text().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        if !rows.is_empty() {
            return rows;
        }
        assert!(Instant::now() < deadline, "no rows in time");
    }
}

fn start(scratch: &Scratch, env: &[(&str, &str)]) -> (Running, SocketAddr) {
    scratch.write("pipeline.toml", PIPELINE);
    let mut run = Running::start_with(scratch, &["run", "pipeline.toml", "--admin-bind", "127.0.0.1:0"], env);
    let addr = run.admin_addr();
    wait_running(addr);
    (run, addr)
}

#[test]
fn queries_answer_in_three_formats_and_errors_list_the_tables() {
    let scratch = Scratch::new();
    let (run, addr) = start(&scratch, &[]);
    let sql = "SELECT auction, bids FROM by_auction ORDER BY auction LIMIT 5";
    let rows = rows_eventually(addr, sql);
    assert!(rows.len() <= 5 && rows[0]["auction"].is_i64() && rows[0]["bids"].is_i64(), "{rows:?}");

    let csv = query(addr, &json!({ "sql": sql, "format": "csv" }));
    assert_eq!(csv.code, 200, "{}", csv.text());
    assert!(csv.header("content-type").is_some_and(|t| t.starts_with("text/csv")));
    let text = csv.text();
    assert_eq!(text.lines().next(), Some("auction,bids"), "{text}");
    assert!(csv.header("sluice-epoch").is_some_and(|e| e.parse::<u64>().is_ok()), "{:?}", csv.headers);

    let arrow = query(addr, &json!({ "sql": sql, "format": "arrow" }));
    assert_eq!(arrow.code, 200, "{}", arrow.text());
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(arrow.body), None).expect("IPC");
    let names: Vec<String> = reader.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["auction", "bids"]);
    let decoded: usize = reader.map(|b| b.expect("a batch").num_rows()).sum();
    assert!((1..=5).contains(&decoded), "{decoded}");

    // `sluice query` prints a table.
    let addr_text = addr.to_string();
    let output = scratch.sluice(&["query", "--addr", &addr_text, "SELECT COUNT(*) AS groups FROM by_bidder"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("| groups |") && stdout.contains("+--------+"), "{stdout}");
    assert!(stderr.contains("1 row at checkpoint "), "{stderr}");

    let tables = "the materialized tables are: by_auction, by_bidder (not materialized: ";
    for (sql, code, needles) in [
        ("SELECT * FROM nope", 400, vec!["no table `nope`", tables, "bid"]),
        ("SELECT * FROM bid", 400, vec!["table `bid` is not materialized", tables, "materialized = true"]),
        ("SELEC auction FROM by_auction", 400, vec!["the SQL cannot be read", "by_auction, by_bidder"]),
        ("DROP TABLE by_auction", 400, vec!["only queries are answered"]),
        ("SELECT no_such_column FROM by_auction", 400, vec!["no_such_column"]),
    ] {
        let answer = query(addr, &json!({ "sql": sql }));
        assert_eq!(answer.code, code, "{sql}: {}", answer.text());
        let body = answer.json();
        let said = format!("{} {}", body["error"].as_str().unwrap_or(""), body["fix"].as_str().unwrap_or(""));
        for needle in needles {
            assert!(said.contains(needle), "{sql}: {needle:?} not in {said}");
        }
    }
    let output = scratch.sluice(&["query", "--addr", &addr_text, "SELECT * FROM nope"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no table `nope`"));
    stop(run, addr);
}

/// The keys of one JSON line, in order, repeated ones kept (a map would keep one).
fn keys_of(line: &str) -> Vec<String> {
    let mut keys = Vec::new();
    // Every key is a string right before a colon: the values of NEXMark's rows are
    // strings and numbers, never nested.
    let bytes = line.as_bytes();
    let mut at = 0;
    while let Some(start) = line[at..].find('"').map(|i| at + i) {
        let mut end = start + 1;
        while bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        if bytes.get(end + 1) == Some(&b':') {
            keys.push(serde_json::from_str::<String>(&line[start..=end]).expect("a key"));
        }
        at = end + 1;
    }
    keys
}

/// NEXMark q20 (its text as the bench runs it) selects `dateTime` and `extra` of both a
/// bid and its auction. Every name that leaves Sluice is Flink's, in Flink's order (the
/// header of Flink's stored answer: `dateTime0`, `extra0`): `explain`, a materialized
/// view's `/query` answer, the file sink's JSON lines; and an ad-hoc query's own repeated
/// name is renamed the same way.
#[test]
fn nexmark_q20s_columns_are_named_as_flink_names_them_everywhere() {
    let header = std::fs::read_to_string(crate::harness::crate_dir().join("tests/nexmark-oracle/q20.csv"))
        .expect("Flink's answer to q20");
    let flink: Vec<String> = header.lines().next().expect("a header").split(',').map(str::to_string).collect();
    assert!(flink.contains(&"dateTime0".to_string()), "{flink:?}");
    let q20 = sluice_engine::nexmark::query_sql("q20").expect("q20");
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        &format!(
            "[pipeline]\nname = \"q20\"\nthreads = 2\n\n[[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n\
             [source.options]\nrate = 5000\n\n[[view]]\nname = \"q20\"\nsql = \"\"\"{q20}\"\"\"\nmaterialized = true\n\n\
             [[sink]]\nname = \"out\"\nfrom = \"q20\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\n\
             path = \"q20.jsonl\"\n\n[checkpoint]\ninterval = \"200ms\"\nstore = \"file://./state\"\n"
        ),
    );
    let explain = scratch.sluice(&["explain", "pipeline.toml"]);
    let text = String::from_utf8_lossy(&explain.stdout).into_owned();
    assert!(explain.status.success() && text.contains("dateTime0") && text.contains("extra0"), "{text}");

    let mut run = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = run.admin_addr();
    wait_running(addr);
    let rows = rows_eventually(addr, "SELECT * FROM q20 LIMIT 1");
    let answered = query(addr, &json!({ "sql": "SELECT * FROM q20 LIMIT 1" })).text();
    assert_eq!(keys_of(answered.lines().next().expect("a row")), flink, "{rows:?}");
    let own = query(addr, &json!({ "sql": "SELECT x.auction, y.auction, x.extra, y.extra0 FROM q20 x JOIN q20 y ON x.auction = y.auction LIMIT 1" })).text();
    assert_eq!(keys_of(own.lines().next().expect("a row")), ["auction", "auction0", "extra", "extra0"], "{own}");
    stop(run, addr);
    let written = std::fs::read_to_string(scratch.path("q20.jsonl")).expect("the sink's file");
    assert_eq!(keys_of(written.lines().next().expect("a line")), flink, "{written:.300}");
}

#[test]
fn two_materialized_views_of_one_input_never_disagree() {
    let scratch = Scratch::new();
    let (run, addr) = start(&scratch, &[]);
    views_never_disagree(addr, addr, 300);
    // The committed changes each table took count as its sink's rows out.
    let (code, metrics) = request(addr, "GET", "/metrics");
    assert_eq!(code, 200, "{metrics}");
    let rows = metrics
        .lines()
        .find_map(|line| line.strip_prefix("sluice_sink_rows_total{sink=\"materialized:by_auction\"} "))
        .and_then(|value| value.parse::<u64>().ok());
    assert!(rows.is_some_and(|rows| rows > 0), "{metrics}");
    stop(run, addr);
}

/// Asks `addr` `rounds` times for both views' totals and checks they agree: both are read
/// at one checkpoint. A checkpoint is also taken through `leader` every 50 rounds (its
/// answer waits for the commit), so the answers span several checkpoints however slowly
/// the interval's own checkpoints come on a loaded machine.
fn views_never_disagree(addr: SocketAddr, leader: SocketAddr, rounds: usize) {
    let sql = "SELECT a.n AS a_bids, b.n AS b_bids, a.v AS a_volume, b.v AS b_volume FROM \
               (SELECT COALESCE(SUM(bids), 0) AS n, COALESCE(SUM(volume), 0) AS v FROM by_auction) a CROSS JOIN \
               (SELECT COALESCE(SUM(bids), 0) AS n, COALESCE(SUM(volume), 0) AS v FROM by_bidder) b";
    let mut epochs = std::collections::BTreeSet::new();
    let mut most = 0;
    for round in 0..rounds {
        if round % 50 == 49 {
            let (code, text) = request(leader, "POST", "/checkpoint");
            assert_eq!(code, 200, "{text}");
        }
        let answer = query(addr, &json!({ "sql": sql }));
        assert_eq!(answer.code, 200, "{}", answer.text());
        let epoch: u64 = answer.header("sluice-epoch").expect("an epoch").parse().expect("a number");
        let row: Value = serde_json::from_str(answer.text().trim()).expect("one row");
        assert_eq!(row["a_bids"], row["b_bids"], "checkpoint {epoch}: {row}");
        assert_eq!(row["a_volume"], row["b_volume"], "checkpoint {epoch}: {row}");
        most = most.max(row["a_bids"].as_i64().unwrap_or(0));
        epochs.insert(epoch);
    }
    assert!(epochs.len() > 1, "the pipeline moved on while queried: {epochs:?}");
    assert!(most > 0, "the views had rows");
}

#[test]
fn a_lease_ends_when_its_client_goes_away() {
    let scratch = Scratch::new();
    // The first query holds its lease and stops at the failpoint (forever); later ones pass.
    let (run, addr) = start(&scratch, &[("SLUICE_FAILPOINTS", "query.leased=1*pause")]);
    let leases = || {
        let (code, text) = request(addr, "GET", "/metrics");
        assert_eq!(code, 200, "{text}");
        text.lines().find_map(|l| l.strip_prefix("sluice_query_leases ")).map(|n| n.trim().parse::<u64>().expect("n"))
    };
    let wait_for = |want: u64| {
        let deadline = Instant::now() + DEADLINE;
        while leases() != Some(want) {
            assert!(Instant::now() < deadline, "leases never became {want}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    assert_eq!(leases(), Some(0));
    let client = send(addr, &json!({ "sql": "SELECT COUNT(*) FROM by_auction" }));
    wait_for(1);
    // The client vanishes: its connection closes while the query holds the lease.
    drop(client);
    wait_for(0);
    // Later queries still get answers.
    let rows = rows_eventually(addr, "SELECT COUNT(*) AS n FROM by_auction");
    assert!(rows[0]["n"].is_i64(), "{rows:?}");
    stop(run, addr);
}

/// Rows of `(k, v)` from a file, counted in eleven groups, one row per batch, a checkpoint
/// every 10 ms. The view's union with nexmark bids that never pass its filter keeps its
/// flow open once the file is read (a table whose input ends is readable only up to the
/// checkpoint before its end while the job runs on).
pub(crate) const RESTORED: &str = r#"
[pipeline]
name = "restored"
threads = 2
batch_size = 1

[[source]]
name = "bids"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT"
[source.options]
path = "bids.jsonl"

[[source]]
name = "ticks"
connector = "nexmark"
[source.options]
rate = 20

[[view]]
name = "totals"
sql = """
SELECT k, COUNT(*) AS n, SUM(v) AS total FROM (
  SELECT k, v FROM bids
  UNION ALL
  SELECT CAST(bidder AS VARCHAR) AS k, price AS v FROM bid WHERE price < 0
) GROUP BY k
"""
materialized = true

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"

[checkpoint]
interval = "10ms"
store = "file://./state"
"#;

const RESTORED_ROWS: i64 = 60;

pub(crate) fn restored_scratch() -> Scratch {
    let scratch = Scratch::new();
    // The first rows' groups get no row later: only the restored state has them.
    let key = |i: i64| if i < 3 { format!("early{i}") } else { format!("k{}", i % 8) };
    let rows: String = (0..RESTORED_ROWS).map(|i| format!("{{\"k\": \"{}\", \"v\": {}}}\n", key(i), i * 7)).collect();
    scratch.write("bids.jsonl", &rows);
    scratch.write("pipeline.toml", RESTORED);
    scratch
}

/// The table `totals` once it holds every row of the file (fails on more), sorted.
pub(crate) fn complete_totals(addr: SocketAddr) -> Vec<Value> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let rows = rows_eventually(addr, "SELECT COALESCE(SUM(n), 0) AS rows FROM totals");
        let seen = rows[0]["rows"].as_i64().expect("a count");
        assert!(seen <= RESTORED_ROWS, "{seen} rows counted, more than the file's {RESTORED_ROWS}");
        if seen == RESTORED_ROWS {
            return rows_eventually(addr, "SELECT k, n, total FROM totals ORDER BY k");
        }
        assert!(Instant::now() < deadline, "the table never held every row: {seen} of {RESTORED_ROWS}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `scratch`'s pipeline with the admin API on `threads` threads until its table is
/// complete; returns the table and the run's stderr.
pub(crate) fn run_and_read(scratch: &Scratch, threads: &str) -> (Vec<Value>, String) {
    let args = ["run", "pipeline.toml", "--threads", threads, "--admin-bind", "127.0.0.1:0"];
    let mut run = Running::start(scratch, &args);
    let addr = run.admin_addr();
    wait_running(addr);
    let table = complete_totals(addr);
    let (code, answer) = request(addr, "POST", "/stop");
    assert_eq!(code, 202, "{answer}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "{text}");
    (table, text)
}

#[test]
fn a_job_resumed_on_another_thread_count_answers_with_the_restored_rows() {
    let uninterrupted = restored_scratch();
    let (want, _) = run_and_read(&uninterrupted, "2");
    assert_eq!(want.len(), 11, "{want:?}");

    // Killed after its 21st committed checkpoint, at most one row per checkpoint:
    // mid-file, past the first rows (whose groups the restore alone brings back).
    let crashed = restored_scratch();
    let killed = crate::harness::sluice_command(crashed.dir.path())
        .args(["--quiet", "run", "pipeline.toml", "--threads", "2"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return;checkpoint.after_commit=20*off->return(kill)")
        .stdout(std::process::Stdio::null())
        .output()
        .expect("run sluice");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&killed.status),
        Some(9),
        "{}",
        crate::harness::stderr(&killed)
    );
    let (got, text) = run_and_read(&crashed, "3");
    assert!(text.contains("resuming from checkpoint"), "{text}");
    assert_eq!(got, want, "the resumed job's table differs from an uninterrupted run's\n{text}");
}

/// A cluster of two workers of `pipeline`, both in `scratch` (one pipeline file, one
/// checkpoint store, one input), each with its admin API; once both run, the leader's
/// and the follower's admin addresses.
pub(crate) fn start_cluster(scratch: &Scratch) -> (Running, SocketAddr, Running, SocketAddr) {
    let admin = ["--admin-bind", "127.0.0.1:0"];
    let mut leader = Running::start(
        scratch,
        &[&["run", "pipeline.toml", "--workers", "2", "--control-bind", "127.0.0.1:0"][..], &admin].concat(),
    );
    let line = leader.until("--join ");
    let address = line.split("--join ").nth(1).expect("a join command").trim().to_string();
    let leader_addr = leader.admin_addr();
    let mut follower = Running::start(scratch, &[&["run", "pipeline.toml", "--join", &address][..], &admin].concat());
    let follower_addr = follower.admin_addr();
    wait_running(leader_addr);
    wait_running(follower_addr);
    (leader, leader_addr, follower, follower_addr)
}

/// Every row of the file, grouped as `totals` groups it.
pub(crate) fn expected_totals() -> Vec<Value> {
    let key = |i: i64| if i < 3 { format!("early{i}") } else { format!("k{}", i % 8) };
    let mut groups = std::collections::BTreeMap::<String, (i64, i64)>::new();
    for i in 0..RESTORED_ROWS {
        let group = groups.entry(key(i)).or_default();
        *group = (group.0 + 1, group.1 + i * 7);
    }
    groups.into_iter().map(|(k, (n, total))| json!({ "k": k, "n": n, "total": total })).collect()
}

/// Each worker keeps only the rows its threads hold: a query on either answers with the
/// whole table (both slices) and both answer alike.
#[test]
fn both_workers_of_a_cluster_answer_with_the_whole_table() {
    let scratch = restored_scratch();
    let (leader, leader_addr, follower, follower_addr) = start_cluster(&scratch);
    // Fails (in time) if the follower answered from its own slice alone.
    let from_follower = complete_totals(follower_addr);
    assert_eq!(from_follower, expected_totals());
    let from_leader = rows_eventually(leader_addr, "SELECT k, n, total FROM totals ORDER BY k");
    assert_eq!(from_leader, from_follower, "the leader and the follower answer alike");
    // The same in Arrow, read at one checkpoint on both workers.
    let arrow = query(leader_addr, &json!({ "sql": "SELECT COUNT(*) AS groups FROM totals", "format": "arrow" }));
    assert_eq!(arrow.code, 200, "{}", arrow.text());
    assert!(arrow.header("sluice-epoch").is_some(), "{:?}", arrow.headers);
    // Dropping them kills both: this pipeline's stop on two workers is not what is tested.
    drop((leader, follower));
}

/// The check of `two_materialized_views_of_one_input_never_disagree`, asked of the
/// follower of a cluster: every worker's slices of both views at one checkpoint.
#[test]
fn two_views_gathered_from_a_clusters_workers_never_disagree() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    let (leader, leader_addr, follower, follower_addr) = start_cluster(&scratch);
    views_never_disagree(follower_addr, leader_addr, 150);
    // Dropping them kills both: the stop of a cluster with materialized views is not what
    // is tested here.
    drop((leader, follower));
}

/// A query never answers from some of the slices: with a worker gone, it fails naming it.
#[test]
fn a_killed_worker_makes_a_query_fail_naming_it() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    let (leader, leader_addr, mut follower, _) = start_cluster(&scratch);
    let sql = "SELECT COUNT(*) AS groups FROM by_auction";
    rows_eventually(leader_addr, sql);
    follower.kill();
    let answer = query(leader_addr, &json!({ "sql": sql }));
    assert_eq!(answer.code, 503, "{}", answer.text());
    let error = answer.json();
    let said = error["error"].as_str().unwrap_or_default();
    // Unreachable, or (once the leader noticed the loss) a cluster forming again after it.
    assert!(said.contains("worker 1"), "{error}");
    assert!(said.contains("cannot be reached") || said.contains("lost"), "{error}");
    // The leader's /status names the worker it could not ask, if the cluster has not
    // noticed the loss yet (then it lists no members: it forms again).
    let (code, status) = request(leader_addr, "GET", "/status");
    assert_eq!(code, 200, "{status}");
    let body = json_body(&status);
    if let Some(gone) = body["members"].as_array().and_then(|members| members.iter().find(|m| m["id"] == 1)) {
        assert!(gone["state"].is_null() && gone["error"].is_string(), "{body}");
    }
    drop(leader);
}

/// The rows of the file of `a_materialized_table_beyond_the_memory_budget_answers_in_full`.
const SPILLED_ROWS: i64 = 30_000;

/// A table of 30,000 distinct rows (about 3 MB in memory) kept under a budget of 1 MiB
/// on two threads: it spills its rows to the state directory (the spill counter moves),
/// answers with every row, and a job restored from its checkpoints on three threads,
/// under the same budget, answers alike.
#[test]
fn a_materialized_table_beyond_the_memory_budget_answers_in_full() {
    let scratch = Scratch::new();
    let rows: String = (0..SPILLED_ROWS)
        .map(|i| format!("{{\"k\": \"row-{i:06}-of-a-table-larger-than-its-budget\", \"v\": {i}}}\n"))
        .collect();
    scratch.write("rows.jsonl", &rows);
    let pipeline = RESTORED
        .replace("bids.jsonl", "rows.jsonl")
        .replace("batch_size = 1\n", "batch_size = 500\nstate_memory_mib = 1\n")
        .replace(
            "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM (\n  SELECT k, v FROM bids\n  UNION ALL\n  SELECT CAST(bidder AS VARCHAR) AS k, price AS v FROM bid WHERE price < 0\n) GROUP BY k",
            "SELECT k, v FROM bids UNION ALL SELECT CAST(bidder AS VARCHAR) AS k, price AS v FROM bid WHERE price < 0",
        );
    assert!(pipeline.contains("SELECT k, v FROM bids UNION ALL") && pipeline.contains("state_memory_mib = 1"));
    scratch.write("pipeline.toml", &pipeline);
    let sums = "SELECT COUNT(*) AS n, COUNT(DISTINCT k) AS keys, COALESCE(SUM(v), 0) AS total FROM totals";
    let want = json!({ "n": SPILLED_ROWS, "keys": SPILLED_ROWS, "total": SPILLED_ROWS * (SPILLED_ROWS - 1) / 2 });
    let complete = |addr: SocketAddr| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let rows = rows_eventually(addr, sums);
            if rows[0]["n"] == want["n"] {
                return rows[0].clone();
            }
            assert!(Instant::now() < deadline, "the table never held every row: {}", rows[0]);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    for threads in ["2", "3"] {
        let args = ["run", "pipeline.toml", "--threads", threads, "--admin-bind", "127.0.0.1:0"];
        let mut run = Running::start(&scratch, &args);
        let addr = run.admin_addr();
        wait_running(addr);
        assert_eq!(complete(addr), want, "{threads} threads");
        let first = rows_eventually(addr, "SELECT k, v FROM totals ORDER BY v LIMIT 1");
        assert_eq!(first, [json!({ "k": "row-000000-of-a-table-larger-than-its-budget", "v": 0 })]);
        // The committed rows spill at the barrier after their commit (the input idle).
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (code, metrics) = request(addr, "GET", "/metrics");
            assert_eq!(code, 200, "{metrics}");
            let spilled = metrics
                .lines()
                .find_map(|line| {
                    line.strip_prefix("sluice_counter_total{name=\"state bytes written to spill files\"} ")
                })
                .and_then(|value| value.parse::<u64>().ok());
            if spilled.is_some_and(|bytes| bytes > 1 << 20) {
                // The input read, nothing waits for a commit; whether it ever waited
                // depends on how fast the checkpoints came.
                let value = |name: &str| metrics.lines().find_map(|line| line.strip_prefix(name)?.parse::<f64>().ok());
                assert_eq!(value("sluice_sources_held "), Some(0.0), "{metrics}");
                assert!(value("sluice_sources_held_seconds_total ").is_some_and(|s| s >= 0.0), "{metrics}");
                break;
            }
            assert!(Instant::now() < deadline, "{threads} threads: nothing spilled\n{metrics}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(complete(addr), want, "{threads} threads, after the spill");
        let (code, answer) = request(addr, "POST", "/stop");
        assert_eq!(code, 202, "{answer}");
        let (exit, text) = run.finish();
        assert_eq!(exit, Some(0), "{text}");
        if threads == "3" {
            assert!(text.contains("resuming from checkpoint"), "{text}");
        }
    }
}
