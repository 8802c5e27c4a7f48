//! One side's stored rows: a multiset of whole rows, each with its weight and match
//! count, found by join key (to probe) and by the row itself (to accumulate weights).
//!
//! Rows live in a slab of slots (a removed row's slot is reused). Two hash indexes point
//! into it: `by_key` from the join key to its bucket (the slots of every row with that
//! key), `by_row` from a row's bytes to its slot. Both are keyed by hashes computed once
//! per batch (the key's placement hash, the row's XXH3), so nothing is hashed twice and
//! no bucket is ever scanned to find an equal row: a key with millions of rows costs the
//! same per insert as a key with one.
//!
//! A side whose rows expire (an interval or window join) also indexes its rows by the
//! time they expire (`by_time`, ordered), so freeing the rows a watermark passed touches
//! only those rows, never the rest of the state. An entry of that index may outlive its
//! row (a retraction removed it, or its slot was reused): freeing checks the slot still
//! holds a row that expires by then.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashTable;

/// One distinct stored row.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    /// The whole row in the project's key encoding (the side's columns in order).
    pub(super) row: Arc<[u8]>,
    /// XXH3 of `row`.
    pub(super) row_hash: u64,
    /// The join key's placement hash (the exchange's), so the row's vnode.
    pub(super) key_hash: u64,
    /// The row's multiplicity (never 0 while stored).
    pub(super) weight: i64,
    /// The summed weights of the other side's rows it matches (same key, residual true).
    pub(super) matches: i64,
    /// When the row can be freed: once the watermark is at or above it (`NEVER` for a
    /// side whose rows do not expire).
    pub(super) expires: i64,
    bucket: u32,
    /// Where the slot is in its bucket's list.
    position: u32,
}

/// The rows sharing one join key.
#[derive(Debug)]
struct Bucket {
    key: Box<[u8]>,
    hash: u64,
    slots: Vec<u32>,
}

/// The expiry of a row that never expires.
pub(super) const NEVER: i64 = i64::MAX;

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Store {
    slots: Vec<Option<Stored>>,
    free_slots: Vec<u32>,
    by_row: HashTable<u32>,
    buckets: Vec<Option<Bucket>>,
    free_buckets: Vec<u32>,
    by_key: HashTable<u32>,
    /// Expiry time → the slots of rows expiring then (rows that never expire are not here).
    by_time: BTreeMap<i64, Vec<u32>>,
    live: usize,
    /// The encoded rows' bytes.
    bytes: usize,
    /// Rows not written for a while are dropped (see `crate::ttl`), by slot.
    ttl: Option<crate::ttl::Ttl>,
}

/// A row to apply to a store: its bytes and hashes, as encoded for one batch.
pub(super) struct RowRef<'a> {
    pub(super) row: &'a [u8],
    pub(super) row_hash: u64,
    pub(super) key: &'a [u8],
    pub(super) key_hash: u64,
}

impl Store {
    /// Drops rows not written (inserted, or their weight changed) for the TTL.
    pub(super) fn set_ttl(&mut self, ttl: crate::ttl::Ttl) {
        self.ttl = Some(ttl);
    }

    /// Drops the rows whose TTL passed; returns how many went.
    pub(super) fn expire_ttl(&mut self) -> usize {
        let Some(ttl) = self.ttl.as_mut() else { return 0 };
        let expired = ttl.expired();
        let mut freed = 0;
        for slot in expired {
            if self.slots[slot as usize].is_some() {
                self.remove(slot);
                freed += 1;
            }
        }
        freed
    }

    /// Distinct rows held.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// The bytes of the distinct rows held, in their encoding (the indexes not counted).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The slots of the rows whose join key is `key` (placement hash `hash`).
    pub(super) fn bucket(&self, key: &[u8], hash: u64) -> &[u32] {
        let buckets = &self.buckets;
        let found =
            self.by_key.find(hash, |&b| buckets[b as usize].as_ref().is_some_and(|b| crate::same_bytes(&b.key, key)));
        match found {
            Some(&b) => &self.buckets[b as usize].as_ref().expect("an indexed bucket lives").slots,
            None => &[],
        }
    }

