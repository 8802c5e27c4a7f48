//! Keys: the project's own encoding of key values, and the hash that places them.
//!
//! Whatever is persisted (group keys in state blobs) or decides where state lives (the
//! placement hash, through [`crate::vnode`]) must stay the same across builds, hosts and
//! dependency upgrades. Arrow's row format "may change from release to release", and a
//! general-purpose hasher reserves the right to change its output, so neither is used:
//! keys have the encoding below, pinned by golden vectors in this module's tests.
//!
//! # Key encoding, version 1 ([`KEY_ENCODING_VERSION`])
//!
//! A key is the values of its key columns, in order, each written as a tag byte and
//! then the value, all integers little-endian:
//!
//! | tag    | value (by the column's SQL type)                          | bytes after the tag |
//! |--------|-----------------------------------------------------------|---------------------|
//! | `0x00` | NULL, of any type                                         | none                |
//! | `0x01` | BOOLEAN: `0x00` false, `0x01` true                        | 1                   |
//! | `0x02` | TINYINT, SMALLINT, INT, BIGINT; DATE (days), TIMESTAMP, TIME and INTERVAL/DURATION (in the column's unit): as i64 | 8 |
//! | `0x03` | unsigned integers: as u64                                 | 8                   |
//! | `0x04` | FLOAT, DOUBLE: as f64 bits, -0.0 written as 0.0 and every NaN as `0x7ff8000000000000` | 8 |
//! | `0x05` | DECIMAL(p, s): the unscaled value as i128 (the scale is the column's) | 16     |
//! | `0x06` | VARCHAR (any Arrow string layout): u32 byte length, then the UTF-8 bytes | 4 + n |
//! | `0x07` | VARBINARY: u32 length, then the bytes                     | 4 + n               |
//!
//! Equal SQL values of one column type encode to equal bytes (so they group together);
//! the type itself is fixed by the plan, whose fingerprint the manifest records.
//!
//! # Key hash, version 1 ([`KEY_HASH_VERSION`])
//!
//! The hash of a key is XXH3-64 with seed 0 ([`hash`]) of its encoding; its high bits
//! choose the vnode ([`crate::vnode::of_hash`]).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Decimal128Builder, Float64Builder, Int64Builder,
    StringBuilder, UInt64Builder,
};
use arrow::compute::cast;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType, DurationMillisecondType,
    DurationNanosecondType, DurationSecondType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt64Type,
};

use crate::SluiceError;

/// The key encoding this build writes and reads (see the module docs).
pub const KEY_ENCODING_VERSION: u32 = 1;
/// The key hash this build places rows with (see the module docs).
pub const KEY_HASH_VERSION: u32 = 1;

const TAG_NULL: u8 = 0x00;
const TAG_BOOLEAN: u8 = 0x01;
const TAG_SIGNED: u8 = 0x02;
const TAG_UNSIGNED: u8 = 0x03;
const TAG_FLOAT: u8 = 0x04;
const TAG_DECIMAL: u8 = 0x05;
const TAG_STRING: u8 = 0x06;
const TAG_BINARY: u8 = 0x07;

/// The canonical NaN's bits.
const CANONICAL_NAN: u64 = 0x7ff8_0000_0000_0000;

/// The key hash of an encoded key: XXH3-64, seed 0.
pub fn hash(encoded: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(encoded)
}

/// How one key column is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Boolean,
    Signed,
    Unsigned,
    Float,
    Decimal,
    String,
    Binary,
}

fn kind_of(data_type: &DataType) -> Option<Kind> {
    Some(match data_type {
        DataType::Boolean => Kind::Boolean,
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Date32
        | DataType::Date64
        | DataType::Timestamp(_, _)
        | DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Duration(_) => Kind::Signed,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => Kind::Unsigned,
        DataType::Float32 | DataType::Float64 => Kind::Float,
        DataType::Decimal128(_, _) => Kind::Decimal,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Kind::String,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Kind::Binary,
        _ => return None,
    })
}

/// Whether values of `data_type` can be keys (grouped, joined, placed).
pub fn is_key_type(data_type: &DataType) -> bool {
    kind_of(data_type).is_some()
}

