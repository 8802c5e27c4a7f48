//! The leader's side of the rendezvous: accept, handshake each connection on its own
//! thread, gather registrations until every worker is there (or the join timeout), then
//! welcome them and keep the connections as control sessions.
//!
//! The gathering loop owns the listener (non-blocking) and the registered set; it wakes
//! every [`ACCEPT_POLL`] to accept, and at once when a handshake thread reports. Each
//! handshake thread authenticates, reads the registration and checks version and
//! fingerprint under its own deadline, refusing the peer itself when a check fails; it
//! then reports exactly one [`Arrival`], so the loop's count of handshakes in flight is
//! exact. Duplicates are judged by the loop (it owns the registered set), which hands the
//! refusal to a short-lived thread so that it never waits on a peer.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use sluice_types::SluiceError;

use super::membership::Membership;
use super::session::{LeaderControl, MAX_QUEUED_EVENTS_PER_PEER, Session, Timing};
use super::stream::{Deadline, ReadFailure, is_closed, read_until, refuse};
use super::{ControlSettings, MAX_PENDING_HANDSHAKES, RendezvousEvent, WorkerInfo, seconds};
use crate::auth::{Role, Secret, authenticate};
use crate::wire::{ControlMessage, FrameReader, Member, Problem, Register, Welcome, frame_of};

/// How often the gathering leader looks for new connections.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How often the formed cluster's doorman looks for late joiners (and for its stop flag).
const DOORMAN_POLL: Duration = Duration::from_millis(250);
/// How many refused connections the join-timeout message lists.
const MAX_SEEN_LISTED: usize = 16;

/// What the caller asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gathering {
    /// Workers in the cluster, the leader included.
    pub(crate) workers: usize,
    pub(crate) join_timeout: Duration,
    /// The wire version this leader speaks (tests announce others).
    pub(crate) wire_version: u16,
}

/// Leads the rendezvous; see the module doc of `rendezvous`.
pub(crate) fn lead(
    listener: TcpListener,
    me: WorkerInfo,
    secret: Option<&Secret>,
    gathering: Gathering,
    settings: &ControlSettings,
) -> Result<(Membership, LeaderControl), SluiceError> {
    settings.check()?;
    if gathering.workers == 0 || me.threads == 0 {
        return Err(SluiceError::user(
            "cluster.settings",
            format!("a cluster of {} workers with {} threads on the leader", gathering.workers, me.threads),
        )
        .with_fix("run at least one worker with at least one thread"));
    }
    if gathering.workers == 1 {
        return Ok((Membership::solo(&me), LeaderControl::new(Vec::new(), Vec::new(), unbounded(), None)));
    }
    let mut door = Door::open(listener, &me, secret, gathering.wire_version, settings)?;
    let mut registry = Registry::new(gathering.workers, &me.exchange_addr);
    gather(&mut door, &mut registry, gathering.join_timeout, settings)?;
    form(door, registry, &me, settings)
}

/// Everything a handshake thread needs.
#[derive(Debug)]
struct Facts {
    fingerprint: String,
    version: u16,
    handshake_timeout: Duration,
    secret: Option<Secret>,
}

/// A handshake's outcome; each handshake thread reports exactly one.
#[derive(Debug)]
enum Arrival {
    /// A checked registration, its connection open.
    Registered(Registration),
    /// The connection was refused (the thread sent the refusal, if any) and closed.
    Refused { peer: SocketAddr, error: SluiceError },
}

#[derive(Debug)]
struct Registration {
    peer: SocketAddr,
    stream: TcpStream,
    /// What was read past the registration (normally nothing).
    reader: FrameReader,
    register: Register,
}

/// The listener and the handshakes in flight.
#[derive(Debug)]
struct Door {
    listener: TcpListener,
    /// The control address, for messages.
    address: String,
    facts: Arc<Facts>,
    arrivals_tx: Sender<Arrival>,
    arrivals_rx: Receiver<Arrival>,
    in_flight: usize,
}

impl Door {
    fn open(
        listener: TcpListener,
        me: &WorkerInfo,
        secret: Option<&Secret>,
        version: u16,
        settings: &ControlSettings,
    ) -> Result<Door, SluiceError> {
        let local = listener.local_addr();
        let io = |error: io::Error| {
            SluiceError::external("cluster.control_listen", format!("the control listener failed: {error}"))
        };
        listener.set_nonblocking(true).map_err(io)?;
        let address = local.map_err(io)?.to_string();
        let facts = Facts {
            fingerprint: me.fingerprint.clone(),
            version,
            handshake_timeout: settings.handshake_timeout,
            secret: secret.cloned(),
        };
        let (arrivals_tx, arrivals_rx) = unbounded();
        Ok(Door { listener, address, facts: Arc::new(facts), arrivals_tx, arrivals_rx, in_flight: 0 })
    }

