//! The normalization's table of cases, its anomalies' counters, its state through
//! checkpoints (full, delta, restore, a golden record) and damaged records.

use std::sync::Arc;

use arrow::array::{Array, Int8Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use sluice_runtime::{Metrics, Operator, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, RowKind, vnode};

use super::{ChangelogNormalize, NormalizeSpec};
use crate::testing;

const VNODES: u32 = 16;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("v", DataType::Utf8, true)]))
}

fn normalize(upsert: bool) -> (ChangelogNormalize, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
    let spec = NormalizeSpec { source: "s".into(), schema: schema(), key: vec![0], upsert, vnodes: VNODES };
    (ChangelogNormalize::new(spec, Arc::clone(&metrics)).expect("normalize"), metrics)
}

/// Rows as (kind, id, v), with the kinds column after the declared ones.
fn input(rows: &[(&str, Option<i64>, Option<&str>)]) -> Batch {
    let kinds = Int8Array::from_iter_values(rows.iter().map(|r| RowKind::from_short(r.0).expect("a kind") as i8));
    let ids = Int64Array::from_iter(rows.iter().map(|r| r.1));
    let values = StringArray::from_iter(rows.iter().map(|r| r.2));
    let mut fields: Vec<Field> = schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(sluice_types::ROW_KIND_COLUMN, DataType::Int8, false));
    let rows =
        RecordBatch::try_new(Arc::new(Schema::new(fields)), vec![Arc::new(ids), Arc::new(values), Arc::new(kinds)])
            .expect("rows");
    Batch::inserts(rows)
}

/// The output as `+1 id,v` lines.
fn lines(out: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        let ids = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("ids");
        let values = batch.rows.column(1).as_any().downcast_ref::<StringArray>().expect("values");
        for row in 0..batch.num_rows() {
            let value = if values.is_null(row) { "null" } else { values.value(row) };
            lines.push(format!("{:+} {},{}", batch.weight(row), ids.value(row), value));
        }
    }
    lines
}

fn step(operator: &mut ChangelogNormalize, rows: &[(&str, Option<i64>, Option<&str>)]) -> Vec<String> {
    let mut out = Vec::new();
    operator.on_data(input(rows), &mut out).expect("data");
    lines(&out)
}

fn counter(metrics: &Metrics, name: &str) -> u64 {
    metrics.counters().into_iter().find(|(n, _)| n.starts_with(&format!("source s: {name}"))).map_or(0, |(_, v)| v)
}

/// Each case: the rows of one batch after `before`, and what leaves.
fn check(
    upsert: bool,
    before: &[(&str, Option<i64>, Option<&str>)],
    rows: &[(&str, Option<i64>, Option<&str>)],
    expected: &[&str],
) {
    let (mut operator, _) = normalize(upsert);
    step(&mut operator, before);
    assert_eq!(step(&mut operator, rows), expected, "after {before:?}: {rows:?}");
}

#[test]
fn debezium_changes_become_weights_with_each_change_a_retraction_then_its_new_row() {
    let a1 = [("+I", Some(1), Some("a"))];
    check(false, &[], &a1, &["+1 1,a"]);
    check(false, &a1, &[("-U", Some(1), Some("a")), ("+U", Some(1), Some("b"))], &["-1 1,a", "+1 1,b"]);
    check(false, &a1, &[("-D", Some(1), Some("a"))], &["-1 1,a"]);
    // An update without its before image (PostgreSQL's default replica identity).
    check(false, &a1, &[("+U", Some(1), Some("b"))], &["-1 1,a", "+1 1,b"]);
    // Nothing changes, nothing leaves.
    check(false, &a1, &[("+U", Some(1), Some("a"))], &[]);
    // Several changes of a key in one batch, in order.
    check(
        false,
        &[],
        &[
            ("+I", Some(1), Some("a")),
            ("-U", Some(1), Some("a")),
            ("+U", Some(1), Some("b")),
            ("-D", Some(1), Some("b")),
        ],
        &["+1 1,a", "-1 1,a", "+1 1,b", "-1 1,b"],
    );
}

#[test]
fn upserts_replace_a_keys_row_and_a_tombstone_retracts_it_by_key() {
    let a1 = [("+U", Some(1), Some("a"))];
    check(true, &[], &a1, &["+1 1,a"]);
    check(true, &a1, &[("+U", Some(1), Some("b"))], &["-1 1,a", "+1 1,b"]);
    check(true, &a1, &[("-D", Some(1), None)], &["-1 1,a"]);
    check(true, &a1, &[("+U", Some(1), Some("a"))], &[]);
}

