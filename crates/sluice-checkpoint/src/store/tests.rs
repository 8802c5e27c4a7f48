//! The store on a local directory: writing, publishing, reading back, damage and fallback.

use super::*;
use crate::lease::Holder;
use crate::manifest::{OperatorState, StateRun};
use std::path::PathBuf;

/// A store at `file://./store` under a fresh temporary base directory, holding the lease
/// (the handle keeps it after the returned `Lease` is dropped).
pub(crate) fn temp_store() -> (tempfile::TempDir, CheckpointStore) {
    let base = tempfile::tempdir().expect("temp dir");
    let store = CheckpointStore::open("file://./store", base.path()).expect("opens");
    store.acquire_lease(Holder::this_process("test")).expect("lease");
    (base, store)
}

/// The file behind a path relative to the store root.
pub(crate) fn file(base: &tempfile::TempDir, relative: &str) -> PathBuf {
    base.path().join("store").join(relative)
}

/// Writes one object per operator name and publishes a manifest naming them.
pub(crate) fn checkpoint(store: &CheckpointStore, epoch: u64, operators: &[&str]) -> Manifest {
    let mut manifest = Manifest::new(epoch, "fp", 8, 1_000 + epoch as i64);
    for (vnode, id) in operators.iter().enumerate() {
        let bytes = format!("state of {id} at epoch {epoch}").into_bytes();
        let object = store.put_object(epoch, &format!("{id}/vnode-{vnode}"), bytes).expect("put");
        let (start, end) = (vnode as u32, vnode as u32 + 1);
        manifest.operators.push(OperatorState { id: id.to_string(), runs: vec![StateRun { start, end, object }] });
    }
    store.publish(&manifest).expect("publish");
    manifest
}

fn error_code<T: std::fmt::Debug>(result: Result<T, SluiceError>) -> &'static str {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error.code,
    }
}

fn error_kind<T: std::fmt::Debug>(result: Result<T, SluiceError>) -> (&'static str, ErrorKind) {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => (error.code, error.kind),
    }
}

#[test]
fn objects_round_trip_and_carry_size_and_checksum() {
    let (_base, store) = temp_store();
    let object = store.put_object(3, "agg/vnode-7", b"hello".to_vec()).expect("put");
    assert_eq!(
        object,
        ObjectRef { path: "state/epoch-3/agg/vnode-7".into(), offset: 0, size: 5, checksum: crc32fast::hash(b"hello") }
    );
    assert_eq!(store.get_object(&object).expect("get"), b"hello");
    let empty = store.put_object(3, "empty", Vec::new()).expect("put");
    assert_eq!(store.get_object(&empty).expect("get"), b"");
}

/// A file of `bytes` in `dir`, and its CRC-32.
fn local_file(dir: &Path, bytes: &[u8]) -> (PathBuf, u32) {
    let path = dir.join("run.sst");
    std::fs::write(&path, bytes).expect("local file written");
    (path, crc32fast::hash(bytes))
}

#[test]
fn a_local_file_becomes_an_object_by_a_link_and_outlives_its_removal() {
    use std::os::unix::fs::MetadataExt;
    let (base, store) = temp_store();
    let bytes: Vec<u8> = (0..3 * CHUNK_BYTES as u32 / 2).map(|i| (i % 251) as u8).collect();
    let (path, checksum) = local_file(base.path(), &bytes);
    let object = store.put_file(4, "join/run-0-8", &path, checksum).expect("put");
    assert_eq!(object.size, bytes.len() as u64);
    assert_eq!(std::fs::metadata(&path).expect("still there").nlink(), 2, "linked, not copied");
    std::fs::remove_file(&path).expect("the local file goes");
    assert_eq!(store.read_within(&object, 0, object.size).expect("read"), bytes);
    // Written again (a retried upload of an unpublished epoch): the object is replaced.
    let (path, checksum) = local_file(base.path(), b"again");
    let object = store.put_file(4, "join/run-0-8", &path, checksum).expect("put again");
    assert_eq!(store.get_object(&object).expect("get"), b"again");
}

