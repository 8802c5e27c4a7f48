//! Golden vectors of the encoding, encode/decode pairing, rejection of damaged encodings,
//! and property tests.

use super::*;
use crate::frame::tests::unhex;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

fn object(epoch: u64, name: &str, size: u64) -> ObjectRef {
    ObjectRef { path: format!("state/epoch-{epoch}/{name}"), offset: 0, size, checksum: 0xdead_beef }
}

/// Representative manifests: empty, one of everything, several epochs' objects.
fn samples() -> Vec<Manifest> {
    let empty = Manifest::new(0, "", 1, 0);
    let mut full = Manifest::new(42, "fp-0123456789abcdef", 256, 1_700_000_000_000);
    full.encodings = [("key".to_string(), 1), ("window_state".to_string(), u32::MAX)].into();
    full.sources = vec![
        SourcePositions {
            name: "bids".into(),
            layout: b"a.csv".to_vec(),
            lanes: vec![vec![], vec![1, 2, 3], vec![0xff; 40]],
        },
        SourcePositions { name: "auctions".into(), layout: vec![], lanes: vec![vec![7]] },
    ];
    full.operators = vec![
        OperatorState {
            id: "agg".into(),
            runs: vec![
                StateRun { start: 0, end: 128, object: object(42, "agg/0", 10) },
                StateRun { start: 128, end: 256, object: object(40, "agg/255", 0) },
                StateRun { start: 0, end: 1, object: object(42, "agg/0", 10) },
            ],
        },
        OperatorState { id: "empty".into(), runs: vec![] },
    ];
    full.sinks = vec![SinkRecords {
        name: "out".into(),
        records: vec![
            SinkRecord::Inline(b"txn-1".to_vec()),
            SinkRecord::Inline(vec![]),
            SinkRecord::Stored(object(41, "out/record-0", 1 << 20)),
        ],
    }];
    let negative_time = Manifest { created_ms: -1, epoch: u64::MAX, vnodes: u32::MAX, ..empty.clone() };
    vec![empty, full, negative_time]
}

/// `manifest` encodes to exactly `fields` (hex), and those bytes decode back to it. A failure
/// here means the encoding changed: that needs a new format version, never a new vector.
fn check_golden(manifest: &Manifest, fields: &[&str]) {
    let expected = unhex(fields);
    let encoded = encode(manifest);
    assert_eq!(encoded, expected, "encoding changed: got {}", encoded.escape_ascii());
    assert_eq!(decode(&expected).as_ref(), Ok(manifest));
}

/// The frame's magic and version 5.
const FRAME: &str = "53 4c 55 49 43 45 4d 46  05 00 00 00";

#[test]
fn golden_vector_of_an_empty_manifest() {
    let body = ["05", "00", "00", "00", "01", "01", "00", "00", "00", "00"];
    let checksum = "27 59 9f f3";
    check_golden(&Manifest::new(0, "", 1, 0), &[&[FRAME][..], &body[..], &[checksum][..]].concat());
}

/// One of every field, with multi-byte varints.
fn golden_manifest() -> Manifest {
    let mut manifest = Manifest::new(300, "fp-7", 256, 1_700_000_000_000);
    manifest.lane_threads = 2;
    manifest.encodings = [("window_state".to_string(), 2), ("key".to_string(), 1)].into();
    manifest.sources =
        vec![SourcePositions { name: "bids".into(), layout: b"f1".to_vec(), lanes: vec![vec![1], vec![]] }];
    let object = ObjectRef { path: "state/epoch-300/agg/v200".into(), offset: 1024, size: 1000, checksum: 0xdead_beef };
    manifest.operators =
        vec![OperatorState { id: "agg".into(), runs: vec![StateRun { start: 200, end: 201, object }] }];
    let stored = ObjectRef { path: "state/epoch-299/out/r".into(), offset: 0, size: 7, checksum: 1 };
    let records = vec![SinkRecord::Inline(b"t1".to_vec()), SinkRecord::Inline(vec![]), SinkRecord::Stored(stored)];
    manifest.sinks = vec![SinkRecords { name: "out".into(), records }];
    manifest
}

