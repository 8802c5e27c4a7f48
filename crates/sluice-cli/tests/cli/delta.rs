//! The `delta` sink end to end: tables written by `sluice run` and read back with the
//! Python `deltalake` package (`python3 -m pip install deltalake pyarrow`), locally and in
//! S3 (a `moto_server` the test starts: `python3 -m pip install 'moto[server]'`). A
//! missing tool fails the test; nothing is skipped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::harness::{Scratch, sluice_command, stderr};

/// The longest the S3 server may take to announce its address.
const SERVER_START: Duration = Duration::from_secs(60);

/// Reads a Delta table with Python's `deltalake` and prints each row as a JSON object,
/// `str()` of every value; argv: path, then storage options as KEY=VALUE. It ends with
/// `os._exit(0)` after flushing: the binding (1.6 with pyarrow 16) aborts in its
/// interpreter-exit teardown ("terminate called without an active exception") after a
/// successful read.
const READ_TABLE: &str = r#"
import json, os, sys
from deltalake import DeltaTable
options = dict(arg.split("=", 1) for arg in sys.argv[2:])
table = DeltaTable(sys.argv[1], storage_options=options or None)
for row in table.to_pyarrow_table().to_pylist():
    print(json.dumps({k: (None if v is None else str(v)) for k, v in row.items()}, sort_keys=True))
sys.stdout.flush()
os._exit(0)
"#;

/// The rows of the Delta table at `path`, each `{column: text}` as JSON, sorted.
fn python_rows(path: &str, storage: &[(&str, &str)]) -> Vec<String> {
    let mut command = Command::new("python3");
    command.args(["-c", READ_TABLE, path]);
    command.args(storage.iter().map(|(k, v)| format!("{k}={v}")));
    let output = command.output().expect("run python3 (install deltalake: python3 -m pip install deltalake pyarrow)");
    assert!(output.status.success(), "python deltalake read of {path} failed:\n{}", stderr(&output));
    let mut rows: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
    rows.sort();
    rows
}

/// A changelog table's rows integrated: +I/+U count one, -U/-D minus one; the rows (without
/// `op`) whose count is above zero, sorted.
fn integrated(rows: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for row in rows {
        let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_str(row).expect("json row");
        let op = value.remove("op").expect("an op column");
        let weight = match op.as_str() {
            Some("+I" | "+U") => 1,
            Some("-U" | "-D") => -1,
            other => panic!("op {other:?}"),
        };
        *counts.entry(serde_json::Value::Object(value).to_string()).or_default() += weight;
    }
    assert!(counts.values().all(|&n| n >= 0), "a row retracted more often than inserted: {counts:?}");
    counts.into_iter().flat_map(|(row, n)| std::iter::repeat_n(row, n as usize)).collect()
}

/// `n` events: key `k{i % 5}`, value `i`, one a millisecond.
fn events(n: usize) -> String {
    (0..n).map(|i| format!("{{\"k\":\"k{}\",\"v\":{i},\"ts\":{i}}}\n", i % 5)).collect()
}

fn pipeline(name: &str, store: Option<&str>, views_and_sinks: &str) -> String {
    let checkpoint = match store {
        Some(store) => {
            format!("[checkpoint]\ninterval = \"10ms\"\nstore = \"{store}\"\nguarantee = \"exactly-once\"\n\n")
        }
        None => String::new(),
    };
    format!(
        "[pipeline]\nname = \"{name}\"\nbatch_size = 2\n\n{checkpoint}[[source]]\nname = \"events\"\nconnector = \"file\"\n\
         format = \"json\"\nschema = \"k VARCHAR, v BIGINT, ts TIMESTAMP(3)\"\nevent_time = \"ts\"\n\
         [source.options]\npath = \"events.jsonl\"\nsplit_bytes = 300\n\n{views_and_sinks}"
    )
}

const COPIES: &str = "[[view]]\nname = \"copies\"\nsql = \"SELECT k, v, ts FROM events WHERE v % 2 = 0\"\n\n";
const COUNTS: &str = "[[view]]\nname = \"counts\"\n\
    sql = \"SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k HAVING COUNT(*) <= 6\"\n\n";

fn sink(name: &str, from: &str, options: &str) -> String {
    format!("[[sink]]\nname = \"{name}\"\nfrom = \"{from}\"\nconnector = \"delta\"\n[sink.options]\n{options}\n")
}