/// A local store reads a part of an object from its file; a missing or truncated one is
/// refused as damaged, as through `object_store`.
#[test]
fn a_local_read_within_an_object_names_a_missing_or_truncated_file() {
    let (base, store) = temp_store();
    let bytes: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let (path, checksum) = local_file(base.path(), &bytes);
    let object = store.put_file(4, "join/run-0-8", &path, checksum).expect("put");
    assert_eq!(store.read_within(&object, 100, 50).expect("read"), &bytes[100..150]);
    let stored = file(&base, "state/epoch-4/join/run-0-8");
    std::fs::remove_file(&path).expect("the local file goes");
    std::fs::write(&stored, &bytes[..120]).expect("truncated");
    let error = store.read_within(&object, 100, 50).expect_err("truncated");
    assert_eq!((error.code, error.kind), ("checkpoint.object_truncated", ErrorKind::DamagedObject));
    assert!(error.message.contains("120 bytes, expected at least 150"), "{}", error.message);
    std::fs::remove_file(&stored).expect("removed");
    let error = store.read_within(&object, 0, 10).expect_err("missing");
    assert_eq!((error.code, error.kind), ("checkpoint.object_missing", ErrorKind::DamagedObject));
}

/// A run file made anonymous (`O_TMPFILE`, as the engine writes runs) is linked into the
/// store through `/proc/self/fd/N` and outlives its handle.
#[test]
fn an_anonymous_local_file_is_linked_through_its_descriptor() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let (base, store) = temp_store();
    let mut anonymous = tempfile::tempfile_in(base.path()).expect("an anonymous file");
    anonymous.write_all(b"anonymous run").expect("written");
    let path = PathBuf::from(format!("/proc/self/fd/{}", anonymous.as_raw_fd()));
    let object = store.put_file(5, "join/run-0-8", &path, crc32fast::hash(b"anonymous run")).expect("put");
    let stored = std::fs::metadata(file(&base, "state/epoch-5/join/run-0-8")).expect("stored");
    assert_eq!(anonymous.metadata().expect("its metadata").ino(), stored.ino(), "linked, not copied");
    drop(anonymous);
    assert_eq!(store.get_object(&object).expect("get"), b"anonymous run");
    let names: Vec<_> = std::fs::read_dir(base.path()).expect("listed").flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["store"], "nothing else is left in the directory: {names:?}");
}

#[test]
fn a_local_file_on_another_file_system_is_copied() {
    use std::os::unix::fs::MetadataExt;
    let (_base, store) = temp_store();
    // /dev/shm is a tmpfs where there is one; elsewhere the file is linked, and the object
    // reads back the same.
    let other = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("a directory");
    let (path, checksum) = local_file(other.path(), b"state bytes");
    let object = store.put_file(2, "agg/run-0-4", &path, checksum).expect("put");
    std::fs::write(&path, b"changed after").expect("the local file is rewritten");
    if other.path().starts_with("/dev/shm") {
        assert_eq!(std::fs::metadata(&path).expect("there").nlink(), 1, "copied");
        assert_eq!(store.get_object(&object).expect("get"), b"state bytes");
    }
}

#[test]
fn a_local_file_changed_since_its_writer_wrote_it_is_refused_and_not_stored() {
    let (base, store) = temp_store();
    let (path, checksum) = local_file(base.path(), b"what the writer wrote");
    std::fs::write(&path, b"what the disk holds now").expect("changed");
    let error = store.put_file(3, "agg/run-0-4", &path, checksum).expect_err("refused");
    assert_eq!(error.code, "checkpoint.local_changed");
    assert!(!file(&base, "state/epoch-3/agg/run-0-4").exists());
}

