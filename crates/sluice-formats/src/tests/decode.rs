//! Decoding: each accepted form, each kind of bad row, and where the rows are.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::*;
use crate::MAX_BAD_ROW_CHARS;

const SMALL_TABLE: &str = "
    +----+-------+-------------------------+
    | id | name  | ts                      |
    +----+-------+-------------------------+
    | 1  | alice | 2026-01-01T00:00:00.123 |
    | 2  |       |                         |
    | 3  | carol | 2026-01-01T00:00:03     |
    +----+-------+-------------------------+";

const ONE_ROW: &str = "
    +----+------+----+
    | id | name | ts |
    +----+------+----+
    | 1  | a    |    |
    +----+------+----+";

#[test]
fn csv_with_and_without_header() {
    let rows = "1,alice,2026-01-01 00:00:00.123\n2,,\n3,carol,2026-01-01 00:00:03\n";
    check(CSV, small_schema(), rows, SMALL_TABLE, &[]);
    check(CSV_HEADER, small_schema(), format!("id,name,ts\n{rows}"), SMALL_TABLE, &[]);
    // Line numbers count the header.
    let bad = check(CSV_HEADER, small_schema(), format!("id,name,ts\n{rows}x,y,z\n"), SMALL_TABLE, &[5]);
    assert_eq!(bad[0].text, "x,y,z");
}

#[test]
fn csv_header_only_or_empty() {
    check(CSV_HEADER, small_schema(), "id,name,ts\n", "", &[]);
    check(CSV_HEADER, small_schema(), "id,name,ts", "", &[]);
    check(CSV, small_schema(), "", "", &[]);
    check(JSON, small_schema(), "", "", &[]);
}

#[test]
fn csv_custom_delimiter() {
    let rows = "1;alice;2026-01-01 00:00:00.123\n2;;\n3;carol;2026-01-01 00:00:03\n";
    check(RowFormat::Csv { header: false, delimiter: b';' }, small_schema(), rows, SMALL_TABLE, &[]);
    let rows = "1\talice\t2026-01-01 00:00:00.123\n2\t\t\n3\tcarol\t2026-01-01 00:00:03\n";
    check(RowFormat::Csv { header: false, delimiter: b'\t' }, small_schema(), rows, SMALL_TABLE, &[]);
    // A comma is data when it is not the delimiter.
    let rows = "1|a,b|\n";
    let expected = "
        +----+------+----+
        | id | name | ts |
        +----+------+----+
        | 1  | a,b  |    |
        +----+------+----+";
    check(RowFormat::Csv { header: false, delimiter: b'|' }, small_schema(), rows, expected, &[]);
}

#[test]
fn csv_quoted_fields() {
    let rows = "1,\"Smith, John\",\n2,\"say \"\"hi\"\"\",\n\"3\",\"\",\"2026-01-01 00:00:00\"\n";
    let expected = r#"
        +----+-------------+---------------------+
        | id | name        | ts                  |
        +----+-------------+---------------------+
        | 1  | Smith, John |                     |
        | 2  | say "hi"    |                     |
        | 3  |             | 2026-01-01T00:00:00 |
        +----+-------------+---------------------+"#;
    check(CSV, small_schema(), rows, expected, &[]);
}

/// The `id` and `name` columns of `batches`, with `name` in Rust's escaped form.
fn ids_and_names(batches: &[RecordBatch]) -> Vec<(i64, String)> {
    use arrow::array::AsArray;
    let mut rows = Vec::new();
    for batch in batches {
        let ids = batch.column(0).as_primitive::<arrow::datatypes::Int64Type>();
        let names = batch.column(1).as_string::<i32>();
        for row in 0..batch.num_rows() {
            rows.push((ids.value(row), format!("{:?}", names.value(row))));
        }
    }
    rows
}

