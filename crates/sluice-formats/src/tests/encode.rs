//! Encoding: each format, the op column, NULL, timestamps, repeated rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_types::{Batch, SluiceError};

use super::*;
use crate::{Encoder, OutputFormat};

/// `id BIGINT NOT NULL, name VARCHAR, price DOUBLE, ts TIMESTAMP(3)`.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]))
}

/// Three rows: a full one, one of NULLs, one with a comma and a quote in its name.
fn rows() -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3])),
        Arc::new(StringArray::from(vec![Some("alice"), None, Some("x, \"y\"")])),
        Arc::new(Float64Array::from(vec![Some(1.5), None, Some(2.0)])),
        Arc::new(TimestampMillisecondArray::from(vec![Some(1_767_225_610_000), None, Some(1_767_225_600_123)])),
    ];
    match RecordBatch::try_new(schema(), columns) {
        Ok(batch) => batch,
        Err(error) => panic!("batch: {error}"),
    }
}

fn encode(format: OutputFormat, updating: bool, batches: &[Batch]) -> Result<String, SluiceError> {
    let mut encoder = Encoder::new(format, schema(), updating);
    let mut out = Vec::new();
    for batch in batches {
        encoder.encode(batch, &mut out)?;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn encoded(format: OutputFormat, updating: bool, batches: &[Batch]) -> String {
    match encode(format, updating, batches) {
        Ok(text) => text,
        Err(error) => panic!("encode: {error}"),
    }
}

fn weighted(weights: Vec<i64>) -> Batch {
    Batch::with_weights(rows(), Int64Array::from(weights))
}

#[test]
fn json_lines() {
    let text = encoded(OutputFormat::JsonLines, false, &[Batch::inserts(rows())]);
    assert_eq!(
        text,
        concat!(
            r#"{"id":1,"name":"alice","price":1.5,"ts":"2026-01-01 00:00:10.000"}"#,
            "\n",
            r#"{"id":2,"name":null,"price":null,"ts":null}"#,
            "\n",
            r#"{"id":3,"name":"x, \"y\"","price":2.0,"ts":"2026-01-01 00:00:00.123"}"#,
            "\n",
        )
    );
}

#[test]
fn json_lines_with_the_op_column() {
    let text = encoded(OutputFormat::JsonLines, true, &[weighted(vec![1, -1, 2])]);
    assert_eq!(
        text,
        concat!(
            r#"{"op":"+I","id":1,"name":"alice","price":1.5,"ts":"2026-01-01 00:00:10.000"}"#,
            "\n",
            r#"{"op":"-D","id":2,"name":null,"price":null,"ts":null}"#,
            "\n",
            r#"{"op":"+I","id":3,"name":"x, \"y\"","price":2.0,"ts":"2026-01-01 00:00:00.123"}"#,
            "\n",
            r#"{"op":"+I","id":3,"name":"x, \"y\"","price":2.0,"ts":"2026-01-01 00:00:00.123"}"#,
            "\n",
        )
    );
    let inserts = encoded(OutputFormat::JsonLines, true, &[Batch::inserts(rows())]);
    assert_eq!(inserts.lines().filter(|line| line.starts_with(r#"{"op":"+I","#)).count(), 3);
}

/// Rows keyed by `name`: a change of `k` (-1 then +1), a lone retraction of `k`, an
/// insert of `j`, a retraction of `k` followed by an insert of another key `j`, and an
/// insert of `k`.
fn changes() -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6, 7])),
        Arc::new(StringArray::from(vec!["k", "k", "k", "j", "k", "j", "k"])),
        Arc::new(Float64Array::from(vec![None::<f64>; 7])),
        Arc::new(TimestampMillisecondArray::from(vec![None::<i64>; 7])),
    ];
    let rows = RecordBatch::try_new(schema(), columns).expect("batch");
    Batch::with_weights(rows, Int64Array::from(vec![-1, 1, -1, 1, -1, 1, 1]))
}

