//! The manifest: what one committed epoch consists of, and its byte encoding.
//!
//! A manifest names, for epoch `e`, the topology it belongs to (fingerprint, vnodes), the
//! versions of the encodings its state depends on, every source's lane layout and position
//! per lane, every operator's state per vnode and every sink's pre-commit records.
//! State objects, layouts and positions are opaque bytes to this crate; a manifest refers
//! to each vnode's state by [`ObjectRef`] (path, offset, size, checksum) so that a reader
//! can prove it got the bytes the writer wrote. Several vnodes' states may lie one after
//! another in one object (a writer packs each operator's vnodes into one object per
//! worker: one write per operator rather than one per vnode).
//!
//! # Encoding, format version 5
//!
//! This section is the complete specification: a decoder can be written from it alone. The
//! golden vectors in `manifest/tests.rs` pin it; a change of these bytes (by a change here
//! or by a dependency upgrade) fails them, and needs a new format version.
//!
//! ## The frame
//!
//! ```text
//! offset  bytes  content
//! 0       8      magic: ASCII "SLUICEMF" = 53 4c 55 49 43 45 4d 46
//! 8       4      format version, u32 little-endian: 05 00 00 00
//! 12      n      body: the manifest in postcard (below); n = total length - 16
//! 12+n    4      CRC-32 of the body only, u32 little-endian
//! ```
//!
//! The body has no length field: it runs to 4 bytes before the end. The checksum is the
//! CRC-32 of zlib, gzip and PNG (IEEE 802.3: reflected polynomial `0xEDB88320`, initial
//! value and final XOR `0xFFFFFFFF`; the CRC of ASCII `123456789` is `0xCBF43926`). The lease
//! (see `lease`) uses the same frame with its own magic.
//!
//! ## The body: postcard's wire rules
//!
//! The body is the [`Manifest`] serialized by postcard 1.x, which writes:
//! - **varint** (every `u32` and `u64`): unsigned LEB128, 7 bits per byte, least significant
//!   group first; every byte but the last has its high bit (`0x80`) set. A `u32` takes 1 to 5
//!   bytes (the 5th at most `0x0f`), a `u64` 1 to 10 (the 10th at most `0x01`). Examples:
//!   0 = `00`, 127 = `7f`, 128 = `80 01`, 300 = `ac 02`, `u32::MAX` = `ff ff ff ff 0f`.
//! - **zigzag** (every `i64`): `(n << 1) ^ (n >> 63)` (arithmetic shift) as a `u64`, then its
//!   varint: 0 = `00`, -1 = `01`, 1 = `02`, -2 = `03`, 1 700 000 000 000 = `80 a0 ab fe f9 62`.
//! - **string**: the byte length as a varint, then that many bytes of UTF-8.
//! - **bytes** (a `Vec<u8>`): the length as a varint, then the bytes, one per element.
//! - **seq** of `T`: the element count as a varint, then the elements.
//! - **map** of `K` to `V`: the entry count as a varint, then key, value, key, value, ...
//! - **struct** and **tuple**: the fields in the order below, with nothing between them (no
//!   tags, names or lengths).
//! - **enum**: the variant's index as a varint, then its fields.
//!
//! ## The body: fields in order
//!
//! ```text
//! Manifest
//!   version        varint u32     equal to the frame's version (5)
//!   epoch          varint u64
//!   fingerprint    string         the topology fingerprint
//!   created_ms     zigzag i64     milliseconds since the Unix epoch
//!   vnodes         varint u32     at least 1
//!   lane_threads   varint u32
//!   encodings      map of string to varint u32   encoding name -> version
//!   sources        seq of SourcePositions
//!   operators      seq of OperatorState
//!   sinks          seq of SinkRecords
//! SourcePositions  name: string, layout: bytes, lanes: seq of bytes (one position per lane)
//! OperatorState    id: string, runs: seq of StateRun
//! StateRun         start: varint u32, end: varint u32 (the vnodes start..end the run
//!                  serves; start < end <= vnodes), object: ObjectRef (a whole run file,
//!                  `sluice-state`'s format)
//! ObjectRef        path: string, offset: varint u64, size: varint u64,
//!                  checksum: varint u32 (CRC-32 as above of the `size` bytes at `offset`)
//! SinkRecords      name: string, records: seq of SinkRecord
//! SinkRecord       enum: 0 Inline (bytes: the record) | 1 Stored (ObjectRef: an object holding
//!                  the record's bytes, for records too large to carry in the manifest)
//! ```
//!
//! An operator's state is the merge of its runs: for a vnode, the runs whose range holds it,
//! in the order listed (oldest first), the newest record of a key winning. A run may be
//! listed more than once, for disjoint ranges (a run written by one thread, whose vnodes
//! two threads now own), and by many manifests: a run is written once, and every later
//! checkpoint that still needs it names it again (incremental checkpoints).
//!
//! Example, the golden vector of `Manifest::new(0, "", 1, 0)` (no encodings, sources,
//! operators or sinks): frame `53 4c 55 49 43 45 4d 46 05 00 00 00`, body
//! `05 00 00 00 01 01 00 00 00 00` (version 5, epoch 0, fingerprint "", created_ms 0,
//! vnodes 1, lane_threads 1, four empty collections), checksum `27 59 9f f3`.
//!
//! ## What a decoder accepts
//!
//! A manifest is accepted only if all of these hold, checked in this order:
//! 1. the magic matches (else `checkpoint.manifest_magic`), there are at least 16 bytes (else
//!    `checkpoint.manifest_truncated`), the frame's version is [`FORMAT_VERSION`], 4 or 2
//!    (else `checkpoint.manifest_version`, the only refusal that is not damage), and the
//!    checksum matches (else `checkpoint.manifest_checksum`);
//! 2. the body decodes, is consumed exactly and is canonical: every varint in its shortest
//!    form, `encodings` in ascending byte order of the names, each name once; there is
//!    exactly one encoding of every manifest (else `checkpoint.manifest_body`);
//! 3. the body's version equals the frame's, and the manifest passes [`Manifest::check`]
//!    (else `checkpoint.manifest_inconsistent`).
//!
//! ## Versions
//!
//! - 1: the fields above without `encodings` and without `SourcePositions::layout`. A store
//!   of version 1 is refused with `checkpoint.manifest_version`: its state cannot be matched
//!   to the encodings it depends on.
//! - 2: adds `encodings` (after `lane_threads`) and each source's `layout` (after its name).
//!   Its `ObjectRef` is `path: string, size: varint u64, checksum: varint u32` (a whole
//!   object) and its `SinkRecords` are `name: string, records: seq of bytes`. A version 2
//!   manifest is still read: it decodes as version 4 would with objects starting at
//!   offset 0 and records all `Inline` (the same records); it is never written.
//! - 3: two changes made side by side before they met, each called version 3 (offsets,
//!   and stored records). Refused with `checkpoint.manifest_version`: neither was
//!   released.
//! - 4: adds `ObjectRef::offset` (after its path: vnodes' states packed into shared
//!   objects) and lets a sink record be `Stored` in an object (`SinkRecord`). Its
//!   `OperatorState` is `id: string, vnodes: seq of (vnode: varint u32, object: ObjectRef)`,
//!   one blob per vnode. Still read: it decodes to the version 5 manifest whose runs are
//!   those objects, each serving its one vnode (a restore of it is then refused by the
//!   encodings, which changed with the state's format: `sluice checkpoints` still lists
//!   and verifies such a store).
//! - 5: an operator's state is a list of runs over vnode ranges (`StateRun`), named by
//!   every manifest that needs them, instead of one object per vnode.
//!
//! # Correctness argument for [`decode`], which reads bytes from outside the process
//!
//! - It never panics and never allocates more than its input justifies: every length is
//!   checked against the remaining input before use (postcard bounds sequence lengths by the
//!   input, and serde caps pre-allocation).
//! - It accepts only what the rules above accept. CRC-32 detects every error burst of up to
//!   32 bits, so a single damaged byte or a truncation is always rejected; other damage is
//!   rejected except with probability 2^-32.
//! - Encoding and decoding are paired: [`encode`] asserts `decode(encode(m)) == m` (debug
//!   builds), and the canonical-form rule makes `encode(decode(b)) == b` for every accepted
//!   `b` of version 5 (a version 2 or 4 `b` re-encodes as version 5).

