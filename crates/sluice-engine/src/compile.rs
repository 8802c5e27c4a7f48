//! From a validated [`Pipeline`] to a runnable [`CompiledPipeline`]: sources built,
//! views planned by the SQL layer, sinks attached, the topology fingerprinted.
//!
//! Compiling touches the file system (file sources list and measure their files) but
//! writes nothing. It also refuses pipelines that would destroy their own input: a sink
//! writing where a source reads (directly, through `..` or a symbolic link), or two
//! sinks writing one path.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sluice_config::{Position, SinkConfig};
use sluice_connectors::{SinkContext, SourceContext};
use sluice_runtime::{Plan, RunOptions, SinkParallelism};
use sluice_sql::{PlannerOptions, SqlPlanner};
use sluice_types::SluiceError;
use sluice_types::vnode::SlotLayout;

use crate::error::EngineError;
use crate::fingerprint::{Fingerprint, fingerprint};
use crate::load::Pipeline;

/// What a restore fixes about the sources, from the checkpoint it resumes: lanes are
/// laid out as in the first run, whatever the input looks like now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restoring {
    /// The thread count the first run laid the lanes out for.
    pub lane_threads: u32,
    /// Each source's recorded layout, by source name (see `SourceFactory::layout`).
    pub layouts: std::collections::BTreeMap<String, Vec<u8>>,
}

/// A pipeline ready to run.
pub struct CompiledPipeline {
    /// `[pipeline] name`.
    pub name: String,
    pub plan: Plan,
    /// What checkpointed state depends on (see [`crate::fingerprint`]).
    pub fingerprint: Fingerprint,
    pub options: RunOptions,
    /// The thread count the sources' lanes are laid out for.
    pub lane_threads: u32,
    /// The materialized tables, filled by the run, read by queries.
    pub materialized: Arc<crate::materialize::Materialized>,
    /// The local directory of this worker's state beyond memory: spilled rows, and the
    /// runs a checkpoint writes before they go to the store.
    pub state_dir: std::path::PathBuf,
}