#[test]
fn csv_quoted_line_breaks_stay_in_their_field_regression() {
    let rows = "1,a,\n2,\"two\nlines\",\n3,\"\"\"q\"\",\n x\",2026-01-01 00:00:00\n\
                4,\"crlf\r\n\r\n\"\"\"\"\",\r\n5,e,\n";
    let expected =
        [(1, r#""a""#), (2, r#""two\nlines""#), (3, r#""\"q\",\n x""#), (4, r#""crlf\r\n\r\n\"\"""#), (5, r#""e""#)];
    let expected: Vec<(i64, String)> = expected.iter().map(|(id, name)| (*id, name.to_string())).collect();
    let with_header = format!("id,name,ts\n{rows}");
    for (format, input) in [(CSV, rows.to_string()), (CSV_HEADER, with_header)] {
        let longest = longest_record(format, input.as_bytes());
        for (batches, bad) in [
            decode_whole(format, &small_schema(), input.as_bytes(), 1024),
            decode_chunked(format, &small_schema(), input.as_bytes(), longest, 2),
        ] {
            assert!(bad.is_empty(), "{bad:?}");
            assert_eq!(ids_and_names(&batches), expected);
        }
    }
    // Line numbers count the line breaks inside quotes; a bad record is numbered by
    // its first line, and a good one after it is kept.
    let input = format!("{rows}x,\"y\nz\",\n6,f,\nw,,\n");
    let longest = longest_record(CSV, input.as_bytes());
    let (batches, bad) = decode_chunked(CSV, &small_schema(), input.as_bytes(), longest, 2);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), [10, 13]);
    assert_eq!(bad[0].text, "x,\"y\nz\",");
    assert_eq!(bad[0].reason, "column `id`: expected BIGINT, found \"x\"");
    assert_eq!(ids_and_names(&batches).len(), 6, "rows in: every good record, once");
    assert_eq!(decode_whole(CSV, &small_schema(), input.as_bytes(), 1024).1, bad);
}

#[test]
fn csv_quotes_inside_unquoted_fields_are_data() {
    // As Arrow's decoder reads them: only a quote at the start of a field opens one.
    let expected = r#"
        +----+-----------+----+
        | id | name      | ts |
        +----+-----------+----+
        | 1  | 5" screen |    |
        | 2  | b         |    |
        +----+-----------+----+"#;
    check(CSV, small_schema(), "1,5\" screen,\n2,b,\n", expected, &[]);
}

#[test]
fn csv_an_unterminated_quote_runs_to_the_end() {
    let bad = check(CSV, small_schema(), "1,a,\n2,\"b,\n3,c,\n", ONE_ROW, &[2]);
    assert_eq!(bad[0].reason, "unterminated quoted field opened at column 3");
    assert_eq!(bad[0].text, "2,\"b,\n3,c,");
}

#[test]
fn blank_lines_are_skipped() {
    let rows = "\n1,alice,2026-01-01 00:00:00.123\n\n   \n2,,\r\n\t\n3,carol,2026-01-01 00:00:03\n\n\n";
    check(CSV, small_schema(), rows, SMALL_TABLE, &[]);
    let json = "\n{\"id\":1,\"name\":\"alice\",\"ts\":\"2026-01-01 00:00:00.123\"}\n  \n\n{\"id\":2}\n\
                {\"id\":3,\"name\":\"carol\",\"ts\":\"2026-01-01T00:00:03\"}\n\n";
    check(JSON, small_schema(), json, SMALL_TABLE, &[]);
    // Line numbers count blank lines.
    check(CSV, small_schema(), "\n\n1,a,\n\nx,,\n", ONE_ROW, &[5]);
}

#[test]
fn crlf_line_endings() {
    let rows = "1,alice,2026-01-01 00:00:00.123\r\n2,,\r\n3,carol,2026-01-01 00:00:03\r\n";
    check(CSV, small_schema(), rows, SMALL_TABLE, &[]);
    let bad = check(CSV, small_schema(), format!("{rows}4,x\r\n"), SMALL_TABLE, &[4]);
    assert_eq!(bad[0].text, "4,x", "the line break is not part of the text");
    let json = "{\"id\":1,\"name\":\"alice\",\"ts\":\"2026-01-01 00:00:00.123\"}\r\n{\"id\":2}\r\n\
                {\"id\":3,\"name\":\"carol\",\"ts\":\"2026-01-01 00:00:03\"}\r\n{\"id\":\r\n";
    check(JSON, small_schema(), json, SMALL_TABLE, &[4]);
}

