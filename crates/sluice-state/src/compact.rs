//! Which runs of a vnode range to merge, and when.
//!
//! A range's runs are its oldest (the *base*, everything up to some checkpoint) followed
//! by newer ones (one per checkpoint since, or merges of those). Each run costs a restore
//! one more input to merge and the manifest one more entry; each merge rewrites bytes.
//! The policy keeps both small, in the manner of size-tiered ("universal") compaction:
//!
//! 1. **Everything**, when the newer runs together hold at least as many bytes as the
//!    base ([`SPACE_RATIO`]) and one of them may overwrite or delete: the merge drops
//!    what they overwrote or deleted, so the range's bytes stay within about twice its
//!    live state. Runs of fresh keys only ([`RunInfo::fresh_keys`]: a join's appended
//!    rows) overwrite nothing, so a merge with the base would only rewrite it; a state
//!    that only grows that way is merged by the two rules below alone.
//! 2. **The newest runs of similar size**, when at least [`MERGE_WIDTH`] of them are: from
//!    the newest, runs are taken while the ones taken hold at least as many bytes as the
//!    next older one. Deletes are kept (older runs may hold what they delete).
//! 3. **Beyond [`RUNS_MAX`] runs, two adjacent ones**: of the pairs within
//!    [`PAIR_RATIO`] of each other in size, the one holding the fewest bytes; without
//!    one, the pair closest in size. Runs of similar sizes pair up, as a binary counter's
//!    carries, so a byte is rewritten about as many times as the runs double.
//!    Merging the newest runs instead rewrote, at every new run, the run they had grown
//!    into: an operator's cold state that evicts a few hundred KB at a time behind a run
//!    of 170 MB rewrote those 170 MB at each eviction (NEXMark q9 at 100 M events wrote
//!    879 GB in 15 minutes).
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

/// What the policy knows of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunInfo {
    pub bytes: u64,
    /// Every record of the run is a put of a key that no older run of the range holds:
    /// merging it with older runs drops nothing.
    pub fresh_keys: bool,
}

impl RunInfo {
    /// A run that may overwrite or delete what older runs hold.
    pub fn of(bytes: u64) -> RunInfo {
        RunInfo { bytes, fresh_keys: false }
    }
}

/// Whether a range's runs are so many, or so much larger than its base, that its
/// merges have fallen behind its checkpoints: [`RUNS_MAX`] twice over, or newer runs that
/// may overwrite holding twice [`SPACE_RATIO`] times the base's bytes (so a range holds
/// at most about three times its live state while its merges run beside its checkpoints).
pub fn overdue(runs: &[RunInfo]) -> bool {
    let Some((base, newer)) = runs.split_first() else { return false };
    let newer_bytes: u64 = newer.iter().map(|run| run.bytes).sum();
    let overwrites = newer.iter().any(|run| !run.fresh_keys);
    runs.len() >= 2 * RUNS_MAX || (overwrites && newer_bytes >= base.bytes.saturating_mul(2 * SPACE_RATIO).max(1))
}

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

/// The merge the policy asks for a range of the runs `runs`, oldest first; `None` when
/// the range is fine as it is.
pub fn plan(runs: &[RunInfo]) -> Option<Plan> {
    let sizes: Vec<u64> = runs.iter().map(|run| run.bytes).collect();
    let count = sizes.len();
    if count <= 1 {
        return None;
    }
    let newer: u64 = sizes[1..].iter().sum();
    let overwrites = runs[1..].iter().any(|run| !run.fresh_keys);
    if overwrites && newer >= sizes[0].saturating_mul(SPACE_RATIO) {
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
        let at = pair_to_merge(&sizes);
        return Some(Plan { runs: at..at + 2 });
    }
    None
}

/// Runs within this factor of each other in size are "close" (see [`pair_to_merge`]).
pub const PAIR_RATIO: u64 = 8;

