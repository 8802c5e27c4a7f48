//! Which readers share a view's computation, what the plan and the fingerprint of a
//! shared view look like, and that state of the unshared plan is refused by it.

use std::path::Path;

use sluice_checkpoint::{CheckpointStore, Holder, Manifest};
use sluice_runtime::SegmentOutput;

use crate::fingerprint::{Fingerprint, canonical_form};
use crate::load::Overrides;
use crate::{Engine, StartOptions};

const PIPELINE: &str = r#"
[pipeline]
name = "share"
threads = 2

[checkpoint]
interval = "1h"
store = "file://./state"

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
sql = "SELECT k, SUM(v) AS total FROM events GROUP BY k"

[[view]]
name = "big"
sql = "SELECT k, v FROM events WHERE v > 1"

[[sink]]
name = "sums_file"
from = "sums"
connector = "file"
[sink.options]
path = "sums.jsonl"
"#;

/// Another sink named `name` reading `from`, writing a part per thread.
fn sink(name: &str, from: &str) -> String {
    format!(
        "\n[[sink]]\nname = \"{name}\"\nfrom = \"{from}\"\nconnector = \"file\"\n[sink.options]\npath = \"{name}/\"\n"
    )
}

fn pipeline(text: &str, dir: &Path) -> crate::Pipeline {
    std::fs::write(dir.join("events.jsonl"), "").expect("write");
    Engine::default().parse(text, "share.toml", dir, Overrides::default()).expect("valid")
}

#[test]
fn later_readers_of_a_view_tap_its_first_reader_and_keep_no_state_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let alone = pipeline(PIPELINE, dir.path()).compile(None).expect("compiles");
    let text = format!("{PIPELINE}{}", sink("sums_parts", "sums"));
    let shared = pipeline(&text, dir.path()).compile(None).expect("compiles");
    let (first, second) = (&shared.plan.flows[0], &shared.plan.flows[1]);
    // The first reader plans as it does alone: same segments, hence same operator ids.
    assert!(first.tap.is_none());
    let lines = |flow: &sluice_runtime::Flow| -> Vec<Vec<String>> {
        flow.segments.iter().map(|s| s.operators.iter().map(|(line, _)| line.clone()).collect()).collect()
    };
    assert_eq!(lines(first), lines(&alone.plan.flows[0]));
    // The second reads the aggregate's segment, forwarded, and computes nothing itself.
    let tap = second.tap.as_ref().expect("a tap");
    assert_eq!((tap.flow, tap.segment, tap.description.as_str()), (0, 1, super::FORWARD));
    assert_eq!(second.segments.len(), 1);
    assert!(second.segments[0].operators.is_empty() && second.segments[0].state.is_none());
    assert!(matches!(second.segments[0].output, SegmentOutput::Sink));
    let form = canonical_form(&pipeline(&text, dir.path()).config, &shared.plan).expect("form");
    assert!(form.ends_with("share flow 1 taps flow 0 segment 1\n"), "{form}");
}

#[test]
fn readers_of_a_stateless_view_or_of_different_views_compute_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!("{PIPELINE}{}{}{}", sink("big_a", "big"), sink("big_b", "big"), sink("raw", "events"));
    let compiled = pipeline(&text, dir.path()).compile(None).expect("compiles");
    assert!(compiled.plan.flows.iter().all(|flow| flow.tap.is_none()));
    let form = canonical_form(&pipeline(&text, dir.path()).config, &compiled.plan).expect("form");
    assert!(!form.contains("share "), "{form}");
}

#[test]
fn state_of_the_unshared_plan_is_refused_by_the_shared_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!("{PIPELINE}{}", sink("sums_parts", "sums"));
    let shared = pipeline(&text, dir.path());
    let compiled = shared.compile(None).expect("compiles");
    // The plan before sharing had the same form without its `share` line.
    let form = canonical_form(&shared.config, &compiled.plan).expect("form");
    let unshared = form.lines().filter(|line| !line.starts_with("share ")).map(|line| format!("{line}\n")).collect();
    let unshared = Fingerprint(sluice_types::key::hash(String::as_bytes(&unshared)));
    assert_ne!(unshared, compiled.fingerprint);
    let store = CheckpointStore::open("file://./state", dir.path()).expect("store");
    let lease = store.acquire_lease(Holder::this_process("an earlier build")).expect("lease");
    let mut manifest = Manifest::new(1, unshared.to_string(), 256, 0);
    manifest.encodings = crate::checkpointing::encodings();
    store.publish(&manifest).expect("publish");
    lease.release().expect("release");
    let error = crate::Job::start(&shared, StartOptions::default()).expect_err("refused");
    assert_eq!(error.code(), "checkpoint.fingerprint");
    let text = error.to_string();
    assert!(text.contains(&unshared.to_string()) && text.contains(&compiled.fingerprint.to_string()), "{text}");
    assert!(
        text.contains("which readers of a view share its computation") && text.contains("--from-scratch"),
        "{text}"
    );
}

#[test]
fn two_single_writers_share_at_the_aggregate_whatever_the_thread_count() {
    // On several threads both gather to thread 0 (a common segment more); on one they
    // do not gather. The cut is at the aggregate either way, so the fingerprint and the
    // ids agree and a checkpoint restores on another thread count.
    let dir = tempfile::tempdir().expect("tempdir");
    let again = "\n[[sink]]\nname = \"sums_again\"\nfrom = \"sums\"\nconnector = \"file\"\n[sink.options]\npath = \"again.jsonl\"\n";
    let text = format!("{PIPELINE}{again}");
    let on = |threads: u32| {
        let compiled = pipeline(&text.replace("threads = 2", &format!("threads = {threads}")), dir.path())
            .compile(None)
            .expect("compiles");
        let tap = compiled.plan.flows[1].tap.as_ref().expect("a tap");
        (compiled.fingerprint, tap.segment, tap.description.clone())
    };
    let (one, two, four) = (on(1), on(2), on(4));
    assert_eq!((one.0, one.1), (two.0, two.1), "one fingerprint, one cut, on 1 and 2 threads");
    assert_eq!(two, four);
    assert_eq!(one.1, 1, "the aggregate's segment");
    assert_eq!((one.2.as_str(), two.2.as_str()), (super::FORWARD, "gather → thread 0 (single-writer sink)"));
}
