//! Reading a value's text exactly: whether it fits its column without being rounded or
//! truncated.
//!
//! Arrow's decoders change some values silently: a DECIMAL keeps the first `scale`
//! decimal places of `1.239` (and reads `e5` as 0), a timestamp keeps the digits of its
//! unit from `00:00:00.1239` (and at most nine). So the text of the values at risk is
//! read here exactly, as `±digits × 10^exponent` for numbers ([`exact`]) and as the
//! digits after the decimal point for timestamps ([`fraction_misfit`]). A value that
//! does not fit is a bad row, with a [`Misfit`] that says why. Trailing zeros never make
//! a misfit: `1.230` fits DECIMAL(10, 2), `00:00:00.1230` fits TIMESTAMP(3).
//!
//! Used by the JSON number audit ([`crate::json_numbers`]), the CSV audit
//! ([`crate::csv_audit`]) and the reasons of bad rows ([`crate::diagnose`]).

use arrow::datatypes::{DataType, TimeUnit};

/// How a value fails to fit its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misfit {
    NotANumber,
    NotAnInteger,
    OutOfRange,
    OutsideYears,
    /// More decimal places than the scale.
    DecimalPlaces(i8),
    /// More digits before the decimal point than precision minus scale.
    WholeDigits(i16),
    /// A finer fraction of seconds than the precision.
    FractionDigits(u8),
}