impl std::fmt::Debug for CompiledPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPipeline")
            .field("name", &self.name)
            .field("fingerprint", &self.fingerprint)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Compiles the pipeline, its sources' lanes laid out for this run (None), or, when
    /// resuming, as the checkpoint recorded them (lanes are fixed for the life of the
    /// state; they spread over any number of threads).
    /// A sink's `worker` is a cluster's business: here every single-writer sink runs on
    /// thread 0.
    pub fn compile(&self, restoring: Option<&Restoring>) -> Result<CompiledPipeline, EngineError> {
        self.compile_on(&SlotLayout::solo(self.config.pipeline.threads), restoring)
    }

    /// [`Pipeline::compile`] for the slots of `layout` (a cluster's every worker's
    /// threads) instead of `[pipeline] threads`; a single-writer sink with `worker = N`
    /// runs on worker N's first slot (N must be one of the layout's workers, unless the
    /// layout is one worker's, as for `validate`).
    pub fn compile_on(
        &self,
        layout: &SlotLayout,
        restoring: Option<&Restoring>,
    ) -> Result<CompiledPipeline, EngineError> {
        self.check_paths()?;
        let threads = layout.slots();
        let section = &self.config.pipeline;
        let lane_threads = restoring.map_or(threads, |r| r.lane_threads);
        let layout_workers = layout.workers();
        let mut planner = SqlPlanner::new(PlannerOptions {
            threads,
            vnodes: section.vnodes,
            batch_size: section.batch_size,
            windows_per_row_max: u64::from(section.windows_per_row_max),
            state_ttl: section.state_ttl,
            local_aggregation: section.local_aggregation,
            mini_batch_rows: section.mini_batch_rows,
        });
        for view in &self.config.views {
            if let Some(ttl) = view.state_ttl {
                planner.set_state_ttl(&view.name, ttl);
            }
        }
        let spill = self.spill_space()?;
        let state_dir = spill.dir().to_path_buf();
        planner.set_spill(Arc::clone(&spill));
        let mut sources = Vec::new();
        for (index, (source, configured)) in self.config.sources.iter().zip(&self.sources).enumerate() {
            let at =
                |error: SluiceError| self.problem(source.position, error.context(format!("source `{}`", source.name)));
            let schema = match (&source.schema, configured.reads_declared_schema()) {
                (Some(schema), true) => Some(
                    sluice_sql::parse_schema(&schema.value, source.event_time.as_deref())
                        .map_err(|e| self.problem(schema.position, e.context(format!("source `{}`", source.name))))?,
                ),
                _ => None,
            };
            let layout = restoring.and_then(|r| r.layouts.get(&source.name)).filter(|l| !l.is_empty());
            let context = SourceContext {
                config: source,
                base_dir: &self.base_dir,
                lane_threads,
                schema,
                layout: layout.cloned(),
                exactly_once: self
                    .config
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| c.guarantee == sluice_config::Guarantee::ExactlyOnce),
                workers: layout_workers,
            };
            let factory = configured.build(&context).map_err(at)?;
            if self.config.checkpoint.is_some() && !factory.resumable() {
                return Err(at(SluiceError::user(
                    "source.not_resumable",
                    format!(
                        "{} reads a pipe or a device, which cannot be read again from a checkpoint's position",
                        factory.describe()
                    ),
                )
                .with_fix("remove the [checkpoint] section, or read a regular file")));
            }
            if let Some(key) = &source.primary_key
                && factory.tables().iter().all(|table| table.changelog.is_none())
            {
                return Err(self.problem(
                    key.position,
                    SluiceError::user(
                        "source.primary_key_unused",
                        format!(
                            "source `{}`: primary_key is read only with a changelog format, and {} is append-only",
                            source.name,
                            factory.describe()
                        ),
                    )
                    .with_fix(
                        "remove primary_key, or set a changelog format: kafka: format = \"debezium-json\", \"debezium-avro-confluent\" or \
                         \"upsert\"; file: format = \"changelog-json\", \"changelog-csv\" or \"debezium-json\"",
                    ),
                ));
            }
            planner.add_source(index, factory.tables(), source.on_error).map_err(at)?;
            sources.push(factory);
        }
        planner.declare_views(self.config.views.iter().map(|view| sluice_sql::ViewDeclaration {
            name: view.name.clone(),
            sql: view.sql.value.clone(),
            location: format!("line {}", view.position.line),
        }));
        for view in &self.config.views {
            planner.add_view(&view.name, &view.sql.value).map_err(|e| {
                let position = sql_position(&e.message, view.sql.position).unwrap_or(view.position);
                self.problem(position, e)
            })?;
        }
        let mut flows = Vec::new();
        for (sink, configured) in self.config.sinks.iter().zip(&self.sinks) {
            let stream = planner.plan_stream(&sink.from, &sink.name).map_err(|e| self.problem(sink.position, e))?;
            let context = SinkContext {
                pipeline: &section.name,
                config: sink,
                base_dir: &self.base_dir,
                schema: Arc::clone(&stream.schema),
                updating: stream.updating,
                upsert_key: stream.changelog.upsert_key().map(<[usize]>::to_vec),
                exactly_once: self
                    .config
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| c.guarantee == sluice_config::Guarantee::ExactlyOnce),
                checkpoint_span: self.config.checkpoint.as_ref().map(|c| c.interval.saturating_add(c.timeout)),
            };
            let factory = configured
                .build(&context)
                .map_err(|e| self.problem(sink.position, e.context(format!("sink `{}`", sink.name))))?;
            let slot = self.sink_slot(sink, factory.parallelism(), layout)?;
            flows.push(stream.into_flow(factory, threads, slot));
        }
        let mut reads: Vec<String> = self.config.sinks.iter().map(|sink| sink.from.clone()).collect();
        let materialized = crate::materialize::add_flows(
            self,
            &sources,
            &planner,
            threads,
            Some(Arc::clone(&spill)),
            &mut flows,
            &mut reads,
        )?;
        crate::share::share_readers(&mut flows, &reads);
        let options = RunOptions {
            threads,
            vnodes: section.vnodes,
            batch_size: section.batch_size,
            queue_batches: section.queue_batches,
            shutdown_timeout: section.shutdown_timeout,
        };
        let plan = Plan { sources, flows };
        let fingerprint = fingerprint(&self.config, &plan).map_err(EngineError::new)?;
        Ok(CompiledPipeline {
            name: section.name.clone(),
            plan,
            fingerprint,
            options,
            lane_threads,
            materialized,
            state_dir,
        })
    }

    /// Where a single-writer sink runs: its `worker`'s first slot (the leader's by default).
    fn sink_slot(
        &self,
        sink: &SinkConfig,
        parallelism: SinkParallelism,
        layout: &SlotLayout,
    ) -> Result<u32, EngineError> {
        let Some(worker) = sink.worker else { return Ok(0) };
        if parallelism != SinkParallelism::Single {
            let error = SluiceError::user(
                "sink.worker",
                format!(
                    "sink `{}` has `worker = {worker}`, but it writes from every worker (one part per thread)",
                    sink.name
                ),
            )
            .with_fix("remove `worker`: it places only sinks with one writer (a file sink with a file path, stdout)");
            return Err(self.problem(sink.position, error));
        }
        if layout.workers() == 1 {
            return Ok(0);
        }
        if worker >= layout.workers() {
            let error = SluiceError::user(
                "sink.worker",
                format!(
                    "sink `{}` runs on worker {worker}, but the cluster has {} workers (0 is the leader)",
                    sink.name,
                    layout.workers()
                ),
            )
            .with_fix(format!("set worker to 0..={}", layout.workers() - 1));
            return Err(self.problem(sink.position, error));
        }
        Ok(layout.slots_of(worker).start)
    }

    /// Where state beyond `[pipeline] state_memory_mib` goes: `state_dir` (relative to
    /// the pipeline file), else the system's temporary directory; it must be a directory
    /// this process can write.
    fn spill_space(&self) -> Result<Arc<sluice_operators::spill::SpillSpace>, EngineError> {
        let section = &self.config.pipeline;
        let dir = match &section.state_dir {
            Some(dir) => self.base_dir.join(dir),
            None => std::env::temp_dir(),
        };
        let fix = "create it, or set [pipeline] state_dir to an existing local directory this process may write \
                   (state beyond state_memory_mib is written there)";
        if !dir.is_dir() {
            let error = SluiceError::user(
                "pipeline.state_dir",
                format!("the state directory {} is not a directory this process can see", dir.display()),
            )
            .with_fix(fix);
            return Err(EngineError::at(&self.file, None, error));
        }
        // A spill file or a run is made at the first spill or checkpoint, maybe hours in: find out now.
        if let Err(error) = tempfile::tempfile_in(&dir) {
            let error = SluiceError::user(
                "pipeline.state_dir",
                format!("cannot create a file in the state directory {}: {error}", dir.display()),
            )
            .with_fix(fix);
            return Err(EngineError::at(&self.file, None, error));
        }
        let budget = usize::try_from(section.state_memory_mib).expect("a u32 fits a usize") << 20;
        Ok(sluice_operators::spill::SpillSpace::new(dir, budget))
    }

    /// Refuses a sink that writes where a source reads, or where another sink writes.
    fn check_paths(&self) -> Result<(), EngineError> {
        let inputs: Vec<(&str, PathBuf)> = self
            .config
            .sources
            .iter()
            .zip(&self.sources)
            .flat_map(|(source, c)| c.input_paths(&self.base_dir).into_iter().map(|p| (source.name.as_str(), p)))
            .collect();
        let mut outputs: Vec<(&str, Position, PathBuf)> = Vec::new();
        for (sink, configured) in self.config.sinks.iter().zip(&self.sinks) {
            for path in configured.output_paths(&self.base_dir) {
                let path = normalized(&path);
                for (source, input) in &inputs {
                    if overlap(&path, &normalized(input)) {
                        return Err(self.problem(sink.position, destroys_input(&sink.name, &path, source, input)));
                    }
                }
                if let Some((other, line, _)) = outputs.iter().find(|(_, _, o)| overlap(o, &path)) {
                    let error = SluiceError::user(
                        "sink.shared_path",
                        format!(
                            "sink `{}` writes {}, where sink `{other}` (line {}) writes too: their rows would interleave",
                            sink.name,
                            path.display(),
                            line.line
                        ),
                    )
                    .with_fix("give every sink its own path");
                    return Err(self.problem(sink.position, error));
                }
                outputs.push((sink.name.as_str(), sink.position, path));
            }
        }
        Ok(())
    }
}

