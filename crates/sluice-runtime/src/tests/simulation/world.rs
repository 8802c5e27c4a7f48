//! What outlives a simulated process: the checkpoint store (durable objects, published
//! manifests) and the sinks' visible output (committed records). The simulation's
//! [`Checkpointer`] and [`SinkFactory`] write here, and check the protocol's invariants
//! at the moment they are called:
//!
//! - (a) a manifest is published only from one part of this epoch per worker, naming only
//!   objects already durable, every lane's position once, epochs strictly increasing;
//! - (b) a sink commits only records that a published manifest names;
//! - (c) within one run a worker commits each (sink, epoch) at most once, never above the
//!   newest published manifest; recovery re-commits only the restored manifest's records
//!   (idempotent: committing a visible record again changes nothing);
//! - (e) at the very end, the visible records cover every lane's rows exactly once.
//!
//! A broken invariant panics with its description; the seed loop turns that into a
//! report naming the seed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_types::{Epoch, SluiceError};

use crate::checkpoint::{Checkpointer, ManifestSlice};
use crate::plan::{SinkFactory, SinkParallelism, SinkWriter};

/// One sink writer's staged output: rows `start..end` of `lane`, staged for `epoch` by
/// `worker` in run `generation` (the record's bytes encode exactly this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Staged {
    pub generation: u32,
    pub worker: u32,
    pub lane: u32,
    pub epoch: u64,
    pub start: u64,
    pub end: u64,
}

impl Staged {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(36);
        for word in [self.generation, self.worker, self.lane] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for word in [self.epoch, self.start, self.end] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Staged {
        assert_eq!(bytes.len(), 36, "a sink record of the simulation is 36 bytes");
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Staged { generation: word(0), worker: word(4), lane: word(8), epoch: long(12), start: long(20), end: long(28) }
    }
}

/// A lane position's bytes: the number of rows read.
pub(super) fn position_bytes(rows: u64) -> Vec<u8> {
    rows.to_le_bytes().to_vec()
}

/// What a worker's `write_part` made durable.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub generation: u32,
    pub worker: u32,
    pub epoch: u64,
    pub objects: Vec<String>,
    /// (lane, rows read).
    pub positions: Vec<(u32, u64)>,
    pub records: Vec<Staged>,
}

/// A published manifest.
#[derive(Debug, Clone)]
pub(super) struct Manifest {
    pub epoch: u64,
    pub final_epoch: bool,
    pub parts: Vec<Part>,
}

impl Manifest {
    /// (lane, rows read) of every lane.
    pub(super) fn positions(&self) -> BTreeMap<u32, u64> {
        self.parts.iter().flat_map(|part| part.positions.iter().copied()).collect()
    }

    pub(super) fn records(&self) -> impl Iterator<Item = &Staged> {
        self.parts.iter().flat_map(|part| part.records.iter())
    }
}

/// What the next checkpoint write of a worker does (the simulation picks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteFate {
    Succeed,
    /// The store fails while writing the part (some objects may be durable already).
    FailPart,
    /// The store fails to publish the manifest.
    FailPublish,
    /// The process dies once its part is durable (before publishing, on the leader).
    CrashAfterPart,
    /// The process dies right after the manifest is published (before any commit).
    CrashAfterPublish,
}

/// The store and the sinks' output, shared by every simulated process.
#[derive(Debug, Default)]
pub(super) struct World {
    /// The run (one per start of the cluster: the first, and one per recovery).
    pub generation: u32,
    pub workers: u32,
    pub lanes: u32,
    /// Recovery is committing the restored manifest's records.
    pub recovering: bool,
    /// What each worker's write in progress does.
    pub fates: BTreeMap<u32, WriteFate>,
    /// Workers whose next sink commit fails half-way (some records visible, then an error).
    pub failing_commits: BTreeSet<u32>,
    durable: BTreeSet<String>,
    parts: Vec<Part>,
    pub manifests: Vec<Manifest>,
    /// Records some published manifest names.
    published: BTreeSet<Staged>,
    /// Visible output.
    visible: BTreeSet<Staged>,
    /// (generation, worker, flow, epoch) committed by a run (not by recovery).
    run_commits: BTreeSet<(u32, u32, usize, u64)>,
    /// Commits of a record already visible (recovery repeating one).
    pub repeated_commits: u64,
    /// The latest events, for a failing seed's report.
    pub trace: VecDeque<String>,
}

