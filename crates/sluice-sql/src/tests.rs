//! The planner end to end: pipeline views in, messages or evaluated rows out.
//!
//! One source table `t (a BIGINT, b BIGINT, s VARCHAR, ts TIMESTAMP(3))` with event time
//! `ts`; [`plan`] declares and adds views as the CLI does, [`run`] plans a view's stream and
//! pushes one batch through its operators (exchanges pass rows through: one thread).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sluice_config::OnError;
use sluice_runtime::{Metrics, OperatorContext, TableDef};
use sluice_types::{Batch, Changelog, Message, SluiceError};

use crate::stack::EVALUATION_STACK_BYTES;
use crate::{EXPRESSION_DEPTH_MAX, PlannerOptions, SqlPlanner, ViewDeclaration, WINDOWS_PER_ROW_MAX_DEFAULT};

fn source_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// A planner over `t` with every view of `views` declared (`line N` for the Nth) and
/// added in order: the first error, or the planner.
pub(crate) fn plan(views: &[(&str, &str)], on_error: OnError) -> Result<SqlPlanner, SluiceError> {
    plan_aggregating(views, on_error, true)
}

/// [`plan`], with window aggregates in two phases or not (`local_aggregation`).
fn plan_aggregating(
    views: &[(&str, &str)],
    on_error: OnError,
    local_aggregation: bool,
) -> Result<SqlPlanner, SluiceError> {
    let options = PlannerOptions {
        threads: 1,
        vnodes: 16,
        batch_size: 1024,
        windows_per_row_max: 1000,
        state_ttl: None,
        local_aggregation,
        mini_batch_rows: 1,
    };
    let mut planner = SqlPlanner::new(options);
    let table = TableDef { name: "t".into(), schema: source_schema(), event_time: Some("ts".into()), changelog: None };
    planner.add_source(0, &[table], on_error)?;
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

/// The error planning `views` gives, as the user sees it.
pub(crate) fn plan_error(views: &[(&str, &str)]) -> String {
    plan(views, OnError::Skip).err().map_or_else(|| "no error".to_string(), |error| error.to_string())
}

fn check_error(views: &[(&str, &str)], expected: &[&str]) {
    let error = plan_error(views);
    for part in expected {
        assert!(error.contains(part), "expected {part:?} in:\n{error}");
    }
}

/// Rows of `t`: `a`, `b`, `s` and `ts` per row.
pub(crate) fn rows(values: &[(i64, i64, &str, i64)]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(values.iter().map(|v| v.0))),
        Arc::new(Int64Array::from_iter_values(values.iter().map(|v| v.1))),
        Arc::new(StringArray::from_iter_values(values.iter().map(|v| v.2))),
        Arc::new(TimestampMillisecondArray::from_iter_values(values.iter().map(|v| v.3))),
    ];
    Batch::inserts(RecordBatch::try_new(source_schema(), columns).expect("batch"))
}

/// What a run gave: the output batches (or the error) and the run's counters.
pub(crate) struct Ran {
    pub output: Result<Vec<Batch>, SluiceError>,
    pub counters: Vec<(String, u64)>,
}

/// Plans `view` of `planner` and runs `batch` through it, then end of input, on a thread
/// with the stack the runtime's drivers are to have.
pub(crate) fn run(planner: &SqlPlanner, view: &str, batch: Batch) -> Ran {
    run_batches(planner, view, vec![batch])
}

/// [`run`] with several input batches.
pub(crate) fn run_batches(planner: &SqlPlanner, view: &str, batches: Vec<Batch>) -> Ran {
    let stream = planner.plan_stream(view, "sink").expect("plan_stream");
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let context = OperatorContext { thread: 0, threads: 1, vnodes: 16, metrics: Arc::clone(&metrics) };
    let state = stream.state;
    let factories: Vec<_> =
        state.segments.iter().flat_map(|segment| &segment.operators).chain(&state.operators).collect();
    let output = std::thread::scope(|scope| {
        let driver = std::thread::Builder::new().stack_size(EVALUATION_STACK_BYTES).spawn_scoped(scope, || {
            let mut messages: Vec<Message> = batches.into_iter().map(Message::Data).collect();
            messages.push(Message::EndOfData);
            for (_, factory) in &factories {
                let mut operator = factory(&context)?;
                let mut out = Vec::new();
                for message in messages {
                    match message {
                        Message::Data(batch) => operator.on_data(batch, &mut out)?,
                        Message::EndOfData => operator.on_end(&mut out)?,
                        other => out.push(other),
                    }
                    while operator.has_more() {
                        operator.on_resume(&mut out)?;
                    }
                }
                messages = out;
            }
            let batches = messages.into_iter().filter_map(|m| if let Message::Data(b) = m { Some(b) } else { None });
            Ok(batches.collect())
        });
        driver.expect("driver thread").join().expect("no panic")
    });
    Ran { output, counters: metrics.counters() }
}

fn int_column(batches: &[Batch], column: usize) -> Vec<Option<i64>> {
    let mut values = Vec::new();
    for batch in batches {
        let array = batch.rows.column(column).as_any().downcast_ref::<Int64Array>().expect("BIGINT column");
        values.extend((0..array.len()).map(|row| array.is_valid(row).then(|| array.value(row))));
    }
    values
}

#[test]
fn a_view_reading_a_view_below_it_or_a_cycle_is_told_so() {
    check_error(
        &[("a", "SELECT * FROM b"), ("b", "SELECT * FROM t")],
        &["view `a` (line 1) reads view `b`, which is defined below it (line 2)", "fix: move view `b` above view `a`"],
    );
    check_error(
        &[("a", "SELECT * FROM TABLE(TUMBLE(TABLE b, DESCRIPTOR(ts), INTERVAL '1' SECOND))"), ("b", "SELECT * FROM t")],
        &["view `a` (line 1) reads view `b`, which is defined below it (line 2)"],
    );
    check_error(&[("a", "SELECT * FROM a")], &["view `a` (line 1) reads itself", "a cycle of views cannot be planned"]);
    check_error(
        &[("a", "SELECT * FROM b"), ("b", "SELECT * FROM c"), ("c", "SELECT a FROM a")],
        &[
            "views read each other in a cycle: `a` (line 1) reads `b` (line 2), which reads `c` (line 3), which reads `a`",
            "a cycle of views cannot be planned",
        ],
    );
    check_error(&[("a", "SELECT * FROM nowhere")], &["table `nowhere` does not exist; the tables are: t"]);
    check_error(&[("a", "WITH b AS (SELECT * FROM t) SELECT * FROM b"), ("b", "SELECT * FROM t")], &["no error"]);
}

#[test]
fn window_functions_are_refused_by_name() {
    for (sql, name) in [
        ("SELECT RANK() OVER (PARTITION BY a ORDER BY ts) FROM t", "RANK(…) OVER (…)"),
        ("SELECT a, LAG(a) OVER (ORDER BY ts) FROM t", "LAG(…) OVER (…)"),
        ("SELECT FIRST_VALUE(a) OVER (PARTITION BY b ORDER BY ts) FROM t", "FIRST_VALUE(…) OVER (…)"),
    ] {
        check_error(
            &[("v", sql)],
            &[
                &format!(
                    "view `v`: {name}: window functions other than COUNT, SUM, MIN, MAX, AVG and TopN's ROW_NUMBER \
                     are not supported yet"
                ),
                "fix: aggregate over a window",
            ],
        );
    }
}

/// The explain lines of the operators of `view`'s stream.
pub(crate) fn operator_lines(planner: &SqlPlanner, view: &str) -> Vec<String> {
    let stream = planner.plan_stream(view, "sink").expect("plan_stream");
    let state = &stream.state;
    state.segments.iter().flat_map(|s| &s.operators).chain(&state.operators).map(|(line, _)| line.clone()).collect()
}

