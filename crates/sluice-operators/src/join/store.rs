//! One side's stored rows: a multiset of whole rows, each with its weight and match
//! count, found by join key (to probe) and by the row itself (to accumulate weights).
//!
//! The layout is compact, so that memory follows the rows' encoded size (a regular join
//! keeps every row of its inputs: NEXMark q20 holds tens of millions):
//!
//! - A row's bytes are appended to large shared chunks (a [`SpillLog`]), never allocated
//!   one by one; given a spill space ([`Store::new`]), the oldest chunks beyond the
//!   worker's memory budget are written to the log's file, and a probe, a lookup of an
//!   equal row, a removal or a snapshot reads a spilled row back with a positioned read.
//!   A removed row's bytes stay where they are, counted as
//!   dead; once the dead bytes outnumber the live ones (and a chunk's worth), every live
//!   row is copied into a fresh log in slot order and the old one is dropped, its file
//!   with it ([`Store::compact`]), so a row's removal costs O(1) amortized and the log,
//!   in memory and on disk, never holds more than about twice the live bytes. A snapshot
//!   shares the chunks (a chunk a snapshot shares is not appended to again; a compaction
//!   leaves it to the snapshot).
//! - Each distinct row has a slot: a fixed-size [`Slot`] (48 bytes) in [`Pages`]
//!   of up to 65,536 slots, so that growing never copies the slots already held nor
//!   holds them twice (one vector doubled and copied every slot into fresh pages, and
//!   kept old and new at once: NEXMark q20's peak), a removed row's slot reused (slot
//!   numbers are the TTL's ids). The slots of one join
//!   key form a doubly linked list through the slots, in insertion order, so a key has
//!   no vector of its own.
//! - `by_key`: a hash table from join key to its list's ends ([`Head`], the key inline
//!   when short), one entry per key, no allocation for a key of up to 22 bytes.
//! - `by_row`: a hash table of slot numbers by the row's hash (the batch's XXH3, its low
//!   32 bits kept in the slot so growing the table reads no row bytes).
//!
//! Both tables are keyed by hashes computed once per batch, so nothing is hashed twice
//! and no list is ever scanned to find an equal row: a key with millions of rows costs
//! the same per insert as a key with one.
//!
//! Snapshots ([`Store::changes`]): each slot whose row was inserted, reweighed or (on a
//! preserved side) matched since the previous snapshot is marked, once; each row removed
//! since is kept (its key hash and bytes) for a delete. A delta is then the rows of the
//! marked slots still holding one, and the removed rows, keyed by the row itself.
//!
//! A side whose rows expire (an interval or window join with a TTL) also indexes its
//! rows by the time they expire (`by_time`, ordered, and each slot's expiry in
//! `expiries`, kept only once some row expires), so freeing the rows a watermark passed
//! touches only those rows, never the rest of the state. An entry of that index may
//! outlive its row (a retraction removed it, or its slot was reused): freeing checks the
//! slot still holds a row that expires by then.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashTable;

use sluice_types::SluiceError;

use crate::bytes::SmallBytes;
use crate::counter::LazyCounter;
use crate::pages::Pages;
use crate::same_bytes;
use crate::spill::{SharedChunk, SpillLog, SpillSpace};

/// No slot: the end of a key's list, or of the free list.
const NONE: u32 = u32::MAX;

/// Bytes of rows appended in slot-insertion order, as tests see a chunk in memory.
#[cfg(test)]
pub(super) type Chunk = Arc<Vec<u8>>;

/// One distinct stored row, or a free slot (`chunk == NONE`).
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Where the row's bytes are: the whole row in the project's key encoding (the
    /// side's columns in order), `length` bytes from `start` in chunk `chunk`.
    chunk: u32,
    start: u32,
    length: u32,
    /// The low 32 bits of the row's XXH3 (the `by_row` table's hash).
    row_hash: u32,
    /// The neighbours in the key's list (`next` also links the free list).
    previous: u32,
    next: u32,
    /// The join key's placement hash (the exchange's), so the row's vnode.
    key_hash: u64,
    /// The row's multiplicity (never 0 while stored).
    weight: i64,
    /// The summed weights of the other side's rows it matches (same key, residual true).
    matches: i64,
}

