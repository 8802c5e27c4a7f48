//! `connector = "postgres-cdc"` (its source lands next): the tables of one PostgreSQL
//! database read from a logical replication slot. This first part is the wire:
//!
//! - [`protocol`]: the replication session (startup, authentication, queries,
//!   `START_REPLICATION`, CopyBoth, status updates).
//! - [`pgoutput`]: the stream's messages, decoded.
//! - [`values`]: text values into Arrow columns.
//! - [`position`]: a lane's checkpointed position.

pub mod pgoutput;
pub mod position;
pub mod protocol;
pub mod values;
