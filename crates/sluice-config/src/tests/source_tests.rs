//! `[[source]]`: the keys every source has. Connector options (`[source.options]`) are
//! kept, unread, for the connector (the engine's tests cover their validation). Sources
//! start at line 8 ([`with_sink`]).

use std::time::Duration;

use super::{check_errors, check_ok, file_source, nexmark, with_sink};
use crate::{OnError, Position};

#[test]
fn common_keys_and_defaults() {
    check_ok(&with_sink(&nexmark("")), |c| {
        let s = &c.sources[0];
        assert_eq!(s.name, "nx");
        assert_eq!(s.position, Position::new(8, 1));
        assert_eq!((s.connector.value.as_str(), s.connector.position), ("nexmark", Position::new(10, 1)));
        assert_eq!((s.format.clone(), s.schema.clone(), s.event_time.clone()), (None, None, None));
        assert_eq!(s.watermark_delay, Duration::ZERO);
        assert_eq!(s.max_watermark_drift, None, "the connector's default");
        assert_eq!(s.on_error, OnError::Skip);
        assert!(s.options.keys().is_empty());
    });
    let timed =
        "event_time = \"dateTime\"\nwatermark_delay = \"4s\"\nmax_watermark_drift = \"30s\"\non_error = \"fail\"";
    check_ok(&with_sink(&nexmark(timed)), |c| {
        let s = &c.sources[0];
        assert_eq!(s.event_time.as_deref(), Some("dateTime"));
        assert_eq!(s.watermark_delay, Duration::from_secs(4));
        assert_eq!(s.max_watermark_drift, Some(Duration::from_secs(30)));
        assert_eq!(s.on_error, OnError::Fail);
    });
    // Accepted here; the connector decides whether it can write a dead-letter topic.
    check_ok(&with_sink(&nexmark("on_error = \"dead-letter\"")), |c| {
        assert_eq!(c.sources[0].on_error, OnError::DeadLetter);
    });
    check_ok(&with_sink(&file_source("json", "[source.options]\npath = \"in.csv\"\nrate = 2\n")), |c| {
        let s = &c.sources[0];
        assert_eq!(s.format.as_ref().map(|f| (f.value.as_str(), f.position)), Some(("json", Position::new(11, 1))));
        // A schema's position is its content's: SQL errors point inside it.
        assert_eq!(
            s.schema.as_ref().map(|l| (l.value.as_str(), l.position)),
            Some(("a BIGINT", Position::new(12, 11)))
        );
        assert_eq!(s.options.keys(), ["path", "rate"]);
        assert_eq!(s.options.position(), Position::new(13, 1));
        assert_eq!(s.options.label(), "[[source]] \"f\"");
    });
}

#[test]
fn bad_common_keys() {
    let src = |lines: &str| with_sink(&format!("[[source]]\n{lines}"));
    let n = |lines: &str| with_sink(&nexmark(lines));
    check_errors(&[
        (
            src("name = \"s\""),
            "8:1: [[source]] \"s\": missing required key `connector`\n  fix: add connector = \"file\" or \"nexmark\"",
        ),
        (src("name = \"s\"\nconnector = 1"), "10:1: [[source]] \"s\": `connector` must be a connector name, found 1"),
        (
            src("name = \"s\"\nconnector = \"\""),
            "10:1: [[source]] \"s\": `connector` must be a connector name, found \"\"",
        ),
        (
            src("connector = \"nexmark\""),
            "8:1: [[source]] #1: missing required key `name`\n  fix: add name = \"source_1\"",
        ),
        (
            src("name = \"hot-items\"\nconnector = \"nexmark\""),
            "9:1: [[source]] #1: `name` must be a SQL identifier ([A-Za-z_][A-Za-z0-9_]*), found \"hot-items\"\n  fix: use letters, digits and `_`, not starting with a digit, e.g. name = \"hot_items\"",
        ),
        (
            src("name = \"1x\"\nconnector = \"nexmark\""),
            "9:1: [[source]] #1: `name` must be a SQL identifier ([A-Za-z_][A-Za-z0-9_]*), found \"1x\"\n  fix: use letters, digits and `_`, not starting with a digit, e.g. name = \"_1x\"",
        ),
        (n("event_time = 5"), "11:1: [[source]] \"nx\": `event_time` must be a column name, found 5"),
        (n("event_time = \" \""), "11:1: [[source]] \"nx\": `event_time` must be a column name, found \" \""),
        (
            n("watermark_delay = \"4s\""),
            "11:1: [[source]] \"nx\": `watermark_delay` is given without `event_time`\n  fix: add event_time = \"<timestamp column>\", or remove `watermark_delay`",
        ),
        (
            n("event_time = \"t\"\nwatermark_delay = \"soon\""),
            "12:1: [[source]] \"nx\": `watermark_delay` must be a duration such as \"4s\", \"1m\" or \"500ms\" (at most 10 years), found \"soon\"\n  fix: set how far",
        ),
        (
            n("max_watermark_drift = \"0s\""),
            "11:1: [[source]] \"nx\": `max_watermark_drift` must be a duration > 0 such as \"30s\", \"1m\" or \"500ms\" (at most 10 years), found \"0s\"\n  fix: set how far in event time a lane may run ahead",
        ),
        (
            n("on_error = \"skp\""),
            "11:1: [[source]] \"nx\": `on_error` must be one of \"skip\", \"fail\", \"dead-letter\", found \"skp\"\n  fix: did you mean on_error = \"skip\"?",
        ),
        (n("format = 3"), "11:1: [[source]] \"nx\": `format` must be a format name such as \"json\", found 3"),
        (n("schema = \"\""), "11:1: [[source]] \"nx\": `schema` must be a non-empty column list, found \"\""),
        (
            n("schema = [\"a INT\"]"),
            "11:1: [[source]] \"nx\": `schema` must be a non-empty column list, found [\"a INT\"]",
        ),
        (
            n("options = 5"),
            "11:1: [[source]] \"nx\": `options` must be a table ([source.options]), found 5\n  fix: write the options under a [source.options] header",
        ),
        (
            n("[[source.options]]\nevents = 1"),
            "11:10: [[source]] \"nx\": `options` must be a table ([source.options]), found an array of tables",
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
    check_errors(&[
        // The misspelt `connector` is the first error, not a missing `connector`.
        (with_sink("[[source]]\nname = \"s\"\nconector = \"nexmark\""), &conector),
        (with_sink(&nexmark("rate = 10")), &rate),
    ]);
}

#[test]
fn a_primary_key_is_a_list_of_distinct_column_names_at_its_key() {
    check_ok(&with_sink(&nexmark("primary_key = [\"id\", \"region\"]")), |c| {
        let key = c.sources[0].primary_key.as_ref().expect("a primary key");
        assert_eq!(
            (key.value.clone(), key.position),
            (vec!["id".to_string(), "region".to_string()], Position::new(11, 1))
        );
    });
    check_ok(&with_sink(&nexmark("")), |c| assert_eq!(c.sources[0].primary_key, None));
    let expected = "11:1: [[source]] \"nx\": `primary_key` must be a non-empty list of distinct column names";
    for bad in ["primary_key = []", "primary_key = \"id\"", "primary_key = [1]", "primary_key = [\"a\", \"a\"]"] {
        check_errors(&[(with_sink(&nexmark(bad)), expected)]);
    }
}
