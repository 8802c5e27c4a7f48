//! Named failpoints: deterministic fault injection for tests.
//!
//! A failpoint is a named place in the code (`failpoint!("checkpoint.after_publish")`)
//! that does nothing unless activated. Activation comes only from the
//! `SLUICE_FAILPOINTS` environment variable, read once at start by the `sluice` binary
//! ([`setup_from_env`]), or from a test calling [`fail::cfg`] in-process:
//!
//! ```text
//! SLUICE_FAILPOINTS='checkpoint.after_publish=2*off->return(kill);sink.write=1*return(note)'
//! ```
//!
//! Each entry is `name=actions` in the `fail` crate's syntax (`N*` counts, `->` chains,
//! `off`, `return(ARG)`, `sleep(MS)`, `panic`). What `return(ARG)` does here ([`act`]):
//!
//! | ARG             | effect                                                          |
//! |-----------------|-----------------------------------------------------------------|
//! | `kill`          | the process kills itself with SIGKILL at this exact point (a crash) |
//! | `note`          | prints `sluice: failpoint NAME reached` to stderr and goes on (a test waits for it) |
//! | `error` or none | the step fails with an `Injected` error, as a failing disk or peer would |
//! | anything else   | the step fails with that text as the error's message            |
//!
//! The list of failpoints, each with where it is, is in ARCHITECTURE.md ("Failpoints").
//! When no failpoint is active, an evaluation is one read lock and one hash lookup, so
//! failpoints sit at per-batch and per-checkpoint steps, never per row.

use crate::{ErrorKind, SluiceError};

pub use fail;

/// The environment variable that activates failpoints.
pub const ENVIRONMENT_VARIABLE: &str = "SLUICE_FAILPOINTS";

/// Evaluates failpoint `$name`; an error action returns `Err` from the enclosing
/// function (whose error type must come from [`SluiceError`]).
#[macro_export]
macro_rules! failpoint {
    ($name:expr) => {
        if let Some(Some(error)) =
            $crate::failpoint::fail::eval($name, |argument| $crate::failpoint::act($name, argument))
        {
            return Err(error.into());
        }
    };
}

/// Whether failpoint `name` is active and takes its action now (the action's argument is
/// ignored): for failpoints that change what a step does rather than failing it.
pub fn triggered(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

/// What `return(ARG)` at failpoint `name` does: None to go on, Some(error) to fail.
pub fn act(name: &str, argument: Option<String>) -> Option<SluiceError> {
    match argument.as_deref() {
        Some("kill") => kill_self(name),
        Some("note") => {
            eprintln!("sluice: failpoint {name} reached");
            None
        }
        Some("error") | None => Some(injected(name, "an injected failure")),
        Some(message) => Some(injected(name, message)),
    }
}

fn injected(name: &str, message: &str) -> SluiceError {
    SluiceError::external("failpoint", format!("failpoint {name}: {message}")).with_kind(ErrorKind::Injected)
}

/// SIGKILL to this process: nothing is flushed, no destructor runs, as in a real crash.
fn kill_self(name: &str) -> ! {
    eprintln!("sluice: failpoint {name}: killing the process");
    let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
    // SIGKILL cannot be caught: the process is gone before this loop turns.
    loop {
        std::thread::park();
    }
}

/// Activates the failpoints named in [`ENVIRONMENT_VARIABLE`]; returns their names.
/// Fails on an entry the `fail` crate cannot parse, naming it.
pub fn setup_from_env() -> Result<Vec<String>, SluiceError> {
    let Ok(spec) = std::env::var(ENVIRONMENT_VARIABLE) else { return Ok(Vec::new()) };
    let mut names = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: String| {
            SluiceError::user("failpoint.spec", format!("{ENVIRONMENT_VARIABLE}: `{entry}` {why}"))
                .with_fix("write name=actions entries separated by `;`, e.g. checkpoint.after_publish=1*return(kill)")
        };
        let (name, actions) = entry.split_once('=').ok_or_else(|| bad("has no `=`".into()))?;
        fail::cfg(name.trim(), actions.trim()).map_err(bad)?;
        names.push(name.trim().to_string());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> Result<u32, SluiceError> {
        failpoint!("test.step");
        Ok(1)
    }

    #[test]
    fn an_inactive_failpoint_does_nothing_and_an_active_one_fails_or_notes() {
        let scenario = fail::FailScenario::setup();
        assert_eq!(step().expect("inactive"), 1);
        fail::cfg("test.step", "1*return(note)->return(error)").expect("cfg");
        assert_eq!(step().expect("a note goes on"), 1);
        let error = step().expect_err("then an error");
        assert_eq!((error.kind, error.code), (ErrorKind::Injected, "failpoint"));
        fail::cfg("test.step", "return(disk full)").expect("cfg");
        assert!(step().expect_err("custom").message.contains("disk full"));
        fail::cfg("test.step", "1*off->return").expect("cfg");
        assert!(step().is_ok(), "skipped once");
        assert!(step().is_err());
        assert!(!triggered("test.other"));
        scenario.teardown();
    }
}
