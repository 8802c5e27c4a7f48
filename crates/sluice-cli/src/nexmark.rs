//! `sluice nexmark`: generate NEXMark events to a file, and the end-to-end benchmark.
//!
//! The benchmark runs each query in a child process of its own (so its peak RSS is its
//! own), from the generator or from a bid CSV file, into a blackhole sink, and prints
//! events per second and peak memory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Subcommand, ValueEnum};
use sluice_formats::{Encoder, OutputFormat};
use sluice_nexmark::{GeneratorConfig, LaneGenerator, Table, TableSet};
use sluice_types::Batch;

use crate::build::build;

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
        /// Comma-separated: source (the input alone: generator or CSV parser), q0, q1, q2, tumble.
        #[arg(long, default_value = "source,q0,q1,q2,tumble")]
        queries: String,
        /// Read bids from this CSV file (from `sluice nexmark generate`) instead of the generator.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Take checkpoints at this interval (e.g. "10s") into a temporary store.
        #[arg(long, value_parser = humantime::parse_duration)]
        checkpoint_interval: Option<std::time::Duration>,
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
        #[arg(long, value_parser = humantime::parse_duration)]
        checkpoint_interval: Option<std::time::Duration>,
    },
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

/// The keyed-state query over a one-`$unit` tumbling window.
macro_rules! state_query {
    ($unit:literal) => {
        concat!(
            "SELECT auction, bidder, COUNT(*) AS bids, SUM(price) AS total, window_start ",
            "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' ",
            $unit,
            ")) GROUP BY auction, bidder, window_start, window_end"
        )
    };
}

/// The benchmark queries, in Flink's NEXMark text.
pub fn query_sql(query: &str) -> Option<&'static str> {
    Some(match query {
        // The input's ceiling: rows reach the sink untouched (no operator runs).
        "source" => "SELECT * FROM bid",
        "q0" => "SELECT auction, bidder, price, dateTime, extra FROM bid",
        "q1" => "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
        "q2" => "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
        // Keyed window state that grows with the input: one group per (auction, bidder)
        // pair in an hour-long window; used to measure checkpoints of a given state size.
        "state" => state_query!("HOUR"),
        // The same over a day-long window: the state keeps growing for 864 M events of
        // event time, so a run reaches gigabytes of state.
        "state_day" => state_query!("DAY"),
        "tumble" => {
            "SELECT auction, COUNT(*) AS bids, window_start, window_end \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end"
        }
        _ => return None,
    })
}

pub fn main(command: NexmarkCommand, quiet: bool) -> Result<ExitCode, String> {
    match command {
        NexmarkCommand::Generate { events, seed, table, format, output } => {
            generate(events, seed, table, format, output.as_deref())
        }
        NexmarkCommand::Bench { events, threads, queries, csv, checkpoint_interval } => {
            bench(events, threads, &queries, csv.as_deref(), checkpoint_interval, quiet)
        }
        NexmarkCommand::Query { query, events, threads, csv, checkpoint_interval } => {
            run_query(&query, events, threads, csv.as_deref(), checkpoint_interval)
        }
    }
}

