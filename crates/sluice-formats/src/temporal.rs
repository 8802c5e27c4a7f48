//! The range of dates and times the formats read and write.
//!
//! A timestamp is read only within the years 0000-9999 (UTC): the text forms have four
//! year digits, and every timestamp read can be written back and read again. A value
//! outside is a bad row ([`first_outside_years`], checked on every decoded batch, so
//! text with an offset that crosses the range, like `0000-01-01T00:00:00+01:00`, is
//! caught too).
//!
//! When encoding, a date or time value that cannot be formatted at all (outside what
//! chrono represents, or a time of day past 24 hours: a query can compute one) is a
//! typed error ([`first_unformattable`]), never text such as `ERROR: Cast error...`,
//! which Arrow's formatters otherwise write in its place. Both checks look at a
//! column's minimum and maximum first, so a batch in range costs two passes of
//! min/max.

use arrow::array::{Array, ArrayRef, ArrowPrimitiveType, AsArray, PrimitiveArray};
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Time32MillisecondType, Time32SecondType, Time64MicrosecondType,
    Time64NanosecondType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use arrow::temporal_conversions as convert;

/// 0000-01-01T00:00:00Z in seconds since the Unix epoch.
const YEAR_0000_SECONDS: i64 = -62_167_219_200;
/// 10000-01-01T00:00:00Z in seconds since the Unix epoch.
const YEAR_10000_SECONDS: i64 = 253_402_300_800;

/// The smallest and largest value of a timestamp of `unit` within the years 0000-9999.
pub(crate) fn timestamp_bounds(unit: TimeUnit) -> (i64, i64) {
    let per_second: i64 = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        // i64 nanoseconds span the years 1677-2262, all inside.
        TimeUnit::Nanosecond => return (i64::MIN, i64::MAX),
    };
    (YEAR_0000_SECONDS * per_second, YEAR_10000_SECONDS * per_second - 1)
}

/// The first row of a timestamp `column` outside the years 0000-9999, and its value.
pub(crate) fn first_outside_years(column: &ArrayRef) -> Option<(usize, i64)> {
    let DataType::Timestamp(unit, _) = column.data_type() else { return None };
    let (min, max) = timestamp_bounds(*unit);
    match unit {
        TimeUnit::Second => first_where::<TimestampSecondType>(column, |v| v < min || v > max),
        TimeUnit::Millisecond => first_where::<TimestampMillisecondType>(column, |v| v < min || v > max),
        TimeUnit::Microsecond => first_where::<TimestampMicrosecondType>(column, |v| v < min || v > max),
        TimeUnit::Nanosecond => None,
    }
}

/// Whether an Int64 or timestamp `column` holds i64::MIN or i64::MAX.
pub(crate) fn holds_i64_extreme(column: &ArrayRef) -> bool {
    let extreme = |min: Option<i64>, max: Option<i64>| min == Some(i64::MIN) || max == Some(i64::MAX);
    macro_rules! check {
        ($type:ty) => {
            column
                .as_primitive_opt::<$type>()
                .is_some_and(|values| extreme(arrow::compute::min(values), arrow::compute::max(values)))
        };
    }
    match column.data_type() {
        DataType::Int64 => check!(arrow::datatypes::Int64Type),
        DataType::Timestamp(TimeUnit::Second, _) => check!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => check!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => check!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => check!(TimestampNanosecondType),
        _ => false,
    }
}

