//! A run never hangs and never goes on without one of its threads: a panic on a driver
//! or on the checkpoint writer fails it with the panic's message, a barrier that is not
//! acknowledged fails its checkpoint (and the run, past `max_failed_checkpoints`) naming
//! the thread, and `shutdown_timeout` bounds the final checkpoint. Faults come from
//! failpoints; the only clocks are the configured timeouts, far below the blocked step.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::harness::{Scratch, assert_fails_with, sluice_command};

/// An unbounded nexmark source: a run that lost a thread would go on forever.
fn endless(checkpoint: &str, threads: u32) -> String {
    format!(
        r#"[pipeline]
name = "endless"
threads = {threads}
shutdown_timeout = "1s"
{checkpoint}
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 20000

[[view]]
name = "q2"
sql = "SELECT auction, price FROM bid WHERE MOD(auction, 7) = 0"

[[sink]]
name = "out"
from = "q2"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#
    )
}

/// The run failed (exit code 1) and its report says `needle`; the panic itself was
/// printed by the panic hook, as any panic is.
fn failed_with_panic(run: &std::process::Output, needle: &str) {
    let text = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{text}");
    let report = text.lines().skip_while(|line| !line.contains("FAILED")).collect::<Vec<_>>().join("\n");
    assert!(report.contains(needle), "the report lacks {needle:?}:\n{text}");
}

fn run_with(scratch: &Scratch, failpoints: &str) -> std::process::Output {
    sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", failpoints)
        .stdout(Stdio::null())
        .output()
        .expect("run sluice")
}

#[test]
fn a_panic_on_one_driver_thread_fails_the_run_with_its_message() {
    let scratch = Scratch::new();
    // Two threads, no exchange between them: the other thread could go on alone.
    scratch.write("pipeline.toml", &endless("", 2));
    let run = run_with(&scratch, "sink.write=1*panic(a bug in a sink)");
    failed_with_panic(&run, "FAILED after");
    failed_with_panic(&run, "in driver");
    failed_with_panic(&run, "panicked: a bug in a sink");
}

#[test]
fn a_panic_on_the_checkpoint_writer_fails_the_run_with_its_message() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &endless("[checkpoint]\ninterval = \"10ms\"\n", 1));
    let run = run_with(&scratch, "checkpoint.after_encode=panic(a bug in a snapshot)");
    failed_with_panic(&run, "checkpoint writer panicked: a bug in a snapshot");
}

#[test]
fn a_barrier_nobody_acknowledges_fails_the_checkpoint_naming_the_thread() {
    let scratch = Scratch::new();
    let checkpoint = "[checkpoint]\ninterval = \"10ms\"\ntimeout = \"500ms\"\nmax_failed_checkpoints = 1\n";
    scratch.write("pipeline.toml", &endless(checkpoint, 1));
    // The first write holds its thread for a minute: no barrier can pass it.
    let run = run_with(&scratch, "sink.write=1*sleep(60000)");
    assert_fails_with(&run, &["was not acknowledged within timeout = 500ms: thread 0 has not taken the barrier"]);
    assert_fails_with(&run, &["max_failed_checkpoints = 1", "raise [checkpoint] timeout"]);
}

/// The input ends while a checkpoint takes longer to write than `shutdown_timeout`
/// (a large state's delta): the run waits for it, as a running job would, and then the
/// final checkpoint, bounded from its own start, commits the last rows.
#[test]
fn a_checkpoint_written_when_the_input_ends_does_not_count_against_shutdown_timeout() {
    let scratch = Scratch::new();
    // 20,000 events at 4,000 a second: the input ends about 5 s after the start, well
    // after the second checkpoint started (10 ms after the first) and well before it is
    // written. Without the rate, the input could end before the second checkpoint
    // started, which would then be the final one and rightly bounded by shutdown_timeout.
    let bounded =
        endless("[checkpoint]\ninterval = \"10ms\"\n", 1).replace("rate = 20000", "rate = 4000\nevents = 20000");
    scratch.write("pipeline.toml", &bounded);
    // The first checkpoint is written at once, the second in 15 s (the input ends
    // meanwhile), every later one at once.
    let run = run_with(&scratch, "checkpoint.after_state_written=1*off->1*sleep(15000)");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("shutdown_timeout"), "{stderr}");
    // The committed parts (files in progress are hidden, starting with a dot).
    let rows: usize = std::fs::read_dir(scratch.dir.path().join("out"))
        .expect("the sink's directory")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.is_file() && !path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.')))
        .map(|path| std::fs::read_to_string(path).expect("a part").lines().count())
        .sum();
    assert!(rows > 0, "the final checkpoint committed the rows");
}

#[test]
fn shutdown_timeout_bounds_the_final_checkpoint() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &endless("[checkpoint]\ninterval = \"10ms\"\n", 1));
    // The first checkpoint is written; every later one takes a minute to write.
    let failpoints = "checkpoint.after_commit=1*return(note);checkpoint.after_state_written=1*off->sleep(60000)";
    let mut child = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", failpoints)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    while !seen.contains("checkpoint.after_commit reached") {
        assert!(stderr.read_line(&mut seen).expect("stderr") > 0, "the run ended early:\n{seen}");
    }
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let mut rest = String::new();
    for line in stderr.lines() {
        rest.push_str(&line.expect("stderr"));
        rest.push('\n');
    }
    assert_eq!(child.wait().expect("wait").code(), Some(1), "{rest}");
    assert!(rest.contains("is still being written to the store"), "{rest}");
    assert!(rest.contains("after shutdown_timeout = 1s"), "{rest}");
}
