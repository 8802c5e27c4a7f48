//! A job on several workers: every worker runs the same binary with the same pipeline;
//! the leader is one of them.
//!
//! Forming the cluster ([`form`]): bind this worker's exchange listener (its address is
//! what peers dial) → compile once for the topology fingerprint → rendezvous (the leader
//! waits for every worker; both sides refuse another wire version, fingerprint or
//! secret) → compile again for the cluster's slots (every worker's threads, in member
//! order, `sluice_types::vnode::SlotLayout`) → register the plan's remote channels and
//! open one link per peer when the run starts.
//!
//! During the run ([`supervise`]) the control session carries what is not data: the
//! leader's `Stop` (a stop requested on the leader drains the whole cluster), each
//! worker's `Finished` or `Failed` at its end, and heartbeats; a lost peer stops the
//! local part and fails the run, naming the peer. The leader's outcome covers every
//! worker: it completes only if every worker finished.
//!
//! Not yet: checkpoints across workers (refused before anything starts), rejoining after
//! a lost worker, and a leader's report that sums every worker's counters.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use sluice_cluster::auth::{Role, Secret, authenticate, check_control_bind};
use sluice_cluster::link::{Authenticator, LinkConfig, NetworkBuilder};
use sluice_cluster::rendezvous::{
    self, ControlEvent, ControlSettings, LeaderControl, Membership, ToLeader, ToWorker, WorkerControl, WorkerInfo,
};
use sluice_runtime::{ClusterRun, Metrics, StopHandle};
use sluice_types::vnode::SlotLayout;
use sluice_types::{ErrorKind, SluiceError};

use crate::compile::CompiledPipeline;

mod report;
use crate::error::EngineError;
use crate::load::Pipeline;

/// Whether this worker leads or joins.
#[derive(Debug, Clone)]
pub enum ClusterRole {
    /// Lead a cluster of `workers` workers (this one included), listening for joins on
    /// `control_bind`.
    Lead { workers: usize, control_bind: SocketAddr },
    /// Join the leader at `leader` (`host:port`).
    Join { leader: String },
}

/// How this worker takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub role: ClusterRole,
    /// Where this worker listens for exchange links.
    pub exchange_bind: SocketAddr,
    /// The address peers dial to reach that listener, when it differs from the bound one
    /// (a wildcard bind, a NAT).
    pub advertise: Option<String>,
    pub secret: Option<Secret>,
    /// Lead on a non-loopback control address without a secret.
    pub insecure: bool,
    /// How long the rendezvous may take.
    pub join_timeout: Duration,
    pub control: ControlSettings,
}

/// What the leader tells its caller once it listens (to print the command the others run).
#[derive(Debug, Clone)]
pub struct Listening {
    pub control_addr: SocketAddr,
    pub workers: usize,
}

/// A formed cluster, ready to run.
pub(crate) struct Formed {
    pub compiled: CompiledPipeline,
    pub part: ClusterRun,
    pub control: Control,
    pub membership: Membership,
    /// Set when a peer is lost: opening the links then gives up at once.
    pub cancel_links: Arc<AtomicBool>,
}

/// This worker's control session.
pub(crate) enum Control {
    Leader(LeaderControl),
    Worker(WorkerControl),
}

/// What forming a cluster needs, ready before any peer is waited for: the listeners are
/// bound (so a busy port is an error at once) and the leader has announced itself.
pub(crate) struct Prepared {
    /// The pipeline compiled for this worker's threads alone (for the fingerprint, and
    /// the counters' shape while the cluster forms).
    pub local: CompiledPipeline,
    me: WorkerInfo,
    exchange: TcpListener,
    /// The leader's control listener.
    control: Option<TcpListener>,
}

