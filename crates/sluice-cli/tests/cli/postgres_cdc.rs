//! The `postgres-cdc` source against a real PostgreSQL (`wal_level = logical`, started by
//! `postgres::Server::start_logical`): the tables' snapshot and changes joined and
//! aggregated into a PostgreSQL sink, compared with the same query run by PostgreSQL on
//! the final tables; across a kill between a checkpoint and the slot's confirm, and
//! kills during the snapshot with rows changed before the restart (the slot kept, or
//! the restart refused when it is gone); a transaction open across a run's
//! checkpoints; a large transaction cut in pieces; TOAST values an update leaves
//! unchanged; and each refusal naming its setting.
//!
//! Every run is bounded (`bounded = true`: it ends once the changes committed before
//! the server's WAL position at its start are read), so tests wait for processes to
//! exit, never for time to pass.

use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use crate::harness::{Scratch, assert_fails_with, sluice_command, stderr, stdout};
use crate::postgres::{PASSWORD, PASSWORD_VARIABLE, Server, run};

/// The captured tables: customers (text columns: REPLICA IDENTITY FULL) and orders
/// (integers only: DEFAULT is enough), in one publication.
const SCHEMA: &str = "
    CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT NOT NULL, region TEXT);
    ALTER TABLE customers REPLICA IDENTITY FULL;
    CREATE TABLE orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, amount BIGINT NOT NULL);
    CREATE PUBLICATION shop FOR TABLE customers, orders;
    CREATE VIEW expected AS SELECT c.region, COUNT(*) AS orders, SUM(o.amount) AS total
        FROM orders o JOIN customers c ON o.customer = c.id GROUP BY c.region;
";

const SNAPSHOT_ROWS: &str = "
    INSERT INTO customers VALUES (1, 'ada', 'east'), (2, 'bob', 'west'), (3, 'cy', 'east');
    INSERT INTO orders SELECT i, 1 + i % 3, i * 10 FROM generate_series(1, 30) AS i;
";

/// Inserts, updates (of amounts, of a customer's region, of an order's customer) and
/// deletes, several in one transaction across both tables.
const CHANGES: &str = "
    INSERT INTO customers VALUES (4, 'dee', 'north');
    INSERT INTO orders VALUES (31, 4, 500), (32, 4, 7);
    BEGIN;
    UPDATE customers SET region = 'west' WHERE id = 3;
    UPDATE orders SET amount = amount + 1 WHERE id % 4 = 0;
    DELETE FROM orders WHERE id IN (5, 6, 7);
    COMMIT;
    UPDATE orders SET customer = 2 WHERE id = 32;
    DELETE FROM customers WHERE id = 4;
    DELETE FROM orders WHERE id = 31;
    INSERT INTO orders SELECT i, 1 + i % 4, i FROM generate_series(40, 60) AS i;
    UPDATE customers SET name = 'ada lovelace' WHERE id = 1;
";

/// The sums by region as a view of the captured tables, upserted into `table`.
fn pipeline(server: &Server, table: &str, source_options: &str) -> String {
    format!(
        "[pipeline]\nname = \"cdc_{table}\"\nbatch_size = 8\nmini_batch_rows = 1\n\n\
         [checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n\
         [[source]]\nname = \"shop\"\nconnector = \"postgres-cdc\"\n[source.options]\nurl = \"{url}\"\n\
         password_env = \"{PASSWORD_VARIABLE}\"\ntables = [\"customers\", \"public.orders\"]\npublication = \"shop\"\n\
         slot = \"slot_{table}\"\nbounded = true\n{source_options}\n\
         [[view]]\nname = \"totals\"\nsql = \"\"\"SELECT c.region, COUNT(*) AS orders, SUM(o.amount) AS total\n\
         FROM orders o JOIN customers c ON o.customer = c.id GROUP BY c.region\"\"\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"totals\"\nconnector = \"postgres\"\n[sink.options]\nurl = \"{url}\"\n\
         password_env = \"{PASSWORD_VARIABLE}\"\ntable = \"{table}\"\ncreate_table = true\n",
        url = server.url(),
    )
}

impl Server {
    /// The LSN `expression` gives, as a number.
    fn lsn(&self, expression: &str) -> i64 {
        self.count(&format!("SELECT ({expression} - '0/0')::bigint"))
    }

