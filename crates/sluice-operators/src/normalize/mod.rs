//! Changelog normalization (Flink's `ChangelogNormalize`): the first operator of a
//! changelog source's stream, after an exchange by its primary key. It keeps each key's
//! current row and turns the source's row kinds into the weights every other operator
//! reads, so that what leaves it is a consistent changelog whatever arrived:
//!
//! | input | key has a row `p` | key has none |
//! |---|---|---|
//! | `+I` / `+U` row `r` | `-1 p`, `+1 r` (nothing if `r = p`); a `+I` is a *duplicate insert* | `+1 r` |
//! | `-U` / `-D` row `r` | `-1 p`; *out of order* if `r` differs from `p` in a column `r` holds (not NULL: a before image may hold only the key; not checked for upserts, whose `-D` has only the key) | dropped: a *delete of an unknown key* |
//!
//! A change is thus always the key's previous row retracted, directly followed by its new
//! row, which sinks write as `-U`/`+U`; a `-U`/`+U` pair of the input arrives as one.
//! Downstream operators never see a retraction of a row they were not given, nor two live
//! rows of one key, which is what makes the output's upsert key the primary key.
//!
//! The anomalies (a duplicate insert, a delete of an unknown key, a retraction whose
//! before image is not the key's row, a row with a NULL key column) are never fatal and
//! never silent: each is counted in the run counter `source NAME: …` and the first
//! [`LOGGED_PER_ANOMALY`] of each kind per thread are logged with the key and what was
//! done. What arrived before cannot be known: a delete that arrives before the insert it
//! deletes (out of order across the source's partitions) is dropped, and the insert then
//! stays. Bad envelopes never reach here: the source decodes them as bad rows.
//!
//! State: one record per key in [`state`]; it grows with the table's live keys, as Flink's
//! does (`state_ttl` does not apply: an expired key would make its later delete unknown).
//! The rows' bytes are kept in a [`RowLog`](crate::row_log): beyond the pipeline's state
//! memory budget (`with_spill`) on local disk. The keys count in the budget too: when a
//! batch ends over it, keys no change touched since the clock's hand passed them are
//! written with their rows, as their checkpoint records, to a cold run
//! ([`crate::cold`]), and read back when a change of theirs comes.

mod state;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int8Array, Int64Array};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use sluice_runtime::{Metrics, Operator, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, RowKind, SluiceError, Weights};

use crate::cold::{FROM_COLD, RECENT};
use crate::counter::LazyCounter;
use crate::row_log::{RowAt, RowLog};
use crate::spill::SpillSpace;

pub use state::NORMALIZE_STATE_VERSION;

/// How many of each anomaly an instance logs; the counters count every one.
pub const LOGGED_PER_ANOMALY: u64 = 10;

/// What the normalization was told about its input.
#[derive(Debug, Clone)]
pub struct NormalizeSpec {
    /// The source's name, in counters and logs.
    pub source: String,
    /// The declared columns (the input has one more, the row kinds, after them).
    pub schema: SchemaRef,
    /// The primary key's columns, never empty.
    pub key: Vec<usize>,
    /// Upsert input: a `-D` carries only the key, so its other columns are not compared.
    pub upsert: bool,
    pub vnodes: u32,
}

/// One of the input's anomalies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Anomaly {
    DuplicateInsert,
    UnknownKey,
    OutOfOrder,
    NullKey,
}

impl Anomaly {
    const ALL: [Anomaly; 4] = [Anomaly::DuplicateInsert, Anomaly::UnknownKey, Anomaly::OutOfOrder, Anomaly::NullKey];

    /// The counter's name after `source NAME: `.
    fn counter(self) -> &'static str {
        match self {
            Anomaly::DuplicateInsert => "duplicate inserts (applied as updates)",
            Anomaly::UnknownKey => "deletes of unknown keys (dropped)",
            Anomaly::OutOfOrder => "out-of-order changes (before image not the key's row)",
            Anomaly::NullKey => "rows with a NULL primary key (dropped)",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Anomaly::DuplicateInsert => "an insert of a key that has a row: applied as an update of that row",
            Anomaly::UnknownKey => "a delete (or update's before image) of a key that has no row: dropped",
            Anomaly::OutOfOrder => {
                "a delete or update whose before image differs from the key's row: the key's row is retracted"
            }
            Anomaly::NullKey => "a row with a NULL primary key column: dropped",
        }
    }
}

