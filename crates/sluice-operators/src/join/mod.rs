//! The regular (non-windowed) streaming join: `INNER`, `LEFT`, `RIGHT` and `FULL` joins
//! on equality keys, with an optional residual predicate, over weighted changelogs on
//! both inputs (Flink SQL's regular join, computed incrementally).
//!
//! Rows arrive on two ports (0: left, 1: right; [`Operator::on_port_data`]), both
//! routed to threads by the hash of their join key columns, so equal keys of both sides
//! meet on one thread. Each side's state is the multiset of its rows so far
//! ([`store`]): equal rows accumulate their weights, a row whose weight reaches 0 is
//! dropped. Each stored row also carries its match count: the summed weights of the
//! other side's rows with the same key for which the residual is true. (A side whose
//! rows expire keeps them in arrival order instead, [`expiring`]: see Expiry.)
//!
//! Output is the change of the join's result, one batch per input batch. For each input
//! row `q` of weight `w`, in batch order, against the other side's stored rows `r` (of
//! weight `m`) with the same key (a NULL in any key column matches nothing):
//! - for each `r` for which the residual holds, the joined row with weight `w × m`; if
//!   the other side is preserved (outer) and `r` had no match before, its NULL-padded
//!   row is first retracted (`-m`); if `r` has no match left after, its padded row is
//!   emitted again (`+m`) after the joined row's retraction;
//! - if this side is preserved and `q` matches nothing, the NULL-padded `q` with
//!   weight `w`;
//! - then `q` is applied to this side's state.
//!
//! So within one output a retraction always precedes the row that replaces it. The
//! output's integral (the sum of weights per row) is always the join of the integrals
//! of the inputs: the state is a multiset with integer weights, which also keeps a
//! retraction arriving before its insert consistent (the row is held with a negative
//! weight until its insert cancels it).
//!
//! Work per batch is vectorized where it matters: keys and rows are encoded per batch,
//! every candidate pair's other-side row is decoded in one go, the residual is evaluated
//! once over all candidate pairs, and the output columns are gathered with `take`.
//!
//! Stored rows are held in the project's key encoding ([`sluice_types::key`]), so every
//! column of both inputs must be of a key type (integers, decimals, floats, booleans,
//! strings, binaries, dates, times, timestamps, durations); floats are kept with -0.0
//! as 0.0 and a single NaN, as in TopN. Snapshots: [`state`].
//!
//! **Expiry** (interval and window joins, inner joins only). A side may carry an
//! [`Expiry`]: its rows can match only rows of the other side whose time is at most
//! `column + offset_ms` of the row (the planner derives it from the join's time bounds or
//! window bounds, which stay in the residual and still decide every match). As the
//! watermark `w` (already the lower of both inputs') reaches a row's expiry, no row that
//! may still come can match it ("no row at or below the watermark follows"), so
//! [`Operator::on_watermark`] expires it. Such a side is an inner join's input that only
//! appends, so it keeps its rows in arrival order ([`expiring`]): an expired row is
//! skipped by probes, left out of snapshots and of [`JoinOperator::state_rows`] at once,
//! and its memory freed from the front of that order (with a state TTL the side keeps
//! its rows by row, [`store`], freeing each through an ordered index by expiry time).
//! Expired rows are not retracted: an inner join has nothing to retract, so its output
//! stays append-only. A row arriving with its expiry
//! already at or below the watermark could only have matched rows already freed: it is
//! late, counted in `view NAME: late rows` and dropped (never joined, never stored),
//! unlike a regular join, which joins every row however late. A row whose time is NULL
//! matches nothing through the time condition and is dropped without being counted.
//! The watermark is not part of a snapshot: after a restore it starts unknown, and the
//! restored rows are freed as the first watermark passes them.

mod append;
mod expiring;
#[cfg(test)]
mod expiry_tests;
mod state;
mod store;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, UInt32Array, new_null_array};
use arrow::buffer::NullBuffer;
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use datafusion_physical_expr::PhysicalExpr;
use sluice_runtime::{Operator, OperatorContext, Snapshot};
use sluice_state::StateSource;
use sluice_types::key::{KeyEncoder, KeyRows, is_key_type};
use sluice_types::{Batch, Message, SluiceError, TimestampMs};

