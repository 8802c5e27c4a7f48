//! Kafka messages into rows of the declared schema: the value decoded by
//! `sluice-formats` (JSON, CSV), by `avro.rs` (one Avro datum per message) or taken as
//! text (raw), the metadata columns filled from the message.
//!
//! # Metadata columns
//!
//! A declared column with one of these names is filled from the message, not from its
//! value, and must have exactly this type:
//!
//! | column | type | value |
//! |---|---|---|
//! | `_topic` | VARCHAR | the topic |
//! | `_partition` | INT | the partition |
//! | `_offset` | BIGINT | the offset in the partition |
//! | `_timestamp` | TIMESTAMP(3) | the record's timestamp (NULL when it has none) |
//! | `_key` | VARCHAR | the key as text (NULL without a key; bad row if not UTF-8) |
//! | `_headers` | VARCHAR | the headers as a JSON object of text values (`{}` without headers) |
//!
//! In `_headers`, a header without a value is `null`, a value that is not UTF-8 has its
//! bad bytes replaced by U+FFFD, and of a name repeated the last value is kept.
//!
//! The other columns are the value's: JSON keys by name, CSV fields by position (in the
//! order declared, metadata columns left out), or, for `raw`, the one value column
//! (VARCHAR) holding the whole value as text.
//!
//! # Changelog formats
//!
//! `debezium-json` and `upsert` turn each message into the rows it changes first
//! (`sluice_formats::changelog`: a Debezium update is two rows, `-U` and `+U`), each with
//! the message's metadata, then decode those rows as JSON; the batch carries their row
//! kinds in one more column after the declared ones (`crate::changelog`). A message is
//! all or nothing: if its envelope or any of its rows is bad, none of its rows is kept and
//! it is one bad message. A Debezium tombstone (no value, or an empty one) is skipped, as
//! Flink skips it; an upsert tombstone is the key's delete.
//!
//! # One message, one row
//!
//! The messages of one poll are decoded together as one chunk (one line per JSON
//! message, whose line breaks, which JSON allows only as whitespace, become spaces; one
//! record per CSV message), so the fast path of the decoder runs once per poll. A
//! message that is empty (a tombstone included), is not one CSV record, or that the
//! decoder finds bad, is a bad row named by topic, partition and offset; its neighbours
//! are kept. Should the rows decoded ever not match the good messages one to one, the
//! poll is decoded again message by message, so metadata never shifts onto another row.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_formats::{BadRow, CsvRecordFinder, Decoder, DecoderOptions, RowFormat};
use sluice_types::SluiceError;

use super::avro::{AvroDecoder, Framing, Registry};
use super::options::KafkaFormat;

/// The first line number handed to the decoder: never 1, so no message is taken for a
/// CSV header (line numbers are otherwise unused here).
const FIRST_LINE: u64 = 2;

/// What fills one declared column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    /// Column `i` of the decoded value.
    Value(usize),
    Topic,
    Partition,
    Offset,
    Timestamp,
    Key,
    Headers,
}

const METADATA: &[(&str, Column)] = &[
    ("_topic", Column::Topic),
    ("_partition", Column::Partition),
    ("_offset", Column::Offset),
    ("_timestamp", Column::Timestamp),
    ("_key", Column::Key),
    ("_headers", Column::Headers),
];

fn metadata_type(column: Column) -> DataType {
    match column {
        Column::Topic | Column::Key | Column::Headers => DataType::Utf8,
        Column::Partition => DataType::Int32,
        Column::Offset => DataType::Int64,
        Column::Timestamp => DataType::Timestamp(TimeUnit::Millisecond, None),
        Column::Value(_) => unreachable!("a value column has its declared type"),
    }
}

fn sql_type(column: Column) -> &'static str {
    match column {
        Column::Topic | Column::Key | Column::Headers => "VARCHAR",
        Column::Partition => "INT",
        Column::Offset => "BIGINT",
        Column::Timestamp => "TIMESTAMP(3)",
        Column::Value(_) => "",
    }
}

/// One message as read: its value and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub value: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    /// The headers, in order (read only when `_headers` is declared).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A message that made no row, with the reason and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMessage {
    pub offset: i64,
    pub reason: String,
    pub text: String,
}

