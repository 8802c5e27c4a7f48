//! `/status/stream`: NDJSON, one line per status change (the current status first), a
//! heartbeat line `{"heartbeat":true}` after [`HEARTBEAT`] without a change, ended
//! after the line of a final state (completed, failed) or when the client goes away.
//! In a cluster a line carries the whole cluster's source and sink counters, as
//! `/status` does: this worker's now, the others' as they answered the server's last
//! round of asks (`members`, a round every second while a stream is open), each other
//! worker under `members` with its part, or why it could not be asked.
//!
//! Bounds: nothing queues per client. The engine's `StatusStream` keeps only the latest
//! status (a slow client skips intermediate states but always sees the current one);
//! one line is produced only when the client's connection asks for the next; at most
//! [`MAX_STREAMS`] streams are open at once (more get 503), each waiting on one blocking
//! thread for at most [`HEARTBEAT`] at a time. A line never waits for another worker,
//! but the first after no stream was open waits for the first round (at most 3 s).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluice_engine::{JobHandle, StatusStream};
use tokio::sync::OwnedSemaphorePermit;

use crate::members::Members;
use crate::sampler::Sampler;
use crate::shared::Shared;
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
    /// The other workers' last answers (in a cluster).
    members: Arc<Members>,
    /// This API's address, for this worker's entry under `members`.
    admin_addr: Option<String>,
    changes: Option<StatusStream>,
    /// Held while the stream lives.
    _permit: OwnedSemaphorePermit,
}

/// The response: a body that yields a line per change until a final state.
pub(crate) fn respond(shared: &Shared, permit: Option<OwnedSemaphorePermit>) -> Response {
    let Some(permit) = permit else {
        let body = crate::bodies::ErrorBody {
            error: "too many status streams".into(),
            fix: format!("close one of the {MAX_STREAMS} open streams, or poll GET /status"),
        };
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    };
    let job = shared.job.clone();
    let changes = Some(job.subscribe());
    let watch = Watch {
        job,
        sampler: Arc::clone(&shared.sampler),
        members: Arc::clone(&shared.members),
        admin_addr: shared.admin_addr.clone(),
        changes,
        _permit: permit,
    };
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
            // The other workers' answers first (it may wait, see `members`), then this
            // worker's counters as of the line.
            let round = watch.members.latest(&watch.job).await;
            let mut document = status::document(&watch.job, &watch.sampler, &status);
            if let Some(round) = round {
                document.add_members(&round.answers, watch.admin_addr.clone());
            }
            let mut line = serde_json::to_string(&document).unwrap_or_default();
            line.push('\n');
            line
        }
    };
    Some((Ok(Bytes::from(line)), watch))
}
