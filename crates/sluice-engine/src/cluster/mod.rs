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
//! Checkpoints (`[checkpoint]`): only the leader takes the store's lease and decides
//! the epochs; it tells every worker which checkpoint to restore (`Resume`), each worker
//! restores its own slots' state and lanes, writes its own state objects at each
//! barrier and sends the leader its part; the leader publishes the manifest, then every
//! worker commits its own sinks (`sluice_runtime::peers`). The store must be one that
//! every worker reaches (an object store, or a directory they share).
//!
//! Not yet: rejoining after a lost worker (a loss fails the run everywhere; restarting
//! every worker resumes from the last checkpoint).

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, bounded};
use sluice_checkpoint::{CheckpointStore, Lease, Manifest};
use sluice_cluster::auth::{Role, Secret, authenticate, check_control_bind, check_exchange_bind};
use sluice_cluster::link::{Authenticator, LinkConfig, NetworkBuilder};
use sluice_cluster::rendezvous::{
    self, ControlEvent, ControlSettings, LeaderControl, Membership, WorkerControl, WorkerInfo,
};
use sluice_cluster::wire::{ToLeader, ToWorker};
use sluice_runtime::Checkpointing;
use sluice_runtime::ClusterRun;
use sluice_runtime::peers::{FOLLOWER_EVENTS, LEADER_EVENTS_PER_WORKER, Peers, SendToLeader, SendToWorker};
use sluice_types::vnode::SlotLayout;
use sluice_types::{ErrorKind, SluiceError};

use crate::checkpointing::{self, Recovered, Recovering};
use crate::compile::{CompiledPipeline, Restoring};

mod report;
mod supervise;
use crate::error::EngineError;
use crate::load::Pipeline;
pub(crate) use supervise::{Supervised, supervise};

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
    /// Listen on a non-loopback control or exchange address without a secret.
    pub insecure: bool,
    /// How long the rendezvous may take.
    pub join_timeout: Duration,
    pub control: ControlSettings,
    /// Discard the checkpoint store's state first (the leader's option).
    pub from_scratch: bool,
    /// Where this worker's admin API listens (`host:port`, announced to every worker: a
    /// query on any worker reads this worker's slices there); None without one.
    pub admin_addr: Option<String>,
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
    /// The run's checkpoints, restored state first, when the pipeline checkpoints.
    pub checkpointing: Option<Checkpointing>,
    /// Where the control session delivers what belongs to the checkpoints.
    pub route: Route,
    /// The store's lease (the leader's).
    pub lease: Option<Lease>,
    /// The checkpoint this run resumed from.
    pub resumed_from: Option<u64>,
    /// The leader's control listener, kept for a later round (its joiners know its
    /// address, and a join arriving between rounds waits in its queue).
    pub control_listener: Option<TcpListener>,
    /// The control sessions' loss timeout.
    pub loss_timeout: Duration,
}

/// This worker's control session (shared with the controller, which sends the
/// checkpoints' messages on it).
pub(crate) enum Control {
    Leader(Arc<LeaderControl>),
    Worker(Arc<WorkerControl>),
}

/// Where the control thread puts the checkpoints' messages for the controller (see
/// `sluice_runtime::peers` for why the channels' room suffices).
pub(crate) enum Route {
    None,
    Lead(Sender<(u32, ToLeader)>),
    Follow(Sender<ToWorker>),
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
    /// The leader's opened checkpoint store (with its lease) and what recovery found.
    recovered: Option<Recovered>,
}

/// How many times one job forms its cluster: the first time, then after each lost
/// worker (with checkpoints); past it the run fails.
pub(crate) const MAX_ROUNDS: u32 = 16;

/// The synchronous part of forming a cluster: everything that can fail without a peer.
pub(crate) fn prepare(
    pipeline: &Pipeline,
    options: &ClusterOptions,
    announce: &mut dyn FnMut(&Listening),
) -> Result<Prepared, EngineError> {
    prepare_round(pipeline, options, None, announce)
}

