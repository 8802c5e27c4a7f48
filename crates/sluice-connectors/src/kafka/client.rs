//! The librdkafka clients: their settings, their logs, and their errors as
//! [`SluiceError`]s naming the brokers and the fix.
//!
//! # Memory of an unpolled partition
//!
//! The source reads every partition through its own queue (split from the one consumer
//! of the source in this process). librdkafka prefetches into each partition's queue
//! until it holds [`QUEUED_KBYTES_PER_PARTITION`] KiB (`queued.max.messages.kbytes`,
//! which applies per partition once its queue is split) or [`QUEUED_MESSAGES_MIN`]
//! messages, then stops fetching that partition until the lane drains it. A lane the
//! driver does not poll (its downstream is full) therefore holds at most that much (and,
//! skipped for longer than `lane::PAUSE_AFTER`, pauses its partition, which drops it), and
//! a fetch response is at most [`FETCH_BYTES_MAX`]: the consumer's memory is bounded by
//! about `partitions × 4 MiB + 8 MiB`. Both can be changed under `client`.
//!
//! Once a partition's queue reached those thresholds, librdkafka postpones its next
//! fetch by `fetch.queue.backoff.ms`, a full second by default: a lane that drains its
//! queue sooner then waits for the rest of that second. With thresholds this small that
//! is most of the time (a 4-partition topic was read at a third of the client's own
//! speed, `scripts/kafka-bench.sh`), so the source sets it to
//! [`FETCH_QUEUE_BACKOFF_MS`], about the time a lane waits on an empty queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use sluice_types::SluiceError;

/// The longest a metadata request (planning, the broker checks) may take.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Prefetched KiB per partition queue (`queued.max.messages.kbytes`).
pub const QUEUED_KBYTES_PER_PARTITION: u32 = 4096;
/// Prefetched messages per partition queue below which librdkafka fetches more.
pub const QUEUED_MESSAGES_MIN: u32 = 10_000;
/// The most bytes of one fetch response (`fetch.max.bytes`).
pub const FETCH_BYTES_MAX: u32 = 8 << 20;
/// How long librdkafka postpones fetching a partition whose queue is full
/// (`fetch.queue.backoff.ms`; see the module docs).
pub const FETCH_QUEUE_BACKOFF_MS: u32 = 20;
/// The group id of a consumer without `group_id` (never joined, never committed to).
const UNCOMMITTED_GROUP: &str = "sluice-uncommitted";
/// Client log lines forwarded per client; later ones are counted, not logged.
const LOGGED_LINES_MAX: u64 = 200;

/// The consumer of a source's lanes in this process.
pub(crate) type SourceConsumer = BaseConsumer<SluiceClientContext>;

/// What serves a group-mode consumer's rebalances (`group::Group`), so that this file,
/// which every other one uses, needs none of them.
pub(crate) trait Rebalance: Send + Sync + std::fmt::Debug {
    fn rebalance(&self, consumer: &SourceConsumer, event: RDKafkaRespErr, partitions: &TopicPartitionList);
}

/// The client context of every consumer and producer: forwards librdkafka's logs and
/// errors to `tracing`, and remembers when the brokers were last found unreachable.
#[derive(Debug, Default)]
pub struct SluiceClientContext {
    /// The brokers, for messages.
    pub brokers: String,
    logged: AtomicU64,
    /// Milliseconds since the epoch of the first "all brokers down" error not yet
    /// cleared by a successful read (0: none).
    down_since_ms: AtomicU64,
    /// The last client error, for the message that fails a lane.
    last_error: Mutex<Option<String>>,
    /// A group-mode source's group state, which serves the consumer's rebalances.
    group: Option<Arc<dyn Rebalance>>,
}

impl SluiceClientContext {
    pub fn new(brokers: &str) -> SluiceClientContext {
        SluiceClientContext { brokers: brokers.to_owned(), ..SluiceClientContext::default() }
    }

    /// The context of a group-mode consumer: `group` serves its rebalances.
    pub(crate) fn with_group(self, group: Arc<dyn Rebalance>) -> SluiceClientContext {
        SluiceClientContext { group: Some(group), ..self }
    }

