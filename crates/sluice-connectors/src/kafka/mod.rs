//! The Kafka source and sink (`connector = "kafka"`), over librdkafka.
//!
//! - [`source`] and [`lane`]: one lane per partition of each topic (the runtime spreads
//!   lanes over threads and, in a cluster, over workers by its placement function);
//!   positions are next offsets, stored in checkpoints ([`position`]) and sought on
//!   restore; bounded reads; per-partition watermarks with `idle_timeout`.
//! - [`range`]: an offset a partition no longer holds (the topic recreated, the brokers'
//!   data lost): detected at start and while reading, failing or reset per
//!   `offset_out_of_range`; [`last_record`]: a checkpoint's offset that a recreated
//!   partition holds again, detected by reading again the last record the lane read.
//! - [`group`]: group mode (`assignment = "group"`): the consumer subscribes as a member
//!   of `group_id`, a lane reads only while the group assigns its partition here, and a
//!   revocation waits (bounded) for what the lane read to be acknowledged by a checkpoint
//!   before committing it and letting the partition go.
//! - [`rows`]: messages into rows of the declared schema, with the metadata columns
//!   `_topic`, `_partition`, `_offset`, `_timestamp`, `_key`, `_headers`; [`avro`]: the
//!   `avro` and `avro-confluent` values (the schema derived from the columns, the
//!   registry client, schema resolution), and `avro_debezium.rs` (`debezium-avro-confluent`:
//!   Debezium envelopes in Avro); the changelog formats `debezium-json` and `upsert` in
//!   [`rows`].
//! - [`sink`]: one message per row (Flink's changelog for an updating stream) or, in
//!   upsert mode, keyed upserts and tombstones, with headers from options or a column;
//!   at-least-once through the idempotent producer, exactly-once through Kafka
//!   transactions, each epoch's messages kept in its checkpoint ([`record`]) to be
//!   written again at recovery when the transaction never committed.
//! - [`delivery`]: a sink producer's delivery reports: rows out count what the brokers
//!   acknowledged, and brokers silent for `delivery_timeout` fail the run naming them.
//! - [`dead_letter`]: `on_error = "dead-letter"`: each bad message, as read and with its
//!   error, written to a topic before the lane hands out anything after it.
//! - [`client`]: the clients' settings (and why a partition not polled holds bounded
//!   memory), logs and errors.
//! - [`options`]: what a pipeline file may say, validated without I/O.

pub mod avro;
mod avro_direct;
pub mod client;
pub mod dead_letter;
pub mod delivery;
pub mod group;
pub mod lane;
pub mod last_record;
pub mod offsets;
pub mod options;
pub mod position;
pub mod range;
pub mod record;
pub mod rows;
pub mod shared;
pub mod sink;
pub mod source;

#[cfg(test)]
mod avro_debezium_tests;
#[cfg(test)]
mod avro_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use sluice_config::{ConfigError, SinkConfig, SourceConfig};
use sluice_runtime::{SinkFactory, SourceFactory};
use sluice_types::SluiceError;

use crate::connector::{
    ConfiguredSink, ConfiguredSource, OptionDoc, SinkConnector, SinkContext, SourceConnector, SourceContext,
};
pub use options::{
    Assignment, KafkaFormat, KafkaSinkMode, KafkaSinkOptions, KafkaSourceOptions, OffsetOutOfRange, StartAt,
    sink_options_of, source_options_of,
};
pub use sink::KafkaSink;
pub use source::KafkaSource;

/// The `kafka` source connector.
#[derive(Debug, Clone, Copy)]
pub struct KafkaSourceConnector;

impl SourceConnector for KafkaSourceConnector {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn options(&self) -> &'static [OptionDoc] {
        options::SOURCE_OPTIONS
    }

    /// Bad messages go to `dead_letter_topic` (see `dead_letter`).
    fn dead_letter(&self) -> bool {
        true
    }

    fn configure(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredKafkaSource { table: config.name.clone(), options: source_options_of(config)? }))
    }
}

/// A validated Kafka source.
#[derive(Debug, Clone)]
pub struct ConfiguredKafkaSource {
    pub table: String,
    pub options: KafkaSourceOptions,
}

impl ConfiguredSource for ConfiguredKafkaSource {
    fn tables(&self) -> Vec<String> {
        vec![self.table.clone()]
    }

    fn reads_declared_schema(&self) -> bool {
        true
    }

    fn build(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError> {
        let schema = context.schema.clone().ok_or_else(|| {
            SluiceError::user("source.schema_missing", "a kafka source needs a `schema`")
                .with_fix("add `schema = \"col TYPE, ...\"` to the [[source]]")
        })?;
        check_group_mode(&self.options, context)?;
        Ok(Arc::new(KafkaSource::new(context.config, &self.options, schema, context.layout.as_deref())?))
    }
}

/// Refuses what group mode cannot do: exactly-once, whose truth is the positions in the
/// checkpoint (a restore seeks every partition to its recorded offset, while the group
/// may have given those partitions to another member meanwhile), and a cluster, whose
/// workers open only the lanes placed on them (a partition the group gives a worker that
/// has not its lane would never be read). The caller names the source.
pub(crate) fn check_group_mode(options: &KafkaSourceOptions, context: &SourceContext<'_>) -> Result<(), SluiceError> {
    if options.assignment != Assignment::Group {
        return Ok(());
    }
    if context.exactly_once {
        return Err(SluiceError::user(
            "source.kafka_group_exactly_once",
            "assignment = \"group\" cannot be exactly-once: exactly-once resumes every partition from the \
             checkpoint's offsets, but in group mode the group decides who reads a partition and from which offset",
        )
        .with_fix(
            "set guarantee = \"at-least-once\" under [checkpoint], or assignment = \"manual\" (the default) to \
             read every partition in this pipeline",
        ));
    }
    if context.workers > 1 {
        return Err(SluiceError::user(
            "source.kafka_group_cluster",
            format!(
                "assignment = \"group\" runs in one process, not a cluster of {} workers: each \
                 worker opens only the lanes placed on it, so a partition the group gives a worker without its lane \
                 would never be read",
                context.workers
            ),
        )
        .with_fix(
            "run each pipeline as a single process (scale by starting more pipelines with the same group_id), or \
             set assignment = \"manual\"",
        ));
    }
    Ok(())
}

/// The `kafka` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct KafkaSinkConnector;

impl SinkConnector for KafkaSinkConnector {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn options(&self) -> &'static [OptionDoc] {
        options::SINK_OPTIONS
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredKafkaSink { options: sink_options_of(config)? }))
    }
}

/// A validated Kafka sink.
#[derive(Debug, Clone)]
pub struct ConfiguredKafkaSink {
    pub options: KafkaSinkOptions,
}

impl ConfiguredSink for ConfiguredKafkaSink {
    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        let sink = KafkaSink::new(
            context.pipeline,
            &context.config.name,
            &self.options,
            &context.schema,
            context.updating,
            context.upsert_key.as_deref(),
        )?
        .with_exactly_once(context.exactly_once)
        .with_checkpoint_span(context.checkpoint_span)?;
        Ok(Arc::new(sink))
    }
}
