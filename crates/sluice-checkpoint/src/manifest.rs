//! The manifest: what one committed epoch consists of, and its byte encoding.
//!
//! A manifest names, for epoch `e`, the topology it belongs to (fingerprint, vnodes), every
//! source's position per lane, every operator's state object per vnode and every sink's
//! pre-commit records. State objects are opaque bytes to this crate; a manifest refers to
//! them by [`ObjectRef`] (path, size, checksum) so that a reader can prove it got the bytes
//! the writer wrote.
//!
//! Encoding (all integers little-endian):
//!
//! ```text
//! "SLUICEMF" | u32 format version | postcard body | u32 CRC-32 of the body
//! ```
//!
//! Correctness argument for [`decode`], which reads bytes from outside the process:
//! - it never panics and never allocates more than its input justifies: every length is
//!   checked against the remaining input before use (postcard bounds sequence lengths by
//!   the input, and serde caps pre-allocation);
//! - a manifest is accepted only if the magic, the version and the checksum match, the body
//!   is consumed exactly, and the decoded value passes [`Manifest::check`]. CRC-32 detects
//!   every error burst of up to 32 bits, so a single damaged byte or a truncation is always
//!   rejected; other damage is rejected except with probability 2^-32;
//! - the encoder asserts the inverse pairing: `decode(encode(m)) == m` (debug builds).

use serde::{Deserialize, Serialize};
use sluice_types::{ErrorKind, SluiceError};
use std::collections::BTreeSet;

use crate::layout;

/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The first bytes of every encoded manifest.
pub const MAGIC: [u8; 8] = *b"SLUICEMF";
/// The largest encoded manifest a store reads; larger ones are refused as damaged.
pub const MANIFEST_BYTES_MAX: u64 = 64 * 1024 * 1024;

const VERSION_BYTES: usize = 4;
const HEADER_BYTES: usize = MAGIC.len() + VERSION_BYTES;
const CHECKSUM_BYTES: usize = 4;

/// Where an object lives and how to check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Relative to the store root: `state/epoch-{e}/{name}`.
    pub path: String,
    /// Length in bytes.
    pub size: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub checksum: u32,
}

/// A source's position per lane, opaque to the store (an offset, a byte range, a seed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePositions {
    pub name: String,
    /// One position per lane; the lane count is fixed by the first run.
    pub lanes: Vec<Vec<u8>>,
}

/// An operator's state: one object per vnode that has state (vnodes without state are absent).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    pub id: String,
    /// `(vnode, object)`, ascending by vnode, each vnode at most once.
    pub vnodes: Vec<(u32, ObjectRef)>,
}

/// A sink's pre-commit records, one per writer (transaction ids, staged file names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkRecords {
    pub name: String,
    pub records: Vec<Vec<u8>>,
}

/// Everything one committed epoch consists of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] when written by this build.
    pub version: u32,
    pub epoch: u64,
    /// The topology fingerprint (plan, schemas, vnodes) the state belongs to.
    pub fingerprint: String,
    /// Wall clock at creation, milliseconds since the Unix epoch (for listings only).
    pub created_ms: i64,
    pub vnodes: u32,
    /// The thread count the sources' lanes were laid out for in the first run: lanes are
    /// fixed for the life of the state, and a resumed run lays them out the same way.
    pub lane_threads: u32,
    pub sources: Vec<SourcePositions>,
    pub operators: Vec<OperatorState>,
    pub sinks: Vec<SinkRecords>,
}

impl Manifest {
    /// An empty manifest of the current format for `epoch`.
    pub fn new(epoch: u64, fingerprint: impl Into<String>, vnodes: u32, created_ms: i64) -> Manifest {
        Manifest {
            version: FORMAT_VERSION,
            epoch,
            fingerprint: fingerprint.into(),
            created_ms,
            vnodes,
            lane_threads: 1,
            sources: Vec::new(),
            operators: Vec::new(),
            sinks: Vec::new(),
        }
    }

    /// Every state object the manifest names.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectRef> {
        self.operators.iter().flat_map(|operator| operator.vnodes.iter().map(|(_, object)| object))
    }

    /// Checks that the manifest does not contradict itself: a known version, at least one
    /// vnode, unique names, vnodes ascending and in range, object paths inside the store and
    /// written no later than this epoch. Fails with `checkpoint.manifest_inconsistent`.
    pub fn check(&self) -> Result<(), SluiceError> {
        self.find_contradiction().map_or(Ok(()), |problem| {
            Err(SluiceError::internal(
                "checkpoint.manifest_inconsistent",
                format!("manifest of epoch {} contradicts itself: {problem}", self.epoch),
            ))
        })
    }

    fn find_contradiction(&self) -> Option<String> {
        if self.version != FORMAT_VERSION {
            return Some(format!("version {} is not {FORMAT_VERSION}", self.version));
        }
        if self.vnodes == 0 {
            return Some("vnodes is 0".to_string());
        }
        duplicate(self.sources.iter().map(|s| s.name.as_str()))
            .map(|name| format!("source {name:?} appears twice"))
            .or_else(|| {
                duplicate(self.sinks.iter().map(|s| s.name.as_str())).map(|n| format!("sink {n:?} appears twice"))
            })
            .or_else(|| {
                duplicate(self.operators.iter().map(|o| o.id.as_str()))
                    .map(|id| format!("operator {id:?} appears twice"))
            })
            .or_else(|| self.operators.iter().find_map(|operator| self.operator_contradiction(operator)))
    }

    fn operator_contradiction(&self, operator: &OperatorState) -> Option<String> {
        let mut previous: Option<u32> = None;
        for (vnode, object) in &operator.vnodes {
            if *vnode >= self.vnodes {
                return Some(format!("operator {:?} has vnode {vnode} of {}", operator.id, self.vnodes));
            }
            if previous.is_some_and(|p| p >= *vnode) {
                return Some(format!("operator {:?} lists vnode {vnode} out of order or twice", operator.id));
            }
            previous = Some(*vnode);
            match layout::epoch_of_object(&object.path) {
                Some(written) if written <= self.epoch => {}
                Some(written) => {
                    return Some(format!("object {:?} was written at the later epoch {written}", object.path));
                }
                None => return Some(format!("object path {:?} is not a state object path", object.path)),
            }
        }
        None
    }
}

