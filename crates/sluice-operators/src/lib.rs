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
//! - [`topn`]: TopN and deduplication (`ROW_NUMBER() … <= N`) over an append-only input.
//! - [`partition`]: key hash → vnode → thread routing for the exchange.
//! - [`row_errors`]: what a filter or projection does with a row its expression fails on.
//! - [`counter`]: named run counters registered on first use.
//! - [`ttl`]: state time-to-live: keys not written for a while, dropped.
//!
//! May depend on: sluice-types, sluice-runtime, arrow, DataFusion's expression crates.
//! Never on connectors, SQL planning or the CLI.

pub mod aggregate;
mod blob;
pub mod counter;
pub mod expr;
pub mod join;
pub mod over;
pub mod partition;
pub mod row_errors;
pub mod topn;
pub mod ttl;
pub mod union;
pub mod window;

/// Whether two byte strings (encoded keys) are equal. An empty one is never handed to the
/// system's `memcmp`: its vectorised version reads through the pointer with a masked load
/// even for zero bytes, and an empty slice's dangling pointer turns that load into a
/// slow processor assist (it took an eighth of NEXMark q7's time in the window aggregate
/// without keys).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn same_bytes_compares_empty_and_other_strings() {
        assert!(super::same_bytes(&[], &[]));
        assert!(!super::same_bytes(&[], &[0]));
        assert!(super::same_bytes(&[1, 2], &[1, 2]) && !super::same_bytes(&[1, 2], &[1, 3]));
    }
}
