//! Operators and fused chains.
//!
//! An [`Operator`] consumes the in-band [`Message`]s of one input and appends what it
//! emits to an output vector. A [`Chain`] runs several operators back to back on one
//! thread with no queue between them (operator fusion): it is how every segment of a
//! flow runs.
//!
//! Contract: an operator sees the in-band messages of its input in edge order;
//! the default handlers forward watermarks, barriers and end-of-data unchanged, so a
//! stateless operator only implements [`Operator::on_data`].

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_state::{StateSink, StateSource};
use sluice_types::{Batch, Epoch, Message, SluiceError, TimestampMs};

use crate::metrics::OperatorMetrics;

/// One step of a dataflow: a filter, a projection, a window aggregate...
pub trait Operator: Send {
    /// A short name for errors and `explain`, e.g. `filter`, `window_aggregate`.
    fn name(&self) -> &str;

    /// Rows arrived.
    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError>;

    /// Rows arrived on input `port` of an operator with several inputs (a join: 0 is
    /// the left input, 1 the right; a union: one port per input). Every batch reaches
    /// an operator through this method; the default serves single-input operators. Only the first
    /// operator of a segment fed by several inputs receives a port other than 0; the
    /// watermark, barriers and end-of-data it sees are already merged over every port
    /// (the lowest watermark, aligned barriers, the end once every input ended).
    fn on_port_data(&mut self, port: usize, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert_eq!(port, 0, "{} has a single input but received rows on port {port}", self.name());
        self.on_data(batch, out)
    }

    /// The input's watermark advanced (it never decreases).
    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// Every input delivered barrier `epoch`; state as of this point belongs to it.
    fn on_barrier(&mut self, epoch: Epoch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        out.push(Message::Barrier(epoch));
        Ok(())
    }

    /// The input ended: emit what is still held (e.g. open windows), then end-of-data.
    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        out.push(Message::EndOfData);
        Ok(())
    }

    /// Emit the changes held for a mini-batch (an operator that folds several input
    /// batches into one output, such as the running aggregate, holds them until a bound
    /// of its own). The driver calls it when its thread runs out of input, every
    /// [`crate::MINI_BATCH_LATENCY`] while it is busy (once the segment's output queue has
    /// room), and before each barrier's snapshot,
    /// so the snapshot never covers a change that was not emitted. Only data may be
    /// emitted. The default holds nothing.
    fn on_flush(&mut self, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        Ok(())
    }

    /// Whether the operator holds output of a watermark or of the end that it has not
    /// emitted yet. An operator whose watermark closes more than it should build at once
    /// (a window aggregate's windows) emits a part and keeps the rest, with the watermark
    /// or end-of-data itself, for [`Operator::on_resume`]; until it says it holds none,
    /// it is given no other message, no flush and no barrier. The default holds none.
    fn has_more(&self) -> bool {
        false
    }

    /// Emits the next part of the held output ([`Operator::has_more`]); the watermark or
    /// end-of-data that started it goes out last, with the last part.
    fn on_resume(&mut self, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        unreachable!("{} resumed without held output", self.name())
    }

    /// The operator's state at the current barrier, as records (`sluice_state`): the
    /// operator copies what it needs here, on the hot path, and returns a job that
    /// writes the copy's records on another thread while processing goes on (keyed
    /// operators key each record by the vnode of its key, so a restore onto a different
    /// number of threads gives each thread exactly its vnodes).
    ///
    /// `delta`: the operator's previous snapshot was written, so it may write only what
    /// changed since then ([`SnapshotKind::Delta`]); otherwise (the first after a failed
    /// checkpoint) it must write everything ([`SnapshotKind::Full`]). `None` means the
    /// operator never holds state (the default); one that holds none now writes an empty
    /// snapshot (its earlier runs are then no longer its state).
    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        let _ = delta;
        Ok(None)
    }

    /// Loads the merged records of the vnodes this instance owns (the records
    /// `snapshot_state` wrote, newest winning) before any message arrives. An operator
    /// without state has none to load: a record is a plan's mismatch.
    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        match state.next_record()? {
            None => Ok(()),
            Some(record) => Err(SluiceError::internal(
                "state.corrupt",
                format!(
                    "{} keeps no state, but a checkpoint holds a record of vnode {} for it",
                    self.name(),
                    record.vnode
                ),
            )
            .with_fix("run the Sluice build that wrote this state, or start over with --from-scratch")),
        }
    }
}

