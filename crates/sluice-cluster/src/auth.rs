//! The shared secret of a cluster and the proof of it on every connection between
//! workers (control and data): mutual HMAC-SHA256 challenge-response.
//!
//! # Protocol, auth version 1
//!
//! Right after a connection opens (the data mesh: after its link preamble), both sides
//! run [`authenticate`], the connecting side as [`Role::Initiator`], the accepting side as
//! [`Role::Acceptor`]. Each side first **writes** its preamble, then reads the other's:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic, ASCII `SLCA` = `53 4c 43 41` |
//! | 1 | auth version (1) |
//! | 1 | flags: bit 0 set when the sender has a secret and requires the proof; other bits 0 |
//! | 32 | the sender's nonce, fresh from the operating system's random generator |
//!
//! - Neither side requires the proof: done (no secret anywhere).
//! - Exactly one side requires it: both refuse. Each knows from the two preambles which
//!   side lacks the secret, and says so.
//! - Both require it: each side writes its proof, then reads the other's (32 bytes):
//!
//! ```text
//! proof(role) = HMAC-SHA256(secret, "sluice-cluster/auth/v1" | 00 | role | initiator nonce | acceptor nonce)
//! role: 01 for the initiator, 02 for the acceptor
//! ```
//!
//! and checks the other's proof with `ring::hmac::verify` (constant time). The layout
//! of the preamble never changes across auth versions; a peer of another auth version is
//! refused naming both versions.
//!
//! # Correctness argument
//!
//! - **No deadlock**: each side writes everything it will send in a step (38, then 32
//!   bytes, far below any socket buffer) before it reads, so neither waits on the other.
//!   Every read is bounded by the stream's read timeout, which the caller sets (the
//!   rendezvous sets a deadline on the whole handshake).
//! - **Symmetric outcome**: both sides read the same two preambles and, with different
//!   secrets, each finds the other's proof wrong; so both refuse, each naming the cause.
//! - **The secret never crosses the wire**, only MACs over fresh nonces. A proof cannot be
//!   replayed (the other side's nonce is fresh) nor reflected (the role is inside the
//!   MAC, and the label separates this use of the secret from any other).
//! - **Limits**: this authenticates the peer when the connection opens. It does not
//!   encrypt or protect what follows; an attacker on the network path can relay the
//!   handshake and then read or alter the stream. Use a private network (or a tunnel)
//!   between workers when that matters.
//! - Bytes from the peer are read into fixed-size arrays: no length from the network is
//!   trusted, nothing panics, and a stray client is refused at its first wrong byte with
//!   what it sent.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::Path;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use sluice_types::SluiceError;

use crate::wire::escaped;

/// The environment variable holding the secret when no file is given.
pub const SECRET_ENV: &str = "SLUICE_CLUSTER_SECRET";
/// The first bytes of the auth preamble.
pub const AUTH_MAGIC: [u8; 4] = *b"SLCA";
/// The auth protocol this build speaks.
pub const AUTH_VERSION: u8 = 1;
/// A nonce's length.
pub const NONCE_BYTES: usize = 32;
/// The preamble's length: magic, version, flags, nonce.
pub const PREAMBLE_BYTES: usize = 4 + 1 + 1 + NONCE_BYTES;
/// A proof's length (an HMAC-SHA256 tag).
pub const PROOF_BYTES: usize = 32;
/// The largest secret file read (a secret is a few dozen bytes).
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// The domain-separation label inside every proof.
const LABEL: &[u8] = b"sluice-cluster/auth/v1";
const FLAG_REQUIRES_PROOF: u8 = 0b1;

/// How to give every worker the secret, for messages.
const SECRET_FIX: &str = "give every worker the same secret: `--secret-file PATH` (the same file content on every \
                          host) or the SLUICE_CLUSTER_SECRET environment variable";

