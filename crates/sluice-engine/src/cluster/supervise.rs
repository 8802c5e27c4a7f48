//! Supervising a cluster's run: the control session beside the local part. The leader
//! forwards a stop, routes the workers' checkpoint reports to its controller and collects
//! every worker's end; a worker obeys the leader's stop, abort and rejoin, routes the
//! leader's checkpoint commands to its controller and reports its end.
//!
//! Pausing the sources: every worker's `StopHandle` holds a paused flag its drivers read
//! before polling lanes. The leader's flag is the cluster's: whenever it differs from
//! what the leader last told the workers (checked at every event and at least every
//! [`PAUSE_POLL`]), it sends `Pause` to all. A pause or resume asked of a worker sets its
//! own flag at once and, when that differs from what the leader last said, asks the
//! leader (`PauseRequested`, sent again at the next check if it could not be sent); the
//! leader applies it to its flag and answers every request with a `Pause` of its flag to
//! all. So after any sequence of requests, every worker ends with the leader's flag, the
//! last request the leader heard.
//!
//! Losing a worker, when the pipeline checkpoints: the leader tells the others to stop
//! and join it again (`Rejoin`); once every survivor reported its end, the round ends,
//! and the job forms the cluster again (the lost worker restarted with the same
//! command, the survivors on their own) and resumes from the last checkpoint. Without
//! checkpoints, or when the leader is lost, the run fails everywhere.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TrySendError};
use sluice_cluster::rendezvous::{ControlEvent, LeaderControl, ToLeader, ToWorker, WorkerControl};
use sluice_runtime::{Metrics, StopHandle};
use sluice_types::{ErrorKind, SluiceError};

use super::{Control, Route, leader_lost, report};
use crate::job::show_paused;
use crate::status::StatusCell;

/// How the local part ended, as the control thread is told: the failure's text, and
/// whether it was a lost peer (then the session's account of which peer usually follows).
pub(crate) type LocalOutcome = Result<(), (String, bool)>;

/// How long a worker whose part failed for a lost peer waits for its session to say
/// which (the leader, usually), before reporting what it has.
const CAUSE_WAIT: Duration = Duration::from_secs(2);

/// The longest a change of the paused flag, or a stop asked of a worker, waits to be sent
/// on to the leader.
const PAUSE_POLL: Duration = Duration::from_millis(200);

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
    /// Where the checkpoints' messages go.
    pub route: Route,
    /// Whether a lost worker makes the cluster re-form (the pipeline checkpoints).
    pub rejoin: bool,
    /// The control sessions' loss timeout: within it the leader is heard from or lost.
    pub loss_timeout: Duration,
    /// The job's status, whose state shows the sources paused.
    pub status: Arc<StatusCell>,
}

/// How the cluster's part of a run ended.
#[derive(Debug, Default)]
pub(crate) struct Supervision {
    /// The cluster's failure, if any: a lost peer, a worker that failed, a worker that
    /// never reported.
    pub failure: Option<(String, SluiceError)>,
    /// The cluster re-forms: this worker takes part in the next round.
    pub rejoin: bool,
}

/// Runs the control session while the local part runs; see the module doc.
pub(crate) fn supervise(control: Control, run: Supervised) -> Supervision {
    match control {
        Control::Leader(session) => lead(&session, &run),
        Control::Worker(session) => follow(&session, &run),
    }
}

