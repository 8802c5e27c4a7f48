//! The JSON fast path: its pieces against Arrow's own readings, and the decoder with the
//! fast path on against the decoder with it off (the reference) on random and malformed
//! inputs, which must give the same batches, bad rows, errors and slow chunks.

use std::sync::Arc;

use arrow::compute::kernels::cast_utils::string_to_datetime;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};

use super::differential::{bid_schema, check_same, decode, kinds_schema};
use super::*;
use crate::UTF8_BOM;

#[test]
fn only_schemas_of_the_types_it_reads_have_a_fast_path() {
    assert!(FastJson::new(&bid_schema()).is_some());
    assert!(FastJson::new(&kinds_schema()).is_some());
    for (name, data_type) in [
        ("d", DataType::Decimal128(10, 2)),
        ("f", DataType::Float64),
        ("t", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))),
        ("v", DataType::Utf8View),
        ("day", DataType::Date32),
    ] {
        let schema = Arc::new(Schema::new(vec![Field::new(name, data_type, true)]));
        assert!(FastJson::new(&schema).is_none(), "{schema:?}");
    }
    for name in ["a\"b", "a\\b", "a\tb"] {
        let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, true)]));
        assert!(FastJson::new(&schema).is_none(), "{name:?}");
    }
    let duplicate = Field::new("a", DataType::Int64, true);
    assert!(FastJson::new(&Arc::new(Schema::new(vec![duplicate.clone(), duplicate]))).is_none());
    assert!(FastJson::new(&Arc::new(Schema::empty())).is_none());
}

#[test]
fn integers_are_read_as_json_writes_them() {
    let read = |text: &str| integer(format!("{text},").as_bytes(), 0).map(|(value, end)| (value, end == text.len()));
    for (text, value) in [
        ("0", 0),
        ("7", 7),
        ("-7", -7),
        ("1234567890123456789", 1_234_567_890_123_456_789),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775808", i64::MIN),
    ] {
        assert_eq!(read(text), Ok((value, true)), "{text}");
    }
    for declined in
        ["", "-", "-0", "00", "07", "-07", "9223372036854775808", "-9223372036854775809", "12345678901234567890"]
    {
        assert_eq!(read(declined), Err(NotMine), "{declined:?}");
    }
    // The number ends at the first byte that is no digit: the line then declines `1.5`.
    assert_eq!(integer(b"1.5", 0), Ok((1, 1)));
}

/// `text` read by Arrow's timestamp parser, in `unit` since the epoch.
fn arrow_timestamp(text: &str, unit: TimeUnit) -> Option<i64> {
    let utc: arrow::array::timezone::Tz = "+00:00".parse().ok()?;
    let parsed = string_to_datetime(&utc, text).ok()?;
    match unit {
        TimeUnit::Second => Some(parsed.timestamp()),
        TimeUnit::Millisecond => Some(parsed.timestamp_millis()),
        TimeUnit::Microsecond => Some(parsed.timestamp_micros()),
        TimeUnit::Nanosecond => parsed.timestamp_nanos_opt(),
    }
}

const UNITS: [TimeUnit; 4] = [TimeUnit::Second, TimeUnit::Millisecond, TimeUnit::Microsecond, TimeUnit::Nanosecond];

