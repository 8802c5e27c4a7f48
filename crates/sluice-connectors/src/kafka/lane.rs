//! One lane of a Kafka source: one partition, read through its own queue of the
//! source's consumer.
//!
//! - **Start.** A lane resumed from a checkpoint seeks to the recorded next offset; a
//!   fresh lane starts per `start` (`earliest`, `latest`, `committed`, a timestamp).
//!   A checkpoint's offset, or the group's with `start = "committed"`, is first checked
//!   against what the partition holds, and one it no longer holds fails the run or is
//!   reset per `offset_out_of_range` (`range`), as is an offset the brokers answer as out
//!   of range while the lane reads. A checkpoint's offset in range is then confirmed by
//!   reading again the last record the lane handed out before it, which the position
//!   records (`last_record`): a recreated topic refilled past the offset fails or is
//!   reset the same way.
//! - **Poll.** Takes what the partition queue holds now, at most `batch_size`
//!   messages, without blocking; an empty queue answers `Wait` for
//!   [`EMPTY_POLL_WAIT`]. The rows are built by [`RowBuilder`]; bad messages are
//!   counted, logged (the first [`LOGGED_BAD_ROWS`] of the source) or fatal per
//!   `on_error`, named by topic, partition and offset; with `dead-letter` also written
//!   to the dead-letter topic and flushed before the poll returns (`dead_letter`).
//! - **Bounded.** The lane ends once it handed out the record before the end offset
//!   planning saw (at once for an empty partition).
//! - **Watermark.** The largest event time read minus `watermark_delay`. A lane silent
//!   for `idle_timeout` (or ended) is *idle*: while idle it reports the lowest watermark
//!   of the source's lanes in this process that are not idle, so it does not hold the
//!   stream back (Flink's `source.idle-timeout`); its first record ends the idleness.
//! - **Brokers lost.** librdkafka reconnects on its own; a lane that has seen the
//!   brokers down (the client's "all brokers down" error) for [`BROKER_LOST_AFTER`]
//!   without reading anything checks them with a metadata request and fails with
//!   `kafka.broker_lost` if they still do not answer.
//! - **Paused while blocked.** A lane the driver skips because its downstream is full
//!   ([`LaneReader::blocked`]) for [`PAUSE_AFTER`] pauses its partition in the consumer,
//!   so librdkafka stops fetching it (and drops what it prefetched); its next poll
//!   resumes it, and fetching starts again at the next offset the lane hands out. A
//!   short stall does not pause, so a busy pipeline does not refetch at every turn.
//! - **Group mode.** The lane reads only while the group grants its partition to this
//!   process (`Group::turn`): a new grant starts at the offset the grant resolved; a
//!   lane without a grant is idle at once (it yields nothing and reports the other lanes'
//!   watermark) and records where it stopped when its grant is revoked. A resumed lane
//!   keeps only its watermark: the group's offsets say where a partition resumes. Its
//!   queue was split off when the consumer joined, and it never polls the main queue
//!   (the group's poller does, see `group`).
//! - **Group offsets.** Committed by the source once a checkpoint is committed (see
//!   `source`), never from here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::Message as _;
use rdkafka::consumer::Consumer;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::message::Headers as _;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_config::OnError;
use sluice_runtime::metrics::{NO_WATERMARK, SourceMetrics};
use sluice_runtime::{LaneContext, LanePoll, LaneReader};
use sluice_types::{SluiceError, TimestampMs};

use super::client::SourceConsumer;
use super::client::{self, METADATA_TIMEOUT, SluiceClientContext};
use super::group::{Seen, Turn};
use super::last_record;
use super::offsets::{is_out_of_range, start_offset};
use super::options::StartAt;
use super::position::Position;
use super::position::{LastRead, RecordFingerprint};
use super::range::{self, Origin};
use super::rows::{BadMessage, Message, RowBuilder};
use super::shared::{EMPTY_POLL_WAIT, Shared};
use crate::lanes::{LOGGED_BAD_ROWS, max_timestamp_ms};

