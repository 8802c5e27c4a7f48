//! Running the `sluice` binary in a scratch directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create dirs");
        }
        std::fs::write(&path, text).expect("write file");
        path
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    /// Runs `sluice ARGS` in the scratch directory.
    /// The names in the scratch directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .expect("read scratch dir")
            .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    pub fn sluice(&self, args: &[&str]) -> Output {
        sluice_command(self.dir.path()).args(args).output().expect("run sluice")
    }
}

/// This crate's directory, read when the test runs: cargo and nextest set
/// `CARGO_MANIFEST_DIR` for the test process. The value compiled in is only the
/// fallback, since it goes stale when a target directory is shared by clones at
/// different paths (cargo reuses the test binary when the sources did not change).
pub fn crate_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn sluice_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.current_dir(dir);
    command
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts the run failed with exit code 1 and a message containing every `needle`, and
/// no panic or backtrace.
pub fn assert_fails_with(output: &Output, needles: &[&str]) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(1), "expected exit 1; stderr:\n{text}");
    for needle in needles {
        assert!(text.contains(needle), "stderr lacks {needle:?}:\n{text}");
    }
    assert!(!text.contains("panicked") && !text.contains("RUST_BACKTRACE"), "a panic:\n{text}");
}

/// Runs `pipeline.toml` of `dir` on two threads, killed (SIGKILL) once its fourth
/// checkpoint is committed, then again on one thread; returns the second run's log,
/// which must have resumed from a checkpoint and succeeded.
pub fn killed_after_a_checkpoint_then_resumed(dir: &Path) -> String {
    use std::os::unix::process::ExitStatusExt;
    let crashed = sluice_command(dir)
        .args(["run", "pipeline.toml", "--threads", "2"])
        .env("SLUICE_FAILPOINTS", "source.barrier_after_batch=return;checkpoint.after_commit=4*off->return(kill)")
        .output()
        .expect("run sluice");
    assert_eq!(crashed.status.signal(), Some(9), "killed at the failpoint:\n{}", stderr(&crashed));
    let restarted = sluice_command(dir).args(["run", "pipeline.toml", "--threads", "1"]).output().expect("run");
    let log = stderr(&restarted);
    assert!(restarted.status.success(), "restart failed:\n{log}");
    assert!(log.contains("resuming from checkpoint"), "{log}");
    log
}

/// Lines of `text`, sorted, without empty ones.
pub fn sorted_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    lines.sort();
    lines
}
