//! Sluice's vocabulary, the lowest layer: every other crate may depend on it, it depends
//! on nothing of Sluice's.
//!
//! - [`Batch`]: an Arrow record batch whose rows each carry a weight (+1 insert, -1
//!   retract). The common append-only case stores no weight column.
//! - [`Changelog`]: whether a stream is append-only or updating, with its upsert key.
//! - [`Message`]: the one in-band enum that travels every edge (data, watermark, barrier,
//!   end-of-data).
//! - [`SluiceError`]: the typed error for operating failures, with a stable code, a
//!   domain and the fix.
//! - [`failpoint`]: named failpoints for deterministic fault injection in tests.
//! - [`key`]: the project's own encoding of key values and the key hash (versioned,
//!   pinned by golden vectors): what state blobs store and placement hashes.
//! - [`vnode`]: how a key hash maps to a virtual node, and vnodes to threads.

mod batch;
mod changelog;
mod error;
pub mod failpoint;
pub mod key;
pub mod vnode;

pub use batch::{Batch, Weights};
pub use changelog::{Changelog, ROW_KIND_COLUMN, RowKind};
pub use error::{Domain, ErrorKind, SluiceError, panic_message};

/// Milliseconds since the Unix epoch, the unit of event time and watermarks.
pub type TimestampMs = i64;

/// A checkpoint epoch: barriers carry it, manifests are named by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

/// The in-band message on every edge of the dataflow.
///
/// Ordering contract on one edge: watermarks never decrease; after `EndOfData` nothing
/// follows; a `Barrier(e)` is followed only by barriers of higher epochs.
#[derive(Debug, Clone)]
pub enum Message {
    /// Rows with their weights.
    Data(Batch),
    /// No row with an event time at or below this value will follow on this edge
    /// (Flink's meaning: a window ending at `end` is complete at `end - 1`).
    Watermark(TimestampMs),
    /// Everything before this message belongs to epoch `e` and earlier.
    Barrier(Epoch),
    /// The producer will send nothing more.
    EndOfData,
}
