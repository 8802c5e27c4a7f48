//! Keyed state as sorted runs: the layer between operators and the checkpoint store.
//!
//! Every stateful operator's state is, for checkpoints, a table of records keyed by
//! `(vnode, key)`: the vnode its key hashes to (so state moves between threads and
//! workers by vnode ranges) and key bytes of the operator's own layout. A checkpoint
//! writes what changed since the previous one as a **run**: an immutable file of
//! records sorted by `(vnode, key)`, each a put (the key's whole value now), a delete, or
//! a range delete (every key of the vnode from `start` to `end`, as a window that closes
//! drops all its groups). A run is written once and named by every later manifest that
//! still needs it; a key's value is the one in the newest run that mentions it.
//!
//! - [`StateSink`]: what an operator's snapshot writes into ([`RunWriter`] implements it);
//!   [`StateSource`]: what a restore reads, the merged live records of a vnode range.
//! - [`run`]: the run file's encoding (versioned, specified in full there, pinned by
//!   golden vectors) and its writer; [`read`]: its index and blocks, every byte checked.
//! - [`merge`]: runs merged, newest winning, for a restore or a compaction.
//! - [`compact`]: which runs of a vnode range to merge, so that a range keeps few runs
//!   while the bytes rewritten stay a small multiple of the bytes changed.
//!
//! Layer: depends only on `sluice-types`; the runtime's snapshot contract, the operators
//! and the engine's checkpointer use it. It knows nothing of object stores: a run is read
//! through [`RunSource`] (a local file, bytes, or whatever the caller adapts).

pub mod compact;
pub mod merge;
pub mod read;
pub mod run;
mod varint;

pub use merge::{Merge, MergeMode};
pub use read::{RunIndex, RunSource};
pub use run::{RUN_FORMAT_VERSION, RunWriter, WrittenRun};

use sluice_types::SluiceError;

/// The records of one snapshot, written in order: vnodes ascending (unless the snapshot
/// said it interleaves them, [`StateSink::interleave`]); within a vnode its range deletes
/// first (ascending by start), then its puts and deletes (keys strictly ascending). A
/// writer asserts the order: it is the operator's contract, not input.
pub trait StateSink {
    /// The records that follow may interleave vnodes, each vnode's in its order (a
    /// join's appended rows in arrival order: their keys are arrival numbers). Called
    /// before the first record, by a snapshot whose records come so: the sink then takes
    /// them as they come, with no sort (a run writer keeps a block open per vnode).
    fn interleave(&mut self);

    /// Every key `k` of `vnode` with `start <= k < end` is gone (in the runs older than
    /// this one; a put of this snapshot in that range stands).
    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), SluiceError>;

    /// `key` of `vnode` has the value `value` now.
    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError>;

    /// `key` of `vnode` is gone.
    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), SluiceError>;

    /// A local directory where a snapshot job may put scratch files while it sorts its
    /// records (the worker's state directory); None: the system's temporary directory.
    fn scratch_dir(&self) -> Option<&std::path::Path> {
        None
    }

    /// Whether this sink takes whole blocks of other runs ([`StateSink::copy_block`]),
    /// and the fewest bytes (decompressed) a block must hold to be worth taking whole
    /// rather than entry by entry. None (the default): it takes records only.
    fn copies_blocks(&self) -> Option<u64> {
        None
    }

    /// Takes a block of puts and deletes of `vnode` from another run as it is: `info` as
    /// that run's index lists it, `bytes` its bytes in that file (checked against its
    /// checksum). Its keys follow every key given before; only for a sink that
    /// [`StateSink::copies_blocks`] (a merge, `merge::Merge::write_into`).
    fn copy_block(&mut self, vnode: u32, info: &read::BlockInfo, bytes: &[u8]) -> Result<(), SluiceError> {
        let _ = (vnode, info, bytes);
        unreachable!("copy_block on a sink that does not copy blocks")
    }
}

/// One live record of a restore: a key and its value, in `(vnode, key)` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub vnode: u32,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// The live records of a restore, in `(vnode, key)` order, each key once.
pub trait StateSource {
    /// The next record, or `None` at the end.
    fn next_record(&mut self) -> Result<Option<Record<'_>>, SluiceError>;
}

/// No state: a source that ends at once (a fresh start).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoState;

impl StateSource for NoState {
    fn next_record(&mut self) -> Result<Option<Record<'_>>, SluiceError> {
        Ok(None)
    }
}

/// Records held in memory, for tests and small states: `(vnode, key, value)`, sorted
/// and deduplicated when built.
#[derive(Debug, Default, Clone)]
pub struct MemoryState {
    records: Vec<(u32, Vec<u8>, Vec<u8>)>,
    next: usize,
}

