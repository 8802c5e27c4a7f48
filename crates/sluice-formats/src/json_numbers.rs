//! Exact numbers in JSON rows: a number that does not fit its column exactly is a bad
//! row, never a changed value.
//!
//! Arrow's JSON decoder converts a number it cannot parse as the column's integer type
//! through `f64`, truncating: `5.5` becomes 5 in a BIGINT column, `-128.4` becomes -128
//! in a TINYINT, `-9223372036854775809` becomes the smallest BIGINT; `1767225600123.5`
//! becomes a whole millisecond in a TIMESTAMP(3) and `1e300` the largest timestamp; a
//! DECIMAL(10, 2) keeps two of the decimals of `1.234`. It also reads a numeric string
//! (`"5.5"`) the same way for an integer or decimal column.
//!
//! So before Arrow decodes a chunk, a [`NumberAudit`] scans it for the values of the
//! columns at risk (integers, decimals, timestamps) and checks each number (and each
//! string of an integer or decimal column) from its text, exactly: an integer column
//! takes an integral value in its type's range (`42.0` and `4.2e1` are 42), a decimal
//! column at most its scale of decimal places, a timestamp column an integral value of
//! its unit within the years 0000-9999 (see [`crate::temporal`]). The first value that
//! does not fit sends the chunk to the decoder's record-by-record path, where the audit
//! of each record names it.
//!
//! The scan visits only the bytes outside strings one by one (memchr skips strings) and
//! looks at top-level keys only, which is where the decoder reads columns. It assumes
//! well-formed JSON: a line it misreads is one Arrow rejects anyway.

use arrow::datatypes::{DataType, Schema};

use crate::diagnose::sql_type;
use crate::temporal::timestamp_bounds;

/// What a column at risk accepts.
#[derive(Debug, Clone, Copy)]
enum Fit {
    /// An integral value in `[min, max]`; also read from a numeric string.
    Integer { min: i128, max: i128 },
    /// At most `scale` decimal places; also read from a numeric string.
    Decimal { scale: i8 },
    /// An integral number in `[min, max]` (units since the epoch); strings are dates.
    Timestamp { min: i64, max: i64 },
}

#[derive(Debug)]
struct AuditedColumn {
    name: String,
    sql_type: String,
    fit: Fit,
}

/// Checks the numbers of the columns at risk in JSON rows; see the module doc.
#[derive(Debug)]
pub(crate) struct NumberAudit {
    columns: Vec<AuditedColumn>,
}

impl NumberAudit {
    /// The audit of `schema`'s columns, or `None` when no column is at risk.
    pub(crate) fn new(schema: &Schema) -> Option<NumberAudit> {
        let columns: Vec<AuditedColumn> = schema
            .fields()
            .iter()
            .filter_map(|field| {
                let fit = fit_of(field.data_type())?;
                Some(AuditedColumn { name: field.name().clone(), sql_type: sql_type(field.data_type()), fit })
            })
            .collect();
        (!columns.is_empty()).then_some(NumberAudit { columns })
    }

    /// Why the first value of `bytes` (JSON lines) that does not fit its column does
    /// not, e.g. ``column `id`: expected BIGINT, found 5.5 (not an integer)``.
    pub(crate) fn first_misfit(&self, bytes: &[u8]) -> Option<String> {
        let mut at = 0;
        let mut depth = 0usize;
        let mut expect_key = false;
        let mut pending: Option<&AuditedColumn> = None;
        while at < bytes.len() {
            match bytes[at] {
                b'"' => {
                    let end = string_end(bytes, at + 1);
                    let content = &bytes[at + 1..end.min(bytes.len())];
                    if depth == 1 && expect_key {
                        expect_key = false;
                        pending = self.column(content);
                    } else if let Some(column) = pending.take()
                        && let Some(reason) = column.check_string(content)
                    {
                        return Some(reason);
                    }
                    at = end + 1;
                    continue;
                }
                b'-' | b'+' | b'.' | b'0'..=b'9' => {
                    let end = number_end(bytes, at);
                    if let Some(column) = pending.take()
                        && let Some(reason) = column.check_number(&bytes[at..end])
                    {
                        return Some(reason);
                    }
                    at = end;
                    continue;
                }
                b'{' | b'[' => {
                    depth += 1;
                    expect_key = bytes[at] == b'{' && depth == 1;
                    pending = None;
                }
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    pending = None;
                }
                b',' => expect_key = depth == 1,
                // A JSON line cannot hold a raw line break outside strings: a new record.
                b'\n' => (depth, expect_key, pending) = (0, false, None),
                b':' | b' ' | b'\t' | b'\r' => {}
                // true, false, null, or a syntax error.
                _ => pending = None,
            }
            at += 1;
        }
        None
    }

    /// The audited column named by the raw (still escaped) key `key`.
    fn column(&self, key: &[u8]) -> Option<&AuditedColumn> {
        if memchr::memchr(b'\\', key).is_none() {
            return self.columns.iter().find(|column| column.name.as_bytes() == key);
        }
        let mut quoted = Vec::with_capacity(key.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(key);
        quoted.push(b'"');
        let key: String = serde_json::from_slice(&quoted).ok()?;
        self.columns.iter().find(|column| column.name == key)
    }
}

