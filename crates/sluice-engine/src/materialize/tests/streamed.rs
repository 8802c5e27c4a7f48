//! Reading a table at an epoch batch by batch (`materialize::read`), and queries over
//! it: the rows streamed are the multiset at the epoch, whatever the batch size; a pin
//! keeps its epoch after its lease ends and holds folding back until it is dropped.

use std::sync::Arc;
use std::time::Duration;

use sluice_types::Epoch;

use super::{KEYS, LONG, Random, batch, open, pairs, registry, rows_of, thread_of};

/// A scan resumes each batch after the last row it took, so a row taken twice, skipped,
/// or a weight cut short at a batch's end would show here. Two threads, an old lease
/// holding every delta unfolded (the base at epoch 1 and up to seven deltas merged per
/// read), rows of weights past a batch; every epoch read at every batch size against the
/// multiset counted from scratch.
#[test]
fn a_table_streams_in_batches_as_the_multiset_at_its_epoch() {
    for seed in 0..24 {
        let mut random = Random(seed);
        let registry = registry(&["t"], 2);
        let sink = registry.sink("t").expect("sink");
        let mut threads = [open(&registry, &sink, "t", 0, 2), open(&registry, &sink, "t", 1, 2)];
        let mut multiset: std::collections::BTreeMap<(String, i64), i64> = Default::default();
        let mut oldest = None;
        for epoch in 1..=8u64 {
            for _ in 0..random.below(16) {
                let row = (KEYS[random.below(5) as usize].to_string(), random.below(4) as i64);
                let present = multiset.get(&row).copied().unwrap_or(0);
                let weight = if present > 0 && random.below(3) == 0 {
                    -1 - random.below(present as u64) as i64
                } else {
                    1 + random.below(6) as i64
                };
                *multiset.entry(row.clone()).or_default() += weight;
                let thread = thread_of(&registry, &row.0, row.1, 2);
                threads[thread].write(&batch(&[(&row.0, row.1, weight)])).expect("write");
            }
            for thread in &mut threads {
                thread.pre_commit(Epoch(epoch)).expect("seal");
            }
            sink.commit(Epoch(epoch), &[]).expect("commit");
            let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
            let kept = oldest.get_or_insert(lease);
            let table = registry.table("t").expect("table");
            let at = registry.pin(table, kept, epoch, Duration::ZERO).expect("pinned");
            let mut want: Vec<(String, i64)> = Vec::new();
            for (row, weight) in &multiset {
                want.extend(std::iter::repeat_n(row.clone(), (*weight).max(0) as usize));
            }
            for batch_rows in [1, 2, 3, 7, 8192] {
                let batches = at.batches(batch_rows).expect("read");
                assert!(batches.iter().all(|b| b.num_rows() <= batch_rows && b.num_rows() > 0), "seed {seed}");
                assert_eq!(rows_of(&batches), want, "seed {seed}, epoch {epoch}, {batch_rows} rows per batch");
            }
        }
    }
}

/// A pin taken under a lease keeps its epoch after the lease ends, while newer epochs
/// commit: the slice folds none of them into its base (it merges their deltas into one)
/// until the pin is dropped, then folds them at the next commit.
#[test]
fn a_pinned_table_outlives_its_lease_and_holds_folding_back() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    thread.write(&batch(&[("a", 1, 1), ("b", 2, 3)])).expect("write");
    thread.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    let table = Arc::clone(registry.table("t").expect("table"));
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    let pinned = registry.pin(&table, &lease, 1, Duration::ZERO).expect("pinned");
    lease.release();
    assert_eq!(registry.pin(&table, &lease, 1, Duration::ZERO).expect_err("released").code, "query.lease_expired");
    thread.write(&batch(&[("a", 1, -1), ("c", 2, 1)])).expect("write");
    thread.pre_commit(Epoch(2)).expect("seal");
    sink.commit(Epoch(2), &[]).expect("commit");
    thread.write(&batch(&[("b", 2, -3), ("c", 3, 1)])).expect("write");
    thread.pre_commit(Epoch(3)).expect("seal");
    sink.commit(Epoch(3), &[]).expect("commit");
    {
        let slice = super::super::lock(&table.slices[0]);
        // No lease, but the pin holds the base back; the two deltas are merged into one,
        // so that queries run back to back (one holding the base at every commit) leave one
        // delta to merge, not one per epoch (the regression: a CLI test's 300 queries
        // slowed from 84 s to past 300 s).
        let sealed: Vec<u64> = slice.sealed.iter().map(|(epoch, _)| *epoch).collect();
        assert_eq!((slice.base_epoch, sealed), (Some(1), vec![3]), "the pin holds folding back");
    }
    let want = pairs(&[("a", 1), ("b", 2), ("b", 2), ("b", 2)]);
    assert_eq!(rows_of(&pinned.batches(2).expect("read")), want, "epoch 1, as pinned");
    let newest = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(rows_of(&registry.read(&table, &newest, 2).expect("read")), pairs(&[("c", 2), ("c", 3)]));
    drop((pinned, newest));
    thread.pre_commit(Epoch(4)).expect("seal");
    sink.commit(Epoch(4), &[]).expect("commit");
    let slice = super::super::lock(&table.slices[0]);
    assert_eq!((slice.base_epoch, slice.sealed.len()), (Some(4), 0), "the pin dropped, every delta is folded");
}

