//! The store's lease: one run at a time writes a checkpoint store.
//!
//! Two runs sharing a store used to fight: one collected the other's unpublished objects as
//! abandoned, and both published the same epochs ("epoch 3 is already published with a
//! different manifest"). A run now takes the store's lease before it writes, and every
//! call that commits or deletes checks that it still holds it.
//!
//! # Protocol
//!
//! 1. **Acquire** ([`CheckpointStore::acquire_lease`]): a create-only PUT of the object
//!    `lease` at the store root, holding the [`Holder`] (host, boot id, pid namespace, pid,
//!    process start time, a random run id, the pipeline, the time, how often it refreshes
//!    the lease and how many times it did). It is atomic on every
//!    backend, as the manifest publish is: a hard link on a local directory,
//!    `If-None-Match: *` on S3 and Azure, `x-goog-if-generation-match: 0` on GCS. A lease
//!    found with this run's own id (the client retried a PUT whose answer was lost) counts
//!    as acquired.
//! 2. If a lease exists, it is judged ([`judge`]). It is **stale** when it is certain
//!    that its holder no longer runs: same host name, and either the host restarted since
//!    (another boot id), or, in the same pid namespace, its pid is not running (or is a
//!    zombie) or is running with another start time (the pid was reused). Where this host
//!    cannot tell (another host, another pid namespace: a container restarted by
//!    Kubernetes keeps its host name and gets a new pid namespace), the lease's
//!    **heartbeat** tells: a holder refreshes its lease every `refresh_interval_ms`
//!    (`heartbeat`), and the acquiring run watches the lease for [`EXPIRY_INTERVALS`]
//!    intervals on its own clock (so the hosts' clocks need not agree); a lease that did
//!    not change meanwhile is stale, one that did is live. A stale lease is broken
//!    (deleted, then the create-only PUT again) with a warning naming it
//!    ([`Lease::warnings`]). Otherwise acquiring is refused with `checkpoint.store_leased`,
//!    naming the holder and how to break a lease whose holder is gone:
//!    `sluice checkpoints unlock --store URL`, which calls [`CheckpointStore::break_lease`].
//!    A lease that cannot be read is refused too (`checkpoint.lease_damaged`, or
//!    `checkpoint.lease_version` for another format version), with the same way out. At most
//!    [`ACQUIRE_ATTEMPTS_MAX`] rounds are tried (`checkpoint.lease_contended` after that).
//! 3. **Fencing**: [`CheckpointStore::publish`], [`CheckpointStore::collect_garbage`] and
//!    [`CheckpointStore::clear`] first check that this run refreshed its lease within
//!    [`PUBLISH_INTERVALS`] intervals (else `checkpoint.lease_expired`: another run may be
//!    about to judge it stale), then read the lease (one GET) and go on only if it carries
//!    this handle's run id; otherwise they fail with `checkpoint.lease_lost` (a run whose lease
//!    was broken must not write a manifest nor delete), or `checkpoint.lease_missing` when the
//!    handle never acquired it. Reading the store (`epochs`, `load`, `verify`,
//!    `latest_valid`, `get_object`) needs no lease, so `sluice checkpoints list` and
//!    `verify` work beside a running pipeline.
//! 4. **Release** ([`Lease::release`], on a clean exit): delete the lease if it is still
//!    this run's. A crash leaves it; the next run finds it stale: at once on the same host
//!    and pid namespace, after [`EXPIRY_INTERVALS`] refresh intervals anywhere else.
//!    The heartbeat goes on while the store handle or the [`Lease`] lives (dropping the
//!    lease releases nothing, as a crash releases nothing), until it is released or
//!    broken.
//!
//! `clear` (for `--from-scratch`) is fenced like the other deletions, so the order is:
//! acquire, then clear, then run. `clear` deletes only `manifests/` and `state/`; the lease
//! lives at the store root, so the run keeps holding it through the clear.
//!
//! # Correctness argument
//!
//! - *Mutual exclusion of acquisition*: while a lease object exists, every create-only PUT
//!   fails, so of any set of runs that acquire without breaking, exactly one succeeds.
//! - *Breaking is safe when the judgement is right*: a lease is broken automatically only
//!   when its holder's process is gone (it can write nothing more), or by an operator. Two
//!   runs breaking the same stale lease at once may both delete, and the second delete may
//!   remove the first run's fresh lease (object stores offer no delete-if-unchanged), so both
//!   may believe they hold the lease. Fencing settles it: the object carries one run id, and
//!   only that run can publish or delete; the other fails at its first publish.
//! - *What fencing cannot close*: the check and the write it guards are two requests, so a
//!   lease broken between them does not stop that one write. This only matters when an
//!   operator unlocks a run that is alive (a stale lease's holder writes nothing). The damage
//!   is then bounded and detected, never silent: a manifest is published create-only, so two
//!   runs never replace each other's epoch (the loser fails with
//!   `checkpoint.manifest_exists`); an object deleted or overwritten under a published
//!   manifest fails its size or checksum in `verify`, and recovery falls back past it.
//! - `put_object` is not fenced (a read before every object would double the requests): a
//!   run whose lease was broken may write objects until its next publish, which is refused.
//!   Such an object can overwrite the new holder's object of the same epoch; the new
//!   holder's manifest records size and checksum, so this too is detected damage.
//! - *The heartbeat*: a refresh reads the lease and overwrites it only if it is still this
//!   run's (two requests: a lease broken between them is written back once, and the new
//!   holder's next publish is refused by fencing, while this run, alive, goes on). A
//!   watcher breaks a lease only after seeing no change for [`EXPIRY_INTERVALS`]
//!   intervals, so the holder's last refresh was more than that long ago by the
//!   watcher's clock; the holder publishes only within [`PUBLISH_INTERVALS`] of its last
//!   refresh by its own clock. A holder frozen past that (SIGSTOP, a long pause) stops
//!   publishing; one whose lease was broken meanwhile is fenced out.
//! - *Limits of the judgement*: a host name is taken to name one machine. Two machines with
//!   the same host name sharing a store may judge each other's live lease stale (fencing
//!   then stops the older run at its next publish). With `/proc` mounted `hidepid`, another
//!   user's live process looks gone. Without `/proc` (not Linux) nothing is ever judged
//!   stale by its pid, only by its heartbeat. A format-1 lease has no heartbeat: it is
//!   judged by its pid alone (broken with `unlock` when that cannot tell).
//!
//! # Encoding, lease format version 2 (version 1 is still read)
//!
//! The manifest's frame (see the `manifest` module doc for the frame, the CRC-32 and
//! postcard's rules) with its own magic, and a canonical postcard body (the only accepted
//! encoding, as for manifests):
//!
//! ```text
//! frame     "SLUICELS" = 53 4c 55 49 43 45 4c 53 | version u32 LE = 01 00 00 00 | body | CRC-32 u32 LE
//! Holder (the body), fields in order:
//!   pipeline             string
//!   host                 string
//!   boot_id              string           "" when unknown
//!   pid_namespace        string           "" when unknown
//!   pid                  varint u32
//!   process_start_ticks  option of u64    00 when unknown, else 01 then the varint
//!   run_id               string           not empty
//!   acquired_ms          zigzag i64       milliseconds since the Unix epoch
//!   refresh_interval_ms  varint u64       0: never refreshed (absent in version 1)
//!   beats                varint u64       refreshes so far (absent in version 1: 0)
//! ```
//!
//! An option is one tag byte, `00` (none) or `01` followed by the value; any other tag is
//! refused. The golden vectors in `lease/tests.rs` pin these bytes. A lease is at most
//! [`LEASE_BYTES_MAX`] bytes.

