//! The stored rows of a side whose rows expire (an interval or window join), kept in
//! arrival order.
//!
//! Such a side is one input of an inner join of append-only inputs (the planner gives an
//! expiry to nothing else): rows only arrive, each stays until the watermark reaches its
//! expiry, and the side is probed by join key. [`super::store::Store`] serves any join
//! (retractions, outer joins' match counts, a TTL) with a slab and three indexes, and
//! pays several random memory accesses per row on insert and again on removal. Here:
//!
//! - Rows are appended to a ring ([`VecDeque`]) in arrival order, each numbered by a
//!   sequence number; equal rows are not merged (each arrival is an entry of its own,
//!   with its weight), so no index by row is needed. A row's bytes, then its join key's,
//!   are appended to large shared chunks of bytes ([`Chunk`]), in the same order, so
//!   that storing a row allocates nothing and freeing rows frees whole chunks; a
//!   snapshot shares the chunks (a chunk a snapshot shares is not appended to again).
//! - A hash index by join key (the key's bytes inline when short) points to the newest
//!   indexed entry of the key; each indexed entry points to the previous one of its key.
//!   Only a prefix of the ring is indexed: a probe walks the key's chain there, then
//!   scans the entries after it, comparing key hashes. Before scanning, a probe indexes
//!   those entries when the scan would be longer than `SCAN_ALWAYS` entries and than
//!   `SCAN_PER_INSERT` times the rows added since the previous probe. So a side probed
//!   rarely (NEXMark q7's bids, probed once per window by the window's highest price) is
//!   never indexed and a probe's scan costs at most a few steps per row added, while a
//!   side probed often is indexed in batches, each entry once.
//! - A row is *expired* once the watermark reaches its expiry: from then on probes skip
//!   it, snapshots leave it out, and [`ExpiringStore::len`] and [`ExpiringStore::bytes`]
//!   no longer count it (an ordered count of rows and bytes per expiry time keeps those
//!   exact), so the side behaves exactly as one that removes each row at its expiry.
//! - Its memory is freed from the front of the ring: every entry up to the first one
//!   not yet expired. Rows arriving in the order of their expiry (a stream in event-time
//!   order) are freed as they expire; a row arriving out of that order keeps the rows
//!   after it in memory (expired, invisible) until it expires itself, so memory lags by
//!   at most the input's disorder. Index entries whose chain left the ring are swept
//!   once they outnumber the entries, so the index stays proportional to the ring.
//!
//! Insertion and freeing are thus sequential in memory: two appends and a pop per row,
//! and one hash insertion per row on a side that is indexed.
//!
//! Beyond the worker's memory budget (`crate::spill`), starting a chunk writes the
//! oldest chunks still in memory (all but the newest) to spill files: in a stream in
//! event-time order they hold the rows that expire first. A probe reads a spilled row
//! back, and a spilled entry's key only when its hash is the key's. The files are
//! written in segments of [`SEGMENT_BYTES`], each an anonymous file that lives as long as
//! a chunk written to it, so the disk comes back as the rows expire. The entries, the
//! index and the expiry counts stay in memory.
//!
//! Snapshots ([`ExpiringStore::changes`]): rows only arrive and expire, so a delta is the
//! rows arrived since the previous snapshot and not expired, each under an arrival
//! number that keeps counting across snapshots and restores, and how far the watermark
//! expired rows (a range delete of every row expiring by then). At the barrier the
//! delta's entries are copied in one piece and its chunks shared (one reference each),
//! so the driver's work is a memory copy of the delta, never a step per row or per byte;
//! the snapshot's job leaves out the rows expired by the barrier's watermark.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use hashbrown::HashTable;
use sluice_types::SluiceError;

use crate::bytes::SmallBytes;
use crate::counter::LazyCounter;
use crate::same_bytes;
use crate::spill::{LogChunk, SpillFile, SpillSpace};

/// No previous entry of the same key.
const NONE: u64 = u64::MAX;

/// A probe scans this many unindexed entries without indexing them, whatever else.
const SCAN_ALWAYS: u64 = 16;
/// A probe scans up to this many unindexed entries per row added since the previous
/// probe without indexing them.
const SCAN_PER_INSERT: u64 = 4;

/// The bytes of a chunk (a row longer than that gets a chunk of its own) without a
/// spill space (with one, the space's).
const CHUNK_BYTES: usize = 256 * 1024;

/// The bytes of one spill file: the rows expire oldest first, and a file is freed once
/// every chunk in it is, so its disk comes back in steps of this.
const SEGMENT_BYTES: u64 = 256 << 20;

/// One join key in the index: its newest indexed entry.
#[derive(Debug)]
struct Head {
    hash: u64,
    newest: u64,
    key: SmallBytes,
}

