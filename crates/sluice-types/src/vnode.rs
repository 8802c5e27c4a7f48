//! Virtual nodes: a keyed stream hashes its key to one of `vnodes` virtual nodes, and
//! vnodes are split into contiguous ranges over the slots (threads) that run an operator.
//!
//! In a cluster the slots are every worker's threads in member order ([`SlotLayout`]):
//! worker 0's threads first, then worker 1's, so a worker's slots, and therefore its
//! vnodes, are one contiguous range. Lane `l` of a source runs on slot `l % slots`.
//!
//! Placement is a pure function of (vnodes, the members' thread counts), so every thread
//! and every worker derives the same assignment without being told (ARCHITECTURE.md,
//! "Architecture invariants"); a checkpoint stores state per vnode, so it restores onto
//! any other layout.

/// The vnode of a key hash.
pub fn of_hash(hash: u64, vnodes: u32) -> u32 {
    assert!(vnodes > 0, "vnodes must be positive");
    // Multiply-shift: uniform for any vnode count, cheaper than a modulo.
    ((u128::from(hash) * u128::from(vnodes)) >> 64) as u32
}

/// The slot that owns `vnode` when `vnodes` are split into contiguous ranges over `slots`.
pub fn slot_of(vnode: u32, vnodes: u32, slots: u32) -> u32 {
    assert!(vnode < vnodes, "vnode {vnode} out of range 0..{vnodes}");
    assert!(slots > 0, "slots must be positive");
    ((u64::from(vnode) * u64::from(slots)) / u64::from(vnodes)) as u32
}

/// The contiguous range of vnodes owned by `slot`.
pub fn range_of(slot: u32, vnodes: u32, slots: u32) -> std::ops::Range<u32> {
    assert!(slot < slots, "slot {slot} out of range 0..{slots}");
    let start = (u64::from(slot) * u64::from(vnodes)).div_ceil(u64::from(slots)) as u32;
    let end = (u64::from(slot + 1) * u64::from(vnodes)).div_ceil(u64::from(slots)) as u32;
    start..end
}

/// The slots of a cluster: each worker's threads, in member order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLayout {
    /// `starts[w]` is worker `w`'s first slot; the last entry is the total.
    starts: Vec<u32>,
}

impl SlotLayout {
    /// `threads[w]` is worker `w`'s thread count (every worker has at least one).
    pub fn new(threads: &[u32]) -> SlotLayout {
        assert!(!threads.is_empty(), "a cluster has at least one worker");
        let mut starts = Vec::with_capacity(threads.len() + 1);
        let mut next = 0u32;
        for (worker, count) in threads.iter().enumerate() {
            assert!(*count > 0, "worker {worker} has no thread");
            starts.push(next);
            next = next.checked_add(*count).expect("fewer than 2^32 slots");
        }
        starts.push(next);
        SlotLayout { starts }
    }

    /// One worker with `threads` threads.
    pub fn solo(threads: u32) -> SlotLayout {
        SlotLayout::new(&[threads])
    }

    pub fn slots(&self) -> u32 {
        *self.starts.last().expect("the total is the last entry")
    }

    pub fn workers(&self) -> u32 {
        (self.starts.len() - 1) as u32
    }

    /// Worker `worker`'s slots.
    pub fn slots_of(&self, worker: u32) -> std::ops::Range<u32> {
        let worker = worker as usize;
        assert!(worker + 1 < self.starts.len(), "worker {worker} out of range");
        self.starts[worker]..self.starts[worker + 1]
    }

    /// The worker that runs `slot`.
    pub fn worker_of(&self, slot: u32) -> u32 {
        assert!(slot < self.slots(), "slot {slot} out of range 0..{}", self.slots());
        // The last start at or below the slot (starts are sorted, workers non-empty).
        (self.starts.partition_point(|start| *start <= slot) - 1) as u32
    }

    /// The vnodes worker `worker` owns: its slots' ranges, which are contiguous.
    pub fn vnodes_of(&self, worker: u32, vnodes: u32) -> std::ops::Range<u32> {
        let slots = self.slots_of(worker);
        let first = range_of(slots.start, vnodes, self.slots()).start;
        let last = range_of(slots.end - 1, vnodes, self.slots()).end;
        first..last
    }

