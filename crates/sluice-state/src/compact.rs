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
//!    rows) overwrite nothing, so a merge with the base would only rewrite it; a range
//!    that only grows that way is merged by its own rules (**Fresh keys**, below).
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
//!
//! **Fresh keys** ([`plan_fresh`]). A range whose newer runs all hold fresh keys (a join
//! keeping every row) loses nothing to a merge and gains only fewer runs, so its runs
//! merge by other rules: any [`MERGE_WIDTH`] or more adjacent runs of similar size (taken
//! from the newest of them while the ones taken hold at least as many bytes as the next
//! older), but only while the merge writes at most an eighth of the range's bytes
//! ([`FRESH_MERGE_SHARE`]), the cheapest such merge first; and beyond [`FRESH_RUNS_MAX`]
//! runs, the pair as above. So no merge rewrites most of a large state (the rules above
//! merged 15 runs, 13 GB of NEXMark q20's 14 GB, in one piece), each byte is rewritten
//! about once per eightfold growth of its run, and a range keeps more runs (a restore
//! reads them all anyway, one block of each at a time). Simulated
//! (`tests::fresh_keys_*`): growing from nothing by one delta per checkpoint, 2 times the
//! added bytes written over 100 checkpoints and 3.7 over 2,000; from 17 runs of 6% of the
//! state, with deltas of 1%, 2.3 times.

use std::ops::Range;

/// Newer runs holding this many times the base's bytes merge with it.
pub const SPACE_RATIO: u64 = 1;
/// The fewest runs of similar size merged together.
pub const MERGE_WIDTH: usize = 8;
/// The most runs a range keeps.
pub const RUNS_MAX: usize = 16;
/// The most runs a range of fresh keys keeps ([`plan_fresh`]).
pub const FRESH_RUNS_MAX: usize = 48;
/// A merge of a range of fresh keys writes at most this fraction of its bytes.
pub const FRESH_MERGE_SHARE: u64 = 8;

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
/// merges have fallen behind its checkpoints: [`RUNS_MAX`] twice over ([`FRESH_RUNS_MAX`]
/// for fresh keys), or newer runs that may overwrite holding twice [`SPACE_RATIO`] times
/// the base's bytes (so a range holds at most about three times its live state while its
/// merges run beside its checkpoints).
pub fn overdue(runs: &[RunInfo]) -> bool {
    let Some((base, newer)) = runs.split_first() else { return false };
    let newer_bytes: u64 = newer.iter().map(|run| run.bytes).sum();
    let overwrites = newer.iter().any(|run| !run.fresh_keys);
    if !overwrites {
        return runs.len() >= 2 * FRESH_RUNS_MAX;
    }
    runs.len() >= 2 * RUNS_MAX || newer_bytes >= base.bytes.saturating_mul(2 * SPACE_RATIO).max(1)
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
    if runs[1..].iter().all(|run| run.fresh_keys) {
        return plan_fresh(&sizes);
    }
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
        let at = pair_to_merge(&sizes);
        return Some(Plan { runs: at..at + 2 });
    }
    None
}

