//! Bounded calls to the backend, run on the store's own runtime.
//!
//! The store's callers are synchronous threads (the checkpointer, the CLI), so the store
//! owns a small current-thread tokio runtime and blocks on it. Every backend call is
//! bounded by [`CALL_TIMEOUT`] on top of the backend's own per-request timeout and bounded
//! retries (see `location`), so no caller waits forever on a store that does not answer.
//!
//! Names passed here are relative to the store root; [`Calls`] prepends the prefix on the
//! way out and strips it on the way back, so nothing above this module sees backend keys.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{GetOptions, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use sluice_types::SluiceError;
use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use crate::location::Location;

/// The longest one backend call (including the backend's retries) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How many deletions go into one bounded call.
pub const DELETE_BATCH: usize = 1000;

/// Why a call failed, for the outcomes callers act on.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The object does not exist.
    Missing,
    /// A create-only write found the object already there.
    Exists,
    /// Anything else, already described.
    Other(SluiceError),
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Relative to the store root.
    pub(crate) path: String,
    pub(crate) size: u64,
}

/// The backend, its prefix and the runtime that drives it.
#[derive(Debug)]
pub(crate) struct Calls {
    location: Location,
    runtime: tokio::runtime::Runtime,
    /// The code of a failed call's error (`checkpoint.io` for the checkpoint store).
    io_code: &'static str,
}

