//! Changelog sources in the planner: a changelog table's rows routed by its primary key
//! into the normalization (`sluice_operators::normalize`), after which the stream is
//! updating with the primary key as upsert key; the checks of such a table; and the
//! refusal, with Flink's message, of what cannot consume its updates (window functions,
//! OVER aggregates).

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use sluice_runtime::OperatorFactory;
use sluice_types::{Changelog, SluiceError};

use crate::stream::{StreamPlanner, StreamState};

impl StreamPlanner<'_> {
    /// `state`, a changelog table's rows with their row kinds, routed by the primary key
    /// to the normalization that keeps each key's row and turns the kinds into weights
    /// (`sluice_operators::normalize`): an updating stream whose upsert key is the
    /// primary key.
    pub(crate) fn normalize(
        &self,
        mut state: StreamState,
        name: &str,
        schema: &SchemaRef,
        changelog: &sluice_runtime::SourceChangelog,
    ) -> StreamState {
        let key = changelog.primary_key.clone();
        let names: Vec<&str> = key.iter().map(|&i| schema.field(i).name().as_str()).collect();
        let names = names.join(", ");
        let description = format!("hash({names}) → {} vnodes", self.vnodes);
        self.hash_exchange(&mut state, key.clone(), description);
        let what = if changelog.upsert { "upserts" } else { "changes" };
        let line = format!(
            "changelog_normalize (updating): {what} of `{name}` ({}) by primary key [{names}] into -U/+U",
            changelog.format
        );
        let (source, schema, upsert, vnodes) = (name.to_string(), Arc::clone(schema), changelog.upsert, self.vnodes);
        let spill = self.spill.clone();
        let line = if spill.is_some() {
            format!("{line} (keys and rows spill to disk beyond state_memory_mib)")
        } else {
            line
        };
        let factory: OperatorFactory = Arc::new(move |context| {
            let spec = sluice_operators::normalize::NormalizeSpec {
                source: source.clone(),
                schema: Arc::clone(&schema),
                key: key.clone(),
                upsert,
                vnodes,
            };
            let mut normalize =
                sluice_operators::normalize::ChangelogNormalize::new(spec, Arc::clone(&context.metrics))?;
            if let Some(space) = &spill {
                let written = sluice_operators::spill::spilled_bytes(&context.metrics);
                normalize = normalize.with_spill(Arc::clone(space), written);
            }
            Ok(Box::new(normalize))
        });
        state.operators.push((line, factory));
        state.state = Some(format!("the last row of each primary key [{names}]"));
        state.changelog = Changelog::Updating { upsert_key: Some(changelog.primary_key.clone()) };
        state.changelog_sources.push(format!(
            "the changelog source `{name}` ({}, primary key [{names}]) through changelog_normalize",
            changelog.format
        ));
        state
    }
}

/// The refusal of `construct` over `state` when its updates come from a changelog
/// source (None otherwise): Flink's message ("doesn't support consuming update and delete
/// changes which is produced by …") naming the source, with `fix` and the other way out,
/// reading the source as append-only rows.
pub(crate) fn changelog_input(construct: &str, state: &StreamState, fix: &str) -> Option<SluiceError> {
    if state.changelog_sources.is_empty() {
        return None;
    }
    let error = SluiceError::user(
        "sql.unsupported",
        format!(
            "{construct} doesn't support consuming update and delete changes which is produced by {}",
            state.changelog_sources.join(" and ")
        ),
    );
    Some(error.with_fix(format!(
        "{fix}; or read the source as append-only rows (no primary_key and an append-only format such as `json`: \
         each change is then a row of its own)"
    )))
}

/// How to aggregate a changelog source's rows instead of in windows.
pub(crate) const CHANGELOG_WINDOW_FIX: &str = "aggregate its rows without a window (a GROUP BY of the keys, or of \
    a time bucket such as FLOOR(ts TO MINUTE): an updating result that Sluice keeps up to date)";

/// Refuses a changelog table that cannot be normalized: a primary key out of the
/// schema, or a column the key encoding cannot hold (the normalization keeps each key's
/// whole row in it).
pub(crate) fn check_changelog_table(
    name: &str,
    schema: &Schema,
    changelog: &sluice_runtime::SourceChangelog,
) -> Result<(), SluiceError> {
    assert!(!changelog.primary_key.is_empty(), "a changelog table has a primary key");
    assert!(changelog.primary_key.iter().all(|&i| i < schema.fields().len()), "primary key columns in the schema");
    for field in schema.fields() {
        if !sluice_types::key::is_key_type(field.data_type()) {
            return Err(SluiceError::user(
                "sql.changelog_column",
                format!(
                    "source `{name}` (format {}): column `{}` of type {} cannot be kept per primary key",
                    changelog.format,
                    field.name(),
                    field.data_type()
                ),
            )
            .with_fix(
                "declare the column with a scalar type (integer, decimal, float, boolean, string, date or timestamp)",
            ));
        }
    }
    Ok(())
}
