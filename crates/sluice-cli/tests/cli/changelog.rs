//! Changelog input through the whole binary: a file source reading the `op` column of a
//! changelog (what the file sink writes for an updating stream), normalized by its
//! primary key, into aggregates, joins and TopN; the anomalies counted and named; what
//! `explain` shows; what is refused, with the fix. `debezium` reads Debezium events from
//! a file against Apache Flink's answers.
//!
//! The Flink oracle's fixtures (`tests/changelog-oracle/`, see
//! `scripts/changelog-oracle.py`) are read here for the Kafka tests too.

mod debezium;

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::golden::integrated;
use crate::harness::{Scratch, assert_fails_with, crate_dir, stderr, stdout};

/// A fixture of the changelog oracle (`tests/changelog-oracle/NAME`).
pub(crate) fn fixture(name: &str) -> String {
    std::fs::read_to_string(crate_dir().join("tests/changelog-oracle").join(name)).expect("a fixture")
}

/// A Flink oracle file (`name.csv`: a header, then one row per line) as JSON rows of
/// `columns`, sorted.
pub(crate) fn oracle(name: &str) -> Vec<String> {
    let text = fixture(&format!("{name}.csv"));
    let mut lines = text.lines();
    let columns: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let mut rows: Vec<String> = lines
        .map(|line| {
            let object: serde_json::Map<String, Value> = columns
                .iter()
                .zip(line.split(','))
                .map(|(column, field)| {
                    let value = match field.parse::<i64>() {
                        Ok(number) => Value::from(number),
                        Err(_) => Value::from(field.trim_matches('"')),
                    };
                    (column.to_string(), value)
                })
                .collect();
            Value::Object(object).to_string()
        })
        .collect();
    rows.sort();
    rows
}

/// A sink's changelog integrated, each row as canonical JSON (keys sorted), sorted.
pub(crate) fn table(scratch: &Scratch, view: &str) -> Vec<String> {
    let mut rows: Vec<String> = integrated(&scratch.read(&format!("{view}.jsonl")))
        .iter()
        .map(|row| serde_json::from_str::<Value>(row).expect("a row").to_string())
        .collect();
    rows.sort();
    rows
}

/// A pipeline of one changelog file source `orders` (primary key `id`), `views` and one
/// file sink of view `out` into `out.jsonl`.
fn pipeline(threads_note: &str, views: &str) -> String {
    format!(
        "[pipeline]\nname = \"changes\"{threads_note}\n\n\
         [[source]]\nname = \"orders\"\nconnector = \"file\"\nformat = \"changelog-json\"\n\
         schema = \"id BIGINT NOT NULL, customer VARCHAR, amount BIGINT\"\nprimary_key = [\"id\"]\n\
         [source.options]\npath = \"orders.jsonl\"\n\n{views}\n\
         [[sink]]\nname = \"sink\"\nfrom = \"out\"\nconnector = \"file\"\nformat = \"json\"\n\
         [sink.options]\npath = \"out.jsonl\"\n"
    )
}

/// The changes of the tests: inserts, an update moving order 2 to customer b, a delete,
/// then the anomalies: a duplicate insert of order 3, a delete of an unknown order 9, an
/// update whose before image is not order 4's row, and a bad op.
const ORDERS: &str = r#"{"op":"+I","id":1,"customer":"a","amount":10}
{"op":"+I","id":2,"customer":"a","amount":20}
{"op":"+I","id":3,"customer":"b","amount":5}
{"op":"+I","id":4,"customer":"c","amount":1}
{"op":"-U","id":2,"customer":"a","amount":20}
{"op":"+U","id":2,"customer":"b","amount":25}
{"op":"-D","id":1,"customer":"a","amount":10}
{"op":"+I","id":3,"customer":"b","amount":7}
{"op":"-D","id":9,"customer":"z","amount":0}
{"op":"-U","id":4,"customer":"c","amount":99}
{"op":"+U","id":4,"customer":"c","amount":2}
{"op":"+X","id":5,"customer":"c","amount":1000}
"#;

fn run(scratch: &Scratch, args: &[&str]) -> std::process::Output {
    let output = scratch.sluice(args);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    output
}

