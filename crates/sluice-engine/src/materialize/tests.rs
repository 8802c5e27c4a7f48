//! Integration of weighted rows, versions per epoch, and leases.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_types::{Batch, Epoch};

use super::{Materialized, TableSpec};

const LONG: Duration = Duration::from_secs(600);

fn schema() -> arrow::datatypes::SchemaRef {
    Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("v", DataType::Int64, true)]))
}

fn registry(tables: &[&str], threads: u32) -> Arc<Materialized> {
    let specs = tables.iter().map(|name| TableSpec { name: name.to_string(), schema: schema() }).collect();
    Materialized::new(specs, vec!["raw".into()], threads)
}

/// Rows `(k, v, weight)`.
fn batch(rows: &[(&str, i64, i64)]) -> Batch {
    let keys = StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let values = Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
    let weights = Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>());
    let rows = RecordBatch::try_new(schema(), vec![Arc::new(keys), Arc::new(values)]).expect("batch");
    Batch::with_weights(rows, weights)
}

/// Table `name` at the lease's epoch, as sorted `(k, v)` pairs.
fn read(registry: &Materialized, name: &str, lease: &super::Lease) -> Vec<(String, i64)> {
    let table = registry.table(name).expect("table");
    let mut rows = Vec::new();
    for batch in registry.read(table, lease, 2).expect("read") {
        let keys = batch.column(0).as_any().downcast_ref::<StringArray>().expect("keys");
        let values = batch.column(1).as_any().downcast_ref::<Int64Array>().expect("values");
        rows.extend((0..batch.num_rows()).map(|i| (keys.value(i).to_string(), values.value(i))));
    }
    rows.sort();
    rows
}

fn pairs(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
    rows.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn weighted_rows_integrate_into_a_multiset_per_committed_epoch() {
    let registry = registry(&["t"], 2);
    let sink = registry.sink("t").expect("sink");
    let mut first = sink.open(0, 2, true).expect("writer");
    let mut second = sink.open(1, 2, true).expect("writer");
    assert!(registry.lease(Duration::ZERO, LONG).is_none(), "nothing is readable before a commit");
    first.write(&batch(&[("a", 1, 1), ("b", 2, 1), ("a", 1, 1)])).expect("write");
    second.write(&batch(&[("c", 3, 1), ("c", 3, -1), ("d", 4, 2)])).expect("write");
    first.pre_commit(Epoch(1)).expect("seal");
    second.pre_commit(Epoch(1)).expect("seal");
    // Sealed but not committed: still not readable.
    assert!(registry.lease(Duration::ZERO, LONG).is_none());
    sink.commit(Epoch(1), &[]).expect("commit");
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 1);
    // A weight of 2 is two rows; a row retracted to 0 is gone.
    assert_eq!(read(&registry, "t", &lease), pairs(&[("a", 1), ("a", 1), ("b", 2), ("d", 4), ("d", 4)]));
    // A retraction in a later epoch removes it.
    first.write(&batch(&[("a", 1, -2)])).expect("write");
    first.pre_commit(Epoch(2)).expect("seal");
    second.pre_commit(Epoch(2)).expect("seal");
    sink.commit(Epoch(2), &[]).expect("commit");
    drop(lease);
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 2);
    assert_eq!(read(&registry, "t", &lease), pairs(&[("b", 2), ("d", 4), ("d", 4)]));
}

#[test]
fn a_lease_keeps_its_epoch_while_newer_ones_commit() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut writer = sink.open(0, 1, true).expect("writer");
    writer.write(&batch(&[("a", 1, 1)])).expect("write");
    writer.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    let old = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(registry.leases(), 1);
    for epoch in 2..=4 {
        writer.write(&batch(&[("a", epoch - 1, -1), ("a", epoch, 1)])).expect("write");
        writer.pre_commit(Epoch(epoch as u64)).expect("seal");
        sink.commit(Epoch(epoch as u64), &[]).expect("commit");
    }
    // Rows after the newest barrier are not part of any epoch yet.
    writer.write(&batch(&[("z", 9, 1)])).expect("write");
    assert_eq!(read(&registry, "t", &old), pairs(&[("a", 1)]));
    let new = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(new.epoch, 4);
    assert_eq!(read(&registry, "t", &new), pairs(&[("a", 4)]));
    assert_eq!(read(&registry, "t", &old), pairs(&[("a", 1)]), "the old epoch is still kept");
    // Released: the next commit folds the old versions away and the lease reads nothing.
    old.release();
    writer.pre_commit(Epoch(5)).expect("seal");
    sink.commit(Epoch(5), &[]).expect("commit");
    let table = registry.table("t").expect("table");
    let error = registry.read(table, &old, 10).expect_err("released");
    assert_eq!(error.code, "query.lease_expired");
    assert_eq!(read(&registry, "t", &new), pairs(&[("a", 4)]), "a newer lease still holds epoch 4");
    drop(new);
    assert_eq!(registry.leases(), 0);
}

#[test]
fn an_expired_lease_holds_nothing_back() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut writer = sink.open(0, 1, true).expect("writer");
    writer.write(&batch(&[("a", 1, 1)])).expect("write");
    writer.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    let expired = registry.lease(Duration::ZERO, Duration::ZERO).expect("lease");
    assert_eq!(registry.leases(), 0, "a lease past its deadline is not counted");
    assert!(!expired.is_live());
    let table = registry.table("t").expect("table");
    assert_eq!(registry.read(table, &expired, 10).expect_err("expired").code, "query.lease_expired");
}

#[test]
fn the_readable_epoch_is_committed_on_every_table() {
    let registry = registry(&["a", "b"], 1);
    let (sink_a, sink_b) = (registry.sink("a").expect("a"), registry.sink("b").expect("b"));
    let mut a = sink_a.open(0, 1, true).expect("writer");
    let mut b = sink_b.open(0, 1, true).expect("writer");
    for epoch in 1..=2 {
        a.write(&batch(&[("x", epoch, 1)])).expect("write");
        b.write(&batch(&[("x", epoch, 1)])).expect("write");
        a.pre_commit(Epoch(epoch as u64)).expect("seal");
        b.pre_commit(Epoch(epoch as u64)).expect("seal");
    }
    sink_a.commit(Epoch(1), &[]).expect("commit");
    sink_b.commit(Epoch(1), &[]).expect("commit");
    sink_a.commit(Epoch(2), &[]).expect("commit");
    // `a` committed 2, `b` only 1: both are read at 1, and `a` kept it.
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 1);
    assert_eq!(read(&registry, "a", &lease), pairs(&[("x", 1)]));
    assert_eq!(read(&registry, "b", &lease), pairs(&[("x", 1)]));
    sink_b.commit(Epoch(2), &[]).expect("commit");
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 2);
    assert_eq!(read(&registry, "a", &lease), pairs(&[("x", 1), ("x", 2)]));
}

#[test]
fn a_lease_waits_for_the_first_commit() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut writer = sink.open(0, 1, true).expect("writer");
    writer.pre_commit(Epoch(3)).expect("seal");
    let waiting = {
        let registry = Arc::clone(&registry);
        std::thread::spawn(move || registry.lease(LONG, LONG).map(|lease| lease.epoch))
    };
    sink.commit(Epoch(3), &[]).expect("commit");
    assert_eq!(waiting.join().expect("thread"), Some(3));
}
