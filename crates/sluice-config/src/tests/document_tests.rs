//! The document as a whole: top-level keys, required sections, unique names, TOML
//! syntax errors, inline and dotted tables, error ordering.

use super::{check_error, check_errors, check_ok, nexmark, with_sink, with_source};
use crate::{ConfigError, Position, parse_all};

const PIPELINE: &str = "[pipeline]\nname = \"p\"\n";
const SOURCE: &str = "[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n";
const SINK: &str = "[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"stdout\"\n";

fn all_errors(toml: &str) -> Vec<ConfigError> {
    match parse_all(toml, "pipeline.toml") {
        Ok(config) => panic!("expected errors, got {config:#?}"),
        Err(errors) => errors,
    }
}

#[test]
fn top_level() {
    let known = "known keys: pipeline, checkpoint, source, view, sink";
    let checkpoint = "5:1: [checkpoint]: `guarantee` must be one of \"exactly-once\", \"at-least-once\"";
    let sources = format!("4:3: unknown key `sources` at the top level; {known}\n  fix: did you mean `source`?");
    let pipelin = format!("1:2: unknown key `pipelin` at the top level; {known}\n  fix: did you mean `pipeline`?");
    let stray = format!("1:1: unknown key `debug` at the top level; {known}\n  fix: remove `debug`");
    check_errors(&[
        ("".to_owned(), " missing [pipeline] section\n  fix: add a [pipeline] section"),
        (format!("{SOURCE}{SINK}"), " missing [pipeline] section"),
        (
            format!("{PIPELINE}{SINK}"),
            " no [[source]] section: a pipeline needs at least one source\n  fix: add a [[source]] section",
        ),
        (format!("{PIPELINE}{SOURCE}"), " no [[sink]] section: a pipeline needs at least one sink"),
        (format!("source = []\n{PIPELINE}{SINK}"), "1:1: no [[source]] section: a pipeline needs at least one source"),
        (format!("{PIPELINE}\n[checkpoint]\nguarantee = \"twice\"\n{SOURCE}{SINK}"), checkpoint),
        (format!("{PIPELINE}\n[[sources]]\nname = \"nx\"\nconnector = \"nexmark\"\n{SINK}"), &sources),
        (format!("[pipelin]\nname = \"p\"\n{SOURCE}{SINK}"), &pipelin),
        (format!("debug = true\n{PIPELINE}{SOURCE}{SINK}"), &stray),
        (
            format!("pipeline = 3\n{SOURCE}{SINK}"),
            "1:1: top level: `pipeline` must be a table ([pipeline]), found 3\n  fix: write it as a [pipeline] section",
        ),
        (
            format!("{PIPELINE}[source]\nname = \"nx\"\n{SINK}"),
            "3:2: top level: `source` must be an array of tables, found a table\n  fix: write each source under its own [[source]] header (two brackets)",
        ),
        (
            format!("{PIPELINE}{SOURCE}{SINK}view = \"v\"\n"),
            "10:1: unknown key `view` in [[sink]] \"out\"; known keys: name, from, connector, format, worker, options",
        ),
        (
            format!("view = [1]\n{PIPELINE}{SOURCE}{SINK}"),
            "1:1: top level: `view` must be an array of tables, found [1]",
        ),
    ]);
    // A misspelt section is reported once, as misspelt, not also as missing.
    let errors = all_errors(&format!("[pipelin]\nname = \"p\"\n{SOURCE}[[sinks]]\nname = \"o\""));
    assert_eq!(errors.len(), 2, "{errors:#?}");
}