/// How long the brokers may stay down before a lane checks them and gives up.
pub const BROKER_LOST_AFTER: Duration = Duration::from_secs(60);
/// How long a lane stays unpolled for a full downstream before its partition is paused.
pub const PAUSE_AFTER: Duration = Duration::from_millis(200);
/// The check of brokers believed down.
const BROKER_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A lane reading one partition.
pub struct KafkaLane {
    shared: Arc<Shared>,
    lane: usize,
    topic: String,
    partition: i32,
    consumer: Arc<SourceConsumer>,
    queue: PartitionQueue<SluiceClientContext>,
    rows: RowBuilder,
    metrics: Arc<SourceMetrics>,
    batch_size: usize,
    /// The offset of the next record to hand out (`None`: not known before the first).
    next_offset: Option<i64>,
    /// The last record handed out since `next_offset` was resolved, for the position.
    last_read: LastRead,
    /// Bounded: the offset the lane ends at.
    end: Option<i64>,
    max_event_time: Option<TimestampMs>,
    announce_watermark: bool,
    last_record: Instant,
    /// Since when the driver skips the lane for a full downstream.
    blocked_since: Option<Instant>,
    /// Whether the partition is paused in the consumer.
    paused: bool,
    /// Group mode: the grant the lane reads under.
    seen: Seen,
}

