//! Changelog topics on the real broker: Debezium change events (plain and
//! schema-embedded, with the tombstones Debezium sends after a delete and a bad envelope)
//! and upsert-kafka messages, read by their primary keys into an aggregate, a join and a
//! TopN; and the same pipeline killed after a checkpoint and restarted, its
//! normalization state restored, with the same final tables.
//!
//! The messages are the fixtures in `tests/changelog-oracle/`, and the answers are Apache
//! Flink's: `scripts/changelog-oracle.py` runs the same queries over the same messages and
//! writes them there. Flink reads the Debezium events with its `debezium-json` format. The
//! upsert messages it cannot read with `upsert-kafka` (the oracle has no Kafka connector):
//! the script decodes each key and value with Python's `json` as that connector's `json`
//! formats do, and Flink turns the rows into the table as it turns upsert-kafka's, through
//! its upsert changelog mode and normalization by the primary key. So the join's answer
//! and the upsert table's are Flink's, the decoding of their bytes is not.

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;

use super::{Broker, WAIT};
use crate::changelog::{fixture, oracle, table};
use crate::harness::{Scratch, killed_after_a_checkpoint_then_resumed, stderr};

/// Produces `(partition, key, value)` records (`None` value: a tombstone), one per batch
/// (see `Broker::produce`).
fn produce(broker: &Broker, topic: &str, records: &[(i32, Option<String>, Option<String>)]) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &broker.address).create().expect("producer");
    for (partition, key, value) in records {
        let mut record: BaseRecord<'_, str, str> = BaseRecord::to(topic).partition(*partition);
        if let Some(key) = key {
            record = record.key(key.as_str());
        }
        if let Some(value) = value {
            record = record.payload(value.as_str());
        }
        producer.send(record).map_err(|(e, _)| e).expect("send");
        producer.flush(WAIT).expect("the broker acknowledged");
    }
}

/// The Debezium fixture as records: keyed by `{"id":N}` on partition `N % 2`, each delete
/// followed by Debezium's tombstone; `wrap` embeds each in a `schema`/`payload` envelope.
fn orders(wrap: bool) -> Vec<(i32, Option<String>, Option<String>)> {
    let mut records = Vec::new();
    for line in fixture("orders.debezium.jsonl").lines() {
        let event: Value = serde_json::from_str(line).expect("a fixture event");
        let row = if event["after"].is_null() { &event["before"] } else { &event["after"] };
        let id = row["id"].as_i64().expect("an id");
        let key = format!("{{\"id\":{id}}}");
        let value = if wrap {
            format!("{{\"schema\":{{\"type\":\"struct\",\"optional\":false}},\"payload\":{line}}}")
        } else {
            line.to_string()
        };
        records.push(((id % 2) as i32, Some(key.clone()), Some(value)));
        if event["op"] == "d" {
            records.push(((id % 2) as i32, Some(key), None));
        }
    }
    records
}

/// The upsert fixture (`key<TAB>value`, an empty value a tombstone) as records: repeated
/// upserts, a key's value without the key's field, a tombstone of a key never upserted
/// (customer z) and one of a key that has a row (customer c).
fn customers() -> Vec<(i32, Option<String>, Option<String>)> {
    let lines = fixture("customers.upsert.tsv");
    lines
        .lines()
        .map(|line| {
            let (key, value) = line.split_once('\t').expect("key<TAB>value");
            (0, Some(key.to_string()), (!value.is_empty()).then(|| value.to_string()))
        })
        .collect()
}