#[test]
fn a_retraction_directly_followed_by_an_insert_of_its_key_is_an_update() {
    let ops = |key: Option<&[usize]>| -> Vec<String> {
        let mut encoder = Encoder::new(OutputFormat::Csv { header: false }, schema(), true).with_upsert_key(key);
        let mut out = Vec::new();
        encoder.encode(&changes(), &mut out).expect("encode");
        String::from_utf8(out).expect("utf-8").lines().map(|l| l[..l.find(',').expect("op")].to_string()).collect()
    };
    assert_eq!(ops(Some(&[1])), ["-U", "+U", "-D", "+I", "-D", "+I", "+I"]);
    // Keyed by `id`, no two adjacent rows share a key; without a key nothing pairs.
    assert_eq!(ops(Some(&[0])), ["-D", "+I", "-D", "+I", "-D", "+I", "+I"]);
    assert_eq!(ops(None), ["-D", "+I", "-D", "+I", "-D", "+I", "+I"]);
    // An empty key (a stream of one row): every adjacent retraction and insert pair.
    assert_eq!(ops(Some(&[])), ["-U", "+U", "-U", "+U", "-U", "+U", "+I"]);
}

#[test]
fn csv_header_once() {
    let text = encoded(
        OutputFormat::Csv { header: true },
        false,
        &[Batch::inserts(rows()), Batch::inserts(rows().slice(0, 1))],
    );
    assert_eq!(
        text,
        "id,name,price,ts\n\
         1,alice,1.5,2026-01-01 00:00:10.000\n\
         2,,,\n\
         3,\"x, \"\"y\"\"\",2.0,2026-01-01 00:00:00.123\n\
         1,alice,1.5,2026-01-01 00:00:10.000\n"
    );
    let text = encoded(OutputFormat::Csv { header: false }, false, &[Batch::inserts(rows().slice(0, 1))]);
    assert_eq!(text, "1,alice,1.5,2026-01-01 00:00:10.000\n");
}

#[test]
fn csv_with_the_op_column() {
    let text = encoded(OutputFormat::Csv { header: true }, true, &[weighted(vec![-2, 1, 0])]);
    assert_eq!(
        text,
        "op,id,name,price,ts\n\
         -D,1,alice,1.5,2026-01-01 00:00:10.000\n\
         -D,1,alice,1.5,2026-01-01 00:00:10.000\n\
         +I,2,,,\n"
    );
}

#[test]
fn pretty_tables() {
    let text = encoded(OutputFormat::Pretty, true, &[weighted(vec![1, -1, 1]), weighted(vec![0, 0, 0])]);
    let expected = r#"
        +----+----+--------+-------+-------------------------+
        | op | id | name   | price | ts                      |
        +----+----+--------+-------+-------------------------+
        | +I | 1  | alice  | 1.5   | 2026-01-01 00:00:10.000 |
        | -D | 2  | NULL   | NULL  | NULL                    |
        | +I | 3  | x, "y" | 2.0   | 2026-01-01 00:00:00.123 |
        +----+----+--------+-------+-------------------------+"#;
    assert_eq!(unindent(&text), unindent(expected));
    assert!(text.ends_with("+\n"));
}

#[test]
fn weights_above_one_repeat_rows_when_not_updating() {
    let text = encoded(OutputFormat::Csv { header: false }, false, &[weighted(vec![3, 0, 1])]);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "1,alice,1.5,2026-01-01 00:00:10.000",
            "1,alice,1.5,2026-01-01 00:00:10.000",
            "1,alice,1.5,2026-01-01 00:00:10.000",
            "3,\"x, \"\"y\"\"\",2.0,2026-01-01 00:00:00.123",
        ]
    );
}

#[test]
#[should_panic(expected = "a retraction reached an encoder that is not updating")]
fn a_retraction_without_updating_is_a_bug() {
    let _ = encode(OutputFormat::JsonLines, false, &[weighted(vec![1, -1, 1])]);
}

#[test]
fn a_batch_of_another_schema_is_an_error() {
    let other = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["a"])) as ArrayRef],
    );
    let Ok(other) = other else { panic!("batch") };
    let error = encode(OutputFormat::JsonLines, false, &[Batch::inserts(other)]).err().map(|e| e.code);
    assert_eq!(error, Some("format.schema_mismatch"));
}

