//! Sluice's checkpoint store and manifest.
//!
//! Layer: below everything that takes checkpoints (the runtime's checkpointer, the CLI's
//! `checkpoints` commands, recovery); above `sluice-types` only. It knows nothing of
//! operators, connectors or plans: state objects and source positions are opaque bytes,
//! and the topology is a fingerprint string.
//!
//! A checkpoint of epoch `e` is a set of immutable state objects under
//! `state/epoch-{e}/` plus one manifest `manifests/epoch-{e:020}.manifest` that names them
//! (with size and checksum), the source positions and the sinks' pre-commit records (each
//! in the manifest, or, when large, in a state object it names). The
//! manifest is published last and atomically; an epoch is committed exactly when its
//! manifest exists. See `store` for the protocol and its correctness argument, `collect`
//! for retention, `manifest` for the encoding, and `lease` for how one run at a time
//! writes a store (publishing, collecting and clearing need its lease; reading does not).
//!
//! ```no_run
//! use sluice_checkpoint::{CheckpointStore, Holder, Manifest, OperatorState, StateRun};
//! # fn main() -> Result<(), sluice_types::SluiceError> {
//! let store = CheckpointStore::open("file://./sluice-state", std::path::Path::new("."))?;
//! let lease = store.acquire_lease(Holder::this_process("hot-items"))?;
//! let object = store.put_object(7, "window/vnode-3", b"state".to_vec())?;
//! let mut manifest = Manifest::new(7, "fingerprint", 256, 1_700_000_000_000);
//! let run = StateRun { start: 0, end: 256, object };
//! manifest.operators.push(OperatorState { id: "window".into(), runs: vec![run] });
//! store.publish(&manifest)?;
//! let (restored, warnings) = store.latest_valid()?.expect("one checkpoint");
//! assert!(warnings.is_empty() && restored == manifest);
//! store.collect_garbage(2)?;
//! lease.release()?;
//! # Ok(())
//! # }
//! ```
//!
//! Store URLs: `file:///abs/dir`, `file://./relative/dir` (against the caller's base
//! directory), a plain path, or an object store (the crate's `cloud` feature; a build
//! without it refuses these URLs naming the feature):
//! - `s3://bucket/prefix`, configured by the `AWS_*` environment variables (`AWS_ENDPOINT`
//!   and `AWS_ALLOW_HTTP=true` for a local S3-compatible server);
//! - `az://container/prefix` (also `azure://`, `abfs://`, `abfss://`), configured by the
//!   `AZURE_*` variables (`AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY` or
//!   `AZURE_STORAGE_SAS_KEY`; `AZURE_STORAGE_USE_EMULATOR=true` for Azurite);
//! - `gs://bucket/prefix`, configured by the `GOOGLE_*` variables (`GOOGLE_SERVICE_ACCOUNT`,
//!   a service-account JSON file; `GOOGLE_BASE_URL` for another endpoint).
//!
//! [`CheckpointStore::open_with_options`] takes the same settings as options that win over
//! the environment. On every object store the manifest is published with a create-only PUT
//! (`If-None-Match: *` on S3 and Azure, `x-goog-if-generation-match: 0` on GCS).
//!
//! [`ObjectDir`] opens any such URL as a plain directory of objects (create-only and plain
//! writes, reads, listing, deletion), for another writer of durable output (the Delta
//! Lake sink's table).
//!
//! Every backend call is bounded: [`CALL_TIMEOUT`] per call, and for object stores
//! [`REQUEST_TIMEOUT`] per request with at most [`RETRIES_MAX`] retries of transient
//! failures, backing off exponentially from [`BACKOFF_INITIAL`] to [`BACKOFF_MAX`].
//!
//! Testing: unit and property tests run with `cargo test -p sluice-checkpoint`. The
//! scenarios every backend must pass (`tests/common/scenarios.rs`: checkpoints and the
//! lease) run on a local directory (`tests/local.rs`), on S3 (`tests/s3.rs`, needs
//! `moto_server`: `python3 -m pip install 'moto[server]'`) and on Azure (`tests/azure.rs`,
//! needs Azurite's `azurite-blob`: `npm install --prefix ~/.cache/sluice-tools/azurite
//! azurite@3`); `scripts/test.sh` installs both, and each test starts its own server on a
//! port the kernel picks, and stops it. `gs://` has no server test: the Python
//! `gcp-storage-emulator` (tried at version 2026.7.19) does not implement the XML API that
//! `object_store`'s GCS client speaks well enough. Its object PUT answers without an `ETag`
//! header (the client fails every write), it ignores `x-goog-if-generation-match: 0` (a
//! create-only PUT overwrites), and listing (`GET /bucket?list-type=2`) and deletion answer
//! 501. The GCS path is therefore covered only by the unit tests of URL and option
//! handling. The manifest and lease decoders have fuzz targets (need a nightly toolchain and
//! cargo-fuzz): `cd crates/sluice-checkpoint/fuzz && cargo +nightly fuzz run decode_manifest`
//! (or `decode_lease`).

mod calls;
mod collect;
mod frame;
mod layout;
mod lease;
mod location;
mod manifest;
mod objects;
mod store;

pub use calls::{CALL_TIMEOUT, DELETE_BATCH};
pub use lease::{ACQUIRE_ATTEMPTS_MAX, BrokenLease, Holder, LEASE_BYTES_MAX, LEASE_FORMAT_VERSION, LEASE_MAGIC, Lease};
pub use location::{BACKOFF_INITIAL, BACKOFF_MAX, CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRIES_MAX, RETRY_WINDOW};
pub use manifest::{
    FORMAT_VERSION, MAGIC, MANIFEST_BYTES_MAX, Manifest, ObjectRef, OperatorState, SinkRecord, SinkRecords,
    SourcePositions, StateRun, decode, encode,
};
pub use objects::ObjectDir;
pub use store::{CHUNK_BYTES, CheckpointStore, VERIFY_CONCURRENCY};
