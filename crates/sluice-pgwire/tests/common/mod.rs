//! A running job with a materialized table and its PostgreSQL endpoint on 127.0.0.1:0,
//! and the real `psql` of the Debian `postgresql` package. Every wait is on an event (an
//! answer, a process's exit) with a deadline that only catches a hang.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sluice_engine::query::QueryLimits;
use sluice_engine::{Engine, Job, Overrides, StartOptions};
use sluice_pgwire::{PgListener, PgServer};

pub const DEADLINE: Duration = Duration::from_secs(60);
const INSTALL: &str = "install it with: apt-get install -y postgresql-client";

/// Rows of `(k, v)` from a file, counted by `k` into the materialized `totals`; the
/// view's union with NEXMark bids that never pass its filter keeps its flow open once
/// the file is read (a table whose input ended is readable only up to the checkpoint
/// before its end while the job runs on).
const PIPELINE: &str = r#"
[pipeline]
name = "served"
threads = 2

[[source]]
name = "bids"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT"
[source.options]
path = "bids.jsonl"

[[source]]
name = "ticks"
connector = "nexmark"
[source.options]
rate = 20

[[view]]
name = "totals"
sql = """
SELECT k, COUNT(*) AS n, SUM(v) AS total FROM (
  SELECT k, v FROM bids
  UNION ALL
  SELECT CAST(bidder AS VARCHAR) AS k, price AS v FROM bid WHERE price < 0
) GROUP BY k
"""
materialized = true

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"

[checkpoint]
interval = "50ms"
store = "file://./state"
"#;

/// Rows in the file: `k` cycles through a, b, c; `v` is the row's number.
pub const ROWS: i64 = 30;
/// `totals` once every row is counted, as `k|n|total` lines.
pub const TOTALS: &str = "a|10|135\nb|10|145\nc|10|155";

/// A running job and its endpoint; stops both when dropped.
pub struct Served {
    job: Option<Job>,
    server: Option<PgServer>,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts the pipeline and serves it (with `token`, clients must give it as their
    /// password), then waits until `totals` counts every row.
    pub fn start(token: Option<&str>) -> Served {
        Served::start_with(token, false)
    }

    /// [`Served::start`] serving TLS too, with a self-signed certificate for
    /// `localhost` that `openssl` makes.
    pub fn start_tls(token: Option<&str>) -> Served {
        Served::start_with(token, true)
    }

    fn start_with(token: Option<&str>, tls: bool) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        let lines: Vec<String> =
            (0..ROWS).map(|i| format!(r#"{{"k": "{}", "v": {i}}}"#, ["a", "b", "c"][i as usize % 3])).collect();
        std::fs::write(dir.path().join("bids.jsonl"), lines.join("\n") + "\n").expect("write");
        let pipeline = Engine::default().parse(PIPELINE, "p.toml", dir.path(), Overrides::default()).expect("valid");
        let job = Job::start(&pipeline, StartOptions::default()).expect("starts");
        let bind: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let queries = sluice_admin::Queries::new(job.handle(), token);
        let mut listener = PgListener::bind(bind, token.map(str::to_string)).expect("binds");
        if tls {
            let (certificate, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            let made = Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .args(["-days", "1", "-subj", "/CN=localhost", "-keyout"])
                .arg(&key)
                .arg("-out")
                .arg(&certificate)
                .output()
                .expect("runs openssl (install it with: apt-get install -y openssl)");
            assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
            listener = listener.with_tls(&certificate, &key).expect("TLS");
        }
        let server = listener.serve(queries).expect("serves");
        let served = Served { job: Some(job), server: Some(server), _dir: dir };
        served.wait_for_every_row();
        served
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("server").addr()
    }

    pub fn job(&self) -> &Job {
        self.job.as_ref().expect("job")
    }

    /// Asks the job itself until `totals` counts every row of the file.
    fn wait_for_every_row(&self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let answer = self.job().handle().query("SELECT SUM(n) AS n FROM totals", QueryLimits::default());
            if let Ok(answer) = answer {
                let printed = arrow::util::pretty::pretty_format_batches(&answer.batches).expect("prints").to_string();
                if printed.contains(&format!("| {ROWS} ")) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "totals never counted every row");
        }
    }

    /// Runs `psql` against the endpoint (see [`psql`]).
    pub fn psql(&self, password: Option<&str>, args: &[&str]) -> Output {
        psql(self.addr(), password, args)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
        if let Some(job) = self.job.take() {
            job.stop();
            job.wait();
        }
    }
}

/// The newest `psql` under /usr/lib/postgresql/*/bin.
pub fn psql_binary() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("no /usr/lib/postgresql ({e}); {INSTALL}"))
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let psql = entry.path().join("bin").join("psql");
            psql.exists().then_some((version, psql))
        })
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no psql under /usr/lib/postgresql/*/bin; {INSTALL}")).1
}

/// A `psql` command for `addr` (no ~/.psqlrc, stop on the first error, `password` as
/// PGPASSWORD, never prompting for one).
pub fn psql_command(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Command {
    let mut command = Command::new(psql_binary());
    command
        .args(["-X", "-w", "-v", "ON_ERROR_STOP=1", "-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-U", "sluice", "-d", "sluice"])
        .args(args)
        .env_remove("PGPASSWORD")
        .env("PGCONNECT_TIMEOUT", "60")
        .env("PGSSLMODE", "disable");
    if let Some(password) = password {
        command.env("PGPASSWORD", password);
    }
    command
}

/// Runs `psql ARGS` to its end with `sslmode` (PGSSLMODE).
pub fn psql_ssl(addr: SocketAddr, password: Option<&str>, sslmode: &str, args: &[&str]) -> Output {
    psql_command(addr, password, args).env("PGSSLMODE", sslmode).output().expect("runs psql")
}

/// Runs `psql ARGS` to its end.
pub fn psql(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Output {
    psql_command(addr, password, args).output().expect("runs psql")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
