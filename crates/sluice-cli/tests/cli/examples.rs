//! The shipped examples validate and run, and the README's first command's pipeline
//! produces windows; the updating example writes changelogs that integrate to one row
//! per auction.

use std::path::{Path, PathBuf};

use crate::harness::{Scratch, stderr, stdout};

fn examples() -> PathBuf {
    crate::harness::crate_dir().join("../../examples")
}

/// Copies the examples to a scratch directory, so runs never write into the source tree.
fn copy_examples(scratch: &Scratch) {
    let copy = |from: &Path, to: &str| {
        std::fs::copy(from, scratch.path(to)).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    std::fs::create_dir_all(scratch.path("data")).expect("data dir");
    copy(&examples().join("nexmark.toml"), "nexmark.toml");
    copy(&examples().join("file.toml"), "file.toml");
    copy(&examples().join("running.toml"), "running.toml");
    copy(&examples().join("data/clicks.jsonl"), "data/clicks.jsonl");
}

#[test]
fn the_nexmark_example_prints_hot_auction_windows() {
    let scratch = Scratch::new();
    copy_examples(&scratch);
    let run = scratch.sluice(&["run", "nexmark.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let rows: Vec<serde_json::Value> =
        stdout(&run).lines().map(|l| serde_json::from_str(l).expect("a JSON row")).collect();
    assert!(!rows.is_empty(), "no windows printed");
    for row in &rows {
        assert!(row["bids"].as_i64().expect("bids") >= 40, "HAVING COUNT(*) >= 40 holds: {row}");
        assert!(row["window_start"].as_str().expect("window_start").starts_with("2026-01-01 00:00:"));
    }
    assert!(stderr(&run).contains("completed (end of input)"));
}

#[test]
fn the_file_example_skips_its_bad_row_and_writes_csv() {
    let scratch = Scratch::new();
    copy_examples(&scratch);
    let run = scratch.sluice(&["run", "file.toml"]);
    let report = stderr(&run);
    assert!(run.status.success(), "{report}");
    assert!(report.contains("300 rows in, 1 bad rows") && report.contains("clicks.jsonl:121"), "{report}");
    let csv = scratch.read("out/page_stats.csv");
    assert!(csv.starts_with("page,window_start,views,visitors,mean_latency_ms\n"), "{csv}");
    let views: i64 =
        csv.lines().skip(1).map(|l| l.split(',').nth(2).expect("views").parse::<i64>().expect("int")).sum();
    assert_eq!(views, 300, "every good row is counted in exactly one window");
}

#[test]
fn the_running_example_writes_changelogs() {
    let scratch = Scratch::new();
    copy_examples(&scratch);
    let run = scratch.sluice(&["run", "running.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let counts = scratch.read("out/bids_per_auction.jsonl");
    for op in ["+I", "-U", "+U"] {
        assert!(counts.contains(&format!("{{\"op\":\"{op}\"")), "no {op} row in:\n{counts}");
    }
    let table = crate::golden::integrated(&counts);
    let auctions: std::collections::BTreeSet<i64> = table
        .iter()
        .map(|row| serde_json::from_str::<serde_json::Value>(row).expect("row")["auction"].as_i64().expect("auction"))
        .collect();
    assert_eq!(auctions.len(), table.len(), "one row per auction once integrated");
    let top = crate::golden::integrated(&scratch.read("out/top_bids.jsonl"));
    assert!(!top.is_empty());
    for row in &top {
        let rank = serde_json::from_str::<serde_json::Value>(row).expect("row")["rownum"].as_u64().expect("rank");
        assert!((1..=3).contains(&rank), "{row}");
    }
}
