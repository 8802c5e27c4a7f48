//! Connections to the server: the password from its environment variable, TLS as
//! `url`'s `sslmode` says ([`super::tls`]), bounded retries for a server that cannot be
//! reached, and errors that name the server (host, port, database, user; never the
//! password) and the fix.
//!
//! Only connecting is retried here ([`CONNECT_ATTEMPTS`], with a doubling pause): a
//! refused or timed-out connection may be a server restarting. Bad credentials, a
//! missing database and every error inside a transaction are not retried: the caller
//! decides (a transaction's rows are gone with its connection; the run fails and
//! replays them from its last checkpoint).

use std::time::Duration;

use postgres::error::{DbError, SqlState};
use postgres::{Client, Config, NoTls};
use sluice_types::SluiceError;

use tokio_postgres_rustls::MakeRustlsConnect;

use super::options::{PostgresSinkOptions, parse_connection};
use super::tls::{Side, SslMode, TlsFailure, TlsSettings, refuses_plain};

/// Connection attempts before a server that cannot be reached fails the step.
pub const CONNECT_ATTEMPTS: u32 = 3;
/// The pause after the first failed attempt; it doubles after each.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// The longest a write waits for a row lock (held, e.g., by a prepared transaction of
/// a checkpoint that failed) before it fails.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// How to reach the server: the client's configuration with the password applied.
#[derive(Clone)]
pub struct Server {
    /// Without the password, which is read when connecting.
    config: Config,
    /// `sslmode` and `sslrootcert` of `url`; the client's own mode in `config` is set
    /// from them.
    pub tls: TlsSettings,
    password_env: Option<String>,
    /// `host:port/database as user`, for messages.
    pub description: String,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

impl Server {
    /// The server of `options` (connecting to nothing).
    pub fn new(sink: &str, options: &PostgresSinkOptions) -> Result<Server, SluiceError> {
        let (mut config, tls) = parse_connection(&options.url, "sink.postgres_url", &format!("sink `{sink}`"))?;
        config.connect_timeout(options.connect_timeout);
        config.application_name("sluice");
        let description = describe(&config);
        Ok(Server { config, tls, password_env: options.password_env.clone(), description })
    }

    /// The configuration with the password from `password_env`, read when connecting
    /// (so that `sluice validate` needs no secret).
    fn config(&self, sink: &str) -> Result<Config, SluiceError> {
        let mut config = self.config.clone();
        if let Some(variable) = &self.password_env {
            let password = std::env::var(variable).map_err(|_| {
                SluiceError::user(
                    "sink.postgres_password",
                    format!("sink `{sink}`: password_env names {variable}, which is not set (or not UTF-8)"),
                )
                .with_fix(format!("export {variable}=… before running, or remove `password_env`"))
            })?;
            config.password(password);
        }
        Ok(config)
    }

    /// A new session, after at most [`CONNECT_ATTEMPTS`] attempts for a server that
    /// cannot be reached.
    /// TLS failures are not retried: a certificate does not change between attempts.
    pub fn connect(&self, sink: &str) -> Result<Client, SluiceError> {
        let config = self.config(sink)?;
        let tls = self.tls.client_config().map_err(|failure| self.tls_error(sink, failure))?;
        let mut pause = RETRY_PAUSE;
        let mut attempt = 1;
        loop {
            let result = match &tls {
                Some(tls) => config.connect(MakeRustlsConnect::new(tls.clone())),
                None => config.connect(NoTls),
            };
            match result {
                Ok(client) => return Ok(client),
                Err(error)
                    if error.as_db_error().is_none()
                        && attempt < CONNECT_ATTEMPTS
                        && self.tls_failure(&error).is_none() =>
                {
                    tracing::warn!(sink, server = %self.description, attempt, "cannot connect to PostgreSQL ({error}); retrying");
                    std::thread::sleep(pause);
                    pause *= 2;
                    attempt += 1;
                }
                Err(error) => return Err(self.connect_error(sink, &error)),
            }
        }
    }