/// The synchronous part of forming a cluster: everything that can fail without a peer.
pub(crate) fn prepare(
    pipeline: &Pipeline,
    options: &ClusterOptions,
    announce: &mut dyn FnMut(&Listening),
) -> Result<Prepared, EngineError> {
    if pipeline.config.checkpoint.is_some() {
        return Err(EngineError::new(
            SluiceError::user(
                "cluster.checkpoints",
                "checkpoints across workers are not supported yet: a cluster run would not be exactly-once",
            )
            .with_fix("run this pipeline on one worker, or remove its [checkpoint] section to run it on several"),
        ));
    }
    let threads = pipeline.config.pipeline.threads;
    let local = pipeline.compile(None)?;
    let exchange = TcpListener::bind(options.exchange_bind).map_err(|error| {
        EngineError::new(
            SluiceError::external(
                "cluster.exchange_bind",
                format!("cannot listen on {}: {error}", options.exchange_bind),
            )
            .with_fix("choose a free address with --exchange-bind"),
        )
    })?;
    let exchange_addr = advertised(&exchange, options.advertise.as_deref())?;
    // Workers agree on the topology and on their input files (each reads its own copy:
    // different files would split into different lanes).
    let agreement = format!("{} inputs {:016x}", local.fingerprint, inputs_identity(&local));
    let me = WorkerInfo::new(exchange_addr, threads, agreement);
    let control = match &options.role {
        ClusterRole::Lead { workers, control_bind } => {
            check_control_bind(*control_bind, options.secret.as_ref(), options.insecure).map_err(EngineError::new)?;
            let control = TcpListener::bind(control_bind).map_err(|error| {
                EngineError::new(
                    SluiceError::external("cluster.control_bind", format!("cannot listen on {control_bind}: {error}"))
                        .with_fix("choose a free address with --control-bind"),
                )
            })?;
            let control_addr = control.local_addr().map_err(|e| EngineError::new(io("cluster.control_bind", &e)))?;
            announce(&Listening { control_addr, workers: *workers });
            Some(control)
        }
        ClusterRole::Join { .. } => None,
    };
    Ok(Prepared { local, me, exchange, control })
}

/// Waits for the rendezvous, then compiles the pipeline for the cluster's slots (on the
/// job's controller thread, while the job's state is `coordination`).
pub(crate) fn form(prepared: Prepared, pipeline: &Pipeline, options: &ClusterOptions) -> Result<Formed, SluiceError> {
    let Prepared { local, me, exchange, control } = prepared;
    let fingerprint = local.fingerprint.to_string();
    let agreement = me.fingerprint.clone();
    let secret = options.secret.as_ref();
    let (membership, control) = match (&options.role, control) {
        (ClusterRole::Lead { workers, .. }, Some(listener)) => {
            let (membership, session) =
                rendezvous::lead_with(listener, me, *workers, secret, options.join_timeout, &options.control)?;
            (membership, Control::Leader(session))
        }
        (ClusterRole::Join { leader }, _) => {
            let (membership, session) =
                rendezvous::join_with(leader, me, secret, options.join_timeout, &options.control)?;
            (membership, Control::Worker(session))
        }
        (ClusterRole::Lead { .. }, None) => unreachable!("a leader's control listener is bound in prepare"),
    };
    let layout = SlotLayout::new(&membership.members.iter().map(|m| m.threads).collect::<Vec<_>>());
    let compiled = pipeline.compile_on(&layout, None).map_err(first_problem)?;
    assert_eq!(compiled.fingerprint.to_string(), fingerprint, "the fingerprint does not depend on the thread count");
    assert_eq!(membership.fingerprint, agreement, "the rendezvous checked every worker's agreement");
    let run = run_token(&membership);
    let mut peers = Vec::new();
    for member in membership.members.iter().filter(|m| m.id != membership.me) {
        peers.push((member.id, resolve(&member.exchange_addr).map_err(first_problem)?));
    }
    let network = NetworkBuilder::new(membership.me, run, peers, LinkConfig::default());
    let cancel_links = network.canceller();
    let secret = options.secret.clone();
    let authenticator: Authenticator =
        Arc::new(move |stream, initiator| authenticate(stream, secret.as_ref(), Role::of_initiator(initiator)));
    let connect = Box::new(move |builder: NetworkBuilder| builder.connect(&exchange, authenticator));
    let part = ClusterRun { layout, worker: membership.me, network, connect };
    Ok(Formed { compiled, part, control, membership, cancel_links })
}

/// The identity of every input the pipeline reads (each source's
/// `SourceFactory::content_identity`: for files, their sizes and edge hashes).
fn inputs_identity(compiled: &CompiledPipeline) -> u64 {
    let mut identity = Vec::new();
    for source in &compiled.plan.sources {
        let content = source.content_identity();
        identity.extend_from_slice(&(content.len() as u64).to_le_bytes());
        identity.extend_from_slice(&content);
    }
    twox_hash::XxHash3_64::oneshot(&identity)
}

/// An engine error's first problem as one error, its place in the file in the message.
fn first_problem(error: EngineError) -> SluiceError {
    let Some(problem) = error.problems.into_iter().next() else {
        return SluiceError::internal("cluster.compile", "compiling for the cluster failed without a reason");
    };
    let place = match (&problem.file, problem.position) {
        (Some(file), Some(position)) => format!("{file}:{position}: "),
        (Some(file), None) => format!("{file}: "),
        (None, _) => String::new(),
    };
    let mut error = problem.error;
    error.message = format!("{place}{}", error.message);
    error
}

