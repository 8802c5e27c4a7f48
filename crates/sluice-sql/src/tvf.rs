//! Flink's window table functions, rewritten before DataFusion parses the query.
//!
//! DataFusion's parser rejects `TABLE t` as a table-function argument, so
//! `TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))` is found at the
//! token level and replaced by the name of a synthetic table (`__window_0`, …) whose
//! schema is the input table's plus `window_start`, `window_end` and `window_time`. The
//! stream planner later turns a scan of that table into the input's stream followed by
//! window assignment. Everything else in the query is left exactly as written.
//!
//! Supported: `TUMBLE(data, timecol, size)`, `HOP(data, timecol, slide, size)`,
//! `CUMULATE(data, timecol, step, size)` (size a multiple of step) and `SESSION(data,
//! timecol, gap)`, where a SESSION's data may be `TABLE t PARTITION BY k` or `TABLE t
//! PARTITION BY (k1, k2)`; with positional or named (`DATA =>`, `TIMECOL =>`, `SIZE =>`,
//! `SLIDE =>`, `STEP =>`, `GAP =>`) arguments. An `OFFSET` argument is reported as not
//! supported yet.

use sluice_operators::window::WindowKind;
use sluice_types::SluiceError;
use sqlparser::dialect::GenericDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

/// One window table function found in a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowCall {
    /// The synthetic table that replaces the call.
    pub table: String,
    /// The table or view the window reads.
    pub input: String,
    pub time_column: String,
    pub kind: WindowKind,
    /// A SESSION's `PARTITION BY` columns (empty: none given).
    pub partition: Vec<String>,
    /// The call as written (whitespace collapsed), for messages.
    pub text: String,
}

/// The query with every window call replaced, and the calls in order.
pub fn rewrite(sql: &str, first_index: usize) -> Result<(String, Vec<WindowCall>), SluiceError> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| SluiceError::user("sql.syntax", format!("SQL syntax error: {e}")))?;
    let mut output = String::with_capacity(sql.len());
    let mut calls = Vec::new();
    let mut index = 0;
    while index < tokens.len() {
        if let Some((call, next)) = match_call(&tokens, index, first_index + calls.len())? {
            output.push_str(&call.table);
            calls.push(call);
            index = next;
        } else {
            output.push_str(&token_text(&tokens[index]));
            index += 1;
        }
    }
    Ok((output, calls))
}

/// A token as SQL text. The tokenizer's `Display` writes a quoted string or identifier
/// without doubling the quotes inside it (`'it''s'` would come back as `'it's'`).
fn token_text(token: &Token) -> String {
    match token {
        Token::SingleQuotedString(text) => format!("'{}'", text.replace('\'', "''")),
        Token::Word(word) if word.quote_style == Some('"') => format!("\"{}\"", word.value.replace('"', "\"\"")),
        Token::Word(word) if word.quote_style == Some('`') => format!("`{}`", word.value.replace('`', "``")),
        other => other.to_string(),
    }
}

fn is_word(token: &Token, keyword: &str) -> bool {
    matches!(token, Token::Word(word) if word.quote_style.is_none() && word.value.eq_ignore_ascii_case(keyword))
}

