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
//!    runtime's [`SourceFactory`](sluice_runtime::SourceFactory) or
//!    [`SinkFactory`](sluice_runtime::SinkFactory), given what only planning knows (the
//!    declared schema parsed by the SQL layer, the lane layout, the sink's input schema).
//!
//! The traits live in `connector`, which every connector imports; this file imports the
//! connectors. Adding a connector (Kafka, PostgreSQL, …) means writing these two traits and one
//! [`Registry::add_source`] / [`Registry::add_sink`] call; nothing else in the workspace
//! enumerates connectors.
//!
//! The connectors that need large dependencies are cargo features (`kafka`, `postgres`,
//! `delta`), so that a build without them compiles less. A connector a build leaves out
//! stays a known name ([`LeftOut`]): a pipeline naming it is refused with the feature to
//! rebuild with, never as an unknown connector.

use sluice_config::{ConfigError, Located, OnError, Options, SinkConfig, SourceConfig, suggest};

use crate::connector::{ConfiguredSink, ConfiguredSource, OptionDoc, SinkConnector, SourceConnector, quoted};

/// Every connector a pipeline may name.
pub struct Registry {
    sources: Vec<Box<dyn SourceConnector>>,
    sinks: Vec<Box<dyn SinkConnector>>,
    /// Source connectors of this crate that this build leaves out.
    sources_left_out: &'static [LeftOut],
    /// Sink connectors of this crate that this build leaves out.
    sinks_left_out: &'static [LeftOut],
}

/// A connector of this crate behind a cargo feature the build did not enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    /// The connector's name, as `connector = "…"` writes it.
    pub name: &'static str,
    /// The cargo feature (of `sluice-connectors` and of the `sluice` binary) that builds it.
    pub feature: &'static str,
}

/// The source connectors behind features this build leaves out, in registration order.
const SOURCES_LEFT_OUT: &[LeftOut] = &[
    #[cfg(not(feature = "kafka"))]
    LeftOut { name: "kafka", feature: "kafka" },
    #[cfg(not(feature = "postgres"))]
    LeftOut { name: "postgres-cdc", feature: "postgres" },
];

/// The sink connectors behind features this build leaves out, in registration order.
const SINKS_LEFT_OUT: &[LeftOut] = &[
    #[cfg(not(feature = "kafka"))]
    LeftOut { name: "kafka", feature: "kafka" },
    #[cfg(not(feature = "postgres"))]
    LeftOut { name: "postgres", feature: "postgres" },
    #[cfg(not(feature = "delta"))]
    LeftOut { name: "delta", feature: "delta" },
];

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
        Registry { sources: Vec::new(), sinks: Vec::new(), sources_left_out: &[], sinks_left_out: &[] }
    }

    /// The connectors of this crate: sources `nexmark`, `file`, `kafka` (feature `kafka`)
    /// and `postgres-cdc` (feature `postgres`); sinks `stdout`, `file`, `blackhole`, `kafka`
    /// (feature `kafka`), `postgres` (feature `postgres`) and `delta` (feature `delta`).
    pub fn builtin() -> Registry {
        let mut registry = Registry::empty();
        registry.add_source(Box::new(crate::nexmark::NexmarkConnector));
        registry.add_source(Box::new(crate::file_source::FileConnector));
        #[cfg(feature = "kafka")]
        registry.add_source(Box::new(crate::kafka::KafkaSourceConnector));
        #[cfg(feature = "postgres")]
        registry.add_source(Box::new(crate::postgres_cdc::PostgresCdcConnector));
        registry.add_sink(Box::new(crate::sinks::StdoutConnector));
        registry.add_sink(Box::new(crate::sinks::FileSinkConnector));
        registry.add_sink(Box::new(crate::sinks::BlackholeConnector));
        #[cfg(feature = "kafka")]
        registry.add_sink(Box::new(crate::kafka::KafkaSinkConnector));
        #[cfg(feature = "postgres")]
        registry.add_sink(Box::new(crate::postgres::PostgresSinkConnector));
        #[cfg(feature = "delta")]
        registry.add_sink(Box::new(crate::delta::DeltaSinkConnector));
        registry.sources_left_out = SOURCES_LEFT_OUT;
        registry.sinks_left_out = SINKS_LEFT_OUT;
        registry
    }

    /// The source connectors of this crate that this build leaves out.
    pub fn sources_left_out(&self) -> &'static [LeftOut] {
        self.sources_left_out
    }

    /// The sink connectors of this crate that this build leaves out.
    pub fn sinks_left_out(&self) -> &'static [LeftOut] {
        self.sinks_left_out
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
            None => Err(vec![absent(
                &config.options,
                &config.connector,
                "source",
                &self.source_names(),
                self.sources_left_out,
            )]),
        }
    }

    /// Configures a `[[sink]]` with the connector it names.
    pub fn configure_sink(&self, config: &SinkConfig) -> Result<Box<dyn ConfiguredSink>, Vec<ConfigError>> {
        match self.find_sink(&config.connector.value) {
            Some(connector) => connector.configure(config),
            None => {
                Err(vec![absent(&config.options, &config.connector, "sink", &self.sink_names(), self.sinks_left_out)])
            }
        }
    }
}

