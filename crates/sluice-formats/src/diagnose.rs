//! Why a line failed to decode, in words that name the column and the value at fault.
//!
//! Runs only for records the decoder already rejected, so it may be slow. It re-checks
//! the record piece by piece (the syntax, the field count, each column alone with
//! Arrow's own decoder and the range checks); when no piece explains the failure, the
//! decoder's message is the reason (for a JSON number that does not fit its column,
//! the audit's, which names the number as written).

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use serde_json::Value;

use crate::decode::{DecoderOptions, RowFormat, trim_line_break};
use crate::exact::{Misfit, text_misfit};
use crate::header::UTF8_BOM;
use crate::json_numbers::NumberAudit;
use crate::temporal;

/// A value quoted in a reason is cut to this many characters.
const MAX_VALUE_CHARS: usize = 60;

/// What a byte order mark is called in reasons.
pub(crate) const BOM_REASON: &str = "a UTF-8 byte order mark (U+FEFF)";

/// The reason `line` is bad; `arrow_reason` is Arrow's own message for it.
pub(crate) fn reason(options: &DecoderOptions, line: &[u8], arrow_reason: &str) -> String {
    let line = trim_line_break(line);
    if let Some(at) = memchr::memmem::find(line, UTF8_BOM) {
        return bom_reason(options, line, at);
    }
    let found = match options.format {
        RowFormat::Csv { delimiter, .. } => csv_reason(&options.schema, delimiter, line),
        RowFormat::Json => json_reason(&options.schema, line),
    };
    found.unwrap_or_else(|| arrow_reason.to_string())
}

/// Where the byte order mark at byte `at` of `line` is, in words: which CSV column, and
/// whether it comes before the value (invisible in most editors, it still makes the
/// value unreadable).
fn bom_reason(options: &DecoderOptions, line: &[u8], at: usize) -> String {
    let column = String::from_utf8_lossy(&line[..at]).chars().count() + 1;
    let RowFormat::Csv { delimiter, .. } = options.format else {
        let before = line[..at].iter().all(u8::is_ascii_whitespace);
        return match before {
            true => format!("{BOM_REASON} before the JSON object"),
            false => format!("{BOM_REASON} at column {column}"),
        };
    };
    // The field holding it: delimiters outside quotes before it.
    let (mut field, mut in_quotes, mut field_start) = (0, false, 0);
    for (index, byte) in line[..at].iter().enumerate() {
        if *byte == b'"' {
            in_quotes = !in_quotes;
        } else if *byte == delimiter && !in_quotes {
            field += 1;
            field_start = index + 1;
        }
    }
    let place = match line[field_start..at].iter().all(|b| *b == b'"') {
        true => "before the value",
        false => "inside the value",
    };
    match options.schema.fields().get(field) {
        Some(column) => format!("column `{}`: {BOM_REASON} {place}", column.name()),
        None => format!("{BOM_REASON} at column {column}"),
    }
}

/// The SQL name of a column type, as the SQL layer spells it.
pub(crate) fn sql_type(data_type: &DataType) -> String {
    let name = match data_type {
        DataType::Boolean => "BOOLEAN",
        DataType::Int8 => "TINYINT",
        DataType::Int16 => "SMALLINT",
        DataType::Int32 => "INT",
        DataType::Int64 => "BIGINT",
        DataType::UInt8 => "TINYINT UNSIGNED",
        DataType::UInt16 => "SMALLINT UNSIGNED",
        DataType::UInt32 => "INT UNSIGNED",
        DataType::UInt64 => "BIGINT UNSIGNED",
        DataType::Float16 | DataType::Float32 => "FLOAT",
        DataType::Float64 => "DOUBLE",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR",
        DataType::Date32 | DataType::Date64 => "DATE",
        DataType::Timestamp(unit, tz) => {
            let precision = match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            let kind = if tz.is_some() { "TIMESTAMP_LTZ" } else { "TIMESTAMP" };
            return format!("{kind}({precision})");
        }
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => return format!("DECIMAL({p}, {s})"),
        other => return other.to_string(),
    };
    name.to_string()
}

