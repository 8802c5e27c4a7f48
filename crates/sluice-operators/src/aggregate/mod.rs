//! The event-time window aggregate.
//!
//! Input rows carry `window_start` and `window_end` (from window assignment) plus the key
//! columns and aggregate arguments. State is, per open window (ordered by end), a hash map
//! from the key (Arrow row format bytes) to a group index, and one accumulator column per
//! aggregate. A window is emitted once, when the watermark reaches `window_end - 1` (the
//! window's last millisecond, as in Flink), then dropped. A row whose window was already
//! emitted (or would be, at the current watermark) is late: counted and dropped.
//! End of input emits every open window.
//!
//! Output: one row per (window, key) with the columns in `GROUP BY` order followed by the
//! aggregates, cast to the planner's declared output types.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use datafusion_common::hash_utils::RandomState;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError, TimestampMs, vnode};

mod state;

/// The aggregate functions the window aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    /// `COUNT(*)`: rows.
    CountRows,
    /// `COUNT(x)`: non-null values.
    Count,
    CountDistinct,
    Sum,
    Min,
    Max,
    Avg,
}

/// One aggregate of the output.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    pub function: AggregateFunction,
    /// The input column of the argument (None for `COUNT(*)`).
    pub argument: Option<usize>,
}

/// One output column of the `GROUP BY` part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupColumn {
    WindowStart,
    WindowEnd,
    /// The i-th key column.
    Key(usize),
}

/// Everything the operator needs, built by the planner.
#[derive(Debug, Clone)]
pub struct WindowAggregateSpec {
    pub window_start: usize,
    pub window_end: usize,
    /// Input columns of the keys (group-by columns other than the window's).
    pub keys: Vec<usize>,
    /// The group-by output columns, in order.
    pub groups: Vec<GroupColumn>,
    pub aggregates: Vec<AggregateSpec>,
    /// Group columns then aggregates.
    pub output: SchemaRef,
    /// Most rows per output batch.
    pub batch_size: usize,
}

/// One aggregate's accumulators, one slot per group of a window.
enum Accumulators {
    Count(Vec<i64>),
    SumInt(Vec<Option<i64>>),
    SumFloat(Vec<Option<f64>>),
    MinMaxInt { values: Vec<Option<i64>>, max: bool },
    MinMaxFloat { values: Vec<Option<f64>>, max: bool },
    MinMaxString { values: Vec<Option<String>>, max: bool },
    Avg { sums: Vec<f64>, counts: Vec<i64> },
    Distinct(Vec<HashSet<Box<[u8]>, RandomState>>),
}

/// How an argument column is read: its values cast once per batch.
enum Argument {
    None,
    Int(Int64Array),
    Float(Float64Array),
    Text(StringArray),
    /// Row-format encodings, and the column (for its validity).
    Encoded(arrow::row::Rows, ArrayRef),
}

struct WindowGroups {
    start: TimestampMs,
    index: HashMap<Box<[u8]>, u32, RandomState>,
    keys: Vec<Box<[u8]>>,
    /// The vnode of each group's key, kept so a snapshot needs no rehashing.
    vnodes: Vec<u16>,
    accumulators: Vec<Accumulators>,
}

/// See the module documentation.
pub struct WindowAggregate {
    spec: WindowAggregateSpec,
    key_converter: RowConverter,
    distinct_converters: Vec<Option<RowConverter>>,
    windows: BTreeMap<TimestampMs, WindowGroups>,
    watermark: TimestampMs,
    late_rows: Arc<AtomicU64>,
    input_types: Vec<DataType>,
    vnodes: u32,
    /// Placement hashes of the current batch's keys (reused buffer).
    hashes: Vec<u64>,
}

fn is_float(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Decimal128(..))
}

