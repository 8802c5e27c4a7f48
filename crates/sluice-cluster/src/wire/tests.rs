//! The control encoding: golden vectors of every message, the refusal across versions,
//! every problem a decoder names, and proptests over arbitrary bytes and messages.

use std::collections::VecDeque;

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

/// The bytes of hex fields (one field per element; spaces are ignored).
fn unhex(fields: &[&str]) -> Vec<u8> {
    let digits: Vec<u8> = fields.concat().bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits in {fields:?}");
    let value = |digit: u8| char::from(digit).to_digit(16).expect("a hex digit") as u8;
    digits.chunks(2).map(|pair| value(pair[0]) << 4 | value(pair[1])).collect()
}

/// `message` encodes to exactly `fields` (hex) and those bytes decode back to it. A
/// failure means the encoding changed: that needs a new WIRE_VERSION, never a new vector.
fn check_golden(message: ControlMessage, fields: &[&str]) {
    let expected = unhex(fields);
    let encoded = encode(&message).expect("encodes");
    assert_eq!(encoded, expected, "encoding of {message:?} changed: got {}", encoded.escape_ascii());
    assert_eq!(decode(&expected).as_ref(), Ok(&message));
}

#[test]
fn golden_vector_of_a_register() {
    let register = Register {
        exchange_addr: "10.0.0.2:7000".into(),
        threads: 4,
        fingerprint: "fp-1".into(),
        host: "node-2".into(),
        pid: 4242,
        build: "0.1.0".into(),
        admin_addr: "10.0.0.2:9400".into(),
    };
    let fields = [
        "53 4c 43 43",                               // magic "SLCC"
        "06 00",                                     // wire version 6
        "01",                                        // kind: register
        "31 00 00 00",                               // body: 49 bytes
        "0d 31 30 2e 30 2e 30 2e 32 3a 37 30 30 30", // exchange_addr "10.0.0.2:7000"
        "04",                                        // threads 4
        "04 66 70 2d 31",                            // fingerprint "fp-1"
        "06 6e 6f 64 65 2d 32",                      // host "node-2"
        "92 21",                                     // pid 4242
        "05 30 2e 31 2e 30",                         // build "0.1.0"
        "0d 31 30 2e 30 2e 30 2e 32 3a 39 34 30 30", // admin_addr "10.0.0.2:9400"
    ];
    check_golden(ControlMessage::Register(register), &fields);
}

#[test]
fn a_thread_count_outside_the_configs_bounds_is_refused_when_decoded() {
    let register = |threads| Register {
        exchange_addr: "10.0.0.2:7000".into(),
        threads,
        fingerprint: "fp-1".into(),
        host: "node-2".into(),
        pid: 1,
        build: "0.1.0".into(),
        admin_addr: String::new(),
    };
    for threads in [0, MAX_WORKER_THREADS + 1, 1 << 31] {
        let bytes = encode(&ControlMessage::Register(register(threads))).expect("encodes");
        let error = decode(&bytes).expect_err("refused");
        assert!(error.message.contains(&format!("{threads} threads")), "{error}");
        let member = Member { id: 1, exchange_addr: "a:1".into(), threads, admin_addr: String::new() };
        let welcome = Welcome { members: vec![member], you: 1, fingerprint: "fp".into() };
        assert!(decode(&encode(&ControlMessage::Welcome(welcome)).expect("encodes")).is_err());
    }
    for threads in [1, MAX_WORKER_THREADS] {
        let bytes = encode(&ControlMessage::Register(register(threads))).expect("encodes");
        assert_eq!(decode(&bytes).expect("decodes"), ControlMessage::Register(register(threads)));
    }
}

#[test]
fn golden_vector_of_a_welcome() {
    let members = vec![
        Member { id: 0, exchange_addr: "127.0.0.1:7000".into(), threads: 2, admin_addr: "a:1".into() },
        Member { id: 1, exchange_addr: "127.0.0.1:7001".into(), threads: 3, admin_addr: String::new() },
    ];
    let fields = [
        "53 4c 43 43 06 00",                                  // magic, version 6
        "02",                                                 // kind: welcome
        "2e 00 00 00",                                        // body: 46 bytes
        "02",                                                 // 2 members
        "00 0e 31 32 37 2e 30 2e 30 2e 31 3a 37 30 30 30 02", // id 0, "127.0.0.1:7000", threads 2
        "03 61 3a 31",                                        // admin_addr "a:1"
        "01 0e 31 32 37 2e 30 2e 30 2e 31 3a 37 30 30 31 03", // id 1, "127.0.0.1:7001", threads 3
        "00",                                                 // admin_addr "" (no admin API)
        "01",                                                 // you: 1
        "04 66 70 2d 31",                                     // fingerprint "fp-1"
    ];
    check_golden(ControlMessage::Welcome(Welcome { members, you: 1, fingerprint: "fp-1".into() }), &fields);
}

