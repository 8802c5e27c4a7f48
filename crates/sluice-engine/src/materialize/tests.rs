//! Integration of weighted rows, versions per epoch, leases, and the state that
//! checkpoints keep of it: records (deltas when they can be) restored onto other
//! numbers of threads, against a from-scratch multiset over random epochs.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_operators::spill::SpillSpace;
use sluice_runtime::{Metrics, Operator, OperatorContext, SinkFactory, SinkWriter, SnapshotKind};
use sluice_state::{CollectedState, MemoryState, StateModel};
use sluice_types::{Batch, Epoch, SluiceError};

use super::{Integrate, Materialized, TableSpec};

const VNODES: u32 = 16;

/// A record: vnode, key, value.
type Record = (u32, Vec<u8>, Vec<u8>);

/// One thread's part of a table's flow, fed as a driver feeds it: the operator, then
/// the hidden sink's writer.
struct Thread {
    operator: Integrate,
    writer: Box<dyn SinkWriter>,
}

impl Thread {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        self.operator.on_data(batch.clone(), &mut Vec::new())
    }

    /// A barrier: the snapshot at the segment's input (not written), the operator, the
    /// sink.
    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        let _ = self.operator.snapshot_state(false)?;
        self.operator.on_barrier(epoch, &mut Vec::new())?;
        self.writer.pre_commit(epoch)
    }

    /// Like `pre_commit`, returning the snapshot's kind and records (a delta when
    /// `delta` and it can be).
    fn checkpoint(&mut self, epoch: Epoch, delta: bool) -> (SnapshotKind, CollectedState) {
        let snapshot = self.operator.snapshot_state(delta).expect("snapshot").expect("a stateful operator");
        let mut records = CollectedState::default();
        (snapshot.job)(&mut records).expect("records");
        self.operator.on_barrier(epoch, &mut Vec::new()).expect("barrier");
        self.writer.pre_commit(epoch).expect("seal");
        (snapshot.kind, records)
    }
}

fn open(registry: &Arc<Materialized>, sink: &Arc<dyn SinkFactory>, name: &str, slot: u32, slots: u32) -> Thread {
    open_in(registry, sink, name, slot, slots, None)
}

/// [`open`], the slice counting in `space` and spilling there beyond its budget.
fn open_in(
    registry: &Arc<Materialized>,
    sink: &Arc<dyn SinkFactory>,
    name: &str,
    slot: u32,
    slots: u32,
    space: Option<Arc<SpillSpace>>,
) -> Thread {
    let table = Arc::clone(registry.table(name).expect("table"));
    let context = OperatorContext {
        thread: slot,
        threads: slots,
        vnodes: VNODES,
        metrics: Arc::new(Metrics::new(Vec::new(), Vec::new(), slots)),
    };
    Thread {
        operator: Integrate::new(table, &context, space).expect("operator"),
        writer: sink.open(slot, slots, true).expect("writer"),
    }
}

const LONG: Duration = Duration::from_secs(600);

fn schema() -> arrow::datatypes::SchemaRef {
    Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("v", DataType::Int64, true)]))
}

fn registry(tables: &[&str], threads: u32) -> Arc<Materialized> {
    let specs = tables.iter().map(|name| TableSpec { name: name.to_string(), schema: schema() }).collect();
    Materialized::new(specs, vec!["raw".into()], threads).expect("registry")
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
    rows_of(&registry.read(table, lease, 2).expect("read"))
}

