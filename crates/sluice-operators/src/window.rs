//! Window assignment for Flink's window table functions.
//!
//! `TUMBLE(TABLE t, DESCRIPTOR(ts), size)` puts each row in the one window
//! `[floor(ts / size) * size, … + size)`; `HOP(TABLE t, DESCRIPTOR(ts), slide, size)` puts
//! it in every window of length `size` starting at a multiple of `slide` that contains
//! `ts` (size / slide windows when slide divides size); `CUMULATE(TABLE t, DESCRIPTOR(ts),
//! step, size)` puts it in every window `[S, S + k * step)` (k = 1 … size / step) that
//! contains `ts`, where `S = floor(ts / size) * size` (the windows grow by `step` within
//! each `size`, as Flink's; size is a multiple of step); `SESSION(TABLE t, DESCRIPTOR(ts),
//! gap)` puts it in its proto-window `[ts, ts + gap)`, which the session aggregate merges
//! with the key's others into sessions. The output is the input row
//! followed by `window_start`, `window_end` and `window_time` (= `window_end` - 1 ms, the
//! row time of the window, as in Flink), all `TIMESTAMP(3)`.
//!
//! Windows are aligned to the Unix epoch. Rows without an event time (NULL) belong to no
//! window and are counted under `rows without event time`.
//!
//! Range: window bounds are computed in 128-bit integers, so no event time (from
//! `i64::MIN` to `i64::MAX` milliseconds) can overflow, wrap or panic. A row any of whose
//! windows has a bound outside `i64` milliseconds (e.g. `ts = i64::MAX`: its window ends
//! after it) is counted under `rows outside the window range` and dropped. Hence every
//! emitted window has `i64::MIN <= window_start < window_end <= i64::MAX`, so
//! `window_end > i64::MIN` and `window_time = window_end - 1` never overflows.
//!
//! Bound: a row is copied once per window it joins, at most [`WindowKind::windows_per_row`]
//! times; the SQL planner refuses HOP windows whose size / slide exceeds its
//! `windows_per_row_max`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, TimestampMillisecondArray, UInt32Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_runtime::Operator;
use sluice_types::{Batch, Message, SluiceError};

use crate::counter::LazyCounter;

/// A window table function's shape, in milliseconds (both positive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Tumble {
        size_ms: i64,
    },
    Hop {
        slide_ms: i64,
        size_ms: i64,
    },
    /// `size_ms` is a multiple of `step_ms` (the SQL planner checks it).
    Cumulate {
        step_ms: i64,
        size_ms: i64,
    },
    /// A session window's proto-window: each row gets `[ts, ts + gap)`; the session
    /// aggregate merges them per key ([`crate::aggregate::session`]).
    Session {
        gap_ms: i64,
    },
}

impl WindowKind {
    pub fn size_ms(&self) -> i64 {
        match *self {
            WindowKind::Tumble { size_ms } | WindowKind::Hop { size_ms, .. } | WindowKind::Cumulate { size_ms, .. } => {
                size_ms
            }
            WindowKind::Session { gap_ms } => gap_ms,
        }
    }

    pub fn slide_ms(&self) -> i64 {
        match *self {
            WindowKind::Tumble { size_ms } => size_ms,
            WindowKind::Hop { slide_ms, .. } => slide_ms,
            WindowKind::Cumulate { step_ms, .. } => step_ms,
            WindowKind::Session { gap_ms } => gap_ms,
        }
    }

    /// HOP's slice: the greatest common divisor of slide and size. Every window's bounds
    /// are multiples of it, so each slice `[k * slice, (k + 1) * slice)` lies wholly
    /// inside or wholly outside each window: all rows of a slice share their windows,
    /// which a row at the slice's start has. Rows can be folded per slice and each
    /// slice's partial given to its windows (Flink's sliced window aggregation) instead
    /// of copying every row once per window. None for the other kinds.
    pub fn slice_ms(&self) -> Option<i64> {
        let WindowKind::Hop { slide_ms, size_ms } = *self else { return None };
        let (mut a, mut b) = (slide_ms.unsigned_abs(), size_ms.unsigned_abs());
        while b != 0 {
            (a, b) = (b, a % b);
        }
        i64::try_from(a).ok()
    }