    /// Returns once `slot`'s confirmed position reaches `lsn` (a checkpoint holding the
    /// changes up to it was committed), failing after 10 s of 10 ms waits.
    fn wait_confirmed(&self, slot: &str, lsn: i64) {
        let mut client = self.client();
        let query = "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1";
        for _ in 0..1000 {
            let confirmed: i64 = client.query_one(query, &[&slot]).expect("the slot").get(0);
            if confirmed >= lsn {
                return;
            }
            client.batch_execute("SELECT pg_sleep(0.01)").expect("wait for the slot");
        }
        panic!("slot {slot} never confirmed {lsn:x}");
    }

    /// The confirmed position of `slot` once no session holds it (its walsender, which
    /// applies the last status update it read, exited).
    fn slot_confirmed(&self, slot: &str) -> i64 {
        let mut client = self.client();
        let query =
            "SELECT active, (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1";
        for _ in 0..1000 {
            let row = client.query_one(query, &[&slot]).expect("the slot");
            if !row.get::<_, bool>(0) {
                return row.get(1);
            }
            client.batch_execute("SELECT pg_sleep(0.01)").expect("wait for the walsender");
        }
        panic!("slot {slot} is still held by a session");
    }
}

/// A run that must succeed; its log.
fn run_ok(scratch: &Scratch, failpoints: Option<&str>) -> String {
    let output = run(scratch, 2, failpoints);
    let log = stderr(&output);
    assert!(output.status.success(), "sluice failed:\n{log}");
    log
}

#[test]
fn two_tables_joined_and_aggregated_end_as_postgresql_computes_them() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "totals", ""));
    let mut command = sluice_command(scratch.dir.path());
    let explain =
        command.args(["explain", "pipeline.toml"]).env(PASSWORD_VARIABLE, PASSWORD).output().expect("run sluice");
    let plan = stdout(&explain);
    assert!(explain.status.success(), "explain failed:\n{}", stderr(&explain));
    assert!(plan.contains("pgoutput, updating, primary key [id]"), "{plan}");
    let first = run_ok(&scratch, None);
    assert!(first.contains("slot created"), "{first}");
    assert_eq!(server.rows("totals"), server.rows("expected"), "after the snapshot:\n{first}");
    let before_changes = server.lsn("pg_current_wal_lsn()");
    server.execute(CHANGES);
    let log = run_ok(&scratch, None);
    let log = format!("{first}\n{log}");
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert_eq!(server.rows("totals"), server.rows("expected"), "after the changes:\n{log}");
    assert!(!log.contains("duplicate inserts"), "{log}");
    assert!(!log.contains("deletes of unknown keys"), "{log}");
    // The slot confirmed the committed checkpoint, past the changes: the server may
    // recycle their WAL.
    let confirmed = server.slot_confirmed("slot_totals");
    assert!(confirmed > before_changes, "confirmed {confirmed:x}, changes from {before_changes:x}:\n{log}");
}

/// An unbounded run follows the changes as they commit: once the slot confirms a
/// position inside the last transaction of changes, a committed checkpoint holds them,
/// and the sink's table is PostgreSQL's answer. SIGTERM then ends the run cleanly.
#[test]
fn an_unbounded_run_follows_commits_and_stops_on_sigterm() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "live", "").replace("bounded = true\n", ""));
    let mut child = sluice_command(scratch.dir.path())
        .args(["--log-level", "info", "run", "pipeline.toml"])
        .env(PASSWORD_VARIABLE, PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    while !seen.contains("streaming changes") {
        let read = log.read_line(&mut seen).expect("the log");
        assert!(read > 0, "the run ended before streaming:\n{seen}");
    }
    // The rest of the log, read as it comes so that the pipe never fills.
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut log, &mut rest).expect("the log");
        rest
    });
    let mut client = server.client();
    client.batch_execute(CHANGES).expect("the changes");
    let mut last = client.transaction().expect("a transaction");
    last.batch_execute("UPDATE orders SET amount = amount + 1000 WHERE id = 2").expect("an update");
    let inside: i64 = last.query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[]).expect("lsn").get(0);
    last.commit().expect("commit");
    server.wait_confirmed("slot_live", inside);
    assert_eq!(server.rows("live"), server.rows("expected"), "{seen}");
    let killed = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(killed.expect("kill").success());
    let status = child.wait().expect("wait for sluice");
    let rest = rest.join().expect("the log's reader");
    assert!(status.success(), "SIGTERM:\n{seen}{rest}");
    assert!(rest.contains("final checkpoint"), "{rest}");
}

