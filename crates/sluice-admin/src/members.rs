//! The other workers' own status, asked in the background for a cluster's status
//! streams (`stream`): one task per server asks every other worker's `/internal/status`
//! (as `/status` does: [`ask_members`]) while a stream is open, a round at a time,
//! [`REFRESH`] apart, and keeps the last round's answers. A stream's line adds them to
//! this worker's counters without asking anyone itself, so a slow or lost worker never
//! holds a line back: it shows under `members` with why it could not be asked.
//!
//! Bounds: one task per server; one round at a time (each answer within
//! [`MEMBER_WAIT`] and [`MEMBER_BYTES`], on one blocking thread); only the
//! last round is kept (one document per worker); no round while no stream is open. A
//! line waits only when the kept round is older than [`STALE`] (the first line after no
//! stream was open, or the first since the cluster formed), and then at most
//! [`FIRST_WAIT`] for the next round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_engine::JobHandle;
use tokio::sync::{Notify, Semaphore, watch};

use crate::status::MemberStatus;

/// How long `/status` waits for the other workers' answers.
pub(crate) const MEMBER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The largest answer of a worker to `/internal/status`.
pub(crate) const MEMBER_BYTES: usize = 1 << 20;

/// Every other worker's own status, asked in parallel, each answer within [`MEMBER_WAIT`]:
/// the member, and its document when it answered (also the status streams' rounds:
/// `members`).
pub(crate) fn ask_members(
    peers: Vec<sluice_engine::query::Peer>,
    token: Option<&str>,
) -> Vec<(MemberStatus, Option<serde_json::Value>)> {
    ask_peers(peers, token, "/internal/status")
        .into_iter()
        .map(|(peer, answer)| {
            let answer = answer.and_then(|body| {
                serde_json::from_slice::<serde_json::Value>(&body).map_err(|e| format!("its answer: {e}"))
            });
            let document = answer.as_ref().ok().cloned();
            let member = MemberStatus::of_answer(peer.id, peer.admin_addr, answer, crate::sampler::now_ms());
            (member, document)
        })
        .collect()
}

/// `POST path` (empty body) asked of every other worker in parallel, each answer (its
/// body, or why there is none) within [`MEMBER_WAIT`] and [`MEMBER_BYTES`].
pub(crate) fn ask_peers(
    peers: Vec<sluice_engine::query::Peer>,
    token: Option<&str>,
    path: &str,
) -> Vec<(sluice_engine::query::Peer, Result<Vec<u8>, String>)> {
    let deadline = std::time::Instant::now() + MEMBER_WAIT;
    std::thread::scope(|scope| {
        let asked: Vec<_> = peers
            .into_iter()
            .map(|peer| {
                scope.spawn(move || {
                    let answer = if peer.admin_addr.is_empty() {
                        Err("it runs without an admin API".to_string())
                    } else {
                        match crate::peer_http::post(&peer.admin_addr, token, path, b"", deadline, MEMBER_BYTES) {
                            Ok((200, body)) => Ok(body),
                            Ok((code, _)) => Err(format!("it answered HTTP {code}")),
                            Err(crate::peer_http::PostError::Unreachable(detail)) => Err(detail),
                            Err(crate::peer_http::PostError::TooLarge) => Err("its answer was too long".to_string()),
                        }
                    };
                    (peer, answer)
                })
            })
            .collect();
        asked.into_iter().filter_map(|handle| handle.join().ok()).collect()
    })
}

/// The pause between two rounds of asks while a stream is open.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// A round older than this is not used without waiting for the next one: rounds come
/// [`REFRESH`] apart and each takes at most `MEMBER_WAIT`.
const STALE: Duration = REFRESH.saturating_add(MEMBER_WAIT).saturating_add(Duration::from_secs(1));

/// How long a line waits for a round when the kept one is stale.
const FIRST_WAIT: Duration = MEMBER_WAIT.saturating_add(Duration::from_secs(1));

/// One round of asks: each other worker as it answered (or why it did not), and its
/// own document when it answered.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    at: Instant,
    pub(crate) answers: Arc<Vec<(MemberStatus, Option<serde_json::Value>)>>,
}

/// The last round, shared by the server's streams and its asking task.
#[derive(Debug)]
pub(crate) struct Members {
    /// A stream wants rounds (notified at each of its lines).
    wanted: Notify,
    rounds: watch::Sender<Option<Round>>,
}

impl Members {
    pub(crate) fn new() -> Arc<Members> {
        Arc::new(Members { wanted: Notify::new(), rounds: watch::Sender::new(None) })
    }

    /// The round a line adds in: None when this worker has no other (alone, or before
    /// its cluster formed). Waits (at most [`FIRST_WAIT`]) only when the kept round is
    /// stale; after that wait, the kept round as it is (possibly none: the line then
    /// lists no other worker).
    pub(crate) async fn latest(&self, job: &JobHandle) -> Option<Round> {
        if job.peers().is_empty() {
            return None;
        }
        let mut rounds = self.rounds.subscribe();
        self.wanted.notify_one();
        let fresh = |round: &Option<Round>| round.as_ref().is_some_and(|round| round.at.elapsed() <= STALE);
        if !fresh(&rounds.borrow_and_update()) {
            // A timeout leaves the stale round: the line goes out with it.
            let _ = tokio::time::timeout(FIRST_WAIT, rounds.wait_for(fresh)).await;
        }
        rounds.borrow().clone()
    }
}

/// The asking task of a server (ends with its runtime): once a line wants a round,
/// rounds [`REFRESH`] apart for as long as a stream is open (`streams` has fewer than
/// `max_streams` permits left) and this worker has others.
pub(crate) async fn ask(
    job: JobHandle,
    token: Option<Arc<str>>,
    members: Arc<Members>,
    streams: Arc<Semaphore>,
    max_streams: usize,
) {
    loop {
        members.wanted.notified().await;
        while streams.available_permits() < max_streams {
            let peers = job.peers();
            if peers.is_empty() {
                break;
            }
            let token = token.clone();
            let Ok(answers) = tokio::task::spawn_blocking(move || ask_members(peers, token.as_deref())).await else {
                // The blocking pool is gone: the server shuts down.
                return;
            };
            members.rounds.send_replace(Some(Round { at: Instant::now(), answers: Arc::new(answers) }));
            tokio::time::sleep(REFRESH).await;
        }
    }
}