#[test]
fn golden_vectors_of_the_leaders_commands() {
    let cases: [(ToWorker, &[&str]); 11] = [
        (ToWorker::Barrier { epoch: 300, final_epoch: false }, &["04 00 00 00", "00 ac 02 00"]),
        (ToWorker::Barrier { epoch: 2, final_epoch: true }, &["03 00 00 00", "00 02 01"]),
        (ToWorker::Commit { epoch: 1, final_epoch: false }, &["03 00 00 00", "01 01 00"]),
        (
            ToWorker::Commit { epoch: u64::MAX, final_epoch: true },
            &["0c 00 00 00", "01 ff ff ff ff ff ff ff ff ff 01 01"],
        ),
        (ToWorker::Stop, &["01 00 00 00", "02"]),
        (ToWorker::Abort { reason: "disk full".into() }, &["0b 00 00 00", "03 09 64 69 73 6b 20 66 75 6c 6c"]),
        (ToWorker::Heartbeat, &["01 00 00 00", "04"]),
        (ToWorker::Resume { restored_epoch: 128, first_epoch: 129 }, &["05 00 00 00", "05 80 01 81 01"]),
        (ToWorker::Rejoin { reason: "lost".into() }, &["06 00 00 00", "06 04 6c 6f 73 74"]),
        (ToWorker::Pause { paused: true }, &["02 00 00 00", "07 01"]),
        (ToWorker::Pause { paused: false }, &["02 00 00 00", "07 00"]),
    ];
    for (command, fields) in cases {
        // magic, version 6, kind 3 (to-worker), then the length and the body.
        let fields = [&["53 4c 43 43 06 00 03"], fields].concat();
        check_golden(ControlMessage::ToWorker(command), &fields);
    }
}

#[test]
fn golden_vectors_of_the_workers_reports() {
    let cases: [(ToLeader, &[&str]); 8] = [
        (ToLeader::Acked { epoch: 7, part: vec![1, 2, 3] }, &["06 00 00 00", "00 07 03 01 02 03"]),
        (ToLeader::Finished { report: Vec::new() }, &["02 00 00 00", "01 00"]),
        (ToLeader::Failed { message: "boom".into() }, &["06 00 00 00", "02 04 62 6f 6f 6d"]),
        (ToLeader::Heartbeat, &["01 00 00 00", "03"]),
        (ToLeader::DriversFinished, &["01 00 00 00", "04"]),
        (ToLeader::StopRequested, &["01 00 00 00", "05"]),
        (ToLeader::PauseRequested { paused: true }, &["02 00 00 00", "06 01"]),
        (ToLeader::PauseRequested { paused: false }, &["02 00 00 00", "06 00"]),
    ];
    for (report, fields) in cases {
        // magic, version 6, kind 4 (to-leader), then the length and the body.
        let fields = [&["53 4c 43 43 06 00 04"], fields].concat();
        check_golden(ControlMessage::ToLeader(report), &fields);
    }
}

#[test]
fn golden_vector_of_a_refusal() {
    // magic, version 6, kind 0, 2 bytes, "no"
    check_golden(ControlMessage::Refusal("no".into()), &["53 4c 43 43 06 00 00 02 00 00 00 6e 6f"]);
}

#[test]
fn a_refusal_of_any_version_decodes_and_other_frames_of_another_version_do_not() {
    for version in [0, 1, 2, 3, 4, 5, 7, 0xbeef, u16::MAX] {
        let frame = encode_as(&ControlMessage::Refusal("you are on another version".into()), version).expect("encodes");
        assert_eq!(
            decode(&frame),
            Ok(ControlMessage::Refusal("you are on another version".into())),
            "version {version}"
        );
        let frame = encode_as(&ControlMessage::ToWorker(ToWorker::Stop), version).expect("encodes");
        assert_eq!(
            decode_prefix(&frame, WIRE_VERSION),
            Err(Problem::Version { found: version, expected: WIRE_VERSION })
        );
        let error = decode(&frame).expect_err("another version");
        assert_eq!(error.code, "cluster.wire_version");
        assert!(error.message.contains(&format!("version {version}")), "{error}");
        assert!(error.message.contains("speaks 6"), "{error}");
    }
    // Invalid UTF-8 in a refusal is shown, never an error.
    let frame = [&CONTROL_MAGIC[..], &[7, 0, 0, 2, 0, 0, 0, 0xff, b'x']].concat();
    assert_eq!(decode(&frame), Ok(ControlMessage::Refusal("\u{fffd}x".into())));
}

