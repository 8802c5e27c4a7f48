//! The fast path of JSON lines: one pass over a chunk, straight into Arrow arrays.
//!
//! [`FastJson::decode`] either decodes a whole chunk or declines it and emits nothing;
//! the [`crate::Decoder`] then decodes the chunk on its reference path (Arrow's JSON
//! decoder, the audits of [`crate::json_numbers`] and [`crate::temporal`], and the
//! record-by-record path for bad rows), exactly as without the fast path. So the fast
//! path takes only chunks whose every line it is sure the reference path reads as one
//! good row, and gives exactly that row: it declines anything else, including every
//! bad row, and runs no audit (the values it accepts are ones no audit rejects).
//!
//! What it takes:
//! - a schema of at most 64 columns of types BOOLEAN, TINYINT to BIGINT (and the
//!   unsigned ones up to the largest BIGINT), VARCHAR (`Utf8`) and TIMESTAMP(p)
//!   without a time zone, whose names hold no quote, backslash or control character
//!   and are distinct ([`FastJson::new`] gives `None` for any other schema);
//! - a chunk of valid UTF-8 without a byte order mark, where each line is blank
//!   (spaces, tabs, carriage returns) or one JSON object, with spaces, tabs and
//!   carriage returns around it and its tokens, in strict JSON syntax;
//! - keys without escapes, each column's at most once, in any order (the schema's order
//!   is tried first); a key that names no column has its value skipped, which must be
//!   strict JSON nested at most [`MAX_DEPTH`] deep;
//! - values: `null` in a nullable column (a missing key is `null` too); `true` or
//!   `false` in a BOOLEAN; a JSON string in a VARCHAR (escapes decoded as Arrow does, see
//!   [`unescape`]); in an integer column, an integer without fraction, exponent, leading
//!   zero or `-0`, within the column's range; in a timestamp column, an integer number of
//!   its unit within the years 0000-9999, or a string `YYYY-MM-DD`, or
//!   `YYYY-MM-DD HH:MM:SS` (or `T`/`t` between) with an optional fraction of one to nine
//!   digits and an optional `Z`, a valid date, seconds below 60, and no digit beyond the
//!   column's precision other than `0` ([`timestamp_text`]).
//!
//! Everything else (numbers with a fraction or an exponent in integer columns, which
//! Arrow reads through `f64` under the audits; numeric strings; time zone offsets; other
//! types) is left to the reference path.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, ArrowPrimitiveType, BooleanArray, BooleanBufferBuilder, NullBufferBuilder, PrimitiveArray, StringArray,
};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    DataType, Int8Type, Int16Type, Int32Type, Int64Type, SchemaRef, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow::record_batch::RecordBatch;

use crate::header::UTF8_BOM;
use crate::temporal::{days_from_civil, days_in_month, timestamp_bounds};

/// The most columns of a schema the fast path takes: one bit each in a `u64`.
const MAX_COLUMNS: usize = 64;

/// The deepest nesting of a skipped value (of a key that names no column).
pub(crate) const MAX_DEPTH: usize = 32;

/// The chunk is not one the fast path is sure of: the reference path decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotMine;

type Fast<T> = Result<T, NotMine>;

/// What a column reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An integer in `[min, max]`.
    Integer {
        min: i64,
        max: i64,
    },
    Boolean,
    Text,
    /// Text or an integer in `[min, max]` (units since the epoch, within the years
    /// 0000-9999).
    Timestamp {
        unit: TimeUnit,
        min: i64,
        max: i64,
    },
}

/// The values of a column decoded so far. At each batch they become the array's
/// buffers without a copy, and buffers of the same capacity take their place.
#[derive(Debug)]
enum Values {
    Integers(Vec<i64>),
    Booleans(BooleanBufferBuilder),
    Texts { offsets: Vec<i32>, bytes: Vec<u8> },
}

#[derive(Debug)]
struct Column {
    name: Box<[u8]>,
    /// The name's first eight bytes as a little-endian word (zero-padded), and the mask
    /// of its bytes in such a word.
    name_word: u64,
    name_mask: u64,
    /// The last date read by a timestamp column, and its days since the epoch.
    last_date: DateCache,
    data_type: DataType,
    nullable: bool,
    kind: Kind,
    values: Values,
    nulls: NullBufferBuilder,
}

