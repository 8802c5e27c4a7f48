//! The sink's two writers: the idempotent one (at-least-once) and the transactional one
//! (exactly-once, two producers alternating per epoch), the states of the transactional
//! producers they share with the sink's commit, and the marker each transaction commits
//! (see "Exactly-once" in `mod.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_runtime::SinkWriter;
use sluice_types::{Batch, Epoch, SluiceError};

use super::encoding::Output;
use crate::kafka::delivery::{self, FLUSH_TIMEOUT, SinkProducer};
use crate::kafka::record::{self, SavedMessages};

/// The longest a writer waits for the commit of its producer's previous transaction.
pub const PENDING_WAIT: Duration = Duration::from_secs(60);
/// The partition of the sink's topic under which each transaction commits its marker.
pub(super) const MARKER_PARTITION: i32 = 0;

/// Where a transactional producer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TransactionState {
    /// No transaction open: ready to begin one.
    Idle,
    Open,
    /// Flushed at barrier `epoch`, waiting for commit(epoch).
    Prepared(u64),
}

/// A transactional producer, shared by its writer and the sink's commit.
pub(super) struct TransactionalProducer {
    pub(super) id: String,
    pub(super) producer: SinkProducer,
    /// The consumer group of this producer's markers (named as the transactional id).
    pub(super) marker: ConsumerGroupMetadata,
    /// The run token its markers and records carry.
    pub(super) run: u32,
    pub(super) state: Mutex<TransactionState>,
    pub(super) changed: Condvar,
    /// Messages sent in the transaction open or prepared now, for the commit's log line.
    pub(super) messages: AtomicU64,
}

/// Commits the marker of `(run, epoch)` in the open transaction of `producer`: the
/// offset `run × 2^32 + epoch` (an epoch must fit in 32 bits: 136 years of a checkpoint
/// a second; the run in 31, so that the offset is positive).
pub(super) fn send_marker(
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

pub(super) fn poisoned(sink: &str) -> SluiceError {
    SluiceError::internal("sink.kafka", format!("sink `{sink}`: a writer panicked holding the producers"))
}

pub(super) fn transaction_error(brokers: &str, id: &str, step: &str, error: &KafkaError) -> SluiceError {
    SluiceError::external(
        "sink.kafka_transaction",
        format!("Kafka transaction {id} ({step}) on brokers {brokers} failed: {error}"),
    )
    .with_fix("check that the brokers are running and support transactions; the run can be restarted from its last checkpoint")
}

/// The at-least-once writer.
pub(super) struct IdempotentWriter {
    pub(super) output: Output,
    pub(super) producer: SinkProducer,
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
pub(super) struct TransactionalWriter {
    pub(super) output: Output,
    pub(super) producers: [Arc<TransactionalProducer>; 2],
    pub(super) current: usize,
    /// Whether the current producer has a transaction open.
    pub(super) open: bool,
    /// The messages of the open transaction, for its record.
    pub(super) saved: SavedMessages,
    /// The most bytes `saved` may hold.
    pub(super) saved_max: usize,
}

impl TransactionalWriter {
    /// Begins a transaction on the current producer once its previous one is committed.
    pub(super) fn begin(&mut self) -> Result<(), SluiceError> {
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
pub(super) fn epoch_too_large(sink: &str, messages: u32, max: usize) -> SluiceError {
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
