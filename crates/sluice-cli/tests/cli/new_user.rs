//! Defects found by using Sluice as a new user would, each with the test that failed
//! before its fix: paths that destroy their own input, two runs on one store, a closed
//! pipe, colours in logs, a header line taken for data, a report that counted rows nobody
//! could see, a backpressure figure that measured the wrong thing, and a spill directory
//! that is no directory.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use crate::harness::{Scratch, assert_fails_with, sluice_command, stderr, stdout};

/// A file source reading `input` and a JSON file sink writing `output`.
fn copy_pipeline(input: &str, output: &str) -> String {
    format!(
        r#"[pipeline]
name = "copy"

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT"
[source.options]
path = "{input}"

[[sink]]
name = "out"
from = "events"
connector = "file"
format = "json"
[sink.options]
path = "{output}"
"#
    )
}

fn events(scratch: &Scratch, name: &str) {
    scratch.write(name, "{\"k\":\"a\",\"v\":1}\n{\"k\":\"b\",\"v\":2}\n");
}

#[test]
fn a_sink_over_its_own_input_is_refused_by_validate_and_run() {
    for (input, output) in [
        ("data/in.jsonl", "data/in.jsonl"),
        ("data/in.jsonl", "data/../data/in.jsonl"),
        ("data/in.jsonl", "link/in.jsonl"),
        ("data", "data/out.jsonl"),
        ("data/in.jsonl", "data"),
    ] {
        let scratch = Scratch::new();
        events(&scratch, "data/in.jsonl");
        std::os::unix::fs::symlink(scratch.path("data"), scratch.path("link")).expect("symlink");
        scratch.write("pipeline.toml", &copy_pipeline(input, output));
        for command in ["validate", "run"] {
            let run = scratch.sluice(&[command, "pipeline.toml"]);
            assert_fails_with(&run, &["pipeline.toml:12:1", "overlaps the input of source `events`", "fix:"]);
        }
        assert_eq!(scratch.read("data/in.jsonl").lines().count(), 2, "{input} → {output}: the input is intact");
    }
}

#[test]
fn two_sinks_writing_one_path_are_refused() {
    let scratch = Scratch::new();
    events(&scratch, "in.jsonl");
    let second = "\n[[sink]]\nname = \"again\"\nfrom = \"events\"\nconnector = \"file\"\n[sink.options]\npath = \"out/../out.jsonl\"\n";
    scratch.write("pipeline.toml", &format!("{}{second}", copy_pipeline("in.jsonl", "out.jsonl")));
    let run = scratch.sluice(&["validate", "pipeline.toml"]);
    assert_fails_with(&run, &["sink `again` writes", "where sink `out` (line 12) writes too", "own path"]);
}

#[test]
fn a_state_directory_that_is_not_one_is_refused_at_start() {
    let scratch = Scratch::new();
    events(&scratch, "in.jsonl");
    scratch.write("a-file", "not a directory\n");
    // `spill_dir` is the older name of `state_dir`, and is read the same.
    for (key, dir) in [("state_dir", "no-such-dir"), ("state_dir", "a-file"), ("spill_dir", "a-file")] {
        let pipeline = copy_pipeline("in.jsonl", "out.jsonl").replacen(
            "name = \"copy\"\n",
            &format!("name = \"copy\"\n{key} = \"{dir}\"\n"),
            1,
        );
        scratch.write("pipeline.toml", &pipeline);
        for command in ["validate", "run"] {
            let run = scratch.sluice(&[command, "pipeline.toml"]);
            assert_fails_with(&run, &["state directory", dir, "is not a directory", "fix:", "state_dir"]);
        }
    }
    let both = copy_pipeline("in.jsonl", "out.jsonl").replacen(
        "name = \"copy\"\n",
        "name = \"copy\"\nstate_dir = \".\"\nspill_dir = \".\"\n",
        1,
    );
    scratch.write("pipeline.toml", &both);
    let run = scratch.sluice(&["validate", "pipeline.toml"]);
    assert_fails_with(&run, &["older name of state_dir", "fix:"]);
    assert!(!scratch.path("out.jsonl").exists(), "nothing ran");
}

