//! Exact numbers in JSON rows: a number that does not fit its column exactly is a bad
//! row, never a changed value.
//!
//! Arrow's JSON decoder converts a number it cannot parse as the column's integer type
//! through `f64`, truncating: `5.5` becomes 5 in a BIGINT column, `-128.4` becomes -128
//! in a TINYINT, `-9223372036854775809` becomes the smallest BIGINT; `1767225600123.5`
//! becomes a whole millisecond in a TIMESTAMP(3) and `1e300` the largest timestamp; a
//! DECIMAL(10, 2) keeps two of the decimals of `1.234`. It also reads a numeric string
//! (`"5.5"`) the same way for an integer or decimal column, and keeps the digits of its
//! unit from the fraction of a timestamp string (`"2026-01-01 00:00:00.1239"` is
//! `.123` in a TIMESTAMP(3)).
//!
//! So a [`NumberAudit`] checks the values of the columns at risk (integers, decimals,
//! timestamps) from their text, exactly ([`NumberAudit::first_misfit`]): an integer
//! column takes an integral value in its type's range (`42.0` and `4.2e1` are 42), a
//! decimal column at most its scale of decimal places and its precision of digits, a
//! timestamp column an integral number of its unit within the years 0000-9999 (see
//! [`crate::temporal`]) or text with no finer fraction than its unit (see
//! [`crate::exact`], which reads every value's text). The first
//! value that does not fit sends the chunk to the decoder's record-by-record path, where
//! the audit of each record names it. The scan lexes the chunk (strings are skipped
//! eight bytes at a time) and looks at top-level keys only, which is where the decoder
//! reads columns. It assumes well-formed JSON: a line it misreads is one Arrow rejects
//! anyway.
//!
//! # The quick test
//!
//! The exact scan costs about 40% of Arrow's own decoding, so a clean chunk is first
//! put to a quicker, complete test ([`NumberAudit::may_misfit`]), and the exact scan
//! runs only when it fails. Arrow changes a value only through its `f64` fallback,
//! which it takes for a JSON number (never for a string: an integer column parses a
//! string strictly) whose text is not an integer of the column's type:
//! - a number with a fraction or an exponent: every column value follows its key
//!   (`"key"`, optional whitespace, `:`, optional whitespace), so the test looks for
//!   such a value whose digits are followed by `.`, `e` or `E`;
//! - an integer beyond the type's range: it fails to convert, except that a BIGINT
//!   just below its minimum rounds to the minimum, and a timestamp saturates to the
//!   smallest or largest i64; so a decoded BIGINT or timestamp of exactly i64::MIN or
//!   i64::MAX also runs the exact scan ([`NumberAudit::checks_extremes`]).
//!
//! A timestamp string can only be cut when its fraction has more digits than the
//! column's unit holds, so a chunk with a timestamp column also runs the exact scan
//! when some `.` in it is followed by more digits than that (`exact::has_long_fraction`;
//! a chunk whose timestamps have three digits, and no other long fraction, passes).
//!
//! A decimal column parses strings and numbers alike, cutting extra decimal places, so
//! a schema with a decimal column always runs the exact scan.
//!
//! Cost, counted with cachegrind on the decode bench's 200,000 NEXMark bids as JSON
//! (`benches/decode.rs`): 6,950 instructions per row decoded against 5,810 before the
//! audit (+20%), most of it the quick test; the exact scan alone would add 2,250. (Counted
//! before the test for long timestamp fractions, one more memchr pass for `.`, was
//! added.)

use arrow::datatypes::{DataType, Schema};

use crate::diagnose::misfit_reason;
use crate::exact::{Misfit, decimal_misfit, fraction_digits, fraction_misfit, has_long_fraction, integer_misfit};
use crate::temporal::timestamp_bounds;

/// What a column at risk accepts.
#[derive(Debug, Clone, Copy)]
enum Fit {
    /// An integral value in `[min, max]`; also read from a numeric string.
    Integer { min: i128, max: i128 },
    /// At most `scale` decimal places and `precision` digits; also read from a numeric
    /// string.
    Decimal { precision: u8, scale: i8 },
    /// An integral number in `[min, max]` (units since the epoch), or a string whose
    /// fraction of seconds has at most `digits` digits (beyond trailing zeros).
    Timestamp { min: i64, max: i64, digits: u8 },
}

