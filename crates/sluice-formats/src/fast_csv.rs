//! The one-pass CSV decoder: plain CSV chunks straight into Arrow arrays.
//!
//! The decoder's general path ([`crate::decode`]) makes several passes over a chunk (a
//! search for byte order marks, the audit's quick test, a count of the records) before
//! Arrow's CSV decoder splits the records into fields and parses each column. A
//! [`FastCsv`] reads a chunk of the common shape once instead: after one vectorised
//! search for the bytes it declines (see [`plain`]), it reads the fields of each record
//! in order straight off the chunk, each parsed by its column's type as it is found (a
//! VARCHAR field ends at the next delimiter or line feed, found by a vectorised search;
//! any other form ends where it does), and appends the values to the arrays of the
//! batch being built.
//!
//! It decodes a chunk whole and exactly as the general path would (the same rows, in
//! the same batches of at most `batch_size` rows, with the same values), or declines
//! it and appends nothing; the general path then decodes the chunk, bad rows and all.
//! So it reads only what it is sure of, and declines a chunk holding:
//! - a quote (`"`), a byte order mark, a carriage return other than before a line
//!   feed, or text that is not UTF-8;
//! - a record of only whitespace (an empty line is skipped, as Arrow's decoder does; a
//!   blank one sends the chunk down the record-by-record path, counted in
//!   [`crate::Decoder::slow_chunks`], which the general path keeps counting);
//! - a record with too few or too many fields;
//! - an empty field (NULL) in a NOT NULL column;
//! - a value in none of the forms below, even one Arrow would read (` 5` in a BIGINT
//!   column, which it trims, or `2026-01-01T00:00:00+02:00`).
//!
//! The forms, each exactly as Arrow's CSV decoder and the audit of
//! [`crate::csv_audit`] read them:
//! - an integer column (TINYINT to BIGINT, signed or not): `[+-]?[0-9]+` within the
//!   type's range, no `-` for an unsigned type;
//! - REAL and DOUBLE: `[+-]?[0-9]+(.[0-9]+)?` within the type's range (see
//!   [`float_prefix`]);
//! - DECIMAL(p, s) (128 bits, `0 <= s <= p`): `[+-]?[0-9]+(.[0-9]+)?` that fits the
//!   column exactly (see [`decimal_prefix`]);
//! - BOOLEAN: `true` or `false` in any case;
//! - VARCHAR: any text;
//! - TIMESTAMP (without time zone, or in UTC): `YYYY-MM-DD`, or `YYYY-MM-DD` then `T`,
//!   `t` or a space, `HH:MM:SS` (seconds 00-59), optionally `.` and 1 to 9 digits of
//!   which none past the column's precision is anything but `0`, optionally `Z` or `z`;
//!   read as UTC, so always within the years 0000-9999.
//!
//! An empty field is NULL in every column. A schema with another column type, and a
//! delimiter that is no ASCII byte or may appear in these forms (a letter, a digit,
//! `+ - . :` or a space), have no fast path.
//!
//! The fields other than VARCHAR are ASCII, and so are delimiters and line breaks, so a
//! chunk is UTF-8 exactly when each VARCHAR column's text is: Arrow's string array
//! checks that when it is built, one pass over the text.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, ArrowPrimitiveType, BooleanArray, BooleanBufferBuilder, NullBufferBuilder, PrimitiveArray, StringArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    DataType, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, SchemaRef, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;

use crate::exact::fraction_digits;
use crate::header::UTF8_BOM;
use crate::records::is_blank;
use crate::temporal::{days_from_civil, days_in_month};

/// The bytes per row a VARCHAR column's text is first given room for.
const FIRST_TEXT_BYTES_PER_ROW: usize = 16;

/// A column type the fast path reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float32,
    Float64,
    /// Precision and scale, `0 <= scale <= precision`.
    Decimal128(u8, u8),
    Boolean,
    Utf8,
    Timestamp(TimeUnit),
}

impl Kind {
    fn of(data_type: &DataType) -> Option<Kind> {
        Some(match data_type {
            DataType::Int8 => Kind::Int8,
            DataType::Int16 => Kind::Int16,
            DataType::Int32 => Kind::Int32,
            DataType::Int64 => Kind::Int64,
            DataType::UInt8 => Kind::UInt8,
            DataType::UInt16 => Kind::UInt16,
            DataType::UInt32 => Kind::UInt32,
            DataType::UInt64 => Kind::UInt64,
            DataType::Float32 => Kind::Float32,
            DataType::Float64 => Kind::Float64,
            DataType::Decimal128(precision, scale) => {
                let scale = u8::try_from(*scale).ok().filter(|scale| scale <= precision)?;
                Kind::Decimal128(*precision, scale)
            }
            DataType::Boolean => Kind::Boolean,
            DataType::Utf8 => Kind::Utf8,
            // A naive timestamp is read in the column's time zone: only UTC is read here.
            DataType::Timestamp(unit, None) => Kind::Timestamp(*unit),
            DataType::Timestamp(unit, Some(zone)) if matches!(zone.as_ref(), "UTC" | "+00:00") => {
                Kind::Timestamp(*unit)
            }
            _ => return None,
        })
    }
}