/// The address peers dial: `advertise`, or the bound one unless it is a wildcard.
fn advertised(listener: &TcpListener, advertise: Option<&str>) -> Result<String, EngineError> {
    let bound = listener.local_addr().map_err(|e| EngineError::new(io("cluster.exchange_bind", &e)))?;
    match advertise {
        Some(address) => {
            resolve(address)?;
            Ok(address.to_string())
        }
        None if bound.ip().is_unspecified() => Err(EngineError::new(
            SluiceError::user(
                "cluster.advertise",
                format!("the exchange listens on {bound}, an address other workers cannot dial"),
            )
            .with_fix("give the address they reach this host on with --advertise HOST:PORT"),
        )),
        None => Ok(bound.to_string()),
    }
}

fn resolve(address: &str) -> Result<SocketAddr, EngineError> {
    let unresolved = |detail: String| {
        EngineError::new(
            SluiceError::external(
                "cluster.address",
                format!("cannot resolve the worker address `{address}`: {detail}"),
            )
            .with_fix("give --advertise as HOST:PORT that every worker can resolve"),
        )
    };
    address
        .to_socket_addrs()
        .map_err(|e| unresolved(e.to_string()))?
        .next()
        .ok_or_else(|| unresolved("no address".into()))
}

fn io(code: &'static str, error: &std::io::Error) -> SluiceError {
    SluiceError::external(code, error.to_string())
}

/// A token both ends of every link share: this run's fingerprint and members (a link
/// from another cluster, even of the same pipeline, is refused).
fn run_token(membership: &Membership) -> u64 {
    let mut canonical = membership.fingerprint.clone();
    for member in &membership.members {
        canonical.push_str(&format!("\n{} {} {}", member.id, member.exchange_addr, member.threads));
    }
    twox_hash::XxHash3_64::oneshot(canonical.as_bytes())
}

/// How the local part ended, as the control thread is told: the failure's text, and
/// whether it was a lost peer (then the session's account of which peer usually follows).
pub(crate) type LocalOutcome = Result<(), (String, bool)>;

/// How long a worker whose part failed for a lost peer waits for its session to say
/// which (the leader, usually), before reporting what it has.
const CAUSE_WAIT: Duration = Duration::from_secs(2);

/// Runs the control session while the local part runs; returns the cluster's failure,
/// if any (a lost peer, a worker that failed, a worker that never reported).
/// What the control thread needs of the run.
pub(crate) struct Supervised {
    pub stop: StopHandle,
    pub cancel_links: Arc<AtomicBool>,
    pub local_done: Receiver<LocalOutcome>,
    /// The job's counters: a worker reports its slots' part, the leader adds every
    /// worker's report to its own.
    pub metrics: Arc<Metrics>,
    pub local: Range<u32>,
    pub workers: usize,
    pub shutdown_timeout: Duration,
}

pub(crate) fn supervise(control: Control, run: Supervised) -> Option<(String, SluiceError)> {
    match control {
        Control::Leader(session) => lead(&session, &run),
        Control::Worker(session) => follow(&session, &run),
    }
}

