//! A randomized property over many seeded scenarios: random epochs of random rows, a
//! crash at a random point (after committing a random prefix of epochs, possibly in the
//! middle of that prefix's last commit, with the next epoch staged and more rows
//! written), recovery, and a restart (possibly with another number of writers) that
//! writes the remaining epochs. The visible output must equal an uninterrupted run's:
//! byte for byte in file mode and with the same writers; as sorted rows when the
//! restart rescaled a directory sink.
//!
//! Each seed is reproducible: a failure names it and its scenario.

use std::fs;
use std::io::Write as _;
use std::path::Path;

use crate::sinks::FileMode;
use sluice_types::Epoch;

use super::tests::{CASES, Case, EpochRows, open, recover, stage, uninterrupted, write_rows};

const SEEDS: u64 = 256;

/// SplitMix64: a small, good-enough generator whose stream is fixed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`.
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn chance(&mut self) -> bool {
        self.next() & 1 == 1
    }

    /// Rows of one epoch over three slots, each with up to three rows.
    fn epoch_rows(&mut self) -> EpochRows {
        (0..3).map(|_| (0..self.below(4)).map(|_| self.below(100) as i64).collect()).collect()
    }
}

#[derive(Debug)]
struct Scenario {
    case: Case,
    writers_before: u32,
    writers_after: u32,
    epochs: Vec<EpochRows>,
    /// Epochs `1..=committed` were committed before the crash.
    committed: usize,
    /// The commit of epoch `committed` was cut short by the crash.
    commit_cut: bool,
    /// The epoch after the committed ones was pre-committed, not committed.
    next_staged: bool,
    /// Rows written after the last pre-commit.
    unstaged: EpochRows,
}

fn scenario(seed: u64) -> Scenario {
    let mut rng = Rng(seed);
    let case = CASES[rng.below(CASES.len() as u64) as usize];
    let mut writers = || if case.mode == FileMode::File { 1 } else { 1 + rng.below(3) as u32 };
    let (writers_before, writers_after) = (writers(), writers());
    let epochs: Vec<EpochRows> = (0..1 + rng.below(6)).map(|_| rng.epoch_rows()).collect();
    let committed = rng.below(epochs.len() as u64 + 1) as usize;
    let (commit_cut, next_staged) = (rng.chance(), rng.chance());
    Scenario {
        case,
        writers_before,
        writers_after,
        epochs,
        committed,
        commit_cut,
        next_staged,
        unstaged: rng.epoch_rows(),
    }
}

/// The commit of `epoch` cut short: some parts renamed, or half the bytes appended.
fn cut_commit(scenario: &Scenario, root: &Path, epoch: u64, records: &[Vec<u8>]) {
    let case = scenario.case;
    let sink = case.sink(root);
    if case.mode == FileMode::Directory {
        sink.commit(Epoch(epoch), &records[..1]).expect("commit the first part only");
        return;
    }
    let Some(name) = case.staged_files(root).into_iter().find(|name| name.starts_with("epoch-")) else { return };
    let bytes = fs::read(case.staging(root).join(name)).expect("staged file");
    let mut target = fs::File::options().append(true).open(case.target(root)).expect("target");
    target.write_all(&bytes[..bytes.len() / 2]).expect("append half");
}

/// Runs until the crash, recovers, checks the committed prefix, restarts; the output.
fn crash_and_restart(scenario: &Scenario, root: &Path) -> String {
    let case = scenario.case;
    let sink = case.sink(root);
    sink.discard_after(None, &[]).expect("fresh start");
    let mut writers = open(&sink, scenario.writers_before);
    let mut last_records = Vec::new();
    for (index, rows) in scenario.epochs[..scenario.committed].iter().enumerate() {
        let epoch = index as u64 + 1;
        last_records = stage(&mut writers, epoch, rows);
        if epoch as usize == scenario.committed && scenario.commit_cut {
            cut_commit(scenario, root, epoch, &last_records);
        } else {
            sink.commit(Epoch(epoch), &last_records).expect("commit");
        }
    }
    if let Some(rows) = scenario.epochs.get(scenario.committed).filter(|_| scenario.next_staged) {
        stage(&mut writers, scenario.committed as u64 + 1, rows);
    }
    write_rows(&mut writers, &scenario.unstaged);
    drop(writers);

    let sink = case.sink(root);
    let restored = (scenario.committed > 0).then_some((scenario.committed as u64, last_records.as_slice()));
    recover(&sink, restored);
    let prefix = case.expected(scenario.writers_before, &scenario.epochs[..scenario.committed]);
    assert_eq!(case.visible(root), prefix, "after recovery");
    assert_eq!(case.staged_files(root), Vec::<String>::new(), "after recovery");

    let mut writers = open(&sink, scenario.writers_after);
    for (index, rows) in scenario.epochs.iter().enumerate().skip(scenario.committed) {
        let epoch = index as u64 + 1;
        let records = stage(&mut writers, epoch, rows);
        sink.commit(Epoch(epoch), &records).expect("commit after restart");
    }
    writers.iter_mut().for_each(|writer| writer.close().expect("close"));
    case.visible(root)
}

/// The data rows of a visible output, sorted (file names and CSV headers left out).
fn sorted_rows(visible: &str) -> Vec<&str> {
    let mut rows: Vec<&str> = visible.lines().filter(|l| !l.starts_with("== ") && *l != "id,name").collect();
    rows.sort_unstable();
    rows
}

#[test]
fn any_crash_and_restart_leaves_the_output_of_an_uninterrupted_run() {
    for seed in 0..SEEDS {
        let scenario = scenario(seed);
        let outcome = std::panic::catch_unwind(|| {
            let root = tempfile::tempdir().expect("tempdir");
            let output = crash_and_restart(&scenario, root.path());
            scenario.case.assert_one_header_per_file(root.path());
            let clean = tempfile::tempdir().expect("tempdir");
            let reference = uninterrupted(scenario.case, clean.path(), scenario.writers_before, &scenario.epochs);
            if scenario.writers_after == scenario.writers_before {
                assert_eq!(output, reference);
            } else {
                assert_eq!(sorted_rows(&output), sorted_rows(&reference));
            }
        });
        if let Err(panic) = outcome {
            eprintln!("seed {seed} failed: {scenario:#?}");
            std::panic::resume_unwind(panic);
        }
    }
}
