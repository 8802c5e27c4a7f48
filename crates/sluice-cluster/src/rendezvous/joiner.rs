//! The joining worker's side of the rendezvous: connect (retrying while the leader is not
//! up), authenticate, register, and wait for the welcome, all by one deadline.
//!
//! Retries cover only the connection itself (refused, unreachable, a name that does not
//! resolve yet), with a backoff doubling from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`] and
//! never past the deadline. Once connected, any failure is final: a refusal or an
//! authentication failure would repeat, and a leader that closes the connection has given
//! up (its log says why).

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use sluice_types::SluiceError;

use super::membership::Membership;
use super::session::{MAX_QUEUED_EVENTS_PER_PEER, Session, Timing, WorkerControl};
use super::stream::{Deadline, ReadFailure, read_until, refuse, write_until};
use super::{ControlSettings, WorkerInfo, seconds};
use crate::auth::{Role, Secret, authenticate};
use crate::wire::{ControlMessage, FrameReader, Problem, frame_of};

/// The first wait between connection attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest one connection attempt may take.
const MAX_CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

/// Joins the leader at `leader`; see the module doc of `rendezvous`.
pub(crate) fn join(
    leader: &str,
    me: WorkerInfo,
    secret: Option<&Secret>,
    timeout: Duration,
    settings: &ControlSettings,
    version: u16,
) -> Result<(Membership, WorkerControl), SluiceError> {
    settings.check()?;
    let deadline = Instant::now() + timeout;
    tracing::info!(%leader, exchange = %me.exchange_addr, "joining the leader");
    let stream = connect(leader, deadline, timeout, settings)?;
    let _ = stream.set_nodelay(true);
    authenticate(&mut Deadline::new(&stream, deadline), secret, Role::Initiator)
        .map_err(|error| error.context(format!("authenticating with the leader at {leader}")))?;
    write_until(&stream, &frame_of(&me.register(), version)?, deadline).map_err(|error| {
        SluiceError::external("cluster.control_io", format!("registering with the leader at {leader} failed: {error}"))
    })?;
    let mut reader = FrameReader::new(version);
    // The welcome comes once every worker joined: wait in slices, to notice a stop.
    let welcome = loop {
        settings.cancelled(&format!("waiting for the leader at {leader} to gather every worker"))?;
        match read_until(&stream, &mut reader, deadline.min(Instant::now() + super::CANCEL_POLL)) {
            Err(ReadFailure::TimedOut) if Instant::now() < deadline => continue,
            other => break other,
        }
    };
    let welcome = match welcome {
        Ok(ControlMessage::Welcome(welcome)) => welcome,
        Ok(ControlMessage::Refusal(text)) => return Err(refused_by(leader, &text)),
        Ok(other) => {
            let message =
                format!("the leader at {leader} answered with a {:?} frame instead of a welcome", other.kind());
            return Err(SluiceError::external("cluster.control_protocol", message));
        }
        Err(ReadFailure::Wire(Problem::Version { found, expected })) => {
            return Err(refuse_leader(stream, version, version_mismatch(leader, found, expected)));
        }
        Err(failure) => return Err(read_failure(failure, leader, timeout)),
    };
    if welcome.fingerprint != me.fingerprint {
        let error = SluiceError::user(
            "cluster.fingerprint_mismatch",
            format!(
                "topology fingerprint mismatch: the leader at {leader} has fingerprint {}, this joining worker \
                 (exchange {}) has {}",
                welcome.fingerprint, me.exchange_addr, me.fingerprint
            ),
        )
        .with_fix(super::AGREEMENT_FIX);
        return Err(refuse_leader(stream, version, error));
    }
    let membership = match Membership::from_welcome(welcome, &me) {
        Ok(membership) => membership,
        Err(problem) => {
            let message = format!("the welcome from the leader at {leader} is not valid: {problem}");
            return Err(refuse_leader(stream, version, SluiceError::external("cluster.bad_welcome", message)));
        }
    };
    let control = start_session(stream, reader, leader, version, settings)?;
    tracing::info!(%leader, me = membership.me, workers = membership.len(), "joined the cluster");
    Ok((membership, control))
}

