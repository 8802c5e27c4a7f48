//! Accumulators that take retractions: one per (group, aggregate) of the group aggregate.
//!
//! Each accepts a value with a weight (+1 insert, -1 retraction, or any multiplicity)
//! and can say its current result at any time:
//! - COUNT(*) and COUNT(x): the weighted count;
//! - SUM and AVG: the weighted sum and the weighted count of non-NULL values (the result
//!   is NULL when that count is 0); AVG of an integer type is the integer quotient
//!   (truncated toward zero, as Flink's `AVG` of `BIGINT`);
//! - MIN and MAX: the multiset of values (value → weighted count), since a retraction of
//!   the extreme needs the next one; the result is the least or greatest value of
//!   positive count;
//! - COUNT(DISTINCT x): the number of values of positive count; the values themselves
//!   are in the group's [`super::distinct::DistinctValues`] of the argument column,
//!   shared by every COUNT(DISTINCT) of that column, which keeps this number up to date.
//!
//! Integer sums wrap on overflow, as in the window aggregate (and in Flink, whose BIGINT
//! arithmetic is Java's); a float sum that took retractions may differ from a
//! recomputation in its last bits.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray};

use super::super::AggregateFunction;

/// The current result of one aggregate of one group.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Null,
    Int(i64),
    Float(f64),
    /// Shared with the MIN/MAX multiset it comes from (no copy per result).
    Text(Arc<str>),
}

impl Value {
    /// Equality for "did the result change": floats by their bits (NaN equals itself).
    pub fn same(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            _ => self == other,
        }
    }
}

/// The kind of values an argument column is read as (after a cast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueKind {
    Int,
    Float,
    Text,
}

/// An `f64` ordered by `total_cmp`, for the MIN/MAX multiset.
#[derive(Debug, Clone, Copy)]
pub(super) struct OrderedFloat(pub f64);