/// Writes a state copy taken at a barrier as records, off the hot path.
pub type SnapshotJob = Box<dyn FnOnce(&mut dyn StateSink) -> Result<(), SluiceError> + Send>;

/// What a snapshot's records are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotKind {
    /// Every record of the instance's vnodes: the state is these records alone.
    Full,
    /// What changed since the instance's previous snapshot: the state is the previous
    /// one's with these records applied.
    Delta,
    /// A delta of puts only, each of a key that no earlier snapshot of the instance
    /// wrote (a join's appended rows, numbered by arrival): merging its run with older
    /// ones drops nothing, so compaction need not rewrite the older runs for it.
    Additions,
    /// No state at all (the job writes nothing).
    Empty,
}

impl SnapshotKind {
    /// Whether the records apply to the previous snapshot's (a delta or additions).
    pub fn is_delta(self) -> bool {
        matches!(self, SnapshotKind::Delta | SnapshotKind::Additions)
    }
}

/// One operator's snapshot: its kind and the job writing its records.
pub struct Snapshot {
    pub kind: SnapshotKind,
    pub job: SnapshotJob,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").field("kind", &self.kind).finish_non_exhaustive()
    }
}

impl Snapshot {
    /// The snapshot of an instance holding no state.
    pub fn empty() -> Snapshot {
        Snapshot { kind: SnapshotKind::Empty, job: Box::new(|_: &mut dyn StateSink| Ok(())) }
    }
}

/// Whether an operator instance's last snapshot was written, is being written, or was
/// dropped unwritten. The checkpointer calls [`SnapshotGuard::written`] once a
/// snapshot's records are in a run the next checkpoint names; a guard dropped unwritten
/// (a failed or abandoned checkpoint) marks it unwritten, and the instance's next
/// snapshot is then full. Each snapshot taken is a new generation of the flag, so a
/// guard of an older snapshot, resolved late, changes nothing.
#[derive(Debug, Clone)]
pub struct SnapshotFlag(Arc<AtomicU64>);

/// The states of a [`SnapshotFlag`], in its two low bits (the generation above them).
const WRITTEN: u64 = 0;
const IN_FLIGHT: u64 = 1;
const UNWRITTEN: u64 = 2;
const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

impl SnapshotFlag {
    /// The flag of a fresh or restored instance: what the store holds for it (nothing,
    /// or the restored runs) is its state, so its first snapshot may be a delta.
    pub fn written() -> SnapshotFlag {
        SnapshotFlag(Arc::new(AtomicU64::new(WRITTEN)))
    }

    /// Whether the last snapshot was written (or none was taken).
    pub fn is_written(&self) -> bool {
        self.0.load(Ordering::Acquire) & STATE_MASK == WRITTEN
    }

    /// Whether the last snapshot is still being written: its guard is not resolved.
    pub fn in_flight(&self) -> bool {
        self.0.load(Ordering::Acquire) & STATE_MASK == IN_FLIGHT
    }

    /// A new snapshot taken: the next generation, in flight, and its guard.
    pub fn take(&self) -> SnapshotGuard {
        let generation = (self.0.load(Ordering::Acquire) >> STATE_BITS).wrapping_add(1);
        self.0.store(generation << STATE_BITS | IN_FLIGHT, Ordering::Release);
        SnapshotGuard { flag: self.clone(), generation }
    }

