//! Which runs of a vnode range to merge, and when.
//!
//! A range's runs are its oldest (the *base*, everything up to some checkpoint) followed
//! by newer ones (one per checkpoint since, or merges of those). Each run costs a restore
//! one more input to merge and the manifest one more entry; each merge rewrites bytes.
//! The policy keeps both small, in the manner of size-tiered ("universal") compaction:
//!
//! 1. **Everything**, when the newer runs together hold at least as many bytes as the
//!    base ([`SPACE_RATIO`]): the merge drops what they overwrote or deleted, so the
//!    range's bytes stay within about twice its live state. A state that only grows (a
//!    join keeping every row) is rewritten each time it doubles, about twice in all.
//! 2. **The newest runs of similar size**, when at least [`MERGE_WIDTH`] of them are: from
//!    the newest, runs are taken while the ones taken hold at least as many bytes as the
//!    next older one. Deletes are kept (older runs may hold what they delete).
//! 3. **The newest runs beyond [`RUNS_MAX`]**, whatever their sizes.
//!
//! Simulated with one delta of 1% of a range's state per checkpoint, each key changed at
//! random (`tests::rewrites_stay_a_small_multiple_of_the_changes`): a range keeps at most
//! 11 runs and writes about 4.2 times the changed bytes over time (1 for the checkpoint's
//! own run, the rest merges; the base is rewritten once every hundred checkpoints).

use std::ops::Range;

/// Newer runs holding this many times the base's bytes merge with it.
pub const SPACE_RATIO: u64 = 1;
/// The fewest runs of similar size merged together.
pub const MERGE_WIDTH: usize = 8;
/// The most runs a range keeps.
pub const RUNS_MAX: usize = 16;

/// A merge to do: the runs `runs` (positions in the range's list, oldest first) become
/// one, and whether it includes the base (so deletes are dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub runs: Range<usize>,
}

impl Plan {
    /// Whether the merge includes the range's oldest run: then nothing older remains for
    /// a delete to hide, and the merge keeps live records only.
    pub fn includes_base(&self) -> bool {
        self.runs.start == 0
    }
}

/// The merge the policy asks for a range whose runs have `sizes` bytes, oldest first;
/// `None` when the range is fine as it is.
pub fn plan(sizes: &[u64]) -> Option<Plan> {
    let count = sizes.len();
    if count <= 1 {
        return None;
    }
    let newer: u64 = sizes[1..].iter().sum();
    if newer >= sizes[0].saturating_mul(SPACE_RATIO) {
        return Some(Plan { runs: 0..count });
    }
    let mut taken = sizes[count - 1];
    let mut start = count - 1;
    while start > 1 && taken >= sizes[start - 1] {
        start -= 1;
        taken = taken.saturating_add(sizes[start]);
    }
    if count - start >= MERGE_WIDTH {
        return Some(Plan { runs: start..count });
    }
    if count > RUNS_MAX {
        return Some(Plan { runs: RUNS_MAX - 1..count });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_run_or_none_stays() {
        assert_eq!(plan(&[]), None);
        assert_eq!(plan(&[100]), None);
        assert_eq!(plan(&[100, 1, 1]), None);
    }

    #[test]
    fn newer_runs_as_large_as_the_base_merge_everything() {
        assert_eq!(plan(&[100, 60, 40]), Some(Plan { runs: 0..3 }));
        assert!(plan(&[100, 60, 40]).expect("a plan").includes_base());
        // An empty base (a fresh state): its first delta merges with it.
        assert_eq!(plan(&[0, 5]), Some(Plan { runs: 0..2 }));
    }

    #[test]
    fn similar_newest_runs_merge_without_the_base() {
        let mut sizes = vec![1000, 50];
        sizes.extend([1; MERGE_WIDTH]);
        let plan = plan(&sizes).expect("a plan");
        assert_eq!(plan.runs, 2..2 + MERGE_WIDTH, "the 50-byte run is larger than the eight together");
        assert!(!plan.includes_base());
    }

    #[test]
    fn runs_beyond_the_cap_merge() {
        // Sizes that never pass the ratio test: each twice the sum of the newer ones.
        let mut sizes: Vec<u64> = (0..RUNS_MAX + 1).map(|i| 1u64 << (2 * (RUNS_MAX + 1 - i))).collect();
        sizes[0] = u64::MAX / 2;
        assert_eq!(plan(&sizes), Some(Plan { runs: RUNS_MAX - 1..RUNS_MAX + 1 }));
    }

    /// A range of 100 units with one unit changed per checkpoint (new keys at random,
    /// so merges of newer runs shrink nothing; a merge with the base gives it back its
    /// size), over 2,000 checkpoints.
    #[test]
    fn rewrites_stay_a_small_multiple_of_the_changes() {
        let (base, delta) = (100u64 << 20, 1u64 << 20);
        let mut sizes = vec![base];
        let (mut written, mut changed, mut most_runs) = (0u64, 0u64, 0);
        for _ in 0..2000 {
            sizes.push(delta);
            written += delta;
            changed += delta;
            while let Some(plan) = plan(&sizes) {
                let merged = if plan.includes_base() { base } else { sizes[plan.runs.clone()].iter().sum() };
                written += merged;
                sizes.splice(plan.runs, [merged]);
            }
            most_runs = most_runs.max(sizes.len());
        }
        let amplification = written as f64 / changed as f64;
        assert!(most_runs <= 12, "{most_runs} runs");
        assert!(amplification < 4.5, "{amplification:.2} times the changed bytes");
    }
}