fn pipeline(broker: &Broker, checkpoint: &str) -> String {
    let source = |name: &str, topic: &str, format: &str, schema: &str, key: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nconnector = \"kafka\"\nformat = \"{format}\"\nschema = \"{schema}\"\n\
             primary_key = [\"{key}\"]\n[source.options]\nbrokers = \"{}\"\ntopic = \"{topic}\"\nbounded = true\n\n",
            broker.address
        )
    };
    let orders = "id BIGINT NOT NULL, customer VARCHAR, amount BIGINT";
    let sink = |view: &str| {
        format!(
            "[[sink]]\nname = \"{view}_out\"\nfrom = \"{view}\"\nconnector = \"file\"\nformat = \"json\"\n\
             [sink.options]\npath = \"{view}.jsonl\"\n\n"
        )
    };
    let views = [
        ("totals", "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer"),
        (
            "totals_wrapped",
            "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders_wrapped GROUP BY customer",
        ),
        (
            "top",
            "SELECT customer, id, amount FROM (SELECT customer, id, amount, ROW_NUMBER() OVER \
             (PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1",
        ),
        (
            "regions",
            "SELECT c.region, SUM(o.amount) AS total, COUNT(*) AS n FROM orders o JOIN customers c \
             ON o.customer = c.name GROUP BY c.region",
        ),
        ("live_customers", "SELECT name, region FROM customers"),
    ];
    let mut text = format!("[pipeline]\nname = \"cdc\"\nbatch_size = 1\n\n{checkpoint}");
    text.push_str(&source("orders", "orders", "debezium-json", orders, "id"));
    text.push_str(&source("orders_wrapped", "orders_wrapped", "debezium-json", orders, "id"));
    text.push_str(&source("customers", "customers", "upsert", "name VARCHAR NOT NULL, region VARCHAR", "name"));
    for (name, sql) in views {
        text.push_str(&format!("[[view]]\nname = \"{name}\"\nsql = \"{sql}\"\n\n"));
        text.push_str(&sink(name));
    }
    text
}

fn broker_with_fixtures() -> Broker {
    let broker = Broker::with_topics(&[("orders", 2), ("orders_wrapped", 2), ("customers", 1)]);
    produce(&broker, "orders", &orders(false));
    produce(&broker, "orders_wrapped", &orders(true));
    produce(&broker, "customers", &customers());
    broker
}

/// Every sink's final table, checked against Flink's answers (and, to read them at a
/// glance, written out).
fn check_tables(scratch: &Scratch) {
    // Live orders: 2 (b, 25), 3 (b, 6), 4 (a, 8), 6 (c, 1); customers a and b in the
    // north, c deleted.
    let totals = [
        r#"{"customer":"a","n":1,"total":8}"#,
        r#"{"customer":"b","n":2,"total":31}"#,
        r#"{"customer":"c","n":1,"total":1}"#,
    ];
    assert_eq!(table(scratch, "totals"), totals);
    assert_eq!(table(scratch, "totals"), oracle("totals"), "Flink's answer");
    assert_eq!(table(scratch, "totals_wrapped"), totals, "schema-embedded events read as plain ones");
    let top = [
        r#"{"amount":1,"customer":"c","id":6}"#,
        r#"{"amount":25,"customer":"b","id":2}"#,
        r#"{"amount":8,"customer":"a","id":4}"#,
    ];
    assert_eq!(table(scratch, "top"), top);
    assert_eq!(table(scratch, "top"), oracle("top"), "Flink's answer");
    assert_eq!(table(scratch, "regions"), [r#"{"n":3,"region":"north","total":39}"#]);
    assert_eq!(table(scratch, "regions"), oracle("regions"), "Flink's answer");
    let customers = [r#"{"name":"a","region":"north"}"#, r#"{"name":"b","region":"north"}"#];
    assert_eq!(table(scratch, "live_customers"), customers);
    assert_eq!(table(scratch, "live_customers"), oracle("live_customers"), "Flink's answer");
}

/// The deletes of unknown keys `log` names other than the fixture's one (customer z's
/// tombstone, which Flink drops too).
fn unknown_keys_but_zs(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains("of a key that has no row"))
        .filter(|line| !line.contains("source customers: key (name=z): "))
        .collect()
}

#[test]
fn debezium_and_upsert_topics_through_an_aggregate_a_join_and_topn_end_as_their_tables() {
    let broker = broker_with_fixtures();
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&broker, ""));
    let explain = scratch.sluice(&["explain", "pipeline.toml"]);
    let text = String::from_utf8_lossy(&explain.stdout);
    for part in [
        "debezium-json, updating, primary key [id]",
        "upsert, updating, primary key [name]",
        "changelog_normalize (updating): upserts of `customers` (upsert) by primary key [name] into -U/+U",
    ] {
        assert!(text.contains(part), "expected {part:?} in:\n{text}");
    }
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", "2"]);
    assert!(run.status.success(), "sluice failed:\n{}", stderr(&run));
    check_tables(&scratch);
    // The bad envelope (op "x") is one bad message of each Debezium topic, named by its
    // position; the tombstones after deletes are no bad messages.
    let log = stderr(&run);
    assert!(log.contains("orders/1@6: op \"x\" is not one of c, r, u, d"), "{log}");
    assert!(log.contains("orders_wrapped/1@6: op \"x\""), "{log}");
    assert!(log.contains("source orders: 14 rows in, 1 bad rows"), "an update is two rows:\n{log}");
    assert!(!log.contains("tombstone"), "{log}");
    assert!(log.contains("source customers: key (name=z): a delete"), "{log}");
    assert_eq!(unknown_keys_but_zs(&log), Vec::<&str>::new(), "{log}");
}