fn duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = BTreeSet::new();
    names.into_iter().find(|name| !seen.insert(*name))
}

/// Encodes a manifest (see the module doc for the layout).
///
/// The manifest must pass [`Manifest::check`]: encoding an inconsistent one is a bug of the
/// caller ([`crate::CheckpointStore::publish`] checks first and returns an error).
pub fn encode(manifest: &Manifest) -> Vec<u8> {
    debug_assert!(manifest.check().is_ok(), "encoding an inconsistent manifest: {:?}", manifest.check());
    // Serializing plain structs into a vector fails only on allocation failure, which aborts.
    let body = postcard::to_allocvec(manifest).expect("postcard serializes plain structs into a Vec");
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len() + CHECKSUM_BYTES);
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&manifest.version.to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    debug_assert_eq!(decode(&bytes).ok().as_ref(), Some(manifest), "manifest encoding does not round-trip");
    bytes
}

/// Decodes and checks a manifest; never panics. Errors name what is wrong:
/// `checkpoint.manifest_truncated`, `checkpoint.manifest_magic`, `checkpoint.manifest_checksum`,
/// `checkpoint.manifest_body` and `checkpoint.manifest_inconsistent` are damage
/// ([`ErrorKind::DamagedManifest`]: a reader may fall back to an older manifest);
/// `checkpoint.manifest_version` is not ([`ErrorKind::Other`]: the store was written by another
/// Sluice, and falling back past it would silently restore older state).
pub fn decode(bytes: &[u8]) -> Result<Manifest, SluiceError> {
    let (version, body) = split_frame(bytes)?;
    let manifest = decode_body(body).map_err(damaged)?;
    if manifest.version != version {
        return Err(damaged(SluiceError::internal(
            "checkpoint.manifest_inconsistent",
            format!("manifest header says version {version} but its body says {}", manifest.version),
        )));
    }
    manifest.check().map_err(damaged)?;
    Ok(manifest)
}

fn damaged(error: SluiceError) -> SluiceError {
    error.with_kind(ErrorKind::DamagedManifest)
}

/// Checks magic, version and checksum; returns the version and the body.
fn split_frame(bytes: &[u8]) -> Result<(u32, &[u8]), SluiceError> {
    let magic_len = MAGIC.len().min(bytes.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(damaged(SluiceError::external(
            "checkpoint.manifest_magic",
            format!("not a Sluice manifest: it starts with {:?}, not {:?}", escaped(&bytes[..magic_len]), "SLUICEMF"),
        )));
    }
    if bytes.len() < HEADER_BYTES + CHECKSUM_BYTES {
        return Err(damaged(truncated(bytes.len())));
    }
    let (header, rest) = bytes.split_at(HEADER_BYTES);
    let version = u32::from_le_bytes(le_word(&header[MAGIC.len()..]));
    if version != FORMAT_VERSION {
        return Err(SluiceError::user(
            "checkpoint.manifest_version",
            format!("manifest format version {version} is not supported (this build reads version {FORMAT_VERSION})"),
        )
        .with_fix("run the Sluice version that wrote this store, or start over with --from-scratch"));
    }
    let (body, trailer) = rest.split_at(rest.len() - CHECKSUM_BYTES);
    let stored = u32::from_le_bytes(le_word(trailer));
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(damaged(SluiceError::external(
            "checkpoint.manifest_checksum",
            format!(
                "manifest checksum mismatch over {} bytes (stored {stored:#010x}, computed {computed:#010x}): \
                 it is damaged or truncated",
                bytes.len()
            ),
        )));
    }
    Ok((version, body))
}

fn decode_body(body: &[u8]) -> Result<Manifest, SluiceError> {
    let body_error = |detail: String| {
        SluiceError::internal("checkpoint.manifest_body", format!("manifest body does not decode: {detail}"))
    };
    match postcard::take_from_bytes::<Manifest>(body) {
        Ok((manifest, [])) => Ok(manifest),
        Ok((_, rest)) => Err(body_error(format!("{} bytes follow the manifest", rest.len()))),
        Err(error) => Err(body_error(error.to_string())),
    }
}

fn truncated(len: usize) -> SluiceError {
    SluiceError::external(
        "checkpoint.manifest_truncated",
        format!(
            "manifest is truncated: {len} bytes, fewer than the {} of an empty frame",
            HEADER_BYTES + CHECKSUM_BYTES
        ),
    )
}

fn le_word(bytes: &[u8]) -> [u8; 4] {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    word
}

fn escaped(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

#[cfg(test)]
mod tests;
