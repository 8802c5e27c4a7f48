//! The server: the routes, and the thread that runs them on a tokio runtime of its own
//! (the rest of Sluice is std threads).
//!
//! Bounds: one current-thread runtime; connections capped in number, per peer and in
//! time (`connections`); the status stream's waits on the blocking pool
//! (at most [`crate::stream::MAX_STREAMS`]), and one more for the other workers' round
//! of asks (`members`); shutdown waits at most [`GRACE`] for open
//! requests, then drops them.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use sluice_engine::JobHandle;
use sluice_types::SluiceError;
use tokio::sync::{Semaphore, watch};

use crate::connections::Limits;
use crate::sampler::{self, Sampler};
use crate::shared::Shared;
use crate::{access, openapi, routes, site, stream};

/// How long shutdown waits for open requests (status streams) before dropping them.
pub const GRACE: Duration = Duration::from_secs(1);

/// A running admin server. Dropping it (or [`AdminServer::shutdown`]) stops it.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    queries: crate::queries::Queries,
    thread: ServerThread,
}

/// A server's thread and the signal that stops it (the admin API's, the PostgreSQL
/// endpoint's). Stopping sends the signal and waits for the thread, which ends at most
/// its server's grace period later; dropping it stops it.
#[derive(Debug)]
pub struct ServerThread {
    /// The server, for a log line if its thread panicked.
    name: &'static str,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    pub fn new(name: &'static str, stop: watch::Sender<bool>, thread: JoinHandle<()>) -> ServerThread {
        ServerThread { name, stop: Some(stop), thread: Some(thread) }
    }

    /// Signals the server to stop and waits for its thread.
    pub fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            // No receiver left means the server already ended.
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the {}'s thread panicked", self.name);
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl AdminServer {
    /// The address it listens on (the port chosen when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its path of ad-hoc queries, to share with another front end (the PostgreSQL
    /// wire protocol): one admission bound for both.
    pub fn queries(&self) -> crate::queries::Queries {
        self.queries.clone()
    }

    /// Stops accepting, lets open requests finish for at most [`GRACE`], and waits for
    /// the server's thread.
    pub fn shutdown(mut self) {
        self.thread.stop_and_join();
    }
}

/// Serves the admin API of `job` on `bind` (port 0: any free port) from a thread of its
/// own. Off loopback, `token` is required (see [`crate::access`]).
pub fn serve(job: JobHandle, bind: SocketAddr, token: Option<String>) -> Result<AdminServer, SluiceError> {
    AdminListener::bind(bind, token)?.serve(job)
}

/// The admin API's listener, bound before its job starts: a cluster's worker announces
/// its address to the others while the cluster forms.
#[derive(Debug)]
pub struct AdminListener {
    listener: TcpListener,
    addr: SocketAddr,
    token: Option<String>,
    hosts: Vec<String>,
    limits: Limits,
}

impl AdminListener {
    /// Checks the access settings and binds `bind` (port 0: any free port).
    pub fn bind(bind: SocketAddr, token: Option<String>) -> Result<AdminListener, SluiceError> {
        let token = access::settle(bind, token)?;
        let listener = TcpListener::bind(bind).map_err(|e| {
            SluiceError::external("admin.bind", format!("the admin API cannot listen on {bind}: {e}")).with_fix(
                "choose another address or port with --admin-bind (port 0: any free port), or --admin-bind off",
            )
        })?;
        let addr = listener.local_addr().map_err(|e| thread_error(format!("its address: {e}")))?;
        Ok(AdminListener { listener, addr, token, hosts: Vec::new(), limits: Limits::default() })
    }

    /// Also answers requests whose Host names one of `names` (`host` or `host:port`),
    /// besides the bound address (see `site`): the names other workers or users reach
    /// this API by.
    #[must_use]
    pub fn with_hosts(mut self, names: Vec<String>) -> AdminListener {
        self.hosts.extend(names);
        self
    }