/// A key's row, and its marks while spilling (`crate::cold::passes`).
#[derive(Debug, Clone, Copy)]
struct Kept {
    at: RowAt,
    marks: u8,
}

/// About the bytes of memory a key held in `rows` takes: its bytes, its box and their
/// allocation, the entry and its index slot.
fn key_bytes(key: &[u8]) -> usize {
    key.len() + 64
}

/// Keys beyond the memory budget ([`crate::cold`]): where they go, and what is kept to
/// count, choose and find them.
struct Spilling {
    store: crate::cold::ColdStore,
    /// The clock's hand: the next position in `rows` it looks at.
    hand: usize,
    /// Keys evicted while changed since the previous snapshot: the next delta writes
    /// them again from their run.
    evicted_dirty: crate::cold::Keys,
    /// Keys deleted from memory whose older copy may still be in a run: the next run
    /// writes their deletes.
    dropped: crate::cold::Keys,
}

/// The operator: each key's current row, by the key's encoding.
pub struct ChangelogNormalize {
    spec: NormalizeSpec,
    key_encoder: KeyEncoder,
    row_encoder: KeyEncoder,
    /// Each live key in memory (in the key encoding) and where its row is in `log`.
    rows: indexmap::IndexMap<Box<[u8]>, Kept>,
    /// Keys beyond the memory budget (None: every key stays in memory).
    cold: Option<Spilling>,
    /// The rows' bytes (in the key encoding): in shared chunks, beyond the state memory
    /// budget on local disk (`crate::row_log`).
    log: RowLog,
    /// A spilled row read back.
    scratch: Vec<u8>,
    /// Keys written since the previous snapshot (for a delta), while `tracking`.
    changed: HashSet<Box<[u8]>>,
    /// Whether `changed` holds every change since a snapshot (false before the first).
    tracking: bool,
    counters: Vec<LazyCounter>,
    logged: [u64; 4],
    keys: KeyRows,
    encoded: KeyRows,
}

/// An output row: weight and where its bytes are (a stored row stays in the log until
/// the batch is emitted: the log is compacted only between batches).
enum Out {
    Input(usize, i64),
    Stored(RowAt),
}

impl ChangelogNormalize {
    pub fn new(spec: NormalizeSpec, metrics: Arc<Metrics>) -> Result<ChangelogNormalize, SluiceError> {
        assert!(!spec.key.is_empty(), "a normalization needs a primary key");
        let types = |columns: &mut dyn Iterator<Item = usize>| {
            columns.map(|i| spec.schema.field(i).data_type().clone()).collect::<Vec<_>>()
        };
        let key_encoder = KeyEncoder::new(types(&mut spec.key.iter().copied()))?;
        let row_encoder = KeyEncoder::new(types(&mut (0..spec.schema.fields().len())))?;
        let counters = Anomaly::ALL
            .iter()
            .map(|a| LazyCounter::new(Arc::clone(&metrics), format!("source {}: {}", spec.source, a.counter())))
            .collect();
        Ok(ChangelogNormalize {
            spec,
            key_encoder,
            row_encoder,
            rows: indexmap::IndexMap::new(),
            cold: None,
            log: RowLog::new(None, None),
            scratch: Vec::new(),
            changed: HashSet::new(),
            tracking: false,
            counters,
            logged: [0; 4],
            keys: KeyRows::default(),
            encoded: KeyRows::default(),
        })
    }

    /// Keeps the rows' bytes within `space` (the pipeline's state memory budget), beyond
    /// it on local disk, the bytes written counted in `written`.
    pub fn with_spill(mut self, space: Arc<SpillSpace>, written: LazyCounter) -> ChangelogNormalize {
        assert!(self.rows.is_empty(), "spilling is chosen before any row is kept");
        let store = crate::cold::ColdStore::new(Arc::clone(&space), written.again());
        self.log = RowLog::new(Some(space), Some(written));
        self.cold = Some(Spilling {
            store,
            hand: 0,
            evicted_dirty: crate::cold::Keys::default(),
            dropped: crate::cold::Keys::default(),
        });
        self
    }

