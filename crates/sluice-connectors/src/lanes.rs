//! What the lanes of every source share: how many bad rows are logged in full, a
//! batch's largest event time (its watermark's ground), and durations as the
//! milliseconds that positions and watermarks hold.

use std::time::Duration;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use sluice_types::TimestampMs;

/// Bad rows of one source logged in full; later ones are only counted.
pub const LOGGED_BAD_ROWS: u64 = 5;

/// The largest value of a timestamp column, in ms; `None` when it has no value.
pub(crate) fn max_timestamp_ms(column: &ArrayRef) -> Option<TimestampMs> {
    let DataType::Timestamp(unit, _) = column.data_type() else { return None };
    if column.len() == column.null_count() {
        return None;
    }
    match unit {
        TimeUnit::Second => arrow::compute::max(column.as_primitive_opt::<TimestampSecondType>()?)
            .map(|seconds| seconds.saturating_mul(1000)),
        TimeUnit::Millisecond => arrow::compute::max(column.as_primitive_opt::<TimestampMillisecondType>()?),
        TimeUnit::Microsecond => arrow::compute::max(column.as_primitive_opt::<TimestampMicrosecondType>()?)
            .map(|micros| micros.div_euclid(1000)),
        TimeUnit::Nanosecond => arrow::compute::max(column.as_primitive_opt::<TimestampNanosecondType>()?)
            .map(|nanos| nanos.div_euclid(1_000_000)),
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn timestamps_of_every_unit_become_milliseconds() {
        use arrow::array::{TimestampMicrosecondArray, TimestampSecondArray};
        let seconds: ArrayRef = Arc::new(TimestampSecondArray::from(vec![Some(3), None, Some(5)]));
        assert_eq!(max_timestamp_ms(&seconds), Some(5_000));
        let micros: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![-1_500, -2_500]));
        assert_eq!(max_timestamp_ms(&micros), Some(-2));
        let empty: ArrayRef = Arc::new(TimestampSecondArray::from(vec![None::<i64>]));
        assert_eq!(max_timestamp_ms(&empty), None);
    }
}