/// An object larger than a read's piece, in a local store, is read from its file into
/// one buffer: its damage is named as an object store's would be.
#[test]
fn a_large_local_object_is_verified_and_its_damage_named() {
    let (base, store) = temp_store();
    let bytes: Vec<u8> = (0..CHUNK_BYTES as u32 + 4096).map(|i| (i % 253) as u8).collect();
    let (path, checksum) = local_file(base.path(), &bytes);
    let object = store.put_file(2, "join/run-0-8", &path, checksum).expect("put");
    std::fs::remove_file(&path).expect("the local file goes");
    let mut manifest = Manifest::new(2, "fp", 8, 1_002);
    manifest
        .operators
        .push(OperatorState { id: "join".into(), runs: vec![StateRun { start: 0, end: 8, object: object.clone() }] });
    assert_eq!(store.verify(&manifest).expect("verified"), Vec::<String>::new());
    let stored = file(&base, "state/epoch-2/join/run-0-8");
    let damages: [(&dyn Fn(), &str); 3] = [
        (
            &|| {
                let mut flipped = bytes.clone();
                flipped[CHUNK_BYTES + 7] ^= 1;
                std::fs::write(&stored, flipped).expect("flipped");
            },
            "checksum mismatch",
        ),
        (&|| std::fs::write(&stored, &bytes[..CHUNK_BYTES]).expect("truncated"), "truncated"),
        (&|| std::fs::remove_file(&stored).expect("removed"), "missing"),
    ];
    for (damage, expected) in damages {
        damage();
        let problems = store.verify(&manifest).expect("verify");
        assert_eq!(problems.len(), 1, "{expected}: {problems:?}");
        assert!(problems[0].contains(expected) && problems[0].contains("join/run-0-8"), "{problems:?}");
    }
}

#[test]
fn opening_creates_nothing_and_an_empty_store_has_no_checkpoint() {
    let base = tempfile::tempdir().expect("temp dir");
    let store = CheckpointStore::open("file://./store", base.path()).expect("opens");
    assert!(!base.path().join("store").exists());
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    assert_eq!(store.latest_valid().expect("latest"), None);
    assert!(!base.path().join("store").exists());
    assert_eq!(store.url(), format!("file://{}/store", base.path().display()));
}

#[test]
fn published_manifests_are_listed_in_order_and_load_back() {
    let (base, store) = temp_store();
    let manifests: Vec<Manifest> = [2, 9, 10].iter().map(|e| checkpoint(&store, *e, &["agg", "join"])).collect();
    assert_eq!(store.epochs().expect("epochs"), vec![2, 9, 10]);
    for manifest in &manifests {
        assert_eq!(&store.load(manifest.epoch).expect("load"), manifest);
        assert_eq!(store.verify(manifest).expect("verify"), Vec::<String>::new());
    }
    assert!(file(&base, "manifests/epoch-00000000000000000002.manifest").is_file());
    assert!(!file(&base, "manifests/epoch-00000000000000000002.tmp").exists());
    let (latest, warnings) = store.latest_valid().expect("latest").expect("some");
    assert_eq!((latest.epoch, warnings.len()), (10, 0));
    let expected_size: u64 = latest.objects().map(|object| object.size).sum();
    assert_eq!(store.size(&latest), expected_size);
}

#[test]
fn leftover_staged_manifests_are_ignored() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    std::fs::write(file(&base, "manifests/epoch-00000000000000000002.tmp"), b"half").expect("write");
    std::fs::write(file(&base, "manifests/notes.txt"), b"mine").expect("write");
    assert_eq!(store.epochs().expect("epochs"), vec![1]);
    assert_eq!(store.latest_valid().expect("latest").map(|(m, w)| (m.epoch, w)), Some((1, vec![])));
}

/// How a test damages the newest checkpoint.
#[derive(Debug, Clone, Copy)]
enum Damage {
    FlipObjectByte,
    TruncateObject,
    RemoveObject,
    TruncateManifest,
    GarbageManifest,
}