#[derive(Debug)]
struct AuditedColumn {
    name: String,
    /// The first eight bytes of the name as a little-endian word (zero-padded).
    name_word: u64,
    data_type: DataType,
    fit: Fit,
}

/// Checks the numbers of the columns at risk in JSON rows; see the module doc.
#[derive(Debug)]
pub(crate) struct NumberAudit {
    columns: Vec<AuditedColumn>,
    /// A decimal column is at risk from any value: the quick test does not apply.
    has_decimal: bool,
    /// The fewest digits of fractional seconds a timestamp column holds, if any.
    fraction_digits: Option<u8>,
    /// Bit `n` is set when a column's name is `n` bytes long (`n < 64`), or bit 63 for
    /// longer names: most keys are rejected by their length alone.
    name_lengths: u64,
}

impl NumberAudit {
    /// The audit of `schema`'s columns, or `None` when no column is at risk.
    pub(crate) fn new(schema: &Schema) -> Option<NumberAudit> {
        let columns: Vec<AuditedColumn> = schema
            .fields()
            .iter()
            .filter_map(|field| {
                let fit = fit_of(field.data_type())?;
                let name = field.name().clone();
                let name_word = word_of(name.as_bytes());
                Some(AuditedColumn { name, name_word, data_type: field.data_type().clone(), fit })
            })
            .collect();
        let name_lengths = columns.iter().fold(0u64, |mask, column| mask | length_bit(column.name.len()));
        let has_decimal = columns.iter().any(|column| matches!(column.fit, Fit::Decimal { .. }));
        let fraction_digits = (columns.iter())
            .filter_map(|column| match column.fit {
                Fit::Timestamp { digits, .. } => Some(digits),
                _ => None,
            })
            .min();
        (!columns.is_empty()).then_some(NumberAudit { columns, has_decimal, fraction_digits, name_lengths })
    }

    /// The quick, complete test: `false` when no value of `bytes` can be changed by
    /// Arrow's decoder, short of a decoded extreme (see the module doc).
    pub(crate) fn may_misfit(&self, bytes: &[u8]) -> bool {
        self.has_decimal
            || has_fractional_value(bytes)
            || self.fraction_digits.is_some_and(|digits| has_long_fraction(bytes, digits))
    }

    /// Whether a decoded value of `data_type` equal to i64::MIN or i64::MAX may have
    /// been rounded or saturated by Arrow's decoder.
    pub(crate) fn checks_extremes(data_type: &DataType) -> bool {
        matches!(data_type, DataType::Int64 | DataType::Timestamp(_, _))
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
                    let (end, has_escape) = string_end(bytes, at + 1);
                    let content = &bytes[at + 1..end];
                    if depth == 1 && expect_key {
                        expect_key = false;
                        pending = self.column(content, word_at(bytes, at + 1, content.len()), has_escape);
                    } else if let Some(column) = pending.take()
                        && let Some(reason) = column.check_string(content, has_escape)
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

    /// The audited column named by the raw key `key`, whose first eight bytes are
    /// `key_word` and which holds escapes when `has_escape`.
    fn column(&self, key: &[u8], key_word: u64, has_escape: bool) -> Option<&AuditedColumn> {
        if has_escape {
            let key = unescape(key)?;
            return self.columns.iter().find(|column| column.name == key);
        }
        if self.name_lengths & length_bit(key.len()) == 0 {
            return None;
        }
        self.columns.iter().find(|column| {
            column.name_word == key_word
                && column.name.len() == key.len()
                && (key.len() <= 8 || column.name.as_bytes() == key)
        })
    }
}

impl AuditedColumn {
    fn check_number(&self, text: &[u8]) -> Option<String> {
        let why = match self.fit {
            Fit::Integer { min, max } => integer_misfit(text, min, max),
            Fit::Decimal { precision, scale } => decimal_misfit(text, precision, scale),
            // Nanoseconds in an i64 span only the years 1677-2262: their bound is the i64's.
            Fit::Timestamp { min, max, .. } => match integer_misfit(text, i128::from(min), i128::from(max)) {
                Some(Misfit::OutOfRange) if (min, max) != (i64::MIN, i64::MAX) => Some(Misfit::OutsideYears),
                other => other,
            },
        }?;
        Some(self.reason(&String::from_utf8_lossy(text), why))
    }

