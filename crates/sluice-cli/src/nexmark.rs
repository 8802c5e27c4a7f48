//! `sluice nexmark`: generate NEXMark events to a file, and the end-to-end benchmark.
//!
//! The benchmark runs each query in a child process of its own (so its peak RSS is its
//! own), from the generator or from a bid CSV file, into a blackhole sink, and prints
//! events per second and peak memory. The pipelines are built by the engine
//! (`sluice_engine::nexmark`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Subcommand, ValueEnum};
use sluice_engine::nexmark::{BenchSetup, EventFormat, bench_config, query_sql, unknown_query};
use sluice_engine::{Engine, EngineError, Job, Overrides, RunOutcome, StartOptions};
use sluice_nexmark::Table;
use sluice_types::SluiceError;

use crate::output;

#[derive(Subcommand)]
pub enum NexmarkCommand {
    /// Write NEXMark events of one table as CSV or JSON lines.
    Generate {
        /// How many events to generate (all kinds count; bids are 46 of every 50).
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value_t = TableArg::Bid)]
        table: TableArg,
        #[arg(long, value_enum, default_value_t = FormatArg::Csv)]
        format: FormatArg,
        /// Output file (stdout when absent).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Run NEXMark queries into a blackhole and print events/s and peak memory per query.
    Bench {
        /// Events per query.
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Driver threads.
        #[arg(long, default_value_t = 1)]
        threads: u32,
        /// Comma-separated: source (the input alone: generator or CSV parser); NEXMark's q0-q5,
        /// q7-q9, q11, q15-q22 (Flink's text); tumble, running (a non-windowed, updating GROUP
        /// BY), state, state_day.
        #[arg(long, default_value = "source,q0,q1,q2,tumble")]
        queries: String,
        /// Read bids from this CSV file (from `sluice nexmark generate`) instead of the generator,
        /// or from a directory holding person.csv, auction.csv and bid.csv.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Take checkpoints at this interval (e.g. "10s") into a temporary store.
        #[arg(long, value_parser = sluice_engine::config::parse_duration)]
        checkpoint_interval: Option<std::time::Duration>,
        /// MiB of spillable state kept in memory before the rest goes to disk (the
        /// pipeline's `state_memory_mib`).
        #[arg(long, default_value_t = sluice_engine::nexmark::DEFAULT_STATE_MEMORY_MIB)]
        state_memory_mib: u32,
    },
    /// Run one benchmark query in this process and print one JSON line (used by `bench`).
    #[command(hide = true)]
    Query {
        query: String,
        #[arg(long)]
        events: u64,
        #[arg(long)]
        threads: u32,
        #[arg(long)]
        csv: Option<PathBuf>,
        #[arg(long, value_parser = sluice_engine::config::parse_duration)]
        checkpoint_interval: Option<std::time::Duration>,
        #[arg(long, default_value_t = sluice_engine::nexmark::DEFAULT_STATE_MEMORY_MIB)]
        state_memory_mib: u32,
    },
    /// Print one benchmark query's SQL exactly as the engine runs it (the NEXMark oracle
    /// script feeds this very text to the reference engine).
    #[command(hide = true)]
    Sql { query: String },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TableArg {
    Person,
    Auction,
    Bid,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Csv,
    Json,
}

pub fn main(engine: &Engine, command: NexmarkCommand, quiet: bool) -> Result<ExitCode, EngineError> {
    match command {
        NexmarkCommand::Generate { events, seed, table, format, output } => {
            generate(events, seed, table, format, output.as_deref())
        }
        NexmarkCommand::Bench { events, threads, queries, csv, checkpoint_interval, state_memory_mib } => {
            let run = RunSettings { checkpoint_interval, state_memory_mib };
            bench(events, threads, &queries, csv.as_deref(), run, quiet)
        }
        NexmarkCommand::Query { query, events, threads, csv, checkpoint_interval, state_memory_mib } => {
            let run = RunSettings { checkpoint_interval, state_memory_mib };
            run_query(engine, &query, events, threads, csv.as_deref(), run)
        }
        NexmarkCommand::Sql { query } => print_sql(&query),
    }
}