    /// The number of keys held in memory (beyond the budget, others are in cold runs).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn note(&mut self, anomaly: Anomaly, key: &[u8]) {
        let index = Anomaly::ALL.iter().position(|a| *a == anomaly).expect("a listed anomaly");
        self.counters[index].add(1);
        if self.logged[index] < LOGGED_PER_ANOMALY {
            self.logged[index] += 1;
            let last = if self.logged[index] == LOGGED_PER_ANOMALY {
                " (further ones on this thread are only counted)"
            } else {
                ""
            };
            tracing::warn!(
                source = %self.spec.source,
                "source {}: key ({}): {}; counted in `source {}: {}`{last}",
                self.spec.source,
                self.key_text(key),
                anomaly.done(),
                self.spec.source,
                anomaly.counter(),
            );
        }
    }

    /// The key as `col=value, …`, for logs.
    fn key_text(&self, key: &[u8]) -> String {
        let Ok(columns) = self.key_encoder.decode(std::iter::once(key)) else { return "?".to_string() };
        let names = self.spec.key.iter().map(|&i| self.spec.schema.field(i).name());
        let values = columns.iter().map(|c| arrow::util::display::array_value_to_string(c, 0).unwrap_or_default());
        names.zip(values).map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
    }

    fn mark(&mut self, key: &[u8]) {
        if self.tracking && !self.changed.contains(key) {
            self.changed.insert(key.into());
        }
    }

    /// The row kinds column of `rows`, checked.
    fn kinds(&self, rows: &RecordBatch) -> Result<Int8Array, SluiceError> {
        let width = self.spec.schema.fields().len();
        let kinds = (rows.num_columns() == width + 1)
            .then(|| rows.column(width).as_any().downcast_ref::<Int8Array>().cloned())
            .flatten();
        kinds.filter(|k| k.null_count() == 0).ok_or_else(|| {
            SluiceError::internal(
                "normalize.input",
                format!("source {}: a changelog batch without its row kinds column", self.spec.source),
            )
        })
    }

    /// Whether input row `index` (a before image) differs from the key's row `previous`
    /// in a column the image holds: Debezium's images of a delete may hold only the key
    /// (PostgreSQL's default replica identity), their other columns NULL.
    fn differs(&self, previous: &[u8], columns: &[ArrayRef], index: usize) -> bool {
        let Ok(stored) = self.row_encoder.decode(std::iter::once(previous)) else { return true };
        columns
            .iter()
            .zip(&stored)
            .any(|(column, stored)| column.is_valid(index) && column.slice(index, 1).to_data() != stored.to_data())
    }

    /// The bytes of the row at `at`, read back into `scratch` when spilled.
    fn stored<'a>(log: &'a RowLog, at: RowAt, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], SluiceError> {
        if let Some(bytes) = log.get(at) {
            return Ok(bytes);
        }
        scratch.clear();
        log.read_into(at, scratch)?;
        Ok(scratch)
    }

    /// Applies one input row of `columns`; pushes the rows it emits.
    fn apply(
        &mut self,
        columns: &[ArrayRef],
        index: usize,
        kind: RowKind,
        out: &mut Vec<Out>,
    ) -> Result<(), SluiceError> {
        let key: Box<[u8]> = self.keys.row(index).into();
        let held = match self.rows.get_mut(&key) {
            Some(kept) => {
                kept.marks |= RECENT;
                true
            }
            None => self.load_cold(&key)?,
        };
        if kind.is_accumulate() {
            let mut marks = RECENT;
            if held {
                let kept = self.rows[&key];
                marks |= kept.marks & FROM_COLD;
                let previous = kept.at;
                let same = Self::stored(&self.log, previous, &mut self.scratch)? == self.encoded.row(index);
                if kind == RowKind::Insert && !self.spec.upsert {
                    self.note(Anomaly::DuplicateInsert, &key);
                }
                if same {
                    return Ok(());
                }
                out.push(Out::Stored(previous));
                self.log.forget(previous);
            } else if let Some(cold) = self.cold.as_mut() {
                if cold.dropped.remove(&key[..]) {
                    // Deleted since it was read back: its run's copy is stale.
                    marks |= FROM_COLD;
                }
                cold.store.charge(key_bytes(&key));
            }
            out.push(Out::Input(index, 1));
            self.mark(&key);
            let at = self.log.append(self.encoded.row(index))?;
            self.rows.insert(key, Kept { at, marks });
            return Ok(());
        }
        match self.rows.swap_remove(&key).map(|kept| self.forget_key(&key, kept)) {
            None => self.note(Anomaly::UnknownKey, &key),
            Some(previous) => {
                let row = Self::stored(&self.log, previous, &mut self.scratch)?;
                if !self.spec.upsert && row != self.encoded.row(index) {
                    let row = row.to_vec();
                    if self.differs(&row, columns, index) {
                        self.note(Anomaly::OutOfOrder, &key);
                    }
                }
                self.mark(&key);
                self.log.forget(previous);
                out.push(Out::Stored(previous));
            }
        }
        Ok(())
    }

    /// The output batch of `out` (rows of the declared schema with their weights).
    fn emit(&mut self, out: Vec<Out>) -> Result<Option<Batch>, SluiceError> {
        if out.is_empty() {
            return Ok(None);
        }
        let weights = Int64Array::from_iter_values(out.iter().map(|o| match o {
            Out::Input(_, weight) => *weight,
            Out::Stored(_) => -1,
        }));
        let stored = out.iter().filter_map(|o| match o {
            Out::Stored(at) => Some(*at),
            Out::Input(..) => None,
        });
        let mut spilled = Vec::new();
        let mut stored = self.log.gather(stored, &mut spilled)?.into_iter();
        let rows = out.iter().map(|o| match o {
            Out::Input(index, _) => self.encoded.row(*index),
            Out::Stored(_) => stored.next().expect("a row gathered for each stored one"),
        });
        let columns: Vec<ArrayRef> = self.row_encoder.decode(rows)?;
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.schema), columns).map_err(|e| {
            SluiceError::internal("normalize.output", format!("source {}: assembling rows: {e}", self.spec.source))
        })?;
        Ok(Some(Batch::with_weights(rows, weights)))
    }

    /// Once the log holds more dead bytes than live ones, copies the live rows into a
    /// fresh one (between batches: no output refers to a row any more).
    fn compact(&mut self) -> Result<(), SluiceError> {
        if self.log.is_sparse() {
            self.log.compact(self.rows.values_mut().map(|kept| &mut kept.at))?;
        }
        Ok(())
    }

    /// A key taken out of `rows` (deleted): no longer counted, and its run's copy to be
    /// deleted if it may have one. Returns where its row is.
    fn forget_key(&mut self, key: &[u8], kept: Kept) -> RowAt {
        if let Some(cold) = self.cold.as_mut() {
            cold.store.release(key_bytes(key));
            if kept.marks & FROM_COLD != 0 {
                cold.dropped.insert(key.to_vec());
            }
        }
        kept.at
    }

    /// Reads `key` back from the cold runs into `rows`; whether it was there.
    fn load_cold(&mut self, key: &[u8]) -> Result<bool, SluiceError> {
        let Some(cold) = self.cold.as_mut().filter(|cold| !cold.store.runs().is_empty()) else { return Ok(false) };
        if cold.dropped.contains(key) {
            return Ok(false);
        }
        let hash = sluice_types::key::hash(key);
        let vnode = sluice_types::vnode::of_hash(hash, self.spec.vnodes);
        let Some(found) = cold.store.runs().find(vnode, key, hash, &|_| false)? else { return Ok(false) };
        cold.store.charge(key_bytes(key));
        let dirty = cold.evicted_dirty.remove(key);
        let at = self.log.append(&found.value)?;
        self.rows.insert(key.into(), Kept { at, marks: RECENT | FROM_COLD });
        if dirty {
            // Its change since the previous snapshot is in no checkpoint yet.
            self.mark(key);
        }
        Ok(true)
    }

    /// When the space is over its budget, evicts keys no change touched since the
    /// clock's hand last passed them, with their rows, enough to bring the space an
    /// eighth of its budget under it, into one cold run ([`crate::cold`]).
    fn evict_over_budget(&mut self) -> Result<(), SluiceError> {
        const SCAN_MAX: usize = 1 << 17;
        let Some(cold) = self.cold.as_mut() else { return Ok(()) };
        let space = Arc::clone(cold.store.space());
        if self.rows.is_empty() {
            return Ok(());
        }
        let Some(goal) = cold.store.eviction_goal() else { return Ok(()) };
        let (mut chosen, mut freed) = (Vec::new(), 0usize);
        let (mut scanned, entries) = (0, self.rows.len());
        while freed < goal && scanned < entries.min(SCAN_MAX) {
            scanned += 1;
            if cold.hand >= self.rows.len() {
                cold.hand = 0;
            }
            let (key, kept) = self.rows.get_index_mut(cold.hand).expect("the hand is within the keys");
            cold.hand += 1;
            let bytes = key_bytes(key) + kept.at.len();
            if !crate::cold::passes(&mut kept.marks, bytes, space.budget()) {
                continue;
            }
            freed += bytes;
            chosen.push(key.clone());
        }
        if chosen.is_empty() {
            cold.store.evicted(0, goal, scanned, entries);
            return Ok(());
        }
        let mut records = crate::records::Records::new(Some(space.dir()));
        let mut row = Vec::new();
        for key in &chosen {
            let kept = self.rows[key];
            row.clear();
            self.log.read_into(kept.at, &mut row)?;
            let vnode = sluice_types::vnode::of_hash(sluice_types::key::hash(key), self.spec.vnodes);
            records.add(vnode, |k| k.extend_from_slice(key), Some(&|v: &mut Vec<u8>| v.extend_from_slice(&row)));
        }
        for key in cold.dropped.drain() {
            let vnode = sluice_types::vnode::of_hash(sluice_types::key::hash(&key), self.spec.vnodes);
            records.add(vnode, |k| k.extend_from_slice(&key), None);
        }
        let hash = |key: &[u8]| Some(sluice_types::key::hash(key));
        cold.store.add(records, chosen.len(), freed, hash)?;
        for key in chosen {
            let kept = self.rows.swap_remove(&key).expect("a chosen key is held");
            cold.store.release(key_bytes(&key));
            self.log.forget(kept.at);
            if self.tracking && self.changed.remove(&key) {
                cold.evicted_dirty.insert(key.into_vec());
            }
        }
        cold.store.evicted(freed, goal, scanned, entries);
        Ok(())
    }
}