fn type_mismatch(field: &FieldRef, found: &str) -> String {
    format!("column `{}`: expected {}, found {}", field.name(), sql_type(field.data_type()), found)
}

/// The reason of a value `found` (as written in the row) of column `name` that does
/// not fit its type exactly, e.g. ``column `d`: expected DECIMAL(10, 2), found 1.239
/// (more than 2 decimal places)``.
pub(crate) fn misfit_reason(name: &str, data_type: &DataType, found: &str, misfit: Misfit) -> String {
    format!("column `{name}`: expected {}, found {} ({})", sql_type(data_type), cut(found), misfit.describe())
}

/// How one value fails its column: it does not parse, or it parses to a value outside
/// the column's range.
enum ValueFailure {
    Parse,
    OutsideYears,
}

impl ValueFailure {
    fn reason(self, field: &FieldRef, found: &str) -> String {
        match self {
            ValueFailure::Parse => type_mismatch(field, found),
            ValueFailure::OutsideYears => {
                format!("{} ({})", type_mismatch(field, found), Misfit::OutsideYears.describe())
            }
        }
    }
}

/// Decodes all of `bytes` with `decoder` and checks the decoded timestamps' years.
fn decoded_fits<D>(bytes: &[u8], mut decode: D) -> Result<(), ValueFailure>
where
    D: FnMut(&[u8]) -> Result<Option<RecordBatch>, arrow::error::ArrowError>,
{
    let batch = decode(bytes).map_err(|_| ValueFailure::Parse)?;
    let outside =
        batch.iter().flat_map(|batch| batch.columns()).any(|column| temporal::first_outside_years(column).is_some());
    if outside { Err(ValueFailure::OutsideYears) } else { Ok(()) }
}

/// `text` cut to [`MAX_VALUE_CHARS`] characters, with `...` when cut.
pub(crate) fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_VALUE_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// The reason of a bad CSV line, or `None` when no piece of it explains the failure.
fn csv_reason(schema: &SchemaRef, delimiter: u8, line: &[u8]) -> Option<String> {
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(error) => return Some(format!("invalid UTF-8 at byte {}", error.valid_up_to() + 1)),
    };
    let fields = match split_csv(text, char::from(delimiter)) {
        Ok(fields) => fields,
        Err(reason) => return Some(reason),
    };
    let expected = schema.fields().len();
    if fields.len() != expected {
        return Some(format!("expected {expected} fields, found {}", fields.len()));
    }
    for (index, (field, value)) in schema.fields().iter().zip(&fields).enumerate() {
        if value.is_empty() {
            if !field.is_nullable() {
                return Some(format!("missing required column `{}` (empty field)", field.name()));
            }
            continue;
        }
        if let Some(misfit) = text_misfit(field.data_type(), value.as_bytes()) {
            return Some(misfit_reason(field.name(), field.data_type(), &format!("{value:?}"), misfit));
        }
        if let Err(failure) = csv_column_fits(schema, delimiter, index, line) {
            return Some(failure.reason(field, &cut(&format!("{value:?}"))));
        }
    }
    None
}

/// Whether column `index` of `line` decodes with Arrow's CSV decoder, in range.
fn csv_column_fits(schema: &SchemaRef, delimiter: u8, index: usize, line: &[u8]) -> Result<(), ValueFailure> {
    let mut decoder = arrow::csv::ReaderBuilder::new(schema.clone())
        .with_header(false)
        .with_delimiter(delimiter)
        .with_projection(vec![index])
        .with_batch_size(1)
        .build_decoder();
    let mut bytes = line.to_vec();
    bytes.push(b'\n');
    decoded_fits(&bytes, |bytes| {
        decoder.decode(bytes)?;
        decoder.flush()
    })
}

