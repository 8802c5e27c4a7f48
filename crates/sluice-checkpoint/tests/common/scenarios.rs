//! The scenarios every backend must pass: the checkpoint protocol and the lease. Each takes
//! the root of an existing bucket or container (or a local directory) and a way to open a
//! store handle on a URL below it.

use sluice_checkpoint::{
    BrokenLease, CheckpointStore, Holder, Manifest, OperatorState, SinkRecord, SinkRecords, SourcePositions, StateRun,
};

/// Writes three state objects for `epoch` and returns the manifest naming them.
fn stage(store: &CheckpointStore, epoch: u64) -> Manifest {
    let mut manifest = Manifest::new(epoch, "fingerprint", 4, 0);
    manifest.operators.push(OperatorState { id: "agg".into(), runs: Vec::new() });
    for vnode in 0..3u32 {
        let bytes = format!("epoch {epoch} vnode {vnode}").into_bytes();
        let object = store.put_object(epoch, &format!("agg/vnode-{vnode}"), bytes).expect("put");
        manifest.operators[0].runs.push(StateRun { start: vnode, end: vnode + 1, object });
    }
    manifest.encodings.insert("key".into(), 1);
    let (layout, lanes) = (b"bids.csv".to_vec(), vec![epoch.to_le_bytes().to_vec()]);
    manifest.sources.push(SourcePositions { name: "bids".into(), layout, lanes });
    manifest.sinks.push(SinkRecords { name: "out".into(), records: vec![SinkRecord::Inline(b"txn".to_vec())] });
    manifest
}

/// Writes three state objects for `epoch` and publishes their manifest.
fn checkpoint(store: &CheckpointStore, epoch: u64) -> Manifest {
    let manifest = stage(store, epoch);
    store.publish(&manifest).expect("publish");
    manifest
}

/// The checkpoint protocol against the store in the existing bucket or container `root`
/// (e.g. `s3://checkpoints`), each handle opened by `open(url)`: publishing, listing,
/// create-only manifests, verification, fallback past damage, retention, separate prefixes.
pub fn checkpoints_round_trip(root: &str, open: impl Fn(&str) -> CheckpointStore) {
    let url = format!("{root}/pipelines/hot-items");
    let store = open(&url);
    let lease = store.acquire_lease(Holder::this_process("hot-items")).expect("lease");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    assert_eq!(store.latest_valid().expect("latest"), None);

    let manifests: Vec<Manifest> = (1..=3).map(|epoch| checkpoint(&store, epoch)).collect();
    assert_eq!(store.epochs().expect("epochs"), vec![1, 2, 3]);
    for manifest in &manifests {
        assert_eq!(&store.load(manifest.epoch).expect("load"), manifest);
        assert_eq!(store.verify(manifest).expect("verify"), Vec::<String>::new());
    }

    // Publishing is create-only: the same manifest again is harmless, a different one is refused.
    store.publish(&manifests[2]).expect("republish");
    let different = Manifest { fingerprint: "other".into(), ..manifests[2].clone() };
    assert_eq!(store.publish(&different).err().map(|e| e.code), Some("checkpoint.manifest_exists"));
    assert_eq!(&store.load(3).expect("load"), &manifests[2], "the refused manifest replaced the published one");

    // Damage epoch 3 through a second handle that has not seen it published yet.
    let other = open(&url);
    other.put_object(3, "agg/vnode-1", b"overwritten".to_vec()).expect("overwrite");
    let problems = store.verify(&manifests[2]).expect("verify");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("state/epoch-3/agg/vnode-1"), "{problems:?}");
    let (latest, warnings) = store.latest_valid().expect("latest").expect("some");
    assert_eq!(latest, manifests[1]);
    assert!(warnings.len() == 1 && warnings[0].contains("epoch 3"), "{warnings:?}");

    // Retention keeps epoch 2 (healthy), leaves damaged epoch 3 for inspection, drops epoch 1.
    let deleted = store.collect_garbage(1).expect("collect");
    assert!(deleted > 0);
    assert_eq!(store.epochs().expect("epochs"), vec![2, 3]);
    let old = &manifests[0].operators[0].runs[0].object;
    assert_eq!(store.get_object(old).err().map(|e| e.code), Some("checkpoint.object_missing"));
    assert_eq!(store.verify(&manifests[1]).expect("verify"), Vec::<String>::new());
    let fourth = checkpoint(&store, 4);
    store.collect_garbage(1).expect("collect");
    assert_eq!(store.epochs().expect("epochs"), vec![4]);
    assert_eq!(store.latest_valid().expect("latest").map(|(m, w)| (m, w.len())), Some((fourth, 0)));

    // Another prefix in the same bucket is a separate store.
    let neighbour = open(&format!("{root}/pipelines/other"));
    assert_eq!(neighbour.epochs().expect("epochs"), Vec::<u64>::new());
    store.clear().expect("clear");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    lease.release().expect("release");
}

