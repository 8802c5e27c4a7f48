//! Checkpoint stores as a user meets them: damaged checkpoints fall back or fail clearly,
//! a changed plan is refused with both fingerprints and the remedies, and
//! `sluice checkpoints list/verify` inspect a store.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use crate::harness::{Scratch, assert_fails_with, sluice_command, sorted_lines, stderr, stdout};

fn pipeline(view_sql: &str) -> String {
    pipeline_into(view_sql, "out/")
}

/// The pipeline writing its file sink at `sink_path` (a directory, or one file).
fn pipeline_into(view_sql: &str, sink_path: &str) -> String {
    format!(
        r#"[pipeline]
name = "stored"
threads = 2
batch_size = 10

[checkpoint]
interval = "20ms"
store = "file://./state"
retain = 10

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT, ts TIMESTAMP(3)"
event_time = "ts"
[source.options]
path = "events.jsonl"

[[view]]
name = "sums"
sql = "{view_sql}"

[[sink]]
name = "out"
from = "sums"
connector = "file"
format = "json"
[sink.options]
path = "{sink_path}"
"#
    )
}

const SUMS: &str = "SELECT k, SUM(v) AS total, window_start FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY k, window_start, window_end";

fn scratch() -> Scratch {
    scratch_into("out/")
}

fn scratch_into(sink_path: &str) -> Scratch {
    let scratch = Scratch::new();
    let rows: String = (0..120)
        .map(|i| format!("{{\"k\":\"k{}\",\"v\":{i},\"ts\":{}}}\n", i % 3, 1_767_225_600_000i64 + i * 250))
        .collect();
    scratch.write("events.jsonl", &rows);
    scratch.write("pipeline.toml", &pipeline_into(SUMS, sink_path));
    scratch
}

