//! The last record a lane read, and whether a resumed partition still holds it.
//!
//! A broker that came back empty, its topic recreated and refilled past a checkpoint's
//! offset, leaves an offset that is in range ([`range`](super::range)): by offsets
//! alone, a partition that grew. Reading on from it silently skips every record of the
//! new partition below the offset. So a lane's position also records the last data
//! record it handed out ([`RecordFingerprint`]: its offset, timestamp and the XXH3-64
//! of its key and value, see [`position`](super::position)), and a lane resumed from a
//! checkpoint whose offset is in range reads that record again before it starts
//! ([`confirm`]):
//!
//! - the same timestamp and hash: the partition is the one the lane read; read on;
//! - another record at that offset, or none (the first record the fetch brings comes
//!   after it, or the brokers answer the offset as out of range): the partition lost
//!   what the lane read, and `offset_out_of_range` decides, as for an offset out of
//!   range: `fail` (the default) stops the run naming the partition, the offset, the
//!   record expected and the one found, with the fixes; `earliest` and `latest` log the
//!   same facts and read from the partition's earliest record or its end;
//! - none, on a topic whose `cleanup.policy` includes `compact`: compaction removes a
//!   record once a later one has its key, so a record gone is no sign of a lost
//!   partition; read on, logged. (Compaction never changes a record it keeps, so a record
//!   that differs is a lost partition on any topic.) The policy is asked of the brokers
//!   only then, so topics that are not compacted never need the admin request.
//!
//! Checked without a read: a position of version 1 (written before the last record was
//! recorded: resumed unconfirmed, logged), a lane that handed out no record since its
//! offset was resolved (nothing to confirm), and a last record below the partition's
//! earliest offset (retention removed it after it was read: the records after it are
//! what the lane reads next, so they cannot be confirmed either, logged).
//!
//! The last record, not the one before the next offset: that one may be a transaction's
//! marker (or, under compaction, gone), which consumers never see. The read is one fetch
//! through a consumer of its own, bounded by `METADATA_TIMEOUT`; a fetch that brings
//! nothing in that time fails the start with `source.kafka_resume_unconfirmed` (retry
//! helps) rather than reading on unconfirmed.
//!
//! Not covered: a recreated partition whose record at that offset has the same
//! timestamp, key and value (a producer that replays the same records with their
//! timestamps rebuilds the partition the lane read, and reading on is then right);
//! group mode, whose offsets are the brokers' own and are not checked at start.

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use sluice_types::SluiceError;

use super::client::{self, METADATA_TIMEOUT, SourceConsumer};
use super::options::OffsetOutOfRange;
use super::position::{LastRead, RecordFingerprint};
use super::range::{self, Fetched, Origin, PartitionRange};
use super::shared::Shared;

/// Checks `offset` of `topic`/`partition` (from `origin`) before a lane starts from it:
/// the offset to read from, per the source's policy. An offset in range is then
/// confirmed by `last`, the last record read before it (see `last_record`).
pub(crate) fn check_start(
    shared: &Shared,
    consumer: &SourceConsumer,
    topic: &str,
    partition: i32,
    offset: i64,
    origin: Origin,
    last: LastRead,
) -> Result<i64, SluiceError> {
    let brokers = &shared.options.brokers;
    let mut range = range::watermarks(consumer, brokers, topic, partition)?;
    if range::needs_read(offset, range) {
        let end = range::read_end(shared, topic, partition, range.end - 1)?;
        tracing::debug!(source = %shared.name, topic, partition, offset, reported = range.end, read = ?end,
            "kafka: an offset past the reported end, checked by reading the last batch");
        range.end = range.end.max(end.unwrap_or(range.end));
    }
    if !range.contains(offset) {
        return range::apply(shared, topic, partition, offset, origin, range);
    }
    confirm(shared, topic, partition, offset, last, range)
}

/// What a resumed lane does before reading from an offset in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read this record again and compare.
    Confirm(RecordFingerprint),
    /// Nothing can be confirmed, for this reason.
    Skip(Unconfirmed),
}

/// Why a resumed lane reads on without confirming its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unconfirmed {
    /// A version 1 position.
    Unrecorded,
    /// No record read since the offset was resolved.
    Nothing,
    /// The last record is below the partition's earliest offset (retention).
    BeforeEarliest,
    /// The last record is gone from a compacted topic.
    Compacted,
}

