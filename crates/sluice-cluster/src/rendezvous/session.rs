//! The control sessions: the rendezvous connections, kept open for the run.
//!
//! Each session has one reader thread, which delivers the peer's messages to its owner's
//! channel, sends this side's heartbeats, and declares the peer lost (the pure decision
//! of `liveness`). Writes (the owner's messages, the heartbeats) go through one mutex
//! with the socket's write timeout, so frames never interleave and no write blocks
//! longer than `write_timeout`.
//!
//! # Correctness argument
//!
//! - **Exactly one `Lost` per session, never after a close**: every path that ends a
//!   session (the reader's EOF, a read or write error, silence, a protocol violation, the
//!   owner's drop) goes through one `AtomicBool` swap; only the path that flips it
//!   reports, and the owner's close flips it without reporting. A session that ended
//!   refuses further sends with a `LostPeer` error.
//! - **The reader thread always ends**: each read waits at most until the next heartbeat
//!   or the loss deadline (`liveness::Tick::next_check`), so it re-checks the loss
//!   condition at least that often; shutting the socket down (on loss or close) ends a
//!   blocked read at once.
//! - **Bounded queue**: the protocol sends a bounded number of messages per request (an
//!   `Acked` per `Barrier`, one `Finished` or `Failed`), and heartbeats are not queued. A
//!   peer that exceeds [`MAX_QUEUED_EVENTS_PER_PEER`] unconsumed messages per peer breaks
//!   the protocol and is declared lost, so the queue never grows without bound.
//! - **Nothing from the peer panics**: an undecodable frame, a message of the wrong
//!   direction or a refusal ends the session with a typed error naming the peer.

use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use sluice_types::{ErrorKind, SluiceError};

use super::liveness;
use super::{ControlSettings, seconds};
use crate::auth::is_timeout;
use crate::wire::{Body, ControlMessage, Fill, FrameReader, ToLeader, ToWorker, frame_of};

/// Unconsumed messages one peer may have queued before it is declared lost.
pub const MAX_QUEUED_EVENTS_PER_PEER: usize = 1024;

/// What a control session tells its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlEvent<M> {
    /// `peer` (a member id; 0 is the leader) sent `message`. Heartbeats are not reported.
    Received { peer: u32, message: M },
    /// The session with `peer` ended: it closed, went silent, failed or broke the
    /// protocol (`error`, of kind `LostPeer`, says which). Reported once per peer.
    Lost { peer: u32, error: SluiceError },
}

/// A message this side receives.
pub(crate) trait Inbound: Sized + Send + 'static {
    /// The message, or the frame it was not.
    fn from_message(message: ControlMessage) -> Result<Self, Box<ControlMessage>>;
    fn is_heartbeat(&self) -> bool;
}

/// A message this side sends.
pub(crate) trait Outbound: Body + Send + Sync + 'static {
    fn heartbeat() -> Self;
}

impl Inbound for ToLeader {
    fn from_message(message: ControlMessage) -> Result<ToLeader, Box<ControlMessage>> {
        match message {
            ControlMessage::ToLeader(message) => Ok(message),
            other => Err(Box::new(other)),
        }
    }

    fn is_heartbeat(&self) -> bool {
        matches!(self, ToLeader::Heartbeat)
    }
}

impl Inbound for ToWorker {
    fn from_message(message: ControlMessage) -> Result<ToWorker, Box<ControlMessage>> {
        match message {
            ControlMessage::ToWorker(message) => Ok(message),
            other => Err(Box::new(other)),
        }
    }

    fn is_heartbeat(&self) -> bool {
        matches!(self, ToWorker::Heartbeat)
    }
}

impl Outbound for ToWorker {
    fn heartbeat() -> ToWorker {
        ToWorker::Heartbeat
    }
}

impl Outbound for ToLeader {
    fn heartbeat() -> ToLeader {
        ToLeader::Heartbeat
    }
}

/// The timings a session uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    heartbeat_interval: Duration,
    loss_timeout: Duration,
    write_timeout: Duration,
}

impl Timing {
    pub(crate) fn of(settings: &ControlSettings) -> Timing {
        Timing {
            heartbeat_interval: settings.heartbeat_interval,
            loss_timeout: settings.loss_timeout,
            write_timeout: settings.write_timeout,
        }
    }
}

/// The writing half and the last time anything was sent.
#[derive(Debug)]
struct Writer {
    stream: TcpStream,
    last_sent: Instant,
}

