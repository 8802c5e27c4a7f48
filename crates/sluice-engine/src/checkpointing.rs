//! Checkpoints of a job: the store-backed [`Checkpointer`], and recovery (load the newest
//! valid manifest, check that it belongs to this plan, resolve the sinks' staged work,
//! rebuild the runtime's restore).
//!
//! Mapping between the runtime's slices and the manifest (through each worker's
//! [`part::Part`]: every worker writes its own state objects, the leader publishes):
//! - lane positions → `sources[i].lanes[lane]` (source order of the pipeline file);
//! - operator state → runs (`runs`): each instance's snapshot a run object
//!   `state/epoch-{e}/{operator}/run-{start}-{end}` of the vnodes `start..end` its thread
//!   owns (a compaction's `…/merged-{start}-{end}-{n}`; vnode ranges of workers never
//!   overlap, so names never collide), and the manifest's `operators[i].runs` every run
//!   each instance's state is made of, whatever epoch wrote it;
//! - sink records → `sinks[flow].records`, each prefixed with its epoch (8 bytes,
//!   little-endian; a manifest may carry records of earlier epochs whose own checkpoint
//!   failed) and the id of the worker that staged it (4 bytes, little-endian): the
//!   encoding `sink_record` version 2 in the manifest's encodings (version 1 had no
//!   worker). A prefixed record longer than [`INLINE_RECORD_BYTES_MAX`] (an exactly-once
//!   Kafka sink's record carries its epoch's messages) is written by the worker that
//!   staged it as a state object, `sinks/flow-{F}/worker-{W}/epoch-{E}-{I}` of the
//!   checkpoint's epoch (`E` the record's epoch, `I` its index among the worker's
//!   records), which the manifest names instead (`SinkRecord::Stored`): manifests and
//!   the parts workers send stay small, and the object is kept, verified and collected
//!   with the manifest like any state object.
//!
//! Recovery in a cluster: every worker restores the state of the vnodes its slots own
//! and the positions of its lanes, and commits the records it staged (the leader also
//! those of workers that are no longer members: after a restore onto fewer workers, a
//! file sink's staged files must then be reachable from the leader, a shared
//! directory). A worker with a writer of a sink discards that sink's later staged work.
//! Every worker recovers before its links open, so before any worker's drivers run.

mod part;
mod runs;
#[cfg(test)]
mod tests;

pub(crate) use part::Part;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use runs::{RunBook, StoreState};
use sluice_checkpoint::{
    CheckpointStore, Holder, Lease, Manifest, OperatorState, SinkRecord, SinkRecords, SourcePositions,
};
use sluice_config::{CheckpointSection, Guarantee};
use sluice_runtime::checkpoint::{CheckpointOptions, Checkpointer, ManifestSlice, Restore, commit_in_order};
use sluice_runtime::{Checkpointing, Plan, SinkParallelism};
use sluice_types::vnode::{self, SlotLayout};
use sluice_types::{Epoch, SluiceError};

use crate::compile::CompiledPipeline;
use crate::fingerprint::{FINGERPRINT_VERSION, Fingerprint};

/// The versions of the encodings checkpointed state depends on, recorded in every
/// manifest: a restore refuses state written with any other version.
pub(crate) fn encodings() -> BTreeMap<String, u32> {
    [
        ("fingerprint", FINGERPRINT_VERSION),
        ("key", sluice_types::key::KEY_ENCODING_VERSION),
        ("key_hash", sluice_types::key::KEY_HASH_VERSION),
        ("window_state", sluice_operators::aggregate::WINDOW_STATE_VERSION),
        ("sink_record", SINK_RECORD_VERSION),
        ("group_state", sluice_operators::aggregate::GROUP_STATE_VERSION),
        ("topn_state", sluice_operators::topn::TOPN_STATE_VERSION),
        ("session_state", sluice_operators::aggregate::SESSION_STATE_VERSION),
        ("join_state", sluice_operators::join::JOIN_STATE_VERSION),
        ("over_state", sluice_operators::over::OVER_STATE_VERSION),
        ("normalize_state", sluice_operators::normalize::NORMALIZE_STATE_VERSION),
        ("materialized_state", crate::materialize::state::MATERIALIZED_STATE_VERSION),
        ("state_run", sluice_state::RUN_FORMAT_VERSION),
    ]
    .into_iter()
    .map(|(name, version)| (name.to_string(), version))
    .collect()
}

