//! PostgreSQL end to end: `sluice run` writing tables of a real server.
//!
//! Each test starts its own throwaway cluster (Debian's `postgresql` package, which
//! `scripts/test.sh` installs; a missing server fails the test, it is never skipped):
//! `initdb` into a temporary directory with a password-protected superuser, then
//! `pg_ctl start -w` on a free loopback port with `max_prepared_transactions` set, as
//! the `postgres` user when the tests run as root (the server refuses to run as root).
//! [`Server::start_logical`] also sets what logical replication needs (`wal_level`,
//! replication slots and WAL senders), for the CDC source's tests (`postgres_cdc.rs`).
//! Waits are `pg_ctl`'s own (it returns once the server accepts connections) and the
//! processes' exits; the cluster is stopped when the test ends.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{Scratch, assert_fails_with, sluice_command, stderr};

const INSTALL: &str = "install it with: apt-get install -y postgresql";
pub(crate) const PASSWORD: &str = "sluice-test-password";
pub(crate) const PASSWORD_VARIABLE: &str = "SLUICE_TEST_PG_PASSWORD";
/// Clusters started for one test before giving up (a chosen port may be taken).
const START_ATTEMPTS: usize = 3;

/// A throwaway PostgreSQL cluster, stopped when dropped.
pub(crate) struct Server {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// TLS on and only `hostssl` connections over TCP: the test's own sessions go
    /// through the Unix socket.
    tls: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = self.as_owner(&self.bin.join("pg_ctl"), &["-D", &data.to_string_lossy(), "-m", "immediate", "stop"]);
    }
}

