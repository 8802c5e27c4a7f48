//! Values that do not fit their column exactly are bad rows in both formats: decimals
//! with more decimal places than the scale or more digits than the precision, timestamp
//! text with a finer fraction than the column holds. Never a rounded or truncated value.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::*;

/// `id BIGINT NOT NULL, d DECIMAL(10, 2)`.
fn decimal_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("d", DataType::Decimal128(10, 2), true),
    ]))
}

/// Decimal texts with the reason of each bad one, for CSV fields and JSON strings.
const DECIMALS: [(&str, Option<&str>); 14] = [
    ("1.5", None),
    ("1.239", Some("more than 2 decimal places")),
    ("1.230", None),
    ("12345678.99", None),
    ("123456789.5", Some("more than 8 digits before the decimal point")),
    ("123456789", Some("more than 8 digits before the decimal point")),
    ("1231e-3", Some("more than 2 decimal places")),
    ("1.12345e-30", Some("more than 2 decimal places")),
    ("-0.001", Some("more than 2 decimal places")),
    ("1e2", None),
    ("-0.000", None),
    ("00012345678.9900", None),
    ("e5", Some("not a number")),
    ("1.2399999999999999999999999999999999999999", Some("more than 2 decimal places")),
];

const DECIMAL_TABLE: &str = "
    +----+-------------+
    | id | d           |
    +----+-------------+
    | 1  | 1.50        |
    | 3  | 1.23        |
    | 4  | 12345678.99 |
    | 10 | 100.00      |
    | 11 | 0.00        |
    | 12 | 12345678.99 |
    +----+-------------+";

/// Decodes `texts` as rows `id, d` written by `write`, expecting `table` and, for each
/// bad text, the reason naming it (`quoted`: as a string).
fn check_decimals(
    format: RowFormat,
    texts: &[(&str, Option<&str>)],
    table: &str,
    quoted: bool,
    write: impl Fn(usize, &str) -> String,
) {
    let input: String = texts.iter().enumerate().map(|(index, (text, _))| write(index + 1, text) + "\n").collect();
    let bad_texts: Vec<(u64, &str, &str)> = (texts.iter().enumerate())
        .filter_map(|(index, (text, why))| why.map(|why| (index as u64 + 1, *text, why)))
        .collect();
    let expected_bad: Vec<u64> = bad_texts.iter().map(|(line, _, _)| *line).collect();
    let bad = check(format, decimal_schema(), &input, table, &expected_bad);
    let reasons: Vec<&str> = bad.iter().map(|row| row.reason.as_str()).collect();
    let expected: Vec<String> = bad_texts
        .iter()
        .map(|(_, text, why)| {
            let found = if quoted { format!("{text:?}") } else { text.to_string() };
            format!("column `d`: expected DECIMAL(10, 2), found {found} ({why})")
        })
        .collect();
    assert_eq!(reasons, expected);
}

#[test]
fn csv_decimals_that_do_not_fit_their_column_are_bad_rows_regression() {
    check_decimals(CSV, &DECIMALS, DECIMAL_TABLE, true, |id, text| format!("{id},{text}"));
}

#[test]
fn json_decimals_that_do_not_fit_their_column_are_bad_rows_regression() {
    check_decimals(JSON, &DECIMALS, DECIMAL_TABLE, true, |id, text| format!("{{\"id\":{id},\"d\":\"{text}\"}}"));
    // As numbers: the texts that are valid JSON numbers.
    let table = "
        +----+-------------+
        | id | d           |
        +----+-------------+
        | 1  | 1.50        |
        | 3  | 1.23        |
        | 4  | 12345678.99 |
        | 10 | 100.00      |
        | 11 | 0.00        |
        +----+-------------+";
    check_decimals(JSON, &DECIMALS[..11], table, false, |id, text| format!("{{\"id\":{id},\"d\":{text}}}"));
}

fn timestamp_schema(unit: TimeUnit) -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(unit, None), true)]))
}

/// Timestamp texts, each written as a CSV field and as a JSON string.
fn timestamp_input(format: RowFormat, texts: &[&str]) -> String {
    let line = |text: &&str| match format {
        RowFormat::Json => format!("{{\"ts\":\"{text}\"}}\n"),
        RowFormat::Csv { .. } => format!("{text}\n"),
    };
    texts.iter().map(line).collect()
}

#[test]
fn timestamps_with_a_finer_fraction_than_their_column_are_bad_rows_regression() {
    let texts = [
        "2026-01-01 00:00:00.1239",         // 1 bad
        "2026-01-01 00:00:00.1230",         // 2 good
        "2026-01-01T00:00:00.123000000Z",   // 3 good
        "2026-01-01T00:00:00.1234567891",   // 4 bad
        "2026-01-01T00:00:00.1239+02:00",   // 5 bad
        "2026-01-01 00:00:00.12",           // 6 good
        "2026-01-01 00:00:00.000000000001", // 7 bad: beyond nanoseconds
        "2026-01-01 00:00:00.123000000000", // 8 good
    ];
    let expected = "
        +-------------------------+
        | ts                      |
        +-------------------------+
        | 2026-01-01T00:00:00.123 |
        | 2026-01-01T00:00:00.123 |
        | 2026-01-01T00:00:00.120 |
        | 2026-01-01T00:00:00.123 |
        +-------------------------+";
    for format in [CSV, JSON] {
        let input = timestamp_input(format, &texts);
        let bad = check(format, timestamp_schema(TimeUnit::Millisecond), &input, expected, &[1, 4, 5, 7]);
        assert_eq!(
            bad[0].reason,
            "column `ts`: expected TIMESTAMP(3), found \"2026-01-01 00:00:00.1239\" (more than 3 digits of fractional seconds)"
        );
    }
}

#[test]
fn seconds_and_nanoseconds_columns_keep_every_digit_regression() {
    let seconds = "
        +---------------------+
        | ts                  |
        +---------------------+
        | 2026-01-01T00:00:00 |
        | 2026-01-01T00:00:01 |
        +---------------------+";
    let nanos = "
        +-------------------------------+
        | ts                            |
        +-------------------------------+
        | 2026-01-01T00:00:00.123456789 |
        +-------------------------------+";
    for format in [CSV, JSON] {
        let texts = ["2026-01-01 00:00:00.0", "2026-01-01 00:00:00.5", "2026-01-01T00:00:01.000Z"];
        let bad = check(format, timestamp_schema(TimeUnit::Second), timestamp_input(format, &texts), seconds, &[2]);
        assert!(bad[0].reason.ends_with("(more than 0 digits of fractional seconds)"), "{}", bad[0].reason);
        let texts = ["2026-01-01 00:00:00.1234567890", "2026-01-01 00:00:00.1234567891"];
        let bad = check(format, timestamp_schema(TimeUnit::Nanosecond), timestamp_input(format, &texts), nanos, &[2]);
        assert!(bad[0].reason.starts_with("column `ts`: expected TIMESTAMP(9)"), "{}", bad[0].reason);
    }
}
