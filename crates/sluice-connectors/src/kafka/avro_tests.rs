//! Tests of the Avro formats that need no broker: the derived schema, datums into rows,
//! the Confluent framing against a registry served by a thread, and bad messages.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Decimal, Schema as AvroSchema};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_config::parse_partial;

use super::avro::{Registry, derived_schema_json};
use super::options::{KafkaFormat, source_options_of};
use super::rows::{BadMessage, Message, RowBuilder};
use super::tests::rows_text;

/// `value` encoded as one Avro binary datum of `schema`.
pub(super) fn to_avro_datum(schema: &AvroSchema, value: Value) -> apache_avro::AvroResult<Vec<u8>> {
    GenericDatumWriter::builder(schema).build()?.write_value_to_vec(value)
}

pub(super) fn schema(fields: &[(&str, DataType, bool)]) -> SchemaRef {
    Arc::new(Schema::new(fields.iter().map(|(n, t, null)| Field::new(*n, t.clone(), *null)).collect::<Vec<_>>()))
}

pub(super) fn message(offset: i64, value: Vec<u8>) -> Message {
    Message { value: Some(value), key: None, partition: 0, offset, timestamp: Some(offset), headers: Vec::new() }
}

pub(super) fn build(builder: &mut RowBuilder, messages: &[Message]) -> (Vec<String>, Vec<BadMessage>) {
    let (batch, bad) = builder.build(messages).expect("builds");
    (batch.map(|b| rows_text(&b)).unwrap_or_default(), bad)
}

pub(super) fn some(value: Value) -> Value {
    Value::Union(1, Box::new(value))
}

pub(super) fn null() -> Value {
    Value::Union(0, Box::new(Value::Null))
}

pub(super) fn record(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect())
}

