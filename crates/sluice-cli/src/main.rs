//! `sluice`: the one binary, a thin client of the engine (`sluice-engine`): it parses
//! the command line, calls the engine, and prints what comes back. [`run`] adds the
//! signals, the progress line and the exit report; [`nexmark`] runs the benchmark's
//! queries in child processes.

mod checkpoints_cmd;
mod connectors_cmd;
mod http;
mod nexmark;
#[cfg(not(feature = "pgwire"))]
mod no_pgwire;
mod output;
mod progress;
mod query_cmd;
mod report;
mod run;
mod status_cmd;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_engine::{Engine, EngineError, Overrides};

/// Arrow allocates a fresh buffer per column per batch; glibc's malloc maps and unmaps
/// large ones each time, and the page faults cost ~14% of a pass-through query.
/// mimalloc keeps the pages. Its v2 (the workspace pins it) peaks 10-25% lower than v3
/// on the NEXMark queries with large state, at the same or better speed: v3 keeps freed
/// pages for a second before returning them (docs/benchmarks/log/2026-12-02-mini-batches-watermark-alignment-and-mimalloc-v2.md). Built without transparent
/// huge pages (`no_thp`): mimalloc returns freed pages after 10 ms, and each one taken
/// again as a huge page had 2 MiB zeroed by the kernel (4% of q5's time on two threads).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Shown after `sluice --help`: the smallest useful pipeline file.
const PIPELINE_EXAMPLE: &str = r#"A pipeline file:

  [pipeline]
  name = "hot-auctions"

  [[source]]
  name = "nexmark"            # tables person, auction, bid
  connector = "nexmark"       # or "file" (format, schema, event_time, [source.options] path)
  [source.options]
  events = 100000

  [[view]]
  name = "hot"
  sql = """SELECT auction, COUNT(*) AS n, window_start, window_end
           FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
           GROUP BY auction, window_start, window_end"""

  [[sink]]
  name = "out"
  from = "hot"
  connector = "stdout"        # or "file" ([sink.options] path) or "blackhole"
  format = "json""#;

