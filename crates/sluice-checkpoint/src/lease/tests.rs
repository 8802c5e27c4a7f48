//! The lease: golden vectors of its encoding, the staleness rules, and fencing on a local
//! directory (the same scenario runs on every backend in `tests/`).

use super::*;
use crate::frame::tests::unhex;
use crate::manifest::Manifest;
use crate::store::tests::checkpoint;
use proptest::collection::vec;
use proptest::prelude::*;
use std::time::Duration;

/// A holder with every field known.
fn golden_holder() -> Holder {
    Holder {
        pipeline: "hot-items".into(),
        host: "node-1".into(),
        boot_id: "b0".into(),
        pid_namespace: "pid:[4026531836]".into(),
        pid: 4242,
        process_start_ticks: Some(987_654),
        run_id: "r-42".into(),
        acquired_ms: 1_700_000_000_000,
        refresh_interval_ms: 10_000,
        beats: 7,
    }
}

/// `holder` encodes to exactly `fields` (hex) and those bytes decode back to it. A failure
/// means the encoding changed: that needs a new lease format version, never a new vector.
fn check_golden(holder: &Holder, fields: &[&str]) {
    let expected = unhex(fields);
    let encoded = holder.encode();
    assert_eq!(encoded, expected, "encoding changed: got {}", encoded.escape_ascii());
    assert_eq!(Holder::decode(&expected).as_ref(), Ok(holder));
}

/// Format 1's bytes still decode, to a holder without a heartbeat.
fn check_golden_v1(holder: &Holder, fields: &[&str]) {
    let expected = Holder { refresh_interval_ms: 0, beats: 0, ..holder.clone() };
    assert_eq!(Holder::decode(&unhex(fields)).as_ref(), Ok(&expected));
}

#[test]
fn golden_vector_of_a_lease() {
    let fields = [
        "53 4c 55 49 43 45 4c 53",       // magic "SLUICELS"
        "02 00 00 00",                   // lease format version 2
        "09 68 6f 74 2d 69 74 65 6d 73", // pipeline "hot-items"
        "06 6e 6f 64 65 2d 31",          // host "node-1"
        "02 62 30",                      // boot_id "b0"
        "10 70 69 64 3a 5b 34 30",       // pid_namespace, 16 bytes: "pid:[40"
        "32 36 35 33 31 38 33 36 5d",    //   "26531836]"
        "92 21",                         // pid 4242
        "01 86 a4 3c",                   // process_start_ticks: some, 987654
        "04 72 2d 34 32",                // run_id "r-42"
        "80 a0 ab fe f9 62",             // acquired_ms 1_700_000_000_000, zigzag
        "90 4e",                         // refresh_interval_ms 10000
        "07",                            // beats 7
        "39 d5 93 6d",                   // CRC-32 of the body
    ];
    check_golden(&golden_holder(), &fields);
}

#[test]
fn golden_vector_of_a_format_1_lease() {
    let fields = [
        "53 4c 55 49 43 45 4c 53",       // magic "SLUICELS"
        "01 00 00 00",                   // lease format version 1
        "09 68 6f 74 2d 69 74 65 6d 73", // pipeline "hot-items"
        "06 6e 6f 64 65 2d 31",          // host "node-1"
        "02 62 30",                      // boot_id "b0"
        "10 70 69 64 3a 5b 34 30",       // pid_namespace, 16 bytes: "pid:[40"
        "32 36 35 33 31 38 33 36 5d",    //   "26531836]"
        "92 21",                         // pid 4242
        "01 86 a4 3c",                   // process_start_ticks: some, 987654
        "04 72 2d 34 32",                // run_id "r-42"
        "80 a0 ab fe f9 62",             // acquired_ms 1_700_000_000_000, zigzag
        "c6 8f 3f b8",                   // CRC-32 of the body
    ];
    check_golden_v1(&golden_holder(), &fields);
}

