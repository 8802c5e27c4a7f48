//! The bytes of the rows an operator keeps (a TopN's, the changelog normalization's),
//! in a [`SpillLog`] (`crate::spill`): appended in shared chunks rather than allocated
//! one by one, and beyond the pipeline's state memory budget in a file on local disk,
//! read back when a row is emitted, retracted or checkpointed.
//!
//! A row that leaves (the first N, or a key's row replaced or deleted) leaves its bytes
//! behind, dead. Once
//! the dead bytes outnumber the live ones and fill a chunk, [`RowLog::compact`] copies
//! every kept row into a fresh log (in the old log's order) and drops the old one, whose
//! file the system then frees: so the log, in memory and on disk, holds at most about
//! twice the kept rows' bytes, and a row's removal costs O(1) amortized. A log is
//! compacted only between batches, so rows referred to during a batch (the partitions'
//! rows before it) stay readable until it is emitted.

use std::cell::RefCell;
use std::sync::Arc;

use sluice_types::SluiceError;

use crate::counter::LazyCounter;
use crate::spill::{LogChunk, SharedChunk, SpillLog, SpillSpace, SpilledChunk};

/// Where a kept row's bytes are: `length` bytes from `start` in chunk `chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowAt {
    chunk: u32,
    start: u32,
    length: u32,
}

/// The chunk number of a row not stored yet: row `start` of the batch being processed.
const PENDING: u32 = u32::MAX - 1;

impl RowAt {
    /// No row yet (an entry compared before its row is stored).
    pub(crate) const NONE: RowAt = RowAt { chunk: u32::MAX, start: 0, length: 0 };

    /// Row `row` of the batch being processed, to be stored once the batch is done (if
    /// it is still kept then).
    pub(crate) fn pending(row: u32) -> RowAt {
        RowAt { chunk: PENDING, start: row, length: 0 }
    }

    /// The batch row of a row not stored yet.
    pub(crate) fn pending_row(&self) -> Option<u32> {
        (self.chunk == PENDING).then_some(self.start)
    }

    fn range(&self) -> std::ops::Range<usize> {
        crate::spill::byte_range(self.start, self.length)
    }

    pub(crate) fn len(&self) -> usize {
        self.length as usize
    }

    /// Where the row is in the log, for reading rows in the log's order.
    pub(crate) fn place(&self) -> (u32, u32) {
        (self.chunk, self.start)
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct RowLog {
    log: SpillLog,
    space: Option<Arc<SpillSpace>>,
    /// The bytes of the rows kept, and of rows no longer kept still in the log.
    live: usize,
    dead: usize,
    /// The size of a chunk: compaction waits for at least this many dead bytes.
    chunk_bytes: usize,
}

impl RowLog {
    /// A log spilling within `space` (None: all in memory), the bytes written counted
    /// in `written`.
    pub(crate) fn new(space: Option<Arc<SpillSpace>>, written: Option<LazyCounter>) -> RowLog {
        let log = SpillLog::new(space.clone()).counting(written);
        let chunk_bytes = log.chunk_bytes();
        RowLog { log, space, live: 0, dead: 0, chunk_bytes }
    }

    /// Keeps `row`.
    pub(crate) fn append(&mut self, row: &[u8]) -> Result<RowAt, SluiceError> {
        let length = u32::try_from(row.len()).expect("a row shorter than 4 GiB");
        let (chunk, start) = self.log.append(row)?;
        self.live += row.len();
        Ok(RowAt { chunk, start, length })
    }

    /// The row at `at` is no longer kept (one never stored costs nothing).
    pub(crate) fn forget(&mut self, at: RowAt) {
        if at.pending_row().is_some() {
            return;
        }
        self.live -= at.len();
        self.dead += at.len();
    }

    /// The bytes of the rows kept.
    #[cfg(test)]
    pub(crate) fn live_bytes(&self) -> usize {
        self.live
    }

    /// The row's bytes if they are in memory.
    pub(crate) fn get(&self, at: RowAt) -> Option<&[u8]> {
        self.log.get(at.chunk, at.range())
    }

    /// Appends the row's bytes to `out`, from memory or from the spill file.
    pub(crate) fn read_into(&self, at: RowAt, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        self.log.read_into(at.chunk, at.range(), out)
    }

    /// The bytes of rows `rows`, in order: those spilled are read into `spilled` first.
    pub(crate) fn gather<'a>(
        &'a self,
        rows: impl Iterator<Item = RowAt> + Clone,
        spilled: &'a mut Vec<u8>,
    ) -> Result<Vec<&'a [u8]>, SluiceError> {
        crate::spill::gather(rows, |at| self.get(at), |at, out| self.read_into(at, out), spilled)
    }