fn all_types() -> SchemaRef {
    schema(&[
        ("id", DataType::Int64, false),
        ("i", DataType::Int32, true),
        ("s", DataType::Int16, true),
        ("t", DataType::Int8, true),
        ("b", DataType::Boolean, true),
        ("d", DataType::Float64, true),
        ("f", DataType::Float32, true),
        ("name", DataType::Utf8, true),
        ("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ("us", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ("price", DataType::Decimal128(10, 2), true),
        ("day", DataType::Date32, true),
    ])
}

#[test]
fn the_derived_schema_is_flinks_record_of_the_value_columns() {
    let json = derived_schema_json(&all_types()).expect("derived");
    let expected = r#"{"fields":[{"name":"id","type":"long"},{"default":null,"name":"i","type":["null","int"]},{"default":null,"name":"s","type":["null","int"]},{"default":null,"name":"t","type":["null","int"]},{"default":null,"name":"b","type":["null","boolean"]},{"default":null,"name":"d","type":["null","double"]},{"default":null,"name":"f","type":["null","float"]},{"default":null,"name":"name","type":["null","string"]},{"default":null,"name":"ts","type":["null",{"logicalType":"timestamp-millis","type":"long"}]},{"default":null,"name":"us","type":["null",{"logicalType":"timestamp-micros","type":"long"}]},{"default":null,"name":"price","type":["null",{"logicalType":"decimal","precision":10,"scale":2,"type":"bytes"}]},{"default":null,"name":"day","type":["null",{"logicalType":"date","type":"int"}]}],"name":"record","namespace":"org.apache.flink.avro.generated","type":"record"}"#;
    assert_eq!(json, expected);
    AvroSchema::parse_str(&json).expect("an Avro schema");
}

#[test]
fn columns_avro_cannot_carry_are_refused_by_name_with_a_fix() {
    let cases = [
        (
            schema(&[("a", DataType::Int64, true), ("when", DataType::Timestamp(TimeUnit::Second, None), true)]),
            "`when`",
        ),
        (schema(&[("l", DataType::List(Arc::new(Field::new("x", DataType::Int64, true))), true)]), "`l`"),
        (schema(&[("bad-name", DataType::Int64, true)]), "`bad-name`"),
    ];
    for (schema, needle) in cases {
        for format in [KafkaFormat::Avro, KafkaFormat::AvroConfluent] {
            let error = RowBuilder::new(Arc::clone(&schema), format, "t", 10).err().expect("refused");
            let text = error.to_string();
            assert!(text.contains(needle), "{text}");
            assert!(error.fix.is_some(), "{text}");
        }
    }
}

#[test]
fn plain_datums_decode_into_every_column_type_with_nulls_and_metadata() {
    let value_schema = all_types();
    let avro = AvroSchema::parse_str(&derived_schema_json(&value_schema).expect("derived")).expect("parses");
    let full = record(vec![
        ("id", Value::Long(7)),
        ("i", some(Value::Int(-3))),
        ("s", some(Value::Int(300))),
        ("t", some(Value::Int(-8))),
        ("b", some(Value::Boolean(true))),
        ("d", some(Value::Double(2.5))),
        ("f", some(Value::Float(0.25))),
        ("name", some(Value::String("é x".to_owned()))),
        ("ts", some(Value::TimestampMillis(1_767_225_600_123))),
        ("us", some(Value::TimestampMicros(1_767_225_600_123_456))),
        ("price", some(Value::Decimal(Decimal::from(vec![0xCF, 0xC7])))),
        ("day", some(Value::Date(20_454))),
    ]);
    let empty = record(vec![
        ("id", Value::Long(8)),
        ("i", null()),
        ("s", null()),
        ("t", null()),
        ("b", null()),
        ("d", null()),
        ("f", null()),
        ("name", null()),
        ("ts", null()),
        ("us", null()),
        ("price", null()),
        ("day", null()),
    ]);
    let mut fields: Vec<Field> = value_schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.insert(0, Field::new("_offset", DataType::Int64, true));
    let mut builder = RowBuilder::new(Arc::new(Schema::new(fields)), KafkaFormat::Avro, "t", 10).expect("builder");
    let messages = [
        message(5, to_avro_datum(&avro, full).expect("encodes")),
        message(6, to_avro_datum(&avro, empty).expect("encodes")),
    ];
    let (rows, bad) = build(&mut builder, &messages);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(
        rows,
        [
            "5|7|-3|300|-8|true|2.5|0.25|é x|2026-01-01T00:00:00.123|2026-01-01T00:00:00.123456|-123.45|2026-01-01",
            "6|8|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL",
        ]
    );
}

#[test]
fn a_value_that_is_not_one_datum_of_the_derived_schema_is_bad_and_costs_no_neighbour() {
    let value_schema = schema(&[("id", DataType::Int64, false), ("name", DataType::Utf8, true)]);
    let avro = AvroSchema::parse_str(&derived_schema_json(&value_schema).expect("derived")).expect("parses");
    let good = |id: i64| {
        to_avro_datum(&avro, record(vec![("id", Value::Long(id)), ("name", some(Value::String("ab".into())))]))
    };
    let datum = good(1).expect("encodes");
    let mut trailing = datum.clone();
    trailing.push(0);
    // id 1 (zigzag 2), the union's branch 1, a string of 1 byte that is not UTF-8.
    let not_utf8 = vec![2, 2, 2, 0xFF];
    let mut builder = RowBuilder::new(value_schema, KafkaFormat::Avro, "t", 10).expect("builder");
    let mut messages = vec![
        message(0, good(0).expect("encodes")),
        message(1, datum[..datum.len() - 1].to_vec()),
        message(2, trailing),
        message(3, not_utf8),
        message(4, vec![2, 4]),
        message(5, good(5).expect("encodes")),
    ];
    messages.push(Message { value: None, ..message(6, Vec::new()) });
    let (rows, bad) = build(&mut builder, &messages);
    assert_eq!(rows, ["0|ab", "5|ab"]);
    let offsets: Vec<i64> = bad.iter().map(|b| b.offset).collect();
    assert_eq!(offsets, [1, 2, 3, 4, 6]);
    assert!(bad[0].reason.contains("is truncated"), "{}", bad[0].reason);
    assert!(bad[1].reason.contains("1 bytes after the datum"), "{}", bad[1].reason);
    assert!(bad[2].reason.contains("UTF-8") || bad[2].reason.contains("utf"), "{}", bad[2].reason);
    assert!(bad[3].reason.contains("union") || bad[3].reason.contains("datum"), "{}", bad[3].reason);
}

/// A schema registry on 127.0.0.1 answering `GET /schemas/ids/N` from `schemas` (404
/// for others); counts the requests.
pub(super) fn serve_registry(schemas: Vec<(u32, String)>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().expect("clones"));
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let id = line.split(' ').nth(1).and_then(|p| p.strip_prefix("/schemas/ids/")).and_then(|i| i.parse().ok());
            let found = schemas.iter().find(|(i, _)| Some(*i) == id);
            let (status, body) = match found {
                Some((_, schema)) => ("200 OK", serde_json::json!({ "schema": schema }).to_string()),
                None => ("404 Not Found", r#"{"error_code":40403,"message":"Schema not found"}"#.to_owned()),
            };
            // Chunked, as some registries answer.
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (url, requests)
}

pub(super) fn confluent(id: u32, datum: Vec<u8>) -> Vec<u8> {
    let mut value = vec![0];
    value.extend_from_slice(&id.to_be_bytes());
    value.extend(datum);
    value
}

#[test]
fn confluent_values_resolve_their_writer_schema_onto_the_columns() {
    // The reader: id BIGINT NOT NULL, name VARCHAR, score DOUBLE, note VARCHAR.
    let value_schema = schema(&[
        ("id", DataType::Int64, false),
        ("name", DataType::Utf8, true),
        ("score", DataType::Float64, true),
        ("note", DataType::Utf8, true),
    ]);
    // Writer 1: fields in another order, `id` an int (promoted to long), `score` a
    // float, an extra field, no `note` (the column's default, null); `name` plain bytes.
    let writer1 = r#"{"type":"record","name":"v1","fields":[
        {"name":"extra","type":{"type":"array","items":"string"}},
        {"name":"score","type":"float"},
        {"name":"name","type":"bytes"},
        {"name":"id","type":"int"}]}"#;
    // Writer 2: the derived schema itself.
    let writer2 = derived_schema_json(&value_schema).expect("derived");
    let (url, requests) = serve_registry(vec![(1, writer1.to_owned()), (2, writer2.clone())]);
    let w1 = AvroSchema::parse_str(writer1).expect("parses");
    let w2 = AvroSchema::parse_str(&writer2).expect("parses");
    let v1 = |id: i32| {
        let value = record(vec![
            ("extra", Value::Array(vec![Value::String("x".into())])),
            ("score", Value::Float(1.5)),
            ("name", Value::Bytes(b"n1".to_vec())),
            ("id", Value::Int(id)),
        ]);
        confluent(1, to_avro_datum(&w1, value).expect("encodes"))
    };
    let v2 = record(vec![
        ("id", Value::Long(1 << 40)),
        ("name", null()),
        ("score", some(Value::Double(-2.0))),
        ("note", some(Value::String("hi".into()))),
    ]);
    let registry = Arc::new(Registry::new(&url).expect("url"));
    let mut builder = RowBuilder::new(value_schema, KafkaFormat::AvroConfluent, "t", 10).expect("builder");
    builder.set_registry(Arc::clone(&registry));
    let messages =
        [message(0, v1(10)), message(1, confluent(2, to_avro_datum(&w2, v2).expect("enc"))), message(2, v1(-4))];
    let (rows, bad) = build(&mut builder, &messages);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(rows, ["10|n1|1.5|NULL", "1099511627776|NULL|-2.0|hi", "-4|n1|1.5|NULL"]);
    assert_eq!(requests.load(Ordering::SeqCst), 2, "each schema id asked once");
    // Another lane's builder shares the registry's cache.
    let mut other = RowBuilder::new(schema(&[("id", DataType::Int64, false)]), KafkaFormat::AvroConfluent, "t", 10)
        .expect("builder");
    other.set_registry(registry);
    let (rows, bad) = build(&mut other, &[message(3, v1(3))]);
    assert_eq!((rows, bad.len()), (vec!["3".to_owned()], 0));
    assert_eq!(requests.load(Ordering::SeqCst), 2, "the cache answered");
}

