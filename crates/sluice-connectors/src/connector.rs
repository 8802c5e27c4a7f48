//! What a connector is: the traits a source or sink connector implements
//! ([`SourceConnector`], [`SinkConnector`]) and what they get and give
//! ([`SourceContext`], [`SinkContext`], [`OptionDoc`]), with the option-reading helpers
//! every connector shares. `registry` lists the connectors; every connector imports this
//! file, never the registry.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_config::{ConfigError, Located, Options, Position, SinkConfig, SourceConfig, suggest};
use sluice_runtime::{SinkFactory, SourceFactory};
use sluice_types::SluiceError;

/// One option a connector accepts, for documentation and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionDoc {
    pub key: &'static str,
    /// The value's type, e.g. `integer >= 1`, `string`, `duration`.
    pub kind: &'static str,
    /// The default, or `required`.
    pub default: &'static str,
    pub doc: &'static str,
}

/// A source connector, registered by name.
pub trait SourceConnector: Send + Sync {
    /// The name written as `connector = "…"`.
    fn name(&self) -> &'static str;
    /// The options it accepts under `[source.options]`.
    fn options(&self) -> &'static [OptionDoc];
    /// Validates a `[[source]]` naming this connector, without I/O.
    fn configure(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>>;
    /// Whether it accepts `on_error = "dead-letter"` (writes bad input somewhere).
    fn dead_letter(&self) -> bool {
        false
    }
}

/// A validated source, ready to be planned.
pub trait ConfiguredSource: Send + Sync {
    /// The SQL tables it provides (most sources: one, named after the source).
    fn tables(&self) -> Vec<String>;
    /// Whether it reads rows of the declared `schema` (which the SQL layer parses).
    fn reads_declared_schema(&self) -> bool;
    /// The local paths it reads, resolved against `base_dir` (for overlap checks).
    fn input_paths(&self, _base_dir: &Path) -> Vec<PathBuf> {
        Vec::new()
    }
    /// The runtime's source. `lane_threads` is the thread count its lanes are laid out
    /// for; `schema` is the declared schema when [`Self::reads_declared_schema`].
    fn build(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError>;
}

/// What building a source needs beyond its configuration.
#[derive(Debug, Clone)]
pub struct SourceContext<'a> {
    pub config: &'a SourceConfig,
    /// The directory of the pipeline file: relative paths start there.
    pub base_dir: &'a Path,
    pub lane_threads: u32,
    pub schema: Option<SchemaRef>,
    /// The layout a checkpoint recorded for this source (its `SourceFactory::layout`),
    /// when the run resumes from one: the source must lay its lanes out the same way, or
    /// refuse with the reason.
    pub layout: Option<Vec<u8>>,
    /// Whether the run asks for exactly-once output (checkpoints with `guarantee =
    /// "exactly-once"`): a source whose positions cannot be the checkpoint's alone (a
    /// Kafka source in group mode) refuses it.
    pub exactly_once: bool,
    /// The workers of the cluster the source is planned for (1 outside a cluster).
    pub workers: u32,
}

/// A sink connector, registered by name.
pub trait SinkConnector: Send + Sync {
    /// The name written as `connector = "…"`.
    fn name(&self) -> &'static str;
    /// The options it accepts under `[sink.options]`.
    fn options(&self) -> &'static [OptionDoc];
    /// Validates a `[[sink]]` naming this connector, without I/O.
    fn configure(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>>;
}

/// A validated sink, ready to be planned.
pub trait ConfiguredSink: Send + Sync {
    /// The local paths it writes, resolved against `base_dir` (for overlap checks).
    fn output_paths(&self, _base_dir: &Path) -> Vec<PathBuf> {
        Vec::new()
    }
    /// Whether it writes to this process's standard output.
    fn writes_stdout(&self) -> bool {
        false
    }
    /// Checks, creating nothing, that it can write where it is told to (`validate`).
    fn check(&self, _base_dir: &Path) -> Result<(), SluiceError> {
        Ok(())
    }
    /// The runtime's sink for rows of `schema`; `updating`: rows may be retractions.
    fn build(&self, context: &SinkContext<'_>) -> Result<Arc<dyn SinkFactory>, SluiceError>;
}

/// What building a sink needs beyond its configuration.
#[derive(Debug, Clone)]
pub struct SinkContext<'a> {
    /// The pipeline's name (`[pipeline] name`), stable across restarts: a sink may
    /// derive durable identities from it (the Kafka sink's transactional ids).
    pub pipeline: &'a str,
    pub config: &'a SinkConfig,
    pub base_dir: &'a Path,
    pub schema: SchemaRef,
    /// Whether rows may be retractions (the stream is updating).
    pub updating: bool,
    /// The columns of `schema` identifying a live row of an updating stream, when known:
    /// a change of one row arrives as its retraction directly followed by its new version.
    pub upsert_key: Option<Vec<usize>>,
    /// Whether the run asks for exactly-once output (checkpoints with `guarantee =
    /// "exactly-once"`); a sink whose staging costs something (a PostgreSQL prepared
    /// transaction) stages only then.
    pub exactly_once: bool,
    /// With checkpoints: the longest a checkpoint may take from one barrier to the next
    /// one's end (`[checkpoint] interval` + `timeout`), so an epoch's staged output
    /// (a Kafka transaction) must stay open at least that long.
    pub checkpoint_span: Option<std::time::Duration>,
}

/// Names as a message lists them: each in double quotes, comma-separated.
pub(crate) fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
}

/// Reads the item-level `format` key as one of `choices`: None with an error when it is
/// missing (and `required`: reported at the item's header, `item`) or unknown.
pub fn format_choice<T: Copy>(
    format: Option<&Located<String>>,
    options: &Options,
    item: Position,
    choices: &[(&str, T)],
    required: bool,
    errors: &mut Vec<ConfigError>,
) -> Option<T> {
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let list = quoted(&names);
    let Some(format) = format else {
        if required {
            let fix =
                format!("add format = {}", names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(" or "));
            errors.push(options.item_error(item, "missing required key `format`", &fix));
        }
        return None;
    };
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == format.value) {
        return Some(*value);
    }
    let fix = match suggest(&format.value, &names) {
        Some(close) => format!("did you mean format = \"{close}\"?"),
        None => format!("set format to one of {list}"),
    };
    let message = format!("`format` must be one of {list}, found \"{}\"", format.value);
    errors.push(options.item_error(format.position, &message, &fix));
    None
}