/// Batches as sorted `(k, v)` pairs.
fn rows_of(batches: &[RecordBatch]) -> Vec<(String, i64)> {
    let mut rows = Vec::new();
    for batch in batches {
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
    let mut first = open(&registry, &sink, "t", 0, 2);
    let mut second = open(&registry, &sink, "t", 1, 2);
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
    let mut writer = open(&registry, &sink, "t", 0, 1);
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
    let mut writer = open(&registry, &sink, "t", 0, 1);
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
    let mut a = open(&registry, &sink_a, "a", 0, 1);
    let mut b = open(&registry, &sink_b, "b", 0, 1);
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
    let mut writer = open(&registry, &sink, "t", 0, 1);
    writer.pre_commit(Epoch(3)).expect("seal");
    let waiting = {
        let registry = Arc::clone(&registry);
        std::thread::spawn(move || registry.lease(LONG, LONG).map(|lease| lease.epoch))
    };
    sink.commit(Epoch(3), &[]).expect("commit");
    assert_eq!(waiting.join().expect("thread"), Some(3));
}

/// The rows of `batch` in the table's key encoding.
fn encoded(registry: &Materialized, rows: &Batch) -> Vec<Vec<u8>> {
    let mut keys = sluice_types::key::KeyRows::default();
    registry.table("t").expect("table").encoder.encode(rows.rows.columns(), &mut keys).expect("encode");
    (0..keys.len()).map(|i| keys.row(i).to_vec()).collect()
}

/// The thread of `slots` that the exchange before the operator sends row `(k, v)` to.
fn thread_of(registry: &Materialized, k: &str, v: i64, slots: u32) -> usize {
    let row = encoded(registry, &batch(&[(k, v, 1)])).remove(0);
    let vnode = sluice_types::vnode::of_hash(sluice_types::key::hash(&row), VNODES);
    sluice_types::vnode::slot_of(vnode, VNODES, slots) as usize
}

#[test]
fn a_checkpoint_restores_the_table_at_its_epoch_onto_another_number_of_threads() {
    let before = registry(&["t"], 1);
    let sink = before.sink("t").expect("sink");
    let mut thread = open(&before, &sink, "t", 0, 1);
    let inserts: Vec<(String, i64)> = (0..40).map(|i| (format!("k{i}"), i)).collect();
    let rows: Vec<(&str, i64, i64)> = inserts.iter().map(|(k, v)| (k.as_str(), *v, 1)).collect();
    thread.write(&batch(&rows)).expect("write");
    let mut runs = StateModel::default();
    let (kind, records) = thread.checkpoint(Epoch(1), true);
    assert_eq!(kind, SnapshotKind::Full, "the first snapshot is full");
    runs.apply(0..VNODES, true, records);
    sink.commit(Epoch(1), &[]).expect("commit");
    // Epoch 2: a retraction, a duplicate, a row in and out again, all in the open delta.
    thread.write(&batch(&[("k0", 0, -1), ("k1", 1, 1), ("gone", 7, 1), ("gone", 7, -1)])).expect("write");
    let (kind, records) = thread.checkpoint(Epoch(2), true);
    assert_eq!(kind, SnapshotKind::Delta);
    runs.apply(0..VNODES, false, records);
    sink.commit(Epoch(2), &[]).expect("commit");
    // After the checkpoint: not in it.
    thread.write(&batch(&[("late", 9, 1)])).expect("write");
    let lease = before.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 2);
    let want = read(&before, "t", &lease);
    assert_eq!(want.len(), 40, "39 rows and a duplicate: {want:?}");
    assert!(runs.records().keys().map(|(vnode, _)| vnode).collect::<std::collections::BTreeSet<_>>().len() > 1);

    let after = registry(&["t"], 3);
    let sink = after.sink("t").expect("sink");
    let mut threads: Vec<Thread> = (0..3).map(|slot| open(&after, &sink, "t", slot, 3)).collect();
    for (slot, thread) in threads.iter_mut().enumerate() {
        let owned = sluice_types::vnode::range_of(slot as u32, VNODES, 3);
        thread.operator.restore_state(&mut runs.source(owned)).expect("restore");
    }
    assert!(after.lease(Duration::ZERO, LONG).is_none(), "readable from the first checkpoint after the restore");
    // Retractions reach the thread of their row, where the restored row is.
    threads[thread_of(&after, "k2", 2, 3)].write(&batch(&[("k2", 2, -1)])).expect("write");
    threads[thread_of(&after, "k1", 1, 3)].write(&batch(&[("k1", 1, -1)])).expect("write");
    for thread in &mut threads {
        thread.pre_commit(Epoch(3)).expect("seal");
    }
    sink.commit(Epoch(3), &[]).expect("commit");
    let lease = after.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 3);
    let mut want = want;
    for gone in [("k1".to_string(), 1), ("k2".to_string(), 2)] {
        let at = want.iter().position(|row| *row == gone).expect("present");
        want.remove(at);
    }
    assert_eq!(read(&after, "t", &lease), want);
}

