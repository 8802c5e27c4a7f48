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
//! **Compaction.** After a checkpoint, when no merge is under way, the first list that
//! `sluice_state::compact::plan` says to merge (newest runs of similar size; everything
//! once the newer runs hold as many bytes as the oldest, unless they are all fresh keys,
//! which merge in tiers of at most an eighth of the list's bytes; beyond its run cap the
//! cheapest pair of runs close in size)
//! is merged on a thread of its own, `sluice-compact`: the runs are read from the store
//! block by block and the merge written to a local file (a vnode whose runs' keys do not
//! overlap, a join's appended rows, by copying their blocks as they are:
//! `sluice_state::Merge::write_into`), while the pipeline and the
//! next checkpoints go on. The first checkpoint after the merge finishes uploads its
//! file as a run of that checkpoint's epoch, with its own runs, and puts it in place of
//! the runs merged, if the list still holds them in a row (a full snapshot may have
//! replaced them: the merge is then dropped). So garbage collection, which deletes
//! every object no retained manifest names, never sees a merge's object unnamed: it
//! exists only once a checkpoint names it. A list whose merges fell behind (`overdue`) makes
//! the checkpoint wait for the merge under way. A merge that fails is logged and
//! dropped, its runs staying; one under way when the book goes (the run ends) is
//! cancelled, and its file removed.
//!
//! **Files.** A run is written to an anonymous file of the state directory as its
//! records come (memory holds one block of it; `[checkpoint] compression`: by default
//! a checkpoint's runs store their blocks as they are and merges compress them with LZ4
//! where that saves an eighth, `sluice_state::run`; `"lz4"` compresses every run,
//! `"none"` none),
//! then uploaded from the file
//! (`CheckpointStore::put_file`, in pieces, or linked into a local store through
//! `/proc/self/fd/N`), then dropped. Being anonymous, it never outlives the process,
//! even one killed mid-checkpoint or mid-merge.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_checkpoint::{CheckpointStore, Manifest, ObjectRef, StateRun};
use sluice_config::Compression;
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
/// or merged from such runs only; unknown after a restore, so false until the
/// instance's first snapshot says its deltas are additions).
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
    /// How runs store their blocks (`[checkpoint] compression`).
    compression: Compression,
    /// The merge being written in the background, if any.
    compaction: Option<Compaction>,
    /// Merges started so far (numbers their objects' names).
    merges: u64,
    /// The instance merged last: the next merge goes to the first list after it that
    /// needs one, so every list gets its turn.
    merged_last: Option<Instance>,
}

/// A finished merge about to land: its instance, the positions of the runs it replaces
/// in the list, its file, and whether it holds fresh keys only.
type Landing = (Instance, Range<usize>, LocalRun, bool);

/// A merge of some of an instance's runs, written to a local file on a thread of its own
/// (see the module doc).
struct Compaction {
    instance: Instance,
    /// The objects merged, oldest first: the merge replaces them if the list still holds
    /// them in a row when it lands.
    objects: Vec<String>,
    fresh_keys: bool,
    /// Set to stop the merge (the run book is going away).
    cancel: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Option<LocalRun>, SluiceError>>,
}