    /// A writer's session: [`Self::connect`] with a bounded lock wait.
    pub fn connect_writer(&self, sink: &str) -> Result<Client, SluiceError> {
        let mut client = self.connect(sink)?;
        let statement = format!("SET lock_timeout = '{}s'", LOCK_TIMEOUT.as_secs());
        client.batch_execute(&statement).map_err(|e| self.error(sink, "setting lock_timeout", &e))?;
        Ok(client)
    }

    /// The TLS failure `error` holds, if any (a handshake's, or a refusal of TLS).
    fn tls_failure(&self, error: &postgres::Error) -> Option<TlsFailure> {
        let host = self.config.get_hosts().first().map_or_else(String::new, |host| match host {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        });
        TlsFailure::find(error, &host)
    }

    fn tls_error(&self, sink: &str, failure: TlsFailure) -> SluiceError {
        failure.into_error(Side::Sink, &format!("sink `{sink}`"), &self.description, &self.tls)
    }

    fn connect_error(&self, sink: &str, error: &postgres::Error) -> SluiceError {
        let server = &self.description;
        if let Some(failure) = self.tls_failure(error) {
            return self.tls_error(sink, failure);
        }
        match error.as_db_error() {
            Some(db) if self.tls.mode == SslMode::Disable && refuses_plain(db.code().code(), db.message()) => {
                self.tls_error(sink, TlsFailure::EncryptionRequired { detail: db.message().to_owned() })
            }
            Some(db) if is_credentials(db.code()) => SluiceError::user(
                "sink.postgres_credentials",
                format!("sink `{sink}`: PostgreSQL at {server} refused the credentials: {}", db.message()),
            )
            .with_fix("check the user in `url` and the password in the variable `password_env` names"),
            Some(db) if db.code() == &SqlState::INVALID_CATALOG_NAME => SluiceError::user(
                "sink.postgres_database",
                format!("sink `{sink}`: PostgreSQL at {server}: {}", db.message()),
            )
            .with_fix("create the database (CREATE DATABASE …) or name an existing one in `url`"),
            Some(db) => SluiceError::external(
                "sink.postgres_connect",
                format!("sink `{sink}`: PostgreSQL at {server} refused the connection: {}", db.message()),
            )
            .with_fix("check the server's log and pg_hba.conf"),
            None => SluiceError::external(
                "sink.postgres_unreachable",
                format!(
                    "sink `{sink}`: cannot reach PostgreSQL at {server} after {CONNECT_ATTEMPTS} attempts: {}",
                    full_message(error)
                ),
            )
            .with_fix("check that the server is running and that host and port in `url` are right"),
        }
    }

    /// An error of a statement on an open session, `doing` naming the step.
    pub fn error(&self, sink: &str, doing: &str, error: &postgres::Error) -> SluiceError {
        let server = &self.description;
        match error.as_db_error() {
            Some(db) => SluiceError::external(
                "sink.postgres_statement",
                format!("sink `{sink}`: PostgreSQL at {server} failed {doing}: {}", db_text(db)),
            )
            .with_fix("check the server's log; the run can be restarted from its last checkpoint"),
            None => SluiceError::external(
                "sink.postgres_connection",
                format!(
                    "sink `{sink}`: lost the connection to PostgreSQL at {server} {doing}: {}",
                    full_message(error)
                ),
            )
            .with_fix(
                "check that the server is running; the rows of the open transaction were rolled back and \
                 replay from the last checkpoint when the run is restarted",
            ),
        }
    }
}

/// Whether a server error means bad credentials.
fn is_credentials(code: &SqlState) -> bool {
    code == &SqlState::INVALID_PASSWORD || code == &SqlState::INVALID_AUTHORIZATION_SPECIFICATION
}

/// A server error with its detail and hint.
pub fn db_text(db: &DbError) -> String {
    let mut text = db.message().to_owned();
    if let Some(detail) = db.detail() {
        text.push_str(&format!(" ({detail})"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!("; hint: {hint}"));
    }
    text
}

/// An error with its sources (the client's top-level message is often only "error
/// connecting to server").
fn full_message(error: &postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    text
}

/// `host:port/database as user`, never the password.
fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
            postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
        })
        .collect();
    let user = config.get_user().unwrap_or("(default user)");
    let database = config.get_dbname().unwrap_or(user);
    format!("{}/{database} as {user}", hosts.join(","))
}