/// The fields of the golden manifest from the version to its operator's id, which
/// versions 2, 4 and 5 share (after a version byte of their own).
const SHARED_FIELDS: [&str; 15] = [
    "ac 02",                   // epoch 300
    "04 66 70 2d 37",          // fingerprint "fp-7"
    "80 a0 ab fe f9 62",       // created_ms 1_700_000_000_000, zigzag
    "80 02",                   // vnodes 256
    "02",                      // lane_threads 2
    "02",                      // 2 encodings, ascending by name:
    "03 6b 65 79 01",          //   "key" -> 1
    "0c 77 69 6e 64 6f 77 5f", //   12 bytes: "window_"
    "73 74 61 74 65 02",       //   "state" -> 2
    "01",                      // 1 source:
    "04 62 69 64 73",          //   name "bids"
    "02 66 31",                //   layout "f1"
    "02 01 01 00",             //   2 lanes: [01], []
    "01",                      // 1 operator:
    "03 61 67 67",             //   id "agg"
];

/// The object's path, which versions 2, 4 and 5 share.
const OBJECT_PATH: [&str; 4] = [
    "18 73 74 61 74 65 2f", //   path, 24 bytes: "state/"
    "65 70 6f 63 68 2d 33", //   "epoch-3"
    "30 30 2f 61 67 67 2f", //   "00/agg/"
    "76 32 30 30",          //   "v200"
];

/// The object's size and checksum, after its path (and, from version 4, its offset).
const OBJECT_TAIL: [&str; 2] = [
    "e8 07",          //   size 1000
    "ef fd b6 f5 0d", //   checksum 0xdeadbeef
];

/// The sinks of the golden manifest in versions 4 and 5, then `checksum`: the CRC-32
/// of the body.
fn golden_sinks(checksum: &'static str) -> [&'static str; 11] {
    [
        "01",                      // 1 sink:
        "03 6f 75 74",             //   name "out"
        "03",                      //   3 records:
        "00 02 74 31",             //     inline "t1"
        "00 00",                   //     inline, empty
        "01",                      //     stored:
        "15 73 74 61 74 65 2f 65", //       path, 21 bytes: "state/e"
        "70 6f 63 68 2d 32 39 39", //       "poch-299"
        "2f 6f 75 74 2f 72",       //       "/out/r"
        "00 07 01",                //       offset 0, size 7, checksum 1
        checksum,                  // CRC-32 of the body
    ]
}

#[test]
fn golden_vector_of_a_manifest_with_every_field() {
    let run = [
        "01",    //   1 run:
        "c8 01", //     start 200
        "c9 01", //     end 201
    ];
    let object = [
        "80 08", //   offset 1024
    ];
    let sinks = golden_sinks("7b 24 de 40");
    let fields =
        [&[FRAME, "05"][..], &SHARED_FIELDS[..], &run[..], &OBJECT_PATH[..], &object[..], &OBJECT_TAIL[..], &sinks[..]]
            .concat();
    check_golden(&golden_manifest(), &fields);
}

/// A store written by format 4 is still read: the golden manifest as version 4 wrote it
/// (one object per vnode) decodes into the version 5 manifest whose runs are those
/// objects, each serving its vnode.
#[test]
fn a_version_4_manifest_decodes_with_each_vnodes_object_as_a_run() {
    let vnode = [
        "01",    //   1 vnode:
        "c8 01", //     200
    ];
    let object = [
        "80 08", //   offset 1024
    ];
    let sinks = golden_sinks("34 0b dd bd");
    let fields = [
        &["53 4c 55 49 43 45 4d 46  04 00 00 00", "04"][..],
        &SHARED_FIELDS[..],
        &vnode[..],
        &OBJECT_PATH[..],
        &object[..],
        &OBJECT_TAIL[..],
        &sinks[..],
    ]
    .concat();
    assert_eq!(decode(&unhex(&fields)), Ok(golden_manifest()));
    assert_eq!(&encode(&golden_manifest())[8..12], &[5, 0, 0, 0], "written back as version 5");
}

/// A store written by format 2 is still read: the golden manifest as version 2 wrote it
/// (whole objects, records as bytes) decodes into the version 5 manifest it amounts to,
/// every object at offset 0 and every record inline.
#[test]
fn a_version_2_manifest_decodes_with_whole_objects_and_its_records_inline() {
    let sinks = [
        "01",             // 1 sink:
        "03 6f 75 74",    //   name "out"
        "02 02 74 31 00", //   2 records: "t1", []
        "c3 e0 4e 34",    // CRC-32 of the body
    ];
    let vnode = ["01 c8 01"]; //   1 vnode: 200
    let fields = [
        &["53 4c 55 49 43 45 4d 46  02 00 00 00", "02"][..],
        &SHARED_FIELDS[..],
        &vnode[..],
        &OBJECT_PATH[..],
        &OBJECT_TAIL[..],
        &sinks[..],
    ]
    .concat();
    let mut expected = golden_manifest();
    expected.operators[0].runs[0].object.offset = 0;
    expected.sinks[0].records.pop();
    assert_eq!(decode(&unhex(&fields)), Ok(expected.clone()));
    // It is written back in this build's format.
    assert_eq!(&encode(&expected)[8..12], &[5, 0, 0, 0]);
    let mut body = unhex(&fields[1..fields.len() - 1]);
    body[0] = 5;
    check_rejected(
        "a body saying version 5 in a version 2 frame",
        &reframe(2, &body),
        "checkpoint.manifest_inconsistent",
    );
}