/// One arrived row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// The chunk holding the row's bytes (its sequence number).
    chunk: u64,
    /// Where in the chunk: the whole row in the project's key encoding (the side's
    /// columns in order) from `start`, `row_length` bytes, then its join key's encoding,
    /// `key_length` bytes.
    start: u32,
    row_length: u32,
    key_length: u32,
    /// The row is expired once the watermark is at or above this.
    pub(super) expires: i64,
    /// The join key's placement hash (the exchange's), so the row's vnode.
    pub(super) key_hash: u64,
    /// Its multiplicity (positive: the input is append-only).
    pub(super) weight: i64,
    /// The summed weights of the other side's rows it matched.
    pub(super) matches: i64,
    /// The previous indexed entry of the same join key, or [`NONE`] (also before the
    /// entry is indexed).
    older: u64,
}

impl Entry {
    /// Where the row's bytes are in its chunk.
    pub(super) fn row_range(&self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.row_length as usize
    }

    fn key_range(&self) -> std::ops::Range<usize> {
        let start = self.start as usize + self.row_length as usize;
        start..start + self.key_length as usize
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct ExpiringStore {
    ring: VecDeque<Entry>,
    /// The sequence number of `ring[0]`.
    front: u64,
    /// Bytes of rows and keys in arrival order, in memory (shared with snapshots) or
    /// spilled.
    chunks: VecDeque<LogChunk>,
    /// The sequence number of `chunks[0]`.
    first_chunk: u64,
    /// Every chunk numbered below this is spilled (or freed).
    first_resident: u64,
    /// The capacity of a new chunk.
    chunk_bytes: usize,
    /// The budget this side's chunks count in (None: they stay in memory), its files,
    /// the capacity of its chunks in memory and the bytes of its spilled ones as counted
    /// there, and the counter of bytes written.
    space: Option<Arc<SpillSpace>>,
    file: SpillFile,
    resident: usize,
    spilled: usize,
    written: Option<LazyCounter>,
    /// A freed chunk, kept to be filled again.
    spare: Option<Vec<u8>>,
    /// Entries numbered below this are indexed (or freed).
    indexed: u64,
    heads: HashTable<Head>,
    /// Rows added since the previous probe.
    added: u64,
    /// Expiry time → rows (with their multiplicity) and bytes not yet expired that
    /// expire then.
    by_time: BTreeMap<i64, (usize, usize)>,
    /// The highest watermark passed to [`ExpiringStore::expire`], if any.
    watermark: Option<i64>,
    /// Rows not yet expired, with their multiplicity, and their entries' bytes.
    live: usize,
    bytes: usize,
    /// Entries numbered below this are in the runs: a snapshot took them.
    snapshotted: u64,
    /// Entry `base_entry` (and every later one) has arrival number `base_arrival` plus
    /// the difference.
    base_entry: u64,
    base_arrival: u64,
    /// The watermark when the previous snapshot was taken.
    snapshot_watermark: Option<i64>,
    /// Whether the runs hold the rows a delta builds on (from the first snapshot or a
    /// restore on).
    tracking: bool,
}

/// What a snapshot takes: the entries of the rows arrived since the previous snapshot
/// (every entry held, for a full one), copied in one piece at the barrier, with the
/// chunks holding their bytes (shared, not copied); the watermark then (rows expiring by
/// it are left out when written); and (a delta) the watermark through which rows
/// expired since the previous snapshot, when it moved.
#[derive(Debug, Default)]
pub(super) struct ExpiringChanges {
    entries: Vec<Entry>,
    /// The arrival number of `entries[0]`.
    first_arrival: u64,
    /// The sequence number of `chunks[0]`.
    first_chunk: u64,
    chunks: Vec<LogChunk>,
    watermark: Option<i64>,
    pub(super) expired_through: Option<i64>,
}

/// A row a snapshot writes: its arrival number, when it expires, its key hash and
/// weight, and where its bytes are (`chunk` numbers [`ExpiringChanges::chunks`]).
#[derive(Debug, Clone)]
pub(super) struct ExpiringRow {
    pub(super) arrival: u64,
    pub(super) expires: i64,
    pub(super) key_hash: u64,
    pub(super) weight: i64,
    pub(super) chunk: usize,
    pub(super) range: std::ops::Range<usize>,
}

impl ExpiringChanges {
    /// The chunks holding the rows' bytes.
    pub(super) fn chunks(&self) -> &[LogChunk] {
        &self.chunks
    }

    fn row(&self, index: usize) -> ExpiringRow {
        let entry = &self.entries[index];
        ExpiringRow {
            arrival: self.first_arrival + index as u64,
            expires: entry.expires,
            key_hash: entry.key_hash,
            weight: entry.weight,
            chunk: (entry.chunk - self.first_chunk) as usize,
            range: entry.row_range(),
        }
    }

    /// The positions of the entries not expired when the snapshot was taken.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        let watermark = self.watermark;
        let live = move |entry: &Entry| watermark.is_none_or(|watermark| entry.expires > watermark);
        self.entries.iter().enumerate().filter(move |(_, entry)| live(entry)).map(|(index, _)| index)
    }

    /// The rows not expired when the snapshot was taken, in arrival order.
    pub(super) fn rows(&self) -> impl Iterator<Item = ExpiringRow> + '_ {
        self.live().map(|index| self.row(index))
    }

