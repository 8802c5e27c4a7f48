//! How workers find each other and agree on the member set, and the control sessions
//! that stay open for the run.
//!
//! # Protocol
//!
//! One worker leads ([`lead`]); it also works. Every other worker joins it ([`join`]),
//! on one TCP connection to the leader's control address:
//!
//! 1. **Authenticate** (`auth`): both directions prove the shared secret, or both have
//!    none; anything else is refused by both sides.
//! 2. **Register** (joiner → leader): a [`Register`] frame (`wire`) with the joiner's
//!    exchange address, threads, topology fingerprint, host, pid, build and admin API
//!    address (every member learns every worker's, for queries over the whole cluster).
//! 3. The leader **checks** it, each check refusing with a refusal frame (plain text,
//!    readable by any wire version) and a message naming both values and the remedy:
//!    the frame's wire version must equal the leader's; the fingerprint must equal the
//!    leader's; the exchange address must be used by no other registered worker (nor the
//!    leader). A refused joiner exits with that message; the leader logs it, reports a
//!    [`RendezvousEvent::Refused`] and keeps waiting.
//! 4. Once `workers - 1` joiners are registered, the leader **settles** the member set
//!    ([`Membership::settle`]: itself id 0, the others by exchange address, ids 1..N) and
//!    sends each joiner a [`Welcome`] (the members, its id, the fingerprint). The joiner
//!    checks the welcome again (wire version, fingerprint, a well-formed member set that
//!    names it), refusing the leader otherwise.
//! 5. The connection stays open as the run's **control session** (`session`):
//!    [`ToWorker`] from the leader, [`ToLeader`] from the workers, heartbeats both ways.
//!
//! # Correctness argument
//!
//! - **Agreement**: the member set is a pure function of the registered set, computed
//!   once by the leader and sent to everyone; joiners verify it rather than trust it, so
//!   every worker derives the same placement from it.
//! - **Every wait ends**: the leader's gathering ends at `join_timeout` (an error naming
//!   how many workers are missing and which joins were seen); each accepted connection is
//!   handshaken on its own thread under a deadline (`handshake_timeout`), so a stray
//!   client that sends nothing or garbage costs one thread for at most that long and
//!   never blocks the gathering (at most [`MAX_PENDING_HANDSHAKES`] at once; more are
//!   dropped); the joiner's retries, handshake and wait for the welcome all end at its own
//!   `timeout`; after the welcome, silence longer than `loss_timeout` ends a session.
//! - **Nothing from the network panics**: frames are checked before use (`wire`), and
//!   every refusal, loss and protocol violation is a typed `SluiceError`.
//! - **Stale registrations do not block a retry**: before a duplicate exchange address is
//!   refused, and before every progress report and the welcome, the leader checks whether
//!   the registered connection was closed (a joiner that gave up or restarted) and forgets
//!   it if so.
//! - **Late joiners learn why**: after the cluster formed, the leader keeps its control
//!   port and refuses every further registration with a message (the cluster formed
//!   already), until its [`LeaderControl`] is dropped.
//!
//! - **A lost leader is asked whether it runs** (`probe`): a worker whose control
//!   session with the leader ended connects to the leader's control address and waits,
//!   briefly, for its auth preamble. A leader that answers runs on and declared this
//!   worker lost; one that does not is gone, stopped or unreachable. The two need
//!   different restarts (this worker alone, or every worker), so the caller says which.
//!
//! The leader does not check its own control address; callers check it with
//! `auth::check_control_bind` before binding.

mod joiner;
mod leader;
mod liveness;
mod membership;
mod probe;
mod session;
mod stream;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;
use sluice_types::SluiceError;

use crate::auth::Secret;
use crate::wire::{self, Register};
pub use crate::wire::{Member, ToLeader, ToWorker, Welcome};
pub use liveness::{Tick, tick};
pub use membership::Membership;
pub use probe::{PROBE_TIMEOUT, leader_answers};
pub use session::{ControlEvent, LeaderControl, WorkerControl};

/// How many accepted connections the leader handshakes at once; further connections are
/// dropped (and logged) until one finishes.
pub const MAX_PENDING_HANDSHAKES: usize = 64;

