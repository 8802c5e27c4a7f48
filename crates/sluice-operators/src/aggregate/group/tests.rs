//! The group aggregate: its changelog row by row, an oracle over random weighted input
//! (with checkpoints, deltas when they can be, and a restore onto two instances in the
//! middle), and its state records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use sluice_runtime::{Metrics, Operator, SnapshotKind};
use sluice_state::StateModel;
use sluice_types::{Batch, Message, vnode};

use super::{GroupAggregate, GroupAggregateSpec};
use crate::aggregate::{AggregateFunction, AggregateSpec};
use crate::counter::LazyCounter;
use crate::spill::SpillSpace;
use crate::testing;

const VNODES: u32 = 16;

/// Input: key `k`, value `v`, text `s`, filter condition `f` (`v > 0`, computed by the
/// planner's projection in a real plan).
fn input_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("f", DataType::Boolean, true),
    ]))
}

/// The aggregates the tests compute, by output column name: [`aggregate`] the first nine,
/// the oracle all ten (the last shares `d`'s set of values: the same column, filtered).
const AGGREGATES: [(&str, AggregateFunction, Option<usize>, Option<usize>); 10] = [
    ("n", AggregateFunction::CountRows, None, None),
    ("nv", AggregateFunction::Count, Some(1), None),
    ("d", AggregateFunction::CountDistinct, Some(1), None),
    ("total", AggregateFunction::Sum, Some(1), None),
    ("low", AggregateFunction::Min, Some(1), None),
    ("high", AggregateFunction::Max, Some(1), None),
    ("mean", AggregateFunction::Avg, Some(1), None),
    ("last_s", AggregateFunction::Max, Some(2), None),
    ("positive", AggregateFunction::Sum, Some(1), Some(3)),
    ("dp", AggregateFunction::CountDistinct, Some(1), Some(3)),
];

/// A counter of spilled bytes.
fn written() -> LazyCounter {
    LazyCounter::new(Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), "spilled")
}

fn aggregate(with_key: bool) -> GroupAggregate {
    aggregate_of(with_key, &AGGREGATES[..9])
}

fn aggregate_of(
    with_key: bool,
    aggregates: &[(&str, AggregateFunction, Option<usize>, Option<usize>)],
) -> GroupAggregate {
    let mut fields = Vec::new();
    if with_key {
        fields.push(Field::new("k", DataType::Utf8, false));
    }
    for &(name, function, _, _) in aggregates {
        let data_type = if name == "last_s" { DataType::Utf8 } else { DataType::Int64 };
        fields.push(Field::new(name, data_type, !matches!(function, AggregateFunction::CountRows)));
    }
    let spec = GroupAggregateSpec {
        keys: if with_key { vec![0] } else { Vec::new() },
        aggregates: aggregates
            .iter()
            .map(|(_, function, argument, filter)| AggregateSpec {
                function: *function,
                argument: *argument,
                filter: *filter,
            })
            .collect(),
        output: Arc::new(Schema::new(fields)),
        append_only_input: false,
    };
    let ignored = LazyCounter::new(Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), "ignored retractions");
    GroupAggregate::new(spec, &input_schema(), ignored, VNODES).expect("aggregate")
}

/// A row of input: key, value, text, weight.
type Row = (&'static str, Option<i64>, Option<&'static str>, i64);

fn batch(rows: &[Row]) -> Batch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| r.1.map(|v| v > 0)))),
    ];
    let rows_batch = RecordBatch::try_new(input_schema(), columns).expect("batch");
    Batch::with_weights(rows_batch, Int64Array::from_iter_values(rows.iter().map(|r| r.3)))
}

/// Each output row as `±weight cell,cell,…` in output order.
fn lines(out: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in out {
        let Message::Data(batch) = message else { continue };
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = batch
                .rows
                .columns()
                .iter()
                .map(|c| arrow::util::display::array_value_to_string(c, row).expect("format"))
                .map(|cell| if cell.is_empty() { "∅".into() } else { cell })
                .collect();
            lines.push(format!("{:+} {}", batch.weight(row), cells.join(",")));
        }
    }
    lines
}

fn check(batches: &[&[Row]], expected: &[&[&str]]) {
    let mut operator = aggregate(true);
    for (input, expected) in batches.iter().zip(expected) {
        let mut out = Vec::new();
        operator.on_data(batch(input), &mut out).expect("data");
        assert_eq!(lines(&out), *expected, "after input {input:?}");
    }
}

#[test]
fn groups_appear_update_in_pairs_and_disappear() {
    check(
        &[
            &[("a", Some(5), Some("x"), 1), ("a", Some(-2), Some("y"), 1), ("b", None, None, 1)],
            &[("a", Some(7), Some("x"), 1)],
            &[("a", Some(7), Some("x"), -1), ("b", None, None, -1)],
            &[("a", Some(5), Some("x"), 1), ("a", Some(5), Some("x"), -1)],
        ],
        &[
            // One row per group per batch: a group touched twice changes once.
            &["+1 a,2,2,2,3,-2,5,1,y,5", "+1 b,1,0,0,∅,∅,∅,∅,∅,∅"],
            &["-1 a,2,2,2,3,-2,5,1,y,5", "+1 a,3,3,3,10,-2,7,3,y,12"],
            // Retracting the maximum 7 brings back 5 (the multiset, not the extreme);
            // b's only row is retracted: b disappears.
            &["-1 a,3,3,3,10,-2,7,3,y,12", "+1 a,2,2,2,3,-2,5,1,y,5", "-1 b,1,0,0,∅,∅,∅,∅,∅,∅"],
            // An insert and its retraction in one batch change nothing.
            &[],
        ],
    );
}