#[test]
fn last_line_without_line_break() {
    let rows = "1,alice,2026-01-01 00:00:00.123\n2,,\n3,carol,2026-01-01 00:00:03";
    check(CSV, small_schema(), rows, SMALL_TABLE, &[]);
    check(CSV, small_schema(), format!("{rows}\nbad"), SMALL_TABLE, &[4]);
}

#[test]
fn csv_bad_rows_of_each_kind() {
    let input = [
        "1,alice,2026-01-01 00:00:00.123", // 1 good
        "abc,bob,",                        // 2 a string in BIGINT
        "2,,",                             // 3 good
        "4,dave",                          // 4 too few fields
        "5,eve,,extra",                    // 5 too many fields
        ",frank,",                         // 6 empty NOT NULL
        "7,gina,yesterday",                // 7 bad timestamp
        "9.5,ivan,",                       // 8 a float in BIGINT
        "3,carol,2026-01-01 00:00:03",     // 9 good
        "8,\"hal,",                        // 10 unterminated quote (it runs to the end)
    ]
    .join("\n");
    let bad = check(CSV, small_schema(), &input, SMALL_TABLE, &[2, 4, 5, 6, 7, 8, 10]);
    let reasons: Vec<&str> = bad.iter().map(|row| row.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `id`: expected BIGINT, found \"abc\"",
            "expected 3 fields, found 2",
            "expected 3 fields, found 4",
            "missing required column `id` (empty field)",
            "column `ts`: expected TIMESTAMP(3), found \"yesterday\"",
            "column `id`: expected BIGINT, found \"9.5\"",
            "unterminated quoted field opened at column 3",
        ]
    );
    assert_eq!(bad[0].text, "abc,bob,");
}

#[test]
fn csv_invalid_utf8_is_a_bad_row() {
    let mut input = b"1,alice,2026-01-01 00:00:00.123\n2,\xff\xfe,\n".to_vec();
    input.extend_from_slice(b"2,,\n3,carol,2026-01-01 00:00:03\n");
    let bad = check(CSV, small_schema(), &input, SMALL_TABLE, &[2]);
    assert_eq!(bad[0].reason, "invalid UTF-8 at byte 3");
    assert_eq!(bad[0].text, "2,\u{fffd}\u{fffd},");
}

#[test]
fn json_missing_and_extra_fields() {
    let json = "{\"id\":1,\"name\":\"alice\",\"ts\":\"2026-01-01 00:00:00.123\",\"extra\":[1,{\"x\":2}]}\n\
                {\"id\":2,\"name\":null}\n\
                {\"unknown\":true,\"ts\":\"2026-01-01T00:00:03\",\"name\":\"carol\",\"id\":3}\n";
    check(JSON, small_schema(), json, SMALL_TABLE, &[]);
}

