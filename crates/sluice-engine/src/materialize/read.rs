//! Reading a table at one epoch, batch by batch, without copying it.
//!
//! [`Materialized::pin`](super::Materialized::pin) takes, under each slice's lock, the
//! slice's base and its sealed deltas up to the epoch ([`TableAt`]): shared, not copied.
//! [`TableAt::rows`] then merges them, one slice after another, into batches of at most
//! `batch_rows` rows, in the rows' byte order: every multiset is sorted by its rows' key
//! encoding (a `BTreeMap`), so each batch starts its merge after the last row the
//! previous one took (`Cursor`), and a reader holds no more than one batch of rows
//! decoded at a time, whatever the table's size.
//!
//! Why a pin keeps its epoch readable: the slice's deltas are never changed once sealed
//! (folding pops them and adds them to the base), and the base is only changed in place
//! while nobody else holds it (`Arc::get_mut` in `Slice::fold`); a pinned base makes the
//! slice leave its deltas unfolded until the pin is dropped. The lease is needed only
//! until the pin is taken: it guarantees that no slice's base is past the epoch then.

use std::collections::btree_map;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::RecordBatch;
use sluice_types::SluiceError;

use super::{Multiset, Table};

/// One slice at an epoch: its base (at or before the epoch) and its sealed deltas after
/// the base up to the epoch, in increasing epochs.
pub(super) struct SliceAt {
    pub(super) base: Arc<Multiset>,
    pub(super) deltas: Vec<Arc<Multiset>>,
}

impl SliceAt {
    /// The multisets whose weights add up to the slice's: the base, then each delta.
    fn parts(&self) -> impl Iterator<Item = &Multiset> {
        std::iter::once(&*self.base).chain(self.deltas.iter().map(|delta| &**delta))
    }

    /// The stored bytes of `row`, a row of one of the parts.
    fn stored(&self, row: &[u8]) -> Option<&[u8]> {
        self.parts().find_map(|part| part.get_key_value(row)).map(|(stored, _)| &stored[..])
    }
}

/// Every slice of one table in this process at one epoch, pinned (see the module docs):
/// while it lives, no slice folds its deltas.
pub struct TableAt {
    pub(super) table: Arc<Table>,
    pub(super) epoch: u64,
    pub(super) slices: Vec<SliceAt>,
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
        Rows { at: Arc::clone(self), batch_rows: batch_rows.max(1), slice: 0, cursor: Cursor::default() }
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
    cursor: Cursor,
}

impl Iterator for Rows {
    type Item = Result<RecordBatch, SluiceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let at = Arc::clone(&self.at);
        let mut rows: Vec<&[u8]> = Vec::with_capacity(self.batch_rows.min(8192));
        while rows.len() < self.batch_rows && self.slice < at.slices.len() {
            if self.cursor.fill(&at.slices[self.slice], &mut rows, self.batch_rows) {
                self.slice += 1;
                self.cursor = Cursor::default();
            }
        }
        if rows.is_empty() {
            return None;
        }
        Some(at.table.decode(&rows))
    }
}

/// Where a slice's merge stands between two batches.
#[derive(Default)]
struct Cursor {
    /// The last row taken: the merge goes on after it.
    after: Option<Box<[u8]>>,
    /// Copies of `after` still due (its weight was more than its batch had room for).
    due: u64,
}

impl Cursor {
    /// Adds the slice's next rows to `rows`, up to `limit` rows in all; true once the
    /// slice has no rows left.
    fn fill<'a>(&mut self, slice: &'a SliceAt, rows: &mut Vec<&'a [u8]>, limit: usize) -> bool {
        let after = self.after.take();
        let mut last: Option<&'a [u8]> = None;
        if self.due > 0 {
            let row = after.as_deref().and_then(|row| slice.stored(row));
            let row = row.expect("a row with copies due was taken from the slice's parts, which a pin keeps");
            self.due -= take(row, self.due, rows, limit);
            last = Some(row);
        }
        let from = match after.as_deref() {
            Some(row) => Bound::Excluded(row),
            None => Bound::Unbounded,
        };
        let mut parts: Vec<Peekable<btree_map::Range<'a, Box<[u8]>, i64>>> =
            slice.parts().map(|part| part.range::<[u8], _>((from, Bound::Unbounded)).peekable()).collect();
        let mut ended = false;
        while self.due == 0 && rows.len() < limit {
            // The least row among the parts, and its weight summed over them.
            let least = parts.iter_mut().filter_map(|part| part.peek().map(|&(row, _)| row)).min();
            let Some(least) = least.map(|row| &row[..]) else {
                ended = true;
                break;
            };
            let mut weight = 0i64;
            for part in &mut parts {
                if let Some((_, w)) = part.next_if(|&(row, _)| &row[..] == least) {
                    weight += w;
                }
            }
            let copies = weight.max(0) as u64;
            self.due = copies - take(least, copies, rows, limit);
            last = Some(least);
        }
        self.after = last.map(Box::from).or(after);
        ended
    }
}

/// Adds at most `copies` copies of `row` to `rows`, up to `limit` rows in all; returns
/// how many it added.
fn take<'a>(row: &'a [u8], copies: u64, rows: &mut Vec<&'a [u8]>, limit: usize) -> u64 {
    let room = limit.saturating_sub(rows.len()) as u64;
    let taken = copies.min(room);
    rows.extend(std::iter::repeat_n(row, taken as usize));
    taken
}

impl Table {
    /// `rows` (whole rows in the key encoding) as a batch of the table's schema.
    fn decode(&self, rows: &[&[u8]]) -> Result<RecordBatch, SluiceError> {
        let damaged =
            |e: &dyn std::fmt::Display| SluiceError::internal("query.decode", format!("table `{}`: {e}", self.name));
        let columns = self.encoder.decode(rows.iter().copied()).map_err(|e| damaged(&e))?;
        RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(|e| damaged(&e))
    }
}