/// Whether `delimiter` can never appear in a field of the forms read here, so that a
/// field ends where its form does.
fn usable_delimiter(delimiter: u8) -> bool {
    delimiter.is_ascii()
        && !delimiter.is_ascii_alphanumeric()
        && !matches!(delimiter, b'+' | b'-' | b'.' | b':' | b' ' | b'"' | b'\r' | b'\n')
}

/// The one-pass decoder of plain CSV chunks for one schema; see the module doc.
#[derive(Debug)]
pub(crate) struct FastCsv {
    schema: SchemaRef,
    delimiter: u8,
    kinds: Vec<Kind>,
    nullable: Vec<bool>,
    /// Per column, the bytes per row of its text in the last batch (VARCHAR columns),
    /// to size the next batch's buffer.
    text_bytes_per_row: Vec<usize>,
}

impl FastCsv {
    /// The fast path for `schema` with fields separated by `delimiter`, or `None` when
    /// a column type or the delimiter has none.
    pub(crate) fn new(schema: &SchemaRef, delimiter: u8) -> Option<FastCsv> {
        if schema.fields().is_empty() || !usable_delimiter(delimiter) {
            return None;
        }
        let kinds = schema.fields().iter().map(|field| Kind::of(field.data_type())).collect::<Option<Vec<_>>>()?;
        Some(FastCsv {
            schema: schema.clone(),
            delimiter,
            nullable: schema.fields().iter().map(|field| field.is_nullable()).collect(),
            text_bytes_per_row: vec![FIRST_TEXT_BYTES_PER_ROW; kinds.len()],
            kinds,
        })
    }

    /// Decodes `chunk` (whole records, ending with a line break) into batches of at
    /// most `batch_size` rows appended to `out`, and returns `true`; or declines it,
    /// appending nothing, and returns `false`.
    pub(crate) fn decode(&mut self, chunk: &[u8], batch_size: usize, out: &mut Vec<RecordBatch>) -> bool {
        match self.batches(chunk, batch_size.max(1)) {
            Some(batches) => {
                out.extend(batches);
                true
            }
            None => false,
        }
    }

    fn batches(&mut self, chunk: &[u8], batch_size: usize) -> Option<Vec<RecordBatch>> {
        if !chunk.ends_with(b"\n") || !plain(chunk) {
            return None;
        }
        // A record holds at least a byte per field (a delimiter or its line break).
        let most_rows = batch_size.min(chunk.len() / self.kinds.len() + 1);
        let mut batches = Vec::new();
        let mut columns = self.columns(most_rows);
        let mut rows = 0;
        let mut at = 0;
        while let Some(first) = chunk.get(at) {
            // An empty line is skipped, as Arrow's decoder does; a blank one is declined.
            match first {
                b'\n' => {
                    at += 1;
                    continue;
                }
                // Before a line feed (see `plain`).
                b'\r' => {
                    at += 2;
                    continue;
                }
                first if first.is_ascii_whitespace() => {
                    let end = memchr::memchr(b'\n', &chunk[at..]).map_or(chunk.len(), |length| at + length);
                    if is_blank(&chunk[at..end]) {
                        return None;
                    }
                }
                _ => {}
            }
            at = self.read_record(chunk, at, &mut columns)?;
            rows += 1;
            if rows == batch_size {
                let full = std::mem::replace(&mut columns, self.columns(most_rows));
                batches.push(self.finish(full, rows)?);
                rows = 0;
            }
        }
        if rows > 0 {
            batches.push(self.finish(columns, rows)?);
        }
        Some(batches)
    }

    /// Empty builders for a batch of at most `rows` rows.
    fn columns(&self, rows: usize) -> Vec<Column> {
        (self.kinds.iter().zip(&self.text_bytes_per_row))
            .map(|(kind, text_bytes)| Column::new(*kind, rows, rows.saturating_mul(*text_bytes)))
            .collect()
    }

    /// Appends the fields of the record at `start` in `chunk` to `columns` and returns
    /// where the next record starts; `None` when the record is not of the forms read
    /// here. A value's form never holds a delimiter or a line break, and every field is
    /// followed by one, so no form is read past its field.
    fn read_record(&self, chunk: &[u8], start: usize, columns: &mut [Column]) -> Option<usize> {
        let delimiter = self.delimiter;
        let last = columns.len() - 1;
        let mut at = start;
        for (index, column) in columns.iter_mut().enumerate() {
            let rest = &chunk[at..];
            let length = match &mut column.values {
                Values::Utf8 { bytes, offsets } => {
                    let end = memchr::memchr2(delimiter, b'\n', rest)?;
                    // Too many fields, or too few.
                    if (rest[end] == b'\n') != (index == last) {
                        return None;
                    }
                    // A carriage return before the line feed ends the record (see `plain`).
                    let length = match rest[end] == b'\n' && end > 0 && rest[end - 1] == b'\r' {
                        true => end - 1,
                        false => end,
                    };
                    bytes.extend_from_slice(&rest[..length]);
                    offsets.push(i32::try_from(bytes.len()).ok()?);
                    length
                }
                _ if rest.first().is_none_or(|byte| matches!(*byte, b'\n' | b'\r') || *byte == delimiter) => {
                    column.values.push_default();
                    0
                }
                values => values.parse(rest)?,
            };
            if length == 0 {
                if !self.nullable[index] {
                    return None;
                }
                column.nulls.append_null();
            } else {
                column.nulls.append_non_null();
            }
            at += length;
            // The delimiter, or the line break ending the record.
            at += match (index == last, chunk.get(at)) {
                (false, Some(byte)) if *byte == delimiter => 1,
                (true, Some(b'\n')) => 1,
                (true, Some(b'\r')) => 2,
                _ => return None,
            };
        }
        Some(at)
    }

