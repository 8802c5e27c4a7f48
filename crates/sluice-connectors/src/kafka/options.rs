//! The options of the Kafka source and sink, validated without I/O.
//!
//! Both read `brokers` and a `client` table of librdkafka settings passed through as
//! written (`[source.options.client]` / `[sink.options.client]`, values strings, integers
//! or booleans). The settings the connector owns (`bootstrap.servers`, `group.id`,
//! `enable.auto.commit`, `transactional.id`, …) are refused there, naming the option to
//! use instead.

use std::time::Duration;

use sluice_config::{ConfigError, Located, OptionsReader, SinkConfig, SourceConfig};

use crate::connector::{OptionDoc, format_choice};

/// The row format of Kafka message values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaFormat {
    /// One JSON object per message.
    Json,
    /// One CSV record per message (comma separated, no header).
    Csv,
    /// The value as text, into the schema's one value column (VARCHAR).
    Raw,
    /// One Avro binary datum per message, written with the schema derived from the
    /// columns (see `avro.rs`).
    Avro,
    /// The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, one Avro
    /// binary datum written with that schema (fetched from `schema_registry`).
    AvroConfluent,
    /// Debezium change events in JSON (Flink's `debezium-json`): a changelog, read by
    /// its `primary_key` (see `sluice_formats::changelog`).
    DebeziumJson,
    /// Debezium change events in Avro, Confluent framing (Flink's
    /// `debezium-avro-confluent`; see `avro_debezium.rs`).
    DebeziumAvroConfluent,
    /// Flink's upsert-kafka: a JSON key (the primary key) and a JSON value (the key's
    /// new row), a tombstone a delete.
    Upsert,
}

impl KafkaFormat {
    /// The format's name as written.
    pub fn name(self) -> &'static str {
        match self {
            KafkaFormat::Json => "json",
            KafkaFormat::Csv => "csv",
            KafkaFormat::Raw => "raw",
            KafkaFormat::Avro => "avro",
            KafkaFormat::AvroConfluent => "avro-confluent",
            KafkaFormat::DebeziumJson => "debezium-json",
            KafkaFormat::DebeziumAvroConfluent => "debezium-avro-confluent",
            KafkaFormat::Upsert => "upsert",
        }
    }

    /// Whether messages are changes of a table (rows with row kinds), read by a primary
    /// key; and whether they are upserts.
    pub fn changelog(self) -> Option<crate::changelog::ChangelogFormat> {
        match self {
            KafkaFormat::DebeziumJson | KafkaFormat::DebeziumAvroConfluent => {
                Some(crate::changelog::ChangelogFormat { name: self.name(), upsert: false })
            }
            KafkaFormat::Upsert => Some(crate::changelog::ChangelogFormat { name: self.name(), upsert: true }),
            _ => None,
        }
    }
}

/// Where a partition starts when no checkpoint gives its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest retained record.
    Earliest,
    /// The end: only records produced after the start are read.
    Latest,
    /// The group's committed offset (`group_id` required); the oldest record when the
    /// group has none.
    Committed,
    /// The first record whose timestamp is at or after this many ms since the epoch.
    Timestamp(i64),
}

/// What a source does with an offset outside its partition's range (before the
/// earliest record the brokers still hold, or past the partition's end): a checkpoint's
/// or the group's offset after the topic was recreated or the brokers lost data. See
/// `range.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetOutOfRange {
    /// Stop the run, naming the partition, the offset and the partition's range.
    Fail,
    /// Log it and read from the earliest record the partition holds.
    Earliest,
    /// Log it and read only records produced from now on.
    Latest,
}

/// Who decides which partitions this process reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Kafka's manual assignment (`assign()`): every partition is a lane, placed over
    /// this process's threads by the runtime; the group (if any) only receives offsets.
    Manual,
    /// Kafka's group management (`subscribe()`): the consumer joins `group_id`, and a
    /// lane reads only while the group assigns its partition to this process.
    Group,
}

/// The default [`KafkaSourceOptions::revoke_timeout`].
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(5);

