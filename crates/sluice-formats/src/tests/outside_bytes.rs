//! Any bytes: the properties of [`crate::properties`], which the fuzz targets in `fuzz/`
//! also check, on inputs built from tokens that reach the decoders' corners (quotes,
//! line breaks, byte order marks, the column names, numbers and timestamps that do not
//! fit, invalid UTF-8) and from plain random bytes.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use crate::properties::{check_chunker, check_chunker_scans, check_csv_records, check_decoder};
use crate::{RowFormat, UTF8_BOM};

const CSV_TOKENS: &[&[u8]] = &[
    b",",
    b";",
    b"\"",
    b"\"\"",
    b"\n",
    b"\r\n",
    b"\r",
    b" ",
    b"\t",
    b"1",
    b"-42",
    b"9.5",
    b"1.239",
    b"1.230",
    b"e5",
    b"123456789",
    b"abc",
    b"2026-01-01 00:00:00.123",
    b"2026-01-01T00:00:00.1239Z",
    b"0000-01-01T00:00:00+01:00",
    b"id,name,ts,d",
    b"\xEF\xBB\xBF",
    b"\xff",
    b"\xc3\xa9",
];

const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"\\",
    b"\n",
    b"\r\n",
    b" ",
    b"{\"id\":",
    b"\"name\":",
    b"\"ts\":",
    b"\"d\":",
    b"1",
    b"-1",
    b"5.5",
    b"1e30",
    b"-9223372036854775809",
    b"\"1.239\"",
    b"1.230",
    b"\"e5\"",
    b"null",
    b"true",
    b"\"2026-01-01 00:00:00.1239\"",
    b"1767225600123",
    b"\"x\"",
    b"{\"id\":1,\"d\":1.5}",
    b"\xEF\xBB\xBF",
    b"\xff",
];

/// Inputs of up to `tokens` pieces drawn from `vocabulary`, or random bytes.
fn input(vocabulary: &'static [&'static [u8]], tokens: usize) -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        6 => select(vocabulary).prop_map(<[u8]>::to_vec),
        1 => any::<u8>().prop_map(|byte| vec![byte]),
    ];
    prop_oneof![
        6 => vec(token, 0..tokens).prop_map(|pieces| pieces.concat()),
        1 => vec(any::<u8>(), 0..tokens * 4),
    ]
}

/// Records of mostly good rows among bad ones, blank lines and `junk`.
fn records(record: BoxedStrategy<String>, junk: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        12 => record.prop_map(String::into_bytes),
        1 => select(junk).prop_map(<[u8]>::to_vec),
        1 => any::<u8>().prop_map(|byte| vec![byte]),
    ];
    vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

const LINE_ENDS: &[&str] = &["\n", "\n", "\n", "\r\n", "\n\n", " \n"];

const CSV_IDS: &[&str] = &["1", "-42", "0", "1", "2", "9.5", "abc", "", "\"7\"", "99999999999999999999"];
const CSV_NAMES: &[&str] =
    &["x", "", "\"a,b\"", "\"q\nr\"", "\"say \"\"hi\"\"\"", "5\" screen", "name", "\u{feff}n", "é", "\"\r\n\""];
const CSV_TIMESTAMPS: &[&str] = &[
    "",
    "2026-01-01 00:00:00.123",
    "2026-01-01T00:00:00Z",
    "2026-01-01 00:00:00.1239",
    "2026-01-01 00:00:00.1230",
    "0000-01-01T00:00:00+01:00",
    "yesterday",
    "2026-01-01",
];
const CSV_DECIMALS: &[&str] = &["", "1.5", "1.239", "1.230", "e5", "+.", "123456789", "-0.001", "1e2", "\"2.50\""];

/// A CSV record of mostly four fields, each good or bad for its column.
fn csv_record() -> BoxedStrategy<String> {
    let fields = (select(CSV_IDS), select(CSV_NAMES), select(CSV_TIMESTAMPS), select(CSV_DECIMALS));
    (fields, 0..10u8, select(LINE_ENDS))
        .prop_map(|((id, name, ts, d), shape, end)| {
            let mut fields = vec![id, name, ts, d];
            match shape {
                0 => drop(fields.pop()),
                1 => fields.push("extra"),
                _ => {}
            }
            fields.join(",") + end
        })
        .boxed()
}

const JSON_IDS: &[&str] = &["1", "-1", "2", "5.5", "\"42\"", "42.0", "1e30", "-9223372036854775809", "null", "true"];
const JSON_NAMES: &[&str] = &["\"x\"", "42", "null", "\"\\u0041\\n\"", "\"\u{feff}\"", "\"\\\"id\\\":5.5\""];
const JSON_TIMESTAMPS: &[&str] = &[
    "\"2026-01-01 00:00:00.123\"",
    "\"2026-01-01 00:00:00.1239\"",
    "\"2026-01-01 00:00:00.1230\"",
    "\"2026-01-01T00:00:00.12\\u0033\"",
    "\"2026-01-01T00:00:00.123\\u0034\"",
    "1767225600123",
    "1767225600123.5",
    "1e300",
    "null",
];
const JSON_DECIMALS: &[&str] =
    &["1.5", "1.239", "\"1.239\"", "\"e5\"", "\"-.\"", "123456789", "1.230", "null", "\"1\\u002e5\""];

