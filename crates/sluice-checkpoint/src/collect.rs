//! Retention: which manifests and state objects may be deleted, and deleting them.
//!
//! A manifest is *healthy* for retention when it decodes and every object it names is in
//! the store's listing, long enough for every range it names in it (a listing, not a full
//! read: a flipped byte is only
//! found by `verify`, so keep `retain` at 2 or more where that matters). Collection keeps
//! the newest `retain` healthy manifests and:
//! - deletes older manifests, damaged manifests older than the newest kept one, and every
//!   staged `.tmp` manifest;
//! - deletes every object under `state/epoch-{e}/` that no kept manifest names, including
//!   the objects of epochs newer than every manifest (abandoned checkpoints);
//! - leaves damaged manifests newer than the newest kept one, with their epochs' objects,
//!   for inspection (`sluice checkpoints verify`): the next published epoch makes them
//!   older than the newest kept manifest, and the next collection removes them;
//! - with no healthy manifest at all, deletes only staged manifests and abandoned objects;
//! - never touches files outside `manifests/` and `state/`, nor names it does not recognise.
//!
//! Manifests are deleted before objects, so a collection interrupted at any point never
//! leaves a manifest naming a deleted object (invariant 1).
//!
//! Ordering constraint: collection must not run concurrently with `put_object`/`publish`
//! of a newer epoch (their objects would look abandoned). The checkpointer collects after
//! `publish(e)` returns and before it writes objects of the next epoch, or at startup.
//! Collection and `clear` need the store's lease and check it first (see `lease`), so a run
//! whose lease was broken deletes nothing of the run that holds it now.

use sluice_types::{ErrorKind, SluiceError};
use std::collections::{BTreeMap, BTreeSet};

use crate::calls::Listed;
use crate::layout::{self, ManifestFile};
use crate::manifest::Manifest;
use crate::store::CheckpointStore;

/// What one collection deletes.
#[derive(Debug, Default)]
struct Doomed {
    manifests: Vec<String>,
    objects: Vec<String>,
    bytes: u64,
}

/// The manifests found, by kind.
#[derive(Debug, Default)]
struct ManifestFiles {
    /// `(epoch, path, size)`, newest first.
    committed: Vec<(u64, String, u64)>,
    leftovers: Vec<Listed>,
}

impl CheckpointStore {
    /// Keeps the newest `retain` (≥ 1) healthy manifests and deletes what no kept manifest
    /// needs (see the module doc). Returns the number of bytes deleted. Needs the lease.
    pub fn collect_garbage(&self, retain: usize) -> Result<u64, SluiceError> {
        if retain == 0 {
            return Err(SluiceError::internal("checkpoint.retain", "retaining 0 checkpoints would delete them all")
                .with_fix("retain at least 1 checkpoint"));
        }
        let bytes = self.calls.block_on(self.collect_async(retain))?;
        self.prune_local_directories();
        Ok(bytes)
    }

    async fn collect_async(&self, retain: usize) -> Result<u64, SluiceError> {
        self.check_lease("collecting old checkpoints").await?;
        let files = manifest_files(self.calls.list(layout::MANIFEST_DIR).await?);
        let objects = self.calls.list(layout::STATE_DIR).await?;
        let sizes: BTreeMap<&str, u64> = objects.iter().map(|o| (o.path.as_str(), o.size)).collect();
        let (kept, damaged) = self.choose_kept(&files, &sizes, retain).await?;
        let newest_kept = kept.first().map(|manifest| manifest.epoch);
        let newest_any = files.committed.first().map(|(epoch, _, _)| *epoch);
        let mut doomed = Doomed::default();
        for leftover in &files.leftovers {
            doomed.add_manifest(&leftover.path, leftover.size);
        }
        for (epoch, path, size) in &files.committed {
            let older_than_kept = newest_kept.is_some_and(|newest| *epoch < newest);
            if older_than_kept && !kept.iter().any(|manifest| manifest.epoch == *epoch) {
                doomed.add_manifest(path, *size);
            }
        }
        let referenced: BTreeSet<&str> = kept.iter().flat_map(|m| m.objects().map(|o| o.path.as_str())).collect();
        for object in &objects {
            let Some(epoch) = layout::epoch_of_object(&object.path) else { continue };
            let protected = match newest_kept {
                Some(newest) => epoch > newest && damaged.contains(&epoch),
                None => newest_any.is_some_and(|newest| epoch <= newest),
            };
            if !protected && !referenced.contains(object.path.as_str()) {
                doomed.objects.push(object.path.clone());
                doomed.bytes = doomed.bytes.saturating_add(object.size);
            }
        }
        self.calls.delete_all(&doomed.manifests).await?;
        sluice_types::failpoint!("checkpoint.collect_between");
        self.calls.delete_all(&doomed.objects).await?;
        let (manifests, objects, bytes) = (doomed.manifests.len(), doomed.objects.len(), doomed.bytes);
        tracing::info!(store = self.url(), retain, manifests, objects, bytes, "checkpoints collected");
        Ok(doomed.bytes)
    }

