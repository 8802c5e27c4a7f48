//! Parameters of the extended query protocol (`$1`, `$2`…) bound into the SQL text as
//! literals of their declared types, so that the bound query takes the same path, with
//! the same checks, as one written out (`/query` has no parameters).
//!
//! Placeholders are found by the SQL tokenizer, never inside a string literal, a quoted
//! identifier or a comment; every other token is written back as it came. A value
//! becomes: `NULL`; a number in parentheses (so `x-$1` with -5 stays `x-(-5)`, not a
//! comment), checked to be one; `TRUE`/`FALSE`; `CAST('…' AS DOUBLE)` for floats;
//! `CAST('…' AS DATE|TIMESTAMP)`; or a string literal with its quotes doubled. Text and
//! binary parameters of those types are read; any other type is refused by name.
//!
//! Bounds: the bound text is the query's text plus each value once (values arrive within
//! `pgwire`'s message size limit).

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use pgwire::api::Type;
use pgwire::api::portal::Portal;
use sluice_types::SluiceError;

/// `sql` with every `$n` replaced by the portal's value `n`, read as the type the
/// client declared for it, else as `described` (what the server's Describe told the
/// client, which then binds values of that type: rust-postgres, JDBC), else as text.
pub(crate) fn bind(sql: &str, portal: &Portal<String>, described: &[Option<Type>]) -> Result<String, SluiceError> {
    if portal.parameter_len() == 0 {
        return Ok(sql.to_string());
    }
    let literals = (0..portal.parameter_len())
        .map(|index| {
            let declared =
                declared(portal, index).or_else(|| described.get(index).cloned().flatten()).unwrap_or(Type::UNKNOWN);
            literal(portal, index, declared)
        })
        .collect::<Result<Vec<_>, _>>()?;
    substitute(sql, &literals)
}

/// The type the client declared for parameter `index` (None for none, or unknown).
fn declared(portal: &Portal<String>, index: usize) -> Option<Type> {
    portal.statement.parameter_types.get(index).cloned().flatten().filter(|t| *t != Type::UNKNOWN)
}

/// Whether a parameter's type is neither declared by the client nor text: its value
/// can be read only with the type the server described.
pub(crate) fn needs_described_types(portal: &Portal<String>) -> bool {
    (0..portal.parameter_len())
        .any(|index| declared(portal, index).is_none() && portal.parameter_format.is_binary(index))
}

/// `sql` with `$n` replaced by `literals[n - 1]` (`NULL` where a statement is described
/// before its values are bound: the catalog's queries are then run on them).
pub(crate) fn substitute(sql: &str, literals: &[String]) -> Result<String, SluiceError> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().map_err(|e| {
        SluiceError::user("query.sql", format!("the SQL cannot be read: {e}"))
            .with_fix("write one SELECT over the materialized tables")
    })?;
    let mut bound = String::with_capacity(sql.len() + literals.iter().map(String::len).sum::<usize>());
    for token in tokens {
        match &token {
            Token::Placeholder(name) if name.starts_with('$') => {
                let number = name[1..].parse::<usize>().ok().filter(|n| (1..=literals.len()).contains(n));
                let Some(number) = number else {
                    return Err(SluiceError::user(
                        "pgwire.parameter",
                        format!("the query names parameter {name}, but {} were bound", literals.len()),
                    )
                    .with_fix("bind one value per parameter, numbered from $1"));
                };
                bound.push_str(&literals[number - 1]);
            }
            token => bound.push_str(&token.to_string()),
        }
    }
    Ok(bound)
}