#[test]
fn over_aggregates_compute_rows_and_range_frames_in_event_time_order() {
    let views = [
        (
            "rows",
            "SELECT s, a, ts, AVG(a) OVER w AS mean, COUNT(*) OVER w AS n, MIN(s) OVER w AS low FROM t \
             WINDOW w AS (PARTITION BY s ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
        ),
        (
            "range",
            "SELECT a, SUM(a) OVER (ORDER BY ts RANGE BETWEEN INTERVAL '1' SECOND PRECEDING AND CURRENT ROW) AS total \
             FROM t",
        ),
        ("running", "SELECT a, MAX(b + 1) OVER (PARTITION BY s || 'x' ORDER BY ts) AS top FROM t"),
    ];
    let planner = plan(&views, OnError::Fail).expect("plans");
    let input = || {
        vec![
            rows(&[(5, 1, "x", 3000), (1, 2, "x", 1000), (2, 3, "y", 1500)]),
            rows(&[(-3, 4, "x", 2000), (7, 5, "x", 2000)]),
        ]
    };
    // No watermark: end of input emits every row, per partition in time order (x, then y).
    let output = run_batches(&planner, "rows", input()).output.expect("runs");
    assert_eq!(
        changes(&output),
        [
            "+1 x,1,1970-01-01T00:00:01,1,1,x",
            "+1 x,-3,1970-01-01T00:00:02,-1,2,x",
            // Ties in time go by arrival: 7 after -3. AVG of BIGINT truncates: (-3 + 7) / 2.
            "+1 x,7,1970-01-01T00:00:02,2,2,x",
            "+1 x,5,1970-01-01T00:00:03,6,2,x",
            "+1 y,2,1970-01-01T00:00:01.500,2,1,y",
        ]
    );
    let stream = planner.plan_stream("rows", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::AppendOnly);
    assert_eq!(stream.schema.field_with_name("mean").expect("mean").data_type(), &DataType::Int64);
    assert_eq!(
        operator_lines(&planner, "rows").iter().find(|l| l.starts_with("over_aggregate")).expect("over line"),
        "over_aggregate: [AVG(a), COUNT(*), MIN(s)] PARTITION BY s ORDER BY ts ROWS 1 PRECEDING"
    );
    // RANGE 1 s: [ts - 1 s, ts], rows of equal time are peers.
    let output = run_batches(&planner, "range", input()).output.expect("runs");
    assert_eq!(changes(&output), ["+1 1,1", "+1 2,3", "+1 -3,7", "+1 7,7", "+1 5,9"]);
    assert!(
        operator_lines(&planner, "range")
            .contains(&"over_aggregate: [SUM(a)] ORDER BY ts RANGE 1000 ms PRECEDING".to_string())
    );
    // No frame: RANGE UNBOUNDED PRECEDING; the partition and argument are expressions.
    let output = run_batches(&planner, "running", input()).output.expect("runs");
    assert_eq!(int_column(&output, 1), [Some(3), Some(6), Some(6), Some(6), Some(4)]);
    let lines = operator_lines(&planner, "running");
    assert!(lines.iter().any(|l| l.contains("RANGE UNBOUNDED PRECEDING")), "{lines:?}");
}

#[test]
fn an_over_aggregate_keeps_the_event_time_for_a_later_window() {
    let views = [
        ("recent", "SELECT a, ts, SUM(a) OVER (ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS s3 FROM t"),
        (
            "windowed",
            "SELECT window_start, MAX(s3) AS top FROM TABLE(TUMBLE(TABLE recent, DESCRIPTOR(ts), INTERVAL '10' SECOND)) \
             GROUP BY window_start, window_end",
        ),
        (
            "nested",
            "SELECT a, COUNT(*) OVER (PARTITION BY s ORDER BY ts) AS n, \
             SUM(a) OVER (ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS pair FROM t",
        ),
    ];
    let planner = plan(&views, OnError::Fail).expect("a window over an OVER aggregate's output plans");
    let output = run(&planner, "windowed", rows(&[(1, 0, "x", 0), (2, 0, "x", 1), (4, 0, "x", 2)])).output;
    assert_eq!(int_column(&output.expect("runs"), 1), [Some(7)]);
    let lines = operator_lines(&planner, "nested");
    assert_eq!(lines.iter().filter(|l| l.starts_with("over_aggregate")).count(), 2, "{lines:?}");
}

#[test]
fn over_aggregates_refuse_what_they_cannot_mean_by_name() {
    let over = |window: &str| format!("SELECT a, SUM(a) OVER ({window}) AS x FROM t");
    for (sql, expected) in [
        (over("ORDER BY ts ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING"), "it must end at CURRENT ROW"),
        (over("ORDER BY ts ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING"), "it must end at CURRENT ROW"),
        (over("ORDER BY ts GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW"), "GROUPS window frames"),
        (over("ORDER BY ts ROWS BETWEEN 100001 PRECEDING AND CURRENT ROW"), "the limit is 100000"),
        (over("PARTITION BY s"), "an OVER aggregate without ORDER BY"),
        (over("ORDER BY a"), "an OVER aggregate ORDER BY `t.a`, which is not an event-time attribute"),
        (over("ORDER BY ts DESC"), "an OVER aggregate ORDER BY ts DESC"),
        (over("ORDER BY ts, a"), "an OVER aggregate ordered by several columns"),
        (
            "SELECT SUM(a) OVER (ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), \
             SUM(a) OVER (ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM t"
                .to_string(),
            "OVER aggregates over different frames in one SELECT",
        ),
        ("SELECT COUNT(DISTINCT a) OVER (ORDER BY ts) FROM t".to_string(), "COUNT(DISTINCT …) OVER (…)"),
        (
            "SELECT a, ROW_NUMBER() OVER (ORDER BY ts) AS r, SUM(a) OVER (ORDER BY ts) AS x FROM t".to_string(),
            "the window function ROW_NUMBER beside OVER aggregates",
        ),
    ] {
        check_error(&[("v", &sql)], &["view `v`: ", expected, "fix:"]);
    }
    check_error(
        &[
            ("counts", "SELECT s, MAX(ts) AS ts FROM t GROUP BY s"),
            ("v", "SELECT s, COUNT(*) OVER (ORDER BY ts) AS n FROM counts"),
        ],
        &["view `v`: ", "is not supported yet"],
    );
}

#[test]
fn subqueries_in_expressions_are_refused_by_name() {
    for (sql, construct) in [
        ("SELECT a FROM t WHERE a IN (SELECT b FROM t)", "a subquery in an expression (`IN (SELECT …)`)"),
        ("SELECT a FROM t WHERE a NOT IN (SELECT b FROM t)", "a subquery in an expression (`NOT IN (SELECT …)`)"),
        ("SELECT a FROM t WHERE EXISTS (SELECT 1 FROM t)", "a subquery in an expression (`EXISTS (SELECT …)`)"),
        ("SELECT (SELECT MAX(b) FROM t) AS m FROM t", "a scalar subquery in an expression (`(SELECT …)`)"),
    ] {
        check_error(&[("v", sql)], &[&format!("view `v`: {construct}"), "is not supported yet", "x IN (1, 2, 3)"]);
    }
}

#[test]
fn months_and_years_are_no_window_size() {
    check_error(
        &[("v", "SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MONTH))")],
        &["view `v`: TUMBLE(...): the size INTERVAL '1' MONTH has no fixed length", "INTERVAL '30' DAY"],
    );
}

#[test]
fn an_expression_of_5000_terms_is_too_deep() {
    let sql = format!("SELECT {} AS x FROM t", vec!["a"; 5000].join(" + "));
    check_error(
        &[("huge", &sql)],
        &[
            &format!(
                "view `huge`: an expression is nested 5000 levels deep; the limit is {EXPRESSION_DEPTH_MAX} levels"
            ),
            "fix: split the expression",
        ],
    );
    let parens = format!("SELECT {}a{} AS x FROM t", "(".repeat(5000), ")".repeat(5000));
    check_error(&[("parens", &parens)], &["view `parens`: the query is nested deeper than the parser allows"]);
}

