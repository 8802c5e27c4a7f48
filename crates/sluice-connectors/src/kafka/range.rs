//! Offsets a partition no longer holds, and what a source does about them
//! (`offset_out_of_range`).
//!
//! A broker that lost its data (restarted empty, the topic deleted and recreated,
//! retention that deleted records not read yet) leaves the source's offset past the
//! partition's end or before its earliest record. Reading on from it silently skips the
//! records the partition holds below it (a recreated topic refilled past the offset) or
//! waits for offsets that come only later; Kafka's consumers answer it per
//! `auto.offset.reset` and Flink per its out-of-range handling. Here the policy is
//! [`OffsetOutOfRange`]: `fail` (the default) stops the run with
//! `source.kafka_offset_out_of_range`, naming the source, the partition, the offset,
//! where it came from and the partition's range, with the fixes; `earliest` and
//! `latest` log the same facts and read from the earliest record or the end.
//!
//! # At start
//!
//! A lane that starts from an offset it did not just get from the brokers (a restored
//! checkpoint's position, or with `start = "committed"` the group's committed offset)
//! fetches the partition's watermarks, earliest and end, and locates the offset
//! ([`needs_read`], [`decide`]):
//!
//! - below the earliest: out of range (records deleted under the source);
//! - at most the end: in range (at the end: nothing new yet);
//! - past the end of an empty partition (end = earliest): out of range;
//! - past the end of a partition that holds records: out of range on a broker whose end
//!   is exact (Kafka's end, the high watermark, is the offset after the last record a
//!   consumer can read, so a position taken from what was read never passes it). But the
//!   test broker (`tansu`) reports as the end the base offset of the partition's last
//!   batch plus one, short of the true end by the other records of that batch: a
//!   checkpoint taken after reading a batch of five records at offsets 0..=4 holds 5
//!   while the broker says 1. So the lane then reads the partition from end - 1 (on that
//!   broker the last batch's first record, whose fetch brings the whole batch; on a broker
//!   with exact ends the last record) and takes the offset after the last record of that
//!   fetch as the end ([`read_end`]). A read that brings nothing within
//!   [`METADATA_TIMEOUT`] keeps the reported end: a broker whose end is exact is right
//!   (its record at end - 1 may be a transaction marker, which consumers never see), and
//!   on the test broker the last batch holds records.
//!
//! Not taken: a tolerance (in range up to the end plus some records) would miss a topic
//! recreated with a few records fewer and still fail after a longer batch; fetching the
//! watermarks again after a wait does not help, the shortfall is in how the test broker
//! computes the end, not in when it is asked.
//!
//! # While reading
//!
//! The source's consumers set `auto.offset.reset = "error"`, so a fetch the brokers
//! answer with "offset out of range" reaches the lane as an error rather than a silent
//! jump, and the lane applies the same policy ([`after_reset_error`]), seeking to where
//! it reads next. Kafka answers so for a partition that lost the offset; the test broker
//! answers a fetch past the end with nothing, so there only the check at start applies,
//! and a broker that comes back empty while a run goes on is not noticed before the
//! partition passes the offset again. A lane that has no offset yet (group mode, when
//! the group's offsets could not be read and the client looked for them itself) takes
//! `start` instead.
//!
//! Group mode checks no offset at start: the group's committed offsets are the brokers'
//! own, and an out-of-range one is answered while reading.
//!
//! An offset that a recreated partition holds again (refilled past it before the check)
//! is, by offsets, one of a partition that grew: a checkpoint's offset in range is then
//! confirmed by reading again the last record the lane read (`last_record`).

use std::fmt;
use std::time::{Duration, Instant};

use rdkafka::Message as _;
use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_types::SluiceError;

use super::client::SourceConsumer;
use super::client::{self, METADATA_TIMEOUT, SluiceClientContext};
use super::options::{OffsetOutOfRange, StartAt};
use super::position::RecordFingerprint;
use super::shared::Shared;