const FREE: Slot = Slot {
    chunk: NONE,
    start: 0,
    length: 0,
    row_hash: 0,
    previous: NONE,
    next: NONE,
    key_hash: 0,
    weight: 0,
    matches: 0,
};

impl Slot {
    fn is_free(&self) -> bool {
        self.chunk == NONE
    }

    fn range(&self) -> std::ops::Range<usize> {
        crate::spill::byte_range(self.start, self.length)
    }
}

/// A join key's list of slots.
#[derive(Debug)]
struct Head {
    hash: u64,
    first: u32,
    last: u32,
    key: SmallBytes,
}

/// The expiry of a row that never expires.
pub(super) const NEVER: i64 = i64::MAX;

/// The `by_row` table's hash of a row, from the low 32 bits of its XXH3 (spread over 64
/// bits: the table takes its control bits from the top).
fn row_table_hash(row_hash: u32) -> u64 {
    u64::from(row_hash).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A stored row as [`Store::rows`] gives it: its bytes shared with the store.
#[cfg(test)]
pub(super) struct StoredRef<'a> {
    pub(super) chunk: &'a Chunk,
    pub(super) range: std::ops::Range<usize>,
    pub(super) weight: i64,
    pub(super) matches: i64,
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct Store {
    slots: Pages<Slot>,
    /// The first free slot (linked through `next`), or [`NONE`].
    free_slot: u32,
    /// Per slot, when its row can be freed (once the watermark is at or above it); empty
    /// while every row never expires.
    expiries: Vec<i64>,
    /// The rows' bytes, beyond the budget of `space` in its file.
    log: SpillLog,
    space: Option<Arc<SpillSpace>>,
    by_row: HashTable<u32>,
    by_key: HashTable<Head>,
    /// Expiry time → the slots of rows expiring then (rows that never expire are not here).
    by_time: BTreeMap<i64, Vec<u32>>,
    live: usize,
    /// The encoded rows' bytes.
    bytes: usize,
    /// The bytes of removed rows still in the chunks.
    dead_bytes: usize,
    /// Rows not written for a while are dropped (see `crate::ttl`), by slot.
    ttl: Option<crate::ttl::Ttl>,
    /// The slots changed since the previous snapshot.
    changed: crate::changed::ChangedIds,
    /// The rows removed since the previous snapshot: key hash and bytes.
    removed: Vec<(u64, Vec<u8>)>,
    /// Whether changes are kept: from the first snapshot (or a restore) on, so that a
    /// run without checkpoints keeps nothing of the kind.
    tracking: bool,
    /// The bytes of the slots and the two tables, as counted in `space`.
    index_bytes: usize,
}

/// A stored row a snapshot takes: its bytes shared with the store.
#[derive(Debug, Clone)]
pub(super) struct ByRowCopy {
    /// Its chunk's number in [`ByRowChanges::chunks`].
    pub(super) chunk: u32,
    pub(super) range: std::ops::Range<usize>,
    pub(super) key_hash: u64,
    pub(super) weight: i64,
    pub(super) matches: i64,
}

/// The rows a snapshot takes: rows now, and rows removed (key hash and bytes).
#[derive(Debug, Default)]
pub(super) struct ByRowChanges {
    pub(super) rows: Vec<ByRowCopy>,
    /// The log's chunks, shared (none when no row is taken).
    pub(super) chunks: Vec<SharedChunk>,
    pub(super) removed: Vec<(u64, Vec<u8>)>,
}

impl Default for Store {
    fn default() -> Store {
        Store::new(None, None)
    }
}

/// A row to apply to a store: its bytes and hashes, as encoded for one batch.
pub(super) struct RowRef<'a> {
    pub(super) row: &'a [u8],
    pub(super) row_hash: u64,
    pub(super) key: &'a [u8],
    pub(super) key_hash: u64,
}