use serde::{Deserialize, Serialize};
use sluice_types::{ErrorKind, SluiceError};
use std::collections::{BTreeMap, BTreeSet};

use crate::frame::{self, Problem};
use crate::layout;

/// The manifest format this build writes and reads (see the module doc for the history).
pub const FORMAT_VERSION: u32 = 5;
/// The previous formats still read (see the module doc).
const PREVIOUS_VERSIONS: [u32; 2] = [4, 2];
/// The first bytes of every encoded manifest.
pub const MAGIC: [u8; 8] = *b"SLUICEMF";
/// The largest encoded manifest a store reads; larger ones are refused as damaged.
pub const MANIFEST_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Where a state lives and how to check it: `size` bytes at `offset` of the object at
/// `path` (which may hold other states before and after them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Relative to the store root: `state/epoch-{e}/{name}`.
    pub path: String,
    /// Where the bytes start in the object.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub checksum: u32,
}

impl ObjectRef {
    /// The bytes of the object it covers (None when `offset + size` overflows).
    pub fn range(&self) -> Option<std::ops::Range<u64>> {
        Some(self.offset..self.offset.checked_add(self.size)?)
    }
}

/// A source's lane layout and its position per lane, both opaque to the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePositions {
    pub name: String,
    /// How the source laid out its lanes in the first run (for a file source: its files,
    /// their identities and byte ranges), for a resumed run to compare with its own.
    pub layout: Vec<u8>,
    /// One position per lane (an offset, a byte range, a seed); the lane count is fixed by
    /// the first run.
    pub lanes: Vec<Vec<u8>>,
}

