//! Stack sizes for planning and evaluating expressions at the depth limit.
//!
//! sqlparser and DataFusion recurse once per level of nesting, with large frames in a
//! debug build. Measured in a debug build: the smallest stack (to 256 KiB) with which a
//! view with one expression at the limit ([`EXPRESSION_DEPTH_MAX`](crate::EXPRESSION_DEPTH_MAX)
//! = 500 levels) is planned (parse, check, DataFusion's planner, analyzer, simplifier,
//! physical planning, stream planning):
//!
//! | query at the limit                                   | planning  |
//! |------------------------------------------------------|-----------|
//! | `abs(abs(…(a)…))`                                    | 47.3 MiB  |
//! | 257 nested derived tables (the parser's limit)       | 44.0 MiB  |
//! | `CASE WHEN … THEN CASE WHEN … THEN … END … END`      | 42.3 MiB  |
//! | `-(-(…a))` (prefix operators)                        | 29.3 MiB  |
//! | `((…(a)…))`                                          | 25.3 MiB  |
//! | `a + (a + (… + a))` (250 terms: 2 levels each)       | 19.8 MiB  |
//! | `a + a + … + a`                                      |  9.0 MiB  |
//!
//! So each view is planned on a thread of [`PLANNING_STACK_BYTES`] (2.7 times the worst
//! measured; the memory is reserved, and touched only as deep as a query goes).
//! Evaluating such an expression on 1024 rows needed at most 2.0 MiB (`a + a + … + a`;
//! nested calls 1.8 MiB, nested CASE and `a + (a + …)` 1.0 MiB; parentheses and prefix
//! operators are folded away by the simplifier), the whole of a default Rust thread's
//! 2 MiB: threads that evaluate expressions (the runtime's drivers) need
//! [`EVALUATION_STACK_BYTES`] (4 times that; release builds need less). Dropping the
//! planner and its plans needed under 256 KiB, so any thread may drop them.

use sluice_types::SluiceError;

/// The stack of the thread each view is planned on.
pub const PLANNING_STACK_BYTES: usize = 128 << 20;

/// The stack a thread evaluating planned expressions of any depth allowed needs (the
/// runtime's driver threads; the default of Rust threads is 2 MiB).
pub const EVALUATION_STACK_BYTES: usize = 8 << 20;

/// Runs `work` on a thread of [`PLANNING_STACK_BYTES`] and waits for it. A panic in
/// `work` is resumed on the caller's thread.
pub(crate) fn on_planning_stack<T: Send>(work: impl FnOnce() -> T + Send) -> Result<T, SluiceError> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("sluice-sql-planner".into())
            .stack_size(PLANNING_STACK_BYTES)
            .spawn_scoped(scope, work)
            .map_err(|error| {
                SluiceError::external(
                    "sql.planning_thread",
                    format!(
                        "cannot start a thread with a {} MiB stack to plan SQL: {error}",
                        PLANNING_STACK_BYTES >> 20
                    ),
                )
                .with_fix("check the process's memory and thread limits (ulimit -v, ulimit -u)")
            })?;
        match thread.join() {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