impl Store {
    /// A store whose chunks hold `chunk_bytes` (tests use small ones to compact often).
    #[cfg(test)]
    fn with_chunk_bytes(chunk_bytes: usize) -> Store {
        Store::with_log(SpillLog::with_chunk_bytes(None, chunk_bytes), None)
    }

    /// A store whose rows' bytes spill within `space` (None: all in memory), the bytes
    /// written counted in `written`.
    pub(super) fn new(space: Option<Arc<SpillSpace>>, written: Option<LazyCounter>) -> Store {
        Store::with_log(SpillLog::new(space.clone()).counting(written), space)
    }

    fn with_log(log: SpillLog, space: Option<Arc<SpillSpace>>) -> Store {
        Store {
            slots: Pages::default(),
            free_slot: NONE,
            expiries: Vec::new(),
            log,
            space,
            by_row: HashTable::new(),
            by_key: HashTable::new(),
            by_time: BTreeMap::new(),
            live: 0,
            bytes: 0,
            dead_bytes: 0,
            ttl: None,
            changed: crate::changed::ChangedIds::default(),
            removed: Vec::new(),
            tracking: false,
            index_bytes: 0,
        }
    }

    /// Counts the slots and the tables in the space again (after a row was added): the
    /// slots by 1,024 at a time, the tables by their capacity (an entry and a control
    /// byte a bucket), so that the space's shared count changes only now and then. They
    /// stay in memory: counting them makes the rows' bytes spill sooner.
    fn count_index(&mut self) {
        let slots = self.slots.len().next_multiple_of(1024) * size_of::<Slot>();
        let tables = self.by_row.capacity() * (size_of::<u32>() + 1) + self.by_key.capacity() * (size_of::<Head>() + 1);
        let bytes = slots + tables;
        if bytes != self.index_bytes {
            SpillSpace::recount(self.space.as_deref(), &mut self.index_bytes, bytes);
        }
    }

    /// Marks `slot` changed since the previous snapshot.
    pub(super) fn mark(&mut self, slot: u32) {
        if !self.tracking {
            return;
        }
        self.changed.mark(slot);
    }

    /// Whether a snapshot may take only what changed (changes are kept).
    pub(super) fn tracking(&self) -> bool {
        self.tracking
    }

    /// The rows a snapshot takes (see the module doc): every row (`full`), or the rows
    /// changed and removed since the previous snapshot. Changes are kept from then on.
    pub(super) fn changes(&mut self, full: bool) -> ByRowChanges {
        assert!(full || self.tracking, "a delta of a store that kept no changes");
        let copy = |slot: &Slot| ByRowCopy {
            chunk: slot.chunk,
            range: slot.range(),
            key_hash: slot.key_hash,
            weight: slot.weight,
            matches: slot.matches,
        };
        let mut changes = ByRowChanges::default();
        if full {
            changes.rows = self.slots.iter().filter(|s| !s.is_free()).map(copy).collect();
        } else {
            changes.rows.reserve(self.changed.listed());
            for slot in self.changed.take() {
                let stored = &self.slots[slot as usize];
                if !stored.is_free() {
                    changes.rows.push(copy(stored));
                }
            }
            changes.removed = std::mem::take(&mut self.removed);
        }
        if !changes.rows.is_empty() {
            changes.chunks = self.log.share(0..self.log.chunk_count());
        }
        self.clear_changes();
        changes
    }

    /// Forgets what changed: the state is all in the runs (after a snapshot, or a
    /// restore); changes are kept from now on.
    pub(super) fn clear_changes(&mut self) {
        self.changed.clear();
        self.removed.clear();
        self.tracking = true;
    }

