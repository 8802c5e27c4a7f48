use std::sync::Arc;

use arrow::array::{ArrayRef, DictionaryArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use proptest::prelude::*;

use super::*;

fn batch(rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("kind", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
    let names: ArrayRef =
        Arc::new(StringArray::from_iter((0..rows).map(|i| (i % 3 != 0).then(|| format!("name-{i}")))));
    let kinds: DictionaryArray<Int32Type> = (0..rows).map(|i| if i % 2 == 0 { "even" } else { "odd" }).collect();
    RecordBatch::try_new(schema, vec![ids, names, Arc::new(kinds)]).expect("batch")
}

/// Decodes every frame in `bytes` through one decoder, as a reader thread does.
fn decode_all(bytes: &[u8], decoder: &mut ChannelDecoder) -> Vec<Message> {
    let mut reader = bytes;
    let mut out = Vec::new();
    while let Some(frame) = read_frame(&mut reader).expect("frame") {
        match frame {
            Frame::Message { channel, kind, body } => {
                out.push(decoder.decode_message(channel, kind, body).expect("message"))
            }
            Frame::Credit { .. } => panic!("no credit expected"),
        }
    }
    out
}

#[test]
fn golden_preamble_header_and_control_frames() {
    // Pinned bytes: a change here breaks every worker of an older build. Bump
    // DATA_VERSION and update these vectors together.
    let preamble = Preamble { version: DATA_VERSION, run: 0x0102_0304_0506_0708, from: 2, to: 1 };
    assert_eq!(preamble.encode(), [b'S', b'L', b'C', b'D', 2, 0, 8, 7, 6, 5, 4, 3, 2, 1, 2, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(Preamble::decode(&preamble.encode()).expect("decode"), preamble);

    let mut out = Vec::new();
    let mut encoder = ChannelEncoder::default();
    encoder.encode(7, &Message::Watermark(-2), MAX_FRAME_BODY_BYTES, &mut out).expect("watermark");
    encoder.encode(7, &Message::Barrier(Epoch(3)), MAX_FRAME_BODY_BYTES, &mut out).expect("barrier");
    encoder.encode(7, &Message::EndOfData, MAX_FRAME_BODY_BYTES, &mut out).expect("end");
    encode_credit(9, 1 << 20, &mut out);
    #[rustfmt::skip]
    let expected: Vec<u8> = vec![
        2, 7, 0, 0, 0, 8, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        3, 7, 0, 0, 0, 8, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
        4, 7, 0, 0, 0, 0, 0, 0, 0,
        5, 9, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0,
    ];
    assert_eq!(out, expected);

    let mut reader = &out[..];
    let mut decoder = ChannelDecoder::new(None);
    let mut seen = Vec::new();
    while let Some(frame) = read_frame(&mut reader).expect("frame") {
        seen.push(match frame {
            Frame::Credit { channel, bytes } => format!("credit {channel} {bytes}"),
            Frame::Message { channel, kind, body } => {
                match decoder.decode_message(channel, kind, body).expect("decode") {
                    Message::Watermark(w) => format!("wm {w}"),
                    Message::Barrier(e) => format!("barrier {}", e.0),
                    Message::EndOfData => "end".into(),
                    Message::Data(_) => "data".into(),
                }
            }
        });
    }
    assert_eq!(seen, ["wm -2", "barrier 3", "end", "credit 9 1048576"]);
}

#[test]
fn golden_data_frame_prefix() {
    // The part of a data frame the project owns: header, weights tag, weights. The rest
    // is Arrow IPC (continuation marker 0xffffffff, then the schema message's length).
    let rows = batch(2);
    let mut out = Vec::new();
    let data = Message::Data(Batch::with_weights(rows, Int64Array::from(vec![1, -1])));
    ChannelEncoder::default().encode(4, &data, MAX_FRAME_BODY_BYTES, &mut out).expect("encode");
    assert_eq!(out[0], 1, "kind: data");
    assert_eq!(&out[1..5], &[4, 0, 0, 0], "channel");
    assert_eq!(u32::from_le_bytes(out[5..9].try_into().unwrap()) as usize, out.len() - HEADER_BYTES, "body length");
    assert_eq!(
        &out[9..17],
        &[0x81, 0, 0, 0, 2, 0, 0, 0],
        "flags (a new IPC stream, weights follow), padding, row count"
    );
    assert_eq!(
        &out[17..33],
        &[1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        "weights +1, -1"
    );
    assert_eq!(&out[33..37], &[0xff; 4], "Arrow IPC continuation marker");
}

#[test]
fn batches_round_trip_with_weights_dictionaries_and_the_schema_sent_once() {
    let mut encoder = ChannelEncoder::default();
    let mut first = Vec::new();
    encoder.encode(1, &Message::Data(Batch::inserts(batch(5))), MAX_FRAME_BODY_BYTES, &mut first).expect("first");
    let mut second = Vec::new();
    let weighted = Batch::with_weights(batch(3), Int64Array::from(vec![1, -1, 2]));
    encoder.encode(1, &Message::Data(weighted), MAX_FRAME_BODY_BYTES, &mut second).expect("second");
    assert!(
        second.len() < first.len(),
        "the second frame carries no schema ({} vs {} bytes)",
        second.len(),
        first.len()
    );

    let mut decoder = ChannelDecoder::new(Some(batch(0).schema()));
    let mut all = first.clone();
    all.extend_from_slice(&second);
    let messages = decode_all(&all, &mut decoder);
    let [Message::Data(a), Message::Data(b)] = &messages[..] else { panic!("two batches, got {}", messages.len()) };
    assert_eq!(a.rows, batch(5));
    assert!(matches!(a.weights, Weights::Inserts));
    assert_eq!(b.rows, batch(3));
    assert_eq!((0..3).map(|i| b.weight(i)).collect::<Vec<_>>(), [1, -1, 2]);
}

#[test]
fn a_batch_above_the_frame_limit_is_split_and_a_row_above_it_is_refused() {
    let rows = batch(1000);
    let weights = Int64Array::from_iter_values((0..1000).map(|i| if i % 2 == 0 { 1 } else { -1 }));
    let mut out = Vec::new();
    let mut encoder = ChannelEncoder::default();
    encoder.encode(2, &Message::Data(Batch::with_weights(rows.clone(), weights)), 4096, &mut out).expect("split");
    let messages = decode_all(&out, &mut ChannelDecoder::new(None));
    assert!(messages.len() > 1, "split into {} frames", messages.len());
    let mut offset = 0;
    for message in &messages {
        let Message::Data(part) = message else { panic!("data only") };
        assert_eq!(part.rows, rows.slice(offset, part.num_rows()));
        for i in 0..part.num_rows() {
            assert_eq!(part.weight(i), if (offset + i) % 2 == 0 { 1 } else { -1 });
        }
        offset += part.num_rows();
    }
    assert_eq!(offset, 1000);

    let error = ChannelEncoder::default()
        .encode(2, &Message::Data(Batch::inserts(batch(1))), 16, &mut Vec::new())
        .expect_err("one row cannot fit 16 bytes");
    assert_eq!(error.code, "cluster.row_too_large");
}

#[test]
fn bad_frames_are_errors_that_name_the_problem() {
    let header = |kind: u8, length: u32| Header { kind, channel: 3, length }.encode();
    let error = Header::decode(&header(9, 0)).expect_err("unknown kind");
    assert!(error.message.contains("unknown frame kind 9"), "{}", error.message);
    let error = Header::decode(&header(1, MAX_FRAME_BODY_BYTES + 1)).expect_err("too long");
    assert!(error.message.contains("above the limit"), "{}", error.message);

    let mut truncated = header(2, 8).to_vec();
    truncated.extend_from_slice(&[1, 2, 3]);
    assert_eq!(read_frame(&mut &truncated[..]).expect_err("truncated").kind, ErrorKind::LostPeer);
    assert_eq!(read_frame(&mut &header(2, 8)[..4]).expect_err("cut header").kind, ErrorKind::LostPeer);
    assert_eq!(read_frame(&mut &[][..]).expect("clean end"), None);

    let mut decoder = ChannelDecoder::new(None);
    for body in [
        vec![],
        vec![7],
        vec![1, 0, 0, 0, 9, 0, 0, 0],
        vec![0, 1, 2, 3, 0, 0, 0, 0],
        vec![0],
        vec![0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0, 0, 0, 0, 1, 0, 0, 0],
    ] {
        assert!(decoder.decode_message(3, 1, body.clone()).is_err(), "{body:?} is not a data body");
    }
    assert!(decoder.decode_message(3, 4, vec![1]).is_err(), "an end with a body");
    assert!(decoder.decode_message(3, 2, vec![1, 2]).is_err(), "a short watermark");

    let mut other = Vec::new();
    let schema_b = Arc::new(Schema::new(vec![Field::new("other", DataType::Int64, false)]));
    let rows_b = RecordBatch::try_new(schema_b, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
    ChannelEncoder::default()
        .encode(3, &Message::Data(Batch::inserts(rows_b)), MAX_FRAME_BODY_BYTES, &mut other)
        .unwrap();
    let Frame::Message { kind, body, .. } = read_frame(&mut &other[..]).unwrap().unwrap() else { panic!() };
    let error = ChannelDecoder::new(Some(batch(0).schema())).decode_message(3, kind, body).expect_err("schema");
    assert!(error.message.contains("the plan expects"), "{}", error.message);

    let refused = Preamble::decode(b"GET / HTTP/1.1\r\nHost: ").expect_err("http");
    assert_eq!(refused.code, "cluster.data_preamble");
}

#[test]
fn the_answer_round_trips_and_is_bounded() {
    let mut out = Vec::new();
    write_answer(&mut out, None).unwrap();
    assert_eq!(read_answer(&mut &out[..]).unwrap(), None);
    let mut out = Vec::new();
    let long = "é".repeat(MAX_REFUSAL_BYTES);
    write_answer(&mut out, Some(&long)).unwrap();
    let text = read_answer(&mut &out[..]).unwrap().expect("refused");
    assert!(text.len() <= MAX_REFUSAL_BYTES && text.chars().all(|c| c == 'é'));
    assert!(read_answer(&mut &[7u8][..]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the frame reader or the message decoder, and never
    /// make them allocate past the frame bound.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut reader = &bytes[..];
        let mut decoder = ChannelDecoder::new(None);
        for _ in 0..64 {
            match read_frame(&mut reader) {
                Ok(Some(Frame::Message { channel, kind, body })) => {
                    prop_assert!(body.len() <= MAX_FRAME_BODY_BYTES as usize);
                    let _ = decoder.decode_message(channel, kind, body);
                }
                Ok(Some(Frame::Credit { .. })) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// A valid data frame with its body's bytes mutated decodes or fails, never panics.
    #[test]
    fn mutated_data_frames_never_panic(position in 0usize..4096, value in any::<u8>(), rows in 1usize..20) {
        let mut out = Vec::new();
        ChannelEncoder::default().encode(1, &Message::Data(Batch::inserts(batch(rows))), MAX_FRAME_BODY_BYTES, &mut out).unwrap();
        let at = HEADER_BYTES + position % (out.len() - HEADER_BYTES);
        out[at] = value;
        if let Ok(Some(Frame::Message { channel, kind, body })) = read_frame(&mut &out[..]) {
            let _ = ChannelDecoder::new(None).decode_message(channel, kind, body);
        }
    }
}