mod heartbeat;
mod process;

use bytes::Bytes;
use object_store::PutMode;
use serde::{Deserialize, Serialize};
use sluice_types::SluiceError;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::calls::{Calls, Failure};
use crate::frame::{self, Problem};
use crate::layout::LEASE_PATH;
use crate::store::CheckpointStore;
use process::Probe;

/// The lease format this build writes and reads (it also reads version 1).
pub const LEASE_FORMAT_VERSION: u32 = 2;
/// How often a run refreshes its lease by default.
pub const LEASE_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// The longest refresh interval a lease may give (a longer one is taken as this when a
/// lease is watched), so that a watch is bounded.
pub const LEASE_REFRESH_INTERVAL_MAX: Duration = Duration::from_secs(60);
/// A lease not refreshed for this many of its intervals, watched from another run, is
/// stale.
pub const EXPIRY_INTERVALS: u32 = 3;
/// A run publishes (or deletes) only within this many of its intervals since its last
/// refresh: below [`EXPIRY_INTERVALS`], so no watcher judges it stale meanwhile.
pub const PUBLISH_INTERVALS: u32 = 2;
/// The first bytes of an encoded lease.
pub const LEASE_MAGIC: [u8; 8] = *b"SLUICELS";
/// The largest encoded lease: written leases are refused above it, read ones are damaged.
pub const LEASE_BYTES_MAX: u64 = 64 * 1024;
/// How many rounds of create, read and break one acquisition tries before giving up.
pub const ACQUIRE_ATTEMPTS_MAX: usize = 4;

