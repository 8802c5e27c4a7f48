//! The listener, the thread that serves it on a tokio runtime of its own, and each
//! connection's life.
//!
//! A connection is `pgwire`'s `process_socket` raced against two events: the server's
//! stop, and the client's socket closing. `pgwire` reads the next message only after
//! the handler of the previous one finished, so a client that goes away while its query
//! runs would go unnoticed until the answer is written; the race notices it at once,
//! through a second handle on the same socket that waits for the peer's hang-up
//! (`EPOLLRDHUP`) and consumes nothing. The connection's future is then dropped, and
//! with it the query's guards: the lease is released and the execution cancelled
//! (`sluice_admin::Queries::run`).
//!
//! Bounds: [`CONNECTIONS_MAX`] at once (a connection beyond is closed at once, before
//! any byte is read); `pgwire`'s startup timeout for the startup and authentication;
//! the blocking pool of the runtime: two threads per admitted query (its preparation
//! and its execution) plus catalog queries, each with the planner's stack; shutdown
//! waits at most [`GRACE`] for open connections, then drops them.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use sluice_admin::Queries;
use sluice_types::SluiceError;
use tokio::io::Interest;
use tokio::sync::{Semaphore, watch};

use crate::handler::Backend;
use pgwire::tokio::TlsAcceptor;

/// Connections served at once.
pub const CONNECTIONS_MAX: usize = 64;
/// How long shutdown waits for open connections before dropping them.
pub const GRACE: Duration = Duration::from_secs(1);
/// How long a query over the catalog may take.
pub const CATALOG_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL listener, bound before the job starts (so that a taken port fails the
/// run before it begins).
#[derive(Debug)]
pub struct PgListener {
    listener: TcpListener,
    addr: SocketAddr,
    token: Option<String>,
    tls: Option<crate::tls::Tls>,
}

impl PgListener {
    /// Checks the access settings and binds `bind` (port 0: any free port): a
    /// non-loopback address needs `token`, the admin token, which clients give as
    /// their password.
    pub fn bind(bind: SocketAddr, token: Option<String>) -> Result<PgListener, SluiceError> {
        check_access(bind, token.as_deref())?;
        let listener = TcpListener::bind(bind).map_err(|e| {
            SluiceError::external("pgwire.bind", format!("the PostgreSQL endpoint cannot listen on {bind}: {e}"))
                .with_fix("choose another address or port with --pg-bind (port 0: any free port)")
        })?;
        let addr = listener.local_addr().map_err(|e| start_error(format!("its address: {e}")))?;
        Ok(PgListener { listener, addr, token, tls: None })
    }

    /// Also serves TLS (clients asking for it with `sslmode=require` or `prefer`) with
    /// the certificate chain and private key in the PEM files `certificate` and `key`.
    pub fn with_tls(mut self, certificate: &std::path::Path, key: &std::path::Path) -> Result<PgListener, SluiceError> {
        self.tls = Some(crate::tls::Tls::load(certificate, key)?);
        Ok(self)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves ad-hoc queries through `queries` (the admin API's, to share its bounds; or
    /// `Queries::new` when the admin API is off) from a thread of its own.
    pub fn serve(self, queries: Queries) -> Result<PgServer, SluiceError> {
        let PgListener { listener, addr, token, tls } = self;
        listener.set_nonblocking(true).map_err(|e| start_error(format!("a non-blocking socket: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(2 * sluice_admin::MAX_QUERIES + 4)
            // Queries are planned and run on blocking threads: the planner's stack.
            .thread_stack_size(sluice_engine::QUERY_STACK_BYTES)
            .build()
            .map_err(|e| start_error(format!("a runtime: {e}")))?;
        let backend = Arc::new(Backend::new(queries, token.as_deref(), tls.as_ref()));
        let acceptor = tls.map(|tls| tls.acceptor);
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("sluice-pgwire".into())
            .spawn(move || run(runtime, listener, backend, acceptor, stopped))
            .map_err(|e| start_error(format!("a thread: {e}")))?;
        Ok(PgServer { addr, thread: sluice_admin::ServerThread::new("PostgreSQL endpoint", stop, thread) })
    }
}

/// The rule of the admin API: a non-loopback address needs a token, never empty.
fn check_access(bind: SocketAddr, token: Option<&str>) -> Result<(), SluiceError> {
    if token.is_some_and(|token| token.trim().is_empty()) {
        return Err(SluiceError::user("pgwire.token", "the admin token is empty")
            .with_fix("put a non-empty secret in the --admin-token-file file (or SLUICE_ADMIN_TOKEN)"));
    }
    if token.is_none() && sluice_admin::needs_token(bind) {
        return Err(SluiceError::user(
            "pgwire.token",
            format!("the PostgreSQL endpoint would listen on {bind}, a non-loopback address, without a password"),
        )
        .with_fix(
            "give the admin token with --admin-token-file PATH (or SLUICE_ADMIN_TOKEN): clients send it as their \
             password; or bind a loopback address (--pg-bind 127.0.0.1:5432)",
        ));
    }
    Ok(())
}

fn start_error(what: String) -> SluiceError {
    SluiceError::external("pgwire.start", format!("the PostgreSQL endpoint cannot start: cannot get {what}"))
        .with_fix("check the process's limits (threads, open files); or run without --pg-bind")
}

/// A running PostgreSQL endpoint. Dropping it (or [`PgServer::shutdown`]) stops it.
#[derive(Debug)]
pub struct PgServer {
    addr: SocketAddr,
    thread: sluice_admin::ServerThread,
}

impl PgServer {
    /// The address it listens on (the port chosen when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets open connections go on for at most [`GRACE`], and waits for
    /// the server's thread.
    pub fn shutdown(mut self) {
        self.thread.stop_and_join();
    }
}

/// The server's thread: accepts until asked to stop, then at most [`GRACE`] more.
fn run(
    runtime: tokio::runtime::Runtime,
    listener: TcpListener,
    backend: Arc<Backend>,
    acceptor: Option<TlsAcceptor>,
    stopped: watch::Receiver<bool>,
) {
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "the PostgreSQL endpoint cannot listen");
                return;
            }
        };
        let open = Arc::new(Semaphore::new(CONNECTIONS_MAX));
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = asked(stopped.clone()) => break,
            };
            // Reap the connections that ended, so the set holds only open ones.
            while connections.try_join_next().is_some() {}
            let (socket, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // A connection that failed before it was accepted (or the process
                    // is out of files): the next accept goes on.
                    tracing::debug!(%error, "a PostgreSQL connection failed to be accepted");
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                tracing::warn!(%peer, "closed a PostgreSQL connection: {CONNECTIONS_MAX} are open");
                continue;
            };
            let backend = Arc::clone(&backend);
            let acceptor = acceptor.clone();
            let stopped = stopped.clone();
            connections.spawn(async move {
                let _permit = permit;
                serve_connection(socket, backend, acceptor, stopped).await;
            });
        }
        // Stopped: the open connections go on for at most GRACE.
        let drained = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(GRACE, drained).await.is_err() {
            tracing::debug!("the PostgreSQL endpoint dropped the connections still open after {GRACE:?}");
        }
    });
    // Executions still going on the blocking pool were cancelled with their connections.
    runtime.shutdown_background();
}

