//! A directory of objects wherever a checkpoint store may live, for a writer of durable
//! output other than the checkpoint store (the Delta Lake sink's table).
//!
//! It resolves its URL exactly as the checkpoint store does (`location`: the same forms,
//! the same `AWS_*`/`AZURE_*`/`GOOGLE_*` variables and lower-case options, fsync on local
//! directories) and makes the same bounded calls (`calls`), synchronously: the caller is a
//! plain thread (a sink's driver thread or its committing controller thread). What it adds
//! is the few operations an append-only table log needs: a create-only write (the atomic
//! step of a commit), a plain write of an immutable object, a bounded read, a listing (whole,
//! or from a name on, so that a log's reader lists only its newest entries) and deletion.
//! It counts the entries its listings returned ([`ObjectDir::listed_entries`]): a listing
//! costs one request per 1,000 of them on S3.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::PutMode;
use sluice_types::SluiceError;

use crate::calls::{Calls, Failure};
use crate::location;
use crate::store::CHUNK_BYTES;

/// Objects under one URL (see the module doc).
#[derive(Debug)]
pub struct ObjectDir {
    calls: Calls,
    /// The entries every listing returned so far.
    listed_entries: AtomicU64,
}

impl ObjectDir {
    /// Opens the directory at `url` (a checkpoint store's URL forms), relative local paths
    /// against `base_dir`, with object-store `options` over the environment. `what` names
    /// it in messages (`Delta table`) and `io_code` is the code of a failed call's error.
    /// Performs no I/O and creates nothing.
    pub fn open(
        url: &str,
        base_dir: &Path,
        options: &[(String, String)],
        what: &str,
        io_code: &'static str,
    ) -> Result<ObjectDir, SluiceError> {
        let location = location::resolve(url, base_dir, options).map_err(|mut error| {
            // `location` describes the URL as a checkpoint store's; say what this one is.
            error.message = error.message.replacen("checkpoint store", what, 1);
            error.code = io_code;
            error
        })?;
        Ok(ObjectDir { calls: Calls::new(location)?.with_io_code(io_code), listed_entries: AtomicU64::new(0) })
    }

    /// The resolved URL (local paths are absolute `file://` URLs).
    pub fn url(&self) -> &str {
        self.calls.url()
    }

    /// Writes `relative` only if no object has that name: `true` when this call wrote it,
    /// `false` when it existed (someone else's). Atomic and durable when it returns.
    pub fn create(&self, relative: &str, bytes: Vec<u8>) -> Result<bool, SluiceError> {
        let outcome = self.calls.block_on(async {
            match self.calls.put(relative, Bytes::from(bytes), PutMode::Create).await {
                Ok(()) => Ok(true),
                Err(Failure::Exists) => Ok(false),
                Err(Failure::Missing) => Err(self.calls.error("writing", relative, "the parent does not exist")),
                Err(Failure::Other(error)) => Err(error),
            }
        })?;
        Ok(outcome)
    }

    /// Writes (or replaces) `relative`: one request up to [`CHUNK_BYTES`], a multipart
    /// upload of parts of that size beyond. Visible and durable only when it returns.
    pub fn put(&self, relative: &str, bytes: Bytes) -> Result<(), SluiceError> {
        self.calls.block_on(async {
            if bytes.len() <= CHUNK_BYTES {
                return self.calls.put(relative, bytes, PutMode::Overwrite).await.map_err(|failure| match failure {
                    Failure::Other(error) => error,
                    Failure::Missing | Failure::Exists => self.calls.error("writing", relative, "refused"),
                });
            }
            let mut upload = self.calls.upload(relative).await?;
            for start in (0..bytes.len()).step_by(CHUNK_BYTES) {
                let part = bytes.slice(start..bytes.len().min(start + CHUNK_BYTES));
                if let Err(error) = upload.part(part).await {
                    upload.abort().await;
                    return Err(error);
                }
            }
            upload.complete().await
        })
    }