    /// The rows not expired, in an order where each of the `vnodes` vnodes' rows come in
    /// key order (expiry, then arrival), so that they may be written as they come, vnodes
    /// interleaved: arrival order when, within each vnode, rows expire in the order they
    /// arrived (a stream in event-time order), else the order of their expiry, arrival
    /// breaking ties (a stable sort of the expiry times, about one pass over input that is
    /// nearly in order).
    pub(super) fn rows_in_key_order(&self, vnodes: u32) -> Box<dyn Iterator<Item = ExpiringRow> + '_> {
        if self.in_key_order(vnodes) {
            return Box::new(self.rows());
        }
        let mut order: Vec<(i64, u32)> = self
            .live()
            .map(|index| {
                let position = u32::try_from(index).expect("a snapshot takes fewer than 2^32 rows");
                (self.entries[index].expires, position)
            })
            .collect();
        order.sort_by_key(|&(expires, _)| expires);
        Box::new(order.into_iter().map(|(_, index)| self.row(index as usize)))
    }

    /// Whether, within each of the `vnodes` vnodes, the rows expire in the order they
    /// arrived (ties allowed): then their keys (expiry, arrival) ascend per vnode in
    /// arrival order.
    fn in_key_order(&self, vnodes: u32) -> bool {
        let mut last = vec![i64::MIN; vnodes as usize];
        self.rows().all(|row| {
            let last = &mut last[sluice_types::vnode::of_hash(row.key_hash, vnodes) as usize];
            let ordered = *last <= row.expires;
            *last = row.expires;
            ordered
        })
    }
}

impl Default for ExpiringStore {
    fn default() -> ExpiringStore {
        ExpiringStore::new(None, None)
    }
}

impl Drop for ExpiringStore {
    fn drop(&mut self) {
        if let Some(space) = &self.space {
            space.release(self.resident);
            space.count_spilled(self.spilled, false);
        }
    }
}

/// The bytes at `range` of `chunk`: borrowed when in memory, else read into `scratch`.
fn bytes_of<'a>(
    chunk: &'a LogChunk,
    range: std::ops::Range<usize>,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], SluiceError> {
    match chunk {
        LogChunk::Resident(bytes) => Ok(&bytes[range]),
        LogChunk::Spilled(spilled) => {
            scratch.clear();
            spilled.read_range(range, scratch)?;
            Ok(scratch)
        }
    }
}

/// The entries of `ring` from position `start` on, copied as (at most) two slices.
fn copy_from(ring: &VecDeque<Entry>, start: usize) -> Vec<Entry> {
    let (front, back) = ring.as_slices();
    let mut copy = Vec::with_capacity(ring.len().saturating_sub(start));
    if start < front.len() {
        copy.extend_from_slice(&front[start..]);
        copy.extend_from_slice(back);
    } else {
        copy.extend_from_slice(&back[start - front.len()..]);
    }
    copy
}

impl ExpiringStore {
    /// A store whose chunks beyond `space`'s budget spill (None: all stay in memory),
    /// counting the bytes written in `written`.
    pub(super) fn new(space: Option<Arc<SpillSpace>>, written: Option<LazyCounter>) -> ExpiringStore {
        ExpiringStore {
            ring: VecDeque::new(),
            front: 0,
            chunks: VecDeque::new(),
            first_chunk: 0,
            first_resident: 0,
            chunk_bytes: space.as_ref().map_or(CHUNK_BYTES, |space| space.chunk_bytes()),
            space,
            file: SpillFile::new(SEGMENT_BYTES),
            resident: 0,
            spilled: 0,
            written,
            spare: None,
            indexed: 0,
            heads: HashTable::new(),
            added: 0,
            by_time: BTreeMap::new(),
            watermark: None,
            live: 0,
            bytes: 0,
            snapshotted: 0,
            base_entry: 0,
            base_arrival: 0,
            snapshot_watermark: None,
            tracking: false,
        }
    }