/// The leader: forwards a stop, collects every worker's end.
fn lead(session: &LeaderControl, run: &Supervised) -> Option<(String, SluiceError)> {
    let Supervised { stop, cancel_links, local_done, workers, shutdown_timeout, .. } = run;
    let (workers, shutdown_timeout) = (*workers, *shutdown_timeout);
    let mut stop_sent = false;
    let mut ended = std::collections::BTreeSet::new();
    let mut failure = None;
    let mut deadline: Option<Instant> = None;
    while ended.len() + 1 < workers {
        if stop.is_requested() && !stop_sent {
            stop_sent = true;
            if let Err(error) = session.broadcast(&ToWorker::Stop) {
                tracing::warn!(%error, "the stop could not reach every worker");
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let missing: Vec<u32> = session.workers().filter(|w| !ended.contains(w)).collect();
            return failure.or(Some((
                "cluster".into(),
                SluiceError::external(
                    "cluster.unfinished",
                    format!("workers {missing:?} did not report their end within shutdown_timeout after the leader's"),
                )
                .with_kind(ErrorKind::LostPeer)
                .with_fix(
                    "look at those workers' output; raise [pipeline] shutdown_timeout if they were still draining",
                ),
            )));
        }
        crossbeam_channel::select! {
            recv(session.events()) -> event => match event {
                Ok(ControlEvent::Received { peer, message: ToLeader::Finished { report } }) => {
                    ended.insert(peer);
                    if let Err(error) = report::merge(&run.metrics, &report, peer) {
                        tracing::warn!(%error, "the exit report leaves out worker {peer}'s counters");
                    }
                }
                Ok(ControlEvent::Received { peer, message: ToLeader::Failed { message } }) => {
                    ended.insert(peer);
                    failure.get_or_insert((format!("worker {peer}"), SluiceError::external("cluster.worker_failed", message)));
                    end_now(stop, cancel_links);
                }
                Ok(ControlEvent::Received { peer, message }) => tracing::debug!(peer, ?message, "unexpected control message"),
                // A worker closes its session once it reported its end.
                Ok(ControlEvent::Lost { peer, error }) => {
                    if ended.insert(peer) {
                        failure.get_or_insert((format!("worker {peer}"), error));
                        end_now(stop, cancel_links);
                    }
                }
                Err(_) => return failure,
            },
            recv(local_done) -> outcome => {
                if let Ok(Err((message, _))) = outcome {
                    let _ = session.broadcast(&ToWorker::Abort { reason: message });
                }
                deadline.get_or_insert(Instant::now() + shutdown_timeout);
            },
            default(Duration::from_millis(200)) => {}
        }
    }
    failure
}

/// A worker: obeys the leader's stop, reports its end.
fn follow(session: &WorkerControl, run: &Supervised) -> Option<(String, SluiceError)> {
    let Supervised { stop, cancel_links, local_done, .. } = run;
    let mut failure = None;
    let never = crossbeam_channel::never();
    let mut events = session.events();
    loop {
        crossbeam_channel::select! {
            recv(events) -> event => match event {
                Ok(ControlEvent::Received { message: ToWorker::Stop, .. }) => stop.stop(),
                Ok(ControlEvent::Received { message: ToWorker::Abort { reason }, .. }) => {
                    failure.get_or_insert(("leader".into(), SluiceError::external("cluster.leader_failed", reason)));
                    end_now(stop, cancel_links);
                }
                Ok(ControlEvent::Received { message, .. }) => tracing::debug!(?message, "unexpected control message"),
                Ok(ControlEvent::Lost { error, .. }) => {
                    failure.get_or_insert(("leader".into(), leader_lost(&error)));
                    end_now(stop, cancel_links);
                }
                // The session ended (its loss was reported above): wait for the local end.
                Err(_) => events = &never,
            },
            recv(local_done) -> outcome => {
                let report = match outcome {
                    Ok(Ok(())) => ToLeader::Finished { report: report::encode(&run.metrics, run.local.clone()) },
                    Ok(Err((message, lost_peer))) => {
                        if lost_peer && failure.is_none() {
                            failure = cause(events);
                        }
                        ToLeader::Failed { message }
                    }
                    Err(_) => ToLeader::Failed { message: "the local run ended without an outcome".into() },
                };
                if let Err(error) = session.send(&report) {
                    tracing::warn!(%error, "the leader did not hear this worker's end");
                }
                return failure;
            },
        }
    }
}

/// A peer is gone or failed: no drain can complete (its channels will never end), so
/// the local part ends at once, and so does opening the links.
fn end_now(stop: &StopHandle, cancel_links: &AtomicBool) {
    cancel_links.store(true, Ordering::Release);
    stop.abort(
        SluiceError::external("cluster.peer_lost", "stopped at once: another worker was lost or failed")
            .with_kind(ErrorKind::LostPeer),
    );
}

/// The leader's account of why this worker's links closed, if it comes within
/// [`CAUSE_WAIT`]: its loss, or its abort.
fn cause(events: &Receiver<ControlEvent<ToWorker>>) -> Option<(String, SluiceError)> {
    let deadline = Instant::now() + CAUSE_WAIT;
    loop {
        match events.recv_deadline(deadline) {
            Ok(ControlEvent::Lost { error, .. }) => return Some(("leader".into(), leader_lost(&error))),
            Ok(ControlEvent::Received { message: ToWorker::Abort { reason }, .. }) => {
                return Some(("leader".into(), SluiceError::external("cluster.leader_failed", reason)));
            }
            Ok(ControlEvent::Received { .. }) => {}
            Err(_) => return None,
        }
    }
}

fn leader_lost(error: &SluiceError) -> SluiceError {
    SluiceError::external("cluster.leader_lost", format!("lost the leader: {}", error.message))
        .with_kind(ErrorKind::LostPeer)
        .with_fix("restart every worker with the same command (the leader first)")
}
