//! Inspecting a checkpoint store: what `sluice checkpoints list` and `verify` show, as
//! data.

use std::path::Path;

use sluice_checkpoint::CheckpointStore;
use sluice_types::SluiceError;

/// One committed checkpoint, or why it cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointEntry {
    Readable(CheckpointSummary),
    Damaged { epoch: u64, problem: String },
}

/// What a listing shows of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSummary {
    pub epoch: u64,
    /// Milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Bytes of state.
    pub bytes: u64,
    /// State objects.
    pub objects: usize,
    pub fingerprint: String,
    /// Each source's name and lane positions.
    pub sources: Vec<(String, Vec<Vec<u8>>)>,
}

/// The result of reading every object of one checkpoint back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub epoch: u64,
    /// Each problem names its object; empty: the checkpoint can be restored from.
    pub problems: Vec<String>,
}

fn open(url: &str, base_dir: &Path) -> Result<CheckpointStore, SluiceError> {
    CheckpointStore::open(url, base_dir)
}

/// Breaks the store's lease whoever holds it (its holder is gone: a crash on another
/// host, or a container); returns a description of what was broken, None when the store
/// had no lease. A run that still held it fails at its next checkpoint.
pub fn unlock(url: &str, base_dir: &Path) -> Result<Option<String>, SluiceError> {
    Ok(open(url, base_dir)?.break_lease()?.map(|broken| broken.to_string()))
}

/// Every checkpoint in the store at `url`, oldest first.
pub fn list(url: &str, base_dir: &Path) -> Result<Vec<CheckpointEntry>, SluiceError> {
    let store = open(url, base_dir)?;
    let mut entries = Vec::new();
    for epoch in store.epochs()? {
        entries.push(match store.load(epoch) {
            Ok(manifest) => CheckpointEntry::Readable(CheckpointSummary {
                epoch,
                created_ms: manifest.created_ms,
                bytes: store.size(&manifest),
                objects: manifest.distinct_objects().len(),
                fingerprint: manifest.fingerprint.clone(),
                sources: manifest.sources.iter().map(|s| (s.name.clone(), s.lanes.clone())).collect(),
            }),
            Err(error) => CheckpointEntry::Damaged { epoch, problem: error.to_string() },
        });
    }
    Ok(entries)
}

/// Reads every object of checkpoint `only` (or of every checkpoint) and checks it.
pub fn verify(url: &str, base_dir: &Path, only: Option<u64>) -> Result<Vec<Verification>, SluiceError> {
    let store = open(url, base_dir)?;
    let epochs = match only {
        Some(epoch) => vec![epoch],
        None => store.epochs()?,
    };
    if epochs.is_empty() {
        return Err(SluiceError::user("checkpoint.none", format!("no checkpoints in {url}"))
            .with_fix("check the store URL: it is the [checkpoint] store of the pipeline"));
    }
    let mut verified = Vec::new();
    for epoch in epochs {
        let problems = match store.load(epoch) {
            Ok(manifest) => store.verify(&manifest)?,
            Err(error) => vec![error.to_string()],
        };
        verified.push(Verification { epoch, problems });
    }
    Ok(verified)
}