#[test]
fn a_version_1_manifest_is_refused_with_the_fix() {
    // The golden manifest as version 1 wrote it: no encodings, no source layout.
    let version_1 = [
        "53 4c 55 49 43 45 4d 46  01 00 00 00",
        "01 ac 02 04 66 70 2d 37 80 a0 ab fe f9 62 80 02 02",
        "01 04 62 69 64 73 02 01 01 00",
        "01 03 61 67 67 01 c8 01 18 73 74 61 74 65 2f 65 70 6f 63 68 2d 33 30 30 2f 61 67 67 2f 76 32 30 30",
        "e8 07 ef fd b6 f5 0d 01 03 6f 75 74 02 02 74 31 00",
        "2f e1 63 52",
    ];
    let error = decode(&unhex(&version_1)).expect_err("version 1 is refused");
    assert_eq!((error.code, error.kind), ("checkpoint.manifest_version", ErrorKind::Other));
    assert_eq!(error.message, "manifest format version 1 is not supported (this build reads versions 2, 4 and 5)");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("--from-scratch")), "{error}");
}

#[test]
fn representative_manifests_round_trip() {
    for manifest in samples() {
        let bytes = encode(&manifest);
        assert_eq!(&bytes[..8], b"SLUICEMF");
        assert_eq!(decode(&bytes), Ok(manifest));
    }
}

/// Decoding `bytes` fails with `code`, of kind `DamagedManifest` except for another format
/// version (which is not damage: recovery must stop rather than fall back past it).
fn check_rejected(name: &str, bytes: &[u8], code: &str) {
    let kind = if code == "checkpoint.manifest_version" { ErrorKind::Other } else { ErrorKind::DamagedManifest };
    match decode(bytes) {
        Ok(manifest) => panic!("{name}: decoded {manifest:?}, expected {code}"),
        Err(error) => assert_eq!((error.code, error.kind), (code, kind), "{name}: {error}"),
    }
}

fn reframe(version: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bytes
}

#[test]
fn damaged_encodings_are_rejected_by_name() {
    let manifest = samples().remove(1);
    let good = encode(&manifest);
    let body = postcard::to_allocvec(&manifest).expect("serializes");
    let mut flipped = good.clone();
    flipped[20] ^= 0x01;
    let mut trailing = body.clone();
    trailing.push(0);
    let inconsistent = Manifest { vnodes: 0, ..manifest.clone() };
    let inconsistent_body = postcard::to_allocvec(&inconsistent).expect("serializes");
    let other_version = Manifest { version: 1, ..manifest.clone() };
    let other_version_body = postcard::to_allocvec(&other_version).expect("serializes");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "checkpoint.manifest_truncated"),
        ("magic only", MAGIC.to_vec(), "checkpoint.manifest_truncated"),
        ("half magic", MAGIC[..3].to_vec(), "checkpoint.manifest_truncated"),
        ("wrong magic", b"NOTAMANIFEST-AT-ALL".to_vec(), "checkpoint.manifest_magic"),
        ("json", br#"{"epoch": 3}"#.to_vec(), "checkpoint.manifest_magic"),
        ("version 1", reframe(1, &body), "checkpoint.manifest_version"),
        ("version 3", reframe(3, &body), "checkpoint.manifest_version"),
        ("version 6", reframe(6, &body), "checkpoint.manifest_version"),
        ("version 0", reframe(0, &body), "checkpoint.manifest_version"),
        ("flipped byte", flipped, "checkpoint.manifest_checksum"),
        ("cut in the body", good[..good.len() / 2].to_vec(), "checkpoint.manifest_checksum"),
        ("cut checksum", good[..good.len() - 1].to_vec(), "checkpoint.manifest_checksum"),
        ("empty body", reframe(5, &[]), "checkpoint.manifest_body"),
        ("empty version 4 body", reframe(4, &[]), "checkpoint.manifest_body"),
        ("empty version 2 body", reframe(2, &[]), "checkpoint.manifest_body"),
        ("trailing byte", reframe(5, &trailing), "checkpoint.manifest_body"),
        ("inconsistent", reframe(5, &inconsistent_body), "checkpoint.manifest_inconsistent"),
        ("body version differs", reframe(5, &other_version_body), "checkpoint.manifest_inconsistent"),
    ];
    for (name, bytes, code) in cases {
        check_rejected(name, &bytes, code);
    }
}