#[test]
fn golden_vector_of_a_lease_with_unknowns() {
    let holder = Holder {
        pipeline: "p".into(),
        host: String::new(),
        boot_id: String::new(),
        pid_namespace: String::new(),
        pid: 1,
        process_start_ticks: None,
        run_id: "r".into(),
        acquired_ms: -1,
        refresh_interval_ms: 0,
        beats: 0,
    };
    let fields = [
        "53 4c 55 49 43 45 4c 53 01 00 00 00", // frame
        "01 70",                               // pipeline "p"
        "00 00 00",                            // host, boot_id, pid_namespace: ""
        "01",                                  // pid 1
        "00",                                  // process_start_ticks: none
        "01 72",                               // run_id "r"
        "01",                                  // acquired_ms -1, zigzag
        "f8 a8 47 aa",                         // CRC-32 of the body
    ];
    check_golden_v1(&holder, &fields);
}

fn reframe(version: u32, body: &[u8]) -> Vec<u8> {
    frame::seal(LEASE_MAGIC, version, body)
}

#[test]
fn damaged_leases_are_refused_by_name() {
    let good = golden_holder().encode();
    let body = frame::encode_body(&golden_holder());
    let mut flipped = good.clone();
    flipped[20] ^= 0x01;
    let no_run_id = frame::encode_body(&Holder { run_id: String::new(), ..golden_holder() });
    // The body of the holder with unknowns, with its option tag (byte 5) replaced by 2.
    let bad_option = unhex(&["01 70 00 00 00 01 02 01 72 01"]);
    let overlong = unhex(&["01 70 00 00 00 81 00 00 01 72 01"]);
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("empty", vec![], "checkpoint.lease_damaged", "0 bytes"),
        ("a manifest", crate::manifest::encode(&Manifest::new(1, "", 1, 0)), "checkpoint.lease_damaged", "SLUICEMF"),
        ("version 3", reframe(3, &body), "checkpoint.lease_version", "version 3 is not supported"),
        ("flipped byte", flipped, "checkpoint.lease_damaged", "checksum mismatch"),
        ("cut", good[..good.len() - 1].to_vec(), "checkpoint.lease_damaged", "checksum mismatch"),
        ("trailing byte", reframe(2, &[&body[..], &[0]].concat()), "checkpoint.lease_damaged", "1 bytes follow"),
        ("a version 2 body as 1", reframe(1, &body), "checkpoint.lease_damaged", "3 bytes follow"),
        ("no run id", reframe(2, &no_run_id), "checkpoint.lease_damaged", "run id is empty"),
        ("option tag 2", reframe(1, &bad_option), "checkpoint.lease_damaged", "its body"),
        ("overlong pid", reframe(1, &overlong), "checkpoint.lease_damaged", "canonical"),
    ];
    for (name, bytes, code, needle) in cases {
        match Holder::decode(&bytes) {
            Ok(holder) => panic!("{name}: decoded {holder:?}"),
            Err(error) => {
                assert_eq!(error.code, code, "{name}: {error}");
                assert!(error.message.contains(needle), "{name}: {error}");
            }
        }
    }
}

/// A run moves its lease and its store handle to whichever thread ends it.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Lease>();
    send_and_sync::<CheckpointStore>();
};

#[test]
fn times_are_shown_in_utc() {
    let cases: [(i64, &str); 5] = [
        (0, "1970-01-01T00:00:00Z"),
        (-1, "1969-12-31T23:59:59Z"),
        (951_782_400_000, "2000-02-29T00:00:00Z"),
        (1_700_000_000_000, "2023-11-14T22:13:20Z"),
        (4_102_444_799_999, "2099-12-31T23:59:59Z"),
    ];
    for (ms, expected) in cases {
        assert_eq!(utc(ms), expected, "{ms}");
    }
}

/// Judging `held` from `golden_holder()`'s place, where pid 4242 is `probed`, gives a
/// verdict of kind `stale` whose reason contains `needle`.
fn check_verdict(held: Holder, probed: Probe, stale: bool, needle: &str) {
    let me = Holder { run_id: "me".into(), pid: 1, ..golden_holder() };
    let verdict = judge(&held, &me, |pid| if pid == 4242 { probed } else { Probe::Gone });
    let (is_stale, why) = match &verdict {
        Verdict::Stale(why) => (true, why),
        Verdict::Live(why) | Verdict::Unknown(why) => (false, why),
    };
    assert_eq!(is_stale, stale, "{held:?} with {probed:?}: {verdict:?}");
    assert!(why.contains(needle), "{held:?} with {probed:?}: {verdict:?} does not mention {needle:?}");
}

