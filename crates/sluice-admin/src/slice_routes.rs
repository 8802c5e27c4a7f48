//! The handlers of the internal endpoints of a cluster's query (`slices` states their
//! protocol and bounds): `POST /internal/lease`, `/internal/slice` and
//! `/internal/release`.

use std::sync::PoisonError;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_engine::query::{QueryFormat, QueryLimits, TIMEOUT_LIMIT};
use sluice_types::SluiceError;

use crate::bodies::ErrorBody;
use crate::shared::Shared;
use crate::slices::{LeaseAnswer, LeaseRequest, MAX_SLICE_LEASES, ReleaseRequest, SliceLeases, SliceRequest};

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SluiceError> {
    serde_json::from_slice(body)
        .map_err(|e| SluiceError::user("query.internal_body", format!("not an internal query request: {e}")))
}

fn held(shared: &Shared) -> std::sync::MutexGuard<'_, SliceLeases> {
    shared.slices.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `POST /internal/lease`.
pub(crate) async fn lease(State(shared): State<Shared>, body: Bytes) -> Response {
    let taken = async {
        let request: LeaseRequest = parse(&body)?;
        let timeout = QueryLimits::new(None, Some(request.timeout_ms))?.timeout;
        let job = shared.job.clone();
        let lease = tokio::task::spawn_blocking(move || job.lease_slices(timeout)).await.map_err(joined)??;
        let mut leases = held(&shared);
        leases.held.retain(|_, lease| lease.is_live());
        if leases.held.len() >= MAX_SLICE_LEASES {
            return Err(SluiceError::external("query.busy", format!("{MAX_SLICE_LEASES} leases are held here"))
                .with_fix("ask again soon"));
        }
        let id = leases.next;
        leases.next += 1;
        let epoch = lease.epoch;
        leases.held.insert(id, lease);
        Ok(axum::Json(LeaseAnswer { lease: id, epoch }).into_response())
    };
    taken.await.unwrap_or_else(failure)
}

/// `POST /internal/slice`.
pub(crate) async fn slice(State(shared): State<Shared>, body: Bytes) -> Response {
    let read = async {
        let request: SliceRequest = parse(&body)?;
        let lease = held(&shared).held.get(&request.lease).cloned().ok_or_else(|| {
            SluiceError::external("query.lease_expired", format!("no lease {} is held here", request.lease))
                .with_fix("ask again; give the query a longer timeout")
        })?;
        let wait = Duration::from_millis(request.wait_ms).min(TIMEOUT_LIMIT);
        tokio::task::spawn_blocking(move || {
            let (schema, batches) = lease.read_slice(&request.table, request.epoch, wait)?;
            let answer = sluice_engine::query::QueryAnswer { epoch: Some(request.epoch), schema, batches };
            answer.encode(QueryFormat::ArrowIpc)
        })
        .await
        .map_err(joined)?
    };
    match read.await {
        Ok(bytes) => ([(header::CONTENT_TYPE, QueryFormat::ArrowIpc.content_type())], bytes).into_response(),
        Err(error) => failure(error),
    }
}

/// `POST /internal/release`.
pub(crate) async fn release(State(shared): State<Shared>, body: Bytes) -> Response {
    match parse::<ReleaseRequest>(&body) {
        Ok(request) => {
            if let Some(lease) = held(&shared).held.remove(&request.lease) {
                lease.release();
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => failure(error),
    }
}

fn joined(error: tokio::task::JoinError) -> SluiceError {
    SluiceError::internal("admin.query", format!("the task failed: {error}"))
}

fn failure(error: SluiceError) -> Response {
    let code = match error.domain {
        sluice_types::Domain::User => StatusCode::BAD_REQUEST,
        sluice_types::Domain::External => StatusCode::SERVICE_UNAVAILABLE,
        sluice_types::Domain::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (code, axum::Json(ErrorBody::from(error))).into_response()
}