#[test]
fn a_retraction_of_what_was_never_inserted_is_ignored_and_counted() {
    let mut operator = aggregate(true);
    let mut out = Vec::new();
    operator.on_data(batch(&[("z", Some(1), None, -1), ("a", Some(1), None, 1)]), &mut out).expect("data");
    assert_eq!(lines(&out), ["+1 a,1,1,1,1,1,1,1,∅,1"]);
    assert_eq!(operator.ignored_retractions.add(0), 1);
    assert_eq!(operator.groups.iter().flatten().count(), 1, "no group is left for z");
}

#[test]
fn avg_of_bigint_is_the_truncated_integer_quotient() {
    let mut operator = aggregate(false);
    let mut out = Vec::new();
    operator.on_data(batch(&[("a", Some(-7), None, 1), ("b", Some(2), None, 1)]), &mut out).expect("data");
    // AVG(-7, 2) = -2.5 → -2 (toward zero, Java's long division).
    assert_eq!(lines(&out), ["+1 2,2,2,-5,-7,2,-2,∅,2"]);
}

/// An input row of the oracle's multiset: key, value, text.
type LiveRow = (String, Option<i64>, Option<String>);

/// A from-scratch computation of every group's row over the live input multiset.
fn recompute(live: &BTreeMap<LiveRow, i64>) -> BTreeSet<String> {
    let mut groups: BTreeMap<&str, Vec<&LiveRow>> = BTreeMap::new();
    for (row, count) in live {
        for _ in 0..*count {
            groups.entry(&row.0).or_default().push(row);
        }
    }
    let show = |v: Option<i64>| v.map_or("∅".to_string(), |v| v.to_string());
    groups
        .into_iter()
        .map(|(key, rows)| {
            let values: Vec<i64> = rows.iter().filter_map(|r| r.1).collect();
            let distinct: BTreeSet<i64> = values.iter().copied().collect();
            let sum = (!values.is_empty()).then(|| values.iter().sum::<i64>());
            let positive: Vec<i64> = values.iter().copied().filter(|v| *v > 0).collect();
            let distinct_positive: BTreeSet<i64> = positive.iter().copied().collect();
            let cells = [
                rows.len().to_string(),
                values.len().to_string(),
                distinct.len().to_string(),
                show(sum),
                show(values.iter().copied().min()),
                show(values.iter().copied().max()),
                show(sum.map(|s| s / values.len() as i64)),
                rows.iter().filter_map(|r| r.2.clone()).max().unwrap_or_else(|| "∅".into()),
                show((!positive.is_empty()).then(|| positive.iter().sum())),
                distinct_positive.len().to_string(),
            ];
            format!("{key},{}", cells.join(","))
        })
        .collect()
}

/// Applies output lines to the integrated table, asserting every retraction removes a
/// row that is there.
fn integrate(table: &mut BTreeMap<String, i64>, lines: Vec<String>) {
    for line in lines {
        let (weight, row) = line.split_once(' ').expect("weight and row");
        let weight: i64 = weight.parse().expect("weight");
        let count = table.entry(row.to_string()).or_insert(0);
        *count += weight;
        assert!(*count >= 0, "a retraction of a row not in the output: {row}");
        if *count == 0 {
            table.remove(row);
        }
    }
}

const KEYS: [&str; 4] = ["a", "b", "c", "d"];
const TEXTS: [&str; 3] = ["x", "y", "z"];