/// The offsets a partition holds: `earliest..end`, as the brokers report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRange {
    /// The offset of the earliest record the partition holds.
    pub earliest: i64,
    /// The offset after its last record (the high watermark).
    pub end: i64,
}

impl PartitionRange {
    pub(crate) fn contains(&self, offset: i64) -> bool {
        (self.earliest..=self.end).contains(&offset)
    }
}

/// Where an offset that is checked came from, for the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A restored checkpoint's position of the lane.
    Checkpoint,
    /// The group's committed offset (`start = "committed"`).
    Group,
    /// The offset the lane was reading, which the brokers answered as out of range.
    Reading,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Checkpoint => "the restored checkpoint's offset",
            Origin::Group => "the group's committed offset",
            Origin::Reading => "the offset being read",
        })
    }
}

/// What a lane does with an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// In range: read from it.
    Read(i64),
    /// Out of range, and the policy resets: read from this offset instead.
    Reset(i64),
    /// Out of range, and the policy is to fail.
    Fail,
}

/// Whether `offset` is past the reported end of a partition that holds records, where a
/// broker that reports the end short (see the module docs) needs a read to tell.
pub fn needs_read(offset: i64, range: PartitionRange) -> bool {
    offset > range.end && range.end > range.earliest
}

/// What to do with `offset` in `range` (its end confirmed, see [`needs_read`]).
pub fn decide(policy: OffsetOutOfRange, offset: i64, range: PartitionRange) -> Decision {
    if range.contains(offset) {
        return Decision::Read(offset);
    }
    match policy {
        OffsetOutOfRange::Fail => Decision::Fail,
        OffsetOutOfRange::Earliest => Decision::Reset(range.earliest),
        OffsetOutOfRange::Latest => Decision::Reset(range.end),
    }
}

/// The error of `offset` (from `origin`) outside `range` of `topic`/`partition`.
pub fn out_of_range(
    source: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    origin: Origin,
    range: PartitionRange,
) -> SluiceError {
    SluiceError::user(
        "source.kafka_offset_out_of_range",
        format!("source `{source}`: {}", describe(topic, partition, offset, origin, range)),
    )
    .with_fix(OUT_OF_RANGE_FIX)
}

/// The fix of a partition that lost records the source has not read, or has.
pub(crate) const OUT_OF_RANGE_FIX: &str = "if those records are gone for good, set offset_out_of_range = \"earliest\" \
     (read what the partition holds now) or \"latest\" (only records produced from now on) under [source.options], \
     or start over with --from-scratch; if `brokers` names the wrong cluster, correct it";

/// The facts of an offset out of range, for the error and the warning of a reset.
fn describe(topic: &str, partition: i32, offset: i64, origin: Origin, range: PartitionRange) -> String {
    let (side, why) = match offset < range.earliest {
        true => ("before the earliest record of", "retention or a deletion removed records not read yet"),
        false => ("past the end of", "the topic was deleted and recreated, or the brokers lost their data"),
    };
    format!(
        "{origin} {offset} is {side} {topic}/{partition} (topic/partition), which holds offsets {}..{} (earliest {}, \
         end {}): {why}, and reading on from it would skip or wait for records without telling",
        range.earliest, range.end, range.earliest, range.end
    )
}

/// The lane's fetch at `next` (`None`: no offset yet) was answered "out of range": the
/// offset to seek to, per the policy (or per `start` without an offset).
pub(crate) fn after_reset_error(
    shared: &Shared,
    consumer: &SourceConsumer,
    topic: &str,
    partition: i32,
    next: Option<i64>,
) -> Result<Offset, SluiceError> {
    let brokers = &shared.options.brokers;
    let Some(next) = next else {
        let start = match shared.options.start {
            StartAt::Committed => StartAt::Earliest,
            other => other,
        };
        return super::offsets::start_offset(consumer, &start, topic, partition, brokers);
    };
    // In range again only if the partition grew meanwhile: then reading on is right.
    let range = watermarks(consumer, brokers, topic, partition)?;
    apply(shared, topic, partition, next, Origin::Reading, range).map(Offset::Offset)
}

