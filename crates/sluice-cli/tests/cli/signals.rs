//! SIGTERM mid-run: the sources stop, everything in flight drains into the sink, the
//! report says so, and the exit code is 0.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use crate::harness::{Scratch, sluice_command};

#[test]
fn sigterm_drains_and_reports() {
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        r#"
[pipeline]
name = "endless"
threads = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 500000

[[view]]
name = "q2"
sql = "SELECT auction, price FROM bid WHERE MOD(auction, 7) = 0"

[[sink]]
name = "out"
from = "q2"
connector = "file"
format = "json"
[sink.options]
path = "out.jsonl"
"#,
    );
    let mut child = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "sink.write=1*return(note)")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // The first rows are being written: the run is genuinely mid-stream. (The CLI
    // announces the run once the job started, so on a loaded machine the sink's first
    // write may come before that line: their order is not asserted.)
    let seen = read_until(&mut stderr, "failpoint sink.write reached");
    assert!(seen.contains("sink.write reached"), "{seen}");
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let mut rest = String::new();
    for next in stderr.lines() {
        rest.push_str(&next.expect("stderr line"));
        rest.push('\n');
    }
    let exit = child.wait().expect("wait");
    assert_eq!(exit.code(), Some(0), "stderr:\n{rest}");
    assert!(rest.contains("stopped and drained"), "{rest}");
    assert!(seen.contains("running pipeline") || rest.contains("running pipeline"), "{seen}{rest}");
    let rows_out: usize = rest
        .lines()
        .find_map(|l| l.trim().strip_prefix("sink out: ")?.split_whitespace().next()?.parse().ok())
        .expect("the report names the sink's rows");
    let text = scratch.read("out.jsonl");
    for row in text.lines() {
        serde_json::from_str::<serde_json::Value>(row).unwrap_or_else(|e| panic!("torn row {row:?}: {e}"));
    }
    assert_eq!(text.lines().count(), rows_out, "every counted row reached the file");
    assert!(rows_out > 0);
}

/// A pipeline whose stdout sink blocks as soon as the test stops reading: the drain
/// cannot finish, which is what the two tests below need.
const BLOCKED_STDOUT: &str = r#"
[pipeline]
name = "blocked"
threads = 1
shutdown_timeout = "SHUTDOWN"

[[source]]
name = "nexmark"
connector = "nexmark"

[[sink]]
name = "console"
from = "bid"
connector = "stdout"
format = "json"
"#;

/// Starts the blocked pipeline and returns once rows are flowing to stdout (one large
/// batch is being written, and the test reads no further).
fn start_blocked(scratch: &Scratch, shutdown: &str) -> (std::process::Child, BufReader<std::process::ChildStderr>) {
    scratch.write("pipeline.toml", &BLOCKED_STDOUT.replace("SHUTDOWN", shutdown));
    let mut child = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).expect("rows reach stdout");
    // Keep the pipe open but unread: the sink's next write blocks.
    std::mem::forget(stdout);
    let stderr = BufReader::new(child.stderr.take().expect("stderr"));
    (child, stderr)
}

fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status();
    assert!(status.expect("kill").success());
}

/// Reads stderr until a line contains `needle`; returns everything read.
fn read_until(stderr: &mut BufReader<std::process::ChildStderr>, needle: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let read = stderr.read_line(&mut line).expect("stderr");
        seen.push_str(&line);
        if read == 0 || line.contains(needle) {
            return seen;
        }
    }
}

#[test]
fn a_second_interrupt_exits_at_once_naming_what_was_abandoned() {
    let scratch = Scratch::new();
    let (mut child, mut stderr) = start_blocked(&scratch, "10m");
    signal(&child, "INT");
    let seen = read_until(&mut stderr, "stopping sources and draining");
    assert!(seen.contains("stopping sources and draining"), "{seen}");
    signal(&child, "INT");
    let seen = read_until(&mut stderr, "exiting now");
    assert!(seen.contains("second interrupt: exiting now") && seen.contains("abandoned"), "{seen}");
    assert_eq!(child.wait().expect("wait").code(), Some(1));
}

/// A stop asked some other way (the admin API here; in a cluster, another worker's
/// Ctrl-C, which a terminal running every worker sends them all at once) leaves the first
/// signal a first: it says the job is already stopping, and only a second exits at once.
#[test]
fn a_signal_after_a_stop_asked_otherwise_is_still_the_first() {
    let scratch = Scratch::new();
    let (mut child, mut stderr) = start_blocked(&scratch, "10m");
    let seen = read_until(&mut stderr, "admin API on http://");
    let addr: std::net::SocketAddr = seen
        .lines()
        .find_map(|line| line.split("admin API on http://").nth(1))
        .and_then(|addr| addr.trim().parse().ok())
        .unwrap_or_else(|| panic!("no admin address in {seen}"));
    let (code, answer) = crate::admin::request(addr, "POST", "/stop");
    assert_eq!(code, 202, "{answer}");
    signal(&child, "INT");
    let seen = read_until(&mut stderr, "interrupt");
    assert!(seen.contains("interrupt: already stopping (again to exit at once)"), "{seen}");
    signal(&child, "INT");
    let seen = read_until(&mut stderr, "exiting now");
    assert!(seen.contains("second interrupt: exiting now"), "{seen}");
    assert_eq!(child.wait().expect("wait").code(), Some(1));
}

#[test]
fn a_drain_past_shutdown_timeout_fails_naming_the_deadline() {
    let scratch = Scratch::new();
    let (mut child, mut stderr) = start_blocked(&scratch, "1s");
    signal(&child, "TERM");
    let seen = read_until(&mut stderr, "FAILED");
    assert!(seen.contains("still draining after shutdown_timeout = 1s"), "{seen}");
    assert_eq!(child.wait().expect("wait").code(), Some(1));
}

/// With checkpoints, SIGTERM takes a final checkpoint instead of flushing open windows:
/// the restarted run then ends with exactly the output of a run never stopped.
#[test]
fn sigterm_with_checkpoints_resumes_without_duplicates() {
    let pipeline = r#"
[pipeline]
name = "stoppable"
threads = 2

[checkpoint]
interval = "50ms"

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = 40000
rate = 20000
first_event_rate = 10000

[[view]]
name = "counts"
sql = "SELECT auction, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end"

[[sink]]
name = "out"
from = "counts"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#;
    let parts = |scratch: &Scratch| crate::harness::sorted_lines(&crate::golden::output(scratch, "out"));
    let clean = Scratch::new();
    clean.write("pipeline.toml", pipeline);
    assert!(clean.sluice(&["--quiet", "run", "pipeline.toml"]).status.success());

    let stopped = Scratch::new();
    stopped.write("pipeline.toml", pipeline);
    let mut child = sluice_command(stopped.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "checkpoint.after_commit=1*return(note)")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // A checkpoint was committed; the stop comes mid-stream.
    let seen = read_until(&mut stderr, "failpoint checkpoint.after_commit reached");
    assert!(seen.contains("after_commit reached"), "{seen}");
    signal(&child, "TERM");
    let seen = read_until(&mut stderr, "sluice: pipeline");
    assert_eq!(child.wait().expect("wait").code(), Some(0), "{seen}");
    assert!(seen.contains("stopped and drained"), "{seen}");
    let resumed = stopped.sluice(&["run", "pipeline.toml"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(parts(&stopped), parts(&clean), "a stop and restart must not change the output");
}