fn generate(
    events: u64,
    seed: u64,
    table: TableArg,
    format: FormatArg,
    output: Option<&Path>,
) -> Result<ExitCode, String> {
    let table = match table {
        TableArg::Person => Table::Person,
        TableArg::Auction => Table::Auction,
        TableArg::Bid => Table::Bid,
    };
    let config = GeneratorConfig { seed, events: Some(events), ..GeneratorConfig::default() };
    let mut generator = LaneGenerator::new(&config, 0, 1, TableSet::only(table));
    let format = match format {
        FormatArg::Csv => OutputFormat::Csv { header: true },
        FormatArg::Json => OutputFormat::JsonLines,
    };
    let mut encoder = Encoder::new(format, sluice_nexmark::schema(table), false);
    let mut writer: Box<dyn Write> = match output {
        Some(path) => Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut buffer = Vec::new();
    while let Some(batch) = generator.next_batch(8192) {
        if let Some(rows) = batch.table(table) {
            buffer.clear();
            encoder.encode(&Batch::inserts(rows.clone()), &mut buffer).map_err(|e| e.to_string())?;
            writer.write_all(&buffer).map_err(|e| format!("write failed: {e}"))?;
        }
    }
    writer.flush().map_err(|e| format!("write failed: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// The pipeline file of one benchmark query.
fn pipeline_text(query: &str, events: u64, threads: u32, csv: Option<&Path>) -> Result<String, String> {
    let sql = query_sql(query).ok_or_else(|| {
        format!("unknown query `{query}`; the queries are source, q0, q1, q2, tumble, state, state_day")
    })?;
    let source = match csv {
        None => {
            format!("[[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n[source.options]\nevents = {events}\n")
        }
        Some(path) => format!(
            "[[source]]\nname = \"bid\"\nconnector = \"file\"\nformat = \"csv\"\n\
             schema = \"auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR\"\n\
             event_time = \"dateTime\"\n[source.options]\npath = {:?}\n",
            path.display().to_string()
        ),
    };
    Ok(format!(
        "[pipeline]\nname = \"nexmark-{query}\"\nthreads = {threads}\n\n{source}\n[[view]]\nname = \"result\"\nsql = {sql:?}\n\n\
         [[sink]]\nname = \"blackhole\"\nfrom = \"result\"\nconnector = \"blackhole\"\n"
    ))
}

fn run_query(
    query: &str,
    events: u64,
    threads: u32,
    csv: Option<&Path>,
    checkpoint_interval: Option<std::time::Duration>,
) -> Result<ExitCode, String> {
    let mut text = pipeline_text(query, events, threads, csv)?;
    let store = std::env::temp_dir().join(format!("sluice-bench-state-{}", std::process::id()));
    if let Some(interval) = checkpoint_interval {
        let url = format!("file://{}", store.display());
        let section = format!("\n[checkpoint]\ninterval = \"{}ms\"\nstore = {url:?}\n", interval.as_millis());
        text = text.replacen("\n[[source]]", &format!("{section}\n[[source]]"), 1);
    }
    let file = PathBuf::from(format!("<nexmark {query}>"));
    let config = sluice_config::parse(&text, &file.display().to_string()).map_err(|e| e.to_string())?;
    let section = config.checkpoint.clone();
    let built = build(&file, config, Path::new("."), None)?;
    let checkpointing = match &section {
        Some(section) => {
            let (store, recovered) = crate::checkpointing::open(section, Path::new("."), true)?;
            let fingerprint = built.fingerprint.clone();
            let vnodes = built.options.vnodes;
            Some(crate::checkpointing::prepare(
                section,
                store,
                recovered.manifest,
                &built.plan,
                fingerprint,
                vnodes,
                threads,
            )?)
        }
        None => None,
    };
    let started = Instant::now();
    let report = sluice_runtime::run(
        &built.plan,
        &built.options,
        checkpointing,
        sluice_runtime::controller::stop_handle(),
        |_, _| {},
    );
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&store);
    if let sluice_runtime::RunOutcome::Failed { component, reason } = &report.outcome {
        return Err(format!("query {query} failed in {component}: {reason}"));
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
            "max_pause_ms": c.max_pause_ms,
            "p50_pause_ms": c.pause_percentile(50.0),
            "p99_pause_ms": c.pause_percentile(99.0),
            "max_duration_ms": c.max_duration_ms,
            // [epoch, MB of state, pause ms, checkpoint ms] per published checkpoint.
            "history": c.history.iter().map(|r| serde_json::json!([
                r.epoch, r.state_bytes as f64 / 1e6, r.pause_ms, r.duration_ms
            ])).collect::<Vec<_>>(),
        })),
    });
    println!("{line}");
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
    checkpoint_interval: Option<std::time::Duration>,
    quiet: bool,
) -> Result<ExitCode, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the sluice binary: {e}"))?;
    if !quiet {
        let input = csv.map_or("generator".to_string(), |p| format!("csv {}", p.display()));
        eprintln!("sluice nexmark bench: {events} events, {threads} thread(s), input {input}");
        println!("{:<8} {:>10} {:>14} {:>18} {:>12}", "query", "seconds", "events/s", "events/s/thread", "peak RSS MB");
    }
    for query in queries.split(',').map(str::trim).filter(|q| !q.is_empty()) {
        query_sql(query).ok_or_else(|| {
            format!("unknown query `{query}`; the queries are source, q0, q1, q2, tumble, state, state_day")
        })?;
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
        if let Some(interval) = checkpoint_interval {
            command.arg("--checkpoint-interval").arg(format!("{}ms", interval.as_millis()));
        }
        let output = command.output().map_err(|e| format!("cannot run query {query}: {e}"))?;
        if !output.status.success() {
            return Err(format!("query {query} failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
        }
        let line = String::from_utf8_lossy(&output.stdout);
        let result: serde_json::Value =
            serde_json::from_str(line.trim()).map_err(|e| format!("query {query}: bad result line: {e}"))?;
        if quiet {
            println!("{}", line.trim());
        } else {
            println!(
                "{:<8} {:>10.2} {:>14.0} {:>18.0} {:>12.0}",
                query,
                result["seconds"].as_f64().unwrap_or_default(),
                result["events_per_second"].as_f64().unwrap_or_default(),
                result["events_per_second_per_thread"].as_f64().unwrap_or_default(),
                result["peak_rss_mb"].as_f64().unwrap_or_default()
            );
            let checkpoints = &result["checkpoints"];
            if !checkpoints.is_null() {
                println!(
                    "         checkpoints: {} published, largest state {:.1} MB, pause p50 {} / p99 {} / max {} ms, \
                     longest checkpoint {} ms",
                    checkpoints["published"],
                    checkpoints["max_state_bytes"].as_f64().unwrap_or_default() / 1e6,
                    checkpoints["p50_pause_ms"],
                    checkpoints["p99_pause_ms"],
                    checkpoints["max_pause_ms"],
                    checkpoints["max_duration_ms"]
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