/// A delta holds the rows received since the previous snapshot, each with its weight
/// now, and a delete for each row whose weight is 0 now.
#[test]
fn a_delta_holds_the_rows_whose_weight_changed_since_the_previous_snapshot() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    thread.write(&batch(&[("a", 1, 1), ("b", 2, 2), ("c", 3, 1)])).expect("write");
    assert_eq!(thread.checkpoint(Epoch(1), true).0, SnapshotKind::Full, "the first snapshot is full");
    // b loses a copy, c is gone, d is new, e comes and goes; a is untouched.
    thread.write(&batch(&[("b", 2, -1), ("c", 3, -1), ("d", 4, 3), ("e", 5, 1), ("e", 5, -1)])).expect("write");
    let (kind, delta) = thread.checkpoint(Epoch(2), true);
    assert_eq!(kind, SnapshotKind::Delta);
    let rows = encoded(&registry, &batch(&[("b", 2, 1), ("c", 3, 1), ("d", 4, 1)]));
    let vnode = |row: &[u8]| sluice_types::vnode::of_hash(sluice_types::key::hash(row), VNODES);
    let mut expected: Vec<(u32, Vec<u8>, Option<Vec<u8>>)> = vec![
        (vnode(&rows[0]), rows[0].clone(), Some(1i64.to_le_bytes().to_vec())),
        (vnode(&rows[1]), rows[1].clone(), None),
        (vnode(&rows[2]), rows[2].clone(), Some(3i64.to_le_bytes().to_vec())),
    ];
    expected.sort();
    assert_eq!(delta.points, expected);
    assert!(delta.ranges.is_empty());
    let (kind, nothing) = thread.checkpoint(Epoch(3), true);
    assert_eq!(kind, SnapshotKind::Delta);
    assert!(nothing.points.is_empty(), "nothing changed since");
    assert_eq!(thread.checkpoint(Epoch(4), false).0, SnapshotKind::Full, "after a snapshot not written");
}

/// A small deterministic generator (splitmix64): the engine's tests have no proptest.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    }
}

const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Threads of one table and the runs their checkpoints wrote.
struct Running {
    registry: Arc<Materialized>,
    sink: Arc<dyn SinkFactory>,
    threads: Vec<Thread>,
    runs: StateModel,
}

impl Running {
    /// `slots` threads, restored from `runs`.
    fn restored(slots: u32, runs: StateModel) -> Running {
        Running::restored_in(slots, runs, None)
    }

    /// [`Running::restored`], the slices counting in `space`.
    fn restored_in(slots: u32, runs: StateModel, space: Option<&Arc<SpillSpace>>) -> Running {
        let registry = registry(&["t"], slots);
        let sink = registry.sink("t").expect("sink");
        let mut threads: Vec<Thread> =
            (0..slots).map(|slot| open_in(&registry, &sink, "t", slot, slots, space.cloned())).collect();
        for (slot, thread) in threads.iter_mut().enumerate() {
            let owned = sluice_types::vnode::range_of(slot as u32, VNODES, slots);
            thread.operator.restore_state(&mut runs.source(owned)).expect("restore");
        }
        Running { registry, sink, threads, runs }
    }

    /// Writes up to `rows_max` random rows, one batch each to its row's thread, and
    /// adds them to `multiset`: insertions, and retractions of rows present, as in a
    /// changelog.
    fn write_random(&mut self, random: &mut Random, multiset: &mut Multiset, rows_max: u64) {
        let slots = self.threads.len() as u32;
        for _ in 0..random.below(rows_max) {
            let row = (KEYS[random.below(5) as usize].to_string(), random.below(3) as i64);
            let present = multiset.get(&row).copied().unwrap_or(0);
            let retract = present > 0 && random.below(2) == 0;
            let weight = if retract { -1 - random.below(present as u64) as i64 } else { 1 + random.below(2) as i64 };
            *multiset.entry(row.clone()).or_default() += weight;
            let thread = thread_of(&self.registry, &row.0, row.1, slots);
            self.threads[thread].write(&batch(&[(&row.0, row.1, weight)])).expect("write");
        }
    }

    /// A checkpoint of epoch `epoch` (deltas when they can be), committed.
    fn checkpoint(&mut self, epoch: u64) {
        let slots = self.threads.len() as u32;
        for (slot, thread) in self.threads.iter_mut().enumerate() {
            let (kind, records) = thread.checkpoint(Epoch(epoch), true);
            let owned = sluice_types::vnode::range_of(slot as u32, VNODES, slots);
            self.runs.apply(owned, !kind.is_delta(), records);
        }
        self.sink.commit(Epoch(epoch), &[]).expect("commit");
    }
}

/// Over random epochs of insertions and retractions (each routed to its row's thread),
/// with a checkpoint at the end of each and, now and then, a restart from the runs onto
/// one to three threads: the table read at each epoch is the from-scratch multiset of
/// the rows so far, and so are the runs at the end.
#[test]
fn the_table_restored_from_deltas_is_the_multiset_of_every_row_so_far() {
    for seed in 0..48 {
        let mut random = Random(seed);
        let mut running = Running::restored(1, StateModel::default());
        let mut multiset = Multiset::new();
        for epoch in 1..=12u64 {
            if random.below(4) == 0 {
                let runs = std::mem::take(&mut running.runs);
                running = Running::restored(1 + random.below(3) as u32, runs);
            }
            running.write_random(&mut random, &mut multiset, 12);
            running.checkpoint(epoch);
            let lease = running.registry.lease(Duration::ZERO, LONG).expect("lease");
            assert_eq!(lease.epoch, epoch);
            assert_eq!(read(&running.registry, "t", &lease), expanded(&multiset), "seed {seed}, epoch {epoch}");
        }
        let want = records_of(&running.registry, &multiset);
        assert_eq!(running.runs.records(), &want, "seed {seed}: the runs hold each row with its weight");
    }
}