impl Column {
    /// Whether the key whose text starts at `at` is this column's name: one word
    /// compare for a name of at most eight bytes.
    fn named_at(&self, c: &[u8], at: usize) -> bool {
        let length = self.name.len();
        let same = match c.get(at..).and_then(<[u8]>::first_chunk::<8>) {
            Some(word) if length <= 8 => u64::from_le_bytes(*word) & self.name_mask == self.name_word,
            _ => c.get(at..at + length) == Some(&self.name[..]),
        };
        same && c.get(at + length) == Some(&b'"')
    }

    fn push_null(&mut self) -> Fast<()> {
        if !self.nullable {
            return Err(NotMine);
        }
        self.nulls.append_null();
        match &mut self.values {
            Values::Integers(values) => values.push(0),
            Values::Booleans(values) => values.append(false),
            Values::Texts { offsets, bytes } => offsets.push(text_offset(bytes)?),
        }
        Ok(())
    }

    /// Reads the value at `at` (not `null`); returns where it ends.
    fn push_value(&mut self, c: &[u8], at: usize) -> Fast<usize> {
        let end = match (self.kind, &mut self.values) {
            (Kind::Integer { min, max }, Values::Integers(values)) => {
                let (value, end) = integer(c, at)?;
                if value < min || value > max {
                    return Err(NotMine);
                }
                values.push(value);
                end
            }
            (Kind::Timestamp { unit, min, max }, Values::Integers(values)) => {
                let (value, end) = match c.get(at) {
                    Some(b'"') => timestamp_text(c, at + 1, unit, &mut self.last_date)?,
                    _ => integer(c, at)?,
                };
                if value < min || value > max {
                    return Err(NotMine);
                }
                values.push(value);
                end
            }
            (Kind::Boolean, Values::Booleans(values)) => match c.get(at) {
                Some(b't') => {
                    values.append(true);
                    literal(c, at, b"true")?
                }
                Some(b'f') => {
                    values.append(false);
                    literal(c, at, b"false")?
                }
                _ => return Err(NotMine),
            },
            (Kind::Text, Values::Texts { offsets, bytes }) => {
                if c.get(at) != Some(&b'"') {
                    return Err(NotMine);
                }
                let end = text(c, at + 1, bytes)?;
                offsets.push(text_offset(bytes)?);
                end
            }
            _ => return Err(NotMine),
        };
        self.nulls.append_non_null();
        Ok(end)
    }

    /// The array of the values decoded so far; the column starts afresh.
    fn finish(&mut self, rows: usize) -> Fast<ArrayRef> {
        let nulls = self.nulls.finish();
        match &mut self.values {
            Values::Integers(values) => {
                integer_array(&self.data_type, std::mem::replace(values, Vec::with_capacity(rows)), nulls)
            }
            Values::Booleans(values) => Ok(Arc::new(BooleanArray::new(values.finish(), nulls))),
            Values::Texts { offsets, bytes } => {
                let offsets = std::mem::replace(offsets, first_offset(rows));
                let bytes = std::mem::replace(bytes, Vec::with_capacity(bytes.capacity()));
                let array = StringArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    Buffer::from_vec(bytes),
                    nulls,
                );
                Ok(Arc::new(array.map_err(|_| NotMine)?))
            }
        }
    }

    /// Drops the values decoded so far.
    fn clear(&mut self) {
        self.nulls = NullBufferBuilder::new(0);
        match &mut self.values {
            Values::Integers(values) => values.clear(),
            Values::Booleans(values) => *values = BooleanBufferBuilder::new(0),
            Values::Texts { offsets, bytes } => {
                offsets.truncate(1);
                bytes.clear();
            }
        }
    }
}

/// The offsets of an empty text column.
fn first_offset(rows: usize) -> Vec<i32> {
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0);
    offsets
}

/// The end offset of the text value just written to `bytes`.
fn text_offset(bytes: &[u8]) -> Fast<i32> {
    i32::try_from(bytes.len()).map_err(|_| NotMine)
}

