//! The planned Delta sink: the table's setup on the first writer's open, and the commit
//! and recovery of staged epochs through the log's `txn` actions.
//!
//! # Exactly-once through `txn`
//!
//! The staged writer of slot `s` uploads epoch `e`'s data files, referenced by nothing, and
//! returns a [`PreparedFiles`] record naming them. `commit(e)` (after checkpoint `e` is
//! durable) writes ONE Delta commit holding every record's `add` actions and, per slot, a
//! `txn` action with `appId = sluice/{pipeline}/{sink}/{s}` and `version = e`. The commit
//! is the create-only write of the next version, so it is atomic: the table shows all of
//! the epoch's files or none. Hence:
//!
//! - **Empty epochs.** A slot that wrote no file in `e` adds no `txn` (an idle sink adds
//!   no commit per checkpoint); its `txn` stays at its last epoch with files, which is all
//!   recovery needs: an epoch without files has nothing to repeat or skip.
//! - **Idempotent commit.** Before writing, the newest log is read; a slot whose `txn`
//!   version is already `>= e` is skipped (its files were committed before: recovery
//!   repeats the restored epoch's commit). A commit interrupted by a crash either wrote its
//!   version or did not; the repetition finds out from the log.
//! - **Neither repeated nor skipped.** Recovery commits the restored epoch `r` (its records
//!   are in the manifest), so every epoch `<= r` is in the table exactly once; the run goes
//!   on with `r + 1`, whose files a crashed run may have uploaded but never referenced
//!   (unreferenced files are invisible to readers).
//! - **Fencing.** `discard_after` reads the log's `txn` versions of this sink as the
//!   versions this run expects; every later commit checks that each slot's `txn` version
//!   is still the one this run last saw or wrote. Another run committing to the table
//!   under the same ids breaks that, and this run's commit fails (`sink.delta_fenced`),
//!   so two runs never interleave their epochs. A run without a checkpoint (a fresh start)
//!   that finds `txn` versions of its ids is refused: the table holds the output of a run
//!   whose checkpoints it does not have, and writing epochs from 1 again would be skipped.
//! - **A fallback past a damaged checkpoint** (restored `r`, the log at `t > r`): epochs
//!   `r + 1 ..= t` are in the table already; the run writes them again and their commits
//!   are skipped by the `txn` check (the earlier run's output stays), which is logged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use sluice_runtime::{SinkFactory, SinkParallelism, SinkWriter};
use sluice_types::{Epoch, SluiceError};

use super::DeltaOptions;
use super::log::{self, AddFile, LogState, TableMetadata};
use super::shared::{Control, Input, Layout, Shared};
use super::table::{Decision, Table};
use super::writer::{DeltaWriter, PreparedFiles, now_ms};

impl Shared {
    pub fn new(
        name: &str,
        pipeline: &str,
        table: Table,
        layout: Layout,
        options: DeltaOptions,
        input: Input,
    ) -> Shared {
        Shared {
            name: name.to_string(),
            pipeline: pipeline.to_string(),
            table,
            layout,
            options,
            input_schema: input.schema,
            updating: input.updating,
            upsert_key: input.upsert_key,
            app_prefix: format!("sluice/{pipeline}/{name}/"),
            control: Mutex::new(Control::default()),
        }
    }

