//! Materialized tables: the rows of sources and views marked `materialized = true`, kept
//! as they stand at each committed checkpoint, for ad-hoc queries ([`crate::query`]).
//!
//! Each materialized table ends a flow of its own: an exchange by the hash of the whole
//! row (every column, in the key encoding of `sluice_types::key`), then the [`Integrate`]
//! operator, then a hidden per-thread sink ([`MaterializeSink`]). The operator integrates
//! the weighted rows it receives into a multiset (row → weight, a row whose weight
//! reaches 0 is gone): rows since the last barrier in an open delta, handed to its
//! thread's slice at the barrier (or at the end of the input) and sealed there by the
//! sink's writer at `pre_commit(e)` as epoch `e`'s delta. Each thread's slice is a base
//! (the multiset at some epoch) and the sealed deltas after it; a delta is folded into
//! the base once its epoch is committed on every table and no lease reads an older
//! epoch. The state at epoch `e` of a slice is the base plus the deltas up to `e`,
//! readable while the base is not past `e`. The base and the deltas are sorted by the
//! rows' keys (vnode, then row: [`keyed`]), so that a query reads them merged, batch by
//! batch, without copying them ([`read`]).
//!
//! Memory: with a state directory (every compiled job has one), a slice counts its base
//! and deltas, and its operator its open delta, in the worker's state memory budget
//! (`[pipeline] state_memory_mib`, shared with every operator that spills). Beyond the
//! budget, the operator (at its next batch, or, its input idle, its next barrier)
//! writes its slice's base in memory and its deltas committed on every table as a run in the state directory ([`Integrate::spill`], through
//! `sluice_operators::SpilledRecords`): each row with its weight then, the older runs'
//! weight (found by their bloom filters and block indexes) plus the base's and the
//! deltas'; the base then starts empty, its weights added to the runs'. The runs are merged as the operators' evicted state is, but on a
//! thread of their own ([`Integrate::start_merge`]), and a read or a
//! snapshot merges them block by block with the parts in memory. A slice that will spill
//! at its next batch leaves its committed deltas for the run rather than folding them
//! into the base in memory first ([`Slice::fold`]). The deltas waiting for their commit
//! and the open delta stay in memory: they hold the rows since the last committed
//! checkpoint, which a run (committed rows) cannot take. Beyond half the budget
//! ([`Pending`]) they hold the job's sources back, and start the next checkpoint at
//! once, until a commit brings them under it (`sluice_runtime::StopHandle::hold_sources`):
//! the input waits for the checkpoint instead of memory growing with its duration.
//!
//! Checkpoints: equal rows always reach the same thread (the exchange places a row by
//! its hash's vnode), so the operator's state at a barrier is a record per distinct row
//! under its vnode ([`state`]): every row, or (a delta) the rows received since the
//! previous snapshot, with their weight now; a restore, on any number of threads, gives
//! each thread the rows of its vnodes as its slice's base. A restored job's tables
//! become readable at the first checkpoint committed after the restore (the restored
//! rows plus what came since), exactly as a job that never stopped would have them at
//! that checkpoint.
//!
//! Consistency: barriers are aligned (materialization requires exactly-once
//! checkpoints, see `sluice-config`), so at barrier `e` every writer of every table has
//! received exactly the rows that the input up to checkpoint `e`'s positions produce.
//! A query reads every table at one epoch committed on all of them.
//!
//! Leases: a query takes a [`Lease`] on the newest epoch committed on every table; while
//! it lives, no slice folds past that epoch. It ends when released (the query ended, its
//! HTTP client went away) or at its deadline; an expired lease no longer holds anything
//! back, and a read that comes too late fails rather than answering from another epoch.
//! Under the lease a query pins each table at the epoch ([`Materialized::pin`], a
//! [`TableAt`]): the slices' base and deltas shared, so that no slice folds while the pin
//! lives (see [`read`]); the pin, not the lease, then keeps the epoch while the query
//! streams the rows.
//!
//! Bounds: a slice's deltas wait for folding only while a lease, a read or a snapshot
//! holds them (bounded in time by the query's deadline, or the checkpoint's encoding; a
//! base or runs that a read or a snapshot holds stay, in memory or on disk, until it
//! ends);
//! rows are encoded once, in the key encoding (so a materialized table's columns must
//! be of types a key may have: numbers, decimals, booleans, strings, binary, dates,
//! times, timestamps).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use sluice_operators::spill::SpillSpace;
use sluice_operators::{MergedRun, SpilledRecords, SpilledRuns};
use sluice_runtime::{Operator, OperatorContext, SinkFactory, SinkParallelism, SinkWriter, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Epoch, Message, SluiceError, vnode};

pub(crate) mod read;
pub(crate) mod state;

pub use read::{Rows, TableAt};

/// One row under its key ([`keyed`]: its vnode, then the row in the key encoding), and
/// its weight; sorted by the keys, as runs and checkpoints are, so that a read merges
/// the parts of a slice and resumes after the last key it took ([`read`]).
type Multiset = BTreeMap<Box<[u8]>, i64>;

/// The rows an operator receives between two barriers, consolidated: hashed, as they
/// come in any order, and sorted once when taken ([`Integrate::take_open`]). Placed by
/// the row's hash (`sluice_types::key::hash` of the row without its vnode), which the
/// operator computes anyway for the row's vnode, rather than hashed a second time.
type Open = hashbrown::HashTable<(Box<[u8]>, i64)>;

/// The hash an [`Open`] places a key by: its row's.
fn open_hash(key: &[u8]) -> u64 {
    sluice_types::key::hash(split(key).1)
}

/// The bytes a row's entry in a [`Multiset`] or [`Open`] takes besides its key, about:
/// the map's slot (key pointer, length, weight) at its usual fill, and the key's
/// allocation.
const ENTRY_BYTES: usize = 48;

/// A delta's rows, shared, and their bytes in memory (each row's key and
/// [`ENTRY_BYTES`]), counted as it is made rather than again at every barrier and commit
/// that counts the slice in the budget.
#[derive(Clone, Default)]
struct Delta {
    rows: Arc<Multiset>,
    bytes: usize,
}