/// `(k, v)` rows and their weights.
type Multiset = std::collections::BTreeMap<(String, i64), i64>;

/// The rows of a multiset, each as often as its weight, sorted.
fn expanded(multiset: &Multiset) -> Vec<(String, i64)> {
    let mut rows = Vec::new();
    for (row, weight) in multiset {
        rows.extend(std::iter::repeat_n(row.clone(), (*weight).max(0) as usize));
    }
    rows
}

/// The same random epochs as above, each slice spilling its base to runs at every batch
/// and barrier (a budget of 0 bytes), with a pin taken at each epoch and read only after
/// the next epoch's rows, spills and compactions: every read is the multiset at its
/// epoch, the runs of the checkpoints hold each row with its weight, and once the job is
/// gone the space counts no memory and no file.
#[test]
fn a_table_spilled_beyond_its_budget_reads_and_restores_as_one_kept_in_memory() {
    for seed in 0..48 {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 0);
        let mut random = Random(seed);
        let mut running = Running::restored_in(1, StateModel::default(), Some(&space));
        let mut multiset = Multiset::new();
        // A pin and the rows it must read.
        type Pinned = (Arc<super::TableAt>, Vec<(String, i64)>);
        let mut pinned: Option<Pinned> = None;
        let mut spilled = false;
        for epoch in 1..=12u64 {
            if random.below(4) == 0 {
                let runs = std::mem::take(&mut running.runs);
                pinned = None;
                running = Running::restored_in(1 + random.below(3) as u32, runs, Some(&space));
            }
            running.write_random(&mut random, &mut multiset, 24);
            spilled |= space.spilled() > 0;
            running.checkpoint(epoch);
            if let Some((at, want)) = pinned.take() {
                let rows = rows_of(&at.batches(2).expect("the pinned epoch"));
                assert_eq!(rows, want, "seed {seed}: epoch {} read after epoch {epoch}", at.epoch());
            }
            let lease = running.registry.lease(Duration::ZERO, LONG).expect("lease");
            assert_eq!(lease.epoch, epoch);
            assert_eq!(read(&running.registry, "t", &lease), expanded(&multiset), "seed {seed}, epoch {epoch}");
            let table = running.registry.table("t").expect("table");
            let at = running.registry.pin(table, &lease, epoch, Duration::ZERO).expect("a pin");
            pinned = Some((at, expanded(&multiset)));
        }
        assert!(spilled, "seed {seed}: nothing was spilled");
        let want = records_of(&running.registry, &multiset);
        assert_eq!(running.runs.records(), &want, "seed {seed}: the runs hold each row with its weight");
        drop((pinned, running));
        assert_eq!((space.resident(), space.spilled()), (0, 0), "seed {seed}: the space counts what is gone");
    }
}

