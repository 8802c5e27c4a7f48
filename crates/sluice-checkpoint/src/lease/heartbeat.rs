//! The lease's heartbeat: the holder refreshes its lease every refresh interval, and a
//! run that finds a lease whose holder it cannot check by pid watches it for a change.
//!
//! - [`Heartbeat`]: a thread per held lease that, every interval, reads the lease and, if
//!   it is still this run's, writes it back with one more beat; it notes each write's
//!   start in the store handle's slot (what the fencing check compares with). It ends
//!   when its [`Heartbeat`] is dropped (the `Lease` released or dropped), when the slot
//!   no longer holds this run's lease, or when the lease in the store is another's (the
//!   run's next publish is then refused by fencing). A failed refresh is logged and tried
//!   again at the next interval: the fencing check refuses to publish once refreshes
//!   failed for [`super::PUBLISH_INTERVALS`] intervals. The slot owns the [`Heartbeat`]
//!   and the thread holds the slot weakly, so the thread ends once the store handle and
//!   its `Lease` are both gone, or the lease is released or broken.
//! - [`watch`]: re-reads a lease every quarter interval (within 10 ms and 1 s) until it
//!   changes or [`super::EXPIRY_INTERVALS`] intervals passed on this run's clock.
//!
//! Bounds: one thread and at most one store call at a time per held lease; a watch lasts
//! at most `EXPIRY_INTERVALS` times [`super::LEASE_REFRESH_INTERVAL_MAX`] plus one call.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::PutMode;
use sluice_types::SluiceError;

use super::{EXPIRY_INTERVALS, Found, Holder, LeaseSlot, read_lease};
use crate::calls::{Calls, Failure};
use crate::layout::LEASE_PATH;

/// Refreshes a lease on a thread of its own until dropped.
#[derive(Debug)]
pub(super) struct Heartbeat {
    /// Dropping it wakes and ends the thread.
    _stop: mpsc::Sender<()>,
}

impl Heartbeat {
    /// Starts refreshing `holder`'s lease, held in `slot`; None when it never refreshes
    /// (no interval), or when no thread could be had (then the lease looks stale to
    /// other runs after its expiry, and this run's publishes are refused: logged).
    pub(super) fn start(calls: Arc<Calls>, slot: &Arc<LeaseSlot>, holder: &Holder) -> Option<Heartbeat> {
        let interval = holder.refresh_interval()?;
        let (stop, stopped) = mpsc::channel();
        let run_id = holder.run_id.clone();
        let slot = Arc::downgrade(slot);
        let spawned = std::thread::Builder::new()
            .name("sluice-lease".into())
            .spawn(move || beat(&calls, &slot, &run_id, interval, &stopped));
        match spawned {
            Ok(_) => Some(Heartbeat { _stop: stop }),
            Err(error) => {
                tracing::error!(%error, "no thread to refresh the store's lease: this run will not publish");
                None
            }
        }
    }
}

fn beat(calls: &Calls, slot: &Weak<LeaseSlot>, run_id: &str, interval: Duration, stopped: &mpsc::Receiver<()>) {
    loop {
        match stopped.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            // Dropped (or, never, sent): stop.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(slot) = slot.upgrade() else {
            return;
        };
        let Some((mine, _)) = slot.get().filter(|(mine, _)| mine.run_id == run_id) else {
            return;
        };
        // The write lands after this instant: the fencing check counts from here.
        let started = Instant::now();
        match calls.block_on(refresh(calls, &mine)) {
            Ok(Some(refreshed)) => {
                if !slot.refreshed(refreshed, started) {
                    return;
                }
            }
            Ok(None) => {
                tracing::error!(
                    store = calls.url(),
                    run = run_id,
                    "the store's lease is no longer this run's (it was broken): this run's next checkpoint is refused"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(store = calls.url(), %error, "could not refresh the store's lease; trying again in {interval:?}");
            }
        }
    }
}

/// Writes `mine` back with one more beat if the lease is still its; None when it is not.
async fn refresh(calls: &Calls, mine: &Holder) -> Result<Option<Holder>, SluiceError> {
    match read_lease(calls).await? {
        Found::Held(held) if held.run_id == mine.run_id => {
            let next = Holder { beats: held.beats.saturating_add(1), ..mine.clone() };
            match calls.put(LEASE_PATH, Bytes::from(next.encode()), PutMode::Overwrite).await {
                Ok(()) => Ok(Some(next)),
                Err(Failure::Other(error)) => Err(error),
                Err(Failure::Missing | Failure::Exists) => {
                    Err(calls.error("refreshing", LEASE_PATH, "unexpected answer"))
                }
            }
        }
        _ => Ok(None),
    }
}

/// What watching a lease showed.
#[derive(Debug)]
pub(super) enum Watched {
    /// Its holder refreshed it: how, for the refusal.
    Refreshed(String),
    /// Nobody refreshed it for its expiry: how, for the warning.
    Silent(String),
    /// It is gone, or another run's now: judge again.
    Replaced,
}

/// Watches `held`, just read, whose holder refreshes it every `interval`.
pub(super) async fn watch(calls: &Calls, held: &Holder, interval: Duration) -> Result<Watched, SluiceError> {
    let patience = interval * EXPIRY_INTERVALS;
    let poll = (interval / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let started = Instant::now();
    tracing::info!(
        store = calls.url(),
        holder = %held,
        "the store's lease cannot be checked from here: watching its heartbeat for up to {patience:?}"
    );
    loop {
        tokio::time::sleep(poll).await;
        match read_lease(calls).await? {
            Found::Held(now) if now.run_id == held.run_id && now.beats != held.beats => {
                return Ok(Watched::Refreshed(format!(
                    "its holder refreshed it while this run watched (beat {} after {})",
                    now.beats, held.beats
                )));
            }
            Found::Held(now) if now.run_id == held.run_id => {}
            _ => return Ok(Watched::Replaced),
        }
        if started.elapsed() >= patience {
            return Ok(Watched::Silent(format!(
                "its holder did not refresh it for {} ms ({EXPIRY_INTERVALS} of its intervals of {} ms): it is gone",
                started.elapsed().as_millis(),
                interval.as_millis()
            )));
        }
    }
}