/// The leader: forwards a stop, collects every worker's end.
fn lead(session: &LeaderControl, run: &Supervised) -> Supervision {
    let Supervised { stop, cancel_links, local_done, workers, shutdown_timeout, .. } = run;
    let (workers, shutdown_timeout) = (*workers, *shutdown_timeout);
    let mut stop_sent = false;
    let mut ended = std::collections::BTreeSet::new();
    let mut failure = None;
    let mut rejoin = false;
    let mut deadline: Option<Instant> = None;
    // The abort held back while a worker's loss may still be reported, and until when.
    let mut abort_later: Option<(String, Instant)> = None;
    // What the workers were last told of the paused flag (they start unpaused).
    let mut told_paused = false;
    while ended.len() + 1 < workers {
        if rejoin {
            abort_later = None;
        }
        let paused = stop.is_paused();
        if paused != told_paused {
            told_paused = paused;
            if let Err(error) = session.broadcast(&ToWorker::Pause { paused }) {
                tracing::warn!(%error, "the pause could not reach every worker");
            }
        }
        if let Some((reason, _)) = abort_later.take_if(|(_, until)| Instant::now() >= *until) {
            let _ = session.broadcast(&ToWorker::Abort { reason });
        }
        if stop.is_requested() && !stop_sent {
            stop_sent = true;
            if let Err(error) = session.broadcast(&ToWorker::Stop) {
                tracing::warn!(%error, "the stop could not reach every worker");
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let missing: Vec<u32> = session.workers().filter(|w| !ended.contains(w)).collect();
            let failure = failure.or(Some((
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
            return Supervision { failure, rejoin };
        }
        crossbeam_channel::select! {
            recv(session.events()) -> event => match event {
                Ok(ControlEvent::Received { peer, message: ToLeader::Finished { report } }) => {
                    ended.insert(peer);
                    if let Err(error) = report::merge(&run.metrics, &report, peer) {
                        tracing::warn!(%error, "the exit report leaves out worker {peer}'s counters");
                    }
                }
                Ok(ControlEvent::Received { message: ToLeader::StopRequested, .. }) => stop.stop(),
                Ok(ControlEvent::Received { peer, message: ToLeader::PauseRequested { paused } }) => {
                    tracing::info!(worker = peer, paused, "a worker asked to pause or resume the sources");
                    set_paused(stop, &run.status, paused);
                    // Answered at once, changed or not: the asking worker learns the
                    // cluster's flag even if another request undoes this one before
                    // the next check.
                    told_paused = stop.is_paused();
                    if let Err(error) = session.broadcast(&ToWorker::Pause { paused: told_paused }) {
                        tracing::warn!(%error, "the pause could not reach every worker");
                    }
                }
                Ok(ControlEvent::Received { peer, message: message @ (ToLeader::Acked { .. } | ToLeader::DriversFinished) }) => {
                    if let Err(error) = route_to_leader(&run.route, peer, message) {
                        failure.get_or_insert((format!("worker {peer}"), error));
                        end_now(stop, cancel_links);
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
                        if run.rejoin && failure.is_none() && !stop.is_requested() {
                            rejoin = true;
                            let reason = format!("worker {peer} was lost: {}", error.message);
                            tracing::warn!("{reason}; the cluster stops and re-forms to resume from its last checkpoint");
                            // Unreachable workers are lost too; the others hear it.
                            let _ = session.broadcast(&ToWorker::Rejoin { reason });
                        }
                        failure.get_or_insert((format!("worker {peer}"), error));
                        end_now(stop, cancel_links);
                    }
                }
                Err(_) => return Supervision { failure, rejoin },
            },
            recv(local_done) -> outcome => {
                if let Ok(Err((message, lost_peer))) = outcome
                    && !rejoin
                {
                    if lost_peer && run.rejoin {
                        // A link to a lost worker closed before its session said so: the
                        // loss (a rejoin) is likely what comes next, not an abort.
                        abort_later = Some((message, Instant::now() + run.loss_timeout + CAUSE_WAIT));
                    } else {
                        let _ = session.broadcast(&ToWorker::Abort { reason: message });
                    }
                }
                deadline.get_or_insert(Instant::now() + shutdown_timeout);
            },
            default(PAUSE_POLL) => {}
        }
    }
    Supervision { failure, rejoin }
}

/// Sets this worker's paused flag and shows it in the status.
fn set_paused(stop: &StopHandle, status: &StatusCell, paused: bool) {
    if paused {
        stop.pause();
    } else {
        stop.resume();
    }
    show_paused(status, paused);
}

/// A worker: obeys the leader's stop, reports its end.
fn follow(session: &WorkerControl, run: &Supervised) -> Supervision {
    let Supervised { stop, cancel_links, local_done, .. } = run;
    let mut failure = None;
    let mut rejoin = false;
    let never = crossbeam_channel::never();
    let mut events = session.events();
    // The leader's paused flag as it last said (workers start unpaused).
    let mut leader_paused = false;
    // Whether the cluster's stop is under way: the leader said so, or this worker told it.
    let mut stopping = false;
    loop {
        if stop.is_requested() && !stopping {
            // A stop asked of this worker (a signal, its admin API) stops the cluster: the
            // leader stops every worker. Without this, this worker's sources alone would
            // stop while its inputs from the others never end. (With checkpoints the
            // coordinator asks too; the leader takes the first.) Sent once.
            stopping = true;
            if let Err(error) = session.send(&ToLeader::StopRequested) {
                tracing::warn!(%error, "the stop request did not reach the leader");
            }
        }
        let paused = stop.is_paused();
        if paused != leader_paused {
            // Asked of this worker: the leader decides for every worker, and answers
            // every request with its flag (a `Pause`), which settles it. A request that
            // could not be sent is sent again at the next check.
            match session.send(&ToLeader::PauseRequested { paused }) {
                Ok(()) => leader_paused = paused,
                Err(error) => tracing::warn!(%error, "the leader did not hear this worker's pause or resume"),
            }
        }
        crossbeam_channel::select! {
            recv(events) -> event => match event {
                Ok(ControlEvent::Received { message: ToWorker::Stop, .. }) => {
                    stopping = true;
                    stop.stop();
                }
                Ok(ControlEvent::Received { message: ToWorker::Pause { paused }, .. }) => {
                    leader_paused = paused;
                    set_paused(stop, &run.status, paused);
                }
                Ok(ControlEvent::Received { message: message @ (ToWorker::Barrier { .. } | ToWorker::Commit { .. }), .. }) => {
                    if let Err(error) = route_to_worker(&run.route, message) {
                        failure.get_or_insert(("leader".into(), error));
                        end_now(stop, cancel_links);
                    }
                }
                Ok(ControlEvent::Received { message: ToWorker::Abort { reason }, .. }) => {
                    failure.get_or_insert(("leader".into(), SluiceError::external("cluster.leader_failed", reason)));
                    end_now(stop, cancel_links);
                }
                Ok(ControlEvent::Received { message: ToWorker::Rejoin { reason }, .. }) => {
                    rejoin |= failure.is_none();
                    failure.get_or_insert(("leader".into(), rejoining(reason)));
                    end_now(stop, cancel_links);
                }
                Ok(ControlEvent::Received { message, .. }) => tracing::debug!(?message, "unexpected control message"),
                Ok(ControlEvent::Lost { error, .. }) => {
                    failure.get_or_insert(("leader".into(), leader_lost(&error, session.leader(), run.rejoin)));
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
                            // With checkpoints the leader's word decides whether this
                            // worker rejoins: wait for it, or for the leader's loss.
                            let wait = if run.rejoin { run.loss_timeout + CAUSE_WAIT } else { CAUSE_WAIT };
                            (failure, rejoin) = cause(events, session, run.rejoin, wait);
                        }
                        ToLeader::Failed { message }
                    }
                    Err(_) => ToLeader::Failed { message: "the local run ended without an outcome".into() },
                };
                if let Err(error) = session.send(&report) {
                    tracing::warn!(%error, "the leader did not hear this worker's end");
                }
                if rejoin {
                    // The leader closes this session when its round ends; joining again
                    // before that would be refused as one worker too many.
                    wait_for_close(events, run.shutdown_timeout);
                }
                return Supervision { failure, rejoin };
            },
            default(PAUSE_POLL) => {}
        }
    }
}

/// The leader's request to rejoin, as this round's outcome.
fn rejoining(reason: String) -> SluiceError {
    SluiceError::external("cluster.rejoin", format!("{reason}; joining the leader again"))
        .with_kind(ErrorKind::LostPeer)
}

/// Waits, at most `timeout`, until the leader closed the session.
fn wait_for_close(events: &Receiver<ControlEvent<ToWorker>>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while let Ok(event) = events.recv_deadline(deadline) {
        if matches!(event, ControlEvent::Lost { .. }) {
            return;
        }
    }
}

/// Hands a worker's checkpoint report to the leader's controller.
fn route_to_leader(route: &Route, peer: u32, message: ToLeader) -> Result<(), SluiceError> {
    let Route::Lead(sender) = route else {
        return Err(broken(format!("worker {peer} sent {message:?}, but this run takes no checkpoints")));
    };
    match sender.try_send((peer, message)) {
        // The controller ended: the run is over and nothing waits for this.
        Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
        Err(TrySendError::Full((_, message))) => {
            Err(broken(format!("worker {peer} sent {message:?} with more checkpoint reports unread than allowed")))
        }
    }
}

/// Hands the leader's checkpoint command to this worker's controller.
fn route_to_worker(route: &Route, message: ToWorker) -> Result<(), SluiceError> {
    let Route::Follow(sender) = route else {
        return Err(broken(format!("the leader sent {message:?}, but this run takes no checkpoints")));
    };
    match sender.try_send(message) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
        Err(TrySendError::Full(message)) => {
            Err(broken(format!("the leader sent {message:?} with more checkpoint commands unread than allowed")))
        }
    }
}

fn broken(message: String) -> SluiceError {
    SluiceError::internal("cluster.checkpoint_protocol", message)
        .with_kind(ErrorKind::LostPeer)
        .with_fix("run the same sluice build and pipeline.toml on every worker")
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
/// `wait`: its loss, its abort, or its request to rejoin (then true).
fn cause(
    events: &Receiver<ControlEvent<ToWorker>>,
    session: &WorkerControl,
    checkpoints: bool,
    wait: Duration,
) -> (Option<(String, SluiceError)>, bool) {
    let deadline = Instant::now() + wait;
    loop {
        match events.recv_deadline(deadline) {
            Ok(ControlEvent::Lost { error, .. }) => {
                return (Some(("leader".into(), leader_lost(&error, session.leader(), checkpoints))), false);
            }
            Ok(ControlEvent::Received { message: ToWorker::Abort { reason }, .. }) => {
                return (Some(("leader".into(), SluiceError::external("cluster.leader_failed", reason))), false);
            }
            Ok(ControlEvent::Received { message: ToWorker::Rejoin { reason }, .. }) => {
                return (Some(("leader".into(), rejoining(reason))), true);
            }
            Ok(ControlEvent::Received { .. }) => {}
            Err(_) => return (None, false),
        }
    }
}