/// One step of random input: insert a new row, or retract a live one.
#[derive(Debug, Clone)]
enum Step {
    Insert { key: usize, value: Option<i64>, text: Option<usize> },
    Retract { pick: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let insert = (0..KEYS.len(), prop::option::weighted(0.8, -20i64..20), prop::option::of(0..TEXTS.len()))
        .prop_map(|(key, value, text)| Step::Insert { key, value, text });
    let retract = any::<usize>().prop_map(|pick| Step::Retract { pick });
    prop::collection::vec(prop_oneof![3 => insert, 2 => retract], 1..120)
}

/// The input rows of `steps` (retractions of rows inserted before).
fn rows_of(steps: &[Step]) -> Vec<Row> {
    let mut live: Vec<Row> = Vec::new();
    let mut rows = Vec::new();
    for step in steps {
        match step {
            Step::Insert { key, value, text } => {
                let row = (KEYS[*key], *value, text.map(|t| TEXTS[t]), 1);
                live.push(row);
                rows.push(row);
            }
            Step::Retract { pick } if !live.is_empty() => {
                let row = live.swap_remove(pick % live.len());
                rows.push((row.0, row.1, row.2, -1));
            }
            Step::Retract { .. } => {}
        }
    }
    rows
}

/// The vnode of a row's key, as the exchange computes it.
fn vnode_of(key: &str) -> u32 {
    let mut rows = sluice_types::key::KeyRows::default();
    let encoder = sluice_types::key::KeyEncoder::new(vec![DataType::Utf8]).expect("encoder");
    let column: ArrayRef = Arc::new(StringArray::from(vec![key]));
    encoder.encode(&[column], &mut rows).expect("encode");
    vnode::of_hash(rows.hash(0), VNODES)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After every flush of the mini-batch (every `flush_every` batches, as the driver
    /// does, besides the operator's own after `mini_batch` rows) the integrated changelog
    /// equals a from-scratch computation over the input so far; halfway, the state is
    /// snapshotted (after a flush, as at a barrier) and restored onto two instances that
    /// split the vnodes, as after a restart with two threads. With `append_only` the
    /// input only inserts and the operator knows it (MIN and MAX keep their extreme
    /// alone, COUNT(DISTINCT) whether it saw a value). With `spill` the instances share a
    /// memory budget of 0 bytes: every flush evicts the groups no row touched since the
    /// one before to cold runs, and rows, snapshots and restores read them back.
    #[test]
    fn the_integrated_changelog_equals_a_recomputation(
        steps in steps(),
        batch_rows in 1usize..12,
        restore_after in 0usize..20,
        split in 1u32..VNODES,
        append_only in any::<bool>(),
        mini_batch in prop_oneof![Just(1usize), 1usize..40],
        flush_every in 1usize..4,
        spill in any::<bool>(),
    ) {
        let mut rows = rows_of(&steps);
        if append_only {
            rows.retain(|row| row.3 > 0);
        }
        let space = SpillSpace::new(std::env::temp_dir(), 0);
        let aggregate_of = |with_key, aggregates: &[_]| {
            let mut operator = aggregate_of(with_key, aggregates).with_mini_batch(mini_batch);
            operator.spec.append_only_input = append_only;
            if spill {
                operator = operator.with_spill(Arc::clone(&space), written());
            }
            operator
        };
        let mut instances = vec![aggregate_of(true, &AGGREGATES)];
        // The runs of the checkpoints taken (a delta whenever it can be), with each
        // instance's vnodes.
        let mut runs = StateModel::default();
        let mut ranges = testing::one_instance(VNODES);
        let mut table = BTreeMap::new();
        let mut live = BTreeMap::new();
        for (index, chunk) in rows.chunks(batch_rows).enumerate() {
            if index == restore_after || index % 3 == 1 {
                // A barrier: the mini-batch flushed, then a checkpoint.
                for (instance, vnodes) in instances.iter_mut().zip(&ranges) {
                    let mut out = Vec::new();
                    instance.on_flush(&mut out).expect("flush");
                    integrate(&mut table, lines(&out));
                    testing::checkpoint(instance, &mut runs, vnodes.clone(), true);
                }
            }
            if index == restore_after && instances.len() == 1 {
                ranges = [0, split, VNODES].windows(2).map(|pair| pair[0]..pair[1]).collect();
                instances = ranges
                    .iter()
                    .map(|vnodes| {
                        let mut instance = aggregate_of(true, &AGGREGATES);
                        testing::restore(&mut instance, &runs, vnodes.clone()).expect("restore");
                        instance
                    })
                    .collect();
            }
            let parts: Vec<Vec<Row>> = if instances.len() == 1 {
                vec![chunk.to_vec()]
            } else {
                let (low, high) = chunk.iter().partition(|row| vnode_of(row.0) < split);
                vec![low, high]
            };
            for (instance, part) in instances.iter_mut().zip(parts) {
                if part.is_empty() {
                    continue;
                }
                let mut out = Vec::new();
                instance.on_data(batch(&part), &mut out).expect("data");
                integrate(&mut table, lines(&out));
            }
            for row in chunk {
                *live.entry((row.0.to_string(), row.1, row.2.map(str::to_string))).or_insert(0) += row.3;
            }
            live.retain(|_, count| *count != 0);
            let last = (index + 1) * batch_rows >= rows.len();
            if !last && index % flush_every != 0 {
                continue;
            }
            for instance in &mut instances {
                let mut out = Vec::new();
                instance.on_flush(&mut out).expect("flush");
                integrate(&mut table, lines(&out));
            }
            let got: BTreeSet<String> = table.keys().map(|row| row.replacen("+1 ", "", 1)).collect();
            prop_assert!(table.values().all(|count| *count == 1), "one row per group: {:?}", table);
            prop_assert_eq!(got, recompute(&live));
        }
    }
}

#[test]
fn a_snapshot_holds_the_state_at_the_barrier() {
    let mut operator = aggregate(true);
    operator.on_data(batch(&[("a", Some(1), None, 1)]), &mut Vec::new()).expect("data");
    let snapshot = operator.snapshot_state(false).expect("snapshot").expect("state");
    operator.on_data(batch(&[("a", Some(9), None, 1), ("b", Some(2), None, 1)]), &mut Vec::new()).expect("data");
    let mut records = sluice_state::CollectedState::default();
    (snapshot.job)(&mut records).expect("records");
    let mut restored = aggregate(true);
    restored.restore_state(&mut records.into_source()).expect("restore");
    let mut out = Vec::new();
    restored.on_data(batch(&[("a", Some(3), None, 1)]), &mut out).expect("data");
    assert_eq!(lines(&out), ["-1 a,1,1,1,1,1,1,1,∅,1", "+1 a,2,2,2,4,1,3,2,∅,4"]);
}

/// A group's record: vnode, key and value.
type GroupRecord = (u32, Vec<u8>, Vec<u8>);
/// A value's record: key and value.
type ValueRecord = (Vec<u8>, Vec<u8>);

/// The records of a full snapshot of `operator` with one group: its group record
/// (vnode, key and value), then its values' records (key and value).
fn the_records(operator: &mut GroupAggregate) -> (GroupRecord, Vec<ValueRecord>) {
    let puts = testing::puts(&testing::snapshot(operator, false).1);
    let [group, values @ ..] = puts.as_slice() else { panic!("one group: {puts:?}") };
    assert_eq!(group.1.last(), Some(&0x00), "the group's record comes first: {puts:?}");
    assert!(values.iter().all(|(vnode, _, _)| *vnode == group.0), "its values share its vnode");
    (group.clone(), values.iter().map(|(_, key, value)| (key.clone(), value.clone())).collect())
}

/// The group record of a full snapshot of `operator` with one group.
fn the_record(operator: &mut GroupAggregate) -> (u32, Vec<u8>, Vec<u8>) {
    the_records(operator).0
}

/// A delta holds the groups a mini-batch touched since the previous snapshot, and a
/// delete for each group dropped since.
#[test]
fn a_delta_holds_the_groups_changed_and_dropped_since_the_previous_snapshot() {
    let mut operator = aggregate(true);
    let input = [("a", Some(1), None, 1), ("b", Some(2), None, 1), ("c", Some(3), None, 1)];
    operator.on_data(batch(&input), &mut Vec::new()).expect("data");
    assert_eq!(testing::snapshot(&mut operator, true).0, SnapshotKind::Full, "the first snapshot is full");
    operator.on_data(batch(&[("a", Some(5), None, 1), ("b", Some(2), None, -1)]), &mut Vec::new()).expect("data");
    let (kind, delta) = testing::snapshot(&mut operator, true);
    assert_eq!(kind, SnapshotKind::Delta);
    let keys: Vec<(Vec<u8>, bool)> =
        delta.points.iter().map(|(_, key, value)| (key.clone(), value.is_some())).collect();
    let g = |text: &str| [&[0x06][..], &(text.len() as u32).to_le_bytes(), text.as_bytes()].concat();
    let group = |text: &str| [g(text), vec![0x00]].concat();
    // a's COUNT(DISTINCT v) gained 5: one value record, not its whole set.
    let five = [g("a"), vec![0x01, 0x00, 0x02, 5, 0, 0, 0, 0, 0, 0, 0]].concat();
    let mut expected = vec![(group("a"), true), (five, true), (group("b"), false)];
    let text_of = |key: &[u8]| std::str::from_utf8(&key[5..6]).expect("utf-8").to_string();
    expected.sort_by_key(|(key, _)| (vnode_of(&text_of(key)), key.clone()));
    let mut keys = keys;
    keys.sort_by_key(|(key, _)| (vnode_of(&text_of(key)), key.clone()));
    assert_eq!(keys, expected, "a changed, b dropped, c untouched");
    let b_values = [g("b"), vec![0x01]].concat();
    assert_eq!(delta.ranges, [(vnode_of("b"), b_values.clone(), [g("b"), vec![0x02]].concat())], "b's values go");
    assert!(testing::snapshot(&mut operator, true).1.points.is_empty(), "nothing changed since");
}

#[test]
fn damaged_records_are_refused() {
    let mut operator = aggregate(true);
    operator.on_data(batch(&[("a", Some(1), Some("x"), 1)]), &mut Vec::new()).expect("data");
    let record = the_record(&mut operator);
    let restore = |record: (u32, Vec<u8>, Vec<u8>)| testing::restore_records(&mut aggregate(true), vec![record]);
    assert!(restore(record.clone()).is_ok());
    for cut in [0, 3, 9, record.2.len() - 1] {
        let error = restore((record.0, record.1.clone(), record.2[..cut].to_vec())).expect_err("truncated");
        assert_eq!(error.code, "state.corrupt");
    }
    let mut longer = record.clone();
    longer.2.push(0);
    assert!(restore(longer).is_err(), "trailing bytes");
    let elsewhere = ((record.0 + 1) % VNODES, record.1.clone(), record.2.clone());
    assert!(restore(elsewhere).is_err(), "under another vnode than its key's");
    let mut no_rows = record.clone();
    no_rows.2[..8].copy_from_slice(&0i64.to_le_bytes());
    assert!(restore(no_rows).is_err(), "a group without rows");
    let mut neither = record.clone();
    *neither.1.last_mut().expect("a key") = 0x02;
    assert!(restore(neither).is_err(), "a record of neither a group nor a value");
    // Value records: after their group, of a share that exists, a state of the right size.
    let mut operator = aggregate(true);
    operator.on_data(batch(&[("a", Some(1), Some("x"), 1)]), &mut Vec::new()).expect("data");
    let (group, values) = the_records(&mut operator);
    let [(value_key, value)] = values.as_slice() else { panic!("one value: {values:?}") };
    let records = |key: &[u8], value: &[u8]| vec![group.clone(), (group.0, key.to_vec(), value.to_vec())];
    let restore_all = |records| testing::restore_records(&mut aggregate(true), records);
    assert!(restore_all(records(value_key, value)).is_ok());
    let orphan = testing::restore_records(&mut aggregate(true), vec![(group.0, value_key.clone(), value.clone())]);
    assert!(orphan.is_err(), "a value without its group");
    let mut other_share = value_key.clone();
    other_share[group.1.len()] = 1;
    assert!(restore_all(records(&other_share, value)).is_err(), "a value of no COUNT(DISTINCT)");
    assert!(restore_all(records(value_key, &value[..7])).is_err(), "a count cut short");
    assert!(restore_all(records(value_key, &[0; 8])).is_err(), "a value no member holds");
}

/// A golden vector: state records are persisted, so their layout (and the key encoding
/// and hash inside) must not change silently; a change fails here and bumps
/// `GROUP_STATE_VERSION`.
#[test]
fn a_snapshot_record_is_pinned_byte_for_byte() {
    let mut operator = aggregate(true);
    let input = [("ab", Some(5), Some("x"), 1), ("ab", Some(5), Some("x"), 1), ("ab", None, None, 1)];
    operator.on_data(batch(&input), &mut Vec::new()).expect("data");
    let ((vnode, key, value), values) = the_records(&mut operator);
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    assert_eq!(hex(&key), "0602000000616200", "VARCHAR \"ab\", then 00: the group's record");
    let expected = concat!(
        "0300000000000000", // 3 rows
        "01",
        "0300000000000000", // COUNT(*) = 3
        "01",
        "0200000000000000", // COUNT(v) = 2
        "0c",               // COUNT(DISTINCT v): its values are records of their own
        "02",
        "0a00000000000000",
        "0200000000000000", // SUM(v): 10 over 2
        "06",
        "01000000",
        "0500000000000000",
        "0200000000000000", // MIN(v): {5: 2}
        "07",
        "01000000",
        "0500000000000000",
        "0200000000000000", // MAX(v): {5: 2}
        "04",
        "0a00000000000000",
        "0200000000000000", // AVG(v): 10 over 2
        "0b",
        "01000000",
        "01000000",
        "78",
        "0200000000000000", // MAX(s): {"x": 2}
        "02",
        "0a00000000000000",
        "0200000000000000", // SUM(v) FILTER (WHERE v > 0): 10 over 2
    );
    assert_eq!(hex(&value), expected);
    let values: Vec<(String, String)> = values.iter().map(|(key, value)| (hex(key), hex(value))).collect();
    // The group's key, 01, share 0, the value 5; its count for the share's one member.
    let five = ("06020000006162".to_string() + "01" + "00" + "020500000000000000", "0200000000000000".to_string());
    assert_eq!(values, [five], "COUNT(DISTINCT v): {{5: 2}}");
    let hash = sluice_types::key::hash(&[0x06, 2, 0, 0, 0, b'a', b'b']);
    assert_eq!(vnode, vnode::of_hash(hash, VNODES));
}

/// COUNT(DISTINCT)s of one column share one set of values, and one record per value:
/// the group's value is the golden vector's with the tenth aggregate's tag, and the value
/// 5's record holds a count per member (the FILTERed one's too).
#[test]
fn count_distincts_sharing_their_values_write_one_record_per_value() {
    let records = |operator: &mut GroupAggregate| {
        let input = [("ab", Some(5), Some("x"), 1), ("ab", Some(5), Some("x"), 1), ("ab", None, None, 1)];
        operator.on_data(batch(&input), &mut Vec::new()).expect("data");
        the_records(operator)
    };
    let ((_, _, nine), _) = records(&mut aggregate(true));
    let (ten, values) = records(&mut aggregate_of(true, &AGGREGATES));
    assert_eq!(ten.2[..nine.len()], nine[..]);
    assert_eq!(ten.2[nine.len()..], [0x0c]);
    let counts = [2i64.to_le_bytes(), 2i64.to_le_bytes()].concat();
    assert_eq!(values.iter().map(|(_, value)| value.clone()).collect::<Vec<_>>(), [counts]);
    let mut restored = aggregate_of(true, &AGGREGATES);
    let all = std::iter::once(ten.clone()).chain(values.iter().map(|(k, v)| (ten.0, k.clone(), v.clone())));
    testing::restore_records(&mut restored, all.collect()).expect("restore");
    assert_eq!(the_records(&mut restored), (ten, values), "restored, the shared values write the same records");
}

/// Six COUNT(DISTINCT v), alternately filtered: a set serves at most four, so the column
/// gets two; each result is still its own.
#[test]
fn more_count_distincts_of_a_column_than_a_set_serves_count_alike() {
    let six: Vec<_> = (0..6)
        .map(|i| {
            (["d0", "d1", "d2", "d3", "d4", "d5"][i], AggregateFunction::CountDistinct, Some(1), [None, Some(3)][i % 2])
        })
        .collect();
    let mut operator = aggregate_of(true, &six);
    assert_eq!(operator.shares.iter().map(|s| s.members.len()).collect::<Vec<_>>(), [4, 2]);
    let mut out = Vec::new();
    let input = [("a", Some(1), None, 1), ("a", Some(-1), None, 1), ("a", Some(2), None, 1), ("a", Some(2), None, 1)];
    operator.on_data(batch(&input), &mut out).expect("data");
    assert_eq!(lines(&out), ["+1 a,3,2,3,2,3,2"]);
}

#[test]
fn a_global_aggregate_keeps_its_one_group_in_vnode_zero() {
    let mut operator = aggregate(false);
    operator.on_data(batch(&[("a", Some(1), None, 1)]), &mut Vec::new()).expect("data");
    let (vnode, key, _) = the_record(&mut operator);
    assert_eq!((vnode, key), (vnode::of_hash(0, VNODES), vec![0x00]), "the empty key, then 00: its record");
}

#[test]
fn over_an_append_only_input_min_and_max_keep_only_the_extreme() {
    let mut operator = aggregate(true);
    operator.spec.append_only_input = true;
    let mut out = Vec::new();
    let input = [("a", Some(3), Some("x"), 1), ("a", Some(9), Some("z"), 1), ("a", Some(5), Some("y"), 1)];
    operator.on_data(batch(&input), &mut out).expect("data");
    assert_eq!(lines(&out), ["+1 a,3,3,3,17,3,9,5,z,17"]);
    let group = operator.groups.iter().flatten().next().expect("a group");
    for accumulator in &group.accumulators {
        use super::accumulator::{Accumulator, Multiset};
        let entries = match accumulator {
            Accumulator::Extreme { values, .. } => match values.as_ref() {
                Multiset::Int(map) => map.len(),
                Multiset::Float(map) => map.len(),
                Multiset::Text(map) => map.len(),
            },
            Accumulator::OneInt { count, .. } | Accumulator::OneFloat { count, .. } => usize::from(*count != 0),
            _ => continue,
        };
        assert_eq!(entries, 1, "{accumulator:?}");
    }
}

/// Over an append-only input a COUNT(DISTINCT) keeps only whether each member saw a
/// value: a value's record holds the members that saw it (a bit each).
#[test]
fn over_an_append_only_input_count_distinct_keeps_what_it_saw() {
    let append_only = || {
        let mut operator = aggregate_of(true, &AGGREGATES);
        operator.spec.append_only_input = true;
        operator
    };
    let mut operator = append_only();
    let input = [("a", Some(5), None, 1), ("a", Some(5), None, 1), ("a", Some(-2), None, 1)];
    operator.on_data(batch(&input), &mut Vec::new()).expect("data");
    let (group, values) = the_records(&mut operator);
    let g = &group.1[..group.1.len() - 1];
    let value = |v: i64| [g, &[0x01, 0x00, 0x02][..], &v.to_le_bytes()].concat();
    // 5 seen by COUNT(DISTINCT v) and by its FILTER (v > 0); -2 by the first only.
    assert_eq!(values, [(value(5), vec![0b11]), (value(-2), vec![0b01])]);
    let all = |values: &[(Vec<u8>, Vec<u8>)]| {
        std::iter::once(group.clone()).chain(values.iter().map(|(k, v)| (group.0, k.clone(), v.clone()))).collect()
    };
    let mut restored = append_only();
    testing::restore_records(&mut restored, all(&values)).expect("restore");
    let mut out = Vec::new();
    restored.on_data(batch(&[("a", Some(7), None, 1), ("a", Some(5), None, 1)]), &mut out).expect("data");
    assert_eq!(lines(&out).last().map(String::as_str), Some("+1 a,5,5,3,20,-2,7,4,∅,22,2"));
    let beyond = [(value(5), vec![0b100])];
    assert!(testing::restore_records(&mut append_only(), all(&beyond)).is_err(), "a member the share lacks");
}

#[test]
fn a_group_not_written_for_the_ttl_is_dropped_and_starts_again_from_nothing() {
    let (clock, now) = crate::ttl::manual_clock(0);
    let mut operator = aggregate(true).with_ttl(crate::ttl::Ttl::new(std::time::Duration::from_secs(10), clock));
    let mut step = |rows: &[Row]| {
        let mut out = Vec::new();
        operator.on_data(batch(rows), &mut out).expect("data");
        lines(&out)
    };
    assert_eq!(
        step(&[("a", Some(5), None, 1), ("b", Some(1), None, 1)]),
        ["+1 a,1,1,1,5,5,5,5,∅,5", "+1 b,1,1,1,1,1,1,1,∅,1"]
    );
    now.store(6_000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(step(&[("b", Some(2), None, 1)]), ["-1 b,1,1,1,1,1,1,1,∅,1", "+1 b,2,2,2,3,1,2,1,∅,3"]);
    // At 12 s, a (last written at 0) is dropped, b (written at 6 s) is kept; a's old row
    // is not retracted, and a new row of a starts a new group.
    now.store(12_000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        step(&[("a", Some(1), None, 1), ("b", Some(3), None, 1)]),
        ["+1 a,1,1,1,1,1,1,1,∅,1", "-1 b,2,2,2,3,1,2,1,∅,3", "+1 b,3,3,3,6,1,3,2,∅,6"]
    );
    // Nothing is written after 12 s: both go at 22 s, on a watermark as well as on rows.
    now.store(22_000, std::sync::atomic::Ordering::Relaxed);
    let mut out = Vec::new();
    operator.on_watermark(1, &mut out).expect("watermark");
    assert_eq!(operator.groups.iter().flatten().count(), 0, "every group expired");
}

#[test]
fn a_group_takes_64_bytes_besides_its_accumulators() {
    // Hundreds of thousands are kept (NEXMark q4 groups by auction): the key inline when
    // short, the row count, and two boxed slices; no placement hash (computed again).
    assert_eq!(std::mem::size_of::<super::Group>(), 64);
}

#[test]
fn a_mini_batch_holds_changes_across_batches_until_its_rows_a_flush_a_barrier_or_the_end() {
    let mut operator = aggregate(true).with_mini_batch(3);
    let mut out = Vec::new();
    operator.on_data(batch(&[("a", Some(1), None, 1)]), &mut out).expect("data");
    operator.on_data(batch(&[("a", Some(2), None, 1)]), &mut out).expect("data");
    assert!(out.is_empty(), "two rows of three: held");
    // The third row ends the mini-batch: `a` appears once, with all three rows.
    operator.on_data(batch(&[("b", Some(5), None, 1)]), &mut out).expect("data");
    assert_eq!(lines(&out), ["+1 a,2,2,2,3,1,2,1,∅,3", "+1 b,1,1,1,5,5,5,5,∅,5"]);
    out.clear();
    operator.on_data(batch(&[("a", Some(4), None, 1)]), &mut out).expect("data");
    operator.on_flush(&mut out).expect("flush");
    assert_eq!(lines(&out), ["-1 a,2,2,2,3,1,2,1,∅,3", "+1 a,3,3,3,7,1,4,2,∅,7"], "the driver's flush");
    out.clear();
    operator.on_data(batch(&[("b", Some(5), None, -1)]), &mut out).expect("data");
    operator.on_barrier(sluice_types::Epoch(1), &mut out).expect("barrier");
    assert_eq!(lines(&out), ["-1 b,1,1,1,5,5,5,5,∅,5"], "a barrier");
    assert!(matches!(out.last(), Some(Message::Barrier(_))), "the changes come before the barrier");
    out.clear();
    operator.on_data(batch(&[("c", Some(1), None, 1)]), &mut out).expect("data");
    operator.on_end(&mut out).expect("end");
    assert_eq!(lines(&out), ["+1 c,1,1,1,1,1,1,1,∅,1"], "the end");
    assert!(matches!(out.last(), Some(Message::EndOfData)));
}

#[test]
fn a_group_emptied_within_a_mini_batch_goes_on_from_nothing() {
    // SUM of floats: 0.1 + 0.2 - 0.1 - 0.2 leaves 2.8e-17 in a running sum.
    let input =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("x", DataType::Float64, true)]));
    let spec = GroupAggregateSpec {
        keys: vec![0],
        aggregates: vec![AggregateSpec { function: AggregateFunction::Sum, argument: Some(1), filter: None }],
        output: Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("total", DataType::Float64, true),
        ])),
        append_only_input: false,
    };
    let ignored = LazyCounter::new(Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), "ignored retractions");
    let mut operator = GroupAggregate::new(spec, &input, ignored, VNODES).expect("aggregate").with_mini_batch(100);
    let rows = |values: &[(f64, i64)]| {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(values.iter().map(|_| "a"))),
            Arc::new(arrow::array::Float64Array::from_iter_values(values.iter().map(|v| v.0))),
        ];
        let rows = RecordBatch::try_new(Arc::clone(&input), columns).expect("batch");
        Batch::with_weights(rows, Int64Array::from_iter_values(values.iter().map(|v| v.1)))
    };
    let mut out = Vec::new();
    operator.on_data(rows(&[(0.1, 1), (0.2, 1)]), &mut out).expect("data");
    operator.on_data(rows(&[(0.1, -1), (0.2, -1)]), &mut out).expect("data");
    operator.on_data(rows(&[(0.001, 1)]), &mut out).expect("data");
    operator.on_flush(&mut out).expect("flush");
    assert_eq!(lines(&out), ["+1 a,0.001"], "not 0.001 plus the retracted rows' rounding");
}

