//! A synchronous client of PostgreSQL's streaming replication protocol, over a
//! `std::net::TcpStream` or TLS over it ([`super::transport`], as `url`'s `sslmode`
//! says), with the message codecs and SCRAM-SHA-256 of `postgres-protocol` (the
//! `postgres` crate speaks no replication protocol).
//!
//! What it does, in the order a session does it:
//! 1. startup with `replication=database` (a walsender that also takes SQL), then
//!    authentication: trust, cleartext, md5 or SCRAM-SHA-256 (without channel binding,
//!    also over TLS: the `postgres` sessions of the catalog and the snapshot bind theirs);
//! 2. simple queries (`IDENTIFY_SYSTEM`, `CREATE_REPLICATION_SLOT`, `SELECT …`): rows as
//!    text, or the server's error;
//! 3. `START_REPLICATION`, after which the connection is in CopyBoth mode: each
//!    [`ReplicationConnection::read_copy`] returns one CopyData payload (an `XLogData` or
//!    a keepalive, decoded by [`super::pgoutput`]) or nothing when none has arrived, and
//!    [`ReplicationConnection::send_status`] confirms LSNs to the server.
//!
//! Bounds: one frame is at most [`FRAME_BYTES_MAX`] (the server's own limit on a
//! message); the read buffer holds at most one frame beyond what was parsed.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::{backend, frontend};
use sluice_types::SluiceError;

use super::transport::{OpenError, Transport};
use crate::postgres::tls::{Side, SslMode, TlsFailure, TlsSettings, refuses_plain};

/// The longest frame read (a server's message is at most 1 GiB plus its header).
pub const FRAME_BYTES_MAX: usize = (1 << 30) + 64;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Where and as whom to connect.
#[derive(Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
    pub password: Option<String>,
    pub connect_timeout: Duration,
    /// `sslmode` and `sslrootcert` of `url`.
    pub tls: TlsSettings,
}

impl Endpoint {
    /// `host:port/database as user`, for messages (never the password).
    pub fn describe(&self) -> String {
        format!("{}:{}/{} as {}", self.host, self.port, self.database, self.user)
    }
}

/// An error the server sent (an `ErrorResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// The SQLSTATE, e.g. `42704`.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.code)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

/// A failed step: the server refused it, or the connection failed.
#[derive(Debug)]
pub enum ProtocolError {
    Server(ServerError),
    Io(std::io::Error),
    /// The server sent what the protocol does not allow here.
    Unexpected(String),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::Server(error) => error.fmt(f),
            ProtocolError::Io(error) => write!(f, "{error}"),
            ProtocolError::Unexpected(what) => write!(f, "unexpected from the server: {what}"),
        }
    }
}

impl From<std::io::Error> for ProtocolError {
    fn from(error: std::io::Error) -> ProtocolError {
        ProtocolError::Io(error)
    }
}

/// One frame: its tag and body (without the length).
struct Frame {
    tag: u8,
    body: Bytes,
}

/// A replication session (`replication=database`).
pub struct ReplicationConnection {
    stream: Transport,
    read: BytesMut,
    write: BytesMut,
    /// Set once `START_REPLICATION` succeeded: reads are then non-blocking.
    streaming: bool,
}

