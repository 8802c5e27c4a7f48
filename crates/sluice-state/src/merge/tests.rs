//! Merging against a model: runs of random puts, deletes and range deletes, applied one
//! after another to a map, must read back as the map; and so must the runs after any
//! compaction of any of their suffixes.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::read::BytesSource;
use crate::run::RunWriter;

/// One vnode's operations in a run: range deletes, then points (`None`: delete).
type VnodeOps = (Vec<(Vec<u8>, Vec<u8>)>, BTreeMap<Vec<u8>, Option<Vec<u8>>>);

/// One run's operations, by vnode.
#[derive(Debug, Clone)]
struct RunOps {
    vnodes: BTreeMap<u32, VnodeOps>,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..4, 0..3)
}

fn run_ops() -> impl Strategy<Value = RunOps> {
    let ranges = proptest::collection::vec((key(), key()), 0..2).prop_map(|pairs| {
        let mut ranges: Vec<_> = pairs.into_iter().filter(|(a, b)| a < b).collect();
        ranges.sort();
        ranges
    });
    let points = proptest::collection::btree_map(
        key(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..3)),
        0..6,
    );
    proptest::collection::btree_map(0u32..3, (ranges, points), 0..3).prop_map(|vnodes| RunOps { vnodes })
}

fn write_run(ops: &RunOps, block_bytes: usize) -> MergeInput {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), block_bytes).expect("a writer");
    for (vnode, (ranges, points)) in &ops.vnodes {
        for (start, end) in ranges {
            writer.delete_range(*vnode, start, end).expect("range");
        }
        for (key, value) in points {
            match value {
                Some(value) => writer.put(*vnode, key, value).expect("put"),
                None => writer.delete(*vnode, key).expect("delete"),
            }
        }
    }
    let (_, bytes) = writer.finish().expect("finished");
    MergeInput::open(Arc::new(BytesSource { name: "run".into(), bytes })).expect("opens")
}

type Model = BTreeMap<(u32, Vec<u8>), Vec<u8>>;

fn apply(model: &mut Model, ops: &RunOps) {
    for (vnode, (ranges, points)) in &ops.vnodes {
        for (start, end) in ranges {
            model.retain(|(v, k), _| !(v == vnode && start <= k && k < end));
        }
        for (key, value) in points {
            match value {
                Some(value) => model.insert((*vnode, key.clone()), value.clone()),
                None => model.remove(&(*vnode, key.clone())),
            };
        }
    }
}

fn read_live(inputs: Vec<MergeInput>, vnodes: Range<u32>) -> Model {
    let mut merge = Merge::new(inputs, vnodes, MergeMode::Live);
    let mut read = Model::new();
    let mut last: Option<(u32, Vec<u8>)> = None;
    while let Some(record) = merge.next_record().expect("merges") {
        let at = (record.vnode, record.key.to_vec());
        assert!(last.as_ref() < Some(&at), "records come in order, each key once");
        read.insert(at.clone(), record.value.to_vec());
        last = Some(at);
    }
    read
}

fn compact(inputs: Vec<MergeInput>, mode: MergeMode, block_bytes: usize) -> MergeInput {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), block_bytes).expect("a writer");
    Merge::new(inputs, 0..u32::MAX, mode).write_into(&mut writer).expect("merges");
    let (_, bytes) = writer.finish().expect("finished");
    MergeInput::open(Arc::new(BytesSource { name: "merged".into(), bytes })).expect("opens")
}

