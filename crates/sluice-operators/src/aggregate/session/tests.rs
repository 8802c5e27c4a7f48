//! The session aggregate against a from-scratch sessionization, its late rows, and its
//! snapshots (restored across instances by vnode, and pinned byte for byte).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message};

use super::SessionAggregate;
use crate::aggregate::{AggregateFunction, AggregateSpec, GroupColumn, WindowAggregateSpec};

const VNODES: u32 = 16;

fn input_schema() -> Arc<Schema> {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

/// `k, window_start, window_end, COUNT(*), SUM(v), MAX(v), COUNT(DISTINCT v)`.
fn aggregate(late: Arc<AtomicU64>) -> SessionAggregate {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    let output = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("window_start", ts.clone(), false),
        Field::new("window_end", ts, false),
        Field::new("n", DataType::Int64, false),
        Field::new("total", DataType::Int64, true),
        Field::new("top", DataType::Int64, true),
        Field::new("kinds", DataType::Int64, false),
    ]));
    let spec = |function, argument| AggregateSpec { function, argument, filter: None };
    let spec = WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: vec![2],
        groups: vec![GroupColumn::Key(0), GroupColumn::WindowStart, GroupColumn::WindowEnd],
        aggregates: vec![
            spec(AggregateFunction::CountRows, None),
            spec(AggregateFunction::Sum, Some(3)),
            spec(AggregateFunction::Max, Some(3)),
            spec(AggregateFunction::CountDistinct, Some(3)),
        ],
        output,
        batch_size: 7,
        late_weights: None,
    };
    SessionAggregate::new(spec, &input_schema(), late, VNODES).expect("aggregate")
}

/// Rows `(ts, key, value)` with their proto-windows `[ts, ts + gap)`.
fn rows(gap: i64, rows: &[(i64, &str, Option<i64>)]) -> Batch {
    let starts = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0));
    let ends = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0 + gap));
    let keys = StringArray::from_iter_values(rows.iter().map(|r| r.1));
    let values = Int64Array::from_iter(rows.iter().map(|r| r.2));
    let columns: Vec<arrow::array::ArrayRef> = vec![Arc::new(starts), Arc::new(ends), Arc::new(keys), Arc::new(values)];
    Batch::inserts(RecordBatch::try_new(input_schema(), columns).expect("batch"))
}

/// Output rows as `k start end n total top kinds`, in emission order.
fn lines(out: Vec<Message>) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        let rows = &batch.rows;
        let text = |column: usize, row: usize| {
            let array = rows.column(column);
            arrow::util::display::array_value_to_string(array, row).expect("display")
        };
        for row in 0..rows.num_rows() {
            let starts = rows.column(1).as_any().downcast_ref::<TimestampMillisecondArray>().expect("ts");
            let ends = rows.column(2).as_any().downcast_ref::<TimestampMillisecondArray>().expect("ts");
            lines.push(format!(
                "{} {} {} {} {} {} {}",
                text(0, row),
                starts.value(row),
                ends.value(row),
                text(3, row),
                text(4, row),
                text(5, row),
                text(6, row)
            ));
        }
    }
    lines
}

fn ended(aggregate: &mut SessionAggregate) -> Vec<String> {
    let mut out = Vec::new();
    aggregate.on_end(&mut out).expect("end");
    let mut lines = lines(out);
    lines.sort();
    lines
}

/// From scratch: per key, rows in time order; a row more than `gap` after the session's
/// latest row starts a new session; a session ends `gap` after its latest row.
fn sessionize(gap: i64, rows: &[(i64, &str, Option<i64>)]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for &(ts, key, value) in rows {
        by_key.entry(key).or_default().push((ts, value));
    }
    let mut lines = Vec::new();
    for (key, mut rows) in by_key {
        rows.sort();
        let mut sessions: Vec<Vec<(i64, Option<i64>)>> = Vec::new();
        for row in rows {
            match sessions.last_mut() {
                Some(session) if row.0 <= session.last().expect("non-empty").0 + gap => session.push(row),
                _ => sessions.push(vec![row]),
            }
        }
        for session in sessions {
            let values: Vec<i64> = session.iter().filter_map(|r| r.1).collect();
            let distinct: std::collections::BTreeSet<i64> = values.iter().copied().collect();
            let show = |value: Option<i64>| value.map_or(String::new(), |v| v.to_string());
            lines.push(format!(
                "{key} {} {} {} {} {} {}",
                session[0].0,
                session.last().expect("non-empty").0 + gap,
                session.len(),
                show((!values.is_empty()).then(|| values.iter().sum())),
                show(values.iter().max().copied()),
                distinct.len()
            ));
        }
    }
    lines.sort();
    lines
}

fn row_strategy() -> impl Strategy<Value = (i64, &'static str, Option<i64>)> {
    (0i64..300, prop::sample::select(vec!["a", "b", "c"]), prop::option::of(0i64..4))
}