    /// When the brokers became unreachable, if they are.
    pub fn down_since_ms(&self) -> Option<u64> {
        Some(self.down_since_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    /// The brokers answered: clears the down state.
    pub fn mark_up(&self) {
        if self.down_since_ms.swap(0, Ordering::Relaxed) > 0 {
            tracing::info!(brokers = %self.brokers, "kafka: the brokers are reachable again");
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl ClientContext for SluiceClientContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if self.logged.fetch_add(1, Ordering::Relaxed) >= LOGGED_LINES_MAX {
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::warn!(brokers = %self.brokers, facility, "kafka client: {message}");
            }
            RDKafkaLogLevel::Warning | RDKafkaLogLevel::Notice => {
                tracing::info!(brokers = %self.brokers, facility, "kafka client: {message}");
            }
            RDKafkaLogLevel::Info | RDKafkaLogLevel::Debug => {
                tracing::debug!(brokers = %self.brokers, facility, "kafka client: {message}");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            let _ = self.down_since_ms.compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed);
        }
        let text = format!("{error}: {reason}");
        // librdkafka repeats an error (all brokers down) in bursts of hundreds while
        // nothing polls: the same error as the last one is not logged again.
        let repeated = match self.last_error.lock() {
            Ok(mut last) => last.replace(text).as_deref() == last.as_deref(),
            Err(_) => false,
        };
        if !repeated && self.logged.fetch_add(1, Ordering::Relaxed) < LOGGED_LINES_MAX {
            tracing::warn!(brokers = %self.brokers, "kafka client error: {error}: {reason}");
        }
    }
}

impl ConsumerContext for SluiceClientContext {
    /// Group mode's rebalances (`group.rs`); a consumer in manual mode never subscribes,
    /// so never rebalances.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, event: RDKafkaRespErr, partitions: &mut TopicPartitionList) {
        match &self.group {
            Some(group) => group.rebalance(consumer, event, partitions),
            None => {
                tracing::warn!(brokers = %self.brokers, "kafka: a rebalance ({event:?}) of a manual consumer ignored")
            }
        }
    }
}

/// The base settings of a client of `brokers`, then the user's `client` settings.
pub fn base_config(brokers: &str, client: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config.set("client.id", "sluice");
    config.set("log_level", "6");
    for (key, value) in client {
        config.set(key, value);
    }
    config
}

/// The settings of a source's consumer (manual assignment; offsets committed by the
/// source, never automatically; no automatic reset of an offset out of range).
pub fn consumer_config(brokers: &str, group_id: Option<&str>, client: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config.set("client.id", "sluice");
    config.set("enable.auto.commit", "false");
    config.set("enable.auto.offset.store", "false");
    config.set("enable.partition.eof", "false");
    // Where a lane starts is always explicit (`start`, a checkpoint, the group): an offset
    // the brokers answer as out of range reaches the lane as an error, never as a silent
    // jump, and the lane applies `offset_out_of_range` (see `range`).
    config.set("auto.offset.reset", "error");
    config.set("queued.max.messages.kbytes", QUEUED_KBYTES_PER_PARTITION.to_string());
    config.set("queued.min.messages", QUEUED_MESSAGES_MIN.to_string());
    config.set("fetch.max.bytes", FETCH_BYTES_MAX.to_string());
    config.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string());
    // librdkafka adds partitions to an assignment only with a group id; without the
    // user's, a fixed one that nothing ever commits to or joins.
    config.set("group.id", group_id.unwrap_or(UNCOMMITTED_GROUP));
    for (key, value) in client {
        config.set(key, value);
    }
    config
}

/// A client that could not be created (a bad `client` setting, usually).
pub fn create_error(brokers: &str, error: &KafkaError) -> SluiceError {
    SluiceError::user("kafka.client", format!("cannot create a Kafka client for brokers {brokers}: {error}"))
        .with_fix("check the settings under `client` (librdkafka names and values)")
}

/// The brokers did not answer a metadata request within [`METADATA_TIMEOUT`].
pub fn unreachable(brokers: &str, error: &KafkaError) -> SluiceError {
    SluiceError::external(
        "kafka.unreachable",
        format!(
            "cannot reach the Kafka brokers {brokers}: {error} (librdkafka retried for {}s)",
            METADATA_TIMEOUT.as_secs()
        ),
    )
    .with_fix("check `brokers` (host:port of a running broker) and that the network reaches it")
}

/// The brokers answered before and then stopped answering for longer than `waited`.
pub fn lost(brokers: &str, waited: Duration, last: Option<String>) -> SluiceError {
    let last = last.map(|l| format!(" (last error: {l})")).unwrap_or_default();
    SluiceError::external(
        "kafka.broker_lost",
        format!("lost the Kafka brokers {brokers}: no answer for {}s{last}", waited.as_secs()),
    )
    .with_fix(
        "restart the brokers or fix the network, then restart the pipeline (with checkpoints it resumes where it stopped)",
    )
}

/// A topic the brokers do not know.
pub fn missing_topic(brokers: &str, topic: &str, detail: &str) -> SluiceError {
    SluiceError::user("kafka.missing_topic", format!("topic `{topic}` does not exist on brokers {brokers} ({detail})"))
        .with_fix(format!("create the topic `{topic}`, or correct `topic`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_repeated_is_logged_once_and_kept_as_the_last() {
        let context = SluiceClientContext::new("localhost:9092");
        let down = || KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        for _ in 0..5 {
            context.error(down(), "1/1 brokers are down");
        }
        assert_eq!(context.logged.load(Ordering::Relaxed), 1);
        assert!(context.down_since_ms().is_some());
        context.error(KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure), "connect failed");
        context.error(down(), "1/1 brokers are down");
        assert_eq!(context.logged.load(Ordering::Relaxed), 3);
        assert_eq!(context.last_error().as_deref(), Some(format!("{}: 1/1 brokers are down", down()).as_str()));
    }
}