fn is_space(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// The index of the next non-whitespace token at or after `index`.
fn skip(tokens: &[Token], mut index: usize) -> usize {
    while index < tokens.len() && is_space(&tokens[index]) {
        index += 1;
    }
    index
}

/// Matches `TABLE ( NAME ( args ) )` at `index`; returns the call and the index after it.
fn match_call(tokens: &[Token], index: usize, number: usize) -> Result<Option<(WindowCall, usize)>, SluiceError> {
    if !is_word(&tokens[index], "TABLE") {
        return Ok(None);
    }
    let open = skip(tokens, index + 1);
    if tokens.get(open) != Some(&Token::LParen) {
        return Ok(None);
    }
    let name_at = skip(tokens, open + 1);
    let Some(Token::Word(name)) = tokens.get(name_at) else { return Ok(None) };
    let function = name.value.to_ascii_uppercase();
    if !matches!(function.as_str(), "TUMBLE" | "HOP" | "CUMULATE" | "SESSION") {
        return Ok(None);
    }
    let args_open = skip(tokens, name_at + 1);
    if tokens.get(args_open) != Some(&Token::LParen) {
        return Ok(None);
    }
    let (arguments, args_close) = split_arguments(tokens, args_open)?;
    let close = skip(tokens, args_close + 1);
    if tokens.get(close) != Some(&Token::RParen) {
        return Err(syntax(&function, "expected `)` closing `TABLE(`"));
    }
    let mut call = build_call(&function, arguments, number)?;
    call.text = call_text(&tokens[name_at..args_close + 1]);
    Ok(Some((call, close + 1)))
}

/// Tokens as text, each run of whitespace shown as one space.
fn call_text(tokens: &[Token]) -> String {
    let mut text = String::new();
    for token in tokens {
        if is_space(token) {
            if !text.ends_with(' ') {
                text.push(' ');
            }
        } else {
            text.push_str(&token.to_string());
        }
    }
    text
}

fn syntax(function: &str, message: &str) -> SluiceError {
    SluiceError::user("sql.window_syntax", format!("{function}(...): {message}")).with_fix(format!(
        "write {function}(TABLE t, DESCRIPTOR(ts), {}INTERVAL '10' SECOND)",
        if function == "HOP" || function == "CUMULATE" { "INTERVAL '5' SECOND, " } else { "" }
    ))
}

/// The arguments between the parenthesis at `open` and its match, split at top-level commas.
fn split_arguments(tokens: &[Token], open: usize) -> Result<(Vec<Vec<Token>>, usize), SluiceError> {
    let mut depth = 0usize;
    let mut arguments = vec![Vec::new()];
    for (index, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::LParen => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    let arguments = arguments
                        .into_iter()
                        .map(|a: Vec<Token>| a.into_iter().filter(|t| !is_space(t)).collect())
                        .collect();
                    return Ok((arguments, index));
                }
            }
            Token::Comma if depth == 1 => {
                arguments.push(Vec::new());
                continue;
            }
            _ => {}
        }
        arguments.last_mut().expect("never empty").push(token.clone());
    }
    Err(SluiceError::user("sql.syntax", "unbalanced parentheses in a window table function"))
}

fn build_call(function: &str, arguments: Vec<Vec<Token>>, number: usize) -> Result<WindowCall, SluiceError> {
    let positional = match function {
        "HOP" => ["DATA", "TIMECOL", "SLIDE", "SIZE"].as_slice(),
        "CUMULATE" => &["DATA", "TIMECOL", "STEP", "SIZE"],
        "SESSION" => &["DATA", "TIMECOL", "GAP"],
        _ => &["DATA", "TIMECOL", "SIZE"],
    };
    let mut named: Vec<(String, Vec<Token>)> = Vec::new();
    for (position, mut argument) in arguments.into_iter().enumerate() {
        let name = if argument.len() > 2 && matches!(argument[1], Token::RArrow) {
            let Token::Word(word) = &argument[0] else { return Err(syntax(function, "bad named argument")) };
            let name = word.value.to_ascii_uppercase();
            argument.drain(..2);
            name
        } else {
            match positional.get(position) {
                Some(name) => name.to_string(),
                None if position == positional.len() => "OFFSET".to_string(),
                None => return Err(syntax(function, "too many arguments")),
            }
        };
        named.push((name, argument));
    }
    let take = |name: &str| named.iter().find(|(n, _)| n == name).map(|(_, tokens)| tokens.as_slice());
    if take("OFFSET").is_some() {
        return Err(SluiceError::user(
            "sql.unsupported",
            format!("{function}(...): an OFFSET argument is not supported yet"),
        )
        .with_fix("remove the offset; windows align to the Unix epoch"));
    }
    let (input, partition) = match take("DATA") {
        Some([table, Token::Word(name), rest @ ..]) if is_word(table, "TABLE") => {
            (name.value.clone(), partition_by(function, rest)?)
        }
        _ => return Err(syntax(function, "the first argument must be `TABLE name`")),
    };
    let time_column = match take("TIMECOL") {
        Some([descriptor, Token::LParen, Token::Word(column), Token::RParen]) if is_word(descriptor, "DESCRIPTOR") => {
            column.value.clone()
        }
        _ => return Err(syntax(function, "the time argument must be `DESCRIPTOR(column)`")),
    };
    let kind = match function {
        "HOP" => {
            let slide_ms = interval_ms(function, "slide", take("SLIDE"))?;
            WindowKind::Hop { slide_ms, size_ms: interval_ms(function, "size", take("SIZE"))? }
        }
        "CUMULATE" => {
            let step_ms = interval_ms(function, "step", take("STEP"))?;
            let size_ms = interval_ms(function, "size", take("SIZE"))?;
            if size_ms % step_ms != 0 {
                return Err(SluiceError::user(
                    "sql.window_interval",
                    format!("CUMULATE(...): the size ({size_ms} ms) is not a multiple of the step ({step_ms} ms)"),
                )
                .with_fix("choose a size that is a whole number of steps, as Flink requires"));
            }
            WindowKind::Cumulate { step_ms, size_ms }
        }
        "SESSION" => WindowKind::Session { gap_ms: interval_ms(function, "gap", take("GAP"))? },
        _ => WindowKind::Tumble { size_ms: interval_ms(function, "size", take("SIZE"))? },
    };
    Ok(WindowCall { table: format!("__window_{number}"), input, time_column, kind, partition, text: String::new() })
}

