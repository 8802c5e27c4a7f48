//! Where a lane starts: the offset a fresh lane starts at per `start`, and whether a
//! consumer error says an offset is out of range (see `range` for the policy).

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_types::SluiceError;

use super::client::{self, METADATA_TIMEOUT, SourceConsumer};
use super::options::StartAt;

/// Whether a consumer error says the lane's offset is out of range: librdkafka's answer
/// under `auto.offset.reset = "error"` (see `range`), or the brokers' own code.
pub(crate) fn is_out_of_range(error: &KafkaError) -> bool {
    matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange))
}

/// The offset a fresh lane starts at, per `start`.
pub(crate) fn start_offset(
    consumer: &SourceConsumer,
    start: &StartAt,
    topic: &str,
    partition: i32,
    brokers: &str,
) -> Result<Offset, SluiceError> {
    let mut list = TopicPartitionList::new();
    let at = |e: &rdkafka::error::KafkaError| client::unreachable(brokers, e).context(format!("{topic}/{partition}"));
    match start {
        StartAt::Earliest => {
            let (low, _) = consumer.fetch_watermarks(topic, partition, METADATA_TIMEOUT).map_err(|e| at(&e))?;
            Ok(Offset::Offset(low.max(0)))
        }
        StartAt::Latest => Ok(Offset::End),
        StartAt::Committed => {
            list.add_partition(topic, partition);
            let committed = consumer.committed_offsets(list, METADATA_TIMEOUT).map_err(|e| at(&e))?;
            match committed.find_partition(topic, partition).map(|p| p.offset()) {
                Some(Offset::Offset(offset)) if offset >= 0 => Ok(Offset::Offset(offset)),
                _ => Ok(Offset::Beginning),
            }
        }
        StartAt::Timestamp(ms) => {
            list.add_partition_offset(topic, partition, Offset::Offset(*ms)).map_err(|e| at(&e))?;
            let found = consumer.offsets_for_times(list, METADATA_TIMEOUT).map_err(|e| at(&e))?;
            match found.find_partition(topic, partition).map(|p| p.offset()) {
                Some(Offset::Offset(offset)) if offset >= 0 => Ok(Offset::Offset(offset)),
                _ => Ok(Offset::End),
            }
        }
    }
}
