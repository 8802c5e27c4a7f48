//! Streaming operators, the layer above the runtime: they implement
//! [`sluice_runtime::Operator`] and [`sluice_runtime::Partitioner`] over Arrow batches.
//!
//! - [`expr`]: filters and projections, evaluated with DataFusion physical expressions.
//! - [`window`]: window assignment (`TUMBLE`, `HOP`): adds `window_start`, `window_end`
//!   and `window_time` to each row (a hop row joins several windows).
//! - [`aggregate`]: the event-time window aggregate: keyed state per window, emitted once
//!   when the watermark passes the window's end; rows for an emitted window are late.
//!   [`aggregate::group`]: the non-windowed, updating group aggregate.
//! - [`join`]: the regular (non-windowed) join of two updating inputs: inner, left,
//!   right and full, on equality keys with an optional residual condition.
//! - [`union`]: `UNION ALL`: the rows of every input, under the union's schema.
//! - [`over`]: OVER aggregates over event time (`ROWS`/`RANGE … PRECEDING AND CURRENT
//!   ROW`), each row emitted once the watermark passes it.
//! - [`normalize`]: a changelog source's rows (`+I`/`-U`/`+U`/`-D`) into weights, keeping
//!   each primary key's row (Flink's `ChangelogNormalize`).
//! - [`topn`]: TopN and deduplication (`ROW_NUMBER() … <= N`) over an append-only input.
//! - [`partition`]: key hash → vnode → thread routing for the exchange.
//! - [`row_errors`]: what a filter or projection does with a row its expression fails on.
//! - [`counter`]: named run counters registered on first use.
//! - [`ttl`]: state time-to-live: keys not written for a while, dropped.
//! - [`spill`]: state beyond the memory budget, in files on local disk;
//!   [`SpilledRecords`]: sorted runs there for state kept outside an operator.
//!
//! May depend on: sluice-types, sluice-runtime, arrow, DataFusion's expression crates.
//! Never on connectors, SQL planning or the CLI.

pub mod aggregate;
mod blob;
mod bytes;
mod changed;
mod cold;
pub mod counter;
pub mod expr;
pub mod join;
pub mod normalize;
pub mod over;
mod pages;
pub mod partition;
mod records;
pub mod row_errors;
mod row_log;
pub mod spill;
mod spill_pages;
#[cfg(test)]
mod testing;
pub mod topn;
pub mod ttl;
pub mod union;
pub mod window;

pub(crate) use bytes::same_bytes;
pub use cold::{MergedRun, RunMerge, SpilledRecords, SpilledRuns};