/// Killed right after a checkpoint is published, before the sources are told it is
/// committed (so before the slot confirms it): the restart reads the stream again from
/// the slot, drops what the checkpoint holds, and ends as the uninterrupted run. With a
/// memory budget of 0 (`state_memory_mib = 0`), so that the normalizations' keys and
/// rows, the join's rows and the aggregate's groups go to disk and come back from it,
/// through the checkpoints, the kill and the restore.
#[test]
fn a_kill_between_a_checkpoint_and_the_slot_s_confirm_changes_nothing() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    let spilled =
        pipeline(&server, "killed", "").replace("mini_batch_rows = 1\n", "mini_batch_rows = 1\nstate_memory_mib = 0\n");
    assert!(spilled.contains("state_memory_mib = 0"));
    scratch.write("pipeline.toml", &spilled);
    run_ok(&scratch, None);
    server.execute(CHANGES);
    let crashed =
        run(&scratch, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=2*sleep(30)->return(kill)"));
    assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
    let log = run_ok(&scratch, Some("checkpoint.after_publish=sleep(30)"));
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert!(log.contains("state bytes written to spill files"), "the state went to disk:\n{log}");
    assert!(!log.contains("duplicate inserts"), "nothing read twice:\n{log}");
    assert!(!log.contains("deletes of unknown keys"), "{log}");
    assert_eq!(server.rows("killed"), server.rows("expected"), "killed:\n{}\nrestarted:\n{log}", stderr(&crashed));
}

/// Killed after a checkpoint taken during the snapshot: the snapshot cannot be resumed
/// (it lived in the killed session), so the restart keeps the slot, reads a new one and
/// streams from the first one's point; the rows read twice are applied as updates of
/// their keys.
#[test]
fn a_kill_during_the_snapshot_reads_it_again() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "again", ""));
    let crashed =
        run(&scratch, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=2*sleep(30)->return(kill)"));
    assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
    let log = run_ok(&scratch, Some("checkpoint.after_publish=sleep(30)"));
    assert!(log.contains("the run stopped during its snapshot"), "{log}");
    assert_eq!(server.rows("again"), server.rows("expected"), "killed:\n{}\nrestarted:\n{log}", stderr(&crashed));
    server.execute(CHANGES);
    let log = run_ok(&scratch, None);
    assert_eq!(server.rows("again"), server.rows("expected"), "after the changes:\n{log}");
}

/// Changes made while a run killed during its snapshot is down, to rows its snapshot
/// returned before the kill (the customers, read first, and the first orders): deletes
/// (of a customer, whose orders then join nothing, and of orders), updates, a key
/// deleted and inserted again in one transaction and in two, and new rows.
const BETWEEN: &str = "
    DELETE FROM customers WHERE id = 1;
    DELETE FROM orders WHERE id IN (2, 3);
    UPDATE orders SET amount = 1000 WHERE id = 4;
    UPDATE customers SET region = 'south' WHERE id = 2;
    BEGIN;
    DELETE FROM orders WHERE id = 8;
    INSERT INTO orders VALUES (8, 3, 8000);
    COMMIT;
    DELETE FROM orders WHERE id = 9;
    INSERT INTO orders VALUES (9, 2, 9);
    INSERT INTO customers VALUES (5, 'eve', 'north');
    INSERT INTO orders VALUES (70, 5, 70), (71, 1, 71);
";

/// Changes made while the restart of [`BETWEEN`] is itself killed during its snapshot.
const BETWEEN_AGAIN: &str = "
    DELETE FROM orders WHERE id IN (10, 11);
    UPDATE customers SET region = 'east' WHERE id = 5;
    UPDATE orders SET customer = 3 WHERE id = 12;
";