impl ReplicationConnection {
    /// Connects and authenticates. Errors name the endpoint and what to fix.
    pub fn connect(endpoint: &Endpoint) -> Result<ReplicationConnection, SluiceError> {
        let unreachable = |e: std::io::Error| {
            SluiceError::external(
                "source.postgres_cdc.unreachable",
                format!("cannot connect to PostgreSQL at {}: {e}", endpoint.describe()),
            )
            .with_fix("check `url` (host and port) and that the server is running and accepts TCP connections")
        };
        let address = (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| unreachable(std::io::Error::new(ErrorKind::NotFound, "the host has no address")))?;
        let socket = TcpStream::connect_timeout(&address, endpoint.connect_timeout).map_err(unreachable)?;
        socket.set_nodelay(true).map_err(unreachable)?;
        let stream =
            Transport::open(socket, &endpoint.host, &endpoint.tls, endpoint.connect_timeout).map_err(|e| match e {
                OpenError::Io(error) => unreachable(error),
                OpenError::Tls(failure) => {
                    failure.into_error(Side::Source, "replication session", &endpoint.describe(), &endpoint.tls)
                }
            })?;
        let mut connection =
            ReplicationConnection { stream, read: BytesMut::new(), write: BytesMut::new(), streaming: false };
        connection.startup(endpoint).map_err(|e| match e {
            ProtocolError::Server(error)
                if endpoint.tls.mode == SslMode::Disable && refuses_plain(&error.code, &error.message) =>
            {
                TlsFailure::EncryptionRequired { detail: error.message }.into_error(
                    Side::Source,
                    "replication session",
                    &endpoint.describe(),
                    &endpoint.tls,
                )
            }
            ProtocolError::Server(error) if error.code == "28P01" || error.code == "28000" => SluiceError::user(
                "source.postgres_cdc.authentication",
                format!("PostgreSQL at {} refused the replication connection: {error}", endpoint.describe()),
            )
            .with_fix(
                "check the user and `password_env`; the user needs the REPLICATION attribute \
                 (ALTER ROLE … WITH REPLICATION) and pg_hba.conf must allow it",
            ),
            other => SluiceError::external(
                "source.postgres_cdc.startup",
                format!("PostgreSQL at {}: starting a replication session failed: {other}", endpoint.describe()),
            )
            .with_fix("check that the server is PostgreSQL 10 or later and that `url` names it"),
        })?;
        Ok(connection)
    }

    fn startup(&mut self, endpoint: &Endpoint) -> Result<(), ProtocolError> {
        let parameters = [
            ("user", endpoint.user.as_str()),
            ("database", endpoint.database.as_str()),
            ("replication", "database"),
            ("application_name", "sluice"),
            ("options", "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=3 -c bytea_output=hex"),
        ];
        frontend::startup_message(parameters.iter().copied(), &mut self.write)?;
        self.flush()?;
        let password = endpoint.password.clone().unwrap_or_default();
        let mut scram: Option<ScramSha256> = None;
        loop {
            let frame = self.read_frame_blocking()?;
            match frame.tag {
                b'R' => match parse(&frame)? {
                    backend::Message::AuthenticationOk => {}
                    backend::Message::AuthenticationCleartextPassword => {
                        frontend::password_message(password.as_bytes(), &mut self.write)?;
                        self.flush()?;
                    }
                    backend::Message::AuthenticationMd5Password(body) => {
                        let hash = postgres_protocol::authentication::md5_hash(
                            endpoint.user.as_bytes(),
                            password.as_bytes(),
                            body.salt(),
                        );
                        frontend::password_message(hash.as_bytes(), &mut self.write)?;
                        self.flush()?;
                    }
                    // SCRAM-SHA-256 is what every server offering SASL offers (the -PLUS
                    // variant binds to the TLS session, which this client does not do).
                    backend::Message::AuthenticationSasl(_) => {
                        let state = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                        frontend::sasl_initial_response(SCRAM_SHA_256, state.message(), &mut self.write)?;
                        self.flush()?;
                        scram = Some(state);
                    }
                    backend::Message::AuthenticationSaslContinue(body) => {
                        let state = scram.as_mut().ok_or_else(|| unexpected("SASL continue before SASL"))?;
                        state.update(body.data())?;
                        frontend::sasl_response(state.message(), &mut self.write)?;
                        self.flush()?;
                    }
                    backend::Message::AuthenticationSaslFinal(body) => {
                        let state = scram.as_mut().ok_or_else(|| unexpected("SASL final before SASL"))?;
                        state.finish(body.data())?;
                    }
                    _ => return Err(unexpected("an authentication method this client does not speak")),
                },
                b'Z' => return Ok(()),
                b'E' => return Err(ProtocolError::Server(server_error(&frame)?)),
                // ParameterStatus, BackendKeyData, NoticeResponse.
                b'S' | b'K' | b'N' => {}
                other => return Err(unexpected(&format!("message '{}' during startup", other as char))),
            }
        }
    }