/// The SQL literal of parameter `index`.
fn literal(portal: &Portal<String>, index: usize, declared: Type) -> Result<String, SluiceError> {
    let bad = |e: pgwire::error::PgWireError| {
        SluiceError::user("pgwire.parameter", format!("parameter ${} is not a valid {}: {e}", index + 1, declared))
            .with_fix("send the value in the type's text form")
    };
    let value = match declared {
        Type::INT2 => portal.parameter::<i16>(index, &declared).map_err(bad)?.map(|v| format!("({v})")),
        Type::INT4 => portal.parameter::<i32>(index, &declared).map_err(bad)?.map(|v| format!("({v})")),
        Type::INT8 => portal.parameter::<i64>(index, &declared).map_err(bad)?.map(|v| format!("({v})")),
        Type::OID => portal.parameter::<u32>(index, &declared).map_err(bad)?.map(|v| format!("({v})")),
        Type::FLOAT4 => portal.parameter::<f32>(index, &declared).map_err(bad)?.map(|v| format!("CAST('{v}' AS REAL)")),
        Type::FLOAT8 => {
            portal.parameter::<f64>(index, &declared).map_err(bad)?.map(|v| format!("CAST('{v}' AS DOUBLE)"))
        }
        Type::BOOL => portal.parameter::<bool>(index, &declared).map_err(bad)?.map(|v| v.to_string().to_uppercase()),
        Type::NUMERIC => text(portal, index, &declared)?.map(|v| number(&v, index)).transpose()?,
        Type::DATE => text(portal, index, &declared)?.map(|v| format!("CAST({} AS DATE)", quoted(&v))),
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            text(portal, index, &declared)?.map(|v| format!("CAST({} AS TIMESTAMP)", quoted(&v)))
        }
        Type::UNKNOWN | Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
            text(portal, index, &declared)?.map(|v| quoted(&v))
        }
        other => {
            return Err(SluiceError::user(
                "pgwire.unsupported",
                format!("parameter ${} has type {other}, which is not supported", index + 1),
            )
            .with_fix("send it as text (type unknown or text) and CAST it in SQL"));
        }
    };
    Ok(value.unwrap_or_else(|| "NULL".to_string()))
}

/// Parameter `index` as text: its text form, or UTF-8 bytes in the binary format of a
/// text type; never with a NUL (PostgreSQL's text has none).
fn text(portal: &Portal<String>, index: usize, declared: &Type) -> Result<Option<String>, SluiceError> {
    let Some(Some(bytes)) = portal.parameters.get(index) else { return Ok(None) };
    let text_type = matches!(*declared, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME);
    if portal.parameter_format.is_binary(index) && !text_type {
        return Err(SluiceError::user(
            "pgwire.unsupported",
            format!("parameter ${} of type {declared} came in the binary format", index + 1),
        )
        .with_fix("send it in the text format, or declare its type"));
    }
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
        SluiceError::user("pgwire.parameter", format!("parameter ${} is not UTF-8 text", index + 1))
            .with_fix("send text in UTF-8 (client_encoding = UTF8)")
    })?;
    if text.contains('\0') {
        return Err(SluiceError::user("pgwire.parameter", format!("parameter ${} holds a NUL character", index + 1))
            .with_fix("send text without NUL characters"));
    }
    Ok(Some(text))
}

/// A decimal number, checked, in parentheses.
fn number(text: &str, index: usize) -> Result<String, SluiceError> {
    let trimmed = text.trim();
    let plain = !trimmed.is_empty()
        && trimmed.chars().all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
        && trimmed.parse::<f64>().is_ok();
    if !plain {
        return Err(SluiceError::user(
            "pgwire.parameter",
            format!("parameter ${} is not a number: {text:?}", index + 1),
        )
        .with_fix("send a decimal number"));
    }
    Ok(format!("({trimmed})"))
}

/// A string literal: quotes doubled (standard_conforming_strings = on: no backslash
/// escapes).
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sql: &str, literals: &[&str], expected: &str) {
        let literals: Vec<String> = literals.iter().map(|l| l.to_string()).collect();
        assert_eq!(substitute(sql, &literals).expect("bound"), expected);
    }

    #[test]
    fn placeholders_become_literals_but_not_inside_strings_or_comments() {
        check("SELECT * FROM t WHERE k = $1", &["'a'"], "SELECT * FROM t WHERE k = 'a'");
        check("SELECT '$1', n-$1 FROM t -- $1\n", &["(-5)"], "SELECT '$1', n-(-5) FROM t -- $1\n");
        check("SELECT $2, $1", &["1", "'x'"], "SELECT 'x', 1");
    }

    #[test]
    fn a_missing_value_and_a_bad_number_are_refused() {
        let refused = substitute("SELECT $3", &["1".to_string()]).expect_err("refused");
        assert_eq!(refused.code, "pgwire.parameter");
        assert!(number("1; DROP", 0).is_err());
        assert_eq!(number(" -1.5e3 ", 0).expect("number"), "(-1.5e3)");
        assert_eq!(quoted("it's"), "'it''s'");
    }
}
