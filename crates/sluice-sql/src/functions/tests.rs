//! Each Flink function against values worked out by hand from Flink's documentation,
//! evaluated through the planner (so registration, coercion and result types are checked
//! too) on one row of `t`.

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use sluice_config::OnError;

use crate::tests::{plan, plan_error, rows, run};

/// 2023-11-14 22:13:20.123 UTC, a Tuesday.
const TUESDAY_EVENING_MS: i64 = 1_700_000_000_123;

/// Each expression's value on the row (a = 3, b = -2, s = 'Hello', ts = `ts_ms`) as text
/// ("NULL" for NULL), with its type.
fn values(ts_ms: i64, exprs: &[&str]) -> Vec<(String, DataType)> {
    let sql = format!("SELECT {} FROM t", exprs.join(", "));
    let planner = plan(&[("v", &sql)], OnError::Fail).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let output = run(&planner, "v", rows(&[(3, -2, "Hello", ts_ms)])).output.expect("run");
    let batch = &output[0].rows;
    (0..exprs.len())
        .map(|column| {
            let array = batch.column(column);
            let text = cast(array, &DataType::Utf8).expect("as text");
            let text = text.as_string::<i32>();
            let shown = if text.is_null(0) { "NULL".to_string() } else { text.value(0).to_string() };
            (shown, array.data_type().clone())
        })
        .collect()
}

fn check(ts_ms: i64, cases: &[(&str, &str, DataType)]) {
    let exprs: Vec<&str> = cases.iter().map(|c| c.0).collect();
    for ((expr, expected, data_type), (got, got_type)) in cases.iter().zip(values(ts_ms, &exprs)) {
        assert_eq!((got.as_str(), &got_type), (*expected, data_type), "{expr}");
    }
}

#[test]
fn date_format_follows_simple_date_format_patterns() {
    let text = DataType::Utf8;
    check(
        TUESDAY_EVENING_MS,
        &[
            ("DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')", "2023-11-14 22:13", text.clone()),
            ("DATE_FORMAT(ts, 'yy/M/d h:mm:ss.SSS a')", "23/11/14 10:13:20.123 PM", text.clone()),
            ("DATE_FORMAT(ts, 'EEE, MMM d')", "Tue, Nov 14", text.clone()),
            ("DATE_FORMAT(ts, 'EEEE MMMM')", "Tuesday November", text.clone()),
            // The pattern HH''mm 'o''clock': '' is a quote, inside quoted text too.
            ("DATE_FORMAT(ts, 'HH''''mm ''o''''clock''')", "22'13 o'clock", text.clone()),
            ("DATE_FORMAT(ts, 'yyyy-MM-dd''T''HH:mm:ss')", "2023-11-14T22:13:20", text.clone()),
            ("DATE_FORMAT(ts, 'S')", "123", text.clone()),
        ],
    );
    check(
        5,
        &[
            ("DATE_FORMAT(ts, 'SSS')", "005", text.clone()),
            ("DATE_FORMAT(ts, 'h a, yyyyy')", "12 AM, 01970", text.clone()),
            ("DATE_FORMAT(ts, 'HH:mm:ss')", "00:00:00", text.clone()),
            ("DATE_FORMAT(CAST(NULL AS TIMESTAMP), 'yyyy')", "NULL", text.clone()),
            // A string is read as a timestamp first, as Flink's DATE_FORMAT(STRING, …) does.
            ("DATE_FORMAT('2023-11-14 22:13:20', 'd MMM HH:mm')", "14 Nov 22:13", text),
        ],
    );
}

/// A batch formats once per span of its pattern's finest field; every row still gets
/// what formatting it alone gives, across seconds, hours, days and before 1970.
#[test]
fn date_format_of_many_rows_equals_each_row_formatted_alone() {
    let times: Vec<i64> = [-86_400_001, -1, 0, 999, 1_000, 59_999, 60_000, 3_599_999, 3_600_000, 86_399_999]
        .into_iter()
        .chain((0..200).map(|i| TUESDAY_EVENING_MS + i * 7_919))
        .collect();
    let input: Vec<(i64, i64, &str, i64)> = times.iter().map(|&ts| (0, 0, "x", ts)).collect();
    for pattern in ["yyyy-MM-dd", "HH:mm", "h a", "ss.SSS", "EEE", "'at' m", ""] {
        let sql = format!("SELECT DATE_FORMAT(ts, '{}') FROM t", pattern.replace('\'', "''"));
        let planner = plan(&[("v", &sql)], OnError::Fail).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let output = run(&planner, "v", rows(&input)).output.expect("run");
        let got = output[0].rows.column(0).as_string::<i32>().clone();
        let pieces = crate::functions::date_format::compile(pattern).expect("compiles");
        for (row, &ms) in times.iter().enumerate() {
            let mut alone = String::new();
            let time = chrono::DateTime::from_timestamp_millis(ms).expect("in range").naive_utc();
            crate::functions::date_format::format(&pieces, &time, &mut alone);
            assert_eq!(got.value(row), alone, "{pattern} at {ms} ms");
        }
    }
}