/// What the record read again says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The partition holds the record the lane read: read on.
    Same,
    /// It does not: the policy decides. `found` is the first record at or after the
    /// expected one's offset, if any.
    Lost { expected: RecordFingerprint, found: Option<RecordFingerprint> },
    /// The record is gone, as compaction may remove it: read on.
    Skip(Unconfirmed),
}

/// Whether `last` needs a read to be confirmed in `range`.
pub fn step(last: LastRead, range: PartitionRange) -> Step {
    match last {
        LastRead::Unrecorded => Step::Skip(Unconfirmed::Unrecorded),
        LastRead::Nothing => Step::Skip(Unconfirmed::Nothing),
        LastRead::Record(record) if record.offset < range.earliest => Step::Skip(Unconfirmed::BeforeEarliest),
        LastRead::Record(record) => Step::Confirm(record),
    }
}

/// Compares `expected` with `found`, the first record a fetch from its offset brought
/// (`None`: out of range); `compacted` tells whether the topic is compacted, asked only
/// when the record is gone.
pub fn judge(
    expected: RecordFingerprint,
    found: Option<RecordFingerprint>,
    compacted: impl FnOnce() -> Result<bool, SluiceError>,
) -> Result<Verdict, SluiceError> {
    let lost = Verdict::Lost { expected, found };
    match found {
        Some(found) if found.offset == expected.offset => Ok(if found == expected { Verdict::Same } else { lost }),
        // A fetch never brings records below the offset asked for.
        Some(found) if found.offset < expected.offset => Err(SluiceError::internal(
            "source.kafka",
            format!("a fetch from offset {} brought offset {}", expected.offset, found.offset),
        )),
        _ if compacted()? => Ok(Verdict::Skip(Unconfirmed::Compacted)),
        _ => Ok(lost),
    }
}

/// Where a lane resumed at `offset` (in `range`) of `topic`/`partition` reads from, once
/// the partition is confirmed to hold `last` (see the module docs).
pub(crate) fn confirm(
    shared: &Shared,
    topic: &str,
    partition: i32,
    offset: i64,
    last: LastRead,
    range: PartitionRange,
) -> Result<i64, SluiceError> {
    let verdict = match step(last, range) {
        Step::Skip(why) => Verdict::Skip(why),
        Step::Confirm(expected) => {
            let found = match range::fetch_from(shared, topic, partition, expected.offset)? {
                Fetched::Records { first, .. } => Some(first),
                Fetched::OutOfRange => None,
                Fetched::Nothing => return Err(unconfirmed(&shared.name, topic, partition, expected)),
            };
            judge(expected, found, || compacted(shared, topic))?
        }
    };
    let name = &shared.name;
    match verdict {
        Verdict::Same => {
            tracing::debug!(source = %name, topic, partition, offset, "kafka: the partition holds the last record read");
            Ok(offset)
        }
        Verdict::Skip(why) => {
            let why = match why {
                Unconfirmed::Nothing => return Ok(offset),
                Unconfirmed::Unrecorded => "the checkpoint predates the record of the last record read",
                Unconfirmed::BeforeEarliest => "retention removed the last record read",
                Unconfirmed::Compacted => "the last record read is gone from the compacted topic",
            };
            tracing::info!(source = %name, "kafka: {topic}/{partition} resumes from offset {offset} unconfirmed: {why}");
            Ok(offset)
        }
        Verdict::Lost { expected, found } => match shared.options.offset_out_of_range {
            OffsetOutOfRange::Fail => Err(lost(name, topic, partition, offset, expected, found)),
            policy => {
                let (to, name_of) = match policy {
                    OffsetOutOfRange::Latest => (range.end, "latest"),
                    _ => (range.earliest, "earliest"),
                };
                tracing::warn!(source = %name, "kafka: {}; offset_out_of_range = \"{name_of}\": reading from offset {to}",
                    describe(topic, partition, offset, expected, found));
                Ok(to)
            }
        },
    }
}

/// The error of a partition that lost the records a lane read before `offset`.
pub fn lost(
    source: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    expected: RecordFingerprint,
    found: Option<RecordFingerprint>,
) -> SluiceError {
    SluiceError::user(
        "source.kafka_offset_out_of_range",
        format!("source `{source}`: {}", describe(topic, partition, offset, expected, found)),
    )
    .with_fix(range::OUT_OF_RANGE_FIX)
}