fn is_text(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

impl WindowAggregate {
    /// `input` is the schema of the rows the operator receives.
    /// `vnodes` is the pipeline's vnode count: snapshots split state by the vnode of each key.
    pub fn new(
        spec: WindowAggregateSpec,
        input: &SchemaRef,
        late_rows: Arc<AtomicU64>,
        vnodes: u32,
    ) -> Result<WindowAggregate, SluiceError> {
        let key_fields = spec.keys.iter().map(|&k| SortField::new(input.field(k).data_type().clone())).collect();
        let key_converter = RowConverter::new(key_fields)?;
        let mut distinct_converters = Vec::new();
        for aggregate in &spec.aggregates {
            let converter = match (aggregate.function, aggregate.argument) {
                (AggregateFunction::CountDistinct, Some(column)) => {
                    Some(RowConverter::new(vec![SortField::new(input.field(column).data_type().clone())])?)
                }
                _ => None,
            };
            distinct_converters.push(converter);
        }
        let input_types = input.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(WindowAggregate {
            spec,
            key_converter,
            distinct_converters,
            windows: BTreeMap::new(),
            watermark: i64::MIN,
            late_rows,
            input_types,
            vnodes,
            hashes: Vec::new(),
        })
    }

    fn new_accumulators(&self) -> Vec<Accumulators> {
        self.spec
            .aggregates
            .iter()
            .map(|aggregate| {
                let argument_type = aggregate.argument.map(|c| &self.input_types[c]);
                let max = aggregate.function == AggregateFunction::Max;
                match (aggregate.function, argument_type) {
                    (AggregateFunction::CountRows | AggregateFunction::Count, _) => Accumulators::Count(Vec::new()),
                    (AggregateFunction::CountDistinct, _) => Accumulators::Distinct(Vec::new()),
                    (AggregateFunction::Avg, _) => Accumulators::Avg { sums: Vec::new(), counts: Vec::new() },
                    (AggregateFunction::Sum, Some(t)) if is_float(t) => Accumulators::SumFloat(Vec::new()),
                    (AggregateFunction::Sum, _) => Accumulators::SumInt(Vec::new()),
                    (_, Some(t)) if is_float(t) => Accumulators::MinMaxFloat { values: Vec::new(), max },
                    (_, Some(t)) if is_text(t) => Accumulators::MinMaxString { values: Vec::new(), max },
                    _ => Accumulators::MinMaxInt { values: Vec::new(), max },
                }
            })
            .collect()
    }

    fn arguments(&self, rows: &RecordBatch) -> Result<Vec<Argument>, SluiceError> {
        let mut arguments = Vec::with_capacity(self.spec.aggregates.len());
        for (index, aggregate) in self.spec.aggregates.iter().enumerate() {
            let Some(column) = aggregate.argument else {
                arguments.push(Argument::None);
                continue;
            };
            let array = rows.column(column);
            let argument = if let Some(converter) = &self.distinct_converters[index] {
                Argument::Encoded(converter.convert_columns(std::slice::from_ref(array))?, Arc::clone(array))
            } else if aggregate.function == AggregateFunction::Count {
                Argument::Int(Int64Array::from_iter((0..array.len()).map(|i| array.is_valid(i).then_some(1))))
            } else if is_float(array.data_type()) || aggregate.function == AggregateFunction::Avg {
                Argument::Float(cast(array, &DataType::Float64)?.as_primitive::<Float64Type>().clone())
            } else if is_text(array.data_type()) {
                Argument::Text(cast(array, &DataType::Utf8)?.as_string::<i32>().clone())
            } else {
                Argument::Int(cast(array, &DataType::Int64)?.as_primitive::<Int64Type>().clone())
            };
            arguments.push(argument);
        }
        Ok(arguments)
    }

    fn emit_until(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        while let Some(entry) = self.windows.first_entry() {
            let end = *entry.key();
            if end - 1 > watermark {
                break;
            }
            let groups = entry.remove();
            self.emit(end, groups, out)?;
        }
        Ok(())
    }

    fn emit(&self, end: TimestampMs, groups: WindowGroups, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let count = groups.keys.len();
        if count == 0 {
            return Ok(());
        }
        let key_columns = if self.spec.keys.is_empty() {
            Vec::new()
        } else {
            let parser = self.key_converter.parser();
            self.key_converter.convert_rows(groups.keys.iter().map(|key| parser.parse(key)))?
        };
        let timestamp = |value: i64| -> ArrayRef { Arc::new(TimestampMillisecondArray::from(vec![value; count])) };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.spec.output.fields().len());
        for group in &self.spec.groups {
            columns.push(match group {
                GroupColumn::WindowStart => timestamp(groups.start),
                GroupColumn::WindowEnd => timestamp(end),
                GroupColumn::Key(index) => Arc::clone(&key_columns[*index]),
            });
        }
        for accumulators in groups.accumulators {
            columns.push(finish(accumulators));
        }
        for (column, field) in columns.iter_mut().zip(self.spec.output.fields()) {
            if column.data_type() != field.data_type() {
                *column = cast(column, field.data_type())?;
            }
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.spec.output), columns)?;
        let mut offset = 0;
        while offset < count {
            let length = self.spec.batch_size.min(count - offset);
            out.push(Message::Data(Batch::inserts(rows.slice(offset, length))));
            offset += length;
        }
        Ok(())
    }
}