#[test]
fn expressions_at_the_depth_limit_plan_and_evaluate() {
    // Depth: n terms of a chain are n levels; each `b - (…)` is 2 (the operator and the
    // parentheses); `… > 0` adds 1.
    let chain = |terms: usize| vec!["a"; terms].join(" + ");
    let wraps = (EXPRESSION_DEPTH_MAX - 1) / 2;
    let nested = (0..wraps).fold("b".to_string(), |inner, _| format!("b - ({inner})"));
    let sql = format!(
        "SELECT {} AS x, {nested} AS y FROM t WHERE {} > 0",
        chain(EXPRESSION_DEPTH_MAX),
        chain(EXPRESSION_DEPTH_MAX - 1)
    );
    let planner = plan(&[("deep", &sql)], OnError::Fail).expect("plans");
    let ran = run(&planner, "deep", rows(&[(2, 3, "", 0)]));
    let output = ran.output.expect("evaluates");
    assert_eq!(int_column(&output, 0), [Some(2 * EXPRESSION_DEPTH_MAX as i64)]);
    assert_eq!((wraps + 1) % 2, 0, "an even count of b");
    assert_eq!(int_column(&output, 1), [Some(0)], "b - (b - (… - b)) with an even count of b is 0");
}

#[test]
fn hop_windows_per_row_are_bounded() {
    check_error(
        &[("v", "SELECT * FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY))")],
        &[
            "view `v`: HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY) puts each row in \
             86400000 windows (size 86400000 ms / slide 1 ms); the limit is 1000 windows per row",
            "fix: use a slide of at least 86400 ms (size / 1000), or raise `windows_per_row_max` in [pipeline]",
        ],
    );
    let at_limit = "SELECT * FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '1000' SECOND))";
    assert_eq!(plan_error(&[("v", at_limit)]), "no error");
    let hop = |table: &str| {
        format!(
            "SELECT a, ts FROM TABLE(HOP(TABLE {table}, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '100' SECOND))"
        )
    };
    check_error(
        &[("first", &hop("t")), ("second", &hop("first"))],
        &[
            "view `second`: `first` already puts each source row in 100 windows, and this window table function \
             puts each of those in 100: 10000 windows per source row; the limit is 1000",
            "raise `windows_per_row_max` in [pipeline]",
        ],
    );
    assert_eq!(WINDOWS_PER_ROW_MAX_DEFAULT, 1000);
}

#[test]
fn rows_whose_window_cannot_be_represented_are_counted() {
    let sql = "SELECT a, window_end FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' DAY))";
    let planner = plan(&[("days", sql)], OnError::Fail).expect("plans");
    let ran = run(&planner, "days", rows(&[(1, 0, "", i64::MIN), (2, 0, "", 0), (3, 0, "", i64::MAX)]));
    assert_eq!(int_column(&ran.output.expect("runs"), 0), [Some(2)]);
    assert!(ran.counters.contains(&("view days: rows outside the window range".to_string(), 2)), "{:?}", ran.counters);
}

#[test]
fn rows_failing_an_expression_follow_the_source_policy() {
    let views = [("ratios", "SELECT a / b AS q, CAST(s AS BIGINT) AS n FROM t WHERE a / b < 10")];
    let input = rows(&[(10, 2, "1", 0), (10, 0, "2", 0), (12, 3, "three", 0), (40, 1, "4", 0), (9, 3, "5", 0)]);
    let skip = plan(&views, OnError::Skip).expect("plans");
    let ran = run(&skip, "ratios", input.clone());
    let output = ran.output.expect("skip goes on");
    assert_eq!(int_column(&output, 0), [Some(5), Some(3)], "10/0 and CAST('three') are dropped, 40 filtered out");
    assert!(ran.counters.contains(&("view ratios: rows failing an expression".to_string(), 2)), "{:?}", ran.counters);

    let fail = plan(&views, OnError::Fail).expect("plans");
    let error = run(&fail, "ratios", input).output.expect_err("fail stops").to_string();
    for part in [
        "view `ratios`: the expression `t.a / t.b < Int64(10)` failed on the row (a = 10, b = 0, s = 2, ts = 1970-01-01T00:00:00)",
        "Divide by zero",
        "fix: make the expression defined for every row",
        "on_error = \"skip\"",
    ] {
        assert!(error.contains(part), "expected {part:?} in:\n{error}");
    }
}

#[test]
fn a_failing_row_names_the_view_that_holds_the_expression() {
    let views = [("inner", "SELECT a / b AS q FROM t"), ("outer", "SELECT q + 1 AS r FROM inner")];
    let planner = plan(&views, OnError::Fail).expect("plans");
    let error = run(&planner, "outer", rows(&[(1, 0, "", 0)])).output.expect_err("fails").to_string();
    assert!(error.starts_with("view `inner`: the expression `t.a / t.b AS q`"), "{error}");
}

/// Output rows as `±weight v1,v2,…`, in order.
pub(crate) fn changes(batches: &[Batch]) -> Vec<String> {
    let mut lines = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = batch
                .rows
                .columns()
                .iter()
                .map(|c| arrow::util::display::array_value_to_string(c, row).expect("format"))
                .collect();
            lines.push(format!("{:+} {}", batch.weight(row), cells.join(",")));
        }
    }
    lines
}

#[test]
fn a_non_windowed_group_by_updates_its_rows() {
    let sql = "SELECT s, COUNT(*) AS n, SUM(a) FILTER (WHERE a > 1) AS big, AVG(a) AS mean, MAX(a) AS top \
               FROM t GROUP BY s HAVING COUNT(*) < 3";
    let planner = plan(&[("counts", sql)], OnError::Fail).expect("plans");
    let batches = vec![rows(&[(1, 0, "x", 0), (2, 0, "y", 0)]), rows(&[(4, 0, "x", 5)]), rows(&[(9, 0, "x", 9)])];
    let output = run_batches(&planner, "counts", batches).output.expect("runs");
    assert_eq!(
        changes(&output),
        [
            "+1 x,1,,1,1",
            "+1 y,1,2,2,2",
            // AVG of BIGINT is BIGINT: (1 + 4) / 2 = 2.
            "-1 x,1,,1,1",
            "+1 x,2,4,2,4",
            // The third row of x: COUNT(*) = 3 fails HAVING, so only the retraction passes.
            "-1 x,2,4,2,4",
        ]
    );
    let stream = planner.plan_stream("counts", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::Updating { upsert_key: Some(vec![0]) });
    assert!(stream.updating);
    assert_eq!(stream.schema.field_with_name("mean").expect("mean").data_type(), &DataType::Int64);
}

/// NEXMark q15's shape: COUNT(DISTINCT) of one column under several filters, the
/// filters repeated by other aggregates. Equal arguments and filters are projected once
/// (so the operator shares one set of values per column), and each result is its own.
#[test]
fn count_distincts_of_one_column_under_filters_count_their_own_values() {
    let sql = "SELECT s, COUNT(DISTINCT a) AS d, COUNT(DISTINCT a) FILTER (WHERE b > 0) AS dp, \
               COUNT(*) FILTER (WHERE b > 0) AS np, COUNT(DISTINCT b) FILTER (WHERE b > 0) AS bp FROM t GROUP BY s";
    let planner = plan(&[("q", sql)], OnError::Fail).expect("plans");
    let batches =
        vec![rows(&[(1, 0, "x", 0), (1, 5, "x", 0), (2, 5, "x", 0)]), rows(&[(3, 0, "x", 1), (2, 7, "x", 1)])];
    let output = run_batches(&planner, "q", batches).output.expect("runs");
    assert_eq!(changes(&output), ["+1 x,2,2,2,1", "-1 x,2,2,2,1", "+1 x,3,2,3,2"]);
    let lines = operator_lines(&planner, "q");
    assert!(
        lines.contains(&"project: keys and aggregate arguments: t.s, t.a, t.b > Int64(0), t.b".to_string()),
        "{lines:?}"
    );
}