/// Rows built from messages: the batch, the bad messages, and the indices of the
/// messages that made the batch's rows (one each, in order).
type BuiltRows = (Option<RecordBatch>, Vec<BadMessage>, Vec<usize>);

/// Turns the messages of one partition into batches of the declared schema.
pub struct RowBuilder {
    schema: SchemaRef,
    columns: Vec<Column>,
    format: KafkaFormat,
    /// The value decoder (JSON and CSV).
    decoder: Option<Decoder>,
    /// The value decoder (Avro).
    avro: Option<AvroDecoder>,
    value_schema: SchemaRef,
    topic: Arc<str>,
    /// A changelog format's output schema: the declared columns and the row kinds.
    kinds_schema: Option<SchemaRef>,
    /// `debezium-avro-confluent`: the row kinds of the last Avro decoding, one per row.
    avro_kinds: Vec<i8>,
}

impl RowBuilder {
    /// A builder for messages of `topic` into `schema`; fails when a metadata column has
    /// the wrong type, or the value columns do not suit the format.
    pub fn new(schema: SchemaRef, format: KafkaFormat, topic: &str, batch_size: usize) -> Result<Self, SluiceError> {
        let mut columns = Vec::new();
        let mut value_fields = Vec::new();
        for field in schema.fields() {
            match METADATA.iter().find(|(name, _)| name == field.name()) {
                Some((name, column)) => {
                    if field.data_type() != &metadata_type(*column) {
                        return Err(SluiceError::user(
                            "source.metadata_column",
                            format!(
                                "metadata column `{name}` is declared {}, not {}",
                                field.data_type(),
                                sql_type(*column)
                            ),
                        )
                        .with_fix(format!("declare it as `{name} {}`", sql_type(*column))));
                    }
                    columns.push(*column);
                }
                None => {
                    columns.push(Column::Value(value_fields.len()));
                    value_fields.push(Arc::clone(field));
                }
            }
        }
        let value_schema = Arc::new(Schema::new(value_fields));
        let avro = match format {
            KafkaFormat::Avro => Some(AvroDecoder::new(&value_schema, Framing::Plain)?),
            KafkaFormat::AvroConfluent => Some(AvroDecoder::new(&value_schema, Framing::Confluent)?),
            KafkaFormat::DebeziumAvroConfluent => Some(AvroDecoder::debezium(&value_schema)?),
            _ => None,
        };
        let decoder = match format {
            KafkaFormat::Raw => {
                let is_one_text =
                    value_schema.fields().len() == 1 && value_schema.field(0).data_type() == &DataType::Utf8;
                if !is_one_text {
                    return Err(SluiceError::user(
                        "source.raw_schema",
                        "format = \"raw\" needs exactly one value column of type VARCHAR (beside metadata columns)",
                    )
                    .with_fix("declare e.g. schema = \"line VARCHAR, _offset BIGINT\""));
                }
                None
            }
            KafkaFormat::Json | KafkaFormat::Csv | KafkaFormat::DebeziumJson | KafkaFormat::Upsert => {
                let format = match format {
                    KafkaFormat::Json | KafkaFormat::DebeziumJson | KafkaFormat::Upsert => RowFormat::Json,
                    _ => RowFormat::Csv { header: false, delimiter: b',' },
                };
                let options =
                    DecoderOptions { schema: Arc::clone(&value_schema), format, batch_size: batch_size.max(1) };
                Some(Decoder::new(options)?)
            }
            KafkaFormat::Avro | KafkaFormat::AvroConfluent | KafkaFormat::DebeziumAvroConfluent => None,
        };
        let kinds_schema = format.changelog().map(|_| crate::changelog::with_kinds_schema(&schema));
        Ok(RowBuilder {
            schema,
            columns,
            format,
            decoder,
            avro,
            value_schema,
            topic: Arc::from(topic),
            kinds_schema,
            avro_kinds: Vec::new(),
        })
    }

    /// The registry `avro-confluent` fetches writer schemas from (shared by the lanes).
    pub fn set_registry(&mut self, registry: Arc<Registry>) {
        if let Some(avro) = &mut self.avro {
            avro.set_registry(registry);
        }
    }

    /// Reads every Avro datum with the general decoder (tests compare the two).
    #[cfg(test)]
    pub(crate) fn set_general_only(&mut self) {
        if let Some(avro) = &mut self.avro {
            avro.set_general_only();
        }
    }

