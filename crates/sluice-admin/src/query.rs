//! `POST /query`: ad-hoc SQL over the job's materialized tables, all read at one
//! committed checkpoint (see `sluice_engine::query`).
//!
//! The lease on that checkpoint belongs to the request: it ends when the answer is made,
//! and when the client goes away first (the connection closes, the request's future is
//! dropped, and with it the guard that releases the lease), or at the query's timeout.
//! The execution belongs to the request too: a client that goes away cancels it, and at
//! the query's deadline the answer is 504 at once, the execution cancelled (it stops at
//! its next batch, `sluice_engine::query::interrupt`).
//!
//! Bounds: at most [`crate::queries::MAX_QUERIES`] admitted at once (503 beyond), each on the blocking
//! pool, holding its admission until its execution ended (also after a 504), and at most
//! `sluice_engine::query::executions::EXECUTIONS_MAX` executing, the others waiting
//! their turn within their timeout; rows, time and working memory per query as the
//! engine bounds them; the request body at most [`BODY_MAX`] bytes, arriving within the
//! server's body timeout ([`crate::BODY_TIMEOUT`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_engine::query::{QueryFormat, QueryLimits};
use sluice_types::SluiceError;
use utoipa::ToSchema;

use crate::bodies::ErrorBody;
use crate::shared::Shared;

/// The largest request body.
pub const BODY_MAX: usize = 1 << 20;

/// `POST /query`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueryRequest {
    /// One SQL query (DataFusion's dialect; identifiers case-sensitive) over the
    /// materialized tables.
    pub(crate) sql: String,
    /// How the rows are written (default `json`: JSON lines).
    #[serde(default)]
    pub(crate) format: Option<QueryFormatName>,
    /// The most rows the answer may have (default 10000, at most 1000000); a query
    /// with more is refused.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000)]
    pub(crate) max_rows: Option<u64>,
    /// How long the query may take, waiting for the first checkpoint included (default
    /// 30000, at most 300000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 300000)]
    pub(crate) timeout_ms: Option<u64>,
}

/// An answer's format.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum QueryFormatName {
    /// JSON lines: one object per row.
    Json,
    /// CSV with a header.
    Csv,
    /// An Arrow IPC stream.
    Arrow,
}

impl From<QueryFormatName> for QueryFormat {
    fn from(name: QueryFormatName) -> QueryFormat {
        match name {
            QueryFormatName::Json => QueryFormat::JsonLines,
            QueryFormatName::Csv => QueryFormat::Csv,
            QueryFormatName::Arrow => QueryFormat::ArrowIpc,
        }
    }
}

/// Runs one SQL query over the materialized tables, every table read at the newest
/// checkpoint committed on all of them (the `Sluice-Epoch` header names it). In a
/// cluster, any worker answers for the whole pipeline: it gathers every worker's slice
/// at one checkpoint, or fails naming a worker it cannot reach. The rows
/// come as JSON lines, CSV or an Arrow IPC stream. Errors name the problem and list
/// the tables that exist.
#[utoipa::path(post, path = "/query", tag = "query", request_body = QueryRequest, responses(
    (status = 200, description = "The rows, in the format asked for; headers `Sluice-Epoch` (the checkpoint read, \
        absent when the query reads no table) and `Sluice-Rows`",
        content((String = "application/x-ndjson"), (String = "text/csv"), (String = "application/vnd.apache.arrow.stream"))),
    (status = 400, description = "Bad SQL, an unknown table, a table not materialized (each listing the tables), \
        limits out of range, or too many rows", body = ErrorBody),
    (status = 401, description = "No or a wrong bearer token", body = ErrorBody),
    (status = 403, description = "A cross-site request (another site's Origin), or a Host that does not name the API", body = ErrorBody),
    (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody),
    (status = 503, description = "No checkpoint committed in time, a lease that ended, too many queries at once, \
        or (in a cluster) a worker that cannot be reached or a cluster forming again", body = ErrorBody),
    (status = 504, description = "The query took longer than its timeout", body = ErrorBody)))]
pub(crate) async fn query(State(shared): State<Shared>, body: Body) -> Response {
    match answer(shared, body).await {
        Ok(response) => response,
        Err(error) => failure(error),
    }
}

/// The request's body: at most [`BODY_MAX`] bytes, within `timeout`.
async fn read_body(body: Body, timeout: std::time::Duration) -> Result<axum::body::Bytes, SluiceError> {
    let too_long = || {
        SluiceError::user("query.body", format!("the request body exceeds {BODY_MAX} bytes"))
            .with_fix("send a shorter query")
    };
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, BODY_MAX)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        // The only error of a body read within the limit is the limit, or the client's.
        Ok(Err(error)) if error.to_string().contains("length limit") => Err(too_long()),
        Ok(Err(error)) => Err(SluiceError::user("query.body", format!("the request body broke off: {error}"))
            .with_fix("send the whole body")),
        Err(_) => Err(SluiceError::user(
            "query.body_timeout",
            format!("the request body did not arrive within {} ms", timeout.as_millis()),
        )
        .with_fix("send the body with the request's head")),
    }
}

async fn answer(shared: Shared, body: Body) -> Result<Response, SluiceError> {
    let body = read_body(body, shared.limits.body_timeout).await?;
    let request: QueryRequest = serde_json::from_slice(&body).map_err(|e| {
        SluiceError::user("query.body", format!("the body is not a query request: {e}"))
            .with_fix(r#"send JSON such as {"sql": "SELECT * FROM counts", "format": "json"}"#)
    })?;
    let format: QueryFormat = request.format.unwrap_or(QueryFormatName::Json).into();
    let limits = QueryLimits::new(request.max_rows, request.timeout_ms)?;
    let (answer, bytes) = shared
        .queries
        .run(request.sql, limits, move |answer| {
            let bytes = answer.encode(format)?;
            Ok((answer, bytes))
        })
        .await?;
    let mut response = ([(header::CONTENT_TYPE, format.content_type())], bytes).into_response();
    let headers = response.headers_mut();
    if let Some(epoch) = answer.epoch {
        headers.insert("sluice-epoch", HeaderValue::from(epoch));
    }
    headers.insert("sluice-rows", HeaderValue::from(answer.rows() as u64));
    Ok(response)
}

fn failure(error: SluiceError) -> Response {
    let code = match error.code {
        "query.no_checkpoint" | "query.lease_expired" | "query.busy" => StatusCode::SERVICE_UNAVAILABLE,
        "query.timeout" => StatusCode::GATEWAY_TIMEOUT,
        _ => match error.domain {
            sluice_types::Domain::User => StatusCode::BAD_REQUEST,
            sluice_types::Domain::External => StatusCode::SERVICE_UNAVAILABLE,
            sluice_types::Domain::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        },
    };
    (code, axum::Json(ErrorBody::from(error))).into_response()
}