#[test]
fn timestamps_are_read_as_arrow_reads_them() {
    let mut texts = Vec::new();
    for year in (0..=9999).step_by(97).chain([0, 1, 4, 100, 400, 1600, 1900, 1969, 1970, 2000, 2024, 2026, 9999]) {
        for month in 1..=12 {
            for day in [1, 15, 28, 29, 30, 31] {
                texts.push(format!("{year:04}-{month:02}-{day:02}"));
            }
        }
        texts.push(format!("{year:04}-12-31 23:59:59"));
        texts.push(format!("{year:04}-03-01T12:34:56.789Z"));
    }
    for time in [
        " 00:00:00",
        "T00:00:00Z",
        "t23:59:59z",
        " 12:00:00.5",
        " 12:00:00.123",
        " 12:00:00.1230",
        " 12:00:00.123456",
        " 12:00:00.123456000",
        " 12:00:00.123456789",
        " 12:00:00.000000000Z",
    ] {
        for date in ["2026-01-01", "1969-12-31", "1677-09-21", "2262-04-11", "0000-01-01", "9999-12-31"] {
            texts.push(format!("{date}{time}"));
        }
    }
    let mut read = 0;
    // One cache for all: dates repeat and change.
    let mut cache = DateCache::default();
    for text in &texts {
        let quoted = format!("{text}\"");
        for unit in UNITS {
            match timestamp_text(quoted.as_bytes(), 0, unit, &mut cache) {
                Ok((value, end)) => {
                    assert_eq!(end, quoted.len(), "{text}");
                    assert_eq!(Some(value), arrow_timestamp(text, unit), "{text} in {unit:?}");
                    read += 1;
                }
                // Declined: Arrow rejects it, or the audit does (a finer fraction than the
                // unit), or nanoseconds overflow.
                Err(NotMine) => {
                    let fraction = crate::exact::fraction_misfit(text.as_bytes(), crate::exact::fraction_digits(unit));
                    assert!(
                        arrow_timestamp(text, unit).is_none() || fraction.is_some(),
                        "{text} in {unit:?} is declined but Arrow reads it exactly"
                    );
                }
            }
        }
    }
    assert!(read > texts.len() * 2, "most are read: {read} of {}", texts.len() * 4);
    for declined in [
        "2026-02-29",
        "2026-04-31",
        "2026-13-01",
        "2026-00-01",
        "2026-01-00",
        "2026-01-01 24:00:00",
        "2026-01-01 23:60:00",
        "2026-01-01 23:59:60",
        "2026-01-01 00:00:00.",
        "2026-01-01 00:00:00.1234567890",
        "2026-01-01 000000",
        "2026-01-01T00:00:00+02:00",
        "2026-01-01 00:00:00 Z",
        "2026-01-01Z",
        "2026-1-01",
        "+2026-01-01",
        "2026-01-01x00:00:00",
    ] {
        let quoted = format!("{declined}\"");
        assert_eq!(
            timestamp_text(quoted.as_bytes(), 0, TimeUnit::Nanosecond, &mut DateCache::default()),
            Err(NotMine),
            "{declined}"
        );
    }
    assert_eq!(
        timestamp_text(b"2026-01-01 00:00:00.1239\"", 0, TimeUnit::Millisecond, &mut DateCache::default()),
        Err(NotMine)
    );
    assert_eq!(
        timestamp_text(b"2300-01-01 00:00:00\"", 0, TimeUnit::Nanosecond, &mut DateCache::default()),
        Err(NotMine),
        "overflows"
    );
}

#[test]
fn keys_are_matched_whole() {
    let names = ["", "url", "dateTime", "dateTimes", "a_rather_long_name"];
    let fields: Vec<Field> = names.iter().map(|name| Field::new(*name, DataType::Int64, true)).collect();
    let Some(fast) = FastJson::new(&Arc::new(Schema::new(fields))) else { panic!("a fast path") };
    for (key, column) in [
        ("", Some(0)),
        ("url", Some(1)),
        ("ur", None),
        ("urls", None),
        ("dateTime", Some(2)),
        ("dateTimes", Some(3)),
        ("dateTimeX", None),
        ("a_rather_long_name", Some(4)),
        ("a_rather_long_nam", None),
        ("a_rather_long_namee", None),
    ] {
        // The key, then more text: a word is read past the key's end.
        let text = format!("{key}\":1, \"more\": 2}}");
        for expected in 0..=names.len() {
            let found = fast.key(text.as_bytes(), 0, expected);
            assert_eq!(found, Ok((column, key.len() + 1)), "{key:?}, expecting column {expected}");
        }
        // At the very end of the input, with no word after the key.
        let text = format!("{key}\"");
        assert_eq!(fast.key(text.as_bytes(), 0, column.unwrap_or(0)), Ok((column, key.len() + 1)), "{key:?}");
    }
    assert_eq!(fast.key(b"ur\\u006c\":1", 0, 1), Err(NotMine), "an escaped key");
    assert_eq!(fast.key(b"url", 0, 1), Err(NotMine), "an unterminated key");
}