    /// Accepts every pending connection, each handshaken on its own thread.
    fn admit(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.start_handshake(stream, peer),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::warn!(address = %self.address, "accepting a control connection failed: {error}");
                    return;
                }
            }
        }
    }

    fn start_handshake(&mut self, stream: TcpStream, peer: SocketAddr) {
        if self.in_flight >= MAX_PENDING_HANDSHAKES {
            tracing::warn!(%peer, "dropped a control connection: {MAX_PENDING_HANDSHAKES} handshakes are under way");
            return;
        }
        let facts = Arc::clone(&self.facts);
        let arrivals = self.arrivals_tx.clone();
        let spawned = thread::Builder::new().name("sluice-handshake".into()).spawn(move || {
            // After the rendezvous ended nobody listens: the connection is just dropped.
            let _ = arrivals.send(handshake(stream, peer, &facts));
        });
        match spawned {
            Ok(_) => self.in_flight += 1,
            Err(error) => tracing::warn!(%peer, "dropped a control connection: no thread for it: {error}"),
        }
    }

    /// The next handshake outcome, waiting until `until` at most.
    fn next(&mut self, until: Instant) -> Option<Arrival> {
        match self.arrivals_rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(arrival) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                Some(arrival)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// How joiners reach this leader, for messages (`HOST:PORT` when bound to all
    /// interfaces).
    fn join_address(&self) -> String {
        match self.address.parse::<SocketAddr>() {
            Ok(addr) if addr.ip().is_unspecified() => format!("LEADER_HOST:{}", addr.port()),
            _ => self.address.clone(),
        }
    }
}

/// Authenticates, reads and checks one registration (on its own thread).
fn handshake(stream: TcpStream, peer: SocketAddr, facts: &Facts) -> Arrival {
    let deadline = Instant::now() + facts.handshake_timeout;
    let refused = |error: SluiceError| Arrival::Refused { peer, error };
    if let Err(error) = stream.set_nonblocking(false) {
        return refused(SluiceError::external(
            "cluster.control_io",
            format!("control connection from {peer}: {error}"),
        ));
    }
    let _ = stream.set_nodelay(true);
    let authenticated = authenticate(&mut Deadline::new(&stream, deadline), facts.secret.as_ref(), Role::Acceptor);
    if let Err(error) = authenticated {
        return refused(error.context(format!("control connection from {peer}")));
    }
    let mut reader = FrameReader::new(facts.version);
    let register = match read_until(&stream, &mut reader, deadline) {
        Ok(ControlMessage::Register(register)) => register,
        Ok(ControlMessage::Refusal(text)) => {
            let message = format!("the worker at {peer} refused the leader: {text}");
            return refused(SluiceError::external("cluster.refused", message));
        }
        Ok(other) => {
            let message = format!("the connection from {peer} sent a {:?} frame instead of registering", other.kind());
            return refused(SluiceError::external("cluster.control_protocol", message));
        }
        Err(ReadFailure::Wire(Problem::Version { found, expected })) => {
            let error = version_mismatch(peer, found, expected);
            refuse(stream, &error, facts.version);
            return refused(error);
        }
        Err(failure) => return refused(read_failure(failure, peer, facts.handshake_timeout)),
    };
    if let Err(error) = check_register(&register, peer, facts) {
        refuse(stream, &error, facts.version);
        return refused(error);
    }
    Arrival::Registered(Registration { peer, stream, reader, register })
}

fn read_failure(failure: ReadFailure, peer: SocketAddr, handshake_timeout: Duration) -> SluiceError {
    match failure {
        ReadFailure::Wire(problem) => problem.into_error().context(format!("control connection from {peer}")),
        ReadFailure::Closed { buffered } => SluiceError::external(
            "cluster.control_closed",
            format!("the connection from {peer} closed before it registered ({buffered} bytes of a frame arrived)"),
        ),
        ReadFailure::TimedOut => SluiceError::external(
            "cluster.handshake_timeout",
            format!("the connection from {peer} did not register within {}", seconds(handshake_timeout)),
        ),
        ReadFailure::Io(error) => {
            SluiceError::external("cluster.control_io", format!("reading the registration from {peer} failed: {error}"))
        }
    }
}