/// A window table function copies each row once per window (HOP), so the columns of its
/// input that nobody reads are dropped before window assignment; the event time stays.
#[test]
fn a_window_assigns_only_the_columns_read_after_it() {
    let sql = "SELECT s, COUNT(*) AS n, window_start FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, \
               INTERVAL '2' SECOND)) GROUP BY s, window_start, window_end";
    let planner = plan(
        &[("h", sql), ("all", "SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND))")],
        OnError::Fail,
    )
    .expect("plans");
    let lines = operator_lines(&planner, "h");
    assert_eq!(
        lines[..2],
        [
            "project: t.s, t.ts".to_string(),
            "window_assign: HOP(slide 1000 ms, size 2000 ms) on ts, each row to its 1000 ms slice once".to_string()
        ]
    );
    let output =
        run(&planner, "h", rows(&[(1, 0, "x", 500), (2, 0, "x", 1500), (3, 0, "y", 1500)])).output.expect("runs");
    let mut counts: Vec<String> = changes(&output);
    counts.sort();
    assert_eq!(counts.len(), 5, "{counts:?}");
    assert!(counts.iter().all(|line| line.starts_with("+1 ")), "{counts:?}");
    assert!(counts.contains(&"+1 x,2,1970-01-01T00:00:00".to_string()), "{counts:?}");
    // Every column read: nothing to drop.
    assert!(operator_lines(&planner, "all")[0].starts_with("window_assign: "));
}

/// A HOP window's rows go once to their slice (instead of once per window) when only
/// the grouping of a local window aggregate reads the window's bounds, the slide divides
/// the size, and nothing between can fail on a row; otherwise every row is copied into
/// each window. Both give the one-phase answer and counters.
#[test]
fn hop_rows_go_once_to_their_slice_when_only_the_grouping_reads_the_bounds() {
    let hop = "TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '3' SECOND))";
    let by = "GROUP BY s, window_start, window_end";
    let views = [
        ("sliced", format!("SELECT s, COUNT(*) AS n, SUM(a) AS total, window_start, window_end FROM {hop} {by}"), true),
        (
            "renamed",
            format!(
                "SELECT k, b, e, MIN(a) AS low FROM (SELECT window_end AS e, s AS k, a, window_start AS b FROM {hop}) \
                 AS r WHERE a > 1 GROUP BY k, b, e"
            ),
            true,
        ),
        ("filtered", format!("SELECT s, MAX(a) AS top, COUNT(*) FILTER (WHERE b > 0) AS n FROM {hop} {by}"), true),
        ("hops", format!("SELECT * FROM {hop}"), false),
        ("of_view", "SELECT s, COUNT(*) AS n, window_end FROM hops GROUP BY s, window_start, window_end".into(), true),
        ("time_grouped", format!("SELECT s, COUNT(*) AS n, window_time FROM {hop} {by}, window_time"), false),
        ("bound_read", format!("SELECT s, MAX(window_start) AS m FROM {hop} {by}"), false),
        (
            "bound_filtered",
            format!("SELECT s, COUNT(*) AS n FROM {hop} WHERE window_start > TIMESTAMP '1970-01-01 00:00:01' {by}"),
            false,
        ),
        (
            "bound_computed",
            format!("SELECT s, COUNT(*) AS n FROM {hop} {by}, EXTRACT(SECOND FROM window_end)"),
            false,
        ),
        ("may_fail", format!("SELECT s, COUNT(*) AS n FROM {hop} WHERE a * 2 > 3 {by}"), false),
        ("averaged", format!("SELECT s, AVG(a) AS mean FROM {hop} {by}"), false),
        (
            "uneven",
            "SELECT s, COUNT(*) AS n FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '3' SECOND)) \
             GROUP BY s, window_start, window_end"
                .into(),
            false,
        ),
    ];
    let declared: Vec<(&str, &str)> = views.iter().map(|(name, sql, _)| (*name, sql.as_str())).collect();
    let two_phases = plan_aggregating(&declared, OnError::Fail, true).expect("plans");
    let one_phase = plan_aggregating(&declared, OnError::Fail, false).expect("plans");
    let input = || {
        vec![
            rows(&[(1, 0, "x", 500), (2, 1, "x", 1500), (3, 1, "y", 1500), (4, 1, "x", 2999)]),
            rows(&[(5, 1, "x", 3000), (6, 0, "y", 4100), (7, 1, "x", 900), (8, 1, "x", 6001), (9, 1, "x", i64::MAX)]),
        ]
    };
    for (name, _, sliced) in &views {
        let lines = operator_lines(&two_phases, name);
        let slices = lines.iter().filter(|line| line.contains("slice")).count();
        assert_eq!(slices, if *sliced { 2 } else { 0 }, "{name}: {lines:?}");
        let (expected, got) = (run_batches(&one_phase, name, input()), run_batches(&two_phases, name, input()));
        let (mut expected_rows, mut got_rows) =
            (changes(&expected.output.expect("runs")), changes(&got.output.expect("runs")));
        expected_rows.sort();
        got_rows.sort();
        assert!(!got_rows.is_empty(), "{name}");
        assert_eq!(got_rows, expected_rows, "{name}");
        assert_eq!(got.counters, expected.counters, "{name}");
        assert!(got.counters.iter().any(|(counter, n)| counter.contains("outside the window range") && *n == 1));
    }
}

#[test]
fn the_planner_knows_which_streams_update_and_by_which_key() {
    let views = [
        ("counts", "SELECT s, b, COUNT(*) AS n FROM t GROUP BY s, b"),
        ("reordered", "SELECT n, b, s FROM counts"),
        ("keyless", "SELECT n FROM counts WHERE n > 1"),
        ("total", "SELECT COUNT(*) AS n FROM t"),
        ("of_counts", "SELECT n, COUNT(*) AS groups FROM counts GROUP BY n"),
        (
            "windowed",
            "SELECT s, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) \
             GROUP BY s, window_start, window_end",
        ),
        ("projected", "SELECT a + 1 AS x FROM t"),
    ];
    let planner = plan(&views, OnError::Fail).expect("plans");
    let changelog = |view: &str| planner.plan_stream(view, "sink").expect("plan_stream").changelog;
    assert_eq!(changelog("counts"), Changelog::Updating { upsert_key: Some(vec![0, 1]) });
    assert_eq!(changelog("reordered"), Changelog::Updating { upsert_key: Some(vec![2, 1]) });
    assert_eq!(changelog("keyless"), Changelog::Updating { upsert_key: None });
    assert_eq!(changelog("total"), Changelog::Updating { upsert_key: Some(vec![]) });
    assert_eq!(changelog("of_counts"), Changelog::Updating { upsert_key: Some(vec![0]) });
    assert_eq!(changelog("windowed"), Changelog::AppendOnly, "a window aggregate over an append-only input");
    assert_eq!(changelog("projected"), Changelog::AppendOnly);
    assert_eq!(changelog("t"), Changelog::AppendOnly);
}

#[test]
fn an_aggregate_of_an_updating_stream_takes_its_retractions() {
    let views = [
        ("counts", "SELECT s, COUNT(*) AS n FROM t GROUP BY s"),
        ("histogram", "SELECT n, COUNT(*) AS keys FROM counts GROUP BY n"),
    ];
    let planner = plan(&views, OnError::Fail).expect("plans");
    let batches = vec![rows(&[(0, 0, "x", 0), (0, 0, "y", 0)]), rows(&[(0, 0, "x", 0)])];
    let output = run_batches(&planner, "histogram", batches).output.expect("runs");
    // Two keys with one row; then x has two: one key with one row, one with two.
    assert_eq!(changes(&output), ["+1 1,2", "-1 1,2", "+1 1,1", "+1 2,1"]);
}

#[test]
fn windows_over_an_updating_stream_are_refused_by_name() {
    check_error(
        &[
            ("counts", "SELECT s, COUNT(*) AS n, MAX(ts) AS ts FROM t GROUP BY s"),
            ("windowed", "SELECT * FROM TABLE(TUMBLE(TABLE counts, DESCRIPTOR(ts), INTERVAL '1' SECOND))"),
        ],
        &["view `windowed`: a window table function over `counts`, an updating stream", "is not supported yet"],
    );
}