fn finish(accumulators: Accumulators) -> ArrayRef {
    match accumulators {
        Accumulators::Count(counts) => Arc::new(Int64Array::from(counts)),
        Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => Arc::new(Int64Array::from(values)),
        Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => {
            Arc::new(Float64Array::from(values))
        }
        Accumulators::MinMaxString { values, .. } => Arc::new(StringArray::from(values)),
        Accumulators::Avg { sums, counts } => Arc::new(Float64Array::from_iter(
            sums.iter().zip(&counts).map(|(sum, count)| (*count > 0).then(|| sum / *count as f64)),
        )),
        Accumulators::Distinct(sets) => Arc::new(Int64Array::from_iter_values(sets.iter().map(|s| s.len() as i64))),
    }
}

impl Accumulators {
    fn push_group(&mut self) {
        match self {
            Accumulators::Count(counts) => counts.push(0),
            Accumulators::SumInt(values) | Accumulators::MinMaxInt { values, .. } => values.push(None),
            Accumulators::SumFloat(values) | Accumulators::MinMaxFloat { values, .. } => values.push(None),
            Accumulators::MinMaxString { values, .. } => values.push(None),
            Accumulators::Avg { sums, counts } => {
                sums.push(0.0);
                counts.push(0);
            }
            Accumulators::Distinct(sets) => sets.push(HashSet::with_hasher(RandomState::with_seed(0))),
        }
    }

    fn update(&mut self, group: usize, argument: &Argument, row: usize) {
        match (self, argument) {
            (Accumulators::Count(counts), Argument::None) => counts[group] += 1,
            (Accumulators::Count(counts), Argument::Int(values)) => counts[group] += i64::from(values.is_valid(row)),
            (Accumulators::SumInt(sums), Argument::Int(values)) if values.is_valid(row) => {
                let sum = sums[group].get_or_insert(0);
                *sum = sum.wrapping_add(values.value(row));
            }
            (Accumulators::SumFloat(sums), Argument::Float(values)) if values.is_valid(row) => {
                *sums[group].get_or_insert(0.0) += values.value(row);
            }
            (Accumulators::MinMaxInt { values, max }, Argument::Int(input)) if input.is_valid(row) => {
                let value = input.value(row);
                let slot = &mut values[group];
                if slot.is_none_or(|current| if *max { value > current } else { value < current }) {
                    *slot = Some(value);
                }
            }
            (Accumulators::MinMaxFloat { values, max }, Argument::Float(input)) if input.is_valid(row) => {
                let value = input.value(row);
                let slot = &mut values[group];
                if slot.is_none_or(|current| if *max { value > current } else { value < current }) {
                    *slot = Some(value);
                }
            }
            (Accumulators::MinMaxString { values, max }, Argument::Text(input)) if input.is_valid(row) => {
                let value = input.value(row);
                let slot = &mut values[group];
                let replace = match slot.as_deref() {
                    None => true,
                    Some(current) => {
                        if *max {
                            value > current
                        } else {
                            value < current
                        }
                    }
                };
                if replace {
                    *slot = Some(value.to_string());
                }
            }
            (Accumulators::Avg { sums, counts }, Argument::Float(values)) if values.is_valid(row) => {
                sums[group] += values.value(row);
                counts[group] += 1;
            }
            // A NULL argument is not counted (COUNT(DISTINCT) skips NULLs).
            (Accumulators::Distinct(sets), Argument::Encoded(rows, column)) if column.is_valid(row) => {
                let value = rows.row(row);
                if !sets[group].contains(value.as_ref()) {
                    sets[group].insert(value.as_ref().into());
                }
            }
            _ => {}
        }
    }
}