    /// The newest `retain` healthy manifests (newest first) and the epochs found damaged.
    async fn choose_kept(
        &self,
        files: &ManifestFiles,
        sizes: &BTreeMap<&str, u64>,
        retain: usize,
    ) -> Result<(Vec<Manifest>, BTreeSet<u64>), SluiceError> {
        let mut kept = Vec::new();
        let mut damaged = BTreeSet::new();
        for (epoch, _, _) in &files.committed {
            if kept.len() == retain {
                break;
            }
            let problem = match self.load_async(*epoch).await {
                Ok(manifest) => match missing_object(&manifest, sizes) {
                    None => {
                        kept.push(manifest);
                        continue;
                    }
                    Some(problem) => problem,
                },
                Err(error) if error.kind == ErrorKind::DamagedManifest => error.message,
                Err(error) => return Err(error),
            };
            tracing::warn!(epoch, store = self.url(), %problem, "damaged checkpoint is not retained");
            damaged.insert(*epoch);
        }
        Ok((kept, damaged))
    }

    /// Deletes every manifest and state object (for starting over). Files outside
    /// `manifests/` and `state/` are not the store's and are left alone, and so is the lease:
    /// `clear` needs it (acquire first, then clear), and the run keeps holding it.
    pub fn clear(&self) -> Result<(), SluiceError> {
        self.calls.block_on(async {
            self.check_lease("clearing the store").await?;
            let manifests = self.calls.list(layout::MANIFEST_DIR).await?;
            let objects = self.calls.list(layout::STATE_DIR).await?;
            let manifests: Vec<String> = manifests.into_iter().map(|listed| listed.path).collect();
            let objects: Vec<String> = objects.into_iter().map(|listed| listed.path).collect();
            self.calls.delete_all(&manifests).await?;
            self.calls.delete_all(&objects).await?;
            tracing::info!(store = self.url(), manifests = manifests.len(), objects = objects.len(), "store cleared");
            Ok(())
        })?;
        self.prune_local_directories();
        Ok(())
    }

    /// Removes the empty directories deletions leave behind in a local store (best effort:
    /// a directory that cannot be removed is simply kept).
    fn prune_local_directories(&self) {
        if let Some(root) = self.calls.local_root() {
            prune_empty(&root.join(layout::STATE_DIR), PRUNE_DEPTH_MAX);
        }
    }
}

/// How deep pruning descends (object names have far fewer parts).
const PRUNE_DEPTH_MAX: usize = 64;

/// Removes empty directories below and including `dir`; whether `dir` is gone.
fn prune_empty(dir: &std::path::Path, depth_left: usize) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    if depth_left > 0 {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                prune_empty(&entry.path(), depth_left - 1);
            }
        }
    }
    std::fs::remove_dir(dir).is_ok()
}

fn manifest_files(listed: Vec<Listed>) -> ManifestFiles {
    let mut files = ManifestFiles::default();
    for entry in listed {
        match layout::classify_manifest_file(&entry.path) {
            Some(ManifestFile::Committed(epoch)) => files.committed.push((epoch, entry.path, entry.size)),
            Some(ManifestFile::Leftover(_)) => files.leftovers.push(entry),
            None => {}
        }
    }
    files.committed.sort_by_key(|(epoch, _, _)| std::cmp::Reverse(*epoch));
    files
}

/// The first object of `manifest` that is not in the listing, or ends before a range the
/// manifest names in it, described.
fn missing_object(manifest: &Manifest, sizes: &BTreeMap<&str, u64>) -> Option<String> {
    manifest.objects().find_map(|object| match sizes.get(object.path.as_str()) {
        Some(size) if object.range().is_some_and(|range| *size >= range.end) => None,
        Some(size) => Some(format!(
            "object {:?} has {size} bytes, expected at least {}",
            object.path,
            object.offset.saturating_add(object.size)
        )),
        None => Some(format!("object {:?} is missing", object.path)),
    })
}

impl Doomed {
    fn add_manifest(&mut self, path: &str, size: u64) {
        self.manifests.push(path.to_string());
        self.bytes = self.bytes.saturating_add(size);
    }
}

#[cfg(test)]
mod tests;
