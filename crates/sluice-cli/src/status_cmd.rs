//! `sluice status --addr HOST:PORT`: a live view of a running job through its admin API's
//! status stream: state, members, last checkpoint, and per source and sink the rows,
//! rows per second and watermark. On a terminal it redraws in place every second; else
//! (a pipe, a log, a script over SSH) it prints one plain line per change and per
//! heartbeat. It ends when the job ends (exit 0 when it completed, 1 when it failed) or
//! on Ctrl-C.
//!
//! Bounds: one stream connection, read on a thread of its own into a channel of
//! [`QUEUED`] lines; one `/status` request per redraw; reads time out (see `http`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use sluice_engine::EngineError;
use sluice_types::SluiceError;

use crate::{http, output};

/// How often a terminal view is redrawn.
const REDRAW: Duration = Duration::from_secs(1);
/// Stream lines read ahead of the printing.
const QUEUED: usize = 64;

/// `sluice status`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The admin API's address, as `sluice run` printed it (`sluice: admin API on http://ADDR`).
    #[arg(long, value_name = "HOST:PORT")]
    addr: String,
    /// A file holding the admin API's bearer token (else the SLUICE_ADMIN_TOKEN variable).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
}

pub fn main(args: &StatusArgs) -> Result<ExitCode, EngineError> {
    let addr = args.addr.trim_start_matches("http://").trim_end_matches('/').to_string();
    let token = token(args).map_err(EngineError::new)?;
    let mut stream = http::get(&addr, "/status/stream", token.as_deref()).map_err(EngineError::new)?;
    if stream.code != 200 {
        let body = stream.text().unwrap_or_default();
        return Err(EngineError::new(refused(&addr, "/status/stream", &body)));
    }
    let (lines, changes) = mpsc::sync_channel(QUEUED);
    std::thread::Builder::new()
        .name("sluice-status-stream".into())
        .spawn(move || {
            loop {
                let line = stream.line();
                let end = !matches!(line, Ok(Some(_)));
                if lines.send(line).is_err() || end {
                    return;
                }
            }
        })
        .map_err(|e| EngineError::new(SluiceError::external("status.thread", format!("cannot start a thread: {e}"))))?;
    let live = std::io::stdout().is_terminal();
    loop {
        let line = match changes.recv_timeout(REDRAW) {
            Ok(line) => line.map_err(EngineError::new)?,
            Err(mpsc::RecvTimeoutError::Timeout) if live => {
                draw(&current(&addr, token.as_deref()).map_err(EngineError::new)?);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
        };
        let Some(line) = line else {
            output::line("sluice: the status stream ended (the job's API stopped)");
            return Ok(ExitCode::SUCCESS);
        };
        let Ok(status) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // A heartbeat has no counters: ask for them.
        let status = if status["heartbeat"] == true {
            current(&addr, token.as_deref()).map_err(EngineError::new)?
        } else {
            status
        };
        if live {
            draw(&status);
        } else {
            output::line(&plain(&status));
        }
        match status["state"].as_str() {
            Some("completed") => return Ok(ExitCode::SUCCESS),
            Some("failed") => return Ok(ExitCode::FAILURE),
            _ => {}
        }
    }
}

/// The token from --token-file (trimmed), else SLUICE_ADMIN_TOKEN, else None.
fn token(args: &StatusArgs) -> Result<Option<String>, SluiceError> {
    token_from(args.token_file.as_deref())
}

/// The bearer token: read from `file`, else the SLUICE_ADMIN_TOKEN variable.
pub(crate) fn token_from(file: Option<&std::path::Path>) -> Result<Option<String>, SluiceError> {
    let Some(path) = file else {
        return Ok(std::env::var("SLUICE_ADMIN_TOKEN").ok());
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        SluiceError::user("status.token_file", format!("cannot read {}: {e}", path.display()))
            .with_fix("give a readable file holding the admin API's token with --token-file")
    })?;
    Ok(Some(text.trim().to_string()))
}

/// `GET /status`.
fn current(addr: &str, token: Option<&str>) -> Result<Value, SluiceError> {
    let answer = http::get(addr, "/status", token)?;
    let code = answer.code;
    let body = answer.text()?;
    if code != 200 {
        return Err(refused(addr, "/status", &body));
    }
    serde_json::from_str(&body).map_err(|e| {
        SluiceError::external("status.protocol", format!("{addr}/status is not a status document ({e}): {body}"))
            .with_fix("check that --addr names a Sluice admin API")
    })
}

pub(crate) fn refused(addr: &str, path: &str, body: &str) -> SluiceError {
    let answer: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = answer["error"].as_str().unwrap_or(body.trim());
    let fix = match answer["error"].as_str() {
        Some("unauthorized") => "give the token with --token-file PATH (or SLUICE_ADMIN_TOKEN)",
        _ => answer["fix"].as_str().unwrap_or("check the job's log"),
    };
    SluiceError::external("status.refused", format!("{addr}{path} answered: {error}")).with_fix(fix.to_string())
}