fn run(scratch: &Scratch, threads: u32, failpoints: Option<&str>, environment: &[(&str, &str)]) -> Output {
    let mut command = sluice_command(scratch.dir.path());
    command.args(["--log-level", "info", "run", "pipeline.toml", "--threads", &threads.to_string()]);
    if let Some(failpoints) = failpoints {
        command.env("SLUICE_FAILPOINTS", failpoints);
    }
    command.envs(environment.iter().copied());
    command.output().expect("run sluice")
}

/// The rows of `copies` over `n` events, as Python prints them.
fn expected_copies(n: usize) -> Vec<String> {
    let mut rows: Vec<String> = (0..n)
        .filter(|i| i % 2 == 0)
        .map(|i| {
            let fraction = if i == 0 { String::new() } else { format!(".{:06}", i * 1000) };
            format!("{{\"k\": \"k{}\", \"ts\": \"1970-01-01 00:00:00{fraction}\", \"v\": \"{i}\"}}", i % 5)
        })
        .collect();
    rows.sort();
    rows
}

/// The rows of `counts` over `n` events: keys with at most six events.
fn expected_counts(n: usize) -> Vec<String> {
    let mut groups: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for i in 0..n {
        let entry = groups.entry(i % 5).or_default();
        *entry = (entry.0 + 1, entry.1 + i);
    }
    let rows = groups.into_iter().filter(|(_, (n, _))| *n <= 6);
    let mut rows: Vec<String> =
        rows.map(|(k, (n, total))| format!("{{\"k\":\"k{k}\",\"n\":\"{n}\",\"total\":\"{total}\"}}")).collect();
    rows.sort();
    rows
}

/// Every `txn` action of the table's log as (appId, version), in log order, from its
/// oldest commit (version 0 unless a log cleanup removed the early ones).
fn transactions(table: &Path) -> Vec<(String, u64)> {
    let oldest = std::fs::read_dir(table.join("_delta_log"))
        .expect("the log")
        .filter_map(|entry| entry.expect("entry").file_name().to_str()?.strip_suffix(".json")?.parse::<u64>().ok())
        .min()
        .unwrap_or(0);
    let mut found = Vec::new();
    for version in oldest.. {
        let Ok(text) = std::fs::read_to_string(table.join(format!("_delta_log/{version:020}.json"))) else { break };
        for line in text.lines() {
            let action: serde_json::Value = serde_json::from_str(line).expect("a JSON action");
            if let Some(txn) = action.get("txn") {
                found.push((txn["appId"].as_str().expect("appId").to_string(), txn["version"].as_u64().expect("v")));
            }
        }
    }
    found
}

/// A copy of the table `name` of `scratch` without the commits its newest log checkpoint
/// covers, so that a reader must read the checkpoint.
fn log_checkpoint_only(scratch: &Scratch, name: &str) -> std::path::PathBuf {
    let table = scratch.path(name);
    let pointer = std::fs::read_to_string(table.join("_delta_log/_last_checkpoint")).expect("a log checkpoint");
    let pointer: serde_json::Value = serde_json::from_str(&pointer).expect("json");
    let covered = pointer["version"].as_u64().expect("its version");
    let copy = scratch.path(&format!("{name}-from-checkpoint"));
    let status = Command::new("cp").arg("-r").arg(&table).arg(&copy).status().expect("cp");
    assert!(status.success());
    for version in 0..=covered {
        std::fs::remove_file(copy.join(format!("_delta_log/{version:020}.json"))).expect("a covered commit");
    }
    copy
}

#[test]
fn an_append_only_view_reads_back_with_python_deltalake() {
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(40));
    let sinks = sink("out", "copies", "path = \"out/copies\"\npartition_by = \"k\"\ntarget_file_size_mib = 1");
    scratch.write("pipeline.toml", &pipeline("delta-append", None, &format!("{COPIES}{sinks}")));
    let output = run(&scratch, 2, None, &[]);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    let table = scratch.path("out/copies");
    assert_eq!(python_rows(table.to_str().expect("utf-8"), &[]), expected_copies(40));
    assert!(table.join("k=k0").is_dir(), "partition directories");
    assert!(transactions(&table).is_empty(), "an unstaged run commits without txn actions");
}