    /// The bytes in the chunks, live and dead.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        (0..self.log.chunks().len() as u32).map(|chunk| self.log.resident(chunk).len()).sum()
    }

    /// Drops rows not written (inserted, or their weight changed) for the TTL.
    pub(super) fn set_ttl(&mut self, ttl: crate::ttl::Ttl) {
        self.ttl = Some(ttl);
    }

    /// Drops the rows whose TTL passed; returns how many went.
    pub(super) fn expire_ttl(&mut self) -> Result<usize, SluiceError> {
        let Some(ttl) = self.ttl.as_mut() else { return Ok(0) };
        let expired = ttl.expired();
        let mut freed = 0;
        for slot in expired {
            if !self.slots[slot as usize].is_free() {
                self.remove(slot)?;
                freed += 1;
            }
        }
        self.compact_if_sparse()?;
        Ok(freed)
    }

    /// Distinct rows held.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// The bytes of the distinct rows held, in their encoding (the indexes not counted).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends to `out` the slots of the rows whose join key is `key` (placement hash
    /// `hash`), in the order they were inserted.
    pub(super) fn probe(&self, key: &[u8], hash: u64, out: &mut Vec<u64>) {
        let Some(head) = self.by_key.find(hash, |h| h.hash == hash && same_bytes(h.key.get(), key)) else { return };
        let mut slot = head.first;
        while slot != NONE {
            out.push(u64::from(slot));
            slot = self.slots[slot as usize].next;
        }
    }

    /// The bytes of the row in `slot`, in memory (tests keep every row there).
    #[cfg(test)]
    pub(super) fn row(&self, slot: u32) -> &[u8] {
        self.resident_row(slot).expect("a row in memory")
    }

    /// The bytes of the row in `slot`, if they are in memory.
    pub(super) fn resident_row(&self, slot: u32) -> Option<&[u8]> {
        let stored = &self.slots[slot as usize];
        assert!(!stored.is_free(), "a probed slot holds a row");
        self.log.get(stored.chunk, stored.range())
    }

    /// Appends the bytes of the row in `slot` to `out`, from memory or from the file.
    pub(super) fn read_row(&self, slot: u32, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        let stored = &self.slots[slot as usize];
        assert!(!stored.is_free(), "a probed slot holds a row");
        self.log.read_into(stored.chunk, stored.range(), out)
    }

    /// The weight and the match count of the row in `slot`.
    pub(super) fn counts_mut(&mut self, slot: u32) -> (i64, &mut i64) {
        let stored = &mut self.slots[slot as usize];
        assert!(!stored.is_free(), "a probed slot holds a row");
        (stored.weight, &mut stored.matches)
    }

    /// Every stored row, in slot order.
    #[cfg(test)]
    pub(super) fn rows(&self) -> impl Iterator<Item = StoredRef<'_>> {
        self.slots.iter().filter(|s| !s.is_free()).map(|s| StoredRef {
            chunk: self.log.resident(s.chunk),
            range: s.range(),
            weight: s.weight,
            matches: s.matches,
        })
    }

    /// The slot holding exactly `row` (a spilled row of the same hash is read back to
    /// compare).
    pub(super) fn find(&self, row: &[u8], row_hash: u64) -> Result<Option<u32>, SluiceError> {
        let (slots, log) = (&self.slots, &self.log);
        let short_hash = row_hash as u32;
        let (mut scratch, mut failed) = (Vec::new(), None);
        let found = self
            .by_row
            .find(row_table_hash(short_hash), |&s| {
                let stored = &slots[s as usize];
                if stored.row_hash != short_hash || stored.length as usize != row.len() {
                    return false;
                }
                if let Some(bytes) = log.get(stored.chunk, stored.range()) {
                    return same_bytes(bytes, row);
                }
                scratch.clear();
                match log.read_into(stored.chunk, stored.range(), &mut scratch) {
                    Ok(()) => scratch == row,
                    Err(error) => {
                        failed.get_or_insert(error);
                        false
                    }
                }
            })
            .copied();
        match failed {
            Some(error) => Err(error),
            None => Ok(found),
        }
    }

    /// Adds `weight` copies of `row` (a negative weight removes copies); a row whose
    /// weight reaches 0 is dropped. A new row starts with `matches` and expires at
    /// `expires` (a function of the row, so equal rows expire together).
    pub(super) fn apply(
        &mut self,
        row: &RowRef<'_>,
        weight: i64,
        matches: i64,
        expires: i64,
    ) -> Result<(), SluiceError> {
        if weight == 0 {
            return Ok(());
        }
        if let Some(slot) = self.find(row.row, row.row_hash)? {
            let stored = &mut self.slots[slot as usize];
            stored.weight += weight;
            if stored.weight == 0 {
                self.remove(slot)?;
                self.compact_if_sparse()?;
            } else {
                self.mark(slot);
                if let Some(ttl) = self.ttl.as_mut() {
                    ttl.written(slot);
                }
            }
            return Ok(());
        }
        self.insert(row, weight, matches, expires)
    }

    /// Adds a row that is not stored yet.
    fn insert(&mut self, row: &RowRef<'_>, weight: i64, matches: i64, expires: i64) -> Result<(), SluiceError> {
        debug_assert!(weight != 0 && self.find(row.row, row.row_hash).is_ok_and(|found| found.is_none()));
        let length = u32::try_from(row.row.len()).expect("a row shorter than 4 GiB");
        let (chunk, start) = self.log.append(row.row)?;
        let slot = self.take_slot();
        let short_hash = row.row_hash as u32;
        self.slots[slot as usize] = Slot {
            chunk,
            start,
            length,
            row_hash: short_hash,
            previous: NONE,
            next: NONE,
            key_hash: row.key_hash,
            weight,
            matches,
        };
        self.link(slot, row.key, row.key_hash);
        if expires != NEVER || !self.expiries.is_empty() {
            self.expiries.resize(self.slots.len(), NEVER);
            self.expiries[slot as usize] = expires;
        }
        if expires != NEVER {
            self.by_time.entry(expires).or_default().push(slot);
        }
        let slots = &self.slots;
        self.by_row.insert_unique(row_table_hash(short_hash), slot, |&s| row_table_hash(slots[s as usize].row_hash));
        self.live += 1;
        self.bytes += row.row.len();
        self.mark(slot);
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.written(slot);
        }
        self.count_index();
        Ok(())
    }

    /// A free slot, taken off the free list or added.
    fn take_slot(&mut self) -> u32 {
        if self.free_slot != NONE {
            let slot = self.free_slot;
            self.free_slot = self.slots[slot as usize].next;
            return slot;
        }
        assert!(self.slots.len() < NONE as usize, "fewer than 2^32 - 1 rows per side and thread");
        self.slots.push(FREE);
        (self.slots.len() - 1) as u32
    }

    /// Appends `slot` to the list of its join key, adding the key if new.
    fn link(&mut self, slot: u32, key: &[u8], hash: u64) {
        match self.by_key.find_mut(hash, |h| h.hash == hash && same_bytes(h.key.get(), key)) {
            Some(head) => {
                let last = std::mem::replace(&mut head.last, slot);
                self.slots[last as usize].next = slot;
                self.slots[slot as usize].previous = last;
            }
            None => {
                let head = Head { hash, first: slot, last: slot, key: SmallBytes::new(key) };
                self.by_key.insert_unique(hash, head, |h| h.hash);
            }
        }
    }

    /// Drops every row expiring at or before `watermark`; returns how many went. The
    /// work is proportional to the rows freed (and stale index entries passed).
    pub(super) fn expire(&mut self, watermark: i64) -> Result<usize, SluiceError> {
        let due = match watermark.checked_add(1) {
            Some(after) => {
                let kept = self.by_time.split_off(&after);
                std::mem::replace(&mut self.by_time, kept)
            }
            None => std::mem::take(&mut self.by_time),
        };
        let mut freed = 0;
        for slot in due.into_values().flatten() {
            let held = !self.slots[slot as usize].is_free();
            if held && self.expiries.get(slot as usize).is_some_and(|&e| e <= watermark) {
                self.remove(slot)?;
                freed += 1;
            }
        }
        self.compact_if_sparse()?;
        Ok(freed)
    }

    /// Drops the row in `slot` (its bytes stay in their chunk, dead, until a compaction).
    fn remove(&mut self, slot: u32) -> Result<(), SluiceError> {
        let stored = self.slots[slot as usize];
        assert!(!stored.is_free(), "a live slot");
        if self.tracking {
            let mut row = Vec::with_capacity(stored.length as usize);
            self.log.read_into(stored.chunk, stored.range(), &mut row)?;
            self.removed.push((stored.key_hash, row));
        }
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.forget(slot);
        }
        self.live -= 1;
        self.bytes -= stored.length as usize;
        self.dead_bytes += stored.length as usize;
        self.by_row.find_entry(row_table_hash(stored.row_hash), |&s| s == slot).expect("an indexed row").remove();
        self.unlink(slot, &stored);
        if let Some(expires) = self.expiries.get_mut(slot as usize) {
            *expires = NEVER;
        }
        self.slots[slot as usize] = Slot { next: self.free_slot, ..FREE };
        self.free_slot = slot;
        Ok(())
    }

    /// Takes `slot` out of its key's list, and the key out of `by_key` if it was its
    /// only row.
    fn unlink(&mut self, slot: u32, stored: &Slot) {
        let hash = stored.key_hash;
        if stored.previous != NONE {
            self.slots[stored.previous as usize].next = stored.next;
        }
        if stored.next != NONE {
            self.slots[stored.next as usize].previous = stored.previous;
        }
        match (stored.previous, stored.next) {
            (NONE, NONE) => {
                self.by_key.find_entry(hash, |h| h.first == slot).expect("an indexed key").remove();
            }
            (NONE, next) => self.by_key.find_mut(hash, |h| h.first == slot).expect("an indexed key").first = next,
            (previous, NONE) => {
                self.by_key.find_mut(hash, |h| h.last == slot).expect("an indexed key").last = previous;
            }
            _ => {}
        }
    }

    /// Compacts the chunks once removed rows' bytes outnumber the live rows' and fill a
    /// chunk.
    fn compact_if_sparse(&mut self) -> Result<(), SluiceError> {
        if self.dead_bytes >= self.log.chunk_bytes() && self.dead_bytes > self.bytes {
            self.compact()?;
        }
        Ok(())
    }

    /// Copies every live row into a fresh log, in slot order (spilled rows read back),
    /// and drops the old one and its file (a snapshot still sharing a chunk keeps it
    /// until it is done).
    fn compact(&mut self) -> Result<(), SluiceError> {
        // The old chunks in memory go with the old log: counted, they would make the
        // fresh log spill nearly every live row while memory is about to be freed.
        self.log.uncount_resident();
        let counter = self.log.take_counter();
        let mut fresh = SpillLog::with_chunk_bytes(self.space.clone(), self.log.chunk_bytes()).counting(counter);
        let mut moved = Vec::with_capacity(self.live);
        let mut scratch = Vec::new();
        for slot in 0..self.slots.len() {
            let stored = self.slots[slot];
            if stored.is_free() {
                continue;
            }
            let place = match self.log.get(stored.chunk, stored.range()) {
                Some(bytes) => fresh.append(bytes)?,
                None => {
                    scratch.clear();
                    self.log.read_into(stored.chunk, stored.range(), &mut scratch)?;
                    fresh.append(&scratch)?
                }
            };
            moved.push((slot, place));
        }
        for (slot, (chunk, start)) in moved {
            let stored = &mut self.slots[slot];
            stored.chunk = chunk;
            stored.start = start;
        }
        self.log = fresh;
        self.dead_bytes = 0;
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(space) = &self.space {
            space.release(self.index_bytes);
        }
    }
}

#[cfg(test)]
mod tests;