    /// The rows' chunks, shared for a snapshot to read them from after the log moved on
    /// (a chunk shared so is not appended to again; one spilled later is read from the
    /// file).
    pub(crate) fn shared(&mut self) -> SharedRows {
        SharedRows { chunks: self.log.share(0..self.log.chunk_count()), ahead: RefCell::default() }
    }

    /// Whether the dead bytes outnumber the live ones and fill a chunk.
    pub(crate) fn is_sparse(&self) -> bool {
        self.dead >= self.chunk_bytes && self.dead > self.live
    }

    /// Copies the kept rows `rows` into a fresh log, in their order in this one (so that
    /// spilled rows are read ahead, a window at a time, rather than one `pread` each:
    /// NEXMark q18's compactions at 256 MiB took 8% of its time so), and drops this one;
    /// each row's place is updated.
    pub(crate) fn compact<'a>(&mut self, rows: impl Iterator<Item = &'a mut RowAt>) -> Result<(), SluiceError> {
        let mut rows: Vec<&mut RowAt> = rows.collect();
        rows.sort_unstable_by_key(|at| at.place());
        // The old chunks in memory go with the old log: counted, they would make the
        // fresh log spill nearly every kept row while memory is about to be freed.
        self.log.uncount_resident();
        let mut fresh = RowLog::new(self.space.clone(), self.log.take_counter());
        let (mut scratch, mut ahead) = (Vec::new(), ReadAhead::default());
        for at in rows {
            let moved = match self.log.chunk(at.chunk) {
                LogChunk::Resident(bytes) => fresh.append(&bytes[at.range()])?,
                LogChunk::Spilled(spilled) => {
                    scratch.clear();
                    ahead.read_into(*at, spilled, &mut scratch)?;
                    fresh.append(&scratch)?
                }
            };
            *at = moved;
        }
        assert_eq!(fresh.live, self.live, "compaction moves every kept row once");
        *self = fresh;
        Ok(())
    }
}

/// The chunks of a [`RowLog`] as a snapshot or an eviction took them.
pub(crate) struct SharedRows {
    chunks: Vec<SharedChunk>,
    ahead: RefCell<ReadAhead>,
}

/// The least and the most bytes of a spilled chunk read at once ([`ReadAhead`]).
const AHEAD_MIN: usize = 4 << 10;
const AHEAD_MAX: usize = 256 << 10;

/// Bytes of a spilled chunk read past the row asked for, so that rows asked for in the
/// log's order (an evicting TopN's, `crate::topn`) come from a few reads rather than one
/// each: NEXMark q18 at 100 M events and 256 MiB read its evicted partitions' rows back
/// one `pread` at a time, 12% of its time. The window doubles, up to [`AHEAD_MAX`], while
/// each one served a later row, and halves, down to [`AHEAD_MIN`] (a read of about the
/// cost of a row's), while none did.
#[derive(Default)]
struct ReadAhead {
    /// The chunk, and the offset in it, of `bytes`.
    chunk: u32,
    start: usize,
    bytes: Vec<u8>,
    /// The bytes to read at the next miss.
    window: usize,
    /// Whether a row after the first came from `bytes`.
    served: bool,
}

impl SharedRows {
    /// Appends the row's bytes to `out`.
    pub(crate) fn read_into(&self, at: RowAt, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        match &self.chunks[at.chunk as usize].get() {
            LogChunk::Resident(bytes) => {
                out.extend_from_slice(&bytes[at.range()]);
                Ok(())
            }
            LogChunk::Spilled(spilled) => self.ahead.borrow_mut().read_into(at, spilled, out),
        }
    }
}

