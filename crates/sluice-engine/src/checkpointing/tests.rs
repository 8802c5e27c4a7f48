//! The manifest part's encoding, pinned.

use sluice_checkpoint::{ObjectRef, SinkRecord, StateRun};

use super::part::{PART_VERSION, Part};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// A failure means the encoding changed: that needs a new PART_VERSION (and, since parts
/// cross between workers, a new wire version), never a new vector.
#[test]
fn golden_vector_of_a_part() {
    let mut part = Part::new(2);
    part.positions.push((0, 3, vec![0xaa]));
    let object = ObjectRef { path: "p".into(), offset: 300, size: 5, checksum: 1 };
    part.runs.push(("f0/s1/o0".into(), StateRun { start: 300, end: 301, object }));
    part.records.push((1, 7, SinkRecord::Inline(vec![0x62])));
    let stored = ObjectRef { path: "q".into(), offset: 0, size: 300, checksum: 2 };
    part.records.push((0, 8, SinkRecord::Stored(stored)));
    let fields = [
        "04",                         // version 4
        "02",                         // worker 2
        "01 00 03 01 aa",             // 1 position: source 0, lane 3, 1 byte aa
        "01",                         // 1 run
        "08 66 30 2f 73 31 2f 6f 30", // operator "f0/s1/o0"
        "ac 02 ad 02",                // vnodes 300..301
        "01 70 ac 02 05 01",          // path "p", offset 300, size 5, checksum 1
        "02",                         // 2 records:
        "01 07 00 01 62",             //   flow 1, epoch 7, inline: 1 byte "b"
        "00 08 01 01 71 00 ac 02 02", //   flow 0, epoch 8, stored: path "q", offset 0, size 300, checksum 2
    ];
    let encoded = part.encode().expect("encodes");
    assert_eq!(hex(&encoded), fields.join(" "));
    assert_eq!(Part::decode(&encoded), Ok(part));
}

#[test]
fn a_damaged_part_or_one_of_another_version_is_refused_by_name() {
    let encoded = Part::new(1).encode().expect("encodes");
    let mut newer = encoded.clone();
    newer[0] = (PART_VERSION + 1) as u8;
    let error = Part::decode(&newer).expect_err("another version");
    assert!(
        error.message.contains(&format!("version {}, this build reads {PART_VERSION}", PART_VERSION + 1)),
        "{error}"
    );
    let error = Part::decode(&[encoded.as_slice(), &[0]].concat()).expect_err("trailing");
    assert!(error.message.contains("1 bytes follow it"), "{error}");
    for cut in 0..encoded.len() {
        assert_eq!(Part::decode(&encoded[..cut]).expect_err("truncated").code, "checkpoint.part");
    }
}

/// State runs of an earlier format version are read as they are (`sluice_state::run`
/// reads versions 1 to 3), so a manifest naming them restores; any other encoding, or a
/// run format this build does not know, is refused.
#[test]
fn runs_of_an_earlier_format_restore_and_other_encodings_are_refused() {
    let mut manifest = sluice_checkpoint::Manifest::new(1, "f", 256, 0);
    manifest.encodings = super::encodings();
    assert!(super::check_encodings(&manifest, "s").is_ok());
    for readable in 1..sluice_state::RUN_FORMAT_VERSION {
        manifest.encodings.insert("state_run".into(), readable);
        assert!(super::check_encodings(&manifest, "s").is_ok(), "state runs of version {readable}");
    }
    manifest.encodings.insert("state_run".into(), sluice_state::RUN_FORMAT_VERSION + 1);
    let error = super::check_encodings(&manifest, "s").expect_err("a newer run format");
    assert_eq!(error.code, "checkpoint.encodings");
    manifest.encodings = super::encodings();
    manifest.encodings.insert("state_run".into(), 2);
    manifest.encodings.insert("join_state".into(), 0);
    assert!(super::check_encodings(&manifest, "s").is_err(), "another encoding still counts");
}

