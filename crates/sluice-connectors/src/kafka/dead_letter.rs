//! `on_error = "dead-letter"`: a Kafka source's bad messages written to a topic.
//!
//! Every message the lane cannot make a row of (see `lane::bad_messages`) is counted and
//! logged as with `skip`, and written to `dead_letter_topic` as read: the same key, the
//! same value bytes (none for a tombstone), the same headers, plus `sluice.error` (the
//! reason and the text the log shows), `sluice.source` (the source's name),
//! `sluice.topic`, `sluice.partition` and `sluice.offset` (where it was read, as
//! decimal text). The producer chooses the partition by the key, as for any keyed
//! message (no key: any partition): the original partition is in `sluice.partition`,
//! and the dead-letter topic need not have as many partitions as the topics read.
//!
//! # Nothing lost
//!
//! A lane sends a poll's bad messages and then flushes the producer (waiting at most
//! [`FLUSH_TIMEOUT`]) *before* that poll returns: the lane's position, which
//! checkpoints record and from which group offsets are committed, never passes a bad
//! message the brokers have not acknowledged, and nothing is pending at the end of a
//! run. A flush that times out or a delivery that fails stops the run with
//! `source.kafka_dead_letter`, naming the topic and the brokers; the position is not
//! advanced, so a restart from the last checkpoint reads those messages again. A crash
//! after the flush and before the next checkpoint writes them again: at-least-once.
//! Bad messages are rare, so the flush per poll that has some costs little; a poll
//! without one does not flush.
//!
//! # Bounded
//!
//! One idempotent producer per source in this process, shared by its lanes, with the
//! same base settings and `client` table as the source's clients. Its queue holds at
//! most [`QUEUE_MESSAGES`] messages and [`QUEUE_KBYTES`] KiB; a lane that finds it full
//! serves the producer and tries again, for at most [`FLUSH_TIMEOUT`]; a message is
//! given up (and the run fails) after [`MESSAGE_TIMEOUT`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use sluice_types::SluiceError;

use super::client::{self, METADATA_TIMEOUT, SluiceClientContext};
use super::options::DeadLetterOptions;
use super::rows::Message;

/// How long the producer tries to deliver one message (`message.timeout.ms`).
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a flush (and a send waiting for room in the queue) may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(40);
/// The most messages the producer's queue holds (`queue.buffering.max.messages`).
pub const QUEUE_MESSAGES: u32 = 10_000;
/// The most KiB the producer's queue holds (`queue.buffering.max.kbytes`).
pub const QUEUE_KBYTES: u32 = 64 * 1024;
/// How long a send waits on a full queue before trying again.
const FULL_QUEUE_WAIT: Duration = Duration::from_millis(10);

/// The producer's client context: logs like every client, and counts failed deliveries.
struct DeadLetterContext {
    client: SluiceClientContext,
    failed: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl ClientContext for DeadLetterContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.client.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.client.error(error, reason);
    }
}

impl ProducerContext for DeadLetterContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result
            && self.failed.fetch_add(1, Ordering::Relaxed) == 0
            && let Ok(mut first) = self.first_failure.lock()
        {
            *first = Some(error.to_string());
        }
    }
}

/// The dead-letter producer of one source in this process.
pub struct DeadLetter {
    source: String,
    topic: String,
    brokers: String,
    producer: ThreadedProducer<DeadLetterContext>,
}

impl DeadLetter {
    /// Creates the producer of `source` and checks that the topic exists.
    pub fn open(
        source: &str,
        options: &DeadLetterOptions,
        source_brokers: &str,
        settings: &[(String, String)],
    ) -> Result<DeadLetter, SluiceError> {
        let brokers = options.brokers.clone().unwrap_or_else(|| source_brokers.to_owned());
        let mut config = client::base_config(&brokers, settings);
        config.set("enable.idempotence", "true");
        config.set("message.timeout.ms", MESSAGE_TIMEOUT.as_millis().to_string());
        config.set("queue.buffering.max.messages", QUEUE_MESSAGES.to_string());
        config.set("queue.buffering.max.kbytes", QUEUE_KBYTES.to_string());
        // A missing topic fails at start (below), never created by a metadata request.
        config.set("allow.auto.create.topics", "false");
        let context = DeadLetterContext {
            client: SluiceClientContext::new(&brokers),
            failed: AtomicU64::new(0),
            first_failure: Mutex::new(None),
        };
        let producer: ThreadedProducer<DeadLetterContext> =
            config.create_with_context(context).map_err(|e| client::create_error(&brokers, &e))?;
        let topic = &options.topic;
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(|e| client::unreachable(&brokers, &e).context(format!("dead_letter_topic `{topic}`")))?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        let missing = match found {
            None => Some("not in the metadata".to_owned()),
            Some(found) => match found.error() {
                Some(error) => Some(RDKafkaErrorCode::from(error).to_string()),
                None => found.partitions().is_empty().then(|| "it has no partition".to_owned()),
            },
        };
        if let Some(detail) = missing {
            return Err(SluiceError::user(
                "kafka.missing_topic",
                format!(
                    "dead_letter_topic `{topic}` of source `{source}` does not exist on brokers {brokers} ({detail})"
                ),
            )
            .with_fix(format!("create the topic `{topic}`, or correct `dead_letter_topic`")));
        }
        Ok(DeadLetter { source: source.to_owned(), topic: topic.clone(), brokers, producer })
    }

    /// Queues `message`, read from `topic`, with its `error`; waits (bounded) while the
    /// producer's queue is full. Delivered only once [`DeadLetter::flush`] returned.
    pub fn send(&self, topic: &str, message: &Message, error: &str) -> Result<(), SluiceError> {
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 5);
        for (name, value) in &message.headers {
            headers = headers.insert(Header { key: name, value: value.as_deref() });
        }
        let partition = message.partition.to_string();
        let offset = message.offset.to_string();
        for (name, value) in [
            ("sluice.error", error),
            ("sluice.source", &self.source),
            ("sluice.topic", topic),
            ("sluice.partition", &partition),
            ("sluice.offset", &offset),
        ] {
            headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).headers(headers);
        if let Some(value) = &message.value {
            record = record.payload(value);
        }
        if let Some(key) = &message.key {
            record = record.key(key);
        }
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    record = back;
                    self.producer.poll(FULL_QUEUE_WAIT);
                }
                Err((error, _)) => return Err(self.failed(&format!("cannot queue a message: {error}"))),
            }
        }
    }

    /// Waits (at most [`FLUSH_TIMEOUT`]) until the brokers acknowledged every message
    /// sent, and checks that each was delivered.
    pub fn flush(&self) -> Result<(), SluiceError> {
        self.producer.flush(FLUSH_TIMEOUT).map_err(|e| {
            self.failed(&format!("the brokers did not acknowledge within {}s: {e}", FLUSH_TIMEOUT.as_secs()))
        })?;
        let context = self.producer.context();
        if context.failed.swap(0, Ordering::Relaxed) > 0 {
            let first = context.first_failure.lock().ok().and_then(|mut f| f.take()).unwrap_or_default();
            return Err(self.failed(&format!("a message was not delivered: {first}")));
        }
        Ok(())
    }

    fn failed(&self, what: &str) -> SluiceError {
        SluiceError::external(
            "source.kafka_dead_letter",
            format!(
                "source `{}`: writing bad messages to dead_letter_topic `{}` on brokers {}: {what}",
                self.source, self.topic, self.brokers
            ),
        )
        .with_fix(
            "check that the brokers are running and the topic accepts writes, then restart (from the last \
             checkpoint the bad messages are read and written again); or set on_error = \"skip\"",
        )
    }
}
