//! The exchange: one bounded channel per (sender slot, receiver slot) pair. A slot is a
//! driver thread; in a cluster the slots are every worker's threads
//! ([`sluice_types::vnode::SlotLayout`]), and a channel between slots of two workers is
//! carried by their link (`sluice_cluster::link`): the sender's end is a bounded local
//! queue the link drains under the receiver's credit, the receiver's end an inbox that
//! returns credit as messages are taken.
//!
//! Receiving side ([`ExchangeInput`]): merges its senders into one ordered input for the
//! segment: data as it comes (round robin over senders), the watermark as the minimum of
//! the senders' watermarks, a barrier once every live sender delivered it (a sender whose
//! barrier arrived is held back until then: alignment), end-of-data once every sender ended.
//!
//! After a restore, a sender's first message is the watermark its lanes resumed with
//! (before anything else, the driver takes what each lane tells without reading input,
//! `LaneReader::resumed`: its watermark, or that it had ended; even while the job is
//! paused; then, unless it is, it polls each other lane once), but the senders' messages
//! reach a receiver in any order: rows of one sender merged while another sender's first
//! watermark is still on its way would meet the merged watermark of nothing yet, and a
//! row late at the checkpoint would open a window emitted before it again. So a restored
//! input ([`ExchangeInput::restored`]) holds back each sender whose first message was a
//! watermark until every live sender delivered a first message: the merged watermark is
//! the restored one before any row passes. A sender whose first message is rows, a
//! barrier or its end had no watermark to resume with (its lanes had none at the
//! checkpoint, so neither had the merged stream, and no window was emitted), and is not
//! held; nothing is held on an input without event time. A hold ends at the latest with
//! the next barrier or end-of-data, which every sender delivers. Not covered: a job
//! paused when it resumes, on a thread where a lane had ended at the checkpoint and tells
//! so only when polled (a file range, a Kafka partition): that thread's watermark waits
//! for the job to resume, and a barrier taken meanwhile passes first.
//!
//! Sending side ([`ExchangeOutput`]): partitions data by destination and broadcasts
//! control messages, through a per-destination outbox. Sends never block: a full channel
//! leaves the message in the outbox, and the driver stops feeding the segment until the
//! outbox drains (that is how backpressure travels upstream, see `driver`).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError, TrySendError, bounded};
use sluice_cluster::frame::ChannelId;
use sluice_cluster::link::{NetworkBuilder, RemoteInbox};
use sluice_types::vnode::SlotLayout;
use sluice_types::{Epoch, ErrorKind, Message, SluiceError, TimestampMs};

use crate::metrics::{NO_WATERMARK, QueueMetrics};
use crate::plan::Partitioner;

/// Where one sender's messages arrive.
pub(crate) enum Inbound {
    /// From a thread of this worker.
    Local(Receiver<Message>),
    /// From a thread of another worker, over the link to it.
    Remote(RemoteInbox),
}

impl Inbound {
    fn try_recv(&self) -> Result<Message, TryRecvError> {
        match self {
            Inbound::Local(receiver) => receiver.try_recv(),
            Inbound::Remote(inbox) => inbox.messages.try_recv().map(|(message, bytes)| {
                // Taking the message is what grants its sender more credit.
                inbox.consumed(bytes);
                message
            }),
        }
    }

    fn register<'a>(&'a self, select: &mut Select<'a>) {
        match self {
            Inbound::Local(receiver) => select.recv(receiver),
            Inbound::Remote(inbox) => select.recv(&inbox.messages),
        };
    }

    /// Messages waiting in it.
    fn len(&self) -> usize {
        match self {
            Inbound::Local(receiver) => receiver.len(),
            Inbound::Remote(inbox) => inbox.messages.len(),
        }
    }

    fn is_local(&self) -> bool {
        matches!(self, Inbound::Local(_))
    }
}

/// The channels of one exchange as seen by one worker: `senders[from - local.start][to]`
/// for every local sender slot and every receiver slot, `receivers[to - local.start][from]`
/// for every local receiver slot and every sender slot.
pub(crate) struct Mesh {
    pub senders: Vec<Vec<Sender<Message>>>,
    pub receivers: Vec<Vec<Inbound>>,
}

