//! The state every handler shares: the job, the token, and the bounded pieces of the
//! server (admitted queries and streams, the members' last answers, the sampler, the
//! slice leases, relayed checkpoints, the Host names and the connection limits). It
//! sits below the handlers: its pieces are defined in modules that do not read it.

use std::sync::Arc;

use sluice_engine::JobHandle;
use tokio::sync::Semaphore;

use crate::connections::Limits;
use crate::sampler::Sampler;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) job: JobHandle,
    pub(crate) token: Option<Arc<str>>,
    pub(crate) streams: Arc<Semaphore>,
    /// The path of ad-hoc queries (at most [`crate::queries::MAX_QUERIES`] admitted at
    /// once), shared with the other front ends given `AdminServer::queries`.
    pub(crate) queries: crate::queries::Queries,
    /// In a cluster, the other workers' last answers, kept by the asking task for the
    /// status streams (`members`).
    pub(crate) members: Arc<crate::members::Members>,
    /// The latest rates and the checkpoint history, kept by the sampling task.
    pub(crate) sampler: Arc<Sampler>,
    /// The leases other workers of a cluster hold here for their queries.
    pub(crate) slices: Arc<std::sync::Mutex<crate::slices::SliceLeases>>,
    /// The address this API listens on.
    pub(crate) admin_addr: Option<String>,
    /// Checkpoint requests a follower relays to its leader now (at most
    /// `routes::MAX_RELAYED_CHECKPOINTS`: each holds a blocking thread).
    pub(crate) relays: Arc<Semaphore>,
    /// The names a request's Host may give (`site`).
    pub(crate) hosts: Arc<crate::site::Hosts>,
    /// The bounds on connections; `query` reads its body within `body_timeout`.
    pub(crate) limits: Limits,
}