/// The fast decoder of JSON lines of one schema; see the module doc.
#[derive(Debug)]
pub(crate) struct FastJson {
    schema: SchemaRef,
    columns: Vec<Column>,
    /// One bit per column.
    all_columns: u64,
    /// Rows decoded into `columns` since the last batch.
    rows: usize,
    /// The text of skipped strings.
    scratch: Vec<u8>,
    /// Chunks decoded by the fast path.
    chunks: u64,
}

impl FastJson {
    /// The fast decoder of `schema`, or `None` when the fast path does not take it.
    pub(crate) fn new(schema: &SchemaRef) -> Option<FastJson> {
        let fields = schema.fields();
        if fields.is_empty() || fields.len() > MAX_COLUMNS {
            return None;
        }
        let mut columns: Vec<Column> = Vec::with_capacity(fields.len());
        for field in fields {
            let name = field.name().as_bytes();
            let plain = name.iter().all(|byte| !matches!(byte, b'"' | b'\\' | 0..=0x1f));
            if !plain || columns.iter().any(|column| &*column.name == name) {
                return None;
            }
            let kind = kind_of(field.data_type())?;
            let values = match kind {
                Kind::Integer { .. } | Kind::Timestamp { .. } => Values::Integers(Vec::new()),
                Kind::Boolean => Values::Booleans(BooleanBufferBuilder::new(0)),
                Kind::Text => Values::Texts { offsets: first_offset(0), bytes: Vec::new() },
            };
            let name_word = name.iter().take(8).rev().fold(0, |word, byte| word << 8 | u64::from(*byte));
            let name_mask = u64::MAX.checked_shr(64 - 8 * name.len().min(8) as u32).unwrap_or(0);
            columns.push(Column {
                name: name.into(),
                name_word,
                name_mask,
                last_date: DateCache::default(),
                data_type: field.data_type().clone(),
                nullable: field.is_nullable(),
                kind,
                values,
                nulls: NullBufferBuilder::new(0),
            });
        }
        let all_columns = u64::MAX >> (MAX_COLUMNS - columns.len());
        Some(FastJson { schema: schema.clone(), columns, all_columns, rows: 0, scratch: Vec::new(), chunks: 0 })
    }

    /// The chunks decoded by the fast path so far.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Decodes `chunk` (whole JSON lines, ending with a line break) into batches of at
    /// most `batch_size` rows appended to `out`, when the fast path is sure of every
    /// line; otherwise appends nothing and returns `false`.
    pub(crate) fn decode(&mut self, chunk: &[u8], batch_size: usize, out: &mut Vec<RecordBatch>) -> bool {
        let start = out.len();
        match self.decode_lines(chunk, batch_size.max(1), out) {
            Ok(()) => {
                self.chunks += 1;
                true
            }
            Err(NotMine) => {
                out.truncate(start);
                self.rows = 0;
                self.columns.iter_mut().for_each(Column::clear);
                false
            }
        }
    }

    fn decode_lines(&mut self, chunk: &[u8], batch_size: usize, out: &mut Vec<RecordBatch>) -> Fast<()> {
        // Any byte that is not valid UTF-8 makes its line bad, as does a byte order mark.
        // Checked here once for keys and skipped strings (Arrow checks the text columns
        // again when it builds their arrays).
        if !chunk.is_ascii() && (std::str::from_utf8(chunk).is_err() || memchr::memmem::find(chunk, UTF8_BOM).is_some())
        {
            return Err(NotMine);
        }
        let mut at = 0;
        while at < chunk.len() {
            at = self.line(chunk, at)?;
            if self.rows == batch_size {
                out.push(self.finish()?);
            }
        }
        if self.rows > 0 {
            out.push(self.finish()?);
        }
        Ok(())
    }

