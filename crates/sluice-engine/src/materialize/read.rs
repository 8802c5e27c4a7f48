//! Reading a slice's parts merged in key order: a query's table at one epoch, batch by
//! batch, and a checkpoint's snapshot of a slice, without copying either.
//!
//! A slice at one moment is its [`Parts`]: the runs of its base on disk (each row's
//! weight as of the run's writing, the newest run that names a row deciding), the base
//! in memory (weights added to the runs'), and deltas (weights added too). Every part is
//! sorted by the multisets' key (the row's vnode, then the row: see [`super::keyed`]),
//! so a [`Walk`] merges them in that order, summing each key's weight over the parts.
//! It reads the runs block by block, as one merge kept between steps, and the parts in
//! memory from after the last key it visited, so a reader holds no more than one batch
//! of rows decoded at a time, whatever the table's size.
//!
//! [`Materialized::pin`](super::Materialized::pin) takes, under each slice's lock, the
//! slice's parts up to the epoch ([`TableAt`]): shared, not copied. Why a pin keeps its
//! epoch readable: the slice's deltas are never changed once sealed (folding pops them
//! and adds them to the base); the base is only changed in place while nobody else
//! holds it (`Arc::get_mut` in `Slice::fold`), so a pinned base makes the slice leave
//! its deltas unfolded until the pin is dropped; and a spill of the base replaces the
//! slice's base and runs with new ones, while the pin keeps the old ones (a run's file
//! lives while a reader holds it). The lease is needed only until the pin is taken: it
//! guarantees that no slice's base is past the epoch then.

use std::collections::btree_map;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::RecordBatch;
use sluice_operators::SpilledRuns;
use sluice_state::{Merge, StateSource};
use sluice_types::SluiceError;

use super::{Multiset, Table};

/// One slice's parts at one moment (see the module docs).
#[derive(Clone, Default)]
pub(super) struct Parts {
    /// The base's runs on disk: weights as of their writing, the newest deciding.
    pub(super) runs: SpilledRuns,
    /// The base in memory: weights added to the runs'.
    pub(super) base: Arc<Multiset>,
    /// Deltas after the base, in increasing epochs: weights added.
    pub(super) deltas: Vec<Arc<Multiset>>,
}

impl Parts {
    /// The parts in memory: the base, then each delta.
    fn memory(&self) -> impl Iterator<Item = &Multiset> {
        std::iter::once(&*self.base).chain(self.deltas.iter().map(|delta| &**delta))
    }

    /// The weight of `key`, summed over the parts (0 when none holds it).
    pub(super) fn weight(&self, key: &[u8]) -> Result<i64, SluiceError> {
        Ok(stored_weight(&self.runs, key)? + self.memory().filter_map(|part| part.get(key)).sum::<i64>())
    }
}

/// The weight of `key` in the newest of `runs` that names it (0 when none does).
pub(super) fn stored_weight(runs: &SpilledRuns, key: &[u8]) -> Result<i64, SluiceError> {
    let (vnode, row) = super::split(key);
    match runs.get(vnode, row)? {
        Some(value) => weight_of(&value),
        None => Ok(0),
    }
}

/// The weight a run stores for a row.
fn weight_of(value: &[u8]) -> Result<i64, SluiceError> {
    let bytes = value.try_into().map_err(|_| {
        SluiceError::internal(
            "state.spill",
            format!("a materialized row's spilled weight has {} bytes, not 8: the spill file is damaged", value.len()),
        )
    })?;
    Ok(i64::from_le_bytes(bytes))
}

/// Where a merge of one slice's parts stands between steps.
#[derive(Default)]
pub(super) struct Walk {
    /// The last key visited: the parts in memory go on after it.
    after: Option<Box<[u8]>>,
    /// The runs' live records, opened at the first step.
    runs: Option<Merge>,
    /// The runs' next record, not yet visited: its key and weight.
    next_run: Option<(Box<[u8]>, i64)>,
}