/// The in-process mesh of `threads` slots.
#[cfg(test)]
pub(crate) fn mesh(threads: usize, capacity: usize) -> Mesh {
    let layout = SlotLayout::solo(threads as u32);
    cluster_mesh(&layout, 0, 0, capacity, None)
}

/// The mesh of exchange number `exchange` (counted over the plan, the same on every
/// worker) as seen by `worker`. Channels between two local slots are in-process; the
/// others are registered on `network`, which every layout of more than one worker needs.
pub(crate) fn cluster_mesh(
    layout: &SlotLayout,
    worker: u32,
    exchange: u32,
    capacity: usize,
    mut network: Option<&mut NetworkBuilder>,
) -> Mesh {
    assert!(capacity > 0, "exchange queues need room for at least one batch");
    let slots = layout.slots();
    let local: Range<u32> = layout.slots_of(worker);
    let mut senders: Vec<Vec<Option<Sender<Message>>>> =
        local.clone().map(|_| (0..slots).map(|_| None).collect()).collect();
    let mut receivers: Vec<Vec<Option<Inbound>>> = local.clone().map(|_| (0..slots).map(|_| None).collect()).collect();
    for from in 0..slots {
        for to in 0..slots {
            let (from_here, to_here) = (local.contains(&from), local.contains(&to));
            let id = channel_id(exchange, from, to, slots);
            if from_here && to_here {
                let (sender, receiver) = bounded(capacity);
                senders[(from - local.start) as usize][to as usize] = Some(sender);
                receivers[(to - local.start) as usize][from as usize] = Some(Inbound::Local(receiver));
            } else if from_here {
                let network = network.as_deref_mut().expect("a cluster run has a network");
                senders[(from - local.start) as usize][to as usize] = Some(network.outgoing(layout.worker_of(to), id));
            } else if to_here {
                let network = network.as_deref_mut().expect("a cluster run has a network");
                let inbox = network.incoming(layout.worker_of(from), id, None);
                receivers[(to - local.start) as usize][from as usize] = Some(Inbound::Remote(inbox));
            }
        }
    }
    Mesh {
        senders: senders.into_iter().map(complete).collect(),
        receivers: receivers.into_iter().map(complete).collect(),
    }
}

fn complete<T>(row: Vec<Option<T>>) -> Vec<T> {
    row.into_iter().map(|channel| channel.expect("every channel of a local slot is set")).collect()
}

/// The stable id of the channel from slot `from` to slot `to` of exchange `exchange`:
/// both workers of a remote channel derive it from the plan alone.
pub(crate) fn channel_id(exchange: u32, from: u32, to: u32, slots: u32) -> ChannelId {
    let id = (u64::from(exchange) * u64::from(slots) + u64::from(from)) * u64::from(slots) + u64::from(to);
    ChannelId::try_from(id).expect("fewer than 2^32 exchange channels (exchanges x slots x slots)")
}

/// The merged input of one segment instance: one exchange's senders, or (for a segment
/// fed by several inputs, a join's) the senders of one exchange per input port. Rows keep
/// their port; watermarks, barriers and end-of-data are merged over every sender of
/// every port.
pub(crate) struct ExchangeInput {
    receivers: Vec<Inbound>,
    /// The input port of each sender.
    ports: Vec<usize>,
    watermarks: Vec<TimestampMs>,
    ended: Vec<bool>,
    /// Senders whose barrier for `pending_barrier` arrived and are held back.
    aligned: Vec<bool>,
    pending_barrier: Option<Epoch>,
    align: bool,
    emitted_watermark: TimestampMs,
    cursor: usize,
    finished: bool,
    /// Where the messages waiting in its channels are counted, when they are (every
    /// [`GAUGE_EVERY`] polls).
    gauge: Option<Arc<QueueMetrics>>,
    polls: u64,
    /// While a restored input waits for every live sender's first message: what each
    /// sender delivered first.
    seeding: Option<Vec<First>>,
}

/// A sender's first message on a restored input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// Nothing yet.
    Awaited,
    /// Its watermark: held back until every live sender delivered a first message.
    Watermark,
    /// Rows, a barrier or its end: it resumed without a watermark; not held.
    Other,
}