impl Drop for RunBook {
    fn drop(&mut self) {
        if let Some(compaction) = self.compaction.take() {
            compaction.cancel.store(true, Ordering::Relaxed);
            // The merge stops at its next record; its file goes with it.
            let _ = compaction.thread.join();
        }
    }
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
        RunBook { lists, dir, compression: Compression::Lz4Merged, compaction: None, merges: 0, merged_last: None }
    }

    /// The same book storing the blocks of the runs it writes as `compression` says
    /// (`[checkpoint] compression`: a checkpoint's new runs, merges' runs).
    pub(crate) fn compressing(mut self, compression: Compression) -> RunBook {
        self.compression = compression;
        self
    }

    /// Writes the deferred states of one checkpoint as runs of `epoch`, with the merge
    /// finished in the background since the previous checkpoint, and returns every run
    /// of every list, for this worker's part; then starts the next merge the lists need.
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
            if let Some(list) = lists.get_mut(&instance).filter(|_| fresh_keys) {
                // An operator's deltas are additions or not by its plan, which the
                // manifest's fingerprint pins: the runs a restore listed (unknown then)
                // were additions too, or merges of them, but for the base.
                list.iter_mut().skip(1).for_each(|listed| listed.fresh_keys = true);
            }
            if snapshot.kind == SnapshotKind::Empty {
                continue;
            }
            let name = format!("{}/run-{}-{}", instance.0, vnodes.start, vnodes.end);
            let local =
                write_local(&self.dir, &name, vnodes, None, self.compression.new_runs(), |sink| (snapshot.job)(sink))?;
            if let Some(file) = local {
                written.push((instance, file, fresh_keys));
            }
        }
        sluice_types::failpoint!("checkpoint.after_encode");
        let merged = self.finished_merge(&lists)?;
        self.upload(store, epoch, written, merged, &mut lists)?;
        sluice_types::failpoint!("checkpoint.after_compaction");
        self.lists = lists;
        guards.into_iter().for_each(|guard| guard.written());
        self.start_merge(store);
        let runs = self
            .lists
            .iter()
            .flat_map(|((operator, _, _), runs)| runs.iter().map(|listed| (operator.clone(), listed.run.clone())));
        Ok(runs.collect())
    }

    /// Uploads `files` (each an instance's new run) and the merge `merged` (its
    /// instance, the positions of the runs it replaces, its file, whether of fresh keys
    /// only), replaces those runs with the merge and adds each new run to its
    /// instance's list.
    fn upload(
        &self,
        store: &CheckpointStore,
        epoch: u64,
        files: Vec<(Instance, LocalRun, bool)>,
        merged: Option<Landing>,
        lists: &mut BTreeMap<Instance, Vec<Listed>>,
    ) -> Result<(), SluiceError> {
        let mut uploads: Vec<_> = files.iter().map(|(_, file, _)| file.upload()).collect();
        uploads.extend(merged.iter().map(|(_, _, file, _)| file.upload()));
        let mut objects = store.put_files(epoch, uploads)?.into_iter();
        sluice_types::failpoint!("checkpoint.after_runs_uploaded");
        let mut new_runs = Vec::with_capacity(files.len());
        for (instance, _, fresh_keys) in files {
            let object = objects.next().expect("one object per file uploaded");
            new_runs.push((instance, object, fresh_keys));
        }
        // The merge first: its positions are the list's before this checkpoint's runs.
        if let Some((instance, positions, _, fresh_keys)) = merged {
            let object = objects.next().expect("one object per file uploaded");
            let run = StateRun { start: instance.1, end: instance.2, object };
            let list = lists.get_mut(&instance).expect("a merge lands on its list");
            list.splice(positions, [Listed { run, fresh_keys }]);
        }
        for (instance, object, fresh_keys) in new_runs {
            let run = StateRun { start: instance.1, end: instance.2, object };
            lists.entry(instance).or_default().push(Listed { run, fresh_keys });
        }
        Ok(())
    }

    /// The merge finished since the previous checkpoint, if its runs are still in its
    /// instance's list (in `lists`, this checkpoint's lists before its new runs): the
    /// instance, the positions of those runs, the merge's file and whether it holds
    /// fresh keys only. When a list's merges have fallen behind (`compact::overdue`), the
    /// checkpoint waits for the merge under way, so runs never pile up.
    /// A merge that failed is dropped (logged): its runs stay, and a later one merges them.
    fn finished_merge(&mut self, lists: &BTreeMap<Instance, Vec<Listed>>) -> Result<Option<Landing>, SluiceError> {
        let Some(compaction) = self.compaction.as_ref() else { return Ok(None) };
        let crowded = lists.values().any(|list| compact::overdue(&infos(list)));
        if !compaction.thread.is_finished() && !crowded {
            return Ok(None);
        }
        let Compaction { instance, objects, fresh_keys, thread, .. } =
            self.compaction.take().expect("a merge is under way");
        let file = match thread.join() {
            Ok(Ok(Some(file))) => file,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(error)) => {
                tracing::warn!(%error, operator = instance.0, "a merge of state runs failed; its runs stay");
                return Ok(None);
            }
            Err(panic) => {
                let message = format!("a merge of state runs panicked: {}", sluice_types::panic_message(&*panic));
                return Err(SluiceError::internal("run.panic", message).with_kind(sluice_types::ErrorKind::Panic));
            }
        };
        let Some(list) = lists.get(&instance) else { return Ok(None) };
        let paths: Vec<&str> = list.iter().map(|listed| listed.run.object.path.as_str()).collect();
        let Some(start) = paths.windows(objects.len()).position(|window| window.iter().eq(objects.iter())) else {
            // A full snapshot replaced the runs meanwhile.
            return Ok(None);
        };
        Ok(Some((instance, start..start + objects.len(), file, fresh_keys)))
    }

    /// Starts merging the runs of the first list (from the one after the last merged)
    /// that the policy says to, unless a merge is under way.
    fn start_merge(&mut self, store: &Arc<CheckpointStore>) {
        if self.compaction.is_some() {
            return;
        }
        let after = |instance: &&Instance| self.merged_last.as_ref().is_some_and(|last| *instance > last);
        let (later, earlier): (Vec<_>, Vec<_>) = self.lists.iter().partition(|(instance, _)| after(instance));
        let planned = later.into_iter().chain(earlier).find_map(|(instance, list)| {
            compact::plan(&infos(list)).map(|plan| (instance.clone(), list[plan.runs.clone()].to_vec(), plan))
        });
        let Some((instance, runs, plan)) = planned else { return };
        self.merged_last = Some(instance.clone());
        let (operator, start, end) = instance.clone();
        let name = format!("{operator}/merged-{start}-{end}-{}", self.merges);
        self.merges += 1;
        let mode = if plan.includes_base() { MergeMode::Live } else { MergeMode::KeepDeletes };
        let fresh_keys = runs.iter().all(|listed| listed.fresh_keys);
        let objects = runs.iter().map(|listed| listed.run.object.path.clone()).collect();
        let cancel = Arc::new(AtomicBool::new(false));
        let (store, dir, stop) = (Arc::clone(store), self.dir.clone(), Arc::clone(&cancel));
        let compress = self.compression.merged_runs();
        let spawned = std::thread::Builder::new().name("sluice-compact".into()).spawn(move || {
            let inputs =
                runs.iter().map(|listed| StoredRun::open(&store, &listed.run)).collect::<Result<Vec<_>, _>>()?;
            let mut merge = Merge::new(inputs, start..end, mode);
            let write = |sink: &mut dyn StateSink| merge.write_into(sink).map(drop);
            let file = write_local(&dir, &name, start..end, Some(&stop), compress, write)?;
            let (runs, blocks_skipped, blocks_copied) = (runs.len(), merge.blocks_skipped(), merge.blocks_copied());
            tracing::debug!(operator, start, end, runs, blocks_skipped, blocks_copied, "state runs merged");
            Ok(file)
        });
        match spawned {
            Ok(thread) => self.compaction = Some(Compaction { instance, objects, fresh_keys, cancel, thread }),
            Err(error) => tracing::warn!(%error, "a thread to merge state runs could not start"),
        }
    }

    /// Waits for the merge under way (tests: the next checkpoint then lands it).
    #[cfg(test)]
    pub(crate) fn wait_for_merge(&self) {
        while self.compaction.as_ref().is_some_and(|compaction| !compaction.thread.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Writes the records `write` gives as a run in a local file of `dir`, its blocks
/// compressed when `compress`, to be uploaded as the object `name`; `None` when there are
/// no records. Raising `cancel` stops the writing at its next record.
fn write_local(
    dir: &Path,
    name: &str,
    vnodes: Range<u32>,
    cancel: Option<&AtomicBool>,
    compress: bool,
    write: impl FnOnce(&mut dyn StateSink) -> Result<(), SluiceError>,
) -> Result<Option<LocalRun>, SluiceError> {
    let file = tempfile::tempfile_in(dir).map_err(|error| local_error(dir, 0, error))?;
    let mut writer = RunWriter::new(BufWriter::new(&file))?;
    if compress {
        writer = writer.compressed();
    }
    let mut checked = InRange { sink: &mut writer, vnodes, name, dir, cancel };
    let outcome = write(&mut checked);
    let (bytes, entries) = (writer.bytes_written(), writer.entries());
    let local = |error: SluiceError| {
        if error.code == "state.run_write" { local_error(dir, bytes, error) } else { error }
    };
    outcome.map_err(local)?;
    let (run, _) = writer.finish().map_err(local)?;
    Ok((entries > 0).then(|| LocalRun { name: name.to_string(), file, checksum: run.checksum }))
}

/// What the compaction policy knows of a list's runs.
fn infos(list: &[Listed]) -> Vec<compact::RunInfo> {
    list.iter()
        .map(|listed| compact::RunInfo { bytes: listed.run.object.size, fresh_keys: listed.fresh_keys })
        .collect()
}

/// A run written to a local file, to be uploaded. The file is anonymous (`O_TMPFILE`,
/// or unlinked at once where that is not supported), so it goes when this is dropped or
/// the process ends, however it ends: a crash leaves no run behind in the state
/// directory. The store reads it, or links it into a local store, through
/// `/proc/self/fd/N`.
struct LocalRun {
    name: String,
    file: std::fs::File,
    checksum: u32,
}

impl LocalRun {
    fn upload(&self) -> (String, std::path::PathBuf, u32) {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        (self.name.clone(), path, self.checksum)
    }
}

/// Checks that a snapshot writes only its instance's vnodes.
struct InRange<'a> {
    sink: &'a mut dyn StateSink,
    vnodes: Range<u32>,
    name: &'a str,
    /// The state directory, where snapshot jobs sort what does not fit in memory.
    dir: &'a Path,
    /// Raised to stop the writing (a merge in the background).
    cancel: Option<&'a AtomicBool>,
}

impl InRange<'_> {
    fn check(&self, vnode: u32) -> Result<(), SluiceError> {
        if self.cancel.is_some_and(|cancel| cancel.load(Ordering::Relaxed)) {
            return Err(SluiceError::internal("state.merge_cancelled", format!("{} was cancelled", self.name)));
        }
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

    fn interleave(&mut self) {
        self.sink.interleave();
    }

    fn copies_blocks(&self) -> Option<u64> {
        self.sink.copies_blocks()
    }

    fn copy_block(
        &mut self,
        vnode: u32,
        info: &sluice_state::read::BlockInfo,
        bytes: &[u8],
    ) -> Result<(), SluiceError> {
        self.check(vnode)?;
        self.sink.copy_block(vnode, info, bytes)
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
