//! Checking the header record of a CSV file against the declared schema.
//!
//! CSV columns are matched by position, so a header that names other columns (or a
//! data row where a header was expected) means the schema does not describe the file.
//! [`check_csv_header`] compares the names one by one, exactly, after trimming
//! surrounding whitespace and CSV quotes; the header must have as many names as the
//! schema has columns. A mismatch is the user error `source.csv_header`, naming the
//! first column that differs (its position, the expected and the found name).
//!
//! The other way round, a file read without a header (`header = false`, the default)
//! whose first record is exactly the column names (compared the same way) has a header
//! the options do not declare: read as data, it would be a bad row, or with VARCHAR
//! columns a silent data row. [`check_csv_first_row`] refuses it with the same code.

use arrow::datatypes::Schema;
use sluice_types::SluiceError;

use crate::decode::trim_line_break;

/// The UTF-8 byte order mark, skipped at the start of a file.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A header name or value is quoted in messages up to this many characters.
const MAX_NAME_CHARS: usize = 60;

/// The fix of every header mismatch.
const HEADER_FIX: &str = "rename the column in `schema`, or set header = false if the file has no header line";

/// The fix of a header read as data.
const FORGOTTEN_HEADER_FIX: &str = "set header = true; if that line really is data, rename a column in `schema`";

/// Checks the header record of a CSV file (its first record, with or without its line
/// break and a byte order mark) against `schema`. Callers add the file with
/// [`SluiceError::context`].
pub fn check_csv_header(header: &[u8], schema: &Schema, delimiter: u8) -> Result<(), SluiceError> {
    let header = trim_line_break(header.strip_prefix(UTF8_BOM).unwrap_or(header));
    let text = std::str::from_utf8(header).map_err(|error| {
        mismatch(format!("line 1 is not valid UTF-8 (at byte {}), so it is no header", error.valid_up_to() + 1))
    })?;
    let found = header_names(text, char::from(delimiter));
    let expected: Vec<&str> = schema.fields().iter().map(|field| field.name().as_str()).collect();
    for (index, expected_name) in expected.iter().enumerate() {
        let position = index + 1;
        match found.get(index) {
            Some(name) if name == expected_name => {}
            Some(name) => {
                return Err(mismatch(format!(
                    "line 1 names column {position} {}, the schema names it {} (a header of {} names, a schema of {} columns)",
                    quoted(name),
                    quoted(expected_name),
                    found.len(),
                    expected.len(),
                )));
            }
            None => {
                return Err(mismatch(format!(
                    "line 1 has {} names, the schema {} columns: column {position} {} is missing",
                    found.len(),
                    expected.len(),
                    quoted(expected_name),
                )));
            }
        }
    }
    if found.len() > expected.len() {
        return Err(mismatch(format!(
            "line 1 has {} names, the schema {} columns: column {} {} is not in the schema",
            found.len(),
            expected.len(),
            expected.len() + 1,
            quoted(&found[expected.len()]),
        )));
    }
    Ok(())
}

/// Checks the first record of a CSV file read without a header (with or without its
/// line break and a byte order mark): it must not be exactly the column names of
/// `schema`, as [`check_csv_header`] compares them. Callers add the file with
/// [`SluiceError::context`].
pub fn check_csv_first_row(record: &[u8], schema: &Schema, delimiter: u8) -> Result<(), SluiceError> {
    if check_csv_header(record, schema, delimiter).is_err() {
        return Ok(());
    }
    let names: Vec<&str> = schema.fields().iter().map(|field| field.name().as_str()).collect();
    let names = names.join(&char::from(delimiter).to_string());
    Err(SluiceError::user(
        "source.csv_header",
        format!(
            "line 1 is a header, the column names of the schema ({}), but header = false reads it as a data row",
            quoted(&names)
        ),
    )
    .with_fix(FORGOTTEN_HEADER_FIX))
}

fn mismatch(message: String) -> SluiceError {
    SluiceError::user("source.csv_header", format!("the CSV header does not match the schema: {message}"))
        .with_fix(HEADER_FIX)
}

/// `name` in quotes, cut to [`MAX_NAME_CHARS`] characters.
fn quoted(name: &str) -> String {
    match name.char_indices().nth(MAX_NAME_CHARS) {
        Some((end, _)) => format!("{:?}...", &name[..end]),
        None => format!("{name:?}"),
    }
}