/// The command that breaks a lease, for messages.
const UNLOCK: &str = "sluice checkpoints unlock --store";

/// Who holds a store's lease: enough to name the run to a person and, on its host, to tell
/// whether it still runs (see the module doc for the rules).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The pipeline the run executes.
    pub pipeline: String,
    /// The host name (`""` when unknown: never judged to be this host).
    pub host: String,
    /// The id of the host's boot (`""` when unknown): another boot id on the same host
    /// means the holder ended with an earlier boot.
    pub boot_id: String,
    /// The pid namespace (`pid:[4026531836]`, `""` when unknown): pids compare only within
    /// one namespace (container).
    pub pid_namespace: String,
    pub pid: u32,
    /// The process's start time in clock ticks after boot, when known: a running pid with
    /// another start time is another process.
    pub process_start_ticks: Option<u64>,
    /// Unique to one acquisition (32 hex digits); fencing compares it.
    pub run_id: String,
    /// When the holder was made (just before acquiring), milliseconds since the Unix epoch.
    pub acquired_ms: i64,
    /// How often the holder refreshes the lease, in milliseconds; 0: never (a format-1
    /// lease), judged by its pid alone.
    pub refresh_interval_ms: u64,
    /// How many times the holder refreshed the lease: a watcher that sees it change knows
    /// the holder lives.
    pub beats: u64,
}

/// A format-1 lease's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct HolderV1 {
    pipeline: String,
    host: String,
    boot_id: String,
    pid_namespace: String,
    pid: u32,
    process_start_ticks: Option<u64>,
    run_id: String,
    acquired_ms: i64,
}

impl Holder {
    /// This process, about to run `pipeline`, with a fresh run id.
    pub fn this_process(pipeline: impl Into<String>) -> Holder {
        Holder {
            pipeline: pipeline.into(),
            host: process::host_name(),
            boot_id: process::boot_id(),
            pid_namespace: process::pid_namespace(),
            pid: std::process::id(),
            process_start_ticks: process::own_start_ticks(),
            run_id: process::random_run_id(),
            acquired_ms: process::now_ms(),
            refresh_interval_ms: millis(LEASE_REFRESH_INTERVAL),
            beats: 0,
        }
    }

    /// The same holder refreshing its lease every `interval` (at most
    /// [`LEASE_REFRESH_INTERVAL_MAX`]; a zero interval never refreshes it).
    #[must_use]
    pub fn with_refresh_interval(mut self, interval: Duration) -> Holder {
        self.refresh_interval_ms = millis(interval.min(LEASE_REFRESH_INTERVAL_MAX));
        self
    }

    /// How often it refreshes its lease, at most [`LEASE_REFRESH_INTERVAL_MAX`]; None
    /// when it never does.
    pub fn refresh_interval(&self) -> Option<Duration> {
        (self.refresh_interval_ms > 0)
            .then(|| Duration::from_millis(self.refresh_interval_ms).min(LEASE_REFRESH_INTERVAL_MAX))
    }