/// A snapshot's record: its vnode, key and value.
type Record = (u32, Vec<u8>, Vec<u8>);

/// Feeds `rows`, `batch_rows` at a time, to an aggregate that spills and one that keeps
/// its state in memory, checkpointing both every `checkpoint_every` batches (deltas
/// after the first): the same changes and the same checkpointed records, then equal
/// full snapshots, whose records it returns.
fn side_by_side(
    spilling: &mut GroupAggregate,
    in_memory: &mut GroupAggregate,
    rows: &[Row],
    batch_rows: usize,
    checkpoint_every: usize,
) -> Result<Vec<Record>, TestCaseError> {
    let (mut spilled_runs, mut memory_runs) = (StateModel::default(), StateModel::default());
    for (index, chunk) in rows.chunks(batch_rows).enumerate() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        spilling.on_data(batch(chunk), &mut a).expect("data");
        in_memory.on_data(batch(chunk), &mut b).expect("data");
        prop_assert_eq!(lines(&a), lines(&b));
        if index % checkpoint_every == 0 {
            testing::checkpoint(spilling, &mut spilled_runs, 0..VNODES, index > 0);
            testing::checkpoint(in_memory, &mut memory_runs, 0..VNODES, index > 0);
            prop_assert_eq!(spilled_runs.records(), memory_runs.records());
        }
    }
    let (_, full) = testing::snapshot(spilling, false);
    let (_, expected) = testing::snapshot(in_memory, false);
    prop_assert_eq!(testing::puts(&full), testing::puts(&expected));
    Ok(testing::puts(&full))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// State on disk equals state in memory: an aggregate whose budget of 0 bytes sends
    /// its groups to cold runs at every flush and one that keeps them all, fed the same
    /// rows, emit the same changes and take equal full snapshots (the cold groups merged
    /// in), and a delta after groups were evicted while changed leads to the same
    /// checkpointed records. All the while the space counts no more than the runs'
    /// indexes and filters and the groups in memory.
    #[test]
    fn a_spilling_aggregate_emits_and_snapshots_what_one_in_memory_does(
        steps in steps(),
        batch_rows in 1usize..8,
        checkpoint_every in 1usize..5,
    ) {
        let rows = rows_of(&steps);
        let space = SpillSpace::new(std::env::temp_dir(), 0);
        let mut spilling = aggregate(true).with_spill(Arc::clone(&space), written());
        let mut in_memory = aggregate(true);
        side_by_side(&mut spilling, &mut in_memory, &rows, batch_rows, checkpoint_every)?;
        drop(spilling);
        prop_assert_eq!(space.resident(), 0, "every byte counted is given back");
        prop_assert_eq!(space.spilled(), 0, "every run is gone with its aggregate");
    }
}