#[test]
fn json_bad_rows_of_each_kind() {
    let input = [
        r#"{"id":1,"name":"alice","ts":"2026-01-01 00:00:00.123"}"#, // 1 good
        r#"{"id":"abc"}"#,                                           // 2 a string in BIGINT
        r#"{"id":2}"#,                                               // 3 good
        r#"{"id":4,"name":"dave""#,                                  // 4 truncated
        r#"{"id" 5}"#,                                               // 5 bad syntax
        r#"{"name":"frank"}"#,                                       // 6 missing NOT NULL
        r#"{"id":null}"#,                                            // 7 null NOT NULL
        r#"{"id":7,"ts":"yesterday"}"#,                              // 8 bad timestamp
        r#"{"id":8,"name":42}"#,                                     // 9 a number in VARCHAR
        r#"[9,"ivan"]"#,                                             // 10 not an object
        r#"{"id":10} {"id":11}"#,                                    // 11 two records
        r#"{"id":true}"#,                                            // 12 a boolean in BIGINT
        r#"{"id":3,"name":"carol","ts":"2026-01-01 00:00:03"}"#,     // 13 good
    ]
    .join("\n");
    let bad = check(JSON, small_schema(), &input, SMALL_TABLE, &[2, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    let reasons: Vec<&str> = bad.iter().map(|row| row.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `id`: expected BIGINT, found \"abc\"",
            "invalid JSON at column 21: EOF while parsing an object",
            "invalid JSON at column 7: expected `:`",
            "missing required column `id`",
            "column `id`: null in a NOT NULL column",
            "column `ts`: expected TIMESTAMP(3), found \"yesterday\"",
            "column `name`: expected VARCHAR, found 42",
            "expected a JSON object, found an array",
            "invalid JSON at column 11: trailing characters",
            "column `id`: expected BIGINT, found true",
        ]
    );
}

#[test]
fn json_numeric_leniency() {
    // As in Flink, a numeric string fills a numeric column.
    let expected = "
        +----+------+----+
        | id | name | ts |
        +----+------+----+
        | 42 |      |    |
        +----+------+----+";
    check(JSON, small_schema(), "{\"id\":\"42\"}\n", expected, &[]);
    // A number written with a fraction or an exponent fits when its value is an integer.
    for id in ["42.0", "4.2e1", "420e-1", "0.42E2"] {
        check(JSON, small_schema(), format!("{{\"id\":{id}}}\n"), expected, &[]);
    }
}

/// `i BIGINT, t TINYINT, s SMALLINT, u INT UNSIGNED, d DECIMAL(10, 2), ts TIMESTAMP(3)`,
/// all nullable.
fn numbers_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, true),
        Field::new("t", DataType::Int8, true),
        Field::new("s", DataType::Int16, true),
        Field::new("u", DataType::UInt32, true),
        Field::new("d", DataType::Decimal128(10, 2), true),
        Field::new("ts", ts_ms(), true),
    ]))
}

#[test]
fn json_numbers_that_do_not_fit_their_column_are_bad_rows_regression() {
    let input = [
        r#"{"i":5,"t":-128,"s":32767,"u":4294967295,"d":1.5,"ts":253402300799999}"#, // 1 good
        r#"{"i":5.5}"#,                                                              // 2
        r#"{"i":1e30}"#,                                                             // 3
        r#"{"i":"5.5"}"#,                                                            // 4
        r#"{"i":-9223372036854775809}"#,                                             // 5
        r#"{"i":9223372036854775807.5}"#,                                            // 6
        r#"{"t":300}"#,                                                              // 7
        r#"{"t":-128.4}"#,                                                           // 8
        r#"{"s":70000}"#,                                                            // 9
        r#"{"u":-1}"#,                                                               // 10
        r#"{"d":1.234}"#,                                                            // 11
        r#"{"ts":253402300800000}"#,                                                 // 12
        r#"{"ts":-62167219200001}"#,                                                 // 13
        r#"{"ts":1767225600123.5}"#,                                                 // 14
        r#"{"ts":1e300}"#,                                                           // 15
        r#"{"ts":"0000-01-01T00:00:00+01:00"}"#,                                     // 16
        r#"{"ts":"9999-12-31T23:00:00-02:00"}"#,                                     // 17
        r#"{"i":-9223372036854775808,"t":"12","ts":-62167219200000}"#,               // 18 good
    ]
    .join("\n");
    let expected = "
        +----------------------+------+-------+------------+------+-------------------------+
        | i                    | t    | s     | u          | d    | ts                      |
        +----------------------+------+-------+------------+------+-------------------------+
        | 5                    | -128 | 32767 | 4294967295 | 1.50 | 9999-12-31T23:59:59.999 |
        | -9223372036854775808 | 12   |       |            |      | 0000-01-01T00:00:00     |
        +----------------------+------+-------+------------+------+-------------------------+";
    let bad = check(JSON, numbers_schema(), &input, expected, &(2..=17).collect::<Vec<u64>>());
    let reasons: Vec<&str> = bad.iter().map(|row| row.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `i`: expected BIGINT, found 5.5 (not an integer)",
            "column `i`: expected BIGINT, found 1e30 (out of range)",
            "column `i`: expected BIGINT, found \"5.5\" (not an integer)",
            "column `i`: expected BIGINT, found -9223372036854775809 (out of range)",
            "column `i`: expected BIGINT, found 9223372036854775807.5 (not an integer)",
            "column `t`: expected TINYINT, found 300 (out of range)",
            "column `t`: expected TINYINT, found -128.4 (not an integer)",
            "column `s`: expected SMALLINT, found 70000 (out of range)",
            "column `u`: expected INT UNSIGNED, found -1 (out of range)",
            "column `d`: expected DECIMAL(10, 2), found 1.234 (more than 2 decimal places)",
            "column `ts`: expected TIMESTAMP(3), found 253402300800000 (outside the years 0000-9999)",
            "column `ts`: expected TIMESTAMP(3), found -62167219200001 (outside the years 0000-9999)",
            "column `ts`: expected TIMESTAMP(3), found 1767225600123.5 (not an integer)",
            "column `ts`: expected TIMESTAMP(3), found 1e300 (outside the years 0000-9999)",
            "column `ts`: expected TIMESTAMP(3), found \"0000-01-01T00:00:00+01:00\" (outside the years 0000-9999)",
            "column `ts`: expected TIMESTAMP(3), found \"9999-12-31T23:00:00-02:00\" (outside the years 0000-9999)",
        ]
    );
}

