//! A minimal HTTP/1.1 client over std's TcpStream for the tests: one request per
//! connection, fixed-length or chunked responses. Every read has a timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The longest any read waits (a failing test ends instead of hanging).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Reply {
    pub code: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn connect(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    // The test's own Host, if it gives one (a browser's page under another name).
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    request.push_str("Connection: close\r\n");
    // Every POST is JSON, as the API requires, unless the test says otherwise.
    if method == "POST" && !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
        request.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).expect("send");
    BufReader::new(stream)
}

fn read_head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let code = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header");
        let line = line.trim_end();
        if line.is_empty() {
            return (code, headers);
        }
        let (name, value) = line.split_once(':').unwrap_or_else(|| panic!("header {line:?}"));
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"))
}

/// One request, the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, method, path, headers, "")
}

/// A POST of the JSON `body`, the whole response.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> Reply {
    send(addr, "POST", path, &[], body)
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut reader = connect(addr, method, path, headers, body);
    let (code, headers) = read_head(&mut reader);
    let body = if is_chunked(&headers) {
        let mut lines = Lines { reader, pending: Vec::new(), ended: false };
        let mut body = Vec::new();
        while let Some(chunk) = lines.next_chunk() {
            body.extend(chunk);
        }
        String::from_utf8(body).expect("utf-8")
    } else {
        let mut body = String::new();
        reader.read_to_string(&mut body).expect("body");
        body
    };
    Reply { code, headers, body }
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[])
}

/// A streamed response read line by line.
pub struct Lines {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
    ended: bool,
}

/// Opens a GET that may stream: the status code, and the line reader when the body is
/// streamed (a refusal, such as a 503, is not).
pub fn try_stream(addr: SocketAddr, path: &str) -> (u16, Option<Lines>) {
    let mut reader = connect(addr, "GET", path, &[], "");
    let (code, headers) = read_head(&mut reader);
    let lines = is_chunked(&headers).then(|| Lines { reader, pending: Vec::new(), ended: false });
    (code, lines)
}

/// Opens a streamed GET; the status code and the line reader.
pub fn stream(addr: SocketAddr, path: &str) -> (u16, Lines) {
    let mut reader = connect(addr, "GET", path, &[], "");
    let (code, headers) = read_head(&mut reader);
    assert!(is_chunked(&headers), "a streamed body is chunked: {headers:?}");
    (code, Lines { reader, pending: Vec::new(), ended: false })
}

/// The result of a read, or None when the server closed the connection (a reset counts:
/// the server may drop a stream it ends); any other failure (a timeout) fails the test.
fn closed<T>(read: std::io::Result<T>) -> Option<T> {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, UnexpectedEof};
    match read {
        Ok(value) => Some(value),
        Err(e) if matches!(e.kind(), ConnectionReset | ConnectionAborted | UnexpectedEof) => None,
        Err(e) => panic!("reading the response: {e}"),
    }
}

impl Lines {
    fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.ended {
            return None;
        }
        let mut size = String::new();
        if closed(self.reader.read_line(&mut size)).is_none_or(|read| read == 0) {
            self.ended = true;
            return None;
        }
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|_| panic!("chunk size {size:?}"));
        let mut chunk = vec![0; size + 2];
        if closed(self.reader.read_exact(&mut chunk)).is_none() {
            self.ended = true;
            return None;
        }
        chunk.truncate(size);
        if size == 0 {
            self.ended = true;
            return None;
        }
        Some(chunk)
    }

    /// The next line, or None at the end of the body.
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(String::from_utf8(line).expect("utf-8").trim_end().to_string());
            }
            let chunk = self.next_chunk()?;
            self.pending.extend(chunk);
        }
    }
}