fn unsupported(data_type: &DataType) -> SluiceError {
    SluiceError::user("key.type", format!("a column of type {data_type} cannot be a key (GROUP BY, join or placement)"))
        .with_fix("group by a column of a scalar type (integer, decimal, float, boolean, string, date or timestamp), e.g. CAST it")
}

/// Encoded keys, back to back, with each key's hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRows {
    bytes: Vec<u8>,
    /// Key `i` ends at `ends[i]` and starts at `ends[i - 1]` (or 0).
    ends: Vec<usize>,
    hashes: Vec<u64>,
}

impl KeyRows {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The encoding of key `index`.
    pub fn row(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.bytes[start..self.ends[index]]
    }

    /// The hash of key `index`.
    pub fn hash(&self, index: usize) -> u64 {
        self.hashes[index]
    }

    /// Every key's hash, in row order.
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.hashes.clear();
    }
}

/// Encodes the key columns of batches (see the module docs).
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    types: Vec<DataType>,
}

impl KeyEncoder {
    /// An encoder for keys of columns of `types`; fails on a type that cannot be a key.
    pub fn new(types: Vec<DataType>) -> Result<KeyEncoder, SluiceError> {
        if let Some(bad) = types.iter().find(|t| kind_of(t).is_none()) {
            return Err(unsupported(bad));
        }
        Ok(KeyEncoder { types })
    }

    /// The key columns' types.
    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// Encodes the keys made of `columns` (of this encoder's types, equal lengths) into
    /// `out`, replacing its contents, with their hashes.
    pub fn encode(&self, columns: &[ArrayRef], out: &mut KeyRows) -> Result<(), SluiceError> {
        assert_eq!(columns.len(), self.types.len(), "one column per key type");
        out.clear();
        let rows = columns.first().map_or(0, |c| c.len());
        if fixed::encode(columns, rows, out) {
            return Ok(());
        }
        let readers = columns.iter().map(Reader::of).collect::<Result<Vec<_>, _>>()?;
        out.ends.reserve(rows);
        out.hashes.reserve(rows);
        for row in 0..rows {
            let start = out.bytes.len();
            for reader in &readers {
                reader.write(row, &mut out.bytes);
            }
            out.ends.push(out.bytes.len());
            out.hashes.push(hash(&out.bytes[start..]));
        }
        Ok(())
    }

    /// Decodes keys back into one array per key column, of this encoder's types. Fails
    /// on bytes that are not keys of these types (state from another plan, damage).
    pub fn decode<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Result<Vec<ArrayRef>, SluiceError> {
        let mut builders: Vec<Builder> = self.types.iter().map(Builder::for_type).collect();
        for key in keys {
            let mut rest = key;
            for builder in &mut builders {
                rest = builder.append(rest)?;
            }
            if !rest.is_empty() {
                return Err(damaged("bytes after the last key column"));
            }
        }
        builders.into_iter().zip(&self.types).map(|(builder, data_type)| builder.finish(data_type)).collect()
    }
}

fn damaged(what: &str) -> SluiceError {
    SluiceError::internal("key.damaged", format!("an encoded key is damaged or of another type: {what}"))
}

/// The fast path: keys of fixed-width columns without NULLs all have one width, so each
/// column is written straight into its place in every key, a typed loop per column.
mod fixed {
    use arrow::array::{Array, ArrayRef, AsArray};
    use arrow::datatypes::{
        DataType, Date32Type, Date64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit,
        TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
    };

    use super::{KeyRows, TAG_SIGNED, hash};

    /// Bytes of one signed value with its tag.
    const WIDTH: usize = 9;

    /// Whether the fast path applies (every column a signed integer, date or timestamp,
    /// without NULLs); when it does, `out` holds the keys and their hashes.
    pub(super) fn encode(columns: &[ArrayRef], rows: usize, out: &mut KeyRows) -> bool {
        if columns.is_empty() || !columns.iter().all(|c| c.null_count() == 0 && fits(c.data_type())) {
            return false;
        }
        let width = WIDTH * columns.len();
        out.bytes.resize(rows * width, 0);
        for (index, column) in columns.iter().enumerate() {
            write_column(column, &mut out.bytes, width, index * WIDTH);
        }
        out.ends.extend((1..=rows).map(|row| row * width));
        out.hashes.extend(out.bytes.chunks_exact(width).map(hash));
        true
    }