#[test]
fn groups_beyond_the_budget_leave_memory_and_come_back_on_their_next_row() {
    let space = SpillSpace::new(std::env::temp_dir(), 0);
    let mut operator = aggregate(true).with_spill(Arc::clone(&space), written());
    let mut out = Vec::new();
    operator.on_data(batch(&[("a", Some(1), None, 1), ("b", Some(2), None, 1)]), &mut out).expect("data");
    // The clock passes them once (they were touched), then evicts them.
    operator.on_data(batch(&[("c", Some(3), None, 1)]), &mut out).expect("data");
    operator.on_data(batch(&[("c", Some(4), None, 1)]), &mut out).expect("data");
    let live = operator.groups.iter().flatten().count();
    assert!(live <= 1, "{live} groups still in memory");
    assert!(space.spilled() > 0, "the evicted groups are in a run");
    out.clear();
    operator.on_data(batch(&[("a", Some(10), None, 1)]), &mut out).expect("data");
    assert_eq!(lines(&out), ["-1 a,1,1,1,1,1,1,1,∅,1", "+1 a,2,2,2,11,1,10,5,∅,11"]);
}

/// The aggregates of the tests of spilled COUNT(DISTINCT) values: a BIGINT column's set
/// shared by two members (one FILTERed), and a text column's set.
const SPILLED_SETS: [(&str, AggregateFunction, Option<usize>, Option<usize>); 4] = [
    ("n", AggregateFunction::CountRows, None, None),
    ("d", AggregateFunction::CountDistinct, Some(1), None),
    ("dp", AggregateFunction::CountDistinct, Some(1), Some(3)),
    ("ds", AggregateFunction::CountDistinct, Some(2), None),
];

