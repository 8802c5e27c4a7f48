//! `[[source]]` and `[source.options]` as the built-in source connectors validate them.
//! Sources start at line 8 ([`with_sink`]).

use std::path::PathBuf;
use std::time::Duration;

use sluice_config::{OnError, Position, SourceConfig};
use sluice_connectors::{FileFormat, FileOptions, NexmarkOptions};

use super::{all_problems, check_error, check_errors, check_ok, file_source, nexmark, with_sink};

fn nexmark_of(source: &SourceConfig) -> NexmarkOptions {
    sluice_connectors::nexmark::options_of(source).expect("valid nexmark options")
}

fn file_of(source: &SourceConfig) -> FileOptions {
    sluice_connectors::file_source::options_of(source).expect("valid file options")
}

/// A nexmark source whose options (header at line 11) are `lines`, from line 12.
fn nexmark_options(lines: &str) -> String {
    with_sink(&nexmark(&format!("[source.options]\n{lines}")))
}

/// A file source in `format` with `path = "in.csv"` (line 14), then `lines` from line 15.
fn file_options(format: &str, lines: &str) -> String {
    with_sink(&file_source(format, &format!("[source.options]\npath = \"in.csv\"\n{lines}")))
}

#[test]
fn nexmark_defaults_and_values() {
    check_ok(&with_sink(&nexmark("")), |c| {
        let s = &c.sources[0];
        assert_eq!(s.name, "nx");
        assert_eq!(s.position, Position::new(8, 1));
        assert_eq!(s.schema, None);
        assert_eq!(s.event_time, None);
        assert_eq!(s.watermark_delay, Duration::ZERO);
        assert_eq!(s.on_error, OnError::Skip);
        assert_eq!(nexmark_of(s), NexmarkOptions { events: None, rate: None, seed: 0, first_event_rate: 10_000 });
    });
    let options = "events = 1_000\nrate = 2.5\nseed = 7\nfirst_event_rate = 50";
    check_ok(&nexmark_options(options), |c| {
        assert_eq!(
            nexmark_of(&c.sources[0]),
            NexmarkOptions { events: Some(1000), rate: Some(2.5), seed: 7, first_event_rate: 50 }
        );
    });
    check_ok(&nexmark_options("rate = 100000"), |c| {
        let options = nexmark_of(&c.sources[0]);
        assert_eq!(options.rate, Some(100_000.0));
        // Without explicit spacing, event time keeps pace with the rate-limited wall clock.
        assert_eq!(options.first_event_rate, 100_000);
    });
    let timed = "event_time = \"dateTime\"\nwatermark_delay = \"4s\"\non_error = \"fail\"";
    check_ok(&with_sink(&nexmark(timed)), |c| {
        let s = &c.sources[0];
        assert_eq!(s.event_time.as_deref(), Some("dateTime"));
        assert_eq!(s.watermark_delay, Duration::from_secs(4));
        assert_eq!(s.on_error, OnError::Fail);
    });
}

#[test]
fn file_defaults_and_values() {
    check_ok(&file_options("json", ""), |c| {
        let s = &c.sources[0];
        let schema = s.schema.as_ref().map(|l| (l.value.as_str(), l.position));
        assert_eq!(schema, Some(("a BIGINT", Position::new(12, 11))));
        // Without a header line by default, as Flink's CSV format.
        assert_eq!(
            file_of(s),
            FileOptions {
                path: PathBuf::from("in.csv"),
                format: FileFormat::Json,
                header: false,
                delimiter: b',',
                rate: None,
                split_bytes: None,
                changelog: None,
            }
        );
    });
    check_ok(&file_options("json", "rate = 250.5"), |c| {
        assert_eq!(file_of(&c.sources[0]).rate, Some(250.5));
    });
    check_ok(&file_options("csv", "header = true\ndelimiter = \"\\t\""), |c| {
        let options = file_of(&c.sources[0]);
        assert_eq!((options.format, options.header, options.delimiter), (FileFormat::Csv, true, b'\t'));
    });
    // Relative paths stay as written.
    let dir = with_sink(&file_source("csv", "options = { path = \"./data/\" }\n"));
    check_ok(&dir, |c| {
        assert_eq!(file_of(&c.sources[0]).path, PathBuf::from("./data/"));
    });
}