/// A worker's part carries a small record inline and writes a large one as an object;
/// the published manifest carries both prefixed with their epoch and worker, the large
/// one as the object it names, which holds exactly the bytes the manifest would.
#[test]
fn large_sink_records_are_stored_as_objects_the_manifest_names() {
    use std::sync::Arc;

    use sluice_checkpoint::{CheckpointStore, Holder};
    use sluice_runtime::checkpoint::{Checkpointer, ManifestSlice, SinkRecord as Staged};
    use sluice_types::Epoch;

    use super::{INLINE_RECORD_BYTES_MAX, StoreCheckpointer, prefixed};
    use crate::fingerprint::Fingerprint;

    let base = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(CheckpointStore::open("file://./store", base.path()).expect("opens"));
    let _lease = store.acquire_lease(Holder::this_process("test")).expect("lease");
    let mut checkpointer = StoreCheckpointer {
        worker: 3,
        store: Arc::clone(&store),
        fingerprint: Fingerprint(7),
        vnodes: 4,
        lane_threads: 1,
        retain: 2,
        sources: Vec::new(),
        sinks: vec!["out".into()],
        published_by_operator: Vec::new(),
        published_written_bytes: 0,
        runs: super::RunBook::restored(base.path().to_path_buf(), None, std::slice::from_ref(&(0..4))),
    };
    let small = b"small".to_vec();
    let large = vec![9u8; INLINE_RECORD_BYTES_MAX];
    let mut slice = ManifestSlice::default();
    slice.sink_records.push(Staged { flow: 0, epoch: 4, record: small.clone(), rows: 1 });
    slice.sink_records.push(Staged { flow: 0, epoch: 5, record: large.clone(), rows: 1 });
    let part = checkpointer.write_part(Epoch(5), slice).expect("written");
    assert!(part.len() < 200, "the part names the large record: {} bytes", part.len());
    checkpointer.publish(Epoch(5), vec![part], false).expect("published");
    let manifest = store.load(5).expect("loads");
    let records = &manifest.sinks[0].records;
    assert_eq!(records[0], SinkRecord::Inline(prefixed(4, 3, &small)));
    let SinkRecord::Stored(object) = &records[1] else { panic!("stored: {records:?}") };
    assert_eq!(object.path, "state/epoch-5/sinks/flow-0/worker-3/epoch-5-1");
    assert_eq!(super::stored_record_worker(&object.path), Some(3), "recovery finds its worker by the path");
    assert_eq!(store.get_object(object).expect("reads"), prefixed(5, 3, &large));
    assert_eq!(store.verify(&manifest).expect("verifies"), Vec::<String>::new());
}

#[test]
fn a_stored_sink_records_worker_is_read_from_its_path() {
    assert_eq!(super::stored_record_worker("state/epoch-5/sinks/flow-0/worker-3/epoch-5-1"), Some(3));
    assert_eq!(super::stored_record_worker("state/epoch-5/sinks/flow-0/worker-x/epoch-5-1"), None);
    assert_eq!(super::stored_record_worker("state/epoch-5/op/pack"), None);
}

/// The runs of one operator instance over checkpoints: deltas add runs, a full snapshot
/// replaces them, an empty one removes them, a failed write changes nothing and leaves
/// the guard down, many deltas are compacted, and a restore merges what the manifest
/// names into the state the snapshots described, also split over other vnode ranges.
mod runs {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use sluice_checkpoint::{CheckpointStore, Holder, Manifest, OperatorState, StateRun};
    use sluice_config::Compression;
    use sluice_runtime::checkpoint::{DeferredState, RestoredState};
    use sluice_runtime::{Snapshot, SnapshotFlag, SnapshotGuard, SnapshotKind};
    use sluice_state::{Merge, MergeMode, StateSink, StateSource};
    use sluice_types::SluiceError;

    use super::super::runs::{RunBook, StoreState};

    type Model = BTreeMap<(u32, Vec<u8>), Vec<u8>>;

    /// A local store (leased) in a fresh directory, and a run book of one instance over
    /// vnodes 0..4 that writes into it.
    struct Fixture {
        base: tempfile::TempDir,
        store: Arc<CheckpointStore>,
        _lease: sluice_checkpoint::Lease,
        book: RunBook,
        flag: SnapshotFlag,
    }

