//! Real clients against a running job's PostgreSQL endpoint: `psql` lists and describes
//! the materialized tables and queries them (the NOTICE names the checkpoint read; errors
//! carry their SQLSTATE and fix), a token makes SCRAM-SHA-256 authentication required,
//! and psycopg (PyPI) queries through the extended protocol with parameters, in text and
//! binary, discovers the tables through `information_schema`, and gets typed errors.

mod common;

use std::process::Command;

use common::{DEADLINE, ROWS, Served, TOTALS, stderr, stdout};

#[test]
fn psql_lists_describes_and_queries_the_materialized_tables() {
    let served = Served::start(None);
    let listed = served.psql(None, &["-A", "-t", "-c", r"\dt"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(stdout(&listed), "public|totals|table|sluice");

    let described = served.psql(None, &["-c", r"\d totals"]);
    assert!(described.status.success(), "{}", stderr(&described));
    let text = stdout(&described);
    assert!(text.contains(r#"Table "public.totals""#), "{text}");
    for column in [" k      | text ", " n      | bigint ", " total  | bigint "] {
        assert!(text.contains(column), "{column:?} not in\n{text}");
    }

    let queried = served.psql(None, &["-A", "-t", "-c", "SELECT k, n, total FROM totals ORDER BY k"]);
    assert!(queried.status.success(), "{}", stderr(&queried));
    assert_eq!(stdout(&queried), TOTALS);
    assert!(stderr(&queried).contains("NOTICE:  sluice: read at checkpoint "), "{}", stderr(&queried));
}

/// The same errors as `/query`, each with its SQLSTATE, the Sluice code and the fix.
#[test]
fn psql_shows_errors_with_their_sqlstate_and_fix() {
    let served = Served::start(None);
    let check = |sql: &str, expected: &[&str]| {
        let output = served.psql(None, &["-v", "VERBOSITY=verbose", "-c", sql]);
        assert!(!output.status.success(), "{sql} succeeded");
        let text = stderr(&output);
        for needle in expected {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
    };
    check(
        "SELECT * FROM nope",
        &[
            "ERROR:  42P01: no table `nope`",
            "sluice error code: query.unknown_table",
            "HINT:  name a materialized table",
        ],
    );
    check("SELECT * FROM ticks", &["ERROR:  42P01: no table `ticks`", "the materialized tables are: totals"]);
    check("INSERT INTO totals VALUES ('x', 1, 1)", &["ERROR:  25006: only queries are answered"]);
    check("SELEKT 1", &["ERROR:  42601: the SQL cannot be read"]);
    check("SET sluice.max_rows = 2; SELECT k FROM totals", &["ERROR:  54000: the answer has more than 2 rows"]);
    check("SET statement_timeout = '1h'", &["ERROR:  22023: statement_timeout"]);
    // The connection and the job go on answering.
    let after = served.psql(None, &["-A", "-t", "-c", "SELECT SUM(n) FROM totals"]);
    assert_eq!(stdout(&after), ROWS.to_string(), "{}", stderr(&after));
}

#[test]
fn with_a_token_only_its_password_gets_in() {
    let served = Served::start(Some("s3cret"));
    let refused = served.psql(Some("wrong"), &["-c", "SELECT 1"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).to_lowercase().contains("password authentication failed"), "{}", stderr(&refused));
    let without = served.psql(None, &["-c", "SELECT 1"]);
    assert_eq!(without.status.code(), Some(2), "{}", stderr(&without));
    let admitted = served.psql(Some("s3cret"), &["-A", "-t", "-c", "SELECT COUNT(*) FROM totals"]);
    assert!(admitted.status.success(), "{}", stderr(&admitted));
    assert_eq!(stdout(&admitted), "3");
}

/// With a certificate, TLS is served (`sslmode=require` gets in, SCRAM bound to the
/// channel when psql asks: `channel_binding=require`); without one, it is refused.
#[test]
fn tls_is_served_with_a_certificate() {
    let served = Served::start_tls(Some("s3cret"));
    let sql = ["-A", "-t", "-c", "SELECT COUNT(*) FROM totals"];
    let secured = common::psql_ssl(served.addr(), Some("s3cret"), "require", &sql);
    assert!(secured.status.success(), "{}", stderr(&secured));
    assert_eq!(stdout(&secured), "3");
    let bound = common::psql_command(served.addr(), Some("s3cret"), &sql)
        .env("PGSSLMODE", "require")
        .env("PGCHANNELBINDING", "require")
        .output()
        .expect("runs psql");
    assert!(bound.status.success(), "{}", stderr(&bound));
    let plain = Served::start(None);
    let refused = common::psql_ssl(plain.addr(), None, "require", &sql);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("server does not support SSL"), "{}", stderr(&refused));
}

/// rust-postgres prepares statements (Parse, then Describe of the statement: its
/// parameters' and columns' types before any value is bound) and sends its parameters
/// and asks for its results in the binary format.
#[test]
fn a_prepared_statement_is_described_then_bound_in_binary() {
    let served = Served::start(None);
    let addr = served.addr();
    let config = format!("host={} port={} user=sluice dbname=sluice connect_timeout=60", addr.ip(), addr.port());
    let mut client = postgres::Client::connect(&config, postgres::NoTls).expect("connects");
    let statement =
        client.prepare("SELECT k, n, total FROM totals WHERE n > $1 AND k <> $2 ORDER BY k").expect("prepared");
    assert_eq!(statement.params(), &[postgres::types::Type::INT8, postgres::types::Type::TEXT]);
    let columns: Vec<(&str, &postgres::types::Type)> =
        statement.columns().iter().map(|c| (c.name(), c.type_())).collect();
    assert_eq!(
        columns,
        [
            ("k", &postgres::types::Type::TEXT),
            ("n", &postgres::types::Type::INT8),
            ("total", &postgres::types::Type::INT8)
        ]
    );
    let rows = client.query(&statement, &[&5i64, &"b"]).expect("answered");
    let rows: Vec<(String, i64, i64)> = rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    assert_eq!(rows, [("a".to_string(), 10, 135), ("c".to_string(), 10, 155)]);
    // A catalog query with a parameter, prepared the same way.
    let tables = client
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = $1", &[&"public"])
        .expect("answered");
    assert_eq!(tables.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>(), ["totals"]);
    // The error of a query, from its Describe.
    let error = client.prepare("SELECT * FROM nope WHERE x = $1").expect_err("refused");
    assert_eq!(error.code(), Some(&postgres::error::SqlState::UNDEFINED_TABLE), "{error}");
}

/// psycopg's default connection: a transaction opened by BEGIN, queries through the
/// extended protocol with server-side parameters, text and binary results.
const PSYCOPG: &str = r#"
import json, sys
import psycopg

host, port, password = sys.argv[1], int(sys.argv[2]), sys.argv[3]
notices = []
out = {}
with psycopg.connect(host=host, port=port, user="sluice", password=password, dbname="sluice",
                     sslmode="disable", connect_timeout=60) as conn:
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    out["server_version"] = conn.info.server_version
    with conn.cursor() as cur:
        cur.execute("SELECT k, n, total FROM totals WHERE n >= %s AND k <> %s ORDER BY k", (1, "b"))
        out["text"] = [list(r) for r in cur.fetchall()]
    with conn.cursor(binary=True) as cur:
        cur.execute("SELECT k, n, CAST(total AS DOUBLE) AS t, n > %s AS big FROM totals ORDER BY k", (5,))
        out["binary"] = [list(r) for r in cur.fetchall()]
        out["columns"] = [c.name for c in cur.description]
    with conn.cursor() as cur:
        cur.execute("SELECT table_name, table_type FROM information_schema.tables "
                    "WHERE table_schema = 'public' ORDER BY table_name")
        out["tables"] = [list(r) for r in cur.fetchall()]
        cur.execute("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = %s ORDER BY ordinal_position", ("totals",))
        out["columns_of_totals"] = [list(r) for r in cur.fetchall()]
        try:
            cur.execute("SELECT * FROM nope WHERE x = %s", (1,))
        except psycopg.errors.UndefinedTable as e:
            out["error"] = [e.sqlstate, e.diag.message_primary, e.diag.message_hint]
    conn.rollback()
out["notices"] = notices
print(json.dumps(out))
"#;

#[test]
fn psycopg_queries_with_parameters_in_text_and_binary() {
    let served = Served::start(Some("s3cret"));
    let addr = served.addr();
    let output = Command::new("python3")
        .args(["-c", PSYCOPG, &addr.ip().to_string(), &addr.port().to_string(), "s3cret"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}); install psycopg: python3 -m pip install 'psycopg[binary]'")
        });
    assert!(
        output.status.success(),
        "psycopg failed (install it with: python3 -m pip install 'psycopg[binary]'): {}",
        stderr(&output)
    );
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(answer["server_version"], 150000);
    assert_eq!(answer["text"], serde_json::json!([["a", 10, 135], ["c", 10, 155]]));
    assert_eq!(
        answer["binary"],
        serde_json::json!([["a", 10, 135.0, true], ["b", 10, 145.0, true], ["c", 10, 155.0, true]])
    );
    assert_eq!(answer["columns"], serde_json::json!(["k", "n", "t", "big"]));
    assert_eq!(answer["tables"], serde_json::json!([["totals", "BASE TABLE"]]));
    assert_eq!(answer["columns_of_totals"], serde_json::json!([["k", "text"], ["n", "bigint"], ["total", "bigint"]]));
    assert_eq!(answer["error"][0], "42P01");
    assert!(answer["error"][1].as_str().is_some_and(|m| m.contains("no table `nope`")), "{answer}");
    assert_eq!(answer["error"][2], "name a materialized table (names are case-sensitive)");
    let notices = answer["notices"].as_array().expect("notices");
    assert!(
        notices.len() >= 2
            && notices.iter().all(|n| n.as_str().is_some_and(|n| n.starts_with("sluice: read at checkpoint "))),
        "{answer}"
    );
    let _ = DEADLINE;
}