#[test]
fn topn_ranks_per_partition_and_updates_shifted_ranks() {
    let sql = "SELECT * FROM (SELECT s, a, ROW_NUMBER() OVER (PARTITION BY s ORDER BY a DESC) AS rn FROM t) \
               WHERE rn <= 2";
    let planner = plan(&[("top2", sql)], OnError::Fail).expect("plans");
    let batches = vec![rows(&[(5, 0, "x", 0), (3, 0, "x", 0), (1, 0, "y", 0)]), rows(&[(4, 0, "x", 0)])];
    let output = run_batches(&planner, "top2", batches).output.expect("runs");
    assert_eq!(changes(&output), ["+1 x,5,1", "+1 x,3,2", "+1 y,1,1", "-1 x,3,2", "+1 x,4,2"]);
    let stream = planner.plan_stream("top2", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::Updating { upsert_key: Some(vec![0, 2]) }, "(partition, rank)");
}

#[test]
fn deduplication_keeps_the_first_row_per_key() {
    let sql = "SELECT s, a FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY s ORDER BY ts) AS rn FROM t) \
               WHERE rn = 1 AND a > 0";
    let planner = plan(&[("first", sql)], OnError::Fail).expect("plans");
    let batches = vec![rows(&[(5, 0, "x", 10), (3, 0, "x", 20)]), rows(&[(7, 0, "x", 5), (0, 0, "y", 1)])];
    let output = run_batches(&planner, "first", batches).output.expect("runs");
    // An earlier row of x arrives late and replaces the first; y's only row fails a > 0.
    assert_eq!(changes(&output), ["+1 x,5", "-1 x,5", "+1 x,7"]);
    let stream = planner.plan_stream("first", "sink").expect("plan_stream");
    assert_eq!(stream.changelog, Changelog::Updating { upsert_key: Some(vec![0]) });
}

#[test]
fn row_number_outside_topn_is_refused_by_name() {
    let over = "ROW_NUMBER() OVER (PARTITION BY s ORDER BY a)";
    for (sql, expected) in [
        (format!("SELECT a, {over} AS rn FROM t"), "ROW_NUMBER() OVER (…) without a filter `rn <= N`"),
        (format!("SELECT * FROM (SELECT a, {over} AS rn FROM t) WHERE rn = 2"), "a filter on ROW_NUMBER() other than"),
        (
            "SELECT * FROM (SELECT a, ROW_NUMBER() OVER (PARTITION BY s ORDER BY a + 1) AS rn FROM t) WHERE rn <= 2"
                .to_string(),
            "ORDER BY an expression",
        ),
        (
            format!("SELECT * FROM (SELECT a, {over} AS rn FROM t) WHERE rn <= 100001"),
            "TopN keeps 100001 rows per partition",
        ),
    ] {
        check_error(&[("v", &sql)], &[expected]);
    }
    // Over an updating stream TopN keeps every row (a retraction lets the next one in).
    let planner = plan(
        &[
            ("counts", "SELECT s, COUNT(*) AS n FROM t GROUP BY s"),
            ("top", "SELECT * FROM (SELECT s, n, ROW_NUMBER() OVER (ORDER BY n DESC) AS rn FROM counts) WHERE rn <= 3"),
        ],
        OnError::Skip,
    )
    .expect("TopN over an updating stream plans");
    let lines = operator_lines(&planner, "top");
    assert!(lines.iter().any(|line| line.ends_with("(updating input: every row kept)")), "{lines:?}");
}

const SESSION_BY_S: &str = "TABLE(SESSION(TABLE t PARTITION BY s, DESCRIPTOR(ts), INTERVAL '10' SECOND))";

#[test]
fn session_windows_merge_rows_per_partition_key() {
    let sql = format!(
        "SELECT s, window_start, window_end, COUNT(*) AS n, SUM(a) AS total FROM {SESSION_BY_S} \
         GROUP BY window_start, window_end, s"
    );
    let planner = plan(&[("v", &sql)], OnError::Fail).expect("plan");
    // x: 0 s, 10 s (touching: one session), 30 s; y: 5 s.
    let input = rows(&[(1, 0, "x", 0), (2, 0, "x", 10_000), (4, 0, "x", 30_000), (8, 0, "y", 5_000)]);
    let output = run(&planner, "v", input).output.expect("run");
    let mut got: Vec<String> = Vec::new();
    for batch in &output {
        let text = arrow::util::pretty::pretty_format_batches(std::slice::from_ref(&batch.rows)).expect("format");
        got.extend(text.to_string().lines().filter(|l| l.starts_with("| ") && !l.contains(" s ")).map(str::to_string));
    }
    let got: Vec<String> = got.iter().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    let mut got = got;
    got.sort();
    assert_eq!(
        got,
        [
            "| x | 1970-01-01T00:00:00 | 1970-01-01T00:00:20 | 2 | 3 |",
            "| x | 1970-01-01T00:00:30 | 1970-01-01T00:00:40 | 1 | 4 |",
            "| y | 1970-01-01T00:00:05 | 1970-01-01T00:00:15 | 1 | 8 |",
        ]
    );
    let stream = planner.plan_stream("v", "sink").expect("stream");
    assert_eq!(stream.changelog, Changelog::AppendOnly);
    let lines: Vec<&str> = stream
        .state
        .segments
        .iter()
        .flat_map(|s| &s.operators)
        .chain(&stream.state.operators)
        .map(|(line, _)| line.as_str())
        .collect();
    assert!(lines.iter().any(|l| l.starts_with("window_assign: SESSION(gap 10000 ms")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("session_aggregate: [count(Int64(1)), sum(a)] by session, s")),
        "{lines:?}"
    );
}

#[test]
fn session_bounds_are_refused_anywhere_but_their_group_by() {
    check_error(
        &[("v", &format!("SELECT * FROM {SESSION_BY_S}"))],
        &["a SESSION window table function whose rows are not aggregated by GROUP BY window_start, window_end"],
    );
    check_error(
        &[(
            "v",
            &format!(
                "SELECT s, COUNT(*) FROM {SESSION_BY_S} WHERE window_end > ts GROUP BY window_start, window_end, s"
            ),
        )],
        &["reads a SESSION window's window_start, window_end or window_time outside its GROUP BY"],
    );
    check_error(
        &[("v", &format!("SELECT s, MAX(window_time) FROM {SESSION_BY_S} GROUP BY window_start, window_end, s"))],
        &["`max(window_time)`, which reads a SESSION window's"],
    );
    check_error(
        &[("v", &format!("SELECT a, COUNT(*) FROM {SESSION_BY_S} GROUP BY window_start, window_end, a"))],
        &["a SESSION window PARTITION BY s grouped by the keys [a]", "exactly the PARTITION BY columns"],
    );
    check_error(
        &[("v", &format!("SELECT s, COUNT(*) FROM {SESSION_BY_S} GROUP BY s"))],
        &["a SESSION window grouped without both its window_start and window_end"],
    );
    let unpartitioned = "SELECT a, window_end, COUNT(*) FROM TABLE(SESSION(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) \
                         GROUP BY window_start, window_end, a";
    check_error(&[("v", unpartitioned)], &["no error"]);
}

