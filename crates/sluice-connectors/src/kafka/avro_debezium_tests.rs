//! `debezium-avro-confluent` without a broker: Debezium envelopes written in Avro with
//! the registry's schema (served by a thread) into rows with their kinds, and what is bad.

use std::sync::Arc;

use apache_avro::Schema as AvroSchema;
use apache_avro::types::Value;
use arrow::datatypes::DataType;

use super::avro::Registry;
use super::avro_tests::{build, confluent, message, null, record, schema, serve_registry, some, to_avro_datum};
use super::options::KafkaFormat;
use super::rows::RowBuilder;

/// Debezium's envelope of a table `(id long, v string?, amount int?)`: the row record
/// defined in `before`, named in `after`.
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"db.public.t","fields":[
  {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
     {"name":"id","type":"long"},{"name":"v","type":["null","string"],"default":null},
     {"name":"amount","type":["null","int"],"default":null}]}],"default":null},
  {"name":"after","type":["null","Value"],"default":null},
  {"name":"op","type":"string"},
  {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

fn row(id: i64, v: &str, amount: i32) -> Value {
    some(record(vec![
        ("id", Value::Long(id)),
        ("v", some(Value::String(v.into()))),
        ("amount", some(Value::Int(amount))),
    ]))
}

fn event(schema: &AvroSchema, before: Value, after: Value, op: &str) -> Vec<u8> {
    let value = record(vec![("before", before), ("after", after), ("op", Value::String(op.into())), ("ts_ms", null())]);
    confluent(1, to_avro_datum(schema, value).expect("encodes"))
}

#[test]
fn debezium_avro_events_become_rows_with_kinds_all_or_nothing_per_message() {
    let (url, _) = serve_registry(vec![
        (1, ENVELOPE.to_owned()),
        (2, r#"{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}"#.to_owned()),
    ]);
    let envelope = AvroSchema::parse_str(ENVELOPE).expect("parses");
    // The columns: amount promoted from int to BIGINT, v left out, a nullable column the writer lacks.
    let columns = schema(&[
        ("id", DataType::Int64, false),
        ("amount", DataType::Int64, true),
        ("note", DataType::Utf8, true),
        ("_offset", DataType::Int64, false),
    ]);
    let mut builder = RowBuilder::new(columns, KafkaFormat::DebeziumAvroConfluent, "t", 10).expect("builder");
    builder.set_registry(Arc::new(Registry::new(&url).expect("url")));
    let mut tombstone = message(4, Vec::new());
    tombstone.value = None;
    let messages = [
        message(1, event(&envelope, null(), row(1, "a", 10), "c")),
        message(2, event(&envelope, row(1, "a", 10), row(1, "b", 20), "u")),
        message(3, event(&envelope, row(1, "b", 20), null(), "d")),
        tombstone,
        message(5, event(&envelope, null(), row(2, "c", 30), "r")),
        message(6, event(&envelope, null(), null(), "t")),
        message(7, event(&envelope, null(), null(), "u")),
        message(8, confluent(2, vec![2])),
        message(9, vec![1, 2]),
    ];
    let (rows, bad) = build(&mut builder, &messages);
    assert_eq!(rows, ["1|10|NULL|1|0", "1|10|NULL|2|1", "1|20|NULL|2|2", "1|20|NULL|3|3", "2|30|NULL|5|0"]);
    let reasons: Vec<(i64, &str)> = bad.iter().map(|b| (b.offset, b.reason.as_str())).collect();
    assert_eq!(reasons.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [6, 7, 8, 9], "{reasons:?}");
    assert!(reasons[0].1.contains("op \"t\" is not one of c, r, u, d"), "{reasons:?}");
    assert!(reasons[1].1.contains("op \"u\" with a null \"after\""), "{reasons:?}");
    assert!(reasons[2].1.contains("schema id 2 is not a Debezium envelope: it has no field `op`"), "{reasons:?}");
    assert!(reasons[3].1.contains("magic byte"), "{reasons:?}");
}

#[test]
fn debezium_avro_confluent_needs_a_registry_and_is_a_changelog() {
    let text = |options: &str| {
        format!(
            "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"kafka\"\nformat = \"debezium-avro-confluent\"\n\
             schema = \"id BIGINT\"\n[source.options]\nbrokers = \"b:9092\"\ntopic = \"t\"\n{options}"
        )
    };
    let options = |options: &str| {
        let (config, _) = sluice_config::parse_partial(&text(options), "p.toml");
        super::options::source_options_of(&config.expect("parses").sources[0])
            .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
    };
    let missing = options("").expect_err("refused");
    assert!(missing.contains("format = \"debezium-avro-confluent\" needs `schema_registry`"), "{missing}");
    let valid = options("schema_registry = \"http://localhost:8081\"\n").expect("valid");
    assert_eq!(valid.format, KafkaFormat::DebeziumAvroConfluent);
    assert!(valid.format.changelog().is_some_and(|format| !format.upsert));
}

/// Every prefix and every single-byte change of an update event: rows or bad messages,
/// never a panic, and never one row of a two-row update alone.
#[test]
fn no_bytes_of_an_envelope_make_the_decoder_panic_or_split_an_update() {
    let (url, _) = serve_registry(vec![(1, ENVELOPE.to_owned())]);
    let envelope = AvroSchema::parse_str(ENVELOPE).expect("parses");
    let datum = event(&envelope, row(1, "a", 10), row(1, "b", 20), "u");
    // An empty value is a tombstone, skipped: every prefix from one byte on.
    let mut values: Vec<Vec<u8>> = (1..=datum.len()).map(|n| datum[..n].to_vec()).collect();
    for at in 5..datum.len() {
        for byte in [0x00, 0x01, 0x7F, 0x80, 0xFF] {
            let mut changed = datum.clone();
            changed[at] = byte;
            values.push(changed);
        }
    }
    let columns = schema(&[("id", DataType::Int64, false), ("v", DataType::Utf8, true)]);
    let mut builder = RowBuilder::new(columns, KafkaFormat::DebeziumAvroConfluent, "t", 10).expect("builder");
    builder.set_registry(Arc::new(Registry::new(&url).expect("url")));
    for (offset, value) in values.into_iter().enumerate() {
        let (rows, bad) = build(&mut builder, &[message(offset as i64, value)]);
        assert!(rows.len() + bad.len() >= 1 && rows.len() <= 2, "{rows:?} {bad:?}");
        assert!(bad.is_empty() || rows.is_empty(), "a bad message gives no row: {rows:?}");
    }
}
