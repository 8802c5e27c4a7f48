//! Exactly-once through crashes: every golden case, run with checkpoints, is killed with
//! SIGKILL at an exact point of the checkpoint protocol, a sink or a source (a failpoint,
//! see `sluice_types::failpoint`), restarted (with a different thread count every other
//! time, and killed again during recovery), and must end with the same sink output as an
//! uninterrupted run, which must in turn equal the golden expectation.
//!
//! Nothing here depends on timing. The `source.barrier_after_batch` failpoint holds each
//! lane after every batch until the next checkpoint barrier, so a run takes at least one
//! checkpoint per batch of its largest lane, whatever the machine's load; a crash point
//! is chosen among the evaluations that are therefore certain to happen, and the test
//! asserts that the process did die there.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use proptest::prelude::*;

use crate::golden::{Case, case_files, comparable, integrated, output, parse};
use crate::harness::{Scratch, sluice_command, sorted_lines, stderr};

/// Rows per batch in these runs: small, so that there are several batches, hence
/// several checkpoints, to crash among.
const BATCH_ROWS: usize = 1;

/// A place to die: failpoint `point` at its `skip + 1`-th evaluation.
#[derive(Debug, Clone, Copy)]
struct Crash {
    point: &'static str,
    skip: u32,
}

/// Failpoints evaluated once per checkpoint (at least three per run here: every case has
/// at least three input rows, each its own batch and checkpoint).
const CHECKPOINT_POINTS: [&str; 8] = [
    "checkpoint.after_encode",
    "checkpoint.after_runs_uploaded",
    "checkpoint.after_compaction",
    "checkpoint.collect_between",
    "checkpoint.after_state_written",
    "checkpoint.after_publish",
    "checkpoint.after_sink_commit",
    "checkpoint.after_commit",
];

/// The case's pipeline with checkpoints every 10 ms and, if given, `batch_rows` rows per
/// batch (unless the case sets its own: its expectation depends on it).
fn checkpointed(pipeline: &str, batch_rows: Option<usize>) -> String {
    let with_checkpoints = pipeline.replacen(
        "\n[[source]]",
        "\n[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n[[source]]",
        1,
    );
    match batch_rows {
        Some(rows) if !pipeline.contains("\nbatch_size") => {
            with_checkpoints.replacen("[pipeline]\n", &format!("[pipeline]\nbatch_size = {rows}\n"), 1)
        }
        _ => with_checkpoints,
    }
}

fn prepare(case: &Case, batch_rows: Option<usize>) -> Scratch {
    let scratch = Scratch::new();
    for (name, text) in &case.files {
        scratch.write(name, text);
    }
    scratch.write("pipeline.toml", &checkpointed(&case.pipeline, batch_rows));
    scratch
}

fn run_to_end(scratch: &Scratch, threads: u32) -> String {
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", &threads.to_string()]);
    let report = stderr(&run);
    assert!(run.status.success(), "sluice failed:\n{report}");
    report
}

/// Runs the pipeline with one epoch per batch until `crash` kills it; fails the test if
/// the run ended any other way.
fn run_until_crash(scratch: &Scratch, threads: u32, crash: Crash, label: &str) {
    let failpoints = format!("source.barrier_after_batch=return;{}={}*off->return(kill)", crash.point, crash.skip);
    let run = sluice_command(scratch.dir.path())
        .args(["--quiet", "run", "pipeline.toml", "--threads", &threads.to_string()])
        .env("SLUICE_FAILPOINTS", failpoints)
        .stdout(Stdio::null())
        .output()
        .expect("run sluice");
    assert_eq!(
        run.status.signal(),
        Some(9),
        "{label}: the run was to die at {crash:?} but ended with {}:\n{}",
        run.status,
        stderr(&run)
    );
}