#[test]
fn each_anomaly_is_counted_and_never_breaks_the_changelog() {
    let (mut operator, metrics) = normalize(false);
    step(&mut operator, &[("+I", Some(1), Some("a"))]);
    // A duplicate insert: applied as an update.
    assert_eq!(step(&mut operator, &[("+I", Some(1), Some("b"))]), ["-1 1,a", "+1 1,b"]);
    assert_eq!(step(&mut operator, &[("+I", Some(1), Some("b"))]), Vec::<String>::new());
    assert_eq!(counter(&metrics, "duplicate inserts"), 2);
    // A delete of an unknown key: dropped.
    assert_eq!(step(&mut operator, &[("-D", Some(9), Some("x"))]), Vec::<String>::new());
    assert_eq!(step(&mut operator, &[("-U", Some(8), Some("x"))]), Vec::<String>::new());
    assert_eq!(counter(&metrics, "deletes of unknown keys"), 2);
    // Out of order: the before image is not the key's row; the key's row is retracted.
    assert_eq!(step(&mut operator, &[("-U", Some(1), Some("a")), ("+U", Some(1), Some("c"))]), ["-1 1,b", "+1 1,c"]);
    assert_eq!(counter(&metrics, "out-of-order changes"), 1);
    // A before image of the key alone (NULL elsewhere) is no anomaly.
    assert_eq!(step(&mut operator, &[("-D", Some(1), None)]), ["-1 1,c"]);
    assert_eq!(counter(&metrics, "out-of-order changes"), 1);
    step(&mut operator, &[("+I", Some(1), Some("c"))]);
    // A NULL key: dropped.
    assert_eq!(step(&mut operator, &[("+I", None, Some("n"))]), Vec::<String>::new());
    assert_eq!(counter(&metrics, "rows with a NULL primary key"), 1);
    assert_eq!(operator.len(), 1);
}

#[test]
fn an_upsert_tombstone_of_an_unknown_key_is_counted_and_a_repeated_upsert_is_not() {
    let (mut operator, metrics) = normalize(true);
    step(&mut operator, &[("+U", Some(1), Some("a")), ("+U", Some(1), Some("a")), ("-D", Some(2), None)]);
    assert_eq!(counter(&metrics, "duplicate inserts"), 0);
    assert_eq!(counter(&metrics, "deletes of unknown keys"), 1);
}

#[test]
fn a_restored_normalization_continues_from_full_and_delta_snapshots() {
    let (mut operator, _) = normalize(false);
    let mut model = StateModel::default();
    step(&mut operator, &[("+I", Some(1), Some("a")), ("+I", Some(2), Some("b")), ("+I", Some(3), Some("c"))]);
    let (kind, _) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Full, "the first snapshot is full");
    // Written again, into the model, then a delta: 1 changed, 2 deleted, 3 untouched.
    for range in testing::one_instance(VNODES) {
        testing::checkpoint(&mut operator, &mut model, range, false);
    }
    step(&mut operator, &[("+U", Some(1), Some("z")), ("-D", Some(2), Some("b"))]);
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert_eq!(delta.points.len(), 2, "only the changed keys: {:?}", delta.points);
    model.apply(0..VNODES, false, delta);
    // Restored onto two instances, each its vnodes.
    let mut seen = Vec::new();
    for range in [0..VNODES / 2, VNODES / 2..VNODES] {
        let (mut restored, _) = normalize(false);
        testing::restore(&mut restored, &model, range).expect("restore");
        seen.extend(step(&mut restored, &[("-D", Some(1), Some("z")), ("-D", Some(3), Some("c"))]));
        assert_eq!(restored.len(), 0, "{seen:?}");
    }
    seen.sort();
    assert_eq!(seen, ["-1 1,z", "-1 3,c"], "each key restored once, on its vnode's instance");
}