    /// The most windows a row joins: size / slide (or step) rounded up (1 for TUMBLE).
    pub fn windows_per_row(&self) -> u64 {
        let (size, slide) = (self.size_ms().unsigned_abs(), self.slide_ms().unsigned_abs().max(1));
        size.div_ceil(slide)
    }

    /// Appends `(start, end)` of every window containing `ts`, latest first. Returns
    /// false, appending nothing, when a bound of one of them is outside `i64`.
    pub fn windows(&self, ts: i64, out: &mut Vec<(i64, i64)>) -> bool {
        if let WindowKind::Tumble { .. } | WindowKind::Hop { .. } = self
            && self.sliding_windows_in_i64(ts, out)
        {
            return true;
        }
        let (ts, slide, size) = (i128::from(ts), i128::from(self.slide_ms()), i128::from(self.size_ms()));
        assert!(slide > 0 && size > 0, "window size and slide are positive");
        let first = out.len();
        if let WindowKind::Session { .. } = self {
            // `size` is the gap: the row's own proto-window.
            return match (i64::try_from(ts), i64::try_from(ts + size)) {
                (Ok(start), Ok(end)) => {
                    out.push((start, end));
                    true
                }
                _ => false,
            };
        }
        if let WindowKind::Cumulate { .. } = self {
            let start = ts - ts.rem_euclid(size);
            // The ends S + k * step above ts, latest first: at most size / step of them.
            let mut end = start + size;
            while end > ts {
                match (i64::try_from(start), i64::try_from(end)) {
                    (Ok(start), Ok(end)) => out.push((start, end)),
                    _ => {
                        out.truncate(first);
                        return false;
                    }
                }
                end -= slide;
            }
            return true;
        }
        let mut start = ts - ts.rem_euclid(slide);
        // At most windows_per_row() iterations: `start` falls by `slide` each time.
        while start + size > ts {
            match (i64::try_from(start), i64::try_from(start + size)) {
                (Ok(start), Ok(end)) => out.push((start, end)),
                _ => {
                    out.truncate(first);
                    return false;
                }
            }
            start -= slide;
        }
        true
    }

    /// TUMBLE's and HOP's windows of `ts` as [`WindowKind::windows`] appends them,
    /// computed in `i64` (128-bit division is a call per row); false, appending nothing,
    /// when a bound overflows `i64`, for the exact path to decide.
    fn sliding_windows_in_i64(&self, ts: i64, out: &mut Vec<(i64, i64)>) -> bool {
        let first = out.len();
        let representable =
            each_sliding_window(ts, self.slide_ms(), self.size_ms(), |start, end| out.push((start, end)));
        if !representable {
            out.truncate(first);
        }
        representable
    }

    /// The columns the assignment appends.
    pub fn output_fields() -> [Field; 3] {
        let timestamp = DataType::Timestamp(TimeUnit::Millisecond, None);
        [
            Field::new("window_start", timestamp.clone(), false),
            Field::new("window_end", timestamp.clone(), false),
            Field::new("window_time", timestamp, false),
        ]
    }
}

/// Calls `window(start, end)` for each TUMBLE or HOP window (`slide`, `size`) holding
/// `ts`, latest first, computed in `i64`; false as soon as a bound overflows `i64` (the
/// caller drops the windows it was given, for the exact path to decide).
#[inline]
fn each_sliding_window(ts: i64, slide: i64, size: i64, mut window: impl FnMut(i64, i64)) -> bool {
    let Some(mut start) = ts.checked_sub(ts.rem_euclid(slide)) else { return false };
    loop {
        let Some(end) = start.checked_add(size) else { return false };
        if end <= ts {
            return true;
        }
        window(start, end);
        let Some(previous) = start.checked_sub(slide) else { return false };
        start = previous;
    }
}

/// The most window rows [`WindowAssign`] reserves room for up front (1 Mi).
const MAX_PRESIZED_WINDOW_ROWS: usize = 1 << 20;

