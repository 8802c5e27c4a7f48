//! The simulated control network: one session (a TCP connection) between the leader
//! and each other worker, with what TCP allows and nothing more. Frames of one direction
//! arrive in order, each after a delay; a partition holds every frame of the session
//! until it heals (retransmission), so a long one is seen only through silence; a reset
//! drops what is in flight and both ends learn that the session is lost; closing (a
//! process that exits, or that gave its peer up) is a last in-band frame after the data.
//!
//! Each end runs the real heartbeat and loss decision
//! (`sluice_cluster::rendezvous::tick`) on the simulated clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sluice_cluster::rendezvous::tick;
use sluice_cluster::wire::{ToLeader, ToWorker};

/// What travels on a session.
#[derive(Debug, Clone)]
pub(super) enum Frame {
    ToWorker(ToWorker),
    ToLeader(ToLeader),
    /// The sender closed the connection (FIN, after everything it sent).
    Close,
}

/// The leader's end (0) or the other worker's (1).
pub(super) const LEADER_END: usize = 0;
pub(super) const WORKER_END: usize = 1;

pub(super) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
pub(super) const LOSS_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct End {
    last_sent_ms: u64,
    last_received_ms: u64,
    /// This end is done with the session (its process exited or crashed, or it declared
    /// the peer lost): it sends, receives and checks nothing more.
    closed: bool,
}

#[derive(Debug)]
pub(super) struct Session {
    /// Frames from end `i`, in order, each with when it arrives.
    queues: [VecDeque<(u64, Frame)>; 2],
    ends: [End; 2],
    partitioned_until_ms: u64,
}

/// What a delivery attempt found.
#[derive(Debug)]
pub(super) enum Arrival {
    /// The frame for end `to`.
    Frame(Frame),
    /// Try again at this time (a partition holds the frame).
    Later(u64),
    /// Nothing (a reset dropped it, or its receiver is gone).
    Nothing,
}

impl Session {
    pub(super) fn new(now_ms: u64) -> Session {
        let end = || End { last_sent_ms: now_ms, last_received_ms: now_ms, closed: false };
        Session { queues: [VecDeque::new(), VecDeque::new()], ends: [end(), end()], partitioned_until_ms: 0 }
    }

    pub(super) fn is_closed(&self, end: usize) -> bool {
        self.ends[end].closed
    }

    /// Sends `frame` from end `from`, arriving after `delay_ms` (never before an earlier
    /// frame); returns when it arrives, or None when that end is closed.
    pub(super) fn send(&mut self, from: usize, frame: Frame, now_ms: u64, delay_ms: u64) -> Option<u64> {
        if self.ends[from].closed {
            return None;
        }
        self.ends[from].last_sent_ms = now_ms;
        let after = self.queues[from].back().map_or(0, |(at, _)| *at);
        let at = (now_ms + delay_ms).max(after);
        self.queues[from].push_back((at, frame));
        Some(at)
    }

    /// The next frame from end `from` to arrive at `now_ms`.
    pub(super) fn deliver(&mut self, from: usize, now_ms: u64) -> Arrival {
        let to = 1 - from;
        let Some((at, _)) = self.queues[from].front() else { return Arrival::Nothing };
        if *at > now_ms {
            return Arrival::Later(*at);
        }
        if now_ms < self.partitioned_until_ms {
            return Arrival::Later(self.partitioned_until_ms);
        }
        let (_, frame) = self.queues[from].pop_front().expect("checked above");
        if self.ends[to].closed {
            return Arrival::Nothing;
        }
        self.ends[to].last_received_ms = now_ms;
        Arrival::Frame(frame)
    }

    /// Cuts the link until `until_ms`.
    pub(super) fn partition(&mut self, until_ms: u64) {
        self.partitioned_until_ms = self.partitioned_until_ms.max(until_ms);
    }

    /// A reset: everything in flight is gone.
    pub(super) fn reset(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
    }

    /// End `end` is done with the session; with `fin`, its peer hears of it in band.
    pub(super) fn close(&mut self, end: usize, now_ms: u64, fin: bool) -> Option<u64> {
        let at = if fin { self.send(end, Frame::Close, now_ms, 1) } else { None };
        self.ends[end].closed = true;
        at
    }

    /// The heartbeat and loss decision of end `end` at `now_ms`: whether it declares the
    /// peer lost, whether it sends a heartbeat, and when it decides next.
    pub(super) fn check(&self, end: usize, now_ms: u64, base: Instant) -> (bool, bool, u64) {
        let at = |ms: u64| base + Duration::from_millis(ms);
        let state = &self.ends[end];
        let decided =
            tick(at(now_ms), at(state.last_sent_ms), at(state.last_received_ms), HEARTBEAT_INTERVAL, LOSS_TIMEOUT);
        let next_ms = decided.next_check.saturating_duration_since(base).as_millis() as u64;
        (decided.lost_after.is_some(), decided.send_heartbeat, next_ms.max(now_ms + 1))
    }
}
