//! A deterministic simulation of the distributed checkpoint protocol: several workers,
//! each a real [`Coordinator`](crate::coordinator::Coordinator) (alone, leading or
//! following), with simulated drivers, an inline checkpoint writer, a simulated store
//! and sinks, and a simulated control network between them, all on one simulated
//! clock and driven by one seeded random number generator. A seed is one whole story:
//! the cluster's shape, every delay, every fault, and the restarts after failures until
//! the input is processed.
//!
//! What it does to the protocol (`cluster`): frames delayed (in order within a
//! session, as TCP keeps them), sessions reset (a lost frame on TCP is a lost session),
//! links partitioned (heartbeats stop; a long partition is a loss on either side),
//! processes crashed (with their connections closed or silent), slow barrier
//! acknowledgements (checkpoint timeouts), store failures while writing a part or
//! publishing, crashes right after a part is durable or a manifest is published, sink
//! commits failing half-way, and stop signals on any worker. Faults strike only the first few runs of a seed; a run
//! without faults must complete.
//!
//! What it checks (`world`), after every step: (a) a manifest is published only with
//! one part of its epoch from every worker, naming only durable objects and every lane
//! once, epochs strictly increasing; (b) a sink commits only records a published
//! manifest names; (c) a worker commits each epoch at most once per run and never above
//! the newest published manifest, and recovery only repeats the restored manifest's
//! commits; (d) every run ends (each process exits or crashes) within
//! [`cluster::RUN_LIMIT_MS`] of simulated time, and the controller's channels never
//! overflow; (e) after the last run, the committed output holds every row of every lane
//! exactly once. The coordinator's own assertions count as well.
//!
//! Running it:
//! - `cargo nextest run -p sluice-runtime simulation` runs [`CI_SEEDS`] seeds and the
//!   regression seeds;
//! - `SLUICE_SIM_SEED=123 cargo nextest run -p sluice-runtime simulation` replays seed
//!   123 (a failing seed prints this line);
//! - `SLUICE_SIM_SEEDS=100000 cargo nextest run -p sluice-runtime simulation` is the
//!   long run (seeds 0 to 99 999; `SLUICE_SIM_FIRST_SEED` moves the start).
//!
//! Each run ends everywhere when a worker is lost; the next run restores the newest
//! manifest on every worker, which is what the engine's rejoin round does (the leader
//! sends `Rejoin`, the cluster re-forms) and what restarting every worker does. What it
//! leaves out: the rendezvous itself (registering, `Welcome`, `Resume`), the data
//! exchange between workers, and the real drivers and controller thread. Each simulated driver owns one lane and one single-segment flow
//! (so a barrier never reaches its sink through an exchange before the driver injects
//! it), and the controller's loop is a mirror of `Supervisor` in `run`: a change there
//! must be made in both places.

mod cluster;
mod driver;
mod network;
mod process;
mod rng;
mod run;
mod world;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use crate::checkpoint::commit_in_order;

use cluster::{Cluster, Shape, Start, Weather};
use process::Life;
use rng::Rng;
use run::{Outcome, Settings};
use world::{Shared, SimSink, World, lock};

/// Seeds the normal test suite runs (a few seconds in a debug build).
const CI_SEEDS: u64 = 5_000;

/// Seeds that once failed, each replayed in every run of the suite.
/// - 0: a worker whose input ended first asked the leader to stop the whole cluster
///   (`Supervisor::check_end` gave its end a shutdown deadline, which `after_checkpoint`
///   turns into a stop request);
/// - 8: after a stop's final checkpoint the leader waited for `DriversFinished` from
///   workers the stop had paused, until `shutdown_timeout` failed the run.
const REGRESSION_SEEDS: &[u64] = &[0, 8];

/// Runs after which a seed's input must have been processed.
const RUNS_MAX: u32 = 8;

/// What one seed did, for the summary.
#[derive(Debug, Default)]
struct Story {
    runs: u32,
    failed_runs: u32,
    manifests: usize,
    /// How many processes ended how (the failure's first words).
    ends: BTreeMap<String, u32>,
}

impl Story {
    fn add(&mut self, other: Story) {
        self.runs += other.runs;
        self.failed_runs += other.failed_runs;
        self.manifests += other.manifests;
        for (end, count) in other.ends {
            *self.ends.entry(end).or_default() += count;
        }
    }
}

/// A process's end, in a few words, for the summary.
fn kind(life: &Life) -> String {
    match life {
        Life::Exited(Outcome::Failed(message)) => {
            let words: Vec<&str> = message.split_whitespace().take(6).collect();
            format!("failed: {}", words.join(" "))
        }
        other => format!("{other:?}"),
    }
}

#[test]
fn the_checkpoint_protocol_keeps_its_invariants_under_faults() {
    let seeds: Vec<u64> = match std::env::var("SLUICE_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("SLUICE_SIM_SEED is a number")],
        Err(_) => {
            let count = std::env::var("SLUICE_SIM_SEEDS").map_or(CI_SEEDS, |n| n.parse().expect("a number"));
            let first = std::env::var("SLUICE_SIM_FIRST_SEED").map_or(0, |n| n.parse().expect("a number"));
            REGRESSION_SEEDS.iter().copied().chain(first..first + count).collect()
        }
    };
    let mut total = Story::default();
    for &seed in &seeds {
        match check_seed(seed) {
            Ok(story) => total.add(story),
            Err(report) => panic!("{report}"),
        }
    }
    eprintln!(
        "simulated {} seeds: {} runs ({} failed and recovered), {} manifests published; processes ended: {:#?}",
        seeds.len(),
        total.runs,
        total.failed_runs,
        total.manifests,
        total.ends
    );
}

