//! The Kafka sink: one message per row or change (JSON or CSV, the key from columns),
//! one writer per thread.
//!
//! # At-least-once (no checkpoints, or `guarantee = "at-least-once"`)
//!
//! Each writer owns an idempotent producer (`enable.idempotence`: no duplicates from
//! the client's own retries, order kept per partition). At a barrier it flushes, so a
//! checkpoint's positions never pass a row the brokers have not acknowledged; a
//! delivery that failed fails the next write, the barrier or the end. Its rows count
//! as out once the brokers acknowledged them, and brokers that acknowledge nothing for
//! `delivery_timeout` (default 60 s) fail the run naming them (`delivery`).
//!
//! # Exactly-once (checkpoints with `guarantee = "exactly-once"`)
//!
//! Each writer owns two transactional producers whose ids are stable across restarts:
//! `sluice-{pipeline}-{sink}-{slot}-{0|1}`. Opening one calls `init_transactions`,
//! which fences any earlier producer with that id (a zombie of a crashed run) and
//! aborts its open transaction. Each epoch is written in a transaction of one of them,
//! the writer switching to the other at each barrier:
//!
//! Every transactional producer sets `transaction.timeout.ms` to `transaction_timeout`
//! (default [`TRANSACTION_TIMEOUT`], the brokers' default `transaction.max.timeout.ms`,
//! or a minute more than `[checkpoint] interval` + `timeout` when that is longer; a
//! `transaction_timeout` not above that sum is refused when the sink is built):
//! a transaction stays open from the first message of an epoch until the commit after
//! the next checkpoint, so librdkafka's own default (60 s) would let the brokers abort
//! it under backpressure or with an interval of a minute or more. A broker whose maximum
//! is below the value refuses `init_transactions`; the sink then fails with
//! `sink.kafka_transaction_timeout`, naming the value and both fixes.
//!
//! - **write**: every message goes to the open transaction, and a copy of it (key,
//!   value, headers) into the writer's recovery copy of the epoch, at most
//!   `epoch_copy_mib` MiB (default [`EPOCH_COPY_MIB`]; more fails the write with
//!   `sink.kafka_epoch_too_large`: checkpoint more often, or raise it);
//! - **pre-commit** (barrier `e`): if the transaction holds messages, commit the
//!   **marker** of epoch `e` inside it: offset `run × 2^32 + e` on partition 0 of the
//!   sink's topic for the consumer group named as the transactional id, through
//!   `send_offsets_to_transaction` (Kafka commits a transaction's offsets atomically
//!   with its messages: the group holds that offset exactly when epoch `e`'s transaction
//!   committed). `run` is a random token of the process (never 0), also in the record:
//!   the groups outlive a checkpoint store, and a marker that a run of an earlier store
//!   left (its epochs counted from 1 again after `--from-scratch`) must never pass for
//!   this record's; flush, check every delivery, and return the record naming the
//!   transaction and carrying the epoch's messages (`record.rs`, versioned,
//!   golden-tested), which the checkpoint stores (in a state object of its own when
//!   large: `sluice-engine/src/checkpointing.rs`); the transaction stays open;
//! - **commit(e)** (after manifest `e` is published): `commit_transaction` on that
//!   producer. The runtime starts barrier `e + 1` only after commit(e), so when the
//!   writer needs that producer again (for epoch `e + 2`) its transaction is
//!   committed; should a failed checkpoint leave it pending, the writer waits at most
//!   [`PENDING_WAIT`] and then fails with `sink.kafka_transaction_pending`.
//!
//! # Recovery
//!
//! A restart commits the records of the manifest it restores (`SinkFactory::commit`,
//! before any writer opens). A record whose transaction this process does not hold was
//! prepared by an earlier process, which librdkafka cannot resume (it cannot take over
//! a producer id and epoch); for each such record with messages:
//!
//! 1. before any record is resolved, producers with the ids of every such record's
//!    writer (the other one first, then the record's) call `init_transactions`: the
//!    earlier producers are fenced, and the transactions they left open aborted (a
//!    committed one stays committed). Fencing the writer's other producer too stops a
//!    zombie's next epoch at once, and fencing every writer first settles a broker
//!    that, as the test broker does, holds back a committed transaction's offsets
//!    while a later transaction (of any producer) on the same partition is open;
//! 2. the marker group's committed offset on partition 0 of the topic tells what
//!    happened: of the record's run and at least `e`, the transaction of epoch `e`
//!    committed (the earlier run died after its commit): nothing more to do; of the
//!    record's run and below `e`, of another run, or none, it was aborted;
//! 3. then the record's messages are written again, in order, in a new transaction of
//!    that producer with the marker of `e`, committed before the run goes on.
//!
//! **Fewer threads.** A run restored onto fewer threads (slots) than the one it restores
//! has no writer for the earlier run's last slots, whose producers may have left a
//! transaction open (the epoch after the checkpoint), holding back `read_committed`
//! readers of its partitions until the transaction timeout. So the writer of slot 0
//! first looks at the slots from the current count on: a slot whose marker groups hold
//! a committed offset was used, and both its ids are fenced (`init_transactions`, which
//! aborts what they left open) at once; the first slot never used ends the search (at
//! most [`LEFTOVER_SLOTS_MAX`]). A slot that never committed a transaction is not found:
//! its open transaction, if any, ends at its timeout.
//!
//! A crash during recovery leaves the same question, answered the same way at the
//! next start. So every epoch's messages are committed exactly once whenever the run
//! dies, the sources resuming after them. A marker of the record's run above `e` means the restore fell
//! back past a newer checkpoint whose epochs this writer had committed: their rows are
//! written again (logged as an error; Kafka cannot take committed messages back). A
//! record of version 1 (written by a build whose records carried no messages) cannot be
//! written again: the restart logs it as an error, and its transaction, if it never
//! committed, is aborted when the writers open.
//!
//! The marker groups (`sluice-{pipeline}-{sink}-{slot}-{0|1}`) are bookkeeping, never
//! joined: their committed offset is an epoch, not a position in the topic. On brokers
//! with ACLs the sink's principal needs READ on them and on the topic (offsets committed
//! in a transaction, and read back at recovery), besides WRITE on the transactional ids.
//!
//! # Keys
//!
//! With `key` (one or several columns), each message's key is those columns encoded in
//! the sink's format: a JSON object of them in `format = "json"`
//! (`{"auction":7,"bidder":3}`, keys in the order `key` names them), a CSV record of
//! them in `format = "csv"` (`7,3`). Without `key`, and outside upsert mode, messages
//! have no key.
//!
//! # Headers
//!
//! `[sink.options.headers]` gives headers every message carries (`name = "value"`).
//! `headers_column` names a VARCHAR column holding a JSON object whose entries become a
//! message's headers after those (`{"trace":"t-1"}`; a string value is the header's
//! text, `null` a header without value, any other value its JSON text; a NULL column no
//! headers); that column is left out of the value, and a value that is not a JSON
//! object fails the write naming the column. The source's `_headers` column reads them
//! back in the same shape.
//!
//! # Changelog and upsert (`mode`)
//!
//! - `mode = "changelog"` (the default): one message per row. An append-only input is
//!   written as it is; an updating input in Flink's changelog convention, every message
//!   carrying the op column first (`{"op":"-U",...}`), as the file sink writes it.
//! - `mode = "upsert"` (upsert-kafka): every message is keyed, by `key` or else the
//!   stream's upsert key (a stream without one, or whose key is empty as a global
//!   aggregate's, is refused). A row of positive weight (`+I`, `+U`) is written as its
//!   value (every column, no op column); a retraction (`-D`, or a `-U` whose `+U` is not
//!   in the same batch) as a tombstone, the key with no value. A retraction followed
//!   later in its batch by a new version of the same key is not written: the new
//!   version replaces the value anyway. Reading the topic and keeping the last value per
//!   key, dropping a key at its tombstone (what log compaction does), gives the
//!   stream's table. An append-only input in upsert mode writes every row as an upsert
//!   of its key (`key` required). Messages of one key go to one partition (librdkafka's
//!   partitioner hashes the key) from one writer (the plan routes the rows of a key to
//!   one thread), so their order is kept.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, SchemaRef};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_formats::{CsvRecordFinder, Encoder, OutputFormat};
use sluice_runtime::{SinkFactory, SinkParallelism, SinkWriter};
use sluice_types::{Batch, Epoch, SluiceError};