/// One connection, until it ends, its client hangs up or the server stops.
async fn serve_connection(
    socket: tokio::net::TcpStream,
    backend: Arc<Backend>,
    acceptor: Option<TlsAcceptor>,
    stopped: watch::Receiver<bool>,
) {
    let (socket, watch) = match watched(socket) {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(%error, "a PostgreSQL connection could not be watched");
            return;
        }
    };
    tokio::select! {
        served = pgwire::tokio::process_socket(socket, acceptor, Arc::clone(&backend)) => {
            if let Err(error) = served {
                tracing::debug!(%error, "a PostgreSQL connection ended with an error");
            }
        }
        () = hung_up(watch) => tracing::debug!("a PostgreSQL client went away"),
        () = asked(stopped) => {}
    }
}

/// The socket, and a second handle on it (a duplicated descriptor) to watch for the
/// peer's hang-up.
fn watched(socket: tokio::net::TcpStream) -> std::io::Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let socket = socket.into_std()?;
    let watch = socket.try_clone()?;
    Ok((tokio::net::TcpStream::from_std(socket)?, tokio::net::TcpStream::from_std(watch)?))
}

/// Resolves once the peer closed its side (or the socket failed). Reads nothing: a
/// readiness that is not a hang-up (the client's next message arrived) is cleared and
/// waited for again, so each wake-up is a new event, never a spin.
async fn hung_up(watch: tokio::net::TcpStream) {
    loop {
        match watch.ready(Interest::READABLE).await {
            Ok(ready) if ready.is_read_closed() => return,
            Ok(_) => {
                // Clears the readiness without consuming the bytes `pgwire` will read.
                let _ = watch.try_io(Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
            }
            Err(_) => return,
        }
    }
}

/// Resolves once a stop was asked for (or the handle is gone).
async fn asked(mut stopped: watch::Receiver<bool>) {
    // An error means the sender was dropped: stop as well.
    let _ = stopped.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_address_needs_the_token_and_a_token_is_never_empty() {
        let anywhere: SocketAddr = "0.0.0.0:5432".parse().expect("addr");
        let loopback: SocketAddr = "127.0.0.1:5432".parse().expect("addr");
        let refused = check_access(anywhere, None).expect_err("refused");
        assert_eq!(refused.code, "pgwire.token");
        assert!(refused.fix.as_deref().is_some_and(|fix| fix.contains("--admin-token-file")), "{refused:?}");
        assert!(check_access(anywhere, Some("t")).is_ok());
        assert!(check_access(loopback, None).is_ok());
        assert!(check_access(loopback, Some(" ")).is_err());
    }
}