#[test]
fn an_updating_view_is_a_changelog_that_integrates_to_the_final_answer() {
    let scratch = Scratch::new();
    // 33 events: keys k0..k2 get 7 (their rows are deleted at the seventh), k3, k4 get 6.
    scratch.write("events.jsonl", &events(33));
    let sinks = sink("out", "counts", "path = \"out/counts\"");
    scratch.write("pipeline.toml", &pipeline("delta-counts", Some("file://./state"), &format!("{COUNTS}{sinks}")));
    // One epoch per batch, so that the counts change between checkpoints.
    let output = run(&scratch, 2, Some("source.barrier_after_batch=return"), &[]);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    let rows = python_rows(scratch.path("out/counts").to_str().expect("utf-8"), &[]);
    assert!(rows.iter().any(|r| r.contains("\"op\": \"-U\"")), "updates are -U/+U pairs: {rows:?}");
    assert!(rows.iter().any(|r| r.contains("\"op\": \"-D\"")), "deletes are -D: {rows:?}");
    let expected = expected_counts(33);
    assert_eq!(expected.len(), 2, "some keys are deleted, some stay");
    assert_eq!(integrated(&rows), expected);

    // mode = "append" on an updating view is refused, naming the fix.
    let sinks = sink("out", "counts", "path = \"out/counts2\"\nmode = \"append\"");
    scratch.write("pipeline.toml", &pipeline("delta-counts", None, &format!("{COUNTS}{sinks}")));
    let output = run(&scratch, 1, None, &[]);
    crate::harness::assert_fails_with(&output, &["would keep every retracted row", "set mode = \"changelog\""]);
}

/// Exactly-once across a SIGKILL after the epoch's files are uploaded and named by the
/// published checkpoint, but before their Delta commit (twice: at the runtime's
/// `checkpoint.after_publish` and inside the sink's commit): the restart commits them
/// once, and the table equals an uninterrupted run's; no epoch's txn appears twice.
#[test]
fn exactly_once_survives_a_kill_between_the_files_and_their_commit() {
    let views_and_sinks = |suffix: &str| {
        let copies = sink(
            "copied",
            "copies",
            &format!("path = \"out/copies{suffix}\"\npartition_by = \"k\"\ncheckpoint_interval = 2"),
        );
        let counts = sink("counted", "counts", &format!("path = \"out/counts{suffix}\"\ncompact_files = 3"));
        format!("{COPIES}{COUNTS}{copies}{counts}")
    };
    let whole = Scratch::new();
    whole.write("events.jsonl", &events(33));
    whole.write("pipeline.toml", &pipeline("delta-eo", Some("file://./state"), &views_and_sinks("")));
    let output = run(&whole, 2, Some("source.barrier_after_batch=return"), &[]);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    let copies = python_rows(whole.path("out/copies").to_str().expect("utf-8"), &[]);
    let counts = python_rows(whole.path("out/counts").to_str().expect("utf-8"), &[]);
    assert_eq!(copies, expected_copies(33));
    assert_eq!(integrated(&counts), expected_counts(33));
    assert!(transactions(&whole.path("out/copies")).len() >= 3, "epochs are committed with txn actions");
    let log = std::fs::read_dir(whole.path("out/counts/_delta_log")).expect("log");
    let compactions = log
        .map(|entry| std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default())
        .filter(|text| text.contains("\"operation\":\"OPTIMIZE\""))
        .count();
    assert!(compactions > 0, "the changelog table's small files were compacted");

    for point in ["checkpoint.after_publish", "sink.delta.before_commit"] {
        let scratch = Scratch::new();
        scratch.write("events.jsonl", &events(33));
        scratch.write("pipeline.toml", &pipeline("delta-eo", Some("file://./state"), &views_and_sinks("")));
        let failpoints = format!("source.barrier_after_batch=return;{point}=2*off->return(kill)");
        let crashed = run(&scratch, 2, Some(&failpoints), &[]);
        assert_eq!(crashed.status.signal(), Some(9), "killed at {point}:\n{}", stderr(&crashed));
        let restarted = run(&scratch, 1, None, &[]);
        let log = stderr(&restarted);
        assert!(restarted.status.success(), "restart after {point} failed:\n{log}");
        assert!(log.contains("resuming from checkpoint"), "{point}: {log}");
        let table = |name: &str| scratch.path(name).to_str().expect("utf-8").to_string();
        assert_eq!(python_rows(&table("out/copies"), &[]), copies, "{point}");
        assert_eq!(integrated(&python_rows(&table("out/counts"), &[])), expected_counts(33), "{point}");
        let read_from_checkpoint = log_checkpoint_only(&scratch, "out/copies");
        assert_eq!(
            python_rows(read_from_checkpoint.to_str().expect("utf-8"), &[]),
            copies,
            "{point}: from its checkpoint"
        );
        for name in ["out/copies", "out/counts"] {
            let mut seen = transactions(&scratch.path(name));
            let all = seen.len();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), all, "{point}: {name}: an epoch was committed twice");
        }
    }
}