use super::client::{self, METADATA_TIMEOUT, SluiceClientContext};
use super::delivery::{self, DELIVERY_TIMEOUT, DeliveryContext, SinkProducer};
use super::options::{KafkaFormat, KafkaSinkMode, KafkaSinkOptions};
use super::record::{self, RecordMessages, SavedMessages, TransactionRecord};

/// The longest a flush, `init_transactions` or a transaction commit may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);
/// The most slots past the current ones whose leftover producers are looked for.
const LEFTOVER_SLOTS_MAX: u32 = 1024;
/// The default of `transaction_timeout`: how long the brokers keep a transaction open,
/// the brokers' default `transaction.max.timeout.ms` (15 minutes).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The longest a writer waits for the commit of its producer's previous transaction.
pub const PENDING_WAIT: Duration = Duration::from_secs(60);
/// The default of `epoch_copy_mib`: the most MiB of messages a writer keeps for one
/// epoch's recovery copy (see "Recovery" above); more fails the write, naming the fix.
/// The copy is held in memory until the epoch commits (by the writer until the barrier,
/// then with the checkpoint), so it bounds what exactly-once output costs in memory.
pub const EPOCH_COPY_MIB: u32 = 16;
/// The partition of the sink's topic under which each transaction commits its marker.
const MARKER_PARTITION: i32 = 0;

/// Where a transactional producer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TransactionState {
    /// No transaction open: ready to begin one.
    Idle,
    Open,
    /// Flushed at barrier `epoch`, waiting for commit(epoch).
    Prepared(u64),
}

/// A transactional producer, shared by its writer and the sink's commit.
struct TransactionalProducer {
    id: String,
    producer: SinkProducer,
    /// The consumer group of this producer's markers (named as the transactional id).
    marker: ConsumerGroupMetadata,
    /// The run token its markers and records carry.
    run: u32,
    state: Mutex<TransactionState>,
    changed: Condvar,
    /// Messages sent in the transaction open or prepared now, for the commit's log line.
    messages: AtomicU64,
}

/// A planned `connector = "kafka"` sink.
pub struct KafkaSink {
    name: String,
    pipeline: String,
    options: KafkaSinkOptions,
    schema: SchemaRef,
    updating: bool,
    mode: KafkaSinkMode,
    /// The key columns (of `schema`), if messages are keyed.
    key: Option<Vec<usize>>,
    /// The stream's upsert key, for the changelog's `-U`/`+U`.
    upsert_key: Option<Vec<usize>>,
    /// The column of each message's headers (`headers_column`).
    headers_column: Option<usize>,
    /// Whether the run asks for exactly-once output: only then do staged writers use
    /// transactions (at-least-once checkpoints stage too, and flush at barriers).
    exactly_once: bool,
    /// This process's token in its markers and records (see the module doc).
    run: u32,
    /// The transactional producers of this process, by id.
    producers: Mutex<HashMap<String, Arc<TransactionalProducer>>>,
    /// Whether the ids an earlier run with more slots left were fenced (once, by the
    /// writer of slot 0).
    leftovers_fenced: std::sync::atomic::AtomicBool,
    /// `[checkpoint] interval` + `timeout`, when the run checkpoints.
    checkpoint_span: Option<Duration>,
}