/// The first row of a date or time `column` that cannot be formatted, and its value.
pub(crate) fn first_unformattable(column: &ArrayRef) -> Option<(usize, i64)> {
    match column.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            first_where::<TimestampSecondType>(column, |v| convert::timestamp_s_to_datetime(v).is_none())
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            first_where::<TimestampMillisecondType>(column, |v| convert::timestamp_ms_to_datetime(v).is_none())
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            first_where::<TimestampMicrosecondType>(column, |v| convert::timestamp_us_to_datetime(v).is_none())
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            first_where::<TimestampNanosecondType>(column, |v| convert::timestamp_ns_to_datetime(v).is_none())
        }
        DataType::Date32 => first_where::<Date32Type>(column, |v| convert::date32_to_datetime(v).is_none()),
        DataType::Date64 => first_where::<Date64Type>(column, |v| convert::date64_to_datetime(v).is_none()),
        DataType::Time32(TimeUnit::Second) => {
            first_where::<Time32SecondType>(column, |v| convert::time32s_to_time(v).is_none())
        }
        DataType::Time32(TimeUnit::Millisecond) => {
            first_where::<Time32MillisecondType>(column, |v| convert::time32ms_to_time(v).is_none())
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            first_where::<Time64MicrosecondType>(column, |v| convert::time64us_to_time(v).is_none())
        }
        DataType::Time64(TimeUnit::Nanosecond) => {
            first_where::<Time64NanosecondType>(column, |v| convert::time64ns_to_time(v).is_none())
        }
        _ => None,
    }
}

/// The first non-null row whose value is `bad`, checking the minimum and maximum
/// first: `bad` must hold for the values below a bound or above another (a range).
fn first_where<T>(column: &ArrayRef, bad: impl Fn(T::Native) -> bool) -> Option<(usize, i64)>
where
    T: ArrowPrimitiveType,
    T::Native: Into<i64>,
{
    let values: &PrimitiveArray<T> = column.as_primitive_opt::<T>()?;
    let (min, max) = (arrow::compute::min(values)?, arrow::compute::max(values)?);
    if !bad(min) && !bad(max) {
        return None;
    }
    (0..values.len())
        .find(|row| values.is_valid(*row) && bad(values.value(*row)))
        .map(|row| (row, values.value(row).into()))
}

/// Whether `year` of the proleptic Gregorian calendar has a 29 February.
pub(crate) fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// The days of `month` (1-12) in `year` of the proleptic Gregorian calendar.
pub(crate) fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to `year`-`month`-`day` (proleptic Gregorian, years 0-9999):
/// the civil-days algorithm counting from 1 March, so that a leap day ends a year.
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Date32Array, Time32SecondArray, TimestampMillisecondArray, TimestampNanosecondArray};

    use super::*;

    #[test]
    fn timestamps_are_bounded_by_the_years_0000_to_9999() {
        let (min, max) = timestamp_bounds(TimeUnit::Millisecond);
        assert_eq!(
            convert::timestamp_ms_to_datetime(min).map(|t| t.to_string()).as_deref(),
            Some("0000-01-01 00:00:00")
        );
        assert_eq!(
            convert::timestamp_ms_to_datetime(max).map(|t| t.to_string()).as_deref(),
            Some("9999-12-31 23:59:59.999")
        );
        let column: ArrayRef =
            Arc::new(TimestampMillisecondArray::from(vec![Some(0), None, Some(max + 1), Some(min - 1)]));
        assert_eq!(first_outside_years(&column), Some((2, max + 1)));
        let inside: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![min, max]));
        assert_eq!(first_outside_years(&inside), None);
        let nanos: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![i64::MIN, i64::MAX]));
        assert_eq!(first_outside_years(&nanos), None);
    }

    #[test]
    fn unformattable_values_are_found() {
        let column: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![Some(0), None, Some(i64::MAX)]));
        assert_eq!(first_unformattable(&column), Some((2, i64::MAX)));
        let dates: ArrayRef = Arc::new(Date32Array::from(vec![0, i32::MAX]));
        assert_eq!(first_unformattable(&dates), Some((1, i64::from(i32::MAX))));
        let times: ArrayRef = Arc::new(Time32SecondArray::from(vec![0, 86_399, 86_400]));
        assert_eq!(first_unformattable(&times), Some((2, 86_400)));
        let empty: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![None::<i64>]));
        assert_eq!(first_unformattable(&empty), None);
    }
}