proptest! {
    #[test]
    fn a_merge_reads_what_the_runs_applied_in_order_leave(
        runs in proptest::collection::vec(run_ops(), 1..6),
        block_bytes in 1usize..40,
        split in 0usize..6,
        key_range in (key(), proptest::option::of(key())),
    ) {
        let mut model = Model::new();
        runs.iter().for_each(|ops| apply(&mut model, ops));
        let inputs: Vec<MergeInput> = runs.iter().map(|ops| write_run(ops, block_bytes)).collect();
        prop_assert_eq!(&read_live(inputs.clone(), 0..u32::MAX), &model);

        // Only some keys of each vnode.
        let (start, end) = (key_range.0.clone(), key_range.1.clone());
        let within: Model = model
            .iter()
            .filter(|((_, k), _)| start <= *k && end.as_ref().is_none_or(|end| k < end))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut merge = Merge::new(inputs.clone(), 0..u32::MAX, MergeMode::Live).within(start, end);
        let mut read = Model::new();
        while let Some(record) = merge.next_record().expect("merges") {
            read.insert((record.vnode, record.key.to_vec()), record.value.to_vec());
        }
        prop_assert_eq!(&read, &within);

        // Only some vnodes.
        let some: Model = model.iter().filter(|((v, _), _)| *v >= 1).map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(&read_live(inputs.clone(), 1..3), &some);

        // The newest runs merged into one, deletes kept: the same state.
        let split = split % inputs.len();
        let mut compacted = inputs[..split].to_vec();
        compacted.push(compact(inputs[split..].to_vec(), MergeMode::KeepDeletes, block_bytes));
        prop_assert_eq!(&read_live(compacted, 0..u32::MAX), &model);

        // Everything merged into one: the same state, live records only.
        let full = compact(inputs, MergeMode::Live, block_bytes);
        prop_assert_eq!(&read_live(vec![full.clone()], 0..u32::MAX), &model);
        prop_assert_eq!(full.index.blocks.iter().filter(|b| b.ranges).count(), 0);
    }
}

#[test]
fn a_range_delete_hides_older_runs_only() {
    let mut old = RunOps { vnodes: BTreeMap::new() };
    old.vnodes.insert(0, (vec![], [(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), Some(b"2".to_vec()))].into()));
    let mut new = RunOps { vnodes: BTreeMap::new() };
    new.vnodes.insert(0, (vec![(b"a".to_vec(), b"z".to_vec())], [(b"b".to_vec(), Some(b"3".to_vec()))].into()));
    let read = read_live(vec![write_run(&old, 64), write_run(&new, 64)], 0..1);
    assert_eq!(read, Model::from([((0, b"b".to_vec()), b"3".to_vec())]));
}

/// Blocks whose keys a newer run's range delete hides whole are never read, in a
/// restore and in a compaction of every run or of the newest ones.
#[test]
fn blocks_a_newer_range_delete_hides_whole_are_left_unread() {
    let mut old = RunOps { vnodes: BTreeMap::new() };
    old.vnodes.insert(0, (vec![], (0u8..50).map(|k| (vec![k], Some(vec![k; 10]))).collect()));
    let mut newer = RunOps { vnodes: BTreeMap::new() };
    newer.vnodes.insert(0, (vec![(vec![0], vec![40])], [(vec![45], Some(b"new".to_vec()))].into()));
    let mut model = Model::new();
    apply(&mut model, &old);
    apply(&mut model, &newer);
    let inputs = vec![write_run(&old, 64), write_run(&newer, 64)];
    // 14 bytes a record: blocks of 5 keys, the block of keys 35..40 the last hidden.
    assert_eq!(inputs[0].index.blocks.len(), 10);
    let mut merge = Merge::new(inputs.clone(), 0..1, MergeMode::Live);
    let mut read = Model::new();
    while let Some(record) = merge.next_record().expect("merges") {
        read.insert((record.vnode, record.key.to_vec()), record.value.to_vec());
    }
    assert_eq!(read, model);
    assert_eq!(merge.blocks_skipped(), 8);
    for mode in [MergeMode::Live, MergeMode::KeepDeletes] {
        let merged = compact(inputs.clone(), mode, 64);
        let mut after =
            if mode == MergeMode::Live { vec![] } else { vec![write_run(&RunOps { vnodes: BTreeMap::new() }, 64)] };
        after.push(merged);
        assert_eq!(read_live(after, 0..1), model, "{mode:?}");
    }
}