impl Walk {
    /// Visits the keys of `parts` after the last one visited, in order, each with its
    /// weight summed over the parts (maybe 0), while `visit` says to go on. True once
    /// every key was visited. `parts` must be the same at every step.
    pub(super) fn step(
        &mut self,
        parts: &Parts,
        visit: &mut dyn FnMut(&[u8], i64) -> bool,
    ) -> Result<bool, SluiceError> {
        if self.runs.is_none() && self.after.is_none() && !parts.runs.is_empty() {
            self.runs = Some(parts.runs.scan());
            self.pull()?;
        }
        let from = match self.after.as_deref() {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut memory: Vec<Peekable<btree_map::Range<'_, Box<[u8]>, i64>>> =
            parts.memory().map(|part| part.range::<[u8], _>((from, Bound::Unbounded)).peekable()).collect();
        loop {
            let in_memory = memory.iter_mut().filter_map(|part| part.peek().map(|&(key, _)| &key[..])).min();
            let run_first = match (&self.next_run, in_memory) {
                (None, None) => return Ok(true),
                (Some((run_key, _)), Some(key)) => &run_key[..] <= key,
                (run, _) => run.is_some(),
            };
            let mut sum = |key: &[u8], mut weight: i64| {
                for part in &mut memory {
                    if let Some((_, w)) = part.next_if(|&(k, _)| &k[..] == key) {
                        weight += w;
                    }
                }
                weight
            };
            if run_first {
                let (key, stored) = self.next_run.take().expect("the runs' next record is the least key");
                self.pull()?;
                let weight = sum(&key, stored);
                if !visit(&key, weight) {
                    self.after = Some(key);
                    return Ok(false);
                }
            } else {
                let key = in_memory.expect("a part in memory holds the least key");
                let weight = sum(key, 0);
                if !visit(key, weight) {
                    self.after = Some(key.into());
                    return Ok(false);
                }
            }
        }
    }

    /// Reads the runs' next record.
    fn pull(&mut self) -> Result<(), SluiceError> {
        self.next_run = None;
        if let Some(merge) = &mut self.runs
            && let Some(record) = merge.next_record()?
        {
            self.next_run = Some((super::keyed(record.vnode, record.key), weight_of(record.value)?));
        }
        Ok(())
    }
}

/// Every slice of one table in this process at one epoch, pinned (see the module docs):
/// while it lives, no slice folds its deltas.
pub struct TableAt {
    pub(super) table: Arc<Table>,
    pub(super) epoch: u64,
    pub(super) slices: Vec<Parts>,
}

impl std::fmt::Debug for TableAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableAt").field("table", &self.table.name).field("epoch", &self.epoch).finish()
    }
}

impl TableAt {
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The rows, in batches of at most `batch_rows` rows (a row of weight `w` is `w`
    /// equal rows), decoded one batch per call of the iterator.
    pub fn rows(self: &Arc<TableAt>, batch_rows: usize) -> Rows {
        Rows { at: Arc::clone(self), batch_rows: batch_rows.max(1), slice: 0, walk: Walk::default(), due: None }
    }

    /// Every row, collected (a cluster's slice for another worker, and tests).
    pub fn batches(self: &Arc<TableAt>, batch_rows: usize) -> Result<Vec<RecordBatch>, SluiceError> {
        self.rows(batch_rows).collect()
    }
}

/// The rows of a [`TableAt`], batch by batch.
pub struct Rows {
    at: Arc<TableAt>,
    batch_rows: usize,
    /// The slice being read.
    slice: usize,
    walk: Walk,
    /// The last row visited (without its key's vnode) and its copies still due: its
    /// weight was more than its batch had room for.
    due: Option<(Box<[u8]>, u64)>,
}

/// A batch's rows, copied (each a row in the key encoding).
#[derive(Default)]
struct Taken {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Taken {
    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Adds at most `copies` copies of `row`, up to `limit` rows in all; returns how
    /// many it added.
    fn take(&mut self, row: &[u8], copies: u64, limit: usize) -> u64 {
        let taken = copies.min(limit.saturating_sub(self.len()) as u64);
        for _ in 0..taken {
            self.bytes.extend_from_slice(row);
            self.ends.push(self.bytes.len());
        }
        taken
    }

    fn rows(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| &self.bytes[start..end])
    }
}

impl Rows {
    fn fill(&mut self, taken: &mut Taken) -> Result<(), SluiceError> {
        let limit = self.batch_rows;
        if let Some((row, copies)) = self.due.take() {
            let left = copies - taken.take(&row, copies, limit);
            if left > 0 {
                self.due = Some((row, left));
                return Ok(());
            }
        }
        let at = Arc::clone(&self.at);
        while taken.len() < limit && self.slice < at.slices.len() {
            let mut due = None;
            let ended = self.walk.step(&at.slices[self.slice], &mut |key, weight| {
                let row = super::split(key).1;
                let copies = weight.max(0) as u64;
                let left = copies - taken.take(row, copies, limit);
                if left > 0 {
                    due = Some((Box::from(row), left));
                }
                taken.len() < limit
            })?;
            self.due = due;
            if ended && self.due.is_none() {
                self.slice += 1;
                self.walk = Walk::default();
            }
        }
        Ok(())
    }
}

impl Iterator for Rows {
    type Item = Result<RecordBatch, SluiceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut taken = Taken::default();
        if let Err(error) = self.fill(&mut taken) {
            // A damaged spill file: the error once, then the end.
            self.slice = self.at.slices.len();
            self.due = None;
            return Some(Err(error));
        }
        if taken.len() == 0 {
            return None;
        }
        Some(self.at.table.decode(taken.rows()))
    }
}

impl Table {
    /// `rows` (whole rows in the key encoding) as a batch of the table's schema.
    fn decode<'a>(&self, rows: impl Iterator<Item = &'a [u8]>) -> Result<RecordBatch, SluiceError> {
        let damaged =
            |e: &dyn std::fmt::Display| SluiceError::internal("query.decode", format!("table `{}`: {e}", self.name));
        let columns = self.encoder.decode(rows).map_err(|e| damaged(&e))?;
        RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(|e| damaged(&e))
    }
}