#[test]
fn date_format_refuses_an_unsupported_letter_when_planned() {
    let error = plan_error(&[("v", "SELECT DATE_FORMAT(ts, 'yyyy-ww') FROM t")]);
    assert!(error.contains("the pattern letter 'w' in 'yyyy-ww' is not supported"), "{error}");
    let error = plan_error(&[("v", "SELECT DATE_FORMAT(ts, 'yyyy ''open') FROM t")]);
    assert!(error.contains("unclosed quote"), "{error}");
}

#[test]
fn split_index_and_regexp_extract_give_null_out_of_range() {
    let text = DataType::Utf8;
    check(
        0,
        &[
            ("SPLIT_INDEX('a,b,,c', ',', 0)", "a", text.clone()),
            ("SPLIT_INDEX('a,b,,c', ',', 2)", "", text.clone()),
            ("SPLIT_INDEX('a,b,,c', ',', 3)", "c", text.clone()),
            ("SPLIT_INDEX('a,b,,c', ',', 4)", "NULL", text.clone()),
            ("SPLIT_INDEX('a,b,,c', ',', -1)", "NULL", text.clone()),
            ("SPLIT_INDEX('a--b--c', '--', a - 2)", "b", text.clone()),
            ("SPLIT_INDEX('', ',', 0)", "NULL", text.clone()),
            ("SPLIT_INDEX(CAST(NULL AS VARCHAR), ',', 0)", "NULL", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)', 2)", "bar", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)', 1)", "the", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)', 0)", "foothebar", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'o+')", "oo", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)', 3)", "NULL", text.clone()),
            ("REGEXP_EXTRACT('foothebar', 'x(y)', 1)", "NULL", text.clone()),
            ("REGEXP_EXTRACT(s, '(l+)(o)', 1)", "ll", text),
        ],
    );
    let error = plan_error(&[("v", "SELECT REGEXP_EXTRACT(s, '(unclosed', 1) FROM t")]);
    assert!(error.contains("REGEXP_EXTRACT: the regular expression '(unclosed' is invalid"), "{error}");
}

#[test]
fn string_and_conditional_functions_have_flinks_nulls_and_types() {
    let (text, int) = (DataType::Utf8, DataType::Int32);
    check(
        0,
        &[
            ("LOWER(s)", "hello", text.clone()),
            ("UPPER(s)", "HELLO", text.clone()),
            ("CHAR_LENGTH(s)", "5", int.clone()),
            ("INSTR(s, 'l')", "3", int.clone()),
            ("INSTR(s, 'z')", "0", int),
            ("CONCAT(s, '-', s)", "Hello-Hello", text.clone()),
            ("CONCAT(s, CAST(NULL AS VARCHAR))", "NULL", text.clone()),
            ("IF(a > 1, s, 'small')", "Hello", text.clone()),
            ("IF(b > 1, s, 'small')", "small", text.clone()),
            ("IF(CAST(NULL AS BOOLEAN), 1, 2)", "2", DataType::Int64),
            // 0.5 is an exact DECIMAL(1, 1), as in Flink; BIGINT and it meet as a decimal
            // with one digit after the point (Flink: DECIMAL(20, 1); the values are equal).
            ("IF(a > 1, a, 0.5)", "3.0", DataType::Decimal128(21, 1)),
            ("CASE WHEN a = 3 THEN 'three' ELSE 'other' END", "three", text),
        ],
    );
}

#[test]
fn time_fields_are_bigint() {
    let big = DataType::Int64;
    check(
        TUESDAY_EVENING_MS,
        &[
            ("YEAR(ts)", "2023", big.clone()),
            ("MONTH(ts)", "11", big.clone()),
            ("DAYOFMONTH(ts)", "14", big.clone()),
            ("HOUR(ts)", "22", big.clone()),
            ("MINUTE(ts)", "13", big.clone()),
            ("SECOND(ts)", "20", big.clone()),
            ("EXTRACT(HOUR FROM ts)", "22", big.clone()),
            ("EXTRACT(MINUTE FROM ts)", "13", big),
        ],
    );
}