impl Delta {
    /// Adds `other`'s weights to its own (copying its rows first if they are shared).
    fn integrate(&mut self, other: &Multiset) {
        let grown = integrate(Arc::make_mut(&mut self.rows), other);
        self.bytes = self.bytes.saturating_add_signed(grown);
    }
}

/// A row's key in the multisets: its vnode (u32, big-endian, so that keys sort by vnode
/// first, as the records of runs and checkpoints do), then the row.
fn keyed(vnode: u32, row: &[u8]) -> Box<[u8]> {
    let mut key = Vec::with_capacity(4 + row.len());
    key.extend_from_slice(&vnode.to_be_bytes());
    key.extend_from_slice(row);
    key.into()
}

/// A key's vnode and row.
fn split(key: &[u8]) -> (u32, &[u8]) {
    let (vnode, row) = key.split_at(4);
    (u32::from_be_bytes(vnode.try_into().expect("4 bytes")), row)
}

/// A key's first 16 bytes (zeros past its end) as a number: two keys whose prefixes
/// differ are in their prefixes' order, and a tie is broken by the whole keys.
fn prefix(key: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    let length = key.len().min(16);
    bytes[..length].copy_from_slice(&key[..length]);
    u128::from_be_bytes(bytes)
}

/// The smallest base in memory worth a run of its own: a slice spills its base beyond
/// the budget once it holds a sixteenth of the budget, so that its runs are few even
/// when other operators hold the memory.
fn spill_min(budget: usize) -> usize {
    budget / 16
}

/// Every materialized table of a job, their committed epochs and the leases on them.
pub struct Materialized {
    tables: Vec<Arc<Table>>,
    /// The rows since the last commit, of every table, in memory.
    pending: Arc<Pending>,
    /// The names of the tables and views that are not materialized, for messages.
    others: Vec<String>,
    epochs: Mutex<Epochs>,
    committed: Condvar,
}

impl std::fmt::Debug for Materialized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Materialized").field("tables", &self.names()).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Epochs {
    /// The newest committed epoch of each table.
    committed: Vec<Option<u64>>,
    /// Live leases: id → (epoch, deadline).
    leases: HashMap<u64, (u64, Instant)>,
    next_lease: u64,
}

impl Epochs {
    /// The newest epoch committed on every table.
    fn readable(&self) -> Option<u64> {
        self.committed.iter().copied().min().flatten()
    }

    /// The newest epoch a slice may fold into its base.
    fn floor(&self, now: Instant) -> Option<u64> {
        let leased = self.leases.values().filter(|(_, deadline)| *deadline > now).map(|(epoch, _)| *epoch).min();
        match (self.readable(), leased) {
            (Some(readable), Some(leased)) => Some(readable.min(leased)),
            (readable, _) => readable,
        }
    }
}

/// The rows of every table of a job that only a commit lets go of: each operator's
/// open delta, and each slice's deltas handed over or sealed but not yet committed on
/// their table. They cannot spill (a run holds committed rows), so beyond their share
/// of the state budget the sources are held back ([`sluice_runtime::StopHandle::hold_sources`],
/// which also starts the next checkpoint at once) until a commit brings them under it.
/// Past half their share they ask for a checkpoint, so that its commit comes while the
/// input goes on rather than after it stopped.
#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
}

#[derive(Default)]
struct PendingState {
    /// Their bytes in memory, about (as counted in the budget).
    bytes: usize,
    /// The most they may hold before the sources are held back (0: no limit).
    limit: usize,
    /// The run's sources (from its start).
    stop: Option<sluice_runtime::StopHandle>,
    /// Since when the sources are held back (None while they are not).
    held_since: Option<Instant>,
    /// How long they were held back before, in all.
    held_before: Duration,
    /// Whether a checkpoint was asked for since they last passed half the limit.
    asked: bool,
    /// Whether the run was told why its sources wait (once).
    told: bool,
}

impl Pending {
    /// Their share of a state budget of `budget` bytes: half, the other half for the
    /// committed rows (which spill) and every other operator's state.
    fn limit_of(budget: usize) -> usize {
        (budget / 2).max(1)
    }

    /// Counts `to` bytes where `from` were, and holds the sources back, or lets them go
    /// on, to match.
    fn change(&self, from: usize, to: usize) {
        if from == to {
            return;
        }
        let mut state = lock(&self.state);
        state.bytes = state.bytes.saturating_sub(from).saturating_add(to);
        // Past half the limit, a checkpoint now: its commit comes while the input goes
        // on, before the limit holds the input back to wait for one.
        let early = state.limit > 0 && state.bytes > state.limit / 2;
        if early != state.asked {
            state.asked = early;
            if let (true, Some(stop)) = (early, &state.stop) {
                // Its answer (the epoch) is not needed: dropped.
                let _ = stop.request_checkpoint();
            }
        }
        let held = state.limit > 0 && state.bytes > state.limit;
        if held != state.held_since.is_some() {
            if held {
                state.held_since = Some(Instant::now());
            } else if let Some(since) = state.held_since.take() {
                state.held_before += since.elapsed();
            }
            tracing::debug!(bytes = state.bytes, limit = state.limit, held, "materialized rows since the last commit");
            if held && !std::mem::replace(&mut state.told, true) {
                tracing::info!(
                    bytes = state.bytes,
                    limit = state.limit,
                    "the materialized tables' rows since the last committed checkpoint are over half of \
                     state_memory_mib: the sources wait for each checkpoint's commit (raise state_memory_mib for \
                     more throughput)"
                );
            }
            if let Some(stop) = &state.stop {
                stop.hold_sources(held);
            }
        }
    }
}

/// One materialized table: its schema and one slice per thread.
pub struct Table {
    pub name: String,
    pub schema: SchemaRef,
    index: usize,
    /// Encodes (and decodes) the whole rows.
    encoder: KeyEncoder,
    slices: Vec<Mutex<Slice>>,
    /// Rows folded or sealed since the start, for the metrics.
    rows_integrated: AtomicU64,
}