/// Prepares the next round of a cluster that lost a worker: the leader keeps its control
/// listener (its joiners know its address), the exchange listener is bound again, and
/// the store's lease is taken anew.
pub(crate) fn prepare_again(
    pipeline: &Pipeline,
    options: &ClusterOptions,
    control_listener: Option<TcpListener>,
) -> Result<Prepared, SluiceError> {
    let options = ClusterOptions { from_scratch: false, ..options.clone() };
    prepare_round(pipeline, &options, control_listener, &mut |_| {}).map_err(first_problem)
}

/// [`prepare`]; in later rounds the leader keeps `control_listener`, the previous round's.
fn prepare_round(
    pipeline: &Pipeline,
    options: &ClusterOptions,
    control_listener: Option<TcpListener>,
    announce: &mut dyn FnMut(&Listening),
) -> Result<Prepared, EngineError> {
    let leads = matches!(options.role, ClusterRole::Lead { .. });
    if options.from_scratch && !leads {
        return Err(EngineError::new(
            SluiceError::user("cluster.from_scratch", "--from-scratch clears the store, which only the leader does")
                .with_fix("pass --from-scratch to the leader, not to a joining worker"),
        ));
    }
    let threads = pipeline.config.pipeline.threads;
    let local = pipeline.compile(None)?;
    check_exchange_bind(options.exchange_bind, options.secret.as_ref(), options.insecure).map_err(EngineError::new)?;
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
    // Workers agree on the topology, on their input files (each reads its own copy:
    // different files would split into different lanes) and on the checkpoints.
    let checkpoints = match &pipeline.config.checkpoint {
        Some(section) => format!("{:?} to {}", section.guarantee, section.store),
        None => "off".to_string(),
    };
    let agreement = format!("{} inputs {:016x} checkpoints {checkpoints}", local.fingerprint, inputs_identity(&local));
    let me =
        WorkerInfo::new(exchange_addr, threads, agreement).with_admin(options.admin_addr.clone().unwrap_or_default());
    let control = match &options.role {
        ClusterRole::Lead { control_bind, .. } => {
            check_control_bind(*control_bind, options.secret.as_ref(), options.insecure).map_err(EngineError::new)?;
            Some(match control_listener {
                Some(listener) => listener,
                None => TcpListener::bind(control_bind).map_err(|error| {
                    EngineError::new(
                        SluiceError::external(
                            "cluster.control_bind",
                            format!("cannot listen on {control_bind}: {error}"),
                        )
                        .with_fix("choose a free address with --control-bind"),
                    )
                })?,
            })
        }
        ClusterRole::Join { .. } => None,
    };
    let control_addr = control.as_ref().map(TcpListener::local_addr).transpose();
    let control_addr = control_addr.map_err(|e| EngineError::new(io("cluster.control_bind", &e)))?;
    // The leader takes the store (a second leader on it is refused) before it announces
    // itself, so no worker joins a leader that cannot run; the others read the store only
    // once the leader said what to restore. Nothing after this can fail; if the cluster
    // then does not form, `form` gives the lease back.
    let recovered = match (&pipeline.config.checkpoint, leads) {
        (Some(section), true) => Some(
            checkpointing::open(section, &pipeline.base_dir, &pipeline.config.pipeline.name, options.from_scratch)
                .map_err(EngineError::new)?,
        ),
        _ => None,
    };
    if let (ClusterRole::Lead { workers, .. }, Some(control_addr)) = (&options.role, control_addr) {
        announce(&Listening { control_addr, workers: *workers });
    }
    Ok(Prepared { local, me, exchange, control, recovered })
}