/// Creates (`create`) the table at argv[2] with `deltalake`: the `copies` view's columns,
/// partitioned by `k`, six rows in three commits, a log retention of zero; then (every
/// action) writes a log checkpoint of the newest version and removes the commits and
/// checkpoints before it (`cleanup_metadata`), and prints that version.
const DELTALAKE_CHECKPOINT: &str = r#"
import datetime, os, sys
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
action, path = sys.argv[1], sys.argv[2]
if action == "create":
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.timestamp("us"))])
    for start in (1000, 1002, 1004):
        rows = pa.table({"k": ["k0", None], "v": [start, start + 1],
                         "ts": [datetime.datetime(2026, 1, 1)] * 2}, schema=schema)
        configuration = {"delta.logRetentionDuration": "interval 0 seconds"} if start == 1000 else None
        write_deltalake(path, rows, mode="append", partition_by=["k"], configuration=configuration)
table = DeltaTable(path)
table.create_checkpoint()
table.cleanup_metadata()
print(table.version())
sys.stdout.flush()
os._exit(0)
"#;

/// Runs `DELTALAKE_CHECKPOINT`: the table's newest version, now checkpointed, its older
/// commits removed.
fn deltalake_checkpoint(action: &str, table: &Path) -> u64 {
    let output = Command::new("python3")
        .args(["-c", DELTALAKE_CHECKPOINT, action, table.to_str().expect("utf-8")])
        .output()
        .expect("run python3 (install deltalake: python3 -m pip install deltalake pyarrow)");
    assert!(output.status.success(), "deltalake {action} of {}:\n{}", table.display(), stderr(&output));
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let version: u64 = version.parse().expect("the version deltalake printed");
    assert!(!table.join("_delta_log/00000000000000000000.json").exists(), "the cleanup removed version 0");
    version
}

/// A table that `deltalake` created, checkpointed and cleaned up (its commits before the
/// checkpoint removed): the sink appends to it, reading its log from `deltalake`'s
/// checkpoint; killed after an epoch's Delta commit, then checkpointed and cleaned up by
/// `deltalake` again (the sink's txn actions now only in that checkpoint), the restart
/// resumes exactly once: the table holds `deltalake`'s rows and every row of the view once.
#[test]
fn a_table_checkpointed_and_cleaned_up_by_deltalake_resumes_exactly_once() {
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(33));
    let sinks = sink("out", "copies", "path = \"out/copies\"\npartition_by = \"k\"\ncheckpoint_interval = 2");
    scratch.write("pipeline.toml", &pipeline("delta-cleanup", Some("file://./state"), &format!("{COPIES}{sinks}")));
    let table = scratch.path("out/copies");
    let created = deltalake_checkpoint("create", &table);
    let before = python_rows(table.to_str().expect("utf-8"), &[]);
    assert_eq!(before.len(), 6, "{before:?}");

    // Killed after the third epoch's Delta commit, before its checkpoint is known to be
    // committed: the restart commits it again, and only its txn keeps it out.
    let failpoints = "source.barrier_after_batch=return;checkpoint.after_sink_commit=2*off->return(kill)";
    let crashed = run(&scratch, 2, Some(failpoints), &[]);
    assert_eq!(crashed.status.signal(), Some(9), "killed:\n{}", stderr(&crashed));
    let needle = format!("from its checkpoint of version {created} ");
    assert!(stderr(&crashed).contains(&needle), "the first run read deltalake's checkpoint:\n{}", stderr(&crashed));

    let cleaned = deltalake_checkpoint("checkpoint", &table);
    assert!(cleaned > created, "the crashed run committed epochs");
    let restarted = run(&scratch, 2, None, &[]);
    let log = stderr(&restarted);
    assert!(restarted.status.success(), "restart failed:\n{log}");
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert!(log.contains(&format!("from its checkpoint of version {cleaned} ")), "{log}");
    let mut expected = before;
    expected.extend(expected_copies(33));
    expected.sort();
    assert_eq!(python_rows(table.to_str().expect("utf-8"), &[]), expected);
    // Committing an epoch's files again would not show in the rows (an add of a path the
    // table has is the same file): its txn would show in the commits left.
    let mut seen = transactions(&table);
    let all = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), all, "an epoch was committed twice");
}

