//! Virtual nodes: a keyed stream hashes its key to one of `vnodes` virtual nodes, and
//! vnodes are split into contiguous ranges over the slots (threads) that run an operator.
//!
//! Placement is a pure function of (vnodes, slots), so every thread (and, later, every
//! worker) derives the same assignment without being told (ARCHITECTURE.md, "Architecture
//! invariants").

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
