//! Tests of the driver and the controller through the runtime's entry point, with
//! in-memory sources and sinks (`support`). Nothing waits on a clock: sinks are gated by
//! channels the test controls, and stops are requested once an event is seen. The
//! checkpoint protocol across workers runs in a seeded simulation (`simulation`), whose
//! findings are pinned as plain sequences in `coordinator_tests`.

mod cluster_tests;
mod controller_tests;
mod coordinator_tests;
pub(crate) mod driver_tests;
mod simulation;
pub(crate) mod support;