/// The text of the JSON string `quoted` as Arrow's JSON decoder reads it into a VARCHAR.
fn arrow_text(quoted: &str) -> Option<String> {
    use arrow::array::AsArray;
    let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Utf8, true)]));
    let mut decoder = arrow::json::ReaderBuilder::new(schema).build_decoder().ok()?;
    decoder.decode(format!("{{\"a\":{quoted}}}\n").as_bytes()).ok()?;
    let batch = decoder.flush().ok()??;
    Some(batch.column(0).as_string::<i32>().value(0).to_string())
}

fn fast_text(quoted: &str) -> Fast<String> {
    let bytes = format!("{quoted},");
    let mut out = Vec::new();
    let end = text(bytes.as_bytes(), 1, &mut out)?;
    assert_eq!(end, quoted.len(), "{quoted}");
    String::from_utf8(out).map_err(|_| NotMine)
}

#[test]
fn strings_are_unescaped_as_arrow_does() {
    for quoted in [
        r#""""#,
        r#""plain""#,
        r#""a\"b\\c\/d""#,
        r#""\b\f\n\r\t""#,
        r#""\u0041\u00e9\u00E9\u20ac\u0000""#,
        r#""\ud83d\ude00 \uD83D\uDE00""#,
        r#""\ud83f\udfff""#,
        "\"tab\there\"",
        "\"é ü 😀\"",
        "\"long text that spans several words of eight bytes and \\\"an escape\\\" in it\"",
    ] {
        let fast = fast_text(quoted);
        assert_eq!(fast.as_ref().ok(), arrow_text(quoted).as_ref(), "{quoted}");
        assert!(fast.is_ok(), "{quoted}");
    }
    for declined in [
        r#""\x""#,
        r#""\u12""#,
        r#""\u12g4""#,
        r#""\ud83d""#,
        r#""\ud83dx""#,
        r#""\ud83d\u0041""#,
        r#""\udc00""#,
        r#""\udc00\ud83d""#,
        "\"unterminated",
        "\"cut\nline\"",
    ] {
        assert_eq!(fast_text(declined), Err(NotMine), "{declined}");
    }
}

