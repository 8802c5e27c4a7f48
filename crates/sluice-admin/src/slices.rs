//! A cluster's query across workers: the internal endpoints' protocol (served by
//! `slice_routes`) through which the worker that received `POST /query` leases and reads
//! this worker's slices of the materialized tables, the leases held here, and
//! [`HttpGather`], the asking worker's side of them (see `sluice_engine::query` for the
//! protocol: every worker leases its newest committed epoch, all are read at the newest
//! of those).
//!
//! - `POST /internal/lease` `{"timeout_ms": N}` → `{"lease": ID, "epoch": E}`: a lease on
//!   this worker's newest committed epoch, held here until released or for `timeout_ms`.
//! - `POST /internal/slice` `{"lease": ID, "table": NAME, "epoch": E, "wait_ms": N}` →
//!   this worker's slice of `NAME` at `E` as an Arrow IPC stream.
//! - `POST /internal/release` `{"lease": ID}` → 204.
//!
//! They sit behind the same bearer token as the rest of the API (every worker of a
//! cluster is given the same token, and sends it to the others). They are left out of
//! the OpenAPI document on purpose: they serve the cluster's workers, not its users, and
//! their contract changes with the workers' version (all run one).
//!
//! Bounds: at most [`MAX_SLICE_LEASES`] leases held at once (503 beyond; expired ones
//! are forgotten first); every request of [`HttpGather`] ends by the query's deadline
//! (connect, write and every read), and reads at most the bytes left in the query's
//! budget; a body must announce its length.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use serde::{Deserialize, Serialize};
use sluice_engine::materialize::{Lease, Table};
use sluice_engine::query::{Gather, Peer, RemoteLease};
use sluice_types::SluiceError;

/// Leases other workers may hold here at once.
pub const MAX_SLICE_LEASES: usize = 64;

/// The leases other workers hold here, by id.
#[derive(Default)]
pub(crate) struct SliceLeases {
    pub(crate) held: HashMap<u64, Arc<Lease>>,
    pub(crate) next: u64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseRequest {
    pub(crate) timeout_ms: u64,
}

#[derive(Debug, Deserialize, Serialize)]
pub(crate) struct LeaseAnswer {
    pub(crate) lease: u64,
    pub(crate) epoch: u64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SliceRequest {
    pub(crate) lease: u64,
    pub(crate) table: String,
    pub(crate) epoch: u64,
    pub(crate) wait_ms: u64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    pub(crate) lease: u64,
}

/// The receiving worker's side: the other workers' endpoints over HTTP/1.1, one request
/// per connection, with the token this worker's API requires (the cluster shares it).
pub(crate) struct HttpGather {
    pub(crate) token: Option<Arc<str>>,
}

/// The longest a release waits.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer to a lease or a release (JSON, or an error).
const SMALL_BODY: usize = 64 << 10;

impl HttpGather {
    /// `POST path` with a JSON body to `peer`: the status and at most `max_bytes` of body.
    fn post(
        &self,
        peer: &Peer,
        path: &str,
        body: &impl Serialize,
        deadline: Instant,
        max_bytes: usize,
    ) -> Result<(u16, Vec<u8>), SluiceError> {
        if peer.admin_addr.is_empty() {
            return Err(SluiceError::user(
                "query.worker_without_admin",
                format!("{peer} runs without an admin API, so its slice cannot be read"),
            )
            .with_fix("run every worker with an admin API (--admin-bind ADDR, not off)"));
        }
        let unreachable = |detail: String| {
            SluiceError::external(
                "query.worker_unreachable",
                format!("{peer} cannot be reached: {detail}; no answer is made from the other workers' slices alone"),
            )
            .with_fix("check that the worker runs (GET /status on the leader); ask again once it is back")
        };
        let content = serde_json::to_vec(body).map_err(|e| SluiceError::internal("query.gather", e.to_string()))?;
        crate::peer_http::post(&peer.admin_addr, self.token.as_deref(), path, &content, deadline, max_bytes).map_err(
            |error| match error {
                crate::peer_http::PostError::Unreachable(detail) => unreachable(detail),
                crate::peer_http::PostError::TooLarge => sluice_engine::query::too_large(),
            },
        )
    }

    /// The worker's error (its JSON body), as this worker's.
    fn refused(peer: &Peer, code: u16, body: &[u8]) -> SluiceError {
        let said = serde_json::from_slice::<serde_json::Value>(body).ok();
        let error = said.as_ref().and_then(|v| v["error"].as_str()).unwrap_or("no reason given").to_string();
        let fix = said.as_ref().and_then(|v| v["fix"].as_str()).unwrap_or("ask again").to_string();
        let message = format!("{peer} refused its slice (HTTP {code}): {error}");
        match code {
            401 => SluiceError::user("query.worker_token", message)
                .with_fix("give every worker of the cluster the same admin token"),
            _ => SluiceError::external("query.worker_failed", message).with_fix(fix),
        }
    }
}

impl Gather for HttpGather {
    fn lease(&self, peer: &Peer, deadline: Instant) -> Result<RemoteLease, SluiceError> {
        let timeout_ms = deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64;
        let (code, body) = self.post(peer, "/internal/lease", &LeaseRequest { timeout_ms }, deadline, SMALL_BODY)?;
        if code != 200 {
            return Err(HttpGather::refused(peer, code, &body));
        }
        let answer: LeaseAnswer = serde_json::from_slice(&body)
            .map_err(|e| SluiceError::external("query.worker_failed", format!("{peer} answered a lease with {e}")))?;
        Ok(RemoteLease { id: answer.lease, epoch: answer.epoch })
    }

    fn slice(
        &self,
        peer: &Peer,
        lease: RemoteLease,
        table: &Table,
        epoch: u64,
        deadline: Instant,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, SluiceError> {
        let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis() as u64;
        let request = SliceRequest { lease: lease.id, table: table.name.clone(), epoch, wait_ms };
        let (code, body) = self.post(peer, "/internal/slice", &request, deadline, max_bytes)?;
        if code != 200 {
            return Err(HttpGather::refused(peer, code, &body));
        }
        let bad = |e: arrow::error::ArrowError| {
            SluiceError::external("query.worker_failed", format!("{peer} sent a slice that does not decode: {e}"))
        };
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None).map_err(bad)?;
        if reader.schema().fields() != table.schema.fields() {
            return Err(SluiceError::external(
                "query.worker_failed",
                format!("{peer} sent table `{}` with other columns: {}", table.name, reader.schema()),
            )
            .with_fix("run the same pipeline and sluice version on every worker"));
        }
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
        // The schema's metadata may differ; the columns do not.
        batches
            .into_iter()
            .map(|b| RecordBatch::try_new(Arc::clone(&table.schema), b.columns().to_vec()))
            .collect::<Result<_, _>>()
            .map_err(bad)
    }

    fn release(&self, peer: &Peer, lease: RemoteLease) {
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        if let Err(error) =
            self.post(peer, "/internal/release", &ReleaseRequest { lease: lease.id }, deadline, SMALL_BODY)
        {
            // Its deadline ends it anyway.
            tracing::debug!(%error, "a lease on another worker was not released");
        }
    }
}

/// A mutex-held lease table, for the server's shared state.
pub(crate) fn leases() -> Arc<Mutex<SliceLeases>> {
    Arc::new(Mutex::new(SliceLeases::default()))
}
