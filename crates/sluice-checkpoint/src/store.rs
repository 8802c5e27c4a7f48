//! The checkpoint store: immutable state objects, then one atomically published manifest.
//!
//! Protocol for epoch `e` (the checkpointer's side):
//! 1. every state object is written with [`CheckpointStore::put_object`], which returns only
//!    when the object is durable: `LocalFileSystem` (fsync enabled) writes a staged file,
//!    fsyncs it, renames it into place and fsyncs the directories it changed; an object
//!    store acknowledges a PUT only once the object is stored;
//! 2. [`CheckpointStore::publish`] checks that every object the manifest names exists with
//!    its size (one listing per epoch directory involved), then makes the manifest visible
//!    in one atomic step, so a reader sees either no manifest `e` or all of it:
//!    - local directory: the encoded manifest is written and fsynced as `epoch-….tmp`, then
//!      linked to its final `.manifest` name (an atomic create that fails if the name
//!      exists) and the staged name is removed; the directory is fsynced;
//!    - object store: a conditional PUT (`If-None-Match: *`, `PutMode::Create`) of the final
//!      name, because a rename there is copy + delete and not atomic; a single PUT is.
//!
//! Every publish is fenced by the store's lease (see `lease`): it reads the lease just
//! before the atomic step and refuses (`checkpoint.lease_lost`) unless this handle's run
//! still holds it, so a run whose lease was broken never writes a manifest.
//!
//! Epochs are published in increasing order (publish refuses an epoch below the newest
//! manifest, and `put_object` refuses to write into an epoch this process saw published), so
//! the newest manifest is always the newest commit.
//!
//! Hence invariant 1 ("a committed manifest names only files that exist and were fully
//! written"): objects are durable before publish starts (step 1), publish re-checks them,
//! nothing deletes an object while a manifest naming it is kept (see `collect`), and a
//! manifest is never overwritten (create-only publish).
//!
//! If `publish` returns an error, manifest `e` may or may not be committed (the failure may
//! have come after the atomic step). The runtime fails that checkpoint and tries again at
//! the next interval under a higher epoch, keeping `e`'s sink records to commit with the
//! next published manifest, which also names every state object `e` named (a worker's
//! runs stay in its lists once written, whether or not their manifest was published). A
//! committed `e` is harmless: epochs only increase, publish is create-only, and recovery
//! restores the newest manifest and commits its records (commits are idempotent).
//!
//! Readers trust nothing: [`CheckpointStore::load`] decodes with checksums,
//! [`CheckpointStore::verify`] reads every object back and checks size and checksum, and
//! [`CheckpointStore::latest_valid`] restores from the newest manifest that passes both.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{PutMode, PutPayload};
use sluice_types::{ErrorKind, SluiceError};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::calls::{Calls, Failure};
use crate::layout::{self, ManifestFile};
use crate::lease::LeaseSlot;
use crate::location;
use crate::manifest::{self, MANIFEST_BYTES_MAX, Manifest, ObjectRef};

/// How many objects `verify` reads at once.
pub const VERIFY_CONCURRENCY: usize = 8;
/// The bytes of one read when an object is checked or uploaded piece by piece (so that
/// a run of gigabytes never sits in memory whole): at most this times
/// [`VERIFY_CONCURRENCY`] bytes are held by a verification.
pub const CHUNK_BYTES: usize = 8 << 20;
/// How many objects `put_packs` writes at once (a worker writes one per operator with
/// state: each waits for its own durable write, a local file's fsyncs or a remote
/// store's round trip).
pub const PUT_CONCURRENCY: usize = 16;

/// A checkpoint store at one URL. Safe to share between threads; every method blocks the
/// calling thread (which must not be inside an async task) until its I/O is done.
#[derive(Debug)]
pub struct CheckpointStore {
    pub(crate) calls: Arc<Calls>,
    /// One more than the highest epoch this process saw published (0: none), to refuse
    /// writing objects into an epoch that is already committed.
    published_above: AtomicU64,
    /// The lease this handle acquired, if any (see `lease`).
    pub(crate) lease: Arc<LeaseSlot>,
}

impl CheckpointStore {
    /// Opens the store at `url` (see the crate doc for the forms); relative local paths
    /// resolve against `base_dir`. Performs no I/O and creates nothing.
    pub fn open(url: &str, base_dir: &Path) -> Result<CheckpointStore, SluiceError> {
        CheckpointStore::open_with_options(url, base_dir, &[])
    }