    /// The slot that polls lane `lane`.
    pub fn slot_of_lane(&self, lane: u32) -> u32 {
        lane % self.slots()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_partition_the_vnodes_and_agree_with_slot_of() {
        for vnodes in [1u32, 7, 256, 1000] {
            for slots in 1u32..=9 {
                let mut next = 0;
                for slot in 0..slots {
                    let range = range_of(slot, vnodes, slots);
                    assert_eq!(range.start, next);
                    for vnode in range.clone() {
                        assert_eq!(slot_of(vnode, vnodes, slots), slot, "vnodes={vnodes} slots={slots}");
                    }
                    next = range.end;
                }
                assert_eq!(next, vnodes);
            }
        }
    }

    #[test]
    fn of_hash_stays_in_range() {
        for hash in [0u64, 1, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
            assert!(of_hash(hash, 256) < 256);
        }
        assert_eq!(of_hash(u64::MAX, 256), 255);
    }
}

#[cfg(test)]
mod layout_tests {
    use proptest::prelude::*;

    use super::*;

    fn threads() -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(1u32..=8, 1..=6)
    }

    proptest! {
        /// Every worker derives the same placement from the member set: each vnode has
        /// exactly one owning slot, on one worker, and each worker's vnodes are the
        /// union of its slots' ranges, whatever the workers' thread counts.
        #[test]
        fn every_worker_derives_one_owner_per_vnode(threads in threads(), vnodes in 1u32..2048) {
            let layouts: Vec<SlotLayout> = threads.iter().map(|_| SlotLayout::new(&threads)).collect();
            prop_assert!(layouts.windows(2).all(|pair| pair[0] == pair[1]), "a pure function of the member set");
            let layout = &layouts[0];
            prop_assert_eq!(layout.slots(), threads.iter().sum::<u32>());
            let mut owners = vec![0u32; vnodes as usize];
            for worker in 0..layout.workers() {
                let slots = layout.slots_of(worker);
                prop_assert_eq!(slots.len() as u32, threads[worker as usize]);
                for vnode in layout.vnodes_of(worker, vnodes) {
                    owners[vnode as usize] += 1;
                    let slot = slot_of(vnode, vnodes, layout.slots());
                    prop_assert!(slots.contains(&slot), "vnode {} on slot {} outside worker {}'s {:?}", vnode, slot, worker, slots);
                    prop_assert_eq!(layout.worker_of(slot), worker);
                }
            }
            prop_assert!(owners.iter().all(|n| *n == 1), "each vnode owned exactly once: {:?}", owners);
        }

        /// Rescaling from one layout to another (more or fewer workers, other thread
        /// counts) hands every vnode, and so every vnode's state, to exactly one new
        /// worker, and every lane to exactly one slot.
        #[test]
        fn rescaling_hands_every_vnode_and_lane_to_one_new_owner(before in threads(), after in threads(), vnodes in 1u32..1024, lanes in 1u32..64) {
            let (old, new) = (SlotLayout::new(&before), SlotLayout::new(&after));
            for vnode in 0..vnodes {
                let old_owner = old.worker_of(slot_of(vnode, vnodes, old.slots()));
                let new_owners: Vec<u32> = (0..new.workers()).filter(|w| new.vnodes_of(*w, vnodes).contains(&vnode)).collect();
                prop_assert_eq!(new_owners.len(), 1, "vnode {} (was on worker {})", vnode, old_owner);
            }
            for lane in 0..lanes {
                let slot = new.slot_of_lane(lane);
                prop_assert!(slot < new.slots());
                prop_assert_eq!((0..new.workers()).filter(|w| new.slots_of(*w).contains(&slot)).count(), 1);
            }
        }
    }

    #[test]
    fn a_solo_layout_is_the_thread_placement() {
        let layout = SlotLayout::solo(4);
        assert_eq!((layout.slots(), layout.workers()), (4, 1));
        assert_eq!(layout.vnodes_of(0, 256), 0..256);
        assert_eq!(SlotLayout::new(&[2, 3]).worker_of(2), 1);
        assert_eq!(SlotLayout::new(&[2, 3]).slots_of(1), 2..5);
    }
}
