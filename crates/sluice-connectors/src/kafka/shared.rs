//! What every lane of one Kafka source shares in this process: the options, the one
//! consumer (created when the first lane opens; in group mode, joined), the registry,
//! the dead-letter producer, and the offsets last committed to the group.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::topic_partition_list::TopicPartitionList;
use sluice_config::OnError;
use sluice_types::SluiceError;

use super::avro::Registry;
use super::client::{self, SluiceClientContext, SourceConsumer};
use super::dead_letter::DeadLetter;
use super::group::{self, Group, Poller};
use super::options::KafkaSourceOptions;

/// What every lane of one source shares.
pub(crate) struct Shared {
    pub name: String,
    pub options: KafkaSourceOptions,
    pub schema: SchemaRef,
    pub event_time: Option<usize>,
    pub watermark_delay_ms: i64,
    /// See `SourceFactory::max_watermark_drift`.
    pub max_watermark_drift_ms: Option<i64>,
    pub on_error: OnError,
    /// `avro-confluent`: the schema registry, its cache shared by the lanes.
    pub registry: Option<Arc<Registry>>,
    /// `on_error = "dead-letter"`: the producer of the dead-letter topic.
    pub dead_letter: Option<DeadLetter>,
    /// The consumer of this process, created by the first lane opened.
    pub(super) consumer: Mutex<Option<Arc<SourceConsumer>>>,
    /// Per lane: whether it is idle (silent for `idle_timeout`, or ended), so that idle
    /// lanes follow the others' watermark.
    pub idle: Vec<AtomicBool>,
    /// The offsets last committed to the group, committed again synchronously on drop.
    pub(super) last_commit: Mutex<Option<TopicPartitionList>>,
    /// Group mode: the group state shared with the consumer's rebalance callback.
    pub group: Option<Arc<Group>>,
    /// Group mode, once joined: the lanes' queues not taken yet, and the poller.
    pub(super) membership: Mutex<Option<Membership>>,
    /// (topic, partition) of each lane.
    pub(super) partitions: Vec<(String, i32)>,
}

/// What a group-mode consumer holds besides the consumer.
pub(super) struct Membership {
    pub(super) queues: Vec<Option<PartitionQueue<SluiceClientContext>>>,
    pub(super) poller: Poller,
}

impl Shared {
    /// The consumer of this process, created on first use.
    pub fn consumer(&self) -> Result<Arc<SourceConsumer>, SluiceError> {
        let mut slot = self.consumer.lock().map_err(|_| poisoned(&self.name))?;
        if let Some(consumer) = slot.as_ref() {
            return Ok(Arc::clone(consumer));
        }
        let options = &self.options;
        if let Some(group) = &self.group {
            let member = group::join(&self.name, options, group, &self.partitions)?;
            let mut membership = self.membership.lock().map_err(|_| poisoned(&self.name))?;
            *membership = Some(Membership { queues: member.queues, poller: member.poller });
            *slot = Some(Arc::clone(&member.consumer));
            return Ok(member.consumer);
        }
        let config = client::consumer_config(&options.brokers, options.group_id.as_deref(), &options.client);
        let context = SluiceClientContext::new(&options.brokers);
        let consumer: SourceConsumer =
            config.create_with_context(context).map_err(|e| client::create_error(&options.brokers, &e))?;
        let consumer = Arc::new(consumer);
        *slot = Some(Arc::clone(&consumer));
        Ok(consumer)
    }

    /// Group mode: the queue of `lane`'s partition, split off when the consumer joined.
    pub fn take_queue(&self, lane: usize) -> Result<PartitionQueue<SluiceClientContext>, SluiceError> {
        let mut membership = self.membership.lock().map_err(|_| poisoned(&self.name))?;
        let queue = membership.as_mut().and_then(|m| m.queues.get_mut(lane)).and_then(Option::take);
        queue.ok_or_else(|| {
            SluiceError::internal("source.kafka", format!("lane {lane} has no queue or was opened twice"))
        })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let consumer = self.consumer.get_mut().ok().and_then(|c| c.take());
        let membership = self.membership.get_mut().ok().and_then(|m| m.take());
        if let Some(group) = &self.group {
            if let (Some(membership), Some(consumer)) = (membership, consumer) {
                // The queues hold the consumer: dropped first, so closing it is its last use.
                drop(membership.queues);
                group::leave(group, membership.poller, consumer);
            }
            return;
        }
        let last = self.last_commit.get_mut().ok().and_then(|l| l.take());
        if let (Some(consumer), Some(offsets), Some(group)) = (consumer, last, &self.options.group_id)
            && let Err(error) = consumer.commit(&offsets, CommitMode::Sync)
        {
            tracing::warn!(source = %self.name, group = %group, "kafka: committing the last offsets failed: {error}");
        }
    }
}

pub(super) fn poisoned(source: &str) -> SluiceError {
    SluiceError::internal("source.kafka", format!("source `{source}`: a lane panicked while opening the consumer"))
}

/// How long a lane waits before polling an empty partition again.
pub(crate) const EMPTY_POLL_WAIT: Duration = Duration::from_millis(20);
