//! A Delta table in an object directory: its log read up to the newest version, created
//! on first use, checked against the view's columns, and committed to with the
//! create-only write of the next version (see `log`).
//!
//! The log is read incrementally: the first use reads it from its start (`log_start`: one
//! listing of `_delta_log/`, then the newest log checkpoint and the commits after it, or
//! every commit from version 0 when there is no checkpoint to start from); later reads
//! ask only for the versions after the newest known one, until one is missing. A commit
//! that finds its version taken (another writer made it first) reads the new versions
//! and decides again, at most [`COMMIT_ATTEMPTS_MAX`] times.
//!
//! Every commit first checks the newest log's protocol ([`Table::check_writable`]): a table
//! another engine upgraded to a feature this sink does not maintain (a `v2Checkpoint`, a
//! deletion vector) gets no commit from it, neither a recovery's commit of a restored
//! epoch nor a compaction's, which come before or without a writer's setup.

use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use sluice_checkpoint::ObjectDir;
use sluice_types::SluiceError;

use super::checkpoint;
use super::log::{self, LogState, Protocol, TableMetadata};
use super::log_start;

/// The most times one commit finds its version taken before it gives up.
pub const COMMIT_ATTEMPTS_MAX: u32 = 32;

/// What a commit decides once it sees the newest log.
pub enum Decision {
    /// Write these actions as the next version.
    Commit(Vec<Value>),
    /// Nothing to write (already committed).
    Skip,
}

/// A table and what this process read of its log.
pub struct Table {
    /// The sink's name, for messages.
    sink: String,
    pub(crate) dir: ObjectDir,
    state: Mutex<Option<LogState>>,
    /// A log checkpoint after each commit of a multiple of this version (0: none).
    checkpoint_interval: u64,
    /// Whether the live actions are kept (for checkpoints and compaction).
    keep_actions: bool,
}

impl Table {
    /// `keep_actions`: keep the live actions as the log is read (compaction needs them;
    /// checkpoints keep them anyway).
    pub fn new(sink: &str, dir: ObjectDir, checkpoint_interval: u64, keep_actions: bool) -> Table {
        let keep_actions = keep_actions || checkpoint_interval > 0;
        Table { sink: sink.to_string(), dir, state: Mutex::new(None), checkpoint_interval, keep_actions }
    }