impl KafkaSink {
    /// The sink `name` of `pipeline`, writing rows of `schema` (an updating stream when
    /// `updating`, with `upsert_key` when known).
    pub fn new(
        pipeline: &str,
        name: &str,
        options: &KafkaSinkOptions,
        schema: &SchemaRef,
        updating: bool,
        upsert_key: Option<&[usize]>,
    ) -> Result<KafkaSink, SluiceError> {
        let mode = options.mode.unwrap_or(KafkaSinkMode::Changelog);
        let columns = || schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ");
        let key = match (&options.key, mode) {
            (Some(names), _) => Some(
                names
                    .iter()
                    .map(|column| {
                        schema.index_of(column).map_err(|_| {
                            SluiceError::user(
                                "sink.kafka_key",
                                format!("key column `{column}` is not a column of the sink's input"),
                            )
                            .with_fix(format!("set key to columns of the input: {}", columns()))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            (None, KafkaSinkMode::Upsert) => match upsert_key {
                Some(key) if !key.is_empty() => Some(key.to_vec()),
                found => {
                    let why = match (updating, found) {
                        (true, Some(_)) => {
                            "its input holds one row at a time (a global aggregate), which has no key columns"
                        }
                        (true, None) => "its input is an updating stream without a known upsert key",
                        (false, _) => "its input is append-only, which has no upsert key",
                    };
                    return Err(SluiceError::user(
                        "sink.kafka_key",
                        format!("sink `{name}` has mode = \"upsert\", and {why}: upsert messages need a key"),
                    )
                    .with_fix(format!(
                        "set key = [\"…\"] to the columns identifying a row, among: {}; or write the changelog \
                         (mode = \"changelog\")",
                        columns()
                    )));
                }
            },
            (None, KafkaSinkMode::Changelog) => None,
        };
        let headers_column = match &options.headers_column {
            None => None,
            Some(column) => {
                let index = schema.index_of(column).map_err(|_| {
                    SluiceError::user(
                        "sink.kafka_headers",
                        format!("headers_column `{column}` is not a column of the sink's input"),
                    )
                    .with_fix(format!("set headers_column to a VARCHAR column of the input: {}", columns()))
                })?;
                if !matches!(schema.field(index).data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
                {
                    return Err(SluiceError::user(
                        "sink.kafka_headers",
                        format!("headers_column `{column}` is {}, not VARCHAR", schema.field(index).data_type()),
                    )
                    .with_fix("give it a VARCHAR column holding a JSON object, e.g. '{\"trace\":\"t-1\"}'"));
                }
                Some(index)
            }
        };
        Ok(KafkaSink {
            name: name.to_owned(),
            pipeline: pipeline.to_owned(),
            options: options.clone(),
            schema: Arc::clone(schema),
            updating,
            mode,
            key,
            upsert_key: upsert_key.map(<[usize]>::to_vec),
            headers_column,
            exactly_once: true,
            producers: Mutex::new(HashMap::new()),
            leftovers_fenced: std::sync::atomic::AtomicBool::new(false),
            run: run_token(),
            checkpoint_span: None,
        })
    }

    /// The longest a checkpoint may take (`[checkpoint] interval` + `timeout`): a
    /// transaction stays open that long at least, so the default timeout is a minute more
    /// when that is above [`TRANSACTION_TIMEOUT`], and a `transaction_timeout` within it
    /// is refused.
    pub fn with_checkpoint_span(mut self, span: Option<Duration>) -> Result<KafkaSink, SluiceError> {
        if let (Some(span), Some(timeout)) = (span, self.options.transaction_timeout)
            && timeout <= span
        {
            return Err(SluiceError::user(
                "sink.kafka_transaction_timeout",
                format!(
                    "sink `{}`: transaction_timeout = {} ms is not longer than a checkpoint may take ({} ms: [checkpoint] \
                     interval + timeout), so the brokers would abort an epoch's transaction before its commit",
                    self.name,
                    timeout.as_millis(),
                    span.as_millis()
                ),
            )
            .with_fix("raise transaction_timeout above [checkpoint] interval + timeout (and the brokers' transaction.max.timeout.ms with it), or checkpoint more often"));
        }
        self.checkpoint_span = span;
        Ok(self)
    }

    /// Whether checkpoints of this run are exactly-once (the default) or at-least-once,
    /// where the idempotent writer serves.
    pub fn with_exactly_once(mut self, exactly_once: bool) -> KafkaSink {
        self.exactly_once = exactly_once;
        self
    }

    /// The transactional id of producer `index` (0 or 1) of `slot`.
    pub fn transactional_id(&self, slot: u32, index: u32) -> String {
        format!("sluice-{}-{}-{slot}-{index}", self.pipeline, self.name)
    }

    /// How long the brokers keep a transaction of this sink open.
    fn transaction_timeout(&self) -> Duration {
        let needed =
            self.checkpoint_span.map_or(TRANSACTION_TIMEOUT, |span| span.saturating_add(Duration::from_secs(60)));
        self.options.transaction_timeout.unwrap_or(TRANSACTION_TIMEOUT.max(needed))
    }

    /// How long a message may wait for the brokers' acknowledgement (see `delivery`).
    fn delivery_timeout(&self) -> Duration {
        self.options.delivery_timeout.unwrap_or(DELIVERY_TIMEOUT)
    }

    /// The librdkafka settings of a producer: transactional with `transactional_id`.
    pub(super) fn producer_config(&self, transactional_id: Option<&str>) -> rdkafka::ClientConfig {
        let mut config = client::base_config(&self.options.brokers, &self.options.client);
        config.set("enable.idempotence", "true");
        let mut message_timeout = self.delivery_timeout();
        if let Some(id) = transactional_id {
            config.set("transactional.id", id);
            config.set("transaction.timeout.ms", self.transaction_timeout().as_millis().to_string());
            // librdkafka refuses a message timeout above the transaction's.
            message_timeout = message_timeout.min(self.transaction_timeout());
        }
        config.set("message.timeout.ms", message_timeout.as_millis().to_string());
        config
    }

    fn producer(&self, transactional_id: Option<&str>) -> Result<SinkProducer, SluiceError> {
        let brokers = &self.options.brokers;
        let config = self.producer_config(transactional_id);
        let context = DeliveryContext::new(&self.name, brokers, &self.options.topic, self.delivery_timeout());
        let producer: SinkProducer =
            config.create_with_context(context).map_err(|e| client::create_error(brokers, &e))?;
        let metadata = producer
            .client()
            .fetch_metadata(Some(&self.options.topic), METADATA_TIMEOUT)
            .map_err(|e| client::unreachable(brokers, &e))?;
        let topic = metadata.topics().iter().find(|t| t.name() == self.options.topic);
        if let Some(error) = topic.map_or(Some(None), |t| t.error().map(Some)) {
            let detail =
                error.map_or_else(|| "not in the metadata".to_owned(), |e| RDKafkaErrorCode::from(e).to_string());
            return Err(client::missing_topic(brokers, &self.options.topic, &detail));
        }
        Ok(producer)
    }

    fn output_format(&self) -> OutputFormat {
        match self.options.format {
            KafkaFormat::Csv => OutputFormat::Csv { header: false },
            _ => OutputFormat::JsonLines,
        }
    }

    /// The columns of message values: every column but `headers_column`'s.
    fn value_columns(&self) -> Vec<usize> {
        (0..self.schema.fields().len()).filter(|c| Some(*c) != self.headers_column).collect()
    }

    /// The encoder of message values: the changelog's op column only for an updating
    /// input in changelog mode.
    fn encoder(&self) -> Encoder {
        let changelog = self.updating && self.mode == KafkaSinkMode::Changelog;
        let columns = self.value_columns();
        let schema = Arc::new(self.schema.project(&columns).expect("value columns are columns of the schema"));
        // The upsert key as positions among the value columns (none if it holds the
        // headers column).
        let key = (self.upsert_key.as_ref().filter(|_| changelog))
            .and_then(|key| key.iter().map(|k| columns.iter().position(|c| c == k)).collect::<Option<Vec<_>>>());
        Encoder::new(self.output_format(), schema, changelog).with_upsert_key(key.as_deref())
    }

    /// The encoder of message keys: the key columns alone, in the sink's format.
    fn key_encoder(&self) -> Option<KeyEncoder> {
        let columns = self.key.clone()?;
        let schema = Arc::new(self.schema.project(&columns).expect("key columns are columns of the schema"));
        Some(KeyEncoder { columns, encoder: Encoder::new(self.output_format(), schema, false) })
    }

    fn transactional(&self, slot: u32, index: u32) -> Result<Arc<TransactionalProducer>, SluiceError> {
        let id = self.transactional_id(slot, index);
        let producer = self.producer(Some(&id))?;
        producer.init_transactions(FLUSH_TIMEOUT).map_err(|e| self.init_error(&id, &e))?;
        let marker = self.marker_consumer(&id)?.group_metadata().ok_or_else(|| {
            SluiceError::internal("sink.kafka_marker", format!("the consumer of group {id} has no group metadata"))
        })?;
        let shared = Arc::new(TransactionalProducer {
            id: id.clone(),
            producer,
            marker,
            run: self.run,
            state: Mutex::new(TransactionState::Idle),
            changed: Condvar::new(),
            messages: AtomicU64::new(0),
        });
        self.producers.lock().map_err(|_| poisoned(&self.name))?.insert(id, Arc::clone(&shared));
        Ok(shared)
    }

    /// A consumer of the marker group `group` (never subscribed: it names the group of
    /// the markers a producer commits, and reads the group's committed offset).
    fn marker_consumer(&self, group: &str) -> Result<BaseConsumer<SluiceClientContext>, SluiceError> {
        let brokers = &self.options.brokers;
        let mut config = client::base_config(brokers, &self.options.client);
        config.set("group.id", group);
        config.set("enable.auto.commit", "false");
        config.set("isolation.level", "read_committed");
        config.create_with_context(SluiceClientContext::new(brokers)).map_err(|e| client::create_error(brokers, &e))
    }

    /// The run and epoch of the last marker producer `transactional_id` committed, if
    /// any.
    fn committed_marker(&self, transactional_id: &str) -> Result<Option<(u32, u64)>, SluiceError> {
        let consumer = self.marker_consumer(transactional_id)?;
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.options.topic, MARKER_PARTITION);
        let committed = consumer
            .committed_offsets(list, FLUSH_TIMEOUT)
            .map_err(|e| transaction_error(&self.options.brokers, transactional_id, "read the marker of", &e))?;
        let offset = committed.find_partition(&self.options.topic, MARKER_PARTITION).map(|p| p.offset());
        Ok(match offset {
            Some(Offset::Offset(marker)) => {
                u64::try_from(marker).ok().map(|marker| ((marker >> 32) as u32, marker & 0xffff_ffff))
            }
            _ => None,
        })
    }

    /// Fences the earlier producers of the writer of `record` (one with messages), the
    /// other one first: every transaction they left open is aborted, and the record's
    /// own is then committed or aborted.
    fn fence_writer_of(&self, record: &TransactionRecord<'_>) -> Result<(), SluiceError> {
        if record.messages.as_ref().is_none_or(RecordMessages::is_empty) {
            return Ok(());
        }
        let id = record.transactional_id;
        for id in sibling_id(id).iter().map(String::as_str).chain([id]) {
            let producer = self.producer(Some(id))?;
            producer.init_transactions(FLUSH_TIMEOUT).map_err(|e| self.init_error(id, &e))?;
        }
        Ok(())
    }

    /// Fences the transactional ids of the slots from `slots` on that an earlier run with
    /// more threads used (see "Fewer threads" in the module doc); returns those slots.
    fn fence_leftovers(&self, slots: u32) -> Result<Vec<u32>, SluiceError> {
        let mut fenced = Vec::new();
        for slot in slots..slots.saturating_add(LEFTOVER_SLOTS_MAX) {
            let ids = [self.transactional_id(slot, 0), self.transactional_id(slot, 1)];
            let mut used = false;
            for id in &ids {
                used |= self.committed_marker(id)?.is_some();
            }
            if !used {
                break;
            }
            for id in &ids {
                let producer = self.producer(Some(id))?;
                producer.init_transactions(FLUSH_TIMEOUT).map_err(|e| self.init_error(id, &e))?;
            }
            fenced.push(slot);
        }
        if !fenced.is_empty() {
            tracing::info!(
                sink = %self.name,
                "kafka sink `{}`: fenced the transactional ids of slots {fenced:?}, which an earlier run with more \
                 threads left: a transaction they left open is aborted now, not at its timeout",
                self.name
            );
        }
        Ok(fenced)
    }

    /// Resolves the transaction of `record`, which an earlier process prepared (see
    /// "Recovery" in the module doc).
    fn recover(&self, epoch: Epoch, record: &TransactionRecord<'_>) -> Result<(), SluiceError> {
        let id = record.transactional_id;
        let Some(messages) = &record.messages else {
            tracing::error!(
                sink = %self.name,
                "kafka sink `{}`: the transaction {id} of epoch {} was prepared by an earlier run whose record \
                 (version 1) holds no copy of its messages: if that run died before committing it, its rows \
                 are lost (the restarted producer aborts it)",
                self.name, epoch.0
            );
            return Ok(());
        };
        if messages.is_empty() {
            return Ok(());
        }
        let brokers = &self.options.brokers;
        // The record's producer, fenced already (`fence_writer_of`): its transaction is
        // committed or aborted now. Opening it again fences nothing more.
        let producer = self.producer(Some(id))?;
        producer.init_transactions(FLUSH_TIMEOUT).map_err(|e| self.init_error(id, &e))?;
        match self.committed_marker(id)? {
            Some((run, committed)) if run == record.run && committed == record.epoch => {
                tracing::info!(
                    sink = %self.name,
                    epoch = epoch.0,
                    "kafka sink: transaction {id} of epoch {} was committed before the restart",
                    record.epoch
                );
                return Ok(());
            }
            Some((run, committed)) if run == record.run && committed > record.epoch => {
                tracing::error!(
                    sink = %self.name,
                    "kafka sink `{}`: transaction {id} committed epoch {committed}, after the restored epoch {}: \
                     the restore fell back past a newer checkpoint, and the rows this writer committed after \
                     epoch {} are written again",
                    self.name, record.epoch, record.epoch
                );
                return Ok(());
            }
            _ => {}
        }
        producer.begin_transaction().map_err(|e| transaction_error(brokers, id, "begin", &e))?;
        for message in messages.iter() {
            delivery::send(&producer, &self.options.topic, message.value, message.key, message.owned_headers(), 0)?;
        }
        let marker = self.marker_consumer(id)?.group_metadata().ok_or_else(|| {
            SluiceError::internal("sink.kafka_marker", format!("the consumer of group {id} has no group metadata"))
        })?;
        send_marker(&producer, &marker, &self.options.topic, (record.run, record.epoch), brokers, id)?;
        delivery::flush_checked(&producer)?;
        producer.commit_transaction(FLUSH_TIMEOUT).map_err(|e| transaction_error(brokers, id, "commit", &e))?;
        tracing::info!(
            sink = %self.name,
            epoch = epoch.0,
            messages = messages.len(),
            "kafka sink: committed transaction {id} at recovery: the messages of epoch {}, whose transaction \
             the earlier run never committed, written again",
            record.epoch
        );
        Ok(())
    }
}

/// The id of the other producer of the writer whose producer is `transactional_id`
/// (`…-{slot}-0` and `…-{slot}-1`, see [`KafkaSink::transactional_id`]).
fn sibling_id(transactional_id: &str) -> Option<String> {
    let (writer, index) = transactional_id.rsplit_once('-')?;
    let other = match index {
        "0" => "1",
        "1" => "0",
        _ => return None,
    };
    Some(format!("{writer}-{other}"))
}

/// A random token for this process's markers and records: 31 bits, never 0 (the token
/// of records written before tokens).
fn run_token() -> u32 {
    use std::hash::BuildHasher;
    let seed = (std::process::id(), std::time::SystemTime::now(), std::thread::current().id());
    // 31 bits, so that a marker's offset stays positive.
    ((std::collections::hash_map::RandomState::new().hash_one(format!("{seed:?}")) as u32) & 0x7fff_ffff).max(1)
}

/// Commits the marker of `(run, epoch)` in the open transaction of `producer`: the
/// offset `run × 2^32 + epoch` (an epoch must fit in 32 bits: 136 years of a checkpoint
/// a second; the run in 31, so that the offset is positive).
fn send_marker(
    producer: &SinkProducer,
    group: &ConsumerGroupMetadata,
    topic: &str,
    (run, epoch): (u32, u64),
    brokers: &str,
    id: &str,
) -> Result<(), SluiceError> {
    let offset = u32::try_from(epoch)
        .ok()
        .and_then(|epoch| i64::try_from((u64::from(run) << 32) | u64::from(epoch)).ok())
        .ok_or_else(|| {
            SluiceError::internal("sink.kafka_marker", format!("epoch {epoch} of run {run} does not fit a marker"))
        })?;
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, MARKER_PARTITION, Offset::Offset(offset))
        .map_err(|e| transaction_error(brokers, id, "mark", &e))?;
    producer
        .send_offsets_to_transaction(&list, group, FLUSH_TIMEOUT)
        .map_err(|e| transaction_error(brokers, id, "mark", &e))
}

fn poisoned(sink: &str) -> SluiceError {
    SluiceError::internal("sink.kafka", format!("sink `{sink}`: a writer panicked holding the producers"))
}

impl KafkaSink {
    /// Why `init_transactions` of producer `id` failed: a transaction timeout above the
    /// brokers' maximum named as such.
    pub(super) fn init_error(&self, id: &str, error: &KafkaError) -> SluiceError {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::InvalidTransactionTimeout) {
            return transaction_error(&self.options.brokers, id, "init", error);
        }
        let timeout = self.transaction_timeout();
        SluiceError::user(
            "sink.kafka_transaction_timeout",
            format!(
                "sink `{}`: brokers {} refuse a transaction timeout of {} ms (transaction_timeout): it is above \
                 their transaction.max.timeout.ms ({error})",
                self.name,
                self.options.brokers,
                timeout.as_millis()
            ),
        )
        .with_fix(
            "set transaction_timeout under [sink.options] below the brokers' transaction.max.timeout.ms (but longer \
             than the checkpoint interval plus the checkpoint timeout), or raise transaction.max.timeout.ms on the \
             brokers",
        )
    }
}

fn transaction_error(brokers: &str, id: &str, step: &str, error: &KafkaError) -> SluiceError {
    SluiceError::external(
        "sink.kafka_transaction",
        format!("Kafka transaction {id} ({step}) on brokers {brokers} failed: {error}"),
    )
    .with_fix("check that the brokers are running and support transactions; the run can be restarted from its last checkpoint")
}

impl SinkFactory for KafkaSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    fn open(&self, slot: u32, slots: u32, staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        let output = self.output();
        if !staged || !self.exactly_once {
            return Ok(Box::new(IdempotentWriter { output, producer: self.producer(None)? }));
        }
        if slot == 0 && !self.leftovers_fenced.swap(true, Ordering::AcqRel) {
            self.fence_leftovers(slots)?;
        }
        let producers = [self.transactional(slot, 0)?, self.transactional(slot, 1)?];
        Ok(Box::new(TransactionalWriter {
            output,
            producers,
            current: 0,
            open: false,
            saved: SavedMessages::default(),
            saved_max: (self.options.epoch_copy_mib.unwrap_or(EPOCH_COPY_MIB) as usize) << 20,
        }))
    }

    fn describe(&self) -> String {
        let format = if self.options.format == KafkaFormat::Csv { "csv" } else { "json" };
        let mode = if self.mode == KafkaSinkMode::Upsert { ", upsert" } else { "" };
        let key = match &self.key {
            Some(columns) => {
                let names: Vec<&str> = columns.iter().map(|c| self.schema.field(*c).name().as_str()).collect();
                format!(", key={}", names.join(","))
            }
            None => String::new(),
        };
        format!("kafka(topic={}, {format}{mode}{key})", self.options.topic)
    }

    fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    /// Nothing to discard: a transaction left open is fenced when its producer starts.
    fn discard_reads_records(&self) -> bool {
        false
    }

    fn commit(&self, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        let mut held = Vec::new();
        let mut earlier = Vec::new();
        for bytes in records.iter().filter(|r| !r.is_empty()) {
            let record = TransactionRecord::decode(&self.name, bytes)?;
            let found = self.producers.lock().map_err(|_| poisoned(&self.name))?.get(record.transactional_id).cloned();
            match found {
                Some(shared) => held.push((record, shared)),
                None => earlier.push(record),
            }
        }
        // Prepared by an earlier process: recovery. Every writer's producers are fenced
        // before any marker is read, so that no writer's open transaction holds back
        // another's committed marker (as the test broker does across producers).
        for record in &earlier {
            self.fence_writer_of(record)?;
        }
        for record in &earlier {
            self.recover(epoch, record)?;
        }
        for (record, shared) in held {
            let mut state = shared.state.lock().map_err(|_| poisoned(&self.name))?;
            match *state {
                TransactionState::Prepared(prepared) if prepared == record.epoch => {
                    sluice_types::failpoint!("sink.kafka.before_commit");
                    shared
                        .producer
                        .commit_transaction(FLUSH_TIMEOUT)
                        .map_err(|e| transaction_error(&self.options.brokers, &shared.id, "commit", &e))?;
                    let messages = shared.messages.swap(0, Ordering::Relaxed);
                    tracing::info!(sink = %self.name, epoch = epoch.0, messages, "kafka sink: committed transaction {}", shared.id);
                    *state = TransactionState::Idle;
                    shared.changed.notify_all();
                    drop(state);
                    sluice_types::failpoint!("sink.kafka.after_commit");
                }
                // Committed before (commit is repeated at recovery).
                TransactionState::Idle | TransactionState::Open | TransactionState::Prepared(_) => {}
            }
        }
        Ok(())
    }
}

impl KafkaSink {
    /// What encodes a writer's messages.
    fn output(&self) -> Output {
        Output {
            sink: self.name.clone(),
            brokers: self.options.brokers.clone(),
            topic: self.options.topic.clone(),
            encoder: self.encoder(),
            keys: self.key_encoder(),
            value_columns: self.headers_column.map(|_| self.value_columns()),
            headers: self.options.headers.clone(),
            headers_column: self.headers_column,
            csv: self.options.format == KafkaFormat::Csv,
            upsert: self.mode == KafkaSinkMode::Upsert,
            updating: self.updating,
            buffer: Vec::new(),
            key_buffer: Vec::new(),
            encoded: 0,
        }
    }
}

/// The key columns of a sink and their encoder.
struct KeyEncoder {
    columns: Vec<usize>,
    encoder: Encoder,
}

/// Encoding rows as messages, shared by both writers.
struct Output {
    sink: String,
    brokers: String,
    topic: String,
    encoder: Encoder,
    keys: Option<KeyEncoder>,
    /// The columns of values, when not all (`headers_column` is left out).
    value_columns: Option<Vec<usize>>,
    /// Headers of every message.
    headers: Vec<(String, String)>,
    headers_column: Option<usize>,
    csv: bool,
    upsert: bool,
    updating: bool,
    buffer: Vec<u8>,
    key_buffer: Vec<u8>,
    /// Bytes of keys and values handed to the producer since the writer last told the
    /// runtime ([`SinkWriter::take_bytes`]).
    encoded: u64,
}

/// The byte ranges of the records of `buffer`: JSON lines, or CSV records (either
/// without its line end); fails unless there are exactly `expected`.
fn records(buffer: &[u8], csv: bool, expected: usize) -> Result<Vec<Range<usize>>, SluiceError> {
    let mut ranges = Vec::with_capacity(expected);
    let mut start = 0;
    let mut finder = CsvRecordFinder::new(b',');
    while start < buffer.len() {
        let end = match csv {
            true => finder.find_record_end(&buffer[start..]).map(|length| start + length),
            false => memchr::memchr(b'\n', &buffer[start..]).map(|at| start + at + 1),
        };
        let end = end.ok_or_else(|| SluiceError::internal("sink.kafka", "the encoder wrote an unfinished record"))?;
        ranges.push(start..end - 1);
        start = end;
    }
    if ranges.len() != expected {
        return Err(SluiceError::internal(
            "sink.kafka",
            format!("the encoder wrote {} records for {expected} messages", ranges.len()),
        ));
    }
    Ok(ranges)
}

/// What upsert mode writes for the rows of one batch, in order: `(row, true)` the row
/// as the value of its key, `(row, false)` a tombstone of its key. A retraction is
/// dropped when a later row of the batch with the same key has a positive weight (that
/// row's value replaces it); a row of weight 0 writes nothing, and a row of weight
/// `w > 1` one upsert (its key has one value).
pub(crate) fn upsert_actions(weights: &[i64], keys: &[&[u8]]) -> Vec<(usize, bool)> {
    let mut last_upsert: HashMap<&[u8], usize> = HashMap::new();
    for (row, key) in keys.iter().enumerate() {
        if weights[row] > 0 {
            last_upsert.insert(key, row);
        }
    }
    (0..weights.len())
        .filter_map(|row| match weights[row] {
            w if w > 0 => Some((row, true)),
            w if w < 0 => last_upsert.get(keys[row]).is_none_or(|later| *later <= row).then_some((row, false)),
            _ => None,
        })
        .collect()
}

impl Output {
    /// The encoded key of every row of `rows`, into `key_buffer`; empty without keys.
    fn keys(&mut self, rows: &RecordBatch) -> Result<Vec<Range<usize>>, SluiceError> {
        self.key_buffer.clear();
        let Some(keys) = &mut self.keys else { return Ok(Vec::new()) };
        let projected = rows
            .project(&keys.columns)
            .map_err(|e| SluiceError::internal("sink.kafka_key", format!("key columns: {e}")))?;
        keys.encoder.encode(&Batch::inserts(projected), &mut self.key_buffer)?;
        records(&self.key_buffer, self.csv, rows.num_rows())
    }

    /// The value columns of `rows`.
    fn values(&self, rows: &RecordBatch) -> Result<RecordBatch, SluiceError> {
        match &self.value_columns {
            Some(columns) => {
                rows.project(columns).map_err(|e| SluiceError::internal("sink.kafka", format!("value columns: {e}")))
            }
            None => Ok(rows.clone()),
        }
    }

    /// The `headers_column` of `rows` as text, if the sink has one.
    fn header_texts(&self, rows: &RecordBatch) -> Result<Option<arrow::array::ArrayRef>, SluiceError> {
        let Some(column) = self.headers_column else { return Ok(None) };
        let texts = arrow::compute::cast(rows.column(column), &DataType::Utf8)
            .map_err(|e| SluiceError::internal("sink.kafka_headers", format!("headers as text: {e}")))?;
        Ok(Some(texts))
    }

    /// The headers of the message of `row`: the constant ones, then those of the row's
    /// `texts` (its `headers_column`).
    fn headers_of(
        &self,
        texts: Option<&arrow::array::ArrayRef>,
        row: usize,
    ) -> Result<Option<OwnedHeaders>, SluiceError> {
        let from_row = match texts {
            Some(texts) if texts.is_valid(row) => {
                let text = texts.as_string::<i32>().value(row);
                match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(serde_json::Value::Object(object)) => Some(object),
                    _ => {
                        return Err(SluiceError::user(
                            "sink.kafka_headers",
                            format!("sink `{}`: its headers_column holds {text:?}, not a JSON object", self.sink),
                        )
                        .with_fix(
                            "make the column a JSON object of header names and values, e.g. '{\"trace\":\"t-1\"}'",
                        ));
                    }
                }
            }
            _ => None,
        };
        if self.headers.is_empty() && from_row.as_ref().is_none_or(|o| o.is_empty()) {
            return Ok(None);
        }
        let mut headers = OwnedHeaders::new_with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        for (name, value) in from_row.iter().flatten() {
            let text = match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(text) => Some(text.clone()),
                other => Some(other.to_string()),
            };
            headers = headers.insert(Header { key: name, value: text.as_deref().map(str::as_bytes) });
        }
        Ok(Some(headers))
    }