/// A compaction of the newest runs keeps their range deletes as one union: a state
/// deleting a growing prefix at each checkpoint (a join's expiry) keeps one range.
#[test]
fn a_compaction_keeps_the_union_of_its_runs_range_deletes() {
    let runs: Vec<RunOps> = (1u8..=4)
        .map(|end| {
            let mut ops = RunOps { vnodes: BTreeMap::new() };
            ops.vnodes.insert(0, (vec![(vec![0], vec![end])], [(vec![end + 10], Some(vec![end]))].into()));
            ops
        })
        .collect();
    let mut model = Model::new();
    runs.iter().for_each(|ops| apply(&mut model, ops));
    let inputs: Vec<MergeInput> = runs.iter().map(|ops| write_run(ops, 64)).collect();
    let merged = compact(inputs, MergeMode::KeepDeletes, 64);
    let mut merge = Merge::new(vec![merged.clone()], 0..1, MergeMode::KeepDeletes);
    let mut ranges = Vec::new();
    while let Some(item) = merge.next_merged().expect("merges") {
        if let Merged::Range { start, end, .. } = item {
            ranges.push((start.to_vec(), end.to_vec()));
        }
    }
    assert_eq!(ranges, [(vec![0], vec![4])]);
    assert_eq!(read_live(vec![merged], 0..1), model);
}

#[test]
fn a_damaged_block_is_named_when_the_merge_reaches_it() {
    let mut ops = RunOps { vnodes: BTreeMap::new() };
    ops.vnodes.insert(0, (vec![], (0u8..50).map(|k| (vec![k], Some(vec![k; 10]))).collect()));
    let input = write_run(&ops, 64);
    let mut bytes = BytesSource { name: "x".into(), bytes: Vec::new() };
    // Damage the last block: the merge reads records until it reaches it.
    let last = input.index.blocks.last().expect("blocks").clone();
    let source = input.source.read_at(0, input.source.size() as usize).expect("bytes");
    bytes.bytes = source;
    bytes.bytes[last.offset as usize] ^= 0xff;
    let damaged = MergeInput::open(Arc::new(bytes)).expect("the index is intact");
    let mut merge = Merge::new(vec![damaged], 0..1, MergeMode::Live);
    let mut read = 0;
    let error = loop {
        match merge.next_record() {
            Ok(Some(_)) => read += 1,
            Ok(None) => panic!("the damage went unnoticed"),
            Err(error) => break error,
        }
    };
    assert!(read > 0, "records before the damaged block are read");
    assert_eq!(error.code, "state.run_damaged");
    assert!(error.message.contains("vnode 0"), "{}", error.message);
}

/// A run listed twice, serving disjoint vnodes (written by one thread, owned by two now),
/// among others: each listing yields only its vnodes, and its range deletes never hide
/// its own puts through the other listing.
#[test]
fn a_run_serving_part_of_its_vnodes_yields_only_those() {
    let mut old = RunOps { vnodes: BTreeMap::new() };
    for vnode in 0..4 {
        old.vnodes
            .insert(vnode, (vec![(b"a".to_vec(), b"z".to_vec())], [(b"k".to_vec(), Some(vec![vnode as u8]))].into()));
    }
    let old = write_run(&old, 64);
    let mut newer = RunOps { vnodes: BTreeMap::new() };
    newer.vnodes.insert(3, (vec![], [(b"k".to_vec(), Some(b"new".to_vec()))].into()));
    let inputs = vec![old.clone().serving(0..2), old.serving(2..4), write_run(&newer, 64).serving(2..4)];
    let read = read_live(inputs, 0..4);
    let expected = Model::from([
        ((0, b"k".to_vec()), vec![0]),
        ((1, b"k".to_vec()), vec![1]),
        ((2, b"k".to_vec()), vec![2]),
        ((3, b"k".to_vec()), b"new".to_vec()),
    ]);
    assert_eq!(read, expected);
}

/// Runs of fresh keys (a join's appended rows: per vnode, each run's keys, arrival
/// numbers, above the older runs'), each vnode's rows in several blocks.
fn fresh_runs(runs: u64, compressed: bool) -> (Vec<MergeInput>, Model) {
    let mut model = Model::new();
    let mut inputs = Vec::new();
    for run in 0..runs {
        let mut writer = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer");
        if compressed {
            writer = writer.compressed();
        }
        for vnode in 0..4u32 {
            for arrival in run * 20..run * 20 + 20 {
                let key = arrival.to_be_bytes();
                let value = vec![vnode as u8 + arrival as u8 % 3; 30];
                writer.put(vnode, &key, &value).expect("put");
                model.insert((vnode, key.to_vec()), value);
            }
        }
        let (_, bytes) = writer.finish().expect("finished");
        inputs.push(MergeInput::open(Arc::new(BytesSource { name: format!("run {run}"), bytes })).expect("opens"));
    }
    (inputs, model)
}