    /// Serves with other bounds on connections than [`Limits::default`].
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> AdminListener {
        self.limits = limits;
        self
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the admin API of `job` on it (see [`serve`]).
    pub fn serve(self, job: JobHandle) -> Result<AdminServer, SluiceError> {
        let hosts = site::Hosts::new(self.addr, &self.hosts);
        start(job, self.listener, self.addr, self.token, hosts, self.limits)
    }
}

fn start(
    job: JobHandle,
    listener: TcpListener,
    addr: SocketAddr,
    token: Option<String>,
    hosts: site::Hosts,
    limits: Limits,
) -> Result<AdminServer, SluiceError> {
    listener.set_nonblocking(true).map_err(|e| thread_error(format!("a non-blocking socket: {e}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(stream::MAX_STREAMS + 2 * crate::queries::MAX_QUERIES + 2)
        // Queries are planned and run on blocking threads: the planner's stack, so that
        // a query at the nesting limit cannot overflow it (reserved, touched as used).
        .thread_stack_size(sluice_engine::QUERY_STACK_BYTES)
        .build()
        .map_err(|e| thread_error(format!("a runtime: {e}")))?;
    let queries = crate::queries::Queries::new(job.clone(), token.as_deref());
    let shared = Shared {
        job,
        token: token.map(Arc::from),
        streams: Arc::new(Semaphore::new(stream::MAX_STREAMS)),
        queries: queries.clone(),
        sampler: Arc::new(Sampler::default()),
        members: crate::members::Members::new(),
        slices: crate::slices::leases(),
        admin_addr: Some(addr.to_string()),
        relays: Arc::new(Semaphore::new(crate::routes::MAX_RELAYED_CHECKPOINTS)),
        hosts: Arc::new(hosts),
        limits,
    };
    let (stop, stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("sluice-admin".into())
        .spawn(move || run(runtime, listener, shared, stopped))
        .map_err(|e| thread_error(format!("a thread: {e}")))?;
    Ok(AdminServer { addr, queries, thread: ServerThread::new("admin API", stop, thread) })
}

fn thread_error(what: String) -> SluiceError {
    SluiceError::external("admin.start", format!("the admin API cannot start: cannot get {what}"))
        .with_fix("check the process's limits (threads, open files); or run with --admin-bind off")
}

/// Every route, behind the Host and Origin guard, the token and the JSON check.
fn router(shared: Shared) -> Router {
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .route("/status", get(routes::status_document))
        .route("/status/stream", get(routes::status_stream))
        .route("/metrics", get(routes::metrics_text))
        .route("/graph", get(routes::graph_document))
        .route("/stop", post(routes::stop))
        .route("/checkpoint", post(routes::checkpoint))
        .route("/pause", post(routes::pause))
        .route("/resume", post(routes::resume))
        .route("/query", post(crate::query::query))
        .route("/internal/lease", post(crate::slice_routes::lease))
        .route("/internal/slice", post(crate::slice_routes::slice))
        .route("/internal/release", post(crate::slice_routes::release))
        .route("/internal/status", post(routes::internal_status))
        .route("/internal/graph", post(routes::internal_graph))
        .route("/openapi.json", get(openapi::openapi_document))
        .route("/", get(routes::page))
        // Innermost: a POST that is not JSON, once the caller showed its token.
        .layer(axum::middleware::from_fn(site::require_json))
        .layer(axum::middleware::from_fn_with_state(shared.token.clone(), access::require_token))
        // Outermost: a cross-site request is refused before anything else looks at it.
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&shared.hosts), site::guard))
        .with_state(shared)
}

/// The server's thread: serves until asked to stop, then at most [`GRACE`] more.
fn run(runtime: tokio::runtime::Runtime, listener: TcpListener, shared: Shared, stopped: watch::Receiver<bool>) {
    runtime.block_on(async move {
        // Ends with the runtime.
        tokio::spawn(sample(shared.job.clone(), Arc::clone(&shared.sampler)));
        tokio::spawn(crate::members::ask(
            shared.job.clone(),
            shared.token.clone(),
            Arc::clone(&shared.members),
            Arc::clone(&shared.streams),
            stream::MAX_STREAMS,
        ));
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "the admin API cannot listen");
                return;
            }
        };
        let limits = shared.limits;
        let mut open = crate::connections::accept(listener, router(shared), limits, stopped).await;
        // Stopped: the open connections finish their requests, for at most GRACE.
        let drained = async { while open.join_next().await.is_some() {} };
        if tokio::time::timeout(GRACE, drained).await.is_err() {
            tracing::debug!("the admin API dropped the connections still open after {GRACE:?}");
        }
    });
    // Waits still going on the blocking pool end within their heartbeat; nobody reads them.
    runtime.shutdown_background();
}

/// Reads the job's counters every [`sampler::SAMPLE_EVERY`], forever.
async fn sample(job: JobHandle, sampler: Arc<Sampler>) {
    let mut ticks = tokio::time::interval(sampler::SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        sampler.sample(&job.metrics(), &job.status(), std::time::Instant::now(), sampler::now_ms());
    }
}