#[test]
fn duplicate_names() {
    let two = |a: &str, b: &str| with_sink(&format!("{a}\n{b}"));
    let file = |name: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nconnector = \"file\"\nformat = \"json\"\nschema = \"a INT\"\noptions.path = \"x\"\n"
        )
    };
    let view = |name: &str| format!("[[view]]\nname = \"{name}\"\nsql = \"SELECT 1\"\n");
    check_errors(&[
        (
            two(&file("a"), &file("a")),
            "16:1: [[source]] \"a\": name \"a\" is already used by [[source]] \"a\" at line 9\n  fix: give every source and view its own name",
        ),
        (two(&file("a"), &view("A")), "16:1: [[view]] \"A\": name \"A\" is already used by [[source]] \"a\" at line 9"),
        (
            with_source(&format!("{}\n{}", view("v"), view("v"))),
            "12:1: [[view]] \"v\": name \"v\" is already used by [[view]] \"v\" at line 8",
        ),
        (with_source(&view("nx")), "8:1: [[view]] \"nx\": name \"nx\" is already used by [[source]] \"nx\" at line 5"),
        (
            with_source(&SINK.replace("\"out\"", "\"console\"")),
            "14:1: [[sink]] \"console\": name \"console\" is already used by [[sink]] \"console\" at line 8\n  fix: give every sink its own name",
        ),
    ]);
}

#[test]
fn toml_syntax_errors() {
    check_errors(&[
        (
            format!("[pipeline]\nname = \"p\nthreads = 2\n{SOURCE}{SINK}"),
            "2:10: TOML syntax error: invalid basic string",
        ),
        (format!("{PIPELINE}threads = \n{SOURCE}{SINK}"), "3:11: TOML syntax error: "),
        (format!("{PIPELINE}[[source]\n"), "3:9: TOML syntax error: "),
        (format!("{PIPELINE}name = \"q\"\n{SOURCE}{SINK}"), "3:1: TOML syntax error: duplicate key `name`"),
        (
            format!("{PIPELINE}{SOURCE}{SINK}[pipeline]\n"),
            "10:1: TOML syntax error: invalid table header; duplicate key `\"pipeline\"` in document root\n  fix: remove or rename the second definition",
        ),
    ]);
    check_error(
        "[pipeline]\nname = \"p\nthreads = 2\n",
        "2:10: TOML syntax error: invalid basic string\n  fix: correct the TOML syntax here",
    );
}

#[test]
fn inline_and_dotted_tables() {
    let inline = format!(
        "source = [{{ name = \"nx\", connector = \"nexmark\", options = {{ events = 5 }} }}]\n{PIPELINE}{SINK}"
    );
    check_ok(&inline, |c| {
        assert_eq!(c.sources[0].position, Position::new(1, 11));
        assert_eq!(c.sources[0].options.keys(), ["events"]);
    });
    let dotted = with_sink(&nexmark("options.events = 7\noptions.seed = 3\n"));
    check_ok(&dotted, |c| assert_eq!(c.sources[0].options.keys(), ["events", "seed"]));
    let pipeline_dotted = format!("pipeline.name = \"p\"\npipeline.threads = 3\n{SOURCE}{SINK}");
    check_ok(&pipeline_dotted, |c| assert_eq!(c.pipeline.threads, 3));
}

#[test]
fn errors_in_file_order() {
    let toml = format!("[pipeline]\nname = \"p\"\nthreads = 0\n{SOURCE}rate = 1\n{SINK}form = \"xml\"\n");
    let errors = all_errors(&toml);
    let positions: Vec<Option<Position>> = errors.iter().map(|e| e.position).collect();
    assert_eq!(
        positions,
        [Some(Position::new(3, 1)), Some(Position::new(7, 1)), Some(Position::new(12, 1))],
        "{errors:#?}"
    );
    check_error(&toml, "3:1: [pipeline]: `threads`");
    // Errors without a position (about the file as a whole) come first.
    let errors = all_errors(&format!("[pipeline]\nname = \"p\"\nthreads = 0\n{SOURCE}"));
    assert_eq!(errors[0].position, None);
    assert!(errors[0].message.contains("no [[sink]]"));
}

