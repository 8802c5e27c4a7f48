//! Tests of the Kafka connectors that need no broker: options, and messages into rows
//! (the broker tests are in the CLI's integration tests, `tests/cli/kafka.rs`).

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_config::parse_partial;

use sluice_runtime::SinkFactory;
use sluice_types::SluiceError;

use super::options::{
    Assignment, KafkaFormat, KafkaSinkMode, OffsetOutOfRange, REVOKE_TIMEOUT, StartAt, sink_options_of,
    source_options_of,
};
use super::rows::{Message, RowBuilder};
use super::sink::{KafkaSink, upsert_actions};
use crate::changelog::fixtures::{DEBEZIUM_BAD, DEBEZIUM_EVENTS, DEBEZIUM_ROWS};
use crate::connector::SourceContext;
use std::time::Duration;

fn source(options: &str) -> Result<super::KafkaSourceOptions, String> {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"kafka\"\nformat = \"json\"\nschema = \"a BIGINT\"\n[source.options]\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    let config = config.expect("parses");
    source_options_of(&config.sources[0])
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

#[test]
fn source_options_are_read_with_their_defaults() {
    let options = source("brokers = \"b:9092\"\ntopic = [\"x\", \"y\"]\n").expect("valid");
    assert_eq!(options.topics, ["x", "y"]);
    assert_eq!((options.start, options.bounded, options.group_id), (StartAt::Earliest, false, None));
    assert_eq!(options.format, KafkaFormat::Json);
    assert_eq!(options.offset_out_of_range, OffsetOutOfRange::Fail, "an offset the partition lost fails by default");
    for (written, policy) in [("earliest", OffsetOutOfRange::Earliest), ("latest", OffsetOutOfRange::Latest)] {
        let text = format!("brokers = \"b:9092\"\ntopic = \"x\"\noffset_out_of_range = \"{written}\"\n");
        assert_eq!(source(&text).expect("valid").offset_out_of_range, policy);
    }
    let options = source(
        "brokers = \"b:9092\"\ntopic = \"x\"\nstart = 1767225600000\nbounded = true\nidle_timeout = \"5s\"\n[source.options.client]\n\"fetch.min.bytes\" = 1\n\"check.crcs\" = true\n",
    )
    .expect("valid");
    assert_eq!(options.start, StartAt::Timestamp(1_767_225_600_000));
    assert_eq!(
        options.client,
        [("fetch.min.bytes".to_owned(), "1".to_owned()), ("check.crcs".to_owned(), "true".to_owned())]
    );
    assert_eq!(options.idle_timeout, Some(std::time::Duration::from_secs(5)));
}

#[test]
fn bad_source_options_are_each_named_with_a_fix() {
    let check = |options: &str, needles: &[&str]| {
        let message = source(options).expect_err("refused");
        for needle in needles {
            assert!(message.contains(needle), "{options:?}: {needle:?} not in {message}");
        }
    };
    check("topic = \"x\"\n", &["brokers", "add brokers"]);
    check("brokers = \"b:1\"\n", &["topic"]);
    check("brokers = \"b:1\"\ntopic = [\"x\", \"x\"]\n", &["`topic` must be"]);
    check("brokers = \"b:1\"\ntopic = \"x\"\nstart = \"committed\"\n", &["needs a consumer group", "group_id"]);
    check("brokers = \"b:1\"\ntopic = \"x\"\nstart = \"newest\"\n", &["`start` must be"]);
    check(
        "brokers = \"b:1\"\ntopic = \"x\"\n[source.options.client]\n\"group.id\" = \"g\"\n",
        &["client.group.id", "group_id"],
    );
    check("brokers = \"b:1\"\ntopic = \"x\"\noffset_out_of_range = \"none\"\n", &["\"fail\"", "\"earliest\""]);
    check(
        "brokers = \"b:1\"\ntopic = \"x\"\n[source.options.client]\n\"auto.offset.reset\" = \"latest\"\n",
        &["client.auto.offset.reset", "offset_out_of_range"],
    );
}

#[test]
fn group_mode_is_read_and_needs_a_group_id_and_an_unbounded_read() {
    let options = source("brokers = \"b:1\"\ntopic = \"x\"\n").expect("valid");
    assert_eq!((options.assignment, options.revoke_timeout), (Assignment::Manual, REVOKE_TIMEOUT));
    let options =
        source("brokers = \"b:1\"\ntopic = \"x\"\ngroup_id = \"g\"\nassignment = \"group\"\nrevoke_timeout = \"2s\"\n")
            .expect("valid");
    assert_eq!((options.assignment, options.revoke_timeout), (Assignment::Group, Duration::from_secs(2)));
    let check = |options: &str, needles: &[&str]| {
        let message = source(options).expect_err("refused");
        for needle in needles {
            assert!(message.contains(needle), "{options:?}: {needle:?} not in {message}");
        }
    };
    check(
        "brokers = \"b:1\"\ntopic = \"x\"\nassignment = \"group\"\n",
        &["assignment = \"group\" needs a consumer group", "add group_id"],
    );
    check(
        "brokers = \"b:1\"\ntopic = \"x\"\ngroup_id = \"g\"\nassignment = \"group\"\nbounded = true\n",
        &["bounded", "assignment = \"manual\""],
    );
    check("brokers = \"b:1\"\ntopic = \"x\"\nassignment = \"subscribe\"\n", &["\"manual\"", "\"group\""]);
    check("brokers = \"b:1\"\ntopic = \"x\"\nrevoke_timeout = \"0s\"\n", &["revoke_timeout"]);
}

/// Group mode cannot be exactly-once (the checkpoint's offsets would fight the group's)
/// nor run in a cluster (a worker may be given a partition whose lane is elsewhere):
/// both are refused before any broker is asked, naming the fix.
#[test]
fn group_mode_refuses_exactly_once_and_clusters() {
    let text = "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"kafka\"\nformat = \"json\"\n\
                schema = \"a BIGINT\"\n[source.options]\nbrokers = \"b:1\"\ntopic = \"x\"\ngroup_id = \"g\"\n\
                assignment = \"group\"\n";
    let (config, _) = parse_partial(text, "p.toml");
    let config = config.expect("parses");
    let options = source_options_of(&config.sources[0]).expect("valid");
    let context = |exactly_once: bool, workers: u32| SourceContext {
        config: &config.sources[0],
        base_dir: std::path::Path::new("."),
        lane_threads: 1,
        schema: None,
        layout: None,
        exactly_once,
        workers,
    };
    let error = super::check_group_mode(&options, &context(true, 1)).expect_err("refused");
    assert_eq!(error.code, "source.kafka_group_exactly_once");
    assert!(error.message.contains("assignment = \"group\"") && error.message.contains("exactly-once"), "{error:?}");
    assert!(format!("{error:?}").contains("at-least-once"), "the fix names the other guarantee: {error:?}");
    let error = super::check_group_mode(&options, &context(false, 3)).expect_err("refused");
    assert_eq!(error.code, "source.kafka_group_cluster");
    assert!(error.message.contains("3 workers"), "{error:?}");
    super::check_group_mode(&options, &context(false, 1)).expect("one at-least-once process is fine");
    let manual = super::KafkaSourceOptions { assignment: Assignment::Manual, ..options };
    super::check_group_mode(&manual, &context(true, 3)).expect("manual mode is not concerned");
}

#[test]
fn sink_options_refuse_raw_and_default_to_json() {
    let sink = |format: &str| {
        let text = format!(
            "[pipeline]\nname = \"p\"\n[[sink]]\nname = \"k\"\nfrom = \"t\"\nconnector = \"kafka\"\n{format}[sink.options]\nbrokers = \"b:1\"\ntopic = \"out\"\nkey = \"a\"\n"
        );
        let (config, _) = parse_partial(&text, "p.toml");
        sink_options_of(&config.expect("parses").sinks[0])
    };
    let options = sink("").expect("valid");
    assert_eq!(
        (options.format, options.key.clone(), options.mode),
        (KafkaFormat::Json, Some(vec!["a".to_owned()]), None)
    );
    assert!(sink("format = \"raw\"\n").is_err());
}

fn sink_options(options: &str) -> Result<super::KafkaSinkOptions, String> {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[sink]]\nname = \"k\"\nfrom = \"t\"\nconnector = \"kafka\"\n[sink.options]\nbrokers = \"b:1\"\ntopic = \"out\"\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    sink_options_of(&config.expect("parses").sinks[0])
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

#[test]
fn sink_modes_and_keys_are_read() {
    let options = sink_options("mode = \"upsert\"\nkey = [\"a\", \"b\"]\n").expect("valid");
    assert_eq!((options.mode, options.key), (Some(KafkaSinkMode::Upsert), Some(vec!["a".to_owned(), "b".to_owned()])));
    let options = sink_options("mode = \"changelog\"\n").expect("valid");
    assert_eq!((options.mode, options.key), (Some(KafkaSinkMode::Changelog), None));
    assert!(sink_options("mode = \"upsrt\"\n").expect_err("refused").contains("upsert"));
    assert!(sink_options("key = [\"a\", \"a\"]\n").expect_err("refused").contains("`key` must be"));
    let options = sink_options("headers_column = \"b\"\n[sink.options.headers]\norigin = \"sluice\"\n").expect("valid");
    assert_eq!(options.headers, [("origin".to_owned(), "sluice".to_owned())]);
    assert_eq!(options.headers_column.as_deref(), Some("b"));
    assert_eq!(sink_options("epoch_copy_mib = 64\n").expect("valid").epoch_copy_mib, Some(64));
    assert_eq!(sink_options("").expect("valid").epoch_copy_mib, None);
    assert!(sink_options("epoch_copy_mib = 0\n").expect_err("refused").contains("epoch_copy_mib"));
    let error = kafka_sink("headers_column = \"a\"\n", false, None).err().expect("a BIGINT column is refused");
    assert!(error.message.contains("not VARCHAR"), "{error:?}");
}

/// The sink over `a BIGINT, b VARCHAR` with `options`, for an input that is updating
/// or not, with an upsert key or not.
pub(super) fn kafka_sink(
    options: &str,
    updating: bool,
    upsert_key: Option<&[usize]>,
) -> Result<KafkaSink, SluiceError> {
    let schema = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
    KafkaSink::new("p", "k", &sink_options(options).expect("valid"), &schema, updating, upsert_key)
}

#[test]
fn upsert_mode_needs_a_key_and_takes_the_streams_by_default() {
    let sink = kafka_sink("mode = \"upsert\"\n", true, Some(&[0])).expect("keyed by the upsert key");
    assert_eq!(sink.describe(), "kafka(topic=out, json, upsert, key=a)");
    let sink = kafka_sink("mode = \"upsert\"\nkey = \"b\"\n", false, None).expect("an append-only stream keyed by b");
    assert_eq!(sink.describe(), "kafka(topic=out, json, upsert, key=b)");
    for (updating, key, why) in [
        (true, None, "without a known upsert key"),
        (true, Some(&[][..]), "global aggregate"),
        (false, None, "append-only"),
    ] {
        let error = kafka_sink("mode = \"upsert\"\n", updating, key).err().expect("refused");
        assert_eq!(error.code, "sink.kafka_key");
        assert!(error.message.contains(why) && error.message.contains("need a key"), "{error:?}");
        assert!(error.fix.as_deref().is_some_and(|f| f.contains("key = [")), "{error:?}");
    }
    let error = kafka_sink("key = [\"a\", \"c\"]\n", false, None).err().expect("refused");
    assert!(error.message.contains("`c`") && error.fix.as_deref().is_some_and(|f| f.contains("a, b")), "{error:?}");
    let sink = kafka_sink("", true, Some(&[0])).expect("the changelog needs no key");
    assert_eq!(sink.describe(), "kafka(topic=out, json)");
}

#[test]
fn transactions_stay_open_for_the_transaction_timeout_not_librdkafkas_minute() {
    let sink = kafka_sink("", false, None).expect("valid");
    let timeout = |sink: &KafkaSink, id| sink.producer_config(id).get("transaction.timeout.ms").map(str::to_owned);
    // The brokers' default maximum, far past librdkafka's 60 s and the default
    // checkpoint timeout of 10 minutes.
    assert_eq!(timeout(&sink, Some("t")).as_deref(), Some("900000"));
    assert_eq!(timeout(&sink, None), None, "an idempotent producer has no transactions");
    let sink = kafka_sink("transaction_timeout = \"30m\"\n", false, None).expect("valid");
    assert_eq!(timeout(&sink, Some("t")).as_deref(), Some("1800000"));
    let refused = sink_options("[sink.options.client]\n\"transaction.timeout.ms\" = \"60000\"\n").expect_err("owned");
    assert!(refused.contains("transaction_timeout"), "{refused}");
    assert!(sink_options("transaction_timeout = \"0s\"\n").is_err());
    // A broker whose transaction.max.timeout.ms is lower refuses init_transactions.
    let above = rdkafka::error::KafkaError::Global(rdkafka::types::RDKafkaErrorCode::InvalidTransactionTimeout);
    let error = sink.init_error("t", &above);
    assert_eq!(error.code, "sink.kafka_transaction_timeout");
    assert!(error.message.contains("1800000 ms") && error.message.contains("transaction.max.timeout.ms"), "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("checkpoint interval")), "{error}");
}

/// A message the brokers do not acknowledge within `delivery_timeout` (default the
/// source's 60 s on lost brokers, not librdkafka's 300 s) fails the sink.
#[test]
fn messages_wait_for_their_acknowledgement_at_most_the_delivery_timeout() {
    let timeout = |sink: &KafkaSink, id| sink.producer_config(id).get("message.timeout.ms").map(str::to_owned);
    let sink = kafka_sink("", false, None).expect("valid");
    assert_eq!(timeout(&sink, None).as_deref(), Some("60000"));
    assert_eq!(timeout(&sink, Some("t")).as_deref(), Some("60000"));
    let sink = kafka_sink("delivery_timeout = \"2s\"\n", false, None).expect("valid");
    assert_eq!(timeout(&sink, None).as_deref(), Some("2000"));
    let sink = kafka_sink("transaction_timeout = \"30s\"\n", false, None).expect("valid");
    assert_eq!(timeout(&sink, Some("t")).as_deref(), Some("30000"), "at most the transaction timeout");
    for setting in ["message.timeout.ms", "delivery.timeout.ms"] {
        let refused = sink_options(&format!("[sink.options.client]\n\"{setting}\" = 1000\n")).expect_err("owned");
        assert!(refused.contains("delivery_timeout"), "{refused}");
    }
    assert!(sink_options("delivery_timeout = \"0s\"\n").is_err());
}

/// A transaction stays open from an epoch's first message to the commit after its
/// checkpoint: the default timeout covers the longest checkpoint the run allows, and a
/// `transaction_timeout` that does not is refused when the sink is built.
#[test]
fn the_transaction_timeout_outlasts_the_longest_checkpoint() {
    let timeout = |sink: &KafkaSink| sink.producer_config(Some("t")).get("transaction.timeout.ms").map(str::to_owned);
    let minutes = |m: u64| Some(std::time::Duration::from_secs(m * 60));
    let short = kafka_sink("", false, None).expect("valid").with_checkpoint_span(minutes(11)).expect("fits");
    assert_eq!(timeout(&short).as_deref(), Some("900000"), "15 minutes cover 11");
    let long = kafka_sink("", false, None).expect("valid").with_checkpoint_span(minutes(30)).expect("fits");
    assert_eq!(timeout(&long).as_deref(), Some("1860000"), "a minute more than 30");
    let set = kafka_sink("transaction_timeout = \"20m\"\n", false, None).expect("valid");
    let Err(error) = set.with_checkpoint_span(minutes(20)) else { panic!("not longer than a checkpoint") };
    assert_eq!(error.code, "sink.kafka_transaction_timeout");
    assert!(error.message.contains("1200000 ms") && error.fix.is_some(), "{error}");
}

#[test]
fn upsert_actions_drop_a_retraction_whose_key_gets_a_later_value() {
    let (k1, k2) = (&b"{\"a\":1}"[..], &b"{\"a\":2}"[..]);
    // -U k1, +U k1: one upsert. -D k2: a tombstone. +I k2 then -D k2: an upsert, then
    // the tombstone that removes it.
    assert_eq!(upsert_actions(&[-1, 1, -1], &[k1, k1, k2]), [(1, true), (2, false)]);
    assert_eq!(upsert_actions(&[1, -1], &[k2, k2]), [(0, true), (1, false)]);
    // A retraction, another key's change, then the new version: still one upsert.
    assert_eq!(upsert_actions(&[-1, 1, 1], &[k1, k2, k1]), [(1, true), (2, true)]);
    // Weight 0 writes nothing, weight 2 one upsert; a retraction after the last upsert
    // of its key stays.
    assert_eq!(upsert_actions(&[0, 2, -1, 1, -1], &[k1, k1, k2, k2, k2]), [(1, true), (3, true), (4, false)]);
}

pub(super) fn schema(fields: &[(&str, DataType)]) -> SchemaRef {
    Arc::new(Schema::new(fields.iter().map(|(n, t)| Field::new(*n, t.clone(), true)).collect::<Vec<_>>()))
}

fn message(offset: i64, value: Option<&str>, key: Option<&str>) -> Message {
    Message {
        value: value.map(|v| v.as_bytes().to_vec()),
        key: key.map(|k| k.as_bytes().to_vec()),
        partition: 3,
        offset,
        timestamp: Some(1000 + offset),
        headers: Vec::new(),
    }
}

/// Builds the rows of `messages`; returns them as text lines and the bad offsets.
fn check(format: KafkaFormat, schema: SchemaRef, messages: &[Message]) -> (Vec<String>, Vec<i64>) {
    let mut builder = RowBuilder::new(schema, format, "t", 100).expect("builder");
    let (batch, bad) = builder.build(messages).expect("builds");
    let lines = batch.map(|b| rows_text(&b)).unwrap_or_default();
    (lines, bad.iter().map(|b| b.offset).collect())
}

pub(super) use crate::changelog::fixtures::rows_text;

#[test]
fn metadata_columns_follow_their_own_message_around_bad_ones() {
    let schema = schema(&[
        ("_offset", DataType::Int64),
        ("a", DataType::Int64),
        ("_key", DataType::Utf8),
        ("_partition", DataType::Int32),
        ("_timestamp", DataType::Timestamp(TimeUnit::Millisecond, None)),
        ("_topic", DataType::Utf8),
    ]);
    let messages = [
        message(10, Some("{\"a\":1}"), Some("k1")),
        message(11, Some("{\"a\":\"x\"}"), None),
        message(12, None, Some("tombstone")),
        message(13, Some("{\n \"a\": 4\n}\n"), None),
        message(14, Some("   "), None),
        message(15, Some("{\"a\":6}{\"a\":7}"), None),
        message(16, Some("{\"a\":8}"), Some("k8")),
    ];
    let (rows, bad) = check(KafkaFormat::Json, schema, &messages);
    assert_eq!(
        rows,
        [
            "10|1|k1|3|1970-01-01T00:00:01.010|t",
            "13|4|NULL|3|1970-01-01T00:00:01.013|t",
            "16|8|k8|3|1970-01-01T00:00:01.016|t"
        ]
    );
    assert_eq!(bad, [11, 12, 14, 15]);
}

#[test]
fn csv_messages_are_one_record_each() {
    let schema = schema(&[("a", DataType::Int64), ("b", DataType::Utf8), ("_offset", DataType::Int64)]);
    let messages = [
        message(0, Some("1,x\n"), None),
        message(1, Some("2,\"multi\nline\""), None),
        message(2, Some("3,y\n4,z"), None),
        message(3, Some("q,r"), None),
        message(4, Some("5,\"open"), None),
        message(5, Some("a,b"), None),
    ];
    let (rows, bad) = check(KafkaFormat::Csv, schema, &messages);
    assert_eq!(rows, ["1|x|0", "2|multi\nline|1"]);
    assert_eq!(bad, [2, 3, 4, 5]);
}

#[test]
fn raw_values_are_text_and_need_one_text_column() {
    let raw = schema(&[("line", DataType::Utf8), ("_offset", DataType::Int64)]);
    let mut messages = vec![message(0, Some("hello, world"), None), message(1, Some(""), None)];
    messages.push(Message { value: Some(vec![0xff, 0xfe]), ..message(2, None, None) });
    let (rows, bad) = check(KafkaFormat::Raw, raw, &messages);
    assert_eq!(rows, ["hello, world|0", "|1"]);
    assert_eq!(bad, [2]);
    let two = schema(&[("a", DataType::Utf8), ("b", DataType::Utf8)]);
    let error = RowBuilder::new(two, KafkaFormat::Raw, "t", 10).err().expect("refused");
    assert_eq!(error.code, "source.raw_schema");
}

#[test]
fn a_metadata_column_of_the_wrong_type_is_refused_with_the_right_one() {
    let wrong = schema(&[("_offset", DataType::Utf8)]);
    let error = RowBuilder::new(wrong, KafkaFormat::Json, "t", 10).err().expect("refused");
    assert!(error.fix.as_deref().is_some_and(|f| f.contains("_offset BIGINT")), "{error:?}");
    let keys = schema(&[("_key", DataType::Utf8)]);
    let mut builder = RowBuilder::new(keys, KafkaFormat::Json, "t", 10).expect("builder");
    let bad_key = Message { key: Some(vec![0xff]), ..message(0, Some("{}"), None) };
    let (batch, bad) = builder.build(&[bad_key, message(1, Some("{}"), Some("ok"))]).expect("builds");
    assert_eq!(bad.len(), 1);
    assert_eq!(batch.expect("one row").column(0).as_string::<i32>().value(0), "ok");
}

#[test]
fn headers_are_a_json_object_of_text() {
    let schema = schema(&[("_headers", DataType::Utf8), ("a", DataType::Int64)]);
    let with = |headers: Vec<(&str, Option<&[u8]>)>| Message {
        headers: headers.into_iter().map(|(n, v)| (n.to_owned(), v.map(<[u8]>::to_vec))).collect(),
        ..message(0, Some("{\"a\":1}"), None)
    };
    let messages = [
        with(vec![("trace", Some(b"t-1")), ("empty", None), ("trace", Some(b"t-2")), ("bin", Some(&[0xff, b'x']))]),
        with(Vec::new()),
    ];
    let (rows, bad) = check(KafkaFormat::Json, schema, &messages);
    assert_eq!(rows, ["{\"bin\":\"\u{fffd}x\",\"empty\":null,\"trace\":\"t-2\"}|1", "{}|1"]);
    assert!(bad.is_empty());
}

#[test]
fn the_consumer_refetches_a_drained_partition_soon_unless_the_user_says_otherwise() {
    use super::client::{FETCH_QUEUE_BACKOFF_MS, consumer_config};
    // librdkafka's default of 1000 ms left a lane idle for most of each second.
    let ours = consumer_config("localhost:9092", None, &[]);
    assert_eq!(ours.get("fetch.queue.backoff.ms"), Some(FETCH_QUEUE_BACKOFF_MS.to_string().as_str()));
    let theirs = consumer_config("localhost:9092", None, &[("fetch.queue.backoff.ms".to_owned(), "250".to_owned())]);
    assert_eq!(theirs.get("fetch.queue.backoff.ms"), Some("250"));
}

/// The options of a source with `on_error`, or every problem as one message.
fn source_on_error(on_error: &str, options: &str) -> Result<super::KafkaSourceOptions, String> {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"kafka\"\nformat = \"json\"\nschema = \"a BIGINT\"\n\
         on_error = \"{on_error}\"\n[source.options]\nbrokers = \"b:1\"\ntopic = \"x\"\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    let config = config.expect("parses");
    assert_eq!(config.sources[0].on_error == sluice_config::OnError::DeadLetter, on_error == "dead-letter");
    source_options_of(&config.sources[0])
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

#[test]
fn dead_letter_needs_its_topic_and_its_options_need_dead_letter() {
    let options = source_on_error("dead-letter", "dead_letter_topic = \"bad\"\n").expect("valid");
    let expected = super::options::DeadLetterOptions { topic: "bad".to_owned(), brokers: None };
    assert_eq!(options.dead_letter, Some(expected));
    let options =
        source_on_error("dead-letter", "dead_letter_topic = \"bad\"\ndead_letter_brokers = \"d:1\"\n").expect("valid");
    assert_eq!(options.dead_letter.and_then(|d| d.brokers).as_deref(), Some("d:1"));
    assert_eq!(source_on_error("skip", "").expect("valid").dead_letter, None);
    let message = source_on_error("dead-letter", "").expect_err("refused");
    assert!(message.contains("dead_letter_topic") && message.contains("add dead_letter_topic = "), "{message}");
    let message = source_on_error("dead-letter", "dead_letter_topic = \"\"\n").expect_err("refused");
    assert!(message.contains("`dead_letter_topic` must be"), "{message}");
    for on_error in ["skip", "fail"] {
        let message = source_on_error(on_error, "dead_letter_topic = \"bad\"\n").expect_err("refused");
        assert!(message.contains("applies only to on_error = \"dead-letter\""), "{message}");
        assert!(message.contains("set on_error = \"dead-letter\""), "{message}");
    }
}

/// Debezium events: each message gives its rows with their kinds (the last column, Flink's
/// RowKind byte) and its metadata; a tombstone gives none and is no bad message; a bad
/// envelope, or an event one of whose rows does not decode, is one bad message and gives
/// no row at all.
#[test]
fn debezium_events_become_rows_with_kinds_all_or_nothing_per_message() {
    let schema = schema(&[("id", DataType::Int64), ("v", DataType::Utf8), ("_offset", DataType::Int64)]);
    // Keys do not matter to `debezium-json`; one is given to some events all the same.
    let keys = [Some("{\"id\":1}"), None, None, Some("{\"id\":1}"), None, None, None];
    let messages: Vec<Message> = (1..)
        .zip(DEBEZIUM_EVENTS.iter().zip(keys))
        .map(|(offset, (value, key))| message(offset, *value, key))
        .collect();
    let (rows, bad) = check(KafkaFormat::DebeziumJson, schema, &messages);
    let expected: Vec<String> = DEBEZIUM_ROWS.iter().map(|(id, v, at, kind)| format!("{id}|{v}|{at}|{kind}")).collect();
    assert_eq!(rows, expected);
    assert_eq!(
        bad,
        DEBEZIUM_BAD.map(|at| at as i64),
        "the update whose after image is bad is dropped whole; the truncate refused"
    );
}

/// Upserts: the value is the key's new row (`+U`, 2), columns it lacks taken from the
/// key; a tombstone the key's delete (`-D`, 3); a message without a key is bad.
#[test]
fn upsert_messages_become_the_keys_new_row_or_its_delete() {
    let schema = schema(&[("id", DataType::Int64), ("v", DataType::Utf8)]);
    let messages = [
        message(1, Some(r#"{"id":1,"v":"a"}"#), Some(r#"{"id":1}"#)),
        message(2, Some(r#"{"v":"b"}"#), Some(r#"{"id":1}"#)),
        message(3, None, Some(r#"{"id":1}"#)),
        message(4, Some(r#"{"id":2,"v":"c"}"#), None),
        message(5, Some(r#"{"id":2,"v":"c"}"#), Some("not json")),
    ];
    let (rows, bad) = check(KafkaFormat::Upsert, schema, &messages);
    assert_eq!(rows, ["1|a|2", "1|b|2", "1|NULL|3"]);
    assert_eq!(bad, [4, 5]);
}