#[test]
fn two_runs_on_one_table_are_fenced() {
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(20));
    let sinks = sink("out", "copies", "path = \"out/copies\"");
    scratch.write("pipeline.toml", &pipeline("delta-fence", Some("file://./state-a"), &format!("{COPIES}{sinks}")));
    let first = run(&scratch, 2, None, &[]);
    assert!(first.status.success(), "sluice failed:\n{}", stderr(&first));
    let table = scratch.path("out/copies");
    let before = python_rows(table.to_str().expect("utf-8"), &[]);
    assert_eq!(before, expected_copies(20));
    // The same pipeline from another checkpoint store: its epochs would start again at 1.
    scratch.write("pipeline.toml", &pipeline("delta-fence", Some("file://./state-b"), &format!("{COPIES}{sinks}")));
    let second = run(&scratch, 2, None, &[]);
    crate::harness::assert_fails_with(
        &second,
        &["already holds epochs up to", "resume from that run's checkpoint store"],
    );
    assert_eq!(python_rows(table.to_str().expect("utf-8"), &[]), before, "the refused run wrote nothing visible");
}

/// A `moto_server` on a port the kernel picks, stopped on drop.
struct S3 {
    child: Child,
    endpoint: String,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3 {
    fn start() -> S3 {
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start moto_server (python3 -m pip install 'moto[server]')");
        // Owned at once, so a failed wait below still stops the server.
        let mut server = S3 { child, endpoint: String::new() };
        let (sender, lines) = mpsc::sync_channel::<String>(64);
        let pipes = [
            server.child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
            server.child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for pipe in pipes.into_iter().flatten() {
            let sender = sender.clone();
            // Reads every line while the server runs (its request log), passing them on
            // until the address is known; a pipe nobody reads would block the server.
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = sender.try_send(line);
                }
            });
        }
        drop(sender);
        // moto prints " * Running on http://127.0.0.1:PORT" once it listens.
        loop {
            let line = lines.recv_timeout(SERVER_START).expect("moto_server announces its address");
            if let Some(at) = line.find("Running on http://") {
                server.endpoint = line[at + "Running on ".len()..].trim().trim_end_matches('/').to_string();
                return server;
            }
        }
    }

    /// Creates `bucket` (moto accepts an unsigned request).
    fn create_bucket(&self, bucket: &str) {
        let address = self.endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).expect("connect to moto");
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let request =
            format!("PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {answer}");
    }
}

#[test]
fn a_table_in_s3_reads_back_exactly_once_across_a_kill() {
    let s3 = S3::start();
    s3.create_bucket("lake");
    let environment = [
        ("AWS_ENDPOINT", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(33));
    // A log checkpoint every 2 versions: the restart reads _last_checkpoint and lists the
    // log from its version on (S3's start-after).
    let options = "path = \"s3://lake/tables/copies\"\npartition_by = \"k\"\ncheckpoint_interval = 2";
    let sinks = sink("out", "copies", options);
    scratch.write("pipeline.toml", &pipeline("delta-s3", Some("file://./state"), &format!("{COPIES}{sinks}")));
    let failpoints = "source.barrier_after_batch=return;checkpoint.after_publish=3*off->return(kill)";
    let crashed = run(&scratch, 2, Some(failpoints), &environment);
    assert_eq!(crashed.status.signal(), Some(9), "killed:\n{}", stderr(&crashed));
    let restarted = run(&scratch, 2, None, &environment);
    let log = stderr(&restarted);
    assert!(restarted.status.success(), "restart failed:\n{log}");
    assert!(
        log.contains("delta sink: read the log of s3://lake/tables/copies from its checkpoint of version "),
        "{log}"
    );
    let storage = [
        ("AWS_ENDPOINT_URL", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    assert_eq!(python_rows("s3://lake/tables/copies", &storage), expected_copies(33));
}