    /// Decodes the line starting at `at` (a row, or nothing when it is blank); returns
    /// where the next line starts.
    fn line(&mut self, c: &[u8], at: usize) -> Fast<usize> {
        let mut at = skip_space(c, at);
        match c.get(at) {
            Some(b'\n') => return Ok(at + 1),
            Some(b'{') => at = skip_space(c, at + 1),
            _ => return Err(NotMine),
        }
        let mut seen = 0u64;
        let mut expected = 0;
        if c.get(at) == Some(&b'}') {
            at += 1;
        } else {
            loop {
                if c.get(at) != Some(&b'"') {
                    return Err(NotMine);
                }
                let (column, after_key) = self.key(c, at + 1, expected)?;
                at = skip_space(c, after_key);
                if c.get(at) != Some(&b':') {
                    return Err(NotMine);
                }
                at = skip_space(c, at + 1);
                at = match column {
                    Some(index) => {
                        let bit = 1u64 << index;
                        if seen & bit != 0 {
                            // Arrow keeps the last value, the audits check them all.
                            return Err(NotMine);
                        }
                        seen |= bit;
                        expected = index + 1;
                        self.value(index, c, at)?
                    }
                    None => skip_value(c, at, 0, &mut self.scratch)?,
                };
                at = skip_space(c, at);
                match c.get(at) {
                    Some(b',') => at = skip_space(c, at + 1),
                    Some(b'}') => {
                        at += 1;
                        break;
                    }
                    _ => return Err(NotMine),
                }
            }
        }
        at = skip_space(c, at);
        if c.get(at) != Some(&b'\n') {
            return Err(NotMine);
        }
        if seen != self.all_columns {
            for (index, column) in self.columns.iter_mut().enumerate() {
                if seen & (1u64 << index) == 0 {
                    column.push_null()?;
                }
            }
        }
        self.rows += 1;
        Ok(at + 1)
    }

    /// The column named by the key whose text starts at `at` (after its opening quote),
    /// trying column `expected` first, and where the key ends (after its closing quote).
    fn key(&self, c: &[u8], at: usize, expected: usize) -> Fast<(Option<usize>, usize)> {
        if let Some(column) = self.columns.get(expected)
            && column.named_at(c, at)
        {
            return Ok((Some(expected), at + column.name.len() + 1));
        }
        let end = special_at(c, at)?;
        // An escape, or a line break (the line is cut inside the key).
        if c.get(end) != Some(&b'"') {
            return Err(NotMine);
        }
        let key = c.get(at..end).ok_or(NotMine)?;
        Ok((self.columns.iter().position(|column| &*column.name == key), end + 1))
    }

    /// Reads the value at `at` into column `index`; returns where it ends.
    fn value(&mut self, index: usize, c: &[u8], at: usize) -> Fast<usize> {
        let column = self.columns.get_mut(index).ok_or(NotMine)?;
        if c.get(at) == Some(&b'n') {
            let end = literal(c, at, b"null")?;
            column.push_null()?;
            return Ok(end);
        }
        column.push_value(c, at)
    }

    /// The batch of the rows decoded since the last one.
    fn finish(&mut self) -> Fast<RecordBatch> {
        let rows = std::mem::take(&mut self.rows);
        let arrays = self.columns.iter_mut().map(|column| column.finish(rows)).collect::<Fast<Vec<_>>>()?;
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|_| NotMine)
    }
}

fn kind_of(data_type: &DataType) -> Option<Kind> {
    let integer = |min: i64, max: i64| Some(Kind::Integer { min, max });
    match data_type {
        DataType::Int8 => integer(i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => integer(i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => integer(i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => integer(i64::MIN, i64::MAX),
        DataType::UInt8 => integer(0, u8::MAX.into()),
        DataType::UInt16 => integer(0, u16::MAX.into()),
        DataType::UInt32 => integer(0, u32::MAX.into()),
        DataType::UInt64 => integer(0, i64::MAX),
        DataType::Boolean => Some(Kind::Boolean),
        DataType::Utf8 => Some(Kind::Text),
        DataType::Timestamp(unit, None) => {
            let (min, max) = timestamp_bounds(*unit);
            Some(Kind::Timestamp { unit: *unit, min, max })
        }
        _ => None,
    }
}

/// The array of `data_type` holding `values` (each in the type's range).
fn integer_array(data_type: &DataType, values: Vec<i64>, nulls: Option<NullBuffer>) -> Fast<ArrayRef> {
    fn wide<T: ArrowPrimitiveType<Native = i64>>(values: Vec<i64>, nulls: Option<NullBuffer>) -> Fast<ArrayRef> {
        Ok(Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), nulls)))
    }
    fn narrow<T>(values: Vec<i64>, nulls: Option<NullBuffer>) -> Fast<ArrayRef>
    where
        T: ArrowPrimitiveType,
        T::Native: TryFrom<i64>,
    {
        let values = values.into_iter().map(|value| T::Native::try_from(value).map_err(|_| NotMine));
        Ok(Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values.collect::<Fast<Vec<_>>>()?), nulls)))
    }
    match data_type {
        DataType::Int64 => wide::<Int64Type>(values, nulls),
        DataType::Timestamp(TimeUnit::Second, None) => wide::<TimestampSecondType>(values, nulls),
        DataType::Timestamp(TimeUnit::Millisecond, None) => wide::<TimestampMillisecondType>(values, nulls),
        DataType::Timestamp(TimeUnit::Microsecond, None) => wide::<TimestampMicrosecondType>(values, nulls),
        DataType::Timestamp(TimeUnit::Nanosecond, None) => wide::<TimestampNanosecondType>(values, nulls),
        DataType::Int8 => narrow::<Int8Type>(values, nulls),
        DataType::Int16 => narrow::<Int16Type>(values, nulls),
        DataType::Int32 => narrow::<Int32Type>(values, nulls),
        DataType::UInt8 => narrow::<UInt8Type>(values, nulls),
        DataType::UInt16 => narrow::<UInt16Type>(values, nulls),
        DataType::UInt32 => narrow::<UInt32Type>(values, nulls),
        DataType::UInt64 => narrow::<UInt64Type>(values, nulls),
        _ => Err(NotMine),
    }
}