/// The cluster's shared secret. `Debug` never shows it.
#[derive(Clone)]
pub struct Secret {
    key: hmac::Key,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A secret from its bytes; surrounding ASCII whitespace (the newline `echo` adds to a
    /// file) is not part of it. Refuses a secret that is empty or only whitespace.
    pub fn new(bytes: &[u8]) -> Result<Secret, SluiceError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.is_empty() {
            return Err(SluiceError::user("cluster.secret_empty", "the cluster secret is empty (or only whitespace)")
                .with_fix("put a long random value in it, e.g. `openssl rand -hex 32`"));
        }
        Ok(Secret { key: hmac::Key::new(hmac::HMAC_SHA256, trimmed) })
    }

    /// The secret in the file at `path` (at most [`MAX_SECRET_BYTES`]).
    pub fn from_file(path: &Path) -> Result<Secret, SluiceError> {
        let shown = path.display();
        let unreadable = |error: io::Error| {
            SluiceError::user("cluster.secret_file", format!("cannot read the secret file {shown}: {error}"))
                .with_fix("pass a readable file to --secret-file")
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_SECRET_BYTES as u64 + 1).read_to_end(&mut bytes))
            .map_err(unreadable)?;
        if bytes.len() > MAX_SECRET_BYTES {
            return Err(SluiceError::user(
                "cluster.secret_file",
                format!("the secret file {shown} is larger than {MAX_SECRET_BYTES} bytes: it is not a secret"),
            )
            .with_fix("pass the file that holds only the secret to --secret-file"));
        }
        Secret::new(&bytes).map_err(|error| error.context(format!("secret file {shown}")))
    }

    /// The secret in [`SECRET_ENV`], if that variable is set.
    pub fn from_env() -> Result<Option<Secret>, SluiceError> {
        Secret::from_env_value(std::env::var_os(SECRET_ENV))
    }

    /// The secret of `--secret-file` when given, else of [`SECRET_ENV`] when set, else none.
    pub fn resolve(secret_file: Option<&Path>) -> Result<Option<Secret>, SluiceError> {
        match secret_file {
            Some(path) => Secret::from_file(path).map(Some),
            None => Secret::from_env(),
        }
    }

    fn from_env_value(value: Option<std::ffi::OsString>) -> Result<Option<Secret>, SluiceError> {
        let Some(value) = value else { return Ok(None) };
        let value = value.into_string().map_err(|_| {
            SluiceError::user("cluster.secret_env", format!("{SECRET_ENV} is not valid UTF-8"))
                .with_fix("use a secret of printable characters, e.g. `openssl rand -hex 32`")
        })?;
        Secret::new(value.as_bytes()).map(Some).map_err(|error| error.context(SECRET_ENV))
    }
}

/// Which end of a connection a side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Initiator,
    /// The side that accepted.
    Acceptor,
}

impl Role {
    /// `Initiator` when `initiator`, else `Acceptor` (for callers that carry a flag).
    pub fn of_initiator(initiator: bool) -> Role {
        if initiator { Role::Initiator } else { Role::Acceptor }
    }

    fn byte(self) -> u8 {
        match self {
            Role::Initiator => 1,
            Role::Acceptor => 2,
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Initiator => Role::Acceptor,
            Role::Acceptor => Role::Initiator,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Initiator => "connecting",
            Role::Acceptor => "accepting",
        })
    }
}