/// Rows since the last commit cannot spill: beyond half the budget they hold the sources
/// back (and ask for a checkpoint) until a commit brings them under it. Sealed at a
/// barrier they still count; committed, they no longer do, and once the space is over
/// its budget they spill rather than being folded into the base in memory first.
#[test]
fn rows_since_the_last_commit_beyond_their_share_of_the_budget_hold_the_sources_back_until_a_commit() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let space = SpillSpace::new(dir.path().to_path_buf(), 64 << 10);
    let registry = registry(&["t"], 1);
    registry.limit_pending(space.budget());
    let (stop, _woken) = sluice_runtime::stop_handle();
    registry.hold_with(&stop);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open_in(&registry, &sink, "t", 0, 1, Some(Arc::clone(&space)));
    let row = |i: i64| format!("row {i:06} of a table whose rows since the last commit outgrow their share");
    let mut written = 0;
    let mut write_until_held = |thread: &mut Thread| {
        let from = written;
        while !stop.is_held() {
            assert!(written < from + 10_000, "never held back, {} bytes resident", space.resident());
            thread.write(&batch(&[(&row(written), written, 1)])).expect("a row");
            written += 1;
        }
        written - from
    };
    // Held only past the limit, half of the budget: about 32 KiB of rows of 130 bytes.
    assert_eq!(registry.held_back(), (false, Duration::ZERO));
    let first = write_until_held(&mut thread);
    assert!(registry.held_back().0);
    assert!((200..300).contains(&first), "held back after {first} rows");
    assert_eq!(space.spilled(), 0, "rows not committed never spill");
    let _ = thread.operator.snapshot_state(true).expect("a snapshot");
    assert!(stop.is_held(), "the rows a snapshot took still count until handed over");
    thread.pre_commit(Epoch(1)).expect("sealed");
    assert!(stop.is_held(), "sealed rows are not committed yet");
    sink.commit(Epoch(1), &[]).expect("commit");
    assert!(!stop.is_held(), "the commit let the sources go on");
    let (held, waited) = registry.held_back();
    assert!(!held && waited > Duration::ZERO, "held back for {waited:?}");
    // The committed rows and the new ones outgrow the budget: the committed ones spill,
    // and the new ones hold the sources back again at the same limit.
    let second = write_until_held(&mut thread);
    assert!(space.spilled() > 0, "the committed rows spilled");
    assert!(second.abs_diff(first) <= 1, "held back again after {second} rows, not {first}");
    thread.pre_commit(Epoch(2)).expect("sealed");
    // Other state fills the budget: the commit leaves the rows for the next spill.
    space.charge(space.budget());
    sink.commit(Epoch(2), &[]).expect("commit");
    assert!(!stop.is_held());
    let spilled = space.spilled();
    {
        let slice = super::lock(&registry.table("t").expect("table").slices[0]);
        assert!(slice.base.is_empty() && slice.sealed.len() == 1, "committed rows left for the run");
    }
    thread.write(&batch(&[(&row(written), written, 1)])).expect("a row");
    written += 1;
    assert!(space.spilled() > spilled, "the committed rows spilled at the next batch");
    space.release(space.budget());
    thread.pre_commit(Epoch(3)).expect("sealed");
    sink.commit(Epoch(3), &[]).expect("commit");
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    let mut want: Vec<(String, i64)> = (0..written).map(|i| (row(i), i)).collect();
    want.sort();
    assert_eq!(read(&registry, "t", &lease), want);
}

/// The records a checkpoint holds of a multiset: each row of nonzero weight with it.
fn records_of(registry: &Materialized, multiset: &Multiset) -> std::collections::BTreeMap<(u32, Vec<u8>), Vec<u8>> {
    let mut records = std::collections::BTreeMap::new();
    for ((k, v), weight) in multiset.iter().filter(|(_, weight)| **weight != 0) {
        let row = encoded(registry, &batch(&[(k, *v, 1)])).remove(0);
        let vnode = sluice_types::vnode::of_hash(sluice_types::key::hash(&row), VNODES);
        records.insert((vnode, row), weight.to_le_bytes().to_vec());
    }
    records
}

/// The one record of a full snapshot holding one row.
fn one_row() -> Record {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    thread.write(&batch(&[("a", 1, 2)])).expect("write");
    let (_, records) = thread.checkpoint(Epoch(1), false);
    let [(vnode, key, Some(value))] = records.points.as_slice() else { panic!("one row: {records:?}") };
    (*vnode, key.clone(), value.clone())
}

/// A golden vector: the record layout (and the key encoding inside) must not change
/// without a new MATERIALIZED_STATE_VERSION.
#[test]
fn a_snapshot_record_is_pinned_byte_for_byte() {
    let (vnode, key, value) = one_row();
    assert_eq!(key, [0x06, 1, 0, 0, 0, b'a', 0x02, 1, 0, 0, 0, 0, 0, 0, 0], "(\"a\", 1)");
    assert_eq!(value, [2, 0, 0, 0, 0, 0, 0, 0], "weight 2");
    assert_eq!(vnode, sluice_types::vnode::of_hash(sluice_types::key::hash(&key), VNODES));
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    thread.operator.restore_state(&mut MemoryState::new(vec![(vnode, key, value)])).expect("restore");
    thread.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(read(&registry, "t", &lease), pairs(&[("a", 1), ("a", 1)]));
}