/// Rows replicated once per window, with each copy's window start and end.
type Assigned = (Batch, Vec<i64>, Vec<i64>);

/// Appends the window columns, replicating a row once per window it belongs to.
pub struct WindowAssign {
    time_column: usize,
    kind: WindowKind,
    /// HOP rows assigned to their slice of this length, once each
    /// ([`WindowAssign::sliced`]).
    slice: Option<i64>,
    schema: SchemaRef,
    rows_without_time: Arc<AtomicU64>,
    rows_outside_range: LazyCounter,
    /// Scratch: the windows of one row.
    bounds: Vec<(i64, i64)>,
}

impl WindowAssign {
    /// `schema` is the input schema followed by [`WindowKind::output_fields`];
    /// `rows_outside_range` counts rows dropped because a window bound is not an `i64`.
    pub fn new(
        time_column: usize,
        kind: WindowKind,
        schema: SchemaRef,
        rows_without_time: Arc<AtomicU64>,
        rows_outside_range: LazyCounter,
    ) -> WindowAssign {
        assert!(kind.size_ms() > 0 && kind.slide_ms() > 0, "window size and slide are positive");
        WindowAssign {
            time_column,
            kind,
            slice: None,
            schema,
            rows_without_time,
            rows_outside_range,
            bounds: Vec::new(),
        }
    }

    /// For HOP `kind`: each row once, its `window_start`/`window_end` the bounds of its
    /// slice ([`WindowKind::slice_ms`]), for a local aggregate that gives each slice's
    /// partials to the slice's windows ([`crate::aggregate::local::LocalWindowAggregate::sliced`]).
    /// Which rows are kept is HOP's decision: a row without an event time, or one of
    /// whose windows is outside `i64` milliseconds, is counted and dropped, and a row in
    /// no window (between windows, when the slide exceeds the size) is dropped; a kept
    /// row's slice lies within each of its windows, so within `i64`.
    pub fn sliced(mut self) -> WindowAssign {
        assert!(matches!(self.kind, WindowKind::Hop { .. }), "only HOP windows are sliced");
        self.slice = self.kind.slice_ms();
        self
    }

    /// See [`WindowAssign::sliced`]. Without copying rows when every row has an event
    /// time, windows cover every time (size at least the slide) and no window bound can
    /// leave `i64`; otherwise [`WindowAssign::general_bounds`] decides row by row.
    fn slice_bounds(
        &mut self,
        slice: i64,
        batch: Batch,
        times: &TimestampMillisecondArray,
    ) -> Result<Assigned, SluiceError> {
        let (size, slide) = (self.kind.size_ms(), self.kind.slide_ms());
        let (low, high) = times.values().iter().fold((i64::MAX, i64::MIN), |(l, h), &t| (l.min(t), h.max(t)));
        let in_range = times.is_empty() || (low.checked_sub(size).is_some() && high.checked_add(size).is_some());
        if times.null_count() == 0 && size >= slide && in_range {
            let starts: Vec<i64> = times.values().iter().map(|&ts| ts - ts.rem_euclid(slice)).collect();
            let ends = starts.iter().map(|&start| start + slice).collect();
            return Ok((batch, starts, ends));
        }
        self.general_bounds(&batch, times)
    }

    /// TUMBLE or SESSION (one window per row) over rows that all have an event time and
    /// a representable window: the bounds without copying rows. None when some row needs
    /// the general path.
    fn single_bounds(&self, times: &TimestampMillisecondArray) -> Option<(Vec<i64>, Vec<i64>)> {
        let (size, session) = match self.kind {
            WindowKind::Tumble { size_ms } => (size_ms, false),
            WindowKind::Session { gap_ms } => (gap_ms, true),
            _ => return None,
        };
        if times.null_count() > 0 {
            return None;
        }
        let mut starts = Vec::with_capacity(times.len());
        let mut ends = Vec::with_capacity(times.len());
        for &ts in times.values() {
            let start = if session { ts } else { ts.checked_sub(ts.rem_euclid(size))? };
            ends.push(start.checked_add(size)?);
            starts.push(start);
        }
        Some((starts, ends))
    }