impl Misfit {
    pub(crate) fn describe(self) -> String {
        match self {
            Misfit::NotANumber => "not a number".to_string(),
            Misfit::NotAnInteger => "not an integer".to_string(),
            Misfit::OutOfRange => "out of range".to_string(),
            Misfit::OutsideYears => "outside the years 0000-9999".to_string(),
            Misfit::DecimalPlaces(scale) => format!("more than {scale} decimal places"),
            Misfit::WholeDigits(digits) => format!("more than {digits} digits before the decimal point"),
            Misfit::FractionDigits(digits) => format!("more than {digits} digits of fractional seconds"),
        }
    }
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

/// Whether the numbers `a` and `b` (as [`exact`] reads them) are equal: `-0.0` is `0`.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn same_number(a: &[u8], b: &[u8]) -> bool {
    match (exact(a), exact(b)) {
        (Some(a), Some(b)) if a.digits.is_empty() => b.digits.is_empty(),
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
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
/// case, read in one pass without allocating).
fn plain_integer(text: &[u8]) -> Option<i128> {
    let (negative, digits) = match text.split_first()? {
        (b'-', digits) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut value: u64 = 0;
    for digit in digits {
        let digit = digit.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value * 10 + u64::from(digit);
    }
    let value = i128::from(value);
    Some(if negative { -value } else { value })
}

/// How `text` fails to be a value of a DECIMAL(`precision`, `scale`) without rounding:
/// more decimal places than `scale` (beyond trailing zeros), more digits before the
/// decimal point than `precision - scale`, or no number at all (Arrow reads some such
/// text, like `e5`, as 0).
pub(crate) fn decimal_misfit(text: &[u8], precision: u8, scale: i8) -> Option<Misfit> {
    let Some(number) = exact(text) else { return Some(Misfit::NotANumber) };
    if number.digits.is_empty() {
        return None;
    }
    if number.exponent < -i64::from(scale) {
        return Some(Misfit::DecimalPlaces(scale));
    }
    let whole_digits = (number.digits.len() as i64).saturating_add(number.exponent);
    let whole_digits_max = i16::from(precision) - i16::from(scale);
    (whole_digits > i64::from(whole_digits_max)).then_some(Misfit::WholeDigits(whole_digits_max))
}

/// The digits of fractional seconds a timestamp of `unit` holds: its precision.
pub(crate) fn fraction_digits(unit: TimeUnit) -> u8 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    }
}

/// Whether the timestamp `text` has a fraction of seconds finer than `digits` digits
/// (beyond trailing zeros). Looks where Arrow's parser reads the fraction: every form
/// it accepts with a fraction starts `YYYY-MM-DD HH:MM:SS.` (or `T` between), and it
/// reads every digit after the point, keeping the first nine; text it rejects is left
/// to it.
pub(crate) fn fraction_misfit(text: &[u8], digits: u8) -> Option<Misfit> {
    if text.get(FRACTION_POINT_AT) != Some(&b'.') {
        return None;
    }
    let fraction = text[FRACTION_POINT_AT + 1..].iter().take_while(|b| b.is_ascii_digit());
    fraction.skip(usize::from(digits)).any(|b| *b != b'0').then_some(Misfit::FractionDigits(digits))
}

/// Where a timestamp's decimal point stands: after `YYYY-MM-DD HH:MM:SS`.
const FRACTION_POINT_AT: usize = 19;

/// Whether some `.` of `bytes` is followed by more than `digits` digits: the quick,
/// complete test for [`fraction_misfit`] (and a decimal's places) over many values.
pub(crate) fn has_long_fraction(bytes: &[u8], digits: u8) -> bool {
    let digits = usize::from(digits);
    memchr::memchr_iter(b'.', bytes).any(|point| {
        let after = &bytes[point + 1..];
        after.iter().take(digits + 1).take_while(|b| b.is_ascii_digit()).count() > digits
    })
}

/// How the text of a CSV field fails to be a value of `data_type` exactly, for the
/// types whose text Arrow's CSV decoder may read changed (decimals and timestamps);
/// `None` for other types.
pub(crate) fn text_misfit(data_type: &DataType, text: &[u8]) -> Option<Misfit> {
    match data_type {
        DataType::Decimal32(precision, scale)
        | DataType::Decimal64(precision, scale)
        | DataType::Decimal128(precision, scale)
        | DataType::Decimal256(precision, scale) => decimal_misfit(text, *precision, *scale),
        DataType::Timestamp(unit, _) => fraction_misfit(text, fraction_digits(*unit)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
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
    }

    #[test]
    fn decimals_are_read_exactly() {
        let decimal = |text: &str| decimal_misfit(text.as_bytes(), 10, 2);
        for fits in ["1.230", "-1.5", "+.5", "5.", "12345678.99", "0012345678.9900", "1e2", "-0.000", "0e99", "1E-2"] {
            assert_eq!(decimal(fits), None, "{fits}");
        }
        for (text, misfit) in [
            ("1.231", Misfit::DecimalPlaces(2)),
            ("1231e-3", Misfit::DecimalPlaces(2)),
            ("1.12345e-30", Misfit::DecimalPlaces(2)),
            ("123456789", Misfit::WholeDigits(8)),
            ("1e8", Misfit::WholeDigits(8)),
            ("-1.239", Misfit::DecimalPlaces(2)),
            ("-123456789.50", Misfit::WholeDigits(8)),
            ("e5", Misfit::NotANumber),
            ("+.", Misfit::NotANumber),
            ("-.", Misfit::NotANumber),
            ("", Misfit::NotANumber),
            ("1.5e", Misfit::NotANumber),
        ] {
            assert_eq!(decimal(text), Some(misfit), "{text}");
        }
        assert_eq!(decimal_misfit(b"155", 3, -1), Some(Misfit::DecimalPlaces(-1)));
        assert_eq!(decimal_misfit(b"1500", 3, -1), None);
        assert_eq!(decimal_misfit(b"10000", 3, -1), Some(Misfit::WholeDigits(4)));
    }

    #[test]
    fn timestamp_fractions_are_read_to_their_last_digit() {
        let misfit = |text: &str, digits| fraction_misfit(text.as_bytes(), digits);
        for (text, digits) in [
            ("2026-01-01 00:00:00.123", 3),
            ("2026-01-01T00:00:00.1230000000000Z", 3),
            ("2026-01-01 00:00:00", 0),
            ("2026-01-01 00:00:00.000+02:00", 0),
            ("2026-01-01", 0),
            ("2026-01-01 00:00:00.123456789", 9),
            ("not a timestamp at all.123456", 3),
        ] {
            assert_eq!(misfit(text, digits), None, "{text}");
        }
        for (text, digits) in [
            ("2026-01-01 00:00:00.1239", 3),
            ("2026-01-01T00:00:00.5Z", 0),
            ("2026-01-01 00:00:00.1234567891", 9),
            ("2026-01-01 00:00:00.0000001-05:00", 6),
        ] {
            assert_eq!(misfit(text, digits), Some(Misfit::FractionDigits(digits)), "{text}");
        }
    }

    #[test]
    fn the_quick_test_finds_every_long_fraction() {
        for (text, digits, long) in [
            ("a.123,b.12", 3, false),
            ("a.1234", 3, true),
            ("x.", 0, false),
            ("x.0", 0, true),
            ("1.5e3", 1, false),
            ("ends with a point.", 3, false),
            ("", 0, false),
        ] {
            assert_eq!(has_long_fraction(text.as_bytes(), digits), long, "{text:?}");
        }
    }
}