fn version_mismatch(peer: SocketAddr, found: u16, expected: u16) -> SluiceError {
    SluiceError::user(
        "cluster.wire_version",
        format!(
            "control wire version mismatch: the joining worker at {peer} speaks version {found}, the leader speaks \
             version {expected}"
        ),
    )
    .with_fix("run the same sluice version on every worker")
}

/// The joiner, for messages.
fn who(register: &Register, peer: SocketAddr) -> String {
    format!(
        "the joining worker at {peer} (exchange {}, host {}, pid {}, sluice {})",
        register.exchange_addr, register.host, register.pid, register.build
    )
}

/// The checks a handshake thread makes (the duplicate check needs the registered set).
fn check_register(register: &Register, peer: SocketAddr, facts: &Facts) -> Result<(), SluiceError> {
    if register.fingerprint != facts.fingerprint {
        return Err(SluiceError::user(
            "cluster.fingerprint_mismatch",
            format!(
                "topology fingerprint mismatch: {} has fingerprint {}, the leader has {}",
                who(register, peer),
                register.fingerprint,
                facts.fingerprint
            ),
        )
        .with_fix(super::AGREEMENT_FIX));
    }
    if register.threads == 0 || register.exchange_addr.trim().is_empty() {
        return Err(SluiceError::user(
            "cluster.bad_register",
            format!(
                "{} announces {} threads and exchange address {:?}",
                who(register, peer),
                register.threads,
                register.exchange_addr
            ),
        )
        .with_fix("give every worker at least one thread and an exchange address"));
    }
    Ok(())
}

/// What [`Registry::admit`] did.
#[derive(Debug)]
enum Admission {
    /// Registered; `replaced` is a closed registration of the same address it replaced.
    Joined { replaced: Option<Registration> },
    /// Refused: the address is taken.
    Duplicate { registration: Registration, error: SluiceError },
}

/// The registered workers, by exchange address, and what else was seen.
#[derive(Debug)]
struct Registry {
    workers: usize,
    leader_exchange: String,
    registered: BTreeMap<String, Registration>,
    /// Refused connections, for the join-timeout message (the first few).
    refused: Vec<String>,
    refused_count: usize,
}

impl Registry {
    fn new(workers: usize, leader_exchange: &str) -> Registry {
        Registry {
            workers,
            leader_exchange: leader_exchange.to_string(),
            registered: BTreeMap::new(),
            refused: Vec::new(),
            refused_count: 0,
        }
    }

    /// Workers present, the leader included.
    fn present(&self) -> usize {
        1 + self.registered.len()
    }

    fn is_complete(&self) -> bool {
        self.present() >= self.workers
    }

    /// Registers `registration`, or gives it back with the refusal of a duplicate
    /// exchange address. A registration of the same address whose connection closed
    /// meanwhile is replaced.
    fn admit(&mut self, registration: Registration) -> Admission {
        let address = registration.register.exchange_addr.clone();
        let holder = if address == self.leader_exchange {
            Some("the leader".to_string())
        } else {
            match self.registered.get(&address) {
                Some(held) if !is_closed(&held.stream) => Some(who(&held.register, held.peer)),
                _ => None,
            }
        };
        if let Some(holder) = holder {
            let error = SluiceError::user(
                "cluster.duplicate_exchange",
                format!(
                    "exchange address {address} is registered twice: by {} and by {holder}",
                    who(&registration.register, registration.peer)
                ),
            )
            .with_fix(
                "give every worker its own exchange address (--exchange-bind and --advertise must differ per \
                 worker), and start each worker once",
            );
            return Admission::Duplicate { registration, error };
        }
        Admission::Joined { replaced: self.registered.insert(address, registration) }
    }

    /// Forgets registrations whose connection was closed (their joiner gave up or
    /// restarted) and returns them.
    fn prune(&mut self) -> Vec<Registration> {
        let closed: Vec<String> =
            self.registered.iter().filter(|(_, held)| is_closed(&held.stream)).map(|(a, _)| a.clone()).collect();
        closed.iter().filter_map(|address| self.registered.remove(address)).collect()
    }

    fn note_refused(&mut self, peer: SocketAddr, error: &SluiceError) {
        self.refused_count += 1;
        if self.refused.len() < MAX_SEEN_LISTED {
            self.refused.push(format!("{peer} (refused: {})", error.code));
        }
    }

