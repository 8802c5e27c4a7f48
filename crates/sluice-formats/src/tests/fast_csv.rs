//! The one-pass CSV decoder ([`crate::fast_csv`]) against the general path: the same
//! batches, bad rows, errors and slow chunks with the fast path on and off, on CSV
//! rows of every column type it reads (clean, or with malformed fields, quotes, wrong
//! field counts, values that overflow, odd timestamps, blank lines, CRLF, byte order
//! marks, invalid UTF-8), on random bytes, whole and through chunkers of several
//! sizes, in batches of several sizes.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use proptest::prelude::*;

use crate::RowFormat;
use crate::fast_csv::FastCsv;
use crate::properties::{check_fast_path, fast_path_schema};

/// A schema with a column the fast path does not read: it is never used.
fn date_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("x", DataType::Date32, true)]))
}

const SIGNED: &[&str] = &["0", "1", "-5", "+7", "007", "-0", "127", "-128", "42"];
const UNSIGNED: &[&str] = &["0", "1", "+7", "007", "255", "42"];
const TEXTS: &[&str] = &["abc", "Google", "https://www.nexmark.com/item.htm?query=1", "é ü", "a b", "x"];
const BOOLEANS: &[&str] = &["true", "false", "TRUE", "False"];
const TIMESTAMPS: &[&str] = &[
    "2026-01-01 00:00:00",
    "2026-01-01 00:00:00.123",
    "2026-01-01T12:34:56Z",
    "2026-01-01t12:34:56.5z",
    "2026-01-01",
    "2024-02-29 23:59:59.999999999",
    "1970-01-01 00:00:00.000000000",
    "1969-12-31 23:59:59.9",
    "0000-01-01 00:00:00",
    "9999-12-31 23:59:59.999",
    "2262-04-11 23:47:16.854775807",
    "1677-09-21 00:12:44",
];
/// Fields that are bad, or that only the general path reads.
const ODD: &[&str] = &[
    "",
    " 5",
    "5 ",
    "1e3",
    "5.0",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "256",
    "-1",
    "+",
    "tru",
    "yes",
    "\"",
    "\"a,b\"",
    "\"a\"\"b\"",
    "\"x\ny\"",
    "\r",
    "\u{feff}",
    "\u{feff}1",
    " ",
    "\t",
    "2026-02-30",
    "2026-01-01 24:00:00",
    "2026-01-01 23:59:60",
    "2026-01-01 00:00:00.1234",
    "2026-01-01 00:00:00.1230",
    "2026-01-01 00:00:00.",
    "2026-01-01 00:00:00.1234567891",
    "2026-01-01T00:00:00+02:00",
    "0000-01-01T00:00:00+01:00",
    "2262-04-11 23:47:16.854775808",
    "1677-09-21 00:12:43",
    "2026-01-01 000000",
    "1.5",
];

/// Odd integers for integer columns.
const ODD_INTEGERS: &[&str] = &[
    " 5",
    "5 ",
    "1e3",
    "5.0",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "256",
    "-1",
    "+",
    "-",
    "32768",
    "2147483648",
    "-129",
];
const FLOATS: &[&str] = &["1.5", "-0.25", "3", "+2.0", "007.10", "0.1", "0.30000000000000004", "123456789.123456789"];
const DECIMALS: &[&str] = &["1.5", "-0.25", "3", "+2.0", "007.10", "1.230", "0012345678.9900", "-99999999.99", "0"];
/// Odd decimals for the DECIMAL(10, 2) column.
const ODD_DECIMALS: &[&str] =
    &["1.239", "123456789", "1e2", ".5", "5.", "+.", "e5", " 1.5", "1.5 ", "0.001", "100000000.00"];
/// Odd floats for float columns.
const ODD_FLOATS: &[&str] =
    &["1e5", ".5", "5.", "NaN", "inf", "-inf", " 1.5", "1.5 ", "1,5", "3.4028236e38", "1e400", "0x10"];
/// Odd timestamps for timestamp columns.
const ODD_TIMESTAMPS: &[&str] = &[
    "2026-02-30",
    "2026-01-01 24:00:00",
    "2026-01-01 23:59:60",
    "2026-01-01 00:00:00.1234",
    "2026-01-01 00:00:00.1230",
    "2026-01-01 00:00:00.5",
    "2026-01-01 00:00:00.000001",
    "2026-01-01 00:00:00.1234567891",
    "2026-01-01 00:00:00.",
    "2026-01-01T00:00:00+02:00",
    "0000-01-01T00:00:00+01:00",
    "2262-04-11 23:47:16.854775808",
    "1677-09-21 00:12:43",
    "2026-01-01 000000",
    "2026-01-01 ",
    "2026-01-01T",
    "2026-01-01Z",
    "1900-02-29",
];