    pub fn url(&self) -> &str {
        self.dir.url()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<LogState>>, SluiceError> {
        self.state.lock().map_err(|_| {
            SluiceError::internal("sink.delta", format!("sink `{}`: a thread panicked reading the log", self.sink))
        })
    }

    /// The log read up to its newest version.
    pub fn latest(&self) -> Result<LogState, SluiceError> {
        let mut guard = self.lock()?;
        let state = self.refresh(&mut guard)?;
        Ok(state.clone())
    }

    /// Reads the versions after the newest known one (the first time, from the log's
    /// start: its newest checkpoint, see `log_start`).
    fn refresh<'g>(&self, guard: &'g mut MutexGuard<'_, Option<LogState>>) -> Result<&'g mut LogState, SluiceError> {
        let state = match guard.take() {
            Some(state) => state,
            None => log_start::first_read(&self.sink, &self.dir, self.keep_actions)?.0,
        };
        let state = guard.insert(state);
        loop {
            let next = state.version.map_or(0, |v| v + 1);
            if !log_start::read_commit(&self.sink, &self.dir, state, next)? {
                break;
            }
        }
        Ok(state)
    }

    /// Creates the table with `metadata` when it has no commit yet; returns the newest
    /// log. Losing the race to another creator is fine: its table is then checked.
    pub fn ensure(&self, table_id: &str, metadata: &TableMetadata, now_ms: i64) -> Result<LogState, SluiceError> {
        let mut guard = self.lock()?;
        let state = self.refresh(&mut guard)?;
        if state.version.is_none() {
            let actions = log::create_actions(table_id, metadata, now_ms);
            if self.dir.create(&log::commit_path(0), log::encode_commit(&actions))? {
                tracing::info!(sink = %self.sink, "delta sink: created table {}", self.url());
            }
        }
        let state = self.refresh(&mut guard)?;
        Ok(state.clone())
    }

    /// Refuses a log this sink must not commit to: a protocol asking a writer for what it
    /// does not maintain (`Protocol::unsupported`), or invariants on columns, which it
    /// does not check.
    pub fn check_writable(&self, state: &LogState) -> Result<(), SluiceError> {
        let invariants =
            state.metadata.as_ref().filter(|m| !m.invariants.is_empty()).map(|metadata| {
                format!("invariants on the columns {} (delta.invariants)", metadata.invariants.join(", "))
            });
        let Some(unsupported) = state.protocol.as_ref().and_then(Protocol::unsupported).or(invariants) else {
            return Ok(());
        };
        let v2 = state.protocol.as_ref().is_some_and(|protocol| protocol.requires(log::V2_CHECKPOINT));
        let fix = if v2 { log::v2_checkpoint_fix() } else { "write this view to a new Delta table path".to_string() };
        Err(SluiceError::user(
            "sink.delta_protocol",
            format!(
                "sink `{}`: Delta table {} requires {unsupported}, which this sink does not support (it writes writer \
                 version 2, or 7 with the features {})",
                self.sink,
                self.url(),
                log::WRITER_FEATURES.join(", ")
            ),
        )
        .with_fix(fix))
    }

    /// Writes a log checkpoint of the newest version (see `checkpoint`). A failure is
    /// logged, not returned: the commit it follows is durable, and readers read the
    /// commits without it.
    fn checkpoint(&self, guard: &mut MutexGuard<'_, Option<LogState>>) {
        let written = self.refresh(guard).and_then(|state| {
            let version = state.version.expect("a version was just committed");
            let (bytes, rows) = checkpoint::encode(state).map_err(|why| {
                SluiceError::internal(
                    "sink.delta_checkpoint",
                    format!("building the checkpoint of version {version}: {why}"),
                )
            })?;
            self.dir.put(&checkpoint::checkpoint_path(version), bytes.into())?;
            self.dir.put(&checkpoint::last_checkpoint_path(), checkpoint::last_checkpoint(version, rows).into())?;
            Ok((version, rows))
        });
        match written {
            Ok((version, rows)) => {
                tracing::info!(sink = %self.sink, version, rows, "delta sink: wrote a log checkpoint")
            }
            Err(error) => tracing::warn!(sink = %self.sink, "delta sink: no log checkpoint of {}: {error}", self.url()),
        }
    }

    /// Writes the next version with what `decide` returns for the newest log, deciding
    /// again each time another writer took the version first. Returns the version
    /// written, `None` when `decide` skipped.
    pub fn commit(
        &self,
        mut decide: impl FnMut(&LogState) -> Result<Decision, SluiceError>,
    ) -> Result<Option<u64>, SluiceError> {
        let mut guard = self.lock()?;
        for _ in 0..COMMIT_ATTEMPTS_MAX {
            let state = self.refresh(&mut guard)?;
            self.check_writable(state)?;
            let actions = match decide(state)? {
                Decision::Skip => return Ok(None),
                Decision::Commit(actions) => actions,
            };
            let version = state.version.map_or(0, |v| v + 1);
            if self.dir.create(&log::commit_path(version), log::encode_commit(&actions))? {
                if self.checkpoint_interval > 0 && version > 0 && version % self.checkpoint_interval == 0 {
                    self.checkpoint(&mut guard);
                }
                return Ok(Some(version));
            }
            tracing::debug!(sink = %self.sink, version, "delta sink: version taken by another writer; reading it");
        }
        Err(SluiceError::external(
            "sink.delta_contended",
            format!(
                "sink `{}`: Delta table {}: {COMMIT_ATTEMPTS_MAX} commit attempts in a row found their version taken \
                 by other writers",
                self.sink,
                self.url()
            ),
        )
        .with_fix("let fewer writers commit to this table at once (each commit of another job takes a version)"))
    }
}