impl Operator for WindowAggregate {
    fn name(&self) -> &str {
        "window_aggregate"
    }

    fn on_data(&mut self, batch: Batch, _out: &mut Vec<Message>) -> Result<(), SluiceError> {
        assert!(batch.is_append_only(), "the planner rejects window aggregates over updating input");
        assert!(self.vnodes <= 1 << 16, "vnodes fit in 16 bits");
        let rows = &batch.rows;
        if !self.spec.keys.is_empty() {
            crate::partition::key_hashes(rows, &self.spec.keys, &mut self.hashes)?;
        }
        let starts = rows.column(self.spec.window_start).as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        let ends = rows.column(self.spec.window_end).as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        let key_columns: Vec<ArrayRef> = self.spec.keys.iter().map(|&k| Arc::clone(rows.column(k))).collect();
        let keys = self.key_converter.convert_columns(&key_columns)?;
        let arguments = self.arguments(rows)?;
        let mut late = 0u64;
        let template = self.new_accumulators();
        let mut template = Some(template);
        for row in 0..rows.num_rows() {
            let end = ends.value(row);
            if end - 1 <= self.watermark {
                late += 1;
                continue;
            }
            let window = match self.windows.get_mut(&end) {
                Some(window) => window,
                None => {
                    let accumulators = template.take().unwrap_or_else(|| self.new_accumulators());
                    let groups = WindowGroups {
                        start: starts.value(row),
                        index: HashMap::with_hasher(RandomState::with_seed(0)),
                        keys: Vec::new(),
                        vnodes: Vec::new(),
                        accumulators,
                    };
                    self.windows.entry(end).or_insert(groups)
                }
            };
            // Arrow's row format has no rows when there are no key columns: all rows share
            // the empty key.
            let key: &[u8] = if self.spec.keys.is_empty() { &[] } else { keys.row(row).data() };
            let group = match window.index.get(key) {
                Some(group) => *group as usize,
                None => {
                    let group = window.keys.len();
                    let owned: Box<[u8]> = key.into();
                    window.index.insert(owned.clone(), group as u32);
                    window.keys.push(owned);
                    let vnode =
                        if self.spec.keys.is_empty() { 0 } else { vnode::of_hash(self.hashes[row], self.vnodes) };
                    window.vnodes.push(vnode as u16);
                    window.accumulators.iter_mut().for_each(Accumulators::push_group);
                    group
                }
            };
            for (accumulators, argument) in window.accumulators.iter_mut().zip(&arguments) {
                accumulators.update(group, argument, row);
            }
        }
        if late > 0 {
            self.late_rows.fetch_add(late, Ordering::Relaxed);
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: TimestampMs, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        if watermark > self.watermark {
            self.watermark = watermark;
            self.emit_until(watermark, out)?;
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        self.emit_until(i64::MAX, out)?;
        out.push(Message::EndOfData);
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
        state::snapshot(self)
    }

    fn restore(&mut self, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
        state::restore(self, blobs)
    }
}

/// The output type of each aggregate over an argument of type `argument` (Flink's and
/// DataFusion's: COUNT → BIGINT, AVG → DOUBLE, SUM of integers → BIGINT, of floats → DOUBLE,
/// MIN/MAX → the argument's type).
pub fn output_type(function: AggregateFunction, argument: Option<&DataType>) -> DataType {
    match (function, argument) {
        (AggregateFunction::CountRows | AggregateFunction::Count | AggregateFunction::CountDistinct, _) => {
            DataType::Int64
        }
        (AggregateFunction::Avg, _) => DataType::Float64,
        (AggregateFunction::Sum, Some(t)) if is_float(t) => DataType::Float64,
        (AggregateFunction::Sum, _) => DataType::Int64,
        (_, Some(DataType::Timestamp(unit, zone))) => DataType::Timestamp(*unit, zone.clone()),
        (_, Some(t)) => t.clone(),
        (_, None) => DataType::Timestamp(TimeUnit::Millisecond, None),
    }
}