    fn control(&self) -> Result<MutexGuard<'_, Control>, SluiceError> {
        self.control.lock().map_err(|_| {
            SluiceError::internal("sink.delta", format!("sink `{}`: a thread panicked committing", self.name))
        })
    }

    fn app_id(&self, slot: u32) -> String {
        format!("{}{slot}", self.app_prefix)
    }

    /// Once per process: creates the table, or checks the existing one's columns.
    fn setup(&self) -> Result<(), SluiceError> {
        let mut control = self.control()?;
        if control.ready {
            return Ok(());
        }
        let state = self.table.ensure(&table_id(self.table.url()), &self.layout.metadata, now_ms())?;
        let found = state.metadata.as_ref().ok_or_else(|| {
            SluiceError::external(
                "sink.delta_log",
                format!("sink `{}`: Delta table {} has commits but no metaData action", self.name, self.table.url()),
            )
            .with_fix("write this view to a new Delta table path")
        })?;
        self.table.check_writable(&state)?;
        check_schema(&self.name, self.table.url(), found, &self.layout.metadata)?;
        control.ready = true;
        Ok(())
    }

    /// Commits `files` in one version without `txn` (an unstaged writer's).
    pub fn commit_files(&self, _epoch: Option<Epoch>, files: Vec<AddFile>) -> Result<(), SluiceError> {
        let rows: u64 = files.iter().map(|f| f.rows).sum();
        let mut actions: Vec<Value> = files.iter().map(log::add_action).collect();
        actions.push(log::commit_info("WRITE", now_ms(), self.parameters(None)));
        let version = self.table.commit(|_| Ok(Decision::Commit(actions.clone())))?;
        tracing::debug!(sink = %self.name, ?version, rows, "delta sink: committed unstaged files");
        self.after_commit();
        Ok(())
    }

    fn parameters(&self, epoch: Option<u64>) -> Map<String, Value> {
        let mut parameters = Map::new();
        parameters.insert("mode".into(), json!("Append"));
        parameters.insert("pipeline".into(), json!(self.pipeline));
        parameters.insert("sink".into(), json!(self.name));
        if let Some(epoch) = epoch {
            parameters.insert("epoch".into(), json!(epoch.to_string()));
        }
        parameters
    }

    fn fenced(&self, app: &str, found: Option<u64>, expected: Option<u64>) -> SluiceError {
        let shown = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
        SluiceError::user(
            "sink.delta_fenced",
            format!(
                "sink `{}`: Delta table {}: another run committed to it as `{app}` (txn version {}, this run expected \
                 {}); two runs of pipeline `{}` are writing this table",
                self.name,
                self.table.url(),
                shown(found),
                shown(expected),
                self.pipeline
            ),
        )
        .with_fix("stop the other run: one run at a time writes a table under one pipeline and sink name (give a second pipeline its own name or table path)")
    }

    /// Commits epoch `epoch`'s records in one version (see the module doc).
    fn commit_epoch(&self, epoch: u64, records: &[PreparedFiles]) -> Result<(), SluiceError> {
        let mut control = self.control()?;
        let now = now_ms();
        let mut updates: Vec<(String, u64)> = Vec::new();
        let version = self.table.commit(|state| {
            updates.clear();
            let mut actions = Vec::new();
            for record in records {
                let app = self.app_id(record.slot);
                let found = state.transactions.get(&app).copied();
                if control.recovered && found != control.fence.get(&app).copied() {
                    return Err(self.fenced(&app, found, control.fence.get(&app).copied()));
                }
                if record.files.is_empty() {
                    // Nothing to add: the slot's txn stays where it is (an idle sink adds
                    // no commit per checkpoint), which the fence expects.
                    continue;
                }
                if found.is_some_and(|t| t >= epoch) {
                    updates.push((app, found.expect("checked")));
                    continue;
                }
                for (file, values) in &record.files {
                    let names = self.layout.partition_names.iter().cloned();
                    let add = AddFile { partition_values: names.zip(values.iter().cloned()).collect(), ..file.clone() };
                    actions.push(log::add_action(&add));
                }
                actions.push(log::txn_action(&app, epoch, now));
                updates.push((app, epoch));
            }
            if actions.is_empty() {
                return Ok(Decision::Skip);
            }
            actions.push(log::commit_info("STREAMING UPDATE", now, self.parameters(Some(epoch))));
            Ok(Decision::Commit(actions))
        })?;
        for (app, version) in updates {
            control.fence.insert(app, version);
        }
        drop(control);
        match version {
            Some(version) => tracing::info!(sink = %self.name, epoch, version, "delta sink: committed epoch"),
            None => tracing::debug!(sink = %self.name, epoch, "delta sink: epoch committed before"),
        }
        self.after_commit();
        Ok(())
    }

    /// What follows a commit: at most one compaction (`compact`), whose failure is
    /// logged: the commit before it is durable.
    fn after_commit(&self) {
        if let Err(error) = super::compact::compact(self) {
            tracing::warn!(sink = %self.name, "delta sink: no compaction of {}: {error}", self.table.url());
        }
    }
}