    impl Fixture {
        fn new() -> Fixture {
            let base = tempfile::tempdir().expect("temp dir");
            let store = Arc::new(CheckpointStore::open("file://./store", base.path()).expect("opens"));
            let _lease = store.acquire_lease(Holder::this_process("test")).expect("lease");
            let book = RunBook::restored(base.path().to_path_buf(), None, std::slice::from_ref(&(0..4)));
            Fixture { base, store, _lease, book, flag: SnapshotFlag::written() }
        }
    }

    /// A snapshot of `kind` writing `puts` (a `None` value deletes), in order.
    fn deferred(kind: SnapshotKind, puts: Vec<(u32, &str, Option<&str>)>, flag: &SnapshotFlag) -> DeferredState {
        let puts: Vec<(u32, Vec<u8>, Option<Vec<u8>>)> =
            puts.into_iter().map(|(v, k, x)| (v, k.as_bytes().to_vec(), x.map(|x| x.as_bytes().to_vec()))).collect();
        let job = Box::new(move |sink: &mut dyn StateSink| {
            for (vnode, key, value) in &puts {
                match value {
                    Some(value) => sink.put(*vnode, key, value)?,
                    None => sink.delete(*vnode, key)?,
                }
            }
            Ok(())
        });
        let guard = flag.take();
        DeferredState { operator: "op".into(), vnodes: 0..4, snapshot: Snapshot { kind, job }, guard }
    }

    fn manifest(epoch: u64, runs: &[(String, StateRun)]) -> Manifest {
        let mut manifest = Manifest::new(epoch, "fp", 4, 0);
        let mut state = OperatorState { id: "op".into(), runs: Vec::new() };
        state.runs.extend(runs.iter().map(|(_, run)| run.clone()));
        manifest.operators.push(state);
        manifest
    }

    fn read(store: &Arc<CheckpointStore>, manifest: &Manifest, vnodes: std::ops::Range<u32>) -> Model {
        let state = StoreState::new(Arc::clone(store), manifest);
        let inputs = state.open("op", vnodes.clone()).expect("opens");
        let mut merge = Merge::new(inputs, vnodes, MergeMode::Live);
        let mut model = Model::new();
        while let Some(record) = merge.next_record().expect("merges") {
            model.insert((record.vnode, record.key.to_vec()), record.value.to_vec());
        }
        model
    }

    fn entry(vnode: u32, key: &str, value: &str) -> ((u32, Vec<u8>), Vec<u8>) {
        ((vnode, key.as_bytes().to_vec()), value.as_bytes().to_vec())
    }

