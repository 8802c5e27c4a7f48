//! The streaming runtime of one process: driver threads that own source lanes and fused
//! operator chains, bounded queues between them, watermarks, and the ordered shutdown.
//!
//! Layer: depends on `sluice-types` and arrow only. Operators, connectors and the SQL
//! planner sit above it and reach it through the traits of [`plan`]: a planner builds a
//! [`plan::Plan`] (sources, and one [`plan::Flow`] per sink made of segments separated by
//! exchanges), and [`controller::run`] executes it.
//!
//! Thread anatomy:
//!
//! ```text
//! controller (caller's thread)        driver 0..N (std threads)
//!   spawns drivers, owns the          own their lanes (lane l of a source runs on
//!   shutdown deadline, reports        thread l % N), one instance of every segment,
//!   progress, joins                   poll lanes → chain → exchange/sink
//!        │  Control (Stop, Abort)  ▲ DriverEvent (Finished, Fatal)
//!        └─────────────────────────┘
//! ```
//!
//! Data moves between threads only through the exchange: one bounded channel per
//! (sender thread, receiver thread) pair per exchange, so a receiver can align on, or
//! hold back, each sender separately. See [`driver`] for the scheduling argument (why a
//! full queue can never deadlock the drivers and always reaches the sources).

pub mod chain;
pub mod checkpoint;
pub mod controller;
mod coordinator;
mod driver;
mod duration;
mod exchange;
mod mailbox;
pub mod metrics;
pub mod peers;
pub mod place;
pub mod plan;
mod writer;

#[cfg(test)]
mod tests;

pub use chain::{Chain, Operator, Snapshot, SnapshotFlag, SnapshotGuard, SnapshotJob, SnapshotKind};
pub use controller::{
    Checkpointing, ClusterRun, RunEvent, RunOptions, RunOutcome, RunReport, StopHandle, run, run_part, stop_handle,
};
pub use driver::MINI_BATCH_LATENCY;
pub use metrics::Metrics;
pub use peers::Peers;
pub use plan::{
    Flow, LaneContext, LanePoll, LaneReader, OperatorContext, OperatorFactory, Partitioner, PartitionerFactory, Plan,
    Segment, SegmentOutput, SideInput, SinkFactory, SinkParallelism, SinkWriter, SourceChangelog, SourceFactory,
    TableDef, Tap,
};