#[test]
fn a_second_run_on_one_store_is_refused_naming_the_holder_and_how_to_unlock() {
    let scratch = Scratch::new();
    let endless = "[pipeline]\nname = \"held\"\n[checkpoint]\ninterval = \"50ms\"\n\
                   [[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n[source.options]\nrate = 1000\n\
                   [[sink]]\nname = \"o\"\nfrom = \"bid\"\nconnector = \"blackhole\"\n";
    scratch.write("pipeline.toml", endless);
    let mut first = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "checkpoint.after_commit=1*return(note)")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(first.stderr.take().expect("stderr"));
    let mut seen = String::new();
    while !seen.contains("after_commit reached") {
        assert!(lines.read_line(&mut seen).expect("stderr") > 0, "the first run ended:\n{seen}");
    }
    let second = scratch.sluice(&["run", "pipeline.toml"]);
    let pid = first.id().to_string();
    assert_fails_with(&second, &["is in use", "pipeline \"held\"", &format!("pid {pid}"), "checkpoints unlock"]);
    let unlock = scratch.sluice(&["checkpoints", "unlock", "--store", "file://./sluice-state"]);
    assert!(unlock.status.success() && stdout(&unlock).contains(&format!("pid {pid}")), "{}", stdout(&unlock));
    // The first run no longer holds the store: its next checkpoint is refused.
    let _ = first.wait();
    let mut rest = String::new();
    lines.read_to_string(&mut rest).expect("stderr");
    assert!(rest.contains("FAILED") && rest.contains("lease"), "{rest}");
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        "[pipeline]\nname = \"p\"\n[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n\
         [[sink]]\nname = \"o\"\nfrom = \"bid\"\nconnector = \"stdout\"\nformat = \"json\"\n",
    );
    for args in [
        vec!["run", "pipeline.toml"],
        vec!["nexmark", "generate", "--events", "1000000"],
        vec!["explain", "pipeline.toml"],
    ] {
        let mut child = sluice_command(scratch.dir.path())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut first = [0u8; 1];
        child.stdout.take().expect("stdout").read_exact(&mut first).expect("some output");
        // The reader is gone (as `| head -c 1` leaves it).
        let output = child.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {text}");
        assert!(!text.contains("panicked") && !text.contains("error"), "{args:?}: {text}");
    }
}

#[test]
fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let scratch = Scratch::new();
    events(&scratch, "in.jsonl");
    scratch.write("pipeline.toml", &copy_pipeline("in.jsonl", "out.jsonl"));
    let run = scratch.sluice(&["--log-level", "debug", "run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("DEBUG"), "debug logs are on: {}", stderr(&run));
    assert!(!stderr(&run).contains('\u{1b}'), "no ANSI escape: {:?}", stderr(&run));
}

#[test]
fn a_csv_without_a_header_line_loses_no_row() {
    let scratch = Scratch::new();
    scratch.write("in.csv", "a,1\nb,2\nc,3\n");
    let pipeline =
        copy_pipeline("in.csv", "out.jsonl").replace("format = \"json\"\nschema", "format = \"csv\"\nschema");
    scratch.write("pipeline.toml", &pipeline);
    let run = scratch.sluice(&["run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("3 rows in, 0 bad rows"), "{}", stderr(&run));
    assert_eq!(scratch.read("out.jsonl").lines().count(), 3);
}

#[test]
fn rows_out_counts_only_rows_made_visible() {
    let scratch = Scratch::new();
    let rows: String = (0..500).map(|i| format!("{{\"k\":\"k{i}\",\"v\":{i}}}\n")).collect();
    scratch.write("in.jsonl", &rows);
    let pipeline = copy_pipeline("in.jsonl", "out/")
        .replace("[[source]]", "[checkpoint]\ninterval = \"10ms\"\nmax_failed_checkpoints = 1\n\n[[source]]");
    scratch.write("pipeline.toml", &pipeline);
    // The store accepts no checkpoint: nothing is ever committed, nothing becomes visible.
    let run = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "checkpoint.after_state_written=return(the store is read-only)")
        .output()
        .expect("run");
    let report = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{report}");
    assert!(report.contains("the store is read-only"), "{report}");
    assert!(report.contains("sink out: 0 rows out"), "{report}");
    let visible = crate::golden::output(&scratch, "out");
    assert_eq!(visible, "", "no part is visible");
}

#[test]
fn backpressure_is_the_time_a_thread_is_blocked_by_a_slow_sink() {
    let scratch = Scratch::new();
    // Two threads; a one-file sink gathers every row to thread 0, whose writes are slow:
    // thread 1 waits for room in its queue to thread 0.
    scratch.write(
        "pipeline.toml",
        "[pipeline]\nname = \"slow\"\nthreads = 2\nbatch_size = 100\nqueue_batches = 1\n\
         [[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n[source.options]\nevents = 4000\n\
         [[sink]]\nname = \"o\"\nfrom = \"bid\"\nconnector = \"file\"\n[sink.options]\npath = \"bids.jsonl\"\n",
    );
    let run = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "sink.write=sleep(20)")
        .output()
        .expect("run");
    let report = stderr(&run);
    assert!(run.status.success(), "{report}");
    // 3680 bids in batches of at most 100: at least 37 writes of 20 ms, about half of them
    // of thread 1's rows, which it cannot send while thread 0 sleeps.
    let line = report.lines().find(|l| l.contains("backpressure")).expect("a backpressure line");
    let thread1: f64 = line
        .split("thread 1 ")
        .nth(1)
        .and_then(|rest| rest.split(" s").next())
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("no figure for thread 1: {line}"));
    assert!(thread1 >= 0.1, "thread 1 was blocked for {thread1} s only: {line}");
}

