//! A sink producer's deliveries: the rows the brokers acknowledged (what the sink counts
//! as out), the messages they did not, and brokers lost.
//!
//! # Rows out
//!
//! A send only queues a message in librdkafka; its delivery report comes later, from the
//! producer's thread. Each message carries as its delivery opaque the rows it completes
//! (`sink::Output::messages`: the last message of a row, which also carries the rows
//! before it that need none), and a report of success adds them to
//! [`DeliveryContext::take_acknowledged_rows`]. The at-least-once writer hands those to
//! the runtime (`SinkWriter::take_acknowledged_rows`), so a run whose brokers died
//! reports the rows they acknowledged, not the rows queued. (An exactly-once writer's
//! rows count when their transaction commits.)
//!
//! # Lost brokers
//!
//! Every producer sets `message.timeout.ms` to the sink's `delivery_timeout` (default
//! [`DELIVERY_TIMEOUT`], the bound the source gives lost brokers): librdkafka fails a
//! message the brokers did not acknowledge by then, queued or in flight, whether they
//! refuse connections or stopped answering. The writer checks for failures after every
//! write ([`DeliveryContext::check`]), at each barrier and at the end (the flush waits for
//! every report), so brokers lost fail the run at the first of those after
//! `delivery_timeout` without an acknowledgement, with `sink.kafka_broker_lost` naming
//! the brokers and the fix. A send that finds the queue full ([`send`]) checks for
//! failures while it waits, and waits at most `delivery_timeout` +
//! [`QUEUE_FULL_GRACE`]: by then every queued message was acknowledged or failed. (With
//! librdkafka's defaults a message waited 300 s, and a writer failed on a queue full
//! for 60 s, with neither the brokers nor the cause named.)

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use sluice_types::SluiceError;

use super::client::SluiceClientContext;

/// The longest a flush, `init_transactions` or a transaction commit may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// The default of `delivery_timeout`: how long a message may wait for the brokers'
/// acknowledgement before the sink fails, the source's bound on lost brokers.
pub const DELIVERY_TIMEOUT: Duration = super::lane::BROKER_LOST_AFTER;
/// How much longer than `delivery_timeout` a send waits for room in a full queue.
pub const QUEUE_FULL_GRACE: Duration = Duration::from_secs(5);
/// How long a send on a full queue lets the producer work before trying again.
const FULL_QUEUE_WAIT: Duration = Duration::from_millis(10);

pub(crate) type SinkProducer = ThreadedProducer<DeliveryContext>;

/// The client context of a sink's producer: logs like every client, counts the rows
/// acknowledged and the messages that failed.
#[derive(Debug)]
pub struct DeliveryContext {
    client: SluiceClientContext,
    sink: String,
    topic: String,
    delivery_timeout: Duration,
    acknowledged_rows: AtomicU64,
    /// Failed deliveries since the last check, and the first of them.
    failed: AtomicU64,
    first_failure: Mutex<Option<KafkaError>>,
}

impl DeliveryContext {
    pub fn new(sink: &str, brokers: &str, topic: &str, delivery_timeout: Duration) -> DeliveryContext {
        DeliveryContext {
            client: SluiceClientContext::new(brokers),
            sink: sink.to_owned(),
            topic: topic.to_owned(),
            delivery_timeout,
            acknowledged_rows: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            first_failure: Mutex::new(None),
        }
    }

    /// The rows acknowledged since the last call.
    pub fn take_acknowledged_rows(&self) -> u64 {
        self.acknowledged_rows.swap(0, Ordering::Relaxed)
    }

    /// Counts `rows` as acknowledged without a message (rows that needed none).
    pub fn acknowledge(&self, rows: u64) {
        self.acknowledged_rows.fetch_add(rows, Ordering::Relaxed);
    }

    /// Fails if a delivery failed since the last check: brokers lost when it timed out.
    pub fn check(&self) -> Result<(), SluiceError> {
        let failed = self.failed.swap(0, Ordering::Relaxed);
        if failed == 0 {
            return Ok(());
        }
        let first = self.first_failure.lock().ok().and_then(|mut first| first.take());
        Err(self.failure(failed, first.as_ref()))
    }

    /// The error of `failed` deliveries, the first of which failed with `first`.
    fn failure(&self, failed: u64, first: Option<&KafkaError>) -> SluiceError {
        let first_text = first.map_or_else(|| "unknown".to_owned(), KafkaError::to_string);
        if first.and_then(KafkaError::rdkafka_error_code) == Some(RDKafkaErrorCode::MessageTimedOut) {
            return self.lost(&format!(
                "{failed} messages to {} were not acknowledged within delivery_timeout = {} ms ({first_text})",
                self.topic,
                self.delivery_timeout.as_millis()
            ));
        }
        SluiceError::external(
            "sink.kafka_delivery",
            format!(
                "sink `{}`: {failed} messages to {} on brokers {} were not delivered: {first_text}",
                self.sink, self.topic, self.client.brokers
            ),
        )
        .with_fix("check the topic and the brokers; restart from the last checkpoint")
    }

