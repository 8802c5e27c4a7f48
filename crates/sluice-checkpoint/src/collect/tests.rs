//! Retention on a local directory: exactly the unreferenced objects and old manifests go.

use crate::manifest::{Manifest, OperatorState, SinkRecord, SinkRecords, StateRun};
use crate::store::tests::{checkpoint, file, temp_store};
use std::collections::BTreeMap;
use std::path::Path;

/// Every file under `dir` (relative, `/`-separated) with its size.
fn files(dir: &Path) -> BTreeMap<String, u64> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("below").to_string_lossy().replace('\\', "/");
                found.insert(relative, entry.metadata().expect("metadata").len());
            }
        }
    }
    found
}

const fn manifest(epoch: u64) -> &'static str {
    match epoch {
        1 => "manifests/epoch-00000000000000000001.manifest",
        2 => "manifests/epoch-00000000000000000002.manifest",
        3 => "manifests/epoch-00000000000000000003.manifest",
        4 => "manifests/epoch-00000000000000000004.manifest",
        _ => "manifests/epoch-00000000000000000005.manifest",
    }
}

#[test]
fn retention_deletes_exactly_what_no_kept_manifest_needs() {
    let (base, store) = temp_store();
    for epoch in 1..=3 {
        checkpoint(&store, epoch, &["agg", "join"]);
    }
    // Epoch 4 reuses epoch 2's unchanged `join` state (incremental checkpoint).
    let reused = store.load(2).expect("load").operators[1].clone();
    let object = store.put_object(4, "agg/vnode-0", b"agg at 4".to_vec()).expect("put");
    let mut fourth = Manifest::new(4, "fp", 8, 0);
    fourth.operators =
        vec![OperatorState { id: "agg".into(), runs: vec![StateRun { start: 0, end: 1, object }] }, reused];
    // A sink record too large for the manifest, in an object it names.
    let record = store.put_object(4, "sinks/out/record-0", b"a large record".to_vec()).expect("put");
    fourth.sinks = vec![SinkRecords { name: "out".into(), records: vec![SinkRecord::Stored(record)] }];
    store.publish(&fourth).expect("publish");
    // An abandoned checkpoint 5 (objects, a staged manifest) and files that are not ours.
    store.put_object(5, "agg/vnode-0", b"abandoned".to_vec()).expect("put");
    std::fs::write(file(&base, "manifests/epoch-00000000000000000005.tmp"), b"staged").expect("write");
    std::fs::write(file(&base, "state/README"), b"not ours").expect("write");
    std::fs::write(file(&base, "manifests/notes"), b"not ours").expect("write");

    let before = files(&base.path().join("store"));
    let deleted = store.collect_garbage(2).expect("collect");
    let after = files(&base.path().join("store"));
    let expected: Vec<&str> = vec![
        "lease",
        "manifests/epoch-00000000000000000003.manifest",
        "manifests/epoch-00000000000000000004.manifest",
        "manifests/notes",
        "state/README",
        "state/epoch-2/join/vnode-1",
        "state/epoch-3/agg/vnode-0",
        "state/epoch-3/join/vnode-1",
        "state/epoch-4/agg/vnode-0",
        "state/epoch-4/sinks/out/record-0",
    ];
    assert_eq!(after.keys().map(String::as_str).collect::<Vec<_>>(), expected);
    let gone: u64 = before.iter().filter(|(path, _)| !after.contains_key(*path)).map(|(_, size)| size).sum();
    assert_eq!(deleted, gone);
    assert!(!file(&base, "state/epoch-1").exists(), "empty epoch directories are removed");
    assert!(!file(&base, "state/epoch-5").exists());
    assert_eq!(store.epochs().expect("epochs"), vec![3, 4]);
    let (latest, warnings) = store.latest_valid().expect("latest").expect("some");
    assert_eq!((latest.epoch, warnings.len()), (4, 0));
    assert_eq!(store.collect_garbage(2).expect("collect again"), 0);
}

#[test]
fn a_damaged_newest_checkpoint_never_costs_the_healthy_one() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    checkpoint(&store, 2, &["agg"]);
    std::fs::remove_file(file(&base, "state/epoch-2/agg/vnode-0")).expect("damage 2");
    std::fs::write(file(&base, "state/epoch-2/other"), b"x").expect("write");
    store.collect_garbage(1).expect("collect");
    let kept = files(&base.path().join("store"));
    let expected = vec!["lease", manifest(1), manifest(2), "state/epoch-1/agg/vnode-0", "state/epoch-2/other"];
    assert_eq!(kept.keys().map(String::as_str).collect::<Vec<_>>(), expected);
    // Once a newer healthy checkpoint exists, the damaged one is collected.
    checkpoint(&store, 3, &["agg"]);
    store.collect_garbage(1).expect("collect");
    let kept = files(&base.path().join("store"));
    let expected = vec!["lease", manifest(3), "state/epoch-3/agg/vnode-0"];
    assert_eq!(kept.keys().map(String::as_str).collect::<Vec<_>>(), expected);
}

#[test]
fn without_a_healthy_checkpoint_only_abandoned_work_is_collected() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    std::fs::write(file(&base, manifest(1)), b"garbage").expect("damage 1");
    store.put_object(2, "agg/vnode-0", b"abandoned".to_vec()).expect("put");
    store.collect_garbage(3).expect("collect");
    let kept = files(&base.path().join("store"));
    let expected = vec!["lease", manifest(1), "state/epoch-1/agg/vnode-0"];
    assert_eq!(kept.keys().map(String::as_str).collect::<Vec<_>>(), expected);
}