#[test]
fn a_changelog_pipeline_killed_after_a_checkpoint_restores_its_normalization_and_ends_the_same() {
    let broker = broker_with_fixtures();
    let scratch = Scratch::new();
    let checkpoint = "[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n";
    scratch.write("pipeline.toml", &pipeline(&broker, checkpoint));
    let log = killed_after_a_checkpoint_then_resumed(scratch.dir.path());
    // Had the keys' rows not been restored, the changes after the checkpoint would
    // retract rows the normalization does not know (customer z's tombstone retracts
    // nothing in any run).
    assert_eq!(unknown_keys_but_zs(&log), Vec::<&str>::new(), "{log}");
    check_tables(&scratch);
}

/// The `kafka` sink's upsert mode and the `upsert` format are one format: an aggregate
/// of the Debezium topic written as upserts and tombstones (customer c loses its last
/// order on the way, then gets one again) reads back, by its key, as the aggregate's
/// table. The sink's records are copied one per batch into the topic read back: this
/// broker gives a partition's end offset as its last batch's first, which would end a
/// bounded read of the sink's batches early.
#[test]
fn a_topic_written_in_upsert_mode_reads_back_through_the_upsert_format_as_its_table() {
    let broker = Broker::with_topics(&[("orders", 2), ("totals", 2), ("copy", 2)]);
    produce(&broker, "orders", &orders(false));
    let scratch = Scratch::new();
    let write = format!(
        "[pipeline]\nname = \"write\"\nbatch_size = 1\nmini_batch_rows = 1\n\n\
         [[source]]\nname = \"orders\"\nconnector = \"kafka\"\nformat = \"debezium-json\"\n\
         schema = \"id BIGINT NOT NULL, customer VARCHAR, amount BIGINT\"\nprimary_key = [\"id\"]\n\
         [source.options]\nbrokers = \"{0}\"\ntopic = \"orders\"\nbounded = true\n\n\
         [[view]]\nname = \"totals\"\nsql = \"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"totals\"\nconnector = \"kafka\"\n[sink.options]\nbrokers = \"{0}\"\ntopic = \"totals\"\nmode = \"upsert\"\n",
        broker.address
    );
    scratch.write("write.toml", &write);
    // One thread: orders 4 and 6 (both customer c's, in one partition) reach the
    // aggregate in their order, so c's total drops to nothing before order 6 comes. With
    // two threads the exchange by primary key may give them to different threads, whose
    // changes the aggregate may see in either order (c then never loses its last order).
    let run = scratch.sluice(&["run", "write.toml", "--threads", "1"]);
    assert!(run.status.success(), "sluice failed:\n{}", stderr(&run));
    // Every record the sink wrote (its run ended: the topic stays quiet), in order.
    let records = broker.consume_all("totals", 2);
    let c_deleted = |(_, key, value): &(i32, Option<String>, Option<String>)| {
        value.is_none() && key.as_deref() == Some("{\"customer\":\"c\"}")
    };
    assert!(records.iter().any(c_deleted), "customer c's tombstone: {records:?}");
    produce(&broker, "copy", &records);
    let read = format!(
        "[pipeline]\nname = \"read\"\n\n[[source]]\nname = \"totals\"\nconnector = \"kafka\"\nformat = \"upsert\"\n\
         schema = \"customer VARCHAR NOT NULL, total BIGINT, n BIGINT\"\nprimary_key = [\"customer\"]\n\
         [source.options]\nbrokers = \"{}\"\ntopic = \"copy\"\nbounded = true\n\n\
         [[view]]\nname = \"again\"\nsql = \"SELECT * FROM totals\"\n\n\
         [[sink]]\nname = \"again_out\"\nfrom = \"again\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"again.jsonl\"\n",
        broker.address
    );
    scratch.write("read.toml", &read);
    let run = scratch.sluice(&["run", "read.toml", "--threads", "2"]);
    assert!(run.status.success(), "sluice failed:\n{}", stderr(&run));
    assert_eq!(table(&scratch, "again"), oracle("totals"), "Flink's answer, through the topic");
    assert!(!stderr(&run).contains("deletes of unknown keys"), "{}", stderr(&run));
}