/// One thread's part of a table.
#[derive(Default)]
struct Slice {
    /// The base's rows spilled beyond the memory budget: each row's weight as of its
    /// run's writing (the newest run naming it decides).
    runs: SpilledRuns,
    /// The base in memory: weights added to the runs' (all of the base while nothing
    /// was spilled).
    base: Arc<Multiset>,
    /// The bytes of `base`, about.
    base_bytes: usize,
    /// Where the base spills, and what counts the slice's memory in the budget: set by
    /// the slice's operator when the job has a state directory; taken out while the
    /// operator writes a run.
    store: Option<SpilledRecords>,
    /// A run is being written of the base and the sealed deltas up to `floor`: they are
    /// not folded meanwhile ([`Integrate::spill`] folds them into the run).
    spilling: bool,
    /// The budget the slice counts in (with `store`, kept while `store` is taken): a
    /// slice about to spill leaves its deltas for the run rather than folding them into
    /// its base in memory first ([`Slice::fold`]).
    space: Option<Arc<SpillSpace>>,
    /// The newest epoch the slice may fold into its base, as the last fold was told.
    floor: Option<u64>,
    /// The bytes of the deltas (sealed and handed over), about, as last counted.
    delta_bytes: usize,
    /// The newest epoch folded into `base`.
    base_epoch: Option<u64>,
    /// Sealed deltas after `base_epoch`, in increasing epochs.
    sealed: VecDeque<(u64, Delta)>,
    /// The newest epoch committed on its table.
    committed: Option<u64>,
    /// The bytes of its operator's rows not handed over yet (the open delta, and the
    /// one a snapshot took), as the operator last counted them.
    own_bytes: usize,
    /// The rows since the last commit (its operator's, and every delta after
    /// `committed`, the one handed over included), shared by every slice of the job,
    /// and this slice's bytes there: counted in one step, so that rows handed over are
    /// never counted twice, nor not at all, meanwhile.
    pending: Arc<Pending>,
    pending_bytes: usize,
    /// Rows the operator handed over at a barrier (or the end of its input), sealed by
    /// the sink's next `pre_commit`, which knows the epoch.
    handed: Option<Delta>,
}

impl Slice {
    /// Folds the sealed deltas up to `floor` into the base, unless a read still holds
    /// the base: then it merges those deltas into one, folded later, so that queries
    /// running back to back, one of which holds the base at every commit, leave a slice
    /// one delta to merge in a read rather than one per epoch.
    fn fold(&mut self, floor: Option<u64>) {
        self.floor = floor.max(self.floor);
        if self.spilling || self.spills_next() {
            return;
        }
        let Some(floor) = floor else { return };
        while self.sealed.front().is_some_and(|(epoch, _)| *epoch <= floor) {
            let Some(base) = Arc::get_mut(&mut self.base) else {
                self.merge_deltas(floor);
                return;
            };
            let Some((epoch, delta)) = self.sealed.pop_front() else { return };
            let grown = integrate(base, &delta.rows);
            self.base_bytes = self.base_bytes.saturating_add_signed(grown);
            self.base_epoch = Some(epoch);
        }
    }

    /// Whether its operator's next spill check writes a run ([`Integrate::spill`]): the
    /// space is over its budget and the slice holds at least [`spill_min`] of it. The
    /// run then takes the committed deltas as they are, so folding them into the base
    /// first (a lookup per row in a map of millions) would be work thrown away.
    fn spills_next(&self) -> bool {
        self.space.as_ref().is_some_and(|space| {
            space.resident() > space.budget() && self.base_bytes + self.delta_bytes >= spill_min(space.budget())
        })
    }

    /// Its parts, up to the sealed delta of `epoch` (all with None), and then, with
    /// `handed`, the delta handed over.
    fn parts(&self, epoch: Option<u64>, handed: bool) -> read::Parts {
        let sealed = self.sealed.iter().take_while(|(e, _)| epoch.is_none_or(|epoch| *e <= epoch));
        let mut deltas: Vec<Arc<Multiset>> = sealed.map(|(_, d)| Arc::clone(&d.rows)).collect();
        if handed {
            deltas.extend(self.handed.as_ref().map(|d| Arc::clone(&d.rows)));
        }
        read::Parts { runs: self.runs.clone(), base: Arc::clone(&self.base), deltas }
    }

    /// Counts its memory in the budget (the base and every delta), and its deltas since
    /// the last commit in the [`Pending`] rows.
    fn recount(&mut self) {
        let deltas: usize = self.sealed.iter().map(|(_, d)| d.bytes).chain(self.handed.as_ref().map(|d| d.bytes)).sum();
        self.delta_bytes = deltas;
        let committed = self.committed;
        let uncommitted = self.sealed.iter().filter(|(epoch, _)| committed.is_none_or(|c| *epoch > c));
        let pending = uncommitted.map(|(_, d)| d.bytes).chain(self.handed.as_ref().map(|d| d.bytes)).sum::<usize>()
            + self.own_bytes;
        self.pending.change(self.pending_bytes, pending);
        self.pending_bytes = pending;
        let bytes = self.base_bytes + deltas;
        if let Some(store) = &mut self.store {
            store.set_entry_bytes(bytes);
        }
    }

    /// Merges the sealed deltas up to `floor` into one of the newest epoch among them:
    /// every read is at an epoch at or after the floor (its lease's), so none needs them
    /// apart. Reads that hold them keep their own.
    fn merge_deltas(&mut self, floor: u64) {
        let count = self.sealed.iter().take_while(|(epoch, _)| *epoch <= floor).count();
        if count < 2 {
            return;
        }
        let mut merged = Delta::default();
        let mut newest = 0;
        for (epoch, delta) in self.sealed.drain(..count) {
            merged.integrate(&delta.rows);
            newest = epoch;
        }
        self.sealed.push_front((newest, merged));
    }
}