/// A table id in the form of a UUID, unique to the table's creation.
fn table_id(url: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seed = format!("{url}\0{nanos}\0{}", std::process::id());
    let high = twox_hash::XxHash3_64::oneshot_with_seed(1, seed.as_bytes());
    let low = twox_hash::XxHash3_64::oneshot_with_seed(2, seed.as_bytes());
    let hex = format!("{high:016x}{low:016x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Refuses an existing table whose columns or partitioning differ from the sink's.
pub fn check_schema(sink: &str, url: &str, found: &TableMetadata, wanted: &TableMetadata) -> Result<(), SluiceError> {
    let mut differences = Vec::new();
    for column in &wanted.columns {
        match found.columns.iter().find(|c| c.name == column.name) {
            None => differences.push(format!("column `{}` ({}) is not in the table", column.name, column.delta_type)),
            Some(existing) if existing.delta_type != column.delta_type => differences.push(format!(
                "column `{}`: the table has {}, the view writes {}",
                column.name, existing.delta_type, column.delta_type
            )),
            // Readers trust a non-nullable column to hold no NULL.
            Some(existing) if !existing.nullable && column.nullable => differences.push(format!(
                "column `{}`: the table's is NOT NULL, the view's may be NULL (COALESCE it in the view)",
                column.name
            )),
            Some(_) => {}
        }
    }
    for column in found.columns.iter().filter(|c| !wanted.columns.iter().any(|w| w.name == c.name)) {
        differences
            .push(format!("column `{}` ({}) of the table is not written by the view", column.name, column.delta_type));
    }
    if found.partition_columns != wanted.partition_columns {
        differences.push(format!(
            "the table is partitioned by [{}], the sink by [{}]",
            found.partition_columns.join(", "),
            wanted.partition_columns.join(", ")
        ));
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(SluiceError::user(
        "sink.delta_schema",
        format!("sink `{sink}`: Delta table {url} exists with other columns: {}", differences.join("; ")),
    )
    .with_fix("write to a new table path, or make the view's columns (names, types, partition_by) match the table's (rename or CAST them in the view)"))
}

/// A planned `connector = "delta"` sink.
pub struct DeltaSink {
    shared: Arc<Shared>,
    /// Whether the run asks for exactly-once output (staged epochs, `txn` commits).
    exactly_once: bool,
}

impl DeltaSink {
    pub fn new(shared: Shared, exactly_once: bool) -> DeltaSink {
        DeltaSink { shared: Arc::new(shared), exactly_once }
    }
}

impl SinkFactory for DeltaSink {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    fn open(&self, slot: u32, _slots: u32, staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        self.shared.setup()?;
        Ok(Box::new(DeltaWriter::new(Arc::clone(&self.shared), slot, staged)))
    }

    fn describe(&self) -> String {
        let shared = &self.shared;
        let partitions = match shared.layout.partition_names.as_slice() {
            [] => String::new(),
            names => format!(", partition_by={}", names.join(",")),
        };
        let mode = if shared.updating { "changelog with op column" } else { "append" };
        format!("delta(path={}, {mode}{partitions})", shared.table.url())
    }

    fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    fn commit(&self, epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        let decoded = records
            .iter()
            .filter(|r| !r.is_empty())
            .map(|bytes| PreparedFiles::decode(&self.shared.name, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        if decoded.is_empty() {
            return Ok(());
        }
        sluice_types::failpoint!("sink.delta.before_commit");
        self.shared.commit_epoch(epoch.0, &decoded)
    }

    fn discard_after(&self, epoch: Option<Epoch>, _records: &[Vec<u8>]) -> Result<(), SluiceError> {
        if !self.exactly_once {
            return Ok(());
        }
        let shared = &self.shared;
        let state: LogState = shared.table.latest()?;
        let ours: BTreeMap<String, u64> = state
            .transactions
            .iter()
            .filter(|(app, _)| app.starts_with(&shared.app_prefix))
            .map(|(app, version)| (app.clone(), *version))
            .collect();
        match epoch {
            None if !ours.is_empty() => {
                let newest = ours.values().max().copied().unwrap_or(0);
                // No sink name: the engine names the sink in front of a recovery's errors.
                return Err(SluiceError::user(
                    "sink.delta_fenced",
                    format!(
                        "Delta table {} already holds epochs up to {newest} of pipeline `{}` and this sink (txn ids \
                         {}*), written by a run whose checkpoints this run does not have",
                        shared.table.url(),
                        shared.pipeline,
                        shared.app_prefix
                    ),
                )
                .with_fix("resume from that run's checkpoint store, write to a new table path, or give the pipeline another name"));
            }
            None => {}
            Some(Epoch(restored)) => {
                if let Some(newest) = ours.values().copied().filter(|&t| t > restored).max() {
                    tracing::error!(
                        sink = %shared.name,
                        "delta sink `{}`: table {} holds epochs up to {newest}, after the restored epoch {restored} \
                         (recovery fell back past a damaged checkpoint); those epochs stay as committed and the run's \
                         new output for them is skipped",
                        shared.name,
                        shared.table.url()
                    );
                }
            }
        }
        let mut control = shared.control()?;
        control.fence = ours;
        control.recovered = true;
        Ok(())
    }
}