#[test]
fn surrogate_pairs_arrow_reads_as_another_character_are_declined() {
    // U+20000 is \ud840\udc00; Arrow's decoder reads it as U+10000.
    assert_eq!(arrow_text(r#""\ud840\udc00""#).as_deref(), Some("\u{10000}"));
    assert_eq!(fast_text(r#""\ud840\udc00""#), Err(NotMine));
    // Every pair is either read exactly as Arrow reads it (the character it encodes) or
    // declined.
    for high in (0xD800..=0xDBFF).step_by(7) {
        for low in [0xDC00, 0xDD23, 0xDFFF] {
            let quoted = format!("\"\\u{high:04x}\\u{low:04x}\"");
            let encoded = char::decode_utf16([high, low]).next().and_then(Result::ok).map(String::from);
            if let Ok(fast) = fast_text(&quoted) {
                assert_eq!(Some(&fast), arrow_text(&quoted).as_ref(), "{quoted}");
                assert_eq!(Some(fast), encoded, "{quoted}");
            }
        }
    }
}

#[test]
fn skipped_values_are_strict_json() {
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    for value in [
        "1",
        "-0.5e+10",
        "0",
        "1E3",
        "true",
        "false",
        "null",
        r#""\u0041""#,
        "[]",
        "{}",
        r#"[1, {"a" : [null, "x"]}, -2.5]"#,
        r#"{"id": 2.5, "nested": {"deeper": []}}"#,
        deep.as_str(),
    ] {
        let bytes = format!("{value},");
        assert_eq!(skip_value(bytes.as_bytes(), 0, 0, &mut Vec::new()), Ok(value.len()), "{value}");
    }
    let too_deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    for value in [
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "+1",
        "tru",
        "nul",
        "[1,]",
        "[1 2]",
        "{\"a\"}",
        "{\"a\":1,}",
        "{1:2}",
        "\"\\x\"",
        "[",
        &too_deep,
    ] {
        let bytes = format!("{value},");
        let skipped = skip_value(bytes.as_bytes(), 0, 0, &mut Vec::new());
        // A number stops early (`01` is `0`): the line then declines what follows.
        assert!(skipped.is_err() || skipped.is_ok_and(|end| bytes.as_bytes()[end] != b','), "{value}");
    }
}

/// NEXMark bids with all kinds of text, in schema order or not.
fn bids(rows: usize) -> String {
    let mut out = String::new();
    for i in 0..rows {
        let extra = ["", "abc", "with \\\"quotes\\\" and \\\\", "\\u00e9t\\u00e9 \\ud83d\\ude00", "é"][i % 5];
        if i % 3 == 0 {
            out.push_str(&format!(
                "{{\"price\": {i}, \"auction\": {}, \"bidder\": -{}, \"dateTime\": \"2026-01-01T00:00:{:02}.{:03}Z\", \"extra\": \"{extra}\", \"other\": [1, {{\"x\": null}}]}}\r\n",
                1000 + i,
                i + 1,
                i % 60,
                i % 1000
            ));
        } else {
            out.push_str(&format!(
                "{{\"auction\":{},\"bidder\":{i},\"price\":{},\"channel\":\"Google\",\"url\":\"https://www.nexmark.com/item.htm?query=1&channel_id={i}\",\"dateTime\":\"2026-01-01 00:00:00.{:03}\",\"extra\":\"{extra}\"}}\n",
                1000 + i,
                i * 7,
                i % 1000
            ));
        }
        if i % 7 == 0 {
            out.push_str("  \n");
        }
    }
    out
}

#[test]
fn clean_chunks_take_the_fast_path() {
    let input = bids(100);
    for (capacity, batch_size) in [(0, 1024), (0, 7), (0, 1), (500, 3), (4096, 16)] {
        let chunks = check_same(&bid_schema(), input.as_bytes(), capacity, batch_size);
        assert!(chunks > 0, "capacity {capacity}, batch size {batch_size}");
        let ((_, batches, bad, slow), _) = decode(&bid_schema(), input.as_bytes(), capacity, batch_size, true);
        assert!(bad.is_empty() && slow == 0);
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 100);
        assert!(batches.iter().all(|batch| batch.num_rows() <= batch_size));
    }
    let ((_, batches, _, _), chunks) = decode(&bid_schema(), input.as_bytes(), 0, 40, true);
    assert_eq!(chunks, 1);
    assert_eq!(batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), [40, 40, 20]);
}

#[test]
fn a_chunk_with_one_bad_row_takes_the_reference_path_whole() {
    let mut input = bids(10);
    input.push_str("{\"auction\":1,\"bidder\":2,\"price\":\"x\",\"dateTime\":\"2026-01-01\"}\n");
    input.push_str(&bids(3));
    assert_eq!(check_same(&bid_schema(), input.as_bytes(), 0, 4), 0);
    let ((_, batches, bad, slow), _) = decode(&bid_schema(), input.as_bytes(), 0, 4, true);
    assert_eq!((bad.len(), bad[0].line, slow), (1, 13, 1));
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 13);
}

#[test]
fn every_kind_of_value_matches_the_reference() {
    let lines = [
        r#"{"id":1,"name":"a","ts":"2026-01-01 00:00:00.123","flag":true,"tiny":-128,"u":4294967295,"big":9223372036854775807,"s":"2026-01-01T00:00:00Z","us":"2026-01-01 00:00:00.123456","ns":"2026-01-01 00:00:00.123456789"}"#,
        r#"{"id":-9223372036854775808,"name":null,"ts":null,"flag":false,"tiny":127,"u":0,"big":0,"s":0,"us":-1,"ns":1767225600123456789}"#,
        r#"{ "ns" : null , "id" : 3 }"#,
        r#"{"id":4,"ts":1767225600123,"s":253402300799,"us":-62167219200000000}"#,
        r#"{"unknown":{"deep":[1,2,{"x":"\u0041"}]},"id":5,"other":-1.5e3}"#,
        "\t{\"id\":6}\t\r",
        r#"{"id":7,"ts":"2026-01-01"}"#,
    ];
    let input = lines.join("\n") + "\n";
    assert_eq!(check_same(&kinds_schema(), input.as_bytes(), 0, 3), 1, "the fast path takes them all");
    // Each declined value still gives the reference's row or bad row.
    for odd in [
        r#""id":1.0"#,
        r#""id":4.2e1"#,
        r#""id":"42""#,
        r#""id":-0"#,
        r#""id":007"#,
        r#""id":null"#,
        r#""tiny":128"#,
        r#""u":-1"#,
        r#""big":9223372036854775808"#,
        r#""name":42"#,
        r#""name":"\ud840\udc00""#,
        r#""flag":"true""#,
        r#""ts":"2026-01-01 00:00:00.1239""#,
        r#""ts":"2026-01-01T00:00:00+01:00""#,
        r#""ts":1767225600123.5"#,
        r#""ts":253402300800000"#,
        r#""s":"2026-01-01 00:00:00.5""#,
        r#""ns":"1600-01-01 00:00:00""#,
        r#""i\u0064":2"#,
        r#""name":"x","name":"y""#,
        r#""other":01"#,
    ] {
        let input = format!("{{\"id\":1}}\n{{\"id\":2,{odd}}}\n{{\"id\":3}}\n");
        assert_eq!(check_same(&kinds_schema(), input.as_bytes(), 0, 2), 0, "{odd}");
    }
}

#[test]
fn blank_lines_and_byte_order_marks_match_the_reference() {
    let schema = kinds_schema();
    for input in [
        "\n\n",
        " \t\r\n",
        "{\"id\":1}\n\x0c\n{\"id\":2}\n",
        "{\"id\":1}",
        "{\"id\":1}\r",
        "{\"id\":1}{\"id\":2}\n",
        "{\"id\":1}\n{\"id\":2",
        "{\"id\":1,\"name\":\"a\nb\"}\n",
        "{\"id\":1,}\n",
        "{\"id\":1 \"name\":\"a\"}\n",
        "[{\"id\":1}]\n",
    ] {
        for capacity in [0, 4, 64] {
            check_same(&schema, input.as_bytes(), capacity, 2);
        }
    }
    let with_mark = [UTF8_BOM, b"{\"id\":1}\n{\"id\":2,\"name\":\"\xEF\xBB\xBF\"}\n"].concat();
    check_same(&schema, &with_mark, 0, 2);
    check_same(&schema, &with_mark, 16, 2);
    check_same(&schema, b"{\"id\":1,\"name\":\"\xff\"}\n", 0, 2);
}

/// The values a column's key may be given: mostly ones the fast path reads, and others.
struct ColumnValues {
    name: &'static str,
    /// NOT NULL: never given `null` in a complete line.
    required: bool,
    good: &'static [&'static str],
    odd: &'static [&'static str],
}