/// An operator's state: its runs, oldest first (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    pub id: String,
    pub runs: Vec<StateRun>,
}

/// One run of an operator's state and the vnodes it serves in this manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRun {
    /// The vnodes `start..end`: a restore of any other vnode skips the run, and a record
    /// of the run outside them is not this manifest's.
    pub start: u32,
    pub end: u32,
    /// The whole run file.
    pub object: ObjectRef,
}

impl StateRun {
    pub fn vnodes(&self) -> std::ops::Range<u32> {
        self.start..self.end
    }
}

/// A sink's pre-commit records, one per writer (transaction ids, staged file names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkRecords {
    pub name: String,
    pub records: Vec<SinkRecord>,
}

/// One pre-commit record: its bytes, or an object holding them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SinkRecord {
    Inline(Vec<u8>),
    /// In a state object (written like any other, kept and verified with the manifest).
    Stored(ObjectRef),
}

/// The body of a version 4 manifest (see the module doc), read only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ManifestV4 {
    version: u32,
    epoch: u64,
    fingerprint: String,
    created_ms: i64,
    vnodes: u32,
    lane_threads: u32,
    encodings: BTreeMap<String, u32>,
    sources: Vec<SourcePositions>,
    operators: Vec<OperatorStateV4>,
    sinks: Vec<SinkRecords>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct OperatorStateV4 {
    id: String,
    vnodes: Vec<(u32, ObjectRef)>,
}

impl OperatorStateV4 {
    /// Each vnode's object as a run serving that vnode.
    fn upgrade(self) -> OperatorState {
        let runs = self.vnodes.into_iter().map(|(vnode, object)| StateRun {
            start: vnode,
            end: vnode.saturating_add(1),
            object,
        });
        OperatorState { id: self.id, runs: runs.collect() }
    }
}

