//! The planned Kafka source: its lanes (one per partition of each topic), the one
//! consumer its lanes share in this process, and the offsets a bounded read ends at.
//!
//! Planning asks the brokers for the topics' partitions (bounded by
//! [`METADATA_TIMEOUT`]; an unknown broker or a missing topic fails here, with the
//! fix). The consumer is created when the first lane opens; each lane splits its
//! partition's queue off it and adds its partition to the assignment, so the lanes of
//! a thread, of several threads, or of one worker of a cluster share one client.
//!
//! # Group offsets
//!
//! With a `group_id`, the offsets of a checkpoint's positions are committed to the group
//! once that checkpoint is committed ([`SourceFactory::checkpoint_committed`]): by then
//! every sink acknowledged every row read before them (an at-least-once sink flushed
//! them at the barrier, an exactly-once sink committed them), so a run restarted from
//! the group (`start = "committed"` without a checkpoint to restore) loses no row that
//! left a stateless pipeline. (Rows an aggregate or a join still held at the checkpoint
//! are in its state, not in the sinks: only a restore from the checkpoint keeps them.)
//! The commit is asynchronous; the last one is repeated synchronously when the source is
//! dropped at the end of the run, so the group holds the final positions. Without
//! checkpoints nothing is committed.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sluice_config::{OnError, SourceConfig};
use sluice_runtime::{LaneContext, LaneReader, SourceFactory, TableDef};
use sluice_types::{Epoch, SluiceError};

use super::avro::Registry;
use super::client::{self, METADATA_TIMEOUT, SluiceClientContext, SourceConsumer};
use super::dead_letter::DeadLetter;
use super::group::Group;
use super::lane::KafkaLane;
use super::options::{Assignment, KafkaSourceOptions};
use super::position::{Layout, Position};
use super::rows::RowBuilder;
use super::shared::Shared;
use arrow::datatypes::SchemaRef;

/// A planned `connector = "kafka"` source.
pub struct KafkaSource {
    shared: Arc<Shared>,
    tables: Vec<TableDef>,
    layout: Layout,
    /// (topic, partition) of each lane.
    partitions: Vec<(String, i32)>,
    /// Bounded: the end offset of each lane, read at planning.
    ends: Option<Vec<i64>>,
}

impl KafkaSource {
    /// Plans the source: asks the brokers for the topics' partitions (and, when
    /// bounded, their end offsets); with `recorded` (a checkpoint's layout) the topics
    /// must have the partitions they had.
    pub fn new(
        config: &SourceConfig,
        options: &KafkaSourceOptions,
        schema: SchemaRef,
        recorded: Option<&[u8]>,
    ) -> Result<KafkaSource, SluiceError> {
        for topic in &options.topics {
            RowBuilder::new(Arc::clone(&schema), options.format, topic, 1)?;
        }
        let event_time = crate::file_source::event_time_index(config, &schema)?;
        let registry = match &options.schema_registry {
            Some(url) => Some(Arc::new(Registry::new(url).map_err(|reason| {
                SluiceError::user("source.avro_registry", format!("schema_registry = \"{url}\": {reason}"))
                    .with_fix("set schema_registry = \"http://host:port\" (plain http)")
            })?)),
            None => None,
        };
        let probe = client::consumer_config(&options.brokers, options.group_id.as_deref(), &options.client);
        let probe: SourceConsumer = probe
            .create_with_context(SluiceClientContext::new(&options.brokers))
            .map_err(|e| client::create_error(&options.brokers, &e))?;
        let layout = find_layout(&probe, options)?;
        let dead_letter = match (&options.dead_letter, config.on_error) {
            (Some(dead_letter), OnError::DeadLetter) => {
                Some(DeadLetter::open(&config.name, dead_letter, &options.brokers, &options.client)?)
            }
            (None, OnError::DeadLetter) => {
                return Err(SluiceError::user(
                    "source.kafka_dead_letter",
                    format!("source `{}`: on_error = \"dead-letter\" needs dead_letter_topic", config.name),
                )
                .with_fix("add dead_letter_topic = \"<topic>\" under [source.options]"));
            }
            _ => None,
        };
        if let Some(recorded) = recorded {
            Layout::decode(&config.name, recorded)?.check_resume(&config.name, &layout)?;
        }
        let partitions: Vec<(String, i32)> = (layout.topics.iter())
            .flat_map(|(topic, count)| (0..*count).map(move |p| (topic.clone(), p as i32)))
            .collect();
        let ends = match options.bounded {
            true => Some(end_offsets(&probe, &options.brokers, &partitions)?),
            false => None,
        };
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            options: options.clone(),
            schema: Arc::clone(&schema),
            event_time,
            watermark_delay_ms: crate::lanes::duration_ms(config.watermark_delay),
            max_watermark_drift_ms: config.max_watermark_drift.map(crate::lanes::duration_ms),
            on_error: config.on_error,
            registry,
            dead_letter,
            consumer: Mutex::new(None),
            idle: partitions.iter().map(|_| AtomicBool::new(false)).collect(),
            last_commit: Mutex::new(None),
            group: (options.assignment == Assignment::Group)
                .then(|| Arc::new(Group::new(&config.name, options, &partitions))),
            membership: Mutex::new(None),
            partitions: partitions.clone(),
        });
        let changelog = crate::changelog::source_changelog(config, &schema, options.format.changelog())?;
        let tables =
            vec![TableDef { name: config.name.clone(), schema, event_time: config.event_time.clone(), changelog }];
        Ok(KafkaSource { shared, tables, layout, partitions, ends })
    }

    /// (topic, partition) of each lane.
    pub fn partitions(&self) -> &[(String, i32)] {
        &self.partitions
    }
}