impl PartialEq for OrderedFloat {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for OrderedFloat {}
impl PartialOrd for OrderedFloat {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrderedFloat {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The values of MIN or MAX with their weighted counts (entries of count 0 are removed).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Multiset {
    Int(BTreeMap<i64, i64>),
    Float(BTreeMap<OrderedFloat, i64>),
    Text(BTreeMap<Arc<str>, i64>),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Accumulator {
    Count(i64),
    SumInt {
        sum: i64,
        count: i64,
    },
    SumFloat {
        sum: f64,
        count: i64,
    },
    AvgInt {
        sum: i64,
        count: i64,
    },
    AvgFloat {
        sum: f64,
        count: i64,
    },
    Extreme {
        values: Multiset,
        max: bool,
    },
    Distinct {
        /// How many values have a positive count: the result, kept as counts change
        /// (counting the values per result made COUNT(DISTINCT) quadratic in them).
        positive: i64,
    },
}

/// An argument column of one batch, read once.
pub(super) enum Argument {
    /// COUNT(*): no column.
    None,
    /// COUNT(x): only whether each value is present.
    Present(ArrayRef),
    Int(Int64Array),
    Float(Float64Array),
    Text(StringArray),
}

fn add<K: Ord>(map: &mut BTreeMap<K, i64>, key: K, weight: i64) {
    match map.entry(key) {
        Entry::Occupied(mut entry) => {
            *entry.get_mut() += weight;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
        Entry::Vacant(entry) => {
            if weight != 0 {
                entry.insert(weight);
            }
        }
    }
}

/// The first entry of positive count, from the low end or the high end.
fn extreme<K>(map: &BTreeMap<K, i64>, max: bool) -> Option<&K> {
    if max {
        map.iter().rev().find(|(_, count)| **count > 0).map(|(key, _)| key)
    } else {
        map.iter().find(|(_, count)| **count > 0).map(|(key, _)| key)
    }
}

impl Accumulator {
    /// The empty accumulator of `function` over values of `kind` (None for COUNT(*)).
    pub fn new(function: AggregateFunction, kind: Option<ValueKind>) -> Accumulator {
        let max = function == AggregateFunction::Max;
        match (function, kind) {
            (AggregateFunction::CountRows | AggregateFunction::Count, _) => Accumulator::Count(0),
            (AggregateFunction::CountDistinct, _) => Accumulator::Distinct { positive: 0 },
            (AggregateFunction::Sum, Some(ValueKind::Float)) => Accumulator::SumFloat { sum: 0.0, count: 0 },
            (AggregateFunction::Sum, _) => Accumulator::SumInt { sum: 0, count: 0 },
            (AggregateFunction::Avg, Some(ValueKind::Float)) => Accumulator::AvgFloat { sum: 0.0, count: 0 },
            (AggregateFunction::Avg, _) => Accumulator::AvgInt { sum: 0, count: 0 },
            (_, Some(ValueKind::Float)) => Accumulator::Extreme { values: Multiset::Float(BTreeMap::new()), max },
            (_, Some(ValueKind::Text)) => Accumulator::Extreme { values: Multiset::Text(BTreeMap::new()), max },
            _ => Accumulator::Extreme { values: Multiset::Int(BTreeMap::new()), max },
        }
    }

    /// Over an append-only input nothing is retracted, so MIN and MAX keep only the
    /// extreme value (the multiset of one entry); other accumulators are unchanged.
    pub fn keep_only_extreme(&mut self) {
        fn trim<K: Ord>(map: &mut BTreeMap<K, i64>, max: bool) {
            while map.len() > 1 {
                if max {
                    map.pop_first()
                } else {
                    map.pop_last()
                };
            }
        }
        if let Accumulator::Extreme { values, max } = self {
            match values {
                Multiset::Int(map) => trim(map, *max),
                Multiset::Float(map) => trim(map, *max),
                Multiset::Text(map) => trim(map, *max),
            }
        }
    }

    /// Adds row `row` of `argument` with `weight` (negative: a retraction). A NULL
    /// argument changes nothing (COUNT(*) counts every row); COUNT(DISTINCT) changes
    /// through its column's shared values instead.
    pub fn update(&mut self, argument: &Argument, row: usize, weight: i64) {
        match (self, argument) {
            (Accumulator::Count(count), Argument::None) => *count += weight,
            (Accumulator::Count(count), Argument::Present(column)) if column.is_valid(row) => *count += weight,
            (Accumulator::SumInt { sum, count } | Accumulator::AvgInt { sum, count }, Argument::Int(values))
                if values.is_valid(row) =>
            {
                *sum = sum.wrapping_add(values.value(row).wrapping_mul(weight));
                *count += weight;
            }
            (Accumulator::SumFloat { sum, count } | Accumulator::AvgFloat { sum, count }, Argument::Float(values))
                if values.is_valid(row) =>
            {
                *sum += values.value(row) * weight as f64;
                *count += weight;
            }
            (Accumulator::Extreme { values: Multiset::Int(map), .. }, Argument::Int(values))
                if values.is_valid(row) =>
            {
                add(map, values.value(row), weight);
            }
            (Accumulator::Extreme { values: Multiset::Float(map), .. }, Argument::Float(values))
                if values.is_valid(row) =>
            {
                add(map, OrderedFloat(values.value(row)), weight);
            }
            (Accumulator::Extreme { values: Multiset::Text(map), .. }, Argument::Text(values))
                if values.is_valid(row) =>
            {
                // A value already held is counted without copying it.
                let value = values.value(row);
                match map.get_mut(value) {
                    Some(count) => {
                        *count += weight;
                        if *count == 0 {
                            map.remove(value);
                        }
                    }
                    None => add(map, value.into(), weight),
                }
            }
            _ => {}
        }
    }

    /// The current result.
    pub fn value(&self) -> Value {
        match self {
            Accumulator::Count(count) => Value::Int(*count),
            Accumulator::SumInt { sum, count } => {
                if *count > 0 {
                    Value::Int(*sum)
                } else {
                    Value::Null
                }
            }
            Accumulator::SumFloat { sum, count } => {
                if *count > 0 {
                    Value::Float(*sum)
                } else {
                    Value::Null
                }
            }
            Accumulator::AvgInt { sum, count } => {
                if *count > 0 {
                    Value::Int(sum.wrapping_div(*count))
                } else {
                    Value::Null
                }
            }
            Accumulator::AvgFloat { sum, count } => {
                if *count > 0 {
                    Value::Float(sum / *count as f64)
                } else {
                    Value::Null
                }
            }
            Accumulator::Extreme { values: Multiset::Int(map), max } => {
                extreme(map, *max).map_or(Value::Null, |v| Value::Int(*v))
            }
            Accumulator::Extreme { values: Multiset::Float(map), max } => {
                extreme(map, *max).map_or(Value::Null, |v| Value::Float(v.0))
            }
            Accumulator::Extreme { values: Multiset::Text(map), max } => {
                extreme(map, *max).map_or(Value::Null, |v| Value::Text(Arc::clone(v)))
            }
            Accumulator::Distinct { positive, .. } => Value::Int(*positive),
        }
    }

    /// The kind of the result column (before the cast to the declared output type).
    pub fn result_kind(&self) -> ValueKind {
        match self {
            Accumulator::SumFloat { .. }
            | Accumulator::AvgFloat { .. }
            | Accumulator::Extreme { values: Multiset::Float(_), .. } => ValueKind::Float,
            Accumulator::Extreme { values: Multiset::Text(_), .. } => ValueKind::Text,
            _ => ValueKind::Int,
        }
    }
}

/// The results of one aggregate for many rows, as an Arrow column of `kind`.
pub(super) fn column<'a>(kind: ValueKind, values: impl Iterator<Item = &'a Value>) -> ArrayRef {
    match kind {
        ValueKind::Int => Arc::new(Int64Array::from_iter(values.map(|v| match v {
            Value::Int(v) => Some(*v),
            _ => None,
        }))),
        ValueKind::Float => Arc::new(Float64Array::from_iter(values.map(|v| match v {
            Value::Float(v) => Some(*v),
            _ => None,
        }))),
        ValueKind::Text => Arc::new(StringArray::from_iter(values.map(|v| match v {
            Value::Text(v) => Some(v.as_ref()),
            _ => None,
        }))),
    }
}