    /// Checks the raw content of a string value, which holds escapes when `has_escape`.
    fn check_string(&self, content: &[u8], has_escape: bool) -> Option<String> {
        let unescaped;
        let text = match has_escape {
            // A string that does not unescape is one Arrow rejects.
            true => {
                unescaped = unescape(content)?;
                unescaped.as_bytes()
            }
            false => content,
        };
        let why = match self.fit {
            Fit::Integer { min, max } => integer_misfit(text, min, max),
            Fit::Decimal { precision, scale } => decimal_misfit(text, precision, scale),
            // The years of timestamp text are checked on the decoded value (`crate::temporal`).
            Fit::Timestamp { digits, .. } => fraction_misfit(text, digits),
        }?;
        Some(self.reason(&format!("{:?}", String::from_utf8_lossy(text)), why))
    }

    fn reason(&self, found: &str, why: Misfit) -> String {
        misfit_reason(&self.name, &self.data_type, found, why)
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
        DataType::Decimal32(precision, scale)
        | DataType::Decimal64(precision, scale)
        | DataType::Decimal128(precision, scale)
        | DataType::Decimal256(precision, scale) => Some(Fit::Decimal { precision: *precision, scale: *scale }),
        DataType::Timestamp(unit, _) => {
            let (min, max) = timestamp_bounds(*unit);
            Some(Fit::Timestamp { min, max, digits: fraction_digits(*unit) })
        }
        _ => None,
    }
}

/// The text of the raw content of a JSON string that holds escapes; `None` when it is
/// not a valid string.
fn unescape(content: &[u8]) -> Option<String> {
    let mut quoted = Vec::with_capacity(content.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(content);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).ok()
}

/// The bit of [`NumberAudit::name_lengths`] for a name of `length` bytes.
fn length_bit(length: usize) -> u64 {
    1u64 << length.min(63)
}

/// Bytes 0x01 repeated, for the word-at-a-time search of [`string_end`].
const ONES: u64 = 0x0101_0101_0101_0101;
/// Bytes 0x80 repeated.
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// A word whose bytes' high bits are set where a byte of `word` equals `byte` (and
/// maybe above such a byte: the lowest one set is exact).
fn bytes_equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// Up to eight bytes as a little-endian word, zero-padded.
fn word_of(bytes: &[u8]) -> u64 {
    if let Some(word) = bytes.first_chunk::<8>() {
        return u64::from_le_bytes(*word);
    }
    bytes.iter().rev().fold(0, |word, byte| word << 8 | u64::from(*byte))
}

/// The first `length` (at most eight) bytes of `bytes[from..]` as a little-endian
/// word, zero-padded: one load when eight bytes follow `from`.
fn word_at(bytes: &[u8], from: usize, length: usize) -> u64 {
    let Some(word) = bytes.get(from..).and_then(<[u8]>::first_chunk::<8>) else {
        return word_of(&bytes[from..from + length.min(8)]);
    };
    let word = u64::from_le_bytes(*word);
    if length >= 8 { word } else { word & ((1u64 << (length * 8)) - 1) }
}

/// The index of the closing quote of the string whose content starts at `from` (or
/// `bytes.len()` when it is not closed), and whether the string holds an escape.
/// Reads eight bytes at a time.
fn string_end(bytes: &[u8], from: usize) -> (usize, bool) {
    let mut at = from;
    let mut has_escape = false;
    while let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*word);
        let hits = bytes_equal(word, b'"') | bytes_equal(word, b'\\');
        if hits == 0 {
            at += 8;
            continue;
        }
        at += (hits.trailing_zeros() / 8) as usize;
        if bytes[at] == b'"' {
            return (at, has_escape);
        }
        // An escape: skip the escaped byte.
        has_escape = true;
        at += 2;
    }
    while at < bytes.len() {
        match bytes[at] {
            b'"' => return (at, has_escape),
            b'\\' => {
                has_escape = true;
                at += 2;
            }
            _ => at += 1,
        }
    }
    (bytes.len(), has_escape)
}