/// `[source.options]` of a Kafka source, and its `format`.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSourceOptions {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// One or several topics, read in this order (lanes are numbered topic by topic).
    pub topics: Vec<String>,
    pub group_id: Option<String>,
    /// Manual (every partition here) or group (what the group assigns); see `group.rs`.
    pub assignment: Assignment,
    /// Group mode: how long a revocation waits for the revoked partitions' rows to be
    /// acknowledged by a checkpoint before it commits what is and lets them go.
    pub revoke_timeout: Duration,
    pub start: StartAt,
    /// An offset the partition no longer holds: fail (the default) or reset.
    pub offset_out_of_range: OffsetOutOfRange,
    pub format: KafkaFormat,
    /// Read each partition up to the end offset seen at start, then end.
    pub bounded: bool,
    /// A partition without a record for this long stops holding the watermark back.
    pub idle_timeout: Option<Duration>,
    /// librdkafka settings, as written.
    pub client: Vec<(String, String)>,
    /// `avro-confluent`: the schema registry's base URL (`http://host:port`).
    pub schema_registry: Option<String>,
    /// `on_error = "dead-letter"`: where bad messages are written.
    pub dead_letter: Option<DeadLetterOptions>,
}

/// Where a Kafka source with `on_error = "dead-letter"` writes its bad messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterOptions {
    /// `dead_letter_topic`.
    pub topic: String,
    /// `dead_letter_brokers`; `None`: the source's `brokers`.
    pub brokers: Option<String>,
}

/// How a Kafka sink writes the changes of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaSinkMode {
    /// One message per row: an append-only stream's rows as they are, an updating
    /// stream's rows after Flink's op column (`+I`, `-U`, `+U`, `-D`).
    Changelog,
    /// Upsert-kafka: every message keyed by the key columns; an insert or new version is
    /// the row as the value, a delete a tombstone (no value).
    Upsert,
}

/// `[sink.options]` of a Kafka sink, and its `format`.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSinkOptions {
    pub brokers: String,
    pub topic: String,
    /// `None`: changelog, or upsert when asked; see [`KafkaSinkMode`].
    pub mode: Option<KafkaSinkMode>,
    /// The columns encoded (in the sink's format) as each message's key; in upsert mode
    /// the default is the stream's upsert key, otherwise no key.
    pub key: Option<Vec<String>>,
    /// Headers every message carries, as written.
    pub headers: Vec<(String, String)>,
    /// A VARCHAR column holding a JSON object whose entries are a message's headers (the
    /// column is not part of the value).
    pub headers_column: Option<String>,
    /// Json or Csv (raw is refused for sinks).
    pub format: KafkaFormat,
    /// The most MiB of messages one exactly-once writer copies between two checkpoints
    /// (the copy recovery writes again, see `sink.rs`); `None`: the default.
    pub epoch_copy_mib: Option<u32>,
    /// How long the brokers keep an exactly-once writer's transaction open before they
    /// abort it (librdkafka's `transaction.timeout.ms`); `None`: the default.
    pub transaction_timeout: Option<std::time::Duration>,
    /// How long a message may wait for the brokers' acknowledgement before the sink
    /// fails (librdkafka's `message.timeout.ms`); `None`: the default.
    pub delivery_timeout: Option<Duration>,
    pub client: Vec<(String, String)>,
}

