//! This worker's state runs: each operator instance's snapshot written as a run
//! (`sluice_state::run`) and uploaded, the list of runs each instance's vnodes are made
//! of, their compaction, and reading runs back from the store for a restore.
//!
//! **Lists.** For every operator instance of this worker (an operator id and the vnodes
//! of its thread), the runs its state is the merge of, oldest first. A full snapshot
//! replaces the list with its run; a delta adds its run (or nothing, when nothing
//! changed). After a restore each instance's list is the manifest's runs serving its
//! vnodes, clipped to them. Every part this worker sends lists every run of every list,
//! so the manifest always names every run a restore needs: a run written once is named
//! again by each later checkpoint until a compaction or a full snapshot replaces it, and
//! garbage collection keeps it while a retained manifest names it.
//!
//! **All or nothing.** A part is built on a copy of the lists, which replaces them only
//! when every run is written; only then are the snapshots' guards marked written
//! (`sluice_runtime::SnapshotGuard`). A checkpoint that fails leaves the lists as they
//! were, and the instances whose snapshots it lost write their next snapshot in full.
//!
//! **Compaction.** After a checkpoint's runs are added, each list changed is merged per
//! `sluice_state::compact::plan` (newest runs of similar size; everything once the
//! newer runs hold as many bytes as the oldest), reading the runs from the store block
//! by block and writing the merge as a new run of this epoch, in the same part. It runs
//! on the checkpoint writer's thread, inside the checkpoint (so garbage collection,
//! which runs after a publish and before the next checkpoint writes, never sees a
//! compaction's output unnamed).
//!
//! **Files.** A run is written to a file of the state directory as its records come,
//! then uploaded from the file (`CheckpointStore::put_file`, in pieces), then the file
//! is removed: memory holds one block of it.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_checkpoint::{CheckpointStore, Manifest, ObjectRef, StateRun};
use sluice_runtime::SnapshotKind;
use sluice_runtime::checkpoint::{DeferredState, RestoredState};
use sluice_state::merge::MergeInput;
use sluice_state::{Merge, MergeMode, RunSource, RunWriter, StateSink, compact};
use sluice_types::SluiceError;

/// A run in the checkpoint store, read in ranges.
pub(crate) struct StoredRun {
    store: Arc<CheckpointStore>,
    object: ObjectRef,
    name: String,
}

impl StoredRun {
    pub(crate) fn new(store: Arc<CheckpointStore>, object: ObjectRef) -> StoredRun {
        let name = format!("{:?} in {}", object.path, store.url());
        StoredRun { store, object, name }
    }

    /// The run `run` names, serving its vnodes.
    fn open(store: &Arc<CheckpointStore>, run: &StateRun) -> Result<MergeInput, SluiceError> {
        let source = Arc::new(StoredRun::new(Arc::clone(store), run.object.clone()));
        Ok(MergeInput::open(source)?.serving(run.vnodes()))
    }
}

impl RunSource for StoredRun {
    fn name(&self) -> &str {
        &self.name
    }

    fn size(&self) -> u64 {
        self.object.size
    }

    fn read_at(&self, offset: u64, length: usize) -> Result<Vec<u8>, SluiceError> {
        self.store.read_within(&self.object, offset, length as u64)
    }
}

/// An instance's key in the lists: its operator id and vnodes.
type Instance = (String, u32, u32);

/// This worker's runs (see the module doc).
pub(crate) struct RunBook {
    lists: BTreeMap<Instance, Vec<StateRun>>,
    /// Where runs are written before their upload.
    dir: PathBuf,
}

impl RunBook {
    /// The lists of a worker starting from `manifest` (none: from nothing) whose
    /// instances own the vnode ranges `ranges`.
    pub(crate) fn restored(dir: PathBuf, manifest: Option<&Manifest>, ranges: &[Range<u32>]) -> RunBook {
        let mut lists = BTreeMap::new();
        for operator in manifest.iter().flat_map(|manifest| &manifest.operators) {
            for range in ranges {
                let clipped: Vec<StateRun> = operator
                    .runs
                    .iter()
                    .filter_map(|run| {
                        let (start, end) = (run.start.max(range.start), run.end.min(range.end));
                        (start < end).then(|| StateRun { start, end, object: run.object.clone() })
                    })
                    .collect();
                if !clipped.is_empty() {
                    lists.insert((operator.id.clone(), range.start, range.end), clipped);
                }
            }
        }
        RunBook { lists, dir }
    }

    /// Writes the deferred states of one checkpoint as runs of `epoch`, compacts the
    /// lists they changed, and returns every run of every list, for this worker's part.
    /// The guards are marked written once everything is.
    pub(crate) fn write(
        &mut self,
        store: &Arc<CheckpointStore>,
        epoch: u64,
        deferred: Vec<DeferredState>,
    ) -> Result<Vec<(String, StateRun)>, SluiceError> {
        let mut lists = self.lists.clone();
        let mut guards = Vec::with_capacity(deferred.len());
        let mut changed = Vec::new();
        for DeferredState { operator, vnodes, snapshot, guard } in deferred {
            let instance = (operator, vnodes.start, vnodes.end);
            if snapshot.kind == SnapshotKind::Empty {
                lists.remove(&instance);
                guards.push(guard);
                continue;
            }
            let name = format!("{}/run-{}-{}", instance.0, vnodes.start, vnodes.end);
            let written = self.write_run(store, epoch, &name, vnodes.clone(), |sink| (snapshot.job)(sink))?;
            let list = lists.entry(instance.clone()).or_default();
            if snapshot.kind == SnapshotKind::Full {
                list.clear();
            }
            if let Some(object) = written {
                list.push(StateRun { start: vnodes.start, end: vnodes.end, object });
                changed.push(instance.clone());
            }
            if list.is_empty() {
                lists.remove(&instance);
            }
            guards.push(guard);
        }
        for instance in changed {
            self.compact(store, epoch, &mut lists, &instance)?;
        }
        self.lists = lists;
        guards.into_iter().for_each(|guard| guard.written());
        let runs = self
            .lists
            .iter()
            .flat_map(|((operator, _, _), runs)| runs.iter().map(|run| (operator.clone(), run.clone())));
        Ok(runs.collect())
    }