const INTEGERS: &[&str] =
    &["0", "1", "-1", "42", "127", "-128", "255", "4294967295", "9223372036854775807", "-9223372036854775808", "null"];
const ODD_INTEGERS: &[&str] = &[
    "-0",
    "007",
    "1.0",
    "4.2e1",
    "1e3",
    "\"42\"",
    "9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999",
    "true",
    "1.5",
    "12-3",
    "-",
    "+1",
    "1 2",
    "[1]",
    "{}",
    "9007199254740993.0",
];
const TEXTS: &[&str] = &[
    "\"x\"",
    "\"\"",
    "\"é\"",
    "\"a\\\"b\"",
    "\"\\u00e9\\n\"",
    "\"\\ud83d\\ude00\"",
    "\"\\/\\b\\f\\r\\t\\\\\"",
    "\"tab\there\"",
    "null",
    "\"https://www.nexmark.com/item.htm?query=1&channel_id=1234567\"",
    "\"\\u0000\"",
];
const ODD_TEXTS: &[&str] = &[
    "\"\\ud840\\udc00\"",
    "\"\\ud83d\"",
    "\"\\udc00\"",
    "\"\\ud83dx\"",
    "\"\\x\"",
    "\"\\u12\"",
    "\"\u{feff}\"",
    "\"\\ufeff\"",
    "42",
    "true",
    "\"unterminated",
    "\"1.2345\"",
];
const TIMESTAMPS: &[&str] = &[
    "\"2026-01-01 00:00:00.123\"",
    "\"2026-01-01T00:00:00Z\"",
    "\"2026-01-01\"",
    "\"2026-01-01 00:00:00\"",
    "\"2024-02-29 23:59:59.999\"",
    "\"0000-01-01 00:00:00\"",
    "\"9999-12-31T23:59:59.999z\"",
    "\"1969-12-31 23:59:59.5\"",
    "\"2026-01-01 00:00:00.1230\"",
    "1767225600123",
    "-1",
    "0",
    "null",
];
const ODD_TIMESTAMPS: &[&str] = &[
    "\"2026-01-01 00:00:00.1239\"",
    "\"2026-02-30 00:00:00\"",
    "\"2026-01-01 24:00:00\"",
    "\"2026-01-01 23:59:60\"",
    "\"2026-01-01T00:00:00+02:00\"",
    "\"0000-01-01T00:00:00+01:00\"",
    "\"2026-01-01 00:00:00.\"",
    "\"2026-01-01 000000\"",
    "\"2026-1-01\"",
    "\"2026-01-01 00:00:00.1234567891\"",
    "\"2026-01-01T00:00:00.12\\u0033\"",
    "1767225600123.5",
    "1e300",
    "\"yesterday\"",
    "253402300800000",
    "-62167219200001",
    "\"2026-01-01 00:00:00.123456789\"",
    "\"1500-01-01\"",
];
const TINY: &[&str] = &["0", "1", "-1", "127", "-128", "null"];
const UNSIGNED: &[&str] = &["0", "1", "255", "4294967295", "null"];
const BIG_UNSIGNED: &[&str] = &["0", "1", "9223372036854775807", "null"];
const ODD_UNSIGNED: &[&str] = &["-1", "-0", "18446744073709551615", "4294967296", "1.0"];
const SECONDS: &[&str] = &[
    "\"2026-01-01T00:00:00Z\"",
    "\"2026-01-01\"",
    "\"2026-01-01 00:00:00.000\"",
    "\"0000-01-01 00:00:00\"",
    "1767225600",
    "-1",
    "null",
];
const MICROS: &[&str] = &["\"2026-01-01 00:00:00.123456\"", "\"2026-01-01T00:00:00.1Z\"", "1767225600123456", "null"];
const NANOS: &[&str] = &[
    "\"2026-01-01 00:00:00.123456789\"",
    "\"1970-01-01\"",
    "\"2262-04-11 23:47:16.854775807\"",
    "1767225600123456789",
    "-9223372036854775808",
    "null",
];
const BOOLEANS: &[&str] = &["true", "false", "null"];
const ODD_BOOLEANS: &[&str] = &["tru", "1", "\"true\"", "falsey", "nul"];
const UNKNOWN: &[&str] =
    &["[1,{\"id\":2.5}]", "{\"a\":{\"b\":[]}}", "\"\\u0041\"", "1.5e3", "-0.0", "null", "\"2026-01-01 00:00:00.1239\""];