/// How often (in polls) an input samples the messages waiting in its channels: each
/// sample reads every channel's length.
const GAUGE_EVERY: u64 = 16;

impl ExchangeInput {
    /// `idle[i]` marks a sender known, from the plan, never to send rows (a thread that
    /// owns no lane of the source): it is treated as ended from the start, so whether its
    /// end-of-data arrives before or after the others' rows cannot change which rows are
    /// late. Ignored when every sender is idle.
    /// `align`: hold back a sender whose barrier arrived until every sender delivered it
    /// (exactly-once); without it (at-least-once) rows keep flowing and the barrier is
    /// forwarded once every sender delivered it.
    #[cfg(test)]
    pub(crate) fn new(receivers: Vec<Inbound>, idle: &[bool], align: bool) -> ExchangeInput {
        ExchangeInput::merged(vec![(receivers, idle.to_vec())], align)
    }

    /// The input of a segment fed by several exchanges: `ports[p]` holds port `p`'s
    /// receivers (one per sender slot) and idle flags (as in [`ExchangeInput::new`],
    /// per port).
    pub(crate) fn merged(ports: Vec<(Vec<Inbound>, Vec<bool>)>, align: bool) -> ExchangeInput {
        let mut receivers = Vec::new();
        let mut ended = Vec::new();
        let mut port_of = Vec::new();
        for (port, (inbound, idle)) in ports.into_iter().enumerate() {
            assert_eq!(idle.len(), inbound.len(), "one idle flag per sender");
            let all_idle = idle.iter().all(|i| *i);
            ended.extend(idle.iter().map(|i| *i && !all_idle));
            port_of.extend(std::iter::repeat_n(port, inbound.len()));
            receivers.extend(inbound);
        }
        let senders = receivers.len();
        ExchangeInput {
            receivers,
            ports: port_of,
            watermarks: vec![NO_WATERMARK; senders],
            ended,
            aligned: vec![false; senders],
            pending_barrier: None,
            align,
            emitted_watermark: NO_WATERMARK,
            cursor: 0,
            finished: false,
            gauge: None,
            polls: 0,
            seeding: None,
        }
    }

    /// The input of a run restored from a checkpoint: see the module documentation.
    pub(crate) fn restored(mut self) -> ExchangeInput {
        self.seeding = Some(vec![First::Awaited; self.receivers.len()]);
        self.end_seeding();
        self
    }

    /// Whether `from` is held back until every live sender delivered a first message.
    fn held_at_start(&self, from: usize) -> bool {
        self.seeding.as_ref().is_some_and(|firsts| firsts[from] == First::Watermark)
    }

    /// Ends the restored start once every live sender delivered a first message.
    fn end_seeding(&mut self) {
        let ended = &self.ended;
        if self.seeding.as_ref().is_some_and(|firsts| firsts.iter().zip(ended).all(|(f, e)| *f != First::Awaited || *e))
        {
            self.seeding = None;
        }
    }

    /// The input, counting the messages waiting in its channels in a gauge made by
    /// `make(capacity)` (the capacity of its channels from local threads, `per_channel`
    /// messages each).
    pub(crate) fn gauged(mut self, per_channel: usize, make: impl FnOnce(u64) -> Arc<QueueMetrics>) -> ExchangeInput {
        let local = self.receivers.iter().filter(|receiver| receiver.is_local()).count();
        self.gauge = Some(make((local * per_channel) as u64));
        self
    }