/// Waits for the rendezvous, then compiles the pipeline for the cluster's slots (on the
/// job's controller thread, while the job's state is `coordination`).
pub(crate) fn form(
    prepared: Prepared,
    pipeline: &Pipeline,
    options: &ClusterOptions,
    notices: &mut Vec<String>,
) -> Result<Formed, SluiceError> {
    let Prepared { local, me, exchange, control, recovered } = prepared;
    let fingerprint = local.fingerprint.to_string();
    let agreement = me.fingerprint.clone();
    let secret = options.secret.as_ref();
    let (membership, control, control_listener) = match (&options.role, control) {
        (ClusterRole::Lead { workers, .. }, Some(listener)) => {
            let led = listener.try_clone().map_err(|e| io("cluster.control_bind", &e)).and_then(|serving| {
                rendezvous::lead_with(serving, me, *workers, secret, options.join_timeout, &options.control)
            });
            match led {
                Ok((membership, session)) => (membership, Control::Leader(Arc::new(session)), Some(listener)),
                Err(error) => {
                    // The cluster did not form (workers missing at --join-timeout, a stop):
                    // the store's lease, taken in prepare, is given back, so the next run
                    // (on any host) finds the store free.
                    if let Some(Err(released)) = recovered.map(|r| r.lease.release()) {
                        tracing::warn!(error = %released, "the store's lease could not be released");
                    }
                    return Err(error);
                }
            }
        }
        (ClusterRole::Join { leader }, _) => {
            let (membership, session) = join_retrying(leader, me, options)?;
            (membership, Control::Worker(Arc::new(session)), None)
        }
        (ClusterRole::Lead { .. }, None) => unreachable!("a leader's control listener is bound in prepare"),
    };
    assert_eq!(membership.fingerprint, agreement, "the rendezvous checked every worker's agreement");
    let layout = SlotLayout::new(&membership.members.iter().map(|m| m.threads).collect::<Vec<_>>());
    let resumed = resume(&control, recovered, pipeline, options, notices)?;
    let restoring = resumed.manifest.as_ref().map(|m| Restoring {
        lane_threads: m.lane_threads,
        layouts: m.sources.iter().map(|s| (s.name.clone(), s.layout.clone())).collect(),
    });
    let compiled = pipeline.compile_on(&layout, restoring.as_ref()).map_err(first_problem)?;
    assert_eq!(compiled.fingerprint.to_string(), fingerprint, "the fingerprint does not depend on the thread count");
    let resumed_from = resumed.manifest.as_ref().map(|m| m.epoch);
    let checkpointing = match (&pipeline.config.checkpoint, resumed.store) {
        (Some(section), Some(store)) => {
            if let Some(manifest) = &resumed.manifest {
                checkpointing::check_encodings(manifest, &section.store)?;
                checkpointing::check_fingerprint(manifest, compiled.fingerprint, &section.store)?;
                notices.push(format!("resuming from checkpoint {} in {}", manifest.epoch, section.store));
            }
            let recovering =
                Recovering { me: membership.me, layout: &layout, restored_epoch: Some(resumed.first_epoch - 1) };
            Some(checkpointing::prepare(section, store, resumed.manifest, &compiled, &recovering, notices)?)
        }
        _ => None,
    };
    let (peers, route) = match (&control, checkpointing.is_some()) {
        (_, false) => (None, Route::None),
        (Control::Leader(session), true) => {
            let others: Vec<u32> = session.workers().collect();
            let (route, events) = bounded(others.len() * LEADER_EVENTS_PER_WORKER);
            let session = Arc::clone(session);
            let send: SendToWorker = Box::new(move |worker, message| session.send(worker, &message));
            (Some(Peers::Lead { others, send, events }), Route::Lead(route))
        }
        (Control::Worker(session), true) => {
            let (route, events) = bounded(FOLLOWER_EVENTS);
            let session = Arc::clone(session);
            let send: SendToLeader = Box::new(move |message| session.send(&message));
            (Some(Peers::Follow { send, events }), Route::Follow(route))
        }
    };
    let run = run_token(&membership);
    let mut peers_addresses = Vec::new();
    for member in membership.members.iter().filter(|m| m.id != membership.me) {
        peers_addresses.push((member.id, resolve(&member.exchange_addr).map_err(first_problem)?));
    }
    let network = NetworkBuilder::new(membership.me, run, peers_addresses, LinkConfig::default());
    let cancel_links = network.canceller();
    let secret = options.secret.clone();
    let authenticator: Authenticator =
        Arc::new(move |stream, initiator| authenticate(stream, secret.as_ref(), Role::of_initiator(initiator)));
    let connect = Box::new(move |builder: NetworkBuilder| builder.connect(&exchange, authenticator));
    let part = ClusterRun { layout, worker: membership.me, network, connect, peers };
    Ok(Formed {
        compiled,
        part,
        control,
        membership,
        cancel_links,
        checkpointing,
        route,
        lease: resumed.lease,
        resumed_from,
        control_listener,
        loss_timeout: options.control.loss_timeout,
    })
}

