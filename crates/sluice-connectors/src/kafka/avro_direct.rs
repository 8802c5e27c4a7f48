//! The direct Avro decoder: a datum of a flat record (every field a primitive, or a
//! union of primitives) read straight from its bytes, each field the columns name into
//! its column's slot, the others checked and skipped without allocating. It yields the
//! same values as the general decoder (`GenericDatumReader`), which reads every other
//! writer schema; a test holds the two to the same rows and the same bad messages.

use apache_avro::Decimal;
use apache_avro::Schema as AvroSchema;
use apache_avro::schema::InnerDecimalSchema;
use apache_avro::types::Value;

/// The most bytes one string, bytes or array of a datum may claim: a corrupt length
/// beyond it is a bad message, never an allocation of that size.
pub const MAX_ALLOCATION_BYTES: usize = 64 * 1024 * 1024;

/// A type the direct decoder reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simple {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Date,
    TimeMillis,
    TimeMicros,
    TimestampMillis,
    TimestampMicros,
    LocalTimestampMillis,
    LocalTimestampMicros,
    /// A decimal stored as bytes.
    Decimal,
}

impl Simple {
    fn of(schema: &AvroSchema) -> Option<Simple> {
        Some(match schema {
            AvroSchema::Null => Simple::Null,
            AvroSchema::Boolean => Simple::Boolean,
            AvroSchema::Int => Simple::Int,
            AvroSchema::Long => Simple::Long,
            AvroSchema::Float => Simple::Float,
            AvroSchema::Double => Simple::Double,
            AvroSchema::Bytes => Simple::Bytes,
            AvroSchema::String => Simple::String,
            AvroSchema::Date => Simple::Date,
            AvroSchema::TimeMillis => Simple::TimeMillis,
            AvroSchema::TimeMicros => Simple::TimeMicros,
            AvroSchema::TimestampMillis => Simple::TimestampMillis,
            AvroSchema::TimestampMicros => Simple::TimestampMicros,
            AvroSchema::LocalTimestampMillis => Simple::LocalTimestampMillis,
            AvroSchema::LocalTimestampMicros => Simple::LocalTimestampMicros,
            AvroSchema::Decimal(decimal) if matches!(decimal.inner, InnerDecimalSchema::Bytes) => Simple::Decimal,
            _ => return None,
        })
    }
}

/// One writer field: its branches (one unless a union) and the column it fills.
#[derive(Debug)]
struct Field {
    union: bool,
    branches: Vec<Simple>,
    column: Option<usize>,
}

/// The direct decoder of one flat writer record.
#[derive(Debug)]
pub(crate) struct Direct {
    fields: Vec<Field>,
}

impl Direct {
    /// The decoder of `schema` (`columns[c]`: the writer field of column `c`), if it is
    /// a record of primitives and unions of primitives.
    pub(crate) fn new(schema: &AvroSchema, columns: &[Option<usize>]) -> Option<Direct> {
        let AvroSchema::Record(record) = schema else { return None };
        let mut fields = Vec::with_capacity(record.fields.len());
        for (at, field) in record.fields.iter().enumerate() {
            let (union, branches) = match &field.schema {
                AvroSchema::Union(union) => {
                    (true, union.variants().iter().map(Simple::of).collect::<Option<Vec<_>>>()?)
                }
                schema => (false, vec![Simple::of(schema)?]),
            };
            let column = columns.iter().position(|c| *c == Some(at));
            fields.push(Field { union, branches, column });
        }
        Some(Direct { fields })
    }

    /// Reads `datum` whole, each named field's value into `slots[column]` (which the
    /// caller filled with nulls); the error is the reason, `truncated` when the datum
    /// ends early.
    pub(crate) fn read<'d>(&self, datum: &'d [u8], slots: &mut [Slot<'d>]) -> Result<(), Failure> {
        let mut input = Input { rest: datum };
        for field in &self.fields {
            let simple = match field.union {
                false => field.branches[0],
                true => {
                    let index = input.long()?;
                    let found = usize::try_from(index).ok().and_then(|i| field.branches.get(i));
                    *found.ok_or_else(|| {
                        Failure::Bad(format!("union index {index} out of {} branches", field.branches.len()))
                    })?
                }
            };
            let value = input.value(simple, field.column.is_some())?;
            if let Some(column) = field.column {
                slots[column] = value;
            }
        }
        match input.rest.len() {
            0 => Ok(()),
            left => Err(Failure::Trailing(left)),
        }
    }
}

