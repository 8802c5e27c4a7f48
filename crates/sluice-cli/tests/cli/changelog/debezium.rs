//! `format = "debezium-json"` files through the whole binary. The oracle's Debezium events
//! (`tests/changelog-oracle/orders.debezium.jsonl`, which `scripts/changelog-oracle.py`
//! reads with Flink's filesystem connector and its `debezium-json` format) written as a
//! capture holds them: snapshot reads, creates, updates, deletes, some events
//! schema-embedded, each delete followed by its tombstone as `kafka-console-consumer`
//! prints it, a blank line and lines that are no event. The aggregate and the TopN over
//! them must end as Flink's tables, also when the run is killed after a checkpoint mid-file
//! and restarted; the anomalies Flink does not normalize are checked against a
//! hand-computed table.

use serde_json::Value;

use super::{fixture, oracle, table};
use crate::harness::{Scratch, assert_fails_with, killed_after_a_checkpoint_then_resumed, stderr, stdout};

/// The oracle's events as a file (see the module doc): the events of even ids
/// schema-embedded, a `null` after each delete, a blank line and a line of no JSON after
/// the fourth event (file lines 5 and 6). Flink's answer is the same for both: it skips
/// tombstones and (with `ignore-parse-errors`) bad lines, and a schema-embedded event is
/// the same event.
fn orders_file() -> String {
    let mut text = String::new();
    for (index, line) in fixture("orders.debezium.jsonl").lines().enumerate() {
        let event: Value = serde_json::from_str(line).expect("a fixture event");
        let row = if event["after"].is_null() { &event["before"] } else { &event["after"] };
        let id = row["id"].as_i64().expect("an id");
        if id % 2 == 0 {
            text.push_str(&format!("{{\"schema\":{{\"type\":\"struct\",\"optional\":false}},\"payload\":{line}}}\n"));
        } else {
            text.push_str(&format!("{line}\n"));
        }
        if event["op"] == "d" {
            text.push_str("null\n");
        }
        if index == 3 {
            text.push_str("\n{not json\n");
        }
    }
    text
}

/// A pipeline of the `debezium-json` file source `orders` (primary key `id`), its
/// aggregate and TopN (the oracle's queries) into `totals.jsonl` and `top.jsonl`.
fn pipeline(checkpoint: &str) -> String {
    let sink = |view: &str| {
        format!(
            "[[sink]]\nname = \"{view}_out\"\nfrom = \"{view}\"\nconnector = \"file\"\nformat = \"json\"\n\
             [sink.options]\npath = \"{view}.jsonl\"\n\n"
        )
    };
    format!(
        "[pipeline]\nname = \"cdc\"\nbatch_size = 1\n\n{checkpoint}\
         [[source]]\nname = \"orders\"\nconnector = \"file\"\nformat = \"debezium-json\"\n\
         schema = \"id BIGINT NOT NULL, customer VARCHAR, amount BIGINT\"\nprimary_key = [\"id\"]\n\
         [source.options]\npath = \"orders.jsonl\"\n\n\
         [[view]]\nname = \"totals\"\nsql = \"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer\"\n\n{}\
         [[view]]\nname = \"top\"\nsql = \"SELECT customer, id, amount FROM (SELECT customer, id, amount, ROW_NUMBER() OVER \
         (PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1\"\n\n{}",
        sink("totals"),
        sink("top"),
    )
}

/// Both sinks' final tables against Flink's and the hand-computed ones. Live orders:
/// 2 (b, 25), 3 (b, 6), 4 (a, 8), 6 (c, 1).
fn check_tables(scratch: &Scratch) {
    let totals = [
        r#"{"customer":"a","n":1,"total":8}"#,
        r#"{"customer":"b","n":2,"total":31}"#,
        r#"{"customer":"c","n":1,"total":1}"#,
    ];
    assert_eq!(table(scratch, "totals"), totals);
    assert_eq!(table(scratch, "totals"), oracle("totals"), "Flink's answer");
    assert_eq!(table(scratch, "top"), oracle("top"), "Flink's answer");
}