    /// The brokers stopped acknowledging: `what` happened.
    fn lost(&self, what: &str) -> SluiceError {
        let last = self.client.last_error().map(|l| format!("; last client error: {l}")).unwrap_or_default();
        SluiceError::external(
            "sink.kafka_broker_lost",
            format!("sink `{}`: lost the Kafka brokers {}: {what}{last}", self.sink, self.client.brokers),
        )
        .with_fix(
            "restart the brokers or fix the network, then restart the pipeline (with checkpoints it resumes from the \
             last one; without, the rows the brokers did not acknowledge, which `rows out` does not count, are not \
             written); raise delivery_timeout under [sink.options] to wait longer for slow brokers",
        )
    }
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.client.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.client.error(error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    /// The rows the message completes.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, rows: usize) {
        match result {
            Ok(_) => self.acknowledge(rows as u64),
            Err((error, _)) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0
                    && let Ok(mut first) = self.first_failure.lock()
                {
                    *first = Some(error.clone());
                }
            }
        }
    }
}

/// Sends one message completing `rows` rows, waiting while the producer's queue is full
/// (at most `delivery_timeout` + [`QUEUE_FULL_GRACE`], failing at once on a failed
/// delivery).
pub(crate) fn send(
    producer: &SinkProducer,
    topic: &str,
    value: Option<&[u8]>,
    key: Option<&[u8]>,
    headers: Option<OwnedHeaders>,
    rows: usize,
) -> Result<(), SluiceError> {
    let context = producer.context();
    let deadline = Instant::now() + context.delivery_timeout + QUEUE_FULL_GRACE;
    let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, rows);
    if let Some(headers) = headers {
        record = record.headers(headers);
    }
    if let Some(value) = value {
        record = record.payload(value);
    }
    if let Some(key) = key {
        record = record.key(key);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                context.check()?;
                if Instant::now() >= deadline {
                    let waited = context.delivery_timeout + QUEUE_FULL_GRACE;
                    return Err(context.lost(&format!(
                        "the producer's queue stayed full for {} ms (delivery_timeout + {} ms)",
                        waited.as_millis(),
                        QUEUE_FULL_GRACE.as_millis()
                    )));
                }
                record = back;
                producer.poll(FULL_QUEUE_WAIT);
            }
            Err((error, _)) => {
                return Err(SluiceError::external(
                    "sink.kafka_send",
                    format!(
                        "sink `{}`: cannot send to {topic} on brokers {}: {error}",
                        context.sink, context.client.brokers
                    ),
                )
                .with_fix("check that the brokers are running and the topic accepts writes"));
            }
        }
    }
}

/// Flushes `producer` and checks that every delivery since the last check succeeded.
pub(crate) fn flush_checked(producer: &SinkProducer) -> Result<(), SluiceError> {
    let context = producer.context();
    let flushed = producer.flush(FLUSH_TIMEOUT);
    // Failed deliveries say more than a flush that timed out.
    context.check()?;
    flushed.map_err(|e| {
        context.lost(&format!("they did not acknowledge a flush within {} ms: {e}", FLUSH_TIMEOUT.as_millis()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> DeliveryContext {
        DeliveryContext::new("out", "127.0.0.1:9", "copies", Duration::from_secs(2))
    }

    fn fail(context: &DeliveryContext, code: RDKafkaErrorCode) {
        let error = KafkaError::MessageProduction(code);
        if context.failed.fetch_add(1, Ordering::Relaxed) == 0 {
            *context.first_failure.lock().expect("lock") = Some(error);
        }
    }

    #[test]
    fn messages_not_acknowledged_in_time_are_brokers_lost_named_with_the_fix() {
        let context = context();
        context.client.error(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown), "1/1 brokers are down");
        context.check().expect("no failure yet");
        for _ in 0..3 {
            fail(&context, RDKafkaErrorCode::MessageTimedOut);
        }
        let error = context.check().expect_err("failed");
        assert_eq!(error.code, "sink.kafka_broker_lost");
        for needle in
            ["sink `out`", "127.0.0.1:9", "3 messages to copies", "delivery_timeout = 2000 ms", "brokers are down"]
        {
            assert!(error.message.contains(needle), "{needle} in {}", error.message);
        }
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("delivery_timeout")), "{error:?}");
        context.check().expect("the failures were reported once");
    }

    #[test]
    fn other_failed_deliveries_are_named_as_such() {
        let context = context();
        fail(&context, RDKafkaErrorCode::MessageSizeTooLarge);
        let error = context.check().expect_err("failed");
        assert_eq!(error.code, "sink.kafka_delivery");
        assert!(error.message.contains("1 messages to copies on brokers 127.0.0.1:9"), "{error:?}");
    }

    #[test]
    fn rows_count_once_acknowledged() {
        let context = context();
        context.acknowledge(3);
        context.acknowledge(2);
        assert_eq!(context.take_acknowledged_rows(), 5);
        assert_eq!(context.take_acknowledged_rows(), 0);
    }
}