/// Whether a value of `bytes` written after a key (`"key" : `) is a number with a
/// fraction or an exponent. Finds colons eight bytes at a time.
fn has_fractional_value(bytes: &[u8]) -> bool {
    let mut next = 0;
    loop {
        let colon = match bytes.get(next..).and_then(<[u8]>::first_chunk::<8>) {
            Some(word) => {
                let hits = bytes_equal(u64::from_le_bytes(*word), b':');
                if hits == 0 {
                    next += 8;
                    continue;
                }
                next + (hits.trailing_zeros() / 8) as usize
            }
            None => match bytes[next..].iter().position(|b| *b == b':') {
                Some(index) => next + index,
                None => return false,
            },
        };
        next = colon + 1;
        if bytes[..colon].iter().rev().find(|b| !is_json_space(**b)) == Some(&b'"')
            && number_with_fraction(bytes, colon + 1)
        {
            return true;
        }
    }
}

/// Whether a number with a fraction or an exponent starts at `from`, after optional
/// whitespace.
fn number_with_fraction(bytes: &[u8], from: usize) -> bool {
    let mut at = from;
    while bytes.get(at).copied().is_some_and(is_json_space) {
        at += 1;
    }
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    let digits_start = at;
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at > digits_start && matches!(bytes.get(at), Some(b'.' | b'e' | b'E'))
}

fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
}

/// The end of the number token starting at `from`.
fn number_end(bytes: &[u8], from: usize) -> usize {
    let mut at = from + 1;
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    while bytes.get(at).is_some_and(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn strings_end_at_their_first_unescaped_quote() {
        for (text, end, has_escape) in [
            ("abc\"", 3, false),
            ("a\\\"b\"", 4, true),
            ("0123456789abcdef\"x", 16, false),
            ("0123456\\\\\"", 9, true),
            ("12345678\\\"9\"", 11, true),
            ("no end", 6, false),
            ("", 0, false),
        ] {
            assert_eq!(string_end(text.as_bytes(), 0), (end, has_escape), "{text:?}");
        }
        assert_eq!(word_at(b"abc\"rest of it", 0, 3), u64::from_le_bytes(*b"abc\0\0\0\0\0"));
        assert_eq!(word_at(b"ab", 0, 2), word_of(b"ab"));
    }

    #[test]
    fn keys_of_any_length_are_matched() {
        let schema = Schema::new(vec![
            Field::new("exactly8", DataType::Int64, true),
            Field::new("a_rather_long_column_name", DataType::Int64, true),
            Field::new("a_rather_long_column_nam", DataType::Utf8, true),
            Field::new("x", DataType::Int64, true),
        ]);
        let audit = NumberAudit::new(&schema).expect("at risk");
        for (line, misfit) in [
            (r#"{"exactly8":1.5}"#, true),
            (r#"{"exactly9x":1.5}"#, false),
            (r#"{"a_rather_long_column_name":1.5}"#, true),
            (r#"{"a_rather_long_column_nam":"1.5"}"#, false),
            (r#"{"a_rather_long_column_namX":1.5}"#, false),
            (r#"{"x":1.5}"#, true),
            (r#"{"x":1}"#, false),
        ] {
            assert_eq!(audit.first_misfit(line.as_bytes()).is_some(), misfit, "{line}");
        }
    }

    #[test]
    fn the_quick_test_flags_every_value_with_a_fraction_or_an_exponent() {
        for (text, flagged) in [
            (r#"{"id":5}"#, false),
            (r#"{"id":5.5}"#, true),
            (r#"{"id" : -5e3}"#, true),
            (r#"{"id":"5.5","ts":"2026-01-01 00:00:00.123"}"#, false),
            (r#"{"url":"http://x:8080/a.b","n":[1.5]}"#, false),
            (r#"{"n":{"deep":1E2}}"#, true),
            ("{\"n\":\t\r\n0.0}", true),
            (r#"{"n":12"#, false),
            (r#"{"n":1.""#, true),
        ] {
            assert_eq!(has_fractional_value(text.as_bytes()), flagged, "{text}");
        }
        let decimal = Schema::new(vec![Field::new("d", DataType::Decimal128(10, 2), true)]);
        let audit = NumberAudit::new(&decimal).expect("at risk");
        assert!(audit.may_misfit(br#"{"d":"1"}"#), "a decimal column always takes the exact scan");
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
