//! Blocking socket helpers with deadlines: every read and write of the rendezvous ends
//! by a fixed instant, whatever the peer does.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use sluice_types::SluiceError;

use crate::auth::is_timeout;
use crate::wire::{ControlMessage, Fill, FrameReader, Problem, refusal_frame};

/// How long a refusing side keeps the connection open so that its refusal is read
/// before the connection closes (a close with unread input would reset it).
const REFUSAL_LINGER: Duration = Duration::from_secs(2);
/// At most this much is read and discarded while lingering.
const MAX_DRAIN_BYTES: usize = 2 << 20;

/// A stream whose every read and write ends by `deadline` (an `io::ErrorKind::TimedOut`
/// error after it).
pub(crate) struct Deadline<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Deadline<'_> {
    pub(crate) fn new(stream: &TcpStream, deadline: Instant) -> Deadline<'_> {
        Deadline { stream, deadline }
    }

    fn remaining(&self) -> io::Result<Duration> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the deadline passed"));
        }
        Ok(remaining.max(Duration::from_millis(1)))
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why no message was read.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// The bytes are not an acceptable frame.
    Wire(Problem),
    /// The peer closed the connection (`buffered` bytes of a frame had arrived).
    Closed {
        buffered: usize,
    },
    /// The deadline passed.
    TimedOut,
    Io(io::Error),
}

/// Reads the next message, or fails by `deadline`.
pub(crate) fn read_until(
    stream: &TcpStream,
    reader: &mut FrameReader,
    deadline: Instant,
) -> Result<ControlMessage, ReadFailure> {
    let mut source = Deadline::new(stream, deadline);
    loop {
        if let Some(message) = reader.next_buffered().map_err(ReadFailure::Wire)? {
            return Ok(message);
        }
        match reader.fill(&mut source) {
            Ok(Fill::Data) => {}
            Ok(Fill::Closed { buffered }) => return Err(ReadFailure::Closed { buffered }),
            Err(error) if is_timeout(&error) && Instant::now() >= deadline => return Err(ReadFailure::TimedOut),
            Err(error) if is_timeout(&error) => {}
            Err(error) => return Err(ReadFailure::Io(error)),
        }
    }
}

/// Writes all of `bytes`, or fails by `deadline`.
pub(crate) fn write_until(stream: &TcpStream, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    Deadline::new(stream, deadline).write_all(bytes)
}

/// Sends `error` as a refusal frame (announcing `version`) and closes the connection once
/// the peer has read it (or after [`REFUSAL_LINGER`]). Best effort: the peer may be gone.
pub(crate) fn refuse(stream: TcpStream, error: &SluiceError, version: u16) {
    let deadline = Instant::now() + REFUSAL_LINGER;
    let _ = write_until(&stream, &refusal_frame(&error.to_string(), version), deadline);
    linger(stream, deadline);
}

/// Closes our side, then reads and discards until the peer closes or `deadline`.
pub(crate) fn linger(stream: TcpStream, deadline: Instant) {
    let _ = stream.shutdown(Shutdown::Write);
    let mut source = Deadline::new(&stream, deadline);
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN_BYTES {
        match source.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Whether the peer has closed `stream` (a look without blocking and without consuming).
pub(crate) fn is_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() != io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    closed
}
