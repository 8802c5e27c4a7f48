//! Checkpoints of a job: the store-backed [`Checkpointer`], and recovery (load the newest
//! valid manifest, check that it belongs to this plan, resolve the sinks' staged work,
//! rebuild the runtime's restore).
//!
//! Mapping between the runtime's slices and the manifest:
//! - lane positions → `sources[i].lanes[lane]` (source order of the pipeline file);
//! - state blobs → one object per (operator, vnode) under `state/epoch-{e}/`;
//! - sink records → `sinks[flow].records`, each prefixed with its epoch (8 bytes,
//!   little-endian), since a manifest may carry records of earlier epochs whose own
//!   checkpoint failed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_checkpoint::{CheckpointStore, Holder, Lease, Manifest, OperatorState, SinkRecords, SourcePositions};
use sluice_config::{CheckpointSection, Guarantee};
use sluice_runtime::checkpoint::{CheckpointOptions, Checkpointer, ManifestSlice, Restore, commit_in_order};
use sluice_runtime::{Checkpointing, Plan};
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
        ("group_state", sluice_operators::aggregate::GROUP_STATE_VERSION),
        ("topn_state", sluice_operators::topn::TOPN_STATE_VERSION),
    ]
    .into_iter()
    .map(|(name, version)| (name.to_string(), version))
    .collect()
}