/// Proves knowledge of `secret` to the other end of `stream` and checks its proof (see
/// the module doc); with no secret, checks that the other end has none either. Reads are
/// bounded by the stream's own timeouts. Errors are typed (`cluster.auth_*`) and say
/// which side lacks or differs in its secret; the caller adds the peer's address.
pub fn authenticate<S: Read + Write>(stream: &mut S, secret: Option<&Secret>, role: Role) -> Result<(), SluiceError> {
    let mine = Preamble { requires_proof: secret.is_some(), nonce: fresh_nonce()? };
    send(stream, &mine.encode(), "its preamble")?;
    let theirs = read_preamble(stream)?;
    let secret = match (secret, theirs.requires_proof) {
        (None, false) => return Ok(()),
        (Some(secret), true) => secret,
        (Some(_), false) => {
            return Err(missing_secret(format!(
                "this worker ({role}) has a cluster secret and the {} worker has none",
                role.other()
            )));
        }
        (None, true) => {
            return Err(missing_secret(format!(
                "the {} worker requires a cluster secret and this worker ({role}) has none",
                role.other()
            )));
        }
    };
    let (initiator, acceptor) = match role {
        Role::Initiator => (&mine.nonce, &theirs.nonce),
        Role::Acceptor => (&theirs.nonce, &mine.nonce),
    };
    let proof = hmac::sign(&secret.key, &proof_input(role, initiator, acceptor));
    send(stream, proof.as_ref(), "its proof")?;
    let mut their_proof = [0u8; PROOF_BYTES];
    read_fully(stream, &mut their_proof, "its proof of the secret")?;
    hmac::verify(&secret.key, &proof_input(role.other(), initiator, acceptor), &their_proof).map_err(|_| {
        SluiceError::user(
            "cluster.auth_secret_mismatch",
            format!(
                "the {} worker proved a different cluster secret than this worker's ({role}): the two workers \
                 were given different secrets",
                role.other()
            ),
        )
        .with_fix(SECRET_FIX)
    })
}

/// Refuses, before anything is bound, a control address reachable from other hosts with
/// no secret, unless `insecure` says the network is trusted.
pub fn check_control_bind(addr: SocketAddr, secret: Option<&Secret>, insecure: bool) -> Result<(), SluiceError> {
    check_bind("control", "join the cluster and read its data", addr, secret, insecure)
}

/// Refuses, before anything is bound, an exchange (data link) address reachable from
/// other hosts with no secret, unless `insecure` says the network is trusted: as for the
/// control address, since a link carries the pipeline's rows.
pub fn check_exchange_bind(addr: SocketAddr, secret: Option<&Secret>, insecure: bool) -> Result<(), SluiceError> {
    check_bind("exchange", "open a data link and send or read the pipeline's rows", addr, secret, insecure)
}

fn check_bind(
    which: &str,
    harm: &str,
    addr: SocketAddr,
    secret: Option<&Secret>,
    insecure: bool,
) -> Result<(), SluiceError> {
    if secret.is_some() || insecure || addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(SluiceError::user(
        "cluster.insecure_bind",
        format!(
            "the {which} address {addr} is reachable from other hosts and no cluster secret is set: anyone who \
             can reach this port could {harm}"
        ),
    )
    .with_fix(format!(
        "{SECRET_FIX}; or bind the {which} address (--{which}-bind) to 127.0.0.1 for a single host; or, on a \
         network only the workers can reach, accept the risk with --insecure"
    )))
}

/// One side's preamble.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Preamble {
    requires_proof: bool,
    nonce: [u8; NONCE_BYTES],
}

impl Preamble {
    fn encode(&self) -> [u8; PREAMBLE_BYTES] {
        let mut bytes = [0u8; PREAMBLE_BYTES];
        bytes[..4].copy_from_slice(&AUTH_MAGIC);
        bytes[4] = AUTH_VERSION;
        bytes[5] = if self.requires_proof { FLAG_REQUIRES_PROOF } else { 0 };
        bytes[6..].copy_from_slice(&self.nonce);
        bytes
    }

    /// Checks magic, version and flags of a complete preamble.
    fn decode(bytes: &[u8; PREAMBLE_BYTES]) -> Result<Preamble, SluiceError> {
        if bytes[..4] != AUTH_MAGIC {
            return Err(not_a_worker(bytes));
        }
        if bytes[4] != AUTH_VERSION {
            return Err(SluiceError::user(
                "cluster.auth_version",
                format!("the peer speaks auth version {}, this worker speaks {AUTH_VERSION}", bytes[4]),
            )
            .with_fix("run the same sluice version on every worker"));
        }
        if bytes[5] & !FLAG_REQUIRES_PROOF != 0 {
            return Err(SluiceError::external(
                "cluster.auth_flags",
                format!("the peer's auth preamble has unknown flags {:#04x}", bytes[5]),
            ));
        }
        let mut nonce = [0u8; NONCE_BYTES];
        nonce.copy_from_slice(&bytes[6..]);
        Ok(Preamble { requires_proof: bytes[5] & FLAG_REQUIRES_PROOF != 0, nonce })
    }
}