/// For each of `betweens`: kills a run of `scratch`'s pipeline right after its
/// checkpoint number `killed_at` is published, during the snapshot (one checkpoint per
/// batch), and runs that SQL on the server. Then restarts, checks the sink's `table`
/// against PostgreSQL's answer, and again after [`CHANGES`]. Returns the restart's log.
fn check_kill_during_the_snapshot(
    server: &Server,
    scratch: &Scratch,
    table: &str,
    killed_at: u32,
    betweens: &[&str],
) -> String {
    let failpoints =
        format!("source.barrier_after_batch=return;checkpoint.after_publish={}*sleep(30)->return(kill)", killed_at - 1);
    let mut crashes = String::new();
    for between in betweens {
        let crashed = run(scratch, 2, Some(&failpoints));
        assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
        let crashed = stderr(&crashed);
        assert!(!crashed.contains("streaming changes"), "killed during the snapshot:\n{crashed}");
        // The checkpoint before the killed one is committed: rows of the snapshot, the
        // customers among them, reached the sink, so `between` changes rows returned.
        let sunk = server.count(&format!("SELECT COUNT(*) FROM {table}"));
        assert!(sunk > 0, "nothing of the snapshot reached the sink before the kill:\n{crashed}");
        server.execute(between);
        crashes.push_str(&crashed);
    }
    let log = run_ok(scratch, Some("checkpoint.after_publish=sleep(30)"));
    assert!(log.contains("the run stopped during its snapshot"), "{log}");
    assert_eq!(server.rows(table), server.rows("expected"), "killed:\n{crashes}\nrestarted:\n{log}");
    server.execute(CHANGES);
    let after = run_ok(scratch, None);
    assert_eq!(server.rows(table), server.rows("expected"), "after the changes:\n{after}");
    log
}

/// Killed during the snapshot, and rows it returned are deleted, updated, deleted and
/// inserted again before the restart, which is itself killed during its snapshot and
/// followed by more changes: a new snapshot alone would keep the deleted rows (issue
/// 28); the slot's changes since the first snapshot delete them.
#[test]
fn rows_deleted_between_a_kill_during_the_snapshot_and_its_restart_are_deleted() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    server.execute("INSERT INTO orders SELECT i, 1 + i % 3, i FROM generate_series(100, 299) AS i");
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "between", ""));
    let log = check_kill_during_the_snapshot(&server, &scratch, "between", 4, &[BETWEEN, BETWEEN_AGAIN]);
    assert!(log.contains("applied again"), "the restart says why anomalies may be counted:\n{log}");
}

/// Restarted from a checkpoint taken during the snapshot, the source needs the slot that
/// snapshot was taken at (its changes since say which rows returned were deleted):
/// without it, or with a slot of that name created again, the restart is refused.
#[test]
fn a_restart_during_the_snapshot_without_its_slot_is_refused() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "gone", ""));
    let crashed =
        run(&scratch, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=2*sleep(30)->return(kill)"));
    assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
    // Once its walsender exited, the slot can be dropped.
    server.slot_confirmed("slot_gone");
    server.execute("SELECT pg_drop_replication_slot('slot_gone')");
    let fix = "pg_drop_replication_slot('slot_gone')";
    assert_fails_with(&run(&scratch, 1, None), &["stopped during its snapshot", "has no slot `slot_gone`", "afresh"]);
    server.execute("SELECT pg_create_logical_replication_slot('slot_gone', 'pgoutput')");
    assert_fails_with(&run(&scratch, 1, None), &["stopped during its snapshot", "created again", fix]);
}

/// Three lanes read parts of the snapshot on two threads, killed in the middle; rows
/// they returned are changed before the restart, which reads a new snapshot in parts
/// again; the stream (from the first snapshot's point) starts once a committed
/// checkpoint holds every part, and the changes after follow.
#[test]
fn a_snapshot_read_in_parallel_lanes_ends_as_postgresql_computes() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    server.execute("INSERT INTO orders SELECT i, 1 + i % 3, i FROM generate_series(1000, 3999) AS i");
    let scratch = Scratch::new();
    scratch.write(
        "pipeline.toml",
        &pipeline(&server, "parts", "snapshot_lanes = 3").replace("batch_size = 8", "batch_size = 64"),
    );
    let log = check_kill_during_the_snapshot(&server, &scratch, "parts", 5, &[BETWEEN]);
    assert!(log.contains("snapshot part read"), "{log}");
}

