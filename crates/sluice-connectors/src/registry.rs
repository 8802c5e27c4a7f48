//! The connector registry: how `connector = "…"` in a pipeline file becomes a source or a
//! sink.
//!
//! A connector is registered once, by name, as a [`SourceConnector`] or a
//! [`SinkConnector`]. Using one takes two steps:
//!
//! 1. **configure** (no I/O): the connector validates its part of the item —
//!    `[source.options]` / `[sink.options]` through an
//!    [`OptionsReader`](sluice_config::OptionsReader), and the item-level keys whose
//!    meaning is its own (`format`, `schema`) — and returns every problem as a positioned
//!    [`ConfigError`] with a fix. Its option schema ([`OptionDoc`]) lists what it accepts.
//! 2. **build** (planning, may look at files): the configured connector becomes the
//!    runtime's [`SourceFactory`] or [`SinkFactory`], given what only planning knows (the
//!    declared schema parsed by the SQL layer, the lane layout, the sink's input schema).
//!
//! Adding a connector (Kafka, PostgreSQL, …) means writing these two traits and one
//! [`Registry::add_source`] / [`Registry::add_sink`] call; nothing else in the workspace
//! enumerates connectors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_config::{
    ConfigError, Field, Located, OnError, Options, OptionsReader, Position, SinkConfig, SourceConfig, suggest,
};
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

/// Every connector a pipeline may name.
pub struct Registry {
    sources: Vec<Box<dyn SourceConnector>>,
    sinks: Vec<Box<dyn SinkConnector>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("sources", &self.source_names()).field("sinks", &self.sink_names()).finish()
    }
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::builtin()
    }
}

impl Registry {
    /// No connector at all.
    pub fn empty() -> Registry {
        Registry { sources: Vec::new(), sinks: Vec::new() }
    }

    /// The connectors of this crate: sources `nexmark`, `file` and `kafka`; sinks
    /// `stdout`, `file`, `blackhole`, `kafka`, `postgres` and (with the `delta` feature)
    /// `delta`.
    pub fn builtin() -> Registry {
        let mut registry = Registry::empty();
        registry.add_source(Box::new(crate::nexmark::NexmarkConnector));
        registry.add_source(Box::new(crate::file_source::FileConnector));
        registry.add_source(Box::new(crate::kafka::KafkaSourceConnector));
        registry.add_sink(Box::new(crate::sinks::StdoutConnector));
        registry.add_sink(Box::new(crate::sinks::FileSinkConnector));
        registry.add_sink(Box::new(crate::sinks::BlackholeConnector));
        registry.add_sink(Box::new(crate::kafka::KafkaSinkConnector));
        registry.add_sink(Box::new(crate::postgres::PostgresSinkConnector));
        #[cfg(feature = "delta")]
        registry.add_sink(Box::new(crate::delta::DeltaSinkConnector));
        registry
    }

    /// Registers a source connector; a name registered twice is a programmer error.
    pub fn add_source(&mut self, connector: Box<dyn SourceConnector>) {
        assert!(self.find_source(connector.name()).is_none(), "source connector {} registered twice", connector.name());
        self.sources.push(connector);
    }

    /// Registers a sink connector; a name registered twice is a programmer error.
    pub fn add_sink(&mut self, connector: Box<dyn SinkConnector>) {
        assert!(self.find_sink(connector.name()).is_none(), "sink connector {} registered twice", connector.name());
        self.sinks.push(connector);
    }

    pub fn source_names(&self) -> Vec<&'static str> {
        self.sources.iter().map(|c| c.name()).collect()
    }

    pub fn sink_names(&self) -> Vec<&'static str> {
        self.sinks.iter().map(|c| c.name()).collect()
    }

    /// Every source connector's name and option schema, in registration order.
    pub fn source_options(&self) -> Vec<(&'static str, &'static [OptionDoc])> {
        self.sources.iter().map(|c| (c.name(), c.options())).collect()
    }

    /// Every sink connector's name and option schema, in registration order.
    pub fn sink_options(&self) -> Vec<(&'static str, &'static [OptionDoc])> {
        self.sinks.iter().map(|c| (c.name(), c.options())).collect()
    }

    fn find_source(&self, name: &str) -> Option<&dyn SourceConnector> {
        self.sources.iter().find(|c| c.name() == name).map(|c| c.as_ref())
    }

    fn find_sink(&self, name: &str) -> Option<&dyn SinkConnector> {
        self.sinks.iter().find(|c| c.name() == name).map(|c| c.as_ref())
    }

    /// Configures a `[[source]]` with the connector it names.
    pub fn configure_source(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>> {
        match self.find_source(&config.connector.value) {
            Some(connector) if config.on_error == OnError::DeadLetter && !connector.dead_letter() => {
                Err(vec![config.options.item_error(
                    config.position,
                    &format!(
                        "on_error = \"dead-letter\" is only for the kafka source, not a `{}` source",
                        connector.name()
                    ),
                    "use on_error = \"skip\" (count and log bad rows) or on_error = \"fail\"",
                )])
            }
            Some(connector) => connector.configure(config),
            None => Err(vec![unknown(&config.options, &config.connector, "source", &self.source_names())]),
        }
    }

    /// Configures a `[[sink]]` with the connector it names.
    pub fn configure_sink(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        match self.find_sink(&config.connector.value) {
            Some(connector) => connector.configure(config),
            None => Err(vec![unknown(&config.options, &config.connector, "sink", &self.sink_names())]),
        }
    }
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
}