/// A query scans its tables as streams: a row of weight past two scan batches, a table
/// named twice (scanned twice), a LIMIT, and the lease released once the tables are
/// pinned, before the execution.
#[test]
fn a_query_streams_its_tables_at_the_leased_epoch() {
    let registry = registry(&["t"], 2);
    let sink = registry.sink("t").expect("sink");
    let mut threads = [open(&registry, &sink, "t", 0, 2), open(&registry, &sink, "t", 1, 2)];
    let heavy = 2 * crate::query::SCAN_BATCH_ROWS as i64 + 5;
    threads[0].write(&batch(&[("heavy", 0, heavy)])).expect("write");
    let keys: Vec<String> = (0..300).map(|i| format!("k{i:03}")).collect();
    let rows: Vec<(&str, i64, i64)> = keys.iter().enumerate().map(|(i, k)| (k.as_str(), i as i64, 1)).collect();
    let (first, second) = rows.split_at(150);
    threads[0].write(&batch(first)).expect("write");
    threads[1].write(&batch(second)).expect("write");
    for thread in &mut threads {
        thread.pre_commit(Epoch(1)).expect("seal");
    }
    sink.commit(Epoch(1), &[]).expect("commit");
    // Epoch 2, kept as a delta by a lease on epoch 1: a retraction of every tenth row.
    let old = registry.lease(Duration::ZERO, LONG).expect("lease");
    let retracted: Vec<(&str, i64, i64)> = rows.iter().step_by(10).map(|(k, v, _)| (*k, *v, -1)).collect();
    threads[0].write(&batch(&retracted[..15])).expect("write");
    threads[1].write(&batch(&retracted[15..])).expect("write");
    for thread in &mut threads {
        thread.pre_commit(Epoch(2)).expect("seal");
    }
    sink.commit(Epoch(2), &[]).expect("commit");
    let csv = |sql: &str| {
        let prepared = crate::query::prepare(&registry, sql, crate::query::QueryLimits::default()).expect("prepared");
        let answer = prepared.run().expect("answer");
        assert_eq!(answer.epoch, Some(2));
        String::from_utf8(answer.encode(crate::query::QueryFormat::Csv).expect("csv")).expect("utf-8")
    };
    assert_eq!(csv("SELECT COUNT(*) AS n, SUM(v) AS s FROM t"), format!("n,s\n{},{}\n", heavy + 270, 44_850 - 4_350));
    let joined = "SELECT COUNT(*) AS n FROM t x JOIN t y ON x.k = y.k AND x.v = y.v WHERE x.k <> 'heavy'";
    assert_eq!(csv(joined), "n\n270\n", "each of 270 rows meets itself once");
    assert_eq!(csv("SELECT k FROM t WHERE k = 'heavy' LIMIT 3"), "k\nheavy\nheavy\nheavy\n");
    {
        let slice = super::super::lock(&registry.table("t").expect("table").slices[0]);
        assert_eq!((slice.base_epoch, slice.sealed.len()), (Some(1), 1), "read as the base and a delta");
    }
    drop(old);
    assert_eq!(registry.leases(), 0, "every query's lease ended with it");
    for thread in &mut threads {
        thread.pre_commit(Epoch(3)).expect("seal");
    }
    sink.commit(Epoch(3), &[]).expect("commit");
    let slice = super::super::lock(&registry.table("t").expect("table").slices[0]);
    assert_eq!(slice.base_epoch, Some(3), "every query's pins ended with it: the commit folded");
}
