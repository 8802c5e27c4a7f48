//! `pipeline.toml`: parsing and validation into typed structs.
//!
//! [`parse`] reads the text of a pipeline file (this crate does no other I/O) and
//! returns a [`PipelineConfig`], or the first [`ConfigError`], which names the file,
//! the line and column of the offending key, the section and item, the value found,
//! and a fix:
//!
//! ```text
//! pipeline.toml:12:1: [[source]] "bids": `rate` must be a number > 0, found "fast"
//!   fix: set rate to events per second, e.g. rate = 100000
//! ```
//!
//! [`parse_all`] returns every error, in file order.
//!
//! The file has one `[pipeline]` section, one or more `[[source]]`, any number of
//! `[[view]]` and one or more `[[sink]]`; see [`example`] for a complete file. Keys
//! not listed in the format are errors, with a "did you mean" suggestion when one is
//! close. Schemas and SQL stay strings, with their positions ([`Located`]), for the
//! SQL layer to parse; it reports its errors with [`ConfigError::new`] so they look
//! the same.
//!
//! This crate knows no connector: `connector`, `format`, `schema` and the
//! `[source.options]` / `[sink.options]` tables are kept as written ([`Options`]), and
//! the connector named validates them through an [`OptionsReader`], whose errors look
//! like the parser's. Source and view names share one namespace (tables a connector
//! provides under other names are checked by the engine).
//!
//! Paths inside options are kept as written: a relative path stays relative, and the
//! connector resolves it against the directory of the pipeline file.

mod checkpoint;
mod document;
mod error;
mod model;
mod options;
mod pipeline;
mod reader;
mod sink;
mod source;

#[cfg(test)]
mod tests;

pub use checkpoint::{
    DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_STORE, DEFAULT_CHECKPOINT_TIMEOUT, DEFAULT_MAX_FAILED_CHECKPOINTS,
    DEFAULT_RETAIN,
};
pub use error::{ConfigError, Located, Position};
pub use model::{
    CheckpointSection, Compression, DEFAULT_BATCH_SIZE, DEFAULT_QUEUE_BATCHES, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STATE_MEMORY_MIB, DEFAULT_VNODES, DEFAULT_WINDOWS_PER_ROW_MAX, Guarantee, OnError, PipelineConfig,
    PipelineSection, SinkConfig, SourceConfig, ViewConfig,
};
pub use options::{Options, OptionsReader};
pub use pipeline::default_threads;
pub use reader::{Field, MAX_DURATION, parse_duration, suggest};

use reader::Ctx;

/// Parses and validates the text of a pipeline file; `file_name` is used in error
/// messages only. Returns the first error, in file order.
pub fn parse(text: &str, file_name: &str) -> Result<PipelineConfig, ConfigError> {
    parse_all(text, file_name).map_err(|errors| {
        errors.into_iter().next().unwrap_or_else(|| ConfigError::new(file_name, None, "invalid pipeline file", None))
    })
}

/// Like [`parse`], but returns every error found (at least one), in file order;
/// errors about the file as a whole (no position) come first. A TOML syntax error
/// stops parsing, so it is reported alone.
pub fn parse_all(text: &str, file_name: &str) -> Result<PipelineConfig, Vec<ConfigError>> {
    match parse_partial(text, file_name) {
        (Some(config), errors) if errors.is_empty() => Ok(config),
        (_, errors) if errors.is_empty() => Err(vec![ConfigError::new(file_name, None, "invalid pipeline file", None)]),
        (_, errors) => Err(errors),
    }
}

/// Like [`parse_all`], but also returns what could be read despite the errors: the
/// configuration without the items that were invalid (an unusable `[pipeline]` stands in
/// with defaults, an unusable `[checkpoint]` is left out; None on a TOML syntax error).
/// A later layer can go on checking what is there (connector options) and report every
/// problem at once; the configuration is only for that while errors are non-empty.
pub fn parse_partial(text: &str, file_name: &str) -> (Option<PipelineConfig>, Vec<ConfigError>) {
    let mut ctx = Ctx::new(text, file_name);
    let document = match toml_edit::ImDocument::parse(text) {
        Ok(document) => document,
        Err(e) => return (None, vec![syntax_error(&ctx, &e)]),
    };
    let config = document::parse_root(&mut ctx, document.as_table());
    let mut errors = std::mem::take(&mut ctx.errors);
    errors.sort_by_key(|e| e.position);
    (config, errors)
}

fn syntax_error(ctx: &Ctx<'_>, e: &toml_edit::TomlError) -> ConfigError {
    let message = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
    let fix = if message.contains("duplicate key") {
        "remove or rename the second definition".to_owned()
    } else {
        "correct the TOML syntax here (see https://toml.io)".to_owned()
    };
    ConfigError::new(ctx.file, ctx.span_position(e.span()), format!("TOML syntax error: {message}"), Some(fix))
}

/// A small, commented, complete pipeline file: NEXMark bids counted per auction in
/// 10-second tumbling windows, printed to stdout.
pub fn example() -> &'static str {
    EXAMPLE
}

const EXAMPLE: &str = r#"# A Sluice pipeline: run it with `sluice run pipeline.toml`.

[pipeline]
name = "hot-auctions"       # letters, digits, '_' and '-'
# threads = 4               # driver threads; default: the number of cores
# vnodes = 256              # key-space partitions, fixed for the life of the state
# shutdown_timeout = "30s"  # how long Ctrl-C may take to drain

# The NEXMark generator. Whatever its name, it provides three SQL tables:
# person, auction and bid.
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = 100000             # stop after 100,000 events; omit for an endless stream
# rate = 10000              # events per second; omit to go as fast as possible

# Bids per auction in 10-second tumbling windows of event time.
[[view]]
name = "bids_per_auction"
sql = """
SELECT auction, COUNT(*) AS bids, window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end
"""

# Print the results.
[[sink]]
name = "console"
from = "bids_per_auction"
connector = "stdout"        # or "file" (with [sink.options] path) or "blackhole"
format = "pretty"           # or "json": one object per line
"#;