/// Records an error when an item-level key the connector does not use is present.
pub fn forbid_item<T>(
    value: Option<&Located<T>>,
    key: &str,
    found: &str,
    options: &Options,
    why: &str,
    fix: &str,
    errors: &mut Vec<ConfigError>,
) {
    if let Some(value) = value {
        let message = format!("`{key}` is not allowed here ({why}), found {found}");
        errors.push(options.item_error(value.position, &message, fix));
    }
}

/// A sink's `key` option: one column name, or an array of distinct column names (the
/// Kafka and PostgreSQL sinks').
#[cfg(any(feature = "kafka", feature = "postgres"))]
pub(crate) fn key_columns(reader: &mut sluice_config::OptionsReader<'_>) -> sluice_config::Field<Vec<String>> {
    column_names(reader, "key", "e.g. key = \"auction\" or key = [\"auction\", \"bidder\"]", false)
}

/// Option `key`: one column name, or an array of distinct column names (`empty_ok`: the
/// array may be empty); `example` completes the message of a bad value.
#[cfg(any(feature = "kafka", feature = "postgres", feature = "delta"))]
pub(crate) fn column_names(
    reader: &mut sluice_config::OptionsReader<'_>,
    key: &str,
    example: &str,
    empty_ok: bool,
) -> sluice_config::Field<Vec<String>> {
    reader.value(key, "a column name or an array of distinct column names", example, |value| {
        let names: Vec<String> = match value.as_str() {
            Some(name) => vec![name.to_owned()],
            None => value.as_array()?.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<_>>()?,
        };
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        let valid = (empty_ok || !names.is_empty()) && names.iter().all(|n| !n.is_empty());
        (valid && unique.len() == names.len()).then_some(names)
    })
}

/// `path` resolved against `base_dir` unless it is absolute.
pub(crate) fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) }
}

/// Merges the errors of an options reader with those found beside it.
pub fn finish(reader: sluice_config::OptionsReader<'_>, mut errors: Vec<ConfigError>) -> Result<(), Vec<ConfigError>> {
    if let Err(found) = reader.finish() {
        errors.extend(found);
    }
    errors.sort_by_key(|e| e.position);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}
