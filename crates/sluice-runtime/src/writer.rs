//! The checkpoint writer: a thread of its own on which the [`Checkpointer`] writes a
//! checkpoint's state copies as runs (this worker's part) and, on the worker that
//! publishes, publish the manifest from every worker's part. The controller keeps
//! answering drivers, stop requests and deadlines meanwhile.

use crossbeam_channel::{Receiver, Sender, bounded};
use sluice_types::{Epoch, ErrorKind, SluiceError, panic_message};

use crate::checkpoint::{Checkpointer, ManifestSlice};
use crate::mailbox::{Posted, post};

/// One checkpoint for the writer.
#[derive(Debug)]
pub(crate) struct WriteRequest {
    pub epoch: Epoch,
    pub slice: ManifestSlice,
    pub final_epoch: bool,
    /// The other workers' parts, when this worker publishes (empty alone); `None` when
    /// it only writes its part for the leader.
    pub publish: Option<Vec<Vec<u8>>>,
}

/// What the writer did with one checkpoint.
#[derive(Debug)]
pub(crate) enum WriteOutcome {
    /// The manifest is published; it names this many bytes of state, this many per
    /// operator id.
    Published { state_bytes: u64, written_bytes: u64, by_operator: Vec<(String, u64)> },
    /// This worker's part is durable; the leader publishes it.
    Part(Vec<u8>),
}

/// The writer's answer for one checkpoint.
#[derive(Debug)]
pub(crate) struct Written {
    pub epoch: Epoch,
    pub result: Result<WriteOutcome, SluiceError>,
}

/// Why the writer's two channels (capacity 1) never fill: a request is sent only when no
/// checkpoint is being written (the coordinator's `writing` is empty), and the writer
/// answers each request once, before taking the next.
pub(crate) const WRITER_ARGUMENT: &str = "one checkpoint is written at a time";

/// Starts the writer thread; it ends when the request sender is gone.
pub(crate) fn spawn_writer(mut checkpointer: Box<dyn Checkpointer>) -> (Sender<WriteRequest>, Receiver<Written>) {
    let (requests, incoming) = bounded::<WriteRequest>(1);
    let (answers, results) = bounded::<Written>(1);
    let spawned = std::thread::Builder::new().name("sluice-checkpoint".into()).spawn(move || {
        for request in incoming {
            let epoch = request.epoch;
            // A panic (a bug in a snapshot job or the checkpointer) fails the run with its
            // message, never leaves the controller waiting for an answer.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&mut *checkpointer, request)))
                .unwrap_or_else(|panic| {
                    let message = format!("the checkpoint writer panicked: {}", panic_message(&*panic));
                    Err(SluiceError::internal("run.panic", message).with_kind(ErrorKind::Panic))
                });
            // One checkpoint at a time: the answer channel holds the one answer.
            if post(&answers, Written { epoch, result }, WRITER_ARGUMENT) == Posted::ReceiverGone {
                return;
            }
        }
    });
    // Without the thread every request fails at once (its channel is closed), which the
    // coordinator reports as a failed checkpoint.
    if let Err(error) = spawned {
        tracing::error!(%error, "the checkpoint writer thread could not start");
    }
    (requests, results)
}

/// Writes one checkpoint: this worker's part, then the manifest if it publishes. (The
/// simulation tests call it inline, in place of the thread.)
pub(crate) fn write(checkpointer: &mut dyn Checkpointer, request: WriteRequest) -> Result<WriteOutcome, SluiceError> {
    let WriteRequest { epoch, slice, final_epoch, publish } = request;
    let part = checkpointer.write_part(epoch, slice)?;
    match publish {
        None => Ok(WriteOutcome::Part(part)),
        Some(mut parts) => {
            parts.insert(0, part);
            let state_bytes = checkpointer.publish(epoch, parts, final_epoch)?;
            Ok(WriteOutcome::Published {
                state_bytes,
                written_bytes: checkpointer.published_written_bytes(),
                by_operator: checkpointer.published_by_operator(),
            })
        }
    }
}

pub(crate) fn writer_gone() -> SluiceError {
    SluiceError::internal("checkpoint.writer", "the checkpoint writer thread is gone")
}