    /// Encodes `batch` and hands each message (value, key, headers, the rows it
    /// completes) to `deliver`; a tombstone has no value. A row's last message completes
    /// it and the rows before it that have none (a retraction an upsert of its key
    /// replaces, a row of weight 0), so that the rows of acknowledged messages are the
    /// rows out (see `delivery`). Returns the rows after the batch's last message, which
    /// need none.
    fn messages(
        &mut self,
        batch: &Batch,
        mut deliver: impl FnMut(Option<&[u8]>, Option<&[u8]>, Option<OwnedHeaders>, usize) -> Result<(), SluiceError>,
    ) -> Result<usize, SluiceError> {
        let mut encoded = 0u64;
        // The rows completed by the messages handed out so far.
        let mut completed = 0usize;
        // `last_of`: the row this message is the last of, if it is.
        let mut send = |value: Option<&[u8]>, key: Option<&[u8]>, headers, last_of: Option<usize>| {
            encoded += (value.map_or(0, <[u8]>::len) + key.map_or(0, <[u8]>::len)) as u64;
            let rows = last_of.map_or(0, |row| (row + 1).saturating_sub(std::mem::replace(&mut completed, row + 1)));
            deliver(value, key, headers, rows)
        };
        let keys = self.keys(&batch.rows)?;
        let texts = self.header_texts(&batch.rows)?;
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        let key_of = |row: usize| keys.get(row).map(|range| &self.key_buffer[range.clone()]);
        if self.upsert {
            let weights: Vec<i64> = (0..batch.num_rows()).map(|row| batch.weight(row)).collect();
            let key_bytes: Vec<&[u8]> = (0..batch.num_rows()).map(|row| key_of(row).unwrap_or_default()).collect();
            let actions = upsert_actions(&weights, &key_bytes);
            let upserted: Vec<u32> = actions.iter().filter(|(_, upsert)| *upsert).map(|(row, _)| *row as u32).collect();
            let rows =
                arrow::compute::take_record_batch(&self.values(&batch.rows)?, &UInt32Array::from(upserted.clone()))
                    .map_err(|e| SluiceError::internal("sink.kafka", format!("upserted rows: {e}")))?;
            self.encoder.encode(&Batch::inserts(rows), &mut buffer)?;
            let values = records(&buffer, self.csv, upserted.len())?;
            let mut values = values.into_iter();
            for (row, upsert) in actions {
                let value = match upsert {
                    true => Some(&buffer[values.next().expect("one value per upsert")]),
                    false => None,
                };
                send(value, key_of(row), self.headers_of(texts.as_ref(), row)?, Some(row))?;
            }
        } else {
            let values = Batch { rows: self.values(&batch.rows)?, weights: batch.weights.clone() };
            self.encoder.encode(&values, &mut buffer)?;
            let copies: Vec<u64> = (0..batch.num_rows())
                .map(|row| {
                    let weight = batch.weight(row);
                    if self.updating { weight.unsigned_abs() } else { weight.max(0) as u64 }
                })
                .collect();
            let values = records(&buffer, self.csv, copies.iter().sum::<u64>() as usize)?;
            let mut values = values.into_iter();
            for (row, copies) in copies.into_iter().enumerate() {
                let headers = if copies > 0 { self.headers_of(texts.as_ref(), row)? } else { None };
                for copy in 1..=copies {
                    let value = values.next().expect("counted above");
                    send(Some(&buffer[value]), key_of(row), headers.clone(), (copy == copies).then_some(row))?;
                }
            }
        }
        self.buffer = buffer;
        self.encoded += encoded;
        Ok(batch.num_rows().saturating_sub(completed))
    }
}