impl KafkaLane {
    pub(crate) fn open(
        shared: Arc<Shared>,
        topic: String,
        partition: i32,
        end: Option<i64>,
        context: LaneContext,
    ) -> Result<KafkaLane, SluiceError> {
        let resume = context.start.as_deref().map(|bytes| Position::decode(&shared.name, bytes)).transpose()?;
        let consumer = shared.consumer()?;
        if shared.group.is_some() {
            let queue = shared.take_queue(context.lane as usize)?;
            let watermark = resume.and_then(|p| p.watermark);
            return KafkaLane::new(shared, topic, partition, consumer, queue, context, None, watermark);
        }
        let brokers = shared.options.brokers.clone();
        let mut last_read = LastRead::Nothing;
        let start = match resume.and_then(|p| p.next_offset.map(|offset| (offset, p.last_read))) {
            Some((offset, last)) => {
                let origin = Origin::Checkpoint;
                let start = last_record::check_start(&shared, &consumer, &topic, partition, offset, origin, last)?;
                // Reset: what the lane read is not in the partition it reads now.
                last_read = if start == offset { last } else { LastRead::Nothing };
                Offset::Offset(start)
            }
            None => match start_offset(&consumer, &shared.options.start, &topic, partition, &brokers)? {
                Offset::Offset(offset) if shared.options.start == StartAt::Committed => {
                    let (origin, last) = (Origin::Group, LastRead::Nothing);
                    Offset::Offset(last_record::check_start(
                        &shared, &consumer, &topic, partition, offset, origin, last,
                    )?)
                }
                other => other,
            },
        };
        let queue = consumer.split_partition_queue(&topic, partition).ok_or_else(|| {
            SluiceError::internal("source.kafka", format!("cannot split the queue of {topic}/{partition}"))
        })?;
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&topic, partition, start)
            .map_err(|e| SluiceError::internal("source.kafka", format!("{topic}/{partition}: {e}")))?;
        consumer
            .incremental_assign(&assignment)
            .map_err(|e| client::unreachable(&brokers, &e).context(format!("assigning {topic}/{partition}")))?;
        let watermark = resume.and_then(|p| p.watermark);
        let next_offset = match start {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        };
        let mut lane = KafkaLane::new(shared, topic, partition, consumer, queue, context, next_offset, watermark)?;
        lane.end = end;
        lane.last_read = last_read;
        Ok(lane)
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        shared: Arc<Shared>,
        topic: String,
        partition: i32,
        consumer: Arc<SourceConsumer>,
        queue: PartitionQueue<SluiceClientContext>,
        context: LaneContext,
        next_offset: Option<i64>,
        watermark: Option<TimestampMs>,
    ) -> Result<KafkaLane, SluiceError> {
        let mut rows = RowBuilder::new(Arc::clone(&shared.schema), shared.options.format, &topic, context.batch_size)?;
        if let Some(registry) = &shared.registry {
            rows.set_registry(Arc::clone(registry));
        }
        Ok(KafkaLane {
            lane: context.lane as usize,
            max_event_time: watermark.map(|w| w.saturating_add(shared.watermark_delay_ms)),
            announce_watermark: watermark.is_some(),
            next_offset,
            shared,
            topic,
            partition,
            consumer,
            queue,
            rows,
            metrics: context.metrics,
            batch_size: context.batch_size.max(1),
            last_read: LastRead::Nothing,
            end: None,
            last_record: Instant::now(),
            blocked_since: None,
            paused: false,
            seen: Seen::default(),
        })
    }

    /// Reads on from `offset` (after an offset the brokers answered as out of range).
    fn seek(&mut self, offset: Offset) -> Result<(), SluiceError> {
        let (topic, partition) = (&self.topic, self.partition);
        self.consumer.seek(topic, partition, offset, METADATA_TIMEOUT).map_err(|e| {
            client::unreachable(&self.shared.options.brokers, &e).context(format!("seeking {topic}/{partition}"))
        })?;
        let next_offset = match offset {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        };
        if next_offset != self.next_offset {
            self.last_read = LastRead::Nothing;
        }
        self.next_offset = next_offset;
        Ok(())
    }

    /// Pauses or resumes fetching the lane's partition.
    fn set_paused(&mut self, paused: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, self.partition);
        let done = match paused {
            true => self.consumer.pause(&list),
            false => self.consumer.resume(&list),
        };
        match done {
            Ok(()) => {
                self.paused = paused;
                tracing::debug!(source = %self.shared.name, topic = %self.topic, partition = self.partition,
                    "kafka: {} the partition", if paused { "paused" } else { "resumed" });
            }
            Err(error) => tracing::warn!(source = %self.shared.name, topic = %self.topic, partition = self.partition,
                "kafka: cannot {} the partition: {error}", if paused { "pause" } else { "resume" }),
        }
    }

    fn watermark(&self) -> Option<TimestampMs> {
        self.max_event_time.map(|max| max.saturating_sub(self.shared.watermark_delay_ms))
    }

    fn set_idle(&self, idle: bool) {
        self.shared.idle[self.lane].store(idle, Ordering::Relaxed);
    }

    /// Whether the lane reached the end of a bounded read.
    fn at_end(&self) -> bool {
        match (self.end, self.next_offset) {
            (Some(end), Some(next)) => next >= end,
            (Some(end), None) => end <= 0,
            (None, _) => false,
        }
    }

    /// Takes what the queue holds now, at most a batch (and not past a bounded end).
    fn take_messages(&mut self) -> Result<Vec<Message>, SluiceError> {
        let mut messages = Vec::new();
        // Whether the lane sought elsewhere: the records before are not the partition's now.
        let mut sought = false;
        while messages.len() < self.batch_size && !self.at_end() {
            let Some(result) = self.queue.poll(Duration::ZERO) else { break };
            let message = match result {
                Ok(message) => message,
                Err(error) if is_out_of_range(&error) => {
                    let offset = range::after_reset_error(
                        &self.shared,
                        &self.consumer,
                        &self.topic,
                        self.partition,
                        self.next_offset,
                    )?;
                    self.seek(offset)?;
                    sought = true;
                    break;
                }
                Err(error) => {
                    tracing::warn!(source = %self.shared.name, topic = %self.topic, partition = self.partition,
                        "kafka: reading the partition failed (the client retries): {error}");
                    break;
                }
            };
            if self.end.is_some_and(|end| message.offset() >= end) {
                self.next_offset = Some(message.offset());
                break;
            }
            let size = message.payload().map_or(0, <[u8]>::len) + message.key().map_or(0, <[u8]>::len);
            self.metrics.bytes.fetch_add(size as u64, Ordering::Relaxed);
            messages.push(Message {
                value: message.payload().map(<[u8]>::to_vec),
                key: message.key().map(<[u8]>::to_vec),
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp().to_millis(),
                // Dead-letter messages carry the original headers.
                headers: match (self.rows.wants_headers() || self.shared.dead_letter.is_some(), message.headers()) {
                    (true, Some(headers)) => {
                        headers.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect()
                    }
                    _ => Vec::new(),
                },
            });
            if let Some(expected) = self.next_offset.filter(|expected| message.offset() > *expected) {
                // Normal under compaction and transactions (their markers take offsets);
                // otherwise records the brokers did not serve.
                tracing::debug!(source = %self.shared.name, "kafka: {}/{}: offsets {expected}..{} skipped",
                    self.topic, self.partition, message.offset());
            }
            self.next_offset = Some(message.offset() + 1);
        }
        if let Some(last) = messages.last().filter(|_| !sought) {
            let (key, value) = (last.key.as_deref(), last.value.as_deref());
            self.last_read = LastRead::Record(RecordFingerprint::of(last.offset, last.timestamp, key, value));
        }
        if let (Some(first), Some(last)) = (messages.first(), messages.last()) {
            tracing::debug!(source = %self.shared.name, "kafka: read {}/{} offsets {}..={}",
                self.topic, self.partition, first.offset, last.offset);
        }
        Ok(messages)
    }

    /// Handles the bad messages of `messages` per `on_error`; with dead-letter, returns
    /// once the brokers acknowledged each (see `dead_letter`).
    fn bad_messages(&self, bad: Vec<BadMessage>, messages: &[Message]) -> Result<(), SluiceError> {
        let sent = !bad.is_empty();
        for message in bad {
            let previous = self.metrics.bad_rows.fetch_add(1, Ordering::Relaxed);
            let at = format!("{}/{}@{}", self.topic, self.partition, message.offset);
            match self.shared.on_error {
                OnError::Skip => {
                    if previous < LOGGED_BAD_ROWS {
                        tracing::warn!(source = %self.shared.name, "{at}: {}: {}", message.reason, message.text);
                    }
                }
                OnError::DeadLetter => {
                    if previous < LOGGED_BAD_ROWS {
                        tracing::warn!(source = %self.shared.name, "{at}: {}: {} (written to the dead-letter topic)",
                            message.reason, message.text);
                    }
                    self.dead_letter(&message, messages)?;
                }
                OnError::Fail => {
                    return Err(SluiceError::user(
                        "source.bad_row",
                        format!("bad message at {at} (topic/partition@offset): {}: {}", message.reason, message.text),
                    )
                    .with_fix("fix the producer, or set on_error = \"skip\" to count and skip bad messages"));
                }
            }
        }
        match &self.shared.dead_letter {
            Some(dead_letter) if sent => dead_letter.flush(),
            _ => Ok(()),
        }
    }

    /// Queues the bad message `bad` of `messages` for the dead-letter topic.
    fn dead_letter(&self, bad: &BadMessage, messages: &[Message]) -> Result<(), SluiceError> {
        let (Some(dead_letter), Ok(index)) =
            (&self.shared.dead_letter, messages.binary_search_by_key(&bad.offset, |m| m.offset))
        else {
            return Err(SluiceError::internal(
                "source.kafka",
                format!(
                    "{}/{}@{}: a bad message without its producer or message",
                    self.topic, self.partition, bad.offset
                ),
            ));
        };
        dead_letter.send(&self.topic, &messages[index], &format!("{}: {}", bad.reason, bad.text))
    }

    /// An idle lane's watermark: the lowest of the lanes that are not idle (its own
    /// when every lane is idle), never below its own.
    fn idle_watermark(&self) -> Option<TimestampMs> {
        let active = (self.metrics.lane_watermarks.iter().enumerate())
            .filter(|(lane, _)| !self.shared.idle[*lane].load(Ordering::Relaxed))
            .map(|(_, w)| w.load(Ordering::Relaxed))
            .filter(|w| *w != NO_WATERMARK)
            .min();
        match (active, self.watermark()) {
            (Some(active), Some(own)) => Some(active.max(own)),
            (active, own) => active.or(own),
        }
    }

    /// Group mode: the group granted the partition anew, from `offset`.
    fn start_grant(&mut self, offset: Option<i64>) {
        tracing::debug!(source = %self.shared.name, topic = %self.topic, partition = self.partition,
            "kafka: reading the partition from {offset:?}");
        self.next_offset = offset;
        self.last_read = LastRead::Nothing;
        self.last_record = Instant::now();
        self.set_idle(false);
    }

    /// Group mode: the partition is not this process's now. The lane is idle at once,
    /// reporting the other lanes' watermark when it has event time.
    fn ungranted(&mut self) -> LanePoll {
        self.set_idle(true);
        if self.shared.event_time.is_some() {
            let watermark = self.idle_watermark();
            if watermark.is_some() && watermark != self.watermark() {
                self.max_event_time = watermark.map(|w| w.saturating_add(self.shared.watermark_delay_ms));
                return LanePoll::Data { batches: Vec::new(), watermark };
            }
        }
        LanePoll::Wait(Instant::now() + EMPTY_POLL_WAIT)
    }

    /// Nothing to read: checks for lost brokers, then goes idle or waits.
    fn nothing_read(&mut self) -> Result<LanePoll, SluiceError> {
        let context = self.consumer.context();
        if let Some(since) = context.down_since_ms() {
            let waited = Duration::from_millis(client::now_ms().saturating_sub(since));
            if waited >= BROKER_LOST_AFTER {
                match self.consumer.fetch_metadata(Some(&self.topic), BROKER_CHECK_TIMEOUT) {
                    Ok(_) => context.mark_up(),
                    Err(_) => return Err(client::lost(&self.shared.options.brokers, waited, context.last_error())),
                }
            }
        }
        let idle_after = self.shared.options.idle_timeout;
        if self.shared.event_time.is_some() && idle_after.is_some_and(|after| self.last_record.elapsed() >= after) {
            self.set_idle(true);
            let watermark = self.idle_watermark();
            if watermark.is_some() && watermark != self.watermark() {
                self.max_event_time = watermark.map(|w| w.saturating_add(self.shared.watermark_delay_ms));
                return Ok(LanePoll::Data { batches: Vec::new(), watermark });
            }
        }
        Ok(LanePoll::Wait(Instant::now() + EMPTY_POLL_WAIT))
    }
}