/// `error` has `code`, and its message contains every one of `needles`.
fn check_error(error: Option<sluice_types::SluiceError>, code: &str, needles: &[&str]) {
    let error = error.unwrap_or_else(|| panic!("succeeded, expected {code}"));
    assert_eq!(error.code, code, "{error}");
    for needle in needles {
        assert!(error.message.contains(needle), "{error} does not mention {needle:?}");
    }
}

/// The lease against the store in `root` (see `checkpoints_round_trip`): a second run is
/// refused, naming the holder; unlock breaks the lease, after which the first run can
/// neither publish nor collect nor release; a lease left by a run of this host that is gone
/// is broken as stale.
pub fn lease_round_trip(root: &str, open: impl Fn(&str) -> CheckpointStore) {
    let url = format!("{root}/pipelines/leased");
    let first = open(&url);
    let first_lease = first.acquire_lease(Holder::this_process("first")).expect("acquire a free store");
    assert!(first_lease.warnings().is_empty());
    checkpoint(&first, 1);

    // A second run is refused: the message names the holder, the fix how to unlock.
    let second = open(&url);
    let holder = first_lease.holder().clone();
    let pid = format!("pid {}", holder.pid);
    let needles = ["pipeline \"first\"", &format!("host {}", holder.host), &pid, "since", "is still running"];
    let refused = second.acquire_lease(Holder::this_process("second")).err();
    let fix = refused.as_ref().and_then(|error| error.fix.clone()).unwrap_or_default();
    check_error(refused, "checkpoint.store_leased", &needles);
    assert!(fix.contains(&format!("`sluice checkpoints unlock --store {}`", second.url())), "{fix}");

    // Unlock, and the second run takes the store: the first is fenced out.
    assert_eq!(second.break_lease().expect("unlock"), Some(BrokenLease::Held(holder)));
    let second_lease = second.acquire_lease(Holder::this_process("second")).expect("acquire after unlock");
    let staged = stage(&first, 2);
    let lost = ["publishing epoch 2", "pipeline \"first\"", "held by pipeline \"second\""];
    check_error(first.publish(&staged).err(), "checkpoint.lease_lost", &lost);
    assert_eq!(first.epochs().expect("epochs"), vec![1], "a fenced-out run published");
    check_error(first.collect_garbage(1).err(), "checkpoint.lease_lost", &["collecting old checkpoints"]);
    check_error(first_lease.release().err(), "checkpoint.lease_lost", &["releasing the lease"]);
    checkpoint(&second, 2);
    second_lease.release().expect("release");
    assert_eq!(second.break_lease().expect("nothing to unlock"), None);

    stale_leases_are_broken(&open, &url);
    let cleaner = open(&url);
    let lease = cleaner.acquire_lease(Holder::this_process("cleaner")).expect("acquire");
    cleaner.clear().expect("clear");
    lease.release().expect("release");
}

/// Leases of runs of this host that are gone are broken with a warning naming them. Only
/// where `/proc` tells whether a pid runs.
#[cfg(target_os = "linux")]
fn stale_leases_are_broken(open: &impl Fn(&str) -> CheckpointStore, url: &str) {
    let this = Holder::this_process("this");
    let stale = [
        // Above every Linux pid_max (at most 2^22): never a running process.
        (Holder { pid: u32::MAX, ..Holder::this_process("crashed") }, "pid 4294967295 is not running"),
        // This process's pid with another start time: the pid was reused.
        (
            Holder {
                process_start_ticks: this.process_start_ticks.map(|ticks| ticks + 1),
                ..Holder::this_process("reused")
            },
            "is now another process",
        ),
    ];
    for (gone, why) in stale {
        let crashed = open(url);
        crashed.acquire_lease(gone.clone()).expect("a free store");
        let next = open(url);
        let lease = next.acquire_lease(Holder::this_process("next")).expect("breaks the stale lease");
        assert_eq!(lease.warnings().len(), 1, "{:?}", lease.warnings());
        let warning = &lease.warnings()[0];
        assert!(warning.contains(&format!("pipeline {:?}", gone.pipeline)) && warning.contains(why), "{warning}");
        let staged = stage(&crashed, 9);
        check_error(crashed.publish(&staged).err(), "checkpoint.lease_lost", &["held by pipeline \"next\""]);
        lease.release().expect("release");
    }
}

#[cfg(not(target_os = "linux"))]
fn stale_leases_are_broken(_open: &impl Fn(&str) -> CheckpointStore, _url: &str) {}
