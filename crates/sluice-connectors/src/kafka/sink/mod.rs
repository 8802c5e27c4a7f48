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
//! # Keys, headers and modes
//!
//! What each message holds (its key, headers, and the op column or the upsert of
//! `mode`) is the user's reference in docs/connectors/kafka.md ("Keys, modes and
//! headers"); `encoding` makes them.
//!
//! # Files
//!
//! This file plans the sink (options checked, producers configured) and commits its
//! epochs; `encoding` turns rows into messages; `writers` holds the two writers and the
//! transactional producers' states and markers; `recovery` resolves what an earlier
//! process prepared. None imports this file but `recovery`, whose methods this file calls.

mod encoding;
mod recovery;
mod writers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arrow::datatypes::{DataType, SchemaRef};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use sluice_formats::{Encoder, OutputFormat};
use sluice_runtime::{SinkFactory, SinkParallelism, SinkWriter};
use sluice_types::{Epoch, SluiceError};

#[cfg(test)]
pub(crate) use self::encoding::upsert_actions;
use self::encoding::{KeyEncoder, Output};
pub use self::writers::PENDING_WAIT;
use self::writers::{
    IdempotentWriter, TransactionState, TransactionalProducer, TransactionalWriter, poisoned, transaction_error,
};
use super::client::{self, METADATA_TIMEOUT};
use super::delivery::{DELIVERY_TIMEOUT, DeliveryContext, FLUSH_TIMEOUT, SinkProducer};
use super::options::{KafkaFormat, KafkaSinkMode, KafkaSinkOptions};
use super::record::{SavedMessages, TransactionRecord};

/// The default of `transaction_timeout`: how long the brokers keep a transaction open,
/// the brokers' default `transaction.max.timeout.ms` (15 minutes).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The default of `epoch_copy_mib`: the most MiB of messages a writer keeps for one
/// epoch's recovery copy (see "Recovery" above); more fails the write, naming the fix.
/// The copy is held in memory until the epoch commits (by the writer until the barrier,
/// then with the checkpoint), so it bounds what exactly-once output costs in memory.
pub const EPOCH_COPY_MIB: u32 = 16;
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
}

/// A random token for this process's markers and records: 31 bits, never 0 (the token
/// of records written before tokens).
fn run_token() -> u32 {
    use std::hash::BuildHasher;
    let seed = (std::process::id(), std::time::SystemTime::now(), std::thread::current().id());
    // 31 bits, so that a marker's offset stays positive.
    ((std::collections::hash_map::RandomState::new().hash_one(format!("{seed:?}")) as u32) & 0x7fff_ffff).max(1)
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

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use sluice_types::Batch;

    use super::recovery::sibling_id;

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