#[test]
fn a_store_without_manifests_collects_every_object() {
    let (base, store) = temp_store();
    assert_eq!(store.collect_garbage(1).expect("collect an empty store"), 0);
    store.put_object(1, "agg/vnode-0", b"abc".to_vec()).expect("put");
    assert_eq!(store.collect_garbage(1).expect("collect"), 3);
    assert_eq!(files(&base.path().join("store")).into_keys().collect::<Vec<_>>(), vec!["lease"]);
}

#[test]
fn retaining_nothing_is_refused() {
    let (_base, store) = temp_store();
    assert_eq!(store.collect_garbage(0).err().map(|e| e.code), Some("checkpoint.retain"));
}

/// `clear` keeps the lease: the run that cleared the store (for --from-scratch) goes on
/// holding it.
#[test]
fn clear_deletes_the_store_and_nothing_else() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg", "join"]);
    store.put_object(2, "x", b"y".to_vec()).expect("put");
    std::fs::write(base.path().join("store/pipeline.toml"), b"not ours").expect("write");
    store.clear().expect("clear");
    let left = files(&base.path().join("store"));
    assert_eq!(left.keys().map(String::as_str).collect::<Vec<_>>(), vec!["lease", "pipeline.toml"]);
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    assert_eq!(store.latest_valid().expect("latest"), None);
}

/// Incremental checkpoints name runs that earlier epochs wrote; over any sequence of
/// checkpoints (deltas, full snapshots, compactions), failed checkpoints, collections
/// with any retention, and restarts (the lists reloaded from the newest manifest, as a
/// restore does), every manifest a collection keeps names only objects that exist, and
/// the newest one always verifies.
mod retention_of_runs {
    use proptest::prelude::*;

    use crate::CheckpointStore;
    use crate::manifest::{Manifest, ObjectRef, OperatorState, StateRun};
    use crate::store::tests::temp_store;

    /// What happens next.
    #[derive(Debug, Clone)]
    enum Step {
        /// A checkpoint: for each of two operators, a delta run, a full run, a merge of
        /// its runs into one, or nothing.
        Checkpoint([u8; 2]),
        /// A checkpoint whose runs are written but whose manifest is never published.
        Failed([u8; 2]),
        Collect {
            retain: usize,
        },
        /// The process restarts: the lists are the newest valid manifest's.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => any::<[u8; 2]>().prop_map(Step::Checkpoint),
            1 => any::<[u8; 2]>().prop_map(Step::Failed),
            2 => (1usize..4).prop_map(|retain| Step::Collect { retain }),
            1 => Just(Step::Restart),
        ]
    }

    /// The runs of each operator, oldest first, as a checkpointer keeps them.
    type Lists = [Vec<ObjectRef>; 2];

    /// The lists after one checkpoint of `epoch` writing its runs (`choices` per operator).
    fn next_lists(store: &CheckpointStore, epoch: u64, lists: &Lists, choices: [u8; 2]) -> Lists {
        let mut next = lists.clone();
        for (operator, (list, choice)) in next.iter_mut().zip(choices).enumerate() {
            let write = |name: &str| {
                let bytes = format!("{name} of operator {operator} at {epoch}").into_bytes();
                store.put_object(epoch, &format!("op{operator}/{name}"), bytes).expect("put")
            };
            match choice % 4 {
                0 => list.push(write("run")),
                1 => *list = vec![write("full")],
                2 if !list.is_empty() => *list = vec![write("merged")],
                _ => {}
            }
        }
        next
    }

    fn manifest(epoch: u64, lists: &Lists) -> Manifest {
        let mut manifest = Manifest::new(epoch, "fp", 4, 0);
        for (operator, list) in lists.iter().enumerate() {
            let runs = list.iter().map(|object| StateRun { start: 0, end: 4, object: object.clone() }).collect();
            manifest.operators.push(OperatorState { id: format!("op{operator}"), runs });
        }
        manifest
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn collection_never_deletes_what_a_kept_manifest_names(steps in proptest::collection::vec(step(), 1..24)) {
            let (_base, store) = temp_store();
            let mut lists: Lists = Default::default();
            let mut epoch = 0;
            for step in steps {
                match step {
                    Step::Checkpoint(choices) => {
                        epoch += 1;
                        lists = next_lists(&store, epoch, &lists, choices);
                        store.publish(&manifest(epoch, &lists)).expect("publish");
                    }
                    Step::Failed(choices) => {
                        epoch += 1;
                        next_lists(&store, epoch, &lists, choices);
                    }
                    Step::Collect { retain } => {
                        store.collect_garbage(retain).expect("collect");
                        // The newest `retain` manifests are whole.
                        let epochs = store.epochs().expect("epochs");
                        for kept in epochs.iter().rev().take(retain) {
                            let kept = store.load(*kept).expect("a kept manifest loads");
                            prop_assert_eq!(store.verify(&kept).expect("verify"), Vec::<String>::new());
                        }
                    }
                    Step::Restart => {
                        lists = match store.latest_valid().expect("a readable store") {
                            Some((newest, _)) => {
                                let runs = |operator: usize| {
                                    newest.operators[operator].runs.iter().map(|run| run.object.clone()).collect()
                                };
                                [runs(0), runs(1)]
                            }
                            None => Default::default(),
                        };
                        // A restarted run's epochs go above every epoch written.
                        epoch = epoch.max(store.epochs().expect("epochs").last().copied().unwrap_or(0));
                    }
                }
            }
            if let Some((newest, warnings)) = store.latest_valid().expect("a readable store") {
                prop_assert!(warnings.is_empty(), "{:?}", warnings);
                prop_assert_eq!(store.verify(&newest).expect("verify"), Vec::<String>::new());
            }
        }
    }
}