/// The copy pipeline with checkpoints, two threads and small lanes.
fn checkpointed_copy(input: &str) -> String {
    copy_pipeline(input, "out/")
        .replace("name = \"copy\"", "name = \"copy\"\nthreads = 2\nbatch_size = 5")
        .replace("[[source]]", "[checkpoint]\ninterval = \"10ms\"\n\n[[source]]")
        .replace("path = \"in.jsonl\"", "path = \"in.jsonl\"\nsplit_bytes = 64")
}

fn rows(ids: std::ops::Range<i64>) -> String {
    ids.map(|i| format!("{{\"k\":\"k{i}\",\"v\":{i}}}\n")).collect()
}

/// Runs until the second checkpoint is published, then dies (SIGKILL).
fn crash_after_two_checkpoints(scratch: &Scratch) {
    use std::os::unix::process::ExitStatusExt;
    let run = sluice_command(scratch.dir.path())
        .args(["--quiet", "run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return;checkpoint.after_publish=1*off->return(kill)")
        .output()
        .expect("run");
    assert_eq!(run.status.signal(), Some(9), "{}", stderr(&run));
}

#[test]
fn an_input_grown_between_a_crash_and_the_restart_resumes_with_exactly_its_new_rows() {
    let scratch = Scratch::new();
    scratch.write("in.jsonl", &rows(0..40));
    scratch.write("pipeline.toml", &checkpointed_copy("in.jsonl"));
    crash_after_two_checkpoints(&scratch);
    let mut input = std::fs::OpenOptions::new().append(true).open(scratch.path("in.jsonl")).expect("open");
    std::io::Write::write_all(&mut input, rows(40..55).as_bytes()).expect("append");
    let resumed = scratch.sluice(&["run", "pipeline.toml"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let mut values: Vec<i64> = crate::golden::output(&scratch, "out")
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("json")["v"].as_i64().expect("v"))
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..55).collect::<Vec<_>>(), "every row once, the appended ones included");
}

/// A run that ended with its input keeps, in its final checkpoint, the state of every
/// row it read: the rows after its last barrier too, which its segments took after they
/// passed no more barriers. Appended to, the input resumes from that state. (The final
/// checkpoint once held each operator's state as of its last barrier, while the lanes'
/// positions were at the end: the resumed sums lacked those rows.)
#[test]
fn an_input_appended_after_a_completed_run_resumes_from_the_state_of_every_row() {
    let scratch = Scratch::new();
    let keyed = |ids: std::ops::Range<i64>| -> String {
        ids.map(|i| format!("{{\"k\":\"k{}\",\"v\":{i}}}\n", i % 3)).collect()
    };
    scratch.write("in.jsonl", &keyed(0..40));
    let view =
        "[[view]]\nname = \"counts\"\nsql = \"SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k\"\n\n";
    let pipeline = checkpointed_copy("in.jsonl")
        .replace("[[sink]]", &format!("{view}[[sink]]"))
        .replace("from = \"events\"", "from = \"counts\"");
    assert!(pipeline.contains("from = \"counts\""), "{pipeline}");
    scratch.write("pipeline.toml", &pipeline);
    // Barriers after the first two batches only: the other rows come after the last one.
    let first = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=2*return")
        .output()
        .expect("run");
    assert!(first.status.success(), "{}", stderr(&first));
    let mut input = std::fs::OpenOptions::new().append(true).open(scratch.path("in.jsonl")).expect("open");
    std::io::Write::write_all(&mut input, keyed(40..55).as_bytes()).expect("append");
    let resumed = scratch.sluice(&["run", "pipeline.toml"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains("resuming from checkpoint"), "{}", stderr(&resumed));
    let mut table: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    for line in crate::golden::output(&scratch, "out").lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("json");
        let weight = if matches!(row["op"].as_str(), Some("-U" | "-D")) { -1 } else { 1 };
        *table.entry(format!("{},{},{}", row["k"], row["n"], row["total"])).or_default() += weight;
    }
    let live: Vec<&String> = table.iter().filter(|(_, weight)| **weight != 0).map(|(row, _)| row).collect();
    let expected: Vec<String> = (0..3)
        .map(|k| {
            let values: Vec<i64> = (0..55).filter(|i| i % 3 == k).collect();
            format!("\"k{k}\",{},{}", values.len(), values.iter().sum::<i64>())
        })
        .collect();
    assert_eq!(live, expected.iter().collect::<Vec<_>>(), "the counts and sums of all 55 rows");
}

