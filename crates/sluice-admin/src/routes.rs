//! The routes and their handlers. Each handler carries its OpenAPI description
//! (`utoipa::path`), which the `openapi` module gathers into `/openapi.json`: the
//! document is made from the same code that answers.
//!
//! Bounds: every handler answers from values read once (see `status`, `graph`,
//! `metrics`); only `/status/stream` stays open (see `stream`). The page is static: its
//! script reads `/graph` and `/status` like any client.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::bodies::{CheckpointTaken, ErrorBody, NoBody, Paused, Stopping};
use crate::graph::{self, Graph};
use crate::members::{ask_members, ask_peers};
use crate::shared::Shared;
use crate::status::{self, Readiness, StatusDocument};
use crate::{metrics, stream};

/// The refusal (400) of a body that is neither empty nor `{}`, as the document says.
fn no_body(body: &axum::body::Bytes) -> Option<Response> {
    let empty_object = |value: serde_json::Value| value.as_object().is_some_and(serde_json::Map::is_empty);
    if body.is_empty() || serde_json::from_slice(body).is_ok_and(empty_object) {
        return None;
    }
    let error = ErrorBody {
        error: format!("this endpoint reads no body, and {} bytes that are not {{}} came", body.len()),
        fix: "send an empty body, or {}".into(),
    };
    Some((StatusCode::BAD_REQUEST, axum::Json(error)).into_response())
}

/// How long `POST /checkpoint` waits for its checkpoint to be committed.
const CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether the process lives.
#[utoipa::path(get, path = "/healthz", tag = "probes", security(()),
    responses((status = 200, description = "The process lives", body = String, content_type = "text/plain")))]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// Whether the job runs (every source and sink started, the cluster formed).
#[utoipa::path(get, path = "/readyz", tag = "probes", security(()), responses(
    (status = 200, description = "The job runs", body = Readiness),
    (status = 503, description = "Not running: the state and why", body = Readiness)))]
pub(crate) async fn readyz(State(shared): State<Shared>) -> Response {
    let readiness = status::readiness(&shared.job.status());
    let code = if readiness.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, axum::Json(readiness)).into_response()
}

/// The job's state, checkpoints, place in its cluster, and counters.
#[utoipa::path(get, path = "/status", tag = "job", responses(
    (status = 200, description = "The status", body = StatusDocument),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody)))]
pub(crate) async fn status_document(State(shared): State<Shared>) -> Response {
    let status = shared.job.status();
    let mut document = status::document(&shared.job, &shared.sampler, &status);
    let peers = shared.job.peers();
    if !peers.is_empty() {
        let token = shared.token.clone();
        let asked = tokio::task::spawn_blocking(move || ask_members(peers, token.as_deref())).await;
        document.add_members(&asked.unwrap_or_default(), shared.admin_addr.clone());
    }
    axum::Json(document).into_response()
}

/// `POST /internal/status`: this worker's own status, for another worker's `/status`
/// (left out of the OpenAPI document, as every internal endpoint).
pub(crate) async fn internal_status(State(shared): State<Shared>) -> Response {
    let status = shared.job.status();
    axum::Json(status::document(&shared.job, &shared.sampler, &status)).into_response()
}

/// The status as NDJSON: the current one, then a line per change (each a
/// `StatusDocument`), `{"heartbeat":true}` after 5 s without one; ends after a final
/// state. In a cluster each line adds the other workers' counters as they last answered
/// (asked every second while a stream is open), each listed under `members` (with why it
/// could not be asked).
#[utoipa::path(get, path = "/status/stream", tag = "job", responses(
    (status = 200, description = "Lines of JSON, kept open", body = String, content_type = "application/x-ndjson"),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 503, description = "Too many streams open", body = ErrorBody)))]
pub(crate) async fn status_stream(State(shared): State<Shared>) -> Response {
    let permit = Arc::clone(&shared.streams).try_acquire_owned().ok();
    stream::respond(&shared, permit)
}

/// The counters in the Prometheus text format 0.0.4.
#[utoipa::path(get, path = "/metrics", tag = "job", responses(
    (status = 200, description = "Prometheus text", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody)))]
pub(crate) async fn metrics_text(State(shared): State<Shared>) -> Response {
    let status = shared.job.status();
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render(&shared.job, &status)).into_response()
}