use crate::partition::encode_keys;
use crate::spill::SpillSpace;
use append::AppendStore;
use expiring::ExpiringStore;
use store::{NEVER, RowRef, Store};

pub use state::JOIN_STATE_VERSION;

/// Which sides of the join are preserved (padded with NULLs when unmatched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
}

impl JoinKind {
    /// Whether unmatched rows of `side` (0: left, 1: right) are emitted padded.
    fn preserves(self, side: usize) -> bool {
        match self {
            JoinKind::Inner => false,
            JoinKind::Left => side == 0,
            JoinKind::Right => side == 1,
            JoinKind::Full => true,
        }
    }
}

/// Whether a join's output is append-only: only an inner join of two append-only
/// inputs (an outer join retracts its padded rows; a retraction on either input
/// retracts joined rows).
pub fn output_is_append_only(kind: JoinKind, left_append_only: bool, right_append_only: bool) -> bool {
    kind == JoinKind::Inner && left_append_only && right_append_only
}

/// When a side's rows expire: a row with time `t` in `column` (an Arrow
/// `Timestamp(Millisecond)`) can match only rows of the other side whose time is at most
/// `t + offset_ms`, so it is freed once the watermark is at or above `t + offset_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    pub column: usize,
    pub offset_ms: i64,
}

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct JoinSpec {
    pub kind: JoinKind,
    pub left_schema: SchemaRef,
    pub right_schema: SchemaRef,
    /// The left fields, then the right fields (the non-preserved side's nullable).
    pub output_schema: SchemaRef,
    /// Equality keys: `left_keys[i]` of the left input equals `right_keys[i]` of the
    /// right (of equal types); the inputs are routed by these columns' key hash.
    pub left_keys: Vec<usize>,
    pub right_keys: Vec<usize>,
    /// A condition on joined rows besides the keys, over `output_schema`; a pair joins
    /// when it is true (NULL counts as false).
    pub residual: Option<Arc<dyn PhysicalExpr>>,
    /// The pipeline's vnode count (state is split by the vnode of each row's key).
    pub vnodes: u32,
    /// Per side (0: left, 1: right), when its rows expire (None: kept as long as they
    /// live). Only for inner joins.
    pub expiry: [Option<Expiry>; 2],
    /// The counter of late rows (`view NAME: late rows`), registered only for a join
    /// with an expiry.
    pub late_rows: String,
    /// Per side, whether its input only inserts (no retraction ever comes).
    pub append_only: [bool; 2],
    /// Where the rows of a side without an expiry spill beyond the memory budget
    /// ([`append`], [`store`]); None: they stay in memory.
    pub spill: Option<Arc<SpillSpace>>,
}

/// One input's encoders and stored rows.
struct Side {
    schema: SchemaRef,
    keys: Vec<usize>,
    /// The key columns' encoder, made at the first batch (as the exchange does).
    key_encoder: Option<KeyEncoder>,
    /// Encodes whole rows of this side.
    row_encoder: KeyEncoder,
    store: Rows,
    expiry: Option<Expiry>,
}

/// A side's stored rows: in arrival order when they expire ([`expiring`]: an interval
/// or window join's side, without a TTL); appended when they only come and are never
/// padded ([`append`]); else a multiset by row ([`store`]). Each spills its rows' bytes.
enum Rows {
    ByRow(Store),
    Expiring(ExpiringStore),
    Append(AppendStore),
}

impl Rows {
    fn len(&self) -> usize {
        match self {
            Rows::ByRow(store) => store.len(),
            Rows::Expiring(store) => store.len(),
            Rows::Append(store) => store.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Rows::ByRow(store) => store.bytes(),
            Rows::Expiring(store) => store.bytes(),
            Rows::Append(store) => store.bytes(),
        }
    }

    /// Appends the ids of the rows whose join key is `key` (placement hash `hash`).
    fn probe(&mut self, key: &[u8], hash: u64, out: &mut Vec<u64>) -> Result<(), SluiceError> {
        match self {
            Rows::ByRow(store) => store.probe(key, hash, out),
            Rows::Expiring(store) => return store.probe(key, hash, out),
            Rows::Append(store) => return store.probe(key, hash, out),
        }
        Ok(())
    }

