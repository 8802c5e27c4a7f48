//! The PostgreSQL sink (`connector = "postgres"`), over the synchronous `postgres`
//! client (tokio-postgres underneath): each writer owns a session on its driver thread.
//!
//! # What a table receives
//!
//! - `mode = "append"` (the default for an append-only stream): every row is inserted.
//!   An updating stream is refused in this mode when the pipeline is planned
//!   (`sink.postgres_mode`): a table cannot take back a row it was given by insertion.
//!   To keep a changelog of an updating stream, write it to a `file` or `kafka` sink,
//!   which add the `op` column.
//! - `mode = "upsert"` (the default for an updating stream): `+I`/`+U` rows are
//!   `INSERT … ON CONFLICT (key) DO UPDATE`, `-D` rows `DELETE … WHERE key`, and a
//!   `-U` followed by the `+U` of its key is one upsert ([`rows`]). The key is `key`, or
//!   the stream's upsert key (a `GROUP BY`'s columns, a TopN's partition and rank); the
//!   table needs a primary key or unique index on it, which `create_table` makes.
//!
//! Writes are batched: at most `batch_rows` rows (or keys) pending, written by
//! multi-row statements of at most that many rows.
//!
//! # Guarantees
//!
//! With checkpoints and `guarantee = "exactly-once"`, each writer's rows of an epoch go
//! in one transaction that also records the epoch in a bookkeeping table, prepared with
//! two-phase commit at the barrier and committed once the manifest is published
//! ([`writer`], [`sink`]): the table shows an epoch's changes iff its manifest is
//! committed. The server needs `max_prepared_transactions > 0`. Otherwise rows are
//! committed as they are flushed, and each barrier flushes (at-least-once).
//!
//! - [`options`]: what a pipeline file may say, validated without I/O.
//! - [`client`]: sessions, the password variable, retries, errors naming the server.
//! - [`table`]: types, the catalog check, `CREATE TABLE`, statements.
//! - [`tls`]: `sslmode` and `sslrootcert` of `url` (libpq's semantics), the rustls
//!   configuration, and TLS failures as errors naming the setting (shared with
//!   `postgres-cdc`).

pub mod client;
pub mod options;
pub mod rows;
pub mod sink;
pub mod table;
pub mod tls;
pub mod writer;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use sluice_config::{ConfigError, SinkConfig};
use sluice_runtime::SinkFactory;
use sluice_types::SluiceError;

use crate::connector::{ConfiguredSink, OptionDoc, SinkConnector, SinkContext};
pub use options::{PostgresSinkOptions, TableName, WriteMode, sink_options_of};
pub use sink::PostgresSink;
pub use writer::PreparedRecord;

/// The `postgres` sink connector.
#[derive(Debug, Clone, Copy)]
pub struct PostgresSinkConnector;

impl SinkConnector for PostgresSinkConnector {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn options(&self) -> &'static [OptionDoc] {
        options::SINK_OPTIONS
    }

    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredPostgresSink { options: sink_options_of(config)? }))
    }
}

/// A validated PostgreSQL sink.
#[derive(Debug, Clone)]
pub struct ConfiguredPostgresSink {
    pub options: PostgresSinkOptions,
}

impl ConfiguredSink for ConfiguredPostgresSink {
    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError> {
        let name = &context.config.name;
        let (mode, key) = resolve_mode(name, &self.options, context)?;
        let sink = PostgresSink::new(context.pipeline, name, &self.options, &context.schema, mode, key)?
            .with_exactly_once(context.exactly_once);
        Ok(Arc::new(sink))
    }
}

/// The write mode and its key columns, from the options and the stream's changelog.
pub fn resolve_mode(
    sink: &str,
    options: &PostgresSinkOptions,
    context: &SinkContext<'_>,
) -> Result<(WriteMode, Vec<usize>), SluiceError> {
    let mode = options.mode.unwrap_or(if context.updating { WriteMode::Upsert } else { WriteMode::Append });
    let columns = || context.schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ");
    if mode == WriteMode::Append {
        if context.updating {
            return Err(SluiceError::user(
                "sink.postgres_mode",
                format!(
                    "sink `{sink}` has mode = \"append\", but its input `{}` is an updating stream (it changes and \
                     retracts rows it sent: a GROUP BY without a window, a TopN, a deduplication), which inserts cannot apply",
                    context.config.from
                ),
            )
            .with_fix("set mode = \"upsert\" (by the stream's upsert key, or by the columns of `key`), or write the changelog to a file or kafka sink"));
        }
        return Ok((mode, Vec::new()));
    }
    let key = match (&options.key, context.upsert_key.as_deref()) {
        (Some(names), _) => names
            .iter()
            .map(|name| {
                context.schema.index_of(name).map_err(|_| {
                    SluiceError::user(
                        "sink.postgres_key",
                        format!("sink `{sink}`: key column {name} is not a column of the stream"),
                    )
                    .with_fix(format!("set key to columns of the stream: {}", columns()))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        (None, Some(key)) if !key.is_empty() => key.to_vec(),
        (None, _) => {
            let why = match (context.updating, context.upsert_key.as_deref()) {
                (true, Some(_)) => "its input holds one row at a time (a global aggregate), which has no key columns",
                (true, None) => "its input is an updating stream without a known upsert key",
                (false, _) => "its input is append-only, which has no upsert key",
            };
            return Err(SluiceError::user(
                "sink.postgres_key",
                format!("sink `{sink}` has mode = \"upsert\", and {why}"),
            )
            .with_fix(format!("set key = [\"…\"] to the columns identifying a row, among: {}", columns())));
        }
    };
    Ok((mode, key))
}