#[test]
fn json_extremes_rounded_or_saturated_by_arrow_are_bad_rows_regression() {
    // No fraction or exponent: only the decoded extreme reveals these.
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, true),
        Field::new("ns", DataType::Timestamp(arrow::datatypes::TimeUnit::Nanosecond, None), true),
    ]));
    let input = "{\"i\":-9223372036854775809}\n{\"ns\":9223372036854775808}\n{\"i\":-9223372036854775808,\"ns\":9223372036854775807}\n";
    let expected = "
        +----------------------+-------------------------------+
        | i                    | ns                            |
        +----------------------+-------------------------------+
        | -9223372036854775808 | 2262-04-11T23:47:16.854775807 |
        +----------------------+-------------------------------+";
    let bad = check(JSON, schema, input, expected, &[1, 2]);
    assert_eq!(bad[1].reason, "column `ns`: expected TIMESTAMP(9), found 9223372036854775808 (out of range)");
}

#[test]
fn csv_timestamps_outside_the_years_0000_to_9999_are_bad_rows_regression() {
    let schema = Arc::new(Schema::new(vec![Field::new("ts", ts_ms(), false)]));
    let input =
        "0000-01-01T00:00:00Z\n0000-01-01T00:00:00+01:00\n9999-12-31T23:59:59.999Z\n9999-12-31T23:00:00-02:00\n";
    let expected = "
        +-------------------------+
        | ts                      |
        +-------------------------+
        | 0000-01-01T00:00:00     |
        | 9999-12-31T23:59:59.999 |
        +-------------------------+";
    let bad = check(CSV, schema, input, expected, &[2, 4]);
    assert_eq!(
        bad[0].reason,
        "column `ts`: expected TIMESTAMP(3), found \"0000-01-01T00:00:00+01:00\" (outside the years 0000-9999)"
    );
}

#[test]
fn timestamps_in_each_accepted_form() {
    let schema = Arc::new(Schema::new(vec![Field::new("ts", ts_ms(), false)]));
    let expected = "
        +-------------------------+
        | ts                      |
        +-------------------------+
        | 2026-01-01T00:00:00.123 |
        | 2026-01-01T00:00:00     |
        | 2026-01-01T00:00:00.123 |
        | 2025-12-31T22:00:00     |
        | 2026-01-01T00:00:00     |
        | 2026-01-01T00:00:00.123 |
        +-------------------------+";
    let forms = [
        "2026-01-01 00:00:00.123",
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.123Z",
        "2026-01-01T00:00:00+02:00",
        "2026-01-01",
        "2026-01-01T00:00:00.123",
    ];
    let csv: String = forms.iter().map(|form| format!("{form}\n")).collect();
    check(CSV, schema.clone(), &csv, expected, &[]);
    let json: String = forms.iter().map(|form| format!("{{\"ts\":\"{form}\"}}\n")).collect();
    check(JSON, schema.clone(), &json, expected, &[]);
    // JSON also takes epoch milliseconds; CSV does not.
    let epoch = "
        +-------------------------+
        | ts                      |
        +-------------------------+
        | 2026-01-01T00:00:00.123 |
        +-------------------------+";
    check(JSON, schema.clone(), "{\"ts\":1767225600123}\n", epoch, &[]);
    let bad = check(CSV, schema.clone(), "1767225600123\n", "", &[1]);
    assert_eq!(bad[0].reason, "column `ts`: expected TIMESTAMP(3), found \"1767225600123\"");
    check(CSV, schema.clone(), "2026-13-01 00:00:00\n2026-01-01 25:00:00\n", "", &[1, 2]);
}