/// One control session: receives `I`, sends `O`.
#[derive(Debug)]
pub(crate) struct Session<I, O> {
    /// The peer's member id.
    peer: u32,
    /// The peer for messages, e.g. `worker 2 (exchange 10.0.0.2:7000, from 10.0.0.2:51234)`.
    label: String,
    ended: AtomicBool,
    writer: Mutex<Writer>,
    /// A handle for shutting the socket down without taking the writer's lock.
    socket: TcpStream,
    events: Sender<ControlEvent<I>>,
    version: u16,
    timing: Timing,
    _sends: PhantomData<fn(O)>,
}

impl<I: Inbound, O: Outbound> Session<I, O> {
    /// A session over `stream` (handshaken), not yet reading.
    pub(crate) fn new(
        peer: u32,
        label: String,
        stream: TcpStream,
        events: Sender<ControlEvent<I>>,
        version: u16,
        timing: Timing,
    ) -> Result<Session<I, O>, SluiceError> {
        let io = |error: std::io::Error| {
            SluiceError::external("cluster.control_io", format!("setting up the control session with {label}: {error}"))
        };
        stream.set_write_timeout(Some(timing.write_timeout)).map_err(io)?;
        let socket = stream.try_clone().map_err(io)?;
        Ok(Session {
            peer,
            label,
            ended: AtomicBool::new(false),
            writer: Mutex::new(Writer { stream, last_sent: Instant::now() }),
            socket,
            events,
            version,
            timing,
            _sends: PhantomData,
        })
    }

    /// Sends one message; a failure ends the session (one `Lost`) and is returned.
    pub(crate) fn send(&self, message: &O) -> Result<(), SluiceError> {
        self.write_frame(&frame_of(message, self.version)?)
    }

    /// Writes an encoded frame under the writer's lock.
    pub(crate) fn write_frame(&self, frame: &[u8]) -> Result<(), SluiceError> {
        if self.ended.load(Ordering::Acquire) {
            return Err(self.lost_error("the session has ended"));
        }
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let written = std::io::Write::write_all(&mut writer.stream, frame);
        match written {
            Ok(()) => {
                writer.last_sent = Instant::now();
                Ok(())
            }
            Err(error) => {
                drop(writer);
                let why = if is_timeout(&error) {
                    format!("a write blocked for {} (it stopped reading)", seconds(self.timing.write_timeout))
                } else {
                    format!("writing to it failed: {error}")
                };
                let error = self.lost_error(&why);
                self.lose(error.clone());
                Err(error)
            }
        }
    }

