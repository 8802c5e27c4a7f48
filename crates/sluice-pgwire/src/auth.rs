//! Who may connect: with the admin token set, a client must prove it knows the token
//! (its password, any user name) through SCRAM-SHA-256 (RFC 7677, PostgreSQL's
//! `scram-sha-256`): the token never crosses the network, and a client learns nothing
//! from a failure but that it failed (`28P01`). Without a token (a loopback address
//! only, `server::check_access`) every local client is trusted, as PostgreSQL's `trust`.
//!
//! The server's parameters (`ParameterStatus`) say PostgreSQL 15.0, whose catalog
//! queries `catalog` answers (psql picks its queries by the server's version), UTF8,
//! ISO dates, UTC and `standard_conforming_strings = on`.
//!
//! Cancel requests: every connection is registered by its process id and secret key
//! (32 random bits, as PostgreSQL's) while it lives; a `CancelRequest` naming both ends
//! the query it runs (`pgwire` drops the handler's future, and with it the lease and
//! the execution), and answers nothing otherwise.
//!
//! Bounds: one salted key derived at start (4096 iterations, PostgreSQL's default), a
//! fresh random salt each start; the exchange within `pgwire`'s startup timeout.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::sink::{Sink, SinkExt};
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{ScramAuth, gen_salted_password};
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::api::{
    ClientInfo, ConnectionGuard, ConnectionHandle, ConnectionManager, PidSecretKeyGenerator,
    RandomPidSecretKeyGenerator,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::PgWireFrontendMessage;

/// The version the server says it is: PostgreSQL 15's catalog queries are answered.
pub(crate) const SERVER_VERSION: &str = "15.0";
/// PBKDF2 iterations of the salted key.
const ITERATIONS: usize = 4096;

/// What the server tells every client after it authenticated.
pub(crate) fn parameters() -> DefaultServerParameterProvider {
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.server_version = SERVER_VERSION.to_string();
    parameters.time_zone = "UTC".to_string();
    parameters.default_transaction_read_only = true;
    parameters.is_superuser = false;
    parameters
}

/// The startup handler: SCRAM-SHA-256 with the token, or trust without one.
pub(crate) enum Startup {
    Trust(Trust),
    Scram(SASLAuthStartupHandler<DefaultServerParameterProvider>),
}

impl Startup {
    /// Derives the salted key of `token` once (a random salt), or trusts without one.
    /// Every connection that starts is registered with `connections`, by its process id
    /// and secret key, so that a cancel request can find its query.
    /// With TLS, `certificate` (its PEM) also offers SCRAM-SHA-256-PLUS, which binds the
    /// exchange to the TLS channel.
    pub(crate) fn new(token: Option<&str>, certificate: Option<&[u8]>, connections: Arc<ConnectionManager>) -> Startup {
        let Some(token) = token else {
            return Startup::Trust(Trust {
                parameters: parameters(),
                keys: RandomPidSecretKeyGenerator::default(),
                connections,
            });
        };
        let salt = random_salt();
        let salted = gen_salted_password(token, &salt, ITERATIONS);
        let mut scram = ScramAuth::new(Arc::new(TokenSource { salt, salted }));
        scram.set_iterations(ITERATIONS);
        if let Some(certificate) = certificate
            && let Err(error) = scram.configure_certificate(certificate)
        {
            // Plain SCRAM-SHA-256 still authenticates; only the channel binding is lost.
            tracing::warn!(%error, "the PostgreSQL endpoint offers SCRAM without channel binding");
        }
        Startup::Scram(
            SASLAuthStartupHandler::new(Arc::new(parameters())).with_scram(scram).with_connection_manager(connections),
        )
    }
}

/// 16 random bytes (a fixed salt only if the system's generator fails, which it does
/// not on any supported system; the key stays secret either way).
fn random_salt() -> Vec<u8> {
    use ring::rand::SecureRandom;
    let mut salt = vec![0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut salt).is_err() {
        tracing::warn!("no random salt for the PostgreSQL endpoint's SCRAM key; using a fixed one");
        salt = b"sluice-pgwire-salt".to_vec();
    }
    salt
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Trust(trust) => trust.on_startup(client, message).await,
            Startup::Scram(scram) => scram.on_startup(client, message).await,
        }
    }
}

/// The token's salted key, the only secret the SCRAM exchange needs.
struct TokenSource {
    salt: Vec<u8>,
    salted: Vec<u8>,
}

impl Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSource(..)")
    }
}

#[async_trait]
impl AuthSource for TokenSource {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        Ok(Password::new(Some(self.salt.clone()), self.salted.clone()))
    }
}

/// No authentication (a loopback address without a token): the startup is answered at
/// once with the server's parameters.
pub(crate) struct Trust {
    parameters: DefaultServerParameterProvider,
    keys: RandomPidSecretKeyGenerator,
    connections: Arc<ConnectionManager>,
}

impl Trust {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(startup) = message else {
            return Ok(());
        };
        pgwire::api::auth::protocol_negotiation(client, &startup).await?;
        pgwire::api::auth::save_startup_parameters_to_metadata(client, &startup);
        let (pid, secret_key) = self.keys.generate(client);
        client.set_pid_and_secret_key(pid, secret_key.clone());
        // Registered while the connection lives (the guard leaves with its session).
        let (handle, guard) = self.connections.register(pid, secret_key);
        client.session_extensions().insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert::<ConnectionGuard>(guard);
        // Authentication ok, the parameters, the key data, ReadyForQuery.
        pgwire::api::auth::finish_authentication(client, &self.parameters).await?;
        client.flush().await?;
        Ok(())
    }
}