/// How a manifest's sink records are prefixed (see the module doc).
pub(crate) const SINK_RECORD_VERSION: u32 = 2;
/// The longest prefixed sink record a manifest carries itself; longer ones are stored
/// in objects (see the module doc).
pub(crate) const INLINE_RECORD_BYTES_MAX: usize = 4 << 10;

/// A sink record as the manifest carries it: prefixed with its epoch and worker.
fn prefixed(epoch: u64, worker: u32, record: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12 + record.len());
    bytes.extend_from_slice(&epoch.to_le_bytes());
    bytes.extend_from_slice(&worker.to_le_bytes());
    bytes.extend_from_slice(record);
    bytes
}

/// Writes checkpoints into a store.
struct StoreCheckpointer {
    /// This worker's id (0 alone).
    worker: u32,
    store: Arc<CheckpointStore>,
    fingerprint: Fingerprint,
    vnodes: u32,
    lane_threads: u32,
    retain: usize,
    /// Each source's name, lane count and layout.
    sources: Vec<(String, u32, Vec<u8>)>,
    sinks: Vec<String>,
    /// Bytes of state per operator id in the last manifest published.
    published_by_operator: Vec<(String, u64)>,
    /// Bytes of the objects the last manifest published names that its epoch wrote.
    published_written_bytes: u64,
    /// This worker's runs, by operator instance.
    runs: RunBook,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Checkpointer for StoreCheckpointer {
    fn write_part(&mut self, epoch: Epoch, slice: ManifestSlice) -> Result<Vec<u8>, SluiceError> {
        let mut part = Part::new(self.worker);
        part.positions = slice.positions.into_iter().map(|p| (p.source as u32, p.lane, p.bytes)).collect();
        part.runs = self.runs.write(&self.store, epoch.0, slice.deferred)?;
        // Records too large for the manifest are objects of their own (each a pack of one).
        let mut writes = Vec::new();
        let mut records = Vec::with_capacity(slice.sink_records.len());
        for (index, record) in slice.sink_records.into_iter().enumerate() {
            let (flow, epoch) = (record.flow as u32, record.epoch);
            if record.record.len() + 12 > INLINE_RECORD_BYTES_MAX {
                let name = format!("sinks/flow-{}/worker-{}/epoch-{}-{index}", record.flow, self.worker, record.epoch);
                writes.push((name, vec![prefixed(record.epoch, self.worker, &record.record)]));
                records.push((flow, epoch, None));
            } else {
                records.push((flow, epoch, Some(SinkRecord::Inline(record.record))));
            }
        }
        let mut written = self.store.put_packs(epoch.0, writes)?.into_iter();
        for (flow, epoch, inline) in records {
            let record = match inline {
                Some(inline) => inline,
                None => {
                    let object = written.next().and_then(|objects| objects.into_iter().next());
                    SinkRecord::Stored(object.expect("one object per stored record, in the order given"))
                }
            };
            part.records.push((flow, epoch, record));
        }
        sluice_types::failpoint!("checkpoint.after_state_written");
        part.encode()
    }

    fn publish(&mut self, epoch: Epoch, parts: Vec<Vec<u8>>, final_epoch: bool) -> Result<u64, SluiceError> {
        let mut manifest = Manifest::new(epoch.0, self.fingerprint.to_string(), self.vnodes, now_ms());
        manifest.lane_threads = self.lane_threads;
        manifest.encodings = encodings();
        manifest.sources = self
            .sources
            .iter()
            .map(|(name, lanes, layout)| SourcePositions {
                name: name.clone(),
                layout: layout.clone(),
                lanes: vec![Vec::new(); *lanes as usize],
            })
            .collect();
        manifest.sinks =
            self.sinks.iter().map(|name| SinkRecords { name: name.clone(), records: Vec::new() }).collect();
        let mut operators: HashMap<String, OperatorState> = HashMap::new();
        let mut state_bytes = 0;
        for bytes in &parts {
            let part = Part::decode(bytes)?;
            self.add_part(&mut manifest, &mut operators, part, &mut state_bytes)?;
        }
        for (source, positions) in manifest.sources.iter().enumerate() {
            if let Some(lane) = positions.lanes.iter().position(Vec::is_empty) {
                return Err(SluiceError::internal(
                    "checkpoint.position",
                    format!("checkpoint {} has no position for lane {lane} of source {source}", epoch.0),
                ));
            }
        }
        let mut operators: Vec<OperatorState> = operators.into_values().collect();
        operators.sort_by(|a, b| a.id.cmp(&b.id));
        let by_operator = operators
            .iter()
            .map(|o| {
                let mut paths = std::collections::BTreeSet::new();
                (
                    o.id.clone(),
                    o.runs.iter().filter(|run| paths.insert(&run.object.path)).map(|run| run.object.size).sum(),
                )
            })
            .collect();
        manifest.operators = operators;
        self.store.publish(&manifest)?;
        self.published_by_operator = by_operator;
        let new = format!("state/epoch-{}/", epoch.0);
        let written = manifest.distinct_objects().into_iter().filter(|object| object.path.starts_with(&new));
        self.published_written_bytes = written.map(|object| object.size).sum();
        if let Err(error) = self.store.collect_garbage(self.retain) {
            tracing::warn!(%error, "old checkpoints could not be deleted; the next checkpoint tries again");
        }
        if final_epoch {
            tracing::info!(epoch = epoch.0, "final checkpoint published");
        }
        Ok(state_bytes)
    }

    fn published_by_operator(&self) -> Vec<(String, u64)> {
        self.published_by_operator.clone()
    }

    fn published_written_bytes(&self) -> u64 {
        self.published_written_bytes
    }
}

impl StoreCheckpointer {
    /// Adds one worker's part to the manifest being built (every index checked: a part
    /// crossed the network).
    fn add_part(
        &self,
        manifest: &mut Manifest,
        operators: &mut HashMap<String, OperatorState>,
        part: Part,
        state_bytes: &mut u64,
    ) -> Result<(), SluiceError> {
        let worker = part.worker;
        let out_of_range = |what: String| {
            SluiceError::internal("checkpoint.part", format!("worker {worker}'s manifest part names {what}"))
                .with_fix("run the same sluice build and pipeline.toml on every worker")
        };
        for (source, lane, position) in part.positions {
            let lanes = manifest.sources.get_mut(source as usize).map(|s| &mut s.lanes);
            let slot = lanes.and_then(|lanes| lanes.get_mut(lane as usize));
            *slot.ok_or_else(|| out_of_range(format!("lane {lane} of source {source}")))? = position;
        }
        let mut counted = std::collections::BTreeSet::new();
        for (operator, run) in part.runs {
            if run.start >= run.end || run.end > self.vnodes {
                return Err(out_of_range(format!("vnodes {}..{} of {} vnodes", run.start, run.end, self.vnodes)));
            }
            if counted.insert(run.object.path.clone()) {
                *state_bytes += run.object.size;
            }
            let state =
                operators.entry(operator.clone()).or_insert_with(|| OperatorState { id: operator, runs: Vec::new() });
            state.runs.push(run);
        }
        for (flow, epoch, record) in part.records {
            let sink = manifest.sinks.get_mut(flow as usize).ok_or_else(|| out_of_range(format!("sink {flow}")))?;
            sink.records.push(match record {
                SinkRecord::Inline(record) => SinkRecord::Inline(prefixed(epoch, worker, &record)),
                // Written prefixed by the worker.
                stored @ SinkRecord::Stored(_) => stored,
            });
        }
        Ok(())
    }
}

/// An opened store and what recovery found in it.
pub(crate) struct Recovered {
    pub store: Arc<CheckpointStore>,
    /// This run's lease on the store, released when the run ends.
    pub lease: Lease,
    pub manifest: Option<Manifest>,
    /// What the user should read (fallbacks past damaged checkpoints, a cleared store).
    pub notices: Vec<String>,
}

/// Opens the store, takes its lease (a second run on one store is refused, naming the
/// holder) and finds the newest valid manifest.
pub(crate) fn open(
    section: &CheckpointSection,
    base: &Path,
    pipeline: &str,
    from_scratch: bool,
) -> Result<Recovered, SluiceError> {
    let store = CheckpointStore::open(&section.store, base)?;
    // A stale lease broken here is logged by the store.
    let lease = store.acquire_lease(Holder::this_process(pipeline))?;
    let mut notices = Vec::new();
    if from_scratch {
        store.clear().map_err(|e| e.context(format!("--from-scratch: cannot clear {}", section.store)))?;
        notices.push(format!("--from-scratch: cleared the checkpoint store {}", section.store));
    }
    let manifest = match store.latest_valid()? {
        Some((manifest, warnings)) => {
            notices.extend(warnings.into_iter().map(|w| format!("warning: {w}; falling back to an older checkpoint")));
            Some(manifest)
        }
        None => None,
    };
    Ok(Recovered { store: Arc::new(store), lease, manifest, notices })
}

/// Opens the store a leader holds, to load the manifest it restores (`epoch`, 0: none):
/// a follower neither takes the lease nor clears anything.
pub(crate) fn open_shared(
    section: &CheckpointSection,
    base: &Path,
    epoch: u64,
) -> Result<(Arc<CheckpointStore>, Option<Manifest>), SluiceError> {
    let store = CheckpointStore::open(&section.store, base)?;
    let manifest = match epoch {
        0 => None,
        epoch => {
            Some(store.load(epoch).map_err(|e| e.context(format!("loading checkpoint {epoch}, as the leader said")))?)
        }
    };
    Ok((Arc::new(store), manifest))
}

/// Refuses a manifest whose state was written with encodings other than this build's,
/// but for the state runs' format, of which this build reads every version
/// (`sluice_state::run`: runs written before version 3 are read as they are).
pub(crate) fn check_encodings(manifest: &Manifest, store: &str) -> Result<(), SluiceError> {
    let ours = encodings();
    let mut theirs = manifest.encodings.clone();
    if let Some(run) = theirs.get_mut("state_run").filter(|run| (1..=sluice_state::RUN_FORMAT_VERSION).contains(*run)) {
        *run = sluice_state::RUN_FORMAT_VERSION;
    }
    if theirs == ours {
        return Ok(());
    }
    let show = |map: &BTreeMap<String, u32>| {
        map.iter().map(|(name, version)| format!("{name} v{version}")).collect::<Vec<_>>().join(", ")
    };
    Err(SluiceError::user(
        "checkpoint.encodings",
        format!(
            "checkpoint {} in {store} was written with encodings [{}]; this build reads [{}]",
            manifest.epoch,
            show(&manifest.encodings),
            show(&ours)
        ),
    )
    .with_fix("run the Sluice build that wrote this state, or start over with --from-scratch (or a new store)"))
}

/// Refuses a manifest whose plan differs from this one.
pub(crate) fn check_fingerprint(manifest: &Manifest, fingerprint: Fingerprint, store: &str) -> Result<(), SluiceError> {
    if manifest.fingerprint == fingerprint.to_string() {
        return Ok(());
    }
    Err(SluiceError::user(
        "checkpoint.fingerprint",
        format!(
            "the checkpoint store {store} holds state of a different plan: checkpoint {} has topology fingerprint {}, \
             this pipeline has {fingerprint} (the sources, views, sinks or vnodes changed, or which readers of a view share its computation)",
            manifest.epoch, manifest.fingerprint
        ),
    )
    .with_fix("run with --from-scratch to discard that state, or set [checkpoint] store to a new location"))
}

/// Which worker recovers: its id and the cluster's slots (one worker of its threads
/// alone), and, on a follower, the epoch the leader numbers this run's epochs after.
pub(crate) struct Recovering<'a> {
    pub me: u32,
    pub layout: &'a SlotLayout,
    pub restored_epoch: Option<u64>,
}