/// A field of a column of `data_type`: a value of its type picked by `pick`, empty
/// (NULL) now and then if the column is `nullable`; when `odd`, one field in 8 is odd:
/// a field of [`ODD`], an odd value of its type, a value of another type, or empty.
fn field(data_type: &DataType, nullable: bool, pick: u16, odd: bool) -> Vec<u8> {
    let choose = |list: &[&str]| list[usize::from(pick / 64) % list.len()].as_bytes().to_vec();
    let kind = pick % 64;
    let is_integer = data_type.is_integer();
    match data_type {
        _ if odd && kind < 2 => choose(ODD),
        DataType::Timestamp(_, _) if odd && kind < 5 => choose(ODD_TIMESTAMPS),
        _ if odd && is_integer && kind < 5 => choose(ODD_INTEGERS),
        _ if odd && data_type.is_floating() && kind < 5 => choose(ODD_FLOATS),
        DataType::Decimal128(_, _) if odd && kind < 5 => choose(ODD_DECIMALS),
        _ if odd && kind < 6 => choose(&[SIGNED, TIMESTAMPS, TEXTS, BOOLEANS].concat()),
        _ if odd && kind < 8 => Vec::new(),
        _ if kind % 16 == 8 && nullable => Vec::new(),
        DataType::Utf8 => choose(TEXTS),
        DataType::Boolean => choose(BOOLEANS),
        DataType::Timestamp(unit, _) => {
            let digits = crate::exact::fraction_digits(*unit);
            let fitting: Vec<&str> = (TIMESTAMPS.iter().copied())
                .filter(|text| crate::exact::fraction_misfit(text.as_bytes(), digits).is_none())
                .filter(|text| *unit != TimeUnit::Nanosecond || !(text.starts_with("0000") || text.starts_with("9999")))
                .collect();
            choose(&fitting)
        }
        DataType::Int64 if kind % 16 == 9 => choose(&["9223372036854775807", "-9223372036854775808"]),
        DataType::Int32 if kind % 16 == 9 => choose(&["2147483647", "-2147483648"]),
        DataType::UInt64 if kind % 16 == 9 => b"18446744073709551615".to_vec(),
        DataType::UInt32 if kind % 16 == 9 => b"4294967295".to_vec(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => choose(UNSIGNED),
        DataType::Float32 | DataType::Float64 => choose(FLOATS),
        DataType::Decimal128(_, _) => choose(DECIMALS),
        DataType::Date32 => choose(&["2026-01-01", "1970-01-01"]),
        _ => choose(SIGNED),
    }
}

/// A CSV text of `rows` (a `u16` per field picks its value, a `u8` the shape of the
/// line): clean unless `odd`, when lines may also have a field too many or too few,
/// a lone `\r`, or only whitespace. Clean lines end in `\n` or `\r\n`, and some are
/// empty.
fn csv_text(schema: &SchemaRef, delimiter: u8, rows: &[(u8, Vec<u16>)], odd: bool) -> Vec<u8> {
    let columns = schema.fields().len();
    let mut text = Vec::new();
    for (shape, picks) in rows {
        let fields = match shape % 64 {
            0 if odd => columns + 1,
            1 if odd => columns - 1,
            _ => columns,
        };
        for index in 0..fields {
            if index > 0 {
                text.push(delimiter);
            }
            let pick = picks.get(index).copied().unwrap_or(0);
            let (data_type, nullable) = match schema.fields().get(index) {
                Some(field) => (field.data_type(), field.is_nullable()),
                None => (&DataType::Utf8, true),
            };
            text.extend(self::field(data_type, nullable, pick, odd));
        }
        match shape / 32 {
            0 => text.extend_from_slice(b"\r\n"),
            1 => text.extend_from_slice(b"\n\n"),
            2 if odd && shape % 2 == 0 => text.extend_from_slice(b"\n  \n"),
            3 if odd && shape % 2 == 0 => text.push(b'\r'),
            _ => text.push(b'\n'),
        }
    }
    text
}

/// The header line of `schema`'s column names.
fn header(schema: &SchemaRef, delimiter: u8) -> Vec<u8> {
    let names: Vec<&str> = schema.fields().iter().map(|field| field.name().as_str()).collect();
    let mut line = names.join(&char::from(delimiter).to_string()).into_bytes();
    line.push(b'\n');
    line
}

fn rows(columns: usize) -> impl Strategy<Value = Vec<(u8, Vec<u16>)>> {
    prop::collection::vec((any::<u8>(), prop::collection::vec(any::<u16>(), columns..=columns + 1)), 0..24)
}

/// The schema picked by `which` and the delimiter picked by `delimiter`.
fn setting(which: u8, delimiter: u8) -> (SchemaRef, u8) {
    let schema = match which % 3 {
        0 => super::bid_schema(),
        1 => fast_path_schema(),
        _ => date_schema(),
    };
    (schema, [b',', b';', b'\t', b'|'][usize::from(delimiter % 4)])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn the_fast_path_changes_nothing(
        (which, delimiter, odd, header_line, bom, final_break) in (any::<u8>(), any::<u8>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        rows in rows(15),
        capacity in prop_oneof![Just(0usize), 1usize..600],
        batch_size in 1usize..12,
    ) {
        let (schema, delimiter) = setting(which, delimiter);
        let mut input = Vec::new();
        if bom {
            input.extend_from_slice(crate::UTF8_BOM);
        }
        if header_line {
            input.extend(header(&schema, delimiter));
        }
        input.extend(csv_text(&schema, delimiter, &rows, odd));
        if !final_break && input.ends_with(b"\n") {
            input.pop();
        }
        let format = RowFormat::Csv { header: header_line, delimiter };
        check_fast_path(&schema, format, &input, capacity, batch_size);
    }

    #[test]
    fn the_fast_path_changes_nothing_on_random_bytes(
        bytes in prop::collection::vec(prop_oneof![
            4 => prop::sample::select(&b"0123456789,;-+:. Tt\"\r\n\n\nabcZ"[..]),
            1 => any::<u8>(),
        ], 0..300),
        which in any::<u8>(),
        capacity in prop_oneof![Just(0usize), 1usize..100],
        batch_size in 1usize..6,
    ) {
        let (schema, _) = setting(which, 0);
        check_fast_path(&schema, RowFormat::Csv { header: false, delimiter: b',' }, &bytes, capacity, batch_size);
    }
}

/// The clean texts of the property test are read by the fast path itself, so that the
/// test compares it with the general path rather than the general path with itself.
#[test]
fn clean_texts_take_the_fast_path() {
    let mut state = 7u64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u16
    };
    for which in 0..2 {
        let (schema, delimiter) = setting(which, which);
        let columns = schema.fields().len();
        for _ in 0..50 {
            let rows: Vec<(u8, Vec<u16>)> =
                (0..20).map(|_| ((next() % 256) as u8, (0..columns).map(|_| next()).collect())).collect();
            let text = csv_text(&schema, delimiter, &rows, false);
            let Some(mut fast) = FastCsv::new(&schema, delimiter) else { panic!("no fast path") };
            let taken = text.is_empty() || fast.decode(&text, 8, &mut Vec::new());
            assert!(taken, "declined: {}", String::from_utf8_lossy(&text));
        }
    }
}

/// Each odd field in each column of a clean record, alone in its chunk: the general
/// path's row or bad row, with the fast path on.
#[test]
fn each_odd_field_alone() {
    let schema = fast_path_schema();
    let clean: Vec<Vec<u8>> =
        (schema.fields().iter()).map(|field| self::field(field.data_type(), field.is_nullable(), 64, false)).collect();
    // A column of each kind (the general path is slow on bad rows in a debug build).
    for column in ["i8", "u8", "i64", "u64", "f32", "f64", "d", "flag", "name", "s", "ms", "ns", "utc"] {
        let Ok(column) = schema.index_of(column) else { panic!("no column {column}") };
        let odd = match schema.field(column).data_type() {
            DataType::Timestamp(_, _) => [ODD_TIMESTAMPS, TIMESTAMPS].concat(),
            data_type if data_type.is_integer() => [ODD_INTEGERS, SIGNED, UNSIGNED].concat(),
            data_type if data_type.is_floating() => [ODD_FLOATS, FLOATS, ODD_INTEGERS].concat(),
            DataType::Decimal128(_, _) => [ODD_DECIMALS, DECIMALS, ODD_FLOATS].concat(),
            _ => [ODD, BOOLEANS].concat(),
        };
        let mut input = Vec::new();
        for value in &odd {
            let mut fields = clean.clone();
            fields[column] = value.as_bytes().to_vec();
            input.extend(fields.join(&b","[..]));
            input.push(b'\n');
        }
        // A chunk per record (the records with a quoted line break aside).
        let capacity = input.split(|byte| *byte == b'\n').map(<[u8]>::len).max().unwrap_or(0) + 1;
        check_fast_path(&schema, RowFormat::Csv { header: false, delimiter: b',' }, &input, capacity, 1);
    }
}