/// The at-least-once writer.
struct IdempotentWriter {
    output: Output,
    producer: SinkProducer,
}

impl SinkWriter for IdempotentWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        sluice_types::failpoint!("sink.write");
        let (producer, topic) = (&self.producer, self.output.topic.clone());
        let without_message = self
            .output
            .messages(batch, |value, key, headers, rows| delivery::send(producer, &topic, value, key, headers, rows))?;
        producer.context().acknowledge(without_message as u64);
        producer.context().check()
    }

    fn pre_commit(&mut self, _epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        delivery::flush_checked(&self.producer)?;
        Ok(Vec::new())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        delivery::flush_checked(&self.producer)
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.output.encoded)
    }

    /// What the brokers acknowledged (see `delivery`).
    fn take_acknowledged_rows(&mut self) -> Option<u64> {
        Some(self.producer.context().take_acknowledged_rows())
    }
}

/// The exactly-once writer: two transactional producers, alternating per epoch.
struct TransactionalWriter {
    output: Output,
    producers: [Arc<TransactionalProducer>; 2],
    current: usize,
    /// Whether the current producer has a transaction open.
    open: bool,
    /// The messages of the open transaction, for its record.
    saved: SavedMessages,
    /// The most bytes `saved` may hold.
    saved_max: usize,
}