    /// The batch of `rows` rows in `columns`; `None` when Arrow refuses it (text that
    /// is not UTF-8).
    fn finish(&mut self, columns: Vec<Column>, rows: usize) -> Option<RecordBatch> {
        let mut arrays = Vec::with_capacity(columns.len());
        for (index, column) in columns.into_iter().enumerate() {
            if let Values::Utf8 { bytes, .. } = &column.values {
                self.text_bytes_per_row[index] = bytes.len() / rows + 1;
            }
            arrays.push(column.finish(self.schema.field(index).data_type())?);
        }
        RecordBatch::try_new(self.schema.clone(), arrays).ok()
    }
}

/// Whether `chunk` holds no quote and no byte order mark, and each carriage return in
/// it stands before a line feed (the two then end a record; Arrow's decoder also ends a
/// record at a lone one). One vectorised pass for the three bytes.
fn plain(chunk: &[u8]) -> bool {
    memchr::memchr3_iter(b'"', b'\r', UTF8_BOM[0], chunk).all(|at| match chunk[at] {
        b'"' => false,
        b'\r' => chunk.get(at + 1) == Some(&b'\n'),
        _ => !chunk[at..].starts_with(UTF8_BOM),
    })
}

/// The values of a column of the batch being built.
enum Values {
    Int8(Vec<i8>),
    Int16(Vec<i16>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    UInt8(Vec<u8>),
    UInt16(Vec<u16>),
    UInt32(Vec<u32>),
    UInt64(Vec<u64>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Decimal128 {
        precision: u8,
        scale: u8,
        values: Vec<i128>,
    },
    Boolean(BooleanBufferBuilder),
    /// The text of the rows one after the other, and where each row's ends.
    Utf8 {
        bytes: Vec<u8>,
        offsets: Vec<i32>,
    },
    Timestamp(TimeUnit, Vec<i64>, LastDate),
}

impl Values {
    /// Parses the value at the start of the non-empty field `rest` (and whatever
    /// follows it on its line) and appends it; returns its length, or `None` when no
    /// value of the column's form starts there.
    fn parse(&mut self, rest: &[u8]) -> Option<usize> {
        macro_rules! signed {
            ($values:expr) => {{
                let (negative, magnitude, length) = integer_prefix(rest)?;
                let value =
                    if negative { 0i64.checked_sub_unsigned(magnitude)? } else { i64::try_from(magnitude).ok()? };
                $values.push(value.try_into().ok()?);
                Some(length)
            }};
        }
        macro_rules! unsigned {
            ($values:expr) => {{
                let (negative, magnitude, length) = integer_prefix(rest)?;
                if negative {
                    return None;
                }
                $values.push(magnitude.try_into().ok()?);
                Some(length)
            }};
        }
        match self {
            Values::Int8(values) => signed!(values),
            Values::Int16(values) => signed!(values),
            Values::Int32(values) => signed!(values),
            Values::Int64(values) => signed!(values),
            Values::UInt8(values) => unsigned!(values),
            Values::UInt16(values) => unsigned!(values),
            Values::UInt32(values) => unsigned!(values),
            Values::UInt64(values) => unsigned!(values),
            Values::Float32(values) => {
                let (value, length) = float_prefix(rest)?;
                values.push(value);
                Some(length)
            }
            Values::Float64(values) => {
                let (value, length) = float_prefix(rest)?;
                values.push(value);
                Some(length)
            }
            Values::Decimal128 { precision, scale, values } => {
                let (value, length) = decimal_prefix(rest, *precision, *scale)?;
                values.push(value);
                Some(length)
            }
            Values::Boolean(values) => {
                let (value, length) = boolean_prefix(rest)?;
                values.append(value);
                Some(length)
            }
            Values::Timestamp(unit, values, last_date) => {
                let (value, length) = timestamp_prefix(rest, *unit, last_date)?;
                values.push(value);
                Some(length)
            }
            // Read by the caller.
            Values::Utf8 { .. } => None,
        }
    }

    /// Appends the value of a NULL row.
    fn push_default(&mut self) {
        match self {
            Values::Int8(values) => values.push(0),
            Values::Int16(values) => values.push(0),
            Values::Int32(values) => values.push(0),
            Values::Int64(values) => values.push(0),
            Values::UInt8(values) => values.push(0),
            Values::UInt16(values) => values.push(0),
            Values::UInt32(values) => values.push(0),
            Values::UInt64(values) => values.push(0),
            Values::Float32(values) => values.push(0.0),
            Values::Float64(values) => values.push(0.0),
            Values::Decimal128 { values, .. } => values.push(0),
            Values::Boolean(values) => values.append(false),
            Values::Timestamp(_, values, _) => values.push(0),
            Values::Utf8 { bytes, offsets } => offsets.push(i32::try_from(bytes.len()).unwrap_or(i32::MAX)),
        }
    }
}

/// A column of the batch being built.
struct Column {
    values: Values,
    nulls: NullBufferBuilder,
}

impl Column {
    fn new(kind: Kind, rows: usize, text_bytes: usize) -> Column {
        let values = match kind {
            Kind::Int8 => Values::Int8(Vec::with_capacity(rows)),
            Kind::Int16 => Values::Int16(Vec::with_capacity(rows)),
            Kind::Int32 => Values::Int32(Vec::with_capacity(rows)),
            Kind::Int64 => Values::Int64(Vec::with_capacity(rows)),
            Kind::UInt8 => Values::UInt8(Vec::with_capacity(rows)),
            Kind::UInt16 => Values::UInt16(Vec::with_capacity(rows)),
            Kind::UInt32 => Values::UInt32(Vec::with_capacity(rows)),
            Kind::UInt64 => Values::UInt64(Vec::with_capacity(rows)),
            Kind::Float32 => Values::Float32(Vec::with_capacity(rows)),
            Kind::Float64 => Values::Float64(Vec::with_capacity(rows)),
            Kind::Decimal128(precision, scale) => {
                Values::Decimal128 { precision, scale, values: Vec::with_capacity(rows) }
            }
            Kind::Boolean => Values::Boolean(BooleanBufferBuilder::new(rows)),
            Kind::Utf8 => {
                let mut offsets = Vec::with_capacity(rows + 1);
                offsets.push(0);
                Values::Utf8 { bytes: Vec::with_capacity(text_bytes), offsets }
            }
            Kind::Timestamp(unit) => Values::Timestamp(unit, Vec::with_capacity(rows), LastDate::default()),
        };
        Column { values, nulls: NullBufferBuilder::new(rows) }
    }

    /// The column as an array of `data_type`; `None` when Arrow refuses it.
    fn finish(mut self, data_type: &DataType) -> Option<ArrayRef> {
        let nulls = self.nulls.finish();
        Some(match self.values {
            Values::Int8(values) => primitive::<Int8Type>(values, nulls)?,
            Values::Int16(values) => primitive::<Int16Type>(values, nulls)?,
            Values::Int32(values) => primitive::<Int32Type>(values, nulls)?,
            Values::Int64(values) => primitive::<Int64Type>(values, nulls)?,
            Values::UInt8(values) => primitive::<UInt8Type>(values, nulls)?,
            Values::UInt16(values) => primitive::<UInt16Type>(values, nulls)?,
            Values::UInt32(values) => primitive::<UInt32Type>(values, nulls)?,
            Values::UInt64(values) => primitive::<UInt64Type>(values, nulls)?,
            Values::Float32(values) => primitive::<Float32Type>(values, nulls)?,
            Values::Float64(values) => primitive::<Float64Type>(values, nulls)?,
            Values::Decimal128 { precision, scale, values } => {
                let values = PrimitiveArray::<Decimal128Type>::try_new(ScalarBuffer::from(values), nulls).ok()?;
                Arc::new(values.with_precision_and_scale(precision, scale as i8).ok()?)
            }
            Values::Boolean(mut values) => Arc::new(BooleanArray::new(values.finish(), nulls)),
            Values::Utf8 { bytes, offsets } => {
                // Checks that the text is UTF-8 and that each row's ends at a character.
                let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
                Arc::new(StringArray::try_new(offsets, bytes.into(), nulls).ok()?)
            }
            Values::Timestamp(unit, values, _) => {
                let DataType::Timestamp(_, zone) = data_type else { return None };
                let zone = zone.clone();
                match unit {
                    TimeUnit::Second => timestamps::<TimestampSecondType>(values, nulls, zone)?,
                    TimeUnit::Millisecond => timestamps::<TimestampMillisecondType>(values, nulls, zone)?,
                    TimeUnit::Microsecond => timestamps::<TimestampMicrosecondType>(values, nulls, zone)?,
                    TimeUnit::Nanosecond => timestamps::<TimestampNanosecondType>(values, nulls, zone)?,
                }
            }
        })
    }
}

fn primitive<T: ArrowPrimitiveType>(values: Vec<T::Native>, nulls: Option<NullBuffer>) -> Option<ArrayRef> {
    Some(Arc::new(PrimitiveArray::<T>::try_new(ScalarBuffer::from(values), nulls).ok()?))
}

fn timestamps<T: arrow::datatypes::ArrowTimestampType>(
    values: Vec<i64>,
    nulls: Option<NullBuffer>,
    zone: Option<Arc<str>>,
) -> Option<ArrayRef> {
    Some(Arc::new(PrimitiveArray::<T>::try_new(ScalarBuffer::from(values), nulls).ok()?.with_timezone_opt(zone)))
}

/// `[+-]?[0-9]+` at the start of `field`: whether it is negative, its magnitude and
/// its length; `None` without a digit or when the magnitude overflows 64 bits.
fn integer_prefix(field: &[u8]) -> Option<(bool, u64, usize)> {
    let (negative, start) = match field.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let mut magnitude: u64 = 0;
    let mut at = start;
    while let Some(byte) = field.get(at) {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        // Exact up to 19 digits (below 10^19 < 2^64); longer ones are read again.
        magnitude = magnitude.wrapping_mul(10).wrapping_add(u64::from(digit));
        at += 1;
    }
    let digits = &field[start..at];
    if digits.len() > 19 {
        magnitude = 0;
        for byte in digits {
            magnitude = magnitude.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
        }
    }
    (at > start).then_some((negative, magnitude, at))
}

/// `[+-]?[0-9]+(\.[0-9]+)?` at the start of `field`, as a finite float, and its
/// length. Arrow's parser and the standard library's both round a decimal to the
/// nearest float exactly, so they agree on this form; other forms (`1e5`, `.5`, `5.`,
/// `NaN`, `inf`) and text beyond the float's range are declined.
fn float_prefix<F: std::str::FromStr + Into<f64> + Copy>(field: &[u8]) -> Option<(F, usize)> {
    let digits =
        |from: usize| field.get(from..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_digit()).count());
    let sign = usize::from(matches!(field.first(), Some(b'+' | b'-')));
    let whole = digits(sign);
    if whole == 0 {
        return None;
    }
    let mut length = sign + whole;
    if field.get(length) == Some(&b'.') {
        let fraction = digits(length + 1);
        if fraction == 0 {
            return None;
        }
        length += 1 + fraction;
    }
    let value: F = std::str::from_utf8(&field[..length]).ok()?.parse().ok()?;
    value.into().is_finite().then_some((value, length))
}

/// `[+-]?[0-9]+(\.[0-9]+)?` at the start of `field` as a DECIMAL(`precision`,
/// `scale`) that holds it exactly (see [`crate::exact::decimal_misfit`]): no more
/// digits before the point, leading zeros aside, than `precision - scale`, and no digit
/// but `0` after the first `scale` ones. Arrow's parser reads such text to the same
/// value (it keeps the first `scale` decimal places); other forms (`1e2`, `.5`) are
/// declined. Its value in units of the scale, and its length.
fn decimal_prefix(field: &[u8], precision: u8, scale: u8) -> Option<(i128, usize)> {
    let digits =
        |from: usize| field.get(from..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_digit()).count());
    let sign = usize::from(matches!(field.first(), Some(b'+' | b'-')));
    let whole = &field[sign..sign + digits(sign)];
    if whole.is_empty() {
        return None;
    }
    let mut length = sign + whole.len();
    let mut fraction: &[u8] = &[];
    if field.get(length) == Some(&b'.') {
        fraction = &field[length + 1..length + 1 + digits(length + 1)];
        if fraction.is_empty() {
            return None;
        }
        length += 1 + fraction.len();
    }
    let significant = &whole[whole.iter().take_while(|b| **b == b'0').count()..];
    let kept = fraction.len().min(usize::from(scale));
    if significant.len() > usize::from(precision - scale) || fraction[kept..].iter().any(|b| *b != b'0') {
        return None;
    }
    // At most `precision` (38 or fewer) digits: no overflow.
    let mut value: i128 = 0;
    for byte in significant.iter().chain(&fraction[..kept]) {
        value = value * 10 + i128::from(byte - b'0');
    }
    value *= 10i128.pow(u32::from(scale) - kept as u32);
    Some((if field.first() == Some(&b'-') { -value } else { value }, length))
}

