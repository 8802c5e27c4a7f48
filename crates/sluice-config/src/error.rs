//! The error type shared by every layer that reports a problem in `pipeline.toml`,
//! and the positions it points at.

use std::fmt;

/// A 1-based line and column in the pipeline file. Columns count characters
/// (Unicode scalar values), not bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

impl Position {
    /// A position from a 1-based line and column.
    pub fn new(line: usize, column: usize) -> Self {
        Self { line, column }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A value with the position where it was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Where it was written. For strings: the first character of the string's
    /// content, i.e. after the opening quote(s) and, for a multi-line string,
    /// after the newline that TOML trims right after `"""`.
    pub position: Position,
}

impl<T> Located<T> {
    /// A value at a position.
    pub fn new(value: T, position: Position) -> Self {
        Self { value, position }
    }
}

impl Located<String> {
    /// The string's content.
    pub fn as_str(&self) -> &str {
        &self.value
    }

    /// Maps a 1-based `line` and `column` inside the string's content (as a SQL
    /// parser reports them) to a position in the pipeline file.
    ///
    /// Exact when the string has no escape sequences or line-ending backslashes
    /// (always true for literal strings `'...'` / `'''...'''`, and for ordinary SQL in
    /// `"""..."""`); otherwise the line is still right for content lines that do not
    /// follow a line-ending backslash.
    pub fn locate(&self, line: usize, column: usize) -> Position {
        if line <= 1 {
            Position::new(self.position.line, self.position.column + column.saturating_sub(1))
        } else {
            Position::new(self.position.line + line - 1, column.max(1))
        }
    }
}

/// A problem in a pipeline file: where it is, what is wrong (naming the key and the
/// value found) and how to fix it.
///
/// Displayed as
/// ```text
/// pipeline.toml:12:1: [[source]] "bids": `rate` must be a number > 0, found "fast"
///   fix: set rate to events per second, e.g. rate = 100000
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}{}", at(.position), fix_line(.fix))]
pub struct ConfigError {
    /// The file name as given to the parser (e.g. `pipeline.toml`).
    pub file: String,
    /// Where the problem is, when it is at one place.
    pub position: Option<Position>,
    /// What is wrong, prefixed by the section and item it is in
    /// (e.g. `[[source]] "bids": ...`).
    pub message: String,
    /// How to fix it.
    pub fix: Option<String>,
}

impl ConfigError {
    /// An error in `file` at `position`. Later layers (SQL planning, connectors) use
    /// this to report problems in the same shape as the parser.
    pub fn new(file: &str, position: Option<Position>, message: impl Into<String>, fix: Option<String>) -> Self {
        Self { file: file.to_owned(), position, message: message.into(), fix }
    }

    /// The line of the error, if it has a position.
    pub fn line(&self) -> Option<usize> {
        self.position.map(|p| p.line)
    }
}

fn at(position: &Option<Position>) -> String {
    position.map(|p| format!(":{p}")).unwrap_or_default()
}

fn fix_line(fix: &Option<String>) -> String {
    fix.as_ref().map(|fix| format!("\n  fix: {fix}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_with_and_without_position() {
        let e = ConfigError::new(
            "pipeline.toml",
            Some(Position::new(12, 1)),
            "[[source]] \"bids\": `rate` must be a number > 0, found \"fast\"",
            Some("set rate to events per second, e.g. rate = 100000".into()),
        );
        assert_eq!(
            e.to_string(),
            "pipeline.toml:12:1: [[source]] \"bids\": `rate` must be a number > 0, found \"fast\"\n  fix: set rate to events per second, e.g. rate = 100000"
        );
        let e = ConfigError::new("p.toml", None, "no sink", None);
        assert_eq!(e.to_string(), "p.toml: no sink");
        assert_eq!(e.line(), None);
    }

    #[test]
    fn locate_maps_content_positions() {
        let sql = Located::new("SELECT 1\nFROM t".to_owned(), Position::new(5, 8));
        assert_eq!(sql.locate(1, 1), Position::new(5, 8));
        assert_eq!(sql.locate(1, 3), Position::new(5, 10));
        assert_eq!(sql.locate(2, 6), Position::new(6, 6));
    }
}
