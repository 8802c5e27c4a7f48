//! `sluice checkpoints list|verify --store URL`: inspect a checkpoint store.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use sluice_checkpoint::CheckpointStore;

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
}

pub fn main(command: CheckpointsCommand) -> Result<ExitCode, String> {
    match command {
        CheckpointsCommand::List { store } => list(&store),
        CheckpointsCommand::Verify { store, epoch } => verify(&store, epoch),
    }
}

fn open(url: &str) -> Result<CheckpointStore, String> {
    CheckpointStore::open(url, Path::new(".")).map_err(|e| e.to_string())
}

fn list(url: &str) -> Result<ExitCode, String> {
    let store = open(url)?;
    let epochs = store.epochs().map_err(|e| e.to_string())?;
    if epochs.is_empty() {
        println!("no checkpoints in {url}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>8}  {:<23}  {:>12}  {:>8}  {:<16}  sources (lanes: position bytes)",
        "epoch", "time (UTC)", "bytes", "objects", "fingerprint"
    );
    for epoch in epochs {
        match store.load(epoch) {
            Ok(manifest) => {
                let objects: usize = manifest.operators.iter().map(|o| o.vnodes.len()).sum();
                let sources: Vec<String> = manifest
                    .sources
                    .iter()
                    .map(|s| {
                        format!(
                            "{} ({} lanes: {})",
                            s.name,
                            s.lanes.len(),
                            s.lanes.iter().map(|l| hex(l)).collect::<Vec<_>>().join(" ")
                        )
                    })
                    .collect();
                println!(
                    "{:>8}  {:<23}  {:>12}  {:>8}  {:<16}  {}",
                    epoch,
                    format_timestamp(manifest.created_ms),
                    store.size(&manifest),
                    objects,
                    manifest.fingerprint,
                    sources.join("; ")
                );
            }
            Err(error) => println!("{epoch:>8}  DAMAGED: {error}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn verify(url: &str, only: Option<u64>) -> Result<ExitCode, String> {
    let store = open(url)?;
    let epochs = match only {
        Some(epoch) => vec![epoch],
        None => store.epochs().map_err(|e| e.to_string())?,
    };
    if epochs.is_empty() {
        return Err(format!("no checkpoints in {url}"));
    }
    let mut damaged = false;
    for epoch in epochs {
        let problems = match store.load(epoch) {
            Ok(manifest) => store.verify(&manifest).map_err(|e| e.to_string())?,
            Err(error) => vec![error.to_string()],
        };
        if problems.is_empty() {
            println!("checkpoint {epoch}: ok");
        } else {
            damaged = true;
            for problem in problems {
                println!("checkpoint {epoch}: DAMAGED: {problem}");
            }
        }
    }
    Ok(if damaged { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