/// The columns of `PARTITION BY k` or `PARTITION BY (k1, k2)` after `TABLE name` (none
/// when nothing follows); only a SESSION takes them.
fn partition_by(function: &str, tokens: &[Token]) -> Result<Vec<String>, SluiceError> {
    let bad = || syntax(function, "after `TABLE name` only `PARTITION BY column` or `PARTITION BY (a, b)` may follow");
    let columns = match tokens {
        [] => return Ok(Vec::new()),
        [partition, by, rest @ ..] if is_word(partition, "PARTITION") && is_word(by, "BY") => rest,
        _ => return Err(bad()),
    };
    let columns = match columns {
        [Token::LParen, inner @ .., Token::RParen] => inner,
        single => single,
    };
    let mut names = Vec::new();
    for (index, token) in columns.iter().enumerate() {
        match token {
            Token::Word(word) if index % 2 == 0 => names.push(word.value.clone()),
            Token::Comma if index % 2 == 1 => {}
            _ => return Err(bad()),
        }
    }
    if names.is_empty() || columns.len() % 2 == 0 {
        return Err(bad());
    }
    if function != "SESSION" {
        return Err(SluiceError::user(
            "sql.unsupported",
            format!("{function}(TABLE … PARTITION BY …): only SESSION windows take PARTITION BY"),
        )
        .with_fix("remove PARTITION BY; GROUP BY the columns instead"));
    }
    Ok(names)
}