/// An aggregate of [`SPILLED_SETS`] over an append-only input.
fn append_only_sets() -> GroupAggregate {
    let mut operator = aggregate_of(true, &SPILLED_SETS);
    operator.spec.append_only_input = true;
    operator
}

/// Inserts only: a key of [`KEYS`], a value, and a text of [`TEXTS`] or none.
fn inserts() -> impl Strategy<Value = Vec<Row>> {
    let row = (0..KEYS.len(), prop::option::weighted(0.9, -300i64..300), prop::option::of(0..TEXTS.len()))
        .prop_map(|(key, value, text)| (KEYS[key], value, text.map(|t| TEXTS[t]), 1));
    prop::collection::vec(row, 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Over an append-only input, sets spilled at every flush (a budget of 0 bytes; the
    /// groups stay in memory once their sets spilled, other groups leave whole) give
    /// what sets kept in memory give: the same changes, the same checkpointed records
    /// through deltas, an equal full snapshot (the spilled values merged in); restored
    /// from that snapshot, again with a budget of 0 (spilling as it loads), the same
    /// changes for the rows that follow.
    #[test]
    fn spilled_count_distinct_values_give_what_values_in_memory_give(
        rows in inserts(),
        later in inserts(),
        batch_rows in 1usize..8,
        checkpoint_every in 1usize..5,
    ) {
        let space = SpillSpace::new(std::env::temp_dir(), 0);
        let mut spilling = append_only_sets().with_spill(Arc::clone(&space), written());
        let mut in_memory = append_only_sets();
        let full = side_by_side(&mut spilling, &mut in_memory, &rows, batch_rows, checkpoint_every)?;
        let mut restored = append_only_sets().with_spill(Arc::clone(&space), written());
        testing::restore_records(&mut restored, full).expect("restore");
        for chunk in later.chunks(batch_rows) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            restored.on_data(batch(chunk), &mut a).expect("data");
            in_memory.on_data(batch(chunk), &mut b).expect("data");
            prop_assert_eq!(lines(&a), lines(&b));
        }
        drop((spilling, restored));
        prop_assert_eq!(space.resident(), 0, "every byte counted is given back");
        prop_assert_eq!(space.spilled(), 0, "every run is gone with its aggregate");
    }
}

/// One group's set too large for the budget spills its values while the group stays:
/// the space holds the budget and little more, a value seen again (spilled, read back
/// with its members) counts once, a new one counts; a restore of the group spills as
/// it loads and counts what it spilled.
#[test]
fn a_set_too_large_for_the_budget_spills_its_values_and_its_group_stays() {
    const VALUES: i64 = 100_000;
    const BUDGET: usize = 256 << 10;
    let space = SpillSpace::new(std::env::temp_dir(), BUDGET);
    let mut operator = append_only_sets().with_spill(Arc::clone(&space), written());
    let mut out = Vec::new();
    let rows: Vec<Row> = (0..VALUES).map(|v| ("a", Some(v), None, 1)).collect();
    let mut most = 0;
    for chunk in rows.chunks(1000) {
        operator.on_data(batch(chunk), &mut out).expect("data");
        most = most.max(space.resident());
    }
    let group = operator.groups.iter().flatten().next().expect("the group stays in memory");
    assert!(group.distinct[0].spilled.is_some(), "its set spilled");
    assert!(most < 2 * BUDGET, "the space held {most} bytes at most, against a budget of {BUDGET}");
    let last = |out: &[Message]| lines(out).last().cloned().expect("a change");
    assert_eq!(last(&out), format!("+1 a,{VALUES},{VALUES},{},0", VALUES - 1));
    // 5 and 7 were spilled long ago; -1 is new; 0 is new to the FILTERed member only
    // (v > 0 is false for it: it stays unseen there).
    out.clear();
    operator.on_data(batch(&[("a", Some(5), Some("x"), 1), ("a", Some(7), None, 1)]), &mut out).expect("data");
    assert_eq!(last(&out), format!("+1 a,{},{VALUES},{},1", VALUES + 2, VALUES - 1));
    out.clear();
    operator.on_data(batch(&[("a", Some(-1), None, 1)]), &mut out).expect("data");
    assert_eq!(last(&out), format!("+1 a,{},{},{},1", VALUES + 3, VALUES + 1, VALUES - 1));

    let (_, full) = testing::snapshot(&mut operator, false);
    let restore_space = SpillSpace::new(std::env::temp_dir(), BUDGET);
    let mut restored = append_only_sets().with_spill(Arc::clone(&restore_space), written());
    testing::restore_records(&mut restored, testing::puts(&full)).expect("restore");
    let group = restored.groups.iter().flatten().next().expect("the restored group");
    assert!(group.distinct[0].spilled.is_some(), "the restore spilled the set as it loaded");
    out.clear();
    restored.on_data(batch(&[("a", Some(3), None, 1), ("a", Some(VALUES), None, 1)]), &mut out).expect("data");
    assert_eq!(last(&out), format!("+1 a,{},{},{},1", VALUES + 5, VALUES + 2, VALUES));
}