/// Debezium's Avro envelope of the fixture's table (the row record defined in `before`,
/// named in `after`).
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"db.public.orders","fields":[
  {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
     {"name":"id","type":"long"},{"name":"customer","type":["null","string"],"default":null},
     {"name":"amount","type":["null","long"],"default":null}]}],"default":null},
  {"name":"after","type":["null","Value"],"default":null},
  {"name":"op","type":"string"}]}"#;

/// One JSON row image (or null) in the envelope's Avro encoding.
fn avro_image(out: &mut Vec<u8>, row: &Value) {
    if row.is_null() {
        super::avro_long(out, 0);
        return;
    }
    super::avro_long(out, 1);
    super::avro_long(out, row["id"].as_i64().expect("an id"));
    super::avro_long(out, 1);
    super::avro_string(out, row["customer"].as_str().expect("a customer"));
    super::avro_long(out, 1);
    super::avro_long(out, row["amount"].as_i64().expect("an amount"));
}

/// The fixture's Debezium events, written in Avro with the Confluent framing (schema id
/// 1), keyed and partitioned as [`orders`] does, Debezium's tombstones included.
#[test]
fn debezium_avro_confluent_events_end_as_flinks_table() {
    let broker = Broker::with_topics(&[("orders", 2)]);
    let records: Vec<(i32, Option<String>, Option<String>)> = orders(false);
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &broker.address).create().expect("producer");
    for (partition, key, value) in &records {
        let mut record: BaseRecord<'_, str, [u8]> = BaseRecord::to("orders").partition(*partition);
        if let Some(key) = key {
            record = record.key(key.as_str());
        }
        let bytes = value.as_ref().map(|json| {
            let event: Value = serde_json::from_str(json).expect("an event");
            let mut datum = Vec::new();
            avro_image(&mut datum, &event["before"]);
            avro_image(&mut datum, &event["after"]);
            super::avro_string(&mut datum, event["op"].as_str().expect("an op"));
            super::confluent(1, datum)
        });
        if let Some(bytes) = &bytes {
            record = record.payload(bytes.as_slice());
        }
        producer.send(record).map_err(|(e, _)| e).expect("send");
        producer.flush(WAIT).expect("the broker acknowledged");
    }
    let (registry, _) = super::serve_registry([(1, ENVELOPE.to_owned())].into_iter().collect());
    let scratch = Scratch::new();
    let pipeline = format!(
        "[pipeline]\nname = \"avro\"\nbatch_size = 2\n\n[[source]]\nname = \"orders\"\nconnector = \"kafka\"\n\
         format = \"debezium-avro-confluent\"\nschema = \"id BIGINT NOT NULL, customer VARCHAR, amount BIGINT\"\n\
         primary_key = [\"id\"]\n[source.options]\nbrokers = \"{}\"\ntopic = \"orders\"\nbounded = true\n\
         schema_registry = \"{registry}\"\n\n[[view]]\nname = \"totals\"\n\
         sql = \"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer\"\n\n{}",
        broker.address,
        "[[sink]]\nname = \"totals_out\"\nfrom = \"totals\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"totals.jsonl\"\n"
    );
    scratch.write("pipeline.toml", &pipeline);
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", "2"]);
    let log = stderr(&run);
    assert!(run.status.success(), "sluice failed:\n{log}");
    assert_eq!(table(&scratch, "totals"), oracle("totals"), "Flink's answer over the same events");
    assert!(log.contains("orders/1@6: op \"x\" is not one of c, r, u, d"), "{log}");
}
