//! `[pipeline]`: defaults, values, wrong types, bad values, unknown and missing keys.

use std::time::Duration;

use super::{check_error, check_errors, check_ok, pipeline_with};
use crate::default_threads;

#[test]
fn defaults() {
    check_ok(&pipeline_with("name = \"hot-items\""), |c| {
        let p = &c.pipeline;
        assert_eq!(p.name, "hot-items");
        assert_eq!(p.threads, default_threads());
        assert!(p.threads >= 1);
        assert_eq!(p.vnodes, 256);
        assert_eq!(p.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(p.batch_size, 8192);
        assert_eq!(p.queue_batches, 16);
        assert!(p.local_aggregation, "window aggregates in two phases by default");
    });
}

#[test]
fn local_aggregation_is_a_boolean() {
    check_ok(&pipeline_with("name = \"p\"\nlocal_aggregation = false"), |c| assert!(!c.pipeline.local_aggregation));
    check_error(&pipeline_with("name = \"p\"\nlocal_aggregation = \"no\""), "3:1: [pipeline]: `local_aggregation`");
}

#[test]
fn every_key_set() {
    let body = "name = \"a_B-9\"\nthreads = 1024\nvnodes = 65536\nshutdown_timeout = \"1m 500ms\"\n\
                batch_size = 1_048_576\nqueue_batches = 4096";
    check_ok(&pipeline_with(body), |c| {
        let p = &c.pipeline;
        assert_eq!(p.name, "a_B-9");
        assert_eq!(p.threads, 1024);
        assert_eq!(p.vnodes, 65536);
        assert_eq!(p.shutdown_timeout, Duration::from_millis(60_500));
        assert_eq!(p.batch_size, 1_048_576);
        assert_eq!(p.queue_batches, 4096);
    });
    check_ok(&pipeline_with("name = \"p\"\nthreads = 1\nvnodes = 1\nbatch_size = 1\nqueue_batches = 1"), |c| {
        assert_eq!((c.pipeline.threads, c.pipeline.vnodes), (1, 1))
    });
}

/// `[pipeline] name = "p"` then `line` at line 3.
fn line3(line: &str) -> String {
    pipeline_with(&format!("name = \"p\"\n{line}"))
}

#[test]
fn wrong_types_and_bad_values() {
    let int = |key: &str, range: &str, found: &str| {
        format!("3:1: [pipeline]: `{key}` must be an integer in {range}, found {found}\n  fix: ")
    };
    let cases: Vec<(String, String)> = vec![
        (line3("threads = 0"), int("threads", "1..=1024", "0")),
        (line3("threads = 1025"), int("threads", "1..=1024", "1025")),
        (line3("threads = -1"), int("threads", "1..=1024", "-1")),
        (line3("threads = \"two\""), int("threads", "1..=1024", "\"two\"")),
        (line3("threads = 2.0"), int("threads", "1..=1024", "2.0")),
        (line3("vnodes = 0"), int("vnodes", "1..=65536", "0")),
        (line3("vnodes = 65537"), int("vnodes", "1..=65536", "65537")),
        (line3("vnodes = true"), int("vnodes", "1..=65536", "true")),
        (line3("batch_size = 0"), int("batch_size", "1..=1048576", "0")),
        (line3("batch_size = 1048577"), int("batch_size", "1..=1048576", "1048577")),
        (line3("batch_size = [8192]"), int("batch_size", "1..=1048576", "[8192]")),
        (line3("queue_batches = 0"), int("queue_batches", "1..=4096", "0")),
        (line3("queue_batches = 4097"), int("queue_batches", "1..=4096", "4097")),
        (line3("queue_batches = { n = 1 }"), int("queue_batches", "1..=4096", "{ n = 1 }")),
    ];
    let cases: Vec<(String, &str)> = cases.iter().map(|(t, e)| (t.clone(), e.as_str())).collect();
    check_errors(&cases);
}

#[test]
fn durations_and_names() {
    let duration = "3:1: [pipeline]: `shutdown_timeout` must be a duration > 0 such as \"30s\", \
                    \"1m\" or \"500ms\" (at most 10 years), found";
    let name = "2:1: [pipeline]: `name` must be a name of letters, digits, `_` and `-`, found";
    let d0 = format!("{duration} \"0s\"\n  fix: e.g. shutdown_timeout = \"30s\"");
    let d1 = format!("{duration} 30\n");
    let d2 = format!("{duration} \"30 parsecs\"\n");
    let d3 = format!("{duration} \"\"\n");
    // Past the bound every deadline (now plus the duration) would overflow.
    let d4 = format!("{duration} \"18446744073709551615s\"\n");
    let n0 = format!("{name} \"hot items\"\n  fix: use letters, digits");
    let n1 = format!("{name} \"\"\n");
    let n2 = format!("{name} 5\n");
    check_errors(&[
        (line3("shutdown_timeout = \"0s\""), &d0),
        (line3("shutdown_timeout = 30"), &d1),
        (line3("shutdown_timeout = \"30 parsecs\""), &d2),
        (line3("shutdown_timeout = \"\""), &d3),
        (line3("shutdown_timeout = \"18446744073709551615s\""), &d4),
        (pipeline_with("name = \"hot items\""), &n0),
        (pipeline_with("name = \"\""), &n1),
        (pipeline_with("name = 5"), &n2),
    ]);
}

#[test]
fn unknown_and_missing_keys() {
    let known = "known keys: name, threads, vnodes, shutdown_timeout, batch_size, queue_batches, windows_per_row_max, state_ttl, local_aggregation, mini_batch_rows, state_memory_mib, state_dir, spill_dir";
    let thread = format!("3:1: unknown key `thread` in [pipeline]; {known}\n  fix: did you mean `threads`?");
    let timeout =
        format!("3:1: unknown key `shutdown_timout` in [pipeline]; {known}\n  fix: did you mean `shutdown_timeout`?");
    let colour = format!("3:1: unknown key `colour` in [pipeline]; {known}\n  fix: remove `colour`");
    let nested = format!("3:11: unknown key `extra` in [pipeline]; {known}");
    check_errors(&[
        (line3("thread = 2"), &thread),
        (line3("shutdown_timout = \"1s\""), &timeout),
        (line3("colour = \"red\""), &colour),
        (line3("[pipeline.extra]\nx = 1"), &nested),
        (
            pipeline_with("threads = 2"),
            "1:1: [pipeline]: missing required key `name`\n  fix: add name = \"my-pipeline\"",
        ),
        // A misspelt required key is reported as misspelt, not also as missing.
        (pipeline_with("nmae = \"p\""), "2:1: unknown key `nmae` in [pipeline]"),
    ]);
}

#[test]
fn state_ttl_is_a_positive_duration_for_the_pipeline_and_each_view() {
    let toml = format!(
        "{}\n[[view]]\nname = \"counts\"\nsql = \"SELECT 1\"\nstate_ttl = \"10m\"\n",
        pipeline_with("name = \"p\"\nstate_ttl = \"1h\"")
    );
    check_ok(&toml, |config| {
        assert_eq!(config.pipeline.state_ttl, Some(std::time::Duration::from_secs(3600)));
        assert_eq!(config.views[0].state_ttl, Some(std::time::Duration::from_secs(600)));
    });
    check_ok(&pipeline_with("name = \"p\""), |config| assert_eq!(config.pipeline.state_ttl, None));
    check_error(
        &pipeline_with("name = \"p\"\nstate_ttl = \"0s\""),
        "3:1: [pipeline]: `state_ttl` must be a duration > 0",
    );
    check_error(
        &pipeline_with("name = \"p\"\nstate_ttl = \"soon\""),
        "3:1: [pipeline]: `state_ttl` must be a duration > 0",
    );
}

#[test]
fn a_duration_is_at_most_ten_years() {
    assert_eq!(crate::parse_duration(" 10years "), Ok(crate::MAX_DURATION));
    assert_eq!(crate::parse_duration("3652days 12h"), Ok(crate::MAX_DURATION));
    assert_eq!(crate::parse_duration("1m 500ms"), Ok(Duration::from_millis(60_500)));
    for too_long in ["3653days", "10years 1s", "11years", "18446744073709551615s"] {
        let error = crate::parse_duration(too_long).unwrap_err();
        assert!(error.contains("longer than the longest duration taken, 10 years"), "{too_long}: {error}");
    }
    assert!(crate::parse_duration("soon").unwrap_err().contains("\"soon\""));
}
