//! Recovery of the transactions an earlier process prepared (see "Recovery" and "Fewer
//! threads" in `mod.rs`): its writers' producers fenced, each record's marker read, and
//! the messages of an epoch whose transaction never committed written again.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_types::{Epoch, SluiceError};

use super::KafkaSink;
use super::writers::{MARKER_PARTITION, send_marker, transaction_error};
use crate::kafka::client::{self, SluiceClientContext};
use crate::kafka::delivery::{self, FLUSH_TIMEOUT};
use crate::kafka::record::{RecordMessages, TransactionRecord};

/// The most slots past the current ones whose leftover producers are looked for.
const LEFTOVER_SLOTS_MAX: u32 = 1024;
impl KafkaSink {
    /// A consumer of the marker group `group` (never subscribed: it names the group of
    /// the markers a producer commits, and reads the group's committed offset).
    pub(super) fn marker_consumer(&self, group: &str) -> Result<BaseConsumer<SluiceClientContext>, SluiceError> {
        let brokers = &self.options.brokers;
        let mut config = client::base_config(brokers, &self.options.client);
        config.set("group.id", group);
        config.set("enable.auto.commit", "false");
        config.set("isolation.level", "read_committed");
        config.create_with_context(SluiceClientContext::new(brokers)).map_err(|e| client::create_error(brokers, &e))
    }

    /// The run and epoch of the last marker producer `transactional_id` committed, if
    /// any.
    pub(super) fn committed_marker(&self, transactional_id: &str) -> Result<Option<(u32, u64)>, SluiceError> {
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
    pub(super) fn fence_writer_of(&self, record: &TransactionRecord<'_>) -> Result<(), SluiceError> {
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
    pub(super) fn fence_leftovers(&self, slots: u32) -> Result<Vec<u32>, SluiceError> {
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
    pub(super) fn recover(&self, epoch: Epoch, record: &TransactionRecord<'_>) -> Result<(), SluiceError> {
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
pub(super) fn sibling_id(transactional_id: &str) -> Option<String> {
    let (writer, index) = transactional_id.rsplit_once('-')?;
    let other = match index {
        "0" => "1",
        "1" => "0",
        _ => return None,
    };
    Some(format!("{writer}-{other}"))
}
