//! Stopping a query's execution while it runs: at its deadline, or when it is cancelled
//! (its client went away, or the admin API answered 504 without waiting for it).
//!
//! DataFusion stops a query when its stream is dropped, but a stream is only dropped
//! between two polls, and one poll of a CPU-bound plan can run to the end: a cross join
//! builds batch after batch from rows it already holds and its parent (a sort, an
//! aggregate) consumes them in one loop, never returning `Pending`, so neither a tokio
//! timer nor DataFusion's cooperative budget (spent only by the scans) gets a turn.
//! Hence [`interruptible`]: every operator of the physical plan is wrapped in
//! [`Interruptible`], whose stream checks the [`Interrupt`] before and after each poll of
//! the operator below, and fails with [`STOPPED`] once it fired. A parent sees the error
//! on the next batch of any of its inputs and ends, and so does the whole plan.
//!
//! Granularity: one batch of one operator (DataFusion's batch size, 8192 rows). Not
//! interrupted: work inside one poll that reads no input, such as one expression over one
//! batch, or a hash join building its table from the rows it collected.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Stream, StreamExt};

/// The text of the error an interrupted operator returns (the query's own error, timeout
/// or cancellation, is made by whoever reads [`Interrupt::fired`]).
pub(crate) const STOPPED: &str = "the query was interrupted";

/// Why a query must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its deadline passed.
    Deadline,
    /// [`Interrupt::cancel`] was called.
    Cancelled,
}

/// A query's deadline and cancellation flag, shared by every operator of its plan and by
/// whoever may cancel it. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Interrupt {
    inner: Arc<Flags>,
}

#[derive(Debug)]
struct Flags {
    deadline: Instant,
    cancelled: AtomicBool,
}

impl Interrupt {
    pub fn new(deadline: Instant) -> Interrupt {
        Interrupt { inner: Arc::new(Flags { deadline, cancelled: AtomicBool::new(false) }) }
    }

    pub fn deadline(&self) -> Instant {
        self.inner.deadline
    }

    /// Stops the query at its next check; it fails with `query.cancelled` (unless its
    /// deadline passed first).
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Why the query must stop now, if it must.
    pub fn fired(&self) -> Option<Stop> {
        if Instant::now() >= self.inner.deadline {
            Some(Stop::Deadline)
        } else if self.is_cancelled() {
            Some(Stop::Cancelled)
        } else {
            None
        }
    }
}

/// `plan` with every operator wrapped in [`Interruptible`] (also for other DataFusion
/// plans of the process: the PostgreSQL endpoint's catalog queries).
pub fn interruptible(plan: Arc<dyn ExecutionPlan>, interrupt: &Interrupt) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let wrapped: Arc<dyn ExecutionPlan> = Arc::new(Interruptible { input: node, interrupt: interrupt.clone() });
        Ok(Transformed::yes(wrapped))
    })
    .map(|transformed| transformed.data)
}

/// One operator of a query's plan whose stream stops once the [`Interrupt`] fired.
#[derive(Debug)]
pub(crate) struct Interruptible {
    input: Arc<dyn ExecutionPlan>,
    interrupt: Interrupt,
}

impl DisplayAs for Interruptible {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interruptible")
    }
}

impl ExecutionPlan for Interruptible {
    fn name(&self) -> &str {
        "Interruptible"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[Arc<dyn ExecutionPlan>; 1]>::try_from(children).map_err(|children| {
            DataFusionError::Internal(format!("Interruptible has one input, not {}", children.len()))
        })?;
        Ok(Arc::new(Interruptible { input, interrupt: self.interrupt.clone() }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        Ok(Box::pin(Checked { schema: input.schema(), input, interrupt: self.interrupt.clone() }))
    }
}

/// An operator's stream, checked against the interrupt around each poll.
struct Checked {
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    interrupt: Interrupt,
}

impl Checked {
    fn stopped() -> Poll<Option<Result<RecordBatch>>> {
        Poll::Ready(Some(Err(DataFusionError::Execution(STOPPED.to_string()))))
    }
}

impl Stream for Checked {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.interrupt.fired().is_some() {
            return Checked::stopped();
        }
        let polled = self.input.poll_next_unpin(cx);
        // A batch made after the interrupt fired is not passed on: the poll may have been long.
        if matches!(polled, Poll::Ready(Some(Ok(_)))) && self.interrupt.fired().is_some() {
            return Checked::stopped();
        }
        polled
    }
}

impl RecordBatchStream for Checked {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