/// The names of a header line: split at delimiters outside quotes, each trimmed of
/// surrounding whitespace and unquoted (a doubled quote inside is one quote).
fn header_names(text: &str, delimiter: char) -> Vec<String> {
    let mut names = Vec::new();
    let mut field = String::new();
    let mut in_quotes = false;
    for c in text.chars() {
        if c == '"' {
            in_quotes = !in_quotes;
        } else if c == delimiter && !in_quotes {
            names.push(unquote(&field));
            field.clear();
            continue;
        }
        field.push(c);
    }
    names.push(unquote(&field));
    names
}

/// A raw header field without surrounding whitespace and quotes.
fn unquote(field: &str) -> String {
    let trimmed = field.trim();
    match trimmed.strip_prefix('"').and_then(|inner| inner.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\"").trim().to_string(),
        None => trimmed.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field};

    use super::*;

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("full name", DataType::Utf8, true),
            Field::new("ts", DataType::Utf8, true),
        ]))
    }

    /// `Ok(())`, or the message of the error (which must be `source.csv_header`).
    fn check(header: &str) -> Result<(), String> {
        check_csv_header(header.as_bytes(), &schema(), b',').map_err(|error| {
            assert_eq!(error.code, "source.csv_header");
            assert_eq!(error.domain, sluice_types::Domain::User);
            assert_eq!(error.fix.as_deref(), Some(HEADER_FIX));
            error.message.replace("the CSV header does not match the schema: ", "")
        })
    }

    #[test]
    fn matching_headers_pass_after_trimming_whitespace_and_quotes() {
        for header in [
            "id,full name,ts\n",
            "id,full name,ts\r\n",
            "id,full name,ts",
            " id ,\t\"full name\" , \"ts\"\n",
            "\u{feff}id,full name,ts\n",
        ] {
            assert_eq!(check(header), Ok(()), "{header:?}");
        }
        let semicolons = check_csv_header(b"id;\"full name\";ts\n", &schema(), b';');
        assert!(semicolons.is_ok());
    }

    #[test]
    fn a_mismatch_names_the_column_and_both_names() {
        assert_eq!(
            check("id,name,ts\n"),
            Err(r#"line 1 names column 2 "name", the schema names it "full name" (a header of 3 names, a schema of 3 columns)"#.into())
        );
        assert_eq!(
            check("ID,full name,ts\n"),
            Err(r#"line 1 names column 1 "ID", the schema names it "id" (a header of 3 names, a schema of 3 columns)"#
                .into())
        );
        assert_eq!(
            check("id,full name\n"),
            Err(r#"line 1 has 2 names, the schema 3 columns: column 3 "ts" is missing"#.into())
        );
        assert_eq!(
            check("id,full name,ts,extra\n"),
            Err(r#"line 1 has 4 names, the schema 3 columns: column 4 "extra" is not in the schema"#.into())
        );
        assert_eq!(
            check("\n"),
            Err(r#"line 1 names column 1 "", the schema names it "id" (a header of 1 names, a schema of 3 columns)"#
                .into())
        );
    }

    #[test]
    fn a_header_read_as_data_is_refused() {
        let refused = |record: &str| check_csv_first_row(record.as_bytes(), &schema(), b',').err();
        let error = refused("id,full name,ts\n").expect("the names");
        assert_eq!(error.code, "source.csv_header");
        assert_eq!(error.domain, sluice_types::Domain::User);
        assert_eq!(error.fix.as_deref(), Some(FORGOTTEN_HEADER_FIX));
        assert_eq!(
            error.message,
            r#"line 1 is a header, the column names of the schema ("id,full name,ts"), but header = false reads it as a data row"#
        );
        assert!(refused("\u{feff} \"id\",full name , ts\r\n").is_some());
        for data in ["1,full name,ts\n", "id,full name\n", "id,full name,ts,x\n", ""] {
            assert!(refused(data).is_none(), "{data:?}");
        }
        assert!(check_csv_first_row(b"\xff,full name,ts\n", &schema(), b',').is_ok());
    }

    #[test]
    fn a_data_row_is_no_header() {
        assert_eq!(
            check("1,\"Smith, John\",2026-01-01 00:00:00\n"),
            Err(r#"line 1 names column 1 "1", the schema names it "id" (a header of 3 names, a schema of 3 columns)"#
                .into())
        );
        assert_eq!(
            check_csv_header(b"\xff,a,b\n", &schema(), b',').map_err(|e| e.message),
            Err("the CSV header does not match the schema: line 1 is not valid UTF-8 (at byte 1), so it is no header"
                .into())
        );
    }
}