    /// The lease object's bytes (see the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let bytes = frame::seal(LEASE_MAGIC, LEASE_FORMAT_VERSION, &frame::encode_body(self));
        // A holder without a run id encodes, but is never accepted as a lease.
        debug_assert!(
            self.run_id.is_empty() || Holder::decode(&bytes).as_ref() == Ok(self),
            "lease encoding does not round-trip"
        );
        bytes
    }

    /// Decodes a lease object; never panics. `checkpoint.lease_version` for another format
    /// version, `checkpoint.lease_damaged` for anything else that is not a lease.
    pub fn decode(bytes: &[u8]) -> Result<Holder, SluiceError> {
        let opened = match frame::open(bytes, LEASE_MAGIC, LEASE_FORMAT_VERSION) {
            Ok(body) => Ok((LEASE_FORMAT_VERSION, body)),
            Err(Problem::Version { found: 1 }) => frame::open(bytes, LEASE_MAGIC, 1).map(|body| (1, body)),
            Err(problem) => Err(problem),
        };
        let (version, body) = opened.map_err(|problem| match problem {
            Problem::Version { found } => SluiceError::user(
                "checkpoint.lease_version",
                format!("lease format version {found} is not supported (this build reads {LEASE_FORMAT_VERSION})"),
            ),
            Problem::Magic { found } => damaged(format!("it starts with {found:?}, not \"SLUICELS\"")),
            Problem::Truncated { len } => damaged(format!("{len} bytes, fewer than the {}", frame::FRAME_BYTES)),
            Problem::Checksum { len, stored, computed } => damaged(format!(
                "checksum mismatch over {len} bytes (stored {stored:#010x}, computed {computed:#010x})"
            )),
        })?;
        let body_problem = |problem| damaged(format!("its body: {problem}"));
        let holder = if version == 1 {
            let old: HolderV1 = frame::decode_body(body).map_err(body_problem)?;
            Holder {
                pipeline: old.pipeline,
                host: old.host,
                boot_id: old.boot_id,
                pid_namespace: old.pid_namespace,
                pid: old.pid,
                process_start_ticks: old.process_start_ticks,
                run_id: old.run_id,
                acquired_ms: old.acquired_ms,
                refresh_interval_ms: 0,
                beats: 0,
            }
        } else {
            frame::decode_body(body).map_err(body_problem)?
        };
        if holder.run_id.is_empty() {
            return Err(damaged("its run id is empty".to_string()));
        }
        Ok(holder)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn damaged(problem: String) -> SluiceError {
    SluiceError::external("checkpoint.lease_damaged", format!("the lease is not readable: {problem}"))
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.is_empty() { "(unknown)" } else { &self.host };
        write!(
            f,
            "pipeline {:?} on host {host} (pid {}, run {}) since {}",
            self.pipeline,
            self.pid,
            self.run_id,
            utc(self.acquired_ms)
        )
    }
}

/// What [`CheckpointStore::break_lease`] deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrokenLease {
    /// A readable lease, and who held it.
    Held(Holder),
    /// A lease that could not be read, and why.
    Unreadable(String),
}

impl fmt::Display for BrokenLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokenLease::Held(holder) => write!(f, "the lease of {holder}"),
            BrokenLease::Unreadable(problem) => write!(f, "an unreadable lease ({problem})"),
        }
    }
}

/// The lease a run holds on a store. Dropping it does not release it (a crash does not
/// either): the store handle that acquired it keeps passing the fencing checks until
/// [`Lease::release`] or until the lease is broken.
#[derive(Debug)]
pub struct Lease {
    calls: Arc<Calls>,
    slot: Arc<LeaseSlot>,
    holder: Holder,
    warnings: Vec<String>,
}

impl Lease {
    /// Who holds it: this run.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Stops refreshing the lease without releasing it, as a process that froze or died
    /// stops (for tests of what other runs then see).
    #[cfg(test)]
    pub(crate) fn stop_heartbeat(&self) {
        self.slot.stop_heartbeat();
    }

    /// One warning per stale lease broken to acquire this one, naming its holder (for the
    /// caller to show; they are also logged).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Deletes the lease if it is still this run's (on a clean exit). Fails with
    /// `checkpoint.lease_lost`, deleting nothing, if it was broken meanwhile. Either way the
    /// store handle no longer holds it, and its heartbeat stops.
    pub fn release(self) -> Result<(), SluiceError> {
        self.slot.forget(&self.holder.run_id);
        let calls = &self.calls;
        calls.block_on(async {
            match read_lease(calls).await? {
                Found::Held(held) if held.run_id == self.holder.run_id => {
                    calls.delete_all(&[LEASE_PATH.to_string()]).await?;
                    tracing::info!(store = calls.url(), run = %self.holder.run_id, "lease released");
                    Ok(())
                }
                found => Err(lease_lost(calls.url(), &self.holder, "releasing the lease", &found)),
            }
        })
    }
}