    /// The bytes of rows `ids` (from a probe in this batch), in order: spilled ones
    /// are read into `spilled` first.
    fn gather<'a>(&'a self, ids: &[u64], spilled: &'a mut Vec<u8>) -> Result<Vec<&'a [u8]>, SluiceError> {
        match self {
            Rows::ByRow(store) => crate::spill::gather(
                ids.iter().map(|&id| id as u32),
                |id| store.resident_row(id),
                |id, out| store.read_row(id, out),
                spilled,
            ),
            Rows::Expiring(store) => crate::spill::gather(
                ids.iter().copied(),
                |id| store.resident_row(id),
                |id, out| store.read_row(id, out),
                spilled,
            ),
            Rows::Append(store) => crate::spill::gather(
                ids.iter().map(|&id| id as u32),
                |id| store.resident_row(id),
                |id, out| store.read_row(id, out),
                spilled,
            ),
        }
    }

    /// Marks row `id` (from a probe in this batch) changed for the next snapshot: its
    /// match count changed on a side an outer join pads, where snapshots keep it.
    fn matched(&mut self, id: u64) {
        if let Rows::ByRow(store) = self {
            store.mark(id as u32);
        }
    }

    /// The weight and the match count of row `id` (from a probe in this batch).
    fn counts_mut(&mut self, id: u64) -> (i64, &mut i64) {
        match self {
            Rows::ByRow(store) => store.counts_mut(id as u32),
            Rows::Expiring(store) => {
                let entry = store.get_mut(id);
                (entry.weight, &mut entry.matches)
            }
            Rows::Append(store) => store.counts_mut(id as u32),
        }
    }

    /// Adds `weight` copies of a row (see [`Store::apply`] and [`ExpiringStore::push`]).
    fn apply(&mut self, row: &RowRef<'_>, weight: i64, matches: i64, expires: i64) -> Result<(), SluiceError> {
        match self {
            Rows::ByRow(store) => store.apply(row, weight, matches, expires),
            Rows::Expiring(store) => store.push(row.row, row.key, row.key_hash, weight, matches, expires),
            Rows::Append(store) => store.push(row, weight),
        }
    }

    fn expire(&mut self, watermark: TimestampMs) -> Result<(), SluiceError> {
        match self {
            Rows::ByRow(store) => {
                store.expire(watermark)?;
            }
            Rows::Expiring(store) => {
                store.expire(watermark);
            }
            Rows::Append(_) => {}
        }
        Ok(())
    }

    fn expire_ttl(&mut self) -> Result<(), SluiceError> {
        if let Rows::ByRow(store) = self {
            store.expire_ttl()?;
        }
        Ok(())
    }

    /// Whether the side keeps what changed since the previous snapshot (a delta may
    /// then be taken).
    fn tracking(&self) -> bool {
        match self {
            Rows::ByRow(store) => store.tracking(),
            Rows::Expiring(store) => store.tracking(),
            Rows::Append(store) => store.tracking(),
        }
    }

    /// After a restore: the rows held are the runs' (the highest arrival number there
    /// was `last_arrival`); an expiring side puts its rows in the order they expire.
    fn restored(&mut self, last_arrival: Option<u64>) -> Result<(), SluiceError> {
        match self {
            Rows::ByRow(store) => store.clear_changes(),
            Rows::Expiring(store) => return store.restored(last_arrival),
            Rows::Append(store) => store.restored(last_arrival),
        }
        Ok(())
    }
}

