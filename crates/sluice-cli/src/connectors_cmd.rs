//! `sluice connectors [--format text|markdown] [NAME]`: every connector a pipeline may
//! name, with the options each takes, read from the connector registry (nothing here
//! lists connectors or options by hand).
//!
//! The Markdown form is what the connector pages of `docs/connectors/` hold between
//! their `<!-- generated: … -->` markers; `tests/cli/docs.rs` fails when a page and
//! this output differ, so a changed option cannot leave its page behind.

use std::process::ExitCode;

use sluice_engine::{Engine, EngineError};
use sluice_types::SluiceError;

use crate::output;

/// How the options are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns, for a terminal.
    Text,
    /// One Markdown table per connector and kind (source, sink), as the docs hold them.
    Markdown,
}

/// `sluice connectors`' arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectorsArgs {
    /// How the options are printed.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Only the connector of this name (its source and its sink, when it has both).
    #[arg(value_name = "NAME")]
    name: Option<String>,
}

/// One option of one connector, as the registry documents it.
struct Row {
    key: &'static str,
    kind: &'static str,
    default: &'static str,
    doc: &'static str,
}

/// One connector of one kind with its options.
struct Connector {
    /// `source` or `sink`.
    kind: &'static str,
    name: &'static str,
    options: Vec<Row>,
}

pub fn main(engine: &Engine, args: &ConnectorsArgs) -> Result<ExitCode, EngineError> {
    let registry = engine.registry();
    let mut connectors = Vec::new();
    for (kind, list) in [("source", registry.source_options()), ("sink", registry.sink_options())] {
        for (name, docs) in list {
            let options =
                docs.iter().map(|d| Row { key: d.key, kind: d.kind, default: d.default, doc: d.doc }).collect();
            connectors.push(Connector { kind, name, options });
        }
    }
    if let Some(name) = &args.name {
        connectors.retain(|c| c.name == name);
        let left_out = registry.sources_left_out().iter().chain(registry.sinks_left_out()).find(|c| c.name == name);
        if let (true, Some(left)) = (connectors.is_empty(), left_out) {
            let message = format!(
                "the connector \"{name}\" is not in this build of sluice: it was compiled without the cargo feature `{}`",
                left.feature
            );
            let fix = format!("rebuild with `--features {}` (`--features full`: every connector)", left.feature);
            return Err(EngineError::new(SluiceError::user("cli.connector_left_out", message).with_fix(fix)));
        }
        if connectors.is_empty() {
            let mut known: Vec<&str> = registry.source_names();
            known.extend(registry.sink_names());
            known.sort_unstable();
            known.dedup();
            let error = SluiceError::user("cli.unknown_connector", format!("no connector is named \"{name}\""))
                .with_fix(format!("name one of: {}", known.join(", ")));
            return Err(EngineError::new(error));
        }
    }
    let text = match args.format {
        Format::Text => text(&connectors),
        Format::Markdown => markdown(&connectors),
    };
    output::text(&text);
    Ok(ExitCode::SUCCESS)
}

fn text(connectors: &[Connector]) -> String {
    let mut text = String::new();
    for connector in connectors {
        text.push_str(&format!("{} connector = \"{}\"\n", connector.kind, connector.name));
        if connector.options.is_empty() {
            text.push_str("  (no options)\n");
        }
        for row in &connector.options {
            text.push_str(&format!("  {:<18} {:<26} default {:<24} {}\n", row.key, row.kind, row.default, row.doc));
        }
    }
    text
}

/// A heading per connector and kind, then its options as a table (or a sentence saying
/// it takes none). Cells escape `|`, which would end a cell on a code host.
fn markdown(connectors: &[Connector]) -> String {
    let mut text = String::new();
    for (index, connector) in connectors.iter().enumerate() {
        if index > 0 {
            text.push('\n');
        }
        text.push_str(&format!("### `{}` {} options\n\n", connector.name, connector.kind));
        if connector.options.is_empty() {
            text.push_str(&format!("`[{}.options]` takes no keys.\n", connector.kind));
            continue;
        }
        text.push_str(&format!("Under `[{}.options]`:\n\n", connector.kind));
        text.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        for row in &connector.options {
            text.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                row.key,
                cell(row.kind),
                cell(row.default),
                cell(row.doc)
            ));
        }
    }
    text
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::{Connector, Row, markdown};

    #[test]
    fn markdown_escapes_bars_and_says_when_there_are_no_options() {
        let connectors = [
            Connector {
                kind: "sink",
                name: "x",
                options: vec![Row { key: "mode", kind: "a | b", default: "a", doc: "which" }],
            },
            Connector { kind: "sink", name: "y", options: Vec::new() },
        ];
        let expected = "### `x` sink options\n\nUnder `[sink.options]`:\n\n\
                        | key | type | default | meaning |\n|---|---|---|---|\n\
                        | `mode` | a \\| b | a | which |\n\n\
                        ### `y` sink options\n\n`[sink.options]` takes no keys.\n";
        assert_eq!(markdown(&connectors), expected);
    }
}
