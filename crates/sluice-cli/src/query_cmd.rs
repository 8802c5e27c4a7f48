//! `sluice query --addr HOST:PORT "SQL"`: ad-hoc SQL over a running job's materialized
//! tables through its admin API (`POST /query`). The rows are printed as a table (the
//! answer read as Arrow IPC), or passed through as JSON lines, CSV or Arrow IPC; the
//! checkpoint they were read at goes to stderr.
//!
//! Bounds: one request; the answer is read at most `http::MAX_BODY` bytes; the server
//! bounds rows and time (`--max-rows`, `--timeout`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use sluice_engine::EngineError;
use sluice_types::SluiceError;

use crate::status_cmd::{refused, token_from};
use crate::{http, output};

/// How the rows are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table with a header.
    Table,
    /// JSON lines, one object per row.
    Json,
    /// CSV with a header.
    Csv,
    /// An Arrow IPC stream (binary).
    Arrow,
}

/// `sluice query`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// The admin API's address, as `sluice run` printed it (`sluice: admin API on http://ADDR`).
    #[arg(long, value_name = "HOST:PORT")]
    addr: String,
    /// A file holding the admin API's bearer token (else the SLUICE_ADMIN_TOKEN variable).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// How the rows are printed.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// The most rows the answer may have (the server refuses a query with more).
    #[arg(long, value_name = "N")]
    max_rows: Option<u64>,
    /// How long the query may take, e.g. `30s`.
    #[arg(long, value_name = "DURATION", value_parser = sluice_engine::config::parse_duration)]
    timeout: Option<Duration>,
    /// The query, e.g. "SELECT auction, bids FROM counts ORDER BY bids DESC LIMIT 10".
    sql: String,
}

pub fn main(args: &QueryArgs) -> Result<ExitCode, EngineError> {
    run(args).map_err(EngineError::new)
}

fn run(args: &QueryArgs) -> Result<ExitCode, SluiceError> {
    let addr = args.addr.trim_start_matches("http://").trim_end_matches('/').to_string();
    let token = token_from(args.token_file.as_deref())?;
    let wire = match args.format {
        Format::Table | Format::Arrow => "arrow",
        Format::Json => "json",
        Format::Csv => "csv",
    };
    let mut request = serde_json::json!({ "sql": args.sql, "format": wire });
    if let Some(rows) = args.max_rows {
        request["max_rows"] = rows.into();
    }
    if let Some(timeout) = args.timeout {
        request["timeout_ms"] = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).into();
    }
    let answer = http::post_json(&addr, "/query", token.as_deref(), request.to_string().as_bytes())?;
    let code = answer.code;
    let epoch = answer.header("sluice-epoch").map(str::to_string);
    let bytes = answer.bytes()?;
    if code != 200 {
        return Err(refused(&addr, "/query", &String::from_utf8_lossy(&bytes)));
    }
    match args.format {
        Format::Table => {
            let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
                .map_err(|e| protocol(&addr, &e))?;
            let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| protocol(&addr, &e))?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let table = arrow::util::pretty::pretty_format_batches(&batches).map_err(|e| protocol(&addr, &e))?;
            output::line(&table.to_string());
            let at = epoch.map_or_else(String::new, |epoch| format!(" at checkpoint {epoch}"));
            eprintln!("{rows} row{}{at}", if rows == 1 { "" } else { "s" });
        }
        _ => {
            let mut stdout = std::io::stdout().lock();
            if let Err(error) = stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
                output::closed(&error);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn protocol(addr: &str, error: &arrow::error::ArrowError) -> SluiceError {
    SluiceError::external("query.protocol", format!("{addr}/query answered rows that cannot be read: {error}"))
        .with_fix("use the same sluice build as the job; or --format json")
}