/// See the module documentation.
pub struct JoinOperator {
    kind: JoinKind,
    output: SchemaRef,
    residual: Option<Arc<dyn PhysicalExpr>>,
    sides: [Side; 2],
    vnodes: u32,
    /// The vnodes this instance owns (its thread's).
    owned: std::ops::Range<u32>,
    /// The highest watermark seen (`i64::MIN` before the first).
    watermark: TimestampMs,
    /// Rows dropped as late (a join with an expiry only).
    late_rows: Option<Arc<AtomicU64>>,
    /// Reused per batch.
    key_rows: KeyRows,
    row_rows: KeyRows,
    /// Reused per batch: the bytes of probed rows read back from a spill file.
    spilled_rows: Vec<u8>,
    /// Where rows spill beyond the memory budget, and the metrics counting the bytes
    /// written there (for the stores [`JoinOperator::with_ttl`] makes).
    spill: Option<Arc<SpillSpace>>,
    spill_metrics: Option<Arc<sluice_runtime::Metrics>>,
}

fn invalid(message: String) -> SluiceError {
    SluiceError::internal("join.spec", message)
}

impl JoinOperator {
    pub fn new(spec: JoinSpec, context: &OperatorContext) -> Result<JoinOperator, SluiceError> {
        if spec.vnodes != context.vnodes {
            return Err(invalid(format!("the join plans {} vnodes, the pipeline has {}", spec.vnodes, context.vnodes)));
        }
        if spec.left_keys.is_empty() || spec.left_keys.len() != spec.right_keys.len() {
            return Err(invalid(format!(
                "a join needs as many left keys as right keys, at least one: {:?} and {:?}",
                spec.left_keys, spec.right_keys
            )));
        }
        let (left_width, right_width) = (spec.left_schema.fields().len(), spec.right_schema.fields().len());
        if spec.output_schema.fields().len() != left_width + right_width {
            return Err(invalid("the join's output is the left columns then the right columns".into()));
        }
        for (&l, &r) in spec.left_keys.iter().zip(&spec.right_keys) {
            let (Some(left), Some(right)) = (spec.left_schema.fields().get(l), spec.right_schema.fields().get(r))
            else {
                return Err(invalid(format!("join key column {l} or {r} is not an input column")));
            };
            if left.data_type() != right.data_type() {
                return Err(invalid(format!(
                    "join keys {} and {} have different types: {} and {}",
                    left.name(),
                    right.name(),
                    left.data_type(),
                    right.data_type()
                )));
            }
        }
        for field in spec.left_schema.fields().iter().chain(spec.right_schema.fields().iter()) {
            if !is_key_type(field.data_type()) {
                return Err(SluiceError::user(
                    "join.column_type",
                    format!("a join cannot hold column {} of type {} in its state", field.name(), field.data_type()),
                )
                .with_fix("CAST the column to a scalar type (integer, decimal, float, boolean, string, date or timestamp) before the join, or leave it out"));
            }
        }
        let expires = spec.expiry.iter().any(Option::is_some);
        if expires && spec.kind != JoinKind::Inner {
            return Err(invalid(format!("only an inner join frees rows as the watermark passes, not {:?}", spec.kind)));
        }
        for (expiry, schema) in spec.expiry.iter().zip([&spec.left_schema, &spec.right_schema]) {
            let Some(expiry) = expiry else { continue };
            let data_type = schema.fields().get(expiry.column).map(|f| f.data_type());
            if !matches!(data_type, Some(DataType::Timestamp(TimeUnit::Millisecond, _))) {
                return Err(invalid(format!(
                    "a row's expiry reads column {}, which is no millisecond timestamp ({data_type:?})",
                    expiry.column
                )));
            }
        }
        let written = || spec.spill.as_ref().map(|_| crate::spill::spilled_bytes(&context.metrics));
        let side = |index: usize, schema: &SchemaRef, keys: &[usize]| -> Result<Side, SluiceError> {
            let expiry = spec.expiry[index];
            // A side only appended to, whose rows are never padded (so their match
            // counts are never read), keeps them appended ([`append`]).
            let appended = spec.append_only[index] && !spec.kind.preserves(index);
            Ok(Side {
                schema: Arc::clone(schema),
                keys: keys.to_vec(),
                key_encoder: None,
                row_encoder: KeyEncoder::new(schema.fields().iter().map(|f| f.data_type().clone()).collect())?,
                store: match expiry {
                    Some(_) => Rows::Expiring(ExpiringStore::new(spec.spill.clone(), written())),
                    None if appended => Rows::Append(AppendStore::new(spec.spill.clone(), written())),
                    None => Rows::ByRow(Store::new(spec.spill.clone(), written())),
                },
                expiry,
            })
        };
        Ok(JoinOperator {
            kind: spec.kind,
            sides: [side(0, &spec.left_schema, &spec.left_keys)?, side(1, &spec.right_schema, &spec.right_keys)?],
            output: spec.output_schema,
            residual: spec.residual,
            vnodes: spec.vnodes,
            owned: sluice_types::vnode::range_of(context.thread, context.vnodes, context.threads),
            watermark: TimestampMs::MIN,
            late_rows: expires.then(|| context.metrics.counter(&spec.late_rows)),
            key_rows: KeyRows::default(),
            row_rows: KeyRows::default(),
            spilled_rows: Vec::new(),
            spill_metrics: spec.spill.as_ref().map(|_| Arc::clone(&context.metrics)),
            spill: spec.spill.clone(),
        })
    }

