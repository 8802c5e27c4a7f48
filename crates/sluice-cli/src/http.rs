//! A small HTTP/1.1 client for the admin API (`sluice status`, `sluice query`): one
//! request (a GET, or a POST of a JSON body) per connection
//! (`Connection: close`), an optional bearer token, and a reader of a chunked body line
//! by line (the status stream). No TLS: the admin API is plain HTTP, reached on a
//! loopback address or through a tunnel.
//!
//! Bounds: every read waits at most [`READ_TIMEOUT`] (longer than the stream's
//! heartbeat); a line longer than [`MAX_LINE`] is an error; a body is read at most
//! [`MAX_BODY`] bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use sluice_types::SluiceError;

/// The longest one read waits (the status stream sends a heartbeat every 5 s).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest line of the status stream.
pub const MAX_LINE: usize = 4 << 20;
/// The largest body read.
pub const MAX_BODY: u64 = 16 << 20;

/// An answer's status code and the reader of its body.
pub struct Answer {
    pub code: u16,
    chunked: bool,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    body: BufReader<TcpStream>,
    /// Bytes left in the current chunk.
    left: usize,
}

/// Sends `GET path` to `addr` (HOST:PORT), with `Authorization: Bearer token` if given.
pub fn get(addr: &str, path: &str, token: Option<&str>) -> Result<Answer, SluiceError> {
    request(addr, "GET", path, token, None)
}

/// Sends `POST path` with a JSON `body` to `addr`, as [`get`].
pub fn post_json(addr: &str, path: &str, token: Option<&str>, body: &[u8]) -> Result<Answer, SluiceError> {
    request(addr, "POST", path, token, Some(body))
}

fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    content: Option<&[u8]>,
) -> Result<Answer, SluiceError> {
    let unreachable = |e: std::io::Error| {
        SluiceError::external("status.connect", format!("cannot reach the admin API at {addr}: {e}"))
            .with_fix("give the address `sluice run` printed (`sluice: admin API on http://ADDR`) with --addr")
    };
    let target = addr
        .to_socket_addrs()
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| unreachable(std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address")))?;
    let mut stream = TcpStream::connect_timeout(&target, READ_TIMEOUT).map_err(unreachable)?;
    stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(unreachable)?;
    let auth = token.map_or_else(String::new, |token| format!("Authorization: Bearer {token}\r\n"));
    let length = content.map_or_else(String::new, |content| {
        format!("Content-Type: application/json\r\nContent-Length: {}\r\n", content.len())
    });
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}{length}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(unreachable)?;
    stream.write_all(content.unwrap_or_default()).map_err(unreachable)?;
    let mut body = BufReader::new(stream);
    let mut status = String::new();
    body.read_line(&mut status).map_err(unreachable)?;
    let code = status.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or_else(|| {
        SluiceError::external("status.protocol", format!("{addr} did not answer HTTP: {status:?}"))
            .with_fix("check that --addr names the admin API, not another port")
    })?;
    let mut chunked = false;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        body.read_line(&mut line).map_err(unreachable)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            chunked |= name.eq_ignore_ascii_case("transfer-encoding") && value.trim().eq_ignore_ascii_case("chunked");
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    Ok(Answer { code, chunked, headers, body, left: 0 })
}

impl Answer {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, value)| value.as_str())
    }

    /// The whole body of an answer that is not chunked (at most [`MAX_BODY`] bytes).
    pub fn bytes(self) -> Result<Vec<u8>, SluiceError> {
        let mut bytes = Vec::new();
        self.body.take(MAX_BODY).read_to_end(&mut bytes).map_err(broken)?;
        Ok(bytes)
    }

    /// The whole body as text (at most [`MAX_BODY`] bytes).
    pub fn text(mut self) -> Result<String, SluiceError> {
        let mut text = String::new();
        if self.chunked {
            while let Some(line) = self.line()? {
                text.push_str(&line);
                text.push('\n');
            }
            return Ok(text);
        }
        self.body.take(MAX_BODY).read_to_string(&mut text).map_err(broken)?;
        Ok(text)
    }

    /// The next line of the body (without its `\n`), None at its end.
    pub fn line(&mut self) -> Result<Option<String>, SluiceError> {
        let mut line = Vec::new();
        loop {
            if self.chunked && self.left == 0 {
                let mut size = String::new();
                self.body.read_line(&mut size).map_err(broken)?;
                let size = usize::from_str_radix(size.trim(), 16)
                    .map_err(|_| SluiceError::external("status.protocol", format!("a bad chunk size {size:?}")))?;
                if size == 0 {
                    return Ok((!line.is_empty()).then(|| String::from_utf8_lossy(&line).into_owned()));
                }
                self.left = size + 2;
            }
            let mut byte = [0u8; 1];
            if self.body.read(&mut byte).map_err(broken)? == 0 {
                return Ok((!line.is_empty()).then(|| String::from_utf8_lossy(&line).into_owned()));
            }
            if self.chunked {
                self.left -= 1;
                if self.left < 2 {
                    // The CR LF after a chunk's data.
                    continue;
                }
            }
            if byte[0] == b'\n' {
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            line.push(byte[0]);
            if line.len() > MAX_LINE {
                return Err(SluiceError::external("status.protocol", format!("a line longer than {MAX_LINE} bytes")));
            }
        }
    }
}

fn broken(e: std::io::Error) -> SluiceError {
    SluiceError::external("status.read", format!("the admin API's answer broke off: {e}"))
        .with_fix("check that the job still runs; `sluice status` ends when it ends")
}
