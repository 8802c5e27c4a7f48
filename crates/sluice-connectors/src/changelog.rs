//! What the sources with a changelog format share: the format's primary key resolved
//! against the schema ([`source_changelog`]), the messages of a JSON envelope format
//! opened into the rows they change ([`open_envelopes`]) and those rows kept whole per
//! message ([`whole_messages`]), the row kinds column their batches carry after the
//! declared columns ([`with_kinds`]), and `explain`'s words for them.
//!
//! A changelog format (Kafka's `debezium-json`, `debezium-avro-confluent` and `upsert`, the file source's
//! `debezium-json`, `changelog-json` and `changelog-csv`) needs `primary_key`: the planner routes the rows
//! by it into the normalization that keeps each key's row (`sluice_operators::normalize`),
//! which is what makes retractions, duplicate inserts and deletes of unknown keys
//! well-defined. An upsert source's `-D` carries only its key, so its other columns must
//! be nullable.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int8Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_config::SourceConfig;
use sluice_formats::changelog::ChangeRow;
use sluice_runtime::SourceChangelog;
use sluice_types::{ROW_KIND_COLUMN, SluiceError};

/// A changelog format: its name and whether it is upserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangelogFormat {
    pub name: &'static str,
    pub upsert: bool,
}

/// Flink's `debezium-json`: read by the Kafka and the file source alike.
pub const DEBEZIUM_JSON: ChangelogFormat = ChangelogFormat { name: "debezium-json", upsert: false };

/// The messages of one read opened: the rows they change, in order, each with the index
/// of its message, and the messages whose envelope is bad, with the reason.
#[derive(Debug, Default)]
pub struct OpenedEnvelopes {
    pub changes: Vec<(usize, ChangeRow)>,
    pub bad: Vec<(usize, String)>,
}

/// Opens each `(key, value)` message in `format` (`debezium-json` or `upsert`, see
/// `sluice_formats::changelog`) into its rows. A Debezium tombstone (no value, or an
/// empty one), which Debezium sends after a delete for log compaction, gives no row and
/// is no bad message, as Flink skips it; an upsert tombstone is its key's delete.
pub fn open_envelopes<'a>(
    format: ChangelogFormat,
    messages: impl IntoIterator<Item = (Option<&'a [u8]>, Option<&'a [u8]>)>,
) -> OpenedEnvelopes {
    let mut opened = OpenedEnvelopes::default();
    for (index, (key, value)) in messages.into_iter().enumerate() {
        let changes = if format.upsert {
            sluice_formats::changelog::upsert_json(key, value).map(|row| vec![row])
        } else {
            match value {
                None | Some([]) => continue,
                Some(value) => sluice_formats::changelog::debezium_json(value),
            }
        };
        match changes {
            Ok(changes) => opened.changes.extend(changes.into_iter().map(|change| (index, change))),
            Err(reason) => opened.bad.push((index, reason)),
        }
    }
    opened
}

