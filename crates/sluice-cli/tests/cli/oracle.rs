//! Oracle test: the window aggregate's output through the whole binary, compared with a
//! from-scratch computation, over random rows, random batch boundaries, random thread
//! counts, random watermark delays and every window kind (TUMBLE, HOP, CUMULATE); with a
//! COUNT(DISTINCT), which runs in one phase, or without, in two (a HOP's rows then folded
//! per slice before the exchange).
//!
//! The oracle replays the source's contract: rows arrive in file order in batches of
//! `batch_size`, and after each batch the watermark becomes max(event time) - delay - 1 (a
//! lane promises nothing below its newest time minus the delay; the stream's watermark
//! excludes rows at it); a row whose window already ended at the current watermark
//! (end - 1 <= watermark) is late.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::harness::{Scratch, stderr};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Tumble { size: i64 },
    Hop { slide: i64, size: i64 },
    Cumulate { step: i64, size: i64 },
}

impl Kind {
    /// `(start, end)` of every window holding `ts`.
    fn windows(self, ts: i64) -> Vec<(i64, i64)> {
        let (slide, size) = match self {
            Kind::Tumble { size } => (size, size),
            Kind::Hop { slide, size } => (slide, size),
            Kind::Cumulate { step, size } => {
                let start = ts - ts.rem_euclid(size);
                return (1..=size / step).map(|k| (start, start + k * step)).filter(|(_, end)| *end > ts).collect();
            }
        };
        let mut start = ts - ts.rem_euclid(slide);
        let mut windows = Vec::new();
        while start > ts - size {
            windows.push((start, start + size));
            start -= slide;
        }
        windows
    }

    fn sql(self) -> String {
        match self {
            Kind::Tumble { size } => format!("TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '{size}' MILLISECOND)"),
            Kind::Hop { slide, size } => {
                format!(
                    "HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '{slide}' MILLISECOND, INTERVAL '{size}' MILLISECOND)"
                )
            }
            Kind::Cumulate { step, size } => format!(
                "CUMULATE(TABLE events, DESCRIPTOR(ts), INTERVAL '{step}' MILLISECOND, INTERVAL '{size}' MILLISECOND)"
            ),
        }
    }
}

#[derive(Default)]
struct Group {
    count: i64,
    sum: i64,
    min: Option<i64>,
    max: Option<i64>,
    distinct: std::collections::BTreeSet<i64>,
}