/// The newest installed server's binaries.
fn server_binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("no /usr/lib/postgresql ({e}); {INSTALL}"))
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no initdb under /usr/lib/postgresql/*/bin; {INSTALL}")).1
}

fn running_as_root() -> bool {
    let output = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&output.stdout).trim() == "0"
}

impl Server {
    /// A cluster with `max_prepared_transactions` set as given.
    pub(crate) fn start(max_prepared_transactions: u32) -> Server {
        Server::start_with(max_prepared_transactions, false, None)
    }

    /// A cluster for logical replication: `wal_level = logical`, with replication slots
    /// and WAL senders to spare, and prepared transactions for exactly-once sinks.
    pub(crate) fn start_logical() -> Server {
        Server::start_with(10, true, None)
    }

    /// A logical cluster with `ssl = on`, the certificate and key `server.crt` and
    /// `server.key` of `certificates`, and a pg_hba.conf whose only TCP line is
    /// `hostssl`: a plain connection over TCP is refused.
    pub(crate) fn start_tls_only(certificates: &Path) -> Server {
        Server::start_with(10, true, Some(certificates))
    }

    fn start_with(max_prepared_transactions: u32, logical: bool, tls: Option<&Path>) -> Server {
        let mut failures = Vec::new();
        while failures.len() < START_ATTEMPTS {
            match Server::try_start(max_prepared_transactions, logical, tls) {
                Ok(server) => return server,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("no PostgreSQL cluster started in {START_ATTEMPTS} attempts: {failures:#?}");
    }

    fn try_start(max_prepared_transactions: u32, logical: bool, tls: Option<&Path>) -> Result<Server, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = server_binaries();
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let server = Server { dir, bin, port, tls: tls.is_some() };
        let root = server.dir.path();
        std::fs::write(root.join("password"), PASSWORD).expect("write the password file");
        if running_as_root() {
            let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(root).status().expect("chown");
            assert!(chown.success(), "cannot give {} to the postgres user", root.display());
        }
        let data = root.join("data").to_string_lossy().into_owned();
        let password_file = root.join("password").to_string_lossy().into_owned();
        let initdb = server.as_owner(
            &server.bin.join("initdb"),
            &[
                "-D",
                &data,
                "-U",
                "sluice",
                "--auth=scram-sha-256",
                "--pwfile",
                &password_file,
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        if !initdb.status.success() {
            return Err(format!("initdb failed: {}", stderr(&initdb)));
        }
        let mut settings = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_prepared_transactions={max_prepared_transactions} -c fsync=off",
            root.display()
        );
        if logical {
            settings.push_str(" -c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8");
        }
        if let Some(certificates) = tls {
            server.tls_only(certificates);
            settings.push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        let log = root.join("server.log").to_string_lossy().into_owned();
        let started = server.as_owner(
            &server.bin.join("pg_ctl"),
            &["-D", &data, "-w", "-t", "120", "-l", &log, "-o", &settings, "start"],
        );
        if !started.status.success() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("pg_ctl start failed: {}\n{log}", stderr(&started)));
        }
        Ok(server)
    }

    /// The certificate and key into the data directory (the key readable by its owner
    /// only, as the server demands), and a pg_hba.conf allowing TLS only over TCP.
    fn tls_only(&self, certificates: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let data = self.dir.path().join("data");
        for file in ["server.crt", "server.key"] {
            std::fs::copy(certificates.join(file), data.join(file)).unwrap_or_else(|e| panic!("copy {file}: {e}"));
        }
        std::fs::set_permissions(data.join("server.key"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let hba = "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n";
        std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        if running_as_root() {
            let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data).status().expect("chown");
            assert!(chown.success(), "cannot give {} to the postgres user", data.display());
        }
    }

    /// Runs `program ARGS` as the cluster's owner (the `postgres` user when root).
    fn as_owner(&self, program: &Path, args: &[&str]) -> Output {
        let mut command = if running_as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
    }

    /// The `url` option for this server (the password comes from the environment).
    pub(crate) fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=sluice dbname=postgres", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn client(&self) -> postgres::Client {
        let host = match self.tls {
            true => self.dir.path().to_string_lossy().into_owned(),
            false => "127.0.0.1".to_owned(),
        };
        postgres::Config::new()
            .host(&host)
            .port(self.port)
            .user("sluice")
            .password(PASSWORD)
            .dbname("postgres")
            .connect(postgres::NoTls)
            .expect("connect to the test server")
    }

    pub(crate) fn execute(&self, sql: &str) {
        self.client().batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Every row of `table` as text, sorted.
    pub(crate) fn rows(&self, table: &str) -> Vec<String> {
        let sql = format!("SELECT t::text FROM {table} t");
        let mut rows: Vec<String> =
            self.client().query(sql.as_str(), &[]).expect("read the table").iter().map(|row| row.get(0)).collect();
        rows.sort();
        rows
    }

    pub(crate) fn count(&self, sql: &str) -> i64 {
        self.client().query_one(sql, &[]).expect("count").get(0)
    }
}

/// `sluice run` of the scratch's pipeline with the password in the environment.
pub(crate) fn run(scratch: &Scratch, threads: u32, failpoints: Option<&str>) -> Output {
    let mut command = sluice_command(scratch.dir.path());
    command.args(["--log-level", "info", "run", "pipeline.toml", "--threads", &threads.to_string()]);
    command.env(PASSWORD_VARIABLE, PASSWORD);
    if let Some(failpoints) = failpoints {
        command.env("SLUICE_FAILPOINTS", failpoints);
    }
    command.output().expect("run sluice")
}

/// `n` events: key `k{i % 5}`, value `i`, one a millisecond.
fn events(n: usize) -> String {
    (0..n).map(|i| format!("{{\"k\":\"k{}\",\"v\":{i},\"ts\":{i}}}\n", i % 5)).collect()
}

fn source(batch_size: usize, checkpoints: bool) -> String {
    let checkpoint = if checkpoints { "[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n" } else { "" };
    format!(
        "[pipeline]\nname = \"pg\"\nbatch_size = {batch_size}\n\n{checkpoint}[[source]]\nname = \"events\"\nconnector = \"file\"\n\
         format = \"json\"\nschema = \"k VARCHAR, v BIGINT, ts TIMESTAMP(3)\"\nevent_time = \"ts\"\n\
         [source.options]\npath = \"events.jsonl\"\nsplit_bytes = 300\n\n"
    )
}

fn sink(server: &Server, name: &str, from: &str, options: &str) -> String {
    format!(
        "[[sink]]\nname = \"{name}\"\nfrom = \"{from}\"\nconnector = \"postgres\"\n[sink.options]\nurl = \"{}\"\n\
         password_env = \"{PASSWORD_VARIABLE}\"\n{options}\n",
        server.url()
    )
}

const COPIES: &str = "[[view]]\nname = \"copies\"\nsql = \"SELECT k, v, ts FROM events WHERE v % 2 = 0\"\n\n";
const COUNTS: &str = "[[view]]\nname = \"counts\"\n\
    sql = \"SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k HAVING COUNT(*) <= 6\"\n\n";

/// The rows of `copies` as PostgreSQL prints them.
fn expected_copies(n: usize) -> Vec<String> {
    let mut rows: Vec<String> = (0..n)
        .filter(|i| i % 2 == 0)
        .map(|i| {
            format!(
                "(k{},{i},\"1970-01-01 00:00:00{}\")",
                i % 5,
                if i == 0 { String::new() } else { format!(".{i:03}").trim_end_matches('0').to_owned() }
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The rows of `counts`: keys with at most six events (the others were deleted when
/// their seventh arrived).
fn expected_counts(n: usize) -> Vec<String> {
    let mut groups: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for i in 0..n {
        let entry = groups.entry(i % 5).or_default();
        *entry = (entry.0 + 1, entry.1 + i);
    }
    groups.into_iter().filter(|(_, (n, _))| *n <= 6).map(|(k, (n, total))| format!("(k{k},{n},{total})")).collect()
}

#[test]
fn an_append_only_pipeline_fills_a_created_table() {
    let server = Server::start(10);
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(40));
    let pipeline = format!(
        "{}{COPIES}{}",
        source(3, false),
        sink(&server, "out", "copies", "table = \"copies\"\ncreate_table = true\nbatch_rows = 4")
    );
    scratch.write("pipeline.toml", &pipeline);
    let output = run(&scratch, 2, None);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    assert_eq!(server.rows("copies"), expected_copies(40));
    let types = server.rows("(SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'copies'::regclass AND attnum > 0) ");
    assert_eq!(types, ["(\"timestamp(3) without time zone\")", "(bigint)", "(text)"]);
    // The sink counts the values it sent as text (writer.rs, "Bytes"): `k…`, `v`, and the
    // timestamp as Arrow prints it (`1970-01-01T00:00:00.002`, no fraction at 0).
    let sent: usize = (0..40usize)
        .filter(|i| i % 2 == 0)
        .map(|i| format!("k{}", i % 5).len() + i.to_string().len() + if i == 0 { 19 } else { 23 })
        .sum();
    let report = stderr(&output);
    let counted: usize = report
        .lines()
        .find_map(|line| line.trim().strip_prefix("sink out: 20 rows out, ")?.strip_suffix(" bytes")?.parse().ok())
        .unwrap_or_else(|| panic!("no bytes on the sink's line:\n{report}"));
    assert!(counted > 0, "{report}");
    assert_eq!(counted, sent, "{report}");
}

#[test]
fn a_running_count_upserts_and_deletes_to_the_final_counts() {
    let server = Server::start(10);
    let scratch = Scratch::new();
    // 33 events: keys k0..k2 get 7 (their rows are deleted at the seventh), k3, k4 get 6.
    scratch.write("events.jsonl", &events(33));
    let pipeline = format!(
        "{}{COUNTS}{}",
        source(2, false),
        sink(&server, "out", "counts", "table = \"counts\"\ncreate_table = true")
    );
    scratch.write("pipeline.toml", &pipeline);
    let output = run(&scratch, 2, None);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    let expected = expected_counts(33);
    assert_eq!(expected.len(), 2, "some keys are deleted, some stay");
    assert_eq!(server.rows("counts"), expected);
}

/// Exactly-once across a SIGKILL: right after manifest 3 is published (its prepared
/// transactions not yet committed: the restart commits them), and right after the state
/// of a checkpoint is written (its prepared transactions are never committed: the
/// restart rolls them back). Both tables end as an uninterrupted run's.
#[test]
fn exactly_once_into_tables_survives_a_kill_at_checkpoint_steps() {
    let server = Server::start(10);
    let sinks = |suffix: &str| {
        format!(
            "{}{}",
            sink(&server, "copied", "copies", &format!("table = \"copies{suffix}\"\ncreate_table = true")),
            sink(&server, "counted", "counts", &format!("table = \"counts{suffix}\"\ncreate_table = true"))
        )
    };
    let uninterrupted = Scratch::new();
    uninterrupted.write("events.jsonl", &events(33));
    uninterrupted.write("pipeline.toml", &format!("{}{COPIES}{COUNTS}{}", source(2, true), sinks("_whole")));
    // One epoch per batch, as in the killed runs.
    let output = run(&uninterrupted, 2, Some("source.barrier_after_batch=return"));
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    assert_eq!(server.rows("copies_whole"), expected_copies(33));
    assert_eq!(server.rows("counts_whole"), expected_counts(33));
    let recorded = server.count("SELECT count(DISTINCT epoch) FROM sluice_sink_epochs WHERE sink = 'pg/copied'");
    assert!(recorded >= 3, "the bookkeeping table holds the committed epochs: {recorded}");
    for (index, point) in ["checkpoint.after_publish", "checkpoint.after_state_written"].iter().enumerate() {
        let scratch = Scratch::new();
        scratch.write("events.jsonl", &events(33));
        let suffix = format!("_killed{index}");
        scratch.write("pipeline.toml", &format!("{}{COPIES}{COUNTS}{}", source(2, true), sinks(&suffix)));
        let failpoints = format!("source.barrier_after_batch=return;{point}=2*off->return(kill)");
        let crashed = run(&scratch, 2, Some(&failpoints));
        assert_eq!(crashed.status.signal(), Some(9), "killed at {point}:\n{}", stderr(&crashed));
        let prepared = server.count("SELECT count(*) FROM pg_prepared_xacts");
        assert!(prepared > 0, "{point}: the killed run left prepared transactions");
        let restarted = run(&scratch, 1, None);
        let log = stderr(&restarted);
        assert!(restarted.status.success(), "restart after {point} failed:\n{log}");
        assert!(log.contains("resuming from checkpoint"), "{point}: {log}");
        assert_eq!(server.rows(&format!("copies{suffix}")), server.rows("copies_whole"), "{point}");
        assert_eq!(server.rows(&format!("counts{suffix}")), server.rows("counts_whole"), "{point}");
        assert_eq!(server.count("SELECT count(*) FROM pg_prepared_xacts"), 0, "{point}: nothing is left prepared");
    }
}

#[test]
fn bad_credentials_tables_columns_rows_and_servers_are_clear_errors() {
    let server = Server::start(10);
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(10));
    let check = |options: &str, needles: &[&str]| {
        let pipeline = format!("{}{COPIES}{}", source(4, false), sink(&server, "out", "copies", options));
        scratch.write("pipeline.toml", &pipeline);
        let output = run(&scratch, 1, None);
        assert_fails_with(&output, needles);
        assert!(!stderr(&output).contains(PASSWORD), "the password never shows:\n{}", stderr(&output));
    };
    check("table = \"missing\"", &["table missing does not exist", "create_table = true", "CREATE TABLE"]);
    server.execute("CREATE TABLE wrong (k text, value bigint, ts timestamp)");
    check("table = \"wrong\"", &["table wrong does not match the stream", "column v (stream type Int64) is missing"]);
    server.execute("CREATE TABLE short (k varchar(1), v bigint, ts timestamp)");
    check("table = \"short\"", &["table short rejected the row (k='k", "character varying(1)"]);
    server.execute("CREATE TABLE typed (k text, v boolean, ts timestamp)");
    check("table = \"typed\"", &["column v is boolean in the table but Int64 in the stream"]);
    // A wrong password, through the variable.
    let pipeline =
        format!("{}{COPIES}{}", source(4, false), sink(&server, "out", "copies", "table = \"t\"\ncreate_table = true"));
    scratch.write("pipeline.toml", &pipeline);
    let output = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env(PASSWORD_VARIABLE, "not-the-password")
        .output()
        .expect("run sluice");
    assert_fails_with(&output, &["refused the credentials", "password_env"]);
    assert!(!stderr(&output).contains("not-the-password"));
    let output = sluice_command(scratch.dir.path())
        .args(["run", "pipeline.toml"])
        .env_remove(PASSWORD_VARIABLE)
        .output()
        .expect("run");
    assert_fails_with(&output, &[PASSWORD_VARIABLE, "not set"]);
    // No server at all.
    let closed = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let pipeline =
        format!("{}{COPIES}{}", source(4, false), sink(&server, "out", "copies", "table = \"t\"\ncreate_table = true"))
            .replace(&format!("port={}", server.port), &format!("port={closed}"));
    scratch.write("pipeline.toml", &pipeline);
    assert_fails_with(&run(&scratch, 1, None), &["cannot reach PostgreSQL at 127.0.0.1:", "is running"]);
    // An updating stream in append mode is refused when planned.
    let pipeline =
        format!("{}{COUNTS}{}", source(4, false), sink(&server, "out", "counts", "table = \"c\"\nmode = \"append\""));
    scratch.write("pipeline.toml", &pipeline);
    assert_fails_with(&run(&scratch, 1, None), &["mode = \"append\"", "updating stream", "mode = \"upsert\""]);
}

#[test]
fn exactly_once_without_two_phase_commit_names_the_setting() {
    let server = Server::start(0);
    let scratch = Scratch::new();
    scratch.write("events.jsonl", &events(10));
    let pipeline = format!(
        "{}{COPIES}{}",
        source(4, true),
        sink(&server, "out", "copies", "table = \"copies\"\ncreate_table = true")
    );
    scratch.write("pipeline.toml", &pipeline);
    assert_fails_with(&run(&scratch, 1, None), &["max_prepared_transactions = 0", "at-least-once"]);
    // At-least-once needs no prepared transaction.
    scratch
        .write("pipeline.toml", &pipeline.replace("[checkpoint]\n", "[checkpoint]\nguarantee = \"at-least-once\"\n"));
    let output = run(&scratch, 1, None);
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    assert_eq!(server.rows("copies"), expected_copies(10));
}

/// Changes of `orders (id, customer, amount)`, as a changelog file: 60 changes of 8 keys
/// from a fixed pseudo-random sequence (inserts, updates moving an order between 3
/// customers, deletes), and the table they leave.
fn order_changes() -> (String, BTreeMap<u64, (String, u64)>) {
    let mut state = 7u64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut table: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut lines = String::new();
    let line = |op: &str, id: u64, (customer, amount): &(String, u64)| {
        format!("{{\"op\":\"{op}\",\"id\":{id},\"customer\":\"{customer}\",\"amount\":{amount}}}\n")
    };
    for _ in 0..60 {
        let id = next() % 8;
        let row = (format!("c{}", next() % 3), next() % 100);
        match table.get(&id).cloned() {
            None => lines.push_str(&line("+I", id, &row)),
            Some(old) if next() % 4 == 0 => {
                lines.push_str(&line("-D", id, &old));
                table.remove(&id);
                continue;
            }
            Some(old) => {
                lines.push_str(&line("-U", id, &old));
                lines.push_str(&line("+U", id, &row));
            }
        }
        table.insert(id, row);
    }
    (lines, table)
}

/// Change data capture into PostgreSQL: a changelog (here a file of the file sink's
/// shape; a Debezium topic is read the same way) replicated into a table by its primary
/// key, and aggregated into another, uninterrupted and across a kill after a checkpoint
/// was published: each time both tables end as the changes' final table and its sums.
///
/// Exactly once, and each commit waits 30 ms after its manifest is published: an
/// epoch's `DELETE` of a key that the previous epoch inserted then runs while that
/// epoch's transaction is still prepared, which a `DELETE` alone neither sees nor waits
/// for (this test found `(5,c2,75)` left in `replica`); the writer waits for it.
#[test]
fn a_changelog_replicated_into_tables_ends_as_its_final_table_across_a_kill() {
    let server = Server::start(10);
    let (changes, table) = order_changes();
    let mut expected: Vec<String> =
        table.iter().map(|(id, (customer, amount))| format!("({id},{customer},{amount})")).collect();
    expected.sort();
    let mut sums: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (customer, amount) in table.values() {
        let entry = sums.entry(customer).or_default();
        *entry = (entry.0 + amount, entry.1 + 1);
    }
    let sums: Vec<String> = sums.iter().map(|(c, (total, n))| format!("({c},{total},{n})")).collect();
    let pipeline = |suffix: &str| {
        format!(
            "[pipeline]\nname = \"cdc{suffix}\"\nbatch_size = 4\nmini_batch_rows = 1\n\n\
             [checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n\
             [[source]]\nname = \"orders\"\nconnector = \"file\"\nformat = \"changelog-json\"\n\
             schema = \"id BIGINT NOT NULL, customer VARCHAR, amount BIGINT\"\nprimary_key = [\"id\"]\n\
             [source.options]\npath = \"orders.jsonl\"\n\n\
             [[view]]\nname = \"replica\"\nsql = \"SELECT id, customer, amount FROM orders\"\n\n\
             [[view]]\nname = \"totals\"\nsql = \"SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer\"\n\n{}{}",
            sink(&server, "replicated", "replica", &format!("table = \"replica{suffix}\"\ncreate_table = true")),
            sink(&server, "summed", "totals", &format!("table = \"totals{suffix}\"\ncreate_table = true")),
        )
    };
    let whole = Scratch::new();
    whole.write("orders.jsonl", &changes);
    whole.write("pipeline.toml", &pipeline("_whole"));
    let output = run(&whole, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=sleep(30)"));
    assert!(output.status.success(), "sluice failed:\n{}", stderr(&output));
    assert_eq!(server.rows("replica_whole"), expected, "uninterrupted");
    assert_eq!(server.rows("totals_whole"), sums, "uninterrupted");
    let scratch = Scratch::new();
    scratch.write("orders.jsonl", &changes);
    scratch.write("pipeline.toml", &pipeline("_killed"));
    let crashed =
        run(&scratch, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=3*sleep(30)->return(kill)"));
    assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
    let restarted = run(&scratch, 2, None);
    let log = stderr(&restarted);
    assert!(restarted.status.success(), "restart failed:\n{log}");
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert!(!log.contains("deletes of unknown keys"), "the keys' rows were restored:\n{log}");
    let crashed = stderr(&crashed);
    assert_eq!(server.rows("replica_killed"), expected, "killed:\n{crashed}\nrestarted:\n{log}");
    assert_eq!(server.rows("totals_killed"), sums, "killed:\n{crashed}\nrestarted:\n{log}");
}
