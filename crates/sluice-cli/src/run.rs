//! `sluice run`: signals, the run itself, progress and the exit report.
//!
//! Signals: the first Ctrl-C / SIGTERM asks the run to stop its sources and drain
//! (bounded by `shutdown_timeout`); a second one exits at once with status 1, naming
//! what was abandoned.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use sluice_config::SinkConnector;
use sluice_runtime::{Checkpointing, RunOutcome, StopHandle, controller};

use crate::build::{Built, build, load};
use crate::checkpointing;
use crate::progress::Progress;
use crate::report;

pub fn run(path: &Path, threads: Option<u32>, from_scratch: bool, quiet: bool) -> Result<ExitCode, String> {
    let (config, base) = load(path, threads)?;
    let Some(section) = config.checkpoint.clone() else {
        if from_scratch {
            return Err("--from-scratch needs a [checkpoint] section (there is no state to discard)".into());
        }
        let built = build(path, config, &base, None)?;
        return start(&built, None, quiet);
    };
    let (store, recovered) = checkpointing::open(&section, &base, from_scratch)?;
    let lane_threads = recovered.manifest.as_ref().map(|m| m.lane_threads);
    let built = build(path, config, &base, lane_threads)?;
    if let Some(manifest) = &recovered.manifest {
        checkpointing::check_fingerprint(manifest, &built.fingerprint, &section.store)?;
        if !quiet {
            eprintln!("sluice: resuming from checkpoint {} in {}", manifest.epoch, section.store);
        }
    }
    let lane_threads = lane_threads.unwrap_or(built.options.threads);
    let checkpointing = checkpointing::prepare(
        &section,
        store,
        recovered.manifest,
        &built.plan,
        built.fingerprint.clone(),
        built.options.vnodes,
        lane_threads,
    )?;
    start(&built, Some(checkpointing), quiet)
}

fn start(built: &Built, checkpointing: Option<Checkpointing>, quiet: bool) -> Result<ExitCode, String> {
    let (stop, woken) = controller::stop_handle();
    install_signals(stop.clone())?;
    Ok(execute(built, checkpointing, (stop, woken), quiet))
}

/// Runs a built pipeline and prints the report; returns the exit code.
pub fn execute(
    built: &Built,
    checkpointing: Option<Checkpointing>,
    stop: (StopHandle, crossbeam_channel::Receiver<()>),
    quiet: bool,
) -> ExitCode {
    let writes_stdout = built.config.sinks.iter().any(|s| matches!(s.connector, SinkConnector::Stdout { .. }));
    let live = !quiet && std::io::stderr().is_terminal() && !(writes_stdout && std::io::stdout().is_terminal());
    let mut progress = Progress::new(live, quiet);
    if !quiet {
        eprintln!(
            "sluice: running pipeline \"{}\" on {} thread(s); Ctrl-C stops and drains",
            built.config.pipeline.name, built.options.threads
        );
    }
    let report = sluice_runtime::run(&built.plan, &built.options, checkpointing, stop, |metrics, elapsed| {
        progress.update(metrics, elapsed)
    });
    progress.finish();
    if !quiet || report.outcome != RunOutcome::Completed {
        eprint!("{}", report::render(&built.config.pipeline.name, &report));
    }
    match report.outcome {
        RunOutcome::Completed => ExitCode::SUCCESS,
        RunOutcome::Failed { .. } => ExitCode::FAILURE,
    }
}

fn install_signals(stop: StopHandle) -> Result<(), String> {
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(|e| format!("cannot install signal handlers: {e}"))?;
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
                eprintln!("\nsluice: {name}: stopping sources and draining (again to exit at once)");
                stop.stop();
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}
