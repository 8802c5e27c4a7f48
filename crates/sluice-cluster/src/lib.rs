//! One binary on many hosts. Every worker runs the same `sluice` binary with the same
//! `pipeline.toml`; one of them leads while it also works (no control plane).
//!
//! - [`wire`]: the control connection's framing and messages (length-prefixed,
//!   versioned, bounded, postcard bodies), pinned by golden vectors.
//! - [`auth`]: the shared-secret proof (HMAC-SHA256 challenge-response in both
//!   directions) on control and data connections.
//! - [`rendezvous`]: workers register with the leader; once all have, the leader sends
//!   every worker the member set and the topology fingerprint, and both sides refuse a
//!   worker with another wire version or fingerprint.
//! - [`frame`]: the data connection's frames (exchange messages as Arrow IPC, credits).
//! - [`link`]: one TCP link per worker pair carrying every exchange channel between the
//!   two, with per-channel credit-based flow control.

pub mod auth;
pub mod frame;
pub mod link;
pub mod rendezvous;
pub mod wire;