/// `true` or `false`, in any case, at the start of `field`, and its length.
fn boolean_prefix(field: &[u8]) -> Option<(bool, usize)> {
    if field.get(..4).is_some_and(|word| word.eq_ignore_ascii_case(b"true")) {
        Some((true, 4))
    } else if field.get(..5).is_some_and(|word| word.eq_ignore_ascii_case(b"false")) {
        Some((false, 5))
    } else {
        None
    }
}

/// The last date a timestamp column read, and its days since the Unix epoch: the
/// timestamps of a stream mostly share their date, read once.
#[derive(Debug, Default)]
struct LastDate {
    /// `YYYY-MM-DD`, or zeros (no date) at first.
    text: [u8; 10],
    days: i64,
}

/// A timestamp at the start of `field` in the forms of the module doc: its value in
/// `unit` since the Unix epoch, and its length.
fn timestamp_prefix(field: &[u8], unit: TimeUnit, last_date: &mut LastDate) -> Option<(i64, usize)> {
    let date: [u8; 10] = field.get(..10)?.try_into().ok()?;
    if date != last_date.text {
        last_date.days = date_days(&date)?;
        last_date.text = date;
    }
    let mut seconds = last_date.days * 86_400;
    let (length, nanos) = match field.get(10) {
        Some(b'T' | b't' | b' ') => {
            let (second_of_day, length, nanos) = time_prefix(field, unit)?;
            seconds += second_of_day;
            (length, nanos)
        }
        // A date alone is midnight.
        _ => (10, 0),
    };
    let value = match unit {
        TimeUnit::Second => seconds,
        TimeUnit::Millisecond => seconds * 1_000 + nanos / 1_000_000,
        TimeUnit::Microsecond => seconds * 1_000_000 + nanos / 1_000,
        TimeUnit::Nanosecond => seconds.checked_mul(1_000_000_000)?.checked_add(nanos)?,
    };
    Some((value, length))
}

