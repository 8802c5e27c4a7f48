//! A worker's part of a manifest: what one worker wrote for epoch `e` (its lanes'
//! positions, its state objects, its sinks' records), sent to the leader, which
//! publishes the manifest from every worker's part. It crosses a process boundary, so
//! its encoding is the project's: versioned by [`PART_VERSION`], pinned by the golden
//! vector in `checkpointing/tests.rs`.
//!
//! # Encoding, version 4
//!
//! postcard 1.x (the rules are in `sluice-cluster/src/wire.rs`: varints, strings and
//! byte strings with their length first, sequences with their count first, structs as
//! their fields in order, an enum as its variant's index, a varint, then its fields):
//!
//! ```text
//! Part       version: varint u32 (= 4), worker: varint u32,
//!            positions: seq of (source: varint u32, lane: varint u32, position: bytes),
//!            runs: seq of (operator: string, run: StateRun), every run of every list
//!              of this worker's operator instances, each list oldest first,
//!            records: seq of (flow: varint u32, epoch: varint u64, record: SinkRecord)
//! SinkRecord 0 Inline (the record: bytes) | 1 Stored (ObjectRef: an object this worker
//!            wrote, holding the record as the manifest carries it, prefix included: see
//!            `checkpointing`)
//! StateRun   start: varint u32, end: varint u32 (the vnodes it serves), object: ObjectRef
//! ObjectRef  path: string, offset: varint u64, size: varint u64,
//!            checksum: u32 as varint (CRC-32 of the `size` bytes at `offset` of the object)
//! ```
//!
//! Version 1 had `record: bytes` (every record inline) and no `offset` (one object per
//! vnode); version 2 was each of those two changes, made side by side before they met;
//! version 3 had `objects: seq of (operator: string, vnode: varint u32, object:
//! ObjectRef)`, one blob per vnode, where version 4 has runs.
//!
//! A part of another version is refused by name (workers of one cluster run one build:
//! the rendezvous checked the wire version, which changes with this one).

use serde::{Deserialize, Serialize};
use sluice_checkpoint::{SinkRecord, StateRun};
use sluice_types::SluiceError;

/// The part encoding this build writes and reads.
pub(crate) const PART_VERSION: u32 = 4;

/// One worker's part of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Part {
    pub version: u32,
    pub worker: u32,
    /// `(source, lane, position)` of every lane this worker owns.
    pub positions: Vec<(u32, u32, Vec<u8>)>,
    /// `(operator id, run)`: every run of this worker's operator instances.
    pub runs: Vec<(String, StateRun)>,
    /// `(flow, epoch, record)`: every sink record this worker has not committed.
    pub records: Vec<(u32, u64, SinkRecord)>,
}

impl Part {
    pub fn new(worker: u32) -> Part {
        Part { version: PART_VERSION, worker, positions: Vec::new(), runs: Vec::new(), records: Vec::new() }
    }

    pub fn encode(&self) -> Result<Vec<u8>, SluiceError> {
        assert_eq!(self.version, PART_VERSION, "a part is written in this build's version");
        postcard::to_stdvec(self).map_err(|error| {
            SluiceError::internal("checkpoint.part_encode", format!("a manifest part does not encode: {error}"))
        })
    }

    /// Decodes a part; never panics (the version is read first, so a part of another
    /// version is refused as such).
    pub fn decode(bytes: &[u8]) -> Result<Part, SluiceError> {
        let damaged = |detail: String| {
            SluiceError::internal("checkpoint.part", format!("a worker sent a damaged manifest part: {detail}"))
                .with_fix("run the same sluice build on every worker")
        };
        let (version, _): (u32, &[u8]) = postcard::take_from_bytes(bytes).map_err(|e| damaged(e.to_string()))?;
        if version != PART_VERSION {
            return Err(damaged(format!("version {version}, this build reads {PART_VERSION}")));
        }
        let (part, rest): (Part, &[u8]) = postcard::take_from_bytes(bytes).map_err(|e| damaged(e.to_string()))?;
        if !rest.is_empty() {
            return Err(damaged(format!("{} bytes follow it", rest.len())));
        }
        Ok(part)
    }
}
