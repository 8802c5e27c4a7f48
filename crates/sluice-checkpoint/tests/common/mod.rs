//! What the object-store tests share: a local server the test starts and stops, a plain
//! HTTP request for the setup the store cannot do itself (creating a bucket or container),
//! and the scenarios every backend must pass (`scenarios`, which `tests/local.rs` runs on a
//! local directory).
//!
//! A server is started on port 0, so the kernel picks a free port at bind time (no window
//! in which another process could take a port chosen beforehand), and the test learns the
//! port from the address the server prints. Waiting for it is driven by its output lines,
//! bounded by [`STARTUP_TIMEOUT`]; its exit ends the wait at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::{Duration, Instant};

pub mod scenarios;

/// The longest a server may take to print its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest one setup request may take (connect, send, receive).
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// Output lines buffered between a server's pipes and the test, and kept for a failure
/// message.
const OUTPUT_LINES_MAX: usize = 64;
/// The longest output line read as one (longer lines are split).
const LINE_BYTES_MAX: u64 = 4096;

/// A server for a test; a server the test started is stopped when this is dropped.
pub struct Server {
    child: Option<Child>,
    /// `http://host:port`, without a trailing slash.
    pub endpoint: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Server {
    /// The server already running at `endpoint`.
    pub fn running(endpoint: &str) -> Server {
        Server { child: None, endpoint: endpoint.trim_end_matches('/').to_string() }
    }

    /// Starts `program` with `args`, which must make it listen on port 0 and print the
    /// address it got as `{ready}http://host:port` on its standard output or error; returns
    /// once it has printed that line (it listens by then). A program that cannot start,
    /// exits first or stays silent for [`STARTUP_TIMEOUT`] fails the test, naming `install`
    /// and its last output lines.
    pub fn start(program: &str, args: &[&str], ready: &str, install: &str) -> Server {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {program} ({error}); {install}"));
        let (sender, lines) = sync_channel(OUTPUT_LINES_MAX);
        if let Some(stdout) = child.stdout.take() {
            forward_lines(stdout, sender.clone());
        }
        if let Some(stderr) = child.stderr.take() {
            forward_lines(stderr, sender);
        }
        let mut server = Server { child: Some(child), endpoint: String::new() };
        match server.wait_for_address(&lines, ready) {
            Ok(endpoint) => server.endpoint = endpoint,
            Err(problem) => panic!("{program} {problem}; {install}"),
        }
        server
    }

    /// Reads output lines until one announces the address; the problem otherwise.
    fn wait_for_address(&mut self, lines: &Receiver<String>, ready: &str) -> Result<String, String> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut seen: Vec<String> = Vec::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let line = match lines.recv_timeout(remaining) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("printed no address within {STARTUP_TIMEOUT:?}; output: {seen:?}"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Both pipes closed: the server exited (or closed its outputs, so stop it).
                    let status = self.child.as_mut().map(|child| {
                        let _ = child.kill();
                        child.wait().map_or_else(|error| error.to_string(), |status| status.to_string())
                    });
                    let status = status.unwrap_or_default();
                    return Err(format!("ended before listening ({status}); output: {seen:?}"));
                }
            };
            if let Some(endpoint) = announced_endpoint(&line, ready) {
                return Ok(endpoint);
            }
            if seen.len() == OUTPUT_LINES_MAX {
                seen.remove(0);
            }
            seen.push(line);
        }
    }

    /// Sends `PUT {path}` with `headers` and an empty body; returns the status line.
    pub fn put_empty(&self, path: &str, headers: &[(&str, &str)]) -> String {
        let address = self.endpoint.trim_start_matches("http://");
        let socket: SocketAddr = address.parse().unwrap_or_else(|error| panic!("endpoint {address}: {error}"));
        let mut stream = TcpStream::connect_timeout(&socket, HTTP_TIMEOUT).expect("connect to the server");
        stream.set_read_timeout(Some(HTTP_TIMEOUT)).expect("timeout");
        stream.set_write_timeout(Some(HTTP_TIMEOUT)).expect("timeout");
        let mut request =
            format!("PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("receive");
        response.lines().next().unwrap_or_default().to_string()
    }
}

/// Sends each line of `output` to `lines` until the receiver is gone, then discards the
/// rest, so the server never blocks on a full pipe; ends when the pipe closes.
fn forward_lines(output: impl Read + Send + 'static, lines: SyncSender<String>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(output);
        let mut line = Vec::new();
        let mut forwarding = true;
        loop {
            line.clear();
            match reader.by_ref().take(LINE_BYTES_MAX).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if forwarding => {
                    forwarding = lines.send(String::from_utf8_lossy(&line).trim_end().to_string()).is_ok();
                }
                Ok(_) => {}
            }
        }
    });
}

/// `http://host:port` from a line `...{ready}http://host:port...`.
fn announced_endpoint(line: &str, ready: &str) -> Option<String> {
    let (_, after) = line.split_once(ready)?;
    let url = after.split_whitespace().next()?.trim_end_matches('/');
    let address = url.strip_prefix("http://")?;
    address.parse::<SocketAddr>().ok().map(|_| url.to_string())
}