    pub(super) fn get(&self, slot: u32) -> &Stored {
        self.slots[slot as usize].as_ref().expect("a slot of a bucket lives")
    }

    pub(super) fn get_mut(&mut self, slot: u32) -> &mut Stored {
        self.slots[slot as usize].as_mut().expect("a slot of a bucket lives")
    }

    /// Every stored row, in slot order.
    pub(super) fn rows(&self) -> impl Iterator<Item = &Stored> {
        self.slots.iter().flatten()
    }

    /// The slot holding exactly `row`.
    pub(super) fn find(&self, row: &[u8], row_hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.by_row.find(row_hash, |&s| slots[s as usize].as_ref().is_some_and(|s| &*s.row == row)).copied()
    }

    /// Adds `weight` copies of `row` (a negative weight removes copies); a row whose
    /// weight reaches 0 is dropped. A new row starts with `matches` and expires at
    /// `expires` (a function of the row, so equal rows expire together).
    pub(super) fn apply(&mut self, row: &RowRef<'_>, weight: i64, matches: i64, expires: i64) {
        if weight == 0 {
            return;
        }
        if let Some(slot) = self.find(row.row, row.row_hash) {
            let stored = self.get_mut(slot);
            stored.weight += weight;
            if stored.weight == 0 {
                self.remove(slot);
            } else if let Some(ttl) = self.ttl.as_mut() {
                ttl.written(slot);
            }
            return;
        }
        self.insert(Arc::from(row.row), row.row_hash, row.key, row.key_hash, weight, matches, expires);
    }