#[test]
fn every_problem_is_named() {
    let stop = encode(&ControlMessage::ToWorker(ToWorker::Stop)).expect("encodes");
    let with_header = |kind: u8, len: u32, body: &[u8]| {
        let mut bytes = CONTROL_MAGIC.to_vec();
        bytes.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        bytes.push(kind);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    };
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (Vec::new(), "cluster.wire_truncated", "0 bytes"),
        (b"SLC".to_vec(), "cluster.wire_truncated", "3 bytes"),
        (stop[..stop.len() - 1].to_vec(), "cluster.wire_truncated", "11 bytes"),
        (b"GET / HTTP/1.1\r\n".to_vec(), "cluster.wire_magic", "\"GET / HTTP/\""),
        (b"G".to_vec(), "cluster.wire_magic", "\"G\""),
        (with_header(9, 0, b""), "cluster.wire_kind", "kind 9"),
        (with_header(3, MAX_CONTROL_BODY_BYTES + 1, b""), "cluster.wire_too_large", "1048577 bytes"),
        (with_header(3, u32::MAX, b""), "cluster.wire_too_large", "4294967295 bytes"),
        (with_header(0, u32::MAX, b""), "cluster.wire_too_large", "a refusal frame"),
        (with_header(3, 1, &[9]), "cluster.wire_body", "to-worker"),
        (with_header(3, 2, &[2, 0]), "cluster.wire_body", "1 bytes follow the message"),
        (with_header(1, 1, &[0x80]), "cluster.wire_body", "register"),
        ([stop.clone(), vec![0]].concat(), "cluster.wire_trailing", "1 bytes follow"),
    ];
    for (bytes, code, detail) in cases {
        let error = decode(&bytes).expect_err("refused");
        assert_eq!(error.code, code, "{bytes:?}: {error}");
        assert!(error.message.contains(detail), "{bytes:?}: {error}");
    }
}

#[test]
fn an_oversized_message_is_refused_when_encoding() {
    let part = vec![0u8; MAX_CONTROL_BODY_BYTES as usize];
    let error = encode(&ControlMessage::ToLeader(ToLeader::Acked { epoch: 1, part })).expect_err("too large");
    assert_eq!(error.code, "cluster.wire_too_large");
    // A refusal is cut to the bound instead, at a character boundary.
    let text = "é".repeat(MAX_CONTROL_BODY_BYTES as usize);
    let frame = refusal_frame(&text, WIRE_VERSION);
    assert_eq!(frame.len(), HEADER_BYTES + MAX_CONTROL_BODY_BYTES as usize);
    assert!(matches!(decode(&frame), Ok(ControlMessage::Refusal(cut)) if text.starts_with(&cut)));
}

/// A source that hands out `chunks` one read at a time (at most the reader's buffer),
/// then reports the end of the stream.
struct Chunks(VecDeque<Vec<u8>>);

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.0.front().is_some_and(Vec::is_empty) {
            self.0.pop_front();
        }
        let Some(front) = self.0.front_mut() else { return Ok(0) };
        let n = front.len().min(buf.len());
        buf[..n].copy_from_slice(&front[..n]);
        front.drain(..n);
        if front.is_empty() {
            self.0.pop_front();
        }
        Ok(n)
    }
}

/// Reads every frame from `source` until it ends or fails.
fn read_all(source: &mut Chunks, reader: &mut FrameReader) -> (Vec<ControlMessage>, Result<Fill, Problem>) {
    let mut messages = Vec::new();
    loop {
        match reader.next_buffered() {
            Ok(Some(message)) => messages.push(message),
            Ok(None) => match reader.fill(source).expect("in-memory reads do not fail") {
                Fill::Data => {}
                closed => return (messages, Ok(closed)),
            },
            Err(problem) => return (messages, Err(problem)),
        }
        assert!(reader.capacity() <= 2 * (HEADER_BYTES + MAX_CONTROL_BODY_BYTES as usize));
    }
}

#[test]
fn a_frame_reader_refuses_a_huge_length_before_reading_its_body() {
    let mut header = CONTROL_MAGIC.to_vec();
    header.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    header.extend_from_slice(&[3, 0xff, 0xff, 0xff, 0xff]);
    let mut source = Chunks(VecDeque::from([header, vec![0; 4096]]));
    let mut reader = FrameReader::new(WIRE_VERSION);
    let (messages, outcome) = read_all(&mut source, &mut reader);
    assert!(messages.is_empty());
    assert_eq!(outcome, Err(Problem::TooLarge { kind: Kind::ToWorker, len: u32::MAX }));
    assert!(reader.capacity() < 64, "buffered {} bytes", reader.capacity());
    // A stray's first wrong byte is enough.
    let mut source = Chunks(VecDeque::from([b"G".to_vec()]));
    let mut reader = FrameReader::new(WIRE_VERSION);
    assert_eq!(read_all(&mut source, &mut reader).1, Err(Problem::Magic { found: b"G".to_vec() }));
}

