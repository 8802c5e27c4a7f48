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
//!   positive count. Over an append-only input only the extreme is kept, and an integer
//!   or float one inline ([`Accumulator::OneInt`], [`Accumulator::OneFloat`]) while the
//!   multiset is boxed, so that every accumulator takes 24 bytes (NEXMark q17 keeps eight
//!   per group, in 600,000 groups);
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
    Int(Counts<i64>),
    Float(Counts<OrderedFloat>),
    Text(Counts<Arc<str>>),
}

/// Values with their weighted counts, in value order: one value inline, more in a
/// `BTreeMap`. MIN or MAX over an append-only input holds only its extreme, in each of
/// possibly millions of groups (NEXMark q4's MAX per auction), where a map would
/// allocate a node of eleven entries for the one. The map is boxed so that an
/// accumulator stays as small as before (every accumulator of a group has its size).
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::box_collection, reason = "the box keeps the enum, and so each accumulator, small")]
pub(super) enum Counts<K> {
    One(Option<(K, i64)>),
    Many(Box<BTreeMap<K, i64>>),
}

impl<K: Ord> Default for Counts<K> {
    fn default() -> Counts<K> {
        Counts::One(None)
    }
}

impl<K: Ord> Counts<K> {
    /// Entries of `map` (counts not 0).
    pub(super) fn from_map(mut map: BTreeMap<K, i64>) -> Counts<K> {
        if map.len() > 1 { Counts::Many(Box::new(map)) } else { Counts::One(map.pop_first()) }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Counts::One(one) => usize::from(one.is_some()),
            Counts::Many(map) => map.len(),
        }
    }

    /// The entries in value order.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &i64)> {
        let (one, many) = match self {
            Counts::One(one) => (one.as_ref(), None),
            Counts::Many(map) => (None, Some(map)),
        };
        one.map(|(key, count)| (key, count)).into_iter().chain(many.into_iter().flat_map(|map| map.iter()))
    }

    /// Adds `weight` to the count of `key` (made by `owned` only if it is new); an entry
    /// whose count reaches 0 is removed.
    fn add<Q>(&mut self, key: &Q, weight: i64, owned: impl FnOnce() -> K)
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            Counts::One(None) => {
                if weight != 0 {
                    *self = Counts::One(Some((owned(), weight)));
                }
            }
            Counts::One(Some((held, count))) if <K as std::borrow::Borrow<Q>>::borrow(held) == key => {
                *count += weight;
                if *count == 0 {
                    *self = Counts::One(None);
                }
            }
            Counts::One(Some(_)) => {
                if weight != 0 {
                    let Counts::One(Some((held, count))) = std::mem::take(self) else { unreachable!("one entry") };
                    *self = Counts::Many(Box::new(BTreeMap::from([(held, count), (owned(), weight)])));
                }
            }
            Counts::Many(map) => match map.get_mut(key) {
                Some(count) => {
                    *count += weight;
                    if *count == 0 {
                        map.remove(key);
                    }
                }
                None => add(map, owned(), weight),
            },
        }
    }

    /// Keeps only the greatest entry (`max`) or the least, inline.
    fn keep_only_extreme(&mut self, max: bool) {
        if let Counts::Many(map) = self {
            let kept = if max { map.pop_last() } else { map.pop_first() };
            *self = Counts::One(kept);
        }
    }
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
    /// MIN or MAX: the multiset of values (boxed: a general MIN/MAX is rare enough to
    /// pay an allocation, and every accumulator is as large as the largest variant).
    Extreme {
        values: Box<Multiset>,
        max: bool,
    },
    /// MIN or MAX of integers over an append-only input: the extreme and how many rows
    /// had it (`count` 0: none yet), as a multiset trimmed to its extreme would hold.
    OneInt {
        value: i64,
        count: i64,
        max: bool,
    },
    /// The same over floats.
    OneFloat {
        value: f64,
        count: i64,
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
fn extreme<K: Ord>(map: &Counts<K>, max: bool) -> Option<&K> {
    if max {
        map.iter().rev().find(|(_, count)| **count > 0).map(|(key, _)| key)
    } else {
        map.iter().find(|(_, count)| **count > 0).map(|(key, _)| key)
    }
}

impl Accumulator {
    /// About the bytes of memory it holds beyond itself: a MIN or MAX's values (a
    /// B-tree's entry about 40 bytes; a text value 64 with its bytes).
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Accumulator::Extreme { values, .. } => {
                let per_value = match values.as_ref() {
                    Multiset::Int(_) | Multiset::Float(_) => 40,
                    Multiset::Text(_) => 64,
                };
                let len = match values.as_ref() {
                    Multiset::Int(counts) => counts.len(),
                    Multiset::Float(counts) => counts.len(),
                    Multiset::Text(counts) => counts.len(),
                };
                std::mem::size_of::<Multiset>() + per_value * len
            }
            _ => 0,
        }
    }

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
            (_, Some(ValueKind::Float)) => {
                Accumulator::Extreme { values: Box::new(Multiset::Float(Counts::default())), max }
            }
            (_, Some(ValueKind::Text)) => {
                Accumulator::Extreme { values: Box::new(Multiset::Text(Counts::default())), max }
            }
            _ => Accumulator::Extreme { values: Box::new(Multiset::Int(Counts::default())), max },
        }
    }

    /// Over an append-only input nothing is retracted, so MIN and MAX keep only the
    /// extreme value: integers and floats inline from now on, text as the multiset of
    /// one entry; other accumulators are unchanged.
    pub fn keep_only_extreme(&mut self) {
        let Accumulator::Extreme { values, max } = self else { return };
        let max = *max;
        let one = |entry: Option<(&i64, &i64)>| entry.map_or((0, 0), |(v, c)| (*v, *c));
        match values.as_mut() {
            Multiset::Int(map) => {
                map.keep_only_extreme(max);
                let (value, count) = one(map.iter().next());
                *self = Accumulator::OneInt { value, count, max };
            }
            Multiset::Float(map) => {
                map.keep_only_extreme(max);
                let (value, count) = map.iter().next().map_or((0.0, 0), |(v, c)| (v.0, *c));
                *self = Accumulator::OneFloat { value, count, max };
            }
            Multiset::Text(map) => map.keep_only_extreme(max),
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
            (Accumulator::Extreme { values: multiset, .. }, argument) => match (multiset.as_mut(), argument) {
                (Multiset::Int(map), Argument::Int(values)) if values.is_valid(row) => {
                    let value = values.value(row);
                    map.add(&value, weight, || value);
                }
                (Multiset::Float(map), Argument::Float(values)) if values.is_valid(row) => {
                    let value = OrderedFloat(values.value(row));
                    map.add(&value, weight, || value);
                }
                (Multiset::Text(map), Argument::Text(values)) if values.is_valid(row) => {
                    // A value already held is counted without copying it.
                    let value = values.value(row);
                    map.add(value, weight, || value.into());
                }
                _ => {}
            },
            (Accumulator::OneInt { value, count, max }, Argument::Int(values)) if values.is_valid(row) => {
                keep_one(value, count, *max, values.value(row), weight, i64::cmp);
            }
            (Accumulator::OneFloat { value, count, max }, Argument::Float(values)) if values.is_valid(row) => {
                keep_one(value, count, *max, values.value(row), weight, f64::total_cmp);
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
            Accumulator::Extreme { values, max } => match values.as_ref() {
                Multiset::Int(map) => extreme(map, *max).map_or(Value::Null, |v| Value::Int(*v)),
                Multiset::Float(map) => extreme(map, *max).map_or(Value::Null, |v| Value::Float(v.0)),
                Multiset::Text(map) => extreme(map, *max).map_or(Value::Null, |v| Value::Text(Arc::clone(v))),
            },
            Accumulator::OneInt { value, count, .. } => {
                if *count > 0 {
                    Value::Int(*value)
                } else {
                    Value::Null
                }
            }
            Accumulator::OneFloat { value, count, .. } => {
                if *count > 0 {
                    Value::Float(*value)
                } else {
                    Value::Null
                }
            }
            Accumulator::Distinct { positive, .. } => Value::Int(*positive),
        }
    }

    /// The kind of the result column (before the cast to the declared output type).
    pub fn result_kind(&self) -> ValueKind {
        match self {
            Accumulator::SumFloat { .. } | Accumulator::AvgFloat { .. } | Accumulator::OneFloat { .. } => {
                ValueKind::Float
            }
            Accumulator::Extreme { values, .. } => match values.as_ref() {
                Multiset::Int(_) => ValueKind::Int,
                Multiset::Float(_) => ValueKind::Float,
                Multiset::Text(_) => ValueKind::Text,
            },
            _ => ValueKind::Int,
        }
    }
}