pub(crate) const SOURCE_OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "brokers", kind: "string", default: "required", doc: "bootstrap brokers, host:port[,host:port]" },
    OptionDoc { key: "topic", kind: "string or array of strings", default: "required", doc: "the topics read" },
    OptionDoc {
        key: "group_id",
        kind: "string",
        default: "none",
        doc: "consumer group: offsets are committed to it after checkpoints; needed by start = \"committed\" \
              and assignment = \"group\"",
    },
    OptionDoc {
        key: "assignment",
        kind: "\"manual\" or \"group\"",
        default: "\"manual\"",
        doc: "manual: this process reads every partition (Kafka's assign()); group: it joins group_id and reads \
              the partitions the group gives it (Kafka's subscribe()), rebalancing with the other members; \
              at-least-once: rows read after the last committed checkpoint are read again by the next owner",
    },
    OptionDoc {
        key: "revoke_timeout",
        kind: "duration",
        default: "\"5s\"",
        doc: "group: how long a revoked partition waits for a checkpoint to acknowledge what it read before its \
              acknowledged offset is committed and it is let go",
    },
    OptionDoc {
        key: "start",
        kind: "\"earliest\", \"latest\", \"committed\" or integer ms since the epoch",
        default: "\"earliest\"",
        doc: "where partitions start when no checkpoint is restored (group mode: when the group has no offset for \
              them; \"committed\" then means \"earliest\")",
    },
    OptionDoc {
        key: "offset_out_of_range",
        kind: "\"fail\", \"earliest\" or \"latest\"",
        default: "\"fail\"",
        doc: "what a partition whose offset (a checkpoint's, the group's, or the one being read) is outside what \
              it holds (past its end, or before its earliest record: the topic recreated, the brokers' data lost) \
              does: fail naming the partition, the offset and the range, or read from the earliest record or the \
              end",
    },
    OptionDoc {
        key: "bounded",
        kind: "boolean",
        default: "false",
        doc: "read each partition to the end offset seen at start, then end",
    },
    OptionDoc {
        key: "idle_timeout",
        kind: "duration",
        default: "none",
        doc: "a partition silent this long stops holding the watermark back",
    },
    OptionDoc { key: "client", kind: "table", default: "empty", doc: "librdkafka settings passed through" },
    OptionDoc {
        key: "schema_registry",
        kind: "string",
        default: "required by format = \"avro-confluent\" and \"debezium-avro-confluent\", refused otherwise",
        doc: "the schema registry's base URL, plain http (http://host:port); writer schemas are fetched by id",
    },
    OptionDoc {
        key: "dead_letter_topic",
        kind: "string",
        default: "required with on_error = \"dead-letter\"",
        doc: "the existing topic each bad message is written to (its key, value and headers as read, plus \
              sluice.error, sluice.source, sluice.topic, sluice.partition and sluice.offset headers)",
    },
    OptionDoc {
        key: "dead_letter_brokers",
        kind: "string",
        default: "`brokers`",
        doc: "the brokers of dead_letter_topic, host:port[,host:port]",
    },
];

pub(crate) const SINK_OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "brokers", kind: "string", default: "required", doc: "bootstrap brokers, host:port[,host:port]" },
    OptionDoc { key: "topic", kind: "string", default: "required", doc: "the topic written" },
    OptionDoc {
        key: "mode",
        kind: "\"changelog\" or \"upsert\"",
        default: "\"changelog\"",
        doc: "one message per row (an updating stream's with the op column), or upsert-kafka: keyed upserts and tombstones",
    },
    OptionDoc {
        key: "key",
        kind: "string or array of strings",
        default: "the stream's upsert key in upsert mode, else none",
        doc: "the columns that key each message, encoded in the sink's format (a JSON object, a CSV record)",
    },
    OptionDoc {
        key: "headers",
        kind: "table",
        default: "empty",
        doc: "headers every message carries (name = \"value\")",
    },
    OptionDoc {
        key: "headers_column",
        kind: "string",
        default: "none",
        doc: "a VARCHAR column holding a JSON object of each message's headers, left out of the value",
    },
    OptionDoc {
        key: "epoch_copy_mib",
        kind: "integer, 1 to 1024",
        default: "16",
        doc: "exactly-once: the most MiB of messages one thread writes between two checkpoints (each checkpoint keeps \
              a copy, held in memory until its commit, to write them again after a crash)",
    },
    OptionDoc {
        key: "transaction_timeout",
        kind: "duration",
        default: "\"15m\"",
        doc: "exactly-once: how long the brokers keep a transaction open before aborting it (transaction.timeout.ms); \
              longer than the checkpoint interval plus the checkpoint timeout, at most the brokers' \
              transaction.max.timeout.ms",
    },
    OptionDoc {
        key: "delivery_timeout",
        kind: "duration",
        default: "\"60s\"",
        doc: "how long a message may wait for the brokers' acknowledgement (message.timeout.ms): brokers that \
              acknowledge nothing for this long fail the run, naming them; rows count as out once acknowledged",
    },
    OptionDoc { key: "client", kind: "table", default: "empty", doc: "librdkafka settings passed through" },
];

const SOURCE_FORMATS: &[(&str, KafkaFormat)] = &[
    ("json", KafkaFormat::Json),
    ("csv", KafkaFormat::Csv),
    ("raw", KafkaFormat::Raw),
    ("avro", KafkaFormat::Avro),
    ("avro-confluent", KafkaFormat::AvroConfluent),
    ("debezium-json", KafkaFormat::DebeziumJson),
    ("debezium-avro-confluent", KafkaFormat::DebeziumAvroConfluent),
    ("upsert", KafkaFormat::Upsert),
];
const SINK_FORMATS: &[(&str, KafkaFormat)] = &[("json", KafkaFormat::Json), ("csv", KafkaFormat::Csv)];