impl TransactionalWriter {
    /// Begins a transaction on the current producer once its previous one is committed.
    fn begin(&mut self) -> Result<(), SluiceError> {
        let shared = &self.producers[self.current];
        let deadline = Instant::now() + PENDING_WAIT;
        let mut state = shared.state.lock().map_err(|_| poisoned(&self.output.sink))?;
        while *state != TransactionState::Idle {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(SluiceError::external(
                    "sink.kafka_transaction_pending",
                    format!(
                        "sink `{}`: transaction {} is still waiting for its commit after {}s (a checkpoint failed?)",
                        self.output.sink,
                        shared.id,
                        PENDING_WAIT.as_secs()
                    ),
                )
                .with_fix("check the checkpoint store and the brokers; restart from the last checkpoint"));
            }
            state = shared.changed.wait_timeout(state, remaining).map_err(|_| poisoned(&self.output.sink))?.0;
        }
        shared
            .producer
            .begin_transaction()
            .map_err(|e| transaction_error(&self.output.brokers, &shared.id, "begin", &e))?;
        *state = TransactionState::Open;
        self.open = true;
        Ok(())
    }
}

impl SinkWriter for TransactionalWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        sluice_types::failpoint!("sink.write");
        if !self.open {
            self.begin()?;
        }
        let shared = &self.producers[self.current];
        let (topic, sink) = (self.output.topic.clone(), self.output.sink.clone());
        let (saved, saved_max) = (&mut self.saved, self.saved_max);
        self.output.messages(batch, |value, key, headers, rows| {
            saved.push(key, value, headers.as_ref());
            if saved.len() > saved_max {
                return Err(epoch_too_large(&sink, saved.count(), saved_max));
            }
            delivery::send(&shared.producer, &topic, value, key, headers, rows)?;
            shared.messages.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })?;
        // Its rows count when the transaction commits; a failed delivery fails it now.
        shared.producer.context().check()
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        if !self.open {
            return Ok(Vec::new());
        }
        let shared = Arc::clone(&self.producers[self.current]);
        // A transaction without messages needs no marker: recovery has nothing to write
        // again for it.
        if !self.saved.is_empty() {
            let output = &self.output;
            let marker = (shared.run, epoch.0);
            send_marker(&shared.producer, &shared.marker, &output.topic, marker, &output.brokers, &shared.id)?;
        }
        delivery::flush_checked(&shared.producer)?;
        *shared.state.lock().map_err(|_| poisoned(&self.output.sink))? = TransactionState::Prepared(epoch.0);
        self.open = false;
        self.current = 1 - self.current;
        let record = record::encode(epoch.0, shared.run, &shared.id, &self.saved);
        self.saved.clear();
        Ok(record)
    }

    /// The runtime pre-commits the last rows before closing; a transaction still open
    /// here holds rows no epoch owns, and is aborted.
    fn close(&mut self) -> Result<(), SluiceError> {
        if self.open {
            let shared = &self.producers[self.current];
            shared
                .producer
                .abort_transaction(FLUSH_TIMEOUT)
                .map_err(|e| transaction_error(&self.output.brokers, &shared.id, "abort", &e))?;
            *shared.state.lock().map_err(|_| poisoned(&self.output.sink))? = TransactionState::Idle;
            self.open = false;
            self.saved.clear();
        }
        Ok(())
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.output.encoded)
    }
}