    fn fits(data_type: &DataType) -> bool {
        matches!(
            data_type,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Date32
                | DataType::Date64
                | DataType::Timestamp(_, _)
        )
    }

    /// Writes `column`'s values at `offset` of each `width`-byte key of `bytes`.
    fn write_column(column: &ArrayRef, bytes: &mut [u8], width: usize, offset: usize) {
        macro_rules! write {
            ($type:ty) => {{
                let values = column.as_primitive::<$type>().values();
                for (key, value) in bytes.chunks_exact_mut(width).zip(values.iter()) {
                    key[offset] = TAG_SIGNED;
                    key[offset + 1..offset + WIDTH].copy_from_slice(&i64::from(*value).to_le_bytes());
                }
            }};
        }
        match column.data_type() {
            DataType::Int8 => write!(Int8Type),
            DataType::Int16 => write!(Int16Type),
            DataType::Int32 => write!(Int32Type),
            DataType::Int64 => write!(Int64Type),
            DataType::Date32 => write!(Date32Type),
            DataType::Date64 => write!(Date64Type),
            DataType::Timestamp(TimeUnit::Second, _) => write!(TimestampSecondType),
            DataType::Timestamp(TimeUnit::Millisecond, _) => write!(TimestampMillisecondType),
            DataType::Timestamp(TimeUnit::Microsecond, _) => write!(TimestampMicrosecondType),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => write!(TimestampNanosecondType),
            other => unreachable!("{other} does not fit the fixed path"),
        }
    }
}

