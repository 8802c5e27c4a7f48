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
use sluice_runtime::{RunOutcome, StopHandle, controller};

use crate::build::{Built, load_and_build};
use crate::progress::Progress;
use crate::report;

pub fn run(path: &Path, threads: Option<u32>, quiet: bool) -> Result<ExitCode, String> {
    let built = load_and_build(path, threads)?;
    let (stop, woken) = controller::stop_handle();
    install_signals(stop.clone())?;
    Ok(execute(&built, (stop, woken), quiet))
}

/// Runs a built pipeline and prints the report; returns the exit code.
pub fn execute(built: &Built, stop: (StopHandle, crossbeam_stop::Woken), quiet: bool) -> ExitCode {
    let writes_stdout = built.config.sinks.iter().any(|s| matches!(s.connector, SinkConnector::Stdout { .. }));
    let live = !quiet && std::io::stderr().is_terminal() && !(writes_stdout && std::io::stdout().is_terminal());
    let mut progress = Progress::new(live, quiet);
    if !quiet {
        eprintln!(
            "sluice: running pipeline \"{}\" on {} thread(s); Ctrl-C stops and drains",
            built.config.pipeline.name, built.options.threads
        );
    }
    let report =
        sluice_runtime::run(&built.plan, &built.options, stop, |metrics, elapsed| progress.update(metrics, elapsed));
    progress.finish();
    if !quiet || report.outcome != RunOutcome::Completed {
        eprint!("{}", report::render(&built.config.pipeline.name, &report));
    }
    match report.outcome {
        RunOutcome::Completed => ExitCode::SUCCESS,
        RunOutcome::Failed { .. } => ExitCode::FAILURE,
    }
}

/// The receiving end of a stop handle (re-exported for signatures).
pub mod crossbeam_stop {
    pub type Woken = crossbeam_channel::Receiver<()>;
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
