//! Java `SimpleDateFormat`-style patterns, as Flink's `DATE_FORMAT(ts, pattern)` reads them.
//!
//! A pattern is a run of fields and literals. A field is a run of one ASCII letter; its
//! length (the count) chooses the form:
//!
//! | letter | meaning | forms |
//! |---|---|---|
//! | `y` | year | `yy`: the last two digits; any other count: the year, zero-padded to the count |
//! | `M` | month | `M`/`MM`: the number, padded; `MMM`: `Jan`; `MMMM` or more: `January` |
//! | `d` | day of the month | padded to the count |
//! | `H` | hour of the day, 0–23 | padded |
//! | `h` | hour in AM/PM, 1–12 | padded |
//! | `m` | minute | padded |
//! | `s` | second | padded |
//! | `S` | millisecond | padded (`SSS` gives `007`) |
//! | `a` | `AM` or `PM` | any count |
//! | `E` | day of the week | up to 3: `Mon`; 4 or more: `Monday` |
//!
//! Text between single quotes is literal (`'T'`), and `''` is one quote, inside or outside
//! quotes; any other character that is not an ASCII letter is literal. Every other ASCII
//! letter is refused by name when the pattern is compiled (at planning time for a literal
//! pattern), never printed as something else. A year before 1 prints as its era year
//! (`1 - year`, as `SimpleDateFormat` does without the era field).

use chrono::{Datelike, NaiveDateTime, Timelike};

/// One element of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Literal(String),
    Field { letter: char, count: usize },
}

/// The letters [`format`] understands.
pub(crate) const LETTERS: &str = "yMdHhmsSaE";

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// The pattern's pieces, or a message naming what is wrong with it.
pub(crate) fn compile(pattern: &str) -> Result<Vec<Piece>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        if c == '\'' {
            index = quoted(&chars, index, &mut literal, pattern)?;
        } else if c.is_ascii_alphabetic() {
            if !LETTERS.contains(c) {
                return Err(format!(
                    "the pattern letter '{c}' in '{pattern}' is not supported (supported: {}; quote literal text \
                     as 'text')",
                    LETTERS.chars().map(String::from).collect::<Vec<_>>().join(" ")
                ));
            }
            let count = chars[index..].iter().take_while(|&&other| other == c).count();
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Field { letter: c, count });
            index += count;
        } else {
            literal.push(c);
            index += 1;
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// Reads the quote at `open`: `''` is one quote; otherwise text up to the closing quote
/// (where `''` is again one quote). Returns the index after it.
fn quoted(chars: &[char], open: usize, literal: &mut String, pattern: &str) -> Result<usize, String> {
    if chars.get(open + 1) == Some(&'\'') {
        literal.push('\'');
        return Ok(open + 2);
    }
    let mut index = open + 1;
    loop {
        match chars.get(index) {
            None => return Err(format!("the pattern '{pattern}' has an unclosed quote")),
            Some('\'') if chars.get(index + 1) == Some(&'\'') => {
                literal.push('\'');
                index += 2;
            }
            Some('\'') => return Ok(index + 1),
            Some(&c) => {
                literal.push(c);
                index += 1;
            }
        }
    }
}

/// The span of time, counted in whole spans from 1970-01-01 00:00 UTC, within which
/// `pieces` formats every time alike: a millisecond, second, minute or hour for its
/// finest field, else a day (every field a day has is the same all day). So a run of
/// times formats once per span.
pub(crate) fn granularity_ms(pieces: &[Piece]) -> i64 {
    const DAY_MS: i64 = 86_400_000;
    let span = |piece: &Piece| match piece {
        Piece::Field { letter: 'S', .. } => 1,
        Piece::Field { letter: 's', .. } => 1_000,
        Piece::Field { letter: 'm', .. } => 60_000,
        Piece::Field { letter: 'H' | 'h' | 'a', .. } => 3_600_000,
        _ => DAY_MS,
    };
    pieces.iter().map(span).min().unwrap_or(DAY_MS)
}

/// Appends `time` formatted by `pieces` to `out`.
pub(crate) fn format(pieces: &[Piece], time: &NaiveDateTime, out: &mut String) {
    for piece in pieces {
        match piece {
            Piece::Literal(text) => out.push_str(text),
            Piece::Field { letter, count } => field(*letter, *count, time, out),
        }
    }
}

fn field(letter: char, count: usize, time: &NaiveDateTime, out: &mut String) {
    use std::fmt::Write;
    // Writing to a `String` cannot fail.
    let number = |value: i64, out: &mut String| {
        let _ = write!(out, "{value:0count$}");
    };
    match letter {
        'y' => {
            let year = i64::from(time.year());
            let era_year = if year < 1 { 1 - year } else { year };
            if count == 2 {
                let _ = write!(out, "{:02}", era_year % 100);
            } else {
                number(era_year, out);
            }
        }
        'M' => {
            let month = time.month0() as usize;
            match count {
                1 | 2 => number(month as i64 + 1, out),
                3 => out.push_str(&MONTHS[month][..3]),
                _ => out.push_str(MONTHS[month]),
            }
        }
        'd' => number(i64::from(time.day()), out),
        'H' => number(i64::from(time.hour()), out),
        'h' => number(i64::from(time.hour12().1), out),
        'm' => number(i64::from(time.minute()), out),
        's' => number(i64::from(time.second()), out),
        'S' => number(i64::from(time.and_utc().timestamp_subsec_millis()), out),
        'a' => out.push_str(if time.hour() < 12 { "AM" } else { "PM" }),
        'E' => {
            let day = WEEKDAYS[time.weekday().num_days_from_monday() as usize];
            out.push_str(if count >= 4 { day } else { &day[..3] });
        }
        other => unreachable!("compile refuses the letter {other}"),
    }
}