    /// Like [`CheckpointStore::open`], with object-store options that override the
    /// environment: the names of the service's variables in lower case (`aws_endpoint`,
    /// `aws_allow_http`, `azure_storage_account_name`, `azure_storage_endpoint`,
    /// `google_service_account`, ...). An unknown option is refused; local directories take
    /// no options.
    pub fn open_with_options(
        url: &str,
        base_dir: &Path,
        options: &[(String, String)],
    ) -> Result<CheckpointStore, SluiceError> {
        let location = location::resolve(url, base_dir, options)?;
        let calls = Arc::new(Calls::new(location)?);
        Ok(CheckpointStore { calls, published_above: AtomicU64::new(0), lease: Arc::default() })
    }

    /// The resolved URL (local paths are absolute `file://` URLs).
    pub fn url(&self) -> &str {
        self.calls.url()
    }

    /// Writes the immutable object `state/epoch-{epoch}/{name}`; durable when this returns.
    ///
    /// `name` is `/`-separated parts of `[A-Za-z0-9._=-]`. `epoch` must be above every
    /// published epoch (an object of a committed epoch is never rewritten); rewriting an
    /// object of an abandoned, unpublished epoch is allowed.
    pub fn put_object(&self, epoch: u64, name: &str, bytes: Vec<u8>) -> Result<ObjectRef, SluiceError> {
        let written = self.put_packs(epoch, vec![(name.to_string(), vec![bytes])])?;
        Ok(written.into_iter().flatten().next().expect("one pack of one state gives one reference"))
    }

    /// Writes packs of `epoch` at once (at most [`PUT_CONCURRENCY`] writes in flight):
    /// each `(name, states)` is one object holding its states one after the other, and
    /// each state gets its own reference (its offset, size and checksum in that object),
    /// in the order given. Durable as [`CheckpointStore::put_object`]. The first failure
    /// fails the whole (objects already written are unreferenced, collected later).
    pub fn put_packs(
        &self,
        epoch: u64,
        packs: Vec<(String, Vec<Vec<u8>>)>,
    ) -> Result<Vec<Vec<ObjectRef>>, SluiceError> {
        self.check_epoch_open(epoch)?;
        let mut writes = Vec::with_capacity(packs.len());
        for (name, states) in packs {
            let path = layout::object_path(epoch, &name)?;
            let mut offset = 0;
            let mut objects = Vec::with_capacity(states.len());
            let mut parts = Vec::with_capacity(states.len());
            for state in states {
                let size = state.len() as u64;
                objects.push(ObjectRef { path: path.clone(), offset, size, checksum: crc32fast::hash(&state) });
                offset += size;
                parts.push(Bytes::from(state));
            }
            writes.push((path, offset, objects, PutPayload::from_iter(parts)));
        }
        self.calls.block_on(async {
            let puts = futures::stream::iter(writes).map(|(path, size, objects, payload)| async move {
                self.calls
                    .put_payload(&path, payload, PutMode::Overwrite)
                    .await
                    .map_err(|failure| self.failure("writing", &path, failure))?;
                tracing::debug!(%path, size, states = objects.len(), "checkpoint object written");
                Ok::<_, SluiceError>(objects)
            });
            puts.buffered(PUT_CONCURRENCY).try_collect().await
        })
    }

    /// Writes the local file `file` as the immutable object `state/epoch-{epoch}/{name}`,
    /// reading it [`CHUNK_BYTES`] at a time (a multipart upload when it is larger); durable
    /// when this returns, as [`CheckpointStore::put_object`]. `checksum` is the CRC-32 of
    /// the file as its writer computed it; the bytes read are checked against it, so a
    /// file changed on disk before its upload is refused, never stored under a wrong
    /// checksum.
    pub fn put_file(&self, epoch: u64, name: &str, file: &Path, checksum: u32) -> Result<ObjectRef, SluiceError> {
        let written = self.put_files(epoch, vec![(name.to_string(), file.to_path_buf(), checksum)])?;
        Ok(written.into_iter().next().expect("one file gives one reference"))
    }

    /// Writes several local files as [`CheckpointStore::put_file`] does, at most
    /// [`PUT_CONCURRENCY`] at once (each waits for its own durable write); references in
    /// the order given. The first failure fails the whole (objects already written are
    /// unreferenced, collected later).
    pub fn put_files(
        &self,
        epoch: u64,
        files: Vec<(String, std::path::PathBuf, u32)>,
    ) -> Result<Vec<ObjectRef>, SluiceError> {
        self.check_epoch_open(epoch)?;
        let mut uploads = Vec::with_capacity(files.len());
        for (name, file, checksum) in files {
            uploads.push((layout::object_path(epoch, &name)?, file, checksum));
        }
        self.calls.block_on(async {
            let puts = futures::stream::iter(uploads)
                .map(|(path, file, checksum)| async move { self.upload_file(path, &file, checksum).await });
            puts.buffered(PUT_CONCURRENCY).try_collect().await
        })
    }