    /// Runs one simple query; the rows of its last result as text (None: NULL).
    pub fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, ProtocolError> {
        assert!(!self.streaming, "a query on a streaming replication connection");
        frontend::query(sql, &mut self.write)?;
        self.flush()?;
        let mut rows = Vec::new();
        let mut failure = None;
        loop {
            let frame = self.read_frame_blocking()?;
            match frame.tag {
                b'T' => rows.clear(),
                b'D' => rows.push(data_row(&frame)?),
                b'E' => failure = Some(server_error(&frame)?),
                b'Z' => return failure.map_or(Ok(rows), |e| Err(ProtocolError::Server(e))),
                b'C' | b'I' | b'N' | b'S' => {}
                other => return Err(unexpected(&format!("message '{}' answering a query", other as char))),
            }
        }
    }

    /// Sends `START_REPLICATION …` and waits for CopyBoth mode.
    pub fn start_replication(&mut self, command: &str) -> Result<(), ProtocolError> {
        frontend::query(command, &mut self.write)?;
        self.flush()?;
        loop {
            let frame = self.read_frame_blocking()?;
            match frame.tag {
                b'W' => break,
                b'E' => {
                    let error = server_error(&frame)?;
                    // The ReadyForQuery after the error.
                    let _ = self.read_frame_blocking();
                    return Err(ProtocolError::Server(error));
                }
                b'N' | b'S' => {}
                other => return Err(unexpected(&format!("message '{}' starting replication", other as char))),
            }
        }
        self.stream.set_nonblocking(true)?;
        self.streaming = true;
        Ok(())
    }