fn describe(
    topic: &str,
    partition: i32,
    offset: i64,
    expected: RecordFingerprint,
    found: Option<RecordFingerprint>,
) -> String {
    let found = match found {
        Some(found) if found.offset == expected.offset => format!("holds another record there ({found})"),
        Some(found) => format!("holds no record there (the next is at offset {})", found.offset),
        None => "holds no record there".to_owned(),
    };
    format!(
        "{} {offset} is in range of {topic}/{partition} (topic/partition), but the partition no longer holds the \
         records read before it: the last one read was at {expected}, and the partition {found}: the topic was \
         deleted and recreated, or the brokers lost their data, and reading on from it would skip the records \
         before it without telling",
        Origin::Checkpoint
    )
}

fn unconfirmed(source: &str, topic: &str, partition: i32, expected: RecordFingerprint) -> SluiceError {
    SluiceError::external(
        "source.kafka_resume_unconfirmed",
        format!(
            "source `{source}`: reading {topic}/{partition} (topic/partition) at offset {} brought nothing within \
             {}s, so the partition could not be confirmed to hold the records read before the checkpoint",
            expected.offset,
            METADATA_TIMEOUT.as_secs()
        ),
    )
    .with_fix("check that the brokers answer and restart; the check reads one record")
}

/// Whether `topic`'s `cleanup.policy` includes `compact`, asked of the brokers.
fn compacted(shared: &Shared, topic: &str) -> Result<bool, SluiceError> {
    let brokers = &shared.options.brokers;
    let config = client::base_config(brokers, &shared.options.client);
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(|e| client::create_error(brokers, &e))?;
    let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
    let asked = format!("the cleanup.policy of topic {topic}");
    let answers = futures::executor::block_on(admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &options))
        .map_err(|e| client::unreachable(brokers, &e).context(asked.clone()))?;
    let resource = answers.into_iter().next().and_then(Result::ok).ok_or_else(|| {
        SluiceError::external("kafka.describe_configs", format!("the brokers {brokers} did not answer {asked}"))
            .with_fix("check that the brokers answer DescribeConfigs and restart")
    })?;
    let policy = resource.get("cleanup.policy").and_then(|entry| entry.value.clone()).unwrap_or_default();
    Ok(policy.split(',').any(|part| part.trim() == "compact"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: PartitionRange = PartitionRange { earliest: 0, end: 20_000 };

    fn record(offset: i64, timestamp_ms: Option<i64>, value: &str) -> RecordFingerprint {
        RecordFingerprint::of(offset, timestamp_ms, None, Some(value.as_bytes()))
    }

    /// Whether the partition `range` whose first record at or after the last one read
    /// is `found` holds what the lane read (`last`), the topic compacted or not; `None`
    /// when no read is needed (then `found` is not looked at).
    fn check(
        last: LastRead,
        range: PartitionRange,
        found: Option<RecordFingerprint>,
        compacted: bool,
        expected: Verdict,
    ) {
        let verdict = match step(last, range) {
            Step::Skip(why) => Verdict::Skip(why),
            Step::Confirm(record) => judge(record, found, || Ok(compacted)).expect("judged"),
        };
        assert_eq!(verdict, expected, "{last:?} in {range:?}, found {found:?}, compacted {compacted}");
    }

    #[test]
    fn the_same_record_reads_on_compacted_or_not() {
        let read = record(3_999, Some(1_000), "{\"price\":7}");
        for compacted in [false, true] {
            check(LastRead::Record(read), RANGE, Some(read), compacted, Verdict::Same);
        }
    }

    /// The finding: offsets 0..=3,999 read, the topic recreated and refilled with
    /// 20,000 records; offset 3,999 holds another record now.
    #[test]
    fn another_record_at_the_offset_is_a_lost_partition_even_when_compacted() {
        let read = record(3_999, Some(1_000), "{\"price\":7}");
        let lost = |found: RecordFingerprint| Verdict::Lost { expected: read, found: Some(found) };
        for compacted in [false, true] {
            let other_value = record(3_999, Some(1_000), "{\"price\":8}");
            check(LastRead::Record(read), RANGE, Some(other_value), compacted, lost(other_value));
            let other_time = record(3_999, Some(1_001), "{\"price\":7}");
            check(LastRead::Record(read), RANGE, Some(other_time), compacted, lost(other_time));
            let no_time = record(3_999, None, "{\"price\":7}");
            check(LastRead::Record(read), RANGE, Some(no_time), compacted, lost(no_time));
        }
    }

    #[test]
    fn a_missing_record_is_a_lost_partition_unless_the_topic_is_compacted() {
        let read = record(3_999, Some(1_000), "a");
        let next = record(4_002, Some(1_000), "b");
        let lost = |found| Verdict::Lost { expected: read, found };
        check(LastRead::Record(read), RANGE, Some(next), false, lost(Some(next)));
        check(LastRead::Record(read), RANGE, None, false, lost(None));
        let compacted = Verdict::Skip(Unconfirmed::Compacted);
        check(LastRead::Record(read), RANGE, Some(next), true, compacted);
        check(LastRead::Record(read), RANGE, None, true, compacted);
    }

    #[test]
    fn nothing_to_confirm_reads_on_without_a_read() {
        let skip = |why| Verdict::Skip(why);
        let found = Some(record(5, None, "x"));
        // An old checkpoint, a lane that read nothing, a record retention removed.
        check(LastRead::Unrecorded, RANGE, found, false, skip(Unconfirmed::Unrecorded));
        check(LastRead::Nothing, RANGE, found, false, skip(Unconfirmed::Nothing));
        let retained = PartitionRange { earliest: 4_000, end: 9_000 };
        check(LastRead::Record(record(3_999, None, "a")), retained, found, false, skip(Unconfirmed::BeforeEarliest));
        let at_earliest = record(4_000, None, "a");
        check(LastRead::Record(at_earliest), retained, Some(at_earliest), false, Verdict::Same);
    }

    #[test]
    fn the_compaction_policy_is_asked_only_for_a_missing_record() {
        let read = record(7, Some(1), "a");
        let asked = |_| -> Result<bool, SluiceError> { panic!("cleanup.policy asked") };
        assert_eq!(judge(read, Some(read), || asked(())).expect("judged"), Verdict::Same);
        let other = record(7, Some(2), "a");
        assert!(matches!(judge(read, Some(other), || asked(())), Ok(Verdict::Lost { .. })));
        let failed = judge(read, None, || Err(SluiceError::external("kafka.unreachable", "down")));
        assert_eq!(failed.expect_err("the question failed").code, "kafka.unreachable");
    }

    /// The hash is XXH3-64 of a fixed encoding: pinned, as positions in checkpoints
    /// carry it. A key and value never hash as another split of their bytes.
    #[test]
    fn fingerprints_are_pinned_and_tell_key_from_value() {
        let hash = |key: Option<&[u8]>, value: Option<&[u8]>| RecordFingerprint::of(0, None, key, value).hash;
        let empty = [1u8, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(hash(Some(b""), Some(b"")), twox_hash::XxHash3_64::oneshot(&empty));
        assert_eq!(hash(None, None), twox_hash::XxHash3_64::oneshot(&[0, 0]));
        assert_eq!(hash(Some(b"k"), Some(b"v")), 0x222f_7e8a_b514_82d0);
        assert_ne!(hash(Some(b"ab"), Some(b"c")), hash(Some(b"a"), Some(b"bc")));
        assert_ne!(hash(None, Some(b"v")), hash(Some(b"v"), None));
        assert_ne!(hash(None, Some(b"")), hash(None, None));
    }

    #[test]
    fn the_error_names_the_partition_the_offset_the_records_and_the_fix() {
        let expected = RecordFingerprint { offset: 3_999, timestamp_ms: Some(1_000), hash: 0xab };
        let found = RecordFingerprint { offset: 3_999, timestamp_ms: Some(2_000), hash: 0xcd };
        let error = lost("bids", "orders", 3, 4_000, expected, Some(found));
        assert_eq!(error.code, "source.kafka_offset_out_of_range");
        for needle in [
            "source `bids`",
            "checkpoint's offset 4000",
            "orders/3",
            "offset 3999, timestamp 1000 ms, hash 00000000000000ab",
            "another record there (offset 3999, timestamp 2000 ms, hash 00000000000000cd)",
            "recreated",
        ] {
            assert!(error.message.contains(needle), "{needle} in {}", error.message);
        }
        let fix = error.fix.expect("a fix");
        assert!(fix.contains("offset_out_of_range = \"earliest\"") && fix.contains("--from-scratch"), "{fix}");
        let next = RecordFingerprint { offset: 4_010, ..found };
        let error = lost("bids", "orders", 3, 4_000, expected, Some(next));
        assert!(error.message.contains("no record there (the next is at offset 4010)"), "{}", error.message);
        let error = lost("bids", "orders", 3, 4_000, expected, None);
        assert!(error.message.contains("holds no record there"), "{}", error.message);
    }
}
