//! A simulated driver thread: one lane of `total` rows, read a few at a time, and a sink
//! writer that stages the rows between two barriers as one record. It keeps the real
//! driver's checkpoint behaviour (`crate::driver`): the position is taken when the
//! barrier is injected, the barrier's record holds the rows read before it, the rows left
//! at the end of input are staged for the epoch after the last barrier seen, a final
//! barrier pauses the lane until `Exit`, and a finished driver reads no more control
//! messages.

use sluice_types::Epoch;

use crate::chain::{Snapshot, SnapshotGuard, SnapshotKind};
use crate::checkpoint::{DeferredState, LanePosition, ManifestSlice, SinkRecord};

use super::world::{Staged, position_bytes};

#[derive(Debug)]
pub(super) struct SimDriver {
    pub slot: u32,
    generation: u32,
    worker: u32,
    total: u64,
    position: u64,
    /// Rows before `cut` are staged in some record already.
    cut: u64,
    /// The epoch after the last barrier seen: what the rows left at the end are staged as.
    next_epoch: u64,
    /// A final barrier paused the lane.
    paused: bool,
    /// The input ended and the sink staged its last rows.
    ended: bool,
    end_record: Option<SinkRecord>,
    /// The barrier passed and not acknowledged yet (one at a time).
    pending: Option<(Epoch, ManifestSlice)>,
    /// The thread left: it reads no control message any more.
    pub exited: bool,
}

impl SimDriver {
    /// The driver of lane `slot`, resuming after `position` rows, numbering epochs from
    /// `first_epoch`.
    pub(super) fn new(slot: u32, generation: u32, worker: u32, total: u64, position: u64, first_epoch: u64) -> Self {
        SimDriver {
            slot,
            generation,
            worker,
            total,
            position,
            cut: position,
            next_epoch: first_epoch,
            paused: false,
            ended: false,
            end_record: None,
            pending: None,
            exited: false,
        }
    }

    fn record(&self, epoch: u64, end: u64) -> SinkRecord {
        let staged =
            Staged { generation: self.generation, worker: self.worker, lane: self.slot, epoch, start: self.cut, end };
        SinkRecord { flow: 0, epoch, record: staged.encode(), rows: end - self.cut }
    }

    /// Whether the lane still reads rows.
    pub(super) fn reads(&self) -> bool {
        !self.paused && !self.ended && !self.exited
    }

    /// Reads up to `rows` rows; true when the input ended now (the sink staged the rest).
    pub(super) fn read(&mut self, rows: u64) -> bool {
        if !self.reads() {
            return false;
        }
        self.position = (self.position + rows).min(self.total);
        if self.position < self.total {
            return false;
        }
        self.end_record = Some(self.record(self.next_epoch, self.total));
        self.cut = self.total;
        self.ended = true;
        true
    }

    /// Barrier `epoch` (final: the lane pauses first). Panics on a second barrier before
    /// the first was acknowledged, as the real driver asserts.
    pub(super) fn barrier(&mut self, epoch: Epoch, final_epoch: bool) {
        assert!(self.pending.is_none(), "driver {} got barrier {} with another in flight", self.slot, epoch.0);
        assert!(epoch.0 >= self.next_epoch, "driver {} got barrier {} after {}", self.slot, epoch.0, self.next_epoch);
        self.paused |= final_epoch;
        self.next_epoch = epoch.0 + 1;
        let mut slice = ManifestSlice::default();
        slice.positions.push(LanePosition { source: 0, lane: self.slot, bytes: position_bytes(self.position) });
        let (bytes, slot) = (position_bytes(self.position), self.slot);
        let job = Box::new(move |sink: &mut dyn sluice_state::StateSink| sink.put(slot, &[], &bytes));
        let snapshot = Snapshot { kind: SnapshotKind::Full, job };
        let (operator, vnodes, guard) = ("simulated".into(), slot..slot + 1, SnapshotGuard::detached());
        slice.deferred.push(DeferredState { operator, vnodes, snapshot, guard });
        if !self.ended {
            slice.sink_records.push(self.record(epoch.0, self.position));
            self.cut = self.position;
        }
        self.pending = Some((epoch, slice));
    }

    /// The acknowledgement of the barrier in flight, if any.
    pub(super) fn take_ack(&mut self) -> Option<(Epoch, ManifestSlice)> {
        self.pending.take()
    }

    /// Whether the driver leaves on its own now: every flow ended and no barrier waits.
    pub(super) fn done(&self) -> bool {
        self.ended && self.pending.is_none() && !self.exited
    }

    /// The driver leaves: on `Exit` with nothing, at the end with its final positions and
    /// its sink's last record.
    pub(super) fn leave(&mut self, exit: bool) -> ManifestSlice {
        self.exited = true;
        let mut slice = ManifestSlice::default();
        if !exit {
            slice.positions.push(LanePosition { source: 0, lane: self.slot, bytes: position_bytes(self.position) });
            slice.sink_records.extend(self.end_record.take());
        }
        slice
    }
}
