//! The manifest part's encoding, pinned.

use sluice_checkpoint::ObjectRef;

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
    part.records.push((1, 7, vec![0x62]));
    let fields = [
        "02",                         // version 2
        "02",                         // worker 2
        "01 00 03 01 aa",             // 1 position: source 0, lane 3, 1 byte aa
        "01",                         // 1 object
        "08 66 30 2f 73 31 2f 6f 30", // operator "f0/s1/o0"
        "ac 02",                      // vnode 300
        "01 70 ac 02 05 01",          // path "p", offset 300, size 5, checksum 1
        "01 01 07 01 62",             // 1 record: flow 1, epoch 7, 1 byte "b"
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
