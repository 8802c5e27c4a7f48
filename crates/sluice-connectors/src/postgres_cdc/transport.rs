//! The replication session's bytes: the `TcpStream` itself, or a TLS session over it
//! (rustls, as `url`'s `sslmode` says; see [`crate::postgres::tls`]).
//!
//! Opening follows the protocol's order: unless `sslmode=disable`, the client sends an
//! SSLRequest (8 bytes: length 8, code 80877103) and the server answers one byte, `S`
//! (the TLS handshake follows, then every message goes through the session) or `N`
//! (plain, accepted under `prefer` only). Nothing else may come first: the server
//! sends nothing before its answer, so the byte read is its answer and no message
//! bytes are lost in between. The answer and the handshake are bounded by the
//! connection's timeout; after them the socket has no timeout, as a plain session.
//!
//! Both forms honour `set_nonblocking`: a non-blocking read with nothing (or only part
//! of a TLS record) available is `WouldBlock`, the part kept by rustls for the next read.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use crate::postgres::tls::{TlsFailure, TlsSettings};

/// A plain or encrypted connection to the server.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

/// Why opening failed: the socket, or TLS (a refusal, a certificate, the roots).
#[derive(Debug)]
pub enum OpenError {
    Io(io::Error),
    Tls(TlsFailure),
}

impl Transport {
    /// Negotiates TLS on a connected socket as `settings` say; `host` is the name the
    /// certificate is checked against (`verify-full`) and sent as SNI.
    pub fn open(
        socket: TcpStream,
        host: &str,
        settings: &TlsSettings,
        timeout: Duration,
    ) -> Result<Transport, OpenError> {
        let Some(config) = settings.client_config().map_err(OpenError::Tls)? else {
            return Ok(Transport::Plain(socket));
        };
        let mut socket = socket;
        socket.set_read_timeout(Some(timeout)).map_err(OpenError::Io)?;
        socket.set_write_timeout(Some(timeout)).map_err(OpenError::Io)?;
        let mut request = BytesMut::with_capacity(8);
        frontend::ssl_request(&mut request);
        debug_assert_eq!(request.as_ref(), [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
        socket.write_all(&request).map_err(OpenError::Io)?;
        let mut answer = [0u8; 1];
        socket.read_exact(&mut answer).map_err(OpenError::Io)?;
        let transport = match answer[0] {
            b'N' if settings.requires_tls() => return Err(OpenError::Tls(TlsFailure::ServerRefused)),
            b'N' => Transport::Plain(socket),
            b'S' => Transport::Tls(Box::new(handshake(socket, host, config)?)),
            other => {
                let message = format!("the server answered the SSLRequest with byte {other:#04x}, not S or N");
                return Err(OpenError::Io(io::Error::new(ErrorKind::InvalidData, message)));
            }
        };
        transport.socket().set_read_timeout(None).map_err(OpenError::Io)?;
        transport.socket().set_write_timeout(None).map_err(OpenError::Io)?;
        Ok(transport)
    }

    fn socket(&self) -> &TcpStream {
        match self {
            Transport::Plain(socket) => socket,
            Transport::Tls(stream) => stream.get_ref(),
        }
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.socket().set_nonblocking(nonblocking)
    }

    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.socket().set_nodelay(nodelay)
    }

    /// Ends a TLS session with its close_notify (after the caller's last message);
    /// nothing for a plain one. Best effort: the connection is being dropped.
    pub fn close(&mut self) {
        if let Transport::Tls(stream) = self {
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
    }
}

/// The TLS handshake over `socket`, its failures classified.
fn handshake(
    mut socket: TcpStream,
    host: &str,
    config: rustls::ClientConfig,
) -> Result<StreamOwned<ClientConnection, TcpStream>, OpenError> {
    let name = ServerName::try_from(host.to_owned()).map_err(|e| {
        OpenError::Tls(TlsFailure::Handshake { detail: format!("the host {host:?} is not a name TLS accepts: {e}") })
    })?;
    let mut connection = ClientConnection::new(Arc::new(config), name)
        .map_err(|e| OpenError::Tls(TlsFailure::of_handshake(&e, host)))?;
    while connection.is_handshaking() {
        if let Err(error) = connection.complete_io(&mut socket) {
            let failure = TlsFailure::find(&error, host).unwrap_or(TlsFailure::Handshake { detail: error.to_string() });
            return Err(OpenError::Tls(failure));
        }
    }
    Ok(StreamOwned::new(connection, socket))
}

impl Read for Transport {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(socket) => socket.read(buffer),
            Transport::Tls(stream) => stream.read(buffer),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(socket) => socket.write(bytes),
            Transport::Tls(stream) => stream.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(socket) => socket.flush(),
            Transport::Tls(stream) => stream.flush(),
        }
    }
}