impl AuditedColumn {
    fn check_number(&self, text: &[u8]) -> Option<String> {
        let why = match self.fit {
            Fit::Integer { min, max } => integer_misfit(text, min, max),
            Fit::Decimal { scale } => decimal_misfit(text, scale),
            Fit::Timestamp { min, max } => match integer_misfit(text, i128::from(min), i128::from(max)) {
                Some(Misfit::OutOfRange) => Some(Misfit::OutsideYears),
                other => other,
            },
        }?;
        Some(self.reason(&String::from_utf8_lossy(text), why))
    }

    fn check_string(&self, content: &[u8]) -> Option<String> {
        let why = match self.fit {
            Fit::Integer { min, max } => integer_misfit(content, min, max),
            Fit::Decimal { scale } => decimal_misfit(content, scale),
            // Timestamp text is checked on the decoded value (`crate::temporal`).
            Fit::Timestamp { .. } => None,
        }?;
        Some(self.reason(&format!("{:?}", String::from_utf8_lossy(content)), why))
    }

    fn reason(&self, found: &str, why: Misfit) -> String {
        let found = crate::diagnose::cut(found);
        format!("column `{}`: expected {}, found {found} ({})", self.name, self.sql_type, why.describe())
    }
}

/// How a number fails to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misfit {
    NotAnInteger,
    OutOfRange,
    OutsideYears,
    DecimalPlaces(i8),
}

impl Misfit {
    pub(crate) fn describe(self) -> String {
        match self {
            Misfit::NotAnInteger => "not an integer".to_string(),
            Misfit::OutOfRange => "out of range".to_string(),
            Misfit::OutsideYears => "outside the years 0000-9999".to_string(),
            Misfit::DecimalPlaces(scale) => format!("more than {scale} decimal places"),
        }
    }
}