    fn last_sent(&self) -> Instant {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner).last_sent
    }

    /// Ends the session and reports `error`, unless it had ended already.
    fn lose(&self, error: SluiceError) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            // The owner decides whether a loss is a failure (a worker that already
            // reported its end closes its session as it should).
            tracing::debug!(peer = self.peer, "{}", error.message);
            let _ = self.events.send(ControlEvent::Lost { peer: self.peer, error });
        }
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// Ends the session without reporting (the owner closes it).
    pub(crate) fn close(&self) {
        self.ended.store(true, Ordering::Release);
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// [`Session::lost_error`], or, when this side itself stalled just before, an error
    /// that says so (`cluster.stalled`): the silence was most likely this worker's.
    fn lost_error_after(&self, why: &str, stall: Option<Stall>) -> SluiceError {
        let Some(stall) = stall else {
            return self.lost_error(why);
        };
        SluiceError::external(
            "cluster.stalled",
            format!(
                "the control session with {} is lost ({why}), but this worker itself did not run for {} (the \
                 process was stopped, e.g. by SIGSTOP, or starved of CPU), and the loss timeout is {}: the silence \
                 was most likely this worker's",
                self.label,
                seconds(stall.late),
                seconds(self.timing.loss_timeout),
            ),
        )
        .with_kind(ErrorKind::LostPeer)
        .with_fix("restart only this worker with the same command; see why this process did not run")
    }

    fn lost_error(&self, why: &str) -> SluiceError {
        SluiceError::external("cluster.peer_lost", format!("the control session with {} is lost: {why}", self.label))
            .with_kind(ErrorKind::LostPeer)
            .with_fix("see that worker's log and host: it may have stopped, crashed, stalled or lost the network")
    }

    /// Starts the reader thread; `reader` holds what the handshake read past its last frame.
    pub(crate) fn start(
        self: &Arc<Self>,
        reader: FrameReader,
        max_queued: usize,
    ) -> Result<JoinHandle<()>, SluiceError> {
        let session = Arc::clone(self);
        let stream = self.socket.try_clone().map_err(|error| {
            SluiceError::external("cluster.control_io", format!("reading from {}: {error}", self.label))
        })?;
        thread::Builder::new()
            .name(format!("sluice-control-{}", self.peer))
            .spawn(move || session.read_loop(stream, reader, max_queued))
            .map_err(|error| {
                SluiceError::external("cluster.control_thread", format!("cannot start a control thread: {error}"))
            })
    }

    /// The reader thread: deliver, heartbeat, detect loss; returns once the session ended.
    fn read_loop(&self, stream: TcpStream, mut reader: FrameReader, max_queued: usize) {
        let mut last_received = Instant::now();
        // This side's own last long pause (see `Stall`), while it may explain a loss.
        let mut stall: Option<Stall> = None;
        while !self.ended.load(Ordering::Acquire) {
            if stall.is_some_and(|stall| stall.resumed.elapsed() > self.timing.loss_timeout) {
                stall = None;
            }
            match reader.next_buffered() {
                Ok(Some(message)) => {
                    if !self.deliver(message, max_queued) {
                        return;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(problem) => {
                    let why = format!("it sent an invalid frame: {}", problem.into_error().message);
                    return self.lose(self.lost_error_after(&why, stall));
                }
            }
            let now = Instant::now();
            let timing = self.timing;
            let decision =
                liveness::tick(now, self.last_sent(), last_received, timing.heartbeat_interval, timing.loss_timeout);
            if let Some(silent) = decision.lost_after {
                let why = format!(
                    "nothing arrived for {} (the loss timeout is {})",
                    seconds(silent),
                    seconds(timing.loss_timeout)
                );
                return self.lose(self.lost_error_after(&why, stall));
            }
            if decision.send_heartbeat && self.send(&O::heartbeat()).is_err() {
                return;
            }
            let wait = decision.next_check.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            if let Err(error) = stream.set_read_timeout(Some(wait)) {
                return self.lose(self.lost_error(&format!("its socket failed: {error}")));
            }
            let due = Instant::now() + wait;
            let filled = reader.fill(&mut &stream);
            // Woken far later than asked: this process did not run meanwhile.
            let late = Instant::now().saturating_duration_since(due);
            if late >= timing.loss_timeout / 2 {
                stall = Some(Stall { resumed: Instant::now(), late });
            }
            match filled {
                Ok(Fill::Data) => last_received = Instant::now(),
                Ok(Fill::Closed { buffered: 0 }) => {
                    return self.lose(self.lost_error_after("it closed the connection", stall));
                }
                Ok(Fill::Closed { buffered }) => {
                    let why = format!("it closed the connection in the middle of a frame ({buffered} bytes)");
                    return self.lose(self.lost_error_after(&why, stall));
                }
                Err(error) if is_timeout(&error) => {}
                Err(error) => {
                    return self.lose(self.lost_error_after(&format!("reading from it failed: {error}"), stall));
                }
            }
        }
    }

    /// Hands one message to the owner; false once the session ended.
    fn deliver(&self, message: ControlMessage, max_queued: usize) -> bool {
        let message = match I::from_message(message).map_err(|other| *other) {
            Ok(message) if message.is_heartbeat() => return true,
            Ok(message) => message,
            Err(ControlMessage::Refusal(text)) => {
                self.lose(self.lost_error(&format!("it refused this worker: {text}")));
                return false;
            }
            Err(other) => {
                let why = format!("it sent a {:?} frame, which does not belong in a control session", other.kind());
                self.lose(self.lost_error(&why));
                return false;
            }
        };
        if self.events.len() >= max_queued {
            let why = format!("it sent more than {max_queued} messages that were not consumed");
            self.lose(self.lost_error(&why));
            return false;
        }
        if self.ended.load(Ordering::Acquire) {
            return false;
        }
        // A send fails only when the owner dropped its receiver: nobody listens any more.
        self.events.send(ControlEvent::Received { peer: self.peer, message }).is_ok()
    }
}

/// A pause of this side's own reader: it woke `late` after it asked to, at `resumed`.
#[derive(Debug, Clone, Copy)]
struct Stall {
    resumed: Instant,
    late: Duration,
}

/// The leader's control sessions, one per other worker.
#[derive(Debug)]
pub struct LeaderControl {
    /// Indexed by member id - 1.
    sessions: Vec<Arc<Session<ToLeader, ToWorker>>>,
    readers: Vec<Option<JoinHandle<()>>>,
    events: Receiver<ControlEvent<ToLeader>>,
    /// Keeps the channel open while the control lives (a solo leader has no session).
    _events_open: Sender<ControlEvent<ToLeader>>,
    /// Stops the thread that refuses late joiners.
    doorman_stop: Option<Arc<AtomicBool>>,
}

impl LeaderControl {
    pub(crate) fn new(
        sessions: Vec<Arc<Session<ToLeader, ToWorker>>>,
        readers: Vec<JoinHandle<()>>,
        events: (Sender<ControlEvent<ToLeader>>, Receiver<ControlEvent<ToLeader>>),
        doorman_stop: Option<Arc<AtomicBool>>,
    ) -> LeaderControl {
        LeaderControl {
            sessions,
            readers: readers.into_iter().map(Some).collect(),
            events: events.1,
            _events_open: events.0,
            doorman_stop,
        }
    }

    /// The other workers' ids (1..N).
    pub fn workers(&self) -> impl Iterator<Item = u32> + '_ {
        self.sessions.iter().map(|session| session.peer)
    }

    /// Sends `message` to worker `worker`. A lost worker, or a write that fails (which
    /// loses it), is an error of kind `LostPeer`.
    pub fn send(&self, worker: u32, message: &ToWorker) -> Result<(), SluiceError> {
        self.session(worker)?.send(message)
    }

    /// Sends `message` to every worker, even when some fail; the first failure is returned.
    pub fn broadcast(&self, message: &ToWorker) -> Result<(), SluiceError> {
        let mut first_failure = None;
        for session in &self.sessions {
            if let Err(error) = session.send(message) {
                first_failure.get_or_insert(error);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// Every worker's messages and losses, merged.
    pub fn events(&self) -> &Receiver<ControlEvent<ToLeader>> {
        &self.events
    }

    fn session(&self, worker: u32) -> Result<&Arc<Session<ToLeader, ToWorker>>, SluiceError> {
        let index = (worker as usize).wrapping_sub(1);
        self.sessions.get(index).ok_or_else(|| {
            SluiceError::internal(
                "cluster.no_such_worker",
                format!("there is no worker {worker} (the workers are 1..={})", self.sessions.len()),
            )
        })
    }

    /// Waits for worker `worker`'s reader thread to end (tests: after its `Lost`, so that
    /// no later event can be missed).
    #[cfg(test)]
    pub(crate) fn join_reader(&mut self, worker: u32) {
        if let Some(handle) = self.readers.get_mut((worker as usize).wrapping_sub(1)).and_then(Option::take) {
            handle.join().expect("the reader thread does not panic");
        }
    }
}

impl Drop for LeaderControl {
    fn drop(&mut self) {
        if let Some(stop) = &self.doorman_stop {
            stop.store(true, Ordering::Release);
        }
        for session in &self.sessions {
            session.close();
        }
        // Reader threads end on their own once their socket is shut down.
        self.readers.clear();
    }
}

/// A worker's control session with the leader.
#[derive(Debug)]
pub struct WorkerControl {
    /// The leader's control address, as this worker joined it.
    leader: String,
    session: Arc<Session<ToWorker, ToLeader>>,
    reader: Option<JoinHandle<()>>,
    events: Receiver<ControlEvent<ToWorker>>,
    _events_open: Sender<ControlEvent<ToWorker>>,
}

impl WorkerControl {
    pub(crate) fn new(
        leader: &str,
        session: Arc<Session<ToWorker, ToLeader>>,
        reader: JoinHandle<()>,
        events: (Sender<ControlEvent<ToWorker>>, Receiver<ControlEvent<ToWorker>>),
    ) -> WorkerControl {
        WorkerControl {
            leader: leader.to_string(),
            session,
            reader: Some(reader),
            events: events.1,
            _events_open: events.0,
        }
    }

    /// The leader's control address (`host:port`), as this worker joined it: where
    /// [`super::leader_answers`] asks whether it still runs.
    pub fn leader(&self) -> &str {
        &self.leader
    }

    /// Sends `message` to the leader; a lost leader is an error of kind `LostPeer`.
    pub fn send(&self, message: &ToLeader) -> Result<(), SluiceError> {
        self.session.send(message)
    }

    /// The leader's commands and its loss (as peer 0).
    pub fn events(&self) -> &Receiver<ControlEvent<ToWorker>> {
        &self.events
    }

    /// Ends the session without sending anything more and without closing the connection
    /// (tests: a worker that hangs). Returns once the reader thread ended (it wakes within
    /// a heartbeat interval and sees the session ended).
    #[cfg(test)]
    pub(crate) fn go_silent(&mut self) {
        self.session.ended.store(true, Ordering::Release);
        if let Some(handle) = self.reader.take() {
            handle.join().expect("the reader thread does not panic");
        }
    }
}

impl Drop for WorkerControl {
    fn drop(&mut self) {
        self.session.close();
        self.reader.take();
    }
}