#[test]
fn a_join_plans_both_inputs_by_key_into_one_segment_and_refuses_what_it_cannot_mean() {
    let planner =
        plan(&[("j", "SELECT x.a, y.s FROM t x JOIN t y ON x.a = y.b AND x.ts < y.ts")], OnError::Skip).expect("plans");
    let stream = planner.plan_stream("j", "sink").expect("plan_stream");
    assert!(!stream.updating, "an inner join of append-only inputs is append-only");
    let state = &stream.state;
    assert_eq!(state.sides.len(), 1, "the right input is a side");
    let side = &state.sides[0];
    assert_eq!((side.into, side.port), (state.segments.len(), 1), "it enters the join's segment as port 1");
    let lines: Vec<&str> = state.operators.iter().map(|(line, _)| line.as_str()).collect();
    assert_eq!(
        lines[0],
        "join: INNER ON x.a = y.b AND x.ts < y.ts (interval join: right rows kept until the watermark passes y.ts + \
         0 ms; left rows kept (no bound))",
        "{lines:?}"
    );

    let outer = plan(&[("j", "SELECT x.a, y.s FROM t x LEFT JOIN t y ON x.a = y.a")], OnError::Skip).expect("plans");
    assert!(outer.plan_stream("j", "sink").expect("plan_stream").updating, "an outer join retracts padded rows");

    check_error(&[("j", "SELECT * FROM t x, t y")], &["a join without an equality between a column of each input"]);
    check_error(&[("j", "SELECT * FROM t x JOIN t y ON x.a + 1 = y.a")], &["the join key", "an expression"]);
    check_error(
        &[("j", "SELECT x.a FROM t x JOIN (SELECT y.a FROM t y JOIN t z ON y.a = z.a) w ON x.a = w.a")],
        &["right input is itself a join", "left-deep"],
    );
    check_error(
        &[
            ("j", "SELECT x.a, x.ts FROM t x JOIN t y ON x.a = y.a"),
            ("w", "SELECT * FROM TABLE(TUMBLE(TABLE j, DESCRIPTOR(ts), INTERVAL '1' SECOND))"),
        ],
        &["not an event-time attribute"],
    );
}

#[test]
fn a_union_all_merges_its_inputs_in_one_segment_and_keeps_a_shared_event_time() {
    let planner = plan(
        &[
            ("u", "SELECT a, ts FROM t WHERE a > 1 UNION ALL SELECT b, ts FROM t UNION ALL SELECT a + b, ts FROM t"),
            ("w", "SELECT window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE u, DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY window_start, window_end"),
        ],
        OnError::Skip,
    )
    .expect("plans: the union keeps ts an event-time attribute");
    let stream = planner.plan_stream("u", "sink").expect("plan_stream");
    assert!(!stream.updating);
    let state = &stream.state;
    let ports: Vec<(usize, usize)> = state.sides.iter().map(|side| (side.into, side.port)).collect();
    assert_eq!(ports, [(1, 1), (1, 2)], "the second and third inputs enter the union's segment");
    assert_eq!(state.operators[0].0, "union all: 3 inputs");
    check_error(&[("u", "SELECT a FROM t UNION SELECT b FROM t")], &["UNION is not supported"]);
    let updating =
        plan(&[("u", "SELECT s, COUNT(*) AS n FROM t GROUP BY s UNION ALL SELECT s, a FROM t")], OnError::Skip)
            .expect("plans");
    assert!(updating.plan_stream("u", "sink").expect("plan_stream").updating);
}

#[test]
fn a_condition_on_one_input_filters_it_before_the_join_unless_the_join_preserves_it() {
    // Every operator line, the right input's (a side's segments) too.
    let lines = |sql: &str| {
        let planner = plan(&[("j", sql)], OnError::Skip).expect("plans");
        let stream = planner.plan_stream("j", "sink").expect("plan_stream");
        let state = &stream.state;
        let sides = state.sides.iter().flat_map(|side| side.segments.iter().flat_map(|s| &s.operators));
        let trunk = state.segments.iter().flat_map(|s| &s.operators).chain(&state.operators);
        sides.chain(trunk).map(|(line, _)| line.clone()).collect::<Vec<String>>()
    };
    // NEXMark q20's shape: the WHERE on the right input's columns filters that input.
    let inner = lines("SELECT x.a, y.s FROM t x JOIN t y ON x.a = y.a WHERE y.b = 10 AND x.s <> y.s AND x.b > 1");
    assert!(inner.contains(&"filter: y.b = Int64(10)".to_string()), "{inner:?}");
    assert!(inner.contains(&"filter: x.b > Int64(1)".to_string()), "{inner:?}");
    assert!(inner.contains(&"join: INNER ON x.a = y.a AND x.s != y.s".to_string()), "{inner:?}");
    // A LEFT join keeps its left rows that fail a condition on them (padded): only the
    // right input's condition goes below it.
    let left = lines("SELECT x.a, y.s FROM t x LEFT JOIN t y ON x.a = y.a AND y.b = 10 AND x.b > 1");
    assert!(left.contains(&"filter: y.b = Int64(10)".to_string()), "{left:?}");
    assert!(left.iter().any(|l| l.starts_with("join: LEFT ON x.a = y.a AND x.b > Int64(1)")), "{left:?}");
    let right = lines("SELECT x.a, y.s FROM t x RIGHT JOIN t y ON x.a = y.a AND y.b = 10 AND x.b > 1");
    assert!(right.contains(&"filter: x.b > Int64(1)".to_string()), "{right:?}");
    assert!(right.iter().any(|l| l.starts_with("join: RIGHT ON x.a = y.a AND y.b = Int64(10)")), "{right:?}");
    let full = lines("SELECT x.a, y.s FROM t x FULL JOIN t y ON x.a = y.a AND y.b = 10 AND x.b > 1");
    assert!(!full.iter().any(|l| l.starts_with("filter:")), "{full:?}");
    // A volatile condition is checked on joined pairs, as written.
    let volatile = lines("SELECT x.a FROM t x JOIN t y ON x.a = y.a WHERE random() < 0.5");
    assert!(!volatile.iter().any(|l| l.starts_with("filter:")), "{volatile:?}");
}

/// The join line of the last view of `views` (over `t`).
fn join_line(views: &[(&str, &str)]) -> String {
    let planner = plan(views, OnError::Skip).expect("plans");
    let (view, _) = views.last().expect("a view");
    let lines = operator_lines(&planner, view);
    lines.into_iter().find(|line| line.starts_with("join: ")).expect("a join line")
}