/// A transaction open while a run reads and checkpoints (its first rows are in the WAL
/// before the run's end, its commit after): the next run gets it whole. And a
/// transaction larger than `transaction_rows_max`, cut in pieces with a barrier after
/// each, killed after a checkpoint inside it: the restart skips the changes already out.
#[test]
fn transactions_spanning_checkpoints_arrive_whole_and_once() {
    let server = Server::start_logical();
    server.execute(SCHEMA);
    server.execute(SNAPSHOT_ROWS);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&server, "long", "transaction_rows_max = 5"));
    run_ok(&scratch, None);
    let mut open = server.client();
    open.batch_execute("BEGIN; INSERT INTO orders SELECT i, 2, 1 FROM generate_series(100, 140) AS i;").unwrap();
    server.execute("UPDATE orders SET amount = 0 WHERE id = 1");
    let log = run_ok(&scratch, Some("source.barrier_after_batch=return"));
    assert_eq!(server.rows("long"), server.rows("expected"), "the open transaction is not seen yet:\n{log}");
    open.batch_execute("UPDATE orders SET amount = 2 WHERE id >= 100; COMMIT;").unwrap();
    let crashed =
        run(&scratch, 2, Some("source.barrier_after_batch=return;checkpoint.after_publish=3*sleep(30)->return(kill)"));
    assert_eq!(crashed.status.signal(), Some(9), "killed after a publish:\n{}", stderr(&crashed));
    let crashed = stderr(&crashed);
    assert!(crashed.contains("larger than transaction_rows_max is returned in pieces"), "{crashed}");
    let log = run_ok(&scratch, Some("checkpoint.after_publish=sleep(30)"));
    assert!(!log.contains("duplicate inserts"), "nothing read twice:\n{log}");
    assert_eq!(server.rows("long"), server.rows("expected"), "killed:\n{crashed}\nrestarted:\n{log}");
}

/// A value stored out of line (TOAST) that an update leaves unchanged is not sent; the
/// FULL old image gives it back.
#[test]
fn unchanged_toast_values_keep_their_value() {
    let server = Server::start_logical();
    server.execute(
        "CREATE TABLE docs (id BIGINT PRIMARY KEY, body TEXT, n INT);
         ALTER TABLE docs REPLICA IDENTITY FULL;
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
         CREATE PUBLICATION docs FOR TABLE docs;
         INSERT INTO docs SELECT i, repeat(md5(i::text), 1000), 0 FROM generate_series(1, 3) AS i;",
    );
    let scratch = Scratch::new();
    let url = server.url();
    scratch.write(
        "pipeline.toml",
        &format!(
            "[pipeline]\nname = \"docs\"\n\n[checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n\
             [[source]]\nname = \"docs\"\nconnector = \"postgres-cdc\"\n[source.options]\nurl = \"{url}\"\n\
             password_env = \"{PASSWORD_VARIABLE}\"\ntables = [\"docs\"]\npublication = \"docs\"\nbounded = true\n\n\
             [[sink]]\nname = \"out\"\nfrom = \"docs\"\nconnector = \"postgres\"\n[sink.options]\nurl = \"{url}\"\n\
             password_env = \"{PASSWORD_VARIABLE}\"\ntable = \"copy\"\ncreate_table = true\n"
        ),
    );
    run_ok(&scratch, None);
    server.execute(
        "UPDATE docs SET n = n + 1; UPDATE docs SET body = 'short' WHERE id = 3; UPDATE docs SET n = 7 WHERE id = 1;",
    );
    let log = run_ok(&scratch, None);
    assert_eq!(server.count("SELECT COUNT(*) FROM copy WHERE length(body) = 32000"), 2, "{log}");
    assert_eq!(server.rows("copy"), server.rows("docs"), "{log}");
}