/// Damages checkpoint 2 of {1, 2}: `verify`/`load` name the problem, `latest_valid` falls
/// back to epoch 1 with a warning naming epoch 2 and `expected`.
fn check_damage(damage: Damage, expected: &str) {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    let newest = checkpoint(&store, 2, &["agg"]);
    let object = file(&base, "state/epoch-2/agg/vnode-0");
    let manifest = file(&base, "manifests/epoch-00000000000000000002.manifest");
    let mut object_bytes = std::fs::read(&object).expect("read");
    let manifest_bytes = std::fs::read(&manifest).expect("read");
    match damage {
        Damage::FlipObjectByte => {
            object_bytes[4] ^= 0x20;
            std::fs::write(&object, object_bytes).expect("write");
        }
        Damage::TruncateObject => std::fs::write(&object, &object_bytes[..3]).expect("write"),
        Damage::RemoveObject => std::fs::remove_file(&object).expect("remove"),
        Damage::TruncateManifest => std::fs::write(&manifest, &manifest_bytes[..30]).expect("write"),
        Damage::GarbageManifest => std::fs::write(&manifest, b"not a manifest at all").expect("write"),
    }
    let problems = match store.load(2) {
        Ok(loaded) => store.verify(&loaded).expect("verify"),
        Err(error) => vec![error.to_string()],
    };
    assert_eq!(problems.len(), 1, "{damage:?}: {problems:?}");
    assert!(problems[0].contains(expected), "{damage:?}: {problems:?}");
    if matches!(damage, Damage::FlipObjectByte | Damage::TruncateObject | Damage::RemoveObject) {
        assert!(problems[0].contains("state/epoch-2/agg/vnode-0"), "{damage:?}: {problems:?}");
        assert_eq!(store.verify(&newest).expect("verify"), problems);
    }
    let (restored, warnings) = store.latest_valid().expect("latest").expect("some");
    assert_eq!(restored.epoch, 1, "{damage:?}");
    assert_eq!(warnings.len(), 1, "{damage:?}: {warnings:?}");
    assert!(warnings[0].contains("epoch 2") && warnings[0].contains(expected), "{damage:?}: {warnings:?}");
}

#[test]
fn damaged_checkpoints_are_named_and_skipped() {
    check_damage(Damage::FlipObjectByte, "checksum mismatch");
    check_damage(Damage::TruncateObject, "truncated: 3 bytes");
    check_damage(Damage::RemoveObject, "missing");
    check_damage(Damage::TruncateManifest, "checksum mismatch over 30 bytes");
    check_damage(Damage::GarbageManifest, "not a Sluice manifest");
}

#[test]
fn a_store_with_only_damaged_checkpoints_is_an_error_not_an_empty_store() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    std::fs::remove_file(file(&base, "state/epoch-1/agg/vnode-0")).expect("remove");
    let error = store.latest_valid().expect_err("no valid manifest");
    assert_eq!(error.code, "checkpoint.no_valid_manifest");
    assert!(error.message.contains("epoch 1"), "{error}");
}

#[test]
fn publish_refuses_manifests_naming_unwritten_objects() {
    let (_base, store) = temp_store();
    let mut manifest = Manifest::new(4, "fp", 8, 0);
    let object = ObjectRef { path: "state/epoch-4/agg/vnode-0".into(), offset: 2, size: 3, checksum: 0 };
    manifest
        .operators
        .push(OperatorState { id: "agg".into(), runs: vec![StateRun { start: 0, end: 1, object: object.clone() }] });
    assert_eq!(error_code(store.publish(&manifest)), "checkpoint.publish_unwritten");
    // Bytes 2..5 of an object of 4 bytes: past its end.
    store.put_object(4, "agg/vnode-0", b"four".to_vec()).expect("put");
    assert_eq!(error_code(store.publish(&manifest)), "checkpoint.publish_unwritten");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    let inconsistent = Manifest { vnodes: 0, ..Manifest::new(5, "fp", 8, 0) };
    assert_eq!(error_code(store.publish(&inconsistent)), "checkpoint.manifest_inconsistent");
}