/// Writes checkpoints into a store.
struct StoreCheckpointer {
    store: Arc<CheckpointStore>,
    fingerprint: Fingerprint,
    vnodes: u32,
    lane_threads: u32,
    retain: usize,
    /// Each source's name, lane count and layout.
    sources: Vec<(String, u32, Vec<u8>)>,
    sinks: Vec<String>,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Checkpointer for StoreCheckpointer {
    fn checkpoint(&mut self, epoch: Epoch, slice: ManifestSlice, final_epoch: bool) -> Result<(), SluiceError> {
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
        for position in slice.positions {
            manifest.sources[position.source].lanes[position.lane as usize] = position.bytes;
        }
        for (source, positions) in manifest.sources.iter().enumerate() {
            if let Some(lane) = positions.lanes.iter().position(Vec::is_empty) {
                return Err(SluiceError::internal(
                    "checkpoint.position",
                    format!("checkpoint {} has no position for lane {lane} of source {source}", epoch.0),
                ));
            }
        }
        manifest.operators = self.write_states(epoch, slice.states)?;
        sluice_types::failpoint!("checkpoint.after_state_written");
        manifest.sinks =
            self.sinks.iter().map(|name| SinkRecords { name: name.clone(), records: Vec::new() }).collect();
        for sink_record in slice.sink_records {
            let mut bytes = sink_record.epoch.to_le_bytes().to_vec();
            bytes.extend_from_slice(&sink_record.record);
            manifest.sinks[sink_record.flow].records.push(bytes);
        }
        self.store.publish(&manifest)?;
        if let Err(error) = self.store.collect_garbage(self.retain) {
            tracing::warn!(%error, "old checkpoints could not be deleted; the next checkpoint tries again");
        }
        if final_epoch {
            tracing::info!(epoch = epoch.0, "final checkpoint published");
        }
        Ok(())
    }
}

impl StoreCheckpointer {
    /// Writes every state blob as an object; returns the operators' entries, sorted.
    fn write_states(
        &self,
        epoch: Epoch,
        states: Vec<sluice_runtime::checkpoint::StateBlob>,
    ) -> Result<Vec<OperatorState>, SluiceError> {
        let mut operators: HashMap<String, OperatorState> = HashMap::new();
        for blob in states {
            let name = format!("{}/vnode-{}", blob.operator, blob.vnode);
            let object = self.store.put_object(epoch.0, &name, blob.bytes)?;
            let state = operators
                .entry(blob.operator.clone())
                .or_insert_with(|| OperatorState { id: blob.operator, vnodes: Vec::new() });
            state.vnodes.push((blob.vnode, object));
        }
        let mut operators: Vec<OperatorState> = operators.into_values().collect();
        operators.sort_by(|a, b| a.id.cmp(&b.id));
        operators.iter_mut().for_each(|o| o.vnodes.sort_by_key(|(vnode, _)| *vnode));
        Ok(operators)
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

/// Refuses a manifest whose state was written with encodings other than this build's.
pub(crate) fn check_encodings(manifest: &Manifest, store: &str) -> Result<(), SluiceError> {
    let ours = encodings();
    if manifest.encodings == ours {
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
             this pipeline has {fingerprint} (the sources, views, sinks or vnodes changed)",
            manifest.epoch, manifest.fingerprint
        ),
    )
    .with_fix("run with --from-scratch to discard that state, or set [checkpoint] store to a new location"))
}

/// Resolves every sink's staged work (commit the manifest's records, discard the rest)
/// and builds the runtime's restore and checkpoint options. Notes about sinks that
/// cannot stage go to `notices`.
pub(crate) fn prepare(
    section: &CheckpointSection,
    store: Arc<CheckpointStore>,
    manifest: Option<Manifest>,
    compiled: &CompiledPipeline,
    notices: &mut Vec<String>,
) -> Result<Checkpointing, SluiceError> {
    let plan = &compiled.plan;
    let highest_epoch = store.epochs()?.into_iter().max().unwrap_or(0);
    let mut restore = Restore::default();
    if let Some(manifest) = &manifest {
        restore_positions(manifest, plan, &mut restore)?;
        for operator in &manifest.operators {
            let mut blobs = Vec::with_capacity(operator.vnodes.len());
            for (vnode, object) in &operator.vnodes {
                let bytes = store.get_object(object).map_err(|e| e.context(format!("restoring {}", operator.id)))?;
                blobs.push((*vnode, bytes));
            }
            restore.states.insert(operator.id.clone(), blobs);
        }
    }
    sluice_types::failpoint!("recovery.before_resolve");
    resolve_sinks(manifest.as_ref(), plan)?;
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
    let checkpointer = StoreCheckpointer {
        store,
        fingerprint: compiled.fingerprint,
        vnodes: compiled.options.vnodes,
        lane_threads: compiled.lane_threads,
        retain: section.retain as usize,
        sources: plan.sources.iter().map(|s| (s.name().to_string(), s.lanes(), s.layout())).collect(),
        sinks: plan.flows.iter().map(|f| f.sink.name().to_string()).collect(),
    };
    let options = CheckpointOptions {
        interval: section.interval,
        timeout: section.timeout,
        exactly_once: section.guarantee == Guarantee::ExactlyOnce,
        // New epochs go above every published one, damaged ones included: a fallback
        // must never write a manifest under an epoch that already exists.
        restored_epoch: highest_epoch.max(manifest.as_ref().map_or(0, |m| m.epoch)),
        max_failed: section.max_failed_checkpoints,
        checkpointer: Box::new(checkpointer),
    };
    Ok(Checkpointing { options, restore })
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

/// Commits, epoch by epoch, the staged work a manifest names; discards anything later.
fn resolve_sinks(manifest: Option<&Manifest>, plan: &Plan) -> Result<(), SluiceError> {
    for flow in &plan.flows {
        let sink = &flow.sink;
        let mut by_epoch: Vec<(u64, Vec<u8>)> = Vec::new();
        if let Some(records) = manifest.and_then(|m| m.sinks.iter().find(|s| s.name == sink.name())) {
            for record in &records.records {
                let (epoch, rest) = record.split_at_checked(8).ok_or_else(|| {
                    SluiceError::internal("checkpoint.sink_record", format!("sink {}: a damaged record", sink.name()))
                })?;
                by_epoch.push((u64::from_le_bytes(epoch.try_into().expect("8 bytes")), rest.to_vec()));
            }
        }
        let records: Vec<Vec<u8>> = by_epoch.iter().map(|(_, record)| record.clone()).collect();
        commit_in_order(sink.as_ref(), by_epoch).map_err(|e| e.context("recovery"))?;
        sink.discard_after(manifest.map(|m| Epoch(m.epoch)), &records)
            .map_err(|e| e.context(format!("sink {}", sink.name())))?;
    }
    Ok(())
}