impl Calls {
    pub(crate) fn new(location: Location) -> Result<Calls, SluiceError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|error| {
            SluiceError::external(
                "checkpoint.runtime",
                format!("cannot start the checkpoint store's I/O runtime: {error}"),
            )
        })?;
        Ok(Calls { location, runtime, io_code: "checkpoint.io" })
    }

    /// The same calls, whose failures carry `io_code` (a store other than a checkpoint
    /// store's).
    pub(crate) fn with_io_code(mut self, io_code: &'static str) -> Calls {
        self.io_code = io_code;
        self
    }

    pub(crate) fn url(&self) -> &str {
        &self.location.url
    }

    pub(crate) fn local_root(&self) -> Option<&std::path::Path> {
        self.location.local_root.as_deref()
    }

    /// Runs `work` to completion on the store's runtime. Refused inside an async task,
    /// where blocking would stall that task's executor.
    pub(crate) fn block_on<T>(&self, work: impl Future<Output = Result<T, SluiceError>>) -> Result<T, SluiceError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SluiceError::internal(
                "checkpoint.async_context",
                format!("checkpoint store {} was called from inside an async task", self.url()),
            )
            .with_fix("call the checkpoint store from a plain thread (e.g. tokio::task::spawn_blocking)"));
        }
        self.runtime.block_on(work)
    }

    fn key(&self, relative: &str) -> StorePath {
        let relative = StorePath::from(relative);
        self.location.prefix.parts().chain(relative.parts()).collect()
    }

    fn relative(&self, key: &StorePath) -> Option<String> {
        let parts: Vec<String> =
            key.prefix_match(&self.location.prefix)?.map(|part| part.as_ref().to_string()).collect();
        Some(parts.join("/"))
    }

    /// Describes a failed call, naming the action, the object and the store.
    pub(crate) fn error(&self, action: &str, relative: &str, error: impl std::fmt::Display) -> SluiceError {
        SluiceError::external(self.io_code, format!("{action} {relative:?} in {} failed: {error}", self.url()))
            .with_fix("check that the store is reachable and that its credentials allow read, write, list and delete")
    }

    fn failure(&self, action: &str, relative: &str, error: object_store::Error) -> Failure {
        match error {
            object_store::Error::NotFound { .. } => Failure::Missing,
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => Failure::Exists,
            other => Failure::Other(self.error(action, relative, other)),
        }
    }

    pub(crate) async fn put(&self, relative: &str, bytes: Bytes, mode: PutMode) -> Result<(), Failure> {
        self.put_payload(relative, PutPayload::from_bytes(bytes), mode).await
    }

    /// Writes `payload` (its parts one after the other) as one object.
    pub(crate) async fn put_payload(&self, relative: &str, payload: PutPayload, mode: PutMode) -> Result<(), Failure> {
        let key = self.key(relative);
        let options = PutOptions { mode, ..PutOptions::default() };
        let call = self.location.store.put_opts(&key, payload, options);
        bounded(call).await.map(drop).map_err(|error| self.failure("writing", relative, error))
    }

    /// Starts a multipart upload of one object (see [`Upload`]).
    pub(crate) async fn upload(&self, relative: &str) -> Result<Upload<'_>, SluiceError> {
        let key = self.key(relative);
        let call = self.location.store.put_multipart_opts(&key, object_store::PutMultipartOptions::default());
        let upload = bounded(call).await.map_err(|error| self.error("writing", relative, error))?;
        Ok(Upload { calls: self, relative: relative.to_string(), upload })
    }

    /// Reads the bytes `range` of an object (`Err(actual size)` when the object ends
    /// before the range does).
    pub(crate) async fn get_range(&self, relative: &str, range: Range<u64>) -> Result<Result<Bytes, u64>, Failure> {
        let key = self.key(relative);
        let call = async {
            if range.is_empty() {
                let meta = self.location.store.head(&key).await?;
                return Ok(if meta.size < range.end { Err(meta.size) } else { Ok(Bytes::new()) });
            }
            let options = GetOptions::default().with_range(Some(range.clone()));
            match self.location.store.get_opts(&key, options).await {
                Ok(result) if result.meta.size < range.end => Ok(Err(result.meta.size)),
                Ok(result) => result.bytes().await.map(Ok),
                Err(error @ object_store::Error::NotFound { .. }) => Err(error),
                // Backends refuse a range that starts past the end: tell it by the size.
                Err(error) => match self.location.store.head(&key).await {
                    Ok(meta) if meta.size < range.end => Ok(Err(meta.size)),
                    _ => Err(error),
                },
            }
        };
        bounded(call).await.map_err(|error| self.failure("reading", relative, error))
    }

    /// Reads an object of at most `size_max` bytes (`Err(actual)` without reading the body
    /// of a larger one).
    pub(crate) async fn get(&self, relative: &str, size_max: u64) -> Result<Result<Bytes, u64>, Failure> {
        let key = self.key(relative);
        let call = async {
            let result = self.location.store.get(&key).await?;
            let actual = result.meta.size;
            if actual > size_max {
                return Ok(Err(actual));
            }
            result.bytes().await.map(Ok)
        };
        bounded(call).await.map_err(|error| self.failure("reading", relative, error))
    }

    /// Every object under `relative_dir` (recursively), relative to the store root.
    pub(crate) async fn list(&self, relative_dir: &str) -> Result<Vec<Listed>, SluiceError> {
        self.list_after(relative_dir, None).await
    }

    /// Every object under `relative_dir` (recursively) whose name sorts after `after`
    /// (relative to the store root), or every one when `after` is `None`. The backend
    /// starts the listing there (S3's `start-after`, Azure's and GCS's equivalents), so
    /// its cost follows the entries after `after`, not the directory's.
    pub(crate) async fn list_after(&self, relative_dir: &str, after: Option<&str>) -> Result<Vec<Listed>, SluiceError> {
        let key = self.key(relative_dir);
        let stream = match after {
            None => self.location.store.list(Some(&key)),
            Some(after) => self.location.store.list_with_offset(Some(&key), &self.key(after)),
        };
        let metas = bounded(stream.try_collect::<Vec<_>>())
            .await
            .map_err(|error| self.error("listing", relative_dir, error))?;
        let listed = metas.into_iter().filter_map(|meta| {
            let path = self.relative(&meta.location)?;
            Some(Listed { path, size: meta.size })
        });
        Ok(listed.collect())
    }

    /// Moves `from` to `to` unless `to` exists (local directories only: a hard link, then
    /// the removal of `from`, both durable).
    pub(crate) async fn rename_if_not_exists(&self, from: &str, to: &str) -> Result<(), Failure> {
        let (from_key, to_key) = (self.key(from), self.key(to));
        let call = self.location.store.rename_if_not_exists(&from_key, &to_key);
        bounded(call).await.map_err(|error| self.failure("publishing", to, error))
    }

    /// Deletes `paths` in bounded batches; an object already gone counts as deleted.
    pub(crate) async fn delete_all(&self, paths: &[String]) -> Result<(), SluiceError> {
        for batch in paths.chunks(DELETE_BATCH) {
            let keys: Vec<object_store::Result<StorePath>> = batch.iter().map(|path| Ok(self.key(path))).collect();
            let results = self.location.store.delete_stream(futures::stream::iter(keys).boxed());
            let call = results.collect::<Vec<_>>();
            let outcomes =
                bounded(async { Ok(call.await) }).await.map_err(|error| self.error("deleting", &batch[0], error))?;
            for outcome in outcomes {
                match outcome {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(error) => return Err(self.error("deleting", &batch[0], error)),
                }
            }
        }
        Ok(())
    }
}

/// Bounds a backend call by [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_elapsed) => Err(object_store::Error::Generic {
            store: "checkpoint",
            source: format!("no answer within {} s", CALL_TIMEOUT.as_secs()).into(),
        }),
    }
}

/// An object written in parts, each bounded by [`CALL_TIMEOUT`]; visible, and durable, only
/// once [`Upload::complete`] returns.
pub(crate) struct Upload<'a> {
    calls: &'a Calls,
    relative: String,
    upload: Box<dyn object_store::MultipartUpload>,
}

impl Upload<'_> {
    pub(crate) async fn part(&mut self, bytes: Bytes) -> Result<(), SluiceError> {
        let call = self.upload.put_part(PutPayload::from_bytes(bytes));
        bounded(call).await.map_err(|error| self.calls.error("writing", &self.relative, error))
    }

    pub(crate) async fn complete(mut self) -> Result<(), SluiceError> {
        let call = self.upload.complete();
        bounded(call).await.map(drop).map_err(|error| self.calls.error("writing", &self.relative, error))
    }

    /// Gives the parts up (best effort: a store keeps no object of an upload never completed).
    pub(crate) async fn abort(mut self) {
        let _ = bounded(self.upload.abort()).await;
    }
}