fn rate(value: &Value) -> String {
    value.as_f64().map_or_else(|| "–".to_string(), |rate| format!("{rate:.0}/s"))
}

/// How far a watermark (milliseconds since the Unix epoch) is behind this host's clock.
fn lag(watermark: &Value) -> String {
    let Some(watermark) = watermark.as_i64() else {
        return "none".to_string();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX));
    let seconds = now.saturating_sub(watermark) as f64 / 1000.0;
    match seconds.abs() {
        s if s < 120.0 => format!("{seconds:.1} s"),
        s if s < 7200.0 => format!("{:.1} min", seconds / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", seconds / 3600.0),
        _ => format!("{:.1} days", seconds / 86_400.0),
    }
}

/// `alone`, `worker 1 of 2`, or (from `/status`, which asks every worker) each worker
/// with its state: `0 running, 1 (this) running`.
fn members(status: &Value) -> String {
    if let Some(members) = status["members"].as_array().filter(|members| !members.is_empty()) {
        let each = members.iter().map(|member| {
            let this = if member["this_worker"] == true { " (this)" } else { "" };
            let state = member["state"].as_str().unwrap_or("unreachable");
            format!("{}{this} {state}", member["id"])
        });
        return each.collect::<Vec<_>>().join(", ");
    }
    match (status["worker"]["id"].as_u64(), status["worker"]["workers"].as_u64()) {
        (Some(id), Some(workers)) => format!("worker {id} of {workers}"),
        _ => "alone".to_string(),
    }
}

fn epoch(status: &Value) -> String {
    status["last_committed_epoch"].as_u64().map_or_else(|| "none".to_string(), |epoch| epoch.to_string())
}

/// One line: `running · alone · checkpoint 7 · in nexmark 1234 (1000/s, watermark lag 2.0 s) · out out 1200 (990/s)`.
fn plain(status: &Value) -> String {
    let mut parts = vec![
        status["state"].as_str().unwrap_or("unknown").to_string(),
        members(status),
        format!("checkpoint {}", epoch(status)),
    ];
    for source in status["sources"].as_array().into_iter().flatten() {
        parts.push(format!(
            "in {} {} ({}, watermark lag {})",
            source["name"].as_str().unwrap_or("?"),
            source["rows_in"],
            rate(&source["rows_per_second"]),
            lag(&source["watermark"])
        ));
    }
    for sink in status["sinks"].as_array().into_iter().flatten() {
        let name = sink["name"].as_str().unwrap_or("?");
        parts.push(format!("out {name} {} ({})", sink["rows_out"], rate(&sink["rows_per_second"])));
    }
    if let Some(failure) = status["failure"].as_str() {
        parts.push(format!("failure: {failure}"));
    }
    parts.join(" · ")
}

/// The terminal view, redrawn in place.
fn draw(status: &Value) {
    let mut text = String::from("\x1b[H\x1b[2J");
    text.push_str(&format!(
        "pipeline {}  state {}  members {}  last checkpoint {}\n\n",
        status["pipeline"].as_str().unwrap_or("?"),
        status["state"].as_str().unwrap_or("?"),
        members(status),
        epoch(status)
    ));
    text.push_str(&format!("{:<24} {:>14} {:>12} {:>14}\n", "source", "rows", "rate", "watermark lag"));
    for source in status["sources"].as_array().into_iter().flatten() {
        text.push_str(&format!(
            "{:<24} {:>14} {:>12} {:>14}\n",
            source["name"].as_str().unwrap_or("?"),
            source["rows_in"],
            rate(&source["rows_per_second"]),
            lag(&source["watermark"])
        ));
    }
    text.push_str(&format!("\n{:<24} {:>14} {:>12}\n", "sink", "rows", "rate"));
    for sink in status["sinks"].as_array().into_iter().flatten() {
        let name = sink["name"].as_str().unwrap_or("?");
        text.push_str(&format!("{name:<24} {:>14} {:>12}\n", sink["rows_out"], rate(&sink["rows_per_second"])));
    }
    if let Some(failure) = status["failure"].as_str() {
        text.push_str(&format!("\nfailure: {failure}\n"));
    }
    text.push_str("\nCtrl-C to leave (the job keeps running)\n");
    output::text(&text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_name_each_worker_and_its_state_when_listed() {
        assert_eq!(members(&serde_json::json!({ "worker": null })), "alone");
        assert_eq!(members(&serde_json::json!({ "worker": { "id": 1, "workers": 2 } })), "worker 1 of 2");
        let listed = serde_json::json!({
            "worker": { "id": 1, "workers": 2 },
            "members": [
                { "id": 0, "this_worker": false, "state": "paused" },
                { "id": 1, "this_worker": true, "state": "running" },
                { "id": 2, "this_worker": false, "state": null, "error": "connection refused" },
            ],
        });
        assert_eq!(members(&listed), "0 paused, 1 (this) running, 2 unreachable");
    }
}