    /// The instance owning the vnodes `vnodes` (tests give instances ranges that no
    /// thread count does).
    #[cfg(test)]
    pub(crate) fn owning(mut self, vnodes: std::ops::Range<u32>) -> JoinOperator {
        self.owned = vnodes;
        self
    }

    /// Drops rows of either side not written for the TTL (`crate::ttl`): an inner join
    /// only (an outer join's NULL padding depends on every row of the other side). The
    /// TTL is kept per row, so an expiring side keeps its rows by row too.
    pub fn with_ttl(mut self, ttl: std::time::Duration, clock: crate::ttl::Clock) -> JoinOperator {
        assert_eq!(self.kind, JoinKind::Inner, "the planner gives a state TTL to inner joins only");
        for side in &mut self.sides {
            let mut store =
                Store::new(self.spill.clone(), self.spill_metrics.as_ref().map(crate::spill::spilled_bytes));
            store.set_ttl(crate::ttl::Ttl::new(ttl, clock.clone()));
            side.store = Rows::ByRow(store);
        }
        self
    }

    /// Rows held in state, over both sides: distinct rows of a side kept by row; rows
    /// with their multiplicity on an expiring side (expired ones not counted).
    pub fn state_rows(&self) -> usize {
        self.sides.iter().map(|s| s.store.len()).sum()
    }

    /// The bytes of the rows [`JoinOperator::state_rows`] counts, in their encoding (the
    /// hash indexes and per-row bookkeeping, about 60 bytes a row and 45 a key, not
    /// counted).
    pub fn state_bytes(&self) -> usize {
        self.sides.iter().map(|s| s.store.bytes()).sum()
    }

    /// Output columns from this side's and the other side's columns, in output order.
    fn output_columns(&self, this: usize, this_columns: Vec<ArrayRef>, other_columns: Vec<ArrayRef>) -> Vec<ArrayRef> {
        if this == 0 {
            this_columns.into_iter().chain(other_columns).collect()
        } else {
            other_columns.into_iter().chain(this_columns).collect()
        }
    }

    /// A batch of the output schema (columns cast to its types where they differ).
    fn output_batch(&self, columns: Vec<ArrayRef>) -> Result<RecordBatch, SluiceError> {
        let columns =
            columns
                .into_iter()
                .zip(self.output.fields())
                .map(|(column, field)| {
                    if column.data_type() == field.data_type() { Ok(column) } else { cast(&column, field.data_type()) }
                })
                .collect::<Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.output), columns)?)
    }

    /// Whether each candidate pair satisfies the residual (None: every pair does).
    fn residual_mask(
        &self,
        this: usize,
        rows: &RecordBatch,
        probes: &[u32],
        others: &[ArrayRef],
    ) -> Result<Option<BooleanArray>, SluiceError> {
        let Some(residual) = &self.residual else { return Ok(None) };
        if probes.is_empty() {
            return Ok(None);
        }
        let indices = UInt32Array::from(probes.to_vec());
        let this_columns =
            rows.columns().iter().map(|c| take(c.as_ref(), &indices, None)).collect::<Result<Vec<_>, _>>()?;
        let pairs = self.output_batch(self.output_columns(this, this_columns, others.to_vec()))?;
        let value = residual.evaluate(&pairs).and_then(|v| v.into_array(pairs.num_rows())).map_err(|error| {
            SluiceError::user("join.residual", format!("the join condition failed: {error}"))
                .with_fix("make the join's condition total over its inputs (e.g. guard divisions with CASE)")
        })?;
        let Some(mask) = value.as_boolean_opt() else {
            return Err(SluiceError::internal("join.residual", format!("the join condition is {}", value.data_type())));
        };
        Ok(Some(mask.clone()))
    }
}