/// A golden vector: records are persisted, so their layout (and the key encoding inside)
/// must not change silently; a change fails here and bumps `NORMALIZE_STATE_VERSION`.
#[test]
fn a_snapshot_record_is_pinned_byte_for_byte() {
    let (mut operator, _) = normalize(false);
    step(&mut operator, &[("+I", Some(7), Some("ab"))]);
    let (_, records) = testing::snapshot(&mut operator, false);
    let [(vnode, key, value)] = testing::puts(&records).try_into().expect("one record");
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    assert_eq!(hex(&key), "020700000000000000", "BIGINT 7");
    assert_eq!(hex(&value), "02070000000000000006020000006162", "(7, \"ab\")");
    assert_eq!(vnode, vnode::of_hash(sluice_types::key::hash(&key), VNODES));
    let (mut restored, _) = normalize(false);
    testing::restore_records(&mut restored, vec![(vnode, key, value)]).expect("restore");
    assert_eq!(step(&mut restored, &[("-D", Some(7), Some("ab"))]), ["-1 7,ab"]);
}

#[test]
fn damaged_or_foreign_records_are_refused_never_misread() {
    let (mut operator, _) = normalize(false);
    step(&mut operator, &[("+I", Some(7), Some("ab"))]);
    let (_, records) = testing::snapshot(&mut operator, false);
    let [(vnode, key, value)] = testing::puts(&records).try_into().expect("one record");
    let cases = [
        ((vnode + 1) % VNODES, key.clone(), value.clone(), "another vnode"),
        (vnode, key.clone(), value[..value.len() - 1].to_vec(), "a row of another table"),
        (vnode, key.clone(), [&value[..], &[0]].concat(), "a row of another table"),
    ];
    for (vnode, key, value, expected) in cases {
        let (mut restored, _) = normalize(false);
        let error = testing::restore_records(&mut restored, vec![(vnode, key, value)]).expect_err("refused");
        assert_eq!(error.code, "state.corrupt", "{error}");
        assert!(error.to_string().contains(expected), "{error}");
    }
    // A row whose key is not the record's key.
    let other_key = {
        let (mut other, _) = normalize(false);
        step(&mut other, &[("+I", Some(8), Some("ab"))]);
        let (_, records) = testing::snapshot(&mut other, false);
        testing::puts(&records).remove(0)
    };
    let (mut restored, _) = normalize(false);
    let error =
        testing::restore_records(&mut restored, vec![(other_key.0, other_key.1, value.clone())]).expect_err("refused");
    assert!(error.to_string().contains("another key"), "{error}");
}

/// Any sequence of changes, anomalies included, in any batching, and checkpoints with a
/// restore between batches: the output is a changelog that never retracts a row it did
/// not emit, and it integrates to the last row each key was given by `+I`/`+U` since
/// its last `-U`/`-D` (the table a from-scratch replay of the accepted changes gives).
mod oracle {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    type Change = (u8, Option<i64>, Option<u8>);

