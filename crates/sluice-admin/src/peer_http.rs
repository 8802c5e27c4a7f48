//! One HTTP/1.1 `POST` to another worker's admin API, as a cluster's workers ask each
//! other (a query's slices, a checkpoint asked of a follower): one request per
//! connection, the shared bearer token, bounded in time (connect, write and every read
//! end by the deadline) and in size (the answer must announce its length, at most
//! `max_bytes`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The longest a connection attempt waits, within the deadline.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most header lines an answer may have.
const MAX_HEADERS: usize = 100;
/// The longest header line read.
const MAX_LINE: u64 = 8 << 10;

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PostError {
    /// The worker could not be reached, or broke off; the text says how.
    Unreachable(String),
    /// Its answer is longer than the caller takes.
    TooLarge,
}

/// `POST path` with the JSON `content` to the API at `addr` (`host:port`): the answer's
/// status and body.
pub(crate) fn post(
    addr: &str,
    token: Option<&str>,
    path: &str,
    content: &[u8],
    deadline: Instant,
    max_bytes: usize,
) -> Result<(u16, Vec<u8>), PostError> {
    let unreachable = PostError::Unreachable;
    let left = || {
        let left = deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left).ok_or_else(|| unreachable("the time ran out".into()))
    };
    let target = addr
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("its address resolves to nothing".into()))?;
    let stream = TcpStream::connect_timeout(&target, left()?.min(CONNECT_TIMEOUT))
        .map_err(|e| unreachable(format!("connecting: {e}")))?;
    let auth = token.map_or_else(String::new, |token| format!("Authorization: Bearer {token}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        content.len()
    );
    let io = |e: std::io::Error| unreachable(format!("the request broke off: {e}"));
    stream.set_write_timeout(Some(left()?)).map_err(io)?;
    (&stream).write_all(head.as_bytes()).map_err(io)?;
    (&stream).write_all(content).map_err(io)?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    let read_line = |reader: &mut BufReader<&TcpStream>, line: &mut String| {
        stream.set_read_timeout(Some(left()?)).map_err(io)?;
        line.clear();
        reader.by_ref().take(MAX_LINE).read_line(line).map_err(io)
    };
    read_line(&mut reader, &mut line)?;
    let code: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| unreachable(format!("it did not answer HTTP: {:?}", line.trim_end())))?;
    let mut length = None;
    for _ in 0..MAX_HEADERS {
        read_line(&mut reader, &mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let length = match length {
        Some(length) if length <= max_bytes => length,
        Some(_) => return Err(PostError::TooLarge),
        None if code == 204 => 0,
        None => return Err(unreachable("its answer gives no length".into())),
    };
    let mut bytes = vec![0u8; length];
    let mut filled = 0;
    while filled < length {
        stream.set_read_timeout(Some(left()?)).map_err(io)?;
        match reader.read(&mut bytes[filled..]).map_err(io)? {
            0 => return Err(unreachable(format!("its answer ended after {filled} of {length} bytes"))),
            read => filled += read,
        }
    }
    Ok((code, bytes))
}
