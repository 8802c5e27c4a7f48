//! Bad configuration, bad SQL and bad rows: one clear message, exit 1, no panic.

use crate::harness::{Scratch, assert_fails_with, stderr, stdout};

const EVENTS_SOURCE: &str = r#"
[pipeline]
name = "bad"

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT, ts TIMESTAMP(3)"
event_time = "ts"
"#;

fn pipeline(options: &str, views: &str, sink_path: &str) -> String {
    format!(
        "{EVENTS_SOURCE}{options}\n{views}\n[[sink]]\nname = \"out\"\nfrom = \"result\"\nconnector = \"file\"\n[sink.options]\npath = \"{sink_path}\"\n"
    )
}

const PASS_THROUGH: &str = "[[view]]\nname = \"result\"\nsql = \"SELECT k, v FROM events\"\n";

fn scratch_with(pipeline_text: &str) -> Scratch {
    let scratch = Scratch::new();
    scratch.write(
        "events.jsonl",
        "{\"k\":\"a\",\"v\":1,\"ts\":\"2026-01-01 00:00:01\"}\n{\"k\":\"a\",\"v\":oops}\n{\"k\":\"b\",\"v\":2,\"ts\":\"2026-01-01 00:00:02\"}\n",
    );
    scratch.write("pipeline.toml", pipeline_text);
    scratch
}

#[test]
fn on_error_fail_stops_at_the_bad_row_naming_it() {
    let text = pipeline("on_error = \"fail\"\n[source.options]\npath = \"events.jsonl\"", PASS_THROUGH, "out.jsonl");
    let scratch = scratch_with(&text);
    let run = scratch.sluice(&["run", "pipeline.toml"]);
    assert_fails_with(&run, &["events.jsonl:2", "oops", "on_error = \"skip\"", "FAILED"]);
}