#[test]
fn every_kind_of_bad_confluent_message_is_named_and_costs_no_neighbour() {
    let value_schema = schema(&[
        ("id", DataType::Int32, false),
        ("small", DataType::Int16, true),
        ("price", DataType::Decimal128(5, 2), true),
    ]);
    let good_schema = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"int"},
        {"name":"small","type":["null","int"]},
        {"name":"price","type":["null",{"type":"bytes","logicalType":"decimal","precision":5,"scale":2}]}]}"#;
    let long_id = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}"#;
    let no_id = r#"{"type":"record","name":"r","fields":[{"name":"small","type":"int"}]}"#;
    let nullable_id = r#"{"type":"record","name":"r","fields":[{"name":"id","type":["null","int"]}]}"#;
    let recursive = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"int"},
        {"name":"next","type":["null","r"]}]}"#;
    let other_scale = r#"{"type":"record","name":"r","fields":[{"name":"id","type":"int"},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":6,"scale":3}}]}"#;
    let (url, _) = serve_registry(vec![
        (1, good_schema.to_owned()),
        (2, long_id.to_owned()),
        (3, no_id.to_owned()),
        (4, nullable_id.to_owned()),
        (5, other_scale.to_owned()),
        (6, "not json at all".to_owned()),
        (8, recursive.to_owned()),
    ]);
    let encode =
        |schema: &str, value: Value| to_avro_datum(&AvroSchema::parse_str(schema).expect("p"), value).expect("e");
    let good = |id: i32| {
        confluent(1, encode(good_schema, record(vec![("id", Value::Int(id)), ("small", null()), ("price", null())])))
    };
    let mut truncated = good(0);
    truncated.pop();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1, 0, 0, 0, 1, 2, 0, 0], "not the Confluent magic byte 0"),
        (vec![0, 0, 0], "fewer than the Confluent header"),
        (confluent(99, vec![2, 0, 0]), "no schema id 99"),
        (truncated, "the datum of schema id 1 is truncated"),
        (confluent(2, encode(long_id, record(vec![("id", Value::Long(5))]))), "field `id` is long"),
        (
            confluent(
                1,
                encode(
                    good_schema,
                    record(vec![("id", Value::Int(1)), ("small", some(Value::Int(40_000))), ("price", null())]),
                ),
            ),
            "int 40000 does not fit SMALLINT",
        ),
        (
            confluent(
                1,
                encode(
                    good_schema,
                    record(vec![
                        ("id", Value::Int(1)),
                        ("small", null()),
                        ("price", some(Value::Decimal(Decimal::from(vec![0x01, 0x86, 0xA0])))),
                    ]),
                ),
            ),
            "does not fit DECIMAL(5, 2)",
        ),
        (confluent(3, encode(no_id, record(vec![("small", Value::Int(1))]))), "no field `id`"),
        (confluent(4, encode(nullable_id, record(vec![("id", null())]))), "is NOT NULL"),
        (
            confluent(
                5,
                encode(
                    other_scale,
                    record(vec![("id", Value::Int(1)), ("price", Value::Decimal(Decimal::from(vec![1])))]),
                ),
            ),
            "scale 3",
        ),
        (confluent(6, vec![2]), "schema id 6"),
        (confluent(8, vec![2, 0]), "schema id 8 is recursive"),
    ];
    let mut messages = vec![message(0, good(100))];
    for (i, (value, _)) in cases.iter().enumerate() {
        messages.push(message(i as i64 + 1, value.clone()));
    }
    messages.push(message(cases.len() as i64 + 1, good(200)));
    let mut builder = RowBuilder::new(value_schema, KafkaFormat::AvroConfluent, "t", 10).expect("builder");
    builder.set_registry(Arc::new(Registry::new(&url).expect("url")));
    let (rows, bad) = build(&mut builder, &messages);
    assert_eq!(rows, ["100|NULL|NULL", "200|NULL|NULL"]);
    assert_eq!(bad.len(), cases.len(), "{bad:#?}");
    for (bad, (_, needle)) in bad.iter().zip(&cases) {
        assert!(bad.reason.contains(needle), "offset {}: {needle:?} not in {:?}", bad.offset, bad.reason);
    }
}