/// Applies the policy to `offset` in `range`, logging a reset.
pub(crate) fn apply(
    shared: &Shared,
    topic: &str,
    partition: i32,
    offset: i64,
    origin: Origin,
    range: PartitionRange,
) -> Result<i64, SluiceError> {
    match decide(shared.options.offset_out_of_range, offset, range) {
        Decision::Read(offset) => Ok(offset),
        Decision::Reset(to) => {
            let policy = match shared.options.offset_out_of_range {
                OffsetOutOfRange::Earliest => "earliest",
                OffsetOutOfRange::Latest => "latest",
                OffsetOutOfRange::Fail => "fail",
            };
            tracing::warn!(source = %shared.name, "kafka: {}; offset_out_of_range = \"{policy}\": reading from offset {to}",
                describe(topic, partition, offset, origin, range));
            Ok(to)
        }
        Decision::Fail => Err(out_of_range(&shared.name, topic, partition, offset, origin, range)),
    }
}

pub(crate) fn watermarks(
    consumer: &SourceConsumer,
    brokers: &str,
    topic: &str,
    partition: i32,
) -> Result<PartitionRange, SluiceError> {
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
        .map_err(|e| client::unreachable(brokers, &e).context(format!("the offsets of {topic}/{partition}")))?;
    Ok(PartitionRange { earliest: low.max(0), end: high.max(low.max(0)) })
}

/// The offset after the last record of the first fetch of `topic`/`partition` from
/// `from`; `None` when nothing came (see [`fetch_from`]).
pub(crate) fn read_end(shared: &Shared, topic: &str, partition: i32, from: i64) -> Result<Option<i64>, SluiceError> {
    Ok(match fetch_from(shared, topic, partition, from)? {
        Fetched::Records { last_offset, .. } => Some(last_offset + 1),
        // Out of range, or no answer: the reported end stands.
        Fetched::OutOfRange | Fetched::Nothing => None,
    })
}

/// What the first fetch of a partition from an offset brought.
pub(crate) enum Fetched {
    /// Its first record (at or after the offset) and the offset of its last.
    Records { first: RecordFingerprint, last_offset: i64 },
    /// The brokers answered the offset as out of range.
    OutOfRange,
    /// Nothing within [`METADATA_TIMEOUT`].
    Nothing,
}

/// The first fetch of `topic`/`partition` from `from`, through a consumer of its own.
/// librdkafka hands a fetch's records to the queue at once (and none below `from`), so
/// once the first one arrived the rest of its batch is there too.
pub(crate) fn fetch_from(shared: &Shared, topic: &str, partition: i32, from: i64) -> Result<Fetched, SluiceError> {
    let options = &shared.options;
    let config = client::consumer_config(&options.brokers, None, &options.client);
    let consumer: SourceConsumer = config
        .create_with_context(SluiceClientContext::new(&options.brokers))
        .map_err(|e| client::create_error(&options.brokers, &e))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .map_err(|e| SluiceError::internal("source.kafka", format!("{topic}/{partition}: {e}")))?;
    consumer
        .assign(&assignment)
        .map_err(|e| client::unreachable(&options.brokers, &e).context(format!("reading {topic}/{partition}")))?;
    let deadline = Instant::now() + METADATA_TIMEOUT;
    let first = loop {
        if Instant::now() >= deadline {
            return Ok(Fetched::Nothing);
        }
        match consumer.poll(READ_POLL) {
            Some(Ok(message)) => {
                let fingerprint = |m: &rdkafka::message::BorrowedMessage<'_>| {
                    RecordFingerprint::of(m.offset(), m.timestamp().to_millis(), m.key(), m.payload())
                };
                break fingerprint(&message);
            }
            Some(Err(error)) if super::offsets::is_out_of_range(&error) => return Ok(Fetched::OutOfRange),
            // No answer yet, or an error the client retries.
            Some(Err(_)) | None => {}
        }
    };
    let mut last_offset = first.offset;
    while let Some(Ok(message)) = consumer.poll(Duration::ZERO) {
        last_offset = last_offset.max(message.offset());
    }
    Ok(Fetched::Records { first, last_offset })
}