/// When each row of `rows` expires under `expiry` (None for a row whose time is NULL);
/// None without an expiry.
fn expiry_times(rows: &RecordBatch, expiry: Option<Expiry>) -> Option<Vec<Option<i64>>> {
    let expiry = expiry?;
    let times = rows.column(expiry.column).as_primitive::<TimestampMillisecondType>();
    Some(times.iter().map(|time| time.map(|t| t.saturating_add(expiry.offset_ms))).collect())
}

/// `array`'s values at `indices` (None: NULL).
fn gather(array: &ArrayRef, indices: &UInt32Array) -> Result<ArrayRef, SluiceError> {
    if array.is_empty() {
        return Ok(new_null_array(array.data_type(), indices.len()));
    }
    Ok(take(array.as_ref(), indices, None)?)
}

/// Which rows have a NULL in any of `columns` (None: no row does).
fn null_keys(rows: &RecordBatch, keys: &[usize]) -> Option<NullBuffer> {
    let mut combined: Option<NullBuffer> = None;
    for &key in keys {
        combined = NullBuffer::union(combined.as_ref(), rows.column(key).logical_nulls().as_ref());
    }
    combined.filter(|nulls| nulls.null_count() > 0)
}

impl Operator for JoinOperator {
    fn name(&self) -> &str {
        "join"
    }

    fn on_data(&mut self, _batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        Err(SluiceError::internal("join.port", "a join takes rows from its two inputs only, by port"))
    }