/// The decoded `rows` of opened envelopes with their `kinds` (one each; `messages`: the
/// message of each row, by an id such as a Kafka offset or a file's line number), under `schema` (from [`with_kinds_schema`]), less every row of a
/// message in `bad` (sorted): a message is all or nothing, so neither the `-U` nor the
/// `+U` of an update one of whose rows is bad is kept. None when no row is left.
pub fn whole_messages<Id: Ord>(
    rows: &RecordBatch,
    messages: &[Id],
    kinds: Int8Array,
    bad: &[Id],
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>, SluiceError> {
    assert_eq!(rows.num_rows(), messages.len(), "one message per row");
    assert_eq!(rows.num_rows(), kinds.len(), "one kind per row");
    debug_assert!(bad.is_sorted(), "bad messages sorted");
    let batch = with_kinds(rows, kinds, schema)?;
    if bad.is_empty() {
        return Ok((batch.num_rows() > 0).then_some(batch));
    }
    let keep = BooleanArray::from_iter(messages.iter().map(|message| Some(bad.binary_search(message).is_err())));
    let batch = arrow::compute::filter_record_batch(&batch, &keep)
        .map_err(|e| SluiceError::internal("source.changelog", format!("dropping a bad message's rows: {e}")))?;
    Ok((batch.num_rows() > 0).then_some(batch))
}

/// The changelog of `config`'s table of `schema` read in `format` (None: not a changelog
/// format), its primary key checked: present with a changelog format, every column
/// declared, the non-key columns of an upsert format nullable.
pub fn source_changelog(
    config: &SourceConfig,
    schema: &Schema,
    format: Option<ChangelogFormat>,
) -> Result<Option<SourceChangelog>, SluiceError> {
    let name = &config.name;
    let (format, key) = match (format, &config.primary_key) {
        (None, _) => return Ok(None),
        (Some(format), Some(key)) => (format, key),
        (Some(format), None) => {
            return Err(SluiceError::user(
                "source.primary_key_missing",
                format!(
                    "source `{name}`: format = \"{}\" gives changes of a table, which are read by its primary key, \
                     and the source declares none",
                    format.name
                ),
            )
            .with_fix("add primary_key = [\"<column>\", …] to the [[source]], the columns that identify a row"));
        }
    };
    let mut primary_key = Vec::with_capacity(key.value.len());
    for column in &key.value {
        let Some(index) = schema.fields().iter().position(|f| f.name() == column) else {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(SluiceError::user(
                "source.primary_key",
                format!(
                    "source `{name}` ({}): primary_key names `{column}`, which is not a column of its schema \
                     (columns: {})",
                    key.position,
                    names.join(", ")
                ),
            )
            .with_fix("name declared columns in primary_key, or declare the column in `schema`"));
        };
        primary_key.push(index);
    }
    if format.upsert
        && let Some(field) = schema
            .fields()
            .iter()
            .enumerate()
            .find(|(i, f)| !primary_key.contains(i) && !f.is_nullable())
            .map(|(_, f)| f)
    {
        return Err(SluiceError::user(
            "source.upsert_not_null",
            format!(
                "source `{name}`: column `{}` is NOT NULL, but an upsert tombstone (a delete) carries only the key",
                field.name()
            ),
        )
        .with_fix(format!("declare `{}` without NOT NULL (only primary key columns may be NOT NULL)", field.name())));
    }
    Ok(Some(SourceChangelog { primary_key, upsert: format.upsert, format: format.name.to_string() }))
}

/// The row kinds column a changelog table's batches carry after the declared columns.
pub fn kinds_field() -> Field {
    Field::new(ROW_KIND_COLUMN, DataType::Int8, false)
}

/// `schema` with the row kinds column after its columns.
pub fn with_kinds_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(kinds_field());
    Arc::new(Schema::new(fields))
}

/// `rows` with `kinds` after their columns, under `schema` (from [`with_kinds_schema`]).
pub fn with_kinds(rows: &RecordBatch, kinds: Int8Array, schema: &SchemaRef) -> Result<RecordBatch, SluiceError> {
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    columns.push(Arc::new(kinds));
    RecordBatch::try_new(Arc::clone(schema), columns)
        .map_err(|e| SluiceError::internal("source.changelog", format!("rows with their kinds: {e}")))
}

/// The format and key as `explain` shows them: `debezium-json, updating, primary key [id]`.
pub fn describe(changelog: &SourceChangelog, schema: &Schema) -> String {
    let names: Vec<&str> = changelog.primary_key.iter().map(|&i| schema.field(i).name().as_str()).collect();
    format!("{}, updating, primary key [{}]", changelog.format, names.join(", "))
}

/// What the tests of the sources with a changelog format share.
#[cfg(test)]
pub(crate) mod fixtures {
    use arrow::record_batch::RecordBatch;