    /// The registered workers, for messages: `10.0.0.2:7000 (from 10.0.0.2:51234)`.
    fn joined(&self) -> Vec<String> {
        self.registered.values().map(|held| format!("{} (from {})", held.register.exchange_addr, held.peer)).collect()
    }

    fn timeout_error(&self, join_timeout: Duration, join_address: &str) -> SluiceError {
        let missing = self.workers - self.present().min(self.workers);
        let mut seen = self.joined();
        seen.extend(self.refused.iter().cloned());
        if self.refused_count > self.refused.len() {
            seen.push(format!("{} more refused", self.refused_count - self.refused.len()));
        }
        let seen = if seen.is_empty() {
            "no join was seen".to_string()
        } else {
            format!("joins were seen from [{}]", seen.join(", "))
        };
        SluiceError::external(
            "cluster.join_timeout",
            format!("{missing} of {} workers are missing after {}; {seen}", self.workers, seconds(join_timeout)),
        )
        .with_fix(format!(
            "start the missing workers with `sluice run PIPELINE --join {join_address}` (the same pipeline.toml and \
             secret on every worker), and check their logs for a refusal"
        ))
    }
}

/// Gathers registrations until the cluster is complete or `join_timeout` passed.
fn gather(
    door: &mut Door,
    registry: &mut Registry,
    join_timeout: Duration,
    settings: &ControlSettings,
) -> Result<(), SluiceError> {
    let deadline = Instant::now() + join_timeout;
    let mut next_progress = Instant::now();
    tracing::info!(address = %door.address, workers = registry.workers, "waiting for workers to join");
    loop {
        settings.cancelled("waiting for workers to join")?;
        if registry.is_complete() {
            report_left(registry.prune(), settings);
            if registry.is_complete() {
                return Ok(());
            }
        }
        door.admit();
        let now = Instant::now();
        if now >= next_progress {
            report_left(registry.prune(), settings);
            log_progress(door, registry, deadline.saturating_duration_since(now));
            next_progress = now + settings.progress_interval;
        }
        if now >= deadline {
            let error = registry.timeout_error(join_timeout, &door.join_address());
            // Returned to the caller, which reports it.
            tracing::debug!(address = %door.address, "{}", error.message);
            return Err(error);
        }
        let Some(arrival) = door.next(deadline.min(now + ACCEPT_POLL)) else { continue };
        match arrival {
            Arrival::Refused { peer, error } => {
                registry.note_refused(peer, &error);
                report_refused(peer, error, settings);
            }
            Arrival::Registered(registration) => admit(registry, registration, door.facts.version, settings),
        }
    }
}

fn admit(registry: &mut Registry, registration: Registration, version: u16, settings: &ControlSettings) {
    let (peer, exchange_addr, host) =
        (registration.peer, registration.register.exchange_addr.clone(), registration.register.host.clone());
    match registry.admit(registration) {
        Admission::Joined { replaced } => {
            report_left(replaced.into_iter().collect(), settings);
            let (present, workers) = (registry.present(), registry.workers);
            tracing::info!(%peer, exchange = %exchange_addr, %host, "worker joined ({present} of {workers} present)");
            settings.emit(RendezvousEvent::Joined { peer, exchange_addr, host, present, workers });
        }
        Admission::Duplicate { registration, error } => {
            registry.note_refused(peer, &error);
            refuse_aside(registration.stream, error.clone(), version);
            report_refused(peer, error, settings);
        }
    }
}

fn report_refused(peer: SocketAddr, error: SluiceError, settings: &ControlSettings) {
    // A caller that takes the events shows them itself: the log would say it twice.
    if settings.events.is_some() {
        tracing::debug!(%peer, code = error.code, "refused a control connection: {}", error.message);
    } else {
        tracing::warn!(%peer, code = error.code, "refused a control connection: {}", error.message);
    }
    settings.emit(RendezvousEvent::Refused { peer, error });
}

fn report_left(left: Vec<Registration>, settings: &ControlSettings) {
    for gone in left {
        let (peer, exchange_addr) = (gone.peer, gone.register.exchange_addr);
        tracing::warn!(%peer, exchange = %exchange_addr, "a registered worker closed its connection before the cluster formed");
        settings.emit(RendezvousEvent::Left { peer, exchange_addr });
    }
}