/// The dataflow: nodes (sources, segments of operators, sinks), edges, live rates; in a
/// cluster, every worker's counters added up.
#[utoipa::path(get, path = "/graph", tag = "job", responses(
    (status = 200, description = "The graph", body = Graph),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody)))]
pub(crate) async fn graph_document(State(shared): State<Shared>) -> Response {
    let status = shared.job.status();
    let mut graph = graph::build(&shared.job, &status, &shared.sampler.rates());
    let peers = shared.job.peers();
    if !peers.is_empty() {
        let token = shared.token.clone();
        let asked = tokio::task::spawn_blocking(move || ask_peers(peers, token.as_deref(), "/internal/graph")).await;
        for (peer, answer) in asked.unwrap_or_default() {
            match answer.and_then(|body| serde_json::from_slice::<Graph>(&body).map_err(|e| format!("its answer: {e}")))
            {
                Ok(theirs) => graph.add(theirs),
                Err(reason) => graph.unanswered.push(graph::Unanswered { worker: peer.id, reason }),
            }
        }
    }
    axum::Json(graph).into_response()
}

/// `POST /internal/graph`: this worker's own graph and counters, for another worker's
/// `/graph` (left out of the OpenAPI document, as every internal endpoint).
pub(crate) async fn internal_graph(State(shared): State<Shared>) -> Response {
    let status = shared.job.status();
    axum::Json(graph::build(&shared.job, &status, &shared.sampler.rates())).into_response()
}

/// Stops the sources and drains (with checkpoints: takes a final one), as Ctrl-C.
#[utoipa::path(post, path = "/stop", tag = "job", request_body = NoBody, responses(
    (status = 400, description = "A body that is neither empty nor `{}`", body = ErrorBody),
    (status = 202, description = "The stop was asked for", body = Stopping),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 403, description = "A cross-site request (another site's Origin), or a Host that does not name the API", body = ErrorBody),
    (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody)))]
pub(crate) async fn stop(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    if let Some(refused) = no_body(&body) {
        return refused;
    }
    shared.job.stop();
    let state = shared.job.status().state.into();
    (StatusCode::ACCEPTED, axum::Json(Stopping { stopping: true, state })).into_response()
}

/// Pauses the sources: no lane is read until `POST /resume`; rows in flight drain and
/// checkpoints go on. Idempotent. In a cluster, asked of any worker, every worker's
/// sources pause (the others' once the leader's word reaches them).
#[utoipa::path(post, path = "/pause", tag = "job", request_body = NoBody, responses(
    (status = 400, description = "A body that is neither empty nor `{}`", body = ErrorBody),
    (status = 200, description = "The sources are paused", body = Paused),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 403, description = "A cross-site request (another site's Origin), or a Host that does not name the API", body = ErrorBody),
    (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody),
    (status = 409, description = "The job ended", body = ErrorBody)))]
pub(crate) async fn pause(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    if let Some(refused) = no_body(&body) {
        return refused;
    }
    paused_answer(shared.job.pause(), true)
}

/// Reads the sources again after `POST /pause`. Idempotent.
#[utoipa::path(post, path = "/resume", tag = "job", request_body = NoBody, responses(
    (status = 400, description = "A body that is neither empty nor `{}`", body = ErrorBody),
    (status = 200, description = "The sources are read again", body = Paused),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 403, description = "A cross-site request (another site's Origin), or a Host that does not name the API", body = ErrorBody),
    (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody),
    (status = 409, description = "The job ended", body = ErrorBody)))]
pub(crate) async fn resume(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    if let Some(refused) = no_body(&body) {
        return refused;
    }
    paused_answer(shared.job.resume(), false)
}

fn paused_answer(state: Result<sluice_engine::JobState, sluice_types::SluiceError>, paused: bool) -> Response {
    match state {
        Ok(state) => (StatusCode::OK, axum::Json(Paused { paused, state: state.into() })).into_response(),
        Err(error) => (StatusCode::CONFLICT, axum::Json(ErrorBody::from(error))).into_response(),
    }
}