/// The lease a store handle holds (shared with the [`Lease`] that releases it and its
/// heartbeat): the holder as last written, and when (acquired or refreshed); and what
/// stops the heartbeat (dropped with the slot, or when the lease is forgotten).
#[derive(Debug, Default)]
pub(crate) struct LeaseSlot(Mutex<Option<(Holder, Instant)>>, Mutex<Option<heartbeat::Heartbeat>>);

impl LeaseSlot {
    fn get(&self) -> Option<(Holder, Instant)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, holder: Holder, written: Instant) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((holder, written));
    }

    /// Replaces the lease of the same run with `holder`, written at `written`; false
    /// (nothing changed) when it holds another run's or none.
    fn refreshed(&self, holder: Holder, written: Instant) -> bool {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match held.as_mut() {
            Some((mine, when)) if mine.run_id == holder.run_id => {
                (*mine, *when) = (holder, written);
                true
            }
            _ => false,
        }
    }

    /// Forgets the lease of `run_id` (not a newer one), and stops its heartbeat.
    fn forget(&self, run_id: &str) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().is_some_and(|(holder, _)| holder.run_id == run_id) {
            *held = None;
            self.stop_heartbeat();
        }
    }

    /// Keeps `heartbeat` (stopping the one before, if any).
    fn beat_with(&self, heartbeat: Option<heartbeat::Heartbeat>) {
        *self.1.lock().unwrap_or_else(PoisonError::into_inner) = heartbeat;
    }

    /// Stops the heartbeat: the lease is no longer refreshed.
    fn stop_heartbeat(&self) {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// The lease object, as found.
#[derive(Debug)]
enum Found {
    Absent,
    Held(Holder),
    Unreadable(SluiceError),
}

async fn read_lease(calls: &Calls) -> Result<Found, SluiceError> {
    match calls.get(LEASE_PATH, LEASE_BYTES_MAX).await {
        Ok(Ok(bytes)) => Ok(Holder::decode(&bytes).map_or_else(Found::Unreadable, Found::Held)),
        Ok(Err(size)) => Ok(Found::Unreadable(damaged(format!("{size} bytes, more than the {LEASE_BYTES_MAX}")))),
        Err(Failure::Missing) => Ok(Found::Absent),
        Err(Failure::Exists) => Err(calls.error("reading", LEASE_PATH, "unexpected answer")),
        Err(Failure::Other(error)) => Err(error),
    }
}

/// Whether an existing lease may still be in use, seen from `me` on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// Its holder runs: why.
    Live(String),
    /// Its holder certainly no longer runs: why.
    Stale(String),
    /// This host cannot tell from the holder's pid: why (its heartbeat may).
    Unknown(String),
}

/// Judges `held` by the rules of the module doc; `probe` looks a pid up on this host.
fn judge(held: &Holder, me: &Holder, probe: impl Fn(u32) -> Probe) -> Verdict {
    if held.host.is_empty() || held.host != me.host {
        let here = if me.host.is_empty() { "(unknown)" } else { &me.host };
        return Verdict::Unknown(format!(
            "it was taken on another host than this one ({here}), so its pid cannot be checked"
        ));
    }
    if !held.boot_id.is_empty() && !me.boot_id.is_empty() && held.boot_id != me.boot_id {
        return Verdict::Stale(format!("host {} has restarted since it was taken", held.host));
    }
    if held.pid_namespace != me.pid_namespace {
        return Verdict::Unknown(
            "it was taken in another pid namespace (container), so its pid cannot be checked".into(),
        );
    }
    let pid = held.pid;
    match (probe(pid), held.process_start_ticks) {
        (Probe::Gone, _) => Verdict::Stale(format!("pid {pid} is not running")),
        (Probe::Running { start_ticks: Some(now) }, Some(then)) if now != then => Verdict::Stale(format!(
            "pid {pid} is now another process (started at clock tick {now}, the holder at {then})"
        )),
        (Probe::Running { .. }, _) => Verdict::Live(format!("pid {pid} is still running on this host")),
        (Probe::Unknown, _) => Verdict::Unknown(format!("this host cannot tell whether pid {pid} is running")),
    }
}