/// The connector's name is checked against the registry (the other common keys are the
/// configuration parser's, tested there).
#[test]
fn an_unknown_connector_is_named_with_the_known_ones() {
    let src = |lines: &str| with_sink(&format!("[[source]]\n{lines}"));
    check_errors(&[
        (
            src("name = \"s\"\nconnector = \"postgres\""),
            "10:1: [[source]] \"s\": `connector` must be one of \"nexmark\", \"file\", \"kafka\", \"postgres-cdc\", found \"postgres\" (no source connector has that name)\n  fix: set connector to one of \"nexmark\", \"file\", \"kafka\", \"postgres-cdc\"",
        ),
        (
            src("name = \"s\"\nconnector = \"nexmrk\""),
            "10:1: [[source]] \"s\": `connector` must be one of \"nexmark\", \"file\", \"kafka\", \"postgres-cdc\", found \"nexmrk\" (no source connector has that name)\n  fix: did you mean connector = \"nexmark\"?",
        ),
    ]);
}

#[test]
fn unknown_source_keys() {
    let known = "known keys: name, connector, format, schema, event_time, watermark_delay, max_watermark_drift, \
                 on_error, materialized, primary_key, options";
    let conector =
        format!("10:1: unknown key `conector` in [[source]] \"s\"; {known}\n  fix: did you mean `connector`?");
    let rate = format!(
        "11:1: unknown key `rate` in [[source]] \"nx\"; {known}\n  fix: connector options go under a [source.options] header; remove it here or move it there"
    );
    let opt = "known keys: events, rate, seed, first_event_rate";
    let evnets = format!(
        "12:1: unknown key `evnets` in [source.options] of [[source]] \"nx\"; {opt}\n  fix: did you mean `events`?"
    );
    let topic =
        format!("12:1: unknown key `topic` in [source.options] of [[source]] \"nx\"; {opt}\n  fix: remove `topic`");
    let fopt = "known keys: path, header, delimiter, rate, split_bytes";
    let hdr = format!(
        "15:1: unknown key `headers` in [source.options] of [[source]] \"f\"; {fopt}\n  fix: did you mean `header`?"
    );
    check_errors(&[
        // The misspelt `connector` is the first error, not a missing `connector`.
        (with_sink("[[source]]\nname = \"s\"\nconector = \"nexmark\""), &conector),
        (with_sink(&nexmark("rate = 10")), &rate),
        (nexmark_options("evnets = 10"), &evnets),
        (nexmark_options("topic = \"bids\""), &topic),
        (
            nexmark_options("path = \"x\""),
            "12:1: unknown key `path` in [source.options] of [[source]] \"nx\"; known keys: events, rate, seed, first_event_rate\n  fix: remove `path`",
        ),
        (file_options("csv", "headers = true"), &hdr),
    ]);
}

#[test]
fn nexmark_bad_values() {
    let int_ge = |key: &str, min: u8, found: &str| {
        format!("12:1: [[source]] \"nx\": `{key}` must be an integer >= {min}, found {found}\n  fix: set {key}")
    };
    let rate = |found: &str| {
        format!(
            "12:1: [[source]] \"nx\": `rate` must be a number > 0, found {found}\n  fix: set rate to events per second, e.g. rate = 100000"
        )
    };
    let cases = [
        (nexmark_options("events = 0"), int_ge("events", 1, "0")),
        (nexmark_options("events = -5"), int_ge("events", 1, "-5")),
        (nexmark_options("events = \"many\""), int_ge("events", 1, "\"many\"")),
        (nexmark_options("events = 1e6"), int_ge("events", 1, "1e6")),
        (nexmark_options("rate = \"fast\""), rate("\"fast\"")),
        (nexmark_options("rate = 0"), rate("0")),
        (nexmark_options("rate = -1.5"), rate("-1.5")),
        (nexmark_options("rate = nan"), rate("nan")),
        (nexmark_options("rate = inf"), rate("inf")),
        (nexmark_options("seed = -1"), int_ge("seed", 0, "-1")),
        (nexmark_options("seed = \"x\""), int_ge("seed", 0, "\"x\"")),
        (nexmark_options("first_event_rate = 0"), int_ge("first_event_rate", 1, "0")),
        (nexmark_options("first_event_rate = 1.5"), int_ge("first_event_rate", 1, "1.5")),
    ];
    let cases: Vec<(String, &str)> = cases.iter().map(|(t, e)| (t.clone(), e.as_str())).collect();
    check_errors(&cases);
    check_errors(&[
        (
            with_sink(&nexmark("format = \"json\"")),
            "11:1: [[source]] \"nx\": `format` is not allowed here (the nexmark connector generates its events itself), found \"json\"\n  fix: remove `format`",
        ),
        (
            with_sink(&nexmark("schema = \"a INT\"")),
            "11:11: [[source]] \"nx\": `schema` is not allowed here (nexmark tables person, auction and bid have fixed schemas), found \"a INT\"\n  fix: remove `schema`",
        ),
    ]);
}