fn unknown(options: &Options, connector: &Located<String>, kind: &str, known: &[&str]) -> ConfigError {
    let list = quoted(known);
    let fix = match suggest(&connector.value, known) {
        Some(close) => format!("did you mean connector = \"{close}\"?"),
        None => format!("set connector to one of {list}"),
    };
    let message =
        format!("`connector` must be one of {list}, found \"{}\" (no {kind} connector has that name)", connector.value);
    options.item_error(connector.position, &message, &fix)
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

/// A sink's `key` option: one column name, or an array of distinct column names.
pub(crate) fn key_columns(reader: &mut OptionsReader<'_>) -> Field<Vec<String>> {
    reader.value(
        "key",
        "a column name or an array of distinct column names",
        "e.g. key = \"auction\" or key = [\"auction\", \"bidder\"]",
        |value| {
            let names: Vec<String> = match value.as_str() {
                Some(name) => vec![name.to_owned()],
                None => value.as_array()?.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<_>>()?,
            };
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            (!names.is_empty() && names.iter().all(|n| !n.is_empty()) && unique.len() == names.len()).then_some(names)
        },
    )
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

#[cfg(test)]
mod tests {
    use super::Registry;

    /// Every connector's documented options are exactly the keys it accepts: an unknown
    /// key's message lists them.
    #[test]
    fn dead_letter_is_refused_for_a_source_other_than_kafka() {
        let text = "[pipeline]\nname = \"p\"\n[[source]]\nname = \"x\"\nconnector = \"file\"\nformat = \"csv\"\n\
                    schema = \"a BIGINT\"\non_error = \"dead-letter\"\n[source.options]\npath = \"in.csv\"\n";
        let (config, _) = sluice_config::parse_partial(text, "p.toml");
        let config = config.expect("the item parses");
        let errors = Registry::builtin().configure_source(&config.sources[0]).err().expect("refused");
        let message = errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n");
        assert!(message.contains("on_error = \"dead-letter\" is only for the kafka source"), "{message}");
        assert!(message.contains("use on_error = \"skip\""), "{message}");
    }

    #[test]
    fn the_option_schemas_are_the_keys_each_connector_accepts() {
        let registry = Registry::builtin();
        let sinks = registry.sink_options().into_iter().map(|(name, docs)| ("sink", name, docs));
        for (kind, name, docs) in registry.source_options().into_iter().map(|(n, d)| ("source", n, d)).chain(sinks) {
            let from = if kind == "sink" { "from = \"t\"\n" } else { "" };
            let text = format!(
                "[pipeline]\nname = \"p\"\n[[{kind}]]\nname = \"x\"\nconnector = \"{name}\"\n{from}[{kind}.options]\nzzz_unknown = 1\n"
            );
            let (config, _) = sluice_config::parse_partial(&text, "p.toml");
            let config = config.expect("the item parses");
            let errors = match kind {
                "source" => registry.configure_source(&config.sources[0]).err(),
                _ => registry.configure_sink(&config.sinks[0]).err(),
            }
            .expect("an unknown key is refused");
            let message = errors.iter().map(|e| e.to_string()).find(|m| m.contains("zzz_unknown")).expect("named");
            let keys: Vec<&str> = docs.iter().map(|doc| doc.key).collect();
            let expected = if keys.is_empty() {
                "this connector takes no options".to_string()
            } else {
                format!("known keys: {}", keys.join(", "))
            };
            assert!(message.contains(&expected), "{kind} {name}: {message}");
        }
    }
}
