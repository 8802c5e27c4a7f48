//! Jobs as a library caller sees them: a status that moves and ends, a report, and a
//! restore that refuses state it cannot read.

use std::path::Path;
use std::time::Duration;

use sluice_checkpoint::{CheckpointStore, Holder, Manifest};

use crate::{Engine, JobState, Overrides, RunOutcome, StartOptions};

const PIPELINE: &str = r#"
[pipeline]
name = "job"
threads = 1

[checkpoint]
interval = "1h"
store = "file://./state"

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT"
[source.options]
path = "events.jsonl"

[[sink]]
name = "out"
from = "events"
connector = "file"
[sink.options]
path = "out/"
"#;

fn pipeline(dir: &Path) -> crate::Pipeline {
    std::fs::write(dir.join("events.jsonl"), "{\"k\":\"a\",\"v\":1}\n{\"k\":\"b\",\"v\":2}\n").expect("write");
    Engine::default().parse(PIPELINE, "job.toml", dir, Overrides::default()).expect("valid")
}

#[test]
fn a_job_reports_its_states_its_commit_and_its_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = pipeline(dir.path());
    let job = crate::Job::start(&pipeline, StartOptions::default()).expect("starts");
    let mut changes = job.subscribe();
    let mut seen: Vec<crate::Status> = Vec::new();
    while seen.last().is_none_or(|s| !s.state.is_final()) {
        if let Some(status) = changes.next_timeout(Duration::from_secs(60)) {
            seen.push(status);
        }
    }
    let states: Vec<JobState> = seen.iter().map(|s| s.state).collect();
    let last = seen.last().cloned();
    let report = job.wait();
    assert_eq!(report.outcome, RunOutcome::Completed);
    assert_eq!(report.metrics.rows_out(), 2);
    let last = last.expect("a final status");
    assert_eq!(last.state, JobState::Completed);
    assert_eq!(last.last_committed_epoch, Some(1), "the end-of-input checkpoint");
    assert!(seen.windows(2).all(|pair| pair[0] != pair[1]), "each status once: {seen:?}");
    let order =
        |state: &JobState| [JobState::Starting, JobState::Running, JobState::Completed].iter().position(|s| s == state);
    assert!(states.windows(2).all(|pair| order(&pair[0]) <= order(&pair[1])), "states only move on: {states:?}");
}

#[test]
fn state_written_with_other_encodings_is_refused_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = pipeline(dir.path());
    let fingerprint = pipeline.compile(None).expect("compiles").fingerprint;
    let store = CheckpointStore::open("file://./state", dir.path()).expect("store");
    let lease = store.acquire_lease(Holder::this_process("an older build")).expect("lease");
    let mut manifest = Manifest::new(1, fingerprint.to_string(), 256, 0);
    manifest.encodings = crate::checkpointing::encodings();
    manifest.encodings.insert("key".into(), 0);
    store.publish(&manifest).expect("publish");
    lease.release().expect("release");
    let error = crate::Job::start(&pipeline, StartOptions::default()).expect_err("refused");
    assert_eq!(error.code(), "checkpoint.encodings");
    let text = error.to_string();
    assert!(text.contains("key v0") && text.contains("key v1") && text.contains("--from-scratch"), "{text}");
    // The refusal left the store free: --from-scratch starts over at once.
    let job = crate::Job::start(&pipeline, StartOptions { from_scratch: true }).expect("a fresh start");
    assert_eq!(job.wait().outcome, RunOutcome::Completed);
}