    /// Rows held and not expired, with their multiplicity (so the count does not depend
    /// on whether equal rows arrived apart or together, as after a restore).
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// The bytes of the rows held and not expired, in their encoding.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    fn is_expired(&self, entry: &Entry) -> bool {
        self.watermark.is_some_and(|watermark| entry.expires <= watermark)
    }

    fn end(&self) -> u64 {
        self.front + self.ring.len() as u64
    }

    fn chunk(&self, entry: &Entry) -> &LogChunk {
        &self.chunks[(entry.chunk - self.first_chunk) as usize]
    }

    /// The bytes of row `id` (from [`ExpiringStore::probe`] since the last change), if
    /// its chunk is in memory.
    pub(super) fn resident_row(&self, id: u64) -> Option<&[u8]> {
        let entry = self.get(id);
        match self.chunk(entry) {
            LogChunk::Resident(bytes) => Some(&bytes[entry.row_range()]),
            LogChunk::Spilled(_) => None,
        }
    }

    /// Appends the bytes of row `id` to `out`, wherever they are.
    pub(super) fn read_row(&self, id: u64, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        let entry = self.get(id);
        match self.chunk(entry) {
            LogChunk::Resident(bytes) => {
                out.extend_from_slice(&bytes[entry.row_range()]);
                Ok(())
            }
            LogChunk::Spilled(spilled) => spilled.read_range(entry.row_range(), out),
        }
    }

    fn position(&self, id: u64) -> Option<usize> {
        let position = usize::try_from(id.checked_sub(self.front)?).ok()?;
        (position < self.ring.len()).then_some(position)
    }

    /// Appends to `out` the ids of the rows not expired whose join key is `key`
    /// (placement hash `hash`). A spilled entry's key is read back only when its hash is
    /// the key's.
    pub(super) fn probe(&mut self, key: &[u8], hash: u64, out: &mut Vec<u64>) -> Result<(), SluiceError> {
        let unindexed = self.end() - self.indexed.max(self.front);
        if unindexed > SCAN_ALWAYS && unindexed > SCAN_PER_INSERT.saturating_mul(self.added) {
            self.index()?;
        }
        self.added = 0;
        let found = self.heads.find(hash, |head| head.hash == hash && same_bytes(head.key.get(), key));
        let mut id = found.map_or(NONE, |head| head.newest);
        while let Some(position) = self.position(id) {
            let entry = &self.ring[position];
            if !self.is_expired(entry) {
                out.push(id);
            }
            id = entry.older;
        }
        let first = usize::try_from(self.indexed.saturating_sub(self.front)).unwrap_or(usize::MAX);
        let mut scratch = Vec::new();
        for (position, entry) in self.ring.iter().enumerate().skip(first) {
            if entry.key_hash == hash
                && !self.is_expired(entry)
                && same_bytes(bytes_of(self.chunk(entry), entry.key_range(), &mut scratch)?, key)
            {
                out.push(self.front + position as u64);
            }
        }
        Ok(())
    }

    /// Indexes every entry not indexed yet.
    fn index(&mut self) -> Result<(), SluiceError> {
        self.sweep_heads();
        let first = self.indexed.max(self.front);
        let mut scratch = Vec::new();
        for id in first..self.end() {
            let position = (id - self.front) as usize;
            let entry = &self.ring[position];
            let hash = entry.key_hash;
            let chunk = &self.chunks[(entry.chunk - self.first_chunk) as usize];
            let key = bytes_of(chunk, entry.key_range(), &mut scratch)?;
            let older = match self.heads.find_mut(hash, |head| head.hash == hash && same_bytes(head.key.get(), key)) {
                Some(head) => std::mem::replace(&mut head.newest, id),
                None => {
                    self.heads.insert_unique(hash, Head { hash, newest: id, key: SmallBytes::new(key) }, |h| h.hash);
                    NONE
                }
            };
            // An `older` entry already freed ends the chain there, as `NONE` does.
            self.ring[position].older = older;
        }
        self.indexed = self.end();
        Ok(())
    }

    /// The row `id` (from [`ExpiringStore::probe`] since the last change).
    pub(super) fn get(&self, id: u64) -> &Entry {
        &self.ring[self.position(id).expect("a probed row is held")]
    }

    pub(super) fn get_mut(&mut self, id: u64) -> &mut Entry {
        let position = self.position(id).expect("a probed row is held");
        &mut self.ring[position]
    }

    /// Adds an arrived row of weight `weight` (positive) expiring at `expires`.
    pub(super) fn push(
        &mut self,
        row: &[u8],
        key: &[u8],
        key_hash: u64,
        weight: i64,
        matches: i64,
        expires: i64,
    ) -> Result<(), SluiceError> {
        if weight < 0 {
            return Err(SluiceError::internal(
                "join.expiry",
                "a retraction reached a side whose rows expire (its input must be append-only)",
            ));
        }
        if weight == 0 {
            return Ok(());
        }
        let too_long = |_| SluiceError::internal("join.row", "a joined row and key of 4 GiB or more");
        let (row_length, key_length) =
            (u32::try_from(row.len()).map_err(too_long)?, u32::try_from(key.len()).map_err(too_long)?);
        let (chunk, start) = self.append(row, key)?;
        let start = u32::try_from(start).map_err(too_long)?;
        self.ring.push_back(Entry {
            chunk,
            start,
            row_length,
            key_length,
            expires,
            key_hash,
            weight,
            matches,
            older: NONE,
        });
        self.added += 1;
        if self.watermark.is_none_or(|watermark| expires > watermark) {
            let counts = self.by_time.entry(expires).or_default();
            counts.0 += weight as usize;
            counts.1 += row.len();
            self.live += weight as usize;
            self.bytes += row.len();
        }
        Ok(())
    }

    /// Appends `row` and `key` to the last chunk, or to a new one if it is full or shared
    /// with a snapshot; returns the chunk's sequence number and where they start.
    /// Starting a chunk while the space is over budget first spills the oldest chunks.
    fn append(&mut self, row: &[u8], key: &[u8]) -> Result<(u64, usize), SluiceError> {
        let length = row.len() + key.len();
        fn fits(chunk: &mut LogChunk, length: usize) -> Option<&mut Vec<u8>> {
            match chunk {
                LogChunk::Resident(bytes) => {
                    Arc::get_mut(bytes).filter(|bytes| bytes.capacity() - bytes.len() >= length)
                }
                LogChunk::Spilled(_) => None,
            }
        }
        if self.chunks.back_mut().and_then(|chunk| fits(chunk, length)).is_none() {
            let bytes = match self.spare.take() {
                Some(spare) if spare.capacity() >= length => spare,
                _ => Vec::with_capacity(self.chunk_bytes.max(length)),
            };
            let capacity = bytes.capacity();
            self.chunks.push_back(LogChunk::Resident(Arc::new(bytes)));
            self.resident += capacity;
            if let Some(space) = &self.space {
                space.charge(capacity);
            }
            self.spill_over_budget()?;
        }
        let sequence = self.first_chunk + self.chunks.len() as u64 - 1;
        let bytes =
            self.chunks.back_mut().and_then(|chunk| fits(chunk, length)).expect("a chunk with room, not shared");
        let start = bytes.len();
        bytes.extend_from_slice(row);
        bytes.extend_from_slice(key);
        Ok((sequence, start))
    }

    /// While the space is over budget, spills the oldest chunk in memory but the newest:
    /// the rows that expire first (in an input in event-time order).
    fn spill_over_budget(&mut self) -> Result<(), SluiceError> {
        let Some(space) = self.space.clone() else { return Ok(()) };
        let newest = self.first_chunk + self.chunks.len() as u64 - 1;
        self.first_resident = self.first_resident.max(self.first_chunk);
        while space.over_budget() && self.first_resident < newest {
            let index = (self.first_resident - self.first_chunk) as usize;
            if let LogChunk::Resident(bytes) = &self.chunks[index] {
                let (capacity, length) = (bytes.capacity(), bytes.len());
                let spilled = self.file.write(&space, bytes)?;
                self.chunks[index] = LogChunk::Spilled(Arc::new(spilled));
                self.resident -= capacity;
                self.spilled += length;
                space.release(capacity);
                space.count_spilled(length, true);
                if let Some(written) = self.written.as_mut() {
                    written.add(length as u64);
                }
            }
            self.first_resident += 1;
        }
        Ok(())
    }

    /// Frees the chunks before the one holding the front entry (every chunk when the
    /// ring is empty), keeping one unshared chunk to fill again.
    fn free_chunks(&mut self) {
        let first_held = self.ring.front().map_or(self.first_chunk + self.chunks.len() as u64, |entry| entry.chunk);
        while self.first_chunk < first_held {
            let chunk = self.chunks.pop_front().expect("a chunk before the first held");
            self.first_chunk += 1;
            self.uncount(&chunk);
            if let LogChunk::Resident(bytes) = chunk
                && let Ok(mut bytes) = Arc::try_unwrap(bytes)
            {
                bytes.clear();
                self.spare = Some(bytes);
            }
        }
    }

    /// Stops counting `chunk`, which this store no longer holds, in the space.
    fn uncount(&mut self, chunk: &LogChunk) {
        let (resident, spilled) = match chunk {
            LogChunk::Resident(bytes) => (bytes.capacity(), 0),
            LogChunk::Spilled(_) => (0, chunk.len()),
        };
        self.resident -= resident;
        self.spilled -= spilled;
        if let Some(space) = &self.space {
            space.release(resident);
            space.count_spilled(spilled, false);
        }
    }

    /// Expires every row expiring at or before `watermark` and frees the front of the
    /// ring up to the first row not expired; returns how many rows expired (with their
    /// multiplicity).
    pub(super) fn expire(&mut self, watermark: i64) -> usize {
        if self.watermark.is_some_and(|passed| watermark <= passed) {
            return 0;
        }
        self.watermark = Some(watermark);
        let due = match watermark.checked_add(1) {
            Some(after) => {
                let kept = self.by_time.split_off(&after);
                std::mem::replace(&mut self.by_time, kept)
            }
            None => std::mem::take(&mut self.by_time),
        };
        let mut expired = 0;
        for (rows, bytes) in due.into_values() {
            expired += rows;
            self.live -= rows;
            self.bytes -= bytes;
        }
        while self.ring.front().is_some_and(|entry| entry.expires <= watermark) {
            self.ring.pop_front();
            self.front += 1;
        }
        self.free_chunks();
        self.sweep_heads();
        expired
    }

    /// Drops index entries whose newest entry left the ring, once they may outnumber the
    /// entries held. After a sweep the index holds at most one entry per entry held, so
    /// the next one waits until the index grew or the ring shrank by as many entries:
    /// the work is paid for by those insertions or frees.
    fn sweep_heads(&mut self) {
        if self.ring.is_empty() {
            self.heads.clear();
        }
        if self.heads.len() < 2 * self.ring.len() + 64 {
            return;
        }
        let front = self.front;
        self.heads.retain(|head| head.newest >= front);
    }

    /// Puts the rows in the order of their expiry (restored rows come in the order of
    /// their bytes), so they are freed as they expire; their bytes are copied into new
    /// chunks in that order (read back from the spill files where they spilled), and
    /// the index starts over.
    pub(super) fn sort_by_expiry(&mut self) -> Result<(), SluiceError> {
        let mut entries: Vec<Entry> = std::mem::take(&mut self.ring).into();
        entries.sort_by_key(|entry| entry.expires);
        let chunks = std::mem::take(&mut self.chunks);
        let first_chunk = self.first_chunk;
        self.first_chunk += chunks.len() as u64;
        self.heads.clear();
        self.indexed = self.front;
        let mut scratch = Vec::new();
        for mut entry in entries {
            let chunk = &chunks[(entry.chunk - first_chunk) as usize];
            let whole = entry.row_range().start..entry.key_range().end;
            let bytes = bytes_of(chunk, whole, &mut scratch)?;
            let (row, key) = bytes.split_at(entry.row_length as usize);
            let (chunk, start) = self.append(row, key)?;
            entry.chunk = chunk;
            entry.start = u32::try_from(start).expect("a chunk holds less than 4 GiB before a row starts");
            entry.older = NONE;
            self.ring.push_back(entry);
        }
        for chunk in &chunks {
            self.uncount(chunk);
        }
        Ok(())
    }

    /// Whether a snapshot may take only what changed.
    pub(super) fn tracking(&self) -> bool {
        self.tracking
    }

    /// The rows a snapshot takes (see the module doc): every row not expired (`full`,
    /// numbered from 0), or those arrived since the previous snapshot and the watermark
    /// if it moved. The entries are copied in one piece (expired ones among them are
    /// left out when written), and each chunk holding them is shared once: the barrier's
    /// work is a memory copy of the delta's entries, not a step per row.
    pub(super) fn changes(&mut self, full: bool) -> ExpiringChanges {
        assert!(full || self.tracking, "a delta of a store that kept no changes");
        if full {
            (self.base_entry, self.base_arrival, self.snapshotted) = (self.front, 0, self.front);
        }
        let first = self.snapshotted.max(self.front);
        let entries = copy_from(&self.ring, (first - self.front) as usize);
        let (first_chunk, chunks) = match (entries.first(), entries.last()) {
            (Some(oldest), Some(newest)) => (
                oldest.chunk,
                (oldest.chunk..=newest.chunk)
                    .map(|chunk| self.chunks[(chunk - self.first_chunk) as usize].clone())
                    .collect(),
            ),
            _ => (0, Vec::new()),
        };
        let moved = !full && self.watermark != self.snapshot_watermark;
        let expired_through = if moved { self.watermark } else { None };
        let changes = ExpiringChanges {
            entries,
            first_arrival: self.base_arrival + (first - self.base_entry),
            first_chunk,
            chunks,
            watermark: self.watermark,
            expired_through,
        };
        self.snapshotted = self.end();
        self.snapshot_watermark = self.watermark;
        self.tracking = true;
        changes
    }

    /// After a restore: every row held is in the runs, whose highest arrival number was
    /// `last_arrival` (None: no row).
    pub(super) fn restored(&mut self, last_arrival: Option<u64>) -> Result<(), SluiceError> {
        self.sort_by_expiry()?;
        self.snapshotted = self.end();
        (self.base_entry, self.base_arrival) = (self.end(), last_arrival.map_or(0, |last| last + 1));
        self.snapshot_watermark = self.watermark;
        self.tracking = true;
        Ok(())
    }

    /// Every row not expired, in arrival order, with its chunk.
    #[cfg(test)]
    pub(super) fn rows(&self) -> impl Iterator<Item = (&Entry, &LogChunk)> {
        self.ring.iter().filter(|entry| !self.is_expired(entry)).map(move |entry| (entry, self.chunk(entry)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(store: &mut ExpiringStore, row: &[u8], key: &[u8], expires: i64) {
        store.push(row, key, sluice_types::key::hash(key), 1, 0, expires).expect("push");
    }

    fn probe(store: &mut ExpiringStore, key: &[u8]) -> Vec<Vec<u8>> {
        let mut ids = Vec::new();
        store.probe(key, sluice_types::key::hash(key), &mut ids).expect("probe");
        let mut rows: Vec<Vec<u8>> = ids
            .into_iter()
            .map(|id| {
                let mut row = Vec::new();
                store.read_row(id, &mut row).expect("read");
                row
            })
            .collect();
        rows.sort();
        rows
    }

    #[test]
    fn rows_are_found_by_key_until_they_expire() {
        let mut store = ExpiringStore::default();
        push(&mut store, b"a1", b"a", 10);
        push(&mut store, b"b1", b"b", 15);
        push(&mut store, b"a2", b"a", 20);
        push(&mut store, b"a2", b"a", 20);
        assert_eq!(probe(&mut store, b"a"), [b"a1".to_vec(), b"a2".to_vec(), b"a2".to_vec()]);
        assert_eq!((store.len(), store.bytes()), (4, 8), "equal rows that arrived apart are held apart");
        assert_eq!(store.expire(10), 1);
        assert_eq!(probe(&mut store, b"a"), [b"a2".to_vec(), b"a2".to_vec()]);
        assert_eq!(store.ring.len(), 3, "a1, at the front, is freed");
        assert_eq!(store.expire(16), 1);
        assert!(probe(&mut store, b"b").is_empty());
        assert_eq!(store.expire(20), 2);
        assert!(probe(&mut store, b"a").is_empty());
        assert_eq!((store.len(), store.bytes(), store.ring.len(), store.heads.len()), (0, 0, 0, 0));
    }

    #[test]
    fn a_row_out_of_expiry_order_holds_memory_not_results() {
        let mut store = ExpiringStore::default();
        push(&mut store, b"late", b"a", 100);
        push(&mut store, b"x1", b"x", 10);
        push(&mut store, b"x2", b"x", 11);
        assert_eq!(store.expire(50), 2);
        assert_eq!(store.len(), 1);
        assert!(probe(&mut store, b"x").is_empty(), "expired rows are invisible");
        assert_eq!(store.rows().count(), 1);
        assert_eq!(store.ring.len(), 3, "held behind the row expiring at 100");
        assert_eq!(store.expire(100), 1);
        assert_eq!(store.ring.len(), 0);
        // A row arriving already expired is held by nothing and counted nowhere.
        push(&mut store, b"old", b"x", 90);
        assert_eq!(store.len(), 0);
        assert!(probe(&mut store, b"x").is_empty());
    }

    /// Keys `0..keys` (8 bytes each), one row per key, expiring at their key.
    fn fill(store: &mut ExpiringStore, keys: std::ops::Range<u64>) {
        for key in keys {
            push(store, &key.to_le_bytes(), &key.to_le_bytes(), key as i64);
        }
    }

    #[test]
    fn a_side_probed_rarely_is_scanned_and_one_probed_often_indexed() {
        let mut rare = ExpiringStore::default();
        fill(&mut rare, 0..1000);
        assert_eq!(probe(&mut rare, &7u64.to_le_bytes()), [7u64.to_le_bytes().to_vec()]);
        assert_eq!(rare.heads.len(), 0, "1000 rows added since the last probe: scanned");
        let mut often = ExpiringStore::default();
        fill(&mut often, 0..1000);
        assert_eq!(probe(&mut often, &1u64.to_le_bytes()).len(), 1);
        for key in 1000..1100u64 {
            fill(&mut often, key..key + 1);
            assert_eq!(probe(&mut often, &(key - 500).to_le_bytes()), [(key - 500).to_le_bytes().to_vec()]);
        }
        assert!(often.indexed >= 1100 - SCAN_ALWAYS, "one row added per probe: indexed in batches");
        assert_eq!(often.heads.len() as u64, often.indexed);
        // Freed keys leave the index as it grows; rows keep being found.
        for key in 1100..10_000u64 {
            fill(&mut often, key..key + 1);
            often.expire(key as i64 - 10);
            assert_eq!(probe(&mut often, &(key - 5).to_le_bytes()).len(), 1, "{key}");
        }
        assert!(often.heads.len() < 2 * often.ring.len() + 64, "{}", often.heads.len());
        // A long key is boxed in the index.
        let long = [7u8; 40];
        for _ in 0..100 {
            push(&mut often, b"long", &long, 20_000);
            probe(&mut often, &long);
        }
        assert_eq!(probe(&mut often, &long).len(), 100);
        assert!(often.push(b"r", b"k", 0, -1, 0, 5).is_err(), "retractions are refused");
    }

    #[test]
    fn chunks_shared_with_a_snapshot_stay_as_they_were_and_freed_ones_are_filled_again() {
        let mut store = ExpiringStore::default();
        push(&mut store, b"a", b"k", 1);
        let shared: Vec<LogChunk> = store.rows().map(|(_, chunk)| chunk.clone()).collect();
        push(&mut store, b"b", b"k", 2);
        assert_eq!(store.chunks.len(), 2, "the shared chunk is not appended to");
        let LogChunk::Resident(first) = &shared[0] else { panic!("nothing spills without a space") };
        assert_eq!(first.as_slice(), b"ak", "the snapshot's bytes are as they were");
        drop(shared);
        assert_eq!(store.expire(1), 1);
        assert_eq!(store.chunks.len(), 1, "the first chunk is freed");
        assert!(store.spare.is_some(), "and kept to be filled again");
        let long = vec![1u8; CHUNK_BYTES + 10];
        push(&mut store, &long, b"k", 3);
        assert_eq!(store.chunks.len(), 2, "a row longer than a chunk gets one of its own");
        assert_eq!(probe(&mut store, b"k"), [long, b"b".to_vec()]);
        assert_eq!(store.expire(3), 2);
        assert!(store.chunks.is_empty());
    }

    #[test]
    fn rows_beyond_the_budget_spill_oldest_first_and_their_disk_is_freed_as_they_expire() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 256, 64);
        let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
        let written = crate::spill::spilled_bytes(&metrics);
        let mut store = ExpiringStore::new(Some(Arc::clone(&space)), Some(written));
        // 1,000 rows of 16 bytes and an 8-byte key, 2 per chunk, expiring in order.
        fill(&mut store, 0..1000);
        assert!(space.resident() <= 256 + 64, "{} bytes in memory over a budget of 256", space.resident());
        assert!(space.spilled() >= 1000 * 16 - 256 - 64, "{} bytes spilled", space.spilled());
        assert!(matches!(store.chunks[0], LogChunk::Spilled(_)), "the oldest rows spill");
        assert!(matches!(store.chunks.back(), Some(LogChunk::Resident(_))), "the newest stay");
        assert_eq!(metrics.counters()[0].1 as usize, space.spilled(), "the bytes written are counted");
        // Probes find spilled rows by a scan and, probed often, through the index.
        assert_eq!(probe(&mut store, &3u64.to_le_bytes()), [3u64.to_le_bytes().to_vec()]);
        for key in (0..1000u64).step_by(7) {
            assert_eq!(probe(&mut store, &key.to_le_bytes()), [key.to_le_bytes().to_vec()], "{key}");
        }
        assert!(store.indexed > 0, "indexed from spilled keys");
        // A snapshot takes spilled and resident rows alike.
        let changes = store.changes(true);
        assert_eq!(changes.rows().count(), 1000);
        assert!(changes.rows().any(|row| matches!(changes.chunks()[row.chunk], LogChunk::Spilled(_))));
        drop(changes);
        // Expiring the oldest half frees their chunks, on disk first.
        let spilled = space.spilled();
        assert_eq!(store.expire(499), 500);
        assert_eq!(space.spilled(), spilled - 500 * 16, "the expired rows' disk is given back");
        assert_eq!(probe(&mut store, &700u64.to_le_bytes()), [700u64.to_le_bytes().to_vec()]);
        assert_eq!(store.expire(999), 500);
        assert_eq!((space.resident(), space.spilled()), (0, 0), "nothing held, nothing counted");
        fill(&mut store, 1000..1010);
        drop(store);
        assert_eq!((space.resident(), space.spilled()), (0, 0), "a dropped store leaves nothing counted");
    }

    #[test]
    fn restored_rows_are_put_in_expiry_order() {
        let mut store = ExpiringStore::default();
        for key in [5u64, 1, 9, 3] {
            push(&mut store, &key.to_le_bytes(), b"k", key as i64);
        }
        store.sort_by_expiry().expect("sort");
        assert_eq!(store.ring.iter().map(|e| e.expires).collect::<Vec<_>>(), [1, 3, 5, 9]);
        assert_eq!(store.expire(4), 2);
        assert_eq!(store.ring.len(), 2, "both freed at once");
        assert_eq!(probe(&mut store, b"k"), [5u64.to_le_bytes().to_vec(), 9u64.to_le_bytes().to_vec()]);
    }
}