/// A manifest larger than a store reads back is refused before anything is written: a
/// recovery would take it for damage and restore an older one.
#[test]
fn publish_refuses_a_manifest_too_large_to_load() {
    let (_base, store) = temp_store();
    let mut manifest = Manifest::new(1, "fp", 8, 0);
    let record = vec![7u8; MANIFEST_BYTES_MAX as usize];
    let records = vec![crate::manifest::SinkRecord::Inline(record)];
    manifest.sinks.push(crate::manifest::SinkRecords { name: "out".into(), records });
    let error = store.publish(&manifest).expect_err("refused");
    assert_eq!(error.code, "checkpoint.manifest_too_large");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("fewer threads")), "{error:?}");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    manifest.sinks[0].records[0] = crate::manifest::SinkRecord::Inline(vec![7; 1000]);
    store.publish(&manifest).expect("a smaller one is published");
    assert_eq!(store.load(1).expect("loads"), manifest);
}

#[test]
fn a_published_epoch_is_never_replaced_or_written_into() {
    let (_base, store) = temp_store();
    let manifest = checkpoint(&store, 1, &["agg"]);
    store.publish(&manifest).expect("publishing the same manifest again is harmless");
    let other = Manifest { fingerprint: "other".into(), ..manifest.clone() };
    assert_eq!(error_code(store.publish(&other)), "checkpoint.manifest_exists");
    assert_eq!(store.load(1).expect("load"), manifest);
    assert_eq!(error_code(store.put_object(1, "agg/vnode-0", b"x".to_vec())), "checkpoint.epoch_published");
    assert!(store.put_object(2, "agg/vnode-0", b"x".to_vec()).is_ok());
    checkpoint(&store, 3, &[]);
    assert_eq!(error_code(store.publish(&Manifest::new(2, "fp", 8, 0))), "checkpoint.epoch_order");
}

