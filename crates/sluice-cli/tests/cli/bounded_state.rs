//! State that the watermark bounds, seen where a user sees it: the exit report's bytes of
//! state per operator at the last checkpoint that held state.
//!
//! Each run takes one checkpoint per batch (the `source.barrier_after_batch` failpoint),
//! so the last checkpoint holding state is the one after the last batch, whatever the
//! machine's load, and the figures do not depend on timing.

use std::process::Stdio;

use crate::harness::{Scratch, sluice_command, stderr, stdout};

/// Events per second of event time: ten seconds hold 10,000 events (9,200 bids).
const FIRST_EVENT_RATE: u64 = 1_000;

/// Runs the bench's `query` over `events` generated events into a blackhole, one
/// checkpoint per batch of 10,000 events; returns the exit report.
fn report(query: &str, events: u64) -> String {
    let scratch = Scratch::new();
    let sql = scratch.sluice(&["nexmark", "sql", query]);
    assert!(sql.status.success(), "{}", stderr(&sql));
    let sql = stdout(&sql);
    assert!(!sql.contains("'''"), "the query's text fits a TOML literal string");
    scratch.write(
        "pipeline.toml",
        &format!(
            r#"[pipeline]
name = "bounded"
threads = 1
batch_size = 10000

[checkpoint]
interval = "20ms"
store = "file://./state"
retain = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = {events}
first_event_rate = {FIRST_EVENT_RATE}

[[view]]
name = "result"
sql = '''
{sql}'''

[[sink]]
name = "out"
from = "result"
connector = "blackhole"
"#
        ),
    );
    let run = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return")
        .stdout(Stdio::null())
        .output()
        .expect("run sluice");
    assert!(run.status.success(), "{}", stderr(&run));
    stderr(&run)
}

/// The bytes of state of the operator whose report line contains `operator`.
fn state_bytes(report: &str, operator: &str) -> u64 {
    let line = report
        .lines()
        .find(|line| line.contains("state at checkpoint") && line.contains(operator))
        .unwrap_or_else(|| panic!("no state line for {operator} in:\n{report}"));
    line.trim_end_matches(" bytes")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line}"))
}

/// q7 is an interval join: a bid is freed 10 s of event time after its own time, a
/// window's maximum at the window's end. Its live state is the last seconds of bids,
/// the same after 50 s of events as after 800 s (a regular join would hold sixteen
/// times as much). The bytes a checkpoint names are the runs that state is the merge
/// of: between once and about three times the live state, as merges beside the
/// checkpoints drop what expired (`sluice_state::compact::overdue`), so the two runs
/// may differ up to threefold, never sixteen.
#[test]
fn q7_holds_the_last_seconds_of_bids_however_long_it_runs() {
    let short = report("q7", 50_000);
    let long = report("q7", 800_000);
    let (short, long) = (state_bytes(&short, "join: INNER"), state_bytes(&long, "join: INNER"));
    assert!(short > 0, "the join holds the bids of the last window");
    assert!(long < 4 * short, "state grew with the input: {short} bytes after 50 s, {long} after 800 s");
}