    fn on_port_data(&mut self, port: usize, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if port > 1 {
            return Err(SluiceError::internal("join.port", format!("a join has two inputs, not port {port}")));
        }
        let (this, other) = (port, 1 - port);
        for side in &mut self.sides {
            side.store.expire_ttl()?;
        }
        let rows = &batch.rows;
        let count = rows.num_rows();
        let mut keys = std::mem::take(&mut self.key_rows);
        let mut row_bytes = std::mem::take(&mut self.row_rows);
        {
            let side = &mut self.sides[this];
            encode_keys(rows, &side.keys, &mut side.key_encoder, &mut keys)?;
            side.row_encoder.encode(rows.columns(), &mut row_bytes)?;
        }
        let nulls = null_keys(rows, &self.sides[this].keys);
        // With an expiry: rows that could only match freed rows (late) and rows without
        // a time are dropped, as if their weight were 0.
        let expires = expiry_times(rows, self.sides[this].expiry);
        let mut late = 0u64;
        let weights_in: Vec<i64> = (0..count)
            .map(|row| match expires.as_ref().map(|e| e[row]) {
                Some(Some(time)) if time <= self.watermark => {
                    late += u64::from(batch.weight(row) != 0);
                    0
                }
                Some(None) => 0,
                _ => batch.weight(row),
            })
            .collect();
        if let (Some(counter), true) = (&self.late_rows, late > 0) {
            counter.fetch_add(late, Ordering::Relaxed);
        }

        // The candidate pairs: each input row with every stored row of its key.
        let mut probes: Vec<u32> = Vec::new();
        let mut candidates: Vec<u64> = Vec::new();
        let mut ends: Vec<usize> = Vec::with_capacity(count);
        for (row, &weight) in weights_in.iter().enumerate() {
            let matchable = weight != 0 && nulls.as_ref().is_none_or(|n| n.is_valid(row));
            if matchable {
                let before = candidates.len();
                self.sides[other].store.probe(keys.row(row), keys.hash(row), &mut candidates)?;
                probes.extend(std::iter::repeat_n(row as u32, candidates.len() - before));
            }
            ends.push(candidates.len());
        }
        let other_side = &self.sides[other];
        let mut spilled = std::mem::take(&mut self.spilled_rows);
        let stored = other_side.store.gather(&candidates, &mut spilled)?;
        let others = other_side.row_encoder.decode(stored.into_iter())?;
        self.spilled_rows = spilled;
        let mask = self.residual_mask(this, rows, &probes, &others)?;

        // Output rows, as positions in the batch (this side) and among the candidates
        // (the other side), None for NULL padding.
        let mut this_rows: Vec<Option<u32>> = Vec::new();
        let mut other_rows: Vec<Option<u32>> = Vec::new();
        let mut weights: Vec<i64> = Vec::new();
        let mut emit = |this_row: Option<u32>, other_row: Option<usize>, weight: i64| {
            this_rows.push(this_row);
            other_rows.push(other_row.map(|c| c as u32));
            weights.push(weight);
        };
        let (this_preserved, other_preserved) = (self.kind.preserves(this), self.kind.preserves(other));
        let mut start = 0;
        for (row, &end) in ends.iter().enumerate() {
            let weight = weights_in[row];
            if weight == 0 {
                start = end;
                continue;
            }
            let mut matches: i64 = 0;
            for (candidate, &id) in candidates.iter().enumerate().take(end).skip(start) {
                if mask.as_ref().is_some_and(|m| !(m.is_valid(candidate) && m.value(candidate))) {
                    continue;
                }
                let (multiplicity, stored_matches) = self.sides[other].store.counts_mut(id);
                matches += multiplicity;
                let before = *stored_matches;
                *stored_matches += weight;
                let after = *stored_matches;
                if other_preserved {
                    self.sides[other].store.matched(id);
                }
                if other_preserved && before == 0 && after != 0 {
                    emit(None, Some(candidate), -multiplicity);
                }
                let joined = weight.checked_mul(multiplicity).ok_or_else(|| {
                    SluiceError::internal(
                        "join.weight",
                        format!("a joined row's weight {weight} × {multiplicity} overflows"),
                    )
                })?;
                emit(Some(row as u32), Some(candidate), joined);
                if other_preserved && before != 0 && after == 0 {
                    emit(None, Some(candidate), multiplicity);
                }
            }
            start = end;
            if this_preserved && matches == 0 {
                emit(Some(row as u32), None, weight);
            }
            let row_ref = RowRef {
                row: row_bytes.row(row),
                row_hash: row_bytes.hash(row),
                key: keys.row(row),
                key_hash: keys.hash(row),
            };
            let expires = expires.as_ref().map_or(NEVER, |e| e[row].unwrap_or(NEVER));
            self.sides[this].store.apply(&row_ref, weight, matches, expires)?;
        }
        self.key_rows = keys;
        self.row_rows = row_bytes;
        if weights.is_empty() {
            return Ok(());
        }

        let this_indices = UInt32Array::from(this_rows);
        let other_indices = UInt32Array::from(other_rows);
        let this_columns = rows.columns().iter().map(|c| gather(c, &this_indices)).collect::<Result<Vec<_>, _>>()?;
        let other_columns = others.iter().map(|c| gather(c, &other_indices)).collect::<Result<Vec<_>, _>>()?;
        let output = self.output_batch(self.output_columns(this, this_columns, other_columns))?;
        let batch = if weights.iter().all(|&w| w == 1) {
            Batch::inserts(output)
        } else {
            Batch::with_weights(output, Int64Array::from(weights))
        };
        out.push(Message::Data(batch));
        Ok(())
    }

    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        for side in &mut self.sides {
            side.store.expire_ttl()?;
        }
        if watermark > self.watermark {
            self.watermark = watermark;
            for side in &mut self.sides {
                if side.expiry.is_some() {
                    side.store.expire(watermark)?;
                }
            }
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn snapshot_state(&mut self, delta: bool) -> Result<Option<Snapshot>, SluiceError> {
        state::snapshot(self, delta).map(Some)
    }

    fn restore_state(&mut self, state: &mut dyn StateSource) -> Result<(), SluiceError> {
        state::restore(self, state)
    }
}
