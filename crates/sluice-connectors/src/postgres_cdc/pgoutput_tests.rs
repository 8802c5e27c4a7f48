//! Golden byte vectors: messages as a PostgreSQL 15 walsender sends them (laid out
//! per "Logical Replication Message Formats"), each decoded to its expected value, and
//! every truncation of each refused without a panic.

use super::*;

fn bytes(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

fn check(input: &Bytes, expected: Message) {
    assert_eq!(decode(input).unwrap(), expected);
    for end in 0..input.len() {
        assert!(decode(&input.slice(..end)).is_err(), "a truncation to {end} bytes decoded");
    }
}

fn text(value: &str) -> Value {
    Value::Text(Bytes::copy_from_slice(value.as_bytes()))
}

#[test]
fn begin_and_commit() {
    let begin = bytes(&[b"B", &0x0000_0000_0150_0028u64.to_be_bytes(), &7i64.to_be_bytes(), &735u32.to_be_bytes()]);
    check(&begin, Message::Begin { final_lsn: 0x0150_0028, commit_time: 7, xid: 735 });
    let commit = bytes(&[b"C\0", &0x0150_0028u64.to_be_bytes(), &0x0150_0058u64.to_be_bytes(), &7i64.to_be_bytes()]);
    check(&commit, Message::Commit { commit_lsn: 0x0150_0028, end_lsn: 0x0150_0058, commit_time: 7 });
}

#[test]
fn a_relation_with_its_key_column() {
    let input = bytes(&[
        b"R",
        &16385u32.to_be_bytes(),
        b"public\0orders\0d",
        &2i16.to_be_bytes(),
        b"\x01id\0",
        &20u32.to_be_bytes(),
        &(-1i32).to_be_bytes(),
        b"\x00note\0",
        &1043u32.to_be_bytes(),
        &84i32.to_be_bytes(),
    ]);
    check(
        &input,
        Message::Relation(Relation {
            oid: 16385,
            namespace: "public".into(),
            name: "orders".into(),
            replica_identity: b'd',
            columns: vec![
                RelationColumn { key: true, name: "id".into(), type_oid: 20, type_modifier: -1 },
                RelationColumn { key: false, name: "note".into(), type_oid: 1043, type_modifier: 84 },
            ],
        }),
    );
}

#[test]
fn an_insert_with_text_and_null() {
    let input = bytes(&[b"I", &16385u32.to_be_bytes(), b"N", &2i16.to_be_bytes(), b"t\0\0\0\x0242", b"n"]);
    check(&input, Message::Insert { relation: 16385, new: vec![text("42"), Value::Null] });
}

#[test]
fn an_update_with_an_unchanged_toast_value_and_no_old_image() {
    let input = bytes(&[b"U", &16385u32.to_be_bytes(), b"N", &2i16.to_be_bytes(), b"t\0\0\0\x011", b"u"]);
    check(&input, Message::Update { relation: 16385, old: None, new: vec![text("1"), Value::Unchanged] });
}

#[test]
fn an_update_with_a_full_old_image() {
    let input = bytes(&[
        b"U",
        &16385u32.to_be_bytes(),
        b"O",
        &2i16.to_be_bytes(),
        b"t\0\0\0\x011t\0\0\0\x01a",
        b"N",
        &2i16.to_be_bytes(),
        b"t\0\0\0\x011t\0\0\0\x01b",
    ]);
    check(
        &input,
        Message::Update {
            relation: 16385,
            old: Some((OldImage::Full, vec![text("1"), text("a")])),
            new: vec![text("1"), text("b")],
        },
    );
}

#[test]
fn a_delete_with_the_key_only() {
    let input = bytes(&[b"D", &16385u32.to_be_bytes(), b"K", &2i16.to_be_bytes(), b"t\0\0\0\x017n"]);
    check(&input, Message::Delete { relation: 16385, old: (OldImage::Key, vec![text("7"), Value::Null]) });
}

#[test]
fn a_truncate_names_its_relations() {
    let input = bytes(&[b"T", &2u32.to_be_bytes(), b"\0", &16385u32.to_be_bytes(), &16390u32.to_be_bytes()]);
    check(&input, Message::Truncate { relations: vec![16385, 16390] });
    let lying = bytes(&[b"T", &u32::MAX.to_be_bytes(), b"\0"]);
    assert!(decode(&lying).is_err());
}

#[test]
fn type_origin_and_logical_messages() {
    check(
        &bytes(&[b"Y", &16400u32.to_be_bytes(), b"public\0mood\0"]),
        Message::Type { oid: 16400, namespace: "public".into(), name: "mood".into() },
    );
    check(&bytes(&[b"O", &9u64.to_be_bytes(), b"origin\0"]), Message::Origin { lsn: 9, name: "origin".into() });
    check(
        &bytes(&[b"M\x01", &9u64.to_be_bytes(), b"app\0", &2u32.to_be_bytes(), b"hi"]),
        Message::Logical { prefix: "app".into() },
    );
}

#[test]
fn malformed_messages_are_errors() {
    for input in [
        &b""[..],
        b"Z",
        b"I\0\0\0\x01X\0\0",
        b"I\0\0\0\x01N\0\x01x",
        b"I\0\0\0\x01N\xff\xff",
        b"I\0\0\0\x01N\0\x01t\xff\xff\xff\xff",
        b"D\0\0\0\x01N\0\0",
        b"U\0\0\0\x01K\0\0X\0\0",
        b"R\0\0\0\x01public",
    ] {
        assert!(decode(&Bytes::copy_from_slice(input)).is_err(), "{input:?} decoded");
    }
    // Bytes after a complete message.
    assert!(decode(&bytes(&[b"I", &1u32.to_be_bytes(), b"N\0\0!"])).is_err());
}

#[test]
fn xlog_data_and_keepalives() {
    let data = bytes(&[b"w", &16u64.to_be_bytes(), &32u64.to_be_bytes(), &5i64.to_be_bytes(), b"B..."]);
    assert_eq!(
        decode_stream(&data).unwrap(),
        StreamMessage::XLogData { start: 16, end: 32, data: Bytes::from_static(b"B...") }
    );
    let keepalive = bytes(&[b"k", &32u64.to_be_bytes(), &5i64.to_be_bytes(), b"\x01"]);
    assert_eq!(decode_stream(&keepalive).unwrap(), StreamMessage::Keepalive { end: 32, reply: true });
    for end in 0..keepalive.len() {
        assert!(decode_stream(&keepalive.slice(..end)).is_err());
    }
    assert!(decode_stream(&Bytes::from_static(b"x")).is_err());
}

/// Every golden vector with each byte replaced by each of a few values, and cut at
/// every length: decoding answers a message or an error, never a panic.
#[test]
fn mutated_messages_never_panic() {
    let goldens: Vec<Bytes> = vec![
        bytes(&[b"B", &1u64.to_be_bytes(), &7i64.to_be_bytes(), &735u32.to_be_bytes()]),
        bytes(&[b"C\0", &1u64.to_be_bytes(), &2u64.to_be_bytes(), &7i64.to_be_bytes()]),
        bytes(&[
            b"R",
            &1u32.to_be_bytes(),
            b"public\0t\0d",
            &1i16.to_be_bytes(),
            b"\x01id\0",
            &20u32.to_be_bytes(),
            &(-1i32).to_be_bytes(),
        ]),
        bytes(&[
            b"U",
            &1u32.to_be_bytes(),
            b"O",
            &1i16.to_be_bytes(),
            b"t\0\0\0\x011",
            b"N",
            &2i16.to_be_bytes(),
            b"u",
            b"n",
        ]),
        bytes(&[b"D", &1u32.to_be_bytes(), b"K", &1i16.to_be_bytes(), b"t\0\0\0\x017"]),
        bytes(&[b"T", &1u32.to_be_bytes(), b"\0", &1u32.to_be_bytes()]),
        bytes(&[b"M\x01", &9u64.to_be_bytes(), b"app\0", &2u32.to_be_bytes(), b"hi"]),
    ];
    for golden in goldens {
        for at in 0..golden.len() {
            for value in [0u8, 1, 0x7f, 0x80, 0xff, b'n', b't', b'u', b'K', b'O', b'N'] {
                let mut mutated = golden.to_vec();
                mutated[at] = value;
                let mutated = Bytes::from(mutated);
                for end in [mutated.len(), at + 1] {
                    let _ = decode(&mutated.slice(..end));
                    let _ = decode_stream(&mutated.slice(..end));
                }
            }
        }
    }
}