    #[test]
    fn deltas_fulls_failures_and_compaction_keep_the_state_the_snapshots_describe() {
        let Fixture { base, store, _lease, mut book, flag } = Fixture::new();

        let puts = vec![(1, "a", Some("1")), (2, "b", Some("2"))];
        let runs = book.write(&store, 1, vec![deferred(SnapshotKind::Delta, puts, &flag)]).expect("written");
        assert!(flag.is_written(), "the guard is marked once written");
        assert_eq!(runs.len(), 1);
        let puts = vec![(1, "a", None), (3, "c", Some("3"))];
        let runs = book.write(&store, 2, vec![deferred(SnapshotKind::Delta, puts, &flag)]).expect("written");
        assert!((1..=2).contains(&runs.len()), "{runs:?}");
        assert_eq!(read(&store, &manifest(2, &runs), 0..4), Model::from([entry(2, "b", "2"), entry(3, "c", "3")]));

        // A failed snapshot job: nothing changes, the guard stays down.
        let failing = Box::new(|_: &mut dyn StateSink| Err(SluiceError::internal("test.fail", "no")));
        let guard = flag.take();
        let snapshot = Snapshot { kind: SnapshotKind::Delta, job: failing };
        let failed = DeferredState { operator: "op".into(), vnodes: 0..4, snapshot, guard };
        assert!(book.write(&store, 3, vec![failed]).is_err());
        assert!(!flag.is_written() && !flag.in_flight(), "the next snapshot must be full");
        let unchanged = book.write(&store, 4, Vec::new()).expect("written");
        assert_eq!(unchanged, runs, "a failed checkpoint leaves the lists as they were");

        // A full snapshot replaces everything.
        let runs = book.write(&store, 5, vec![deferred(SnapshotKind::Full, vec![(0, "z", Some("0"))], &flag)]);
        let runs = runs.expect("written");
        assert_eq!(read(&store, &manifest(5, &runs), 0..4), Model::from([entry(0, "z", "0")]));

        // Many small deltas over a large base: compacted, never more than the policy's runs.
        let mut model = Model::from([entry(0, "z", "0")]);
        let big: Vec<(u32, String)> = (0..400).map(|i| (i % 4, format!("base-{i:04}"))).collect();
        let mut sorted = big.clone();
        sorted.sort();
        let puts: Vec<(u32, &str, Option<&str>)> = sorted.iter().map(|(v, k)| (*v, k.as_str(), Some("x"))).collect();
        for (vnode, key, _) in &puts {
            model.insert((*vnode, key.as_bytes().to_vec()), b"x".to_vec());
        }
        let mut runs = book.write(&store, 6, vec![deferred(SnapshotKind::Delta, puts, &flag)]).expect("written");
        let mut most = 0;
        for epoch in 7..60u64 {
            let key = format!("delta-{epoch:03}");
            let vnode = (epoch % 4) as u32;
            model.insert((vnode, key.as_bytes().to_vec()), b"y".to_vec());
            let delta = deferred(SnapshotKind::Delta, vec![(vnode, key.as_str(), Some("y"))], &flag);
            // Each checkpoint lands the merge the one before started.
            book.wait_for_merge();
            runs = book.write(&store, epoch, vec![delta]).expect("written");
            most = most.max(runs.len());
        }
        assert!(most <= sluice_state::compact::RUNS_MAX + 1, "{most} runs");
        let last = manifest(59, &runs);
        assert_eq!(read(&store, &last, 0..4), model);

        // Restored on two instances of two vnodes each: each reads its part, and the
        // first delta of each lands on the runs it was given.
        let mut split = RunBook::restored(base.path().to_path_buf(), Some(&last), &[0..2, 2..4]);
        let low: Model = model.iter().filter(|((v, _), _)| *v < 2).map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(read(&store, &last, 0..2), low);
        let mut delta = deferred(SnapshotKind::Delta, vec![(1, "base-0001", None)], &flag);
        delta.vnodes = 0..2;
        let runs = split.write(&store, 60, vec![delta]).expect("written");
        model.remove(&(1, b"base-0001".to_vec()));
        assert_eq!(read(&store, &manifest(60, &runs), 0..4), model);

        // An empty snapshot: the instance holds nothing now.
        let empty = DeferredState {
            operator: "op".into(),
            vnodes: 2..4,
            snapshot: Snapshot::empty(),
            guard: SnapshotGuard::detached(),
        };
        let runs = split.write(&store, 61, vec![empty]).expect("written");
        let low: Model = model.iter().filter(|((v, _), _)| *v < 2).map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(read(&store, &manifest(61, &runs), 0..4), low);
    }

