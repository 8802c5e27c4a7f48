//! The checkpoint store through `az://` against Azurite, the Azure Storage emulator.
//!
//! The test starts `azurite-blob` itself on a loopback port the kernel picks, keeping its
//! data in memory. It runs the program named by `SLUICE_AZURITE`, else the one installed by
//! `scripts/test.sh` under `~/.cache/sluice-tools/azurite`, else `azurite-blob` from the
//! `PATH`; or it uses the Azurite at `SLUICE_TEST_AZURE` (`http://host:port`) when that is
//! set. A missing emulator fails the test: it is never skipped silently.

mod common;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::Server;
use sluice_checkpoint::CheckpointStore;
use std::path::{Path, PathBuf};

const INSTALL: &str = "install it with: npm install --prefix ~/.cache/sluice-tools/azurite azurite@3 \
                       (or set SLUICE_AZURITE=/path/to/azurite-blob, or SLUICE_TEST_AZURE=http://host:port \
                       to use a running Azurite)";

/// The emulator's well-known account and key (public, the same in every installation).
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Blob service only, on a port the kernel picks (Azurite prints it), data in memory, no
/// telemetry, any API version object_store asks for.
const AZURITE_ARGS: [&str; 8] = [
    "--blobHost",
    "127.0.0.1",
    "--blobPort",
    "0",
    "--inMemoryPersistence",
    "--disableTelemetry",
    "--skipApiVersionCheck",
    "--silent",
];

fn azurite() -> String {
    if let Ok(program) = std::env::var("SLUICE_AZURITE") {
        return program;
    }
    let installed = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/sluice-tools/azurite/node_modules/.bin/azurite-blob"));
    match installed {
        Some(path) if path.exists() => path.display().to_string(),
        Some(_) | None => "azurite-blob".to_string(),
    }
}

fn server() -> Server {
    if let Ok(endpoint) = std::env::var("SLUICE_TEST_AZURE") {
        return Server::running(&endpoint);
    }
    // Azurite prints "Azurite Blob service successfully listens on http://127.0.0.1:PORT".
    Server::start(&azurite(), &AZURITE_ARGS, "successfully listens on ", INSTALL)
}

/// Creates `container` (the store only reads and writes blobs) with a request signed by the
/// account key. Azurite does not check how old the signed date is.
fn create_container(server: &Server, container: &str) {
    let (date, version) = ("Mon, 01 Jan 2024 00:00:00 GMT", "2021-08-06");
    let string_to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &STANDARD.decode(KEY).expect("the key is base64"));
    let authorization = format!("SharedKey {ACCOUNT}:{}", STANDARD.encode(hmac::sign(&key, string_to_sign.as_bytes())));
    let headers = [("x-ms-date", date), ("x-ms-version", version), ("Authorization", authorization.as_str())];
    let status = server.put_empty(&format!("/{ACCOUNT}/{container}?restype=container"), &headers);
    // 409: a running emulator may have the container from an earlier run.
    assert!(status.contains(" 201 ") || status.contains(" 409 "), "creating container {container}: {status}");
}

fn open(server: &Server, url: &str) -> CheckpointStore {
    let options = [
        ("azure_storage_account_name", ACCOUNT.to_string()),
        ("azure_storage_account_key", KEY.to_string()),
        ("azure_storage_endpoint", format!("{}/{ACCOUNT}", server.endpoint)),
        ("azure_allow_http", "true".to_string()),
    ];
    let options: Vec<(String, String)> = options.into_iter().map(|(key, value)| (key.to_string(), value)).collect();
    CheckpointStore::open_with_options(url, Path::new("/"), &options).expect("opens")
}

#[test]
fn checkpoints_round_trip_through_azure() {
    let server = server();
    create_container(&server, "checkpoints");
    common::scenarios::checkpoints_round_trip("az://checkpoints", |url| open(&server, url));
}

#[test]
fn one_run_at_a_time_holds_an_azure_store() {
    let server = server();
    create_container(&server, "leases");
    common::scenarios::lease_round_trip("az://leases", |url| open(&server, url));
}