impl CheckpointStore {
    /// Takes the store's lease for `holder` (normally [`Holder::this_process`]), breaking a
    /// stale one; see the module doc. Fails with `checkpoint.store_leased` when another run
    /// holds it, naming that run and how to break its lease if it is gone.
    pub fn acquire_lease(&self, holder: Holder) -> Result<Lease, SluiceError> {
        if holder.run_id.is_empty() {
            let message = format!("the lease of pipeline {:?} has an empty run id", holder.pipeline);
            return Err(SluiceError::internal("checkpoint.lease_holder", message)
                .with_fix("make the holder with Holder::this_process"));
        }
        let bytes = holder.encode();
        if bytes.len() as u64 > LEASE_BYTES_MAX {
            let message = format!("the lease of pipeline {:?} would take {} bytes", holder.pipeline, bytes.len());
            return Err(SluiceError::user("checkpoint.lease_holder", message)
                .with_fix(format!("use a pipeline name well under {LEASE_BYTES_MAX} bytes")));
        }
        let warnings = self.calls.block_on(self.acquire_async(&holder, Bytes::from(bytes)))?;
        self.lease.set(holder.clone(), Instant::now());
        tracing::info!(store = self.url(), %holder, "lease acquired");
        self.lease.beat_with(heartbeat::Heartbeat::start(Arc::clone(&self.calls), &self.lease, &holder));
        Ok(Lease { calls: Arc::clone(&self.calls), slot: Arc::clone(&self.lease), holder, warnings })
    }

    async fn acquire_async(&self, holder: &Holder, bytes: Bytes) -> Result<Vec<String>, SluiceError> {
        let mut warnings = Vec::new();
        for _ in 0..ACQUIRE_ATTEMPTS_MAX {
            match self.calls.put(LEASE_PATH, bytes.clone(), PutMode::Create).await {
                Ok(()) => return Ok(warnings),
                Err(Failure::Exists) => {}
                Err(failure) => return Err(self.failure("writing", LEASE_PATH, failure)),
            }
            let held = match read_lease(&self.calls).await? {
                Found::Absent => continue,
                // Our own create, retried by the client after its answer was lost.
                Found::Held(held) if held.run_id == holder.run_id => return Ok(warnings),
                Found::Held(held) => held,
                Found::Unreadable(error) => return Err(self.unreadable(error)),
            };
            let verdict = match judge(&held, holder, process::probe) {
                Verdict::Unknown(why) => match held.refresh_interval() {
                    // Its heartbeat tells; a lease that went or changed hands meanwhile: again.
                    Some(interval) => match heartbeat::watch(&self.calls, &held, interval).await? {
                        heartbeat::Watched::Replaced => continue,
                        heartbeat::Watched::Refreshed(how) => Verdict::Live(format!("{why}, but {how}")),
                        heartbeat::Watched::Silent(how) => Verdict::Stale(format!("{why}, and {how}")),
                    },
                    None => Verdict::Live(format!("{why}, and it has no heartbeat (an older Sluice took it)")),
                },
                verdict => verdict,
            };
            match verdict {
                Verdict::Live(why) | Verdict::Unknown(why) => return Err(self.leased(&held, &why)),
                Verdict::Stale(why) => {
                    let warning = format!("broke the stale lease of {held} on {}: {why}", self.url());
                    tracing::warn!(store = self.url(), "{warning}");
                    self.calls.delete_all(&[LEASE_PATH.to_string()]).await?;
                    warnings.push(warning);
                }
            }
        }
        Err(SluiceError::external(
            "checkpoint.lease_contended",
            format!(
                "the lease of {} changed hands {ACQUIRE_ATTEMPTS_MAX} times while this run tried to take it",
                self.url()
            ),
        )
        .with_fix("another run is starting on the same store: stop one of them"))
    }

    /// Deletes the store's lease whoever holds it (for `sluice checkpoints unlock` when its
    /// holder is gone) and returns what it deleted; `None` when there was none. The run
    /// that held it fails at its next publish with `checkpoint.lease_lost`.
    pub fn break_lease(&self) -> Result<Option<BrokenLease>, SluiceError> {
        let broken = self.calls.block_on(async {
            let broken = match read_lease(&self.calls).await? {
                Found::Absent => return Ok(None),
                Found::Held(held) => BrokenLease::Held(held),
                Found::Unreadable(error) => BrokenLease::Unreadable(error.message),
            };
            self.calls.delete_all(&[LEASE_PATH.to_string()]).await?;
            Ok(Some(broken))
        })?;
        if let Some(BrokenLease::Held(held)) = &broken {
            self.lease.forget(&held.run_id);
        }
        if let Some(broken) = &broken {
            tracing::warn!(store = self.url(), "broke {broken}");
        }
        Ok(broken)
    }