fn text() -> impl Strategy<Value = String> {
    ".{0,24}"
}

fn message() -> impl Strategy<Value = ControlMessage> {
    // Thread counts a worker may announce (others are refused: see the test above).
    let threads = || 1..=MAX_WORKER_THREADS;
    let register = (text(), threads(), text(), text(), any::<u32>(), text(), text()).prop_map(
        |(exchange_addr, threads, fingerprint, host, pid, build, admin_addr)| {
            ControlMessage::Register(Register { exchange_addr, threads, fingerprint, host, pid, build, admin_addr })
        },
    );
    let member = (any::<u32>(), text(), threads(), text())
        .prop_map(|(id, exchange_addr, threads, admin_addr)| Member { id, exchange_addr, threads, admin_addr });
    let welcome = (vec(member, 0..6), any::<u32>(), text())
        .prop_map(|(members, you, fingerprint)| ControlMessage::Welcome(Welcome { members, you, fingerprint }));
    let to_worker = prop_oneof![
        (any::<u64>(), any::<bool>()).prop_map(|(epoch, final_epoch)| ToWorker::Barrier { epoch, final_epoch }),
        (any::<u64>(), any::<bool>()).prop_map(|(epoch, final_epoch)| ToWorker::Commit { epoch, final_epoch }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(restored_epoch, first_epoch)| ToWorker::Resume { restored_epoch, first_epoch }),
        text().prop_map(|reason| ToWorker::Rejoin { reason }),
        Just(ToWorker::Stop),
        text().prop_map(|reason| ToWorker::Abort { reason }),
        Just(ToWorker::Heartbeat),
        any::<bool>().prop_map(|paused| ToWorker::Pause { paused }),
    ]
    .prop_map(ControlMessage::ToWorker);
    let to_leader = prop_oneof![
        (any::<u64>(), vec(any::<u8>(), 0..64)).prop_map(|(epoch, part)| ToLeader::Acked { epoch, part }),
        vec(any::<u8>(), 0..64).prop_map(|report| ToLeader::Finished { report }),
        text().prop_map(|message| ToLeader::Failed { message }),
        Just(ToLeader::Heartbeat),
        Just(ToLeader::DriversFinished),
        Just(ToLeader::StopRequested),
        any::<bool>().prop_map(|paused| ToLeader::PauseRequested { paused }),
    ]
    .prop_map(ControlMessage::ToLeader);
    prop_oneof![text().prop_map(ControlMessage::Refusal), register, welcome, to_worker, to_leader]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary bytes, alone and behind a valid header of every kind, never panic the
    /// decoder; whatever it accepts re-encodes to a frame that decodes to the same value.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512), kind in 0u8..6) {
        let mut framed = CONTROL_MAGIC.to_vec();
        framed.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        framed.push(kind);
        framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        framed.extend_from_slice(&bytes);
        for input in [&bytes, &framed] {
            if let Ok(message) = decode(input) {
                let again = encode(&message).expect("an accepted message encodes");
                prop_assert_eq!(decode(&again), Ok(message));
            }
            let mut reader = FrameReader::new(WIRE_VERSION);
            let _ = read_all(&mut Chunks(VecDeque::from([input.clone()])), &mut reader);
        }
    }

    /// Messages survive encoding, and a stream of them survives any split into reads.
    #[test]
    fn messages_round_trip_through_any_split(
        messages in vec(message(), 1..6),
        cuts in vec(1usize..40, 0..64),
    ) {
        let mut stream = Vec::new();
        for message in &messages {
            let frame = encode(message).expect("encodes");
            let decoded = decode(&frame);
            prop_assert_eq!(decoded.as_ref(), Ok(message));
            stream.extend_from_slice(&frame);
        }
        let mut chunks = VecDeque::new();
        let mut rest = &stream[..];
        for cut in cuts {
            let (chunk, after) = rest.split_at(cut.min(rest.len()));
            chunks.push_back(chunk.to_vec());
            rest = after;
        }
        chunks.push_back(rest.to_vec());
        let mut reader = FrameReader::new(WIRE_VERSION);
        let (read, outcome) = read_all(&mut Chunks(chunks), &mut reader);
        prop_assert_eq!(read, messages);
        prop_assert_eq!(outcome, Ok(Fill::Closed { buffered: 0 }));
    }
}