fn manifests(scratch: &Scratch) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(scratch.path("state/manifests"))
        .map(|entries| {
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "manifest")).collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Runs with one checkpoint per batch (12 batches of 10 rows, so at least 12
/// checkpoints) and kills the process with SIGKILL right after the `count`-th is
/// published: an exact point, whatever the machine's load.
fn crash_after(scratch: &Scratch, count: usize) {
    let failpoints =
        format!("source.barrier_after_batch=return;checkpoint.after_publish={}*off->return(kill)", count - 1);
    let run = sluice_command(scratch.dir.path())
        .args(["--quiet", "run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", failpoints)
        .stdout(Stdio::null())
        .output()
        .expect("run sluice");
    assert_eq!(run.status.signal(), Some(9), "the run was to die after checkpoint {count}:\n{}", stderr(&run));
    assert_eq!(manifests(scratch).len().min(count), count, "{count} checkpoints were published");
}

fn output(scratch: &Scratch) -> Vec<String> {
    output_at(scratch, "out")
}

fn output_at(scratch: &Scratch, sink_path: &str) -> Vec<String> {
    sorted_lines(&crate::golden::output(scratch, sink_path.trim_end_matches('/')))
}

fn uninterrupted() -> Vec<String> {
    uninterrupted_into("out/")
}

fn uninterrupted_into(sink_path: &str) -> Vec<String> {
    let clean = scratch_into(sink_path);
    let run = clean.sluice(&["run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    output_at(&clean, sink_path)
}

/// The newest checkpoint's epoch may have been committed (its rows visible) before the
/// crash: falling back past it must remove those rows, in directory mode (its parts) and
/// in file mode (the file cut back), or the replay repeats them.
#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    for sink_path in ["out/", "out.jsonl"] {
        falls_back_with_the_output_of_an_uninterrupted_run(sink_path);
    }
}

fn falls_back_with_the_output_of_an_uninterrupted_run(sink_path: &str) {
    let expected = uninterrupted_into(sink_path);
    for damage in ["truncate", "garbage", "delete-object"] {
        let context = format!("{damage}, sink at {sink_path}");
        let crashed = scratch_into(sink_path);
        // Once manifest 6 exists, epochs up to 5 were committed (commits precede the next
        // barrier); damaging every manifest but the first makes recovery fall back to
        // epoch 1, past rows of later epochs that are already visible.
        crash_after(&crashed, 6);
        let mut found = manifests(&crashed);
        for manifest in found.split_off(1) {
            let name = manifest.file_name().expect("a name").to_string_lossy().into_owned();
            let epoch: u64 = name["epoch-".len()..name.len() - ".manifest".len()].parse().expect("an epoch");
            // An epoch whose state was empty has no object to delete: its manifest is
            // damaged instead, so every checkpoint after the first is unusable.
            let object = walk_if_exists(&crashed.path(&format!("state/state/epoch-{epoch}"))).into_iter().next();
            match (damage, object) {
                ("truncate", _) => {
                    std::fs::write(&manifest, &std::fs::read(&manifest).expect("read")[..10]).expect("truncate")
                }
                ("delete-object", Some(object)) => std::fs::remove_file(object).expect("delete"),
                _ => std::fs::write(&manifest, b"not a manifest at all").expect("write"),
            }
        }
        let resumed = crashed.sluice(&["run", "pipeline.toml"]);
        let report = stderr(&resumed);
        assert!(resumed.status.success(), "{context}: {report}");
        assert!(report.contains("falling back"), "{context}: no fallback warning:\n{report}");
        assert_eq!(output_at(&crashed, sink_path), expected, "{context}: output after the fallback differs");
    }
}

fn walk_if_exists(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    if dir.is_dir() { walk(dir) } else { Vec::new() }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files.sort();
    files
}

#[test]
fn a_changed_plan_is_refused_until_from_scratch() {
    let scratch = scratch();
    crash_after(&scratch, 1);
    scratch.write("pipeline.toml", &pipeline(&SUMS.replace("SUM(v)", "MAX(v)")));
    let refused = scratch.sluice(&["run", "pipeline.toml"]);
    assert_fails_with(&refused, &["different plan", "fingerprint", "--from-scratch", "new location"]);
    let fresh = scratch.sluice(&["run", "pipeline.toml", "--from-scratch"]);
    assert!(fresh.status.success(), "{}", stderr(&fresh));
}

#[test]
fn checkpoints_list_and_verify_name_what_is_damaged() {
    let scratch = scratch();
    crash_after(&scratch, 2);
    let list = scratch.sluice(&["checkpoints", "list", "--store", "file://./state"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(
        stdout(&list).contains("events (2 lanes") || stdout(&list).contains("events (1 lanes"),
        "{}",
        stdout(&list)
    );
    let verify = scratch.sluice(&["checkpoints", "verify", "--store", "file://./state"]);
    assert!(verify.status.success(), "{}", stdout(&verify));
    // After 20 rows the 1-second windows of the last rows are open: the checkpoint holds state.
    let object = walk(&scratch.path("state/state")).into_iter().next_back().expect("a state object");
    let mut bytes = std::fs::read(&object).expect("read");
    bytes[0] ^= 0xff;
    std::fs::write(&object, bytes).expect("flip");
    let verify = scratch.sluice(&["checkpoints", "verify", "--store", "file://./state"]);
    assert_eq!(verify.status.code(), Some(1));
    let name = object.file_name().expect("name").to_string_lossy().into_owned();
    assert!(stdout(&verify).contains("DAMAGED") && stdout(&verify).contains(&name), "{}", stdout(&verify));
}

/// (k, window_start) → total, from the JSON rows of the sums view.
fn totals(lines: &[String]) -> std::collections::BTreeMap<(String, String), Vec<i64>> {
    let mut totals: std::collections::BTreeMap<(String, String), Vec<i64>> = Default::default();
    for line in lines {
        let row: serde_json::Value = serde_json::from_str(line).expect("json");
        let key = (row["k"].to_string(), row["window_start"].to_string());
        totals.entry(key).or_default().push(row["total"].as_i64().expect("total"));
    }
    totals
}

#[test]
fn at_least_once_loses_nothing_across_a_crash() {
    let expected = totals(&uninterrupted());
    let scratch = scratch();
    let text = pipeline(SUMS).replace("interval = \"20ms\"", "interval = \"20ms\"\nguarantee = \"at-least-once\"");
    scratch.write("pipeline.toml", &text);
    crash_after(&scratch, 2);
    let resumed = scratch.sluice(&["run", "pipeline.toml"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let got = totals(&output(&scratch));
    for (key, want) in &expected {
        let Some(seen) = got.get(key) else { panic!("window {key:?} was lost") };
        // A window may be emitted again, or count a replayed row twice; never less.
        assert!(seen.iter().any(|total| total >= &want[0]), "window {key:?}: {seen:?} < {want:?}");
    }
}

#[test]
fn the_exit_report_gives_each_operators_state_at_the_last_checkpoint_holding_state() {
    let scratch = scratch();
    scratch.write("pipeline.toml", &pipeline("SELECT k, SUM(v) AS total FROM events GROUP BY k"));
    // One checkpoint per batch: some are taken while the groups hold state (the one at
    // the end of input holds none: nothing is left to resume).
    let run = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return")
        .stdout(Stdio::null())
        .output()
        .expect("run sluice");
    assert!(run.status.success(), "{}", stderr(&run));
    let report = stderr(&run);
    let line = report
        .lines()
        .find(|line| line.contains("state at checkpoint") && line.contains("group_aggregate"))
        .unwrap_or_else(|| panic!("no state line for the aggregate in:\n{report}"));
    assert!(line.contains("sink out, segment 1: "), "{line}");
    let bytes: u64 = line
        .trim_end_matches(" bytes")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line}"));
    assert!(bytes > 0, "three groups hold state: {line}");
}