    /// Uploads one local file (see [`CheckpointStore::put_file`]): into a local store on
    /// the file's own file system, the file itself (a hard link), once its bytes are
    /// checked; elsewhere a copy of its bytes.
    async fn upload_file(&self, path: String, file: &Path, checksum: u32) -> Result<ObjectRef, SluiceError> {
        let Some(root) = self.calls.local_root() else { return self.copy_file(path, file, checksum).await };
        let size = self.check_local(&path, file, checksum)?;
        let linked = link_local(file, &root.join(&path)).map_err(|error| {
            SluiceError::external(
                "checkpoint.write",
                format!("linking {} as {path:?} in {}: {error}", file.display(), self.url()),
            )
            .with_fix("check that the checkpoint directory is writable and its disk has room")
        })?;
        if !linked {
            return self.copy_file(path, file, checksum).await;
        }
        tracing::debug!(%path, size, "checkpoint object linked from a file");
        Ok(ObjectRef { path, offset: 0, size, checksum })
    }

    /// Reads the local file `file` through and checks it against its writer's CRC-32
    /// `checksum`; its size.
    fn check_local(&self, path: &str, file: &Path, checksum: u32) -> Result<u64, SluiceError> {
        let local = |error: std::io::Error| {
            SluiceError::external(
                "checkpoint.local_read",
                format!("reading {} to write it as {path:?} in {}: {error}", file.display(), self.url()),
            )
        };
        let reader = std::fs::File::open(file).map_err(local)?;
        let size = reader.metadata().map_err(local)?.len();
        let computed = file_crc(&reader, 0..size).map_err(local)?;
        if computed != checksum {
            return Err(local_changed(path, file, computed, checksum));
        }
        Ok(size)
    }

    /// Uploads one local file by reading it and writing its bytes (see
    /// [`CheckpointStore::put_file`]).
    async fn copy_file(&self, path: String, file: &Path, checksum: u32) -> Result<ObjectRef, SluiceError> {
        let local = |error: std::io::Error| {
            SluiceError::external(
                "checkpoint.local_read",
                format!("reading {} to write it as {path:?} in {}: {error}", file.display(), self.url()),
            )
        };
        let mut reader = std::fs::File::open(file).map_err(local)?;
        let size = reader.metadata().map_err(local)?.len();
        let mut hasher = crc32fast::Hasher::new();
        let mut read_chunk = |hasher: &mut crc32fast::Hasher| -> Result<Bytes, SluiceError> {
            let mut chunk = Vec::with_capacity(CHUNK_BYTES.min(size as usize));
            std::io::Read::by_ref(&mut reader).take(CHUNK_BYTES as u64).read_to_end(&mut chunk).map_err(local)?;
            hasher.update(&chunk);
            Ok(Bytes::from(chunk))
        };
        let changed = |computed: u32| local_changed(&path, file, computed, checksum);
        if size <= CHUNK_BYTES as u64 {
            let bytes = read_chunk(&mut hasher)?;
            if bytes.len() as u64 != size || hasher.clone().finalize() != checksum {
                return Err(changed(hasher.finalize()));
            }
            self.calls
                .put_payload(&path, PutPayload::from_bytes(bytes), PutMode::Overwrite)
                .await
                .map_err(|failure| self.failure("writing", &path, failure))?;
        } else {
            let mut upload = self.calls.upload(&path).await?;
            let mut sent = 0u64;
            while sent < size {
                let chunk = read_chunk(&mut hasher)?;
                if chunk.is_empty() {
                    break;
                }
                sent += chunk.len() as u64;
                upload.part(chunk).await?;
            }
            if sent != size || hasher.clone().finalize() != checksum {
                upload.abort().await;
                return Err(changed(hasher.finalize()));
            }
            upload.complete().await?;
        }
        tracing::debug!(%path, size, "checkpoint object written from a file");
        Ok(ObjectRef { path, offset: 0, size, checksum })
    }