/// Crashes a run at each of `crashes` in turn (the second and later during their
/// recovery or run), then resumes to the end; the output must equal an uninterrupted
/// run's.
fn check_crashes(case: &Case, label: &str, crashes: &[Crash], threads: (u32, u32), batch_rows: usize) {
    let uninterrupted = prepare(case, Some(batch_rows));
    run_to_end(&uninterrupted, threads.0);
    let crashed = prepare(case, Some(batch_rows));
    for (index, crash) in crashes.iter().enumerate() {
        let threads = if index.is_multiple_of(2) { threads.0 } else { threads.1 };
        run_until_crash(&crashed, threads, *crash, label);
    }
    let published = has_manifest(&crashed);
    let resumed = run_to_end(&crashed, threads.1);
    assert_eq!(resumed.contains("resuming from checkpoint"), published, "{label}: {crashes:?}\n{resumed}");
    for (name, _) in &case.expected {
        let want = comparable(name, &output(&uninterrupted, name));
        let got = comparable(name, &output(&crashed, name));
        assert_eq!(got, want, "{label}: output {name} after crashes at {crashes:?} differs\n{resumed}");
    }
    // A changelog whose rows depend on lane interleaving: the tables must agree.
    for (name, _) in &case.tables {
        let want = integrated(&output(&uninterrupted, name));
        let got = integrated(&output(&crashed, name));
        assert_eq!(
            got, want,
            "{label}: changelog {name} after crashes at {crashes:?} integrates differently\n{resumed}"
        );
    }
}

/// Whether the store holds a published manifest.
fn has_manifest(scratch: &Scratch) -> bool {
    std::fs::read_dir(scratch.path("state/manifests"))
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".manifest")))
        .unwrap_or(false)
}

fn check_case(file: &std::path::Path, index: usize) {
    let case = parse(&std::fs::read_to_string(file).expect("read case"));
    let (first, second) = if index.is_multiple_of(2) { (1, 2) } else { (2, 1) };
    let label = format!("{} ({first} → {second} threads)", file.display());
    // With checkpoints and the default batch size, the output is the golden one.
    let golden = prepare(&case, None);
    let report = run_to_end(&golden, first);
    for (name, expected) in &case.expected {
        let got = comparable(name, &output(&golden, name));
        assert_eq!(
            got,
            comparable(name, expected),
            "{label}: a checkpointed run differs from the golden output\n{report}"
        );
    }
    for (name, expected) in &case.tables {
        let got = integrated(&output(&golden, name));
        assert_eq!(
            got,
            crate::harness::sorted_lines(expected),
            "{label}: a checkpointed run's table differs\n{report}"
        );
    }
    let point = CHECKPOINT_POINTS[index % CHECKPOINT_POINTS.len()];
    let crashes = [
        Crash { point, skip: (index % 3) as u32 },
        Crash { point: "recovery.after_resolve", skip: 0 },
        Crash { point: "source.poll", skip: 0 },
    ];
    check_crashes(&case, &label, &crashes, (first, second), BATCH_ROWS);
}

#[test]
fn every_golden_case_survives_sigkill_at_checkpoint_steps_recovery_and_sources() {
    let mut failures = Vec::new();
    for (index, file) in case_files().iter().enumerate() {
        if std::panic::catch_unwind(|| check_case(file, index)).is_err() {
            failures.push(file.display().to_string());
        }
    }
    assert!(failures.is_empty(), "failing cases (messages above): {failures:?}");
}

