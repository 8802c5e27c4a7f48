//! The manifest part's encoding, pinned.

use sluice_checkpoint::{ObjectRef, SinkRecord};

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
    part.objects.push(("f0/s1/o0".into(), 300, ObjectRef { path: "p".into(), offset: 300, size: 5, checksum: 1 }));
    part.records.push((1, 7, SinkRecord::Inline(vec![0x62])));
    let stored = ObjectRef { path: "q".into(), offset: 0, size: 300, checksum: 2 };
    part.records.push((0, 8, SinkRecord::Stored(stored)));
    let fields = [
        "03",                         // version 3
        "02",                         // worker 2
        "01 00 03 01 aa",             // 1 position: source 0, lane 3, 1 byte aa
        "01",                         // 1 object
        "08 66 30 2f 73 31 2f 6f 30", // operator "f0/s1/o0"
        "ac 02",                      // vnode 300
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