    /// Reads `length` bytes at `offset` within `object` (a part of a run), unchecked: the
    /// caller checks what it reads (a run's blocks carry their own checksums).
    pub fn read_within(&self, object: &ObjectRef, offset: u64, length: u64) -> Result<Vec<u8>, SluiceError> {
        let inside = offset.checked_add(length).filter(|end| *end <= object.size);
        let (Some(end), Some(base)) = (inside, object.range()) else {
            return Err(SluiceError::internal(
                "checkpoint.object_range",
                format!(
                    "{length} bytes at {offset} are outside state object {:?} of {} bytes",
                    object.path, object.size
                ),
            ));
        };
        let range = base.start + offset..base.start + end;
        if let Some(root) = self.calls.local_root() {
            return self.read_local_within(&root.join(&object.path), object, range);
        }
        self.calls.block_on(async {
            match self.calls.get_range(&object.path, range.clone()).await {
                Ok(Ok(bytes)) if bytes.len() as u64 == length => Ok(bytes.to_vec()),
                Ok(Ok(bytes)) => Err(self.damaged_object(
                    object,
                    format!("{} bytes read at {}, expected {length}", bytes.len(), range.start),
                )),
                Ok(Err(actual)) => {
                    Err(self
                        .damaged_object(object, format!("truncated: {actual} bytes, expected at least {}", range.end)))
                }
                Err(Failure::Missing) => Err(self.damaged_object(object, "missing".to_string())),
                Err(failure) => Err(self.failure("reading", &object.path, failure)),
            }
        })
    }

