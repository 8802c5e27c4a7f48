//! Changelog sources in the planner: the normalization by primary key, what downstream
//! operators make of its updates, and what is refused with Flink's message.
//!
//! `orders (id BIGINT, customer VARCHAR, amount BIGINT, ts TIMESTAMP(3))`, primary key
//! `id`, a `debezium-json` changelog with event time `ts`.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int8Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_config::OnError;
use sluice_runtime::{SourceChangelog, TableDef};
use sluice_types::{Batch, Changelog, RowKind, SluiceError};

use crate::tests::{changes, operator_lines, run_batches};
use crate::{PlannerOptions, SqlPlanner, ViewDeclaration};

fn orders_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("customer", DataType::Utf8, true),
        Field::new("amount", DataType::Int64, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]))
}

fn planner(views: &[(&str, &str)]) -> Result<SqlPlanner, SluiceError> {
    let options = PlannerOptions {
        threads: 1,
        vnodes: 16,
        batch_size: 1024,
        windows_per_row_max: 1000,
        state_ttl: None,
        local_aggregation: true,
        mini_batch_rows: 1,
    };
    let mut planner = SqlPlanner::new(options);
    let changelog = SourceChangelog { primary_key: vec![0], upsert: false, format: "debezium-json".into() };
    let table = TableDef {
        name: "orders".into(),
        schema: orders_schema(),
        event_time: Some("ts".into()),
        changelog: Some(changelog),
    };
    planner.add_source(0, &[table], OnError::Skip)?;
    planner.declare_views(views.iter().enumerate().map(|(index, (name, sql))| ViewDeclaration {
        name: name.to_string(),
        sql: sql.to_string(),
        location: format!("line {}", index + 1),
    }));
    for (name, sql) in views {
        planner.add_view(name, sql)?;
    }
    Ok(planner)
}

/// Changes of `orders`: (kind, id, customer, amount), the time 0.
fn changes_of(rows: &[(&str, i64, &str, i64)]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|_| 0))),
        Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| RowKind::from_short(r.0).expect("kind") as i8))),
    ];
    let mut fields: Vec<Field> = orders_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(sluice_types::ROW_KIND_COLUMN, DataType::Int8, false));
    Batch::inserts(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("rows"))
}

/// Every change of the test, in three batches: inserts, an update that moves order 2 to
/// customer b, a delete of order 1, a duplicate insert of order 3 and a delete of an
/// unknown order 9.
fn history() -> Vec<Batch> {
    vec![
        changes_of(&[("+I", 1, "a", 10), ("+I", 2, "a", 20), ("+I", 3, "b", 5)]),
        changes_of(&[("-U", 2, "a", 20), ("+U", 2, "b", 25)]),
        changes_of(&[("-D", 1, "a", 10), ("+I", 3, "b", 7), ("-D", 9, "z", 0)]),
    ]
}

#[test]
fn a_changelog_source_is_updating_by_its_primary_key_through_the_normalization() {
    let planner = planner(&[]).expect("plans");
    let stream = planner.plan_stream("orders", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::Updating { upsert_key: Some(vec![0]) });
    assert!(stream.updating);
    assert_eq!(
        operator_lines(&planner, "orders"),
        ["changelog_normalize (updating): changes of `orders` (debezium-json) by primary key [id] into -U/+U"]
    );
    let ran = run_batches(&planner, "orders", history());
    assert_eq!(
        changes(&ran.output.expect("runs")),
        [
            "+1 1,a,10,1970-01-01T00:00:00",
            "+1 2,a,20,1970-01-01T00:00:00",
            "+1 3,b,5,1970-01-01T00:00:00",
            "-1 2,a,20,1970-01-01T00:00:00",
            "+1 2,b,25,1970-01-01T00:00:00",
            "-1 1,a,10,1970-01-01T00:00:00",
            "-1 3,b,5,1970-01-01T00:00:00",
            "+1 3,b,7,1970-01-01T00:00:00",
        ]
    );
    let counted = |name: &str| ran.counters.iter().find(|(n, _)| n.contains(name)).map_or(0, |(_, v)| *v);
    assert_eq!((counted("duplicate inserts"), counted("deletes of unknown keys")), (1, 1));
}