    /// Debezium events, the values of messages 1 to 7 of a Kafka partition or lines 1 to
    /// 7 of a file (None: a tombstone), read into columns `id BIGINT, v VARCHAR`: a
    /// create, an update, a schema-embedded delete, a tombstone, an update whose after
    /// image does not decode (`id` is text), a truncate, a snapshot read.
    pub(crate) const DEBEZIUM_EVENTS: [Option<&str>; 7] = [
        Some(r#"{"before":null,"after":{"id":1,"v":"a"},"op":"c"}"#),
        Some(r#"{"before":{"id":1,"v":"a"},"after":{"id":1,"v":"b"},"op":"u"}"#),
        Some(r#"{"schema":{},"payload":{"before":{"id":1,"v":"b"},"after":null,"op":"d"}}"#),
        None,
        Some(r#"{"before":{"id":2,"v":"a"},"after":{"id":"x","v":"b"},"op":"u"}"#),
        Some(r#"{"after":{"id":3},"op":"t"}"#),
        Some(r#"{"before":null,"after":{"id":4,"v":"z"},"op":"r"}"#),
    ];

    /// The rows of [`DEBEZIUM_EVENTS`] (`id|v|event|kind`, the kind Flink's RowKind
    /// byte), and the events that are bad: the update with a bad row is dropped whole, the
    /// truncate refused, the tombstone neither a row nor bad.
    pub(crate) const DEBEZIUM_ROWS: [(i64, &str, u64, i8); 5] =
        [(1, "a", 1, 0), (1, "a", 2, 1), (1, "b", 2, 2), (1, "b", 3, 3), (4, "z", 7, 0)];
    pub(crate) const DEBEZIUM_BAD: [u64; 2] = [5, 6];

    /// Each row as its values' text joined by `|` (NULL for a null).
    pub(crate) fn rows_text(batch: &RecordBatch) -> Vec<String> {
        let options = arrow::util::display::FormatOptions::default().with_null("NULL");
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"))
            .collect();
        (0..batch.num_rows())
            .map(|row| formatters.iter().map(|f| f.value(row).to_string()).collect::<Vec<_>>().join("|"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(key: Option<&[&str]>) -> SourceConfig {
        let mut config = SourceConfig::new("orders", "kafka");
        config.primary_key = key.map(|key| {
            sluice_config::Located::new(key.iter().map(|k| k.to_string()).collect(), sluice_config::Position::new(3, 1))
        });
        config
    }

    fn schema() -> Schema {
        Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, false)])
    }

    const DEBEZIUM: ChangelogFormat = ChangelogFormat { name: "debezium-json", upsert: false };
    const UPSERT: ChangelogFormat = ChangelogFormat { name: "upsert", upsert: true };

    #[test]
    fn a_changelog_format_reads_by_its_declared_primary_key() {
        let changelog = source_changelog(&config(Some(&["id"])), &schema(), Some(DEBEZIUM)).expect("valid");
        assert_eq!(
            changelog,
            Some(SourceChangelog { primary_key: vec![0], upsert: false, format: "debezium-json".into() })
        );
        assert_eq!(describe(&changelog.expect("some"), &schema()), "debezium-json, updating, primary key [id]");
        assert_eq!(source_changelog(&config(None), &schema(), None).expect("valid"), None);
    }

    #[test]
    fn a_missing_or_wrong_primary_key_is_refused_with_the_fix() {
        let cases = [
            (config(None), DEBEZIUM, "declares none"),
            (config(Some(&["nope"])), DEBEZIUM, "`nope`, which is not a column"),
            (config(Some(&["id"])), UPSERT, "column `v` is NOT NULL"),
        ];
        for (config, format, expected) in cases {
            let error = source_changelog(&config, &schema(), Some(format)).expect_err("refused").to_string();
            assert!(error.contains(expected) && error.contains("fix:"), "{error}");
        }
    }
}
