//! One view read by two sinks and a materialized table is computed once
//! (`sluice_engine::share`): `explain` shows its operators once with their readers, the
//! checkpoints hold its state once, every reader gets what it would get alone, a crash
//! and restore (on another thread count) changes none of it, and a cluster's workers
//! share it across their links.

use crate::golden::{integrated, output};
use crate::harness::{Scratch, stderr, stdout};
use crate::query::{RESTORED, expected_totals, restored_scratch, run_and_read};

/// `query::RESTORED` (a running aggregate `totals` over a file and a union with nexmark
/// bids that never pass its filter, materialized) with `totals` also read by a sink with
/// one writer and by a sink with a writer per thread.
fn shared() -> String {
    format!(
        "{RESTORED}
[[sink]]
name = \"single\"
from = \"totals\"
connector = \"file\"
format = \"json\"
[sink.options]
path = \"single.jsonl\"

[[sink]]
name = \"parts\"
from = \"totals\"
connector = \"file\"
format = \"json\"
[sink.options]
path = \"parts/\"
"
    )
}

/// `sluice explain` of `pipeline`.
fn explain(pipeline: &str) -> String {
    let scratch = restored_scratch();
    scratch.write("pipeline.toml", pipeline);
    let run = scratch.sluice(&["explain", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    stdout(&run)
}

/// The operator lines of an explanation (indented under their segment; not its state).
fn operators(explanation: &str) -> usize {
    explanation.lines().filter(|line| line.starts_with("    ") && !line.trim_start().starts_with("state: ")).count()
}

/// `shared()` with only `sink` reading `totals` (None: only the materialized table).
fn alone(sink: Option<&str>) -> String {
    let mut text = shared();
    for other in ["single", "parts"].into_iter().filter(|other| Some(*other) != sink) {
        let start = text.find(&format!("[[sink]]\nname = \"{other}\"")).expect("the sink");
        let end = text[start + 1..].find("[[sink]]").map_or(text.len(), |next| start + 1 + next);
        text.replace_range(start..end, "");
    }
    if sink.is_some() {
        text = text.replace("materialized = true\n", "");
    }
    text
}

#[test]
fn explain_shows_a_view_read_by_two_sinks_and_a_table_once_with_its_readers() {
    let shown = explain(&shared());
    assert_eq!(shown.matches("scan bids.bids").count(), 1, "{shown}");
    assert_eq!(shown.matches("group_aggregate").count(), 1, "{shown}");
    assert_eq!(shown.matches("state: ").count(), 2, "the aggregate's groups and the table's rows:\n{shown}");
    assert!(shown.contains("  also read by: sink parts\n  also read by: sink materialized:totals\n"), "{shown}");
    assert_eq!(shown.matches("reads segment 2 of the flow → sink single (shared)").count(), 2, "{shown}");
    // Alone, each reader computes the view itself: three aggregates, three scans.
    let single = explain(&alone(Some("single")));
    let parts = explain(&alone(Some("parts")));
    let table = explain(&alone(None));
    for (name, text) in [("single", &single), ("parts", &parts), ("table", &table)] {
        assert_eq!(text.matches("group_aggregate").count(), 1, "{name}:\n{text}");
        assert!(!text.contains("(shared)"), "{name}:\n{text}");
    }
    // Shared: the single reader's operators and the table's own one (keeping its rows).
    assert_eq!(operators(&shown), operators(&single) + 1, "{shown}");
    assert_eq!(operators(&single) + operators(&parts) + operators(&table), 3 * operators(&single) + 1);
}

/// The sinks' changelogs integrated, each sorted.
fn sink_tables(scratch: &Scratch) -> [Vec<String>; 2] {
    [integrated(&output(scratch, "single.jsonl")), integrated(&output(scratch, "parts/"))]
}

/// What every reader must hold: every row of the file, grouped.
fn expected_rows() -> Vec<String> {
    let mut rows: Vec<String> = expected_totals().iter().map(ToString::to_string).collect();
    rows.sort();
    rows
}

#[test]
fn a_shared_view_keeps_its_state_once_and_survives_sigkill_and_a_restore_on_another_thread_count() {
    let uninterrupted = restored_scratch();
    uninterrupted.write("pipeline.toml", &shared());
    let (want, report) = run_and_read(&uninterrupted, "2");
    assert_eq!(want.len(), 11, "{want:?}");
    let [single, parts] = sink_tables(&uninterrupted);
    assert_eq!(single, expected_rows(), "{report}");
    assert_eq!(parts, expected_rows(), "{report}");
    // The last checkpoint holds the aggregate's state once and the table's rows, nothing else.
    let states: Vec<&str> = report.lines().filter(|line| line.contains("state at checkpoint")).collect();
    assert_eq!(states.len(), 2, "{report}");
    assert!(states[0].contains(": sink single, segment 2: group_aggregate"), "{report}");
    assert!(states[1].contains(": sink materialized:totals, segment 0: materialize"), "{report}");

    // Killed after its 21st committed checkpoint, mid-file, then resumed on 3 threads.
    let crashed = restored_scratch();
    crashed.write("pipeline.toml", &shared());
    let killed = crate::harness::sluice_command(crashed.dir.path())
        .args(["--quiet", "run", "pipeline.toml", "--threads", "2"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return;checkpoint.after_commit=20*off->return(kill)")
        .stdout(std::process::Stdio::null())
        .output()
        .expect("run sluice");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&killed.status), Some(9), "{}", stderr(&killed));
    let (got, text) = run_and_read(&crashed, "3");
    assert!(text.contains("resuming from checkpoint"), "{text}");
    assert_eq!(got, want, "the resumed job's table differs from an uninterrupted run's\n{text}");
    assert_eq!(sink_tables(&crashed), sink_tables(&uninterrupted), "{text}");
}

/// In a cluster the taps cross workers (the table's exchange by the whole row reaches
/// every worker's slots): both workers answer with the whole table.
#[test]
fn a_view_shared_across_a_clusters_workers_fills_the_table_on_both() {
    let scratch = restored_scratch();
    scratch.write("pipeline.toml", &shared());
    let (leader, leader_addr, follower, follower_addr) = crate::query::start_cluster(&scratch);
    let from_follower = crate::query::complete_totals(follower_addr);
    assert_eq!(from_follower, expected_totals());
    assert_eq!(crate::query::complete_totals(leader_addr), from_follower, "the leader and the follower answer alike");
    // Dropping them kills both: the stop of a cluster with materialized views is not what
    // is tested here (ARCHITECTURE.md, "Deliberately absent").
    drop((leader, follower));
}