/// librdkafka settings the connector sets itself, with the option that replaces each.
const OWNED_SETTINGS: &[(&str, &str)] = &[
    ("bootstrap.servers", "set `brokers` instead"),
    ("metadata.broker.list", "set `brokers` instead"),
    ("group.id", "set `group_id` instead"),
    ("enable.auto.commit", "offsets are committed after checkpoints"),
    ("enable.auto.offset.store", "offsets are committed after checkpoints"),
    ("transactional.id", "it is derived from the pipeline, sink and slot"),
    ("enable.idempotence", "the sink always uses the idempotent producer"),
    ("transaction.timeout.ms", "set `transaction_timeout` instead"),
];
/// librdkafka settings a sink sets itself.
const SINK_OWNED_SETTINGS: &[(&str, &str)] = &[
    ("message.timeout.ms", "set `delivery_timeout` instead"),
    ("delivery.timeout.ms", "set `delivery_timeout` instead"),
];
/// librdkafka settings a source sets itself.
const SOURCE_OWNED_SETTINGS: &[(&str, &str)] =
    &[("auto.offset.reset", "set `start` (where to begin) or `offset_out_of_range` (an offset the partition lost)")];

fn client_fix(key: &str) -> String {
    format!("remove it from [{key}.options.client]")
}

/// Reads `client`: librdkafka settings, none of those the connector owns (`OWNED_SETTINGS`
/// and, for this `kind` of client, `also_owned`).
fn client(reader: &mut OptionsReader<'_>, kind: &str, also_owned: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
    let settings: Vec<(&str, &str)> = OWNED_SETTINGS.iter().chain(also_owned).copied().collect();
    let owned: Vec<&str> = settings.iter().map(|(name, _)| *name).collect();
    let expect = format!(
        "the connector sets {} itself ({})",
        owned.join(", "),
        settings.iter().map(|(n, why)| format!("{n}: {why}")).collect::<Vec<_>>().join("; ")
    );
    reader.string_table("client", &expect, &client_fix(kind), |name| !owned.contains(&name)).or(Vec::new())
}

fn brokers(reader: &mut OptionsReader<'_>, kind: &str) -> Option<String> {
    let field =
        reader.string("brokers", "a non-empty list host:port[,host:port]", "e.g. brokers = \"localhost:9092\"", |s| {
            !s.trim().is_empty()
        });
    let fix = format!("add brokers = \"host:port\" under [{kind}.options]");
    reader.required("brokers", field, &fix).map(|b: Located<String>| b.value)
}

