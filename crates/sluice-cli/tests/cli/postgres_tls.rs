//! TLS to PostgreSQL (`sslmode` and `sslrootcert` in `url`), against a real server with
//! `ssl = on` whose pg_hba.conf accepts TCP connections over TLS only (`hostssl`,
//! `postgres::Server::start_tls_only`), so a session that reached it was encrypted.
//! Each test makes its own CA and a server certificate for `localhost` and 127.0.0.1
//! with the `openssl` command.
//!
//! One server serves the sessions that must work (the CDC source and the sink over
//! `verify-full` with the CA, both over `require` without it), another the refusals
//! (no CA, a host the certificate does not name, an unreadable `sslrootcert`,
//! `disable`), each naming its setting.

use std::path::Path;
use std::process::Command;

use crate::harness::{Scratch, assert_fails_with, stderr};
use crate::postgres::{PASSWORD_VARIABLE, Server, run};

/// A CA (`ca.crt`) and the server's certificate and key (`server.crt`, `server.key`),
/// signed by it, naming `localhost` and 127.0.0.1, into `dir`.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(output.status.success(), "openssl {args:?}: {}", stderr(&output));
    };
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"][..],
            &key,
            &["-days", "2", "-subj", "/CN=sluice test CA", "-keyout", "ca.key", "-out", "ca.crt"],
            &["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    openssl(&[&["req"][..], &key, &["-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr"]].concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.crt",
        "-extfile",
        "server.ext",
    ]);
}

/// The server's `url` with `tls` (e.g. `sslmode=require`) added; its host 127.0.0.1
/// unless `tls` names one.
fn url(server: &Server, tls: &str) -> String {
    let host = if tls.contains("host=") { "" } else { "host=127.0.0.1 " };
    format!("{host}port={} user=sluice dbname=postgres {tls}", server.port())
}

/// `items` captured by the CDC source (`source_tls`) into `table` by the sink
/// (`sink_tls`), through slot `slot`.
fn cdc_pipeline(server: &Server, slot: &str, table: &str, source_tls: &str, sink_tls: &str) -> String {
    format!(
        "[pipeline]\nname = \"tls_{table}\"\nbatch_size = 8\n\n\
         [checkpoint]\ninterval = \"10ms\"\nstore = \"file://./state\"\n\n\
         [[source]]\nname = \"shop\"\nconnector = \"postgres-cdc\"\n[source.options]\nurl = \"{source_url}\"\n\
         password_env = \"{PASSWORD_VARIABLE}\"\ntables = [\"items\"]\npublication = \"items\"\nslot = \"{slot}\"\n\
         bounded = true\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"items\"\nconnector = \"postgres\"\n[sink.options]\nurl = \"{sink_url}\"\n\
         password_env = \"{PASSWORD_VARIABLE}\"\ntable = \"{table}\"\ncreate_table = true\n",
        source_url = url(server, source_tls),
        sink_url = url(server, sink_tls),
    )
}

fn run_ok(scratch: &Scratch) -> String {
    let output = run(scratch, 2, None);
    let log = stderr(&output);
    assert!(output.status.success(), "sluice failed:\n{log}");
    log
}

#[test]
fn the_cdc_source_and_the_sink_work_over_verify_full_with_the_ca_and_over_require_without() {
    let certificates = tempfile::tempdir().expect("temp dir");
    make_certificates(certificates.path());
    let server = Server::start_tls_only(certificates.path());
    server.execute(
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT NOT NULL);
         ALTER TABLE items REPLICA IDENTITY FULL;
         CREATE PUBLICATION items FOR TABLE items;
         INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 20) AS i;",
    );
    let ca = certificates.path().join("ca.crt");
    let verified = format!("sslmode=verify-full sslrootcert={}", ca.display());
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &cdc_pipeline(&server, "slot_verified", "copy_verified", &verified, &verified));
    let log = run_ok(&scratch);
    assert!(log.contains("slot created"), "{log}");
    assert_eq!(server.rows("copy_verified"), server.rows("items"), "after the snapshot:\n{log}");
    // Inserts, updates and a delete, read from the slot over the replication session.
    server.execute(
        "INSERT INTO items VALUES (21, 'new'), (22, 'newer');
         UPDATE items SET name = 'renamed' WHERE id IN (3, 21);
         DELETE FROM items WHERE id = 4;",
    );
    let log = run_ok(&scratch);
    assert!(log.contains("resuming from checkpoint"), "{log}");
    let rows = server.rows("copy_verified");
    assert_eq!(rows, server.rows("items"), "after the changes:\n{log}");
    assert!(rows.contains(&"(21,renamed)".to_owned()) && !rows.iter().any(|r| r.starts_with("(4,")), "{rows:?}");
    // `require` encrypts without verifying: no CA needed.
    let scratch = Scratch::new();
    let require = "sslmode=require";
    scratch.write("pipeline.toml", &cdc_pipeline(&server, "slot_required", "copy_required", require, require));
    let log = run_ok(&scratch);
    assert_eq!(server.rows("copy_required"), server.rows("items"), "{log}");
}

#[test]
fn tls_failures_name_the_setting_and_the_fix() {
    let certificates = tempfile::tempdir().expect("temp dir");
    make_certificates(certificates.path());
    let server = Server::start_tls_only(certificates.path());
    server.execute(
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT NOT NULL);
         ALTER TABLE items REPLICA IDENTITY FULL;
         CREATE PUBLICATION items FOR TABLE items;",
    );
    let ca = certificates.path().join("ca.crt");
    let runs = std::cell::Cell::new(0);
    let check = |source_tls: &str, sink_tls: &str, needles: &[&str]| {
        // A scratch and a slot per run: a run refused by its sink may have read the
        // source's catalog or created its slot first.
        runs.set(runs.get() + 1);
        let scratch = Scratch::new();
        let slot = format!("slot_refused_{}", runs.get());
        scratch.write("pipeline.toml", &cdc_pipeline(&server, &slot, "copy_refused", source_tls, sink_tls));
        assert_fails_with(&run(&scratch, 1, None), needles);
    };
    let verified = format!("sslmode=verify-full sslrootcert={}", ca.display());
    // Without the CA, verify-full checks against the system's roots, which lack it.
    check("sslmode=verify-full", &verified, &["source `shop`", "failed verification", "sslrootcert"]);
    check(&verified, "sslmode=verify-full", &["sink `out`", "failed verification", "sslrootcert"]);
    check(&verified, "sslmode=verify-ca", &["sink `out`", "failed verification", "sslmode=verify-ca"]);
    // The certificate names localhost and 127.0.0.1, not the host connected as (the
    // address is given apart, as libpq's hostaddr).
    let wrong_host = format!("{verified} host=db.wrong.test hostaddr=127.0.0.1");
    check(&verified, &wrong_host, &["sink `out`", "does not name the host db.wrong.test", "verify-ca"]);
    let missing = certificates.path().join("missing.pem");
    let unreadable = format!("sslmode=verify-full sslrootcert={}", missing.display());
    check(&unreadable, &verified, &["cannot read sslrootcert=", "missing.pem", "PEM file"]);
    // The server accepts only encrypted sessions: disable is refused with the fix.
    check(
        "sslmode=disable",
        &verified,
        &["source `shop`", "accepts only encrypted connections", "sslmode=verify-full"],
    );
    check(&verified, "sslmode=disable", &["sink `out`", "accepts only encrypted connections", "sslmode=verify-full"]);
}