    /// HOP over rows that all have an event time and representable windows: each row once
    /// per window, latest first as [`WindowKind::windows`] lists them, computed inline
    /// into buffers sized for every row's windows. None when some row needs the general
    /// path.
    fn hop_bounds(&self, batch: &Batch, times: &TimestampMillisecondArray) -> Result<Option<Assigned>, SluiceError> {
        let WindowKind::Hop { slide_ms: slide, size_ms: size } = self.kind else { return Ok(None) };
        if times.null_count() > 0 {
            return Ok(None);
        }
        // Sized for every row's windows, up to a bound: a large `windows_per_row_max`
        // grows the vectors as the general path does instead of reserving it all.
        let per_row = usize::try_from(self.kind.windows_per_row()).unwrap_or(usize::MAX);
        let capacity = times.len().saturating_mul(per_row).min(MAX_PRESIZED_WINDOW_ROWS);
        let mut indices = Vec::with_capacity(capacity);
        let mut starts = Vec::with_capacity(capacity);
        let mut ends = Vec::with_capacity(capacity);
        for (row, &ts) in times.values().iter().enumerate() {
            let representable = each_sliding_window(ts, slide, size, |start, end| {
                indices.push(row as u32);
                starts.push(start);
                ends.push(end);
            });
            if !representable {
                return Ok(None);
            }
        }
        let rows = crate::partition::take_rows(batch, &UInt32Array::from(indices))?;
        Ok(Some((rows, starts, ends)))
    }

    /// Any kind, any rows: each row once per window (sliced: once, to its slice, if it
    /// has a window); rows without a time or with a window out of range are counted and
    /// dropped.
    fn general_bounds(&mut self, batch: &Batch, times: &TimestampMillisecondArray) -> Result<Assigned, SluiceError> {
        let mut indices = Vec::with_capacity(times.len());
        let mut starts = Vec::with_capacity(times.len());
        let mut ends = Vec::with_capacity(times.len());
        let (mut without_time, mut outside_range) = (0, 0);
        for row in 0..times.len() {
            if times.is_null(row) {
                without_time += 1;
                continue;
            }
            let ts = times.value(row);
            self.bounds.clear();
            if !self.kind.windows(ts, &mut self.bounds) {
                outside_range += 1;
                continue;
            }
            match self.slice {
                // Within each of the row's windows, whose bounds are multiples of it.
                Some(slice) if !self.bounds.is_empty() => {
                    let start = ts - ts.rem_euclid(slice);
                    indices.push(row as u32);
                    starts.push(start);
                    ends.push(start + slice);
                }
                Some(_) => {}
                None => {
                    for &(start, end) in &self.bounds {
                        indices.push(row as u32);
                        starts.push(start);
                        ends.push(end);
                    }
                }
            }
        }
        if without_time > 0 {
            self.rows_without_time.fetch_add(without_time, Ordering::Relaxed);
        }
        if outside_range > 0 {
            self.rows_outside_range.add(outside_range);
        }
        let rows = crate::partition::take_rows(batch, &UInt32Array::from(indices))?;
        Ok((rows, starts, ends))
    }
}

impl Operator for WindowAssign {
    fn name(&self) -> &str {
        "window_assign"
    }

