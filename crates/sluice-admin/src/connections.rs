//! The accept loop: every connection bounded in number, per peer and in time, so that
//! slow or idle clients (a slowloris) can neither hold the API nor use up the process's
//! open files, which its sinks and checkpoints need.
//!
//! - At most [`Limits::connections_max`] connections are open at once, and at most
//!   [`Limits::connections_per_peer_max`] from one IP address; a connection past either
//!   is closed as soon as it is accepted (so the kernel's queue does not fill either).
//!   The per-peer cap is below the total, so one peer alone never takes every slot: a
//!   probe from another address (the kubelet's) still gets in.
//! - A request's head must arrive within [`Limits::header_timeout`], counted from when
//!   the connection starts waiting for it (a new connection, or an idle kept-alive one),
//!   so a connection that sends nothing, or its headers a byte at a time, is closed.
//! - A request's body (only `POST /query` reads one) must arrive within
//!   [`Limits::body_timeout`] (`query`).
//!
//! Stopping: the loop stops accepting; each open connection finishes the request it
//! serves and closes (hyper's graceful shutdown); the server's thread gives them
//! [`crate::GRACE`], then drops them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// The bounds on the API's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub connections_max: usize,
    /// Connections open at once from one IP address.
    pub connections_per_peer_max: usize,
    /// How long a request's head may take to arrive.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections_max: CONNECTIONS_MAX,
            connections_per_peer_max: CONNECTIONS_PER_PEER_MAX,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
        }
    }
}

/// Connections open at once: well below a common open-file limit (1024).
pub const CONNECTIONS_MAX: usize = 256;
/// Connections open at once from one IP address (every local client is 127.0.0.1).
pub const CONNECTIONS_PER_PEER_MAX: usize = 128;
/// How long a request's head may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head hyper buffers.
const HEAD_BYTES_MAX: usize = 64 << 10;
/// How long the loop waits after an accept fails (out of open files, say) before it
/// accepts again, so that it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The connections open per peer; a [`PeerSlot`] gives its count back when dropped.
#[derive(Debug, Default)]
struct Peers {
    open: Mutex<HashMap<IpAddr, usize>>,
}

struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    /// A slot for one more connection from `ip`, unless it has `max` open.
    fn take(self: &Arc<Peers>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot { peers: Arc::clone(self), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Accepts and serves connections on `listener` until `stopped`; then returns the
/// connections still open, for the caller to give a grace period.
pub(crate) async fn accept(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    stopped: watch::Receiver<bool>,
) -> JoinSet<()> {
    let open = Arc::new(Semaphore::new(limits.connections_max));
    let peers = Arc::new(Peers::default());
    let mut connections = JoinSet::new();
    loop {
        // Reap the connections that ended, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = asked(stopped.clone()) => return connections,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "the admin API could not accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Past a cap the stream is dropped here: closed at once.
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!(%peer, "refused: {} connections open", limits.connections_max);
            continue;
        };
        let Some(slot) = peers.take(peer.ip(), limits.connections_per_peer_max) else {
            tracing::debug!(%peer, "refused: {} connections open from it", limits.connections_per_peer_max);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let stopped = stopped.clone();
        connections.spawn(async move {
            let (_permit, _slot) = (permit, slot);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(HEAD_BYTES_MAX);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = asked(stopped) => {
                    connection.as_mut().graceful_shutdown();
                    // A connection's end (closed, timed out, broken off) is nobody's error.
                    let _ = connection.await;
                }
            }
        });
    }
}

/// Resolves once a stop was asked for (or the handle is gone).
pub(crate) async fn asked(mut stopped: watch::Receiver<bool>) {
    // An error means the sender was dropped: stop as well.
    let _ = stopped.wait_for(|stop| *stop).await;
}
