//! The local half of a two-phase window aggregate: before the exchange, each batch's rows
//! are folded per (window, key) into one partial row, so the exchange carries and the
//! window aggregate after it looks up one row per group of the batch instead of one per
//! input row (Flink's local-global aggregation).
//!
//! It holds nothing between batches: every batch's partials are emitted with it, so
//! watermarks, barriers and the end pass through unchanged and it has no state to
//! checkpoint.
//!
//! Input: the window aggregate's input (`window_start`, `window_end`, keys, arguments).
//! Output, per (window, key) of the batch, in the order each group first appears:
//! `window_start`, `window_end`, the keys (the group's first row's values), then one
//! partial column per aggregate, then the group's input row count (for the late rows
//! the merging aggregate drops). Only aggregates whose partials merge exactly into the
//! same answer are split this way ([`can_split`]): COUNT and SUM merge by SUM, MIN by
//! MIN, MAX by MAX; each aggregate's `FILTER` is applied here. [`merging_spec`] is the
//! window aggregate after the exchange.
//!
//! Sliced HOP windows ([`LocalWindowAggregate::sliced`]): the rows arrive assigned to
//! their HOP window's slice ([`WindowKind::slice_ms`], a TUMBLE of that size) instead of
//! copied once per window; they are folded per (slice, key), and each slice's partial
//! row is then given to every window holding the slice: the same partials for a fraction
//! of the hashing, except that a window and key whose rows span two slices of the batch
//! get one partial row per slice, which the merging aggregate adds up ([`can_slice`]:
//! not for a floating-point SUM, whose rounding depends on that order).
//! A slice whose windows are not all within `i64` milliseconds is dropped with its rows
//! counted under `rows outside the window range`, as the HOP assignment drops such rows
//! (the sliced assignment, `WindowAssign::sliced`, has already dropped them: this
//! aggregate does not rely on it).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, TimestampMillisecondArray, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use hashbrown::HashTable;
use sluice_runtime::Operator;
use sluice_types::key::{KeyEncoder, KeyRows};
use sluice_types::{Batch, Message, SluiceError};

use crate::counter::LazyCounter;
use crate::window::WindowKind;

use super::{
    Accumulators, AggregateFunction, AggregateSpec, Argument, WindowAggregateSpec, finish, is_float, is_text,
    read_arguments,
};

/// Whether every aggregate's partials merge into exactly its answer: COUNT(*), COUNT(x),
/// SUM, MIN and MAX do (AVG and COUNT(DISTINCT) would need more than one value per
/// partial).
pub fn can_split(aggregates: &[AggregateSpec]) -> bool {
    aggregates.iter().all(|aggregate| {
        matches!(
            aggregate.function,
            AggregateFunction::CountRows
                | AggregateFunction::Count
                | AggregateFunction::Sum
                | AggregateFunction::Min
                | AggregateFunction::Max
        )
    })
}

/// Whether `spec`'s partials over `input` (the window aggregate's input) may also be
/// folded per HOP slice ([`LocalWindowAggregate::sliced`]) and give the same answer: the
/// partials of a window are then added up in another order, which changes no COUNT,
/// MIN, MAX or integer SUM, but may round a floating-point SUM differently.
pub fn can_slice(spec: &WindowAggregateSpec, input: &SchemaRef) -> bool {
    can_split(&spec.aggregates)
        && spec.aggregates.iter().all(|aggregate| {
            aggregate.function != AggregateFunction::Sum
                || aggregate.argument.is_none_or(|column| !is_float(input.field(column).data_type()))
        })
}