    /// Moves generation `generation` from in flight to `state`; a newer one is left.
    fn resolve(&self, generation: u64, state: u64) {
        let in_flight = generation << STATE_BITS | IN_FLIGHT;
        let _ =
            self.0.compare_exchange(in_flight, generation << STATE_BITS | state, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The checkpointer's hold on one snapshot: [`SnapshotGuard::written`] once its records
/// are written, and dropping it otherwise marks the snapshot unwritten.
#[derive(Debug)]
pub struct SnapshotGuard {
    flag: SnapshotFlag,
    generation: u64,
}

impl SnapshotGuard {
    /// A guard whose flag nothing reads (tests, and snapshots no chain asked for).
    pub fn detached() -> SnapshotGuard {
        SnapshotFlag::written().take()
    }

    pub fn written(self) {
        self.flag.resolve(self.generation, WRITTEN);
    }
}

impl Drop for SnapshotGuard {
    fn drop(&mut self) {
        // After `written` this finds the generation resolved and changes nothing.
        self.flag.resolve(self.generation, UNWRITTEN);
    }
}

/// A chain's state: (operator position, snapshot, its guard) for operators that have state.
pub type ChainSnapshot = Vec<(usize, Snapshot, SnapshotGuard)>;

/// Operators fused on one thread. Messages pass through them in order.
pub struct Chain {
    operators: Vec<Box<dyn Operator>>,
    scratch: Vec<Message>,
    /// Each operator's row counters, when counted ([`Chain::counted`]).
    counters: Vec<Arc<OperatorMetrics>>,
    /// Per operator, whether its last snapshot was written (see [`SnapshotFlag`]).
    written: Vec<SnapshotFlag>,
    /// The vnodes this chain's instance owns (its thread's range).
    vnodes: Range<u32>,
}

impl Chain {
    pub fn new(operators: Vec<Box<dyn Operator>>) -> Chain {
        // A fresh or restored instance's state is what the store holds for it (nothing,
        // or the restored runs): its first snapshot may be a delta.
        let written = operators.iter().map(|_| SnapshotFlag::written()).collect();
        Chain { operators, scratch: Vec::new(), counters: Vec::new(), written, vnodes: 0..u32::MAX }
    }

    /// The chain of the thread owning the vnodes `vnodes`: its snapshots' records lie
    /// there.
    pub fn owning(mut self, vnodes: Range<u32>) -> Chain {
        self.vnodes = vnodes;
        self
    }

    pub fn vnodes(&self) -> Range<u32> {
        self.vnodes.clone()
    }

    /// The chain, counting each operator's rows in and out in `counters` (one per
    /// operator, in order): two relaxed additions per operator and batch.
    pub fn counted(mut self, counters: Vec<Arc<OperatorMetrics>>) -> Chain {
        assert_eq!(counters.len(), self.operators.len(), "one counter set per operator");
        self.counters = counters;
        self
    }

    /// Every stateful operator's snapshot, by position in the chain, each with the guard
    /// the checkpointer marks once its records are written.
    pub fn snapshot(&mut self) -> Result<ChainSnapshot, SluiceError> {
        let mut states = Vec::new();
        for (index, operator) in self.operators.iter_mut().enumerate() {
            let written = &self.written[index];
            let delta = written.is_written();
            if let Some(snapshot) = operator.snapshot_state(delta)? {
                let kind = snapshot.kind;
                assert!(delta || !kind.is_delta(), "{} wrote a delta after an unwritten snapshot", operator.name());
                states.push((index, snapshot, written.take()));
            }
        }
        Ok(states)
    }

    /// Whether every operator's last snapshot was written (or none was taken).
    pub fn all_written(&self) -> bool {
        self.written.iter().all(SnapshotFlag::is_written)
    }

    /// Whether an operator's last snapshot is still being written.
    pub fn snapshot_in_flight(&self) -> bool {
        self.written.iter().any(SnapshotFlag::in_flight)
    }

    /// The operators' names, e.g. `project → window_aggregate` (`-` for none).
    pub fn describe(&self) -> String {
        if self.operators.is_empty() {
            return "-".to_string();
        }
        self.operators.iter().map(|operator| operator.name()).collect::<Vec<_>>().join(" → ")
    }

    /// Restores operator `index` of the chain from the merged records of its vnodes.
    pub fn restore(&mut self, index: usize, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        self.operators[index].restore_state(state)
    }

    /// Pushes `message` through every operator, appending the last one's output to `out`.
    /// An operator may then hold output to come ([`Chain::has_more`]).
    pub fn push(&mut self, message: Message, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.push_from(0, message, out)
    }

    /// Pushes `message`, then every part of the output it makes ([`Chain::resume`]), for
    /// callers that take a message's whole output at once (tests, tools).
    pub fn push_whole(&mut self, message: Message, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.push(message, out)?;
        while self.has_more() {
            self.resume(out)?;
        }
        Ok(())
    }

    /// Whether an operator holds output to come ([`Operator::has_more`]): the chain then
    /// takes no message and no flush until [`Chain::resume`] emptied it.
    pub fn has_more(&self) -> bool {
        self.operators.iter().any(|operator| operator.has_more())
    }

    /// Emits the next part of the output an operator holds, through the operators after
    /// it. The last such operator goes first: what it holds came from its input before
    /// anything an earlier one still holds.
    pub fn resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let Some(index) = self.operators.iter().rposition(|operator| operator.has_more()) else {
            return Ok(());
        };
        let mut held = Vec::new();
        self.operators[index].on_resume(&mut held)?;
        self.pass_on(index, held, out)
    }

    /// Pushes `message`, which arrived on input `port` of the chain's first operator
    /// (see [`Operator::on_port_data`]), through every operator.
    pub fn push_from(&mut self, port: usize, message: Message, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(!self.has_more(), "{}: a message pushed before the held output left", self.describe());
        if self.operators.is_empty() {
            assert_eq!(port, 0, "a chain without operators has a single input");
            out.push(message);
            return Ok(());
        }
        self.run_from(0, port, vec![message], None, out)
    }

    /// Flushes every operator's held changes ([`Operator::on_flush`]) in chain order,
    /// each through the operators after it, appending what leaves the chain to `out`.
    pub fn flush(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(!self.has_more(), "{}: a flush before the held output left", self.describe());
        let mut held = Vec::new();
        for index in 0..self.operators.len() {
            self.operators[index].on_flush(&mut held)?;
            if held.is_empty() {
                continue;
            }
            assert!(
                held.iter().all(|message| matches!(message, Message::Data(_))),
                "{} flushed a control message",
                self.operators[index].name()
            );
            self.pass_on(index, std::mem::take(&mut held), out)?;
        }
        Ok(())
    }

    /// Counts what operator `index` emitted outside of a pushed message (a flush or a
    /// resumed part) and pushes it through the operators after it.
    fn pass_on(&mut self, index: usize, mut held: Vec<Message>, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if held.is_empty() {
            return Ok(());
        }
        let measured = (data_rows(&held), data_bytes(&held));
        if let Some(counters) = self.counters.get(index) {
            count(&counters.rows_out, measured.0);
            count(&counters.bytes_out, measured.1);
        }
        if index + 1 == self.operators.len() {
            out.append(&mut held);
            Ok(())
        } else {
            self.run_from(index + 1, 0, held, Some(measured), out)
        }
    }

    /// Pushes `input`, which arrived on `port` of operator `start`, through the
    /// operators from `start` on. `measured`: the rows and bytes of `input` when already
    /// counted as the previous operator's output (they are not measured twice).
    fn run_from(
        &mut self,
        start: usize,
        port: usize,
        mut input: Vec<Message>,
        mut measured: Option<(u64, u64)>,
        out: &mut Vec<Message>,
    ) -> Result<(), SluiceError> {
        let last = self.operators.len() - 1;
        for (index, operator) in self.operators.iter_mut().enumerate().skip(start) {
            let target = if index == last { &mut *out } else { &mut self.scratch };
            let port = if index == start { port } else { 0 };
            let counters = self.counters.get(index);
            let before = target.len();
            if let Some(counters) = counters {
                let (rows, bytes) = measured.unwrap_or_else(|| (data_rows(&input), data_bytes(&input)));
                count(&counters.rows_in, rows);
                count(&counters.bytes_in, bytes);
            }
            let mut messages = input.drain(..);
            while let Some(message) = messages.next() {
                dispatch(operator.as_mut(), port, message, target)?;
                // An operator holds output only after a watermark or the end, which is
                // the last message of what the operator before it emitted at once.
                assert!(
                    messages.len() == 0 || !operator.has_more(),
                    "{} holds output with messages still to take",
                    operator.name()
                );
            }
            drop(messages);
            measured = None;
            if let Some(counters) = counters {
                let produced = &target[before..];
                let (rows, bytes) = (data_rows(produced), data_bytes(produced));
                count(&counters.rows_out, rows);
                count(&counters.bytes_out, bytes);
                // What it produced is the next operator's whole input.
                measured = (before == 0).then_some((rows, bytes));
            }
            if index != last {
                std::mem::swap(&mut input, &mut self.scratch);
            }
        }
        Ok(())
    }
}

/// Adds `rows` to a counter shared by every thread's instance (skipping the zeros of
/// watermarks and barriers, so that they do not touch the shared cache line).
fn count(counter: &std::sync::atomic::AtomicU64, rows: u64) {
    if rows > 0 {
        counter.fetch_add(rows, Ordering::Relaxed);
    }
}

/// Rows of the data messages among `messages`.
fn data_rows(messages: &[Message]) -> u64 {
    let rows: usize = messages.iter().map(|m| if let Message::Data(batch) = m { batch.num_rows() } else { 0 }).sum();
    rows as u64
}

/// Bytes of the rows of the data messages among `messages`: for each column, the part
/// of its Arrow buffers the batch's rows occupy (a slice of a larger array counts only
/// its rows, not the buffers it shares), as `ArrayData::get_slice_memory_size` measures
/// it; a column it cannot measure counts its whole buffers.
fn data_bytes(messages: &[Message]) -> u64 {
    let bytes: usize = messages
        .iter()
        .filter_map(|m| if let Message::Data(batch) = m { Some(&batch.rows) } else { None })
        .flat_map(|rows| rows.columns())
        .map(|column| {
            let data = column.to_data();
            data.get_slice_memory_size().unwrap_or_else(|_| column.get_array_memory_size())
        })
        .sum();
    bytes as u64
}

fn dispatch(
    operator: &mut dyn Operator,
    port: usize,
    message: Message,
    out: &mut Vec<Message>,
) -> Result<(), SluiceError> {
    match message {
        Message::Data(batch) => {
            if batch.num_rows() == 0 {
                return Ok(());
            }
            operator.on_port_data(port, batch, out)
        }
        Message::Watermark(watermark) => operator.on_watermark(watermark, out),
        Message::Barrier(epoch) => operator.on_barrier(epoch, out),
        Message::EndOfData => operator.on_end(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::record_batch::RecordBatch;
    use std::sync::Arc;

    /// Doubles every value of a single Int64 column.
    struct Double;
    impl Operator for Double {
        fn name(&self) -> &str {
            "double"
        }
        fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
            let column = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64");
            let doubled: Int64Array = column.iter().map(|v| v.map(|v| v * 2)).collect();
            let rows = RecordBatch::try_new(batch.rows.schema(), vec![Arc::new(doubled)])?;
            out.push(Message::Data(Batch::inserts(rows)));
            Ok(())
        }
    }

    /// Holds the rows it receives until flushed.
    #[derive(Default)]
    struct Hold(Vec<Batch>);
    impl Operator for Hold {
        fn name(&self) -> &str {
            "hold"
        }
        fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
            self.0.push(batch);
            Ok(())
        }
        fn on_flush(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
            out.extend(self.0.drain(..).map(Message::Data));
            Ok(())
        }
    }

    /// At each watermark emits `parts` one-row batches (0, 1, ...), one a part, then
    /// the watermark with the last.
    struct Parts {
        parts: i64,
        held: std::collections::VecDeque<Message>,
    }
    impl Operator for Parts {
        fn name(&self) -> &str {
            "parts"
        }
        fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
            out.push(Message::Data(batch));
            Ok(())
        }
        fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
            self.held.extend((0..self.parts).map(|v| Message::Data(Batch::inserts(int_rows(vec![v])))));
            self.held.push_back(Message::Watermark(watermark));
            self.on_resume(out)
        }
        fn has_more(&self) -> bool {
            !self.held.is_empty()
        }
        fn on_resume(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
            out.push(self.held.pop_front().expect("held output"));
            if self.held.len() == 1 {
                out.push(self.held.pop_front().expect("the watermark"));
            }
            Ok(())
        }
    }