#[test]
fn damaged_records_are_refused() {
    let record = one_row();
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let damaged = |change: &dyn Fn(&mut Record)| {
        let mut damaged = record.clone();
        change(&mut damaged);
        let mut thread = open(&registry, &sink, "t", 0, 1);
        let restored = thread.operator.restore_state(&mut MemoryState::new(vec![damaged]));
        restored.map_err(|error| error.code)
    };
    let corrupt = Err("state.corrupt");
    assert_eq!(damaged(&|_| {}), Ok(()), "the record as written");
    assert_eq!(damaged(&|r| r.2.truncate(7)), corrupt, "a truncated weight");
    assert_eq!(damaged(&|r| r.2.push(0)), corrupt, "trailing bytes");
    assert_eq!(damaged(&|r| r.2 = 0i64.to_le_bytes().to_vec()), corrupt, "weight 0");
    assert_eq!(damaged(&|r| r.0 = (r.0 + 1) % VNODES), corrupt, "under another vnode than its row's");
    let retyped = |r: &mut Record| {
        // The integer column written as a string, under the row's own vnode.
        r.1[6] = 0x06;
        r.0 = sluice_types::vnode::of_hash(sluice_types::key::hash(&r.1), VNODES);
    };
    assert_eq!(damaged(&retyped), corrupt, "a row of another table");
    let truncated = |r: &mut Record| {
        r.1.truncate(10);
        r.0 = sluice_types::vnode::of_hash(sluice_types::key::hash(&r.1), VNODES);
    };
    assert_eq!(damaged(&truncated), corrupt, "a truncated row");
}

/// Any bytes, and any damage to a valid record, restore to an error or to rows, never
/// a panic (a generator stands in for proptest, which the engine's tests lack).
#[test]
fn arbitrary_records_never_panic() {
    let record = one_row();
    let mut random = Random(7);
    for _ in 0..2_000 {
        let mut damaged = record.clone();
        for _ in 0..1 + random.below(3) {
            let field = if random.below(3) == 0 { &mut damaged.2 } else { &mut damaged.1 };
            let at = random.below(field.len() as u64) as usize;
            field[at] = random.below(256) as u8;
        }
        if random.below(2) == 0 {
            damaged.0 = sluice_types::vnode::of_hash(sluice_types::key::hash(&damaged.1), VNODES);
        }
        // A fresh table each time: a restore is the slice's first state.
        let registry = registry(&["t"], 1);
        let mut thread = open(&registry, &registry.sink("t").expect("sink"), "t", 0, 1);
        let _ = thread.operator.restore_state(&mut MemoryState::new(vec![damaged]));
    }
}

/// Two processes, one epoch: each leases its newest committed epoch, both read at the
/// newest of those; the one behind waits for it, and has not folded past its own.
#[test]
fn a_lease_reads_a_later_epoch_once_committed() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    for epoch in 1..=3 {
        thread.write(&batch(&[("a", epoch, 1)])).expect("write");
        thread.pre_commit(Epoch(epoch as u64)).expect("seal");
        sink.commit(Epoch(epoch as u64), &[]).expect("commit");
    }
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 3);
    let table = registry.table("t").expect("table");
    thread.write(&batch(&[("a", 4, 1)])).expect("write");
    thread.pre_commit(Epoch(4)).expect("seal");
    // Epoch 4 is sealed, not committed: bounded wait, then a typed error.
    let error = registry.read_at(table, &lease, 4, Duration::from_millis(10), 10).expect_err("not committed");
    assert_eq!(error.code, "query.epoch_not_committed");
    let reading = {
        let registry = Arc::clone(&registry);
        let lease = Arc::clone(&lease);
        std::thread::spawn(move || {
            let table = registry.table("t").expect("table");
            registry
                .read_at(table, &lease, 4, LONG, 10)
                .map(|batches| batches.iter().map(|b| b.num_rows()).sum::<usize>())
        })
    };
    sink.commit(Epoch(4), &[]).expect("commit");
    assert_eq!(reading.join().expect("thread").expect("read"), 4usize);
    // Older than the lease: refused (it may be folded).
    assert_eq!(registry.read_at(table, &lease, 2, Duration::ZERO, 10).expect_err("older").code, "query.epoch");
    assert_eq!(read(&registry, "t", &lease).len(), 3, "the lease's own epoch is still kept");
}

/// Worker B's side of a cluster's query, reached in-process: leases and slices as its
/// admin API serves them. `catch_up` commits an epoch on B before its first slice (B
/// behind the receiver, as after a slower commit).
struct InProcess {
    registry: Arc<Materialized>,
    leases: std::sync::Mutex<Vec<Arc<super::Lease>>>,
    catch_up: Option<(Arc<dyn SinkFactory>, u64)>,
    unreachable: bool,
}