    /// [`CheckpointStore::read_within`] for a local store: one positioned read of the
    /// file on the calling thread. (Through `object_store` each read was a task on the
    /// store's runtime handing an open, a read and a close to a blocking thread: a merge
    /// reading runs block by block paid two thread switches per 64 KiB block.)
    fn read_local_within(
        &self,
        file: &Path,
        object: &ObjectRef,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, SluiceError> {
        use std::os::unix::fs::FileExt;
        let reading = |error: std::io::Error| self.calls.error("reading", &object.path, error);
        let opened = match std::fs::File::open(file) {
            Ok(opened) => opened,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.damaged_object(object, "missing".to_string()));
            }
            Err(error) => return Err(reading(error)),
        };
        let mut bytes = vec![0u8; (range.end - range.start) as usize];
        match opened.read_exact_at(&mut bytes, range.start) {
            Ok(()) => Ok(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                let actual = opened.metadata().map_err(reading)?.len();
                let problem = format!("truncated: {actual} bytes, expected at least {}", range.end);
                Err(self.damaged_object(object, problem))
            }
            Err(error) => Err(reading(error)),
        }
    }

    /// The error of an object that is not as its reference says.
    fn damaged_object(&self, object: &ObjectRef, problem: String) -> SluiceError {
        let code = if problem == "missing" { "checkpoint.object_missing" } else { "checkpoint.object_truncated" };
        SluiceError::external(code, format!("state object {:?} in {}: {problem}", object.path, self.url()))
            .with_kind(ErrorKind::DamagedObject)
    }

    /// Refuses objects of an epoch that is already published (see `put_packs`).
    fn check_epoch_open(&self, epoch: u64) -> Result<(), SluiceError> {
        if epoch < self.published_above.load(Ordering::Acquire) {
            return Err(SluiceError::internal(
                "checkpoint.epoch_published",
                format!("objects of epoch {epoch} come after it was published in {}", self.url()),
            )
            .with_fix("write each checkpoint under an epoch above every published one"));
        }
        Ok(())
    }

    /// Reads a state back (its range of its object) and checks its size and checksum.
    pub fn get_object(&self, object: &ObjectRef) -> Result<Vec<u8>, SluiceError> {
        self.calls.block_on(self.read_object(object))
    }

    /// Reads several states back at once (at most [`VERIFY_CONCURRENCY`] reads in
    /// flight), each checked as [`CheckpointStore::get_object`] does, in the order given.
    pub fn get_objects(&self, objects: &[&ObjectRef]) -> Result<Vec<Vec<u8>>, SluiceError> {
        self.calls.block_on(async {
            let reads = futures::stream::iter(objects.iter().copied()).map(|object| self.read_object(object));
            reads.buffered(VERIFY_CONCURRENCY).try_collect().await
        })
    }

    pub(crate) async fn read_object(&self, object: &ObjectRef) -> Result<Vec<u8>, SluiceError> {
        if layout::epoch_of_object(&object.path).is_none() {
            let message = format!("{:?} is not a state object path", object.path);
            return Err(SluiceError::internal("checkpoint.object_name", message));
        }
        // Every failure named here is damage to this object ([`ErrorKind::DamagedObject`]),
        // as opposed to a store that cannot be reached.
        let named = |code, problem: String| {
            SluiceError::external(code, format!("state object {:?} in {}: {problem}", object.path, self.url()))
                .with_kind(ErrorKind::DamagedObject)
        };
        let Some(range) = object.range() else {
            return Err(named("checkpoint.object_range", format!("its range overflows: {object:?}")));
        };
        let bytes = match self.calls.get_range(&object.path, range.clone()).await {
            Ok(Ok(bytes)) if bytes.len() as u64 == object.size => bytes,
            Ok(Ok(bytes)) => {
                let problem = format!("{} bytes read at {}, expected {}", bytes.len(), object.offset, object.size);
                return Err(named("checkpoint.object_truncated", problem));
            }
            Ok(Err(actual)) => {
                return Err(named(
                    "checkpoint.object_truncated",
                    format!("truncated: {actual} bytes, expected at least {}", range.end),
                ));
            }
            Err(Failure::Missing) => return Err(named("checkpoint.object_missing", "missing".to_string())),
            Err(failure) => return Err(self.failure("reading", &object.path, failure)),
        };
        let checksum = crc32fast::hash(&bytes);
        if checksum != object.checksum {
            let problem = format!("checksum mismatch: computed {checksum:#010x}, expected {:#010x}", object.checksum);
            return Err(named("checkpoint.object_checksum", problem));
        }
        Ok(bytes.to_vec())
    }

    /// Reads `object` [`CHUNK_BYTES`] at a time and checks its size and checksum, as
    /// [`CheckpointStore::get_object`] does without holding it whole.
    pub(crate) async fn check_object(&self, object: &ObjectRef) -> Result<(), SluiceError> {
        if object.size <= CHUNK_BYTES as u64 {
            return self.read_object(object).await.map(drop);
        }
        let Some(range) = object.range() else {
            let problem = format!("its range overflows: {object:?}");
            return Err(self.damaged_object(object, problem));
        };
        if let Some(root) = self.calls.local_root() {
            return self.check_local_object(&root.join(&object.path), object, range);
        }
        let mut hasher = crc32fast::Hasher::new();
        let mut at = range.start;
        while at < range.end {
            let end = (at + CHUNK_BYTES as u64).min(range.end);
            let bytes = match self.calls.get_range(&object.path, at..end).await {
                Ok(Ok(bytes)) if bytes.len() as u64 == end - at => bytes,
                Ok(Ok(bytes)) => {
                    let problem = format!("{} bytes read at {at}, expected {}", bytes.len(), end - at);
                    return Err(self.damaged_object(object, problem));
                }
                Ok(Err(actual)) => {
                    let problem = format!("truncated: {actual} bytes, expected at least {}", range.end);
                    return Err(self.damaged_object(object, problem));
                }
                Err(Failure::Missing) => return Err(self.damaged_object(object, "missing".to_string())),
                Err(failure) => return Err(self.failure("reading", &object.path, failure)),
            };
            hasher.update(&bytes);
            at = end;
        }
        let checksum = hasher.finalize();
        if checksum != object.checksum {
            return Err(self.checksum_mismatch(object, checksum));
        }
        Ok(())
    }

    /// [`CheckpointStore::check_object`] for a local store: the file read into one buffer,
    /// reused. (Through `object_store`, each piece of a large object was a buffer of its
    /// own, allocated on a blocking thread and freed on another, and the allocator kept
    /// them: verifying a 1.65 GB checkpoint peaked at as much.)
    fn check_local_object(
        &self,
        file: &Path,
        object: &ObjectRef,
        range: std::ops::Range<u64>,
    ) -> Result<(), SluiceError> {
        let opened = match std::fs::File::open(file) {
            Ok(opened) => opened,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.damaged_object(object, "missing".to_string()));
            }
            Err(error) => return Err(self.calls.error("reading", &object.path, error)),
        };
        let reading = |error: std::io::Error| self.calls.error("reading", &object.path, error);
        let actual = opened.metadata().map_err(reading)?.len();
        if actual < range.end {
            let problem = format!("truncated: {actual} bytes, expected at least {}", range.end);
            return Err(self.damaged_object(object, problem));
        }
        let checksum = file_crc(&opened, range).map_err(reading)?;
        if checksum != object.checksum {
            return Err(self.checksum_mismatch(object, checksum));
        }
        Ok(())
    }

    /// The error of an object whose bytes have the CRC-32 `computed`, not its own.
    fn checksum_mismatch(&self, object: &ObjectRef, computed: u32) -> SluiceError {
        let problem = format!("checksum mismatch: computed {computed:#010x}, expected {:#010x}", object.checksum);
        SluiceError::external(
            "checkpoint.object_checksum",
            format!("state object {:?} in {}: {problem}", object.path, self.url()),
        )
        .with_kind(ErrorKind::DamagedObject)
    }

    /// Publishes `manifest` atomically (see the module doc). Every object it names must be
    /// durable already; publishing the same manifest twice is harmless, publishing a
    /// different manifest for a published epoch is refused, and so is one larger than
    /// [`MANIFEST_BYTES_MAX`] (`checkpoint.manifest_too_large`, before any I/O). Needs the store's lease
    /// (`checkpoint.lease_missing`, `checkpoint.lease_lost` otherwise).
    pub fn publish(&self, manifest: &Manifest) -> Result<(), SluiceError> {
        manifest.check()?;
        let epoch = manifest.epoch;
        let bytes = Bytes::from(manifest::encode(manifest));
        // A manifest `load` would refuse is never written: recovery would take it for
        // damage and fall back past it, to state older than what its sinks committed.
        if bytes.len() as u64 > MANIFEST_BYTES_MAX {
            return Err(SluiceError::external(
                "checkpoint.manifest_too_large",
                format!(
                    "the manifest of epoch {epoch} takes {} bytes, more than the {MANIFEST_BYTES_MAX} a store reads \
                     back; nothing was published",
                    bytes.len()
                ),
            )
            .with_fix(
                "the manifest names every state object and carries the sinks' small records: run with fewer \
                 threads or vnodes, or make sure checkpoints succeed (a failed checkpoint's records ride along \
                 with the next)",
            ));
        }
        self.calls.block_on(async {
            self.check_order(epoch).await?;
            self.check_written(manifest).await?;
            self.check_lease(&format!("publishing epoch {epoch}")).await?;
            let path = layout::manifest_path(epoch);
            let outcome = match self.calls.local_root() {
                Some(_) => self.publish_local(epoch, bytes.clone()).await,
                None => self.calls.put(&path, bytes.clone(), PutMode::Create).await,
            };
            match outcome {
                Ok(()) => Ok(()),
                Err(Failure::Exists) => self.check_republished(epoch, &bytes).await,
                Err(failure) => Err(self.failure("publishing", &path, failure)),
            }
        })?;
        self.published_above.fetch_max(epoch.saturating_add(1), Ordering::AcqRel);
        tracing::info!(epoch, store = self.url(), "checkpoint published");
        Ok(())
    }

    async fn publish_local(&self, epoch: u64, bytes: Bytes) -> Result<(), Failure> {
        let staged = layout::manifest_tmp_path(epoch);
        self.calls.put(&staged, bytes, PutMode::Overwrite).await?;
        let outcome = self.calls.rename_if_not_exists(&staged, &layout::manifest_path(epoch)).await;
        if outcome.is_err() {
            // Best effort: a leftover staged manifest is ignored and later collected.
            let _ = self.calls.delete_all(&[staged]).await;
        }
        outcome
    }

    /// A manifest of `epoch` already exists: fine if it is this one (a retried publish).
    async fn check_republished(&self, epoch: u64, bytes: &Bytes) -> Result<(), SluiceError> {
        let path = layout::manifest_path(epoch);
        match self.calls.get(&path, MANIFEST_BYTES_MAX).await {
            Ok(Ok(existing)) if existing == *bytes => Ok(()),
            Ok(_) | Err(Failure::Exists | Failure::Missing) => Err(SluiceError::internal(
                "checkpoint.manifest_exists",
                format!("epoch {epoch} is already published in {} with a different manifest", self.url()),
            )
            .with_fix("write each checkpoint under an epoch above every published one")),
            Err(Failure::Other(error)) => Err(error),
        }
    }

    /// Asserts that epochs are published in increasing order, so that the newest manifest
    /// is always the newest commit (re-publishing the newest epoch is left to the
    /// create-only write, which accepts an identical manifest).
    async fn check_order(&self, epoch: u64) -> Result<(), SluiceError> {
        let newest = self.committed_epochs().await?.pop_last();
        match newest {
            Some(newest) if epoch < newest => Err(SluiceError::internal(
                "checkpoint.epoch_order",
                format!("epoch {epoch} cannot be published in {}: epoch {newest} already is", self.url()),
            )
            .with_fix("write each checkpoint under an epoch above every published one")),
            Some(_) | None => Ok(()),
        }
    }

    async fn committed_epochs(&self) -> Result<BTreeSet<u64>, SluiceError> {
        let listed = self.calls.list(layout::MANIFEST_DIR).await?;
        let committed = listed.iter().filter_map(|entry| match layout::classify_manifest_file(&entry.path) {
            Some(ManifestFile::Committed(epoch)) => Some(epoch),
            Some(ManifestFile::Leftover(_)) | None => None,
        });
        Ok(committed.collect())
    }

    /// Asserts the precondition of publish: every object exists, and holds every range
    /// the manifest names in it.
    async fn check_written(&self, manifest: &Manifest) -> Result<(), SluiceError> {
        let epochs: BTreeSet<u64> = manifest.objects().filter_map(|o| layout::epoch_of_object(&o.path)).collect();
        let mut sizes = BTreeMap::new();
        for epoch in epochs {
            for listed in self.calls.list(&layout::epoch_dir(epoch)).await? {
                sizes.insert(listed.path, listed.size);
            }
        }
        for object in manifest.objects() {
            let end = object.range().map_or(u64::MAX, |range| range.end);
            let problem = match sizes.get(&object.path) {
                Some(size) if *size >= end => continue,
                Some(size) => format!("has {size} bytes, the manifest names bytes up to {end}"),
                None => "is not in the store".to_string(),
            };
            return Err(SluiceError::internal(
                "checkpoint.publish_unwritten",
                format!("manifest of epoch {} names object {:?}, which {problem}", manifest.epoch, object.path),
            )
            .with_fix("publish a manifest only after put_object returned for every object it names"));
        }
        Ok(())
    }

    /// Committed epochs, ascending (staged `.tmp` manifests and foreign files are ignored).
    pub fn epochs(&self) -> Result<Vec<u64>, SluiceError> {
        let epochs = self.calls.block_on(self.committed_epochs())?;
        if let Some(newest) = epochs.last() {
            self.published_above.fetch_max(newest.saturating_add(1), Ordering::AcqRel);
        }
        Ok(epochs.into_iter().collect())
    }

    /// Reads and decodes the manifest of `epoch` (checksums, version, self-consistency).
    pub fn load(&self, epoch: u64) -> Result<Manifest, SluiceError> {
        self.calls.block_on(self.load_async(epoch))
    }

    pub(crate) async fn load_async(&self, epoch: u64) -> Result<Manifest, SluiceError> {
        let path = layout::manifest_path(epoch);
        let context = format!("checkpoint epoch {epoch} ({path} in {})", self.url());
        let bytes = match self.calls.get(&path, MANIFEST_BYTES_MAX).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(size)) => {
                let message = format!("manifest has {size} bytes, more than the {MANIFEST_BYTES_MAX} allowed");
                return Err(SluiceError::external("checkpoint.manifest_too_large", message)
                    .with_kind(ErrorKind::DamagedManifest)
                    .context(context));
            }
            Err(Failure::Missing) => {
                return Err(SluiceError::user("checkpoint.manifest_missing", "no such manifest")
                    .with_kind(ErrorKind::DamagedManifest)
                    .context(context)
                    .with_fix("list the published epochs with `sluice checkpoints list`"));
            }
            Err(failure) => return Err(self.failure("reading", &path, failure)),
        };
        let manifest = manifest::decode(&bytes).map_err(|error| error.context(&context))?;
        if manifest.epoch != epoch {
            let message = format!("the manifest inside is for epoch {}", manifest.epoch);
            return Err(SluiceError::internal("checkpoint.manifest_inconsistent", message)
                .with_kind(ErrorKind::DamagedManifest)
                .context(context));
        }
        Ok(manifest)
    }

    /// Reads every object the manifest names and checks it; returns the problems found,
    /// each naming its object (empty: the manifest can be restored from). Fails only when
    /// the store itself cannot be read.
    pub fn verify(&self, manifest: &Manifest) -> Result<Vec<String>, SluiceError> {
        if let Err(error) = manifest.check() {
            return Ok(vec![error.message]);
        }
        self.calls.block_on(async {
            let objects = manifest.distinct_objects();
            let reads = futures::stream::iter(objects).map(|object| self.check_object(object));
            let mut outcomes = reads.buffered(VERIFY_CONCURRENCY);
            let mut problems = Vec::new();
            while let Some(outcome) = outcomes.next().await {
                match outcome {
                    Ok(_) => {}
                    Err(error) if error.kind == ErrorKind::DamagedObject => problems.push(error.message),
                    Err(error) => return Err(error),
                }
            }
            Ok(problems)
        })
    }

    /// The newest manifest that decodes and verifies, with one warning per newer damaged
    /// manifest (naming its epoch and the problem). `None` when the store has no manifest;
    /// an error when it has manifests but none is valid (restoring nothing would silently
    /// replay everything), or when the store cannot be read (a transient failure must not
    /// make an older epoch look like the newest).
    ///
    /// The next checkpoint's epoch must still be above every epoch in
    /// [`CheckpointStore::epochs`], damaged ones included.
    pub fn latest_valid(&self) -> Result<Option<(Manifest, Vec<String>)>, SluiceError> {
        let epochs = self.epochs()?;
        let mut warnings = Vec::new();
        for &epoch in epochs.iter().rev() {
            let problems = match self.load(epoch) {
                Ok(manifest) => {
                    let problems = self.verify(&manifest)?;
                    if problems.is_empty() {
                        return Ok(Some((manifest, warnings)));
                    }
                    problems.join("; ")
                }
                Err(error) if error.kind == ErrorKind::DamagedManifest => error.message,
                Err(error) => return Err(error),
            };
            warnings.push(format!("checkpoint epoch {epoch} is damaged and skipped: {problems}"));
        }
        if epochs.is_empty() {
            return Ok(None);
        }
        Err(SluiceError::external(
            "checkpoint.no_valid_manifest",
            format!("none of the {} checkpoints in {} is valid: {}", epochs.len(), self.url(), warnings.join(" | ")),
        )
        .with_fix("inspect them with `sluice checkpoints verify`, or start over with --from-scratch"))
    }

    /// Total size in bytes of the objects a manifest names (each once).
    pub fn size(&self, manifest: &Manifest) -> u64 {
        manifest.distinct_objects().iter().fold(0u64, |total, object| total.saturating_add(object.size))
    }

    pub(crate) fn failure(&self, action: &str, path: &str, failure: Failure) -> SluiceError {
        match failure {
            Failure::Other(error) => error,
            Failure::Missing => self.calls.error(action, path, "not found"),
            Failure::Exists => self.calls.error(action, path, "it already exists"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// Makes the local file `file` the object at `target` of a local store by a hard link,
/// durable when this returns (the file's bytes, then the link's directory, are synced);
/// false when the two are on different file systems, links are not supported, or the
/// file has no name to link (an unlinked file not made with `O_TMPFILE`), for the caller
/// to copy the bytes instead. `file` may be `/proc/self/fd/N` of an anonymous file made
/// with `O_TMPFILE` (`tempfile::tempfile_in`): the link follows it to the file. An object
/// of an unpublished epoch written before (a retried upload) is replaced.
fn link_local(file: &Path, target: &Path) -> std::io::Result<bool> {
    std::fs::File::open(file)?.sync_all()?;
    let directory = target.parent().expect("an object's path is inside the store's root");
    std::fs::create_dir_all(directory)?;
    match std::fs::remove_file(target) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let here = rustix::fs::CWD;
    match rustix::fs::linkat(here, file, here, target, rustix::fs::AtFlags::SYMLINK_FOLLOW) {
        Ok(()) => {}
        Err(errno) if [EXDEV, EPERM, EOPNOTSUPP, ENOENT].contains(&errno.raw_os_error()) => return Ok(false),
        Err(errno) => return Err(errno.into()),
    }
    std::fs::File::open(directory)?.sync_all()?;
    Ok(true)
}

/// `errno` values meaning "no hard link here": another file system, one without links,
/// or a file without a name.
const EXDEV: i32 = 18;
const EPERM: i32 = 1;
const EOPNOTSUPP: i32 = 95;
const ENOENT: i32 = 2;

/// A local file whose bytes are not what its writer wrote.
fn local_changed(path: &str, file: &Path, computed: u32, checksum: u32) -> SluiceError {
    SluiceError::external(
        "checkpoint.local_changed",
        format!(
            "{} changed on disk before it was written as {path:?}: CRC-32 {computed:#010x}, its writer's \
             {checksum:#010x}",
            file.display()
        ),
    )
    .with_fix("nothing but this process may write its state directory; check the disk for errors")
}

/// The CRC-32 of the bytes `range` of `file`, read [`CHUNK_BYTES`] at a time into one buffer.
fn file_crc(file: &std::fs::File, range: std::ops::Range<u64>) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; CHUNK_BYTES.min(range.end.saturating_sub(range.start) as usize)];
    let mut at = range.start;
    while at < range.end {
        let length = (range.end - at).min(CHUNK_BYTES as u64) as usize;
        file.read_exact_at(&mut buffer[..length], at)?;
        hasher.update(&buffer[..length]);
        at += length as u64;
    }
    Ok(hasher.finalize())
}