impl LaneReader for KafkaLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        sluice_types::failpoint!("source.poll");
        self.blocked_since = None;
        if self.paused {
            self.set_paused(false);
        }
        if let Some(answer) = self.resumed() {
            return Ok(answer);
        }
        if let Some(group) = self.shared.group.clone() {
            match group.turn(self.lane, &mut self.seen, self.next_offset) {
                Turn::Read => {}
                Turn::Start(offset) => self.start_grant(offset),
                Turn::Idle => return Ok(self.ungranted()),
            }
        } else if let Some(Err(error)) = self.consumer.poll(Duration::ZERO) {
            // Serves the client's events (errors, logs); messages never arrive here,
            // every assigned partition having its own queue.
            tracing::debug!(source = %self.shared.name, "kafka client event: {error}");
        }
        if self.at_end() {
            self.set_idle(true);
            return Ok(LanePoll::Exhausted);
        }
        let messages = self.take_messages()?;
        if messages.is_empty() {
            return self.nothing_read();
        }
        self.consumer.context().mark_up();
        self.last_record = Instant::now();
        self.set_idle(false);
        let (batch, bad) = self.rows.build(&messages)?;
        self.bad_messages(bad, &messages)?;
        let Some(batch) = batch else {
            return Ok(LanePoll::Data { batches: Vec::new(), watermark: self.watermark() });
        };
        if let Some(column) = self.shared.event_time {
            self.max_event_time = self.max_event_time.max(max_timestamp_ms(batch.column(column)));
        }
        Ok(LanePoll::Data { batches: vec![(0, batch)], watermark: self.watermark() })
    }

    /// Also follows the lane's grant in group mode: a lane held back by its downstream
    /// reads nothing anyway, so it stops at once when revoked and the revocation waits
    /// only for the checkpoint that acknowledges what it read.
    fn blocked(&mut self) {
        let since = *self.blocked_since.get_or_insert_with(Instant::now);
        if let Some(group) = self.shared.group.clone()
            && let Turn::Start(offset) = group.turn(self.lane, &mut self.seen, self.next_offset)
        {
            self.start_grant(offset);
        }
        let granted = self.shared.group.is_none() || self.seen.owned();
        if granted && !self.paused && !self.at_end() && since.elapsed() >= PAUSE_AFTER {
            self.set_paused(true);
        }
    }

    fn position(&self) -> Vec<u8> {
        Position { next_offset: self.next_offset, watermark: self.watermark(), last_read: self.last_read }.encode()
    }

    fn resumed(&mut self) -> Option<LanePoll> {
        // Whether it had ended needs a read: its polls tell.
        let watermark = std::mem::take(&mut self.announce_watermark).then(|| self.watermark()).flatten()?;
        Some(LanePoll::Data { batches: Vec::new(), watermark: Some(watermark) })
    }
}
