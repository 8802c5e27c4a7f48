//! Integration of weighted rows, versions per epoch, leases, and the state that
//! checkpoints keep of it (restored onto another number of threads).

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_runtime::{Metrics, Operator, OperatorContext, SinkFactory, SinkWriter};
use sluice_types::{Batch, Epoch, SluiceError};

use super::{Integrate, Materialized, TableSpec};

const VNODES: u32 = 16;

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

    /// A barrier: the snapshot at the segment's input, the operator, the sink.
    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        let _ = self.operator.snapshot()?;
        self.operator.on_barrier(epoch, &mut Vec::new())?;
        self.writer.pre_commit(epoch)
    }

    /// Like `pre_commit`, returning the snapshot's blobs.
    fn checkpoint(&mut self, epoch: Epoch) -> Vec<(u32, Vec<u8>)> {
        let blobs = self.operator.snapshot().expect("snapshot").map_or_else(Vec::new, |job| job().expect("encode"));
        self.operator.on_barrier(epoch, &mut Vec::new()).expect("barrier");
        self.writer.pre_commit(epoch).expect("seal");
        blobs
    }
}

fn open(registry: &Arc<Materialized>, sink: &Arc<dyn SinkFactory>, name: &str, slot: u32, slots: u32) -> Thread {
    let table = Arc::clone(registry.table(name).expect("table"));
    let context = OperatorContext {
        thread: slot,
        threads: slots,
        vnodes: VNODES,
        metrics: Arc::new(Metrics::new(Vec::new(), Vec::new(), slots)),
    };
    Thread {
        operator: Integrate::new(table, &context).expect("operator"),
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
    thread.pre_commit(Epoch(1)).expect("seal");
    sink.commit(Epoch(1), &[]).expect("commit");
    // Epoch 2: a retraction, a duplicate, a row in and out again, all in the open delta.
    thread.write(&batch(&[("k0", 0, -1), ("k1", 1, 1), ("gone", 7, 1), ("gone", 7, -1)])).expect("write");
    let blobs = thread.checkpoint(Epoch(2));
    sink.commit(Epoch(2), &[]).expect("commit");
    // After the checkpoint: not in it.
    thread.write(&batch(&[("late", 9, 1)])).expect("write");
    let lease = before.lease(Duration::ZERO, LONG).expect("lease");
    assert_eq!(lease.epoch, 2);
    let want = read(&before, "t", &lease);
    assert_eq!(want.len(), 40, "39 rows and a duplicate: {want:?}");
    assert!(blobs.len() > 1, "the rows spread over several vnodes");

    let after = registry(&["t"], 3);
    let sink = after.sink("t").expect("sink");
    let mut threads: Vec<Thread> = (0..3).map(|slot| open(&after, &sink, "t", slot, 3)).collect();
    for (slot, thread) in threads.iter_mut().enumerate() {
        let owned = sluice_types::vnode::range_of(slot as u32, VNODES, 3);
        let mine = blobs.iter().filter(|(v, _)| owned.contains(v)).map(|(_, b)| b.clone()).collect();
        thread.operator.restore(mine).expect("restore");
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

/// A golden vector: the blob layout (and the key encoding inside) must not change
/// without a new MATERIALIZED_STATE_VERSION.
#[test]
fn a_snapshot_blob_is_pinned_byte_for_byte() {
    let registry = registry(&["t"], 1);
    let rows = encoded(&registry, &batch(&[("a", 1, 1), ("b", -2, 1)]));
    let mut base = super::Multiset::new();
    base.insert(rows[0].clone().into(), 2);
    let delta: super::Multiset = [(rows[1].clone().into(), -1), (rows[0].clone().into(), -1)].into_iter().collect();
    let blobs = super::state::encode(&base, &[Arc::new(delta)], 1);
    let expected: Vec<u8> = [
        &[1, 0, 0, 0][..],                                                    // version
        &[2, 0, 0, 0],                                                        // rows
        &[15, 0, 0, 0, 0x06, 1, 0, 0, 0, b'a', 0x02, 1, 0, 0, 0, 0, 0, 0, 0], // ("a", 1)
        &[1, 0, 0, 0, 0, 0, 0, 0],                                            // weight 1
        &[15, 0, 0, 0, 0x06, 1, 0, 0, 0, b'b', 0x02],                         // ("b", -2)
        &(-2i64).to_le_bytes(),
        &(-1i64).to_le_bytes(), // weight -1
    ]
    .concat();
    assert_eq!(blobs, vec![(0, expected)]);
}

#[test]
fn damaged_blobs_are_refused() {
    let registry = registry(&["t"], 1);
    let encoder = &registry.table("t").expect("table").encoder;
    let rows = encoded(&registry, &batch(&[("a", 1, 1)]));
    let mut base = super::Multiset::new();
    base.insert(rows[0].clone().into(), 1);
    let (_, good) = super::state::encode(&base, &[], 1).remove(0);
    let mut into = super::Multiset::new();
    super::state::decode(&good, encoder, &mut into).expect("a good blob");
    assert_eq!(into.len(), 1);
    let mut version = good.clone();
    version[0] = 9;
    let mut weight = good.clone();
    let at = weight.len() - 8;
    weight[at..].copy_from_slice(&0i64.to_le_bytes());
    let mut tag = good.clone();
    tag[18] = 0x06; // the integer column written as a string
    let mut count = good.clone();
    count[4] = 200;
    let trailing = [good.clone(), vec![0]].concat();
    for (what, blob) in [
        ("version", version),
        ("weight", weight),
        ("tag", tag),
        ("count", count),
        ("trailing", trailing),
        ("truncated", good[..good.len() - 1].to_vec()),
    ] {
        let error = super::state::decode(&blob, encoder, &mut super::Multiset::new()).expect_err(what);
        assert_eq!(error.code, "state.corrupt", "{what}: {error}");
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
