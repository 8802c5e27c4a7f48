//! Exactly-once through crashes: every golden case, run with checkpoints, killed with
//! SIGKILL at a random point after at least one checkpoint was published, restarted
//! (with a different thread count every other time), must produce the same sink output as
//! an uninterrupted run, which must in turn equal the golden expectation.
//!
//! The golden inputs are replayed at a rate (rows/s) so a run lasts long enough to be
//! interrupted; checkpoints are taken every 20 ms. Pacing cuts the input into smaller
//! batches, which moves the watermark more often than in the golden run (so more rows can
//! be late): the crash run is compared with an uninterrupted run paced the same way, and a
//! checkpointed run without pacing is compared with the golden expectation.

use std::process::Stdio;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::golden::{Case, case_files, comparable, output, parse};
use crate::harness::{Scratch, sluice_command, stderr};

/// Upper bound for waiting on an event (a manifest appearing, a process ending).
const WAIT_MAX: Duration = Duration::from_secs(60);

/// The case's pipeline with checkpoints on and, unless `rate` is 0, its file sources paced.
fn checkpointed(pipeline: &str, rate: u32) -> String {
    let with_checkpoint = pipeline.replacen(
        "\n[[source]]",
        "\n[checkpoint]\ninterval = \"20ms\"\nstore = \"file://./state\"\n\n[[source]]",
        1,
    );
    if rate == 0 {
        return with_checkpoint;
    }
    with_checkpoint.replace("[source.options]\n", &format!("[source.options]\nrate = {rate}\n"))
}

fn prepare(case: &Case, rate: u32) -> Scratch {
    let scratch = Scratch::new();
    for (name, text) in &case.files {
        scratch.write(name, text);
    }
    scratch.write("pipeline.toml", &checkpointed(&case.pipeline, rate));
    scratch
}

fn run_to_end(scratch: &Scratch, threads: u32) -> String {
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", &threads.to_string()]);
    let report = stderr(&run);
    assert!(run.status.success(), "sluice failed:\n{report}");
    report
}

/// Whether the store holds a published manifest.
fn has_manifest(scratch: &Scratch) -> bool {
    std::fs::read_dir(scratch.path("state/manifests"))
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".manifest")))
        .unwrap_or(false)
}

/// Starts the pipeline, waits until a checkpoint is published, waits `extra` more, then
/// kills the process with SIGKILL. Returns false when the run ended before a checkpoint.
fn crash_after_checkpoint(scratch: &Scratch, threads: u32, extra: Duration) -> bool {
    let mut child = sluice_command(scratch.dir.path())
        .args(["--quiet", "run", "pipeline.toml", "--threads", &threads.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice");
    let started = Instant::now();
    while !has_manifest(scratch) {
        if child.try_wait().expect("poll child").is_some() {
            return false;
        }
        assert!(started.elapsed() < WAIT_MAX, "no checkpoint was published");
        std::thread::yield_now();
    }
    std::thread::sleep(extra);
    let _ = child.kill();
    let _ = child.wait();
    true
}

/// `golden`: the case's expected output applies (its batch size is the golden one).
fn check_case(case: &Case, label: &str, extra: Duration, threads: (u32, u32), golden: bool) {
    let (first_threads, second_threads) = threads;
    if golden {
        let unpaced = prepare(case, 0);
        let report = run_to_end(&unpaced, first_threads);
        for (name, expected) in &case.expected {
            let got = comparable(name, &output(&unpaced, name));
            assert_eq!(
                got,
                comparable(name, expected),
                "{label}: a checkpointed run differs from the golden output\n{report}"
            );
        }
    }
    let uninterrupted = prepare(case, 40);
    run_to_end(&uninterrupted, first_threads);
    let crashed = prepare(case, 40);
    let interrupted = crash_after_checkpoint(&crashed, first_threads, extra);
    let resumed = run_to_end(&crashed, second_threads);
    assert!(interrupted, "{label}: the run ended before its first checkpoint");
    assert!(resumed.contains("resuming from checkpoint"), "{label}: no resume:\n{resumed}");
    for (name, _) in &case.expected {
        let want = comparable(name, &output(&uninterrupted, name));
        let got = comparable(name, &output(&crashed, name));
        assert_eq!(got, want, "{label}: output {name} after a crash and restart differs\n{resumed}");
    }
}

#[test]
fn every_golden_case_survives_sigkill_and_a_restart_with_other_threads() {
    let mut failures = Vec::new();
    for (index, file) in case_files().iter().enumerate() {
        let case = parse(&std::fs::read_to_string(file).expect("read case"));
        let (first, second) = if index % 2 == 0 { (1, 2) } else { (2, 1) };
        let extra = Duration::from_millis(10 * (index as u64 % 5));
        let label = format!("{} ({first} → {second} threads)", file.display());
        if std::panic::catch_unwind(|| check_case(&case, &label, extra, (first, second), true)).is_err() {
            failures.push(label);
        }
    }
    assert!(failures.is_empty(), "failing cases (messages above): {failures:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random crash points and random batch boundaries, on the tumbling-window case.
    #[test]
    fn random_crash_points_and_batch_sizes(extra_ms in 0u64..150, batch_size in 1usize..4, threads in 1u32..3) {
        let file = case_files().into_iter().find(|f| f.ends_with("02_tumble_edges.case")).expect("case");
        let mut case = parse(&std::fs::read_to_string(&file).expect("read case"));
        case.pipeline = case.pipeline.replacen("[pipeline]\n", &format!("[pipeline]\nbatch_size = {batch_size}\n"), 1);
        let label = format!("tumble, batch {batch_size}, kill +{extra_ms} ms, {threads} → {} threads", 3 - threads);
        check_case(&case, &label, Duration::from_millis(extra_ms), (threads, 3 - threads), false);
    }
}