/// The first byte at or after `at` that is not a space, a tab or a carriage return
/// (the JSON whitespace that does not end a line).
fn skip_space(c: &[u8], mut at: usize) -> usize {
    while matches!(c.get(at), Some(b' ' | b'\t' | b'\r')) {
        at += 1;
    }
    at
}

/// The end of `expected` (a literal) at `at`.
fn literal(c: &[u8], at: usize, expected: &[u8]) -> Fast<usize> {
    let end = at + expected.len();
    if c.get(at..end) == Some(expected) { Ok(end) } else { Err(NotMine) }
}

/// A JSON integer at `at` (an optional `-`, then `0` or digits without a leading zero;
/// not `-0`) and where it ends. What follows is checked by the caller: a value ends at
/// whitespace, `,` or `}`, so `1.5`, `1e3` and `12-3` are declined there.
pub(crate) fn integer(c: &[u8], at: usize) -> Fast<(i64, usize)> {
    let negative = c.get(at) == Some(&b'-');
    let start = at + usize::from(negative);
    let mut end = start;
    let mut magnitude: u64 = 0;
    while let Some(digit) = c.get(end).map(|byte| byte.wrapping_sub(b'0')).filter(|digit| *digit < 10) {
        // 19 digits never overflow a u64.
        if end - start == 19 {
            return Err(NotMine);
        }
        magnitude = magnitude * 10 + u64::from(digit);
        end += 1;
    }
    match (c.get(start), end - start) {
        (_, 0) => return Err(NotMine),
        (Some(b'0'), digits) if digits > 1 || negative => return Err(NotMine),
        _ => {}
    }
    let value = match negative {
        true => 0i64.checked_sub_unsigned(magnitude),
        false => i64::try_from(magnitude).ok(),
    };
    Ok((value.ok_or(NotMine)?, end))
}