fn fit_of(data_type: &DataType) -> Option<Fit> {
    let integer = |min: i128, max: i128| Some(Fit::Integer { min, max });
    match data_type {
        DataType::Int8 => integer(i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => integer(i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => integer(i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => integer(i64::MIN.into(), i64::MAX.into()),
        DataType::UInt8 => integer(0, u8::MAX.into()),
        DataType::UInt16 => integer(0, u16::MAX.into()),
        DataType::UInt32 => integer(0, u32::MAX.into()),
        DataType::UInt64 => integer(0, u64::MAX.into()),
        DataType::Decimal32(_, scale)
        | DataType::Decimal64(_, scale)
        | DataType::Decimal128(_, scale)
        | DataType::Decimal256(_, scale) => Some(Fit::Decimal { scale: *scale }),
        DataType::Timestamp(unit, _) => {
            let (min, max) = timestamp_bounds(*unit);
            Some(Fit::Timestamp { min, max })
        }
        _ => None,
    }
}

/// The index of the closing quote of the string whose content starts at `from`, or
/// `bytes.len()` when it is not closed.
fn string_end(bytes: &[u8], from: usize) -> usize {
    let mut at = from;
    while let Some(found) = memchr::memchr2(b'"', b'\\', bytes.get(at..).unwrap_or_default()) {
        if bytes[at + found] == b'"' {
            return at + found;
        }
        // An escape: skip the escaped byte.
        at += found + 2;
    }
    bytes.len()
}

/// The end of the number token starting at `from`.
fn number_end(bytes: &[u8], from: usize) -> usize {
    let length =
        bytes[from..].iter().take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')).count();
    from + length
}

/// A decimal number read exactly: `±digits × 10^exponent`, `digits` without leading or
/// trailing zeros (empty for zero).
#[derive(Debug, PartialEq, Eq)]
struct Exact<'a> {
    negative: bool,
    digits: Vec<&'a u8>,
    exponent: i64,
}

/// Reads `text` as a decimal number (JSON's syntax, also with a leading `+`, a bare
/// `.5` or `5.`); `None` when it is not one (the decoder then rejects it itself).
fn exact(text: &[u8]) -> Option<Exact<'_>> {
    let (negative, rest) = match text.first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let mantissa_end = rest.iter().position(|b| matches!(b, b'e' | b'E')).unwrap_or(rest.len());
    let (mantissa, exponent_text) = rest.split_at(mantissa_end);
    let (whole, fraction) = match mantissa.iter().position(|b| *b == b'.') {
        Some(point) => (&mantissa[..point], &mantissa[point + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    let all_digits = |part: &[u8]| part.iter().all(u8::is_ascii_digit);
    if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    let mut exponent = match exponent_text.get(1..) {
        None => 0i64,
        Some(exponent) => parse_exponent(exponent)?,
    };
    exponent = exponent.saturating_sub(fraction.len() as i64);
    let mut digits: Vec<&u8> = whole.iter().chain(fraction).skip_while(|b| **b == b'0').collect();
    while digits.last() == Some(&&b'0') {
        digits.pop();
        exponent = exponent.saturating_add(1);
    }
    Some(Exact { negative, digits, exponent })
}

/// An exponent's digits with an optional sign, saturating far beyond any real range.
fn parse_exponent(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value =
        digits.iter().fold(0i64, |value, digit| value.saturating_mul(10).saturating_add(i64::from(digit - b'0')));
    Some(if negative { -value } else { value })
}

/// How `text` fails to be an integer in `[min, max]`, if it is a number at all.
pub(crate) fn integer_misfit(text: &[u8], min: i128, max: i128) -> Option<Misfit> {
    if let Some(value) = plain_integer(text) {
        return (value < min || value > max).then_some(Misfit::OutOfRange);
    }
    let number = exact(text)?;
    if number.digits.is_empty() {
        return (min > 0 || max < 0).then_some(Misfit::OutOfRange);
    }
    if number.exponent < 0 {
        return Some(Misfit::NotAnInteger);
    }
    // i128 holds 38 digits; every column type's range is narrower.
    if (number.digits.len() as i64).saturating_add(number.exponent) > 38 {
        return Some(Misfit::OutOfRange);
    }
    let mut value: i128 = 0;
    for digit in &number.digits {
        value = value * 10 + i128::from(**digit - b'0');
    }
    value *= 10i128.pow(number.exponent as u32);
    let value = if number.negative { -value } else { value };
    (value < min || value > max).then_some(Misfit::OutOfRange)
}

/// The value of `text` when it is a plain integer of at most 18 digits (the common
/// case, read without allocating).
fn plain_integer(text: &[u8]) -> Option<i128> {
    let (negative, digits) = match text.split_first()? {
        (b'-', digits) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits.iter().fold(0i128, |value, digit| value * 10 + i128::from(digit - b'0'));
    Some(if negative { -value } else { value })
}

/// Whether `text` has more decimal places than `scale` (beyond trailing zeros).
fn decimal_misfit(text: &[u8], scale: i8) -> Option<Misfit> {
    if scale >= 0 && !text.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        return None;
    }
    let number = exact(text)?;
    (!number.digits.is_empty() && number.exponent < -i64::from(scale)).then_some(Misfit::DecimalPlaces(scale))
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn numbers_are_read_exactly() {
        let bigint = |text: &str| integer_misfit(text.as_bytes(), i64::MIN.into(), i64::MAX.into());
        for fits in
            ["0", "-0", "0.0", "5", "5.0", "5.", "+5", "4.2e1", "420E-1", "0.00e5", "-9223372036854775808", "1e18"]
        {
            assert_eq!(bigint(fits), None, "{fits}");
        }
        for (text, misfit) in [
            ("5.5", Misfit::NotAnInteger),
            (".5", Misfit::NotAnInteger),
            ("1e-1", Misfit::NotAnInteger),
            ("9223372036854775807.5", Misfit::NotAnInteger),
            ("9223372036854775808", Misfit::OutOfRange),
            ("-9223372036854775809", Misfit::OutOfRange),
            ("1e30", Misfit::OutOfRange),
            ("1e999999999999999999999", Misfit::OutOfRange),
            ("123456789012345678901234567890123456789012", Misfit::OutOfRange),
        ] {
            assert_eq!(bigint(text), Some(misfit), "{text}");
        }
        for not_a_number in ["", "-", "abc", "1e", "1.2.3", "0x10", "1e+", "."] {
            assert_eq!(bigint(not_a_number), None, "{not_a_number:?} is left to the decoder");
        }
        assert_eq!(integer_misfit(b"256", 0, 255), Some(Misfit::OutOfRange));
        assert_eq!(integer_misfit(b"0", 1, 2), Some(Misfit::OutOfRange));
        assert_eq!(decimal_misfit(b"1.230", 2), None);
        assert_eq!(decimal_misfit(b"1.231", 2), Some(Misfit::DecimalPlaces(2)));
        assert_eq!(decimal_misfit(b"1231e-3", 2), Some(Misfit::DecimalPlaces(2)));
    }

    #[test]
    fn the_scan_finds_top_level_values_only() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("nested", DataType::Struct(vec![Field::new("id", DataType::Int64, true)].into()), true),
        ]);
        let audit = NumberAudit::new(&schema).expect("id is at risk");
        let misfit = |line: &str| audit.first_misfit(line.as_bytes());
        assert_eq!(misfit(r#"{"id":5,"name":"5.5","x":1.5}"#), None);
        assert_eq!(misfit(r#"{"nested":{"id":5.5},"other":{"id":[1.5]}}"#), None);
        assert_eq!(misfit(r#"{"name":"\"id\":5.5","id":1}"#), None, "a key inside a string is data");
        assert_eq!(
            misfit("{\"id\":1}\n{\"id\" : 2.5}").as_deref(),
            Some("column `id`: expected BIGINT, found 2.5 (not an integer)")
        );
        assert!(misfit(r#"{"i\u0064":2.5}"#).is_some(), "an escaped key is the column it names");
        assert!(misfit("{\"id\":\"7.5\"}").is_some(), "a numeric string is read as a number");
        assert_eq!(NumberAudit::new(&Schema::new(vec![Field::new("name", DataType::Utf8, true)])).map(|_| ()), None);
    }
}