/// Sluice: a stream processor. Describe sources, SQL views and sinks in one
/// pipeline.toml and run it.
///
/// Start with `sluice run examples/nexmark.toml`, or `sluice explain` to see the dataflow.
#[derive(Parser)]
#[command(name = "sluice", version, about, long_about, propagate_version = true, after_long_help = PIPELINE_EXAMPLE)]
struct Cli {
    /// Log level for messages on stderr: error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL")]
    log_level: String,
    /// No progress line and no exit report; errors are still printed.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once at start and matched once: the size of `Run`'s arguments costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run a pipeline until its sources end, or until Ctrl-C / SIGTERM (drain, then exit).
    ///
    /// Exit code 0 when the pipeline completed (or drained cleanly after a stop), 1 on failure.
    /// A second Ctrl-C exits at once.
    Run {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Driver threads, overriding `[pipeline] threads`.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
        threads: Option<u32>,
        /// Discard the checkpoint store's state and start from the beginning.
        #[arg(long)]
        from_scratch: bool,
        #[command(flatten)]
        cluster: run::ClusterArgs,
        #[command(flatten)]
        admin: run::AdminArgs,
    },
    /// Parse, plan and type-check a pipeline without running it.
    Validate {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Driver threads, overriding `[pipeline] threads`.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
        threads: Option<u32>,
    },
    /// Print the dataflow: sources and lanes, operators per segment, exchanges, state.
    Explain {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Driver threads, overriding `[pipeline] threads`.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
        threads: Option<u32>,
    },
    /// Inspect a checkpoint store: list checkpoints, verify their objects.
    Checkpoints {
        #[command(subcommand)]
        command: checkpoints_cmd::CheckpointsCommand,
    },
    /// Watch a running job through its admin API: state, members, last checkpoint, rows,
    /// rates and watermarks, live (a line per change when not on a terminal). Ends with the
    /// job (exit 0 when it completed, 1 when it failed) or on Ctrl-C.
    Status(status_cmd::StatusArgs),
    /// Run ad-hoc SQL over a running job's materialized tables, all read at one committed
    /// checkpoint, through its admin API; prints the rows as a table (or JSON lines, CSV,
    /// Arrow IPC).
    Query(query_cmd::QueryArgs),
    /// The connectors a pipeline may name, with the options each takes (`--format
    /// markdown`: the tables of the connector pages in docs/connectors/).
    Connectors(connectors_cmd::ConnectorsArgs),
    /// NEXMark: generate events, or run the benchmark queries.
    Nexmark {
        #[command(subcommand)]
        command: nexmark::NexmarkCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level);
    // Fault injection for tests: nothing happens unless SLUICE_FAILPOINTS is set.
    if let Err(error) = sluice_types::failpoint::setup_from_env() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let engine = Engine::default();
    let result = match cli.command {
        Command::Run { pipeline, threads, from_scratch, cluster, admin } => {
            let options = run::RunOptions { from_scratch, cluster: &cluster, admin: &admin, quiet: cli.quiet };
            run::run(&engine, &pipeline, Overrides { threads }, options)
        }
        Command::Validate { pipeline, threads } => validate(&engine, &pipeline, Overrides { threads }),
        Command::Explain { pipeline, threads } => explain(&engine, &pipeline, Overrides { threads }),
        Command::Checkpoints { command } => checkpoints_cmd::main(command),
        Command::Status(args) => status_cmd::main(&args),
        Command::Query(args) => query_cmd::main(&args),
        Command::Connectors(args) => connectors_cmd::main(&engine, &args),
        Command::Nexmark { command } => nexmark::main(&engine, command, cli.quiet),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            for problem in &error.problems {
                eprintln!("error: {problem}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `sluice validate`: everything `run` checks before it starts, without running.
fn validate(engine: &Engine, path: &Path, overrides: Overrides) -> Result<ExitCode, EngineError> {
    let validation = engine.load(path, overrides)?.validate()?;
    output::line(&format!("{}: {validation}", path.display()));
    Ok(ExitCode::SUCCESS)
}

/// `sluice explain`: the dataflow graph.
fn explain(engine: &Engine, path: &Path, overrides: Overrides) -> Result<ExitCode, EngineError> {
    let explanation = engine.load(path, overrides)?.explain()?;
    output::text(&explanation.to_string());
    Ok(ExitCode::SUCCESS)
}

/// The workspace's crates, whose messages `--log-level` shows (every other crate's only
/// from `warn`). An operator's or the state store's debug lines (an eviction, a merge)
/// were hidden while only four crates were named here.
const LOGGING_CRATES: [&str; 16] = [
    "sluice",
    "sluice_admin",
    "sluice_checkpoint",
    "sluice_cli",
    "sluice_cluster",
    "sluice_config",
    "sluice_connectors",
    "sluice_engine",
    "sluice_formats",
    "sluice_nexmark",
    "sluice_operators",
    "sluice_pgwire",
    "sluice_runtime",
    "sluice_sql",
    "sluice_state",
    "sluice_types",
];

/// Logs go to stderr, coloured only on a terminal.
fn init_logging(level: &str) {
    let directives: Vec<String> = LOGGING_CRATES.iter().map(|krate| format!("{krate}={level}")).collect();
    let filter = tracing_subscriber::EnvFilter::try_new(format!("warn,{}", directives.join(",")))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    /// Every crate of the workspace is named in `LOGGING_CRATES`, so that `--log-level`
    /// shows its messages.
    #[test]
    fn the_log_level_reaches_every_crate_of_the_workspace() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut names: Vec<String> = std::fs::read_dir(&crates)
            .expect("the workspace's crates")
            .map(|entry| entry.expect("a crate").file_name().to_string_lossy().replace('-', "_"))
            .collect();
        names.sort();
        for name in &names {
            assert!(super::LOGGING_CRATES.contains(&name.as_str()), "{name} is missing from LOGGING_CRATES");
        }
    }
}
