//! From a pipeline file to a runnable plan: config → sources → SQL views → sinks.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use sluice_config::{PipelineConfig, Position, SourceConnector};
use sluice_runtime::{Plan, RunOptions};
use sluice_sql::{PlannerOptions, SqlPlanner};
use sluice_types::SluiceError;

/// A pipeline ready to run.
pub struct Built {
    pub config: PipelineConfig,
    pub plan: Plan,
    pub options: RunOptions,
    /// The topology fingerprint: a hash of what checkpointed state depends on (sources'
    /// tables and schemas, event time, views' SQL, sinks, vnodes) and not of what may
    /// change across a restart (threads, rates, timeouts, batch sizes).
    pub fingerprint: String,
}

/// FNV-1a, 64 bits: stable across builds and platforms (the std hasher is not).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

fn fingerprint(config: &PipelineConfig, plan: &Plan) -> String {
    use std::fmt::Write;
    let mut text = format!("vnodes={}\n", config.pipeline.vnodes);
    for (source, factory) in config.sources.iter().zip(&plan.sources) {
        let _ = write!(text, "source {} {} delay={:?}", source.name, source.connector.name(), source.watermark_delay);
        for table in factory.tables() {
            let _ = write!(text, " table {} {:?} time={:?}", table.name, table.schema.fields(), table.event_time);
        }
        text.push('\n');
    }
    for view in &config.views {
        let _ = writeln!(text, "view {} {}", view.name, view.sql.value);
    }
    for sink in &config.sinks {
        let _ = writeln!(text, "sink {} from {} {}", sink.name, sink.from, sink.connector.name());
    }
    format!("{:016x}", fnv1a(&text))
}

/// Reads and parses the pipeline file.
pub fn load(path: &Path, threads: Option<u32>) -> Result<(PipelineConfig, PathBuf), String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read pipeline file {}: {e}\n  fix: check the path; `sluice run --help` shows usage",
            path.display()
        )
    })?;
    let name = path.display().to_string();
    let mut config = sluice_config::parse(&text, &name).map_err(|e| e.to_string())?;
    if let Some(threads) = threads {
        config.pipeline.threads = threads;
    }
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base = if base.as_os_str().is_empty() { PathBuf::from(".") } else { base };
    Ok((config, base))
}

fn at(file: &Path, position: Position) -> String {
    format!("{}:{}:{}", file.display(), position.line, position.column)
}

fn located(file: &Path, position: Position, error: SluiceError) -> String {
    format!("{}: {error}", at(file, position))
}

/// Maps the parser's "at Line: L, Column: C" (within the SQL text) into the file.
fn sql_position(message: &str, sql_start: Position) -> Option<Position> {
    let rest = &message[message.find("at Line: ")? + "at Line: ".len()..];
    let (line, rest) = rest.split_once(", Column: ")?;
    let line: usize = line.trim().parse().ok()?;
    let column: usize = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    let column = if line == 1 { sql_start.column + column - 1 } else { column };
    Some(Position { line: sql_start.line + line - 1, column })
}

/// Builds the plan of a parsed pipeline. `lane_threads` is the thread count the sources'
/// lanes are laid out for: this run's, or, when resuming, the first run's (lanes are fixed
/// for the life of the state; they spread over any number of threads).
pub fn build(file: &Path, config: PipelineConfig, base: &Path, lane_threads: Option<u32>) -> Result<Built, String> {
    let section = &config.pipeline;
    let threads = section.threads;
    let lane_threads = lane_threads.unwrap_or(threads);
    let mut planner =
        SqlPlanner::new(PlannerOptions { threads, vnodes: section.vnodes, batch_size: section.batch_size });
    let mut sources = Vec::new();
    for (index, source) in config.sources.iter().enumerate() {
        let context = |e: SluiceError| located(file, source.position, e.context(format!("source `{}`", source.name)));
        let schema = match (&source.connector, &source.schema) {
            (SourceConnector::File { .. }, Some(schema)) => {
                let parsed = sluice_sql::parse_schema(&schema.value, source.event_time.as_deref())
                    .map_err(|e| located(file, schema.position, e.context(format!("source `{}`", source.name))))?;
                Some(parsed)
            }
            _ => None,
        };
        let factory = sluice_connectors::source(source, base, lane_threads, schema).map_err(context)?;
        planner.add_source(index, factory.tables()).map_err(context)?;
        sources.push(factory);
    }
    for view in &config.views {
        planner.add_view(&view.name, &view.sql.value).map_err(|e| {
            let position = sql_position(&e.message, view.sql.position).unwrap_or(view.position);
            located(file, position, e)
        })?;
    }
    let mut flows = Vec::new();
    for sink in &config.sinks {
        let stream = planner.plan_stream(&sink.from, &sink.name).map_err(|e| located(file, sink.position, e))?;
        let factory = sluice_connectors::sink(sink, base, Arc::clone(&stream.schema), stream.updating)
            .map_err(|e| located(file, sink.position, e.context(format!("sink `{}`", sink.name))))?;
        flows.push(stream.into_flow(factory, threads));
    }
    let options = RunOptions {
        threads,
        vnodes: section.vnodes,
        batch_size: section.batch_size,
        queue_batches: section.queue_batches,
        shutdown_timeout: section.shutdown_timeout,
        progress_interval: std::time::Duration::from_millis(500),
    };
    let plan = Plan { sources, flows };
    let fingerprint = fingerprint(&config, &plan);
    Ok(Built { config, plan, options, fingerprint })
}

/// Loads and builds in one step.
pub fn load_and_build(path: &Path, threads: Option<u32>) -> Result<Built, String> {
    let (config, base) = load(path, threads)?;
    build(path, config, &base, None)
}

/// `sluice validate`: everything `run` checks before it starts, without running.
pub fn validate(path: &Path, threads: Option<u32>) -> Result<ExitCode, String> {
    let (config, base) = load(path, threads)?;
    for sink in &config.sinks {
        sluice_connectors::check_sink(sink, &base)
            .map_err(|e| located(path, sink.position, e.context(format!("sink `{}`", sink.name))))?;
    }
    let built = build(path, config, &base, None)?;
    println!(
        "{}: pipeline \"{}\" is valid: {} source(s), {} view(s), {} sink(s)",
        path.display(),
        built.config.pipeline.name,
        built.config.sources.len(),
        built.config.views.len(),
        built.config.sinks.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// `sluice explain`: the dataflow graph.
pub fn explain(path: &Path, threads: Option<u32>) -> Result<ExitCode, String> {
    let built = load_and_build(path, threads)?;
    println!("pipeline \"{}\"", built.config.pipeline.name);
    print!("{}", built.plan.explain(built.options.threads, built.options.vnodes));
    Ok(ExitCode::SUCCESS)
}
