//! The JSON documents of `/status`, `/readyz` and each `/status/stream` line, made from
//! the engine's [`Status`], live [`Metrics`] and the sampler's rates and history. Each
//! is a type, so that the OpenAPI document describes exactly what is sent.
//!
//! Bounds: a document is as large as the job's sources and sinks plus at most
//! [`crate::HISTORY`] checkpoints; it is built from atomics read once, never locking the
//! run.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use sluice_engine::{JobHandle, JobState, Metrics, Status};
use utoipa::ToSchema;

use crate::sampler::{Rates, Sampler};

/// The job's state, its checkpoints, its place in a cluster and its counters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatusDocument {
    /// `[pipeline] name`.
    pub(crate) pipeline: String,
    pub(crate) state: State,
    /// The epoch of the last checkpoint committed by this run.
    pub(crate) last_committed_epoch: Option<u64>,
    /// The checkpoint this run resumed from.
    pub(crate) resumed_from: Option<u64>,
    /// Why the job failed: the component and the reason.
    pub(crate) failure: Option<String>,
    /// This worker's place in its cluster (absent when it runs alone, or before the
    /// cluster formed).
    pub(crate) worker: Option<WorkerPlace>,
    /// Driver threads of this worker.
    pub(crate) threads: u32,
    /// Per source and sink: in a cluster, every member that answered added up (each
    /// member's own part is under `members`): in `/status` as each answered just now, in
    /// a `/status/stream` line as each answered last (asked every second while a stream
    /// is open).
    pub(crate) sources: Vec<SourceStatus>,
    pub(crate) sinks: Vec<SinkStatus>,
    /// The checkpoints committed that this API saw (sampled every second; the last
    /// [`crate::HISTORY`]), oldest first.
    pub(crate) checkpoints: Vec<CheckpointSeen>,
    /// In a cluster, every worker (this one too) by id, as each answered (`asked_at_ms`),
    /// or why it could not be asked; empty when it runs alone (and before its cluster
    /// formed).
    pub(crate) members: Vec<MemberStatus>,
}

impl StatusDocument {
    /// In a cluster: `members` made of this worker and the others' `answers` (from
    /// `routes::ask_members`), and the counters of those that answered added in.
    pub(crate) fn add_members(
        &mut self,
        answers: &[(MemberStatus, Option<serde_json::Value>)],
        admin_addr: Option<String>,
    ) {
        let mut members = vec![MemberStatus::of_this_worker(self, admin_addr)];
        for (member, answer) in answers {
            if let Some(answer) = answer {
                self.add_counters(answer);
            }
            members.push(member.clone());
        }
        members.sort_by_key(|member| member.id);
        self.members = members;
    }

    /// Adds another worker's counters (its answer to `/internal/status`) to this
    /// document's, source by source and sink by sink (matched by name): rows, bad rows
    /// and rates summed; a source's watermark the lowest of those known (a worker reading
    /// no lane of a source has none).
    pub(crate) fn add_counters(&mut self, other: &serde_json::Value) {
        let items = |list: &str| other[list].as_array().into_iter().flatten();
        for theirs in items("sources") {
            let Some(ours) = self.sources.iter_mut().find(|s| theirs["name"].as_str() == Some(s.name.as_str())) else {
                continue;
            };
            ours.rows_in += theirs["rows_in"].as_u64().unwrap_or(0);
            ours.bad_rows += theirs["bad_rows"].as_u64().unwrap_or(0);
            ours.rows_per_second = crate::sampler::sum(ours.rows_per_second, theirs["rows_per_second"].as_f64());
            ours.watermark = match (ours.watermark, theirs["watermark"].as_i64()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        for theirs in items("sinks") {
            let Some(ours) = self.sinks.iter_mut().find(|s| theirs["name"].as_str() == Some(s.name.as_str())) else {
                continue;
            };
            ours.rows_out += theirs["rows_out"].as_u64().unwrap_or(0);
            ours.rows_per_second = crate::sampler::sum(ours.rows_per_second, theirs["rows_per_second"].as_f64());
        }
    }
}

/// One worker of a cluster as `/status` (or a stream's last round of asks) found it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct MemberStatus {
    pub(crate) id: u32,
    /// Its admin API's address (absent when it runs without one).
    pub(crate) admin_addr: Option<String>,
    /// Whether it is the worker that answered.
    pub(crate) this_worker: bool,
    /// Its state (absent when it could not be asked).
    pub(crate) state: Option<State>,
    /// The last checkpoint it committed.
    pub(crate) last_committed_epoch: Option<u64>,
    /// Rows its sources read and its sinks wrote (its part of the pipeline's).
    pub(crate) rows_in: Option<u64>,
    pub(crate) rows_out: Option<u64>,
    /// Why it could not be asked.
    pub(crate) error: Option<String>,
    /// When its answer (or the error) came, in milliseconds since the Unix epoch
    /// (absent for the worker that answers: its own part is as of the document).
    pub(crate) asked_at_ms: Option<i64>,
}

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    Coordination,
    Starting,
    Running,
    Paused,
    Stopping,
    Completed,
    Failed,
}