/// What a worker tells the cluster about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Where other workers reach its exchange (data) listener; unique per worker.
    pub exchange_addr: String,
    /// Its driver threads.
    pub threads: u32,
    /// Its topology fingerprint.
    pub fingerprint: String,
    /// For messages: host name, pid, sluice build.
    pub host: String,
    pub pid: u32,
    pub build: String,
    /// Where its admin API listens (`host:port`), empty when it has none.
    pub admin_addr: String,
}

impl WorkerInfo {
    /// This process: its host name, pid and build filled in.
    pub fn new(exchange_addr: impl Into<String>, threads: u32, fingerprint: impl Into<String>) -> WorkerInfo {
        WorkerInfo {
            exchange_addr: exchange_addr.into(),
            threads,
            fingerprint: fingerprint.into(),
            host: host_name(),
            pid: std::process::id(),
            build: env!("CARGO_PKG_VERSION").to_string(),
            admin_addr: String::new(),
        }
    }

    /// The same worker, announcing its admin API at `admin_addr`.
    pub fn with_admin(self, admin_addr: impl Into<String>) -> WorkerInfo {
        WorkerInfo { admin_addr: admin_addr.into(), ..self }
    }

    fn register(&self) -> Register {
        Register {
            exchange_addr: self.exchange_addr.clone(),
            threads: self.threads,
            fingerprint: self.fingerprint.clone(),
            host: self.host.clone(),
            pid: self.pid,
            build: self.build.clone(),
            admin_addr: self.admin_addr.clone(),
        }
    }
}

/// The host name (Linux), or `""`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_string()).unwrap_or_default()
}

/// Timings of the rendezvous and the control sessions, and where to report progress.
#[derive(Debug, Clone)]
pub struct ControlSettings {
    /// Each side sends a heartbeat after this long without sending anything.
    pub heartbeat_interval: Duration,
    /// A peer silent this long (no byte at all) is lost.
    pub loss_timeout: Duration,
    /// The leader's deadline for one connection's authentication and registration.
    pub handshake_timeout: Duration,
    /// The longest one write may block (a peer that stops reading is lost after it).
    pub write_timeout: Duration,
    /// How often the waiting leader logs its progress.
    pub progress_interval: Duration,
    /// Where the leader reports joins and refusals (for a status page). Sends never
    /// block: with a bounded channel, events that do not fit are dropped (they are also
    /// logged).
    pub events: Option<Sender<RendezvousEvent>>,
    /// Set when whoever waits gives up (a stop asked while the cluster forms): the
    /// rendezvous then ends within [`CANCEL_POLL`] with `cluster.cancelled`.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// How often a waiting rendezvous looks at [`ControlSettings::cancel`].
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Sleeps `duration`, looking at [`ControlSettings::cancel`] every [`CANCEL_POLL`].
fn sleep_unless_cancelled(duration: Duration, settings: &ControlSettings, waiting: &str) -> Result<(), SluiceError> {
    let until = std::time::Instant::now() + duration;
    loop {
        settings.cancelled(waiting)?;
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(CANCEL_POLL));
    }
}

impl Default for ControlSettings {
    fn default() -> ControlSettings {
        ControlSettings {
            heartbeat_interval: Duration::from_secs(1),
            loss_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(5),
            progress_interval: Duration::from_secs(5),
            events: None,
            cancel: None,
        }
    }
}

/// The longest any of the settings may be (so that no deadline overflows).
const MAX_SETTING: Duration = Duration::from_secs(24 * 3600);

impl ControlSettings {
    /// The rendezvous was given up: `cluster.cancelled`, saying what it waited for.
    fn cancelled(&self, waiting: &str) -> Result<(), SluiceError> {
        match &self.cancel {
            Some(cancel) if cancel.load(Ordering::SeqCst) => {
                Err(SluiceError::user("cluster.cancelled", format!("stopped while {waiting}"))
                    .with_fix("start the worker again to form the cluster"))
            }
            _ => Ok(()),
        }
    }

