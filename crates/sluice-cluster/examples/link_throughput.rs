//! Throughput of one exchange link between two processes on this host, against raw TCP
//! (the ceiling): `cargo run --release -p sluice-cluster --example link_throughput`.
//!
//! The parent process sends; a child process (this program with `--receive`) receives.
//! Raw TCP: 1 MiB writes of zeros, read into one buffer. The link: Arrow batches of
//! 8192 rows (a BIGINT and a 32-byte VARCHAR, about 400 KiB encoded) round robin over
//! 1 and then 4 channels, each consumed as it arrives (credit returned on take).
//! Prints GB/s of wire bytes and batches/s for each.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use sluice_cluster::link::{Authenticator, LinkConfig, NetworkBuilder};
use sluice_types::{Batch, Message};

/// The sluice binary's allocator, so buffer reuse is what it would be there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RAW_BYTES: u64 = 8 << 30;
const BATCHES: u64 = 20_000;
const ROWS: usize = 8192;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--receive-raw") => receive_raw(),
        Some("--receive-link") => {
            receive_link(args[2].parse().expect("channels"), args[3].parse().expect("sender address"))
        }
        _ => {
            let raw = send_raw();
            println!("raw TCP: {:.2} GB/s ({} GiB in {:.2} s)", RAW_BYTES as f64 / raw / 1e9, RAW_BYTES >> 30, raw);
            for channels in [1u32, 4] {
                let (seconds, bytes) = send_link(channels);
                println!(
                    "link, {channels} channel(s): {:.2} GB/s, {:.0} batches/s ({} batches of {ROWS} rows, {:.2} GiB on the wire in {:.2} s; {:.0}% of raw TCP)",
                    bytes as f64 / seconds / 1e9,
                    BATCHES as f64 / seconds,
                    BATCHES,
                    bytes as f64 / f64::from(1u32 << 30),
                    seconds,
                    100.0 * (bytes as f64 / seconds) / (RAW_BYTES as f64 / raw)
                );
            }
        }
    }
}

fn child(args: &[String]) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the receiver");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    (child, stdout)
}

fn line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a line from the receiver");
    line.trim().to_string()
}

fn send_raw() -> f64 {
    let (mut receiver, mut out) = child(&["--receive-raw".into()]);
    let address: SocketAddr = line(&mut out).parse().expect("address");
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let chunk = vec![0u8; 1 << 20];
    let started = Instant::now();
    for _ in 0..RAW_BYTES / chunk.len() as u64 {
        stream.write_all(&chunk).expect("write");
    }
    drop(stream);
    line(&mut out);
    let seconds = started.elapsed().as_secs_f64();
    receiver.wait().expect("receiver");
    seconds
}

fn receive_raw() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("{}", listener.local_addr().expect("address"));
    let (mut stream, _) = listener.accept().expect("accept");
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buffer).expect("read") {
            0 => break,
            n => total += n as u64,
        }
    }
    assert_eq!(total, RAW_BYTES);
    println!("done");
}

fn batch() -> Batch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..ROWS as i64));
    let names: ArrayRef = Arc::new(StringArray::from_iter_values((0..ROWS).map(|i| format!("{i:032}"))));
    Batch::inserts(RecordBatch::try_new(schema, vec![ids, names]).expect("batch"))
}

fn no_secret() -> Authenticator {
    Arc::new(|_, _| Ok(()))
}

/// Worker 1 sends; worker 0 (the child) receives and accepts.
fn send_link(channels: u32) -> (f64, u64) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mine = listener.local_addr().expect("address");
    let (mut receiver, mut out) = child(&["--receive-link".into(), channels.to_string(), mine.to_string()]);
    let theirs: SocketAddr = line(&mut out).parse().expect("address");
    let mut builder = NetworkBuilder::new(1, 1, [(0, theirs)], LinkConfig::default());
    let senders: Vec<_> = (0..channels).map(|c| builder.outgoing(0, c)).collect();
    let network = builder.connect(&listener, no_secret()).expect("link");
    let batch = batch();
    let started = Instant::now();
    for index in 0..BATCHES {
        senders[(index % u64::from(channels)) as usize].send(Message::Data(batch.clone())).expect("send");
    }
    for sender in &senders {
        sender.send(Message::EndOfData).expect("end");
    }
    let bytes: u64 = line(&mut out).parse().expect("bytes received");
    let seconds = started.elapsed().as_secs_f64();
    network.drain(std::time::Duration::from_secs(60)).expect("clean close");
    receiver.wait().expect("receiver");
    (seconds, bytes)
}

fn receive_link(channels: u32, sender: SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("{}", listener.local_addr().expect("address"));
    let mut builder = NetworkBuilder::new(0, 1, [(1, sender)], LinkConfig::default());
    let inboxes: Vec<_> = (0..channels).map(|c| builder.incoming(1, c, None)).collect();
    let network = builder.connect(&listener, no_secret()).expect("link");
    let mut select = crossbeam_channel::Select::new();
    for inbox in &inboxes {
        select.recv(&inbox.messages);
    }
    let (mut ended, mut bytes, mut batches) = (0, 0u64, 0u64);
    while ended < channels {
        let operation = select.select();
        let index = operation.index();
        let (message, size) = operation.recv(&inboxes[index].messages).expect("message");
        inboxes[index].consumed(size);
        bytes += u64::from(size);
        match message {
            Message::Data(_) => batches += 1,
            Message::EndOfData => ended += 1,
            _ => {}
        }
    }
    assert_eq!(batches, BATCHES);
    println!("{bytes}");
    network.drain(std::time::Duration::from_secs(60)).expect("clean close");
}