/// The partition count of every topic, as the brokers know them.
fn find_layout(probe: &SourceConsumer, options: &KafkaSourceOptions) -> Result<Layout, SluiceError> {
    let brokers = &options.brokers;
    let mut topics = Vec::new();
    for topic in &options.topics {
        let metadata =
            probe.fetch_metadata(Some(topic), METADATA_TIMEOUT).map_err(|e| client::unreachable(brokers, &e))?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        let Some(found) = found else {
            return Err(client::missing_topic(brokers, topic, "not in the metadata"));
        };
        if let Some(error) = found.error() {
            let code = RDKafkaErrorCode::from(error);
            return Err(client::missing_topic(brokers, topic, &code.to_string()));
        }
        if found.partitions().is_empty() {
            return Err(client::missing_topic(brokers, topic, "it has no partition"));
        }
        let count = u32::try_from(found.partitions().len()).expect("few partitions");
        topics.push((topic.clone(), count));
    }
    Ok(Layout { topics })
}

/// The end offset of every partition now.
fn end_offsets(probe: &SourceConsumer, brokers: &str, partitions: &[(String, i32)]) -> Result<Vec<i64>, SluiceError> {
    let mut ends = Vec::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        let (_, high) = probe
            .fetch_watermarks(topic, *partition, METADATA_TIMEOUT)
            .map_err(|e| client::unreachable(brokers, &e).context(format!("end offset of {topic}/{partition}")))?;
        tracing::debug!(topic = %topic, partition, high, "kafka: end offset of a bounded read");
        ends.push(high);
    }
    Ok(ends)
}

impl SourceFactory for KafkaSource {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn tables(&self) -> &[TableDef] {
        &self.tables
    }

    fn lanes(&self) -> u32 {
        u32::try_from(self.partitions.len()).unwrap_or(u32::MAX)
    }

    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError> {
        let lane = context.lane as usize;
        let (topic, partition) = self.partitions.get(lane).cloned().ok_or_else(|| {
            SluiceError::internal(
                "source.lane",
                format!("source `{}` has {} lanes, not lane {lane}", self.shared.name, self.partitions.len()),
            )
        })?;
        let end = self.ends.as_ref().map(|ends| ends[lane]);
        Ok(Box::new(KafkaLane::open(Arc::clone(&self.shared), topic, partition, end, context)?))
    }

    fn describe(&self) -> String {
        let format = match &self.tables[0].changelog {
            Some(changelog) => crate::changelog::describe(changelog, &self.tables[0].schema),
            None => self.shared.options.format.name().to_string(),
        };
        let bounded = if self.ends.is_some() { ", bounded" } else { "" };
        let group = if self.shared.group.is_some() { ", group" } else { "" };
        format!(
            "kafka(topic={}, {format}, {} partitions{bounded}{group})",
            self.shared.options.topics.join(","),
            self.partitions.len()
        )
    }

    fn max_watermark_drift(&self) -> Option<sluice_types::TimestampMs> {
        self.shared.max_watermark_drift_ms
    }

    /// Commits the checkpoint's offsets to the group (see the module docs).
    fn checkpoint_committed(&self, epoch: Epoch, positions: &[(u32, &[u8])]) {
        let Some(group) = &self.shared.options.group_id else { return };
        let Ok(Some(consumer)) = self.shared.consumer.lock().map(|c| c.clone()) else { return };
        if let Some(state) = &self.shared.group {
            let decode = |(lane, bytes): &(u32, &[u8])| match Position::decode(&self.shared.name, bytes) {
                Ok(Position { next_offset: Some(next), .. }) => Some((*lane as usize, next)),
                _ => None,
            };
            let positions: Vec<(usize, i64)> = positions.iter().filter_map(decode).collect();
            tracing::debug!(source = %self.shared.name, group = %group, epoch = epoch.0, "kafka: checkpoint committed");
            return state.checkpoint_committed(&consumer, &positions);
        }
        let mut offsets = TopicPartitionList::new();
        for (lane, bytes) in positions {
            let Some((topic, partition)) = self.partitions.get(*lane as usize) else { continue };
            let Ok(Position { next_offset: Some(next), .. }) = Position::decode(&self.shared.name, bytes) else {
                continue;
            };
            if let Err(error) = offsets.add_partition_offset(topic, *partition, Offset::Offset(next)) {
                tracing::warn!(source = %self.shared.name, "kafka: offset of {topic}/{partition}: {error}");
            }
        }
        if offsets.count() == 0 {
            return;
        }
        tracing::debug!(source = %self.shared.name, group = %group, epoch = epoch.0, "kafka: committing offsets {offsets:?}");
        if let Err(error) = consumer.commit(&offsets, CommitMode::Async) {
            tracing::warn!(source = %self.shared.name, group = %group, "kafka: committing offsets failed: {error}");
        }
        if let Ok(mut last) = self.shared.last_commit.lock() {
            *last = Some(offsets);
        }
    }

    /// The topics and their partition counts (see the `position` module).
    fn layout(&self) -> Vec<u8> {
        self.layout.encode()
    }
}