/// Adds `delta`'s weights to `into`, removing rows whose weight becomes 0; returns by
/// how many bytes `into` grew (each row's key and [`ENTRY_BYTES`]).
fn integrate(into: &mut Multiset, delta: &Multiset) -> isize {
    let mut grown = 0isize;
    for (row, weight) in delta {
        let entry = (row.len() + ENTRY_BYTES) as isize;
        match into.get_mut(row) {
            Some(existing) => {
                *existing += weight;
                if *existing == 0 {
                    into.remove(row);
                    grown -= entry;
                }
            }
            None if *weight != 0 => {
                into.insert(row.clone(), *weight);
                grown += entry;
            }
            None => {}
        }
    }
    grown
}

/// A materialized table as it declares itself, before the run.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub name: String,
    pub schema: SchemaRef,
}

impl Materialized {
    /// The registry of `tables`, each with `threads` slices; `others` are the names of
    /// the tables and views that are not materialized. Fails on a column type that
    /// cannot be materialized.
    pub fn new(tables: Vec<TableSpec>, others: Vec<String>, threads: u32) -> Result<Arc<Materialized>, SluiceError> {
        let count = tables.len();
        let pending = Arc::new(Pending::default());
        let tables = tables
            .into_iter()
            .enumerate()
            .map(|(index, spec)| {
                Ok(Arc::new(Table {
                    encoder: encoder(&spec.schema)?,
                    name: spec.name,
                    schema: spec.schema,
                    index,
                    slices: (0..threads.max(1))
                        .map(|_| Mutex::new(Slice { pending: Arc::clone(&pending), ..Slice::default() }))
                        .collect(),
                    rows_integrated: AtomicU64::new(0),
                }))
            })
            .collect::<Result<_, SluiceError>>()?;
        Ok(Arc::new(Materialized {
            tables,
            pending,
            others,
            epochs: Mutex::new(Epochs { committed: vec![None; count], ..Epochs::default() }),
            committed: Condvar::new(),
        }))
    }

    /// No table materialized.
    pub fn none() -> Arc<Materialized> {
        Materialized::new(Vec::new(), Vec::new(), 1).expect("no table, no type to refuse")
    }

    /// Holds `stop`'s sources back while the rows since the last commit are over
    /// [`Pending::limit_of`] `budget` (none without a budget): set before the run starts.
    pub(crate) fn hold_with(&self, stop: &sluice_runtime::StopHandle) {
        let mut state = lock(&self.pending.state);
        state.stop = Some(stop.clone());
        state.held_since = None;
        state.asked = false;
        stop.hold_sources(false);
    }

    /// Whether the job's sources are held back now for the rows since the last commit
    /// ([`Pending`]), and for how long they were in all.
    pub fn held_back(&self) -> (bool, Duration) {
        let state = lock(&self.pending.state);
        (
            state.held_since.is_some(),
            state.held_before + state.held_since.map_or(Duration::ZERO, |since| since.elapsed()),
        )
    }

    /// Limits the rows since the last commit to their share of a state budget of
    /// `budget` bytes ([`Pending::limit_of`]).
    fn limit_pending(&self, budget: usize) {
        lock(&self.pending.state).limit = Pending::limit_of(budget);
    }

    /// The materialized tables' names, in declaration order.
    pub fn names(&self) -> Vec<&str> {
        self.tables.iter().map(|t| t.name.as_str()).collect()
    }