    /// Whether the rows hold the messages' headers (`_headers` is declared).
    pub fn wants_headers(&self) -> bool {
        self.columns.contains(&Column::Headers)
    }

    /// The rows of `messages` (at most one batch) and the messages that made none.
    pub fn build(&mut self, messages: &[Message]) -> Result<(Option<RecordBatch>, Vec<BadMessage>), SluiceError> {
        if self.kinds_schema.is_some() {
            return self.build_changes(messages);
        }
        let (batch, bad, _) = self.build_rows(messages)?;
        Ok((batch, bad))
    }

    /// A changelog format's messages: their rows (see the module doc), with their kinds.
    fn build_changes(&mut self, messages: &[Message]) -> Result<(Option<RecordBatch>, Vec<BadMessage>), SluiceError> {
        if self.format == KafkaFormat::DebeziumAvroConfluent {
            return self.build_avro_changes(messages);
        }
        let format = self.format.changelog().expect("a changelog format");
        let opened = crate::changelog::open_envelopes(
            format,
            messages.iter().map(|message| (message.key.as_deref(), message.value.as_deref())),
        );
        let mut bad: Vec<BadMessage> =
            opened.bad.into_iter().map(|(index, reason)| bad_message(&messages[index], reason)).collect();
        let mut rows = Vec::with_capacity(opened.changes.len());
        let mut kinds = Vec::with_capacity(opened.changes.len());
        for (index, change) in opened.changes {
            let message = &messages[index];
            // Every field but the value, which the row replaces (not copied).
            rows.push(Message {
                value: Some(change.row),
                key: message.key.clone(),
                partition: message.partition,
                offset: message.offset,
                timestamp: message.timestamp,
                headers: message.headers.clone(),
            });
            kinds.push(change.kind as i8);
        }
        let (batch, more_bad, good) = self.build_rows(&rows)?;
        bad.extend(more_bad);
        bad.sort_by_key(|b| b.offset);
        bad.dedup_by_key(|b| b.offset);
        let Some(batch) = batch else { return Ok((None, bad)) };
        let offsets: Vec<i64> = good.iter().map(|&i| rows[i].offset).collect();
        let bad_offsets: Vec<i64> = bad.iter().map(|b| b.offset).collect();
        let kinds = arrow::array::Int8Array::from_iter_values(good.iter().map(|&i| kinds[i]));
        let schema = self.kinds_schema.as_ref().expect("a changelog format");
        let batch = crate::changelog::whole_messages(&batch, &offsets, kinds, &bad_offsets, schema)?;
        Ok((batch, bad))
    }

    /// `debezium-avro-confluent`: the envelopes decoded straight into rows with their kinds
    /// (tombstones skipped); a message's rows are all or none, by the decoder.
    fn build_avro_changes(
        &mut self,
        messages: &[Message],
    ) -> Result<(Option<RecordBatch>, Vec<BadMessage>), SluiceError> {
        let events: Vec<Message> =
            messages.iter().filter(|m| m.value.as_deref().is_some_and(|v| !v.is_empty())).cloned().collect();
        let (batch, bad, _) = self.build_rows(&events)?;
        let Some(batch) = batch else { return Ok((None, bad)) };
        let kinds = arrow::array::Int8Array::from(std::mem::take(&mut self.avro_kinds));
        let schema = self.kinds_schema.as_ref().expect("a changelog format");
        Ok((Some(crate::changelog::with_kinds(&batch, kinds, schema)?), bad))
    }