/// The days since the Unix epoch of `date`, if it is a valid `YYYY-MM-DD`.
fn date_days(date: &[u8; 10]) -> Option<i64> {
    let two = |at: usize| -> Option<i64> { Some(digit(date, at)? * 10 + digit(date, at + 1)?) };
    if date[4] != b'-' || date[7] != b'-' {
        return None;
    }
    let year = two(0)? * 100 + two(2)?;
    let (month, day) = (two(5)?, two(8)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day))
}

/// The time of day after the date of a timestamp `field` (at byte 11): its seconds
/// since midnight, the length of the timestamp and its nanoseconds.
fn time_prefix(field: &[u8], unit: TimeUnit) -> Option<(i64, usize, i64)> {
    let two = |at: usize| -> Option<i64> { Some(digit(field, at)? * 10 + digit(field, at + 1)?) };
    if field.get(13) != Some(&b':') || field.get(16) != Some(&b':') {
        return None;
    }
    let (hour, minute, second) = (two(11)?, two(14)?, two(17)?);
    // Arrow reads second 60 as a leap second: declined.
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut length = 19;
    let mut nanos: i64 = 0;
    if field.get(19) == Some(&b'.') {
        let fraction = &field[20..];
        let digits = fraction.iter().take_while(|byte| byte.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        // Digits finer than the column's precision are a bad row unless they are 0.
        let kept = usize::from(fraction_digits(unit));
        if fraction[..digits].iter().skip(kept).any(|byte| *byte != b'0') {
            return None;
        }
        for byte in &fraction[..digits] {
            nanos = nanos * 10 + i64::from(byte - b'0');
        }
        nanos *= 10i64.pow(9 - digits as u32);
        length = 20 + digits;
    }
    if matches!(field.get(length), Some(b'Z' | b'z')) {
        length += 1;
    }
    Some((hour * 3600 + minute * 60 + second, length, nanos))
}

/// The ASCII digit at `at` in `field`, if it is one.
fn digit(field: &[u8], at: usize) -> Option<i64> {
    let digit = field.get(at)?.wrapping_sub(b'0');
    (digit <= 9).then_some(i64::from(digit))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::compute::kernels::cast_utils::string_to_datetime;
    use arrow::datatypes::{Field, Schema};

    use super::*;

    #[test]
    fn integers_are_read_with_a_sign_and_leading_zeros() {
        assert_eq!(integer_prefix(b"123,"), Some((false, 123, 3)));
        assert_eq!(integer_prefix(b"-0"), Some((true, 0, 2)));
        assert_eq!(integer_prefix(b"+007x"), Some((false, 7, 4)));
        assert_eq!(integer_prefix(b"18446744073709551615"), Some((false, u64::MAX, 20)));
        for none in [&b""[..], b"-", b"+", b"x1", b" 1", b"18446744073709551616", b"-+1"] {
            assert_eq!(integer_prefix(none), None, "{:?}", String::from_utf8_lossy(none));
        }
    }

    #[test]
    fn floats_are_read_as_arrow_reads_them() {
        use arrow::compute::kernels::cast_utils::Parser;
        let mut texts: Vec<String> = [
            "0", "-0", "+0.0", "1.5", "-0.25", "007.50", "0.1", "0.30000000000000004", "123456789.123456789",
            "9007199254740993", "2.2250738585072011", "4.9406564584124654", "3.4028235677973366",
            "340282356779733661637539395458142568448", "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904",
        ]
        .iter()
        .map(|text| text.to_string())
        .collect();
        // Random digits around the places where rounding is hard.
        let mut state = 11u64;
        for _ in 0..3000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let (whole, fraction) = ((state >> 40) % 24, (state >> 20) % 24);
            let digits: String =
                (0..whole + fraction).map(|i| char::from(b'0' + ((state >> (i % 50)) % 10) as u8)).collect();
            let (a, b) = digits.split_at(whole as usize);
            texts.push(if b.is_empty() { a.to_string() } else { format!("{a}.{b}") });
        }
        for text in texts.iter().filter(|text| !text.is_empty() && !text.starts_with('.')) {
            match float_prefix::<f64>(text.as_bytes()) {
                Some((value, length)) => {
                    assert_eq!(length, text.len(), "{text}");
                    assert_eq!(Some(value.to_bits()), Float64Type::parse(text).map(f64::to_bits), "{text}");
                }
                None => assert!(Float64Type::parse(text).is_none_or(|value| !value.is_finite()), "{text}"),
            }
            match float_prefix::<f32>(text.as_bytes()) {
                Some((value, _)) => {
                    assert_eq!(Some(value.to_bits()), Float32Type::parse(text).map(f32::to_bits), "{text}")
                }
                None => assert!(Float32Type::parse(text).is_none_or(|value| !value.is_finite()), "{text}"),
            }
        }
        for declined in ["1e5", ".5", "5.", "NaN", "inf", "+", "-.5", "1.5e", " 1"] {
            let length = float_prefix::<f64>(declined.as_bytes()).map(|(_, length)| length);
            assert!(length.is_none_or(|length| length < declined.len()), "{declined}");
        }
    }

    #[test]
    fn decimals_are_read_as_arrow_and_the_audit_read_them() {
        use arrow::compute::kernels::cast_utils::parse_decimal;
        let mut texts: Vec<String> = [
            "0",
            "-0",
            "+0.00",
            "1.5",
            "-1.25",
            "1.230",
            "1.239",
            "0012345678.9900",
            "12345678.99",
            "123456789",
            "99999999.99",
            "-99999999.99",
            "0.001",
            "0.010",
            "5",
            "+7.1",
            "100000000",
        ]
        .iter()
        .map(|text| text.to_string())
        .collect();
        let mut state = 5u64;
        for _ in 0..2000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let (whole, fraction) = (1 + (state >> 40) % 12, (state >> 20) % 6);
            let digits: String =
                (0..whole + fraction).map(|i| char::from(b'0' + ((state >> (i % 50)) % 10) as u8)).collect();
            let (a, b) = digits.split_at(whole as usize);
            let sign = ["", "-", "+"][(state % 3) as usize];
            texts.push(if b.is_empty() { format!("{sign}{a}") } else { format!("{sign}{a}.{b}") });
        }
        for (precision, scale) in [(10u8, 2u8), (5, 0), (38, 10), (3, 3), (18, 6)] {
            for text in &texts {
                let fits = crate::exact::decimal_misfit(text.as_bytes(), precision, scale as i8).is_none();
                let arrow = parse_decimal::<Decimal128Type>(text, precision, scale as i8).ok();
                match decimal_prefix(text.as_bytes(), precision, scale) {
                    Some((value, length)) => {
                        assert_eq!(length, text.len(), "{text}");
                        assert!(fits, "{text} in DECIMAL({precision}, {scale}) is a bad row");
                        assert_eq!(Some(value), arrow, "{text} in DECIMAL({precision}, {scale})");
                    }
                    None => assert!(!fits || arrow.is_none(), "{text} in DECIMAL({precision}, {scale}) is declined"),
                }
            }
        }
        for declined in ["1e2", ".5", "5.", "+", "-.5", "1.5e1", " 1", "1.2.3"] {
            let length = decimal_prefix(declined.as_bytes(), 10, 2).map(|(_, length)| length);
            assert!(length.is_none_or(|length| length < declined.len()), "{declined}");
        }
    }

    #[test]
    fn booleans_are_read_in_any_case() {
        assert_eq!(boolean_prefix(b"true"), Some((true, 4)));
        assert_eq!(boolean_prefix(b"FaLsE,x"), Some((false, 5)));
        assert_eq!(boolean_prefix(b"tru"), None);
        assert_eq!(boolean_prefix(b"1"), None);
    }

    /// What Arrow's CSV decoder reads from `text` into a column of `unit`.
    fn arrow_timestamp(text: &str, unit: TimeUnit) -> Option<i64> {
        let utc: arrow::array::timezone::Tz = "+00:00".parse().ok()?;
        let date = string_to_datetime(&utc, text).ok()?;
        match unit {
            TimeUnit::Second => Some(date.timestamp()),
            TimeUnit::Millisecond => Some(date.timestamp_millis()),
            TimeUnit::Microsecond => Some(date.timestamp_micros()),
            TimeUnit::Nanosecond => date.timestamp_nanos_opt(),
        }
    }

    const UNITS: [TimeUnit; 4] = [TimeUnit::Second, TimeUnit::Millisecond, TimeUnit::Microsecond, TimeUnit::Nanosecond];

    #[test]
    fn timestamps_are_read_as_arrow_reads_them() {
        let texts = [
            "2026-01-01 00:00:00",
            "2026-01-01 00:00:00.123",
            "2026-01-01T12:34:56.5Z",
            "2026-01-01t12:34:56.000000000z",
            "2026-01-01",
            "2024-02-29 23:59:59.999999",
            "2000-02-29 01:02:03",
            "1970-01-01 00:00:00",
            "1969-12-31 23:59:59.999",
            "0000-01-01 00:00:00",
            "0000-02-29",
            "9999-12-31 23:59:59.999999999",
            "1677-09-21 00:12:44",
            "1677-09-21 00:12:43.145224192",
            "2262-04-11 23:47:16.854775807",
        ];
        for text in texts {
            for unit in UNITS {
                let fast = timestamp_prefix(text.as_bytes(), unit, &mut LastDate::default());
                let fits = crate::exact::fraction_misfit(text.as_bytes(), fraction_digits(unit)).is_none();
                match (fast, arrow_timestamp(text, unit)) {
                    (Some((value, length)), Some(arrow)) => {
                        assert_eq!((value, length), (arrow, text.len()), "{text} in {unit:?}");
                        assert!(fits, "{text} in {unit:?} is a bad row");
                    }
                    (None, _) => {
                        assert!(!fits || unit == TimeUnit::Nanosecond, "{text} in {unit:?} is declined though it fits")
                    }
                    (Some(_), None) => panic!("{text} in {unit:?}: Arrow refuses it"),
                }
            }
        }
    }

    #[test]
    fn odd_timestamps_are_declined() {
        for text in [
            "2026-02-29",
            "1900-02-29 00:00:00",
            "2026-13-01",
            "2026-00-10",
            "2026-01-00",
            "2026-04-31",
            "2026-01-01 24:00:00",
            "2026-01-01 23:60:00",
            "2026-01-01 23:59:60",
            "2026-01-01 00:00:00.",
            "2026-01-01 00:00:00.1234567891",
            "2026-01-01 000000",
            "2026-01-01 0:00:00",
            "2026-01-01x00:00:00",
            "26-01-01",
            "2026/01/01",
            "2262-04-11 23:47:16.854775808",
        ] {
            let declined = |unit| match timestamp_prefix(text.as_bytes(), unit, &mut LastDate::default()) {
                None => true,
                // A form that stops before the end: the field goes on, so the record is declined.
                Some((_, length)) => length < text.len(),
            };
            assert!(declined(TimeUnit::Nanosecond), "{text}");
        }
        assert!(
            timestamp_prefix(b"2026-01-01 00:00:00.1234", TimeUnit::Millisecond, &mut LastDate::default()).is_none()
        );
        assert!(
            timestamp_prefix(b"2026-01-01 00:00:00.1230", TimeUnit::Millisecond, &mut LastDate::default()).is_some()
        );
        assert!(timestamp_prefix(b"2026-01-01 00:00:00.5", TimeUnit::Second, &mut LastDate::default()).is_none());
        assert!(timestamp_prefix(b"2026-01-01 00:00:00.0", TimeUnit::Second, &mut LastDate::default()).is_some());
    }

    #[test]
    fn days_are_counted_as_arrow_counts_them() {
        for year in (0..=9999).step_by(7).chain([1900, 2000, 2024, 9999]) {
            for (month, day) in [(1, 1), (2, 28), (3, 1), (12, 31)] {
                let text = format!("{year:04}-{month:02}-{day:02}");
                assert_eq!(
                    Some(days_from_civil(year, month, day) * 86_400),
                    arrow_timestamp(&text, TimeUnit::Second),
                    "{text}"
                );
            }
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("small", DataType::UInt8, true),
            Field::new("flag", DataType::Boolean, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), true),
        ]))
    }

    fn fast(schema: &SchemaRef, chunk: &[u8], batch_size: usize) -> Option<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut decoder = FastCsv::new(schema, b',')?;
        decoder.decode(chunk, batch_size, &mut out).then_some(out)
    }

    #[test]
    fn a_plain_chunk_is_read_into_batches() {
        let chunk = b"1,255,true,abc,2026-01-01 00:00:00.5\r\n\n-2,,,,\n3,0,FALSE,\xc3\xa9,2026-01-01\n";
        let Some(batches) = fast(&schema(), chunk, 2) else { panic!("declined") };
        assert_eq!(batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), [2, 1]);
        assert!(batches.iter().all(|batch| batch.schema() == schema()));
        let ids = batches[0].column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values(), &[1, -2]);
        let names = batches[0].column(3).as_string::<i32>();
        assert_eq!((names.value(0), names.is_null(1)), ("abc", true));
        assert_eq!(batches[1].column(3).as_string::<i32>().value(0), "é");
        let times = batches[0].column(4).as_primitive::<TimestampMillisecondType>();
        assert_eq!((times.value(0), times.is_null(1)), (1_767_225_600_500, true));
        assert!(!batches[1].column(2).as_boolean().value(0));
    }

    #[test]
    fn unusual_chunks_are_declined() {
        for chunk in [
            &b"1,2,true,\"abc\",\n"[..],
            b"1,2,true,abc\n",
            b"1,2,true,abc,,\n",
            b",2,true,abc,\n",
            b"1,256,true,abc,\n",
            b"1,-1,true,abc,\n",
            b"1, 2,true,abc,\n",
            b"1,2,yes,abc,\n",
            b"1,2,true,a\rb,\n",
            b"1,2,true,abc,\r",
            b"1,2,true,\xef\xbb\xbfabc,\n",
            b"1,2,true,\xff,\n",
            b"1,2,true,abc,2026-01-01 00:00:00.1234\n",
            b"1,2,true,abc,\n  \n",
            b"1,2,true,abc,",
        ] {
            assert!(fast(&schema(), chunk, 10).is_none(), "{:?}", String::from_utf8_lossy(chunk));
        }
    }

    #[test]
    fn schemas_and_delimiters_without_a_fast_path() {
        let date = Arc::new(Schema::new(vec![Field::new("x", DataType::Date32, true)]));
        assert!(FastCsv::new(&date, b',').is_none());
        let negative_scale = Arc::new(Schema::new(vec![Field::new("x", DataType::Decimal128(10, -2), true)]));
        assert!(FastCsv::new(&negative_scale, b',').is_none());
        let zoned = DataType::Timestamp(TimeUnit::Millisecond, Some("+02:00".into()));
        assert!(FastCsv::new(&Arc::new(Schema::new(vec![Field::new("t", zoned, true)])), b',').is_none());
        assert!(FastCsv::new(&Arc::new(Schema::empty()), b',').is_none());
        for delimiter in [b'a', b'1', b'-', b'.', b':', b' ', 0xfe] {
            assert!(FastCsv::new(&schema(), delimiter).is_none(), "{delimiter}");
        }
        for delimiter in [b',', b';', b'\t', b'|'] {
            assert!(FastCsv::new(&schema(), delimiter).is_some(), "{delimiter}");
        }
    }
}
