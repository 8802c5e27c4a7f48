//! Updating streams through the whole binary: the changelog of a running (non-windowed)
//! aggregate integrates to a from-scratch computation over the input, whatever the
//! batch size, thread count and lane split; and a NEXMark-shaped running count over the
//! generator agrees with the bids themselves.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::golden::integrated;
use crate::harness::{Scratch, stderr};

/// The expected rows of `SELECT k, COUNT(*), SUM(v), MIN(v), MAX(v), COUNT(DISTINCT v),
/// COUNT(*) FILTER (WHERE v > 0) … GROUP BY k HAVING COUNT(*) > 1`.
fn oracle(rows: &[(u8, i64)]) -> Vec<String> {
    let mut groups: BTreeMap<u8, Vec<i64>> = BTreeMap::new();
    for &(key, value) in rows {
        groups.entry(key).or_default().push(value);
    }
    let mut expected: Vec<String> = groups
        .into_iter()
        .filter(|(_, values)| values.len() > 1)
        .map(|(key, values)| {
            let distinct: BTreeSet<i64> = values.iter().copied().collect();
            json!({
                "k": format!("k{key}"), "c": values.len(), "s": values.iter().sum::<i64>(),
                "mn": values.iter().min(), "mx": values.iter().max(), "d": distinct.len(),
                "p": values.iter().filter(|v| **v > 0).count(),
            })
            .to_string()
        })
        .collect();
    expected.sort();
    expected
}

/// Rows as canonical JSON text (keys sorted), sorted.
fn canonical(rows: Vec<String>) -> Vec<String> {
    let mut rows: Vec<String> =
        rows.iter().map(|row| serde_json::from_str::<Value>(row).expect("a JSON row").to_string()).collect();
    rows.sort();
    rows
}

fn run(rows: &[(u8, i64)], batch_size: usize, threads: u32, split_bytes: u64) -> Vec<String> {
    let scratch = Scratch::new();
    let input: String =
        rows.iter().enumerate().map(|(i, (k, v))| format!("{{\"k\":\"k{k}\",\"v\":{v},\"ts\":{i}}}\n")).collect();
    scratch.write("events.jsonl", &input);
    let pipeline = format!(
        "[pipeline]\nname = \"running\"\nbatch_size = {batch_size}\n\n[[source]]\nname = \"events\"\nconnector = \"file\"\n\
         format = \"json\"\nschema = \"k VARCHAR, v BIGINT, ts TIMESTAMP(3)\"\nevent_time = \"ts\"\n\
         [source.options]\npath = \"events.jsonl\"\nsplit_bytes = {split_bytes}\n\n[[view]]\nname = \"result\"\n\
         sql = \"\"\"\nSELECT k, COUNT(*) AS c, SUM(v) AS s, MIN(v) AS mn, MAX(v) AS mx, COUNT(DISTINCT v) AS d,\n\
         COUNT(*) FILTER (WHERE v > 0) AS p FROM events GROUP BY k HAVING COUNT(*) > 1\"\"\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"result\"\nconnector = \"file\"\nformat = \"json\"\n\
         [sink.options]\npath = \"out.jsonl\"\n"
    );
    scratch.write("pipeline.toml", &pipeline);
    let output = scratch.sluice(&["run", "pipeline.toml", "--threads", &threads.to_string()]);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    canonical(integrated(&scratch.read("out.jsonl")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Lanes interleave differently on every run, so the changelog differs; the table
    /// it integrates to must not.
    #[test]
    fn a_running_aggregate_integrates_to_a_from_scratch_computation(
        rows in prop::collection::vec((0u8..5, -30i64..30), 1..80),
        batch_size in 1usize..10,
        threads in 1u32..4,
        split_bytes in prop_oneof![Just(100u64), Just(400), Just(1_000_000)],
    ) {
        prop_assert_eq!(run(&rows, batch_size, threads, split_bytes), oracle(&rows));
    }
}

/// A running count of bids per auction over the NEXMark generator, beside the bids
/// themselves: the changelog integrates to exactly the per-auction counts of the bids.
/// The aggregate emits after every batch of 500 rows, so auctions change several times.
#[test]
fn a_running_count_of_bids_per_auction_matches_the_bids() {
    let scratch = Scratch::new();
    let pipeline = "[pipeline]\nname = \"bids\"\nbatch_size = 500\nmini_batch_rows = 1\n\n[[source]]\nname = \"nexmark\"\n\
        connector = \"nexmark\"\n[source.options]\nevents = 20000\n\n\
        [[view]]\nname = \"bids_per_auction\"\nsql = \"SELECT auction, COUNT(*) AS bids, MAX(price) AS top FROM bid GROUP BY auction\"\n\n\
        [[view]]\nname = \"raw\"\nsql = \"SELECT auction, price FROM bid\"\n\n\
        [[sink]]\nname = \"counts\"\nfrom = \"bids_per_auction\"\nconnector = \"file\"\nformat = \"json\"\n\
        [sink.options]\npath = \"counts.jsonl\"\n\n\
        [[sink]]\nname = \"bids\"\nfrom = \"raw\"\nconnector = \"file\"\nformat = \"json\"\n[sink.options]\npath = \"bids.jsonl\"\n";
    scratch.write("pipeline.toml", pipeline);
    let output = scratch.sluice(&["run", "pipeline.toml", "--threads", "2"]);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    let mut expected: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for line in scratch.read("bids.jsonl").lines() {
        let bid: Value = serde_json::from_str(line).expect("a bid");
        let (auction, price) = (bid["auction"].as_i64().expect("auction"), bid["price"].as_i64().expect("price"));
        let entry = expected.entry(auction).or_insert((0, i64::MIN));
        *entry = (entry.0 + 1, entry.1.max(price));
    }
    let counts = scratch.read("counts.jsonl");
    assert!(counts.contains("\"op\":\"-U\"") && counts.contains("\"op\":\"+U\""), "auctions get several bids");
    let got: BTreeMap<i64, (i64, i64)> = integrated(&counts)
        .iter()
        .map(|line| {
            let row: Value = serde_json::from_str(line).expect("a row");
            let field = |name: &str| row[name].as_i64().expect("BIGINT");
            (field("auction"), (field("bids"), field("top")))
        })
        .collect();
    assert!(expected.values().map(|(bids, _)| bids).sum::<i64>() > 15_000, "most events are bids");
    assert_eq!(got, expected);
}
