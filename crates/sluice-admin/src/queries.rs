//! The path every ad-hoc query of a job takes, whoever asks: `POST /query` (`query`)
//! and the PostgreSQL wire protocol of `sluice-pgwire` share one [`Queries`].
//!
//! Bounds: at most [`MAX_QUERIES`] admitted at once, each holding its admission until
//! its execution ended; the lease and the execution end with the caller's future.

use std::sync::Arc;

use sluice_engine::materialize::Lease;
use sluice_engine::query::{Interrupt, QueryLimits};
use sluice_types::SluiceError;

/// Queries admitted at once (each holding a lease; they execute one at a time, see
/// `sluice_engine::query::executions`).
pub const MAX_QUERIES: usize = 4;
/// Releases a lease when dropped: the request ended, or its client went away.
struct Release(Option<Arc<Lease>>);

impl Drop for Release {
    fn drop(&mut self) {
        if let Some(lease) = &self.0 {
            lease.release();
        }
    }
}

/// Cancels a query's execution when dropped: the request ended, or its client went away
/// (after a finished execution it does nothing).
struct Cancel(Interrupt);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The path every ad-hoc query of a job takes, whoever asks (`POST /query`, the
/// PostgreSQL wire protocol of `sluice-pgwire`): at most [`MAX_QUERIES`] admitted at once
/// (shared by every front end given a clone), the lease released and the execution
/// cancelled when the caller's future is dropped, the answer at the query's deadline or
/// a timeout error, and in a cluster every worker's slice gathered through their admin
/// APIs (with this token).
#[derive(Clone)]
pub struct Queries {
    job: sluice_engine::JobHandle,
    token: Option<Arc<str>>,
    admitted: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Queries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queries").field("available", &self.admitted.available_permits()).finish_non_exhaustive()
    }
}

impl Queries {
    /// The queries of `job`, gathering a cluster's slices with `token` (the admin API's).
    pub fn new(job: sluice_engine::JobHandle, token: Option<&str>) -> Queries {
        Queries { job, token: token.map(Arc::from), admitted: Arc::new(tokio::sync::Semaphore::new(MAX_QUERIES)) }
    }

    /// The job the queries read.
    pub fn job(&self) -> &sluice_engine::JobHandle {
        &self.job
    }

    /// Runs `sql` within `limits` and gives its answer to `then` (on the blocking pool,
    /// still holding the admission: encoding an answer is part of the query's work).
    /// Must run inside a tokio runtime whose blocking threads have the planner's stack
    /// (`sluice_engine::QUERY_STACK_BYTES`). Dropping the future releases the lease and
    /// cancels the execution.
    pub async fn run<T, F>(&self, sql: String, limits: QueryLimits, then: F) -> Result<T, SluiceError>
    where
        T: Send + 'static,
        F: FnOnce(sluice_engine::query::QueryAnswer) -> Result<T, SluiceError> + Send + 'static,
    {
        let permit = Arc::clone(&self.admitted).try_acquire_owned().map_err(|_| {
            SluiceError::external("query.busy", format!("{MAX_QUERIES} queries are running")).with_fix("ask again soon")
        })?;
        let job = self.job.clone();
        let gather = crate::slices::HttpGather { token: self.token.clone() };
        let prepared = tokio::task::spawn_blocking(move || job.prepare_query(&sql, limits)).await.map_err(joined)??;
        // From here on, a caller that goes away drops this future, and the guards end the
        // lease and the execution.
        let _release = Release(prepared.lease());
        let interrupt = prepared.interrupt();
        let _cancel = Cancel(interrupt.clone());
        let execution = tokio::task::spawn_blocking(move || {
            // The admission ends with the execution, not with the answer.
            let _permit = permit;
            let answer = prepared.run_gathering(Some(&gather))?;
            then(answer)
        });
        // The deadline is the request's, whether or not the execution noticed it yet.
        let deadline = tokio::time::Instant::from_std(interrupt.deadline());
        match tokio::time::timeout_at(deadline, execution).await {
            Ok(joined_execution) => joined_execution.map_err(joined)?,
            Err(_) => Err(sluice_engine::query::timed_out(limits.timeout)),
        }
    }
}

fn joined(error: tokio::task::JoinError) -> SluiceError {
    SluiceError::internal("admin.query", format!("the query's task failed: {error}"))
}