/// Adds `weight` rows of `new` to an extreme kept alone (`held`, in `count` rows; none
/// while `count` is 0), as a multiset trimmed to its extreme after each addition would:
/// an equal value adds to the count, a more extreme one replaces it.
fn keep_one<K: Copy>(
    held: &mut K,
    count: &mut i64,
    max: bool,
    new: K,
    weight: i64,
    compare: impl Fn(&K, &K) -> std::cmp::Ordering,
) {
    use std::cmp::Ordering;
    let ordering = compare(&new, held);
    if *count == 0 || (ordering == Ordering::Greater) == max && ordering != Ordering::Equal {
        if weight != 0 {
            (*held, *count) = (new, weight);
        }
    } else if ordering == Ordering::Equal {
        *count += weight;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_accumulator_is_no_larger_than_with_a_map_of_counts() {
        // Each group holds one per aggregate: a MIN/MAX's multiset is boxed, an
        // append-only one's single extreme inline, so neither grows them.
        assert_eq!(std::mem::size_of::<Accumulator>(), 24);
    }

    proptest! {
        /// Counts hold what a map of counts holds, whether one value is inline or many
        /// are in a map, through additions, removals and trims to the extreme.
        #[test]
        fn counts_hold_what_a_map_of_counts_holds(
            steps in prop::collection::vec((0i64..4, -2i64..=2, 0u8..8), 0..60),
        ) {
            let mut counts = Counts::default();
            let mut reference: BTreeMap<i64, i64> = BTreeMap::new();
            for (value, weight, trim) in steps {
                if trim == 0 {
                    counts.keep_only_extreme(true);
                    while reference.len() > 1 {
                        reference.pop_first();
                    }
                } else {
                    counts.add(&value, weight, || value);
                    add(&mut reference, value, weight);
                }
                let held: Vec<(i64, i64)> = counts.iter().map(|(v, c)| (*v, *c)).collect();
                let expected: Vec<(i64, i64)> = reference.iter().map(|(v, c)| (*v, *c)).collect();
                prop_assert_eq!(held, expected);
                prop_assert_eq!(counts.len(), reference.len());
                prop_assert_eq!(extreme(&counts, true), reference.iter().rev().find(|(_, c)| **c > 0).map(|(v, _)| v));
                if trim == 0 {
                    prop_assert!(matches!(counts, Counts::One(_)), "a trimmed multiset holds its value inline");
                }
            }
        }
    }
}