    /// A watermark's output held by an operator leaves a part at a time through the
    /// operators after it, the watermark with the last part, each part counted once; the
    /// operator after it may hold the watermark's output in turn.
    #[test]
    fn held_output_leaves_a_part_at_a_time_through_the_rest_of_the_chain() {
        let metrics = crate::metrics::Metrics::new(Vec::new(), Vec::new(), 1);
        let counters =
            vec![metrics.operator("a", "parts"), metrics.operator("b", "double"), metrics.operator("c", "parts")];
        let operators: Vec<Box<dyn Operator>> = vec![
            Box::new(Parts { parts: 3, held: Default::default() }),
            Box::new(Double),
            Box::new(Parts { parts: 2, held: Default::default() }),
        ];
        let mut chain = Chain::new(operators).counted(counters.clone());
        let mut parts = Vec::new();
        let mut out = Vec::new();
        chain.push(Message::Watermark(7), &mut out).expect("push");
        parts.push(values(&std::mem::take(&mut out)));
        while chain.has_more() {
            chain.resume(&mut out).expect("resume");
            parts.push(values(&std::mem::take(&mut out)));
        }
        assert_eq!(parts, [vec!["[0]"], vec!["[2]"], vec!["[4]", "[0]"], vec!["[1]", "wm 7"]]);
        let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let rows: Vec<[u64; 2]> = counters.iter().map(|c| [read(&c.rows_in), read(&c.rows_out)]).collect();
        assert_eq!(rows, [[0, 3], [3, 3], [3, 5]]);
        chain.push_whole(Message::Watermark(8), &mut out).expect("push");
        assert_eq!(values(&out), ["[0]", "[2]", "[4]", "[0]", "[1]", "wm 8"]);
    }

