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

/// A run of an instance's list, and whether it holds only keys that no older run of the
/// list holds (`compact::RunInfo::fresh_keys`: written from `SnapshotKind::Additions`,
/// or merged from such runs only; unknown after a restore, so false).
#[derive(Debug, Clone)]
struct Listed {
    run: StateRun,
    fresh_keys: bool,
}

/// This worker's runs (see the module doc).
pub(crate) struct RunBook {
    lists: BTreeMap<Instance, Vec<Listed>>,
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
                let clipped: Vec<Listed> = operator
                    .runs
                    .iter()
                    .filter_map(|run| {
                        let (start, end) = (run.start.max(range.start), run.end.min(range.end));
                        let run = StateRun { start, end, object: run.object.clone() };
                        (start < end).then_some(Listed { run, fresh_keys: false })
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
    /// The guards are marked written once everything is. Runs are written to local
    /// files one after the other, then uploaded together (each upload waits for its
    /// durable write, so they overlap).
    pub(crate) fn write(
        &mut self,
        store: &Arc<CheckpointStore>,
        epoch: u64,
        deferred: Vec<DeferredState>,
    ) -> Result<Vec<(String, StateRun)>, SluiceError> {
        let mut lists = self.lists.clone();
        let mut guards = Vec::with_capacity(deferred.len());
        let mut written = Vec::new();
        for DeferredState { operator, vnodes, snapshot, guard } in deferred {
            let instance = (operator, vnodes.start, vnodes.end);
            guards.push(guard);
            if !snapshot.kind.is_delta() {
                lists.remove(&instance);
            }
            let fresh_keys = snapshot.kind == SnapshotKind::Additions;
            if snapshot.kind == SnapshotKind::Empty {
                continue;
            }
            let name = format!("{}/run-{}-{}", instance.0, vnodes.start, vnodes.end);
            if let Some(file) = self.write_local(&name, vnodes, |sink| (snapshot.job)(sink))? {
                written.push((instance, file, fresh_keys));
            }
        }
        sluice_types::failpoint!("checkpoint.after_encode");
        let changed = self.upload(store, epoch, written, &mut lists)?;
        sluice_types::failpoint!("checkpoint.after_runs_uploaded");
        self.compact(store, epoch, &mut lists, changed)?;
        sluice_types::failpoint!("checkpoint.after_compaction");
        self.lists = lists;
        guards.into_iter().for_each(|guard| guard.written());
        let runs = self
            .lists
            .iter()
            .flat_map(|((operator, _, _), runs)| runs.iter().map(|listed| (operator.clone(), listed.run.clone())));
        Ok(runs.collect())
    }

    /// Uploads `files` (each an instance's new run), adds each run to its instance's
    /// list, and returns the instances changed.
    fn upload(
        &self,
        store: &CheckpointStore,
        epoch: u64,
        files: Vec<(Instance, LocalRun, bool)>,
        lists: &mut BTreeMap<Instance, Vec<Listed>>,
    ) -> Result<Vec<Instance>, SluiceError> {
        let objects = store.put_files(epoch, files.iter().map(|(_, file, _)| file.upload()).collect())?;
        let mut changed = Vec::with_capacity(files.len());
        for ((instance, _, fresh_keys), object) in files.into_iter().zip(objects) {
            let (start, end) = (instance.1, instance.2);
            let run = StateRun { start, end, object };
            lists.entry(instance.clone()).or_default().push(Listed { run, fresh_keys });
            changed.push(instance);
        }
        Ok(changed)
    }

    /// Merges the runs of the instances `changed` while the policy asks for it: each
    /// round plans a merge for every instance that needs one, writes them, and uploads
    /// them together.
    fn compact(
        &self,
        store: &Arc<CheckpointStore>,
        epoch: u64,
        lists: &mut BTreeMap<Instance, Vec<Listed>>,
        mut changed: Vec<Instance>,
    ) -> Result<(), SluiceError> {
        let mut round = 0;
        while !changed.is_empty() {
            let mut merges: Vec<(Instance, Range<usize>, Option<LocalRun>, bool)> = Vec::new();
            for instance in std::mem::take(&mut changed) {
                let Some(list) = lists.get(&instance) else { continue };
                let infos: Vec<compact::RunInfo> = list
                    .iter()
                    .map(|listed| compact::RunInfo { bytes: listed.run.object.size, fresh_keys: listed.fresh_keys })
                    .collect();
                let Some(plan) = compact::plan(&infos) else { continue };
                let (operator, start, end) = &instance;
                let merged = &list[plan.runs.clone()];
                let fresh_keys = merged.iter().all(|listed| listed.fresh_keys);
                let inputs =
                    merged.iter().map(|listed| StoredRun::open(store, &listed.run)).collect::<Result<Vec<_>, _>>()?;
                let mode = if plan.includes_base() { MergeMode::Live } else { MergeMode::KeepDeletes };
                let mut merge = Merge::new(inputs, *start..*end, mode);
                let name = format!("{operator}/merged-{start}-{end}-{round}");
                let file = self.write_local(&name, *start..*end, |sink| merge.write_into(sink).map(drop))?;
                tracing::debug!(operator, start, end, runs = plan.runs.len(), "state runs merged");
                merges.push((instance, plan.runs, file, fresh_keys));
            }
            let uploads = merges.iter().filter_map(|(_, _, file, _)| file.as_ref()).map(LocalRun::upload);
            let mut objects = store.put_files(epoch, uploads.collect())?.into_iter();
            for (instance, runs, file, fresh_keys) in merges {
                let object = file.map(|_| objects.next().expect("one object per file uploaded"));
                let (start, end) = (instance.1, instance.2);
                let list = lists.get_mut(&instance).expect("a list planned for a merge");
                let merged = object.map(|object| Listed { run: StateRun { start, end, object }, fresh_keys });
                list.splice(runs, merged);
                if list.is_empty() {
                    lists.remove(&instance);
                }
                changed.push(instance);
            }
            round += 1;
        }
        Ok(())
    }

    /// Writes the records `write` gives as a run in a local file, to be uploaded as the
    /// object `name`; `None` when there are no records.
    fn write_local(
        &self,
        name: &str,
        vnodes: Range<u32>,
        write: impl FnOnce(&mut dyn StateSink) -> Result<(), SluiceError>,
    ) -> Result<Option<LocalRun>, SluiceError> {
        let file = tempfile::Builder::new().prefix("run-").suffix(".sst").tempfile_in(&self.dir);
        let file = file.map_err(|error| local_error(&self.dir, 0, error))?;
        let mut writer = RunWriter::new(BufWriter::new(file.as_file()))?;
        let mut checked = InRange { sink: &mut writer, vnodes, name, dir: &self.dir };
        let outcome = write(&mut checked);
        let (bytes, entries) = (writer.bytes_written(), writer.entries());
        let local = |error: SluiceError| {
            if error.code == "state.run_write" { local_error(&self.dir, bytes, error) } else { error }
        };
        outcome.map_err(local)?;
        let (run, _) = writer.finish().map_err(local)?;
        Ok((entries > 0).then(|| LocalRun { name: name.to_string(), file, checksum: run.checksum }))
    }
}

/// A run written to a local file, to be uploaded (the file goes when this is dropped).
struct LocalRun {
    name: String,
    file: tempfile::NamedTempFile,
    checksum: u32,
}

impl LocalRun {
    fn upload(&self) -> (String, std::path::PathBuf, u32) {
        (self.name.clone(), self.file.path().to_path_buf(), self.checksum)
    }
}

/// Checks that a snapshot writes only its instance's vnodes.
struct InRange<'a> {
    sink: &'a mut dyn StateSink,
    vnodes: Range<u32>,
    name: &'a str,
    /// The state directory, where snapshot jobs sort what does not fit in memory.
    dir: &'a Path,
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

    fn scratch_dir(&self) -> Option<&Path> {
        Some(self.dir)
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
        "free space on that disk, or set [pipeline] state_dir to a writable local directory on a disk with room \
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