#[test]
fn bad_rows_amid_many_good_rows() {
    // More lines than one validation block, bad rows scattered, at the start and end.
    let mut input = String::new();
    let mut expected_bad = Vec::new();
    let mut good = 0;
    for line in 1..=300u64 {
        if line == 1 || line % 37 == 0 || line == 300 {
            input.push_str("oops,,\n");
            expected_bad.push(line);
        } else {
            input.push_str(&format!("{line},n{line},\n"));
            good += 1;
        }
    }
    let (batches, bad) = decode_whole(CSV, &small_schema(), input.as_bytes(), 100);
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), expected_bad);
    assert_eq!(batches.iter().map(|batch| batch.num_rows()).sum::<usize>(), good);
    assert!(batches.iter().all(|batch| batch.num_rows() <= 100));
    assert_eq!(batches.len(), good.div_ceil(100), "the good rows are decoded together, in full batches");
}

#[test]
fn bad_row_text_is_cut() {
    let bad = check(CSV, small_schema(), format!("1,{},,\n", "é".repeat(300)), "", &[1]);
    assert_eq!(bad[0].text.chars().count(), MAX_BAD_ROW_CHARS);
    assert!(bad[0].text.starts_with("1,éé"));
}

#[test]
fn options_are_checked() {
    let options = |format, batch_size| DecoderOptions { schema: small_schema(), format, batch_size };
    let error = Decoder::new(options(CSV, 0)).err().map(|e| e.code);
    assert_eq!(error, Some("format.batch_size"));
    let error = Decoder::new(options(RowFormat::Csv { header: false, delimiter: b'"' }, 8)).err().map(|e| e.code);
    assert_eq!(error, Some("format.csv_delimiter"));
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    let schema = Arc::new(Schema::new(vec![Field::new("xs", list, true)]));
    let error =
        Decoder::new(DecoderOptions { schema: schema.clone(), format: CSV, batch_size: 8 }).err().map(|e| e.code);
    assert_eq!(error, Some("format.unsupported_type"));
    // JSON decodes lists.
    let expected = "
        +--------+
        | xs     |
        +--------+
        | [1, 2] |
        +--------+";
    check(JSON, schema, "{\"xs\":[1,2]}\n", expected, &[]);
}

#[test]
fn header_is_skipped_only_at_line_one() {
    let mut decoder = decoder(CSV_HEADER, &small_schema(), 16);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let decoded = decoder.decode(b"id,name,ts\n1,a,\n", 1, &mut out, &mut bad);
    assert!(decoded.is_ok());
    let decoded = decoder.decode(b"2,b,\n", 3, &mut out, &mut bad);
    assert!(decoded.is_ok());
    assert_eq!(out.iter().map(|batch| batch.num_rows()).sum::<usize>(), 2);
    assert!(bad.is_empty());
}

#[test]
fn clean_input_takes_the_fast_path() {
    let clean: [(RowFormat, &str); 4] = [
        (CSV, "1,alice,2026-01-01 00:00:00.123\n\n2,,\r\n\r\n3,\"c, d\",2026-01-01T00:00:03Z"),
        (CSV_HEADER, "id,name,ts\n1,alice,\n"),
        (JSON, "{\"id\":1}\n\n{\"id\":2,\"ts\":1767225600123}\r\n"),
        (JSON, "{\"id\":1,\"more\":{\"a\":[1,2]}}"),
    ];
    for (format, input) in clean {
        let mut decoder = decoder(format, &small_schema(), 2);
        let (mut out, mut bad) = (Vec::new(), Vec::new());
        assert!(decoder.decode(input.as_bytes(), 1, &mut out, &mut bad).is_ok());
        assert!(bad.is_empty() && !out.is_empty(), "{input}");
        assert_eq!(decoder.slow_chunks(), 0, "{input}");
    }
    let mut decoder = decoder(CSV, &small_schema(), 2);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    assert!(decoder.decode(b"1,a,\nx,,\n", 1, &mut out, &mut bad).is_ok());
    assert_eq!(decoder.slow_chunks(), 1);
}

