//! PostgreSQL values as text (the snapshot's simple-query rows and the stream's `'t'`
//! values alike) into Arrow columns of the types the catalog gives.
//!
//! The session settings of both connections fix the text forms: `DateStyle=ISO`,
//! `TimeZone=UTC`, `bytea_output=hex`, `extra_float_digits=3` (exact floats). A value
//! that does not fit its column (`infinity` as a timestamp, `NaN` as a decimal) is an
//! error naming the table, the column and the value: the run stops rather than change
//! a row.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryBuilder, StringArray, StringBuilder};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, TimeUnit};

/// The Arrow type of a column of PostgreSQL type `type_oid` with `type_modifier`, or
/// why it has none.
pub fn arrow_type(type_oid: u32, type_modifier: i32) -> Result<DataType, String> {
    Ok(match type_oid {
        16 => DataType::Boolean,
        17 => DataType::Binary,
        20 => DataType::Int64,
        21 => DataType::Int16,
        23 => DataType::Int32,
        700 => DataType::Float32,
        701 => DataType::Float64,
        // name, text, json, bpchar, varchar, uuid, jsonb: their text.
        19 | 25 | 114 | 1042 | 1043 | 2950 | 3802 => DataType::Utf8,
        1082 => DataType::Date32,
        1114 => DataType::Timestamp(TimeUnit::Microsecond, None),
        1184 => DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        1700 => {
            if type_modifier < 4 {
                return Err("numeric without a precision has no fixed scale".into());
            }
            let modifier = type_modifier - 4;
            let (precision, scale) = ((modifier >> 16) & 0xffff, modifier & 0xffff);
            if precision > 38 {
                return Err(format!("numeric({precision}, {scale}) is wider than DECIMAL(38)"));
            }
            DataType::Decimal128(precision as u8, scale as i8)
        }
        other => return Err(format!("type oid {other} has no Arrow type in this source")),
    })
}

/// One column's values as text, converted at the end.
#[derive(Debug)]
pub struct TextColumn {
    data_type: DataType,
    text: StringBuilder,
}

/// A value that does not fit its column: its row in the batch and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    pub row: usize,
    pub value: String,
    pub reason: String,
}

impl TextColumn {
    pub fn new(data_type: DataType) -> TextColumn {
        TextColumn { data_type, text: StringBuilder::new() }
    }

    pub fn append(&mut self, value: Option<&str>) {
        self.text.append_option(value);
    }

    /// The column's values so far, converted; the builder starts again empty.
    pub fn finish(&mut self) -> Result<ArrayRef, BadValue> {
        let text = self.text.finish();
        convert(&text, &self.data_type)
    }
}

fn convert(text: &StringArray, data_type: &DataType) -> Result<ArrayRef, BadValue> {
    match data_type {
        DataType::Utf8 => Ok(Arc::new(text.clone())),
        DataType::Binary => {
            let mut binary = BinaryBuilder::with_capacity(text.len(), text.value_data().len() / 2);
            for row in 0..text.len() {
                if text.is_null(row) {
                    binary.append_null();
                    continue;
                }
                let value = text.value(row);
                let bytes = decode_hex(value).ok_or_else(|| BadValue {
                    row,
                    value: shorten(value),
                    reason: "not bytea's hex form (\\x…)".into(),
                })?;
                binary.append_value(bytes);
            }
            Ok(Arc::new(binary.finish()))
        }
        DataType::Timestamp(_, Some(_)) => {
            // `2024-05-01 10:00:00.5+00`: the offset written as Arrow reads it.
            let text: StringArray = text
                .iter()
                .map(|v| v.map(|v| if v.ends_with("+00") { format!("{v}:00") } else { v.to_owned() }))
                .collect();
            cast_text(&text, data_type)
        }
        _ => cast_text(text, data_type),
    }
}

fn cast_text(text: &StringArray, data_type: &DataType) -> Result<ArrayRef, BadValue> {
    let options = CastOptions { safe: false, ..CastOptions::default() };
    cast_with_options(text, data_type, &options).map_err(|error| {
        // Found again value by value, only on this path.
        let row = (0..text.len())
            .find(|&row| cast_with_options(&text.slice(row, 1), data_type, &options).is_err())
            .unwrap_or(0);
        BadValue { row, value: shorten(text.value(row)), reason: error.to_string() }
    })
}

fn decode_hex(value: &str) -> Option<Vec<u8>> {
    let digits = value.strip_prefix("\\x")?.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    digits.chunks(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

/// A value for a message: at most 64 characters.
fn shorten(value: &str) -> String {
    match value.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BinaryArray, Decimal128Array, Int64Array, TimestampMicrosecondArray};

    fn column(data_type: DataType, values: &[Option<&str>]) -> Result<ArrayRef, BadValue> {
        let mut column = TextColumn::new(data_type);
        values.iter().for_each(|v| column.append(*v));
        column.finish()
    }

    #[test]
    fn types_of_the_catalog() {
        assert_eq!(arrow_type(20, -1), Ok(DataType::Int64));
        assert_eq!(arrow_type(1700, (12 << 16 | 2) + 4), Ok(DataType::Decimal128(12, 2)));
        assert!(arrow_type(1700, -1).is_err());
        assert!(arrow_type(1700, (60 << 16) + 4).is_err());
        assert!(arrow_type(600, -1).is_err());
    }

    #[test]
    fn text_into_arrow_values() {
        let ints = column(DataType::Int64, &[Some("42"), None]).unwrap();
        assert_eq!(ints.as_any().downcast_ref::<Int64Array>().unwrap().value(0), 42);
        assert!(ints.is_null(1));
        let booleans = column(DataType::Boolean, &[Some("t"), Some("f")]).unwrap();
        let booleans = booleans.as_any().downcast_ref::<arrow::array::BooleanArray>().unwrap();
        assert!(booleans.value(0) && !booleans.value(1));
        let decimals = column(DataType::Decimal128(12, 2), &[Some("12.50")]).unwrap();
        assert_eq!(decimals.as_any().downcast_ref::<Decimal128Array>().unwrap().value(0), 1250);
        let bytes = column(DataType::Binary, &[Some("\\x00ff")]).unwrap();
        assert_eq!(bytes.as_any().downcast_ref::<BinaryArray>().unwrap().value(0), &[0, 255]);
        let times = column(DataType::Timestamp(TimeUnit::Microsecond, None), &[Some("2024-05-01 10:00:00.5")]).unwrap();
        assert_eq!(times.as_any().downcast_ref::<TimestampMicrosecondArray>().unwrap().value(0), 1_714_557_600_500_000);
        let zoned = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
        let zoned = column(zoned, &[Some("2024-05-01 10:00:00+00")]).unwrap();
        assert_eq!(zoned.as_any().downcast_ref::<TimestampMicrosecondArray>().unwrap().value(0), 1_714_557_600_000_000);
    }

    #[test]
    fn a_value_that_does_not_fit_names_its_row() {
        let bad = column(DataType::Int32, &[Some("1"), Some("99999999999")]).unwrap_err();
        assert_eq!((bad.row, bad.value.as_str()), (1, "99999999999"));
        let bad = column(DataType::Binary, &[Some("\\x0")]).unwrap_err();
        assert_eq!(bad.row, 0);
        assert!(column(DataType::Timestamp(TimeUnit::Microsecond, None), &[Some("infinity")]).is_err());
    }
}
