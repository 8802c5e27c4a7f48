//! The checkpoint store through `s3://` against a local S3-compatible server.
//!
//! The test starts `moto_server` itself on a free loopback port (install it with
//! `python3 -m pip install 'moto[server]'`), or uses the server at `SLUICE_TEST_S3`
//! (`http://host:port`) when that is set. A missing server fails the test: it is never
//! skipped silently.

use sluice_checkpoint::{CheckpointStore, Manifest, OperatorState, SinkRecords, SourcePositions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL: &str = "install it with: python3 -m pip install 'moto[server]' \
                       (or set SLUICE_TEST_S3=http://host:port to use a running S3-compatible server)";

/// A server for the test; a server the test started is stopped when this is dropped.
struct Server {
    child: Option<Child>,
    endpoint: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn server() -> Server {
    if let Ok(endpoint) = std::env::var("SLUICE_TEST_S3") {
        return Server { child: None, endpoint: endpoint.trim_end_matches('/').to_string() };
    }
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start moto_server ({error}); {INSTALL}"));
    let mut server = Server { child: Some(child), endpoint: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(child) = &mut server.child
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("moto_server exited with {status} before listening; {INSTALL}");
        }
        assert!(Instant::now() < deadline, "moto_server did not listen on port {port} within {STARTUP_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// Creates `bucket` with a plain HTTP PUT (moto accepts it unsigned).
fn create_bucket(endpoint: &str, bucket: &str) {
    let address = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect to the S3 server");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let request =
        format!("PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("receive");
    let status = response.lines().next().unwrap_or_default();
    assert!(status.contains(" 200 "), "creating bucket {bucket}: {status}");
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

fn checkpoint(store: &CheckpointStore, epoch: u64) -> Manifest {
    let mut manifest = Manifest::new(epoch, "fingerprint", 4, 0);
    for vnode in 0..3u32 {
        let bytes = format!("epoch {epoch} vnode {vnode}").into_bytes();
        let object = store.put_object(epoch, &format!("agg/vnode-{vnode}"), bytes).expect("put");
        if manifest.operators.is_empty() {
            manifest.operators.push(OperatorState { id: "agg".into(), vnodes: Vec::new() });
        }
        manifest.operators[0].vnodes.push((vnode, object));
    }
    manifest.sources.push(SourcePositions { name: "bids".into(), lanes: vec![epoch.to_le_bytes().to_vec()] });
    manifest.sinks.push(SinkRecords { name: "out".into(), records: vec![b"txn".to_vec()] });
    store.publish(&manifest).expect("publish");
    manifest
}

#[test]
fn checkpoints_round_trip_through_s3() {
    let server = server();
    create_bucket(&server.endpoint, "checkpoints");
    let store = open(&server, "s3://checkpoints/pipelines/hot-items");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
    assert_eq!(store.latest_valid().expect("latest"), None);

    let manifests: Vec<Manifest> = (1..=3).map(|epoch| checkpoint(&store, epoch)).collect();
    assert_eq!(store.epochs().expect("epochs"), vec![1, 2, 3]);
    for manifest in &manifests {
        assert_eq!(&store.load(manifest.epoch).expect("load"), manifest);
        assert_eq!(store.verify(manifest).expect("verify"), Vec::<String>::new());
    }

    // Publishing is create-only: the same manifest again is harmless, a different one is refused.
    store.publish(&manifests[2]).expect("republish");
    let different = Manifest { fingerprint: "other".into(), ..manifests[2].clone() };
    assert_eq!(store.publish(&different).err().map(|e| e.code), Some("checkpoint.manifest_exists"));

    // Damage epoch 3 through a second handle that has not seen it published yet.
    let other = open(&server, "s3://checkpoints/pipelines/hot-items");
    other.put_object(3, "agg/vnode-1", b"overwritten".to_vec()).expect("overwrite");
    let problems = store.verify(&manifests[2]).expect("verify");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("state/epoch-3/agg/vnode-1"), "{problems:?}");
    let (latest, warnings) = store.latest_valid().expect("latest").expect("some");
    assert_eq!(latest, manifests[1]);
    assert!(warnings.len() == 1 && warnings[0].contains("epoch 3"), "{warnings:?}");

    // Retention keeps epoch 2 (healthy), leaves damaged epoch 3 for inspection, drops epoch 1.
    let deleted = store.collect_garbage(1).expect("collect");
    assert!(deleted > 0);
    assert_eq!(store.epochs().expect("epochs"), vec![2, 3]);
    let old = &manifests[0].operators[0].vnodes[0].1;
    assert_eq!(store.get_object(old).err().map(|e| e.code), Some("checkpoint.object_missing"));
    assert_eq!(store.verify(&manifests[1]).expect("verify"), Vec::<String>::new());
    let fourth = checkpoint(&store, 4);
    store.collect_garbage(1).expect("collect");
    assert_eq!(store.epochs().expect("epochs"), vec![4]);
    assert_eq!(store.latest_valid().expect("latest").map(|(m, w)| (m, w.len())), Some((fourth, 0)));

    // Another prefix in the same bucket is a separate store.
    let neighbour = open(&server, "s3://checkpoints/pipelines/other");
    assert_eq!(neighbour.epochs().expect("epochs"), Vec::<u64>::new());
    store.clear().expect("clear");
    assert_eq!(store.epochs().expect("epochs"), Vec::<u64>::new());
}