#[test]
fn an_aggregate_of_a_changelog_file_follows_its_changes_and_names_each_anomaly() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", ORDERS);
    let views = "[[view]]\nname = \"out\"\n\
                 sql = \"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer\"\n";
    scratch.write("pipeline.toml", &pipeline("", views));
    let output = run(&scratch, &["run", "pipeline.toml", "--threads", "2"]);
    // a: no order left; b: orders 2 (25) and 3 (7); c: order 4 (2); the bad op skipped.
    assert_eq!(
        integrated(&scratch.read("out.jsonl")),
        [r#"{"customer":"b","total":32,"n":2}"#, r#"{"customer":"c","total":2,"n":1}"#]
    );
    let log = format!("{}{}", stdout(&output), stderr(&output));
    for named in [
        "duplicate inserts (applied as updates)",
        "deletes of unknown keys (dropped)",
        "out-of-order changes",
        "key (id=3): an insert of a key that has a row",
        "key (id=9): a delete",
        "key (id=4): a delete or update whose before image differs",
        "op \"+X\" is not one of +I, -U, +U, -D",
    ] {
        assert!(log.contains(named), "expected {named:?} in:\n{log}");
    }
}

#[test]
fn a_join_and_a_topn_over_changelogs_retract_what_changed() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", ORDERS);
    scratch.write(
        "customers.jsonl",
        "{\"op\":\"+I\",\"name\":\"b\",\"region\":\"north\"}\n{\"op\":\"+I\",\"name\":\"c\",\"region\":\"south\"}\n\
         {\"op\":\"-U\",\"name\":\"c\",\"region\":\"south\"}\n{\"op\":\"+U\",\"name\":\"c\",\"region\":\"north\"}\n",
    );
    let views = "[[source]]\nname = \"customers\"\nconnector = \"file\"\nformat = \"changelog-json\"\n\
                 schema = \"name VARCHAR NOT NULL, region VARCHAR\"\nprimary_key = [\"name\"]\n\
                 [source.options]\npath = \"customers.jsonl\"\n\n\
                 [[view]]\nname = \"joined\"\nsql = \"SELECT o.id, o.amount, c.region FROM orders o JOIN customers c ON o.customer = c.name\"\n\n\
                 [[view]]\nname = \"out\"\nsql = \"\"\"SELECT region, id, amount FROM (SELECT region, id, amount, \
                 ROW_NUMBER() OVER (PARTITION BY region ORDER BY amount DESC) AS rn FROM joined) WHERE rn <= 1\"\"\"\n";
    scratch.write("pipeline.toml", &pipeline("", views));
    run(&scratch, &["run", "pipeline.toml", "--threads", "2"]);
    // Live orders: 2 (b, 25), 3 (b, 7), 4 (c, 2); both customers in the north.
    assert_eq!(integrated(&scratch.read("out.jsonl")), [r#"{"region":"north","id":2,"amount":25}"#]);
}

#[test]
fn explain_shows_a_changelog_source_as_updating_by_its_primary_key() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", ORDERS);
    scratch.write("pipeline.toml", &pipeline("", "[[view]]\nname = \"out\"\nsql = \"SELECT * FROM orders\"\n"));
    let output = run(&scratch, &["explain", "pipeline.toml"]);
    let text = stdout(&output);
    for part in [
        "changelog-json, updating, primary key [id]",
        "hash(id)",
        "changelog_normalize (updating): changes of `orders` (changelog-json) by primary key [id] into -U/+U",
    ] {
        assert!(text.contains(part), "expected {part:?} in:\n{text}");
    }
}

#[test]
fn what_a_changelog_source_cannot_mean_is_refused_with_the_fix() {
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", ORDERS);
    let window = "[[view]]\nname = \"out\"\nsql = \"\"\"SELECT window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE orders, \
                  DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_start, window_end\"\"\"\n";
    let with_time =
        pipeline("", window).replace("amount BIGINT\"", "amount BIGINT, ts TIMESTAMP(3)\"\nevent_time = \"ts\"");
    scratch.write("window.toml", &with_time);
    assert_fails_with(
        &scratch.sluice(&["validate", "window.toml"]),
        &[
            "doesn't support consuming update and delete changes which is produced by the changelog source `orders`",
            "fix: aggregate its rows without a window",
        ],
    );
    let plain = "[[view]]\nname = \"out\"\nsql = \"SELECT * FROM orders\"\n";
    scratch.write("no_key.toml", &pipeline("", plain).replace("primary_key = [\"id\"]\n", ""));
    assert_fails_with(
        &scratch.sluice(&["validate", "no_key.toml"]),
        &["format = \"changelog-json\" gives changes of a table", "fix: add primary_key"],
    );
    scratch.write("json.toml", &pipeline("", plain).replace("changelog-json", "json"));
    assert_fails_with(
        &scratch.sluice(&["validate", "json.toml"]),
        &["primary_key is read only with a changelog format", "format = \"changelog-json\""],
    );
    scratch.write("unknown.toml", &pipeline("", plain).replace("[\"id\"]", "[\"idx\"]"));
    assert_fails_with(&scratch.sluice(&["validate", "unknown.toml"]), &["`idx`, which is not a column", "fix:"]);
}

