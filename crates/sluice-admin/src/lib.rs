//! The admin HTTP API of one running job (`GET /healthz`, `/readyz`, `/status`,
//! `/status/stream`, `/metrics`, `/graph`; `POST /stop`, `POST /query`), served on a thread of its own by
//! [`serve`]. It serves one worker's job (a cluster's workers each serve their own);
//! nothing here changes the run but `POST /stop`, which asks for the same ordered drain
//! as Ctrl-C. In a cluster, `POST /query` on any worker answers for the whole pipeline:
//! it gathers the other workers' slices through their internal endpoints (`slices`);
//! `/status`, `/graph` and the status stream add every worker's counters (the stream's
//! lines from the other workers' last answers, kept by `members`).
//!
//! Access: on a loopback address anyone local may call it; elsewhere a bearer token is
//! required (the `access` module). A browser may call it only from its own page: the
//! Host must name the API, a cross-site Origin is refused and every POST is JSON
//! (`site`). Bounds: connections in number, per peer and in time (`connections`); see
//! each module; nothing queues per client.

mod access;
mod bodies;
mod connections;
mod graph;
mod members;
mod metrics;
mod openapi;
mod peer_http;
mod queries;
mod query;
mod routes;
mod sampler;
mod server;
mod shared;
mod site;
mod slice_routes;
mod slices;
mod status;
mod stream;

pub use connections::{BODY_TIMEOUT, CONNECTIONS_MAX, CONNECTIONS_PER_PEER_MAX, HEADER_TIMEOUT, Limits};
pub use queries::{MAX_QUERIES, Queries};
pub use sampler::{HISTORY, SAMPLE_EVERY};
pub use server::{AdminListener, AdminServer, GRACE, ServerThread, serve};
pub use slices::MAX_SLICE_LEASES;

#[cfg(test)]
mod tests;
pub use stream::{HEARTBEAT, MAX_STREAMS};

/// Checks the access settings before anything starts: a non-loopback `bind` needs a
/// `token`, and a token is never empty ([`serve`] checks the same).
pub fn check_access(bind: std::net::SocketAddr, token: Option<&str>) -> Result<(), sluice_types::SluiceError> {
    access::settle(bind, token.map(str::to_string)).map(|_| ())
}

/// Whether `bind` needs a token: the rule of the admin API, which the PostgreSQL wire
/// protocol (`sluice-pgwire`) applies too (a non-loopback address does).
pub fn needs_token(bind: std::net::SocketAddr) -> bool {
    !bind.ip().is_loopback()
}