#[test]
fn an_aggregate_over_a_changelog_retracts_what_changed() {
    let sql = "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer";
    let planner = planner(&[("totals", sql)]).expect("plans");
    let ran = run_batches(&planner, "totals", history());
    assert_eq!(
        changes(&ran.output.expect("runs")),
        [
            // Each batch's changes folded per customer (a mini-batch of one batch).
            "+1 a,30,2",
            "+1 b,5,1",
            // Order 2 moves from a to b.
            "-1 a,30,2",
            "+1 a,10,1",
            "-1 b,5,1",
            "+1 b,30,2",
            // Order 1 deleted: a has none left; order 3 becomes 7 (its duplicate insert).
            "-1 a,10,1",
            "-1 b,30,2",
            "+1 b,32,2",
        ]
    );
}

#[test]
fn topn_over_a_changelog_lets_the_next_row_in_when_the_top_one_leaves() {
    let sql = "SELECT * FROM (SELECT customer, id, amount, \
               ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1";
    let planner = planner(&[("top", sql)]).expect("plans");
    assert!(operator_lines(&planner, "top").iter().any(|line| line.contains("updating input: every row kept")));
    let batches = vec![
        changes_of(&[("+I", 1, "a", 10), ("+I", 2, "a", 20)]),
        changes_of(&[("-D", 2, "a", 20)]),
        changes_of(&[("-U", 1, "a", 10), ("+U", 1, "a", 5)]),
    ];
    let ran = run_batches(&planner, "top", batches);
    assert_eq!(
        changes(&ran.output.expect("runs")),
        // Order 2 tops order 1 within the first batch; once deleted, order 1 is back on top.
        ["+1 a,2,20,1", "-1 a,2,20,1", "+1 a,1,10,1", "-1 a,1,10,1", "+1 a,1,5,1"]
    );
}

#[test]
fn windows_and_over_aggregates_over_a_changelog_are_refused_with_flinks_message_and_the_fix() {
    let cases = [
        (
            "SELECT window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) \
          GROUP BY window_start, window_end",
            "a window table function over `orders`",
        ),
        (
            "SELECT COUNT(*) AS n FROM orders GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)",
            "a window table function over `orders`",
        ),
        (
            "SELECT id, SUM(amount) OVER (PARTITION BY customer ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS s \
          FROM orders",
            "an OVER aggregate",
        ),
    ];
    for (sql, construct) in cases {
        let error = planner(&[("v", sql)]).err().expect("refused").to_string();
        let expected = [
            construct,
            "doesn't support consuming update and delete changes which is produced by the changelog source `orders` \
             (debezium-json, primary key [id])",
            "fix:",
            "read the source as append-only rows",
        ];
        for part in expected {
            assert!(error.contains(part), "expected {part:?} in:\n{error}");
        }
    }
}

#[test]
fn a_join_of_a_changelog_is_updating_and_names_its_source_downstream() {
    let views = [
        ("mine", "SELECT o.id, o.amount, p.amount AS other FROM orders o JOIN orders p ON o.customer = p.customer"),
        (
            "w",
            "SELECT window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE mine, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) \
               GROUP BY window_start, window_end",
        ),
    ];
    let error = planner(&views).err().expect("refused").to_string();
    assert!(error.contains("changelog source `orders`"), "{error}");
    let planner = planner(&views[..1]).expect("plans");
    let stream = planner.plan_stream("mine", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::Updating { upsert_key: None });
}

#[test]
fn a_changelog_column_the_key_encoding_cannot_hold_is_refused() {
    let mut planner = SqlPlanner::new(PlannerOptions {
        threads: 1,
        vnodes: 16,
        batch_size: 1024,
        windows_per_row_max: 1000,
        state_ttl: None,
        local_aggregation: true,
        mini_batch_rows: 1,
    });
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("tags", list, true)]));
    let changelog = SourceChangelog { primary_key: vec![0], upsert: true, format: "upsert".into() };
    let table = TableDef { name: "u".into(), schema, event_time: None, changelog: Some(changelog) };
    let error = planner.add_source(0, &[table], OnError::Skip).expect_err("refused").to_string();
    assert!(error.contains("column `tags`") && error.contains("fix:"), "{error}");
}