    /// True once end-of-data was returned: nothing more will come.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The next message for the segment and the input port it came from (data only;
    /// merged control messages say port 0), or None when no sender has one ready.
    pub(crate) fn poll(&mut self) -> Result<Option<(usize, Message)>, SluiceError> {
        if self.finished {
            return Ok(None);
        }
        self.polls = self.polls.wrapping_add(1);
        if let Some(gauge) = self.gauge.as_ref().filter(|_| self.polls.is_multiple_of(GAUGE_EVERY)) {
            let queued: usize = self.receivers.iter().map(Inbound::len).sum();
            gauge.queued.store(queued as u64, Ordering::Relaxed);
        }
        let senders = self.receivers.len();
        for _ in 0..senders {
            let from = self.cursor;
            self.cursor = (self.cursor + 1) % senders;
            if (self.align && self.aligned[from]) || self.held_at_start(from) {
                continue;
            }
            match self.receivers[from].try_recv() {
                Ok(message) => {
                    if let (Message::Data(_), Inbound::Remote(inbox), true) =
                        (&message, &self.receivers[from], self.ended[from])
                    {
                        // Another worker's plan must agree with this one's (the
                        // fingerprint): rows from a slot that has none to send are its
                        // fault, an error here, not a panic.
                        return Err(SluiceError::external(
                            "exchange.unexpected_rows",
                            format!(
                                "worker {} sent rows from slot {from}, which owns no lane of this input",
                                inbox.peer
                            ),
                        )
                        .with_fix("every worker must run the same sluice build and pipeline"));
                    }
                    if let Some(first) = self.seeding.as_mut().map(|firsts| &mut firsts[from])
                        && *first == First::Awaited
                    {
                        *first = if matches!(message, Message::Watermark(_)) { First::Watermark } else { First::Other };
                    }
                    let message = self.accept(from, message);
                    self.end_seeding();
                    if let Some(message) = message {
                        let port = if matches!(message, Message::Data(_)) { self.ports[from] } else { 0 };
                        return Ok(Some((port, message)));
                    }
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) if self.ended[from] => {}
                Err(TryRecvError::Disconnected) => {
                    let error = match &self.receivers[from] {
                        Inbound::Local(_) => SluiceError::internal(
                            "exchange.lost_sender",
                            format!("thread {from} stopped without ending its output"),
                        ),
                        Inbound::Remote(inbox) => SluiceError::external(
                            "exchange.lost_worker",
                            format!(
                                "the link to worker {} closed before its thread (slot {from}) ended its output: the worker stopped or the network failed",
                                inbox.peer
                            ),
                        ),
                    };
                    return Err(error.with_kind(ErrorKind::LostPeer));
                }
            }
        }
        Ok(None)
    }

    /// Folds one sender's message into the merged input; returns what the segment sees.
    fn accept(&mut self, from: usize, message: Message) -> Option<Message> {
        match message {
            Message::Data(_) => {
                assert!(!self.ended[from], "rows from sender {from} after its end (or from an idle sender)");
                Some(message)
            }
            Message::Watermark(watermark) => {
                debug_assert!(watermark >= self.watermarks[from], "watermarks never decrease on an edge");
                self.watermarks[from] = watermark;
                self.advanced_watermark()
            }
            Message::Barrier(epoch) => {
                debug_assert!(self.pending_barrier.is_none_or(|pending| pending == epoch), "one barrier at a time");
                self.pending_barrier = Some(epoch);
                self.aligned[from] = true;
                self.completed_barrier()
            }
            Message::EndOfData if self.ended[from] => None,
            Message::EndOfData => {
                self.ended[from] = true;
                if self.ended.iter().all(|ended| *ended) {
                    self.finished = true;
                    return Some(Message::EndOfData);
                }
                self.completed_barrier().or_else(|| self.advanced_watermark())
            }
        }
    }

    fn advanced_watermark(&mut self) -> Option<Message> {
        let lowest = (0..self.watermarks.len()).filter(|&i| !self.ended[i]).map(|i| self.watermarks[i]).min()?;
        if lowest > self.emitted_watermark {
            self.emitted_watermark = lowest;
            return Some(Message::Watermark(lowest));
        }
        None
    }

    fn completed_barrier(&mut self) -> Option<Message> {
        let epoch = self.pending_barrier?;
        let all = (0..self.aligned.len()).all(|i| self.aligned[i] || self.ended[i]);
        if !all {
            return None;
        }
        self.aligned.iter_mut().for_each(|aligned| *aligned = false);
        self.pending_barrier = None;
        Some(Message::Barrier(epoch))
    }

    /// Registers the receivers that could deliver something, for an idle wait.
    pub(crate) fn register<'a>(&'a self, select: &mut Select<'a>) {
        for (from, receiver) in self.receivers.iter().enumerate() {
            let held_back = (self.align && self.aligned[from]) || self.held_at_start(from);
            if !self.finished && !held_back {
                receiver.register(select);
            }
        }
    }
}