    /// The next CopyData payload of the stream, or None when none has fully arrived.
    pub fn read_copy(&mut self) -> Result<Option<Bytes>, ProtocolError> {
        assert!(self.streaming, "read_copy before START_REPLICATION");
        loop {
            if let Some(frame) = self.parse_frame()? {
                match frame.tag {
                    b'd' => return Ok(Some(frame.body)),
                    b'E' => return Err(ProtocolError::Server(server_error(&frame)?)),
                    b'c' => return Err(unexpected("the server ended the replication stream")),
                    b'N' => continue,
                    other => return Err(unexpected(&format!("message '{}' in the replication stream", other as char))),
                }
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// A Standby Status Update: `received` written, `flushed` durable (the slot's
    /// confirmed position); `reply`: ask the server to answer with a keepalive now.
    pub fn send_status(&mut self, received: u64, flushed: u64, reply: bool) -> Result<(), ProtocolError> {
        let mut payload = BytesMut::with_capacity(34);
        payload.put_u8(b'r');
        payload.put_u64(received);
        payload.put_u64(flushed);
        payload.put_u64(flushed);
        payload.put_i64(postgres_now_micros());
        payload.put_u8(u8::from(reply));
        frontend::CopyData::new(payload.freeze())?.write(&mut self.write);
        self.flush()
    }

    fn flush(&mut self) -> Result<(), ProtocolError> {
        if self.streaming {
            self.stream.set_nonblocking(false)?;
        }
        // The flush sends what a TLS session still holds of the bytes written.
        let result = self.stream.write_all(&self.write).and_then(|()| self.stream.flush());
        self.write.clear();
        if self.streaming {
            self.stream.set_nonblocking(true)?;
        }
        Ok(result?)
    }

    fn read_frame_blocking(&mut self) -> Result<Frame, ProtocolError> {
        loop {
            if let Some(frame) = self.parse_frame()? {
                return Ok(frame);
            }
            if !self.fill()? {
                return Err(unexpected("no data on a blocking read"));
            }
        }
    }

    /// Reads what the socket has; false when a non-blocking read found nothing.
    fn fill(&mut self) -> Result<bool, ProtocolError> {
        let start = self.read.len();
        self.read.resize(start + READ_CHUNK_BYTES, 0);
        let result = self.stream.read(&mut self.read[start..]);
        match result {
            Ok(0) => {
                self.read.truncate(start);
                Err(ProtocolError::Io(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )))
            }
            Ok(n) => {
                self.read.truncate(start + n);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.read.truncate(start);
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                self.read.truncate(start);
                Ok(true)
            }
            Err(e) => {
                self.read.truncate(start);
                Err(e.into())
            }
        }
    }

    fn parse_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        if self.read.len() < 5 {
            return Ok(None);
        }
        let tag = self.read[0];
        let length = u32::from_be_bytes([self.read[1], self.read[2], self.read[3], self.read[4]]) as usize;
        if !(4..=FRAME_BYTES_MAX).contains(&length) {
            return Err(unexpected(&format!("a frame of {length} bytes (at most {FRAME_BYTES_MAX})")));
        }
        if self.read.len() < length + 1 {
            self.read.reserve(length + 1 - self.read.len());
            return Ok(None);
        }
        let mut frame = self.read.split_to(length + 1);
        frame.advance(5);
        Ok(Some(Frame { tag, body: frame.freeze() }))
    }
}

impl Drop for ReplicationConnection {
    fn drop(&mut self) {
        let mut buffer = BytesMut::new();
        frontend::terminate(&mut buffer);
        let _ = self.stream.set_nonblocking(false);
        let _ = self.stream.write_all(&buffer);
        self.stream.close();
    }
}

fn unexpected(what: &str) -> ProtocolError {
    ProtocolError::Unexpected(what.to_owned())
}

/// A frame re-assembled and parsed by `postgres-protocol`.
fn parse(frame: &Frame) -> Result<backend::Message, ProtocolError> {
    let mut bytes = BytesMut::with_capacity(frame.body.len() + 5);
    bytes.put_u8(frame.tag);
    bytes.put_u32(u32::try_from(frame.body.len() + 4).expect("a frame is bounded"));
    bytes.extend_from_slice(&frame.body);
    backend::Message::parse(&mut bytes)?.ok_or_else(|| unexpected("a truncated frame"))
}

fn server_error(frame: &Frame) -> Result<ServerError, ProtocolError> {
    let mut error = ServerError { code: String::new(), message: String::new(), detail: None };
    let mut body = &frame.body[..];
    while let Some((&kind, rest)) = body.split_first() {
        if kind == 0 {
            break;
        }
        let end = rest.iter().position(|&b| b == 0).ok_or_else(|| unexpected("an unterminated error field"))?;
        let value = String::from_utf8_lossy(&rest[..end]).into_owned();
        match kind {
            b'C' => error.code = value,
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            _ => {}
        }
        body = &rest[end + 1..];
    }
    Ok(error)
}

fn data_row(frame: &Frame) -> Result<Vec<Option<String>>, ProtocolError> {
    let mut body = &frame.body[..];
    let short = || unexpected("a truncated data row");
    if body.len() < 2 {
        return Err(short());
    }
    let count = body.get_u16() as usize;
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        if body.len() < 4 {
            return Err(short());
        }
        let length = body.get_i32();
        if length < 0 {
            values.push(None);
            continue;
        }
        let length = length as usize;
        if body.len() < length {
            return Err(short());
        }
        values.push(Some(String::from_utf8_lossy(&body[..length]).into_owned()));
        body.advance(length);
    }
    Ok(values)
}

/// Now in PostgreSQL's time: microseconds since 2000-01-01.
fn postgres_now_micros() -> i64 {
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
    unix - POSTGRES_EPOCH_MICROS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Frame {
        Frame { tag, body: Bytes::copy_from_slice(body) }
    }

    #[test]
    fn an_error_response_gives_its_code_message_and_detail() {
        let error = server_error(&frame(b'E', b"SERROR\0C42704\0Mslot \"s\" does not exist\0Dmore\0\0")).unwrap();
        assert_eq!(error.code, "42704");
        assert_eq!(error.message, "slot \"s\" does not exist");
        assert_eq!(error.detail.as_deref(), Some("more"));
    }

    #[test]
    fn a_data_row_gives_text_and_nulls_and_refuses_truncation() {
        let row = data_row(&frame(b'D', b"\0\x02\0\0\0\x02ab\xff\xff\xff\xff")).unwrap();
        assert_eq!(row, vec![Some("ab".to_owned()), None]);
        assert!(data_row(&frame(b'D', b"\0\x02\0\0\0\x05ab")).is_err());
    }
}
