//! Data-driven tests: every case goes through [`check_ok`] or [`check_error`].
//!
//! The templates below put the part under test at a known line, so each expected
//! error starts with its `line:column`.

mod document_tests;
mod pipeline_tests;
mod sink_tests;
mod source_tests;

use crate::{PipelineConfig, parse};

const FILE: &str = "pipeline.toml";

/// Parses `toml` and runs `asserts` on the result; fails with the error otherwise.
#[track_caller]
pub(crate) fn check_ok(toml: &str, asserts: impl FnOnce(&PipelineConfig)) {
    match parse(toml, FILE) {
        Ok(config) => asserts(&config),
        Err(e) => panic!("expected success, got:\n{e}\n--- input ---\n{toml}"),
    }
}

/// Parses `toml`, expecting an error whose display contains
/// `pipeline.toml:{expected}` (so `expected` starts with `line:column: `, or with a
/// space for an error without a position).
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
    match parse(toml, FILE) {
        Ok(config) => {
            Err(format!("expected error containing\n{expected}\ngot success: {config:#?}\n--- input ---\n{toml}"))
        }
        Err(e) if e.to_string().contains(&expected) => Ok(()),
        Err(e) => Err(format!("expected error containing\n{expected}\ngot\n{e}\n--- input ---\n{toml}")),
    }
}

const SINK: &str = "\n[[sink]]\nname = \"console\"\nfrom = \"bid\"\nconnector = \"stdout\"\n";

/// `[pipeline]` with `body` from line 2, then a nexmark source and a stdout sink.
pub(crate) fn pipeline_with(body: &str) -> String {
    format!("[pipeline]\n{body}\n\n[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n{SINK}")
}

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
fn templates_are_valid() {
    check_ok(&pipeline_with("name = \"p\""), |_| {});
    check_ok(&with_sink(&nexmark("")), |_| {});
    check_ok(&with_source(""), |_| {});
    check_ok(&with_sink(&file_source("csv", "[source.options]\npath = \"in.csv\"\n")), |_| {});
}

#[test]
fn example_parses() {
    check_ok(crate::example(), |c| {
        assert_eq!(c.pipeline.name, "hot-auctions");
        assert_eq!(c.sources.len(), 1);
        assert_eq!(c.sources[0].connector.value, "nexmark");
        assert_eq!(c.sources[0].options.keys(), ["events"]);
        assert_eq!(c.views.len(), 1);
        assert!(c.views[0].sql.value.starts_with("SELECT auction, COUNT(*) AS bids"));
        assert!(c.views[0].sql.value.contains("TUMBLE(TABLE bid, DESCRIPTOR(dateTime)"));
        assert_eq!(c.sinks[0].from, "bids_per_auction");
        assert_eq!(c.sinks[0].connector.value, "stdout");
    });
}