/// The partitioned output of one segment instance.
pub(crate) struct ExchangeOutput {
    partitioner: Box<dyn Partitioner>,
    senders: Vec<Sender<Message>>,
    outbox: Vec<VecDeque<Message>>,
    parts: Vec<(u32, sluice_types::Batch)>,
    /// Nanoseconds its thread waited with this output full (the edge's backpressure,
    /// shared by the sending segment's instances on every thread of this worker).
    blocked_ns: Option<Arc<AtomicU64>>,
}

impl ExchangeOutput {
    pub(crate) fn new(partitioner: Box<dyn Partitioner>, senders: Vec<Sender<Message>>) -> ExchangeOutput {
        let outbox = senders.iter().map(|_| VecDeque::new()).collect();
        ExchangeOutput { partitioner, senders, outbox, parts: Vec::new(), blocked_ns: None }
    }

    /// Counts the time its thread waits while this output is full into `blocked_ns`.
    pub(crate) fn measured(mut self, blocked_ns: Arc<AtomicU64>) -> ExchangeOutput {
        self.blocked_ns = Some(blocked_ns);
        self
    }

    /// Its thread waited `nanoseconds` with this output full.
    pub(crate) fn count_blocked(&self, nanoseconds: u64) {
        if let Some(blocked) = &self.blocked_ns {
            blocked.fetch_add(nanoseconds, Ordering::Relaxed);
        }
    }

    /// Queues `message` for its destinations: data by partition, the rest to everyone.
    pub(crate) fn route(&mut self, message: Message) -> Result<(), SluiceError> {
        match message {
            Message::Data(batch) => {
                let slots = self.senders.len() as u32;
                self.partitioner.partition(batch, slots, &mut self.parts)?;
                for (slot, part) in self.parts.drain(..) {
                    assert!(slot < slots, "partitioner chose slot {slot} of {slots}");
                    self.outbox[slot as usize].push_back(Message::Data(part));
                }
            }
            control => {
                for outbox in &mut self.outbox {
                    outbox.push_back(control.clone());
                }
            }
        }
        Ok(())
    }

    /// Moves queued messages into the channels while they have room. Returns whether
    /// anything moved.
    pub(crate) fn flush(&mut self) -> Result<bool, SluiceError> {
        let mut moved = false;
        for (slot, outbox) in self.outbox.iter_mut().enumerate() {
            while let Some(message) = outbox.pop_front() {
                match self.senders[slot].try_send(message) {
                    Ok(()) => moved = true,
                    Err(TrySendError::Full(message)) => {
                        outbox.push_front(message);
                        break;
                    }
                    // A receiver that finished needed nothing more from this sender (it
                    // treated it as idle): control messages to it are moot. Rows are not.
                    Err(TrySendError::Disconnected(Message::Data(_))) => {
                        return Err(SluiceError::internal(
                            "exchange.lost_receiver",
                            format!("thread {slot} stopped while rows were still addressed to it"),
                        )
                        .with_kind(ErrorKind::LostPeer));
                    }
                    Err(TrySendError::Disconnected(_)) => moved = true,
                }
            }
        }
        Ok(moved)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.outbox.iter().all(VecDeque::is_empty)
    }

