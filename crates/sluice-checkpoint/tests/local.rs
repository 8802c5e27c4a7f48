//! The scenarios every backend runs (`tests/common/scenarios.rs`), on a local directory.

#[path = "common/scenarios.rs"]
mod scenarios;

use sluice_checkpoint::CheckpointStore;
use std::path::Path;

fn open(url: &str) -> CheckpointStore {
    CheckpointStore::open(url, Path::new("/")).expect("opens")
}

#[test]
fn checkpoints_round_trip_locally() {
    let root = tempfile::tempdir().expect("temp dir");
    scenarios::checkpoints_round_trip(&format!("file://{}", root.path().display()), open);
}

#[test]
fn one_run_at_a_time_holds_a_local_store() {
    let root = tempfile::tempdir().expect("temp dir");
    scenarios::lease_round_trip(&format!("file://{}", root.path().display()), open);
}