    /// One column `v` of `values`.
    fn int_rows(values: Vec<i64>) -> RecordBatch {
        let field = arrow::datatypes::Field::new("v", arrow::datatypes::DataType::Int64, false);
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![field]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).expect("batch")
    }

    fn values(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|message| match message {
                Message::Data(batch) => {
                    let column = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64");
                    format!("{:?}", column.values().to_vec())
                }
                Message::Watermark(w) => format!("wm {w}"),
                Message::Barrier(e) => format!("barrier {}", e.0),
                Message::EndOfData => "end".to_string(),
            })
            .collect()
    }

    #[test]
    fn fused_operators_apply_in_order_and_forward_control_messages() {
        let rows = int_rows(vec![1, 2]);
        let mut chain = Chain::new(vec![Box::new(Double), Box::new(Double)]);
        let mut out = Vec::new();
        chain.push(Message::Data(Batch::inserts(rows)), &mut out).expect("push");
        chain.push(Message::Watermark(7), &mut out).expect("push");
        chain.push(Message::Barrier(Epoch(3)), &mut out).expect("push");
        chain.push(Message::EndOfData, &mut out).expect("push");
        assert_eq!(values(&out), ["[4, 8]", "wm 7", "barrier 3", "end"]);
    }

    #[test]
    fn counters_take_the_rows_and_the_bytes_of_a_slice_not_of_the_buffers_it_shares() {
        let rows = int_rows((0..10).collect());
        let metrics = crate::metrics::Metrics::new(Vec::new(), Vec::new(), 1);
        let counters = vec![metrics.operator("a", "first"), metrics.operator("b", "second")];
        let mut chain = Chain::new(vec![Box::new(Double), Box::new(Double)]).counted(counters.clone());
        let mut out = Vec::new();
        // Four rows of ten: 4 × 8 bytes, though the slice shares the ten rows' buffer.
        chain.push(Message::Data(Batch::inserts(rows.slice(3, 4))), &mut out).expect("push");
        chain.push(Message::Watermark(7), &mut out).expect("push");
        assert_eq!(values(&out), ["[12, 16, 20, 24]", "wm 7"]);
        for counter in &counters {
            let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            assert_eq!(
                [read(&counter.rows_in), read(&counter.rows_out), read(&counter.bytes_in), read(&counter.bytes_out)],
                [4, 4, 32, 32],
                "{}",
                counter.name
            );
        }
    }

    #[test]
    fn a_flush_sends_each_operators_held_rows_through_the_operators_after_it() {
        let rows = int_rows(vec![1, 2]);
        let metrics = crate::metrics::Metrics::new(Vec::new(), Vec::new(), 1);
        let counters =
            vec![metrics.operator("a", "hold"), metrics.operator("b", "double"), metrics.operator("c", "hold")];
        let operators: Vec<Box<dyn Operator>> =
            vec![Box::new(Hold::default()), Box::new(Double), Box::new(Hold::default())];
        let mut chain = Chain::new(operators).counted(counters.clone());
        let mut out = Vec::new();
        chain.push(Message::Data(Batch::inserts(rows.clone())), &mut out).expect("push");
        chain.push(Message::Watermark(7), &mut out).expect("push");
        assert_eq!(values(&out), ["wm 7"], "the rows are held");
        out.clear();
        // The first hold's rows pass the doubling and are held by the last one, which
        // the same flush then empties.
        chain.flush(&mut out).expect("flush");
        assert_eq!(values(&out), ["[2, 4]"]);
        out.clear();
        chain.flush(&mut out).expect("flush");
        assert!(out.is_empty(), "nothing is held twice");
        let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        for counter in &counters {
            assert_eq!([read(&counter.rows_in), read(&counter.rows_out)], [2, 2], "{}", counter.name);
        }
        chain.push(Message::Data(Batch::inserts(rows)), &mut out).expect("push");
        chain.push(Message::EndOfData, &mut out).expect("push");
        assert_eq!(values(&out), ["end"], "an operator's own end decides what it emits");
    }

    /// A snapshot is in flight until its guard is marked written or dropped; a guard of
    /// an older snapshot, resolved after a newer one was taken, changes nothing.
    #[test]
    fn a_snapshot_flag_follows_its_newest_guard() {
        let flag = SnapshotFlag::written();
        assert!(flag.is_written() && !flag.in_flight(), "a fresh instance's first snapshot may be a delta");
        let first = flag.take();
        assert!(flag.in_flight() && !flag.is_written());
        first.written();
        assert!(flag.is_written() && !flag.in_flight());

        drop(flag.take());
        assert!(!flag.is_written() && !flag.in_flight(), "dropped unwritten: the next snapshot is full");

        let older = flag.take();
        let newer = flag.take();
        older.written();
        assert!(flag.in_flight(), "the older snapshot's guard leaves the newer one in flight");
        drop(newer);
        assert!(!flag.is_written() && !flag.in_flight(), "the newer one failed: the next is full");

        let older = flag.take();
        let newer = flag.take();
        drop(older);
        assert!(flag.in_flight(), "the older one's failure does not touch the newer one");
        newer.written();
        assert!(flag.is_written());
    }
}