#[test]
fn interval_bounds_between_event_times_free_each_side_they_bound() {
    let expiry = |condition: &str| {
        let sql = format!("SELECT x.a, y.b FROM t x JOIN t y ON x.a = y.a AND {condition}");
        let line = join_line(&[("j", &sql)]);
        let shown = line.split_once(" (interval join: ").map(|(_, shown)| shown.to_string());
        shown
            .map(|shown| shown.strip_prefix("state kept until the watermark passes ").unwrap_or(&shown).to_string())
            .map(|shown| shown[..shown.len() - 1].to_string())
    };
    let cases = [
        ("y.ts BETWEEN x.ts AND x.ts + INTERVAL '10' SECOND", "x.ts + 10000 ms / y.ts + 0 ms"),
        ("x.ts BETWEEN y.ts - INTERVAL '5' SECOND AND y.ts + INTERVAL '2' SECOND", "x.ts + 5000 ms / y.ts + 2000 ms"),
        // Strict comparisons, either side first, the interval on either time.
        (
            "x.ts > y.ts - INTERVAL '1' MINUTE AND y.ts + INTERVAL '30' SECOND >= x.ts",
            "x.ts + 60000 ms / y.ts + 30000 ms",
        ),
        ("y.ts < x.ts + INTERVAL '1' HOUR AND x.ts < y.ts", "x.ts + 3600000 ms / y.ts + 0 ms"),
        // One bound frees one side.
        ("x.ts <= y.ts", "right rows kept until the watermark passes y.ts + 0 ms; left rows kept (no bound)"),
        (
            "y.ts <= x.ts + INTERVAL '2' SECOND",
            "left rows kept until the watermark passes x.ts + 2000 ms; right rows kept (no bound)",
        ),
        // Months have no fixed length: only the other bound counts.
        (
            "y.ts BETWEEN x.ts AND x.ts + INTERVAL '1' MONTH",
            "right rows kept until the watermark passes y.ts + 0 ms; left rows kept (no bound)",
        ),
        // The tightest bound wins.
        (
            "y.ts <= x.ts + INTERVAL '10' SECOND AND y.ts < x.ts + INTERVAL '3' SECOND AND y.ts >= x.ts",
            "x.ts + 3000 ms / y.ts + 0 ms",
        ),
        // A right row can match only left rows at least 5 s older: it is still kept
        // until the watermark passes its own time (so it is never late while the
        // watermark allows it).
        ("y.ts BETWEEN x.ts + INTERVAL '5' SECOND AND x.ts + INTERVAL '10' SECOND", "x.ts + 10000 ms / y.ts + 0 ms"),
    ];
    for (condition, expected) in cases {
        assert_eq!(expiry(condition).as_deref(), Some(expected), "{condition}");
    }
    for condition in [
        // Not event times.
        "x.a BETWEEN y.b AND y.b + 10",
        // Both times of one input.
        "x.ts BETWEEN x.ts AND x.ts + INTERVAL '1' SECOND",
        "y.ts <> x.ts",
    ] {
        assert_eq!(expiry(condition), None, "{condition}");
    }
    // The conditions stay in the residual, and the explain line says what is freed.
    let line = join_line(&[(
        "j",
        "SELECT x.a FROM t x, t y WHERE x.a = y.a AND y.ts BETWEEN x.ts AND x.ts + INTERVAL '1' SECOND",
    )]);
    assert!(
        line.starts_with("join: INNER ON x.a = y.a AND y.ts BETWEEN x.ts AND x.ts + INTERVAL '1' SECOND "),
        "{line}"
    );
    assert!(
        line.ends_with("(interval join: state kept until the watermark passes x.ts + 1000 ms / y.ts + 0 ms)"),
        "{line}"
    );

    // A time without event time (computed in a view), and outer joins, keep every row.
    let plain_time = join_line(&[
        ("v", "SELECT a, CAST(ts AS TIMESTAMP(3)) AS ts FROM t"),
        ("j", "SELECT v.a FROM v JOIN t y ON v.a = y.a AND y.ts BETWEEN v.ts AND v.ts + INTERVAL '1' SECOND"),
    ]);
    assert!(!plain_time.contains("state kept"), "{plain_time}");
    let outer = join_line(&[(
        "j",
        "SELECT x.a FROM t x LEFT JOIN t y ON x.a = y.a AND y.ts BETWEEN x.ts AND x.ts + INTERVAL '1' SECOND",
    )]);
    assert!(!outer.contains("state kept"), "{outer}");
    // Nor does a join over an updating input.
    let updating = join_line(&[
        ("u", "SELECT a, MAX(ts) AS ts FROM t GROUP BY a"),
        ("j", "SELECT x.a FROM t x JOIN u ON x.a = u.a AND u.ts BETWEEN x.ts AND x.ts + INTERVAL '1' SECOND"),
    ]);
    assert!(!updating.contains("state kept"), "{updating}");
}

/// NEXMark q7's shape: every row joined to the highest `a` of the 10-second window that
/// ends within 10 s after it. The window's end (the bench's text, `window_end AS ts`) and
/// its rowtime (older Flink text, `TUMBLE_ROWTIME`) bound the join as event times do: each
/// window's row comes before the watermark passes its `window_end - 1`. So both sides are
/// freed: the rows 10 s after their time, the windows' maxima at their time.
#[test]
fn a_windows_end_or_rowtime_bounds_an_interval_join_as_an_event_time() {
    let q7 = |time: &str, from: &str| {
        format!(
            "SELECT x.a, x.b, x.ts FROM t x JOIN (SELECT MAX(a) AS top, {time} AS ts FROM {from}) m \
             ON x.a = m.top WHERE x.ts BETWEEN m.ts - INTERVAL '10' SECOND AND m.ts"
        )
    };
    let tvf = "TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY window_start, window_end";
    let legacy = "t GROUP BY TUMBLE(ts, INTERVAL '10' SECOND)";
    for sql in [q7("window_end", tvf), q7("TUMBLE_ROWTIME(ts, INTERVAL '10' SECOND)", legacy)] {
        let line = join_line(&[("q7", &sql)]);
        assert!(line.starts_with("join: INNER ON x.a = m.top AND x.ts BETWEEN m.ts - "), "{line}");
        assert!(
            line.ends_with("(interval join: state kept until the watermark passes x.ts + 10000 ms / m.ts + 0 ms)"),
            "{sql}: {line}"
        );
    }
    // A window's start, or its end less more than a millisecond, comes after the
    // watermark passed it: no bound.
    for time in ["window_start", "window_end - INTERVAL '2' MILLISECOND"] {
        let line = join_line(&[("q7", &q7(time, tvf))]);
        assert!(!line.contains("state kept"), "{time}: {line}");
    }
}

/// A window's rowtime is an event time: a later window may group by it, and a row in the
/// last millisecond of a first-level window stays in that window's second-level window.
#[test]
fn a_windows_rowtime_is_an_event_time_for_a_later_window() {
    let views = [
        (
            "per_second",
            "SELECT a, COUNT(*) AS n, TUMBLE_ROWTIME(ts, INTERVAL '1' SECOND) AS rt FROM t \
             GROUP BY TUMBLE(ts, INTERVAL '1' SECOND), a",
        ),
        (
            "per_ten",
            "SELECT SUM(n) AS n, COUNT(*) AS groups, window_start FROM TABLE(TUMBLE(TABLE per_second, DESCRIPTOR(rt), \
             INTERVAL '10' SECOND)) GROUP BY window_start, window_end",
        ),
    ];
    let planner = plan(&views, OnError::Fail).expect("a window over a window's rowtime plans");
    let input = rows(&[
        (1, 0, "x", 0),
        (1, 0, "x", 500),
        (2, 0, "x", 999),
        (1, 0, "x", 1000),
        (1, 0, "x", 9999),
        (1, 0, "x", 10_000),
    ]);
    let output = run(&planner, "per_ten", input).output.expect("runs");
    // [0 s, 10 s): (1, second 0) twice, (2, second 0), (1, second 1), (1, second 9);
    // [10 s, 20 s): (1, second 10).
    assert_eq!(int_column(&output, 0), [Some(5), Some(1)]);
    assert_eq!(int_column(&output, 1), [Some(4), Some(1)]);
    check_error(
        &[
            (
                "late",
                "SELECT a, window_end - INTERVAL '2' MILLISECOND AS rt FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY a, window_start, window_end",
            ),
            ("w", "SELECT * FROM TABLE(TUMBLE(TABLE late, DESCRIPTOR(rt), INTERVAL '10' SECOND))"),
        ],
        &["`rt` of `late` is not an event-time attribute"],
    );
}

const TEN_SECOND_COUNTS: &str = "SELECT a, window_start AS ws, window_end AS we, COUNT(*) AS n \
     FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY a, window_start, window_end";

#[test]
fn window_joins_free_a_window_as_the_watermark_passes_its_end_and_keep_its_bounds() {
    let views = [
        ("p", TEN_SECOND_COUNTS),
        ("q", TEN_SECOND_COUNTS),
        ("j", "SELECT p.a, p.ws, p.we, p.n, q.n AS m FROM p JOIN q ON p.a = q.a AND p.ws = q.ws AND p.we = q.we"),
        ("c", "SELECT ws, we, COUNT(*) AS keys, SUM(n) AS n FROM j GROUP BY ws, we"),
    ];
    assert_eq!(
        join_line(&views[..3]),
        "join: INNER ON p.a = q.a AND p.ws = q.ws AND p.we = q.we (window join: state kept until the watermark \
         passes p.we - 1 ms / q.we - 1 ms)"
    );
    // The bounds stay window bounds: a window aggregate over the join is a window
    // aggregate (append-only), not an updating group aggregate.
    let planner = plan(&views, OnError::Skip).expect("plans");
    let lines = operator_lines(&planner, "c");
    assert!(lines.iter().any(|line| line.starts_with("window_aggregate: ")), "{lines:?}");
    assert!(!planner.plan_stream("c", "sink").expect("plan_stream").updating);

    // Two window table functions joined on their bounds.
    let tvf = join_line(&[(
        "j",
        "SELECT x.a, y.b FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) x \
         JOIN TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) y \
         ON x.a = y.a AND x.window_start = y.window_start AND x.window_end = y.window_end",
    )]);
    assert!(
        tvf.ends_with("(window join: state kept until the watermark passes x.window_end - 1 ms / y.window_end - 1 ms)"),
        "{tvf}"
    );
    // Only one bound: a regular join.
    let one_bound = join_line(&[
        ("p", TEN_SECOND_COUNTS),
        ("q", TEN_SECOND_COUNTS),
        ("j", "SELECT p.a FROM p JOIN q ON p.a = q.a AND p.we = q.we"),
    ]);
    assert!(!one_bound.contains("state kept"), "{one_bound}");
}