/// The fields of one CSV line, unquoted as the CSV decoder does: a field that starts
/// with a quote runs to the closing quote, and a doubled quote inside it is one quote.
fn split_csv(line: &str, delimiter: char) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut at_start = true;
    let mut position = 0;
    while let Some(c) = chars.next() {
        position += 1;
        if at_start && c == '"' {
            let opened = position;
            loop {
                match chars.next() {
                    None => {
                        return Err(format!("unterminated quoted field opened at column {opened}"));
                    }
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        position += 2;
                        field.push('"');
                    }
                    Some('"') => {
                        position += 1;
                        break;
                    }
                    Some(other) => {
                        position += 1;
                        field.push(other);
                    }
                }
            }
            at_start = false;
        } else if c == delimiter {
            fields.push(std::mem::take(&mut field));
            at_start = true;
        } else {
            field.push(c);
            at_start = false;
        }
    }
    fields.push(field);
    Ok(fields)
}

/// The reason of a bad JSON line, or `None` when no piece of it explains the failure.
fn json_reason(schema: &SchemaRef, line: &[u8]) -> Option<String> {
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(error) => return Some(json_syntax(&error)),
    };
    let Value::Object(object) = value else {
        return Some(format!("expected a JSON object, found {}", json_kind(&value)));
    };
    // A number that does not fit its column, named as written (serde_json's `Value`
    // has rounded it).
    if let Some(reason) = NumberAudit::new(schema).and_then(|audit| audit.first_misfit(line)) {
        return Some(reason);
    }
    for field in schema.fields() {
        match object.get(field.name()) {
            None if !field.is_nullable() => {
                return Some(format!("missing required column `{}`", field.name()));
            }
            Some(Value::Null) if !field.is_nullable() => {
                return Some(format!("column `{}`: null in a NOT NULL column", field.name()));
            }
            None | Some(Value::Null) => {}
            Some(value) => {
                if let Err(failure) = json_value_fits(field, value) {
                    return Some(failure.reason(field, &cut(&value.to_string())));
                }
            }
        }
    }
    None
}

/// `invalid JSON at column 17: expected ':'`, from serde_json's error.
fn json_syntax(error: &serde_json::Error) -> String {
    let message = error.to_string();
    // serde_json appends " at line L column C"; the column is given first instead.
    let message = match message.rfind(" at line ") {
        Some(end) => &message[..end],
        None => &message,
    };
    format!("invalid JSON at column {}: {message}", error.column())
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether `value` alone decodes into `field` with Arrow's JSON decoder, in range.
fn json_value_fits(field: &FieldRef, value: &Value) -> Result<(), ValueFailure> {
    let schema = Arc::new(Schema::new(vec![field.clone()]));
    let Ok(mut decoder) = arrow::json::ReaderBuilder::new(schema).build_decoder() else {
        return Ok(());
    };
    let mut object = serde_json::Map::new();
    object.insert(field.name().clone(), value.clone());
    let Ok(bytes) = serde_json::to_vec(&Value::Object(object)) else {
        return Ok(());
    };
    decoded_fits(&bytes, |bytes| {
        decoder.decode(bytes)?;
        decoder.flush()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_csv_unquotes_like_the_decoder() {
        assert_eq!(split_csv("a,b,,c", ','), Ok(vec!["a".into(), "b".into(), "".into(), "c".into()]));
        assert_eq!(
            split_csv(r#""x, y","say ""hi""",z"#, ','),
            Ok(vec!["x, y".into(), r#"say "hi""#.into(), "z".into()])
        );
        assert_eq!(split_csv("a;b", ';'), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(split_csv("", ','), Ok(vec!["".into()]));
        assert_eq!(split_csv(r#"a,"b"#, ','), Err("unterminated quoted field opened at column 3".into()));
    }

    #[test]
    fn sql_types_read_like_sql() {
        assert_eq!(sql_type(&DataType::Int64), "BIGINT");
        assert_eq!(sql_type(&DataType::Timestamp(TimeUnit::Millisecond, None)), "TIMESTAMP(3)");
        assert_eq!(sql_type(&DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))), "TIMESTAMP_LTZ(6)");
        assert_eq!(sql_type(&DataType::Decimal128(10, 2)), "DECIMAL(10, 2)");
        assert_eq!(sql_type(&DataType::Utf8), "VARCHAR");
    }

    #[test]
    fn cut_marks_long_values() {
        assert_eq!(cut("short"), "short");
        let long = "x".repeat(100);
        assert_eq!(cut(&long), format!("{}...", "x".repeat(MAX_VALUE_CHARS)));
    }
}