impl ReadAhead {
    /// Appends the bytes of row `at`, of spilled chunk `spilled`, to `out`: from the
    /// bytes read ahead, else from a read of the next window's bytes from the row on.
    fn read_into(&mut self, at: RowAt, spilled: &SpilledChunk, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        let range = at.range();
        let held = self.start..self.start + self.bytes.len();
        if self.chunk != at.chunk || range.start < held.start || range.end > held.end {
            let window = match (self.window, self.served) {
                (0, _) => AHEAD_MIN,
                (window, true) => (window * 2).min(AHEAD_MAX),
                (window, false) => (window / 2).max(AHEAD_MIN),
            };
            let length = window.max(range.len()).min(spilled.len() - range.start);
            self.bytes.resize(length, 0);
            spilled.read_at(range.start, &mut self.bytes)?;
            (self.chunk, self.start, self.window, self.served) = (at.chunk, range.start, window, false);
        } else {
            self.served = true;
        }
        out.extend_from_slice(&self.bytes[range.start - self.start..range.end - self.start]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_keeps_every_kept_row_and_drops_the_rest() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 64);
        let mut log = RowLog::new(Some(Arc::clone(&space)), None);
        let row = |i: usize| format!("row {i:04}").into_bytes();
        let mut kept = Vec::new();
        for i in 0..200 {
            let at = log.append(&row(i)).expect("append");
            if i % 3 == 0 {
                kept.push((i, at));
            } else {
                log.forget(at);
            }
        }
        assert!(log.is_sparse());
        let spilled_before = space.spilled();
        let mut places: Vec<RowAt> = kept.iter().map(|(_, at)| *at).collect();
        log.compact(places.iter_mut()).expect("compact");
        assert!(!log.is_sparse());
        assert_eq!(log.live_bytes(), kept.iter().map(|(i, _)| row(*i).len()).sum::<usize>());
        assert!(space.spilled() < spilled_before, "the old file's bytes are no longer counted");
        let mut scratch = Vec::new();
        let rows = log.gather(places.iter().copied(), &mut scratch).expect("gather");
        for ((i, _), bytes) in kept.iter().zip(rows) {
            assert_eq!(bytes, &row(*i)[..]);
        }
    }

    /// Spilled rows read back through a snapshot's or an eviction's shared chunks: each
    /// row's own bytes, in the log's order (the window read ahead widening as it serves
    /// later rows) and in reverse (narrowing back as it serves none).
    #[test]
    fn shared_rows_read_spilled_rows_ahead_in_the_log_s_order() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 1 << 20);
        let mut log = RowLog::new(Some(Arc::clone(&space)), None);
        let row = |i: usize| format!("row {i:05} {}", "x".repeat(i % 37)).into_bytes();
        let places: Vec<RowAt> = (0..40_000).map(|i| log.append(&row(i)).expect("append")).collect();
        assert!(space.spilled() > 0, "the rows spilled");
        let shared = log.shared();
        let read = |i: usize| {
            let mut out = vec![b'>'];
            shared.read_into(places[i], &mut out).expect("a row");
            assert_eq!(out[1..], row(i)[..], "row {i}");
        };
        (0..40_000).for_each(read);
        assert_eq!(shared.ahead.borrow().window, AHEAD_MAX, "in order, the window widened");
        (0..40_000).rev().step_by(97).for_each(read);
        assert_eq!(shared.ahead.borrow().window, AHEAD_MIN, "out of order, it narrowed");
    }

    #[test]
    fn kept_rows_that_fit_the_budget_stay_in_memory_through_a_compaction() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 256, 64);
        let mut log = RowLog::new(Some(Arc::clone(&space)), None);
        // 200 rows of 10 bytes fill the budget (so older chunks spill); 10 are kept.
        let mut kept = Vec::new();
        for i in 0..200 {
            let at = log.append(format!("row {i:05}").as_bytes()).expect("append");
            if i >= 190 { kept.push(at) } else { log.forget(at) }
        }
        assert!(space.spilled() > 0 && log.is_sparse());
        log.compact(kept.iter_mut()).expect("compact");
        // 100 bytes of kept rows fit the budget: none of them was written to disk again.
        assert!(kept.iter().all(|at| log.get(*at).is_some()), "every kept row in memory");
        assert_eq!(space.spilled(), 0);
    }

    #[test]
    fn a_snapshots_rows_stay_readable_after_the_log_moves_on() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::with_chunk_bytes(dir.path().to_path_buf(), 0, 16);
        let mut log = RowLog::new(Some(space), None);
        let first = log.append(b"first row").expect("append");
        let shared = log.shared();
        for i in 0..20 {
            let at = log.append(format!("later {i}").as_bytes()).expect("append");
            log.forget(at);
        }
        log.forget(first);
        let mut places: Vec<RowAt> = Vec::new();
        log.compact(places.iter_mut()).expect("compact");
        let mut out = Vec::new();
        shared.read_into(first, &mut out).expect("read");
        assert_eq!(out, b"first row");
    }
}