    /// Merges `instance`'s runs while the policy asks for it.
    fn compact(
        &self,
        store: &Arc<CheckpointStore>,
        epoch: u64,
        lists: &mut BTreeMap<Instance, Vec<StateRun>>,
        instance: &Instance,
    ) -> Result<(), SluiceError> {
        let (operator, start, end) = instance;
        let Some(list) = lists.get_mut(instance) else { return Ok(()) };
        let mut merges = 0;
        while let Some(plan) = compact::plan(&list.iter().map(|run| run.object.size).collect::<Vec<_>>()) {
            let inputs =
                list[plan.runs.clone()].iter().map(|run| StoredRun::open(store, run)).collect::<Result<Vec<_>, _>>()?;
            let mode = if plan.includes_base() { MergeMode::Live } else { MergeMode::KeepDeletes };
            let mut merge = Merge::new(inputs, *start..*end, mode);
            let name = format!("{operator}/merged-{start}-{end}-{merges}");
            let written = self.write_run(store, epoch, &name, *start..*end, |sink| merge.write_into(sink).map(drop))?;
            let merged = written.map(|object| StateRun { start: *start, end: *end, object });
            tracing::debug!(operator, start, end, runs = plan.runs.len(), "state runs merged");
            list.splice(plan.runs, merged);
            merges += 1;
        }
        if list.is_empty() {
            lists.remove(instance);
        }
        Ok(())
    }

    /// Writes the records `write` gives as a run in a local file, then as the object
    /// `name` of `epoch`; `None` when there are no records (nothing is written).
    fn write_run(
        &self,
        store: &CheckpointStore,
        epoch: u64,
        name: &str,
        vnodes: Range<u32>,
        write: impl FnOnce(&mut dyn StateSink) -> Result<(), SluiceError>,
    ) -> Result<Option<ObjectRef>, SluiceError> {
        let file = tempfile::Builder::new().prefix("run-").suffix(".sst").tempfile_in(&self.dir);
        let file = file.map_err(|error| local_error(&self.dir, 0, error))?;
        let mut writer = RunWriter::new(BufWriter::new(file.as_file()))?;
        let mut checked = InRange { sink: &mut writer, vnodes, name };
        let outcome = write(&mut checked);
        let bytes = writer.bytes_written();
        let entries = writer.entries();
        outcome?;
        let (run, _) = writer.finish().map_err(|error| local_error(&self.dir, bytes, error))?;
        if entries == 0 {
            return Ok(None);
        }
        let object = store.put_file(epoch, name, file.path(), run.checksum)?;
        Ok(Some(object))
    }
}

/// Checks that a snapshot writes only its instance's vnodes.
struct InRange<'a> {
    sink: &'a mut dyn StateSink,
    vnodes: Range<u32>,
    name: &'a str,
}

impl InRange<'_> {
    fn check(&self, vnode: u32) -> Result<(), SluiceError> {
        if self.vnodes.contains(&vnode) {
            return Ok(());
        }
        Err(SluiceError::internal(
            "state.vnode_range",
            format!("{} wrote a record of vnode {vnode}, outside its vnodes {:?}", self.name, self.vnodes),
        ))
    }
}

impl StateSink for InRange<'_> {
    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), SluiceError> {
        self.check(vnode)?;
        self.sink.delete_range(vnode, start, end)
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError> {
        self.check(vnode)?;
        self.sink.put(vnode, key, value)
    }

    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), SluiceError> {
        self.check(vnode)?;
        self.sink.delete(vnode, key)
    }
}

/// A run that could not be written to the state directory: the directory, how far it
/// got, and the fix.
fn local_error(dir: &Path, written: u64, error: impl std::fmt::Display) -> SluiceError {
    SluiceError::external(
        "state.dir_write",
        format!(
            "cannot write a state run in {} ({written} bytes written, at least as many more needed): {error}",
            dir.display()
        ),
    )
    .with_fix(
        "free space on that disk, or set [pipeline] spill_dir to a writable local directory on a disk with room \
         for the state's largest checkpoint",
    )
}

/// The operators' state in a manifest, read from the store (see `RestoredState`).
pub(crate) struct StoreState {
    store: Arc<CheckpointStore>,
    runs: BTreeMap<String, Vec<StateRun>>,
}

impl StoreState {
    pub(crate) fn new(store: Arc<CheckpointStore>, manifest: &Manifest) -> StoreState {
        let runs = manifest.operators.iter().map(|operator| (operator.id.clone(), operator.runs.clone())).collect();
        StoreState { store, runs }
    }
}

impl RestoredState for StoreState {
    fn has(&self, operator: &str) -> bool {
        self.runs.contains_key(operator)
    }

    fn open(&self, operator: &str, vnodes: Range<u32>) -> Result<Vec<MergeInput>, SluiceError> {
        let runs = self.runs.get(operator).map(Vec::as_slice).unwrap_or_default();
        let serving = runs.iter().filter(|run| run.start < vnodes.end && vnodes.start < run.end);
        serving.map(|run| StoredRun::open(&self.store, run)).collect()
    }
}