    /// Registers the channels that have queued messages, for an idle wait.
    pub(crate) fn register<'a>(&'a self, select: &mut Select<'a>) {
        for (slot, outbox) in self.outbox.iter().enumerate() {
            if !outbox.is_empty() {
                select.send(&self.senders[slot]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe(message: Option<(usize, Message)>) -> String {
        match message.map(|(_, message)| message) {
            None => "none".into(),
            Some(Message::Data(_)) => "data".into(),
            Some(Message::Watermark(w)) => format!("wm {w}"),
            Some(Message::Barrier(e)) => format!("barrier {}", e.0),
            Some(Message::EndOfData) => "end".into(),
        }
    }

    #[test]
    fn watermark_is_the_minimum_and_barriers_align_and_end_waits_for_all() {
        let Mesh { senders, mut receivers } = mesh(2, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, false], true);
        let to_zero = |from: usize| senders[from][0].clone();
        to_zero(0).send(Message::Watermark(10)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 1 has no watermark yet");
        to_zero(1).send(Message::Watermark(5)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "wm 5");
        to_zero(0).send(Message::Barrier(Epoch(1))).expect("send");
        to_zero(0).send(Message::Watermark(20)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 0 is held back after its barrier");
        to_zero(1).send(Message::Barrier(Epoch(1))).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "barrier 1");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 0's watermark 20 waits for sender 1");
        to_zero(1).send(Message::EndOfData).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "wm 20", "an ended sender no longer holds the watermark");
        to_zero(0).send(Message::EndOfData).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "end");
        assert!(input.is_finished());
    }

    fn rows() -> Message {
        Message::Data(sluice_types::Batch::inserts(crate::tests::support::batch(&[1])))
    }

    /// A restored run: each sender's first message is the watermark it resumed with, but
    /// one sender's rows may arrive before another's watermark. Without holding them, the
    /// rows would meet no watermark, and a row late at the checkpoint would reopen a
    /// window emitted before it.
    #[test]
    fn a_restored_input_passes_no_rows_before_every_sender_delivered_its_first_message() {
        let Mesh { senders, mut receivers } = mesh(3, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, false, false], true).restored();
        let to_zero = |from: usize| senders[from][0].clone();
        to_zero(0).send(Message::Watermark(100)).expect("send");
        to_zero(0).send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 0's watermark");
        assert_eq!(describe(input.poll().expect("poll")), "none", "its rows wait for the others' first messages");
        to_zero(1).send(Message::Watermark(90)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 2 has sent nothing yet");
        // Sender 2's lanes had no watermark to resume with: its first message is rows.
        to_zero(2).send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "data", "sender 2's rows");
        assert_eq!(describe(input.poll().expect("poll")), "data", "then sender 0's, released");
        to_zero(2).send(Message::Watermark(95)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "wm 90");
        // Once every sender spoke, nothing is held any more.
        to_zero(1).send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "data");

        // A first watermark that completes the start comes out before the held rows.
        let Mesh { senders, mut receivers } = mesh(2, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, false], true).restored();
        senders[0][0].send(Message::Watermark(100)).expect("send");
        senders[0][0].send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none");
        senders[1][0].send(Message::Watermark(80)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "wm 80");
        assert_eq!(describe(input.poll().expect("poll")), "data");

        // Rows first (no event time, or lanes without a watermark at the checkpoint):
        // nothing is held, and an idle sender is not waited for.
        let Mesh { senders, mut receivers } = mesh(3, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, true, false], true).restored();
        senders[0][0].send(rows()).expect("send");
        senders[0][0].send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "data");
        assert_eq!(describe(input.poll().expect("poll")), "data", "a sender that spoke with rows is not held");
        senders[2][0].send(Message::Watermark(7)).expect("send");
        senders[2][0].send(rows()).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 2's watermark: 0 has none");
        assert_eq!(describe(input.poll().expect("poll")), "data", "every live sender spoke: nothing held");

        // A barrier first ends the start too (alignment never waits on rows held here).
        let Mesh { senders, mut receivers } = mesh(2, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, false], true).restored();
        senders[0][0].send(Message::Watermark(100)).expect("send");
        senders[0][0].send(rows()).expect("send");
        senders[0][0].send(Message::Barrier(Epoch(2))).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none");
        senders[1][0].send(Message::Barrier(Epoch(2))).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "sender 1 aligned");
        assert_eq!(describe(input.poll().expect("poll")), "data", "sender 0's rows flow to its barrier");
        assert_eq!(describe(input.poll().expect("poll")), "barrier 2");
    }

    #[test]
    fn an_idle_sender_never_holds_the_watermark_whenever_its_end_arrives() {
        let Mesh { senders, mut receivers } = mesh(2, 4);
        let mut input = ExchangeInput::new(receivers.remove(0), &[false, true], true);
        senders[0][0].send(Message::Watermark(10)).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "wm 10", "the idle sender is not waited for");
        senders[1][0].send(Message::EndOfData).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "none", "its late end changes nothing");
        senders[0][0].send(Message::EndOfData).expect("send");
        assert_eq!(describe(input.poll().expect("poll")), "end");
    }
}
