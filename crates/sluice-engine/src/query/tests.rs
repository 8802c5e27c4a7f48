//! A query's execution stops at its deadline or its cancellation, also inside a
//! CPU-bound operator that never returns `Pending`, and queries execute one at a time.
//! Every wait is on an event (the gate's counts, a thread's end) with a deadline that
//! only catches a hang.

use std::sync::Arc;
use std::time::Duration;

use super::{Executions, QueryLimits, prepare};
use crate::materialize::Materialized;

/// Catches a hang; never the measure of a test.
const HANG: Duration = Duration::from_secs(120);

/// A sorted cross join of 10^12 rows, four copies of 1000 values: a cross join builds
/// batches from rows it holds (polling its input once per 1000 batches) and the sort
/// consumes them in one poll, so it runs until something interrupts it inside that poll.
fn endless() -> String {
    let values: Vec<String> = (1..=1000).map(|v| format!("({v})")).collect();
    format!(
        "WITH t(v) AS (VALUES {}) SELECT a.v + b.v + c.v + d.v AS s FROM t a CROSS JOIN t b CROSS JOIN t c \
         CROSS JOIN t d ORDER BY s DESC LIMIT 3",
        values.join(", ")
    )
}

/// No table: the queries here read none (and need no checkpoint).
fn registry() -> Arc<Materialized> {
    Materialized::new(Vec::new(), Vec::new(), 1).expect("registry")
}

fn limits(timeout_ms: u64) -> QueryLimits {
    QueryLimits::new(None, Some(timeout_ms)).expect("limits")
}

/// The finding: with `timeout_ms: 3000` such a query answered after 23–30 s, when it
/// ended by itself. Now it fails with `query.timeout` and gives its turn back; an
/// endless one would never return without the interruption.
#[test]
fn a_sorted_cross_join_past_its_timeout_is_interrupted() {
    let executions = Executions::new(1);
    let prepared = prepare(&registry(), &endless(), limits(200)).expect("prepared");
    let error = prepared.with_executions(Arc::clone(&executions)).run().expect_err("interrupted");
    assert_eq!(error.code, "query.timeout", "{error}");
    assert_eq!(executions.counts(), super::Counts::default(), "its turn ended with it");
}

/// A second query waits while one executes; cancelling the first (its client went away)
/// stops it and gives the second its turn.
#[test]
fn queries_execute_one_at_a_time_and_a_cancelled_one_gives_its_turn_back() {
    let executions = Executions::new(1);
    let first = prepare(&registry(), &endless(), limits(300_000)).expect("prepared");
    let interrupt = first.interrupt();
    let first = first.with_executions(Arc::clone(&executions));
    let first = std::thread::spawn(move || first.run());
    assert!(executions.wait_until(|counts| counts.running == 1, HANG), "the first query executes");
    let second = prepare(&registry(), "SELECT 1 AS one", limits(300_000)).expect("prepared");
    let second = second.with_executions(Arc::clone(&executions));
    let second = std::thread::spawn(move || second.run());
    assert!(executions.wait_until(|counts| counts.waiting == 1, HANG), "the second query waits");
    assert_eq!(executions.counts().running, 1, "one query executes at a time");
    interrupt.cancel();
    let error = first.join().expect("no panic").expect_err("cancelled");
    assert_eq!(error.code, "query.cancelled", "{error}");
    let answer = second.join().expect("no panic").expect("answered once the first stopped");
    assert_eq!(answer.rows(), 1);
    assert_eq!(executions.counts(), super::Counts::default());
}

/// A registry with one table `counts (k VARCHAR, n BIGINT)`, never filled: no
/// checkpoint, so a query that leased would wait.
fn counts() -> Arc<Materialized> {
    use arrow::datatypes::{DataType, Field, Schema};
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("n", DataType::Int64, true)]));
    let table = crate::materialize::TableSpec { name: "counts".to_string(), schema };
    Materialized::new(vec![table], vec!["raw".to_string()], 1).expect("registry")
}

/// A client's Describe: the columns and the parameters' types, planned without a
/// checkpoint, and the same errors as a query for tables that are not there.
#[test]
fn describe_answers_columns_and_parameter_types_without_a_checkpoint() {
    let (schema, parameters) =
        super::describe(&counts(), "SELECT k, n * 2 AS twice FROM counts WHERE k = $1 AND n > $2").expect("described");
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["k", "twice"]);
    assert_eq!(parameters, [Some(arrow::datatypes::DataType::Utf8), Some(arrow::datatypes::DataType::Int64)]);
    assert_eq!(super::describe(&counts(), "SELECT * FROM nope").expect_err("unknown").code, "query.unknown_table");
    assert_eq!(super::describe(&counts(), "SELECT * FROM raw").expect_err("raw").code, "query.not_materialized");
    assert_eq!(super::describe(&counts(), "DROP TABLE counts").expect_err("not a query").code, "query.statement");
}