/// One key column, downcast once per batch.
enum Reader<'a> {
    Boolean(&'a arrow::array::BooleanArray),
    Signed(Box<dyn Fn(usize) -> i64 + 'a>, &'a dyn Array),
    Unsigned(Box<dyn Fn(usize) -> u64 + 'a>, &'a dyn Array),
    Float(Box<dyn Fn(usize) -> f64 + 'a>, &'a dyn Array),
    Decimal(&'a arrow::array::Decimal128Array),
    String(Box<dyn Fn(usize) -> &'a [u8] + 'a>, &'a dyn Array),
}

macro_rules! signed {
    ($column:expr, $type:ty) => {{
        let values = $column.as_primitive::<$type>();
        Reader::Signed(Box::new(move |row| i64::from(values.value(row))), $column.as_ref())
    }};
}

impl<'a> Reader<'a> {
    fn of(column: &'a ArrayRef) -> Result<Reader<'a>, SluiceError> {
        use DataType as T;
        Ok(match column.data_type() {
            T::Boolean => Reader::Boolean(column.as_boolean()),
            T::Int8 => signed!(column, Int8Type),
            T::Int16 => signed!(column, Int16Type),
            T::Int32 => signed!(column, Int32Type),
            T::Int64 => signed!(column, Int64Type),
            T::Date32 => signed!(column, Date32Type),
            T::Date64 => signed!(column, Date64Type),
            T::Timestamp(TimeUnit::Second, _) => signed!(column, TimestampSecondType),
            T::Timestamp(TimeUnit::Millisecond, _) => signed!(column, TimestampMillisecondType),
            T::Timestamp(TimeUnit::Microsecond, _) => signed!(column, TimestampMicrosecondType),
            T::Timestamp(TimeUnit::Nanosecond, _) => signed!(column, TimestampNanosecondType),
            T::Time32(TimeUnit::Second) => signed!(column, Time32SecondType),
            T::Time32(_) => signed!(column, Time32MillisecondType),
            T::Time64(TimeUnit::Microsecond) => signed!(column, Time64MicrosecondType),
            T::Time64(_) => signed!(column, Time64NanosecondType),
            T::Duration(TimeUnit::Second) => signed!(column, DurationSecondType),
            T::Duration(TimeUnit::Millisecond) => signed!(column, DurationMillisecondType),
            T::Duration(TimeUnit::Microsecond) => signed!(column, DurationMicrosecondType),
            T::Duration(TimeUnit::Nanosecond) => signed!(column, DurationNanosecondType),
            T::UInt8 | T::UInt16 | T::UInt32 | T::UInt64 => {
                let widened = cast(column, &T::UInt64)?;
                let values = widened.as_primitive::<UInt64Type>().clone();
                Reader::Unsigned(Box::new(move |row| values.value(row)), column.as_ref())
            }
            T::Float32 => {
                let values = column.as_primitive::<Float32Type>();
                Reader::Float(Box::new(move |row| f64::from(values.value(row))), column.as_ref())
            }
            T::Float64 => {
                let values = column.as_primitive::<Float64Type>();
                Reader::Float(Box::new(move |row| values.value(row)), column.as_ref())
            }
            T::Decimal128(_, _) => Reader::Decimal(column.as_primitive::<Decimal128Type>()),
            T::Utf8 => {
                let values = column.as_string::<i32>();
                Reader::String(Box::new(move |row| values.value(row).as_bytes()), column.as_ref())
            }
            T::LargeUtf8 => {
                let values = column.as_string::<i64>();
                Reader::String(Box::new(move |row| values.value(row).as_bytes()), column.as_ref())
            }
            T::Utf8View => {
                let values = column.as_string_view();
                Reader::String(Box::new(move |row| values.value(row).as_bytes()), column.as_ref())
            }
            T::Binary => {
                let values = column.as_binary::<i32>();
                Reader::String(Box::new(move |row| values.value(row)), column.as_ref())
            }
            T::LargeBinary => {
                let values = column.as_binary::<i64>();
                Reader::String(Box::new(move |row| values.value(row)), column.as_ref())
            }
            T::BinaryView => {
                let values = column.as_binary_view();
                Reader::String(Box::new(move |row| values.value(row)), column.as_ref())
            }
            other => return Err(unsupported(other)),
        })
    }

    fn write(&self, row: usize, out: &mut Vec<u8>) {
        match self {
            Reader::Boolean(values) if values.is_valid(row) => {
                out.extend_from_slice(&[TAG_BOOLEAN, u8::from(values.value(row))])
            }
            Reader::Signed(value, array) if array.is_valid(row) => {
                out.push(TAG_SIGNED);
                out.extend_from_slice(&value(row).to_le_bytes());
            }
            Reader::Unsigned(value, array) if array.is_valid(row) => {
                out.push(TAG_UNSIGNED);
                out.extend_from_slice(&value(row).to_le_bytes());
            }
            Reader::Float(value, array) if array.is_valid(row) => {
                out.push(TAG_FLOAT);
                out.extend_from_slice(&canonical_float_bits(value(row)).to_le_bytes());
            }
            Reader::Decimal(values) if values.is_valid(row) => {
                out.push(TAG_DECIMAL);
                out.extend_from_slice(&values.value(row).to_le_bytes());
            }
            Reader::String(value, array) if array.is_valid(row) => {
                let bytes = value(row);
                let tag =
                    if matches!(array.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView) {
                        TAG_BINARY
                    } else {
                        TAG_STRING
                    };
                out.push(tag);
                let length = u32::try_from(bytes.len()).expect("a key value is shorter than 4 GiB");
                out.extend_from_slice(&length.to_le_bytes());
                out.extend_from_slice(bytes);
            }
            _ => out.push(TAG_NULL),
        }
    }
}

/// -0.0 as 0.0 and every NaN as one NaN: values SQL calls equal encode alike.
fn canonical_float_bits(value: f64) -> u64 {
    if value.is_nan() {
        CANONICAL_NAN
    } else if value == 0.0 {
        0
    } else {
        value.to_bits()
    }
}

/// Builds one decoded key column.
enum Builder {
    Boolean(BooleanBuilder),
    Signed(Int64Builder),
    Unsigned(UInt64Builder),
    Float(Float64Builder),
    Decimal(Decimal128Builder),
    String(StringBuilder),
    Binary(BinaryBuilder),
}

fn split(bytes: &[u8], count: usize) -> Result<(&[u8], &[u8]), SluiceError> {
    if bytes.len() < count {
        return Err(damaged("truncated"));
    }
    Ok(bytes.split_at(count))
}

fn word<const N: usize>(bytes: &[u8]) -> Result<([u8; N], &[u8]), SluiceError> {
    let (head, rest) = split(bytes, N)?;
    Ok((head.try_into().expect("split to N bytes"), rest))
}

impl Builder {
    fn for_type(data_type: &DataType) -> Builder {
        match kind_of(data_type).expect("checked by KeyEncoder::new") {
            Kind::Boolean => Builder::Boolean(BooleanBuilder::new()),
            Kind::Signed => Builder::Signed(Int64Builder::new()),
            Kind::Unsigned => Builder::Unsigned(UInt64Builder::new()),
            Kind::Float => Builder::Float(Float64Builder::new()),
            Kind::Decimal => Builder::Decimal(Decimal128Builder::new()),
            Kind::String => Builder::String(StringBuilder::new()),
            Kind::Binary => Builder::Binary(BinaryBuilder::new()),
        }
    }

    /// Appends the value at the front of `bytes`; returns the bytes after it.
    fn append<'b>(&mut self, bytes: &'b [u8]) -> Result<&'b [u8], SluiceError> {
        let (tag, rest) = split(bytes, 1)?;
        let tag = tag[0];
        if tag == TAG_NULL {
            match self {
                Builder::Boolean(b) => b.append_null(),
                Builder::Signed(b) => b.append_null(),
                Builder::Unsigned(b) => b.append_null(),
                Builder::Float(b) => b.append_null(),
                Builder::Decimal(b) => b.append_null(),
                Builder::String(b) => b.append_null(),
                Builder::Binary(b) => b.append_null(),
            }
            return Ok(rest);
        }
        match (self, tag) {
            (Builder::Boolean(b), TAG_BOOLEAN) => {
                let (value, rest) = split(rest, 1)?;
                match value[0] {
                    0 | 1 => b.append_value(value[0] == 1),
                    _ => return Err(damaged("a boolean is neither 0 nor 1")),
                }
                Ok(rest)
            }
            (Builder::Signed(b), TAG_SIGNED) => {
                let (value, rest) = word::<8>(rest)?;
                b.append_value(i64::from_le_bytes(value));
                Ok(rest)
            }
            (Builder::Unsigned(b), TAG_UNSIGNED) => {
                let (value, rest) = word::<8>(rest)?;
                b.append_value(u64::from_le_bytes(value));
                Ok(rest)
            }
            (Builder::Float(b), TAG_FLOAT) => {
                let (value, rest) = word::<8>(rest)?;
                b.append_value(f64::from_bits(u64::from_le_bytes(value)));
                Ok(rest)
            }
            (Builder::Decimal(b), TAG_DECIMAL) => {
                let (value, rest) = word::<16>(rest)?;
                b.append_value(i128::from_le_bytes(value));
                Ok(rest)
            }
            (Builder::String(b), TAG_STRING) => {
                let (length, rest) = word::<4>(rest)?;
                let (value, rest) = split(rest, u32::from_le_bytes(length) as usize)?;
                b.append_value(std::str::from_utf8(value).map_err(|_| damaged("a string is not UTF-8"))?);
                Ok(rest)
            }
            (Builder::Binary(b), TAG_BINARY) => {
                let (length, rest) = word::<4>(rest)?;
                let (value, rest) = split(rest, u32::from_le_bytes(length) as usize)?;
                b.append_value(value);
                Ok(rest)
            }
            (_, tag) => Err(damaged(&format!("unexpected tag {tag:#04x}"))),
        }
    }

    fn finish(self, data_type: &DataType) -> Result<ArrayRef, SluiceError> {
        let array: ArrayRef = match self {
            Builder::Boolean(mut b) => Arc::new(b.finish()),
            Builder::Signed(mut b) => Arc::new(b.finish()),
            Builder::Unsigned(mut b) => Arc::new(b.finish()),
            Builder::Float(mut b) => Arc::new(b.finish()),
            Builder::Decimal(mut b) => {
                let DataType::Decimal128(precision, scale) = data_type else { unreachable!("decimal kind") };
                Arc::new(b.finish().with_precision_and_scale(*precision, *scale)?)
            }
            Builder::String(mut b) => Arc::new(b.finish()),
            Builder::Binary(mut b) => Arc::new(b.finish()),
        };
        if array.data_type() == data_type {
            return Ok(array);
        }
        // Narrower integers, dates, times and timestamps come back from their i64 form.
        let widened = match (array.data_type(), data_type) {
            (DataType::Int64, DataType::Date32 | DataType::Time32(_)) => cast(&array, &DataType::Int32)?,
            _ => array,
        };
        Ok(cast(&widened, data_type)?)
    }
}

#[cfg(test)]
mod tests;
