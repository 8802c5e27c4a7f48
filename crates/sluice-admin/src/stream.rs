//! `/status/stream`: NDJSON, one line per status change (the current status first), a
//! heartbeat line `{"heartbeat":true}` after [`HEARTBEAT`] without a change, ended
//! after the line of a final state (completed, failed) or when the client goes away.
//!
//! Bounds: nothing queues per client. The engine's `StatusStream` keeps only the latest
//! status (a slow client skips intermediate states but always sees the current one);
//! one line is produced only when the client's connection asks for the next; at most
//! [`MAX_STREAMS`] streams are open at once (more get 503), each waiting on one blocking
//! thread for at most [`HEARTBEAT`] at a time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_engine::{JobHandle, StatusStream};
use tokio::sync::OwnedSemaphorePermit;

use crate::sampler::Sampler;
use crate::status;

/// How long a stream stays silent before a heartbeat line.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// Status streams open at once.
pub const MAX_STREAMS: usize = 32;

/// The heartbeat line.
const HEARTBEAT_LINE: &str = "{\"heartbeat\":true}\n";

/// Where one client's stream is.
struct Watch {
    job: JobHandle,
    sampler: Arc<Sampler>,
    changes: Option<StatusStream>,
    /// Held while the stream lives.
    _permit: OwnedSemaphorePermit,
}

/// The response: a body that yields a line per change until a final state.
pub(crate) fn respond(job: JobHandle, sampler: Arc<Sampler>, permit: Option<OwnedSemaphorePermit>) -> Response {
    let Some(permit) = permit else {
        let body = crate::routes::ErrorBody {
            error: "too many status streams".into(),
            fix: format!("close one of the {MAX_STREAMS} open streams, or poll GET /status"),
        };
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    };
    let changes = Some(job.subscribe());
    let watch = Watch { job, sampler, changes, _permit: permit };
    let lines = futures::stream::unfold(watch, next_line);
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response()
}

/// The next line, or None once a final state was sent (or the watcher was lost).
async fn next_line(mut watch: Watch) -> Option<(Result<Bytes, std::io::Error>, Watch)> {
    let mut changes = watch.changes.take()?;
    let waited = tokio::task::spawn_blocking(move || {
        let next = changes.next_timeout(HEARTBEAT);
        (changes, next)
    })
    .await;
    let Ok((changes, next)) = waited else {
        // The waiting thread was cancelled (the server shuts down): end the stream.
        return None;
    };
    let line = match next {
        None => {
            watch.changes = Some(changes);
            HEARTBEAT_LINE.to_string()
        }
        Some(status) => {
            if !status.state.is_final() {
                watch.changes = Some(changes);
            }
            let document = status::document(&watch.job, &watch.sampler, &status);
            let mut line = serde_json::to_string(&document).unwrap_or_default();
            line.push('\n');
            line
        }
    };
    Some((Ok(Bytes::from(line)), watch))
}