/// A timestamp string whose text starts at `at` (after its opening quote) in `unit`
/// since the epoch (UTC), and where it ends (after its closing quote): the forms of
/// Arrow's parser with no offset but `Z`, and no finer fraction than `unit` holds.
pub(crate) fn timestamp_text(c: &[u8], at: usize, unit: TimeUnit, last: &mut DateCache) -> Fast<(i64, usize)> {
    let text = c.get(at..).ok_or(NotMine)?;
    let digit = |index: usize| -> Fast<i64> {
        let digit = text.get(index).ok_or(NotMine)?.wrapping_sub(b'0');
        if digit < 10 { Ok(i64::from(digit)) } else { Err(NotMine) }
    };
    let two = |index: usize| -> Fast<i64> { Ok(digit(index)? * 10 + digit(index + 1)?) };
    if text.get(4) != Some(&b'-') || text.get(7) != Some(&b'-') {
        return Err(NotMine);
    }
    let (year, month, day) = (two(0)? * 100 + two(2)?, two(5)?, two(8)?);
    let date = (year * 100 + month) * 100 + day;
    if date != last.date {
        if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
            return Err(NotMine);
        }
        *last = DateCache { date, days: days_from_civil(year, month, day) };
    }
    let (seconds, nanos, end) = match text.get(10) {
        Some(b'"') => (0, 0, 10),
        Some(b' ' | b'T' | b't') => {
            if text.get(13) != Some(&b':') || text.get(16) != Some(&b':') {
                return Err(NotMine);
            }
            let (hour, minute, second) = (two(11)?, two(14)?, two(17)?);
            if hour > 23 || minute > 59 || second > 59 {
                return Err(NotMine);
            }
            let (mut nanos, mut end) = (0, 19);
            if text.get(19) == Some(&b'.') {
                end = 20;
                while let Ok(digit) = digit(end) {
                    if end == 29 {
                        return Err(NotMine);
                    }
                    nanos = nanos * 10 + digit;
                    end += 1;
                }
                if end == 20 {
                    return Err(NotMine);
                }
                nanos *= 10i64.pow(29 - end as u32);
            }
            if matches!(text.get(end), Some(b'Z' | b'z')) {
                end += 1;
            }
            (hour * 3600 + minute * 60 + second, nanos, end)
        }
        _ => return Err(NotMine),
    };
    if text.get(end) != Some(&b'"') {
        return Err(NotMine);
    }
    let seconds = last.days * 86_400 + seconds;
    // A digit beyond the unit's that is not 0 is a bad row (`crate::exact::fraction_misfit`).
    let value = match unit {
        TimeUnit::Second if nanos == 0 => Some(seconds),
        TimeUnit::Millisecond if nanos % 1_000_000 == 0 => Some(seconds * 1_000 + nanos / 1_000_000),
        TimeUnit::Microsecond if nanos % 1_000 == 0 => Some(seconds * 1_000_000 + nanos / 1_000),
        TimeUnit::Nanosecond => seconds.checked_mul(1_000_000_000).and_then(|value| value.checked_add(nanos)),
        _ => None,
    };
    Ok((value.ok_or(NotMine)?, at + end + 1))
}

/// A valid date (`YYYYMMDD` as a number) and its days since the epoch: the dates of a
/// stream's timestamps seldom change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DateCache {
    date: i64,
    days: i64,
}

impl Default for DateCache {
    fn default() -> Self {
        // No date: -1 is none of `YYYYMMDD`.
        DateCache { date: -1, days: 0 }
    }
}

/// The first quote, backslash or line break at or after `at`.
fn special_at(c: &[u8], at: usize) -> Fast<usize> {
    let rest = c.get(at..).ok_or(NotMine)?;
    memchr::memchr3(b'"', b'\\', b'\n', rest).map(|index| at + index).ok_or(NotMine)
}

/// Appends the text of the string starting at `at` (after its opening quote) to `out`,
/// escapes decoded; returns where it ends (after its closing quote). A raw line break
/// in it is declined: the line is cut inside a string.
pub(crate) fn text(c: &[u8], mut at: usize, out: &mut Vec<u8>) -> Fast<usize> {
    loop {
        let stop = special_at(c, at)?;
        out.extend_from_slice(c.get(at..stop).ok_or(NotMine)?);
        match c.get(stop) {
            Some(b'"') => return Ok(stop + 1),
            Some(b'\\') => at = unescape(c, stop + 1, out)?,
            _ => return Err(NotMine),
        }
    }
}

/// Decodes the escape after the backslash at `at - 1` into `out`, as Arrow's JSON
/// decoder does; returns where it ends. Arrow reads a surrogate pair `\uD8xx\uDCxx`
/// with an OR where an addition belongs, so it gives a different character than the
/// pair encodes when bit 6 of the high surrogate's offset is set (U+20000 and up); such
/// a pair is declined, so the fast path never writes a character the pair does not
/// encode, and the reference path decides.
fn unescape(c: &[u8], at: usize, out: &mut Vec<u8>) -> Fast<usize> {
    let byte = match c.get(at) {
        Some(b'"') => b'"',
        Some(b'\\') => b'\\',
        Some(b'/') => b'/',
        Some(b'b') => 8,
        Some(b'f') => 12,
        Some(b'n') => b'\n',
        Some(b'r') => b'\r',
        Some(b't') => b'\t',
        Some(b'u') => {
            let code = hex4(c, at + 1)?;
            let (code, end) = match code {
                0xD800..=0xDBFF => {
                    if c.get(at + 5..at + 7) != Some(b"\\u") {
                        return Err(NotMine);
                    }
                    let low = hex4(c, at + 7)?;
                    if !(0xDC00..=0xDFFF).contains(&low) {
                        return Err(NotMine);
                    }
                    let (high, low) = ((code - 0xD800) << 10, low - 0xDC00 + 0x1_0000);
                    if high & low != 0 {
                        return Err(NotMine);
                    }
                    (high | low, at + 11)
                }
                0xDC00..=0xDFFF => return Err(NotMine),
                code => (code, at + 5),
            };
            let character = char::from_u32(code).ok_or(NotMine)?;
            out.extend_from_slice(character.encode_utf8(&mut [0; 4]).as_bytes());
            return Ok(end);
        }
        _ => return Err(NotMine),
    };
    out.push(byte);
    Ok(at + 1)
}