#[test]
fn only_the_canonical_body_is_accepted() {
    // The empty manifest's body with its encodings replaced (the bytes between the
    // lane_threads and the sources): canonical encodings decode, anything else is refused.
    let with_encodings = |encodings: &str| reframe(5, &unhex(&["05 00 00 00 01 01", encodings, "00 00 00"]));
    let two = Manifest { encodings: [("a".into(), 1), ("b".into(), 2)].into(), ..Manifest::new(0, "", 1, 0) };
    assert_eq!(decode(&with_encodings("02 01 61 01 01 62 02")), Ok(two));
    let cases: [(&str, &str, &str); 5] = [
        ("names out of order", "02 01 62 02 01 61 01", "checkpoint.manifest_body"),
        ("a name twice", "02 01 61 01 01 61 02", "checkpoint.manifest_body"),
        ("a longer varint than needed", "02 01 61 81 00 01 62 02", "checkpoint.manifest_body"),
        ("a longer count than needed", "82 00 01 61 01 01 62 02", "checkpoint.manifest_body"),
        ("an empty name", "01 00 01", "checkpoint.manifest_inconsistent"),
    ];
    for (name, encodings, code) in cases {
        check_rejected(name, &with_encodings(encodings), code);
    }
}

/// `manifest` fails `check` with a message containing `needle`.
fn check_contradiction(manifest: &Manifest, needle: &str) {
    match manifest.check() {
        Ok(()) => panic!("accepted, expected a contradiction about {needle:?}: {manifest:?}"),
        Err(error) => {
            assert_eq!(error.code, "checkpoint.manifest_inconsistent");
            assert!(error.message.contains(needle), "{} does not mention {needle:?}", error.message);
        }
    }
}

#[test]
fn contradictions_are_named() {
    let base = samples().remove(1);
    let with_operator = |runs: Vec<(u32, ObjectRef)>| {
        let mut manifest = base.clone();
        let runs = runs.into_iter().map(|(start, object)| StateRun { start, end: start + 1, object }).collect();
        manifest.operators = vec![OperatorState { id: "op".into(), runs }];
        manifest
    };
    let mut twice = base.clone();
    twice.sources.push(twice.sources[0].clone());
    check_contradiction(&twice, "source \"bids\" appears twice");
    let mut sinks = base.clone();
    sinks.sinks.push(sinks.sinks[0].clone());
    check_contradiction(&sinks, "sink \"out\" appears twice");
    let mut operators = base.clone();
    operators.operators.push(operators.operators[0].clone());
    check_contradiction(&operators, "operator \"agg\" appears twice");
    check_contradiction(&with_operator(vec![(256, object(1, "x", 1))]), "a run of vnodes 256..257 of 256");
    let mut empty_run = with_operator(vec![(3, object(1, "x", 1))]);
    empty_run.operators[0].runs[0].end = 3;
    check_contradiction(&empty_run, "a run of vnodes 3..3 of 256");
    let past_the_end = ObjectRef { offset: u64::MAX, ..object(1, "x", 2) };
    check_contradiction(&with_operator(vec![(0, past_the_end)]), "a range past 2^64 bytes");
    check_contradiction(&with_operator(vec![(1, object(43, "x", 1))]), "later epoch 43");
    let escape = ObjectRef { path: "../etc/passwd".into(), offset: 0, size: 1, checksum: 0 };
    check_contradiction(&with_operator(vec![(1, escape.clone())]), "not a state object path");
    let with_stored = |object: ObjectRef| {
        let mut manifest = base.clone();
        manifest.sinks[0].records.push(SinkRecord::Stored(object));
        manifest
    };
    check_contradiction(&with_stored(object(43, "out/r", 1)), "later epoch 43");
    check_contradiction(&with_stored(escape), "not a state object path");
    check_contradiction(&Manifest { version: 9, ..base.clone() }, "version 9");
    let mut unnamed = base.clone();
    unnamed.encodings.insert(String::new(), 1);
    check_contradiction(&unnamed, "an encoding has an empty name");
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_-]{0,8}"
}