const ODD_UNKNOWN: &[&str] = &[
    "01",
    "[",
    "{\"a\" 1}",
    "[1,]",
    "tru",
    "\"\\ud800\"",
    "-",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
];

const BID_COLUMNS: &[ColumnValues] = &[
    ColumnValues { name: "auction", required: true, good: INTEGERS, odd: ODD_INTEGERS },
    ColumnValues { name: "bidder", required: true, good: INTEGERS, odd: ODD_INTEGERS },
    ColumnValues { name: "price", required: true, good: INTEGERS, odd: ODD_INTEGERS },
    ColumnValues { name: "channel", required: false, good: TEXTS, odd: ODD_TEXTS },
    ColumnValues { name: "url", required: false, good: TEXTS, odd: ODD_TEXTS },
    ColumnValues { name: "dateTime", required: true, good: TIMESTAMPS, odd: ODD_TIMESTAMPS },
    ColumnValues { name: "extra", required: false, good: TEXTS, odd: ODD_TEXTS },
    ColumnValues { name: "other", required: false, good: UNKNOWN, odd: ODD_UNKNOWN },
];

const KINDS_COLUMNS: &[ColumnValues] = &[
    ColumnValues { name: "id", required: true, good: INTEGERS, odd: ODD_INTEGERS },
    ColumnValues { name: "name", required: false, good: TEXTS, odd: ODD_TEXTS },
    ColumnValues { name: "ts", required: false, good: TIMESTAMPS, odd: ODD_TIMESTAMPS },
    ColumnValues { name: "flag", required: false, good: BOOLEANS, odd: ODD_BOOLEANS },
    ColumnValues { name: "tiny", required: false, good: TINY, odd: INTEGERS },
    ColumnValues { name: "u", required: false, good: UNSIGNED, odd: ODD_UNSIGNED },
    ColumnValues { name: "big", required: false, good: BIG_UNSIGNED, odd: ODD_UNSIGNED },
    ColumnValues { name: "s", required: false, good: SECONDS, odd: TIMESTAMPS },
    ColumnValues { name: "us", required: false, good: MICROS, odd: ODD_TIMESTAMPS },
    ColumnValues { name: "ns", required: false, good: NANOS, odd: TIMESTAMPS },
    ColumnValues { name: "", required: false, good: UNKNOWN, odd: ODD_UNKNOWN },
];

