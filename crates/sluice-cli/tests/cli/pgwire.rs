//! `sluice run --pg-bind`: the PostgreSQL endpoint of a cluster's follower answers for
//! the whole pipeline (every worker's slice, gathered as `/query` gathers them), to the
//! real `psql`; and a non-loopback address without the token, or a certificate that
//! cannot be read, is refused before the run.
//! Every wait is on an event (a line, an answer) with a deadline.

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::admin::{Running, wait_running};
use crate::harness::{Scratch, assert_fails_with};
use crate::query::{complete_totals, expected_totals, restored_scratch};

const INSTALL: &str = "install it with: apt-get install -y postgresql-client";

/// The newest `psql` under /usr/lib/postgresql/*/bin.
fn psql_binary() -> PathBuf {
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

/// `psql -A -t -c SQL` against the endpoint at `line`'s address (`sluice: PostgreSQL
/// endpoint on ADDR (…)`).
fn psql(line: &str, sql: &str) -> Output {
    let addr = line.split("endpoint on ").nth(1).and_then(|rest| rest.split(' ').next()).expect("an address");
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    Command::new(psql_binary())
        .args(["-X", "-w", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", "sluice", "-d", "sluice"])
        .args(["-A", "-t", "-c", sql])
        .env_remove("PGPASSWORD")
        .env("PGCONNECT_TIMEOUT", "60")
        .env("PGSSLMODE", "disable")
        .output()
        .expect("runs psql")
}

#[test]
fn a_clusters_follower_answers_psql_for_every_worker() {
    let scratch = restored_scratch();
    let serve = ["--admin-bind", "127.0.0.1:0", "--pg-bind", "127.0.0.1:0"];
    let mut leader = Running::start(
        &scratch,
        &[&["run", "pipeline.toml", "--workers", "2", "--control-bind", "127.0.0.1:0"][..], &serve].concat(),
    );
    let line = leader.until("--join ");
    let address = line.split("--join ").nth(1).expect("a join command").trim().to_string();
    let leader_addr = leader.admin_addr();
    let mut follower = Running::start(&scratch, &[&["run", "pipeline.toml", "--join", &address][..], &serve].concat());
    let follower_addr = follower.admin_addr();
    let endpoint = follower.until("PostgreSQL endpoint on ");
    wait_running(leader_addr);
    wait_running(follower_addr);
    // Once the table holds every row (asked over HTTP), psql on the follower sees all of
    // it: both workers' slices.
    let expected: Vec<String> = expected_totals()
        .iter()
        .map(|row| format!("{}|{}|{}", row["k"].as_str().expect("k"), row["n"], row["total"]))
        .collect();
    complete_totals(follower_addr);
    let answer = psql(&endpoint, "SELECT k, n, total FROM totals ORDER BY k");
    let stderr = String::from_utf8_lossy(&answer.stderr);
    assert!(answer.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&answer.stdout).trim(), expected.join("\n"));
    assert!(stderr.contains("NOTICE:  sluice: read at checkpoint "), "{stderr}");
    // Dropping them kills both: this pipeline's stop on two workers is not what is tested.
    drop((leader, follower));
}

#[test]
fn a_non_loopback_pg_address_without_a_token_or_a_missing_certificate_is_refused_before_the_run() {
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        "[pipeline]\nname = \"p\"\n\n[[source]]\nname = \"n\"\nconnector = \"nexmark\"\n[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"blackhole\"\n",
    );
    let output = scratch.sluice(&["run", "pipeline.toml", "--pg-bind", "0.0.0.0:0"]);
    assert_fails_with(&output, &["without a password", "--admin-token-file"]);
    let args =
        ["run", "pipeline.toml", "--pg-bind", "127.0.0.1:0", "--pg-tls-cert", "no.crt", "--pg-tls-key", "no.key"];
    assert_fails_with(&scratch.sluice(&args), &["cannot read the certificate no.crt", "--pg-tls-cert"]);
}