/// A value read for a column: a string is left in its datum.
#[derive(Debug)]
pub(crate) enum Slot<'d> {
    Value(Value),
    Text(&'d str),
}

/// Why a datum could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    Truncated,
    Trailing(usize),
    Bad(String),
}

struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Failure> {
        if n > self.rest.len() {
            return Err(Failure::Truncated);
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    /// A zigzag varint of at most 10 bytes (bits past 64 dropped, as the general
    /// decoder does).
    fn long(&mut self) -> Result<i64, Failure> {
        let mut bits = 0u64;
        for shift in 0..10 {
            let byte = self.take(1)?[0];
            bits |= u64::from(byte & 0x7F) << (shift * 7);
            if byte >> 7 == 0 {
                return Ok(if bits & 1 == 0 { (bits >> 1) as i64 } else { !(bits >> 1) as i64 });
            }
        }
        Err(Failure::Bad("a variable-length integer longer than 10 bytes".to_owned()))
    }

    fn int(&mut self) -> Result<i32, Failure> {
        let long = self.long()?;
        i32::try_from(long).map_err(|_| Failure::Bad(format!("int {long} out of range")))
    }

    fn bytes(&mut self) -> Result<&'a [u8], Failure> {
        let len = self.long()?;
        let len = usize::try_from(len).map_err(|_| Failure::Bad(format!("a negative length {len}")))?;
        if len > MAX_ALLOCATION_BYTES {
            return Err(Failure::Bad(format!("a length of {len} bytes, beyond the bound of {MAX_ALLOCATION_BYTES}")));
        }
        self.take(len)
    }

    /// The value of `simple`; a bytes or string value not `kept` is checked, not copied,
    /// a kept string is left in the datum.
    fn value(&mut self, simple: Simple, kept: bool) -> Result<Slot<'a>, Failure> {
        Ok(Slot::Value(match simple {
            Simple::Null => Value::Null,
            Simple::Boolean => match self.take(1)?[0] {
                0 => Value::Boolean(false),
                1 => Value::Boolean(true),
                other => return Err(Failure::Bad(format!("a boolean of byte {other}"))),
            },
            Simple::Int => Value::Int(self.int()?),
            Simple::Long => Value::Long(self.long()?),
            Simple::Float => Value::Float(f32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"))),
            Simple::Double => Value::Double(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"))),
            Simple::Bytes if !kept => {
                self.bytes()?;
                Value::Null
            }
            Simple::Bytes => Value::Bytes(self.bytes()?.to_vec()),
            Simple::String => {
                let bytes = self.bytes()?;
                let text =
                    std::str::from_utf8(bytes).map_err(|e| Failure::Bad(format!("a string that is not UTF-8: {e}")))?;
                return Ok(match kept {
                    true => Slot::Text(text),
                    false => Slot::Value(Value::Null),
                });
            }
            Simple::Date => Value::Date(self.int()?),
            Simple::TimeMillis => Value::TimeMillis(self.int()?),
            Simple::TimeMicros => Value::TimeMicros(self.long()?),
            Simple::TimestampMillis => Value::TimestampMillis(self.long()?),
            Simple::TimestampMicros => Value::TimestampMicros(self.long()?),
            Simple::LocalTimestampMillis => Value::LocalTimestampMillis(self.long()?),
            Simple::LocalTimestampMicros => Value::LocalTimestampMicros(self.long()?),
            Simple::Decimal => {
                let bytes = self.bytes()?;
                match kept {
                    true => Value::Decimal(Decimal::from(bytes)),
                    false => Value::Null,
                }
            }
        }))
    }
}