#[test]
fn exact_display() {
    let toml = with_sink("[[source]]\nname = \"bids\"\nconnector = \"nexmark\"\n[source.options]\nrate = \"fast\"");
    match super::load(&toml) {
        Ok(_) => panic!("expected an error"),
        Err(e) => assert_eq!(
            e.to_string(),
            "pipeline.toml:12:1: [[source]] \"bids\": `rate` must be a number > 0, found \"fast\"\n  fix: set rate to events per second, e.g. rate = 100000"
        ),
    }
}

#[test]
fn file_bad_values() {
    let f = |format: &str, lines: &str| with_sink(&file_source(format, lines));
    let src = |lines: &str| {
        with_sink(&format!("[[source]]\nname = \"f\"\nconnector = \"file\"\n{lines}\noptions.path = \"x\""))
    };
    let delim = "`delimiter` must be a single ASCII character such as \",\" or \"\\t\", found";
    let d1 = format!("15:1: [[source]] \"f\": {delim} \";;\"");
    let d2 = format!("15:1: [[source]] \"f\": {delim} \"é\"");
    let d3 = format!("15:1: [[source]] \"f\": {delim} 44");
    check_errors(&[
        (
            src("schema = \"a INT\""),
            "8:1: [[source]] \"f\": missing required key `format`\n  fix: add format = \"json\" or \"csv\"",
        ),
        (
            src("format = \"avro\"\nschema = \"a INT\""),
            "11:1: [[source]] \"f\": `format` must be one of \"json\", \"csv\", \"changelog-json\", \"changelog-csv\", \"debezium-json\", found \"avro\"\n  fix: set format to one of \"json\", \"csv\", \"changelog-json\", \"changelog-csv\", \"debezium-json\"",
        ),
        (
            src("format = \"jsn\"\nschema = \"a INT\""),
            "11:1: [[source]] \"f\": `format` must be one of \"json\", \"csv\", \"changelog-json\", \"changelog-csv\", \"debezium-json\", found \"jsn\"\n  fix: did you mean format = \"json\"?",
        ),
        (src("format = \"json\""), "8:1: [[source]] \"f\": missing required key `schema`\n  fix: add the columns"),
        (
            f("json", ""),
            "8:1: [[source]] \"f\": missing required key `path` in [source.options]\n  fix: add path = \"<file or directory>\" under [source.options] (relative paths are relative to the pipeline file)",
        ),
        (
            f("json", "[source.options]\nheader = true"),
            "13:1: [[source]] \"f\": missing required key `path` in [source.options]",
        ),
        (
            f("json", "[source.options]\npath = 5"),
            "14:1: [[source]] \"f\": `path` must be a non-empty file or directory path, found 5",
        ),
        (
            f("json", "[source.options]\npath = \"\""),
            "14:1: [[source]] \"f\": `path` must be a non-empty file or directory path, found \"\"",
        ),
        (
            file_options("csv", "header = \"yes\""),
            "15:1: [[source]] \"f\": `header` must be true or false, found \"yes\"\n  fix: set header = true or header = false",
        ),
        (file_options("csv", "delimiter = \";;\""), &d1),
        (file_options("csv", "delimiter = \"é\""), &d2),
        (file_options("csv", "delimiter = 44"), &d3),
        (
            file_options("json", "header = true"),
            "15:1: [[source]] \"f\": `header` is not allowed here (it applies to csv files only, and the format reads JSON lines), found true\n  fix: remove `header`, or set format = \"csv\"",
        ),
        (
            file_options("json", "delimiter = \";\""),
            "15:1: [[source]] \"f\": `delimiter` is not allowed here (it applies to csv files only, and the format reads JSON lines), found \";\"",
        ),
    ]);
}

#[test]
fn every_error_is_collected() {
    let toml = with_sink(&nexmark("[source.options]\nevents = 0\nrate = \"fast\"\nseed = -1"));
    let lines: Vec<Option<usize>> = all_problems(&toml).iter().map(|p| p.position.map(|p| p.line)).collect();
    assert_eq!(lines, [Some(12), Some(13), Some(14)]);
    check_error(&toml, "12:1: [[source]] \"nx\": `events`");
}