/// A writer's epoch outgrew its recovery copy of `max` bytes.
fn epoch_too_large(sink: &str, messages: u32, max: usize) -> SluiceError {
    SluiceError::user(
        "sink.kafka_epoch_too_large",
        format!(
            "sink `{sink}`: one thread's {messages} messages since the last checkpoint take more than epoch_copy_mib = \
             {} MiB, the copy an exactly-once Kafka sink keeps per checkpoint to write them again after a crash",
            max >> 20
        ),
    )
    .with_fix(
        "checkpoint more often (a shorter [checkpoint] interval), raise epoch_copy_mib under [sink.options] (the copy \
         is held in memory until its checkpoint commits), or use guarantee = \"at-least-once\"",
    )
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use sluice_types::Batch;

    use super::sibling_id;

    /// The rows each message of `weights` completes (`a` = its row, `b` = its key) and
    /// the rows left without one, through the sink of `options`.
    fn rows_per_message(options: &str, updating: bool, weights: &[i64], keys: &[&str]) -> (Vec<usize>, usize) {
        let sink = crate::kafka::tests::kafka_sink(options, updating, Some(&[1])).expect("valid");
        let schema = crate::kafka::tests::schema(&[
            ("a", arrow::datatypes::DataType::Int64),
            ("b", arrow::datatypes::DataType::Utf8),
        ]);
        let rows = arrow::record_batch::RecordBatch::try_new(
            schema,
            vec![
                std::sync::Arc::new(Int64Array::from_iter_values(0..weights.len() as i64)),
                std::sync::Arc::new(StringArray::from(keys.to_vec())),
            ],
        )
        .expect("rows");
        let batch = Batch::with_weights(rows, Int64Array::from(weights.to_vec()));
        let mut sent = Vec::new();
        let left = sink
            .output()
            .messages(&batch, |_, _, _, rows| {
                sent.push(rows);
                Ok(())
            })
            .expect("encoded");
        (sent, left)
    }

    /// Every row is completed by exactly one message (or left over when no message
    /// follows it), so the rows of acknowledged messages are the rows out.
    #[test]
    fn each_row_is_counted_by_one_message() {
        // A changelog: a row of weight 2 is two messages, the second completes it; a row
        // of weight 0 is none, the next message completes it.
        let (sent, left) = rows_per_message("", true, &[1, 2, 0, -1], &["x", "y", "z", "w"]);
        assert_eq!((sent, left), (vec![1, 0, 1, 2], 0));
        // Upsert: the retraction of `x` is dropped (its later upsert replaces it) and
        // counted with the next message; a trailing row of weight 0 needs none.
        let (sent, left) = rows_per_message("mode = \"upsert\"\n", true, &[-1, 1, 1, 0], &["x", "y", "x", "z"]);
        assert_eq!((sent, left), (vec![2, 1], 1));
    }

    /// The sink stages only what the run configured, as the PostgreSQL sink: an
    /// at-least-once run's writers are idempotent, and the driver counts their rows as
    /// the brokers acknowledge them rather than at a commit.
    #[test]
    fn exactly_once_says_what_is_configured() {
        use sluice_runtime::SinkFactory;
        let sink = || crate::kafka::tests::kafka_sink("", false, None).expect("valid");
        assert!(sink().exactly_once(), "exactly-once unless told otherwise");
        assert!(sink().with_exactly_once(true).exactly_once());
        assert!(!sink().with_exactly_once(false).exactly_once(), "an at-least-once run");
    }

    #[test]
    fn a_writers_other_producer_is_named_from_either_id() {
        assert_eq!(sibling_id("sluice-p-out-3-0").as_deref(), Some("sluice-p-out-3-1"));
        assert_eq!(sibling_id("sluice-p-out-3-1").as_deref(), Some("sluice-p-out-3-0"));
        assert_eq!(sibling_id("sluice-p-out-3-2"), None);
        assert_eq!(sibling_id("nodash"), None);
    }
}