#[test]
fn each_refusal_names_its_setting_and_the_fix() {
    let plain = Server::start(0);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline(&plain, "t", ""));
    assert_fails_with(&run(&scratch, 1, None), &["wal_level = replica", "wal_level = logical"]);

    let server = Server::start_logical();
    server.execute(
        "CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT NOT NULL, region TEXT);
         CREATE TABLE orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, amount BIGINT NOT NULL);",
    );
    scratch.write("pipeline.toml", &pipeline(&server, "t", ""));
    assert_fails_with(&run(&scratch, 1, None), &["no publication `shop`", "CREATE PUBLICATION \"shop\" FOR TABLE"]);
    server.execute("CREATE PUBLICATION shop FOR TABLE orders WITH (publish = 'insert')");
    assert_fails_with(&run(&scratch, 1, None), &["does not publish every insert, update and delete", "SET (publish"]);
    server.execute("ALTER PUBLICATION shop SET (publish = 'insert, update, delete'); ALTER PUBLICATION shop SET TABLE orders WHERE (amount > 0)");
    assert_fails_with(&run(&scratch, 1, None), &["publishes table orders with a row filter", "without WHERE"]);
    server.execute("ALTER PUBLICATION shop SET TABLE orders");
    assert_fails_with(&run(&scratch, 1, None), &["not in publication `shop`", "ALTER PUBLICATION \"shop\" ADD TABLE"]);
    server.execute("ALTER PUBLICATION shop ADD TABLE customers");
    assert_fails_with(&run(&scratch, 1, None), &["REPLICA IDENTITY DEFAULT", "name, region", "REPLICA IDENTITY FULL"]);
    server.execute("ALTER TABLE customers REPLICA IDENTITY NOTHING");
    assert_fails_with(&run(&scratch, 1, None), &["REPLICA IDENTITY NOTHING"]);
    server.execute("ALTER TABLE customers REPLICA IDENTITY FULL; ALTER TABLE orders DROP CONSTRAINT orders_pkey");
    assert_fails_with(&run(&scratch, 1, None), &["public.orders has no primary key", "ADD PRIMARY KEY"]);
    server.execute("ALTER TABLE orders ADD PRIMARY KEY (id)");

    let text = pipeline(&server, "t", "snapshot_lanes = 2")
        .replace("store = \"file://./state\"\n", "store = \"file://./state\"\nguarantee = \"at-least-once\"\n");
    scratch.write("pipeline.toml", &text);
    assert_fails_with(&run(&scratch, 1, None), &["snapshot_lanes = 2 needs exactly-once checkpoints", "guarantee"]);

    scratch.write("pipeline.toml", &pipeline(&server, "t", "create_slot = false"));
    assert_fails_with(&run(&scratch, 1, None), &["no replication slot `slot_t`", "pg_create_logical_replication_slot"]);

    // A schema change of a captured table between two runs: the restart stops naming it.
    scratch.write("pipeline.toml", &pipeline(&server, "t", ""));
    server.execute("INSERT INTO customers VALUES (1, 'ada', 'east'); INSERT INTO orders VALUES (1, 1, 5);");
    run_ok(&scratch, None);
    server.execute("ALTER TABLE orders ADD COLUMN note BIGINT; INSERT INTO orders VALUES (2, 1, 6, 9);");
    let needles = ["table public.orders changed since the checkpoint", "column `note` added", "revert the change"];
    assert_fails_with(&run(&scratch, 1, None), &needles);
    // Seen in the stream: a slot whose changes predate the catalog read at planning.
    let stream = Scratch::new();
    server.execute(
        "SELECT pg_create_logical_replication_slot('manual', 'pgoutput'); \
         INSERT INTO orders VALUES (3, 1, 7, 9); ALTER TABLE orders DROP COLUMN note; INSERT INTO orders VALUES (4, 1, 8);",
    );
    let text = pipeline(&server, "t", "create_slot = false").replace("slot = \"slot_t\"", "slot = \"manual\"");
    stream.write("pipeline.toml", &text);
    assert_fails_with(&run(&stream, 1, None), &["table public.orders changed while captured", "column `note` added"]);

    // A value its Arrow column cannot hold stops the run naming the table, column and value.
    server.execute(
        "CREATE TABLE prices (id BIGINT PRIMARY KEY, price NUMERIC(10, 2)); ALTER TABLE prices REPLICA IDENTITY FULL; CREATE PUBLICATION prices FOR TABLE prices; \
         INSERT INTO prices VALUES (1, 2.50), (2, 'NaN');",
    );
    let values = Scratch::new();
    // A fresh run (no checkpoint) over a slot that exists is refused, not a snapshot.
    values.write("pipeline.toml", &pipeline(&server, "t", ""));
    assert_fails_with(&run(&values, 1, None), &["slot `slot_t` exists", "pg_drop_replication_slot('slot_t')"]);
    let text = pipeline(&server, "pricecount", "")
        .replace("tables = [\"customers\", \"public.orders\"]", "tables = [\"prices\"]")
        .replace("publication = \"shop\"", "publication = \"prices\"")
        .replace("FROM orders o JOIN customers c ON o.customer = c.id GROUP BY c.region", "FROM prices p GROUP BY p.id")
        .replace("SELECT c.region, COUNT(*) AS orders, SUM(o.amount) AS total", "SELECT p.id, COUNT(*) AS n");
    values.write("pipeline.toml", &text);
    assert_fails_with(
        &run(&values, 1, None),
        &["table public.prices", "column `price` holds `NaN`, which does not fit"],
    );

    let unreachable = Scratch::new();
    let text = pipeline(&server, "t", "").replace(&server.url(), "host=127.0.0.1 port=1 user=sluice dbname=postgres");
    unreachable.write("pipeline.toml", &text);
    assert_fails_with(&run(&unreachable, 1, None), &["cannot connect to PostgreSQL at 127.0.0.1:1", "check `url`"]);
}