fn generate(
    events: u64,
    seed: u64,
    table: TableArg,
    format: FormatArg,
    output: Option<&Path>,
) -> Result<ExitCode, EngineError> {
    let table = match table {
        TableArg::Person => Table::Person,
        TableArg::Auction => Table::Auction,
        TableArg::Bid => Table::Bid,
    };
    let format = match format {
        FormatArg::Csv => EventFormat::Csv,
        FormatArg::Json => EventFormat::JsonLines,
    };
    let mut writer: Box<dyn Write> = match output {
        Some(path) => Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(path).map_err(|e| {
                SluiceError::user("nexmark.output", format!("cannot create {}: {e}", path.display()))
                    .with_fix("choose an output path in a writable directory")
            })?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    match sluice_engine::nexmark::generate(events, seed, table, format, &mut writer) {
        // A closed standard output (`| head`) ends the program quietly.
        Err(error) if output.is_none() && error.kind == sluice_types::ErrorKind::OutputClosed => Ok(ExitCode::SUCCESS),
        Err(error) => Err(error.into()),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn print_sql(query: &str) -> Result<ExitCode, EngineError> {
    let sql = query_sql(query).ok_or_else(|| EngineError::new(unknown_query(query)))?;
    output::line(sql);
    Ok(ExitCode::SUCCESS)
}

/// How a benchmark query runs besides its input.
#[derive(Clone, Copy)]
struct RunSettings {
    checkpoint_interval: Option<std::time::Duration>,
    state_memory_mib: u32,
}

fn run_query(
    engine: &Engine,
    query: &str,
    events: u64,
    threads: u32,
    csv: Option<&Path>,
    run: RunSettings,
) -> Result<ExitCode, EngineError> {
    let store = std::env::temp_dir().join(format!("sluice-bench-state-{}", std::process::id()));
    let checkpoint = run.checkpoint_interval.map(|interval| (interval, format!("file://{}", store.display())));
    // Each run starts from nothing; discarding state only means something with a store.
    let from_scratch = checkpoint.is_some();
    let state_memory_mib = run.state_memory_mib;
    let config = bench_config(&BenchSetup { query, events, threads, csv, checkpoint, state_memory_mib })?;
    let pipeline = engine.configure(config, &format!("<nexmark {query}>"), Path::new("."), Overrides::default())?;
    let started = Instant::now();
    let job = Job::start(&pipeline, StartOptions { from_scratch })?;
    let report = job.wait();
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&store);
    if let RunOutcome::Failed { component, error } = &report.outcome {
        return Err(error.clone().context(format!("query {query} failed in {component}")).into());
    }
    let rows_in = report.metrics.rows_in();
    let counted = if csv.is_some() { rows_in } else { events };
    let line = serde_json::json!({
        "query": query,
        "input": if csv.is_some() { "csv" } else { "generator" },
        "threads": threads,
        "events": counted,
        "rows_in": rows_in,
        "rows_out": report.metrics.rows_out(),
        "seconds": seconds,
        "events_per_second": counted as f64 / seconds,
        "events_per_second_per_thread": counted as f64 / seconds / f64::from(threads),
        "peak_rss_mb": peak_rss_mb(),
        "longest_step_ms": report.metrics.longest_step_us() as f64 / 1e3,
        "checkpoints": report.checkpoints.as_ref().map(|c| serde_json::json!({
            "published": c.published,
            "max_state_bytes": c.max_state_bytes,
            "written_bytes": c.written_bytes,
            "max_pause_ms": c.max_pause_ms,
            "p50_pause_ms": c.pause_percentile(50.0),
            "p99_pause_ms": c.pause_percentile(99.0),
            "max_duration_ms": c.max_duration_ms,
            // [epoch, MB of state, pause ms, checkpoint ms, MB written] per published checkpoint.
            "history": c.history.iter().map(|r| serde_json::json!([
                r.epoch, r.state_bytes as f64 / 1e6, r.pause_ms, r.duration_ms, r.written_bytes as f64 / 1e6
            ])).collect::<Vec<_>>(),
        })),
    });
    output::line(&line.to_string());
    Ok(ExitCode::SUCCESS)
}

/// The process's peak resident set (VmHWM), in MiB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn bench(
    events: u64,
    threads: u32,
    queries: &str,
    csv: Option<&Path>,
    run: RunSettings,
    quiet: bool,
) -> Result<ExitCode, EngineError> {
    let failed = |message: String| EngineError::new(SluiceError::external("bench.query", message));
    let exe = std::env::current_exe().map_err(|e| failed(format!("cannot find the sluice binary: {e}")))?;
    let queries: Vec<&str> = queries.split(',').map(str::trim).filter(|q| !q.is_empty()).collect();
    // Every name is checked before anything runs or prints.
    if let Some(query) = queries.iter().find(|query| query_sql(query).is_none()) {
        return Err(EngineError::new(unknown_query(query)));
    }
    if !quiet {
        let input = csv.map_or("generator".to_string(), |p| format!("csv {}", p.display()));
        eprintln!("sluice nexmark bench: {events} events, {threads} thread(s), input {input}");
        output::line(&format!(
            "{:<8} {:>10} {:>14} {:>18} {:>12}",
            "query", "seconds", "events/s", "events/s/thread", "peak RSS MB"
        ));
    }
    for query in queries {
        let mut command = Command::new(&exe);
        command.args([
            "--quiet",
            "nexmark",
            "query",
            query,
            "--events",
            &events.to_string(),
            "--threads",
            &threads.to_string(),
        ]);
        if let Some(csv) = csv {
            command.arg("--csv").arg(csv);
        }
        if let Some(interval) = run.checkpoint_interval {
            command.arg("--checkpoint-interval").arg(format!("{}ms", interval.as_millis()));
        }
        command.arg("--state-memory-mib").arg(run.state_memory_mib.to_string());
        let output = command.output().map_err(|e| failed(format!("cannot run query {query}: {e}")))?;
        if !output.status.success() {
            return Err(failed(format!("query {query} failed: {}", String::from_utf8_lossy(&output.stderr).trim())));
        }
        let line = String::from_utf8_lossy(&output.stdout);
        let result: serde_json::Value =
            serde_json::from_str(line.trim()).map_err(|e| failed(format!("query {query}: bad result line: {e}")))?;
        if quiet {
            output::line(line.trim());
        } else {
            output::line(&format!(
                "{:<8} {:>10.2} {:>14.0} {:>18.0} {:>12.0}",
                query,
                result["seconds"].as_f64().unwrap_or_default(),
                result["events_per_second"].as_f64().unwrap_or_default(),
                result["events_per_second_per_thread"].as_f64().unwrap_or_default(),
                result["peak_rss_mb"].as_f64().unwrap_or_default()
            ));
            let checkpoints = &result["checkpoints"];
            if !checkpoints.is_null() {
                output::line(&format!(
                    "         checkpoints: {} published, largest state {:.1} MB, pause p50 {} / p99 {} / max {} ms, \
                     longest checkpoint {} ms",
                    checkpoints["published"],
                    checkpoints["max_state_bytes"].as_f64().unwrap_or_default() / 1e6,
                    checkpoints["p50_pause_ms"],
                    checkpoints["p99_pause_ms"],
                    checkpoints["max_pause_ms"],
                    checkpoints["max_duration_ms"]
                ));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