    /// Reads `relative` whole: `None` when it does not exist; an error naming the size when
    /// it is larger than `size_max`.
    pub fn get(&self, relative: &str, size_max: u64) -> Result<Option<Bytes>, SluiceError> {
        match self.get_at_most(relative, size_max)? {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(actual)) => Err(self.calls.error(
                "reading",
                relative,
                format!("it holds {actual} bytes, more than the {size_max} a reader here takes"),
            )),
        }
    }

    /// Reads `relative` whole when it holds at most `size_max` bytes: `None` when it does not
    /// exist, `Some(Err(size))` (its body not read) when it is larger.
    pub fn get_at_most(&self, relative: &str, size_max: u64) -> Result<Option<Result<Bytes, u64>>, SluiceError> {
        self.calls.block_on(async {
            match self.calls.get(relative, size_max).await {
                Ok(read) => Ok(Some(read)),
                Err(Failure::Missing) => Ok(None),
                Err(Failure::Exists) => Err(self.calls.error("reading", relative, "refused")),
                Err(Failure::Other(error)) => Err(error),
            }
        })
    }

    /// Every object under `relative_dir`, recursively: its name relative to the directory's
    /// root and its size.
    pub fn list(&self, relative_dir: &str) -> Result<Vec<(String, u64)>, SluiceError> {
        self.list_after(relative_dir, None)
    }

    /// The objects under `relative_dir`, recursively, whose names (relative to the
    /// directory's root) sort after `after` (all of them when `None`), each with its size.
    /// The store starts the listing there (S3's `start-after`), so its cost follows the
    /// entries after `after`.
    pub fn list_after(&self, relative_dir: &str, after: Option<&str>) -> Result<Vec<(String, u64)>, SluiceError> {
        let listed = self.calls.block_on(self.calls.list_after(relative_dir, after))?;
        self.listed_entries.fetch_add(listed.len() as u64, Ordering::Relaxed);
        Ok(listed.into_iter().map(|entry| (entry.path, entry.size)).collect())
    }

    /// The entries every listing of this directory returned so far (a measure of what
    /// listings cost: one request per 1,000 entries on S3).
    pub fn listed_entries(&self) -> u64 {
        self.listed_entries.load(Ordering::Relaxed)
    }

    /// Deletes `paths`; an object already gone counts as deleted.
    pub fn delete(&self, paths: &[String]) -> Result<(), SluiceError> {
        self.calls.block_on(self.calls.delete_all(paths))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_creates_once_writes_in_parts_reads_lists_and_deletes() {
        let root = tempfile::tempdir().expect("dir");
        let url = root.path().display().to_string();
        let dir = ObjectDir::open(&url, Path::new("/"), &[], "table", "test.io").expect("opens");
        assert!(dir.create("log/0.json", b"first".to_vec()).expect("creates"));
        assert!(!dir.create("log/0.json", b"second".to_vec()).expect("finds it"), "a second create loses");
        assert_eq!(dir.get("log/0.json", 100).expect("reads").as_deref(), Some(&b"first"[..]));
        assert_eq!(dir.get("log/1.json", 100).expect("reads"), None);
        let large: Vec<u8> = (0..CHUNK_BYTES + 12_345).map(|i| (i % 251) as u8).collect();
        dir.put("data/part.parquet", Bytes::from(large.clone())).expect("writes in parts");
        let read = dir.get("data/part.parquet", large.len() as u64).expect("reads").expect("exists");
        assert!(read == large, "the parts are the object");
        let error = dir.get("data/part.parquet", 10).expect_err("larger than asked");
        assert_eq!(error.code, "test.io");
        let mut listed = dir.list("").expect("lists");
        listed.sort();
        assert_eq!(listed, [("data/part.parquet".to_string(), large.len() as u64), ("log/0.json".to_string(), 5)]);
        let after = dir.list_after("", Some("data/part.parquet")).expect("lists after a name");
        assert_eq!(after, [("log/0.json".to_string(), 5)], "only the names after it");
        assert_eq!(dir.listed_entries(), 3, "two entries, then one");
        assert_eq!(dir.get_at_most("log/0.json", 4).expect("reads"), Some(Err(5)), "larger: its size, unread");
        dir.delete(&["data/part.parquet".to_string(), "gone".to_string()]).expect("deletes");
        assert_eq!(dir.list("data").expect("lists"), []);
    }

    #[test]
    fn a_bad_url_is_named_as_the_caller_says() {
        let error =
            ObjectDir::open("ftp://host/x", Path::new("/"), &[], "Delta table", "sink.delta_io").expect_err("refused");
        assert_eq!(error.code, "sink.delta_io");
        assert!(error.message.starts_with("Delta table \"ftp://host/x\""), "{error}");
    }
}