#[test]
fn a_seed_replays_exactly() {
    for seed in 0..20 {
        let traces: Vec<Vec<String>> = (0..2)
            .map(|_| {
                let world: Shared = Arc::new(Mutex::new(World::default()));
                simulate(seed, &world);
                let world = lock(&world);
                world.trace.iter().cloned().chain([format!("{:?}", world.manifests.len())]).collect()
            })
            .collect();
        assert_eq!(traces[0], traces[1], "seed {seed} replays differently");
    }
}

/// Runs one seed; on a broken invariant, a report naming the seed and its last events.
fn check_seed(seed: u64) -> Result<Story, String> {
    let world: Shared = Arc::new(Mutex::new(World::default()));
    let result = catch_unwind(AssertUnwindSafe(|| simulate(seed, &world)));
    crate::coordinator::SIMULATED_NOW.set(None);
    result.map_err(|panic| {
        let message = sluice_types::panic_message(&*panic);
        let world = lock(&world);
        let trace: Vec<&str> = world.trace.iter().map(String::as_str).collect();
        format!(
            "simulation seed {seed} failed: {message}\nreproduce: SLUICE_SIM_SEED={seed} cargo nextest run -p \
             sluice-runtime simulation\nlast events:\n{}",
            trace.join("\n")
        )
    })
}

fn simulate(seed: u64, world: &Shared) -> Story {
    let mut rng = Rng::new(seed);
    let shape = shape(&mut rng);
    let faulty_runs = rng.between(0, 3) as u32;
    {
        let mut world = lock(world);
        world.workers = shape.workers;
        world.lanes = shape.totals.len() as u32;
        world.note(0, format!("seed {seed}: {shape:?}, faults in the first {faulty_runs} run(s)"));
    }
    let mut story = Story::default();
    for generation in 0..RUNS_MAX {
        let start = recover(world, generation, shape.workers);
        let weather = if generation < faulty_runs {
            rng.pick(&[Weather::Stops, Weather::Hostile, Weather::Hostile])
        } else {
            Weather::Calm
        };
        lock(world).note(0, format!("run {generation}: {weather:?}"));
        let ends = Cluster::new(&shape, &start, weather, rng.next_u64(), world).run();
        story.runs += 1;
        for life in &ends {
            *story.ends.entry(kind(life)).or_default() += 1;
        }
        let completed = ends.iter().all(|life| *life == Life::Exited(Outcome::Completed));
        let world = lock(world);
        let consumed = world.newest().is_some_and(|newest| {
            newest.final_epoch && newest.positions().into_iter().all(|(lane, rows)| rows == shape.totals[lane as usize])
        });
        if completed && consumed {
            world.check_exactly_once(&shape.totals);
            story.manifests = world.manifests.len();
            return story;
        }
        assert!(completed || weather == Weather::Hostile, "run {generation} ({weather:?}) did not complete: {ends:?}");
        assert!(weather != Weather::Calm, "run {generation} (Calm) completed without processing its input");
        story.failed_runs += u32::from(!completed);
    }
    panic!("the input was not processed after {RUNS_MAX} runs");
}

/// The cluster's shape and settings for one seed.
fn shape(rng: &mut Rng) -> Shape {
    let workers = rng.between(1, 4) as u32;
    let drivers_per_worker = rng.between(1, 2) as u32;
    let totals = (0..workers * drivers_per_worker).map(|_| rng.between(0, 60)).collect();
    let settings = Settings {
        interval_ms: rng.between(300, 3_000),
        // Above the longest barrier-to-ack path without faults (a driver's ack 0.5 s, a
        // part's write 1.5 s, the network), so only hostile runs time out.
        timeout_ms: rng.between(3_000, 8_000),
        max_failed: rng.between(1, 3) as u32,
        shutdown_ms: rng.between(10_000, 30_000),
    };
    Shape { workers, drivers_per_worker, totals, settings }
}

/// Recovery before run `generation`, as every worker does it: commit the restored
/// (newest) manifest's records it staged, then start from its positions, numbering
/// epochs after it.
fn recover(world: &Shared, generation: u32, workers: u32) -> Start {
    let newest = {
        let mut guard = lock(world);
        guard.generation = generation;
        // A sink failure planned for a run that ended before it struck does not outlive it.
        guard.failing_commits.clear();
        let Some(newest) = guard.newest().cloned() else { return Start { generation, ..Start::default() } };
        guard.recovering = true;
        newest
    };
    for worker in 0..workers {
        let records: Vec<(u64, Vec<u8>)> =
            newest.records().filter(|r| r.worker == worker).map(|r| (r.epoch, r.encode())).collect();
        let sink = SimSink { worker, world: Arc::clone(world) };
        commit_in_order(&sink, records).expect("the simulated sink commits");
    }
    lock(world).recovering = false;
    let positions: BTreeMap<u32, u64> = newest.positions();
    Start { generation, restored_epoch: newest.epoch, positions }
}
