//! The typed error for operating failures.
//!
//! Programmer errors are assertions, not values of this type. Every message names the
//! value at fault and, where one exists, the fix.

use std::fmt;

/// Who can fix the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// The pipeline file, the SQL or the input data: the user fixes it.
    User,
    /// A service, a file system or a peer outside the process.
    External,
    /// A bug in Sluice.
    Internal,
}

/// What a caller may act on. Control flow matches these variants, never `code` strings;
/// most failures are [`ErrorKind::Other`] and are only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ErrorKind {
    #[default]
    Other,
    /// A peer thread or process went away without ending its output (often the echo of
    /// a failure elsewhere: a supervisor waits briefly for the root cause).
    LostPeer,
    /// A stored object is missing, truncated or fails its checksum.
    DamagedObject,
    /// A stored manifest cannot be read or contradicts itself.
    DamagedManifest,
    /// A failure injected by a failpoint (tests).
    Injected,
    /// The reader of an output went away (a closed pipe): the consumer is done.
    OutputClosed,
    /// A thread panicked (a bug): the run fails, nothing retries.
    Panic,
}

/// An operating failure: bad configuration, bad rows, unreachable services, lost peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SluiceError {
    /// A stable code, e.g. `config.unknown_key`, `sql.unsupported`, `io.sink_path`: for
    /// people and logs.
    pub code: &'static str,
    pub domain: Domain,
    /// What control flow may act on.
    pub kind: ErrorKind,
    /// What went wrong, naming the value at fault.
    pub message: String,
    /// How to fix it, when there is a known remedy.
    pub fix: Option<String>,
}

impl SluiceError {
    pub fn user(code: &'static str, message: impl Into<String>) -> SluiceError {
        SluiceError { code, domain: Domain::User, kind: ErrorKind::Other, message: message.into(), fix: None }
    }

    pub fn external(code: &'static str, message: impl Into<String>) -> SluiceError {
        SluiceError { code, domain: Domain::External, kind: ErrorKind::Other, message: message.into(), fix: None }
    }

    pub fn internal(code: &'static str, message: impl Into<String>) -> SluiceError {
        SluiceError { code, domain: Domain::Internal, kind: ErrorKind::Other, message: message.into(), fix: None }
    }

    /// Marks what control flow may act on.
    pub fn with_kind(mut self, kind: ErrorKind) -> SluiceError {
        self.kind = kind;
        self
    }

    /// Adds the remedy shown after the message.
    pub fn with_fix(mut self, fix: impl Into<String>) -> SluiceError {
        self.fix = Some(fix.into());
        self
    }

    /// Prefixes the message with where it happened (a component, a file, a view).
    pub fn context(mut self, context: impl fmt::Display) -> SluiceError {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Whether retrying the same operation can succeed.
    pub fn is_retryable(&self) -> bool {
        self.domain == Domain::External
    }
}

/// The text of a panic's payload (what `panic!` was given).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

impl fmt::Display for SluiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SluiceError {}

impl From<arrow::error::ArrowError> for SluiceError {
    fn from(error: arrow::error::ArrowError) -> SluiceError {
        SluiceError::internal("arrow", error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_the_fix_on_its_own_line() {
        let error =
            SluiceError::user("config.bad_value", "threads = 0 is not allowed").with_fix("set threads to 1 or more");
        assert_eq!(error.to_string(), "threads = 0 is not allowed\n  fix: set threads to 1 or more");
        assert!(!error.is_retryable());
    }
}