    /// Adds a row that is not stored yet.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &mut self,
        row: Arc<[u8]>,
        row_hash: u64,
        key: &[u8],
        key_hash: u64,
        weight: i64,
        matches: i64,
        expires: i64,
    ) {
        debug_assert!(weight != 0 && self.find(&row, row_hash).is_none());
        let bucket = self.bucket_of(key, key_hash);
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                assert!(self.slots.len() < u32::MAX as usize, "fewer than 2^32 rows per side and thread");
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let slots_of_bucket = &mut self.buckets[bucket as usize].as_mut().expect("a live bucket").slots;
        let position = slots_of_bucket.len() as u32;
        slots_of_bucket.push(slot);
        self.slots[slot as usize] =
            Some(Stored { row, row_hash, key_hash, weight, matches, expires, bucket, position });
        if expires != NEVER {
            self.by_time.entry(expires).or_default().push(slot);
        }
        let slots = &self.slots;
        self.by_row.insert_unique(row_hash, slot, |&s| slots[s as usize].as_ref().map_or(0, |s| s.row_hash));
        self.live += 1;
        self.bytes += self.slots[slot as usize].as_ref().map_or(0, |s| s.row.len());
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.written(slot);
        }
    }

    /// The bucket of `key`, added empty if new.
    fn bucket_of(&mut self, key: &[u8], hash: u64) -> u32 {
        let buckets = &self.buckets;
        if let Some(&b) =
            self.by_key.find(hash, |&b| buckets[b as usize].as_ref().is_some_and(|b| crate::same_bytes(&b.key, key)))
        {
            return b;
        }
        let bucket = Bucket { key: key.into(), hash, slots: Vec::new() };
        let id = match self.free_buckets.pop() {
            Some(id) => {
                self.buckets[id as usize] = Some(bucket);
                id
            }
            None => {
                self.buckets.push(Some(bucket));
                (self.buckets.len() - 1) as u32
            }
        };
        let buckets = &self.buckets;
        self.by_key.insert_unique(hash, id, |&b| buckets[b as usize].as_ref().map_or(0, |b| b.hash));
        id
    }

    /// Drops every row expiring at or before `watermark`; returns how many went. The
    /// work is proportional to the rows freed (and stale index entries passed).
    pub(super) fn expire(&mut self, watermark: i64) -> usize {
        let due = match watermark.checked_add(1) {
            Some(after) => {
                let kept = self.by_time.split_off(&after);
                std::mem::replace(&mut self.by_time, kept)
            }
            None => std::mem::take(&mut self.by_time),
        };
        let mut freed = 0;
        for slot in due.into_values().flatten() {
            let stored = self.slots[slot as usize].as_ref();
            if stored.is_some_and(|s| s.expires <= watermark) {
                self.remove(slot);
                freed += 1;
            }
        }
        freed
    }

    fn remove(&mut self, slot: u32) {
        let stored = self.slots[slot as usize].take().expect("a live slot");
        self.free_slots.push(slot);
        if let Some(ttl) = self.ttl.as_mut() {
            ttl.forget(slot);
        }
        self.live -= 1;
        self.bytes -= stored.row.len();
        self.by_row.find_entry(stored.row_hash, |&s| s == slot).expect("an indexed row").remove();
        let bucket = self.buckets[stored.bucket as usize].as_mut().expect("a live bucket");
        bucket.slots.swap_remove(stored.position as usize);
        if let Some(&moved) = bucket.slots.get(stored.position as usize) {
            self.slots[moved as usize].as_mut().expect("a slot of a bucket lives").position = stored.position;
        }
        if bucket.slots.is_empty() {
            let hash = bucket.hash;
            self.buckets[stored.bucket as usize] = None;
            self.by_key.find_entry(hash, |&b| b == stored.bucket).expect("an indexed bucket").remove();
            self.free_buckets.push(stored.bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(row: &'a [u8], key: &'a [u8]) -> RowRef<'a> {
        RowRef { row, row_hash: sluice_types::key::hash(row), key, key_hash: sluice_types::key::hash(key) }
    }

    #[test]
    fn equal_rows_accumulate_and_leave_at_zero() {
        let mut store = Store::default();
        store.apply(&row(b"a1", b"a"), 1, 0, NEVER);
        store.apply(&row(b"a2", b"a"), 2, 0, NEVER);
        store.apply(&row(b"a1", b"a"), 1, 0, NEVER);
        store.apply(&row(b"b1", b"b"), 1, 0, NEVER);
        assert_eq!(store.len(), 3);
        assert_eq!(store.bytes(), 6);
        let weights = |store: &Store, key: &[u8]| -> Vec<(Vec<u8>, i64)> {
            let mut rows: Vec<_> = store
                .bucket(key, sluice_types::key::hash(key))
                .iter()
                .map(|&s| (store.get(s).row.to_vec(), store.get(s).weight))
                .collect();
            rows.sort();
            rows
        };
        assert_eq!(weights(&store, b"a"), [(b"a1".to_vec(), 2), (b"a2".to_vec(), 2)]);
        store.apply(&row(b"a1", b"a"), -2, 0, NEVER);
        assert_eq!(weights(&store, b"a"), [(b"a2".to_vec(), 2)]);
        store.apply(&row(b"a2", b"a"), -2, 0, NEVER);
        assert!(weights(&store, b"a").is_empty());
        assert_eq!(store.len(), 1);
        assert_eq!(store.bytes(), 2);
        // Slots and buckets are reused.
        store.apply(&row(b"c1", b"c"), 1, 0, NEVER);
        assert_eq!(store.slots.len(), 3);
        assert_eq!(store.buckets.len(), 2);
        assert_eq!(weights(&store, b"c"), [(b"c1".to_vec(), 1)]);
        assert_eq!(weights(&store, b"b"), [(b"b1".to_vec(), 1)]);
    }

    #[test]
    fn rows_expire_by_time_and_stale_index_entries_are_skipped() {
        let mut store = Store::default();
        store.apply(&row(b"a1", b"a"), 1, 0, 10);
        store.apply(&row(b"a2", b"a"), 1, 0, 20);
        store.apply(&row(b"b1", b"b"), 1, 0, NEVER);
        // a1 is retracted; its slot is reused by a row expiring later.
        store.apply(&row(b"a1", b"a"), -1, 0, 10);
        store.apply(&row(b"c1", b"c"), 1, 0, 30);
        assert_eq!(store.expire(9), 0);
        assert_eq!(store.expire(10), 0, "a1's stale entry leaves c1, now in its slot, alone");
        assert_eq!(store.len(), 3);
        assert_eq!(store.expire(25), 1);
        assert!(store.bucket(b"a", sluice_types::key::hash(b"a")).is_empty());
        assert_eq!(store.expire(i64::MAX), 1);
        assert_eq!(store.len(), 1, "b1 never expires");
        assert!(store.by_time.is_empty());
    }
}