/// How long [`fetch_from`] waits per poll.
const READ_POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    /// `offset` in `range` under each policy, and whether the end needs a read.
    fn check(offset: i64, (earliest, end): (i64, i64), read: bool, expected: [Decision; 3]) {
        let range = PartitionRange { earliest, end };
        assert_eq!(needs_read(offset, range), read, "needs_read({offset}, {range:?})");
        let policies = [OffsetOutOfRange::Fail, OffsetOutOfRange::Earliest, OffsetOutOfRange::Latest];
        for (policy, expected) in policies.into_iter().zip(expected) {
            assert_eq!(decide(policy, offset, range), expected, "{policy:?}, {offset} in {range:?}");
        }
    }

    #[test]
    fn offsets_in_range_are_read_whatever_the_policy() {
        use Decision::Read;
        check(0, (0, 0), false, [Read(0); 3]);
        check(4, (0, 10), false, [Read(4); 3]);
        check(10, (0, 10), false, [Read(10); 3]);
        check(3, (3, 10), false, [Read(3); 3]);
    }

    #[test]
    fn an_offset_past_the_end_fails_or_resets() {
        use Decision::{Fail, Reset};
        // The finding: offset 4000 checkpointed, the topic recreated with 1000 records.
        check(4000, (0, 1000), true, [Fail, Reset(0), Reset(1000)]);
        // An empty partition has no batch whose end could be reported short.
        check(4000, (0, 0), false, [Fail, Reset(0), Reset(0)]);
        check(1, (0, 0), false, [Fail, Reset(0), Reset(0)]);
        check(12, (5, 5), false, [Fail, Reset(5), Reset(5)]);
    }

    #[test]
    fn an_offset_before_the_earliest_record_fails_or_resets() {
        use Decision::{Fail, Reset};
        check(2, (5, 9), false, [Fail, Reset(5), Reset(9)]);
        check(0, (1, 1), false, [Fail, Reset(1), Reset(1)]);
    }

    /// The test broker's end is the last batch's base offset plus one: after a batch of
    /// five records 0..=4 it reports 1, and a checkpoint holds 5. The read of the last
    /// batch gives the true end, and the offset is in range.
    #[test]
    fn an_end_reported_short_by_a_batch_is_confirmed_by_a_read() {
        let reported = PartitionRange { earliest: 0, end: 1 };
        assert!(needs_read(5, reported));
        let read = PartitionRange { end: 5, ..reported };
        assert_eq!(decide(OffsetOutOfRange::Fail, 5, read), Decision::Read(5));
        assert_eq!(decide(OffsetOutOfRange::Fail, 6, read), Decision::Fail);
    }

    #[test]
    fn the_error_names_the_partition_the_offset_its_origin_the_range_and_the_fix() {
        let range = PartitionRange { earliest: 0, end: 1000 };
        let error = out_of_range("bids", "orders", 3, 4000, Origin::Checkpoint, range);
        assert_eq!(error.code, "source.kafka_offset_out_of_range");
        for needle in ["source `bids`", "checkpoint", "4000", "orders/3", "0..1000", "earliest 0", "end 1000", "past"] {
            assert!(error.message.contains(needle), "{needle} in {}", error.message);
        }
        let fix = error.fix.expect("a fix");
        assert!(fix.contains("offset_out_of_range = \"earliest\"") && fix.contains("--from-scratch"), "{fix}");
        let error = out_of_range("bids", "orders", 3, 2, Origin::Group, PartitionRange { earliest: 5, end: 9 });
        assert!(error.message.contains("before the earliest record") && error.message.contains("group"), "{error:?}");
    }
}
