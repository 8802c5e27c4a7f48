//! The JSON bodies the API answers with (and the empty one its POSTs read), described
//! for the OpenAPI document (`openapi`).

use serde::Serialize;
use utoipa::ToSchema;

use crate::status::State as JobStateName;

/// An error: what went wrong and how to fix it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
    pub(crate) fix: String,
}

impl From<sluice_types::SluiceError> for ErrorBody {
    fn from(error: sluice_types::SluiceError) -> ErrorBody {
        ErrorBody { error: error.message, fix: error.fix.unwrap_or_default() }
    }
}

/// The body of a `POST` that reads none: `{}` (or nothing), sent as
/// `Content-Type: application/json` as every POST is (see `site`: a browser sends that
/// type across sites only after a preflight this API never grants).
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoBody {}

/// `POST /pause`'s and `POST /resume`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Paused {
    /// Whether the sources are paused now.
    pub(crate) paused: bool,
    /// The state right after asking.
    pub(crate) state: JobStateName,
}

/// `POST /checkpoint`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CheckpointTaken {
    /// The committed checkpoint's epoch (the first that started after the request).
    pub(crate) epoch: u64,
}

/// `POST /stop`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Stopping {
    /// Always true: the stop was asked for (it is idempotent).
    pub(crate) stopping: bool,
    /// The state right after asking.
    pub(crate) state: JobStateName,
}