/// Connects to `leader`, retrying until `deadline` (or until `settings.cancel`).
fn connect(
    leader: &str,
    deadline: Instant,
    timeout: Duration,
    settings: &ControlSettings,
) -> Result<TcpStream, SluiceError> {
    if !leader.contains(':') {
        return Err(SluiceError::user("cluster.leader_address", format!("the leader address {leader:?} has no port"))
            .with_fix("give the leader's control address as HOST:PORT"));
    }
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0u32;
    let mut last_error = String::new();
    let waiting = format!("connecting to the leader at {leader}");
    loop {
        settings.cancelled(&waiting)?;
        attempts += 1;
        match attempt(leader, deadline) {
            Ok(stream) => return Ok(stream),
            // An attempt cut short by the deadline tried nothing: keep what the one
            // before it saw.
            Err(error) if !error.is_empty() => last_error = error,
            Err(_) => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            if last_error.is_empty() {
                last_error = "no attempt finished before the deadline".to_string();
            }
            return Err(SluiceError::external(
                "cluster.leader_unreachable",
                format!(
                    "could not connect to the leader at {leader} within {} ({attempts} attempts; the last: {last_error})",
                    seconds(timeout)
                ),
            )
            .with_fix(format!(
                "start the leader first, check that {leader} is its control address, and that this host can reach it"
            )));
        }
        tracing::debug!(%leader, "the leader is not reachable yet: {last_error}");
        super::sleep_unless_cancelled(backoff.min(remaining), settings, &waiting)?;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One attempt at every address `leader` resolves to.
fn attempt(leader: &str, deadline: Instant) -> Result<TcpStream, String> {
    let addresses: Vec<SocketAddr> = leader.to_socket_addrs().map_err(|error| error.to_string())?.collect();
    let mut last_error = if addresses.is_empty() { format!("{leader} resolves to no address") } else { String::new() };
    for address in addresses {
        let remaining = deadline.saturating_duration_since(Instant::now()).min(MAX_CONNECT_ATTEMPT);
        if remaining.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&address, remaining) {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = format!("{address}: {error}"),
        }
    }
    Err(last_error)
}

/// The leader's refusal as this worker's error (the text is `MESSAGE[\n  fix: FIX]`).
fn refused_by(leader: &str, text: &str) -> SluiceError {
    let (message, fix) = match text.split_once("\n  fix: ") {
        Some((message, fix)) => (message, Some(fix)),
        None => (text, None),
    };
    let error = SluiceError::user("cluster.refused", format!("the leader at {leader} refused this worker: {message}"));
    match fix {
        Some(fix) => error.with_fix(fix),
        None => error,
    }
}

fn version_mismatch(leader: &str, found: u16, expected: u16) -> SluiceError {
    SluiceError::user(
        "cluster.wire_version",
        format!(
            "control wire version mismatch: the leader at {leader} speaks version {found}, this joining worker \
             speaks version {expected}"
        ),
    )
    .with_fix("run the same sluice version on every worker")
}

/// Tells the leader why this worker refuses it, and returns the error.
fn refuse_leader(stream: TcpStream, version: u16, error: SluiceError) -> SluiceError {
    refuse(stream, &error, version);
    error
}

fn read_failure(failure: ReadFailure, leader: &str, timeout: Duration) -> SluiceError {
    match failure {
        ReadFailure::Wire(problem) => problem.into_error().context(format!("the leader at {leader}")),
        ReadFailure::Closed { buffered } => SluiceError::external(
            "cluster.leader_closed",
            format!(
                "the leader at {leader} closed the control connection before the cluster formed ({buffered} bytes \
                 of a frame arrived)"
            ),
        )
        .with_fix("see the leader's log: it may have given up waiting for the other workers, or stopped"),
        ReadFailure::TimedOut => SluiceError::external(
            "cluster.join_timeout",
            format!(
                "no welcome from the leader at {leader} within {}: the cluster did not form (the leader waits for \
                 every worker)",
                seconds(timeout)
            ),
        )
        .with_fix("start the missing workers, and see the leader's log for who joined"),
        ReadFailure::Io(error) => SluiceError::external(
            "cluster.control_io",
            format!("reading the welcome from the leader at {leader} failed: {error}"),
        ),
    }
}

fn start_session(
    stream: TcpStream,
    reader: FrameReader,
    leader: &str,
    version: u16,
    settings: &ControlSettings,
) -> Result<WorkerControl, SluiceError> {
    let events = unbounded();
    let label = format!("the leader at {leader}");
    let session = Arc::new(Session::new(0, label, stream, events.0.clone(), version, Timing::of(settings))?);
    let handle = session.start(reader, MAX_QUEUED_EVENTS_PER_PEER)?;
    Ok(WorkerControl::new(leader, session, handle, events))
}