/// The schema of the partial rows made from `input` (the window aggregate's input) for
/// `spec`'s aggregates: the window bounds and keys as they are, one partial column per
/// aggregate (`__partial{i}`), and `__rows`.
pub fn partial_schema(spec: &WindowAggregateSpec, input: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = vec![input.field(spec.window_start).clone(), input.field(spec.window_end).clone()];
    fields.extend(spec.keys.iter().map(|&k| input.field(k).clone()));
    for (i, aggregate) in spec.aggregates.iter().enumerate() {
        let argument = aggregate.argument.map(|c| input.field(c).data_type());
        let data_type = match aggregate.function {
            AggregateFunction::CountRows | AggregateFunction::Count => DataType::Int64,
            _ if argument.is_some_and(is_float) => DataType::Float64,
            _ if argument.is_some_and(is_text) => DataType::Utf8,
            _ => DataType::Int64,
        };
        fields.push(Field::new(format!("__partial{i}"), data_type, true));
    }
    fields.push(Field::new("__rows", DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// The window aggregate after the exchange, over [`partial_schema`]'s rows: the same
/// groups and output, each aggregate merging its partial column (COUNT and SUM by SUM,
/// MIN by MIN, MAX by MAX, no filter: the partials applied it), late rows weighed by
/// `__rows`.
pub fn merging_spec(spec: &WindowAggregateSpec) -> WindowAggregateSpec {
    let keys = spec.keys.len();
    let aggregates = spec
        .aggregates
        .iter()
        .enumerate()
        .map(|(i, aggregate)| AggregateSpec {
            function: match aggregate.function {
                AggregateFunction::Min => AggregateFunction::Min,
                AggregateFunction::Max => AggregateFunction::Max,
                _ => AggregateFunction::Sum,
            },
            argument: Some(2 + keys + i),
            filter: None,
        })
        .collect();
    WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: (2..2 + keys).collect(),
        groups: spec.groups.clone(),
        aggregates,
        output: Arc::clone(&spec.output),
        batch_size: spec.batch_size,
        late_weights: Some(2 + keys + spec.aggregates.len()),
    }
}

/// See the module documentation.
pub struct LocalWindowAggregate {
    spec: WindowAggregateSpec,
    output: SchemaRef,
    key_encoder: KeyEncoder,
    key_rows: KeyRows,
    input_types: Vec<DataType>,
    /// Group ids of the batch by (window end, key) hash, and each group's hash (kept
    /// between batches for their allocations).
    index: HashTable<u32>,
    hashes: Vec<u64>,
    /// The same for a single BIGINT key, whose groups hold their key and window end (a
    /// probe compares them in place instead of looking up the group's first row).
    int_index: HashTable<IntGroup>,
    /// Each row's group in the current batch (kept for its allocation).
    row_groups: Vec<u32>,
    /// No aggregate counts distinct values ([`can_split`]).
    no_encoders: Vec<Option<KeyEncoder>>,
    /// Rows come assigned to HOP slices (see the module documentation).
    slicing: Option<Slicing>,
}

/// The HOP windows whose slices the rows come in.
struct Slicing {
    hop: WindowKind,
    /// `rows outside the window range`.
    outside_range: LazyCounter,
    /// Scratch: one slice's windows.
    windows: Vec<(i64, i64)>,
}

impl LocalWindowAggregate {
    /// `spec` is the window aggregate's (its aggregates must pass [`can_split`]);
    /// `input` the schema of the rows it receives.
    pub fn new(spec: WindowAggregateSpec, input: &SchemaRef) -> Result<LocalWindowAggregate, SluiceError> {
        assert!(can_split(&spec.aggregates), "the planner splits only aggregates whose partials merge");
        let key_encoder = KeyEncoder::new(spec.keys.iter().map(|&k| input.field(k).data_type().clone()).collect())?;
        let spec_aggregates = spec.aggregates.len();
        Ok(LocalWindowAggregate {
            output: partial_schema(&spec, input),
            input_types: input.fields().iter().map(|f| f.data_type().clone()).collect(),
            spec,
            key_encoder,
            key_rows: KeyRows::default(),
            index: HashTable::new(),
            hashes: Vec::new(),
            int_index: HashTable::new(),
            row_groups: Vec::new(),
            no_encoders: (0..spec_aggregates).map(|_| None).collect(),
            slicing: None,
        })
    }

    /// The same over rows assigned to the slices of `hop` (a TUMBLE of
    /// [`WindowKind::slice_ms`], so `window_start`/`window_end` hold each row's slice):
    /// each slice's partials go to every HOP window holding it. `outside_range` counts
    /// the rows of a slice whose windows are not all within `i64` milliseconds.
    pub fn sliced(mut self, hop: WindowKind, outside_range: LazyCounter) -> LocalWindowAggregate {
        assert!(matches!(hop, WindowKind::Hop { .. }), "only HOP windows are sliced");
        self.slicing = Some(Slicing { hop, outside_range, windows: Vec::new() });
        self
    }

    fn accumulators(&self) -> Vec<Accumulators> {
        super::accumulators_for(&self.spec.aggregates, &self.input_types)
    }
}

/// A group of a single BIGINT key in this batch's table.
#[derive(Clone, Copy)]
struct IntGroup {
    /// The key (0 when NULL).
    key: i64,
    end: i64,
    valid: bool,
    group: u32,
}

impl IntGroup {
    fn hash(&self) -> u64 {
        group_hash(if self.valid { self.key as u64 } else { u64::MAX }, self.end)
    }
}

/// A group's hash in this batch's table: its key's hash (or value) and its window's end,
/// mixed so that every bit of either reaches the high bits the table's tags use.
fn group_hash(key_hash: u64, end: i64) -> u64 {
    let mixed = (key_hash ^ (end as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed ^ (mixed >> 29)
}

impl Operator for LocalWindowAggregate {
    fn name(&self) -> &str {
        "local_window_aggregate"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(batch.is_append_only(), "the planner rejects window aggregates over updating input");
        let rows = &batch.rows;
        if rows.num_rows() == 0 {
            return Ok(());
        }
        let ends = rows.column(self.spec.window_end).as_primitive::<TimestampMillisecondType>();
        // One BIGINT key (NEXMark's auction, bidder) is compared as it is; other keys in
        // their encoding.
        let int_key = match self.spec.keys.as_slice() {
            [key] => rows.column(*key).as_primitive_opt::<Int64Type>().cloned(),
            _ => None,
        };
        let mut keys = std::mem::take(&mut self.key_rows);
        if int_key.is_none() {
            let key_columns: Vec<ArrayRef> = self.spec.keys.iter().map(|&k| Arc::clone(rows.column(k))).collect();
            self.key_encoder.encode(&key_columns, &mut keys)?;
        }
        let no_keys = self.spec.keys.is_empty();
        let arguments: Vec<Argument> = read_arguments(&self.spec.aggregates, &self.no_encoders, rows)?;
        let filters: Vec<Option<arrow::array::BooleanArray>> =
            self.spec.aggregates.iter().map(|a| a.filter.map(|f| rows.column(f).as_boolean().clone())).collect();
        let mut accumulators = self.accumulators();
        self.index.clear();
        self.hashes.clear();
        self.int_index.clear();
        // Each group's first row (the one its key and window are taken from) and its rows.
        let mut first_rows: Vec<u32> = Vec::new();
        let mut counts: Vec<i64> = Vec::new();
        // Each row's group, for the accumulators to take the rows in one pass each.
        let mut row_groups = std::mem::take(&mut self.row_groups);
        row_groups.clear();
        row_groups.reserve(rows.num_rows());
        for row in 0..rows.num_rows() {
            let end = ends.value(row);
            let found = if let Some(ints) = &int_key {
                let valid = ints.is_valid(row);
                let probe = IntGroup { key: if valid { ints.value(row) } else { 0 }, end, valid, group: 0 };
                let hash = probe.hash();
                match self.int_index.find(hash, |g| g.key == probe.key && g.end == end && g.valid == valid) {
                    Some(found) => Ok(found.group as usize),
                    None => {
                        let group = first_rows.len() as u32;
                        self.int_index.insert_unique(hash, IntGroup { group, ..probe }, IntGroup::hash);
                        Err(())
                    }
                }
            } else {
                let hash = group_hash(if no_keys { 0 } else { keys.hash(row) }, end);
                let hashes = &mut self.hashes;
                let same = |&group: &u32| {
                    let first = first_rows[group as usize] as usize;
                    ends.value(first) == end && (no_keys || crate::same_bytes(keys.row(first), keys.row(row)))
                };
                match self.index.find(hash, same) {
                    Some(&group) => Ok(group as usize),
                    None => {
                        let group = first_rows.len();
                        hashes.push(hash);
                        self.index.insert_unique(hash, group as u32, |&g| hashes[g as usize]);
                        Err(())
                    }
                }
            };
            // A new group's index is the number of groups so far.
            let group = found.unwrap_or_else(|()| {
                first_rows.push(row as u32);
                counts.push(0);
                accumulators.iter_mut().for_each(Accumulators::push_group);
                first_rows.len() - 1
            });
            counts[group] += 1;
            row_groups.push(group as u32);
        }
        for ((accumulator, argument), filter) in accumulators.iter_mut().zip(&arguments).zip(&filters) {
            accumulator.update_rows(&row_groups, argument, filter.as_ref());
        }
        self.row_groups = row_groups;
        self.key_rows = keys;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output.fields().len());
        let mut partials: Vec<ArrayRef> = Vec::with_capacity(self.spec.aggregates.len() + 1);
        for (accumulator, field) in accumulators.into_iter().zip(&self.output.fields()[2 + self.spec.keys.len()..]) {
            let mut partial = finish(accumulator);
            if partial.data_type() != field.data_type() {
                partial = arrow::compute::cast(&partial, field.data_type())?;
            }
            partials.push(partial);
        }
        partials.push(Arc::new(Int64Array::from(counts)));
        match self.slicing.as_mut() {
            None => {
                let firsts = UInt32Array::from(first_rows);
                for &column in [self.spec.window_start, self.spec.window_end].iter().chain(&self.spec.keys) {
                    columns.push(take(rows.column(column), &firsts, None)?);
                }
                columns.extend(partials);
            }
            Some(slicing) => {
                let slice_starts = rows.column(self.spec.window_start).as_primitive::<TimestampMillisecondType>();
                let counts = partials.last().expect("the row counts").as_primitive::<Int64Type>();
                let windows_per_slice = usize::try_from(slicing.hop.windows_per_row()).unwrap_or(usize::MAX);
                let capacity = first_rows.len().saturating_mul(windows_per_slice).min(1 << 20);
                let (mut groups, mut group_rows) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
                let (mut starts, mut ends) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
                let mut outside = 0u64;
                for (group, &first) in first_rows.iter().enumerate() {
                    slicing.windows.clear();
                    // Every row of the slice has the windows of the slice's start.
                    if !slicing.hop.windows(slice_starts.value(first as usize), &mut slicing.windows) {
                        outside += counts.value(group).unsigned_abs();
                        continue;
                    }
                    for &(start, end) in &slicing.windows {
                        groups.push(group as u32);
                        group_rows.push(first);
                        starts.push(start);
                        ends.push(end);
                    }
                }
                if outside > 0 {
                    slicing.outside_range.add(outside);
                }
                if groups.is_empty() {
                    return Ok(());
                }
                let fields = self.output.fields();
                for (values, field) in [starts, ends].into_iter().zip(fields.iter()) {
                    let zone = match field.data_type() {
                        DataType::Timestamp(_, zone) => zone.clone(),
                        other => unreachable!("a window bound is a timestamp, not {other}"),
                    };
                    columns.push(Arc::new(TimestampMillisecondArray::from(values).with_timezone_opt(zone)));
                }
                let group_rows = UInt32Array::from(group_rows);
                for &column in &self.spec.keys {
                    columns.push(take(rows.column(column), &group_rows, None)?);
                }
                let groups = UInt32Array::from(groups);
                for partial in partials {
                    columns.push(take(&partial, &groups, None)?);
                }
            }
        }
        out.push(Message::Data(Batch::inserts(RecordBatch::try_new(Arc::clone(&self.output), columns)?)));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