#[test]
fn a_byte_order_mark_starts_a_file_or_makes_its_row_bad_regression() {
    let rows = "1,alice,2026-01-01 00:00:00.123\n2,,\n3,carol,2026-01-01 00:00:03\n";
    check(CSV, small_schema(), format!("\u{feff}{rows}"), SMALL_TABLE, &[]);
    check(CSV_HEADER, small_schema(), format!("\u{feff}id,name,ts\n{rows}"), SMALL_TABLE, &[]);
    let json = "{\"id\":1,\"name\":\"alice\",\"ts\":\"2026-01-01 00:00:00.123\"}\n{\"id\":2}\n\
                {\"id\":3,\"name\":\"carol\",\"ts\":\"2026-01-01T00:00:03\"}\n";
    check(JSON, small_schema(), format!("\u{feff}{json}"), SMALL_TABLE, &[]);
    // Anywhere else, the row is bad, and the reason names the mark.
    let bad = check(
        CSV,
        small_schema(),
        format!("{rows}\u{feff}4,d,\n5,\"\u{feff}e\",\n6,f\u{feff},\n"),
        SMALL_TABLE,
        &[4, 5, 6],
    );
    let reasons: Vec<&str> = bad.iter().map(|row| row.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `id`: a UTF-8 byte order mark (U+FEFF) before the value",
            "column `name`: a UTF-8 byte order mark (U+FEFF) before the value",
            "column `name`: a UTF-8 byte order mark (U+FEFF) inside the value",
        ]
    );
    let bad = check(
        JSON,
        small_schema(),
        format!("{json}\u{feff}{{\"id\":4}}\n{{\"id\":5,\"name\":\"x\u{feff}\"}}\n"),
        SMALL_TABLE,
        &[4, 5],
    );
    assert_eq!(bad[0].reason, "a UTF-8 byte order mark (U+FEFF) before the JSON object");
    assert_eq!(bad[1].reason, "a UTF-8 byte order mark (U+FEFF) at column 18");
}

#[test]
fn a_csv_header_read_as_data_fails_the_decode_regression() {
    // With header = false, a first record that is exactly the column names is a header
    // the user forgot to declare: neither a bad row nor (all VARCHAR) a data row.
    let text =
        Arc::new(Schema::new(vec![Field::new("a", DataType::Utf8, true), Field::new("b", DataType::Utf8, true)]));
    for (schema, input) in [
        (small_schema(), "id,name,ts\n1,a,\n"),
        (small_schema(), "\u{feff}\"id\", name ,ts\r\n1,a,\n"),
        (text.clone(), "a,b\nx,y\n"),
    ] {
        let mut decoder = decoder(CSV, &schema, 16);
        let (mut out, mut bad) = (Vec::new(), Vec::new());
        let Err(error) = decoder.decode(input.as_bytes(), 1, &mut out, &mut bad) else {
            panic!("{input:?} decoded: {out:?} {bad:?}");
        };
        assert_eq!(error.code, "source.csv_header");
        assert_eq!(
            error.fix.as_deref(),
            Some("set header = true; if that line really is data, rename a column in `schema`")
        );
    }
    // Elsewhere than line 1, or when it differs from the names, it is a row like any other.
    let two_rows = "
        +---+---+
        | a | b |
        +---+---+
        | x | y |
        | a | b |
        +---+---+";
    check(CSV, text.clone(), "x,y\na,b\n", two_rows, &[]);
    let one_row = "
        +---+-----+
        | a | b   |
        +---+-----+
        | a | b,c |
        +---+-----+";
    check(CSV, text, "a,\"b,c\"\n", one_row, &[]);
}
