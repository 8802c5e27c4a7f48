//! Oracle test for updating SQL: joins (inner, left, right and full, with conditions on
//! one input alone and on both),
//! an aggregate over a join, and a union under an aggregate, run by the whole binary over
//! random rows, random batch sizes and thread counts, with all state in memory or with a
//! memory budget of 0 (every join's rows but the newest chunk in spill files, every group
//! not touched by the latest mini-batch in cold runs), killed at a random checkpoint and
//! resumed on another thread count; the changelog each sink wrote, integrated, must equal
//! DataFusion's batch answer to the same SQL over all the input.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use proptest::prelude::*;

use crate::golden::integrated;
use crate::harness::{Scratch, sluice_command, stderr};

/// (name, SQL): each a view and a sink of that name.
/// The joins' conditions on one input alone filter that input before the join, except
/// on a side the outer join keeps (whose failing rows it pads): `b.w > 2` below the left
/// join, `a.v > 1` below the right one, none below the full one.
const QUERIES: [(&str, &str); 6] = [
    ("inner_join", "SELECT a.k, a.v, b.w FROM a JOIN b ON a.k = b.k WHERE b.w > 2"),
    ("left_join", "SELECT a.k, a.v, b.w FROM a LEFT JOIN b ON a.k = b.k AND a.v < b.w AND b.w > 2 AND a.v <> 3"),
    ("right_join", "SELECT a.v, b.k, b.w FROM a RIGHT JOIN b ON a.k = b.k AND a.v > 1 AND b.w <> 2"),
    ("full_join", "SELECT a.v, b.w FROM a FULL JOIN b ON a.k = b.k AND a.v > 1 AND b.w < 6"),
    ("joined_totals", "SELECT a.k, COUNT(*) AS n, SUM(b.w) AS total FROM a JOIN b ON a.k = b.k GROUP BY a.k"),
    ("union_counts", "SELECT k, COUNT(*) AS n FROM (SELECT k FROM a UNION ALL SELECT k AS k FROM b) AS u GROUP BY k"),
];

type Rows = Vec<(Option<i64>, i64)>;

fn jsonl(rows: &Rows, value: &str) -> String {
    rows.iter()
        .map(|(k, v)| {
            let k = k.map_or("null".to_string(), |k| k.to_string());
            format!("{{\"k\": {k}, \"{value}\": {v}}}\n")
        })
        .collect()
}

fn pipeline(batch_size: usize, checkpoints: bool, spill: bool) -> String {
    let memory = if spill { "state_memory_mib = 0\n" } else { "" };
    let mut text = format!("[pipeline]\nname = \"updating-oracle\"\nbatch_size = {batch_size}\n{memory}\n");
    if checkpoints {
        text.push_str("[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n");
    }
    for (name, value) in [("a", "v"), ("b", "w")] {
        text.push_str(&format!(
            "[[source]]\nname = \"{name}\"\nconnector = \"file\"\nformat = \"json\"\nschema = \"k BIGINT, {value} BIGINT\"\n\
             [source.options]\npath = \"{name}.jsonl\"\n\n"
        ));
    }
    for (name, sql) in QUERIES {
        text.push_str(&format!(
            "[[view]]\nname = \"{name}\"\nsql = \"{sql}\"\n\n[[sink]]\nname = \"{name}\"\nfrom = \"{name}\"\n\
             connector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"{name}.jsonl\"\n\n"
        ));
    }
    text
}

/// A row as compared: its non-null columns, by name.
fn canonical(line: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let object = value.as_object().expect("a JSON object per row");
    let kept: BTreeMap<&String, &serde_json::Value> =
        object.iter().filter(|(name, value)| *name != "op" && !value.is_null()).collect();
    serde_json::to_string(&kept).expect("JSON")
}

/// The table a sink's output integrates to (an append-only sink's rows as they are).
fn table(output: &str) -> Vec<String> {
    let rows: Vec<String> = if output.starts_with("{\"op\"") {
        integrated(output)
    } else {
        output.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()
    };
    let mut rows: Vec<String> = rows.iter().map(|row| canonical(row)).collect();
    rows.sort();
    rows
}

fn batch(rows: &Rows, value: &str) -> RecordBatch {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new(value, DataType::Int64, true)]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
    ];
    RecordBatch::try_new(schema, columns).expect("batch")
}

/// DataFusion's answer to `sql` over all of `a` and `b`, as canonical rows.
fn batch_answer(a: &Rows, b: &Rows, sql: &str) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let batches = runtime.block_on(async {
        let context = SessionContext::new();
        context.register_batch("a", batch(a, "v")).expect("register a");
        context.register_batch("b", batch(b, "w")).expect("register b");
        context.sql(sql).await.expect("plan").collect().await.expect("run")
    });
    let mut out = Vec::new();
    let mut writer = arrow::json::LineDelimitedWriter::new(&mut out);
    writer.write_batches(&batches.iter().collect::<Vec<_>>()).expect("json");
    writer.finish().expect("json");
    let text = String::from_utf8(out).expect("utf-8");
    let mut rows: Vec<String> = text.lines().map(canonical).collect();
    rows.sort();
    rows
}

fn run(scratch: &Scratch, threads: u32, failpoints: Option<String>) -> std::process::Output {
    let mut command = sluice_command(scratch.dir.path());
    command.args(["--quiet", "run", "pipeline.toml", "--threads", &threads.to_string()]).stdout(Stdio::null());
    if let Some(failpoints) = failpoints {
        command.env("SLUICE_FAILPOINTS", failpoints);
    }
    command.output().expect("run sluice")
}

fn rows_strategy() -> impl Strategy<Value = Rows> {
    prop::collection::vec((prop::option::weighted(0.85, 0i64..5), -3i64..10), 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn updating_sql_integrates_to_the_batch_answer_through_a_crash(
        a in rows_strategy(),
        b in rows_strategy(),
        batch_size in 1usize..8,
        threads in 1u32..3,
        crash_after in 1usize..4,
        spill in any::<bool>(),
    ) {
        let scratch = Scratch::new();
        scratch.write("a.jsonl", &jsonl(&a, "v"));
        scratch.write("b.jsonl", &jsonl(&b, "w"));
        scratch.write("pipeline.toml", &pipeline(batch_size, true, spill));
        // One checkpoint per batch; killed after the `crash_after`-th, unless the input
        // ends first; then resumed on the other thread count.
        let failpoints = format!(
            "source.barrier_after_batch=return;checkpoint.after_publish={}*off->return(kill)",
            crash_after - 1
        );
        let first = run(&scratch, threads, Some(failpoints));
        let resumed = run(&scratch, 3 - threads, None);
        prop_assert!(resumed.status.success(), "first: {}\nresumed: {}", stderr(&first), stderr(&resumed));
        for (name, sql) in QUERIES {
            let got = table(&scratch.read(&format!("{name}.jsonl")));
            let want = batch_answer(&a, &b, sql);
            prop_assert_eq!(
                got,
                want,
                "{} ({} → {} threads, batches of {}, spilled: {})",
                name,
                threads,
                3 - threads,
                batch_size,
                spill
            );
        }
    }
}