    /// Fencing: fails unless the lease in the store is the one this handle acquired (one
    /// read). `action` names what is refused.
    pub(crate) async fn check_lease(&self, action: &str) -> Result<(), SluiceError> {
        let Some((mine, written)) = self.lease.get() else {
            return Err(SluiceError::internal(
                "checkpoint.lease_missing",
                format!("{action} in {} needs the store's lease, and this store handle holds none", self.url()),
            )
            .with_fix(
                "acquire the lease with CheckpointStore::acquire_lease first (a run holds it from start to exit)",
            ));
        };
        if let Some(interval) = mine.refresh_interval()
            && written.elapsed() > interval * PUBLISH_INTERVALS
        {
            return Err(lease_expired(self.url(), &mine, action, written.elapsed(), interval));
        }
        match read_lease(&self.calls).await? {
            Found::Held(held) if held.run_id == mine.run_id => Ok(()),
            found => Err(lease_lost(self.url(), &mine, action, &found)),
        }
    }

    fn leased(&self, held: &Holder, why: &str) -> SluiceError {
        let url = self.url();
        SluiceError::user(
            "checkpoint.store_leased",
            format!("checkpoint store {url} is in use: its lease is held by {held}; {why}"),
        )
        .with_fix(format!(
            "stop that run or use another store; if that run is gone, break its lease with `{UNLOCK} {url}`"
        ))
    }

    fn unreadable(&self, error: SluiceError) -> SluiceError {
        let url = self.url();
        error.context(format!("checkpoint store {url}")).with_fix(format!(
            "if the run that took this lease is gone (whichever Sluice version it was), break the lease with \
             `{UNLOCK} {url}`"
        ))
    }
}

fn lease_lost(url: &str, mine: &Holder, action: &str, found: &Found) -> SluiceError {
    let now = match found {
        Found::Absent => "the store has no lease (it was broken)".to_string(),
        Found::Held(held) => format!("it is held by {held}"),
        Found::Unreadable(error) => format!("the lease there is unreadable ({})", error.message),
    };
    SluiceError::user(
        "checkpoint.lease_lost",
        format!(
            "{action} in {url} is refused: this run (pipeline {:?}, run {}) no longer holds the store's lease: {now}",
            mine.pipeline, mine.run_id
        ),
    )
    .with_fix(
        "stop this run: its lease was broken (by `sluice checkpoints unlock` or as stale), so another run may own \
         the store; restart it once no other run uses the store, and it resumes from the newest checkpoint",
    )
}

fn lease_expired(url: &str, mine: &Holder, action: &str, since: Duration, interval: Duration) -> SluiceError {
    SluiceError::external(
        "checkpoint.lease_expired",
        format!(
            "{action} in {url} is refused: this run (pipeline {:?}, run {}) last refreshed the store's lease {} ms \
             ago, more than {PUBLISH_INTERVALS} intervals of {} ms, so another run may judge it stale and take \
             the store",
            mine.pipeline,
            mine.run_id,
            since.as_millis(),
            interval.as_millis()
        ),
    )
    .with_fix(
        "check that the checkpoint store answers (the lease is refreshed there) and that the process is not \
         paused or starved; restart the run, and it resumes from the newest checkpoint",
    )
}

/// `2026-12-01T02:00:33Z` for milliseconds since the Unix epoch (proleptic Gregorian, UTC).
fn utc(ms: i64) -> String {
    let seconds = ms.div_euclid(1000);
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days to a civil date, counted from 0000-03-01 in 400-year eras of 146 097 days (the
    // Gregorian calendar repeats every era), so that a leap day ends each year.
    let shifted = days + 719_468;
    let (era, day_of_era) = (shifted.div_euclid(146_097), shifted.rem_euclid(146_097));
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (second_of_day / 3600, second_of_day % 3600 / 60, second_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests;