impl ManifestV4 {
    /// The same manifest in the current format.
    fn upgrade(self) -> Manifest {
        Manifest {
            version: FORMAT_VERSION,
            epoch: self.epoch,
            fingerprint: self.fingerprint,
            created_ms: self.created_ms,
            vnodes: self.vnodes,
            lane_threads: self.lane_threads,
            encodings: self.encodings,
            sources: self.sources,
            operators: self.operators.into_iter().map(OperatorStateV4::upgrade).collect(),
            sinks: self.sinks,
        }
    }
}

/// The body of a version 2 manifest (see the module doc), read only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ManifestV2 {
    version: u32,
    epoch: u64,
    fingerprint: String,
    created_ms: i64,
    vnodes: u32,
    lane_threads: u32,
    encodings: BTreeMap<String, u32>,
    sources: Vec<SourcePositions>,
    operators: Vec<OperatorStateV2>,
    sinks: Vec<SinkRecordsV2>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct OperatorStateV2 {
    id: String,
    vnodes: Vec<(u32, ObjectRefV2)>,
}

/// A whole object: version 2 had no offsets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ObjectRefV2 {
    path: String,
    size: u64,
    checksum: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SinkRecordsV2 {
    name: String,
    records: Vec<Vec<u8>>,
}

impl ManifestV2 {
    /// The same manifest in the current format: every object whole, every record inline.
    fn upgrade(self) -> Manifest {
        let operators = self.operators.into_iter().map(|operator| {
            let vnodes = operator.vnodes.into_iter().map(|(vnode, ObjectRefV2 { path, size, checksum })| {
                (vnode, ObjectRef { path, offset: 0, size, checksum })
            });
            OperatorStateV4 { id: operator.id, vnodes: vnodes.collect() }.upgrade()
        });
        let sinks = self.sinks.into_iter().map(|sink| SinkRecords {
            name: sink.name,
            records: sink.records.into_iter().map(SinkRecord::Inline).collect(),
        });
        Manifest {
            version: FORMAT_VERSION,
            epoch: self.epoch,
            fingerprint: self.fingerprint,
            created_ms: self.created_ms,
            vnodes: self.vnodes,
            lane_threads: self.lane_threads,
            encodings: self.encodings,
            sources: self.sources,
            operators: operators.collect(),
            sinks: sinks.collect(),
        }
    }
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
    /// The versions of the encodings the state depends on, by name ("key", "key_hash",
    /// "window_state", "fingerprint", ...). The store carries them without interpreting
    /// them; a resumed run compares them with its own.
    pub encodings: BTreeMap<String, u32>,
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
            encodings: BTreeMap::new(),
            sources: Vec::new(),
            operators: Vec::new(),
            sinks: Vec::new(),
        }
    }

    /// Every state object the manifest names: the operators' runs, then the stored sink
    /// records'. A run listed for several ranges comes once for each.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectRef> {
        let operators = self.operators.iter().flat_map(|operator| operator.runs.iter().map(|run| &run.object));
        operators.chain(self.stored_records())
    }

    /// Every state object the manifest names, each once (by path and range).
    pub fn distinct_objects(&self) -> Vec<&ObjectRef> {
        let mut seen = BTreeSet::new();
        self.objects().filter(|object| seen.insert((object.path.as_str(), object.offset, object.size))).collect()
    }

    /// The objects of the stored sink records.
    fn stored_records(&self) -> impl Iterator<Item = &ObjectRef> {
        self.sinks.iter().flat_map(|sink| sink.records.iter()).filter_map(|record| match record {
            SinkRecord::Inline(_) => None,
            SinkRecord::Stored(object) => Some(object),
        })
    }

    /// Checks that the manifest does not contradict itself: a known version, at least one
    /// vnode, no empty encoding name, unique names, vnodes ascending and in range, object
    /// paths inside the store and written no later than this epoch. Fails with
    /// `checkpoint.manifest_inconsistent`.
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
        if self.encodings.contains_key("") {
            return Some("an encoding has an empty name".to_string());
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
            .or_else(|| self.stored_records().find_map(|object| self.object_contradiction(object)))
    }

    fn operator_contradiction(&self, operator: &OperatorState) -> Option<String> {
        for run in &operator.runs {
            if run.start >= run.end || run.end > self.vnodes {
                let (start, end, vnodes) = (run.start, run.end, self.vnodes);
                return Some(format!("operator {:?} has a run of vnodes {start}..{end} of {vnodes}", operator.id));
            }
            if let Some(problem) = self.object_contradiction(&run.object) {
                return Some(problem);
            }
        }
        None
    }

    /// What is wrong with `object`, if anything: its range must fit in 64 bits, and it
    /// must be a state object written no later than this epoch.
    fn object_contradiction(&self, object: &ObjectRef) -> Option<String> {
        if object.range().is_none() {
            return Some(format!("object {:?} has a range past 2^64 bytes", object.path));
        }
        match layout::epoch_of_object(&object.path) {
            Some(written) if written <= self.epoch => None,
            Some(written) => Some(format!("object {:?} was written at the later epoch {written}", object.path)),
            None => Some(format!("object path {:?} is not a state object path", object.path)),
        }
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
    let bytes = frame::seal(MAGIC, manifest.version, &frame::encode_body(manifest));
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
    let versions = [FORMAT_VERSION, PREVIOUS_VERSIONS[0], PREVIOUS_VERSIONS[1]];
    let (version, body) = frame::open_versions(bytes, MAGIC, &versions).map_err(frame_error)?;
    let body_error = |problem: String| {
        damaged(SluiceError::internal("checkpoint.manifest_body", format!("manifest body does not decode: {problem}")))
    };
    let (manifest, body_version) = match version {
        FORMAT_VERSION => {
            let manifest: Manifest = frame::decode_body(body).map_err(body_error)?;
            let body_version = manifest.version;
            (manifest, body_version)
        }
        4 => {
            let manifest: ManifestV4 = frame::decode_body(body).map_err(body_error)?;
            let body_version = manifest.version;
            (manifest.upgrade(), body_version)
        }
        _ => {
            let manifest: ManifestV2 = frame::decode_body(body).map_err(body_error)?;
            let body_version = manifest.version;
            (manifest.upgrade(), body_version)
        }
    };
    if body_version != version {
        return Err(damaged(SluiceError::internal(
            "checkpoint.manifest_inconsistent",
            format!("manifest header says version {version} but its body says {body_version}"),
        )));
    }
    manifest.check().map_err(damaged)?;
    Ok(manifest)
}