impl From<JobState> for State {
    fn from(state: JobState) -> State {
        match state {
            JobState::Coordination => State::Coordination,
            JobState::Starting => State::Starting,
            JobState::Running => State::Running,
            JobState::Paused => State::Paused,
            JobState::Stopping => State::Stopping,
            JobState::Completed => State::Completed,
            JobState::Failed => State::Failed,
        }
    }
}

/// A worker of a cluster.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WorkerPlace {
    /// This worker's id (0 is the leader).
    pub(crate) id: u32,
    /// Workers in the cluster.
    pub(crate) workers: u64,
}

/// One source's counters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SourceStatus {
    pub(crate) name: String,
    pub(crate) rows_in: u64,
    /// Rows per second over the last sampling interval (absent before two samples).
    pub(crate) rows_per_second: Option<f64>,
    pub(crate) bad_rows: u64,
    /// The source's watermark (its slowest lane of those this worker reads; in a
    /// cluster's `/status`, the lowest of the workers'), in milliseconds since the Unix
    /// epoch.
    pub(crate) watermark: Option<i64>,
}

/// One sink's counters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SinkStatus {
    pub(crate) name: String,
    pub(crate) rows_out: u64,
    /// Rows per second over the last sampling interval (absent before two samples).
    pub(crate) rows_per_second: Option<f64>,
}

/// A committed checkpoint as this API saw it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CheckpointSeen {
    pub(crate) epoch: u64,
    /// When it was first seen committed, in milliseconds since the Unix epoch.
    pub(crate) seen_at_ms: i64,
    /// Milliseconds since the previous one was seen (absent for the first).
    pub(crate) since_previous_ms: Option<u64>,
    /// From its barrier to its manifest published, in milliseconds (where this worker
    /// published it: alone, or leading a cluster).
    pub(crate) duration_ms: Option<u64>,
    /// The pause processing saw: from its barrier to the last driver's acknowledgement.
    pub(crate) pause_ms: Option<u64>,
    /// Bytes of operator state its manifest names.
    pub(crate) state_bytes: Option<u64>,
}

/// `/readyz`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Readiness {
    pub(crate) ready: bool,
    pub(crate) state: State,
    /// Why it is not ready (absent when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Why the job failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<String>,
}

/// `/status`: the state, checkpoints, failure, cluster place and per source and sink
/// counters.
pub(crate) fn document(job: &JobHandle, sampler: &Sampler, status: &Status) -> StatusDocument {
    let metrics = job.metrics();
    let rates = sampler.rates();
    let checkpoints = sampler
        .commits()
        .iter()
        .map(|c| CheckpointSeen {
            epoch: c.epoch,
            seen_at_ms: c.seen_at_ms,
            since_previous_ms: c.since_previous_ms,
            duration_ms: c.record.map(|r| r.duration_ms),
            pause_ms: c.record.map(|r| r.pause_ms),
            state_bytes: c.record.map(|r| r.state_bytes),
        })
        .collect();
    StatusDocument {
        pipeline: job.name().to_string(),
        state: status.state.into(),
        last_committed_epoch: status.last_committed_epoch,
        resumed_from: status.resumed_from,
        failure: status.failure.clone(),
        worker: status.worker.map(|(id, workers)| WorkerPlace { id, workers: workers as u64 }),
        threads: job.threads(),
        sources: sources(&metrics, &rates),
        sinks: sinks(&metrics, &rates),
        checkpoints,
        members: Vec::new(),
    }
}