    /// The rows of `messages`, the messages that made none, and the indices of those that
    /// made one (in order, one row each; a Debezium update's two).
    fn build_rows(&mut self, messages: &[Message]) -> Result<BuiltRows, SluiceError> {
        let mut bad = Vec::new();
        let mut included = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            match self.precheck(message) {
                Ok(()) => included.push(index),
                Err(reason) => bad.push(bad_message(message, reason)),
            }
        }
        let (values, good_indices) = match self.format {
            KafkaFormat::Raw => self.raw_values(messages, &included, &mut bad),
            KafkaFormat::Avro | KafkaFormat::AvroConfluent | KafkaFormat::DebeziumAvroConfluent => {
                self.avro_values(messages, &included, &mut bad)?
            }
            KafkaFormat::Json | KafkaFormat::Csv | KafkaFormat::DebeziumJson | KafkaFormat::Upsert => {
                self.decode_values(messages, &included, &mut bad)?
            }
        };
        bad.sort_by_key(|b| b.offset);
        if good_indices.is_empty() {
            return Ok((None, bad, good_indices));
        }
        let good: Vec<&Message> = good_indices.iter().map(|i| &messages[*i]).collect();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            arrays.push(match column {
                Column::Value(i) => Arc::clone(values.column(*i)),
                Column::Topic => Arc::new(StringArray::from(vec![&*self.topic; good.len()])),
                Column::Partition => Arc::new(Int32Array::from_iter_values(good.iter().map(|m| m.partition))),
                Column::Offset => Arc::new(Int64Array::from_iter_values(good.iter().map(|m| m.offset))),
                Column::Timestamp => Arc::new(TimestampMillisecondArray::from_iter(good.iter().map(|m| m.timestamp))),
                Column::Key => {
                    let keys = good.iter().map(|m| m.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()));
                    Arc::new(StringArray::from_iter(keys))
                }
                Column::Headers => Arc::new(StringArray::from_iter_values(good.iter().map(|m| headers_json(m)))),
            });
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), arrays)
            .map_err(|e| SluiceError::internal("source.kafka_rows", format!("assembling rows: {e}")))?;
        Ok((Some(batch), bad, good_indices))
    }

    /// Why a message cannot make a row before decoding, if it cannot.
    fn precheck(&self, message: &Message) -> Result<(), String> {
        if let Some(key) = &message.key
            && self.columns.contains(&Column::Key)
            && std::str::from_utf8(key).is_err()
        {
            return Err("the key is not UTF-8 (column `_key` is VARCHAR)".to_owned());
        }
        let Some(value) = message.value.as_deref() else {
            return Err("the message has no value (a tombstone)".to_owned());
        };
        let text = matches!(
            self.format,
            KafkaFormat::Json | KafkaFormat::Csv | KafkaFormat::DebeziumJson | KafkaFormat::Upsert
        );
        if text && value.iter().all(u8::is_ascii_whitespace) {
            return Err("the message value is empty".to_owned());
        }
        if self.format == KafkaFormat::Csv {
            let body = trim_line_break(value);
            let mut finder = CsvRecordFinder::new(b',');
            let one_record = finder.find_record_end(body).is_none() && finder.find_record_end(b"\n") == Some(1);
            if !one_record {
                return Err("the message is not exactly one CSV record".to_owned());
            }
        }
        Ok(())
    }

    /// Raw: the value as text.
    fn raw_values(
        &self,
        messages: &[Message],
        included: &[usize],
        bad: &mut Vec<BadMessage>,
    ) -> (RecordBatch, Vec<usize>) {
        let mut good = Vec::with_capacity(included.len());
        let mut texts = Vec::with_capacity(included.len());
        for &index in included {
            let value = messages[index].value.as_deref().unwrap_or_default();
            match std::str::from_utf8(value) {
                Ok(text) => {
                    good.push(index);
                    texts.push(text);
                }
                Err(_) => bad.push(bad_message(&messages[index], "the value is not UTF-8".to_owned())),
            }
        }
        let array: ArrayRef = Arc::new(StringArray::from(texts));
        let batch = RecordBatch::try_new(Arc::clone(&self.value_schema), vec![array]).expect("one text column");
        (batch, good)
    }

    /// Avro: each included message one datum; a message that is not one is bad.
    fn avro_values(
        &mut self,
        messages: &[Message],
        included: &[usize],
        bad: &mut Vec<BadMessage>,
    ) -> Result<(RecordBatch, Vec<usize>), SluiceError> {
        let avro = self.avro.as_mut().expect("the avro formats have an avro decoder");
        let values = included.iter().map(|&i| (i, messages[i].value.as_deref().unwrap_or_default()));
        let decoded = avro.decode(values)?;
        self.avro_kinds = decoded.kinds;
        for (index, reason) in decoded.bad {
            bad.push(bad_message(&messages[index], reason));
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.value_schema), decoded.columns)
            .map_err(|e| SluiceError::internal("source.kafka_rows", format!("assembling avro rows: {e}")))?;
        Ok((batch, decoded.good))
    }

    /// JSON and CSV: every included message in one chunk; message by message when the
    /// rows do not match the good messages one to one.
    fn decode_values(
        &mut self,
        messages: &[Message],
        included: &[usize],
        bad: &mut Vec<BadMessage>,
    ) -> Result<(RecordBatch, Vec<usize>), SluiceError> {
        let mut chunk = Vec::new();
        let mut first_lines = Vec::with_capacity(included.len());
        let mut line = FIRST_LINE;
        for &index in included {
            first_lines.push(line);
            line += self.append(&mut chunk, messages[index].value.as_deref().unwrap_or_default());
        }
        let (batches, bad_rows) = self.decode(&chunk)?;
        let mut bad_indexes = Vec::new();
        for row in bad_rows {
            let at = first_lines.partition_point(|first| *first <= row.line).saturating_sub(1);
            bad_indexes.push(included[at]);
            bad.push(bad_message(&messages[included[at]], row.reason));
        }
        let good: Vec<usize> = included.iter().copied().filter(|i| !bad_indexes.contains(i)).collect();
        let values = self.concat(&batches)?;
        if values.num_rows() == good.len() {
            return Ok((values, good));
        }
        bad.retain(|b| !bad_indexes.iter().any(|i| messages[*i].offset == b.offset));
        self.decode_one_by_one(messages, included, bad)
    }

    fn decode_one_by_one(
        &mut self,
        messages: &[Message],
        included: &[usize],
        bad: &mut Vec<BadMessage>,
    ) -> Result<(RecordBatch, Vec<usize>), SluiceError> {
        let mut good = Vec::new();
        let mut rows = Vec::new();
        for &index in included {
            let mut chunk = Vec::new();
            self.append(&mut chunk, messages[index].value.as_deref().unwrap_or_default());
            let (batches, bad_rows) = self.decode(&chunk)?;
            let count: usize = batches.iter().map(RecordBatch::num_rows).sum();
            match (bad_rows.into_iter().next(), count) {
                (Some(row), _) => bad.push(bad_message(&messages[index], row.reason)),
                (None, 1) => {
                    good.push(index);
                    rows.extend(batches);
                }
                (None, count) => {
                    bad.push(bad_message(&messages[index], format!("the message holds {count} rows, not one")));
                }
            }
        }
        Ok((self.concat(&rows)?, good))
    }

    /// Appends one message as one record; returns the lines it takes.
    fn append(&self, chunk: &mut Vec<u8>, value: &[u8]) -> u64 {
        let body = trim_line_break(value);
        match self.format {
            KafkaFormat::Json | KafkaFormat::DebeziumJson | KafkaFormat::Upsert => {
                chunk.extend(body.iter().map(|b| if matches!(b, b'\n' | b'\r') { b' ' } else { *b }));
                chunk.push(b'\n');
                1
            }
            _ => {
                chunk.extend_from_slice(body);
                chunk.push(b'\n');
                1 + sluice_formats::count_line_breaks(body) as u64
            }
        }
    }

    fn decode(&mut self, chunk: &[u8]) -> Result<(Vec<RecordBatch>, Vec<BadRow>), SluiceError> {
        let mut batches = Vec::new();
        let mut bad = Vec::new();
        if !chunk.is_empty() {
            let decoder = self.decoder.as_mut().expect("json and csv have a decoder");
            decoder.decode(chunk, FIRST_LINE, &mut batches, &mut bad)?;
        }
        Ok((batches, bad))
    }

    fn concat(&self, batches: &[RecordBatch]) -> Result<RecordBatch, SluiceError> {
        concat_batches(&self.value_schema, batches)
            .map_err(|e| SluiceError::internal("source.kafka_rows", format!("joining decoded rows: {e}")))
    }
}

/// The headers of `message` as a JSON object (see the module docs).
fn headers_json(message: &Message) -> String {
    let mut object = serde_json::Map::new();
    for (name, value) in &message.headers {
        let value = match value {
            Some(bytes) => serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()),
            None => serde_json::Value::Null,
        };
        object.insert(name.clone(), value);
    }
    serde_json::Value::Object(object).to_string()
}

fn bad_message(message: &Message, reason: String) -> BadMessage {
    let text = BadRow::new(0, "", message.value.as_deref().unwrap_or_default()).text;
    BadMessage { offset: message.offset, reason, text }
}

/// `bytes` without one trailing `\n` or `\r\n`.
fn trim_line_break(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}