#[test]
fn no_bytes_make_the_decoders_panic() {
    let value_schema = all_types();
    let avro = AvroSchema::parse_str(&derived_schema_json(&value_schema).expect("derived")).expect("parses");
    let datum = to_avro_datum(
        &avro,
        record(vec![
            ("id", Value::Long(-1)),
            ("i", some(Value::Int(1))),
            ("s", null()),
            ("t", some(Value::Int(2))),
            ("b", some(Value::Boolean(false))),
            ("d", null()),
            ("f", some(Value::Float(1.0))),
            ("name", some(Value::String("long enough text".into()))),
            ("ts", some(Value::TimestampMillis(1))),
            ("us", null()),
            ("price", some(Value::Decimal(Decimal::from(vec![0x7F, 0xFF, 0xFF])))),
            ("day", some(Value::Date(1))),
        ]),
    )
    .expect("encodes");
    let (url, _) = serve_registry(vec![(7, derived_schema_json(&value_schema).expect("derived"))]);
    let mut values: Vec<Vec<u8>> = (0..=datum.len()).map(|n| datum[..n].to_vec()).collect();
    // Every single-byte change of the datum, and pseudo-random bytes.
    for at in 0..datum.len() {
        for byte in [0x00, 0x01, 0x7F, 0x80, 0xFF] {
            let mut changed = datum.clone();
            changed[at] = byte;
            values.push(changed);
        }
    }
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..2000 {
        let len = (state % 40) as usize;
        let mut value = Vec::with_capacity(len);
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            value.push(state as u8);
        }
        values.push(value);
    }
    let plain: Vec<Message> = values.iter().enumerate().map(|(i, v)| message(i as i64, v.clone())).collect();
    let framed: Vec<Message> =
        values.iter().enumerate().map(|(i, v)| message(i as i64, confluent(7, v.clone()))).collect();
    let mut builder = RowBuilder::new(Arc::clone(&value_schema), KafkaFormat::Avro, "t", 10).expect("builder");
    let (batch, bad) = builder.build(&plain).expect("builds");
    assert_eq!(batch.map_or(0, |b| b.num_rows()) + bad.len(), plain.len());
    let mut builder = RowBuilder::new(value_schema, KafkaFormat::AvroConfluent, "t", 10).expect("builder");
    builder.set_registry(Arc::new(Registry::new(&url).expect("url")));
    let (batch, bad) = builder.build(&framed).expect("builds");
    assert_eq!(batch.map_or(0, |b| b.num_rows()) + bad.len(), framed.len());
}