#[test]
fn on_error_skip_is_the_default_and_counts_the_row() {
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", PASS_THROUGH, "out.jsonl");
    let scratch = scratch_with(&text);
    let run = scratch.sluice(&["run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let report = stderr(&run);
    assert!(report.contains("2 rows in, 1 bad rows"), "{report}");
    assert!(report.contains("events.jsonl:2"), "the first bad rows are reported in full: {report}");
    assert_eq!(scratch.read("out.jsonl").lines().count(), 2);
}

#[test]
fn a_missing_input_file_is_one_clear_error() {
    let text = pipeline("[source.options]\npath = \"missing.jsonl\"", PASS_THROUGH, "out.jsonl");
    let scratch = scratch_with(&text);
    assert_fails_with(&scratch.sluice(&["run", "pipeline.toml"]), &["missing.jsonl"]);
    assert_fails_with(&scratch.sluice(&["validate", "pipeline.toml"]), &["missing.jsonl"]);
}

#[test]
fn an_unwritable_sink_path_is_one_clear_error() {
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", PASS_THROUGH, "events.jsonl/out.jsonl");
    let scratch = scratch_with(&text);
    for command in ["validate", "run"] {
        assert_fails_with(&scratch.sluice(&[command, "pipeline.toml"]), &["sink", "events.jsonl", "fix:"]);
    }
}

#[test]
fn invalid_sql_names_the_view_and_its_line() {
    let view = "[[view]]\nname = \"result\"\nsql = \"SELEC k FROM events\"\n";
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", view, "out.jsonl");
    let scratch = scratch_with(&text);
    assert_fails_with(
        &scratch.sluice(&["validate", "pipeline.toml"]),
        &["pipeline.toml:15:8", "view `result`", "SELEC"],
    );
}

#[test]
fn an_unknown_table_names_the_tables_that_exist() {
    let view = "[[view]]\nname = \"result\"\nsql = \"SELECT k FROM evnets\"\n";
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", view, "out.jsonl");
    let scratch = scratch_with(&text);
    assert_fails_with(&scratch.sluice(&["validate", "pipeline.toml"]), &["evnets", "the tables are: events"]);
}

#[test]
fn unsupported_sql_is_refused_by_name() {
    for (sql, construct) in [
        (
            "SELECT a.k FROM events a JOIN events b ON a.k <> b.k",
            "a join without an equality between a column of each input (a cross join) is not supported yet",
        ),
        ("SELECT k FROM events UNION SELECT k FROM events", "UNION is not supported yet"),
        ("SELECT k, LAST_VALUE(k) FROM events GROUP BY k", "the aggregate function LAST_VALUE is not supported yet"),
        ("SELECT k FROM events ORDER BY k", "ORDER BY on a stream"),
        (
            "SELECT * FROM TABLE(SESSION(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
            "a SESSION window table function whose rows are not aggregated by GROUP BY window_start, window_end",
        ),
        (
            "SELECT TUMBLE_PROCTIME(ts, INTERVAL '1' SECOND) FROM events GROUP BY TUMBLE(ts, INTERVAL '1' SECOND)",
            "TUMBLE_PROCTIME(…) (processing time) is not supported yet",
        ),
        (
            "SELECT COUNT(*) FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(k), INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
            "not an event-time attribute",
        ),
    ] {
        let view = format!("[[view]]\nname = \"result\"\nsql = \"{sql}\"\n");
        let text = pipeline("[source.options]\npath = \"events.jsonl\"", &view, "out.jsonl");
        let scratch = scratch_with(&text);
        assert_fails_with(&scratch.sluice(&["validate", "pipeline.toml"]), &[construct]);
    }
}

#[test]
fn an_unknown_key_names_its_line_and_the_fix() {
    let text = pipeline("[source.options]\npath = \"events.jsonl\"\npathh = \"x\"", PASS_THROUGH, "out.jsonl");
    let scratch = scratch_with(&text);
    assert_fails_with(
        &scratch.sluice(&["validate", "pipeline.toml"]),
        &["pipeline.toml:13", "pathh", "did you mean `path`"],
    );
}

#[test]
fn validate_and_explain_describe_a_good_pipeline() {
    let view = "[[view]]\nname = \"result\"\nsql = \"SELECT k, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY k, window_start, window_end\"\n";
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", view, "out.jsonl");
    let scratch = scratch_with(&text);
    let validate = scratch.sluice(&["validate", "pipeline.toml"]);
    assert!(validate.status.success(), "{}", stderr(&validate));
    assert!(stdout(&validate).contains("is valid"));
    let explain = scratch.sluice(&["explain", "pipeline.toml"]);
    assert!(explain.status.success(), "{}", stderr(&explain));
    let graph = stdout(&explain);
    for needle in ["source events", "window_assign", "exchange: hash(k", "window_aggregate", "state:", "sink out"] {
        assert!(graph.contains(needle), "explain lacks {needle:?}:\n{graph}");
    }
}

/// A view named `result` with `sql`, over the events file.
fn with_view(sql: &str) -> Scratch {
    let view = format!("[[view]]\nname = \"result\"\nsql = \"\"\"{sql}\"\"\"\n");
    scratch_with(&pipeline("[source.options]\npath = \"events.jsonl\"", &view, "out.jsonl"))
}

#[test]
fn a_view_with_thousands_of_terms_is_refused_not_a_crash() {
    let deep = format!("SELECT {} AS total FROM events", vec!["v"; 5000].join(" + "));
    let scratch = with_view(&deep);
    for command in ["validate", "explain", "run"] {
        let run = scratch.sluice(&[command, "pipeline.toml"]);
        assert_fails_with(&run, &["view `result`", "deep", "500"]);
    }
    // A wide expression within the limit plans and runs.
    let wide = format!("SELECT {} AS total FROM events", vec!["v"; 400].join(" + "));
    let run = with_view(&wide).sluice(&["run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
}

#[test]
fn sql_that_is_not_supported_or_misordered_is_named() {
    let windows = "TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' MONTH))";
    for (sql, needles) in [
        ("SELECT k, RANK() OVER (PARTITION BY k ORDER BY ts) AS r FROM events", vec!["OVER", "not supported"]),
        ("SELECT k FROM events WHERE v IN (SELECT v FROM events)", vec!["subquer", "not supported"]),
        (&*format!("SELECT COUNT(*) AS n FROM {windows} GROUP BY window_start, window_end"), vec!["MONTH", "DAY"]),
        (
            "SELECT COUNT(*) AS n FROM TABLE(HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY)) GROUP BY window_start, window_end",
            vec!["windows_per_row_max", "86400000"],
        ),
    ] {
        assert_fails_with(&with_view(sql).sluice(&["validate", "pipeline.toml"]), &needles);
    }
    let views = "[[view]]\nname = \"result\"\nsql = \"SELECT k FROM later\"\n\n[[view]]\nname = \"later\"\nsql = \"SELECT k FROM events\"\n";
    let scratch = scratch_with(&pipeline("[source.options]\npath = \"events.jsonl\"", views, "out.jsonl"));
    assert_fails_with(&scratch.sluice(&["validate", "pipeline.toml"]), &["later", "below", "line 17"]);
}

#[test]
fn a_division_by_zero_follows_on_error_naming_the_view_expression_and_row() {
    let sql = "SELECT k, 10 / v AS q FROM events";
    let view = format!("[[view]]\nname = \"result\"\nsql = \"{sql}\"\n");
    let rows = "{\"k\":\"a\",\"v\":2,\"ts\":\"2026-01-01 00:00:01\"}\n{\"k\":\"zero\",\"v\":0,\"ts\":\"2026-01-01 00:00:02\"}\n{\"k\":\"b\",\"v\":5,\"ts\":\"2026-01-01 00:00:03\"}\n";
    for (on_error, succeeds) in [("skip", true), ("fail", false)] {
        let scratch = Scratch::new();
        scratch.write("events.jsonl", rows);
        let options = format!("on_error = \"{on_error}\"\n[source.options]\npath = \"events.jsonl\"");
        scratch.write("pipeline.toml", &pipeline(&options, &view, "out.jsonl"));
        let run = scratch.sluice(&["run", "pipeline.toml"]);
        if succeeds {
            assert!(run.status.success(), "{}", stderr(&run));
            assert_eq!(scratch.read("out.jsonl").lines().count(), 2, "the failing row is skipped");
            assert!(stderr(&run).contains("view result: rows failing an expression: 1"), "{}", stderr(&run));
        } else {
            assert_fails_with(&run, &["view `result`", "zero", "Divide by zero"]);
        }
    }
}

#[test]
fn explain_shows_the_state_ttl_of_each_view_and_a_bad_one_is_refused() {
    let views = "[[view]]\nname = \"counts\"\nsql = \"SELECT k, COUNT(*) AS n FROM events GROUP BY k\"\nstate_ttl = \"10m\"\n\
                 [[view]]\nname = \"result\"\nsql = \"SELECT k, SUM(v) AS total FROM events GROUP BY k\"\n";
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", views, "out.jsonl").replacen(
        "[pipeline]\n",
        "[pipeline]\nstate_ttl = \"1h\"\n",
        1,
    );
    let scratch = scratch_with(&text);
    let explain = scratch.sluice(&["explain", "pipeline.toml"]);
    assert!(explain.status.success(), "{}", stderr(&explain));
    let shown = stdout(&explain);
    assert!(shown.contains("group_aggregate (updating): [sum(events.v)] by events.k (state TTL 1h)"), "{shown}");
    let bad = scratch_with(&text.replacen("state_ttl = \"1h\"", "state_ttl = \"-1s\"", 1));
    assert_fails_with(&bad.sluice(&["validate", "pipeline.toml"]), &["state_ttl", "a duration > 0"]);
}

/// Every wait's deadline is now plus a duration: one too long to represent is refused
/// where it is written, never left to overflow (a panic) when the wait starts.
#[test]
fn a_duration_past_ten_years_is_refused_where_it_is_written() {
    let text = pipeline("[source.options]\npath = \"events.jsonl\"", PASS_THROUGH, "out.jsonl")
        .replace("name = \"bad\"", "name = \"bad\"\nshutdown_timeout = \"18446744073709551615s\"");
    let scratch = scratch_with(&text);
    assert_fails_with(&scratch.sluice(&["validate", "pipeline.toml"]), &["shutdown_timeout", "at most 10 years"]);
    let scratch = scratch_with(&pipeline("[source.options]\npath = \"events.jsonl\"", PASS_THROUGH, "out.jsonl"));
    let flag = scratch.sluice(&["run", "pipeline.toml", "--workers", "2", "--join-timeout", "18446744073709551615s"]);
    let text = stderr(&flag);
    assert_eq!(flag.status.code(), Some(2), "a flag's error is the argument parser's: {text}");
    assert!(
        text.contains("--join-timeout") && text.contains("longer than the longest duration taken, 10 years"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}