/// What a worker restores, as the leader decided.
struct Resumed {
    store: Option<Arc<CheckpointStore>>,
    manifest: Option<Manifest>,
    lease: Option<Lease>,
    /// The run's first epoch.
    first_epoch: u64,
}

/// The leader tells every worker which checkpoint to restore and where the run's epochs
/// start (`Resume`); a joining worker waits for that, then loads the same manifest.
fn resume(
    control: &Control,
    recovered: Option<Recovered>,
    pipeline: &Pipeline,
    options: &ClusterOptions,
    notices: &mut Vec<String>,
) -> Result<Resumed, SluiceError> {
    let Some(section) = &pipeline.config.checkpoint else {
        return Ok(Resumed { store: None, manifest: None, lease: None, first_epoch: 1 });
    };
    match control {
        Control::Leader(session) => {
            let Recovered { store, lease, manifest, notices: found } =
                recovered.expect("the leader opened the store in prepare");
            notices.extend(found);
            let first_epoch = checkpointing::restored_epoch(&store, manifest.as_ref())? + 1;
            let restored_epoch = manifest.as_ref().map_or(0, |m| m.epoch);
            session.broadcast(&ToWorker::Resume { restored_epoch, first_epoch })?;
            Ok(Resumed { store: Some(store), manifest, lease: Some(lease), first_epoch })
        }
        Control::Worker(session) => {
            let deadline = Instant::now() + options.join_timeout;
            let (restored_epoch, first_epoch) = loop {
                match session.events().recv_deadline(deadline) {
                    Ok(ControlEvent::Received {
                        message: ToWorker::Resume { restored_epoch, first_epoch }, ..
                    }) => {
                        break (restored_epoch, first_epoch);
                    }
                    Ok(ControlEvent::Received { message: ToWorker::Abort { reason }, .. }) => {
                        return Err(SluiceError::external("cluster.leader_failed", reason));
                    }
                    Ok(ControlEvent::Received { message, .. }) => {
                        tracing::debug!(?message, "a command before the leader said what to restore");
                    }
                    Ok(ControlEvent::Lost { error, .. }) => return Err(leader_lost(&error, session.leader(), true)),
                    Err(_) => {
                        return Err(SluiceError::external(
                            "cluster.resume_timeout",
                            "the leader did not say which checkpoint to restore within --join-timeout",
                        )
                        .with_fix("look at the leader's output: it may not reach its checkpoint store"));
                    }
                }
            };
            if first_epoch <= restored_epoch {
                return Err(SluiceError::internal(
                    "cluster.resume",
                    format!("the leader numbers epochs from {first_epoch}, not above checkpoint {restored_epoch}"),
                ));
            }
            let (store, manifest) = checkpointing::open_shared(section, &pipeline.base_dir, restored_epoch)?;
            Ok(Resumed { store: Some(store), manifest, lease: None, first_epoch })
        }
    }
}

