//! State time-to-live (Flink's `table.exec.state.ttl`): keyed operators whose state
//! would otherwise grow with the input (regular joins, running aggregates, TopN) may drop
//! a key that was not written for the TTL.
//!
//! Time is processing time (the operator's clock), as in Flink; an entry's clock starts
//! again when it is written (created or updated; reads do not count). Each entry has at
//! most one check scheduled, at its last write plus the TTL; when a check comes due the
//! entry expires if it was not written since, or is scheduled again for its newer
//! deadline. Work is proportional to the entries that expire or were written, never to
//! the whole state. A restored entry's clock starts at the restore (the write times are
//! not part of the checkpoint): a restart gives every key a full TTL again.
//!
//! Dropping state changes the answer: a group that expires and sees a row again starts
//! from zero (its old row is not retracted downstream); a join row that expired no
//! longer matches; a TopN partition that expired starts empty.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Milliseconds of processing time.
#[derive(Debug, Clone)]
pub enum Clock {
    /// Since the operator started.
    System(Instant),
    /// Set by a test.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn system() -> Clock {
        Clock::System(Instant::now())
    }

    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System(start) => start.elapsed().as_millis() as u64,
            Clock::Manual(now) => now.load(Ordering::Relaxed),
        }
    }
}

/// The TTL schedule of entries numbered by dense ids (an operator's group or partition
/// ids, reused after an entry is dropped).
#[derive(Debug)]
pub struct Ttl {
    ttl_ms: u64,
    clock: Clock,
    /// (deadline, id) of each scheduled check.
    due: BTreeSet<(u64, u32)>,
    /// Per id: the last write, and the deadline of its scheduled check (if any).
    written: Vec<u64>,
    scheduled: Vec<Option<u64>>,
}

impl Ttl {
    pub fn new(ttl: Duration, clock: Clock) -> Ttl {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        Ttl { ttl_ms, clock, due: BTreeSet::new(), written: Vec::new(), scheduled: Vec::new() }
    }

    /// Entry `id` was written now.
    pub fn written(&mut self, id: u32) {
        let index = id as usize;
        if index >= self.written.len() {
            self.written.resize(index + 1, 0);
            self.scheduled.resize(index + 1, None);
        }
        let now = self.clock.now_ms();
        self.written[index] = now;
        if self.scheduled[index].is_none() {
            let deadline = now.saturating_add(self.ttl_ms);
            self.due.insert((deadline, id));
            self.scheduled[index] = Some(deadline);
        }
    }

    /// Entry `id` is gone (dropped by the operator): its check is cancelled.
    pub fn forget(&mut self, id: u32) {
        if let Some(deadline) = self.scheduled.get_mut(id as usize).and_then(Option::take) {
            self.due.remove(&(deadline, id));
        }
    }

    /// Entry `from` now has id `to` (the operator moved it into a dropped entry's place):
    /// its write time and scheduled check go with it.
    pub fn moved(&mut self, from: u32, to: u32) {
        let (from_index, to_index) = (from as usize, to as usize);
        let needed = from_index.max(to_index) + 1;
        if self.written.len() < needed {
            self.written.resize(needed, 0);
            self.scheduled.resize(needed, None);
        }
        self.forget(to);
        self.written[to_index] = self.written[from_index];
        if let Some(deadline) = self.scheduled[from_index].take() {
            self.due.remove(&(deadline, from));
            self.due.insert((deadline, to));
            self.scheduled[to_index] = Some(deadline);
        }
    }

    /// The ids not written for the TTL, taken off the schedule (the operator drops them).
    pub fn expired(&mut self) -> Vec<u32> {
        let now = self.clock.now_ms();
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.due.first() {
            if deadline > now {
                break;
            }
            self.due.pop_first();
            let index = id as usize;
            let next = self.written[index].saturating_add(self.ttl_ms);
            if next <= now {
                self.scheduled[index] = None;
                expired.push(id);
            } else {
                self.due.insert((next, id));
                self.scheduled[index] = Some(next);
            }
        }
        expired
    }

    /// The TTL, for `explain`.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

/// A manual clock for tests, at `start` ms.
pub fn manual_clock(start: u64) -> (Clock, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(start));
    (Clock::Manual(Arc::clone(&now)), now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_expires_a_ttl_after_its_last_write_and_not_before() {
        let (clock, now) = manual_clock(0);
        let mut ttl = Ttl::new(Duration::from_millis(100), clock);
        ttl.written(0);
        now.store(50, Ordering::Relaxed);
        ttl.written(1);
        ttl.written(0);
        now.store(99, Ordering::Relaxed);
        assert!(ttl.expired().is_empty());
        now.store(100, Ordering::Relaxed);
        assert!(ttl.expired().is_empty(), "0 was written again at 50");
        now.store(150, Ordering::Relaxed);
        let mut gone = ttl.expired();
        gone.sort_unstable();
        assert_eq!(gone, [0, 1]);
        assert!(ttl.expired().is_empty(), "each expires once");
        // A dropped entry's check is cancelled; its id reused starts a new clock.
        ttl.written(2);
        ttl.forget(2);
        now.store(400, Ordering::Relaxed);
        assert!(ttl.expired().is_empty());
        ttl.written(2);
        now.store(499, Ordering::Relaxed);
        assert!(ttl.expired().is_empty());
        now.store(500, Ordering::Relaxed);
        assert_eq!(ttl.expired(), [2]);
        assert_eq!(ttl.due.len(), 0, "nothing left scheduled");
    }
}