    /// A merge under way when a full snapshot replaces its runs is dropped; one whose
    /// runs are still listed lands at the next checkpoint; a book dropped mid-merge
    /// stops it.
    #[test]
    fn a_background_merge_lands_only_on_the_runs_it_merged() {
        let Fixture { base, store, _lease, mut book, flag } = Fixture::new();
        let puts = vec![(1, "a", Some("1")), (2, "b", Some("2"))];
        book.write(&store, 1, vec![deferred(SnapshotKind::Delta, puts, &flag)]).expect("written");
        // Newer runs as large as the base: a merge of everything starts after this one.
        let delta = vec![(1, "a", None), (2, "d", Some("4")), (3, "e", Some("5")), (3, "f", Some("6"))];
        let runs = book.write(&store, 2, vec![deferred(SnapshotKind::Delta, delta, &flag)]);
        assert_eq!(runs.expect("written").len(), 2, "the merge is not in the checkpoint that started it");
        book.wait_for_merge();
        let keys: Vec<String> = (0..10).map(|i| format!("g{i}")).collect();
        let mut delta = vec![(3, "c", Some("3"))];
        delta.extend(keys.iter().map(|key| (3, key.as_str(), Some("7"))));
        let runs = book.write(&store, 3, vec![deferred(SnapshotKind::Delta, delta, &flag)]).expect("written");
        assert_eq!(runs.len(), 2, "the merge replaced the two runs it merged: {runs:?}");
        assert!(runs[0].1.object.path.contains("merged"), "{runs:?}");
        let mut model = Model::from([entry(2, "b", "2"), entry(2, "d", "4"), entry(3, "c", "3")]);
        model.extend([entry(3, "e", "5"), entry(3, "f", "6")]);
        model.extend(keys.iter().map(|key| entry(3, key, "7")));
        assert_eq!(read(&store, &manifest(3, &runs), 0..4), model);
        assert!(runs[1].1.object.size >= runs[0].1.object.size, "a merge of everything is due: {runs:?}");

        // The next merge (everything again) is under way when a full snapshot comes.
        book.wait_for_merge();
        let full = deferred(SnapshotKind::Full, vec![(0, "z", Some("0"))], &flag);
        let runs = book.write(&store, 4, vec![full]).expect("written");
        assert_eq!(runs.len(), 1);
        assert_eq!(read(&store, &manifest(4, &runs), 0..4), Model::from([entry(0, "z", "0")]));
        let runs = book.write(&store, 5, Vec::new()).expect("written");
        assert_eq!(read(&store, &manifest(5, &runs), 0..4), Model::from([entry(0, "z", "0")]));

        // Dropped with a merge under way: the merge stops, and nothing is left locally.
        book.write(&store, 6, vec![deferred(SnapshotKind::Delta, vec![(1, "y", Some("1"))], &flag)]).expect("written");
        drop(book);
        let leftovers: Vec<_> = std::fs::read_dir(base.path())
            .expect("listed")
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("run-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// A state that only adds keys, in blocks large enough to be copied: its runs merge in
    /// tiers (a merge lands in the lists), the merge takes the blocks whole through the
    /// worker's vnode check, and the lists read back every row.
    #[test]
    fn runs_of_additions_merge_by_copying_their_blocks() {
        let Fixture { base: _base, store, _lease, mut book, flag } = Fixture::new();
        let value = "v".repeat(40 << 10);
        let keys: Vec<String> = (0..400).map(|i| format!("k{i:04}")).collect();
        let puts = |range: std::ops::Range<usize>| -> Vec<(u32, &str, Option<&str>)> {
            keys[range]
                .iter()
                .enumerate()
                .map(|(i, key)| ((i % 4) as u32, key.as_str(), Some(value.as_str())))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect()
        };
        let mut runs = book.write(&store, 1, vec![deferred(SnapshotKind::Full, puts(0..4), &flag)]);
        for epoch in 2..100u64 {
            let at = epoch as usize * 4;
            book.wait_for_merge();
            let additions = deferred(SnapshotKind::Additions, puts(at - 4..at), &flag);
            runs = book.write(&store, epoch, vec![additions]);
        }
        let runs = runs.expect("written");
        assert!(runs.iter().any(|(_, run)| run.object.path.contains("merged")), "a merge landed: {runs:?}");
        assert!(runs.len() <= sluice_state::compact::FRESH_RUNS_MAX + 1, "{} runs", runs.len());
        let model: Model = (0..396).map(|i| entry((i % 4) as u32, &keys[i], &value)).collect();
        assert_eq!(read(&store, &manifest(99, &runs), 0..4), model);
    }

    /// `[checkpoint] compression`: by default (`"lz4-merged"`) a checkpoint's runs store
    /// their blocks as they are and a merge compresses them, copied blocks included;
    /// `"lz4"` compresses every run, `"none"` none; all read back alike.
    #[test]
    fn runs_compress_their_blocks_as_told() {
        let value = "v".repeat(40 << 10);
        let keys: Vec<String> = (0..40).map(|i| format!("k{i:04}")).collect();
        let puts = |range: std::ops::Range<usize>| -> Vec<(u32, &str, Option<&str>)> {
            keys[range].iter().map(|key| (1, key.as_str(), Some(value.as_str()))).collect()
        };
        for (compression, new_runs, merged_runs) in
            [(Compression::Lz4Merged, false, true), (Compression::Lz4, true, true), (Compression::None, false, false)]
        {
            let Fixture { base, store, _lease, book, flag } = Fixture::new();
            let mut book = book.compressing(compression);
            let blocks = |runs: &[(String, StateRun)], epoch: u64| -> Vec<bool> {
                let inputs =
                    StoreState::new(Arc::clone(&store), &manifest(epoch, runs)).open("op", 0..4).expect("opens");
                let newest = inputs.last().expect("a run");
                newest.index.blocks.iter().map(|block| block.raw_length.is_some()).collect()
            };
            let runs = book.write(&store, 1, vec![deferred(SnapshotKind::Full, puts(0..4), &flag)]).expect("written");
            assert!(blocks(&runs, 1).iter().all(|lz4| *lz4 == new_runs), "{compression:?}");
            // A state that rewrites its keys: once the newer runs hold as many bytes as
            // the oldest, they are merged into it.
            let mut runs = runs;
            let mut epoch = 1;
            while !runs.iter().any(|(_, run)| run.object.path.contains("merged")) {
                assert!(epoch < 40, "no merge landed in {epoch} checkpoints");
                book.wait_for_merge();
                epoch += 1;
                runs =
                    book.write(&store, epoch, vec![deferred(SnapshotKind::Delta, puts(0..4), &flag)]).expect("written");
            }
            // The inputs open in the manifest's order, the runs' order.
            let at = runs.iter().position(|(_, run)| run.object.path.contains("merged")).expect("merged");
            let inputs = StoreState::new(Arc::clone(&store), &manifest(epoch, &runs)).open("op", 0..4).expect("opens");
            assert_eq!(inputs.len(), runs.len());
            assert!(
                inputs[at].index.blocks.iter().all(|block| block.raw_length.is_some() == merged_runs),
                "{compression:?}: {:?}",
                runs[at]
            );
            let model: Model = keys[..4].iter().map(|key| entry(1, key, &value)).collect();
            assert_eq!(read(&store, &manifest(epoch, &runs), 0..4), model);
            drop(base);
        }
    }

    /// After a restore the runs' kinds are unknown; the instance's first additions say
    /// what they were, so a growing state is not merged into its base.
    #[test]
    fn restored_runs_of_an_instance_that_adds_are_not_merged_into_the_base() {
        let Fixture { base, store, _lease, mut book, flag } = Fixture::new();
        let keys: Vec<String> = (0..40).map(|i| format!("k{i:03}")).collect();
        let puts = |range: std::ops::Range<usize>| -> Vec<(u32, &str, Option<&str>)> {
            keys[range].iter().map(|key| (1, key.as_str(), Some("v"))).collect()
        };
        book.write(&store, 1, vec![deferred(SnapshotKind::Full, puts(0..10), &flag)]).expect("written");
        let runs = book.write(&store, 2, vec![deferred(SnapshotKind::Additions, puts(10..15), &flag)]);
        let runs = runs.expect("written");
        assert_eq!(runs.len(), 2);
        // Restored: the second run is newer and, unknown, might overwrite the base.
        let mut restored =
            RunBook::restored(base.path().to_path_buf(), Some(&manifest(2, &runs)), std::slice::from_ref(&(0..4)));
        let runs = restored.write(&store, 3, vec![deferred(SnapshotKind::Additions, puts(15..30), &flag)]);
        assert_eq!(runs.expect("written").len(), 3);
        restored.wait_for_merge();
        let runs = restored.write(&store, 4, Vec::new()).expect("written");
        assert_eq!(runs.len(), 3, "no merge of everything once the runs are known as additions: {runs:?}");
        let model: Model = keys[..30].iter().map(|key| entry(1, key, "v")).collect();
        assert_eq!(read(&store, &manifest(4, &runs), 0..4), model);
    }
}