#[test]
fn an_input_rewritten_between_a_crash_and_the_restart_is_refused() {
    let scratch = Scratch::new();
    scratch.write("in.jsonl", &rows(0..40));
    scratch.write("pipeline.toml", &checkpointed_copy("in.jsonl"));
    crash_after_two_checkpoints(&scratch);
    scratch.write("in.jsonl", &rows(100..140));
    let resumed = scratch.sluice(&["run", "pipeline.toml"]);
    assert_fails_with(&resumed, &["in.jsonl was rewritten", "appending rows to a file is fine", "--from-scratch"]);
}

#[test]
fn standard_input_is_read_to_its_end_and_refused_with_checkpoints() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &copy_pipeline("/dev/stdin", "out.jsonl"));
    let mut child = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, rows(0..7).as_bytes()).expect("feed");
    drop(stdin);
    let run = child.wait_with_output().expect("wait");
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("7 rows in"), "{}", stderr(&run));
    assert_eq!(scratch.read("out.jsonl").lines().count(), 7);
    let text = copy_pipeline("/dev/stdin", "out.jsonl").replace("[[source]]", "[checkpoint]\n\n[[source]]");
    scratch.write("pipeline.toml", &text);
    let refused = scratch.sluice(&["validate", "pipeline.toml"]);
    assert_fails_with(&refused, &["reads a pipe or a device", "remove the [checkpoint] section"]);
}

/// The benchmark command as BENCHMARKS.md runs it: each query in a child process, with
/// and without checkpoints, from the generator and from a generated CSV file.
#[test]
fn the_benchmark_commands_run_every_query() {
    let scratch = Scratch::new();
    let run = |args: &[&str]| {
        let output = sluice_command(scratch.dir.path()).args(args).output().expect("run sluice");
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        stdout(&output)
    };
    let events = "20000";
    let lines = run(&["--quiet", "nexmark", "bench", "--events", events]);
    let results: Vec<serde_json::Value> =
        lines.lines().map(|line| serde_json::from_str(line).expect("one JSON line per query")).collect();
    let queries: Vec<&str> = results.iter().map(|r| r["query"].as_str().expect("query")).collect();
    assert_eq!(queries, ["source", "q0", "q1", "q2", "tumble"]);
    for result in &results {
        assert_eq!(result["events"], 20000, "{result}");
        assert!(result["rows_out"].as_u64().expect("rows_out") > 0, "{result}");
    }

    let lines = run(&[
        "--quiet",
        "nexmark",
        "bench",
        "--events",
        events,
        "--queries",
        "tumble",
        "--checkpoint-interval",
        "50ms",
    ]);
    let result: serde_json::Value = serde_json::from_str(lines.trim()).expect("JSON line");
    assert!(result["checkpoints"]["published"].as_u64().expect("published") >= 1, "{result}");

    run(&["nexmark", "generate", "--events", events, "--output", "bids.csv"]);
    let csv = scratch.dir.path().join("bids.csv");
    let lines = run(&[
        "--quiet",
        "nexmark",
        "bench",
        "--csv",
        csv.to_str().expect("utf-8"),
        "--queries",
        "q2",
        "--threads",
        "2",
    ]);
    let result: serde_json::Value = serde_json::from_str(lines.trim()).expect("JSON line");
    assert_eq!(result["input"], "csv", "{result}");

    // A join reads two tables: one file will not do, a directory of the three will, and
    // it gives the generator's answer (the files hold the same events).
    let joined = run(&["--quiet", "nexmark", "bench", "--events", events, "--queries", "q3"]);
    let refused = sluice_command(scratch.dir.path())
        .args(["nexmark", "bench", "--csv", csv.to_str().expect("utf-8"), "--queries", "q3"])
        .output()
        .expect("run sluice");
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("reads person and auction besides bid"), "{}", stderr(&refused));
    std::fs::create_dir(scratch.dir.path().join("tables")).expect("mkdir");
    for table in ["person", "auction", "bid"] {
        let path = format!("tables/{table}.csv");
        run(&["nexmark", "generate", "--events", events, "--table", table, "--output", &path]);
    }
    let dir = scratch.dir.path().join("tables");
    let from_files = run(&["--quiet", "nexmark", "bench", "--csv", dir.to_str().expect("utf-8"), "--queries", "q3"]);
    let rows = |lines: &str| {
        let result: serde_json::Value = serde_json::from_str(lines.trim()).expect("JSON line");
        result["rows_out"].as_u64().expect("rows_out")
    };
    assert!(rows(&joined) > 0, "{joined}");
    assert_eq!(rows(&from_files), rows(&joined), "the same events from files and from the generator");
}