#[test]
fn full_file() {
    let toml = r#"
[pipeline]
name = "hot-items"
threads = 2
vnodes = 128
shutdown_timeout = "5s"
batch_size = 1024
queue_batches = 4

[[source]]
name = "bids"
connector = "file"
format = "csv"
schema = "auction BIGINT, price BIGINT, date_time TIMESTAMP(3)"
event_time = "date_time"
watermark_delay = "4s"
on_error = "fail"
[source.options]
path = "data/bids.csv"
header = false
delimiter = "|"

[[view]]
name = "hot_items"
sql = """
SELECT auction, COUNT(*) AS n FROM bids GROUP BY auction
"""
materialized = false

[[sink]]
name = "out"
from = "hot_items"
connector = "file"
format = "csv"
[sink.options]
path = "out/hot_items.csv"
"#;
    check_ok(toml, |c| {
        assert_eq!(c.pipeline.vnodes, 128);
        let s = &c.sources[0];
        assert_eq!(s.position, Position::new(10, 1));
        assert_eq!(s.schema.as_ref().map(|l| l.position), Some(Position::new(14, 11)));
        assert_eq!(s.options.keys(), ["path", "header", "delimiter"]);
        assert_eq!(c.views[0].sql.position, Position::new(26, 1));
        assert_eq!(c.views[0].sql.locate(1, 27), Position::new(26, 27));
        assert_eq!(c.sinks[0].connector.value, "file");
    });
}

#[test]
fn checkpoint_section_defaults_and_values() {
    use crate::{CheckpointSection, Compression, Guarantee};
    check_ok(&format!("{PIPELINE}{SOURCE}{SINK}"), |c| assert_eq!(c.checkpoint, None));
    check_ok(&format!("{PIPELINE}\n[checkpoint]\n{SOURCE}{SINK}"), |c| {
        assert_eq!(
            c.checkpoint,
            Some(CheckpointSection {
                interval: std::time::Duration::from_secs(10),
                timeout: std::time::Duration::from_secs(600),
                store: "file://./sluice-state".into(),
                guarantee: Guarantee::ExactlyOnce,
                retain: 3,
                max_failed_checkpoints: 3,
                compression: Compression::Lz4Merged,
            })
        )
    });
    let custom = "[checkpoint]\ninterval = \"500ms\"\nstore = \"s3://b/p\"\nguarantee = \"at-least-once\"\nretain = 5\nmax_failed_checkpoints = 2\ncompression = \"none\"\n";
    check_ok(&format!("{PIPELINE}\n{custom}{SOURCE}{SINK}"), |c| {
        let checkpoint = c.checkpoint.as_ref().expect("section");
        assert_eq!(checkpoint.interval, std::time::Duration::from_millis(500));
        assert_eq!(
            (checkpoint.store.as_str(), checkpoint.guarantee, checkpoint.retain),
            ("s3://b/p", Guarantee::AtLeastOnce, 5)
        );
        assert_eq!(checkpoint.max_failed_checkpoints, 2);
        assert_eq!(checkpoint.compression, Compression::None);
    });
}

#[test]
fn materialized_tables_need_exactly_once_checkpoints() {
    let source = "[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\nmaterialized = true\n";
    let view = "[[view]]\nname = \"v\"\nsql = \"SELECT * FROM bid\"\nmaterialized = true\n";
    let sink = "[[sink]]\nname = \"out\"\nfrom = \"v\"\nconnector = \"stdout\"\n";
    let checkpoint = "[checkpoint]\ninterval = \"1s\"\n";
    check_ok(&format!("[pipeline]\nname = \"p\"\n{checkpoint}{source}{view}{sink}"), |c| {
        assert_eq!(c.sources[0].materialized, Some(crate::Position::new(8, 1)));
        assert_eq!(c.views[0].materialized, Some(crate::Position::new(12, 1)));
    });
    check_error(
        &format!("[pipeline]\nname = \"p\"\n{source}{sink}"),
        "6:1: [[source]] \"nx\": `materialized = true` needs a [checkpoint] section",
    );
    check_error(
        &format!("[pipeline]\nname = \"p\"\n{checkpoint}guarantee = \"at-least-once\"\n{source}{view}{sink}"),
        "9:1: [[source]] \"nx\": `materialized = true` needs guarantee = \"exactly-once\"",
    );
}
