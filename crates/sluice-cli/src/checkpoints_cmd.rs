//! `sluice checkpoints list|verify|unlock --store URL`: inspect a checkpoint store, or
//! break the lease of a run that is gone.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use sluice_engine::EngineError;
use sluice_engine::stores::{self, CheckpointEntry};

use crate::output;
use crate::report::format_timestamp;

#[derive(Subcommand)]
pub enum CheckpointsCommand {
    /// Committed checkpoints: epoch, time, size, state objects and source positions.
    List {
        /// The store URL, as in `[checkpoint] store` (file://, s3://, az://, gs://).
        #[arg(long)]
        store: String,
    },
    /// Read every object of a checkpoint (default: all of them) and check sizes and
    /// checksums. Exit code 1 on damage, naming the object.
    Verify {
        #[arg(long)]
        store: String,
        /// Only this epoch.
        #[arg(long)]
        epoch: Option<u64>,
    },
    /// Break the store's lease, held by a run that is gone (it crashed on another host or
    /// in a container; a crash on this host is noticed by the next run by itself). A run
    /// that still holds the lease fails at its next checkpoint.
    Unlock {
        #[arg(long)]
        store: String,
    },
}

pub fn main(command: CheckpointsCommand) -> Result<ExitCode, EngineError> {
    match command {
        CheckpointsCommand::List { store } => list(&store),
        CheckpointsCommand::Verify { store, epoch } => verify(&store, epoch),
        CheckpointsCommand::Unlock { store } => {
            match stores::unlock(&store, Path::new("."))? {
                Some(broken) => output::line(&format!("broke {broken}")),
                None => output::line(&format!("{store} has no lease")),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn list(url: &str) -> Result<ExitCode, EngineError> {
    let entries = stores::list(url, Path::new("."))?;
    if entries.is_empty() {
        output::line(&format!("no checkpoints in {url}"));
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "{:>8}  {:<23}  {:>12}  {:>8}  {:<16}  sources (lanes: position bytes)\n",
        "epoch", "time (UTC)", "bytes", "objects", "fingerprint"
    );
    for entry in entries {
        match entry {
            CheckpointEntry::Readable(summary) => {
                let sources: Vec<String> = summary
                    .sources
                    .iter()
                    .map(|(name, lanes)| {
                        let positions: Vec<String> = lanes.iter().map(|l| hex(l)).collect();
                        format!("{name} ({} lanes: {})", lanes.len(), positions.join(" "))
                    })
                    .collect();
                text.push_str(&format!(
                    "{:>8}  {:<23}  {:>12}  {:>8}  {:<16}  {}\n",
                    summary.epoch,
                    format_timestamp(summary.created_ms),
                    summary.bytes,
                    summary.objects,
                    summary.fingerprint,
                    sources.join("; ")
                ));
            }
            CheckpointEntry::Damaged { epoch, problem } => text.push_str(&format!("{epoch:>8}  DAMAGED: {problem}\n")),
        }
    }
    output::text(&text);
    Ok(ExitCode::SUCCESS)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn verify(url: &str, only: Option<u64>) -> Result<ExitCode, EngineError> {
    let mut damaged = false;
    let mut text = String::new();
    for verification in stores::verify(url, Path::new("."), only)? {
        let epoch = verification.epoch;
        if verification.problems.is_empty() {
            text.push_str(&format!("checkpoint {epoch}: ok\n"));
        }
        for problem in verification.problems {
            damaged = true;
            text.push_str(&format!("checkpoint {epoch}: DAMAGED: {problem}\n"));
        }
    }
    output::text(&text);
    Ok(if damaged { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