#[test]
fn a_manifest_of_another_format_version_stops_recovery_and_collection() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    let newer = checkpoint(&store, 2, &["agg"]);
    let mut bytes = crate::manifest::encode(&newer);
    bytes[8..12].copy_from_slice(&(crate::manifest::FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(file(&base, "manifests/epoch-00000000000000000002.manifest"), bytes).expect("write");
    assert_eq!(error_kind(store.latest_valid()), ("checkpoint.manifest_version", ErrorKind::Other));
    assert_eq!(error_kind(store.collect_garbage(1)), ("checkpoint.manifest_version", ErrorKind::Other));
    assert!(file(&base, "state/epoch-1/agg/vnode-0").exists());
}

#[test]
fn a_reopened_store_learns_the_published_epochs_from_a_listing() {
    let (base, store) = temp_store();
    checkpoint(&store, 5, &["agg"]);
    let reopened = CheckpointStore::open("file://./store", base.path()).expect("opens");
    assert_eq!(reopened.epochs().expect("epochs"), vec![5]);
    assert_eq!(error_code(reopened.put_object(5, "agg/vnode-0", b"x".to_vec())), "checkpoint.epoch_published");
}

#[test]
fn reads_name_what_is_wrong() {
    let (_base, store) = temp_store();
    assert_eq!(error_kind(store.load(9)), ("checkpoint.manifest_missing", ErrorKind::DamagedManifest));
    let outside = ObjectRef { path: "../secret".into(), offset: 0, size: 0, checksum: 0 };
    assert_eq!(error_kind(store.get_object(&outside)), ("checkpoint.object_name", ErrorKind::Other));
    let absent = ObjectRef { path: "state/epoch-1/x".into(), offset: 0, size: 0, checksum: 0 };
    assert_eq!(error_kind(store.get_object(&absent)), ("checkpoint.object_missing", ErrorKind::DamagedObject));
    let written = store.put_object(1, "y", b"four".to_vec()).expect("put");
    let longer = ObjectRef { size: 5, ..written.clone() };
    assert_eq!(error_kind(store.get_object(&longer)), ("checkpoint.object_truncated", ErrorKind::DamagedObject));
    let other = ObjectRef { checksum: written.checksum ^ 1, ..written };
    assert_eq!(error_kind(store.get_object(&other)), ("checkpoint.object_checksum", ErrorKind::DamagedObject));
    assert_eq!(error_code(store.put_object(1, "../x", vec![])), "checkpoint.object_name");
}

/// A pack holds several states one after another, each read back alone by its range;
/// damage to one state's bytes is found in that state only, a cut pack in the states
/// past the cut.
#[test]
fn packed_states_are_read_by_their_ranges_and_damage_is_found_per_state() {
    let (base, store) = temp_store();
    let states = vec![b"first".to_vec(), Vec::new(), b"third state".to_vec()];
    let written = store
        .put_packs(2, vec![("agg/worker-0".into(), states.clone()), ("join/worker-0".into(), vec![b"j".to_vec()])])
        .expect("put");
    let agg = &written[0];
    let offsets: Vec<(u64, u64)> = agg.iter().map(|object| (object.offset, object.size)).collect();
    assert_eq!(offsets, [(0, 5), (5, 0), (5, 11)]);
    assert!(agg.iter().all(|object| object.path == "state/epoch-2/agg/worker-0"), "{agg:?}");
    let wanted: Vec<&ObjectRef> = agg.iter().chain(&written[1]).collect();
    let read = store.get_objects(&wanted).expect("read");
    assert_eq!(read, [states.clone(), vec![b"j".to_vec()]].concat());

    let path = file(&base, "state/epoch-2/agg/worker-0");
    let mut bytes = std::fs::read(&path).expect("read the pack");
    bytes[7] ^= 0xff; // inside "third state"
    std::fs::write(&path, &bytes).expect("damage it");
    assert_eq!(store.get_object(&agg[0]).expect("the first state is intact"), b"first");
    assert_eq!(error_kind(store.get_object(&agg[2])), ("checkpoint.object_checksum", ErrorKind::DamagedObject));
    std::fs::write(&path, &bytes[..3]).expect("cut it");
    assert_eq!(error_kind(store.get_object(&agg[0])), ("checkpoint.object_truncated", ErrorKind::DamagedObject));
    assert_eq!(error_kind(store.get_object(&agg[2])), ("checkpoint.object_truncated", ErrorKind::DamagedObject));
}

#[test]
fn a_manifest_under_the_wrong_name_is_refused() {
    let (base, store) = temp_store();
    checkpoint(&store, 1, &["agg"]);
    let from = file(&base, "manifests/epoch-00000000000000000001.manifest");
    std::fs::copy(from, file(&base, "manifests/epoch-00000000000000000007.manifest")).expect("copy");
    assert_eq!(error_code(store.load(7)), "checkpoint.manifest_inconsistent");
}

#[test]
fn calls_from_inside_an_async_task_are_refused() {
    let (_base, store) = temp_store();
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let outcome = runtime.block_on(async { store.epochs() });
    assert_eq!(error_code(outcome), "checkpoint.async_context");
}

#[test]
fn the_store_is_shared_between_threads() {
    let (_base, store) = temp_store();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let store = &store;
            scope.spawn(move || {
                for vnode in 0..8 {
                    let bytes = vec![thread as u8; vnode];
                    let object = store.put_object(1, &format!("t{thread}/v{vnode}"), bytes.clone()).expect("put");
                    assert_eq!(store.get_object(&object).expect("get"), bytes);
                }
            });
        }
    });
}