/// Four hexadecimal digits at `at`.
fn hex4(c: &[u8], at: usize) -> Fast<u32> {
    let digits = c.get(at..at + 4).ok_or(NotMine)?;
    digits.iter().try_fold(0u32, |code, digit| Ok(code << 4 | char::from(*digit).to_digit(16).ok_or(NotMine)?))
}

/// Skips the strict JSON value at `at` (of a key that names no column), nested at most
/// [`MAX_DEPTH`] deep; returns where it ends. Its strings are decoded into `scratch` to
/// check their escapes.
pub(crate) fn skip_value(c: &[u8], at: usize, depth: usize, scratch: &mut Vec<u8>) -> Fast<usize> {
    match c.get(at) {
        Some(b'"') => {
            scratch.clear();
            text(c, at + 1, scratch)
        }
        Some(b'-' | b'0'..=b'9') => skip_number(c, at),
        Some(b't') => literal(c, at, b"true"),
        Some(b'f') => literal(c, at, b"false"),
        Some(b'n') => literal(c, at, b"null"),
        Some(b'[') if depth < MAX_DEPTH => {
            let mut at = skip_space(c, at + 1);
            if c.get(at) == Some(&b']') {
                return Ok(at + 1);
            }
            loop {
                at = skip_space(c, skip_value(c, at, depth + 1, scratch)?);
                match c.get(at) {
                    Some(b',') => at = skip_space(c, at + 1),
                    Some(b']') => return Ok(at + 1),
                    _ => return Err(NotMine),
                }
            }
        }
        Some(b'{') if depth < MAX_DEPTH => {
            let mut at = skip_space(c, at + 1);
            if c.get(at) == Some(&b'}') {
                return Ok(at + 1);
            }
            loop {
                if c.get(at) != Some(&b'"') {
                    return Err(NotMine);
                }
                scratch.clear();
                at = skip_space(c, text(c, at + 1, scratch)?);
                if c.get(at) != Some(&b':') {
                    return Err(NotMine);
                }
                at = skip_space(c, skip_value(c, skip_space(c, at + 1), depth + 1, scratch)?);
                match c.get(at) {
                    Some(b',') => at = skip_space(c, at + 1),
                    Some(b'}') => return Ok(at + 1),
                    _ => return Err(NotMine),
                }
            }
        }
        _ => Err(NotMine),
    }
}

/// The end of the strict JSON number at `at`: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`.
fn skip_number(c: &[u8], at: usize) -> Fast<usize> {
    let digits =
        |from: usize| from + c.get(from..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_digit()).count());
    let start = at + usize::from(c.get(at) == Some(&b'-'));
    let mut end = match c.get(start) {
        Some(b'0') => start + 1,
        Some(b'1'..=b'9') => digits(start),
        _ => return Err(NotMine),
    };
    if c.get(end) == Some(&b'.') {
        let fraction_end = digits(end + 1);
        if fraction_end == end + 1 {
            return Err(NotMine);
        }
        end = fraction_end;
    }
    if matches!(c.get(end), Some(b'e' | b'E')) {
        let start = end + 1 + usize::from(matches!(c.get(end + 1), Some(b'+' | b'-')));
        end = digits(start);
        if end == start {
            return Err(NotMine);
        }
    }
    Ok(end)
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod differential;
#[cfg(test)]
mod tests;