impl MemberStatus {
    /// This worker, from its own document.
    pub(crate) fn of_this_worker(document: &StatusDocument, admin_addr: Option<String>) -> MemberStatus {
        MemberStatus {
            id: document.worker.as_ref().map_or(0, |place| place.id),
            admin_addr,
            this_worker: true,
            state: Some(document.state),
            last_committed_epoch: document.last_committed_epoch,
            rows_in: Some(document.sources.iter().map(|s| s.rows_in).sum()),
            rows_out: Some(document.sinks.iter().map(|s| s.rows_out).sum()),
            error: None,
            asked_at_ms: None,
        }
    }

    /// Another worker, from its answer to `/internal/status` (its own document as JSON)
    /// had at `asked_at_ms`.
    pub(crate) fn of_answer(
        id: u32,
        admin_addr: String,
        answer: Result<serde_json::Value, String>,
        asked_at_ms: i64,
    ) -> MemberStatus {
        let sum = |document: &serde_json::Value, list: &str, field: &str| -> Option<u64> {
            document[list].as_array()?.iter().map(|item| item[field].as_u64()).sum()
        };
        let mut member = MemberStatus {
            id,
            admin_addr: (!admin_addr.is_empty()).then_some(admin_addr),
            this_worker: false,
            state: None,
            last_committed_epoch: None,
            rows_in: None,
            rows_out: None,
            error: None,
            asked_at_ms: Some(asked_at_ms),
        };
        match answer {
            Ok(document) => {
                member.state = serde_json::from_value(document["state"].clone()).ok();
                member.last_committed_epoch = document["last_committed_epoch"].as_u64();
                member.rows_in = sum(&document, "sources", "rows_in");
                member.rows_out = sum(&document, "sinks", "rows_out");
            }
            Err(error) => member.error = Some(error),
        }
        member
    }
}

fn sources(metrics: &Metrics, rates: &Rates) -> Vec<SourceStatus> {
    metrics
        .sources
        .iter()
        .enumerate()
        .map(|(i, source)| SourceStatus {
            name: source.name.clone(),
            rows_in: source.rows.load(Ordering::Relaxed),
            rows_per_second: rates.sources.get(i).copied(),
            bad_rows: source.bad_rows.load(Ordering::Relaxed),
            watermark: source.watermark(),
        })
        .collect()
}

fn sinks(metrics: &Metrics, rates: &Rates) -> Vec<SinkStatus> {
    metrics
        .sinks
        .iter()
        .enumerate()
        .map(|(i, sink)| SinkStatus {
            name: sink.name.clone(),
            rows_out: sink.rows.load(Ordering::Relaxed),
            rows_per_second: rates.sinks.get(i).copied(),
        })
        .collect()
}

/// `/readyz`: ready when the job runs, else the state and why it is not ready.
pub(crate) fn readiness(status: &Status) -> Readiness {
    let reason = match status.state {
        // Paused by an operator: alive and connected, only not reading its sources.
        JobState::Running | JobState::Paused => None,
        JobState::Coordination => Some("waiting for every worker of the cluster to join".to_string()),
        JobState::Starting => Some("recovering and starting its threads".to_string()),
        JobState::Stopping => Some("a stop was requested: sources stopped, the job drains".to_string()),
        JobState::Completed => Some("the job has ended".to_string()),
        JobState::Failed => {
            Some(format!("the job failed: {}", status.failure.as_deref().unwrap_or("no reason was recorded")))
        }
    };
    Readiness { ready: reason.is_none(), state: status.state.into(), reason, failure: status.failure.clone() }
}