    fn kind(code: u8) -> &'static str {
        ["+I", "-U", "+U", "-D"][usize::from(code % 4)]
    }

    /// Each change's value as text (`null` for none).
    fn texts(changes: &[Change]) -> Vec<String> {
        changes.iter().map(|(_, _, v)| v.map_or("null".into(), |v| format!("v{v}"))).collect()
    }

    /// The changes as `(kind, id, value)` rows, their values from `text`.
    fn rows_of<'a>(changes: &[Change], text: &'a [String]) -> Vec<(&'static str, Option<i64>, Option<&'a str>)> {
        changes
            .iter()
            .zip(text)
            .map(|((code, id, value), text)| (kind(*code), *id, value.map(|_| text.as_str())))
            .collect()
    }

    proptest! {
        #[test]
        fn the_output_integrates_to_the_table_of_the_changes(
            changes in prop::collection::vec((0u8..4, prop::option::of(0i64..5), prop::option::of(0u8..3)), 1..80),
            batch in 1usize..6,
            upsert in any::<bool>(),
            restore_every in 1usize..4,
        ) {
            let (mut operator, _) = normalize(upsert);
            let mut model = StateModel::default();
            let mut emitted: BTreeMap<String, i64> = BTreeMap::new();
            let mut expected: BTreeMap<i64, String> = BTreeMap::new();
            let text = texts(&changes);
            let rows = rows_of(&changes, &text);
            for (index, chunk) in rows.chunks(batch).enumerate() {
                for line in step(&mut operator, chunk) {
                    let (weight, row) = line.split_once(' ').expect("weight and row");
                    let count = emitted.entry(row.to_string()).or_default();
                    *count += if weight == "+1" { 1 } else { -1 };
                    prop_assert!(*count >= 0 && *count <= 1, "{line}: a row retracted before it was emitted, or twice");
                }
                for &(kind, id, value) in chunk {
                    let Some(id) = id else { continue };
                    if RowKind::from_short(kind).expect("kind").is_accumulate() {
                        expected.insert(id, format!("{id},{}", value.unwrap_or("null")));
                    } else {
                        expected.remove(&id);
                    }
                }
                if index % restore_every == 0 {
                    for range in testing::one_instance(VNODES) {
                        testing::checkpoint(&mut operator, &mut model, range, true);
                    }
                    let (restored, _) = normalize(upsert);
                    operator = restored;
                    testing::restore(&mut operator, &model, 0..VNODES).expect("restore");
                }
            }
            let table: Vec<String> = emitted.into_iter().filter(|(_, count)| *count > 0).map(|(row, _)| row).collect();
            let wanted: Vec<String> = {
                let mut rows: Vec<String> = expected.into_values().collect();
                rows.sort();
                rows
            };
            prop_assert_eq!(table, wanted);
        }

        /// The rows' bytes spilled to disk (a budget of 0: every chunk but the newest, of
        /// 16 bytes, in the file, and the log compacted whenever it is sparse) and the
        /// keys no change touched since the batch before evicted to cold runs give the
        /// same output, the same snapshots (full and delta) and the same restores as
        /// rows in memory.
        #[test]
        fn rows_spilled_to_disk_behave_as_rows_in_memory(
            changes in prop::collection::vec((0u8..4, prop::option::of(0i64..6), prop::option::of(0u8..3)), 1..80),
            batch in 1usize..6,
            upsert in any::<bool>(),
            snapshot_every in 1usize..5,
        ) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let space = crate::spill::SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 16);
            let spilled = |operator: ChangelogNormalize, metrics: &Arc<Metrics>| {
                operator.with_spill(Arc::clone(&space), crate::spill::spilled_bytes(metrics))
            };
            let (mut memory, _) = normalize(upsert);
            let (disk, metrics) = normalize(upsert);
            let mut disk = spilled(disk, &metrics);
            let (mut memory_model, mut disk_model) = (StateModel::default(), StateModel::default());
            let text = texts(&changes);
            let rows = rows_of(&changes, &text);
            for (index, chunk) in rows.chunks(batch).enumerate() {
                prop_assert_eq!(step(&mut memory, chunk), step(&mut disk, chunk));
                // Two rows of at least 9 bytes fill a chunk: every row but the newest
                // chunk's is on disk.
                prop_assert!(disk.len() < 3 || space.spilled() > 0, "{} keys, nothing spilled", disk.len());
                if index % snapshot_every == 0 {
                    // Deltas and full snapshots alternate; every third snapshot is
                    // restored (until then a delta holds the keys evicted while changed).
                    let taken = index / snapshot_every;
                    let delta = taken % 2 == 1;
                    let (memory_kind, memory_records) = testing::snapshot(&mut memory, delta);
                    let (disk_kind, disk_records) = testing::snapshot(&mut disk, delta);
                    prop_assert_eq!(memory_kind, disk_kind);
                    prop_assert_eq!(&memory_records.points, &disk_records.points);
                    prop_assert_eq!(&memory_records.ranges, &disk_records.ranges);
                    memory_model.apply(0..VNODES, memory_kind == SnapshotKind::Full, memory_records);
                    disk_model.apply(0..VNODES, disk_kind == SnapshotKind::Full, disk_records);
                    if taken % 3 != 2 {
                        continue;
                    }
                    let (restored, _) = normalize(upsert);
                    memory = restored;
                    testing::restore(&mut memory, &memory_model, 0..VNODES).expect("restore");
                    let (restored, metrics) = normalize(upsert);
                    disk = spilled(restored, &metrics);
                    testing::restore(&mut disk, &disk_model, 0..VNODES).expect("restore");
                }
            }
            // Every key held, in memory or in cold runs, is in a full snapshot.
            let (_, memory_records) = testing::snapshot(&mut memory, false);
            let (_, disk_records) = testing::snapshot(&mut disk, false);
            prop_assert_eq!(testing::puts(&memory_records), testing::puts(&disk_records));
            drop(disk);
            prop_assert_eq!(space.resident(), 0, "every byte counted is given back");
        }
    }
}