/// Joins the leader, trying again while it refuses because its cluster already formed
/// (it re-forms after losing a worker), until the join timeout.
fn join_retrying(
    leader: &str,
    me: WorkerInfo,
    options: &ClusterOptions,
) -> Result<(Membership, WorkerControl), SluiceError> {
    let deadline = Instant::now() + options.join_timeout;
    let mut told = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rendezvous::join_with(leader, me.clone(), options.secret.as_ref(), left, &options.control) {
            Err(error) if may_clear(&error) && Instant::now() + JOIN_RETRY < deadline => {
                if !std::mem::replace(&mut told, true) {
                    tracing::warn!("{}; trying again until --join-timeout (it may be re-forming)", error.message);
                }
                std::thread::sleep(JOIN_RETRY);
            }
            other => return other,
        }
    }
}

/// Whether a failed join may succeed later: a formed cluster's refusal, or a connection
/// the leader dropped before a byte of the handshake (its previous round was closing).
fn may_clear(error: &SluiceError) -> bool {
    let dropped =
        matches!(error.code, "cluster.auth_closed" | "cluster.auth_io") && error.message.contains("after 0 bytes");
    rendezvous::is_already_formed(error) || dropped
}

/// The wait between two joins a formed cluster refused.
const JOIN_RETRY: Duration = Duration::from_millis(500);

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

/// What a worker says when its control session with the leader is lost (`error`, which
/// names the leader and the silence or failure): it asks the leader's control address,
/// `leader`, whether the leader still runs (`rendezvous::leader_answers`), which decides
/// what needs restarting; see [`leader_loss`]. `rejoin`: the pipeline checkpoints, so a lost
/// worker makes the leader form the cluster again rather than fail the run everywhere.
pub(crate) fn leader_lost(error: &SluiceError, leader: &str, rejoin: bool) -> SluiceError {
    let answer = rendezvous::leader_answers(leader, rendezvous::PROBE_TIMEOUT);
    leader_loss(error, leader, answer, rejoin)
}

/// The message choice of [`leader_lost`], given whether the leader at `leader` answered
/// (or what was seen instead):
///
/// - it answers and the pipeline checkpoints: the leader runs on and declared this worker
///   lost (this worker, or the network between them, was silent past the loss timeout:
///   a stopped or starved process); it forms the cluster again and waits for this worker
///   alone (`cluster.expelled`: restart only this worker);
/// - it answers, without checkpoints: a lost worker ends the run on every worker
///   (`cluster.run_lost`: restart every worker);
/// - it does not answer: the leader is gone, stopped or unreachable
///   (`cluster.leader_lost`: restart every worker, the leader first).
pub(crate) fn leader_loss(error: &SluiceError, leader: &str, answer: Result<(), String>, rejoin: bool) -> SluiceError {
    let lost = &error.message;
    match answer {
        Ok(()) if rejoin => SluiceError::external(
            "cluster.expelled",
            format!(
                "the leader at {leader} dropped this worker: {lost}; the leader still answers on its control address, \
                 so it runs on: it declared this worker lost (this worker, or the network to it, was silent past the \
                 loss timeout) and forms the cluster again without it"
            ),
        )
        .with_kind(ErrorKind::LostPeer)
        .with_fix(
            "restart only this worker with the same command: the leader waits for it to join again (--join-timeout) \
             and the cluster resumes from its last checkpoint; the other workers need nothing",
        ),
        Ok(()) => SluiceError::external(
            "cluster.run_lost",
            format!(
                "lost the leader: {lost}; the leader at {leader} still answers on its control address, but the \
                 pipeline takes no checkpoints, so losing a worker ended the run on every worker"
            ),
        )
        .with_kind(ErrorKind::LostPeer)
        .with_fix(
            "restart every worker with the same command (the leader first); with a [checkpoint] section only the \
             lost worker would need restarting",
        ),
        Err(seen) => SluiceError::external(
            "cluster.leader_lost",
            format!(
                "lost the leader: {lost}; the leader at {leader} does not answer on its control address either: {seen}"
            ),
        )
        .with_kind(ErrorKind::LostPeer)
        .with_fix(
            "see the leader's log and host: it stopped, crashed, hangs or cannot be reached; restart every worker \
             with the same command (the leader first)",
        ),
    }
}