#[test]
fn only_a_lease_whose_holder_is_certainly_gone_is_stale() {
    let held = golden_holder();
    let running = Probe::Running { start_ticks: Some(987_654) };
    let other_start = Probe::Running { start_ticks: Some(5) };
    let host = |host: &str| Holder { host: host.into(), ..golden_holder() };
    check_verdict(held.clone(), running, false, "pid 4242 is still running");
    check_verdict(held.clone(), Probe::Gone, true, "pid 4242 is not running");
    check_verdict(held.clone(), other_start, true, "pid 4242 is now another process");
    check_verdict(held.clone(), Probe::Running { start_ticks: None }, false, "still running");
    let unknown_start = Holder { process_start_ticks: None, ..golden_holder() };
    check_verdict(unknown_start, other_start, false, "still running");
    check_verdict(held.clone(), Probe::Unknown, false, "cannot tell");
    check_verdict(host("node-2"), Probe::Gone, false, "another host");
    check_verdict(host(""), Probe::Gone, false, "another host");
    let rebooted = Holder { boot_id: "b1".into(), ..golden_holder() };
    check_verdict(rebooted, running, true, "host node-1 has restarted");
    let unknown_boot = Holder { boot_id: String::new(), ..golden_holder() };
    check_verdict(unknown_boot, Probe::Gone, true, "not running");
    let container = Holder { pid_namespace: "pid:[4026532000]".into(), ..golden_holder() };
    check_verdict(container, Probe::Gone, false, "another pid namespace");
}

/// A store under a fresh temporary directory, without a lease.
fn bare_store() -> (tempfile::TempDir, CheckpointStore) {
    let base = tempfile::tempdir().expect("temp dir");
    let store = CheckpointStore::open("file://./store", base.path()).expect("opens");
    (base, store)
}

#[test]
fn writing_without_the_lease_is_a_programming_error() {
    let (_base, store) = bare_store();
    let object = store.put_object(1, "agg/vnode-0", b"state".to_vec()).expect("objects need no lease");
    let mut manifest = Manifest::new(1, "fp", 8, 0);
    manifest.operators.push(crate::manifest::OperatorState {
        id: "agg".into(),
        runs: vec![crate::StateRun { start: 0, end: 1, object }],
    });
    let refusals = [
        ("publishing epoch 1", store.publish(&manifest).err()),
        ("collecting old checkpoints", store.collect_garbage(1).err()),
        ("clearing the store", store.clear().err()),
    ];
    for (action, error) in refusals {
        let error = error.unwrap_or_else(|| panic!("{action} succeeded without the lease"));
        assert_eq!(error.code, "checkpoint.lease_missing", "{error}");
        assert!(error.message.starts_with(action), "{error}");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("acquire_lease")), "{error}");
    }
    assert_eq!(store.epochs().expect("reading needs no lease"), Vec::<u64>::new());
}

#[test]
fn clear_keeps_the_lease_and_a_released_lease_can_be_taken_again() {
    let (base, store) = bare_store();
    let lease = store.acquire_lease(Holder::this_process("first")).expect("acquire");
    assert!(lease.warnings().is_empty());
    checkpoint(&store, 1, &["agg"]);
    store.clear().expect("clear");
    assert!(base.path().join("store/lease").is_file(), "clear removed the lease");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    checkpoint(&store, 2, &["agg"]);
    lease.release().expect("release");
    assert!(!base.path().join("store/lease").exists());
    let error = store.publish(&Manifest::new(3, "fp", 8, 0)).expect_err("released");
    assert_eq!(error.code, "checkpoint.lease_missing");
    let again = store.acquire_lease(Holder::this_process("second")).expect("acquire again");
    assert_eq!(again.holder().pipeline, "second");
}