/// Every crash point the property test picks from, with the most evaluations that are
/// certain (batches of three or more rows give at least three checkpoints).
fn crash_points() -> Vec<(&'static str, u32)> {
    let mut points: Vec<(&'static str, u32)> = CHECKPOINT_POINTS.iter().map(|p| (*p, 3)).collect();
    // The tumble case emits its windows at the end: its sink sees rows only then.
    points.extend([("sink.write", 1), ("sink.file.after_pre_commit", 1), ("source.poll", 3)]);
    points
}

/// A pipeline `name` counting `rows` (JSON lines of `k` and `ts`) per key in tumbling
/// windows of `seconds`, its file split into lanes of `split_bytes`, into the file sink
/// `out`.
fn tumbling_counts(name: &str, rows: String, split_bytes: u64, seconds: u32) -> Case {
    let pipeline = format!(
        "[pipeline]\nname = \"{name}\"\n\n[[source]]\nname = \"events\"\nconnector = \"file\"\nformat = \"json\"\n\
         schema = \"k VARCHAR, ts TIMESTAMP(3)\"\nevent_time = \"ts\"\n[source.options]\npath = \"events.jsonl\"\n\
         split_bytes = {split_bytes}\n\n[[view]]\nname = \"counts\"\nsql = \"SELECT k, COUNT(*) AS n, window_start FROM \
         TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '{seconds}' SECOND)) GROUP BY k, window_start, window_end\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"counts\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"out/\"\n"
    );
    Case {
        files: vec![("events.jsonl".into(), rows)],
        pipeline,
        expected: vec![("out".into(), String::new())],
        tables: Vec::new(),
        report: Vec::new(),
    }
}

/// Several lanes on two threads, killed at each checkpoint step in turn. The input is in
/// event-time order, so no row is late whatever the order the lanes' rows interleave in
/// (with rows out of order within a lane, lateness would depend on that interleaving,
/// as in Flink) and the output is one answer.
#[test]
fn several_lanes_survive_sigkill_at_every_checkpoint_step() {
    let rows: String = (0..60)
        .map(|i| format!("{{\"k\": \"k{}\", \"ts\": \"2026-01-01 00:00:{:02}.{:03}\"}}\n", i % 4, i / 2, (i % 2) * 500))
        .collect();
    let case = tumbling_counts("lanes", rows, 400, 5);
    for (index, point) in CHECKPOINT_POINTS.iter().enumerate() {
        let crashes = [Crash { point, skip: 2 }, Crash { point: "recovery.after_resolve", skip: 0 }];
        let label = format!("two lanes, {point}");
        let threads = if index.is_multiple_of(2) { (2, 1) } else { (2, 2) };
        check_crashes(&case, &label, &crashes, threads, 3);
    }
}

/// Rows out of event-time order in several lanes on two threads, killed at each
/// checkpoint step and resumed: which rows are late depends on how the lanes interleave
/// (as in Flink), so the output is not one answer, but no run may emit a window twice.
/// A window emitted before the checkpoint must stay closed after the restore: a row late
/// there must not open it again, though another thread's rows may reach the aggregate
/// before this thread's restored watermark does.
#[test]
fn late_rows_after_a_restore_never_reopen_an_emitted_window() {
    // Two lanes, one per thread. Every fourth row is 2 s older than its neighbours: it
    // belongs to the window before, which its lane's progress has closed (the merged
    // watermark is the first lane's, the second being ahead).
    let rows: String = (0..120)
        .map(|i: i64| {
            let ms = 10_000 + i * 250 - if i % 4 == 3 { 2_000 } else { 0 };
            format!("{{\"k\": \"k{}\", \"ts\": {ms}}}\n", i % 3)
        })
        .collect();
    let case = tumbling_counts("late", rows, 1600, 2);
    for point in CHECKPOINT_POINTS {
        let label = format!("late rows, {point}");
        let crashed = prepare(&case, Some(2));
        run_until_crash(&crashed, 2, Crash { point, skip: 5 }, &label);
        let resumed = run_to_end(&crashed, 2);
        assert!(resumed.contains("resuming from checkpoint"), "{label}: {resumed}");
        let mut seen = std::collections::BTreeMap::new();
        for line in output(&crashed, "out").lines() {
            let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
            *seen.entry((row["k"].to_string(), row["window_start"].to_string())).or_insert(0) += 1;
        }
        assert!(seen.len() > 10, "{label}: windows were emitted");
        let twice: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
        assert!(twice.is_empty(), "{label}: windows emitted twice: {twice:?}\n{resumed}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Random crash points, counts, batch sizes and thread counts, on the tumbling-window
    /// case; a failure replays from its seed.
    #[test]
    fn random_crash_points_and_batch_sizes(
        point in 0usize..8,
        skip in 0u32..3,
        batch_rows in 1usize..3,
        threads in 1u32..3,
        again in any::<bool>(),
    ) {
        let file = case_files().into_iter().find(|f| f.ends_with("02_tumble_edges.case")).expect("case");
        let case = parse(&std::fs::read_to_string(&file).expect("read case"));
        let (name, evaluations) = crash_points()[point];
        let mut crashes = vec![Crash { point: name, skip: skip.min(evaluations - 1) }];
        if again {
            crashes.push(Crash { point: "recovery.before_resolve", skip: 0 });
        }
        let label = format!("tumble, batches of {batch_rows}, {threads} → {} threads", 3 - threads);
        check_crashes(&case, &label, &crashes, (threads, 3 - threads), batch_rows);
    }
}

/// A stateful operator in a join's right input (a window aggregate) keeps its state when
/// a checkpoint taken on one thread resumes on two, where single-writer sinks add a
/// gather segment to the trunk: side segments are numbered within their side, so the
/// added segment does not renumber them. Killed after the fifth checkpoint, the side's
/// aggregate holds the clicks of an open window (user 3's at 00:00:10).
#[test]
fn state_in_a_joins_right_input_survives_a_restore_on_another_thread_count() {
    let file = crate::golden::case_files()
        .into_iter()
        .find(|file| file.ends_with("23_joins_of_aggregates.case"))
        .expect("the case of joins of aggregates");
    let case = parse(&std::fs::read_to_string(&file).expect("read case"));
    let crashes = [Crash { point: "checkpoint.after_publish", skip: 4 }];
    for threads in [(1, 2), (2, 1)] {
        let label = format!("{} ({} → {} threads)", file.display(), threads.0, threads.1);
        check_crashes(&case, &label, &crashes, threads, BATCH_ROWS);
    }
}

/// Rows kept on disk (`state_memory_mib = 0`: every chunk of a join's rows and of a
/// TopN's rows but each one's newest is in a spill file, and every group of a group
/// aggregate not touched since the previous mini-batch in a cold run) are checkpointed,
/// killed and restored onto another thread count as rows in memory are: NEXMark q20
/// (every bid in a join), q19 (ten bids per auction in a TopN) and q17 (a group per
/// auction and day), killed after a checkpoint's state is written and again during
/// recovery.
#[test]
fn spilled_join_topn_and_group_state_survive_sigkill_and_a_restore_on_another_thread_count() {
    let scratch = Scratch::new();
    let sql = |query: &str| {
        let run = scratch.sluice(&["nexmark", "sql", query]);
        assert!(run.status.success(), "nexmark sql {query}: {}", stderr(&run));
        crate::harness::stdout(&run)
    };
    let view = |name: &str| {
        format!("[[view]]\nname = \"{name}\"\nsql = {}\n\n", serde_json::to_string(&sql(name)).expect("sql"))
    };
    let sink = |name: &str| {
        format!(
            "[[sink]]\nname = \"{name}_out\"\nfrom = \"{name}\"\nconnector = \"file\"\nformat = \"json\"\n\
             [sink.options]\npath = \"{name}.jsonl\"\n\n"
        )
    };
    let pipeline = format!(
        "[pipeline]\nname = \"spilled\"\nbatch_size = 2000\nstate_memory_mib = 0\n\n[[source]]\nname = \"nexmark\"\n\
         connector = \"nexmark\"\n[source.options]\nevents = 20000\nseed = 0\n\n{}{}{}{}{}{}",
        view("q20"),
        view("q19"),
        view("q17"),
        sink("q20"),
        sink("q19"),
        sink("q17")
    );
    let case = Case {
        files: Vec::new(),
        pipeline,
        expected: vec![("q20.jsonl".into(), String::new())],
        tables: vec![("q19.jsonl".into(), String::new()), ("q17.jsonl".into(), String::new())],
        report: Vec::new(),
    };
    let crashes = [
        Crash { point: "checkpoint.after_state_written", skip: 3 },
        Crash { point: "recovery.after_resolve", skip: 0 },
    ];
    check_crashes(&case, "q20, q19 and q17 spilled (1 → 2 threads)", &crashes, (1, 2), 2000);
}

/// A `state_dir` on a disk that fills (a small tmpfs, mounted in a mount namespace of
/// the run's own, under `unshare`) while state spills to it (`state_memory_mib = 0`):
/// the run stops with an error that names the directory, the bytes it could not write and
/// the fix, never a panic. Run again from the same checkpoints with room on its disk, the
/// pipeline's output equals a run that never ran out: nothing committed was lost and
/// nothing is written twice. Two cases: q20's join rows fill 8 MiB (the spill files of
/// rows, or q17's cold runs beside them), and q17's groups fill 512 KiB (the cold runs of
/// evicted groups). Which write meets the full disk first, a spill's or a checkpoint's run
/// (sorted through the same directory; three failed in a row stop the run), depends on
/// the threads' pace: any of these stops is right, and each names the directory, the
/// bytes and the fix.
#[test]
fn a_state_dir_whose_disk_fills_stops_the_run_naming_it_and_the_resume_loses_nothing() {
    const ROWS: &str = "bytes of state to a spill file in ./small";
    const GROUPS: &str = "bytes of evicted state to a spill file in ./small";
    fill_state_dir(&["q20", "q17"], "8m", &[ROWS, GROUPS]);
    fill_state_dir(&["q17"], "512k", &[GROUPS]);
}

/// The NEXMark `queries` run with their `state_dir` on a tmpfs of `size` until it fills
/// with an error containing one of `failures` (or a checkpoint's run failing), then
/// resumed on a larger disk.
fn fill_state_dir(queries: &[&str], size: &str, failures: &[&str]) {
    let scratch = Scratch::new();
    let sql = |query: &str| {
        let run = scratch.sluice(&["nexmark", "sql", query]);
        assert!(run.status.success(), "nexmark sql {query}: {}", stderr(&run));
        serde_json::to_string(&crate::harness::stdout(&run)).expect("sql")
    };
    let mut flows = String::new();
    for query in queries {
        flows.push_str(&format!(
            "[[view]]\nname = \"{query}\"\nsql = {}\n\n[[sink]]\nname = \"{query}_out\"\nfrom = \"{query}\"\n\
             connector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"{query}.jsonl\"\n\n",
            sql(query)
        ));
    }
    let pipeline = |state_dir: &str| {
        format!(
            "[pipeline]\nname = \"filled\"\nbatch_size = 2000\nstate_memory_mib = 0\nstate_dir = \"{state_dir}\"\n\n\
             [checkpoint]\ninterval = \"10ms\"\nstore = \"file://./checkpoints\"\n\n\
             [[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n[source.options]\nevents = 60000\nseed = 0\n\n\
             {flows}"
        )
    };
    // q20 is append-only; q17 updates its rows, which are compared as the table they make.
    let outputs = |dir: &Scratch| -> Vec<Vec<String>> {
        queries
            .iter()
            .map(|query| {
                let text = output(dir, &format!("{query}.jsonl"));
                if *query == "q17" { integrated(&text) } else { sorted_lines(&text) }
            })
            .collect()
    };

    let reference = Scratch::new();
    std::fs::create_dir(reference.path("state")).expect("state dir");
    reference.write("pipeline.toml", &pipeline("state"));
    let run = reference.sluice(&["--quiet", "run", "pipeline.toml"]);
    assert!(run.status.success(), "the reference run: {}", stderr(&run));
    let expected = outputs(&reference);
    assert!(expected.iter().all(|rows| rows.len() > 100), "the reference holds rows");

    std::fs::create_dir(scratch.path("small")).expect("state dir");
    std::fs::create_dir(scratch.path("large")).expect("state dir");
    scratch.write("pipeline.toml", &pipeline("small"));
    // Each lane waits after a batch for the next checkpoint barrier, so checkpoints are
    // taken all along (about ten are published before either disk fills); how many are
    // published first depends on the writer thread, and the resume must be exact
    // whichever it is.
    let filled = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(format!("mount -t tmpfs -o size={size} sluice-test small && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "pipeline.toml"])
        .current_dir(scratch.dir.path())
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return")
        .stdout(Stdio::null())
        .output()
        .expect("run sluice under unshare");
    let text = stderr(&filled);
    assert!(!text.contains("mount:") && !text.contains("unshare:"), "the namespace is made: {text}");
    crate::harness::assert_fails_with(&filled, &["./small", "No space left on device", "fix:", "state_dir"]);
    assert!(
        failures.iter().any(|failure| text.contains(failure)) || text.contains("cannot write a state run in ./small ("),
        "stopped by neither a spill ({failures:?}) nor a checkpoint's run:\n{text}"
    );

    scratch.write("pipeline.toml", &pipeline("large"));
    let resumed = scratch.sluice(&["--quiet", "run", "pipeline.toml"]);
    assert!(resumed.status.success(), "the resumed run: {}", stderr(&resumed));
    assert!(outputs(&scratch) == expected, "{queries:?}: the resumed run's output differs from the reference");
}