/// Where the two adjacent runs to merge start, beyond [`RUNS_MAX`] runs: of the pairs
/// whose larger run is at most [`PAIR_RATIO`] times the smaller, the one holding the
/// fewest bytes; without such a pair, the pair closest in size; the newest on a tie.
fn pair_to_merge(sizes: &[u64]) -> usize {
    let pair = |at: usize| {
        let (a, b) = (sizes[at].max(1), sizes[at + 1].max(1));
        (u128::from(a.max(b)), u128::from(a.min(b)))
    };
    let close = (0..sizes.len() - 1)
        .rev()
        .filter(|&at| {
            let (high, low) = pair(at);
            high <= low * u128::from(PAIR_RATIO)
        })
        .min_by_key(|&at| sizes[at].saturating_add(sizes[at + 1]));
    close.unwrap_or_else(|| {
        let mut best = sizes.len() - 2;
        for at in (0..sizes.len() - 2).rev() {
            let ((high, low), (best_high, best_low)) = (pair(at), pair(best));
            if high * best_low < best_high * low {
                best = at;
            }
        }
        best
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of these sizes, any of which may overwrite.
    fn sized(sizes: &[u64]) -> Vec<RunInfo> {
        sizes.iter().map(|&bytes| RunInfo::of(bytes)).collect()
    }

    #[test]
    fn a_single_run_or_none_stays() {
        assert_eq!(plan(&sized(&[])), None);
        assert_eq!(plan(&sized(&[100])), None);
        assert_eq!(plan(&sized(&[100, 1, 1])), None);
    }

    #[test]
    fn newer_runs_as_large_as_the_base_merge_everything() {
        assert_eq!(plan(&sized(&[100, 60, 40])), Some(Plan { runs: 0..3 }));
        assert!(plan(&sized(&[100, 60, 40])).expect("a plan").includes_base());
        // An empty base (a fresh state): its first delta merges with it.
        assert_eq!(plan(&sized(&[0, 5])), Some(Plan { runs: 0..2 }));
    }

    #[test]
    fn similar_newest_runs_merge_without_the_base() {
        let mut sizes = vec![1000, 50];
        sizes.extend([1; MERGE_WIDTH]);
        let plan = plan(&sized(&sizes)).expect("a plan");
        assert_eq!(plan.runs, 2..2 + MERGE_WIDTH, "the 50-byte run is larger than the eight together");
        assert!(!plan.includes_base());
    }

    #[test]
    fn runs_beyond_the_cap_merge() {
        // Sizes that never pass the ratio test: each twice the sum of the newer ones.
        let mut sizes: Vec<u64> = (0..RUNS_MAX + 1).map(|i| 1u64 << (2 * (RUNS_MAX + 1 - i))).collect();
        sizes[0] = u64::MAX / 2;
        // Every adjacent pair is four times apart: the smallest, the newest.
        assert_eq!(plan(&sized(&sizes)), Some(Plan { runs: RUNS_MAX - 1..RUNS_MAX + 1 }));
        // No pair within PAIR_RATIO (each run 9 times the next): the pair closest in
        // size, wherever it is (here 8.5 times apart).
        let mut far: Vec<u64> = (0..=RUNS_MAX as u32).map(|i| 9u64.pow(RUNS_MAX as u32 - i)).collect();
        assert_eq!(pair_to_merge(&far), RUNS_MAX - 1, "all alike: the newest");
        far[5] = far[4] * 2 / 17;
        assert_eq!(pair_to_merge(&far), 4);
    }

    /// Small runs coming one by one behind a large newest run (what a cold store that
    /// evicts a little at a time builds): each new run must not rewrite the large one.
    /// Sizes that pass neither the ratio test nor the tiers: each run twice the sum of
    /// the newer ones, a base far larger still; then 2,000 runs of one unit.
    #[test]
    fn small_runs_behind_a_large_one_do_not_rewrite_it_each_time() {
        let mut sizes: Vec<u64> = (0..RUNS_MAX).map(|i| 1u64 << (2 * (RUNS_MAX - i) + 4)).collect();
        sizes[0] = 1 << 50;
        let (mut written, mut added) = (0u64, 0u64);
        for _ in 0..2000 {
            sizes.push(1);
            added += 1;
            while let Some(plan) = plan(&sized(&sizes)) {
                assert!(!plan.includes_base(), "the base is far larger than the rest");
                let merged = sizes[plan.runs.clone()].iter().sum();
                written += merged;
                sizes.splice(plan.runs, [merged]);
            }
            assert!(sizes.len() <= RUNS_MAX);
        }
        // Rewriting the newest large run at each step would write 2,000 times its 64
        // units and more; pairing writes each unit a dozen times at most.
        assert!(written <= 40 * added, "{written} units written for {added}");
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
            while let Some(plan) = plan(&sized(&sizes)) {
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

    /// A state that only grows by fresh keys (a join keeping every row), one delta per
    /// checkpoint of the size of the first: the base is never rewritten and runs stay
    /// bounded. Over 2,000 checkpoints each byte is written about 5 times in all (a
    /// tier of eight merges at each power of eight), as often as when every doubling
    /// merged the whole state, but no merge is of the whole state.
    #[test]
    fn fresh_keys_are_never_merged_into_the_base_and_rewrite_little() {
        let delta = 1u64 << 20;
        let mut runs = vec![RunInfo { bytes: delta, fresh_keys: false }];
        let (mut written, mut changed, mut most_runs) = (delta, delta, 1);
        for _ in 0..2000 {
            runs.push(RunInfo { bytes: delta, fresh_keys: true });
            written += delta;
            changed += delta;
            while let Some(plan) = plan(&runs) {
                assert!(!plan.includes_base(), "a merge of fresh keys with the base rewrites it for nothing");
                let merged = runs[plan.runs.clone()].iter().map(|run| run.bytes).sum();
                written += merged;
                runs.splice(plan.runs, [RunInfo { bytes: merged, fresh_keys: true }]);
            }
            most_runs = most_runs.max(runs.len());
        }
        let amplification = written as f64 / changed as f64;
        assert!(most_runs <= RUNS_MAX + 1, "{most_runs} runs");
        assert!(amplification < 5.5, "{amplification:.2} times the changed bytes");
    }

    /// A cold store's runs (`sluice-operators`' `cold`): one run of 1 to 4 units per
    /// eviction, each followed by at most one merge (the store merges once per run it
    /// adds), a merge with the base dropping a tenth (overwritten entries). Merging the
    /// newest runs beyond the cap made this write eleven thousand times the added bytes.
    #[test]
    fn one_merge_per_new_run_keeps_rewrites_small() {
        let mut seed = 1u64;
        let mut sizes: Vec<u64> = vec![1];
        let (mut written, mut added) = (0u64, 0u64);
        for _ in 0..100_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let bytes = 1 + (seed >> 62);
            sizes.push(bytes);
            (written, added) = (written + bytes, added + bytes);
            if let Some(plan) = plan(&sized(&sizes)) {
                let mut merged: u64 = sizes[plan.runs.clone()].iter().sum();
                if plan.includes_base() {
                    merged -= merged / 10;
                }
                written += merged;
                sizes.splice(plan.runs, [merged]);
            }
            assert!(sizes.len() <= RUNS_MAX + 1);
        }
        let amplification = written as f64 / added as f64;
        assert!(amplification < 30.0, "{amplification:.1} times the added bytes");
    }

    #[test]
    fn one_run_that_may_overwrite_brings_the_base_merge_back() {
        let mut runs = vec![RunInfo::of(100), RunInfo { bytes: 60, fresh_keys: true }];
        assert_eq!(plan(&runs), None);
        runs.push(RunInfo::of(40));
        assert_eq!(plan(&runs), Some(Plan { runs: 0..3 }));
    }

    #[test]
    fn a_range_is_overdue_at_twice_the_runs_or_twice_the_base() {
        assert!(!overdue(&[]));
        assert!(!overdue(&sized(&[100, 150])));
        assert!(overdue(&sized(&[100, 150, 50])));
        let fresh = |bytes| RunInfo { bytes, fresh_keys: true };
        assert!(!overdue(&[RunInfo::of(100), fresh(500)]), "fresh keys waste no space");
        assert!(overdue(&vec![fresh(1); 2 * RUNS_MAX]));
    }
}
