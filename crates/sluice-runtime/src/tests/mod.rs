//! Tests of the driver and the controller through the runtime's entry point, with
//! in-memory sources and sinks (`support`). Nothing waits on a clock: sinks are gated by
//! channels the test controls, and stops are requested once an event is seen.

mod cluster_tests;
mod controller_tests;
mod driver_tests;
mod support;