/// The merge of a range whose newer runs all hold fresh keys, of sizes `sizes` (oldest
/// first, at least two; see the module doc): of the tiers of at least [`MERGE_WIDTH`]
/// adjacent runs, each grown from its newest run while the runs taken hold at least as
/// many bytes as the next older one and at most the range's bytes over
/// [`FRESH_MERGE_SHARE`], the one holding the fewest bytes (the newest on a tie);
/// without one, beyond [`FRESH_RUNS_MAX`] runs, a pair ([`pair_to_merge`]).
pub fn plan_fresh(sizes: &[u64]) -> Option<Plan> {
    let limit = sizes.iter().sum::<u64>() / FRESH_MERGE_SHARE;
    let mut best: Option<(Range<usize>, u64)> = None;
    for end in (0..sizes.len()).rev() {
        let (mut start, mut taken) = (end, sizes[end]);
        while start > 0 && taken >= sizes[start - 1] && taken.saturating_add(sizes[start - 1]) <= limit {
            start -= 1;
            taken += sizes[start];
        }
        if end + 1 - start >= MERGE_WIDTH && best.as_ref().is_none_or(|(_, bytes)| taken < *bytes) {
            best = Some((start..end + 1, taken));
        }
    }
    if let Some((runs, _)) = best {
        return Some(Plan { runs });
    }
    if sizes.len() > FRESH_RUNS_MAX {
        let at = pair_to_merge(sizes);
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

    /// Runs of fresh keys from `runs` (the base first) and one delta of `delta` bytes per
    /// checkpoint, `checkpoints` times, with at most one merge per checkpoint (as the
    /// checkpoints' merges run, one at a time): the bytes written over the bytes added,
    /// and the most runs held. Checks that no merge writes more than its share.
    fn fresh_growth(runs: &[u64], delta: u64, checkpoints: usize) -> (f64, usize) {
        let mut runs: Vec<RunInfo> = runs.iter().map(|&bytes| RunInfo { bytes, fresh_keys: true }).collect();
        runs[0].fresh_keys = false;
        let (mut written, mut added, mut most_runs) = (0u64, 0u64, runs.len());
        for _ in 0..checkpoints {
            runs.push(RunInfo { bytes: delta, fresh_keys: true });
            written += delta;
            added += delta;
            if let Some(plan) = plan(&runs) {
                let total: u64 = runs.iter().map(|run| run.bytes).sum();
                let merged: u64 = runs[plan.runs.clone()].iter().map(|run| run.bytes).sum();
                assert!(merged <= total / FRESH_MERGE_SHARE, "a merge of {merged} bytes of {total}");
                written += merged;
                let fresh_keys = !plan.includes_base();
                runs.splice(plan.runs, [RunInfo { bytes: merged, fresh_keys }]);
            }
            assert!(!overdue(&runs), "{} runs", runs.len());
            most_runs = most_runs.max(runs.len());
        }
        (written as f64 / added as f64, most_runs)
    }

    /// A state that only grows by fresh keys (a join keeping every row), from one delta,
    /// by a delta of that size per checkpoint: each byte is rewritten about once per
    /// eightfold growth of its run, and runs stay bounded.
    #[test]
    fn fresh_keys_growing_from_nothing_rewrite_little() {
        let delta = 1u64 << 20;
        let (short, most) = fresh_growth(&[delta], delta, 100);
        assert!(short <= 2.1, "{short:.2} times the added bytes over 100 checkpoints");
        assert!(most <= FRESH_RUNS_MAX + 1, "{most} runs");
        let (long, most) = fresh_growth(&[delta], delta, 2000);
        assert!(long < 4.0, "{long:.2} times the added bytes over 2,000 checkpoints");
        assert!(most <= FRESH_RUNS_MAX + 1, "{most} runs");
    }

    /// NEXMark q20's restore at 13.7 GB: 17 runs of about 6% of the state each, then
    /// deltas of 1% of it. The size-tiered rule merged 15 of those runs (13 GB) in one
    /// piece, writing 3.8 times the added bytes; no merge now writes more than an eighth.
    #[test]
    fn fresh_keys_in_large_runs_are_not_merged_whole() {
        let unit = 1u64 << 20;
        let (forty, most) = fresh_growth(&[800 * unit; 17], 137 * unit, 40);
        assert!(forty < 2.5, "{forty:.2} times the added bytes over 40 checkpoints");
        assert!(most <= FRESH_RUNS_MAX + 1, "{most} runs");
        let (longer, _) = fresh_growth(&[800 * unit; 17], 137 * unit, 200);
        assert!(longer < 3.0, "{longer:.2} times the added bytes over 200 checkpoints");
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
        assert!(!overdue(&vec![fresh(1); 2 * RUNS_MAX]), "a range of fresh keys keeps more runs");
        assert!(overdue(&vec![fresh(1); 2 * FRESH_RUNS_MAX]));
    }
}
