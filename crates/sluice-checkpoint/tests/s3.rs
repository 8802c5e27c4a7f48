//! The checkpoint store through `s3://` against a local S3-compatible server.
//!
//! The test starts `moto_server` itself on a loopback port the kernel picks (install it with
//! `python3 -m pip install 'moto[server]'`), or uses the server at `SLUICE_TEST_S3`
//! (`http://host:port`) when that is set. A missing server fails the test: it is never
//! skipped silently.

mod common;

use common::Server;
use sluice_checkpoint::CheckpointStore;
use std::path::Path;

const INSTALL: &str = "install it with: python3 -m pip install 'moto[server]' \
                       (or set SLUICE_TEST_S3=http://host:port to use a running S3-compatible server)";

fn server() -> Server {
    match std::env::var("SLUICE_TEST_S3") {
        Ok(endpoint) => Server::running(&endpoint),
        // moto prints " * Running on http://127.0.0.1:PORT" once it listens.
        Err(_) => Server::start("moto_server", &["-H", "127.0.0.1", "-p", "0"], "Running on ", INSTALL),
    }
}

fn open(server: &Server, url: &str) -> CheckpointStore {
    let mut options =
        vec![("aws_endpoint".to_string(), server.endpoint.clone()), ("aws_allow_http".to_string(), "true".to_string())];
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        for (key, value) in [("aws_access_key_id", "test"), ("aws_secret_access_key", "test")] {
            options.push((key.to_string(), value.to_string()));
        }
    }
    if std::env::var("AWS_REGION").is_err() {
        options.push(("aws_region".to_string(), "us-east-1".to_string()));
    }
    CheckpointStore::open_with_options(url, Path::new("/"), &options).expect("opens")
}

#[test]
fn checkpoints_round_trip_through_s3() {
    let server = server();
    // moto accepts an unsigned bucket creation.
    let status = server.put_empty("/checkpoints", &[]);
    assert!(status.contains(" 200 "), "creating bucket checkpoints: {status}");
    common::scenarios::checkpoints_round_trip("s3://checkpoints", |url| open(&server, url));
}

#[test]
fn one_run_at_a_time_holds_an_s3_store() {
    let server = server();
    let status = server.put_empty("/leases", &[]);
    assert!(status.contains(" 200 "), "creating bucket leases: {status}");
    common::scenarios::lease_round_trip("s3://leases", |url| open(&server, url));
}