impl MemoryState {
    pub fn new(mut records: Vec<(u32, Vec<u8>, Vec<u8>)>) -> MemoryState {
        records.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        records.dedup_by(|later, earlier| (later.0, &later.1) == (earlier.0, &earlier.1));
        MemoryState { records, next: 0 }
    }
}

impl StateSource for MemoryState {
    fn next_record(&mut self) -> Result<Option<Record<'_>>, SluiceError> {
        let Some((vnode, key, value)) = self.records.get(self.next) else { return Ok(None) };
        self.next += 1;
        Ok(Some(Record { vnode: *vnode, key, value }))
    }
}

/// Collects a snapshot's records in memory (tests; operators' own unit tests check what
/// a snapshot writes without a file). Checks the [`StateSink`] order as a run writer does.
#[derive(Debug, Default, Clone)]
pub struct CollectedState {
    pub ranges: Vec<(u32, Vec<u8>, Vec<u8>)>,
    /// `(vnode, key, Some(value))` for a put, `None` for a delete.
    pub points: Vec<(u32, Vec<u8>, Option<Vec<u8>>)>,
    order: run::OrderCheck,
    interleaved: bool,
}

impl CollectedState {
    /// The puts, as a restore of this snapshot alone would read them.
    pub fn into_source(self) -> MemoryState {
        let records = self.points.into_iter().filter_map(|(vnode, key, value)| Some((vnode, key, value?))).collect();
        MemoryState::new(records)
    }
}

impl StateSink for CollectedState {
    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), SluiceError> {
        self.order.range(vnode, start, end);
        let at = self.ranges.partition_point(|(other, _, _)| *other <= vnode);
        self.ranges.insert(at, (vnode, start.to_vec(), end.to_vec()));
        Ok(())
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError> {
        self.order.point(vnode, key);
        self.add_point(vnode, key, Some(value));
        Ok(())
    }

    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), SluiceError> {
        self.order.point(vnode, key);
        self.add_point(vnode, key, None);
        Ok(())
    }

    /// Interleaved records are kept in `(vnode, key)` order all the same (each goes after
    /// the records of its vnode so far), as a run's index lists them.
    fn interleave(&mut self) {
        self.order.interleave();
        self.interleaved = true;
    }
}

impl CollectedState {
    fn add_point(&mut self, vnode: u32, key: &[u8], value: Option<&[u8]>) {
        let point = (vnode, key.to_vec(), value.map(<[u8]>::to_vec));
        match self.interleaved {
            false => self.points.push(point),
            true => {
                let at = self.points.partition_point(|(other, _, _)| *other <= vnode);
                self.points.insert(at, point);
            }
        }
    }
}

/// What the runs of some operator instances amount to, kept as a map: a model of the
/// run lists of `engine::checkpointing::runs` (and of the merge that reads them) for
/// tests of snapshots and restores, whose own tests check runs against such a map.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StateModel {
    records: std::collections::BTreeMap<(u32, Vec<u8>), Vec<u8>>,
}

impl StateModel {
    /// Applies a snapshot of the instance owning `vnodes`: a full one replaces their
    /// records, a delta applies its range deletes, then its puts and deletes.
    pub fn apply(&mut self, vnodes: std::ops::Range<u32>, full: bool, snapshot: CollectedState) {
        if full {
            self.records.retain(|(vnode, _), _| !vnodes.contains(vnode));
        }
        for (vnode, start, end) in snapshot.ranges {
            assert!(vnodes.contains(&vnode), "a snapshot of {vnodes:?} deletes a range of vnode {vnode}");
            self.records.retain(|(v, key), _| !(*v == vnode && start <= *key && *key < end));
        }
        for (vnode, key, value) in snapshot.points {
            assert!(vnodes.contains(&vnode), "a snapshot of {vnodes:?} writes vnode {vnode}");
            match value {
                Some(value) => self.records.insert((vnode, key), value),
                None => self.records.remove(&(vnode, key)),
            };
        }
    }

    /// The records of `vnodes`, as a restore of them reads them.
    pub fn source(&self, vnodes: std::ops::Range<u32>) -> MemoryState {
        let records = self.records.iter().filter(|((vnode, _), _)| vnodes.contains(vnode));
        MemoryState::new(records.map(|((vnode, key), value)| (*vnode, key.clone(), value.clone())).collect())
    }

    /// Every record, in order.
    pub fn records(&self) -> &std::collections::BTreeMap<(u32, Vec<u8>), Vec<u8>> {
        &self.records
    }
}

/// The error of a damaged run: named, with the fix, never a panic.
pub(crate) fn damaged(source: &str, problem: impl std::fmt::Display) -> SluiceError {
    SluiceError::external("state.run_damaged", format!("state run {source}: {problem}"))
        .with_kind(sluice_types::ErrorKind::DamagedObject)
        .with_fix("the file was changed or truncated after it was written: restore from an older checkpoint (`sluice checkpoints verify` names the damaged ones)")
}