    /// The tables and views that are not materialized.
    pub fn others(&self) -> &[String] {
        &self.others
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The materialized table `name`.
    pub fn table(&self, name: &str) -> Option<&Arc<Table>> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The hidden sink that keeps table `name`'s rows.
    pub fn sink(self: &Arc<Materialized>, name: &str) -> Option<Arc<dyn SinkFactory>> {
        let table = Arc::clone(self.table(name)?);
        Some(Arc::new(MaterializeSink { registry: Arc::clone(self), table, name: format!("materialized:{name}") }))
    }

    /// The newest epoch committed on every table.
    pub fn readable(&self) -> Option<u64> {
        lock(&self.epochs).readable()
    }

    /// Leases live now (expired ones not counted).
    pub fn leases(&self) -> usize {
        let now = Instant::now();
        lock(&self.epochs).leases.values().filter(|(_, deadline)| *deadline > now).count()
    }

    /// Takes a lease on the newest epoch committed on every table, waiting at most
    /// `wait` for the first one; it expires after `lifetime`. None when no epoch was
    /// committed in time.
    pub fn lease(self: &Arc<Materialized>, wait: Duration, lifetime: Duration) -> Option<Arc<Lease>> {
        let deadline = Instant::now() + wait;
        let mut epochs = lock(&self.epochs);
        loop {
            if let Some(epoch) = epochs.readable() {
                let now = Instant::now();
                epochs.leases.retain(|_, (_, until)| *until > now);
                let id = epochs.next_lease;
                epochs.next_lease += 1;
                epochs.leases.insert(id, (epoch, now + lifetime));
                return Some(Arc::new(Lease { registry: Arc::clone(self), id, epoch }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            epochs = self.committed.wait_timeout(epochs, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Waits at most `wait` until `epoch` is committed on every table.
    fn wait_readable(&self, epoch: u64, wait: Duration) -> Result<(), SluiceError> {
        let deadline = Instant::now() + wait;
        let mut epochs = lock(&self.epochs);
        while epochs.readable().is_none_or(|readable| readable < epoch) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SluiceError::external(
                    "query.epoch_not_committed",
                    format!("checkpoint {epoch} was not committed here within {} ms", wait.as_millis()),
                )
                .with_fix("ask again; give the query a longer timeout"));
            }
            epochs = self.committed.wait_timeout(epochs, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        Ok(())
    }

    fn floor(&self) -> Option<u64> {
        lock(&self.epochs).floor(Instant::now())
    }

    /// Epoch `epoch` of `table` is committed.
    fn commit(&self, table: &Table, epoch: u64) {
        {
            let mut epochs = lock(&self.epochs);
            let committed = &mut epochs.committed[table.index];
            *committed = Some(committed.map_or(epoch, |c| c.max(epoch)));
        }
        self.committed.notify_all();
        let floor = self.floor();
        for slice in &table.slices {
            let mut slice = lock(slice);
            slice.committed = slice.committed.max(Some(epoch));
            slice.fold(floor);
            slice.recount();
        }
    }

    /// The rows of `table` at the lease's epoch, in batches of at most `batch_rows`.
    pub fn read(&self, table: &Arc<Table>, lease: &Lease, batch_rows: usize) -> Result<Vec<RecordBatch>, SluiceError> {
        self.read_at(table, lease, lease.epoch, Duration::ZERO, batch_rows)
    }

    /// The rows of `table` at `epoch`, collected: [`Materialized::pin`], then every
    /// batch of its rows.
    pub fn read_at(
        &self,
        table: &Arc<Table>,
        lease: &Lease,
        epoch: u64,
        wait: Duration,
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>, SluiceError> {
        self.pin(table, lease, epoch, wait)?.batches(batch_rows)
    }

    /// `table` at `epoch`, which may be newer than the lease's: the lease keeps every
    /// slice's base at or before its own epoch, so every later epoch stays readable too,
    /// once committed here (waited for at most `wait`). Several processes read one epoch
    /// this way: each leases its newest committed epoch, and all read at the newest of
    /// those, which none has folded past. The pin shares the slices' parts (no row is
    /// copied) and keeps them, whatever happens to the lease, until it is dropped.
    pub fn pin(
        &self,
        table: &Arc<Table>,
        lease: &Lease,
        epoch: u64,
        wait: Duration,
    ) -> Result<Arc<TableAt>, SluiceError> {
        if epoch < lease.epoch {
            return Err(SluiceError::internal(
                "query.epoch",
                format!("checkpoint {epoch} is older than the lease's {}: it may be folded already", lease.epoch),
            ));
        }
        self.wait_readable(epoch, wait)?;
        let mut slices = Vec::with_capacity(table.slices.len());
        for slice in &table.slices {
            let slice = lock(slice);
            if !lease.is_live() || slice.base_epoch.is_some_and(|folded| folded > epoch) {
                return Err(lease_expired(lease.epoch));
            }
            slices.push(slice.parts(Some(epoch), false));
        }
        Ok(Arc::new(TableAt { table: Arc::clone(table), epoch, slices }))
    }

    /// Rows integrated into every table so far (sealed at barriers).
    pub fn rows_integrated(&self) -> u64 {
        self.tables.iter().map(|t| t.rows_integrated.load(Ordering::Relaxed)).sum()
    }
}

/// A hold on one committed epoch of every materialized table: no slice folds past it
/// while it lives (until [`Lease::release`], its drop, or its deadline).
pub struct Lease {
    registry: Arc<Materialized>,
    id: u64,
    pub epoch: u64,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).field("epoch", &self.epoch).finish()
    }
}

impl Lease {
    /// Ends the lease (idempotent): reads through it fail from now on.
    pub fn release(&self) {
        lock(&self.registry.epochs).leases.remove(&self.id);
    }

    /// This process's slice of table `name` at `epoch` (at or after the lease's; waited
    /// for at most `wait`), for a cluster's query gathering it on another worker.
    pub fn read_slice(
        &self,
        name: &str,
        epoch: u64,
        wait: Duration,
    ) -> Result<(SchemaRef, Vec<RecordBatch>), SluiceError> {
        let table = self.registry.table(name).ok_or_else(|| {
            SluiceError::user("query.unknown_table", format!("no materialized table `{name}` on this worker"))
                .with_fix("run the same pipeline on every worker")
        })?;
        let batches = self.registry.read_at(table, self, epoch, wait, 8192)?;
        Ok((Arc::clone(&table.schema), batches))
    }

    /// Whether it still holds its epoch (not released, not expired).
    pub fn is_live(&self) -> bool {
        lock(&self.registry.epochs).leases.get(&self.id).is_some_and(|(_, deadline)| *deadline > Instant::now())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

fn lease_expired(epoch: u64) -> SluiceError {
    SluiceError::external(
        "query.lease_expired",
        format!("the lease on checkpoint {epoch} ended before every table was read (released, or past its deadline)"),
    )
    .with_fix("ask again; give the query a longer timeout if it reads much")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The encoder of a table's whole rows: every column must be of a key type.
fn encoder(schema: &SchemaRef) -> Result<KeyEncoder, SluiceError> {
    if let Some(field) = schema.fields().iter().find(|f| !sluice_types::key::is_key_type(f.data_type())) {
        return Err(SluiceError::user(
            "materialize.type",
            format!("column `{}` of type {} cannot be materialized", field.name(), field.data_type()),
        )
        .with_fix(
            "materialized columns are numbers, decimals, booleans, strings, binary, dates, times or timestamps: CAST \
             the column in a view",
        ));
    }
    KeyEncoder::new(schema.fields().iter().map(|f| f.data_type().clone()).collect())
}

/// The hidden sink of one materialized table: one writer per thread.
struct MaterializeSink {
    registry: Arc<Materialized>,
    table: Arc<Table>,
    name: String,
}

impl SinkFactory for MaterializeSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    fn open(&self, slot: u32, _slots: u32, _staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        Ok(Box::new(MaterializeWriter {
            registry: Arc::clone(&self.registry),
            table: Arc::clone(&self.table),
            slot: self.table.slot(slot)?,
        }))
    }

    fn describe(&self) -> String {
        format!("materialized table `{}` (kept for queries, beyond the state memory budget on disk)", self.table.name)
    }

    /// Staged: rows count as out when their epoch is committed, as they become readable.
    fn exactly_once(&self) -> bool {
        true
    }

    fn commit(&self, epoch: Epoch, _records: &[Vec<u8>]) -> Result<(), SluiceError> {
        self.registry.commit(&self.table, epoch.0);
        Ok(())
    }
}

/// Seals, at each `pre_commit`, the rows its thread's [`Integrate`] handed over.
struct MaterializeWriter {
    registry: Arc<Materialized>,
    table: Arc<Table>,
    slot: usize,
}

impl SinkWriter for MaterializeWriter {
    /// The rows the operator before it kept: only counted (by the runtime).
    fn write(&mut self, _batch: &Batch) -> Result<(), SluiceError> {
        Ok(())
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        let floor = self.registry.floor();
        let mut slice = lock(&self.table.slices[self.slot]);
        let delta = slice.handed.take().unwrap_or_default();
        self.table.rows_integrated.fetch_add(delta.rows.len() as u64, Ordering::Relaxed);
        slice.sealed.push_back((epoch.0, delta));
        slice.fold(floor);
        slice.recount();
        // Not empty, so that the coordinator commits it; nothing to decode.
        Ok(b"materialized".to_vec())
    }

    fn close(&mut self) -> Result<(), SluiceError> {
        Ok(())
    }
}

impl Table {
    /// The slice of thread `slot`.
    fn slot(&self, slot: u32) -> Result<usize, SluiceError> {
        if slot as usize >= self.slices.len() {
            return Err(SluiceError::internal(
                "materialize.slot",
                format!("table `{}` has {} slices, not slot {slot}", self.name, self.slices.len()),
            ));
        }
        Ok(slot as usize)
    }
}

/// The operator that keeps one thread's part of a materialized table: it integrates the
/// rows it receives (placed by the whole row's hash) into an open delta, hands it to its
/// slice at each barrier, and snapshots the slice's multiset as a record per row (see
/// the module docs). Beyond the state memory budget it spills its slice's base into runs
/// ([`Integrate::spill`]). It sends no rows on.
pub(crate) struct Integrate {
    table: Arc<Table>,
    slot: usize,
    vnodes: u32,
    /// Rows since the last barrier (and since the last snapshot, which takes them),
    /// consolidated.
    open: Open,
    /// The bytes of `open`, about.
    open_bytes: usize,
    /// The bytes of its own rows (the open delta and the one a snapshot took, until
    /// handed over) as counted in the space and in the rows since the last commit.
    counted: usize,
    /// The open delta as the last snapshot took it, handed over at its barrier.
    snapshotted: Option<Delta>,
    rows: KeyRows,
    /// A row's key, built in place.
    key: Vec<u8>,
    /// Whether the runs hold the slice as of the previous snapshot (from the first
    /// snapshot or a restore on), so that a snapshot may write the rows since.
    tracking: bool,
    /// The budget the slice counts in, and the directory its base spills to.
    space: Option<Arc<SpillSpace>>,
    /// No batch came since the previous barrier.
    idle: bool,
    /// The merge of the slice's runs under way, on a thread of its own.
    merging: Option<std::thread::JoinHandle<Result<MergedRun, SluiceError>>>,
}

impl Integrate {
    /// The operator of thread `context.thread`; with `space`, its slice counts in the
    /// space's budget and spills its base there beyond it.
    pub(crate) fn new(
        table: Arc<Table>,
        context: &OperatorContext,
        space: Option<Arc<SpillSpace>>,
    ) -> Result<Integrate, SluiceError> {
        let slot = table.slot(context.thread)?;
        if let Some(space) = &space {
            let mut slice = lock(&table.slices[slot]);
            // A slice has one store, which holds its runs: never replaced.
            if slice.store.is_none() && !slice.spilling {
                let written = sluice_operators::spill::spilled_bytes(&context.metrics);
                slice.store = Some(SpilledRecords::new(Arc::clone(space), written));
                slice.space = Some(Arc::clone(space));
                slice.recount();
            }
        }
        Ok(Integrate {
            slot,
            table,
            vnodes: context.vnodes,
            open: Open::default(),
            open_bytes: 0,
            counted: 0,
            snapshotted: None,
            rows: KeyRows::default(),
            key: Vec::new(),
            tracking: false,
            space,
            idle: false,
            merging: None,
        })
    }

    /// The open delta without its rows of weight 0, sorted: by each key's first 16
    /// bytes, held beside it, and only on a tie by the whole key, so that most
    /// comparisons read no key (the sort of millions of rows is most of the barrier's
    /// pause; BENCHMARKS.md, "Materialized tables beyond the memory budget").
    fn take_open(&mut self) -> Delta {
        let open = std::mem::take(&mut self.open);
        let bytes = std::mem::take(&mut self.open_bytes);
        let mut rows: Vec<(u128, Box<[u8]>, i64)> = open
            .into_iter()
            .filter(|(_, weight)| *weight != 0)
            .map(|(key, weight)| (prefix(&key), key, weight))
            .collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        Delta { rows: Arc::new(rows.into_iter().map(|(_, key, weight)| (key, weight)).collect()), bytes }
    }

    /// The bytes of its own rows: the open delta and the one a snapshot took.
    fn own_bytes(&self) -> usize {
        self.open_bytes + self.snapshotted.as_ref().map_or(0, |taken| taken.bytes)
    }

    /// Counts its own rows in the space, and through its slice in the rows since the
    /// last commit.
    fn count_own(&mut self) {
        let bytes = self.own_bytes();
        if let Some(space) = &self.space {
            space.charge(bytes);
            space.release(self.counted);
            let mut slice = lock(&self.table.slices[self.slot]);
            slice.own_bytes = bytes;
            slice.recount();
        }
        self.counted = bytes;
    }

    /// Gives the rows since the last barrier to the slice, for the sink to seal.
    fn hand_over(&mut self) {
        let delta = match self.snapshotted.take() {
            Some(taken) if self.open.is_empty() => taken,
            Some(mut taken) => {
                taken.integrate(&self.take_open().rows);
                taken
            }
            None => self.take_open(),
        };
        {
            let mut slice = lock(&self.table.slices[self.slot]);
            match &mut slice.handed {
                Some(handed) => handed.integrate(&delta.rows),
                None => slice.handed = Some(delta),
            }
            // Handed over, and no longer its operator's, in one count.
            if self.space.is_some() {
                slice.own_bytes = self.own_bytes();
            }
            slice.recount();
        }
        self.count_own();
    }

    /// Writes the slice's base in memory and its sealed deltas up to the floor (the
    /// newest epoch it may fold) as a run, once the space is over its budget and the
    /// base and deltas hold at least [`spill_min`] of it: each row with its weight at
    /// the floor (the runs' plus the base's and the deltas'), or a delete where that is
    /// 0. The run is written without the slice's lock (a pin or a snapshot taken
    /// meanwhile reads the parts before it; nothing is folded meanwhile), then the
    /// slice's base starts empty over the new runs, after the deltas folded into them.
    /// A base that a snapshot or a query holds, which a commit cannot fold into, is
    /// spilled all the same.
    fn spill(&mut self) -> Result<(), SluiceError> {
        let merged = self.finish_merge()?;
        // A merge falls due only when the runs changed.
        if self.spill_run()? || merged {
            self.start_merge();
        }
        Ok(())
    }

    /// Starts the merge of the slice's runs that the compaction policy asks for, on a
    /// thread of its own, unless one is under way: a merge may rewrite most of the table,
    /// and on the driver it would hold every barrier back meanwhile.
    fn start_merge(&mut self) {
        if self.merging.is_some() {
            return;
        }
        let Some(merge) = lock(&self.table.slices[self.slot]).store.as_ref().and_then(SpilledRecords::plan_merge)
        else {
            return;
        };
        match std::thread::Builder::new().name("sluice-merge".into()).spawn(move || merge.write()) {
            Ok(thread) => self.merging = Some(thread),
            // No thread to be had: the next run written tries again.
            Err(error) => tracing::debug!(%error, "no thread for a merge of a materialized table's runs"),
        }
    }

    /// Puts the merge under way in place of the runs it merged, once it is written;
    /// true when it did.
    fn finish_merge(&mut self) -> Result<bool, SluiceError> {
        if !self.merging.as_ref().is_some_and(std::thread::JoinHandle::is_finished) {
            return Ok(false);
        }
        let thread = self.merging.take().expect("a merge under way");
        let name = &self.table.name;
        let merged = thread
            .join()
            .map_err(|_| {
                SluiceError::internal(
                    "state.spill",
                    format!("the merge of materialized table `{name}`'s runs panicked"),
                )
            })?
            .map_err(|error| error.context(format!("materialized table `{name}`")))?;
        let mut slice = lock(&self.table.slices[self.slot]);
        let store =
            slice.store.as_mut().expect("a slice's store is taken only while its operator spills, on this thread");
        store.finish_merge(merged);
        slice.runs = store.runs();
        slice.recount();
        Ok(true)
    }

    /// [`Integrate::spill`]'s run; true when it wrote one.
    fn spill_run(&mut self) -> Result<bool, SluiceError> {
        let Some(space) = &self.space else { return Ok(false) };
        if space.resident() <= space.budget() {
            return Ok(false);
        }
        let (parts, folded, mut store) = {
            let mut slice = lock(&self.table.slices[self.slot]);
            let floor = slice.floor;
            let folded: Vec<u64> =
                slice.sealed.iter().map(|(epoch, _)| *epoch).take_while(|e| floor.is_some_and(|f| *e <= f)).collect();
            if (slice.base.is_empty() && folded.is_empty())
                || slice.base_bytes + slice.delta_bytes < spill_min(space.budget())
            {
                return Ok(false);
            }
            let Some(store) = slice.store.take() else { return Ok(false) };
            slice.spilling = true;
            let deltas = slice.sealed.iter().take(folded.len()).map(|(_, delta)| Arc::clone(&delta.rows)).collect();
            let parts = read::Parts { runs: slice.runs.clone(), base: Arc::clone(&slice.base), deltas };
            (parts, folded, store)
        };
        let runs = parts.runs.clone();
        let in_memory = read::Parts { runs: SpilledRuns::default(), ..parts.clone() };
        let keys = parts.base.len() + parts.deltas.iter().map(|delta| delta.len()).sum::<usize>();
        let bytes = keys * ENTRY_BYTES;
        let written = store.add_unmerged(keys, bytes, |sink| {
            let mut failed = Ok(());
            let mut record = |key: &[u8], added: i64| -> Result<(), SluiceError> {
                if added == 0 {
                    return Ok(());
                }
                let (vnode, row) = split(key);
                match read::stored_weight(&runs, key)? + added {
                    0 => sink.delete(vnode, row),
                    weight => sink.put(vnode, row, &weight.to_le_bytes()),
                }
            };
            read::Walk::default().step(&in_memory, &mut |key, added| {
                failed = record(key, added);
                failed.is_ok()
            })?;
            failed
        });
        let mut slice = lock(&self.table.slices[self.slot]);
        slice.spilling = false;
        if written.is_ok() {
            // Nothing else changes a base it does not hold alone, and this one is held;
            // nothing folds the sealed deltas while the slice spills.
            assert!(Arc::ptr_eq(&slice.base, &parts.base), "the base changed while it was spilled");
            for epoch in &folded {
                let (sealed, _) = slice.sealed.pop_front().expect("the deltas spilled are still sealed");
                assert_eq!(sealed, *epoch, "the deltas spilled are the oldest sealed");
            }
            if let Some(newest) = folded.last() {
                slice.base_epoch = Some(*newest);
            }
            slice.base = Arc::default();
            slice.base_bytes = 0;
            slice.runs = store.runs();
        }
        slice.store = Some(store);
        // Counted without what the run took before the fold asks whether to spill again.
        slice.recount();
        let floor = slice.floor;
        slice.fold(floor);
        slice.recount();
        written.map(|()| true).map_err(|error| error.context(format!("materialized table `{}`", self.table.name)))
    }
}

impl Operator for Integrate {
    fn name(&self) -> &str {
        "materialize"
    }

    /// Keeps the rows, and passes them on to the sink, which only counts them (its rows
    /// out, once their checkpoint is committed).
    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.idle = false;
        self.table.encoder.encode(batch.rows.columns(), &mut self.rows)?;
        let mut grown = 0;
        for index in 0..self.rows.len() {
            let row = self.rows.row(index);
            let weight = batch.weight(index);
            let hash = sluice_types::key::hash(row);
            self.key.clear();
            self.key.extend_from_slice(&vnode::of_hash(hash, self.vnodes).to_be_bytes());
            self.key.extend_from_slice(row);
            match self.open.find_mut(hash, |(key, _)| key[..] == self.key[..]) {
                Some((_, existing)) => *existing += weight,
                None => {
                    grown += self.key.len() + ENTRY_BYTES;
                    self.open.insert_unique(hash, (self.key.as_slice().into(), weight), |(key, _)| open_hash(key));
                }
            }
        }
        self.open_bytes += grown;
        self.count_own();
        out.push(Message::Data(batch));
        self.spill()
    }

    /// Hands the open delta over. The base grows only when a commit folds the deltas
    /// in, and the next batch spills it, outside the barrier's pause; with no batch
    /// since the previous barrier (an idle input), the barrier spills it.
    fn on_barrier(&mut self, epoch: Epoch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let idle = std::mem::replace(&mut self.idle, true);
        self.hand_over();
        out.push(Message::Barrier(epoch));
        if idle { self.spill() } else { Ok(()) }
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.hand_over();
        out.push(Message::EndOfData);
        Ok(())
    }

    /// The slice's rows as of this barrier: its runs, its base, every delta after it
    /// (sealed or handed over) and the open one, shared rather than copied; the job
    /// writes every row, or (a delta) the open one's rows, received since the previous
    /// snapshot.
    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        let open = self.take_open();
        let changed = (delta && self.tracking).then(|| Arc::clone(&open.rows));
        match &mut self.snapshotted {
            // Two snapshots without a barrier between them: keep both deltas' rows.
            Some(earlier) => earlier.integrate(&open.rows),
            None => self.snapshotted = Some(open),
        }
        self.count_own();
        let mut parts = lock(&self.table.slices[self.slot]).parts(None, true);
        parts.deltas.extend(self.snapshotted.as_ref().map(|d| Arc::clone(&d.rows)));
        self.tracking = true;
        Ok(Some(state::snapshot(parts, changed)))
    }

    /// The rows of this thread's vnodes become its slice's base, spilled as they come
    /// beyond the budget.
    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        let (table, slot) = (Arc::clone(&self.table), self.slot);
        let encoder = &table.encoder;
        state::restore(state, encoder, self.vnodes, &mut |rows| {
            {
                let mut slice = lock(&table.slices[slot]);
                let base = Arc::make_mut(&mut slice.base);
                let mut grown = 0;
                for (key, weight) in rows.drain(..) {
                    grown += key.len() + ENTRY_BYTES;
                    *base.entry(key).or_default() += weight;
                }
                slice.base_bytes += grown;
                slice.recount();
            }
            self.spill()
        })?;
        self.tracking = true;
        Ok(())
    }
}

impl Drop for Integrate {
    fn drop(&mut self) {
        // Its files are the space's: gone with the operator, not after it.
        if let Some(thread) = self.merging.take() {
            let _ = thread.join();
        }
        self.open_bytes = 0;
        self.snapshotted = None;
        self.count_own();
    }
}

/// Plans one flow per materialized table (every table of a materialized source, every
/// materialized view), each ending at the table's hidden sink, and returns their
/// registry (empty when nothing is materialized). Adds the name of the table each flow
/// reads to `reads`, for `share`.
pub(crate) fn add_flows(
    pipeline: &crate::load::Pipeline,
    sources: &[Arc<dyn sluice_runtime::SourceFactory>],
    planner: &sluice_sql::SqlPlanner,
    threads: u32,
    spill: Option<Arc<SpillSpace>>,
    flows: &mut Vec<sluice_runtime::Flow>,
    reads: &mut Vec<String>,
) -> Result<Arc<Materialized>, crate::EngineError> {
    let config = &pipeline.config;
    let mut marked = Vec::new();
    for (source, factory) in config.sources.iter().zip(sources) {
        if let Some(at) = source.materialized {
            marked.extend(factory.tables().iter().map(|table| (table.name.clone(), at)));
        }
    }
    marked.extend(config.views.iter().filter_map(|view| view.materialized.map(|at| (view.name.clone(), at))));
    if marked.is_empty() {
        return Ok(Materialized::none());
    }
    let mut streams = Vec::new();
    for (name, at) in &marked {
        let stream =
            planner.plan_stream(name, &format!("materialized:{name}")).map_err(|e| pipeline.problem(*at, e))?;
        // Checked now rather than at the first row.
        encoder(&stream.schema).map_err(|e| pipeline.problem(*at, e.context(format!("table `{name}`"))))?;
        streams.push((name.clone(), stream));
    }
    let specs =
        streams.iter().map(|(name, s)| TableSpec { name: name.clone(), schema: Arc::clone(&s.schema) }).collect();
    let others = planner.table_names().into_iter().filter(|n| !marked.iter().any(|(m, _)| m == n)).map(String::from);
    let registry = Materialized::new(specs, others.collect(), threads).map_err(crate::EngineError::new)?;
    if let Some(space) = &spill {
        registry.limit_pending(space.budget());
    }
    for (name, mut stream) in streams {
        let table = Arc::clone(registry.table(&name).expect("registered above"));
        let space = spill.clone();
        let factory: sluice_runtime::OperatorFactory = Arc::new(move |context: &OperatorContext| {
            Ok(Box::new(Integrate::new(Arc::clone(&table), context, space.clone())?) as Box<dyn Operator>)
        });
        let spills = if spill.is_some() { " (rows spill to disk beyond state_memory_mib)" } else { "" };
        let operator = (format!("materialize: keep the rows of `{name}` per checkpoint{spills}"), factory);
        planner.push_keyed_by_row(&mut stream, operator, format!("the rows of `{name}` (by the whole row)"));
        let sink = registry.sink(&name).expect("registered above");
        flows.push(stream.into_flow(sink, threads, 0));
        reads.push(name);
    }
    Ok(registry)
}

#[cfg(test)]
mod tests;