/// A JSON line: an object with some of the columns, good or bad, and other keys.
fn json_record() -> BoxedStrategy<String> {
    let member = prop_oneof![
        3 => select(JSON_IDS).prop_map(|value| format!("\"id\":{value}")),
        1 => select(JSON_NAMES).prop_map(|value| format!("\"name\":{value}")),
        1 => select(JSON_TIMESTAMPS).prop_map(|value| format!("\"ts\":{value}")),
        1 => select(JSON_DECIMALS).prop_map(|value| format!("\"d\":{value}")),
        1 => Just("\"other\":[1,{\"id\":2.5}]".to_string()),
    ];
    (vec(member, 0..6), select(LINE_ENDS)).prop_map(|(members, end)| format!("{{{}}}{end}", members.join(","))).boxed()
}

fn csv(delimiter: u8, header: bool) -> RowFormat {
    RowFormat::Csv { header, delimiter }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn csv_records_are_found_alike_whole_in_pieces_and_after_a_skip(
        bytes in prop_oneof![records(csv_record(), CSV_TOKENS), input(CSV_TOKENS, 80)],
        semicolon in any::<bool>(),
        piece_bytes in 1..40usize,
    ) {
        check_csv_records(&bytes, if semicolon { b';' } else { b',' }, piece_bytes);
    }

    #[test]
    fn the_chunker_hands_out_every_byte_once_in_whole_records(
        bytes in prop_oneof![records(csv_record(), CSV_TOKENS), input(CSV_TOKENS, 80)],
        json in any::<bool>(),
        capacity in 1..64usize,
        read_bytes in 1..16usize,
    ) {
        let format = if json { RowFormat::Json } else { csv(b',', false) };
        check_chunker(format, &bytes, capacity, read_bytes);
    }

    #[test]
    fn the_chunker_cuts_alike_whatever_its_search(
        bytes in prop_oneof![records(csv_record(), CSV_TOKENS), input(CSV_TOKENS, 80)],
        without_quotes in any::<bool>(),
        byte_order_mark in any::<bool>(),
        json in any::<bool>(),
        capacity in 1..64usize,
        read_bytes in 1..80usize,
        block_bytes in 1..24usize,
    ) {
        let mut bytes = bytes;
        if without_quotes {
            bytes.retain(|byte| *byte != b'"');
        }
        if byte_order_mark {
            bytes.splice(0..0, UTF8_BOM.iter().copied());
        }
        let format = if json { RowFormat::Json } else { csv(b',', false) };
        check_chunker_scans(format, &bytes, capacity, read_bytes, block_bytes);
        check_chunker(format, &bytes, capacity, read_bytes);
    }

    #[test]
    fn csv_decodes_any_bytes_into_rows_and_bad_rows(
        bytes in prop_oneof![records(csv_record(), CSV_TOKENS), input(CSV_TOKENS, 60)],
        header in any::<bool>(),
        capacity in 1..96usize,
        batch_size in 1..8usize,
    ) {
        check_decoder(csv(b',', header), &bytes, capacity, batch_size);
    }

    #[test]
    fn json_decodes_any_bytes_into_rows_and_bad_rows(
        bytes in prop_oneof![records(json_record(), JSON_TOKENS), input(JSON_TOKENS, 60)],
        capacity in 1..128usize,
        batch_size in 1..8usize,
    ) {
        check_decoder(RowFormat::Json, &bytes, capacity, batch_size);
    }
}

#[test]
fn a_byte_order_mark_before_a_quoted_first_field_regression() {
    // The decoder skips the mark; the chunker must read the quote after it as the start
    // of a quoted field too, or it cuts the record at its quoted line break.
    let input = [UTF8_BOM, b"\"a\nb\",,,\n2,x,,\n"].concat();
    check_chunker(csv(b',', false), &input, 8, 3);
    check_decoder(csv(b',', false), &input, 64, 4);
}

#[test]
fn a_byte_order_mark_longer_than_the_buffer_regression() {
    // A buffer shorter than the mark is skipped as an over-long record; the chunker must
    // still find where the mark ends (and a quote after it opens a quoted field), or
    // where what began like a mark turns out to be field bytes.
    let inputs: [&[u8]; 4] = [b"\"\n1", b"\"\n1\"\n2,x\n", b"\n\"\n", b""];
    for rest in inputs {
        for mark in [UTF8_BOM, &UTF8_BOM[..2], &UTF8_BOM[..1]] {
            let input = [mark, rest].concat();
            for capacity in 1..=4 {
                for read_bytes in 1..=3 {
                    check_chunker(csv(b',', false), &input, capacity, read_bytes);
                }
                check_decoder(csv(b',', false), &input, capacity, 1);
            }
        }
    }
}
