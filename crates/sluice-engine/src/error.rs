//! The engine's error: one or more problems, each a [`SluiceError`] (code, domain, kind,
//! message, fix) with the place in the pipeline file it is about, when there is one.
//!
//! Displayed one problem per paragraph, in the shape of the configuration parser's
//! errors:
//!
//! ```text
//! pipeline.toml:12:1: [[source]] "bids": `rate` must be a number > 0, found "fast"
//!   fix: set rate to events per second, e.g. rate = 100000
//! ```

use std::fmt;

use sluice_config::{ConfigError, Position};
use sluice_types::{Domain, ErrorKind, SluiceError};

/// One problem, located in a file when it is about one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The pipeline file (as named on the command line), when the problem is in one.
    pub file: Option<String>,
    pub position: Option<Position>,
    pub error: SluiceError,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}")?;
            if let Some(position) = self.position {
                write!(f, ":{position}")?;
            }
            write!(f, ": ")?;
        }
        write!(f, "{}", self.error)
    }
}

/// Why the engine could not do what it was asked: every problem found (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    pub problems: Vec<Problem>,
}

impl EngineError {
    /// A failure not tied to a place in the pipeline file.
    pub fn new(error: SluiceError) -> EngineError {
        EngineError { problems: vec![Problem { file: None, position: None, error }] }
    }

    /// A problem at `position` of `file`.
    pub fn at(file: &str, position: Option<Position>, error: SluiceError) -> EngineError {
        EngineError { problems: vec![Problem { file: Some(file.to_owned()), position, error }] }
    }

    /// The first problem's error.
    pub fn first(&self) -> &SluiceError {
        &self.problems.first().expect("an engine error holds at least one problem").error
    }

    /// The first problem's stable code.
    pub fn code(&self) -> &'static str {
        self.first().code
    }

    /// The first problem's kind (what control flow may act on).
    pub fn kind(&self) -> ErrorKind {
        self.first().kind
    }

    /// Whether the user (the pipeline file, the data, the command) is at fault.
    pub fn is_user_error(&self) -> bool {
        self.problems.iter().all(|p| p.error.domain == Domain::User)
    }
}

impl From<SluiceError> for EngineError {
    fn from(error: SluiceError) -> EngineError {
        EngineError::new(error)
    }
}

impl From<ConfigError> for Problem {
    fn from(error: ConfigError) -> Problem {
        let mut sluice = SluiceError::user("config.invalid", error.message);
        sluice.fix = error.fix;
        Problem { file: Some(error.file), position: error.position, error: sluice }
    }
}

impl From<Vec<ConfigError>> for EngineError {
    fn from(errors: Vec<ConfigError>) -> EngineError {
        assert!(!errors.is_empty(), "a configuration failure names at least one error");
        EngineError { problems: errors.into_iter().map(Problem::from).collect() }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.problems.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EngineError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_display_like_the_parser_and_keep_code_and_fix() {
        let config = ConfigError::new("p.toml", Some(Position::new(3, 7)), "bad", Some("do this".into()));
        let error = EngineError::from(vec![config]);
        assert_eq!(error.to_string(), "p.toml:3:7: bad\n  fix: do this");
        assert_eq!(error.code(), "config.invalid");
        let located = EngineError::at("p.toml", None, SluiceError::external("io.x", "gone").with_fix("retry"));
        assert_eq!(located.to_string(), "p.toml: gone\n  fix: retry");
        assert!(!located.is_user_error());
        let bare = EngineError::new(SluiceError::user("a.b", "plain"));
        assert_eq!(bare.to_string(), "plain");
        assert!(bare.is_user_error());
    }
}