fn destroys_input(sink: &str, output: &Path, source: &str, input: &Path) -> SluiceError {
    SluiceError::user(
        "sink.overwrites_input",
        format!(
            "sink `{sink}` writes {}, which overlaps the input of source `{source}` ({}): the run would \
             overwrite or delete what it reads",
            output.display(),
            input.display()
        ),
    )
    .with_fix("write the output outside the source's file or directory")
}

/// Whether one path is the other or inside it.
fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `path` absolute, with `.` and `..` resolved and symbolic links followed as far as the
/// path exists (the rest, not created yet, is resolved by its names).
pub(crate) fn normalized(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path)
    };
    let components: Vec<Component<'_>> = absolute.components().collect();
    // The longest prefix that exists is resolved by the file system (links, `..`).
    for cut in (1..=components.len()).rev() {
        let existing: PathBuf = components[..cut].iter().collect();
        if let Ok(mut result) = std::fs::canonicalize(&existing) {
            for component in &components[cut..] {
                push_lexically(&mut result, *component);
            }
            return result;
        }
    }
    let mut result = PathBuf::from("/");
    for component in components {
        push_lexically(&mut result, component);
    }
    result
}

fn push_lexically(path: &mut PathBuf, component: Component<'_>) {
    match component {
        Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        Component::ParentDir => {
            path.pop();
        }
        Component::Normal(name) => path.push(name),
    }
}

/// Maps the SQL parser's "at Line: L, Column: C" (within the SQL text) into the file.
fn sql_position(message: &str, sql_start: Position) -> Option<Position> {
    let rest = &message[message.find("at Line: ")? + "at Line: ".len()..];
    let (line, rest) = rest.split_once(", Column: ")?;
    let line: usize = line.trim().parse().ok()?;
    let column: usize = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    let column = if line == 1 { sql_start.column + column - 1 } else { column };
    Some(Position { line: sql_start.line + line - 1, column })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_through_dots_and_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::create_dir(root.join("data")).expect("mkdir");
        std::fs::write(root.join("data/in.csv"), "1\n").expect("write");
        std::os::unix::fs::symlink(root.join("data"), root.join("link")).expect("symlink");
        assert_eq!(normalized(&root.join("out/../data/in.csv")), root.join("data/in.csv"));
        assert_eq!(normalized(&root.join("link/in.csv")), root.join("data/in.csv"));
        assert_eq!(normalized(&root.join("link/new/../x.json")), root.join("data/x.json"));
        assert!(overlap(&root.join("data"), &root.join("data/in.csv")));
        assert!(!overlap(&root.join("data2"), &root.join("data/in.csv")));
    }
}