/// The bytes a proof by `role` covers.
fn proof_input(role: Role, initiator: &[u8; NONCE_BYTES], acceptor: &[u8; NONCE_BYTES]) -> Vec<u8> {
    let mut input = Vec::with_capacity(LABEL.len() + 2 + 2 * NONCE_BYTES);
    input.extend_from_slice(LABEL);
    input.push(0);
    input.push(role.byte());
    input.extend_from_slice(initiator);
    input.extend_from_slice(acceptor);
    input
}

fn fresh_nonce() -> Result<[u8; NONCE_BYTES], SluiceError> {
    let mut nonce = [0u8; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SluiceError::external("cluster.auth_random", "the operating system's random generator failed"))?;
    Ok(nonce)
}

/// Reads the peer's preamble, refusing at the first byte that breaks the magic.
fn read_preamble<S: Read>(stream: &mut S) -> Result<Preamble, SluiceError> {
    let mut bytes = [0u8; PREAMBLE_BYTES];
    let mut filled = 0;
    while filled < PREAMBLE_BYTES {
        filled += read_some(stream, &mut bytes[filled..], filled, "its auth preamble")?;
        let magic = filled.min(AUTH_MAGIC.len());
        if bytes[..magic] != AUTH_MAGIC[..magic] {
            return Err(not_a_worker(&bytes[..filled]));
        }
    }
    Preamble::decode(&bytes)
}

fn read_fully<S: Read>(stream: &mut S, buf: &mut [u8], what: &str) -> Result<(), SluiceError> {
    let mut filled = 0;
    while filled < buf.len() {
        filled += read_some(stream, &mut buf[filled..], filled, what)?;
    }
    Ok(())
}

/// One read of at least one byte; `filled` (bytes of `what` already read) is for messages.
fn read_some<S: Read>(stream: &mut S, buf: &mut [u8], filled: usize, what: &str) -> Result<usize, SluiceError> {
    loop {
        return match stream.read(buf) {
            Ok(0) => Err(SluiceError::external(
                "cluster.auth_closed",
                format!(
                    "the peer closed the connection after {filled} bytes of {what} (if it is a worker, it refused \
                     this one: see its log)"
                ),
            )),
            Ok(n) => Ok(n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) if is_timeout(&error) => Err(SluiceError::external(
                "cluster.auth_timeout",
                format!("the peer sent {filled} bytes of {what} and then nothing in time"),
            )),
            Err(error) => Err(SluiceError::external(
                "cluster.auth_io",
                format!("reading {what} from the peer failed after {filled} bytes: {error}"),
            )),
        };
    }
}

fn send<S: Write>(stream: &mut S, bytes: &[u8], what: &str) -> Result<(), SluiceError> {
    stream.write_all(bytes).and_then(|()| stream.flush()).map_err(|error| {
        SluiceError::external(
            "cluster.auth_io",
            format!(
                "sending {what} to the peer failed: {error} (if it is a worker, it may have refused this one: see \
                 its log)"
            ),
        )
    })
}

/// Whether a read or write error is a socket timeout (`WouldBlock` on Unix, `TimedOut`
/// on Windows).
pub(crate) fn is_timeout(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn not_a_worker(sent: &[u8]) -> SluiceError {
    SluiceError::external("cluster.auth_not_a_worker", format!("not a Sluice worker: it sent {}", escaped(sent)))
        .with_fix("point only Sluice workers at this port")
}

fn missing_secret(message: String) -> SluiceError {
    SluiceError::user("cluster.auth_missing_secret", message).with_fix(SECRET_FIX)
}

#[cfg(test)]
mod tests;