#[test]
fn a_registry_that_does_not_answer_fails_in_bounded_time_naming_its_url() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let registry = Registry::new(&url).expect("url").with_timeout(Duration::from_millis(100));
    let started = Instant::now();
    let error = registry.schema(1).expect_err("no answer");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let text = error.to_string();
    assert!(text.contains(&url) && text.contains("did not answer"), "{text}");
    assert!(error.fix.as_deref().is_some_and(|f| f.contains("schema_registry")), "{error:?}");
    drop(listener);
    // Nothing listening: refused at once, the same error.
    let registry = Registry::new(&url).expect("url").with_timeout(Duration::from_millis(100));
    assert!(registry.schema(1).expect_err("refused").to_string().contains(&url));
}

fn source(format: &str, options: &str) -> Result<super::KafkaSourceOptions, String> {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"kafka\"\nformat = \"{format}\"\nschema = \"a BIGINT\"\n[source.options]\nbrokers = \"b:1\"\ntopic = \"t\"\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    source_options_of(&config.expect("parses").sources[0])
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

#[test]
fn the_avro_formats_options_are_checked() {
    assert_eq!(source("avro", "").expect("valid").format, KafkaFormat::Avro);
    let options = source("avro-confluent", "schema_registry = \"http://localhost:8081\"").expect("valid");
    assert_eq!(options.format, KafkaFormat::AvroConfluent);
    assert_eq!(options.schema_registry.as_deref(), Some("http://localhost:8081"));
    let check = |format: &str, options: &str, needles: &[&str]| {
        let message = source(format, options).expect_err("refused");
        for needle in needles {
            assert!(message.contains(needle), "{options:?}: {needle:?} not in {message}");
        }
    };
    check("avro-confluent", "", &["needs `schema_registry`", "http://host:port"]);
    check("avro", "schema_registry = \"http://r:1\"", &["only by format = \"avro-confluent\""]);
    check("json", "schema_registry = \"http://r:1\"", &["only by format = \"avro-confluent\""]);
    check("avro-confluent", "schema_registry = \"https://r:1\"", &["https is not supported"]);
    check("avro-confluent", "schema_registry = \"r:1\"", &["plain http URL"]);
    check("avro-confluent", "schema_registry = \"http://r:port\"", &["schema_registry"]);
}

#[test]
fn registry_urls_are_parsed() {
    for (url, ok) in [
        ("http://localhost:8081", true),
        ("http://localhost", true),
        ("http://[::1]:8081/base/", true),
        ("https://localhost:8081", false),
        ("http://", false),
        ("http://u@h:1", false),
        ("http://h:99999", false),
    ] {
        assert_eq!(Registry::new(url).is_ok(), ok, "{url}");
    }
}

/// A pseudo-random sequence for the equivalence test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn the_direct_decoder_reads_what_the_general_one_reads() {
    let writer = r#"{"type":"record","name":"w","fields":[
        {"name":"id","type":"long"},
        {"name":"skip","type":"string"},
        {"name":"i","type":"int"},
        {"name":"b","type":"boolean"},
        {"name":"f","type":"float"},
        {"name":"d","type":["null","double"]},
        {"name":"by","type":"bytes"},
        {"name":"s","type":["string","null"]},
        {"name":"dt","type":{"type":"int","logicalType":"date"}},
        {"name":"tsm","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"tsu","type":["null",{"type":"long","logicalType":"timestamp-micros"}]},
        {"name":"ltm","type":{"type":"long","logicalType":"local-timestamp-millis"}},
        {"name":"dec","type":["null",{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}]},
        {"name":"u","type":["null","string","long"]},
        {"name":"small","type":"int"}]}"#;
    let value_schema = schema(&[
        ("id", DataType::Int64, false),
        ("i", DataType::Int32, true),
        ("b", DataType::Boolean, true),
        ("f", DataType::Float32, true),
        ("d", DataType::Float64, false),
        ("by", DataType::Utf8, true),
        ("s", DataType::Utf8, true),
        ("dt", DataType::Date32, true),
        ("tsm", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ("tsu", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ("ltm", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ("dec", DataType::Decimal128(10, 2), true),
        ("u", DataType::Int64, true),
        ("small", DataType::Int8, true),
        ("missing", DataType::Utf8, true),
    ]);
    let avro = AvroSchema::parse_str(writer).expect("parses");
    let (url, _) = serve_registry(vec![(1, writer.to_owned())]);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut values = Vec::new();
    for _ in 0..300 {
        let text =
            |rng: &mut Rng| (0..rng.below(6)).map(|_| char::from(b'a' + rng.below(26) as u8)).collect::<String>();
        let bytes: Vec<u8> = match rng.below(4) {
            0 => vec![0xC3, 0x28],
            _ => text(&mut rng).into_bytes(),
        };
        let decimal: Vec<u8> = (0..1 + rng.below(6)).map(|_| rng.next() as u8).collect();
        let value = record(vec![
            ("id", Value::Long(rng.next() as i64 >> rng.below(64))),
            ("skip", Value::String(text(&mut rng))),
            ("i", Value::Int(rng.next() as i32)),
            ("b", Value::Boolean(rng.below(2) == 0)),
            ("f", Value::Float(rng.next() as f32)),
            ("d", if rng.below(5) == 0 { null() } else { some(Value::Double(rng.next() as f64 / 3.0)) }),
            ("by", Value::Bytes(bytes)),
            (
                "s",
                if rng.below(3) == 0 {
                    Value::Union(1, Box::new(Value::Null))
                } else {
                    Value::Union(0, Box::new(Value::String(text(&mut rng))))
                },
            ),
            ("dt", Value::Date(rng.below(40_000) as i32)),
            ("tsm", Value::TimestampMillis(rng.next() as i64 >> 20)),
            ("tsu", if rng.below(3) == 0 { null() } else { some(Value::TimestampMicros(rng.next() as i64 >> 10)) }),
            ("ltm", Value::LocalTimestampMillis(rng.below(1 << 40) as i64)),
            ("dec", if rng.below(4) == 0 { null() } else { some(Value::Decimal(Decimal::from(decimal))) }),
            (
                "u",
                match rng.below(3) {
                    0 => Value::Union(0, Box::new(Value::Null)),
                    1 => Value::Union(1, Box::new(Value::String(text(&mut rng)))),
                    _ => Value::Union(2, Box::new(Value::Long(rng.next() as i64))),
                },
            ),
            ("small", Value::Int(rng.below(300) as i32 - 150)),
        ]);
        values.push(to_avro_datum(&avro, value).expect("encodes"));
    }
    // Damaged copies: cut short, a byte changed, a byte added.
    for at in 0..values.len() {
        let mut value = values[at].clone();
        match rng.below(3) {
            0 => value.truncate(rng.below(value.len() as u64) as usize),
            1 => {
                let i = rng.below(value.len() as u64) as usize;
                value[i] = rng.next() as u8;
            }
            _ => value.push(rng.next() as u8),
        }
        values.push(value);
    }
    let messages: Vec<Message> =
        values.iter().enumerate().map(|(i, v)| message(i as i64, confluent(1, v.clone()))).collect();
    let registry = Arc::new(Registry::new(&url).expect("url"));
    let mut results = Vec::new();
    for general in [false, true] {
        let mut builder =
            RowBuilder::new(Arc::clone(&value_schema), KafkaFormat::AvroConfluent, "t", 1000).expect("builder");
        builder.set_registry(Arc::clone(&registry));
        if general {
            builder.set_general_only();
        }
        let (rows, bad) = build(&mut builder, &messages);
        // The decoders' own words for a malformed datum differ; everything else is ours.
        let bad: Vec<(i64, String)> = bad
            .into_iter()
            .map(|b| match b.reason.starts_with("not a datum of") {
                true => (b.offset, "malformed".to_owned()),
                false => (b.offset, b.reason),
            })
            .collect();
        results.push((rows, bad));
    }
    let (direct, general) = (&results[0], &results[1]);
    assert!(direct.0.len() > 50 && direct.1.len() > 300, "good {} bad {}", direct.0.len(), direct.1.len());
    let differ = direct.0.iter().zip(&general.0).find(|(d, g)| d != g);
    assert_eq!(differ, None, "the same rows");
    assert_eq!(direct.0.len(), general.0.len());
    let differ = direct.1.iter().zip(&general.1).find(|(d, g)| d != g);
    assert_eq!(differ, None, "the same bad messages, for the same reasons");
    assert_eq!(direct.1.len(), general.1.len());
}