/// Resolves every sink's staged work (commit the manifest's records, discard the rest)
/// and builds the runtime's restore and checkpoint options. Notes about sinks that
/// cannot stage go to `notices`.
pub(crate) fn prepare(
    section: &CheckpointSection,
    store: Arc<CheckpointStore>,
    manifest: Option<Manifest>,
    compiled: &CompiledPipeline,
    recovering: &Recovering<'_>,
    notices: &mut Vec<String>,
) -> Result<Checkpointing, SluiceError> {
    let plan = &compiled.plan;
    let vnodes = compiled.options.vnodes;
    let mine = recovering.layout.vnodes_of(recovering.me, vnodes);
    let mut restore = Restore::default();
    if let Some(manifest) = &manifest {
        restore_positions(manifest, plan, &mut restore)?;
        // Each instance reads its vnodes' blocks of the runs that serve them, when it is
        // built (`sluice_runtime::controller`), streaming.
        restore.state = Some(Arc::new(StoreState::new(Arc::clone(&store), manifest)));
    }
    let slots = recovering.layout.slots_of(recovering.me);
    let ranges: Vec<_> = slots.map(|slot| vnode::range_of(slot, vnodes, recovering.layout.slots())).collect();
    debug_assert!(ranges.iter().all(|range| range.start >= mine.start && range.end <= mine.end));
    let runs =
        RunBook::restored(compiled.state_dir.clone(), manifest.as_ref(), &ranges).compressing(section.compression);
    sluice_types::failpoint!("recovery.before_resolve");
    resolve_sinks(&store, manifest.as_ref(), plan, recovering)?;
    sluice_types::failpoint!("recovery.after_resolve");
    for flow in &plan.flows {
        if section.guarantee == Guarantee::ExactlyOnce && !flow.sink.exactly_once() {
            notices.push(format!(
                "note: sink {} ({}) cannot stage output: after a crash its rows since the last checkpoint repeat",
                flow.sink.name(),
                flow.sink.describe()
            ));
        }
    }
    // New epochs go above every published one, damaged ones included: a fallback must
    // never write a manifest under an epoch that already exists. A follower takes the
    // leader's numbers.
    let restored_epoch = match recovering.restored_epoch {
        Some(epoch) => epoch,
        None => restored_epoch(&store, manifest.as_ref())?,
    };
    let checkpointer = StoreCheckpointer {
        worker: recovering.me,
        store,
        fingerprint: compiled.fingerprint,
        vnodes,
        lane_threads: compiled.lane_threads,
        retain: section.retain as usize,
        sources: plan.sources.iter().map(|s| (s.name().to_string(), s.lanes(), s.layout())).collect(),
        sinks: plan.flows.iter().map(|f| f.sink.name().to_string()).collect(),
        published_by_operator: Vec::new(),
        published_written_bytes: 0,
        runs,
    };
    let options = CheckpointOptions {
        interval: section.interval,
        timeout: section.timeout,
        exactly_once: section.guarantee == Guarantee::ExactlyOnce,
        restored_epoch,
        max_failed: section.max_failed_checkpoints,
        checkpointer: Box::new(checkpointer),
    };
    Ok(Checkpointing { options, restore })
}