/// Takes a checkpoint now and answers once it is committed (at most 5 minutes), with
/// its epoch. On a cluster's follower, the leader (which decides checkpoints) is asked,
/// and its answer relayed.
#[utoipa::path(post, path = "/checkpoint", tag = "job", request_body = NoBody, responses(
    (status = 400, description = "A body that is neither empty nor `{}`", body = ErrorBody),
    (status = 200, description = "The checkpoint is committed", body = CheckpointTaken),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 403, description = "A cross-site request (another site's Origin), or a Host that does not name the API", body = ErrorBody),
    (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody),
    (status = 409, description = "No checkpoint: the job takes none, or it ended first", body = ErrorBody),
    (status = 503, description = "Too many checkpoint requests wait, or the cluster's leader cannot be reached",
        body = ErrorBody),
    (status = 504, description = "Not committed within 5 minutes", body = ErrorBody)))]
pub(crate) async fn checkpoint(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    if let Some(refused) = no_body(&body) {
        return refused;
    }
    let job = shared.job.clone();
    let token = shared.token.clone();
    let leader = job.leader();
    // A relay holds a blocking thread for as long as the leader takes: a few at once.
    let relay = match leader {
        Some(_) => match Arc::clone(&shared.relays).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let error = sluice_types::SluiceError::external(
                    "checkpoint.requests_busy",
                    format!("{MAX_RELAYED_CHECKPOINTS} checkpoint requests already wait for the cluster's leader here"),
                )
                .with_fix("ask again once one is answered, or ask the leader");
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(ErrorBody::from(error))).into_response();
            }
        },
        None => None,
    };
    let taken = tokio::task::spawn_blocking(move || {
        let _relay = relay;
        match leader {
            Some(leader) => Err(Box::new(ask_leader(&leader, token.as_deref()))),
            None => Ok(job.checkpoint(CHECKPOINT_WAIT)),
        }
    })
    .await;
    let error = match taken {
        Ok(Ok(Ok(epoch))) => return (StatusCode::OK, axum::Json(CheckpointTaken { epoch })).into_response(),
        Ok(Ok(Err(error))) => error,
        Ok(Err(relayed)) => return *relayed,
        Err(join) => sluice_types::SluiceError::internal("admin.checkpoint", join.to_string()),
    };
    let code = match error.code {
        "checkpoint.requests_busy" => StatusCode::SERVICE_UNAVAILABLE,
        "checkpoint.request_timeout" => StatusCode::GATEWAY_TIMEOUT,
        "admin.checkpoint" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::CONFLICT,
    };
    (code, axum::Json(ErrorBody::from(error))).into_response()
}

/// Checkpoint requests a follower relays to its leader at once (503 beyond).
pub(crate) const MAX_RELAYED_CHECKPOINTS: usize = 4;

/// The largest answer of the leader to a checkpoint request (its epoch, or an error).
const RELAYED_BYTES: usize = 64 << 10;

/// `POST /checkpoint` asked of the cluster's `leader`: its answer as it gave it, or 503
/// naming it when it cannot be reached.
fn ask_leader(leader: &sluice_engine::query::Peer, token: Option<&str>) -> Response {
    let unreachable = |detail: String| {
        let error = sluice_types::SluiceError::external(
            "checkpoint.leader_unreachable",
            format!("the cluster's leader decides checkpoints, and {leader} cannot be reached: {detail}"),
        )
        .with_fix("check that the leader runs with an admin API; ask again once it is back");
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(ErrorBody::from(error))).into_response()
    };
    if leader.admin_addr.is_empty() {
        return unreachable("it runs without an admin API (--admin-bind off)".into());
    }
    // A little longer than the leader's own wait, so that its answer (even a 504) arrives.
    let deadline = std::time::Instant::now() + CHECKPOINT_WAIT + std::time::Duration::from_secs(10);
    match crate::peer_http::post(&leader.admin_addr, token, "/checkpoint", b"", deadline, RELAYED_BYTES) {
        Ok((code, body)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(crate::peer_http::PostError::Unreachable(detail)) => unreachable(detail),
        Err(crate::peer_http::PostError::TooLarge) => unreachable("its answer was too long".into()),
    }
}

/// The live page: the dataflow with its rates, backpressure, watermarks and the
/// checkpoints (one file of HTML, CSS, JavaScript and SVG shipped in the binary).
#[utoipa::path(get, path = "/", tag = "meta", security(()),
    responses((status = 200, description = "The page", body = String, content_type = "text/html; charset=utf-8")))]
pub(crate) async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

/// The page's text (`src/page/index.html`).
const PAGE: &str = include_str!("page/index.html");