const SPACES: &[&str] = &["", "", "", " ", "\t", "\r", "  "];
const ODD_KEYS: &[&str] = &["\"i\\u0064\"", "\"\\u0041\"", "\"na\nme\"", "\"x\""];
const LINE_ENDS: &[&str] = &["\n", "\n", "\n", "\n", "\r\n", " \n", "\n\n", "\n \t\n", "", "\x0c\n"];
const JUNK: &[&[u8]] = &[b"{", b"}", b"\"", b"\\", b"\n", b"\xff", b"{}{}", b"[]", b"1", b"\xEF\xBB\xBF", b",", b":"];

/// A JSON line of `columns`: mostly good members, in schema order or shuffled.
fn json_line(columns: &'static [ColumnValues]) -> impl Strategy<Value = String> {
    let member = (any::<Index>(), 0..100u8, any::<Index>(), select(SPACES), select(SPACES)).prop_map(
        move |(column, odds, value, before, after)| {
            let column = column.get(columns);
            let key = match odds {
                // The key with its first character escaped: the column it names.
                0..=1 => match column.name.chars().next() {
                    Some(first) => format!("\"\\u{:04x}{}\"", u32::from(first), &column.name[first.len_utf8()..]),
                    None => "\"\"".to_string(),
                },
                2 => value.get(ODD_KEYS).to_string(),
                _ => format!("\"{}\"", column.name),
            };
            let value = if odds >= 92 { value.get(column.odd) } else { value.get(column.good) };
            format!("{before}{key}{after}:{before}{value}{after}")
        },
    );
    let shape = (vec(member, 0..10), 0..20u8, select(LINE_ENDS), select(SPACES));
    shape.prop_map(|(members, separator, end, space)| {
        let separator = match separator {
            0 => "",
            1 => ",,",
            _ => ",",
        };
        format!("{space}{{{}}}{space}{end}", members.join(separator))
    })
}