fn format_ms(ms: i64) -> String {
    let (day, ms) = if ms < 0 { ("1969-12-31", ms + 86_400_000) } else { ("1970-01-01", ms) };
    format!("{day} {:02}:{:02}:{:02}.{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

/// The expected output rows and late count (`distinct`: with the COUNT(DISTINCT) `d`).
fn oracle(rows: &[(u8, i64, i64)], batch_size: usize, delay: i64, kind: Kind, distinct: bool) -> (Vec<Value>, u64) {
    let mut groups: BTreeMap<(i64, i64, u8), Group> = BTreeMap::new();
    let mut watermark = i64::MIN;
    let mut late = 0;
    for batch in rows.chunks(batch_size) {
        for &(key, value, ts) in batch {
            for (start, end) in kind.windows(ts) {
                if end - 1 <= watermark {
                    late += 1;
                    continue;
                }
                let group = groups.entry((start, end, key)).or_default();
                group.count += 1;
                group.sum += value;
                group.min = Some(group.min.map_or(value, |m| m.min(value)));
                group.max = Some(group.max.map_or(value, |m| m.max(value)));
                group.distinct.insert(value);
            }
        }
        let batch_max = batch.iter().map(|r| r.2).max().expect("non-empty batch");
        watermark = watermark.max(batch_max - delay - 1);
    }
    let expected = groups
        .into_iter()
        .map(|((start, end, key), g)| {
            let mut row = json!({
                "k": format!("k{key}"), "c": g.count, "s": g.sum, "mn": g.min, "mx": g.max,
                "window_start": format_ms(start), "window_end": format_ms(end),
            });
            if distinct {
                row["d"] = json!(g.distinct.len());
            }
            row
        })
        .collect();
    (expected, late)
}

fn run(
    rows: &[(u8, i64, i64)],
    batch_size: usize,
    delay: i64,
    kind: Kind,
    threads: u32,
    distinct: bool,
) -> (Vec<Value>, u64) {
    run_split(rows, batch_size, delay, kind, threads, None, distinct)
}

/// `run`, with the file read by several lanes when `split_bytes` is small.
fn run_split(
    rows: &[(u8, i64, i64)],
    batch_size: usize,
    delay: i64,
    kind: Kind,
    threads: u32,
    split_bytes: Option<u64>,
    distinct: bool,
) -> (Vec<Value>, u64) {
    let scratch = Scratch::new();
    let input: String = rows.iter().map(|(k, v, ts)| format!("{{\"k\":\"k{k}\",\"v\":{v},\"ts\":{ts}}}\n")).collect();
    scratch.write("events.jsonl", &input);
    let pipeline = format!(
        "[pipeline]\nname = \"oracle\"\nbatch_size = {batch_size}\n\n[[source]]\nname = \"events\"\nconnector = \"file\"\nformat = \"json\"\n\
         schema = \"k VARCHAR, v BIGINT, ts TIMESTAMP(3)\"\nevent_time = \"ts\"\nwatermark_delay = \"{delay}ms\"\n\
         [source.options]\npath = \"events.jsonl\"\n{}\n[[view]]\nname = \"result\"\nsql = \"\"\"\n\
         SELECT k, COUNT(*) AS c, SUM(v) AS s, MIN(v) AS mn, MAX(v) AS mx{}, window_start, window_end\n\
         FROM TABLE({}) GROUP BY k, window_start, window_end\"\"\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"result\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"out.jsonl\"\n",
        split_bytes.map_or(String::new(), |bytes| format!("split_bytes = {bytes}\n")),
        if distinct { ", COUNT(DISTINCT v) AS d" } else { "" },
        kind.sql()
    );
    scratch.write("pipeline.toml", &pipeline);
    let output = scratch.sluice(&["run", "pipeline.toml", "--threads", &threads.to_string()]);
    let report = stderr(&output);
    assert!(output.status.success(), "sluice failed:\n{report}");
    let late = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("view result: late rows: ")?.parse().ok())
        .unwrap_or_else(|| panic!("no late-row count in the report:\n{report}"));
    let rows = scratch.read("out.jsonl").lines().map(|l| serde_json::from_str(l).expect("json row")).collect();
    (rows, late)
}

fn sorted(mut values: Vec<Value>) -> Vec<Value> {
    values.sort_by_key(|v| v.to_string());
    values
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (1i64..4).prop_map(|s| Kind::Tumble { size: s * 5_000 }),
        (1i64..3).prop_map(|s| Kind::Hop { slide: s * 2_500, size: 10_000 }),
        (1i64..4).prop_map(|s| Kind::Cumulate { step: 2_500, size: s * 5_000 }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn window_aggregates_match_a_from_scratch_computation(
        rows in prop::collection::vec((0u8..4, -50i64..50, 0i64..120_000), 1..80),
        batch_size in 1usize..10,
        delay in prop_oneof![Just(0i64), Just(1_000), Just(7_000), Just(60_000)],
        kind in kinds(),
        threads in 1u32..4,
        distinct in any::<bool>(),
    ) {
        let (expected, expected_late) = oracle(&rows, batch_size, delay, kind, distinct);
        let (got, late) = run(&rows, batch_size, delay, kind, threads, distinct);
        prop_assert_eq!(late, expected_late, "late rows");
        prop_assert_eq!(sorted(got), sorted(expected));
    }

    /// Several lanes on several threads merge their watermarks. Rows in strictly
    /// increasing event time are never late, however the lanes interleave (rows out of
    /// order within a lane would make lateness depend on that, as in Flink), so one
    /// answer is right.
    #[test]
    fn several_lanes_of_ordered_rows_match_a_from_scratch_computation(
        mut rows in prop::collection::vec((0u8..4, -50i64..50, 0i64..120_000), 20..120),
        batch_size in 1usize..10,
        kind in kinds(),
        threads in 2u32..4,
        distinct in any::<bool>(),
    ) {
        rows.sort_by_key(|(_, _, ts)| *ts);
        rows.dedup_by_key(|(_, _, ts)| *ts);
        let (expected, expected_late) = oracle(&rows, batch_size, 0, kind, distinct);
        prop_assert_eq!(expected_late, 0);
        let (got, late) = run_split(&rows, batch_size, 0, kind, threads, Some(200), distinct);
        prop_assert_eq!(late, 0, "late rows");
        prop_assert_eq!(sorted(got), sorted(expected));
    }
}