/// What a stream of random changes of a few keys leaves: each key's last row, or none.
fn final_table(changes: &[(u8, Option<i64>)]) -> BTreeMap<u8, i64> {
    let mut table = BTreeMap::new();
    for &(key, value) in changes {
        match value {
            Some(value) => table.insert(key, value),
            None => table.remove(&key),
        };
    }
    table
}

/// Random changes as a consistent changelog file (`+I` a new key, `-U`/`+U` a changed
/// one, `-D` a deleted one).
fn changelog_file(changes: &[(u8, Option<i64>)]) -> String {
    let mut table: BTreeMap<u8, i64> = BTreeMap::new();
    let mut lines = String::new();
    let mut line = |op: &str, id: u8, v: i64| lines.push_str(&format!("{}\n", json!({"op": op, "id": id, "v": v})));
    for &(key, value) in changes {
        match (table.get(&key).copied(), value) {
            (None, Some(new)) => line("+I", key, new),
            (Some(old), Some(new)) => {
                line("-U", key, old);
                line("+U", key, new);
            }
            (Some(old), None) => line("-D", key, old),
            (None, None) => continue,
        }
        match value {
            Some(value) => table.insert(key, value),
            None => table.remove(&key),
        };
    }
    lines
}

/// A changelog file in, read back by its primary key, summed per parity and written out;
/// the output is read again as a changelog file by a second pipeline: both integrate to
/// the sums of the final table.
fn round_trip(changes: &[(u8, Option<i64>)], threads: u32, batch_size: usize) -> (Vec<String>, Vec<String>) {
    let scratch = Scratch::new();
    scratch.write("in.jsonl", &changelog_file(changes));
    let first = format!(
        "[pipeline]\nname = \"first\"\nbatch_size = {batch_size}\n\n[[source]]\nname = \"t\"\nconnector = \"file\"\n\
         format = \"changelog-json\"\nschema = \"id BIGINT, v BIGINT\"\nprimary_key = [\"id\"]\n\
         [source.options]\npath = \"in.jsonl\"\n\n[[view]]\nname = \"sums\"\n\
         sql = \"SELECT id % 2 AS parity, SUM(v) AS total, COUNT(*) AS n FROM t GROUP BY id % 2\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"sums\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"sums.jsonl\"\n"
    );
    scratch.write("first.toml", &first);
    run(&scratch, &["run", "first.toml", "--threads", &threads.to_string()]);
    let second = "[pipeline]\nname = \"second\"\n\n[[source]]\nname = \"sums\"\nconnector = \"file\"\n\
         format = \"changelog-json\"\nschema = \"parity BIGINT, total BIGINT, n BIGINT\"\nprimary_key = [\"parity\"]\n\
         [source.options]\npath = \"sums.jsonl\"\n\n[[view]]\nname = \"again\"\nsql = \"SELECT * FROM sums\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"again\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"again.jsonl\"\n";
    scratch.write("second.toml", second);
    run(&scratch, &["run", "second.toml", "--threads", &threads.to_string()]);
    (integrated(&scratch.read("sums.jsonl")), integrated(&scratch.read("again.jsonl")))
}

fn expected_sums(changes: &[(u8, Option<i64>)]) -> Vec<String> {
    let mut sums: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (key, value) in final_table(changes) {
        let entry = sums.entry(i64::from(key) % 2).or_default();
        *entry = (entry.0 + value, entry.1 + 1);
    }
    let mut rows: Vec<String> =
        sums.into_iter().map(|(p, (total, n))| json!({"parity": p, "total": total, "n": n}).to_string()).collect();
    rows.sort();
    rows
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Threads interleave differently on every run; the table
    /// the changes integrate to must not change, nor survive a second trip.
    #[test]
    fn a_changelog_integrates_to_its_final_table_and_round_trips_through_the_file_sink(
        changes in prop::collection::vec((0u8..6, prop::option::weighted(0.8, -20i64..20)), 1..60),
        threads in 1u32..4,
        batch_size in 1usize..8,
    ) {
        let (sums, again) = round_trip(&changes, threads, batch_size);
        let expected = expected_sums(&changes);
        let canonical = |rows: Vec<String>| -> Vec<String> {
            let mut rows: Vec<String> = rows.iter().map(|r| serde_json::from_str::<Value>(r).expect("row").to_string()).collect();
            rows.sort();
            rows
        };
        prop_assert_eq!(canonical(sums), expected.clone());
        prop_assert_eq!(canonical(again), expected);
    }
}