#[test]
fn microsecond_timestamps_keep_their_digits() {
    let schema = Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), false)]));
    let column = Arc::new(arrow::array::TimestampMicrosecondArray::from(vec![1_767_225_600_123_456])) as ArrayRef;
    let Ok(batch) = RecordBatch::try_new(schema.clone(), vec![column]) else { panic!("batch") };
    let mut out = Vec::new();
    let encoded = Encoder::new(OutputFormat::JsonLines, schema, false).encode(&Batch::inserts(batch), &mut out);
    assert!(encoded.is_ok());
    assert_eq!(String::from_utf8_lossy(&out), "{\"ts\":\"2026-01-01 00:00:00.123456\"}\n");
}

#[test]
fn encoded_rows_decode_back() {
    for (output, input) in [
        (OutputFormat::Csv { header: true }, RowFormat::Csv { header: true, delimiter: b',' }),
        (OutputFormat::JsonLines, RowFormat::Json),
    ] {
        let text = encoded(output, false, &[Batch::inserts(rows())]);
        let (batches, bad) = decode_whole(input, &schema(), text.as_bytes(), 16);
        assert!(bad.is_empty(), "{output:?}: {bad:?}");
        assert_eq!(table(&batches), table(&[rows()]), "{output:?}");
    }
}

#[test]
fn zoned_timestamps_carry_their_offset() {
    let zoned = DataType::Timestamp(TimeUnit::Millisecond, Some("+01:00".into()));
    let schema = Arc::new(Schema::new(vec![Field::new("ts", zoned, false)]));
    let column = TimestampMillisecondArray::from(vec![1_767_225_610_000]).with_timezone("+01:00");
    let Ok(batch) = RecordBatch::try_new(schema.clone(), vec![Arc::new(column) as ArrayRef]) else { panic!("batch") };
    let mut out = Vec::new();
    let encoded =
        Encoder::new(OutputFormat::Csv { header: false }, schema, false).encode(&Batch::inserts(batch), &mut out);
    assert!(encoded.is_ok());
    assert_eq!(String::from_utf8_lossy(&out), "2026-01-01 01:00:10.000+01:00\n");
}

#[test]
fn a_value_that_cannot_be_formatted_is_a_typed_error_not_error_text_regression() {
    let columns: Vec<(DataType, ArrayRef, &str)> = vec![
        (
            DataType::Timestamp(TimeUnit::Millisecond, None),
            Arc::new(TimestampMillisecondArray::from(vec![0, i64::MAX])),
            "TIMESTAMP(3) value 9223372036854775807 (milliseconds since 1970-01-01)",
        ),
        (
            DataType::Timestamp(TimeUnit::Second, Some("+01:00".into())),
            Arc::new(arrow::array::TimestampSecondArray::from(vec![0, i64::MIN]).with_timezone("+01:00")),
            "TIMESTAMP_LTZ(0) value -9223372036854775808 (seconds since 1970-01-01)",
        ),
        (
            DataType::Date32,
            Arc::new(arrow::array::Date32Array::from(vec![0, i32::MAX])),
            "DATE value 2147483647 (days since 1970-01-01)",
        ),
        (
            DataType::Time32(TimeUnit::Second),
            Arc::new(arrow::array::Time32SecondArray::from(vec![0, 86_400])),
            "Time32(s) value 86400 (seconds since midnight)",
        ),
    ];
    for (data_type, column, expected) in columns {
        let schema = Arc::new(Schema::new(vec![Field::new("when", data_type, false)]));
        let Ok(batch) = RecordBatch::try_new(schema.clone(), vec![column]) else { panic!("batch") };
        for format in [OutputFormat::JsonLines, OutputFormat::Csv { header: true }, OutputFormat::Pretty] {
            let mut out = Vec::new();
            let result = Encoder::new(format, schema.clone(), false).encode(&Batch::inserts(batch.clone()), &mut out);
            let text = String::from_utf8_lossy(&out);
            assert!(!text.contains("ERROR"), "{format:?} wrote {text}");
            let Err(error) = result else { panic!("{format:?} wrote {text}") };
            assert_eq!(error.code, "format.value_out_of_range", "{format:?}: {error}");
            assert_eq!(error.domain, sluice_types::Domain::User);
            assert_eq!(
                error.message,
                format!("column `when`, row 2 of a batch: {expected} cannot be written as a date or time")
            );
            assert!(error.fix.is_some_and(|fix| fix.contains("query")));
            assert!(out.is_empty(), "{format:?}: nothing is written for a batch that fails");
        }
    }
}