/// A compaction of runs whose keys do not overlap takes their blocks whole (compressed
/// ones as they were, stored ones compressed when the writer compresses), in key order,
/// and reads back as the runs did; runs whose keys overlap are merged record by record,
/// as before.
#[test]
fn runs_of_fresh_keys_are_compacted_by_copying_their_blocks() {
    for (compressed, writer_compresses) in [(false, false), (true, false), (false, true), (true, true)] {
        let (inputs, model) = fresh_runs(3, compressed);
        for mode in [MergeMode::Live, MergeMode::KeepDeletes] {
            let mut writer = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer");
            if writer_compresses {
                writer = writer.compressed();
            }
            let mut merge = Merge::new(inputs.clone(), 0..u32::MAX, mode);
            let items = merge.write_into(&mut writer).expect("merges");
            assert_eq!(items, model.len() as u64);
            let input_blocks: usize = inputs.iter().map(|input| input.index.blocks.len()).sum();
            // Every block but each vnode's last of each run holds at least 32 bytes.
            assert!(merge.blocks_copied() as usize >= input_blocks - 3 * 4, "{} copied", merge.blocks_copied());
            let (_, bytes) = writer.finish().expect("finished");
            let merged = MergeInput::open(Arc::new(BytesSource { name: "merged".into(), bytes })).expect("opens");
            let lz4_blocks = merged.index.blocks.iter().filter(|block| block.raw_length.is_some()).count();
            assert_eq!(lz4_blocks > 0, compressed || writer_compresses);
            if writer_compresses {
                // Every copied block is compressed, stored ones included (their repeated
                // bytes shrink by far more than an eighth).
                assert!(lz4_blocks as u64 >= merge.blocks_copied(), "{lz4_blocks} of {}", merge.blocks_copied());
            }
            assert_eq!(read_live(vec![merged.clone()], 0..u32::MAX), model);
            // Merged again with a newer run of fresh keys: copied again, still the same.
            let (more, _) = fresh_runs(4, compressed);
            let mut model = model.clone();
            let newest = more.last().expect("a fourth run").clone();
            model.extend(read_live(vec![newest.clone()], 0..u32::MAX));
            let again = compact(vec![merged, newest], mode, 64);
            assert_eq!(read_live(vec![again], 0..u32::MAX), model);
        }
    }
    // Overlapping keys (the same run twice): merged by record, the newest winning.
    let (inputs, model) = fresh_runs(1, false);
    let mut writer = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer");
    let mut merge = Merge::new(vec![inputs[0].clone(), inputs[0].clone()], 0..u32::MAX, MergeMode::Live);
    merge.write_into(&mut writer).expect("merges");
    assert_eq!(merge.blocks_copied(), 0, "keys in both runs need a merge");
    let (_, bytes) = writer.finish().expect("finished");
    let merged = MergeInput::open(Arc::new(BytesSource { name: "merged".into(), bytes })).expect("opens");
    assert_eq!(read_live(vec![merged], 0..u32::MAX), model);
}

/// A block taken whole is checked against its checksum first: damage is named, never
/// copied into the merge.
#[test]
fn a_damaged_block_is_not_copied() {
    let (mut inputs, _) = fresh_runs(2, true);
    let first = inputs[0].index.blocks[0].clone();
    let mut bytes = inputs[0].source.read_at(0, inputs[0].source.size() as usize).expect("bytes");
    bytes[first.offset as usize] ^= 0x10;
    inputs[0] = MergeInput::open(Arc::new(BytesSource { name: "damaged".into(), bytes })).expect("the index is intact");
    let mut writer = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer");
    let error = Merge::new(inputs, 0..u32::MAX, MergeMode::KeepDeletes).write_into(&mut writer).expect_err("damaged");
    assert_eq!(error.code, "state.run_damaged");
    assert!(error.message.contains("damaged") && error.message.contains("checksum"), "{}", error.message);
}