/// `INTERVAL '10' SECOND`, `INTERVAL '10' SECONDS`, `INTERVAL '10 seconds'` → milliseconds.
/// Months and years have no fixed length, so they are refused; so is a length of more
/// than `i64::MAX` milliseconds (about 292 million years).
fn interval_ms(function: &str, what: &str, tokens: Option<&[Token]>) -> Result<i64, SluiceError> {
    let bad =
        || syntax(function, &format!("the {what} must be a positive INTERVAL literal such as INTERVAL '10' SECOND"));
    let Some(tokens) = tokens else { return Err(bad()) };
    let (value, unit) = match tokens {
        [interval, Token::SingleQuotedString(value)] if is_word(interval, "INTERVAL") => {
            let mut parts = value.split_whitespace();
            let number = parts.next().unwrap_or_default().to_string();
            (number, parts.next().unwrap_or("SECOND").to_string())
        }
        [interval, Token::SingleQuotedString(value), Token::Word(unit)] if is_word(interval, "INTERVAL") => {
            (value.trim().to_string(), unit.value.clone())
        }
        _ => return Err(bad()),
    };
    let unit = unit.to_ascii_uppercase();
    let unit_ms = match unit.trim_end_matches('S') {
        "MILLISECOND" => 1,
        "SECOND" => 1_000,
        "MINUTE" => 60_000,
        "HOUR" => 3_600_000,
        "DAY" => 86_400_000,
        "MONTH" | "YEAR" => {
            return Err(SluiceError::user(
                "sql.window_interval",
                format!(
                    "{function}(...): the {what} INTERVAL '{value}' {unit} has no fixed length (months and years vary)"
                ),
            )
            .with_fix("give the length in days, e.g. INTERVAL '30' DAY or INTERVAL '365' DAY"));
        }
        _ => return Err(bad()),
    };
    let too_large = || {
        SluiceError::user(
            "sql.window_interval",
            format!(
                "{function}(...): the {what} INTERVAL '{value}' {unit} is longer than Sluice's timestamps can span"
            ),
        )
        .with_fix(format!("give a {what} of at most {} days", i64::MAX / 86_400_000))
    };
    let value: i64 = match value.parse() {
        Ok(value) => value,
        Err(_) if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => return Err(too_large()),
        Err(_) => return Err(bad()),
    };
    if value <= 0 {
        return Err(bad());
    }
    value.checked_mul(unit_ms).ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sql: &str, expected_sql: &str, expected: &[(&str, &str, WindowKind)]) {
        let (rewritten, calls) = rewrite(sql, 0).expect("rewrite");
        assert_eq!(rewritten, expected_sql);
        let got: Vec<(&str, &str, WindowKind)> =
            calls.iter().map(|c| (c.input.as_str(), c.time_column.as_str(), c.kind)).collect();
        assert_eq!(got, expected);
    }

    fn check_error(sql: &str, expected: &str) {
        let error = rewrite(sql, 0).expect_err("should fail").to_string();
        assert!(error.contains(expected), "{error}");
    }

    #[test]
    fn tumble_and_hop_are_replaced_by_synthetic_tables() {
        check(
            "SELECT * FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) w",
            "SELECT * FROM __window_0 w",
            &[("bid", "dateTime", WindowKind::Tumble { size_ms: 10_000 })],
        );
        check(
            "SELECT * FROM TABLE(\n  HOP(TABLE bid, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '1' MINUTE))",
            "SELECT * FROM __window_0",
            &[("bid", "ts", WindowKind::Hop { slide_ms: 2_000, size_ms: 60_000 })],
        );
        check(
            "SELECT 1 FROM TABLE(TUMBLE(DATA => TABLE t, TIMECOL => DESCRIPTOR(ts), SIZE => INTERVAL '5 minutes'))",
            "SELECT 1 FROM __window_0",
            &[("t", "ts", WindowKind::Tumble { size_ms: 300_000 })],
        );
        check(
            "SELECT * FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '1' MINUTE))",
            "SELECT * FROM __window_0",
            &[("t", "ts", WindowKind::Cumulate { step_ms: 1_000, size_ms: 60_000 })],
        );
        check(
            "SELECT 1 FROM TABLE(SESSION(TABLE t PARTITION BY k, DESCRIPTOR(ts), INTERVAL '10' SECOND))",
            "SELECT 1 FROM __window_0",
            &[("t", "ts", WindowKind::Session { gap_ms: 10_000 })],
        );
        check(
            "SELECT 1 FROM TABLE(SESSION(DATA => TABLE t, TIMECOL => DESCRIPTOR(ts), GAP => INTERVAL '1' MINUTE))",
            "SELECT 1 FROM __window_0",
            &[("t", "ts", WindowKind::Session { gap_ms: 60_000 })],
        );
        check("SELECT a FROM t WHERE x = 'TABLE(TUMBLE('", "SELECT a FROM t WHERE x = 'TABLE(TUMBLE('", &[]);
        check("SELECT 'it''s', \"a\"\"b\" FROM t", "SELECT 'it''s', \"a\"\"b\" FROM t", &[]);
    }

    #[test]
    fn unsupported_forms_are_named() {
        check_error(
            "SELECT * FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '5' SECOND))",
            "CUMULATE(...): the size (5000 ms) is not a multiple of the step (2000 ms)",
        );
        check_error(
            "SELECT * FROM TABLE(TUMBLE(TABLE t PARTITION BY k, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
            "only SESSION windows take PARTITION BY",
        );
        check_error(
            "SELECT * FROM TABLE(SESSION(TABLE t PARTITION k, DESCRIPTOR(ts), INTERVAL '1' SECOND))",
            "PARTITION BY column",
        );
        check_error(
            "SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '1' SECOND))",
            "OFFSET",
        );
        check_error("SELECT * FROM TABLE(TUMBLE(TABLE t, ts, INTERVAL '1' SECOND))", "DESCRIPTOR(column)");
        check_error("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), 10))", "INTERVAL literal");
        check_error("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '0' SECOND))", "positive INTERVAL");
    }

    #[test]
    fn months_and_years_are_refused_for_their_varying_length() {
        for (interval, shown) in [
            ("INTERVAL '1' MONTH", "the size INTERVAL '1' MONTH has no fixed length (months and years vary)"),
            ("INTERVAL '2' YEARS", "the size INTERVAL '2' YEARS has no fixed length"),
            ("INTERVAL '1 month'", "the size INTERVAL '1' MONTH has no fixed length"),
        ] {
            let sql = format!("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), {interval}))");
            let error = rewrite(&sql, 0).expect_err("refused");
            assert!(error.message.contains(shown), "{}", error.message);
            assert_eq!(
                error.fix.as_deref(),
                Some("give the length in days, e.g. INTERVAL '30' DAY or INTERVAL '365' DAY")
            );
        }
        check_error(
            "SELECT * FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' YEAR, INTERVAL '2' YEAR))",
            "HOP(...): the slide INTERVAL '1' YEAR has no fixed length",
        );
    }

    #[test]
    fn huge_intervals_are_refused_not_wrapped() {
        for value in ["106751991168", "9223372036854775807", "99999999999999999999999"] {
            let sql = format!("SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '{value}' DAY))");
            let error = rewrite(&sql, 0).expect_err("too large");
            assert!(error.message.contains("is longer than Sluice's timestamps can span"), "{}", error.message);
        }
        check(
            "SELECT 1 FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '106751991167' DAY))",
            "SELECT 1 FROM __window_0",
            &[("t", "ts", WindowKind::Tumble { size_ms: 106_751_991_167 * 86_400_000 })],
        );
    }

    #[test]
    fn session_partition_columns_are_read() {
        let partition = |sql: &str| rewrite(sql, 0).expect("rewrite").1.remove(0).partition;
        let sql = "SELECT 1 FROM TABLE(SESSION(TABLE t PARTITION BY (a, b), DESCRIPTOR(ts), INTERVAL '1' SECOND))";
        assert_eq!(partition(sql), ["a", "b"]);
        let sql = "SELECT 1 FROM TABLE(SESSION(TABLE t PARTITION BY a, DESCRIPTOR(ts), INTERVAL '1' SECOND))";
        assert_eq!(partition(sql), ["a"]);
        let sql = "SELECT 1 FROM TABLE(SESSION(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND))";
        assert!(partition(sql).is_empty());
        check_error(
            "SELECT 1 FROM TABLE(SESSION(TABLE t PARTITION BY (a b), DESCRIPTOR(ts), INTERVAL '1' SECOND))",
            "PARTITION BY (a, b)",
        );
    }

    #[test]
    fn a_call_keeps_its_text_for_messages() {
        let sql = "SELECT * FROM TABLE(HOP(TABLE bid,\n   DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY))";
        let (_, calls) = rewrite(sql, 0).expect("rewrite");
        assert_eq!(calls[0].text, "HOP(TABLE bid, DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY)");
    }
}
