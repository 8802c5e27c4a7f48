//! The engine: everything between a pipeline file and a running, recoverable job, as a
//! library. The `sluice` command-line tool is a thin client of it; so will be an HTTP
//! admin API and a cluster worker.
//!
//! Layer: the top of the library stack. It may depend on every Sluice crate (config,
//! connectors, SQL, runtime, checkpoint store); nothing but front ends depends on it.
//!
//! ```text
//! Engine::load(path) ──▶ Pipeline ──compile──▶ CompiledPipeline { plan, fingerprint, options }
//!   parse (sluice-config)        │                 │
//!   configure connectors         ├─validate()──▶ Validation
//!   (the connector Registry)     ├─explain()───▶ Explanation
//!                                └─Job::start──▶ Job: stop, status, subscribe, metrics, wait → RunReport
//!                                    recovery (checkpoint store) + runtime controller thread
//! ```
//!
//! - [`load`](Engine::load): the file parsed and every connector's options validated,
//!   all problems at once ([`EngineError`], each located and with its fix).
//! - [`Pipeline::compile`]: sources built, views planned, sinks attached, a table or view
//!   read by several sinks computed once for all of them (`share`), the [`fingerprint`]
//!   computed; pipelines that would overwrite their own input or share one output path
//!   are refused.
//! - [`Job`]: recovery from the newest valid checkpoint, then the run on a controller
//!   thread; [`Status`] changes stream to watchers ([`StatusStream`]).
//! - [`stores`]: what `sluice checkpoints list/verify` report; [`nexmark`]: the event
//!   generator's files and the benchmark's pipelines.

mod checkpointing;
pub mod cluster;
mod compile;
mod error;
mod explain;
pub mod fingerprint;
mod job;
mod load;
pub mod materialize;
pub mod nexmark;
pub mod query;
mod share;
mod status;
pub mod stores;

#[cfg(test)]
mod tests;

pub use cluster::{ClusterOptions, ClusterRole, Listening};
pub use compile::{CompiledPipeline, Restoring};
pub use error::{EngineError, Problem};
pub use explain::{Explanation, FlowNode, SegmentNode, SideNode, SourceNode, TapNode, Validation, explain};
pub use fingerprint::{FINGERPRINT_VERSION, Fingerprint};
pub use job::{Job, JobHandle, StartOptions};
pub use load::{Engine, Overrides, PIPELINE_BYTES_MAX, Pipeline};
pub use status::{JobState, Status, StatusStream};

/// The stack of threads that plan and run ad-hoc queries (`query`): the SQL planner's.
pub const QUERY_STACK_BYTES: usize = sluice_sql::stack::PLANNING_STACK_BYTES;

pub use sluice_cluster::auth::Secret;
pub use sluice_cluster::rendezvous::{ControlSettings, RendezvousEvent};
pub use sluice_config as config;
pub use sluice_connectors::Registry;
pub use sluice_runtime::controller::CheckpointRecord;
pub use sluice_runtime::metrics::{OperatorMetrics, PeerTraffic, QueueMetrics, SinkMetrics};
pub use sluice_runtime::{Metrics, RunOutcome, RunReport, StopHandle};