proptest! {
    /// Rows in any order and batches, with watermarks that leave no row late (each at
    /// least `gap` behind every later row), give exactly the from-scratch sessions.
    #[test]
    fn sessions_match_a_from_scratch_sessionization(
        gap in 1i64..40,
        input in prop::collection::vec(row_strategy(), 0..120),
        cuts in prop::collection::vec(0usize..120, 0..6),
    ) {
        let late = Arc::new(AtomicU64::new(0));
        let mut operator = aggregate(Arc::clone(&late));
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        cuts.push(input.len());
        cuts.sort();
        let (mut from, mut out) = (0, Vec::new());
        for cut in cuts {
            operator.on_data(rows(gap, &input[from..cut]), &mut out).expect("data");
            from = cut;
            if let Some(earliest) = input[from..].iter().map(|r| r.0).min() {
                operator.on_watermark(earliest - gap - 1, &mut out).expect("watermark");
            }
        }
        operator.on_end(&mut out).expect("end");
        let mut got = lines(out);
        got.sort();
        prop_assert_eq!(got, sessionize(gap, &input));
        prop_assert_eq!(late.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn a_session_is_emitted_when_the_watermark_passes_its_end_and_late_rows_are_dropped() {
    let late = Arc::new(AtomicU64::new(0));
    let mut operator = aggregate(Arc::clone(&late));
    let mut out = Vec::new();
    operator.on_data(rows(10, &[(0, "a", Some(1)), (10, "a", Some(2)), (40, "a", Some(5))]), &mut out).expect("data");
    operator.on_watermark(18, &mut out).expect("watermark");
    assert!(lines(std::mem::take(&mut out)).is_empty(), "[0, 20) is due at 19");
    operator.on_watermark(19, &mut out).expect("watermark");
    assert_eq!(lines(std::mem::take(&mut out)), ["a 0 20 2 3 2 2"]);
    // 5 would make [5, 15): due already. 35 merges into [40, 50): not due, so taken.
    operator.on_data(rows(10, &[(5, "a", Some(9)), (35, "a", Some(7))]), &mut out).expect("data");
    assert_eq!(late.load(Ordering::Relaxed), 1);
    assert_eq!(ended(&mut operator), ["a 35 50 2 12 7 2"]);
}

#[test]
fn a_row_bridging_two_sessions_merges_them() {
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    let input = rows(10, &[(0, "a", Some(1)), (20, "a", Some(2)), (10, "a", Some(1)), (0, "b", None)]);
    operator.on_data(input, &mut Vec::new()).expect("data");
    assert_eq!(ended(&mut operator), ["a 0 30 3 4 2 2", "b 0 10 1   0"]);
}

#[test]
fn a_restored_aggregate_emits_what_the_original_would_split_by_vnode_across_instances() {
    let input = [(0, "a", Some(1)), (3, "b", Some(2)), (30, "a", None), (7, "c", Some(5)), (9, "a", Some(1))];
    let mut original = aggregate(Arc::new(AtomicU64::new(0)));
    original.on_data(rows(10, &input), &mut Vec::new()).expect("data");
    let blobs = original.snapshot().expect("snapshot").expect("state")().expect("encode");
    assert!(blobs.len() > 1, "three keys spread over vnodes");
    let (low, high): (Vec<_>, Vec<_>) = blobs.into_iter().partition(|(vnode, _)| *vnode < VNODES / 2);
    let mut restored = Vec::new();
    for half in [low, high] {
        let mut instance = aggregate(Arc::new(AtomicU64::new(0)));
        instance.restore(half.into_iter().map(|(_, blob)| blob).collect()).expect("restore");
        // Rows after the restore still merge with the restored sessions.
        instance.on_data(rows(10, &[(20, "a", Some(4))]), &mut Vec::new()).expect("data");
        restored.extend(ended(&mut instance).into_iter().filter(|line| !line.starts_with("a 20 30")));
    }
    restored.sort();
    original.on_data(rows(10, &[(20, "a", Some(4))]), &mut Vec::new()).expect("data");
    assert_eq!(restored, ended(&mut original));
    assert_eq!(restored, ["a 0 19 2 2 1 1", "a 20 40 2 4 4 1", "b 3 13 1 2 2 1", "c 7 17 1 5 5 1"]);
}

#[test]
fn damaged_blobs_are_refused() {
    let mut original = aggregate(Arc::new(AtomicU64::new(0)));
    original.on_data(rows(10, &[(0, "a", Some(1))]), &mut Vec::new()).expect("data");
    let blob = original.snapshot().expect("snapshot").expect("state")().expect("encode").remove(0).1;
    for cut in [0, 3, blob.len() - 1] {
        let error = aggregate(Arc::new(AtomicU64::new(0))).restore(vec![blob[..cut].to_vec()]).expect_err("cut");
        assert_eq!(error.code, "state.corrupt");
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert!(aggregate(Arc::new(AtomicU64::new(0))).restore(vec![longer]).is_err(), "trailing bytes");
}

/// A golden vector: state blobs are persisted, so their layout (and the key encoding and
/// hash inside) must not change silently; a change fails here and bumps
/// `SESSION_STATE_VERSION`.
#[test]
fn a_snapshot_blob_is_pinned_byte_for_byte() {
    let mut operator = aggregate(Arc::new(AtomicU64::new(0)));
    operator.on_data(rows(10, &[(100, "ab", Some(5)), (104, "ab", Some(5))]), &mut Vec::new()).expect("data");
    let blobs = operator.snapshot().expect("snapshot").expect("state")().expect("encode");
    let [(vnode, bytes)] = blobs.as_slice() else { panic!("one vnode holds the one key: {blobs:?}") };
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let expected = concat!(
        "01000000",
        "01000000", // version 1, 1 key
        "07000000",
        "06020000006162", // key: 7 bytes, VARCHAR "ab"
        "01000000",       // 1 session
        "6400000000000000",
        "7200000000000000", // start 100, end 114
        "01",
        "0200000000000000", // COUNT(*) = 2
        "01",
        "0a00000000000000", // SUM(v) = 10
        "01",
        "0500000000000000", // MAX(v) = 5
        "05",
        "01000000",
        "09000000",
        "020500000000000000", // COUNT(DISTINCT v): {5}
    );
    assert_eq!(hex, expected);
    let hash = sluice_types::key::hash(&[0x06, 2, 0, 0, 0, b'a', b'b']);
    assert_eq!(*vnode, sluice_types::vnode::of_hash(hash, VNODES));
}