/// The validated options of a `connector = "kafka"` source, or every problem.
pub fn source_options_of(config: &SourceConfig) -> Result<KafkaSourceOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let format = format_choice(config.format.as_ref(), options, config.position, SOURCE_FORMATS, true, &mut errors);
    if config.schema.is_none() {
        errors.push(options.item_error(
            config.position,
            "missing required key `schema`",
            "add the columns of the message values, e.g. schema = \"id BIGINT, name VARCHAR\" \
             (and metadata columns such as `_offset BIGINT`)",
        ));
    }
    let mut reader = options.read();
    reader.check_keys(&[
        "brokers",
        "topic",
        "group_id",
        "assignment",
        "revoke_timeout",
        "start",
        "offset_out_of_range",
        "bounded",
        "idle_timeout",
        "client",
        "schema_registry",
        "dead_letter_topic",
        "dead_letter_brokers",
    ]);
    let brokers = brokers(&mut reader, "source");
    let topics = reader.value(
        "topic",
        "a topic name or an array of topic names",
        "e.g. topic = \"bids\" or topic = [\"bids\", \"asks\"]",
        |value| {
            let names: Vec<String> = match value.as_str() {
                Some(name) => vec![name.to_owned()],
                None => value.as_array()?.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<_>>()?,
            };
            let valid = !names.is_empty() && names.iter().all(|n| !n.is_empty());
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            (valid && unique.len() == names.len()).then_some(names)
        },
    );
    let topics = reader.required("topic", topics, "add topic = \"<name>\" under [source.options]");
    let group_id =
        reader.string("group_id", "a non-empty group id", "e.g. group_id = \"sluice-bids\"", |s| !s.is_empty());
    let assignment = reader.choice("assignment", &[("manual", Assignment::Manual), ("group", Assignment::Group)]);
    let revoke_timeout = reader.duration("revoke_timeout", false, "e.g. revoke_timeout = \"5s\"");
    let start = reader.value(
        "start",
        "\"earliest\", \"latest\", \"committed\" or a timestamp in ms since the epoch",
        "e.g. start = \"earliest\" or start = 1767225600000",
        |value| match value.as_str() {
            Some("earliest") => Some(StartAt::Earliest),
            Some("latest") => Some(StartAt::Latest),
            Some("committed") => Some(StartAt::Committed),
            Some(_) => None,
            None => value.as_integer().filter(|ms| *ms >= 0).map(StartAt::Timestamp),
        },
    );
    let offset_out_of_range = reader.choice(
        "offset_out_of_range",
        &[
            ("fail", OffsetOutOfRange::Fail),
            ("earliest", OffsetOutOfRange::Earliest),
            ("latest", OffsetOutOfRange::Latest),
        ],
    );
    let bounded = reader.boolean("bounded", "set bounded = true or bounded = false").or(false);
    let idle_timeout = reader.duration("idle_timeout", false, "e.g. idle_timeout = \"10s\"");
    let client = client(&mut reader, "source", SOURCE_OWNED_SETTINGS);
    let schema_registry = reader.string(
        "schema_registry",
        "a plain http URL of the registry, http://host:port (https is not supported)",
        "e.g. schema_registry = \"http://localhost:8081\"",
        |url| super::avro::Registry::new(url).is_ok(),
    );
    let schema_registry = schema_registry.optional();
    match (format, &schema_registry) {
        (Some(format @ (KafkaFormat::AvroConfluent | KafkaFormat::DebeziumAvroConfluent)), Some(None)) => {
            errors.push(options.item_error(
                config.position,
                &format!("format = \"{}\" needs `schema_registry`", format.name()),
                "add schema_registry = \"http://host:port\" under [source.options]",
            ))
        }
        (Some(format), Some(Some(_)))
            if !matches!(format, KafkaFormat::AvroConfluent | KafkaFormat::DebeziumAvroConfluent) =>
        {
            reader.error(
                "schema_registry",
                "schema_registry is read only by format = \"avro-confluent\" or \"debezium-avro-confluent\"",
                "remove schema_registry, or set format = \"avro-confluent\"",
            )
        }
        _ => {}
    }
    let dead_letter = dead_letter(&mut reader, config.on_error);
    let group_id = group_id.optional();
    let start = start.or(StartAt::Earliest);
    if start == Some(StartAt::Committed) && matches!(group_id, Some(None)) {
        reader.error("start", "start = \"committed\" needs a consumer group", "add group_id = \"<group>\"");
    }
    let assignment = assignment.or(Assignment::Manual);
    if assignment == Some(Assignment::Group) {
        if matches!(group_id, Some(None)) {
            reader.error(
                "assignment",
                "assignment = \"group\" needs a consumer group to join",
                "add group_id = \"<group>\" (every pipeline sharing the partitions uses the same one)",
            );
        }
        let cooperative = client.iter().flatten().any(|(name, value)| {
            name == "partition.assignment.strategy" && value.to_ascii_lowercase().contains("cooperative")
        });
        if cooperative {
            reader.error(
                "client",
                "the cooperative rebalance protocol is not supported in group mode: a test lost rows of a \
                 partition that moved in an incremental rebalance",
                "remove partition.assignment.strategy (the eager protocol, range or roundrobin, is supported)",
            );
        }
        if bounded == Some(true) {
            reader.error(
                "bounded",
                "bounded = true reads every partition to its end, but in group mode the group decides which \
                 partitions this process reads",
                "remove bounded, or set assignment = \"manual\"",
            );
        }
    }
    let parsed = (|| {
        Some(KafkaSourceOptions {
            brokers: brokers?,
            topics: topics?,
            group_id: group_id?.map(|g| g.value),
            assignment: assignment?,
            revoke_timeout: revoke_timeout.or(REVOKE_TIMEOUT)?,
            start: start?,
            offset_out_of_range: offset_out_of_range.or(OffsetOutOfRange::Fail)?,
            format: format?,
            bounded: bounded?,
            idle_timeout: idle_timeout.optional()?,
            client: client?,
            schema_registry: schema_registry?.map(|url| url.value),
            dead_letter: dead_letter?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// Reads `dead_letter_topic` and `dead_letter_brokers`: the first required with
/// `on_error = "dead-letter"`, both refused without it.
fn dead_letter(reader: &mut OptionsReader<'_>, on_error: sluice_config::OnError) -> Option<Option<DeadLetterOptions>> {
    let topic = reader.string(
        "dead_letter_topic",
        "a non-empty topic name",
        "e.g. dead_letter_topic = \"bids-dead-letter\"",
        |s| !s.is_empty(),
    );
    let brokers = reader.string(
        "dead_letter_brokers",
        "a non-empty list host:port[,host:port]",
        "e.g. dead_letter_brokers = \"localhost:9092\", or remove it to use `brokers`",
        |s| !s.trim().is_empty(),
    );
    if on_error != sluice_config::OnError::DeadLetter {
        for key in ["dead_letter_topic", "dead_letter_brokers"] {
            if reader.has(key) {
                reader.error(
                    key,
                    &format!("`{key}` applies only to on_error = \"dead-letter\""),
                    &format!("set on_error = \"dead-letter\" on the [[source]], or remove `{key}`"),
                );
            }
        }
        return Some(None);
    }
    let topic = reader.required(
        "dead_letter_topic",
        topic,
        "add dead_letter_topic = \"<topic>\" under [source.options]: the existing topic that on_error = \
         \"dead-letter\" writes each bad message to",
    );
    Some(Some(DeadLetterOptions { topic: topic?.value, brokers: brokers.optional()?.map(|b| b.value) }))
}

/// The validated options of a `connector = "kafka"` sink, or every problem.
pub fn sink_options_of(config: &SinkConfig) -> Result<KafkaSinkOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let format = format_choice(config.format.as_ref(), options, config.position, SINK_FORMATS, false, &mut errors);
    let format_valid = config.format.is_none() || format.is_some();
    let mut reader = options.read();
    reader.check_keys(&[
        "brokers",
        "topic",
        "mode",
        "key",
        "headers",
        "headers_column",
        "epoch_copy_mib",
        "transaction_timeout",
        "delivery_timeout",
        "client",
    ]);
    let brokers = brokers(&mut reader, "sink");
    let topic = reader.string("topic", "a non-empty topic name", "e.g. topic = \"hot_items\"", |s| !s.is_empty());
    let topic = reader.required("topic", topic, "add topic = \"<name>\" under [sink.options]");
    let mode = reader.choice("mode", &[("changelog", KafkaSinkMode::Changelog), ("upsert", KafkaSinkMode::Upsert)]);
    let key = crate::connector::key_columns(&mut reader);
    let headers =
        reader.string_table("headers", "a header name", "e.g. [sink.options.headers] source = \"sluice\"", |name| {
            !name.is_empty()
        });
    let headers_column =
        reader.string("headers_column", "a column name", "e.g. headers_column = \"headers\"", |s| !s.is_empty());
    let epoch_copy_mib = reader.integer("epoch_copy_mib", 1..=1024, "e.g. epoch_copy_mib = 64");
    let transaction_timeout = reader.duration("transaction_timeout", false, "e.g. transaction_timeout = \"15m\"");
    let delivery_timeout = reader.duration("delivery_timeout", false, "e.g. delivery_timeout = \"60s\"");
    let client = client(&mut reader, "sink", SINK_OWNED_SETTINGS);
    let parsed = (|| {
        format_valid.then_some(())?;
        Some(KafkaSinkOptions {
            brokers: brokers?,
            topic: topic?.value,
            mode: mode.optional()?,
            key: key.optional()?,
            headers: headers.or(Vec::new())?,
            headers_column: headers_column.optional()?.map(|c| c.value),
            format: format.unwrap_or(KafkaFormat::Json),
            epoch_copy_mib: epoch_copy_mib.optional()?,
            transaction_timeout: transaction_timeout.optional()?,
            delivery_timeout: delivery_timeout.optional()?,
            client: client?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}