#[test]
fn a_debezium_json_file_ends_as_flinks_table_with_its_bad_lines_named() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", &orders_file());
    scratch.write("pipeline.toml", &pipeline(""));
    let explain = scratch.sluice(&["explain", "pipeline.toml"]);
    assert!(explain.status.success(), "explain failed:\n{}", stderr(&explain));
    for part in [
        "file(path=orders.jsonl, debezium-json, updating, primary key [id], 1 file)",
        "changelog_normalize (updating): changes of `orders` (debezium-json) by primary key [id] into -U/+U",
    ] {
        assert!(stdout(&explain).contains(part), "expected {part:?} in:\n{}", stdout(&explain));
    }
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", "2"]);
    let log = stderr(&run);
    assert!(run.status.success(), "sluice failed:\n{log}");
    check_tables(&scratch);
    // The line of no JSON and the event with op "x" are bad rows named by file line; the
    // tombstones and the blank line are none. An update is two rows.
    assert!(log.contains("orders.jsonl:6: a Debezium envelope is not JSON"), "{log}");
    assert!(log.contains("orders.jsonl:12: op \"x\" is not one of c, r, u, d"), "{log}");
    assert!(log.contains("source orders: 14 rows in, 2 bad rows"), "{log}");
}

#[test]
fn a_debezium_json_file_killed_after_a_checkpoint_mid_file_ends_the_same() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", &orders_file());
    let checkpoint = "[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n";
    scratch.write("pipeline.toml", &pipeline(checkpoint));
    let log = killed_after_a_checkpoint_then_resumed(scratch.dir.path());
    // A line read twice would be a duplicate insert or a delete of a key gone; a line
    // lost would change the tables.
    for anomaly in ["deletes of unknown keys", "duplicate inserts", "out-of-order changes"] {
        assert!(!log.contains(anomaly), "{anomaly}:\n{log}");
    }
    check_tables(&scratch);
}

/// What Flink's `debezium-json` does not normalize (a snapshot row read again, a delete of
/// a key never inserted, an update whose before image is not the key's row) is applied
/// as on Kafka, counted and named; the table is computed by hand.
#[test]
fn anomalies_of_a_debezium_json_file_are_counted_and_named_and_a_key_is_required() {
    let scratch = Scratch::new();
    let events = [
        r#"{"before":null,"after":{"id":1,"customer":"a","amount":10},"op":"r"}"#,
        r#"{"before":null,"after":{"id":2,"customer":"a","amount":20},"op":"r"}"#,
        r#"{"before":null,"after":{"id":1,"customer":"a","amount":11},"op":"r"}"#,
        r#"{"before":{"id":9,"customer":"z","amount":0},"after":null,"op":"d"}"#,
        r#"{"before":{"id":2,"customer":"a","amount":99},"after":{"id":2,"customer":"b","amount":25},"op":"u"}"#,
        r#"{"before":null,"after":{"id":3,"customer":"b","amount":5},"op":"c"}"#,
    ];
    scratch.write("orders.jsonl", &(events.join("\n") + "\n"));
    scratch.write("pipeline.toml", &pipeline(""));
    let run = scratch.sluice(&["run", "pipeline.toml", "--threads", "2"]);
    let log = format!("{}{}", stdout(&run), stderr(&run));
    assert!(run.status.success(), "sluice failed:\n{log}");
    // Order 1 is (a, 11) after its second snapshot read, order 2 moved to b.
    assert_eq!(
        table(&scratch, "totals"),
        [r#"{"customer":"a","n":1,"total":11}"#, r#"{"customer":"b","n":2,"total":30}"#]
    );
    for named in [
        "duplicate inserts (applied as updates)",
        "deletes of unknown keys (dropped)",
        "out-of-order changes",
        "key (id=1): an insert of a key that has a row",
        "key (id=9): a delete",
        "key (id=2): a delete or update whose before image differs",
    ] {
        assert!(log.contains(named), "expected {named:?} in:\n{log}");
    }
    scratch.write("no_key.toml", &pipeline("").replace("primary_key = [\"id\"]\n", ""));
    assert_fails_with(
        &scratch.sluice(&["validate", "no_key.toml"]),
        &["format = \"debezium-json\" gives changes of a table", "fix: add primary_key"],
    );
    scratch.write(
        "split.toml",
        &pipeline("").replace("path = \"orders.jsonl\"\n", "path = \"orders.jsonl\"\nsplit_bytes = 64\n"),
    );
    assert_fails_with(&scratch.sluice(&["validate", "split.toml"]), &["a changelog file is read by one lane"]);
}
