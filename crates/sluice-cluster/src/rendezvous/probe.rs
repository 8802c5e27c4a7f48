//! Whether the leader still runs, asked by a worker that lost its control session with
//! it: the one fact that decides what to restart. A leader that runs keeps its control
//! port open for the whole job (it refuses late joiners during a round and takes joins
//! again while it forms the cluster anew), and, like every worker, answers a connection
//! at once with its auth preamble (`auth`: each side writes its preamble first). So:
//!
//! - the preamble arrives: the leader runs. The session was lost because the leader
//!   declared this worker lost (this worker, or the network between them, was silent
//!   past the loss timeout: a stopped or starved process), and with checkpoints it now
//!   forms the cluster again, waiting for this worker alone;
//! - the connection is refused, or accepted but silent (a stopped process's kernel still
//!   accepts), or nothing answers in time: the leader is gone, stopped or unreachable.
//!
//! The probe reads the whole preamble and closes, so the leader sees a connection that
//! closed before writing a byte, which it logs as a stray and forgets.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::auth::{AUTH_MAGIC, PREAMBLE_BYTES, is_timeout};

/// How long a probe waits for the connection and the preamble together.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the leader at `address` (`host:port`, its control address) answers within
/// `timeout`; otherwise what was seen, for a message ("nothing listens there …").
pub fn leader_answers(address: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let resolved = address.to_socket_addrs().map_err(|e| format!("its address does not resolve: {e}"))?.next();
    let resolved = resolved.ok_or_else(|| "its address resolves to nothing".to_string())?;
    let mut stream = TcpStream::connect_timeout(&resolved, timeout).map_err(|error| match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "nothing listens there (connection refused)".to_string(),
        _ if is_timeout(&error) => format!("no connection within {} ms", timeout.as_millis()),
        _ => format!("connecting failed: {error}"),
    })?;
    let mut preamble = [0u8; PREAMBLE_BYTES];
    let mut filled = 0;
    while filled < PREAMBLE_BYTES {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(|e| format!("its socket failed: {e}"))?;
        match stream.read(&mut preamble[filled..]) {
            Ok(0) => return Err("it accepted the connection and closed it without a word".into()),
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) if is_timeout(&error) => {
                return Err(format!(
                    "it accepted the connection but said nothing within {} ms (a stopped or hung process)",
                    timeout.as_millis()
                ));
            }
            Err(error) => return Err(format!("reading its answer failed: {error}")),
        }
    }
    if preamble[..AUTH_MAGIC.len()] != AUTH_MAGIC {
        return Err("what answers there is not a Sluice worker".into());
    }
    Ok(())
}