impl crate::query::Gather for InProcess {
    fn lease(
        &self,
        peer: &crate::query::Peer,
        _: std::time::Instant,
    ) -> Result<crate::query::RemoteLease, SluiceError> {
        if self.unreachable {
            return Err(SluiceError::external("query.worker_unreachable", format!("{peer} cannot be reached")));
        }
        let lease = self.registry.lease(Duration::ZERO, LONG).expect("B committed");
        let mut leases = self.leases.lock().expect("lock");
        leases.push(Arc::clone(&lease));
        Ok(crate::query::RemoteLease { id: leases.len() as u64 - 1, epoch: lease.epoch })
    }

    fn slice(
        &self,
        _: &crate::query::Peer,
        lease: crate::query::RemoteLease,
        table: &super::Table,
        epoch: u64,
        _: std::time::Instant,
        _: usize,
    ) -> Result<Vec<RecordBatch>, SluiceError> {
        if let Some((sink, epoch)) = &self.catch_up {
            sink.commit(Epoch(*epoch), &[])?;
        }
        let lease = Arc::clone(&self.leases.lock().expect("lock")[lease.id as usize]);
        Ok(lease.read_slice(&table.name, epoch, Duration::ZERO)?.1)
    }

    fn release(&self, _: &crate::query::Peer, lease: crate::query::RemoteLease) {
        self.leases.lock().expect("lock")[lease.id as usize].release();
    }
}

/// A cluster's query on worker A: every worker's slice, read at the newest of their
/// leased epochs (A's 3, B's 2: B is read at 3), and B's lease released after.
#[test]
fn a_query_gathers_every_workers_slice_at_one_epoch() {
    // Two workers of one thread each: slot 0 on A, slot 1 on B.
    let (a, b) = (registry(&["t"], 2), registry(&["t"], 2));
    let (a_sink, b_sink) = (a.sink("t").expect("sink"), b.sink("t").expect("sink"));
    let mut on_a = open(&a, &a_sink, "t", 0, 2);
    let mut on_b = open(&b, &b_sink, "t", 1, 2);
    for epoch in 1..=3u64 {
        on_a.write(&batch(&[("a", epoch as i64, 1)])).expect("write");
        on_b.write(&batch(&[("b", epoch as i64, 1)])).expect("write");
        on_a.pre_commit(Epoch(epoch)).expect("seal");
        on_b.pre_commit(Epoch(epoch)).expect("seal");
        a_sink.commit(Epoch(epoch), &[]).expect("commit");
        if epoch < 3 {
            b_sink.commit(Epoch(epoch), &[]).expect("commit");
        }
    }
    let peers = vec![crate::query::Peer { id: 1, admin_addr: "b:1".into() }];
    let gather = InProcess {
        registry: Arc::clone(&b),
        leases: std::sync::Mutex::new(Vec::new()),
        catch_up: Some((Arc::clone(&b_sink), 3)),
        unreachable: false,
    };
    let sql = "SELECT k, COUNT(*) AS n, MAX(v) AS newest FROM t GROUP BY k ORDER BY k";
    let limits = crate::query::QueryLimits::default();
    let prepared = crate::query::prepare(&a, sql, limits).expect("prepared").with_peers(peers.clone());
    let answer = prepared.run_gathering(Some(&gather)).expect("answer");
    assert_eq!(answer.epoch, Some(3));
    let text = String::from_utf8(answer.encode(crate::query::QueryFormat::Csv).expect("csv")).expect("utf-8");
    assert_eq!(text, "k,n,newest\na,3,3\nb,3,3\n", "both slices, both at epoch 3");
    assert_eq!((a.leases(), b.leases()), (0, 0), "every lease ends with the query");

    // Without a way to reach B, or with B unreachable: an error, never A's slice alone.
    let alone = crate::query::prepare(&a, sql, limits).expect("prepared").with_peers(peers.clone());
    assert_eq!(alone.run().expect_err("no gather").code, "query.gather");
    let gone = InProcess { unreachable: true, catch_up: None, ..gather };
    let error = crate::query::prepare(&a, sql, limits)
        .expect("prepared")
        .with_peers(peers)
        .run_gathering(Some(&gone))
        .expect_err("unreachable");
    assert_eq!(error.code, "query.worker_unreachable");
    assert!(error.message.contains("worker 1 (admin API at b:1)"), "{error}");
}