#[test]
fn a_lost_answer_to_our_own_create_counts_as_acquired() {
    // The client retried a create whose first attempt had succeeded: the lease found is ours.
    let (base, store) = bare_store();
    let holder = Holder::this_process("retried");
    std::fs::create_dir_all(base.path().join("store")).expect("mkdir");
    std::fs::write(base.path().join("store/lease"), holder.encode()).expect("write");
    let lease = store.acquire_lease(holder.clone()).expect("ours");
    assert_eq!(lease.holder(), &holder);
    checkpoint(&store, 1, &["agg"]);
}

#[test]
fn an_unreadable_lease_is_refused_and_can_be_broken() {
    let (base, store) = bare_store();
    std::fs::create_dir_all(base.path().join("store")).expect("mkdir");
    std::fs::write(base.path().join("store/lease"), b"garbage").expect("write");
    let error = store.acquire_lease(Holder::this_process("p")).expect_err("unreadable");
    assert_eq!(error.code, "checkpoint.lease_damaged");
    assert!(error.message.contains("the lease is not readable"), "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("sluice checkpoints unlock --store")), "{error}");
    let broken = store.break_lease().expect("break");
    assert!(matches!(&broken, Some(BrokenLease::Unreadable(problem)) if problem.contains("garbage")), "{broken:?}");
    assert_eq!(store.break_lease().expect("nothing left"), None);
    store.acquire_lease(Holder::this_process("p")).expect("acquire");
}

/// Another handle on `store`'s directory, as another run (or process) opens it.
fn reopen(base: &tempfile::TempDir) -> CheckpointStore {
    CheckpointStore::open("file://./store", base.path()).expect("opens")
}

/// A pid namespace that is not this process's: another container on this host.
const ANOTHER_CONTAINER: &str = "pid:[4026599999]";

#[test]
fn a_lease_left_in_another_container_is_broken_once_nobody_refreshes_it() {
    // Kubernetes restarts a pod killed for its memory: the same host name, a new pid
    // namespace. The killed run's lease stays, and nobody refreshes it any more.
    let (base, killed) = bare_store();
    let left = Holder { pid_namespace: ANOTHER_CONTAINER.into(), ..Holder::this_process("hot-items") }
        .with_refresh_interval(Duration::from_millis(50));
    // The killed process refreshes nothing any more.
    killed.acquire_lease(left.clone()).expect("a free store").stop_heartbeat();
    let restarted = reopen(&base);
    let lease = restarted.acquire_lease(Holder::this_process("hot-items")).expect("the restart takes the store");
    let warnings = lease.warnings().join("\n");
    assert!(warnings.contains(&left.run_id) && warnings.contains("another pid namespace"), "{warnings}");
    assert!(warnings.contains("did not refresh it"), "{warnings}");
    checkpoint(&restarted, 1, &["agg"]);
    // Its heartbeat stopped long ago (expired), and its lease is gone (lost): refused.
    let fenced = killed.publish(&Manifest::new(2, "fp", 8, 0)).expect_err("the old run is fenced out");
    assert!(matches!(fenced.code, "checkpoint.lease_expired" | "checkpoint.lease_lost"), "{fenced}");
    lease.release().expect("release");
}

#[test]
fn a_lease_refreshed_in_another_container_is_live() {
    let (base, first) = bare_store();
    let alive = Holder { pid_namespace: ANOTHER_CONTAINER.into(), ..Holder::this_process("alive") }
        .with_refresh_interval(Duration::from_secs(2));
    let held = first.acquire_lease(alive).expect("a free store");
    let error = reopen(&base).acquire_lease(Holder::this_process("second")).expect_err("a live holder");
    assert_eq!(error.code, "checkpoint.store_leased", "{error}");
    assert!(error.message.contains("refreshed it while this run watched"), "{error}");
    held.release().expect("release");
}

#[test]
fn a_format_1_lease_in_another_container_is_refused_as_before() {
    let (base, store) = bare_store();
    let old = Holder { pid_namespace: ANOTHER_CONTAINER.into(), ..Holder::this_process("old") };
    let v1 = HolderV1 {
        pipeline: old.pipeline,
        host: old.host,
        boot_id: old.boot_id,
        pid_namespace: old.pid_namespace,
        pid: old.pid,
        process_start_ticks: old.process_start_ticks,
        run_id: old.run_id,
        acquired_ms: old.acquired_ms,
    };
    std::fs::create_dir_all(base.path().join("store")).expect("mkdir");
    std::fs::write(base.path().join("store/lease"), reframe(1, &frame::encode_body(&v1))).expect("write");
    let error = store.acquire_lease(Holder::this_process("new")).expect_err("no heartbeat to judge by");
    assert_eq!(error.code, "checkpoint.store_leased", "{error}");
    assert!(error.message.contains("no heartbeat"), "{error}");
}

#[test]
fn a_run_that_stopped_refreshing_its_lease_publishes_nothing() {
    let (_base, store) = bare_store();
    let interval = Duration::from_millis(20);
    let lease = store.acquire_lease(Holder::this_process("frozen").with_refresh_interval(interval)).expect("acquire");
    // Its heartbeat stops (as in a process frozen or starved): once more than
    // PUBLISH_INTERVALS intervals passed on its clock, it publishes and deletes nothing.
    lease.stop_heartbeat();
    std::thread::sleep(interval * (PUBLISH_INTERVALS + 1));
    let error = store.publish(&Manifest::new(2, "fp", 8, 0)).expect_err("expired");
    assert_eq!(error.code, "checkpoint.lease_expired", "{error}");
    assert!(error.message.contains("publishing epoch 2") && error.message.contains("last refreshed"), "{error}");
    assert_eq!(store.collect_garbage(1).expect_err("expired").code, "checkpoint.lease_expired");
}

#[test]
fn an_oversized_holder_is_refused_before_writing() {
    let (base, store) = bare_store();
    let holder = Holder { pipeline: "x".repeat(LEASE_BYTES_MAX as usize), ..Holder::this_process("") };
    let error = store.acquire_lease(holder).expect_err("too large");
    assert_eq!(error.code, "checkpoint.lease_holder");
    assert!(!base.path().join("store").exists());
}

fn holder() -> impl Strategy<Value = Holder> {
    let texts = (".{0,12}", ".{0,12}", ".{0,12}", ".{0,12}", ".{1,12}");
    (texts, any::<u32>(), any::<Option<u64>>(), any::<i64>(), any::<u64>(), any::<u64>()).prop_map(
        |((pipeline, host, boot_id, pid_namespace, run_id), pid, process_start_ticks, acquired_ms, interval, beats)| {
            Holder {
                pipeline,
                host,
                boot_id,
                pid_namespace,
                pid,
                process_start_ticks,
                run_id,
                acquired_ms,
                refresh_interval_ms: interval,
                beats,
            }
        },
    )
}

proptest! {
    #[test]
    fn random_holders_round_trip(holder in holder()) {
        prop_assert_eq!(Holder::decode(&holder.encode()), Ok(holder));
    }

    #[test]
    fn random_lease_bodies_never_panic(body in vec(any::<u8>(), 0..64)) {
        if let Ok(holder) = Holder::decode(&reframe(LEASE_FORMAT_VERSION, &body)) {
            prop_assert_eq!(holder.encode(), reframe(LEASE_FORMAT_VERSION, &body));
        }
        if let Ok(holder) = Holder::decode(&reframe(1, &body)) {
            prop_assert_eq!((holder.refresh_interval_ms, holder.beats), (0, 0));
        }
    }

    #[test]
    fn any_single_byte_change_or_truncation_of_a_lease_is_refused(
        holder in holder(), index in any::<prop::sample::Index>(), xor in 1u8..=255, cut in any::<bool>(),
    ) {
        let good = holder.encode();
        let position = index.index(good.len());
        let damaged = if cut {
            good[..position].to_vec()
        } else {
            let mut damaged = good.clone();
            damaged[position] ^= xor;
            damaged
        };
        prop_assert!(Holder::decode(&damaged).is_err());
    }
}