/// The error for a connector this registry has not: left out of this build (the feature
/// that builds it), or no connector at all (every name this crate knows, built or not).
fn absent(
    options: &Options,
    connector: &Located<String>,
    kind: &str,
    built: &[&'static str],
    left_out: &[LeftOut],
) -> ConfigError {
    if let Some(left) = left_out.iter().find(|left| left.name == connector.value) {
        let message = format!(
            "the {kind} connector \"{}\" is not in this build of sluice: it was compiled without the cargo feature `{}`",
            left.name, left.feature
        );
        let fix = format!(
            "rebuild with `--features {}` (`cargo build --release --features {}`; `--features full` builds every \
             connector, as the release builds and the Docker image do)",
            left.feature, left.feature
        );
        return options.item_error(connector.position, &message, &fix);
    }
    let known: Vec<&str> = built.iter().copied().chain(left_out.iter().map(|left| left.name)).collect();
    unknown(options, connector, kind, &known)
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

#[cfg(test)]
mod tests {
    use super::{LeftOut, Registry};

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

    /// A connector the build left out is refused with the feature that builds it, and is
    /// among the known names for a misspelt one (a made-up connector, so that the test
    /// holds in every build).
    #[test]
    fn a_left_out_connector_is_refused_with_the_feature_that_builds_it() {
        const LEFT_OUT: &[LeftOut] = &[LeftOut { name: "warehouse", feature: "warehouse-sink" }];
        let mut registry = Registry::empty();
        registry.add_sink(Box::new(crate::sinks::BlackholeConnector));
        registry.sinks_left_out = LEFT_OUT;
        let refusal = |connector: &str| {
            let text = format!(
                "[pipeline]\nname = \"p\"\n[[sink]]\nname = \"x\"\nconnector = \"{connector}\"\nfrom = \"t\"\n"
            );
            let (config, _) = sluice_config::parse_partial(&text, "p.toml");
            let errors = registry.configure_sink(&config.expect("the item parses").sinks[0]).err().expect("refused");
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
        };
        let message = refusal("warehouse");
        assert!(message.contains("the sink connector \"warehouse\" is not in this build of sluice"), "{message}");
        assert!(message.contains("compiled without the cargo feature `warehouse-sink`"), "{message}");
        assert!(message.contains("rebuild with `--features warehouse-sink`"), "{message}");
        let message = refusal("warehous");
        assert!(message.contains("must be one of \"blackhole\", \"warehouse\""), "{message}");
        assert!(message.contains("did you mean connector = \"warehouse\"?"), "{message}");
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