#[test]
fn a_query_nested_too_deep_or_answering_too_many_bytes_is_refused() {
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open(&registry, &sink, "t", 0, 1);
    let rows: Vec<(&str, i64, i64)> = (0..300).map(|i| ("k", i, 1)).collect();
    thread.write(&batch(&rows)).expect("write");
    thread.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    let limits = crate::query::QueryLimits::default();
    // Deeper than a view may be: refused before DataFusion plans it (which would
    // overflow the planner's stack, and did the admin API's thread's).
    let deep = format!("SELECT {} FROM t", vec!["v"; 1000].join(" + "));
    let error = crate::query::prepare(&registry, &deep, limits).expect_err("too deep");
    assert_eq!(error.code, "sql.too_deep", "{error}");
    // 300 rows of 1 MB each: past the answer's bound, refused instead of sent.
    let large = "SELECT repeat('x', 1000000) AS s FROM t";
    let error = crate::query::prepare(&registry, large, limits).expect("prepared").run().expect_err("too large");
    assert_eq!(error.code, "query.answer_too_large", "{error}");
    assert_eq!(registry.leases(), 0, "the lease ended with the query");
}

mod streamed;

/// `explain` says that a materialized table's rows spill beyond the budget.
#[test]
fn explain_says_a_materialized_tables_rows_spill() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("write");
    let text = "[pipeline]\nname = \"m\"\n\n[checkpoint]\ninterval = \"1h\"\nstore = \"file://./state\"\n\n\
                [[source]]\nname = \"events\"\nconnector = \"file\"\nformat = \"json\"\nschema = \"k VARCHAR, v BIGINT\"\n\
                [source.options]\npath = \"events.jsonl\"\n\n\
                [[view]]\nname = \"kept\"\nsql = \"SELECT k, v FROM events\"\nmaterialized = true\n\n\
                [[sink]]\nname = \"out\"\nfrom = \"events\"\nconnector = \"blackhole\"\n";
    let pipeline =
        crate::Engine::default().parse(text, "m.toml", dir.path(), crate::load::Overrides::default()).expect("valid");
    let compiled = pipeline.compile(None).expect("compiles");
    let lines: Vec<String> = compiled
        .plan
        .flows
        .iter()
        .flat_map(|flow| flow.segments.iter().flat_map(|s| s.operators.iter().map(|(line, _)| line.clone())))
        .collect();
    let kept = "materialize: keep the rows of `kept` per checkpoint (rows spill to disk beyond state_memory_mib)";
    assert!(lines.iter().any(|line| line == kept), "{lines:#?}");
}

/// Keys sorted by their 16-byte prefix, then whole (as a barrier sorts its open delta),
/// are in their bytes' order: short keys, keys that are prefixes of others and zero
/// bytes included.
#[test]
fn the_prefix_order_is_the_byte_order() {
    let mut random = Random(7);
    let keys: Vec<Vec<u8>> = (0..4000)
        .map(|_| {
            let length = random.below(24);
            (0..length).map(|_| [0u8, 1, 255][random.below(3) as usize]).collect()
        })
        .collect();
    let mut by_prefix = keys.clone();
    by_prefix.sort_by(|a, b| super::prefix(a).cmp(&super::prefix(b)).then_with(|| a.cmp(b)));
    let mut by_bytes = keys;
    by_bytes.sort();
    assert_eq!(by_prefix, by_bytes);
}

/// A spill that cannot write its run (the state directory gone) fails the operator with
/// the directory and the fix, and the committed epoch still reads in full: the slice
/// keeps its base and its store.
#[test]
fn a_spill_that_cannot_write_names_the_directory_and_loses_nothing_committed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("a state directory");
    let space = SpillSpace::new(state.clone(), 0);
    let registry = registry(&["t"], 1);
    let sink = registry.sink("t").expect("sink");
    let mut thread = open_in(&registry, &sink, "t", 0, 1, Some(Arc::clone(&space)));
    thread.write(&batch(&[("a", 1, 1), ("b", 2, 2)])).expect("nothing to spill yet");
    thread.checkpoint(Epoch(1), false);
    sink.commit(Epoch(1), &[]).expect("commit");
    std::fs::remove_dir(&state).expect("the directory goes");
    let error = thread.write(&batch(&[("c", 3, 1)])).expect_err("the spill cannot write");
    assert_eq!(error.code, "state.spill", "{error:?}");
    assert!(error.message.contains(&state.display().to_string()), "{error:?}");
    assert!(error.message.contains("materialized table `t`"), "{error:?}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("state_dir")), "{error:?}");
    let lease = registry.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(read(&registry, "t", &lease), pairs(&[("a", 1), ("b", 2), ("b", 2)]));
    // Once the directory is back, the next batch spills.
    std::fs::create_dir(&state).expect("the directory again");
    thread.write(&batch(&[("d", 4, 1)])).expect("a spill");
    assert!(space.spilled() > 0);
    assert_eq!(read(&registry, "t", &lease), pairs(&[("a", 1), ("b", 2), ("b", 2)]));
}