    fn on_data(&mut self, batch: Batch, out: &mut Vec<Message>) -> Result<(), SluiceError> {
        let times = cast(batch.rows.column(self.time_column), &DataType::Timestamp(TimeUnit::Millisecond, None))?;
        let Some(times) = times.as_any().downcast_ref::<TimestampMillisecondArray>() else {
            return Err(SluiceError::internal("window.time_type", format!("event time cast to {}", times.data_type())));
        };
        let (batch, starts, ends) = if let Some(slice) = self.slice {
            self.slice_bounds(slice, batch, times)?
        } else {
            match self.single_bounds(times) {
                Some((starts, ends)) => (batch, starts, ends),
                None => match self.hop_bounds(&batch, times)? {
                    Some(assigned) => assigned,
                    None => self.general_bounds(&batch, times)?,
                },
            }
        };
        if starts.is_empty() {
            return Ok(());
        }
        // window_end > i64::MIN (see the module doc), so `end - 1` cannot overflow.
        let row_times: Vec<i64> = ends.iter().map(|end| end - 1).collect();
        let mut columns: Vec<ArrayRef> = batch.rows.columns().to_vec();
        columns.push(Arc::new(TimestampMillisecondArray::from(starts)));
        columns.push(Arc::new(TimestampMillisecondArray::from(ends)));
        columns.push(Arc::new(TimestampMillisecondArray::from(row_times)));
        let rows = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        out.push(Message::Data(Batch { rows, weights: batch.weights }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Schema;
    use proptest::prelude::*;

    #[test]
    fn cumulate_windows_grow_by_step_within_each_size() {
        let kind = WindowKind::Cumulate { step_ms: 10, size_ms: 30 };
        let windows = |ts: i64| {
            let mut all = Vec::new();
            assert!(kind.windows(ts, &mut all));
            all
        };
        assert_eq!(windows(0), [(0, 30), (0, 20), (0, 10)]);
        assert_eq!(windows(15), [(0, 30), (0, 20)]);
        assert_eq!(windows(29), [(0, 30)]);
        assert_eq!(windows(30), [(30, 60), (30, 50), (30, 40)]);
        assert_eq!(windows(-1), [(-30, 0)]);
        assert!(!kind.windows(i64::MAX, &mut Vec::new()), "its window ends past i64");
        assert_eq!(kind.windows_per_row(), 3);
    }

    fn starts(kind: WindowKind, ts: i64) -> Vec<i64> {
        let mut all = Vec::new();
        assert!(kind.windows(ts, &mut all), "windows of {ts} are representable");
        assert!(all.iter().all(|&(start, end)| end - start == kind.size_ms()));
        all.into_iter().map(|(start, _)| start).collect()
    }

    #[test]
    fn tumble_and_hop_windows_contain_the_timestamp() {
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 25), [20]);
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 20), [20], "start is inclusive");
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, 19), [10], "end is exclusive");
        assert_eq!(starts(WindowKind::Tumble { size_ms: 10 }, -1), [-10], "before the epoch");
        assert_eq!(starts(WindowKind::Hop { slide_ms: 5, size_ms: 10 }, 12), [10, 5]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 5, size_ms: 10 }, 10), [10, 5]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 4, size_ms: 10 }, 9), [8, 4, 0]);
        assert_eq!(starts(WindowKind::Hop { slide_ms: 10, size_ms: 5 }, 7), Vec::<i64>::new(), "a gap between windows");
    }

    const DAY_MS: i64 = 86_400_000;
    /// 0001-01-01 00:00:00 and 9999-12-31 23:59:59.999 UTC.
    const YEAR_1_MS: i64 = -62_135_596_800_000;
    const YEAR_9999_MS: i64 = 253_402_300_799_999;

    #[test]
    fn windows_near_the_limits_of_i64_are_refused_not_wrapped() {
        let tumble = WindowKind::Tumble { size_ms: DAY_MS };
        let hop = WindowKind::Hop { slide_ms: DAY_MS / 4, size_ms: DAY_MS };
        assert_eq!(starts(tumble, YEAR_1_MS), [YEAR_1_MS]);
        assert_eq!(starts(tumble, YEAR_9999_MS), [YEAR_9999_MS + 1 - DAY_MS]);
        assert_eq!(starts(hop, -1).len(), 4);
        let mut bounds = Vec::new();
        for kind in [tumble, hop, WindowKind::Tumble { size_ms: 10 }, WindowKind::Hop { slide_ms: 1, size_ms: 3 }] {
            assert!(!kind.windows(i64::MAX, &mut bounds), "{kind:?}: a window after i64::MAX");
            assert!(!kind.windows(i64::MIN + 1, &mut bounds), "{kind:?}: a window before i64::MIN");
            assert!(bounds.is_empty(), "a refused row appends nothing");
        }
        let one_ms = WindowKind::Tumble { size_ms: 1 };
        assert_eq!(starts(one_ms, i64::MIN), [i64::MIN], "[MIN, MIN + 1) is representable");
        assert!(!one_ms.windows(i64::MAX, &mut bounds), "[MAX, MAX + 1) is not");
        let huge = WindowKind::Tumble { size_ms: i64::MAX };
        assert_eq!(starts(huge, 0), [0]);
        assert_eq!(starts(huge, -1), [i64::MIN + 1]);
        assert!(!huge.windows(i64::MIN, &mut bounds), "its window would start before i64::MIN");
    }

    proptest! {
        #[test]
        fn windows_are_exactly_those_containing_the_time(
            ts in any::<i64>(),
            slide in 1i64..1_000_000_000_000,
            windows in 1i64..20,
            extra in 0i64..1_000,
        ) {
            let size = slide.saturating_mul(windows).saturating_add(extra % slide);
            let kind = WindowKind::Hop { slide_ms: slide, size_ms: size };
            let mut bounds = Vec::new();
            let representable = kind.windows(ts, &mut bounds);
            let (ts, slide, size) = (i128::from(ts), i128::from(slide), i128::from(size));
            let mut expected = Vec::new();
            let mut start = ts - ts.rem_euclid(slide);
            while start + size > ts {
                expected.push((start, start + size));
                start -= slide;
            }
            let fits = |v: i128| i64::try_from(v).is_ok();
            prop_assert_eq!(representable, expected.iter().all(|&(s, e)| fits(s) && fits(e)));
            if representable {
                let got: Vec<(i128, i128)> = bounds.iter().map(|&(s, e)| (i128::from(s), i128::from(e))).collect();
                prop_assert_eq!(got, expected);
                prop_assert!(bounds.len() as u64 <= kind.windows_per_row());
            } else {
                prop_assert!(bounds.is_empty());
            }
        }
    }

    proptest! {
        /// HOP's inline path (every row with a time and representable windows) and the
        /// general one give each row's windows in the same order.
        #[test]
        fn hop_rows_get_their_windows_in_order_on_either_path(
            times in proptest::collection::vec(
                prop_oneof![
                    -100_000i64..100_000,
                    any::<i64>(),
                    i64::MIN..i64::MIN + 20_000,
                    i64::MAX - 20_000..=i64::MAX,
                ],
                1..40,
            ),
            slide in 1i64..5_000,
            windows in 0i64..6,
            extra in 1i64..5_000,
        ) {
            // `windows` 0: a size below the slide, so rows between windows get none.
            let kind = WindowKind::Hop { slide_ms: slide, size_ms: slide * windows + extra % slide + 1 };
            let input =
                Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true)]));
            let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.extend(WindowKind::output_fields());
            let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
            let counter = LazyCounter::new(Arc::clone(&metrics), "outside");
            let mut assign =
                WindowAssign::new(0, kind, Arc::new(Schema::new(fields)), metrics.counter("without time"), counter);
            let column = Arc::new(TimestampMillisecondArray::from(times.clone()));
            let rows = RecordBatch::try_new(input, vec![column]).expect("batch");
            let mut out = Vec::new();
            assign.on_data(Batch::inserts(rows), &mut out).expect("no error");
            let mut expected = Vec::new();
            let mut outside = 0;
            for &ts in &times {
                let mut bounds = Vec::new();
                if kind.windows(ts, &mut bounds) {
                    expected.extend(bounds.into_iter().map(|(start, end)| (ts, start, end)));
                } else {
                    outside += 1;
                }
            }
            let counted = metrics.counters().into_iter().find(|(name, _)| name == "outside").map_or(0, |(_, n)| n);
            prop_assert_eq!(counted, outside);
            let mut got = Vec::new();
            if let Some(Message::Data(batch)) = out.pop() {
                let column = |i: usize| batch.rows.column(i).as_any().downcast_ref::<TimestampMillisecondArray>().cloned();
                let (ts, starts, ends) = (column(0).expect("ts"), column(1).expect("start"), column(2).expect("end"));
                got = (0..batch.num_rows()).map(|r| (ts.value(r), starts.value(r), ends.value(r))).collect();
            }
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn a_session_row_gets_its_own_proto_window() {
        let kind = WindowKind::Session { gap_ms: 10 };
        let mut bounds = Vec::new();
        assert!(kind.windows(-3, &mut bounds));
        assert_eq!(bounds, [(-3, 7)]);
        assert!(!kind.windows(i64::MAX - 5, &mut bounds), "its end is past i64");
        assert_eq!(bounds.len(), 1, "a refused row appends nothing");
        assert_eq!(kind.windows_per_row(), 1);
    }

    #[test]
    fn session_rows_get_their_proto_windows_on_either_path() {
        let input =
            Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true)]));
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend(WindowKind::output_fields());
        let output = Arc::new(Schema::new(fields));
        // The first batch takes the fast path; the second (a NULL, a row whose window ends
        // past i64) the general one.
        for (times, kept, outside) in [
            (vec![Some(5), Some(-7)], vec![(5, 15), (-7, 3)], 0),
            (vec![Some(5), None, Some(i64::MAX - 1)], vec![(5, 15)], 1),
        ] {
            let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
            let counter = LazyCounter::new(Arc::clone(&metrics), "outside");
            let without_time = metrics.counter("without time");
            let mut assign =
                WindowAssign::new(0, WindowKind::Session { gap_ms: 10 }, Arc::clone(&output), without_time, counter);
            let rows = RecordBatch::try_new(Arc::clone(&input), vec![Arc::new(TimestampMillisecondArray::from(times))]);
            let mut out = Vec::new();
            assign.on_data(Batch::inserts(rows.expect("batch")), &mut out).expect("no error");
            let Some(Message::Data(batch)) = out.pop() else { panic!("rows expected") };
            let column = |i: usize| batch.rows.column(i).as_any().downcast_ref::<TimestampMillisecondArray>().cloned();
            let (starts, ends) = (column(1).expect("start"), column(2).expect("end"));
            let got: Vec<(i64, i64)> = starts.values().iter().copied().zip(ends.values().iter().copied()).collect();
            assert_eq!(got, kept);
            assert_eq!(metrics.counters().contains(&("outside".to_string(), 1)), outside == 1);
        }
    }

    #[test]
    fn rows_at_the_limits_of_i64_are_counted_and_dropped() {
        let input =
            Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true)]));
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend(WindowKind::output_fields());
        let output = Arc::new(Schema::new(fields));
        let times = TimestampMillisecondArray::from(vec![
            Some(i64::MIN),
            Some(YEAR_1_MS),
            Some(-1),
            None,
            Some(YEAR_9999_MS),
            Some(i64::MAX),
        ]);
        let rows = RecordBatch::try_new(input, vec![Arc::new(times)]).expect("batch");
        for kind in [WindowKind::Tumble { size_ms: DAY_MS }, WindowKind::Hop { slide_ms: DAY_MS / 2, size_ms: DAY_MS }]
        {
            let metrics = Arc::new(sluice_runtime::Metrics::new(Vec::new(), Vec::new(), 1));
            let counter = LazyCounter::new(Arc::clone(&metrics), "view v: rows outside the window range");
            let without_time = metrics.counter("view v: rows without event time");
            let mut assign = WindowAssign::new(0, kind, Arc::clone(&output), without_time, counter);
            let mut out = Vec::new();
            assign.on_data(Batch::inserts(rows.clone()), &mut out).expect("no error");
            let Some(Message::Data(batch)) = out.pop() else { panic!("{kind:?}: rows expected") };
            let per_row = kind.windows_per_row() as usize;
            assert_eq!(batch.num_rows(), 3 * per_row, "{kind:?}: year 1, -1 and year 9999 are kept");
            let counters = metrics.counters();
            assert!(counters.contains(&("view v: rows outside the window range".to_string(), 2)), "{counters:?}");
            assert!(counters.contains(&("view v: rows without event time".to_string(), 1)), "{counters:?}");
        }
    }
}