    fn check(&self) -> Result<(), SluiceError> {
        let durations = [
            ("heartbeat_interval", self.heartbeat_interval),
            ("loss_timeout", self.loss_timeout),
            ("handshake_timeout", self.handshake_timeout),
            ("write_timeout", self.write_timeout),
            ("progress_interval", self.progress_interval),
        ];
        for (name, value) in durations {
            if value.is_zero() || value > MAX_SETTING {
                return Err(SluiceError::user(
                    "cluster.settings",
                    format!("{name} = {value:?} is out of range (above 0, at most a day)"),
                ));
            }
        }
        if self.loss_timeout <= self.heartbeat_interval {
            return Err(SluiceError::user(
                "cluster.settings",
                format!(
                    "loss_timeout ({:?}) must be longer than heartbeat_interval ({:?})",
                    self.loss_timeout, self.heartbeat_interval
                ),
            )
            .with_fix("make the loss timeout several heartbeat intervals long"));
        }
        Ok(())
    }

    fn emit(&self, event: RendezvousEvent) {
        if let Some(events) = &self.events {
            let _ = events.try_send(event);
        }
    }
}

/// Progress of the leader's rendezvous, for the caller to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousEvent {
    /// A worker registered; `present` of `workers` (the leader included) are there now.
    Joined { peer: SocketAddr, exchange_addr: String, host: String, present: usize, workers: usize },
    /// A connection was refused or dropped (a stray, a mismatch, a duplicate, a late
    /// joiner): who, and why.
    Refused { peer: SocketAddr, error: SluiceError },
    /// A registered worker closed its connection before the cluster formed.
    Left { peer: SocketAddr, exchange_addr: String },
    /// Every worker registered and was welcomed.
    Formed { members: Vec<Member> },
}

/// Leads the rendezvous on `listener` (the control address) until `workers` workers
/// (this one included) are registered, then welcomes them; see the module doc. With
/// `workers == 1`, returns at once.
pub fn lead(
    listener: TcpListener,
    me: WorkerInfo,
    workers: usize,
    secret: Option<&Secret>,
    join_timeout: Duration,
) -> Result<(Membership, LeaderControl), SluiceError> {
    lead_with(listener, me, workers, secret, join_timeout, &ControlSettings::default())
}

/// [`lead`] with explicit settings.
pub fn lead_with(
    listener: TcpListener,
    me: WorkerInfo,
    workers: usize,
    secret: Option<&Secret>,
    join_timeout: Duration,
    settings: &ControlSettings,
) -> Result<(Membership, LeaderControl), SluiceError> {
    let gathering = leader::Gathering { workers, join_timeout, wire_version: wire::WIRE_VERSION };
    leader::lead(listener, me, secret, gathering, settings)
}

/// Joins the leader at `leader` (`host:port`, resolved at each attempt), retrying until
/// it is up, and waits for the welcome; everything ends by `timeout`.
pub fn join(
    leader: &str,
    me: WorkerInfo,
    secret: Option<&Secret>,
    timeout: Duration,
) -> Result<(Membership, WorkerControl), SluiceError> {
    join_with(leader, me, secret, timeout, &ControlSettings::default())
}

/// [`join`] with explicit settings.
pub fn join_with(
    leader: &str,
    me: WorkerInfo,
    secret: Option<&Secret>,
    timeout: Duration,
    settings: &ControlSettings,
) -> Result<(Membership, WorkerControl), SluiceError> {
    joiner::join(leader, me, secret, timeout, settings, wire::WIRE_VERSION)
}

/// The fix both sides give when a joiner's agreement (its fingerprint) differs from the
/// leader's.
pub(crate) const AGREEMENT_FIX: &str = "run every worker with the same pipeline.toml and the same vnodes, the same \
     input files where it reads files (the part after `inputs`), the same [checkpoint] guarantee and store URL (the \
     part after `checkpoints`), and the same sluice version";

/// Words every refusal of a joiner by a cluster that already formed carries. Such a
/// refusal can clear (the cluster re-forms after losing a worker), so a joining worker
/// may try again while its join timeout lasts ([`is_already_formed`]).
pub const ALREADY_FORMED: &str = "already formed";

/// Whether `error` is a joiner's refusal by a cluster that already formed.
pub fn is_already_formed(error: &SluiceError) -> bool {
    error.code == "cluster.refused" && error.message.contains(ALREADY_FORMED)
}

/// `1 s`, `1.5 s`, `250 ms`: a duration for messages.
fn seconds(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{} ms", duration.as_millis())
    } else if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests;
