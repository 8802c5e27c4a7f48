//! What the sources with a changelog format share: the format's primary key resolved
//! against the schema ([`source_changelog`]), the row kinds column their batches carry
//! after the declared columns ([`with_kinds`]), and `explain`'s words for them.
//!
//! A changelog format (Kafka's `debezium-json`, `debezium-avro-confluent` and `upsert`, the file source's
//! `changelog-json` and `changelog-csv`) needs `primary_key`: the planner routes the rows
//! by it into the normalization that keeps each key's row (`sluice_operators::normalize`),
//! which is what makes retractions, duplicate inserts and deletes of unknown keys
//! well-defined. An upsert source's `-D` carries only its key, so its other columns must
//! be nullable.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_config::SourceConfig;
use sluice_runtime::SourceChangelog;
use sluice_types::{ROW_KIND_COLUMN, SluiceError};

/// A changelog format: its name and whether it is upserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangelogFormat {
    pub name: &'static str,
    pub upsert: bool,
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
