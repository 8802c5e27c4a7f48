//! `sluice run`: the job, the signals, the progress line and the exit report.
//!
//! Signals: the first Ctrl-C / SIGTERM asks the job to stop its sources and drain, or,
//! with checkpoints, to take a final checkpoint that keeps open windows (bounded by
//! `shutdown_timeout`); a second one exits at once with status 1, naming what was
//! abandoned.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use sluice_engine::{Engine, EngineError, Job, Overrides, RunOutcome, StartOptions, StopHandle};
use sluice_types::{ErrorKind, SluiceError};

use crate::progress::Progress;
use crate::report;

/// How often the progress line is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

pub fn run(
    engine: &Engine,
    path: &Path,
    overrides: Overrides,
    from_scratch: bool,
    quiet: bool,
) -> Result<ExitCode, EngineError> {
    let pipeline = engine.load(path, overrides)?;
    let job = Job::start(&pipeline, StartOptions { from_scratch })?;
    for notice in job.notices() {
        if !quiet || notice.starts_with("warning") {
            eprintln!("sluice: {notice}");
        }
    }
    let checkpoints = pipeline.config.checkpoint.is_some();
    install_signals(job.stop_handle(), checkpoints)?;
    let writes_stdout = pipeline.writes_stdout();
    let live = !quiet && std::io::stderr().is_terminal() && !(writes_stdout && std::io::stdout().is_terminal());
    if !quiet {
        let stop = if checkpoints { "stops with a final checkpoint" } else { "stops and drains" };
        eprintln!("sluice: running pipeline \"{}\" on {} thread(s); Ctrl-C {stop}", job.name(), job.threads());
    }
    let mut progress = Progress::new(live, quiet);
    let metrics = job.metrics();
    let started = Instant::now();
    let mut changes = job.subscribe();
    loop {
        let changed = changes.next_timeout(PROGRESS_INTERVAL);
        if changed.is_some_and(|status| status.state.is_final()) {
            break;
        }
        progress.update(&metrics, started.elapsed());
    }
    let name = job.name().to_string();
    let report = job.wait();
    progress.finish();
    if let RunOutcome::Failed { error, .. } = &report.outcome
        && error.kind == ErrorKind::OutputClosed
    {
        // The reader of the output went away (`| head`): quietly done, as other tools.
        return Ok(ExitCode::SUCCESS);
    }
    if !quiet || report.outcome != RunOutcome::Completed {
        eprint!("{}", report::render(&name, &report));
    }
    Ok(match report.outcome {
        RunOutcome::Completed => ExitCode::SUCCESS,
        RunOutcome::Failed { .. } => ExitCode::FAILURE,
    })
}

/// The first Ctrl-C / SIGTERM stops the job (a final checkpoint when `checkpoints`, else a
/// drain that flushes open windows); a second exits at once.
fn install_signals(stop: StopHandle, checkpoints: bool) -> Result<(), EngineError> {
    let failed = |e: std::io::Error| {
        EngineError::new(SluiceError::external("run.signals", format!("cannot install signal handlers: {e}")))
    };
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(failed)?;
    std::thread::Builder::new()
        .name("sluice-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                let name = if signal == SIGINT { "interrupt" } else { "SIGTERM" };
                if stop.is_requested() {
                    eprintln!(
                        "\nsluice: second {name}: exiting now; rows in flight and unflushed sink output were abandoned"
                    );
                    std::process::exit(1);
                }
                let what = if checkpoints {
                    "stopping sources and taking a final checkpoint"
                } else {
                    "stopping sources and draining"
                };
                eprintln!("\nsluice: {name}: {what} (again to exit at once)");
                stop.stop();
            }
        })
        .map_err(failed)?;
    Ok(())
}