fn bytes_vec() -> impl Strategy<Value = Vec<Vec<u8>>> {
    vec(vec(any::<u8>(), 0..12), 0..4)
}

fn records(epoch: u64) -> impl Strategy<Value = Vec<SinkRecord>> {
    let stored = (0..=epoch, name(), any::<u64>(), any::<u32>()).prop_map(|(written, name, size, checksum)| {
        SinkRecord::Stored(ObjectRef { path: format!("state/epoch-{written}/{name}"), offset: 0, size, checksum })
    });
    vec(prop_oneof![vec(any::<u8>(), 0..12).prop_map(SinkRecord::Inline), stored], 0..4)
}

fn operator(epoch: u64, vnodes: u32) -> impl Strategy<Value = Vec<StateRun>> {
    let run = (0..vnodes, 1..=vnodes, 0..=epoch, name(), any::<u32>(), any::<u64>(), any::<u32>());
    vec(run, 0..6).prop_map(move |runs| {
        let runs = runs.into_iter().map(|(start, length, written, name, offset, size, checksum)| {
            let end = start.saturating_add(length).min(vnodes);
            let path = format!("state/epoch-{written}/{name}/v{start}");
            let object = ObjectRef { path, offset: u64::from(offset), size: size >> 1, checksum };
            StateRun { start, end: end.max(start + 1), object }
        });
        runs.collect()
    })
}

fn manifest() -> impl Strategy<Value = Manifest> {
    (0u64..1_000_000, 1u32..1024, any::<i64>(), ".{0,20}").prop_flat_map(|(epoch, vnodes, created_ms, fingerprint)| {
        let encodings = btree_map(name(), any::<u32>(), 0..4);
        let sources = btree_map(name(), (vec(any::<u8>(), 0..12), bytes_vec()), 0..4);
        let operators = btree_map(name(), operator(epoch, vnodes), 0..4);
        let sinks = btree_map(name(), records(epoch), 0..3);
        (encodings, sources, operators, sinks).prop_map(move |(encodings, sources, operators, sinks)| Manifest {
            encodings,
            sources: sources
                .into_iter()
                .map(|(name, (layout, lanes))| SourcePositions { name, layout, lanes })
                .collect(),
            operators: operators.into_iter().map(|(id, runs)| OperatorState { id, runs }).collect(),
            sinks: sinks.into_iter().map(|(name, records)| SinkRecords { name, records }).collect(),
            ..Manifest::new(epoch, fingerprint.clone(), vnodes, created_ms)
        })
    })
}

/// Whether `bytes` carries the right magic, version and a checksum matching its body.
fn frame_is_intact(bytes: &[u8]) -> bool {
    bytes.len() >= 16
        && bytes[..12] == encode(&Manifest::new(0, "", 1, 0))[..12]
        && bytes[bytes.len() - 4..] == crc32fast::hash(&bytes[12..bytes.len() - 4]).to_le_bytes()
}

proptest! {
    #[test]
    fn random_manifests_round_trip(manifest in manifest()) {
        prop_assert_eq!(decode(&encode(&manifest)), Ok(manifest));
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..256), with_magic in any::<bool>()) {
        let mut input = if with_magic { reframe(FORMAT_VERSION, &[])[..12].to_vec() } else { Vec::new() };
        input.extend_from_slice(&bytes);
        if let Ok(manifest) = decode(&input) {
            prop_assert!(frame_is_intact(&input));
            prop_assert!(manifest.check().is_ok());
        }
    }

    #[test]
    fn any_single_byte_change_or_truncation_is_rejected(
        manifest in manifest(), index in any::<prop::sample::Index>(), xor in 1u8..=255, cut in any::<bool>(),
    ) {
        let good = encode(&manifest);
        let position = index.index(good.len());
        let damaged = if cut {
            good[..position].to_vec()
        } else {
            let mut damaged = good.clone();
            damaged[position] ^= xor;
            damaged
        };
        prop_assert!(decode(&damaged).is_err());
    }

    #[test]
    fn mutated_encodings_decode_only_with_a_matching_checksum(
        manifest in manifest(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&manifest);
        for (index, value) in edits {
            let position = index.index(bytes.len());
            bytes[position] = value;
        }
        if let Ok(decoded) = decode(&bytes) {
            prop_assert!(frame_is_intact(&bytes));
            prop_assert!(decoded.check().is_ok());
        }
    }
}