/// The epoch this run's epochs start after, on the worker that decides them.
pub(crate) fn restored_epoch(store: &CheckpointStore, manifest: Option<&Manifest>) -> Result<u64, SluiceError> {
    Ok(store.epochs()?.into_iter().max().unwrap_or(0).max(manifest.map_or(0, |m| m.epoch)))
}

fn restore_positions(manifest: &Manifest, plan: &Plan, restore: &mut Restore) -> Result<(), SluiceError> {
    for (index, source) in plan.sources.iter().enumerate() {
        let Some(positions) = manifest.sources.iter().find(|p| p.name == source.name()) else {
            return Err(SluiceError::internal(
                "checkpoint.positions",
                format!("checkpoint {} has no positions for source {}", manifest.epoch, source.name()),
            ));
        };
        if positions.lanes.len() != source.lanes() as usize {
            return Err(SluiceError::user(
                "checkpoint.lanes",
                format!(
                    "checkpoint {} has {} lane(s) for source {}, the source now has {}: its input changed",
                    manifest.epoch,
                    positions.lanes.len(),
                    source.name(),
                    source.lanes()
                ),
            )
            .with_fix("restore the input as it was, or start over with --from-scratch"));
        }
        for (lane, bytes) in positions.lanes.iter().enumerate() {
            restore.positions.insert((index, lane as u32), bytes.clone());
        }
    }
    Ok(())
}