impl Operator for ChangelogNormalize {
    fn name(&self) -> &str {
        "changelog_normalize"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(matches!(batch.weights, Weights::Inserts), "a source's rows are inserts, their kinds in a column");
        let kinds = self.kinds(&batch.rows)?;
        let width = self.spec.schema.fields().len();
        let key_columns: Vec<ArrayRef> = self.spec.key.iter().map(|&i| Arc::clone(batch.rows.column(i))).collect();
        let row_columns: Vec<ArrayRef> = batch.rows.columns()[..width].to_vec();
        self.key_encoder.encode(&key_columns, &mut self.keys)?;
        self.row_encoder.encode(&row_columns, &mut self.encoded)?;
        let mut emitted = Vec::new();
        for index in 0..batch.num_rows() {
            if key_columns.iter().any(|column| column.is_null(index)) {
                let key: Box<[u8]> = self.keys.row(index).into();
                self.note(Anomaly::NullKey, &key);
                continue;
            }
            let kind = RowKind::from_i8(kinds.value(index)).ok_or_else(|| {
                SluiceError::internal(
                    "normalize.input",
                    format!("source {}: row kind {} is none of Flink's", self.spec.source, kinds.value(index)),
                )
            })?;
            self.apply(&row_columns, index, kind, &mut emitted)?;
        }
        if let Some(batch) = self.emit(emitted)? {
            out.push(Message::Data(batch));
        }
        self.evict_over_budget()?;
        self.compact()
    }

    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        Ok(Some(state::snapshot(self, delta)))
    }

    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        state::restore(self, state)
    }
}