#[test]
fn a_state_ttl_reaches_joins_running_aggregates_and_topn_and_a_view_may_have_its_own() {
    let options = PlannerOptions {
        threads: 1,
        vnodes: 16,
        batch_size: 1024,
        windows_per_row_max: 1000,
        state_ttl: Some(std::time::Duration::from_secs(3600)),
        local_aggregation: true,
        mini_batch_rows: 1,
    };
    let mut planner = SqlPlanner::new(options);
    let table = TableDef { name: "t".into(), schema: source_schema(), event_time: Some("ts".into()), changelog: None };
    planner.add_source(0, &[table], OnError::Skip).expect("source");
    let views = [
        ("counts", "SELECT s, COUNT(*) AS n FROM t GROUP BY s"),
        ("top", "SELECT * FROM (SELECT s, n, ROW_NUMBER() OVER (ORDER BY n DESC) AS rn FROM counts) WHERE rn <= 3"),
        ("inner_join", "SELECT x.a, y.b FROM t x JOIN t y ON x.a = y.a"),
        ("outer_join", "SELECT x.a, y.b FROM t x LEFT JOIN t y ON x.a = y.a"),
    ];
    planner.declare_views(views.iter().enumerate().map(|(index, (name, sql))| ViewDeclaration {
        name: name.to_string(),
        sql: sql.to_string(),
        location: format!("line {}", index + 1),
    }));
    planner.set_state_ttl("top", std::time::Duration::from_secs(600));
    for (name, sql) in views {
        planner.add_view(name, sql).expect("view");
    }
    let line = |view: &str, prefix: &str| {
        let lines = operator_lines(&planner, view);
        lines.into_iter().find(|line| line.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in {view}"))
    };
    assert!(line("counts", "group_aggregate").ends_with("(state TTL 1h)"));
    // `top` reads `counts`: its aggregate is planned as `counts` (1 h), its TopN as `top`.
    assert!(line("top", "group_aggregate").ends_with("(state TTL 1h)"));
    assert!(line("top", "topn").ends_with("(state TTL 10m)"));
    assert!(line("inner_join", "join").ends_with("(state TTL 1h)"));
    assert!(line("outer_join", "join").ends_with("(outer join: no state TTL)"));
}

/// COUNT, SUM, MIN and MAX per window run in two phases (a local fold per batch before
/// the exchange, a merging aggregate after); AVG or COUNT(DISTINCT) keep one phase.
#[test]
fn window_aggregates_split_in_two_phases_only_where_partials_merge() {
    let split = plan(&[("c", TEN_SECOND_COUNTS)], OnError::Skip).expect("plans");
    let lines = operator_lines(&split, "c");
    assert!(lines.iter().any(|line| line.starts_with("local_window_aggregate: [count(")), "{lines:?}");
    assert!(lines.iter().any(|line| line.ends_with("(merging the partials)")), "{lines:?}");
    let avg = "SELECT a, window_start, window_end, AVG(b) AS m \
               FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY a, window_start, window_end";
    let one = plan(&[("c", avg)], OnError::Skip).expect("plans");
    let lines = operator_lines(&one, "c");
    assert!(!lines.iter().any(|line| line.starts_with("local_window_aggregate")), "{lines:?}");
    assert!(lines.iter().any(|line| line.starts_with("window_aggregate: ") && !line.contains("merging")), "{lines:?}");
}

#[test]
fn explain_names_the_join_inputs_the_topns_and_the_group_aggregates_whose_state_spills() {
    let lines = |sql: &str, spill: bool| {
        let mut planner = plan(&[("j", sql)], OnError::Skip).expect("plans");
        if spill {
            planner.set_spill(sluice_operators::spill::SpillSpace::new(std::env::temp_dir(), 0));
        }
        let stream = planner.plan_stream("j", "sink").expect("plan_stream");
        let state = &stream.state;
        let sides = state.sides.iter().flat_map(|side| side.segments.iter().flat_map(|s| &s.operators));
        let trunk = state.segments.iter().flat_map(|s| &s.operators).chain(&state.operators);
        sides.chain(trunk).map(|(line, _)| line.clone()).collect::<Vec<String>>()
    };
    let join = "SELECT x.a, y.s FROM t x JOIN t y ON x.a = y.a";
    let inner = lines(join, true);
    let both = "join: INNER ON x.a = y.a (left and right rows spill to disk beyond state_memory_mib)";
    assert!(inner.contains(&both.to_string()), "{inner:?}");
    // A LEFT join pads its left rows: they are kept by row, and spill all the same.
    let left = lines("SELECT x.a, y.s FROM t x LEFT JOIN t y ON x.a = y.a", true);
    let both_sides = "(left and right rows spill to disk beyond state_memory_mib)";
    assert!(left.iter().any(|l| l.starts_with("join: LEFT") && l.ends_with(both_sides)), "{left:?}");
    assert!(lines(join, false).iter().all(|line| !line.contains("spill")), "no spill space, no spill");
    let top =
        "SELECT * FROM (SELECT a, b, ROW_NUMBER() OVER (PARTITION BY a ORDER BY b DESC) AS r FROM t) WHERE r <= 2";
    let topn = lines(top, true);
    let partitions = "(partitions and kept rows spill to disk beyond state_memory_mib)";
    assert!(topn.iter().any(|line| line.ends_with(partitions)), "{topn:?}");
    let groups = lines("SELECT a, COUNT(DISTINCT b) FROM t GROUP BY a", true);
    let spills = "(groups spill to disk beyond state_memory_mib)";
    assert!(groups.iter().any(|l| l.starts_with("group_aggregate") && l.ends_with(spills)), "{groups:?}");
}

/// `explain` writes interval literals as SQL does, not as DataFusion's debug form.
#[test]
fn interval_literals_read_as_sql() {
    let text = |months: i64, days: i64, nanos: i64| {
        format!(
            "x.ts + IntervalMonthDayNano(\"IntervalMonthDayNano {{ months: {months}, days: {days}, nanoseconds: {nanos} }}\")"
        )
    };
    for ((months, days, nanos), shown) in [
        ((0, 0, 10_000_000_000), "INTERVAL '10' SECOND"),
        ((0, 0, 1_500_000_000), "INTERVAL '1.5' SECOND"),
        ((0, 0, -1_000_000), "INTERVAL '-0.001' SECOND"),
        ((0, 0, 7_200_000_000_000), "INTERVAL '2' HOUR"),
        ((0, 0, 300_000_000_000), "INTERVAL '5' MINUTE"),
        ((0, 3, 0), "INTERVAL '3' DAY"),
        ((24, 0, 0), "INTERVAL '2' YEAR"),
        ((5, 0, 0), "INTERVAL '5' MONTH"),
        ((0, 0, 0), "INTERVAL '0' SECOND"),
    ] {
        assert_eq!(crate::stream::readable_intervals(&text(months, days, nanos)), format!("x.ts + {shown}"));
    }
    // A mix of units, and anything that is not the literal's form, stay as they were.
    let mixed = text(1, 2, 3);
    assert_eq!(crate::stream::readable_intervals(&mixed), mixed);
    let cut = "a + IntervalMonthDayNano(\"IntervalMonthDayNano { months: 0, days: x".to_string();
    assert_eq!(crate::stream::readable_intervals(&cut), cut);
    assert_eq!(
        crate::stream::readable_intervals(&format!("{}{}", text(0, 1, 0), text(0, 0, 0))),
        "x.ts + INTERVAL '1' DAYx.ts + INTERVAL '0' SECOND"
    );
}
