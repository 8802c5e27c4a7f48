//! The JSON documents of `/status`, `/readyz` and each `/status/stream` line, made from
//! the engine's [`Status`] and live [`Metrics`].
//!
//! Bounds: a document is as large as the job's sources and sinks; it is built from
//! atomics read once, never locking the run.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use sluice_engine::{JobHandle, JobState, Metrics, Status};

use crate::sampler::Sampler;

/// `/status`: the state, checkpoints, failure, cluster place and per source and sink
/// counters.
pub(crate) fn document(job: &JobHandle, sampler: &Sampler, status: &Status) -> Value {
    let metrics = job.metrics();
    let checkpoints: Vec<Value> = sampler
        .commits()
        .iter()
        .map(|c| json!({ "epoch": c.epoch, "seen_at_ms": c.seen_at_ms, "since_previous_ms": c.since_previous_ms }))
        .collect();
    json!({
        "pipeline": job.name(),
        "state": status.state.name(),
        "last_committed_epoch": status.last_committed_epoch,
        "resumed_from": status.resumed_from,
        "failure": status.failure,
        "worker": status.worker.map(|(id, workers)| json!({ "id": id, "workers": workers })),
        "threads": job.threads(),
        "sources": sources(&metrics),
        "sinks": sinks(&metrics),
        "checkpoints": checkpoints,
    })
}

fn sources(metrics: &Metrics) -> Vec<Value> {
    metrics
        .sources
        .iter()
        .map(|source| {
            json!({
                "name": source.name,
                "rows_in": source.rows.load(Ordering::Relaxed),
                "bad_rows": source.bad_rows.load(Ordering::Relaxed),
                "watermark": source.watermark(),
            })
        })
        .collect()
}

fn sinks(metrics: &Metrics) -> Vec<Value> {
    metrics
        .sinks
        .iter()
        .map(|sink| json!({ "name": sink.name, "rows_out": sink.rows.load(Ordering::Relaxed) }))
        .collect()
}

/// `/readyz`: None when the job runs (ready), else the state and why it is not ready.
pub(crate) fn not_ready(status: &Status) -> Option<Value> {
    let reason = match status.state {
        JobState::Running => return None,
        JobState::Coordination => "waiting for every worker of the cluster to join".to_string(),
        JobState::Starting => "recovering and starting its threads".to_string(),
        JobState::Stopping => "a stop was requested: sources stopped, the job drains".to_string(),
        JobState::Completed => "the job has ended".to_string(),
        JobState::Failed => {
            format!("the job failed: {}", status.failure.as_deref().unwrap_or("no reason was recorded"))
        }
    };
    Some(json!({ "ready": false, "state": status.state.name(), "reason": reason, "failure": status.failure }))
}
