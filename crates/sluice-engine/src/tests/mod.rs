//! Loading pipeline files as a user writes them: every case goes through [`check_ok`] or
//! [`check_error`], which load the text with the built-in connectors (so connector
//! options, item-level keys and the SQL namespace are all checked).
//!
//! The templates below put the part under test at a known line, so each expected error
//! starts with its `line:column`.

mod cluster_tests;
mod job_tests;
mod namespace_tests;
mod sink_tests;
mod source_tests;

use std::path::Path;

use crate::{Engine, EngineError, Overrides, Pipeline};

const FILE: &str = "pipeline.toml";

fn load(toml: &str) -> Result<Pipeline, EngineError> {
    Engine::default().parse(toml, FILE, Path::new("."), Overrides::default())
}

/// Loads `toml` and runs `asserts` on the configuration; fails with the error otherwise.
#[track_caller]
pub(crate) fn check_ok(toml: &str, asserts: impl FnOnce(&sluice_config::PipelineConfig)) {
    match load(toml) {
        Ok(pipeline) => asserts(&pipeline.config),
        Err(e) => panic!("expected success, got:\n{e}\n--- input ---\n{toml}"),
    }
}

/// Loads `toml`, expecting an error whose display contains `pipeline.toml:{expected}`
/// (so `expected` starts with `line:column: `).
#[track_caller]
pub(crate) fn check_error(toml: &str, expected: &str) {
    if let Err(failure) = error_case(toml, expected) {
        panic!("{failure}");
    }
}

/// Runs [`check_error`] on each `(toml, expected)`, reporting every failing case.
#[track_caller]
pub(crate) fn check_errors(cases: &[(String, &str)]) {
    let failures: Vec<String> = cases.iter().filter_map(|(toml, expected)| error_case(toml, expected).err()).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}

fn error_case(toml: &str, expected: &str) -> Result<(), String> {
    let expected = format!("{FILE}:{expected}");
    match load(toml) {
        Ok(pipeline) => {
            Err(format!("expected error containing\n{expected}\ngot success: {pipeline:#?}\n--- input ---\n{toml}"))
        }
        Err(e) if e.to_string().contains(&expected) => Ok(()),
        Err(e) => Err(format!("expected error containing\n{expected}\ngot\n{e}\n--- input ---\n{toml}")),
    }
}

/// Every problem of `toml`, in the order reported.
pub(crate) fn all_problems(toml: &str) -> Vec<crate::Problem> {
    match load(toml) {
        Ok(pipeline) => panic!("expected errors, got {pipeline:#?}"),
        Err(error) => error.problems,
    }
}

const SINK: &str = "\n[[sink]]\nname = \"console\"\nfrom = \"bid\"\nconnector = \"stdout\"\n";

/// A valid `[pipeline]` and `[[sink]]` (lines 1-7), then `sections` from line 8.
pub(crate) fn with_sink(sections: &str) -> String {
    format!("[pipeline]\nname = \"p\"\n{SINK}{sections}")
}

/// A valid `[pipeline]` and nexmark `[[source]]` "nx" (lines 1-6), `sections` from
/// line 7, then a stdout `[[sink]]` "console".
pub(crate) fn with_source(sections: &str) -> String {
    format!("[pipeline]\nname = \"p\"\n\n[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n{sections}\n{SINK}")
}

/// A nexmark `[[source]]` "nx" (3 lines), then `lines`.
pub(crate) fn nexmark(lines: &str) -> String {
    format!("[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n{lines}")
}

/// A file `[[source]]` "f" in `format` with a schema (5 lines), then `lines`.
pub(crate) fn file_source(format: &str, lines: &str) -> String {
    format!("[[source]]\nname = \"f\"\nconnector = \"file\"\nformat = \"{format}\"\nschema = \"a BIGINT\"\n{lines}")
}

#[test]
fn the_example_loads() {
    check_ok(sluice_config::example(), |c| {
        let options = sluice_connectors::nexmark::options_of(&c.sources[0]).expect("valid");
        assert_eq!((options.events, options.rate), (Some(100_000), None));
        let format = sluice_connectors::sinks::stdout_format_of(&c.sinks[0]).expect("valid");
        assert_eq!(format, sluice_connectors::StdoutFormat::Pretty);
    });
}