/// Events a failing seed's report shows.
const TRACE_KEPT: usize = 400;

pub(super) type Shared = Arc<Mutex<World>>;

pub(super) fn lock(world: &Shared) -> MutexGuard<'_, World> {
    // A violation panics while holding the lock; the report still reads the world.
    world.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl World {
    pub(super) fn note(&mut self, now_ms: u64, line: String) {
        if self.trace.len() == TRACE_KEPT {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{now_ms:>7} ms  run {}  {line}", self.generation));
    }

    pub(super) fn newest(&self) -> Option<&Manifest> {
        self.manifests.last()
    }

    fn fate(&self, worker: u32) -> WriteFate {
        self.fates.get(&worker).copied().unwrap_or(WriteFate::Succeed)
    }

    fn write_part(&mut self, worker: u32, epoch: Epoch, slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        let generation = self.generation;
        let mut objects = Vec::new();
        for deferred in slice.deferred {
            let mut records = sluice_state::CollectedState::default();
            (deferred.snapshot.job)(&mut records)?;
            for (vnode, _, _) in &records.points {
                objects.push(format!("g{generation}/w{worker}/e{}/{}/v{vnode}", epoch.0, deferred.operator));
            }
        }
        if self.fate(worker) == WriteFate::FailPart {
            // Half of the objects made it before the store failed.
            self.durable.extend(objects.iter().take(objects.len() / 2).cloned());
            return Err(SluiceError::external("simulation.store", "the store failed while writing a part"));
        }
        self.durable.extend(objects.iter().cloned());
        let positions = slice
            .positions
            .iter()
            .map(|p| (p.lane, u64::from_le_bytes(p.bytes.as_slice().try_into().expect("8 bytes"))))
            .collect();
        let records: Vec<Staged> = slice.sink_records.iter().map(|r| Staged::decode(&r.record)).collect();
        for (record, raw) in records.iter().zip(&slice.sink_records) {
            assert_eq!(raw.epoch, record.epoch, "a sink record's epoch is the one it was staged for");
            assert!(
                record.worker == worker && record.generation == generation,
                "worker {worker} wrote a part with a record staged elsewhere: {record:?}"
            );
            assert!(record.epoch <= epoch.0, "part {} carries a record of a later epoch: {record:?}", epoch.0);
        }
        self.parts.push(Part { generation, worker, epoch: epoch.0, objects, positions, records });
        Ok(((self.parts.len() - 1) as u64).to_le_bytes().to_vec())
    }

    fn publish(&mut self, worker: u32, epoch: Epoch, ids: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError> {
        assert_eq!(worker, 0, "only the leader publishes");
        match self.fate(worker) {
            WriteFate::FailPublish => {
                return Err(SluiceError::external("simulation.store", "the store failed to publish"));
            }
            WriteFate::CrashAfterPart => {
                return Err(SluiceError::external("simulation.crash", "the process died before publishing"));
            }
            _ => {}
        }
        let parts: Vec<Part> = ids
            .iter()
            .map(|id| {
                let index = u64::from_le_bytes(id.as_slice().try_into().expect("a part is its index"));
                self.parts[index as usize].clone()
            })
            .collect();
        self.check_manifest(epoch.0, &parts);
        let manifest = Manifest { epoch: epoch.0, final_epoch, parts };
        self.published.extend(manifest.records().copied());
        self.manifests.push(manifest);
        Ok(0)
    }

    /// Invariant (a) and the manifest's completeness.
    fn check_manifest(&self, epoch: u64, parts: &[Part]) {
        if let Some(newest) = self.newest() {
            assert!(epoch > newest.epoch, "manifest {epoch} published after manifest {}", newest.epoch);
        }
        let workers: BTreeSet<u32> = parts.iter().map(|part| part.worker).collect();
        assert!(
            workers.len() == parts.len() && workers == (0..self.workers).collect(),
            "manifest {epoch} has the parts of workers {:?}, not one of each of {} workers",
            parts.iter().map(|part| part.worker).collect::<Vec<_>>(),
            self.workers
        );
        let mut lanes = BTreeMap::new();
        for part in parts {
            assert!(
                part.epoch == epoch && part.generation == self.generation,
                "manifest {epoch} of run {} names a part of epoch {} of run {}",
                self.generation,
                part.epoch,
                part.generation
            );
            for object in &part.objects {
                assert!(self.durable.contains(object), "manifest {epoch} names {object}, which is not durable");
            }
            for &(lane, rows) in &part.positions {
                assert!(lanes.insert(lane, rows).is_none(), "manifest {epoch} has two positions of lane {lane}");
            }
        }
        assert_eq!(lanes.len() as u32, self.lanes, "manifest {epoch} has positions of lanes {:?} only", lanes.keys());
    }

    /// Invariants (b) and (c) at a sink's commit.
    fn commit(&mut self, worker: u32, flow: usize, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        let newest = self.newest().map_or(0, |m| m.epoch);
        assert!(epoch.0 <= newest, "worker {worker} commits epoch {} above the newest manifest {newest}", epoch.0);
        if !self.recovering {
            let first = self.run_commits.insert((self.generation, worker, flow, epoch.0));
            assert!(first, "worker {worker} commits epoch {} of sink {flow} twice in run {}", epoch.0, self.generation);
        }
        let fails_after = self.failing_commits.remove(&worker).then_some(records.len() / 2);
        for (index, raw) in records.iter().enumerate() {
            if fails_after == Some(index) {
                return Err(SluiceError::external("simulation.sink", "the sink failed while committing"));
            }
            let record = Staged::decode(raw);
            assert!(
                record.epoch == epoch.0 && record.worker == worker,
                "worker {worker} commits epoch {} with the record {record:?}",
                epoch.0
            );
            assert!(self.published.contains(&record), "worker {worker} commits {record:?}, which no manifest names");
            if !self.visible.insert(record) {
                assert!(self.recovering, "run {} commits {record:?} a second time", self.generation);
                self.repeated_commits += 1;
            }
        }
        Ok(())
    }

    /// Invariant (e): the visible records hold every row of every lane exactly once.
    pub(super) fn check_exactly_once(&self, totals: &[u64]) {
        for (lane, &total) in totals.iter().enumerate() {
            let mut ranges: Vec<(u64, u64)> = self
                .visible
                .iter()
                .filter(|r| r.lane == lane as u32 && r.start < r.end)
                .map(|r| (r.start, r.end))
                .collect();
            ranges.sort_unstable();
            let mut next = 0;
            for (start, end) in &ranges {
                assert!(*start == next, "lane {lane}: rows {next}..{start} missing or repeated, visible: {ranges:?}");
                next = *end;
            }
            assert_eq!(next, total, "lane {lane}: visible rows end at {next} of {total}: {ranges:?}");
        }
    }
}

/// A worker's checkpointer: writes into the shared store.
pub(super) struct SimCheckpointer {
    pub worker: u32,
    pub world: Shared,
}

impl Checkpointer for SimCheckpointer {
    fn write_part(&mut self, epoch: Epoch, slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        lock(&self.world).write_part(self.worker, epoch, slice)
    }

    fn publish(&mut self, epoch: Epoch, parts: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError> {
        lock(&self.world).publish(self.worker, epoch, parts, final_epoch)
    }
}

/// A worker's sink: commits make staged records visible in the shared world. Its
/// writers are simulated by the drivers (never opened).
pub(super) struct SimSink {
    pub worker: u32,
    pub world: Shared,
}

impl SinkFactory for SimSink {
    fn name(&self) -> &str {
        "simulated"
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    fn open(&self, _slot: u32, _slots: u32, _staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        unreachable!("the simulation's drivers stage records themselves")
    }

    fn describe(&self) -> String {
        "the simulation's sink".into()
    }

    fn exactly_once(&self) -> bool {
        true
    }

    fn commit(&self, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        lock(&self.world).commit(self.worker, 0, epoch, records)
    }
}