/// A line of every column but some optional ones, mostly with good values, in schema
/// order or rotated.
fn complete_line(columns: &'static [ColumnValues]) -> impl Strategy<Value = String> {
    let choices = vec((any::<Index>(), 0..100u8), columns.len());
    (choices, any::<Index>(), 0..4u8, select(SPACES), select(&LINE_ENDS[..5])).prop_map(
        move |(choices, rotation, shape, space, end)| {
            let mut members: Vec<String> = (columns.iter().zip(choices))
                .filter_map(|(column, (value, odds))| {
                    let good: Vec<&str> =
                        column.good.iter().copied().filter(|value| !column.required || *value != "null").collect();
                    let value = match odds {
                        0..=19 if !column.required => return None,
                        20 => value.get(column.odd),
                        _ => value.get(&good),
                    };
                    Some(format!("\"{}\":{space}{value}", column.name))
                })
                .collect();
            if shape == 0 {
                let length = members.len().max(1);
                members.rotate_left(rotation.index(length));
            }
            format!("{{{}}}{end}", members.join(","))
        },
    )
}

/// Inputs of complete lines, of mostly good lines among junk, or of random bytes; some
/// start with a byte order mark.
fn json_input(columns: &'static [ColumnValues]) -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        16 => complete_line(columns).prop_map(String::into_bytes),
        8 => json_line(columns).prop_map(String::into_bytes),
        1 => select(JUNK).prop_map(<[u8]>::to_vec),
        1 => any::<u8>().prop_map(|byte| vec![byte]),
    ];
    let complete = vec(complete_line(columns).prop_map(String::into_bytes), 0..12);
    let lines = (prop_oneof![complete, vec(piece, 0..16)], prop::bool::weighted(0.1)).prop_map(|(pieces, mark)| {
        let mut input = if mark { UTF8_BOM.to_vec() } else { Vec::new() };
        input.extend(pieces.concat());
        input
    });
    let soup = vec(select(TOKENS), 0..60).prop_map(|tokens| tokens.concat().into_bytes());
    prop_oneof![8 => lines, 2 => soup, 1 => vec(any::<u8>(), 0..200)]
}

/// Pieces of JSON lines that reach the decoders' corners, for token soups.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\n",
    "\r\n",
    " ",
    "{\"id\":",
    "{\"auction\":1,\"bidder\":2,\"price\":3,\"dateTime\":",
    "\"name\":",
    "\"ts\":",
    "\"flag\":",
    "\"extra\":",
    "1",
    "-1",
    "5.5",
    "1e30",
    "null",
    "true",
    "\"2026-01-01 00:00:00.123\"",
    "\"2026-01-01 00:00:00.1239\"",
    "1767225600123",
    "\"x\"",
    "\"\\u00e9\"",
    "\"\\ud83d\\ude00\"",
    "\u{feff}",
    "é",
];

/// Whole (0), in chunks of one line or less, or of a few lines.
fn capacity() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 1 => 1..64usize, 3 => 200..1500usize]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn the_fast_path_decodes_bids_as_the_reference_does(
        input in json_input(BID_COLUMNS),
        capacity in capacity(),
        batch_size in prop_oneof![1..5usize, Just(1024)],
    ) {
        check_same(&bid_schema(), &input, capacity, batch_size);
    }

    #[test]
    fn the_fast_path_decodes_every_kind_as_the_reference_does(
        input in json_input(KINDS_COLUMNS),
        capacity in capacity(),
        batch_size in prop_oneof![1..5usize, Just(1024)],
    ) {
        check_same(&kinds_schema(), &input, capacity, batch_size);
    }
}