/// The worker whose stored sink record `path` is
/// (`…/sinks/flow-{F}/worker-{W}/epoch-{E}-{I}`, as each worker's part names them);
/// None for a path of another form.
fn stored_record_worker(path: &str) -> Option<u32> {
    let (_, rest) = path.rsplit_once("/worker-")?;
    rest.split('/').next()?.parse().ok()
}

/// Commits, epoch by epoch, the staged work a manifest names that this worker staged
/// (the leader also that of workers no longer members); a worker with a writer of the
/// sink then discards anything later.
fn resolve_sinks(
    store: &CheckpointStore,
    manifest: Option<&Manifest>,
    plan: &Plan,
    recovering: &Recovering<'_>,
) -> Result<(), SluiceError> {
    let (me, workers) = (recovering.me, recovering.layout.workers());
    let commits_here = |worker: u32| worker == me || (me == 0 && worker >= workers);
    for flow in &plan.flows {
        let sink = &flow.sink;
        let mut by_epoch: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut records = Vec::new();
        if let Some(stored) = manifest.and_then(|m| m.sinks.iter().find(|s| s.name == sink.name())) {
            for record in &stored.records {
                let damaged = || {
                    SluiceError::internal("checkpoint.sink_record", format!("sink {}: a damaged record", sink.name()))
                };
                let read;
                let record = match record {
                    SinkRecord::Inline(bytes) => bytes,
                    // Another worker's stored record, which this sink would not read:
                    // left unread (see `SinkFactory::discard_reads_records`).
                    SinkRecord::Stored(object)
                        if !sink.discard_reads_records()
                            && stored_record_worker(&object.path).is_some_and(|w| !commits_here(w)) =>
                    {
                        continue;
                    }
                    SinkRecord::Stored(object) => {
                        read = store
                            .get_object(object)
                            .map_err(|e| e.context(format!("reading a record of sink {}", sink.name())))?;
                        &read
                    }
                };
                let (epoch, rest) = record.split_at_checked(8).ok_or_else(damaged)?;
                let (worker, rest) = rest.split_at_checked(4).ok_or_else(damaged)?;
                let epoch = u64::from_le_bytes(epoch.try_into().expect("8 bytes"));
                let worker = u32::from_le_bytes(worker.try_into().expect("4 bytes"));
                if commits_here(worker) {
                    by_epoch.push((epoch, rest.to_vec()));
                }
                records.push(rest.to_vec());
            }
        }
        commit_in_order(sink.as_ref(), by_epoch).map_err(|e| e.context("recovery"))?;
        let writes_here = match sink.parallelism() {
            SinkParallelism::PerThread => true,
            SinkParallelism::Single => recovering.layout.worker_of(flow.sink_slot) == me,
        };
        if writes_here {
            sink.discard_after(manifest.map(|m| Epoch(m.epoch)), &records)
                .map_err(|e| e.context(format!("sink {}", sink.name())))?;
        }
    }
    Ok(())
}