fn damaged(error: SluiceError) -> SluiceError {
    error.with_kind(ErrorKind::DamagedManifest)
}

fn frame_error(problem: Problem) -> SluiceError {
    match problem {
        Problem::Magic { found } => damaged(SluiceError::external(
            "checkpoint.manifest_magic",
            format!("not a Sluice manifest: it starts with {found:?}, not {:?}", "SLUICEMF"),
        )),
        Problem::Truncated { len } => damaged(SluiceError::external(
            "checkpoint.manifest_truncated",
            format!("manifest is truncated: {len} bytes, fewer than the {} of an empty frame", frame::FRAME_BYTES),
        )),
        Problem::Version { found } => SluiceError::user(
            "checkpoint.manifest_version",
            format!(
                "manifest format version {found} is not supported (this build reads versions {}, {} and \
                 {FORMAT_VERSION})",
                PREVIOUS_VERSIONS[1], PREVIOUS_VERSIONS[0]
            ),
        )
        .with_fix("run the Sluice version that wrote this store, or start over with --from-scratch"),
        Problem::Checksum { len, stored, computed } => damaged(SluiceError::external(
            "checkpoint.manifest_checksum",
            format!(
                "manifest checksum mismatch over {len} bytes (stored {stored:#010x}, computed {computed:#010x}): \
                 it is damaged or truncated"
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
