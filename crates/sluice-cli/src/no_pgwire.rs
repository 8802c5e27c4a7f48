//! The PostgreSQL endpoint in a build without the `pgwire` feature: `--pg-bind` is still
//! an option, and anything but `off` is refused before the run with the feature that
//! builds the endpoint. The types have no values, so nothing past the refusal runs.

use std::net::SocketAddr;
use std::path::Path;

use sluice_admin::Queries;
use sluice_types::SluiceError;

/// Never made: [`PgListener::bind`] refuses.
pub enum PgListener {}

/// Never made: no listener serves.
pub enum PgServer {}

impl PgListener {
    /// Refuses: this build has no PostgreSQL endpoint.
    pub fn bind(bind: SocketAddr, _token: Option<String>) -> Result<PgListener, SluiceError> {
        Err(SluiceError::user(
            "run.pg_bind",
            format!(
                "--pg-bind {bind}: this build of sluice was compiled without the PostgreSQL endpoint (the cargo \
                 feature `pgwire`)"
            ),
        )
        .with_fix(
            "rebuild with `--features pgwire` (`cargo build --release --features pgwire`; `--features full` builds \
             every connector and endpoint), or query over HTTP (`sluice query`, `POST /query`)",
        ))
    }

    pub fn with_tls(self, _certificate: &Path, _key: &Path) -> Result<PgListener, SluiceError> {
        match self {}
    }

    pub fn serve(self, _queries: Queries) -> Result<PgServer, SluiceError> {
        match self {}
    }
}

impl PgServer {
    pub fn addr(&self) -> SocketAddr {
        match *self {}
    }

    pub fn shutdown(self) {
        match self {}
    }
}