fn log_progress(door: &Door, registry: &Registry, left: Duration) {
    let missing = registry.workers - registry.present().min(registry.workers);
    tracing::info!(
        address = %door.address,
        joined = ?registry.joined(),
        "{} of {} workers present, {missing} missing; waiting {} more",
        registry.present(),
        registry.workers,
        seconds(left)
    );
}

/// Sends a refusal on a thread of its own, so the caller never waits on the peer.
fn refuse_aside(stream: TcpStream, error: SluiceError, version: u16) {
    let spawned = thread::Builder::new().name("sluice-refuse".into()).spawn(move || refuse(stream, &error, version));
    if let Err(error) = spawned {
        tracing::warn!("no thread to send a refusal: {error}");
    }
}

/// Welcomes every registered worker and starts the control sessions and the doorman.
fn form(
    door: Door,
    mut registry: Registry,
    me: &WorkerInfo,
    settings: &ControlSettings,
) -> Result<(Membership, LeaderControl), SluiceError> {
    let others: Vec<(String, u32, String)> = registry
        .registered
        .values()
        .map(|held| (held.register.exchange_addr.clone(), held.register.threads, held.register.admin_addr.clone()))
        .collect();
    let members = Membership::settle((&me.exchange_addr, me.threads, &me.admin_addr), &others);
    let version = door.facts.version;
    let events = unbounded();
    let mut sessions = Vec::new();
    let mut readers = Vec::new();
    for member in &members[1..] {
        let Some(held) = registry.registered.remove(&member.exchange_addr) else {
            let message = format!("worker {} ({}) was settled but is not registered", member.id, member.exchange_addr);
            return Err(SluiceError::internal("cluster.settle", message));
        };
        let label = format!(
            "worker {} (exchange {}, host {}, from {})",
            member.id, member.exchange_addr, held.register.host, held.peer
        );
        let session =
            Arc::new(Session::new(member.id, label, held.stream, events.0.clone(), version, Timing::of(settings))?);
        let welcome = Welcome { members: members.clone(), you: member.id, fingerprint: me.fingerprint.clone() };
        // A failed write loses that worker: its `Lost` is reported like any later loss.
        let _ = session.write_frame(&frame_of(&welcome, version)?);
        sessions.push(session);
        readers.push(held.reader);
    }
    let max_queued = MAX_QUEUED_EVENTS_PER_PEER * sessions.len();
    let mut handles = Vec::new();
    for (session, reader) in sessions.iter().zip(readers) {
        match session.start(reader, max_queued) {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                sessions.iter().for_each(|session| session.close());
                return Err(error);
            }
        }
    }
    let listed: Vec<&str> = members.iter().map(|m| m.exchange_addr.as_str()).collect();
    tracing::info!(address = %door.address, members = ?listed, "the cluster formed");
    settings.emit(RendezvousEvent::Formed { members: members.clone() });
    let doorman = spawn_doorman(door, &members, settings);
    let membership = Membership { members, me: 0, fingerprint: me.fingerprint.clone() };
    Ok((membership, LeaderControl::new(sessions, handles, events, doorman)))
}

/// Keeps the control port after formation, refusing late joiners with a message, until
/// the returned flag is set.
fn spawn_doorman(mut door: Door, members: &[Member], settings: &ControlSettings) -> Option<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let settings = settings.clone();
    let summary = format!(
        "the cluster led at {} {} with {} workers ({})",
        door.address,
        super::ALREADY_FORMED,
        members.len(),
        members.iter().map(|m| m.exchange_addr.as_str()).collect::<Vec<_>>().join(", ")
    );
    let spawned = thread::Builder::new().name("sluice-control-door".into()).spawn(move || {
        while !stopped.load(Ordering::Acquire) {
            door.admit();
            match door.next(Instant::now() + DOORMAN_POLL) {
                None => {}
                Some(Arrival::Refused { peer, error }) => report_refused(peer, error, &settings),
                Some(Arrival::Registered(late)) => {
                    let error = SluiceError::user(
                        "cluster.already_formed",
                        format!("{summary}; {} is one too many", who(&late.register, late.peer)),
                    )
                    .with_fix(
                        "start each worker once; to add workers, restart the whole cluster with a larger worker count",
                    );
                    refuse_aside(late.stream, error.clone(), door.facts.version);
                    report_refused(late.peer, error, &settings);
                }
            }
        }
    });
    match spawned {
        Ok(_) => Some(stop),
        Err(error) => {
            tracing::warn!("no thread to refuse late joiners (they will find the control port closed): {error}");
            None
        }
    }
}
