//! The heartbeat and loss decision of a control session, as a pure function of times
//! passed in (so a seeded simulation can drive it with a virtual clock).
//!
//! Each side sends a heartbeat once it has sent nothing for `heartbeat_interval` (any
//! frame counts), and declares its peer lost once it has received nothing (not a byte)
//! for `loss_timeout`. Because `loss_timeout > heartbeat_interval` (checked with the
//! settings), a live peer whose heartbeats arrive within `loss_timeout -
//! heartbeat_interval` of being due is never declared lost; a silent one is declared
//! lost at the first check at or after `last_received + loss_timeout`, and the session
//! checks again no later than [`Tick::next_check`], so that is at most one wake-up late.

use std::time::{Duration, Instant};

/// What a session does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The peer is lost: it has been silent this long (at least the loss timeout).
    pub lost_after: Option<Duration>,
    /// Send a heartbeat now.
    pub send_heartbeat: bool,
    /// When to decide again if nothing arrives before (the next heartbeat or the loss
    /// deadline, whichever is first).
    pub next_check: Instant,
}

/// The decision at `now`, given when this side last sent and last received anything.
/// Times in the future (a send that raced with `now`) count as `now`.
pub fn tick(
    now: Instant,
    last_sent: Instant,
    last_received: Instant,
    heartbeat_interval: Duration,
    loss_timeout: Duration,
) -> Tick {
    let silent = now.saturating_duration_since(last_received);
    if silent >= loss_timeout {
        return Tick { lost_after: Some(silent), send_heartbeat: false, next_check: now };
    }
    let send_heartbeat = now.saturating_duration_since(last_sent) >= heartbeat_interval;
    let sent = if send_heartbeat { now } else { last_sent };
    let next_heartbeat = after(sent, heartbeat_interval, now);
    let loss_deadline = after(last_received, loss_timeout, now);
    Tick { lost_after: None, send_heartbeat, next_check: next_heartbeat.min(loss_deadline) }
}

/// `at + wait`, or an hour after `now` if that is not representable.
fn after(at: Instant, wait: Duration, now: Instant) -> Instant {
    at.checked_add(wait).or_else(|| now.checked_add(Duration::from_secs(3600))).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(1);
    const LOSS: Duration = Duration::from_secs(5);

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_quiet_side_sends_heartbeats_and_a_silent_peer_is_lost() {
        let t0 = Instant::now();
        // Just started: nothing to do until the first heartbeat is due.
        let tick0 = tick(t0, t0, t0, INTERVAL, LOSS);
        assert_eq!(tick0, Tick { lost_after: None, send_heartbeat: false, next_check: at(t0, 1000) });
        // A heartbeat is due after an interval without sending; the next one an interval later.
        let tick1 = tick(at(t0, 1000), t0, at(t0, 900), INTERVAL, LOSS);
        assert_eq!(tick1, Tick { lost_after: None, send_heartbeat: true, next_check: at(t0, 2000) });
        // The loss deadline comes first when it is nearer than the next heartbeat.
        let tick2 = tick(at(t0, 4500), at(t0, 4200), t0, INTERVAL, LOSS);
        assert_eq!(tick2, Tick { lost_after: None, send_heartbeat: false, next_check: at(t0, 5000) });
        // Silent for the loss timeout: lost, with how long.
        let tick3 = tick(at(t0, 5000), at(t0, 4200), t0, INTERVAL, LOSS);
        assert_eq!(tick3.lost_after, Some(LOSS));
        assert!(!tick3.send_heartbeat);
        let tick4 = tick(at(t0, 9000), at(t0, 8000), at(t0, 1500), INTERVAL, LOSS);
        assert_eq!(tick4.lost_after, Some(Duration::from_millis(7500)));
    }

    #[test]
    fn a_peer_heard_from_is_not_lost_and_times_from_the_future_count_as_now() {
        let t0 = Instant::now();
        // Heard from just before the deadline: the deadline moves.
        let heard = tick(at(t0, 4999), at(t0, 4500), at(t0, 4998), INTERVAL, LOSS);
        assert_eq!(heard, Tick { lost_after: None, send_heartbeat: false, next_check: at(t0, 5500) });
        // A send or receive stamped after `now` (a race) is neither a heartbeat due nor silence.
        let raced = tick(t0, at(t0, 10), at(t0, 20), INTERVAL, LOSS);
        assert_eq!(raced, Tick { lost_after: None, send_heartbeat: false, next_check: at(t0, 1010) });
    }

    #[test]
    fn a_simulated_session_sends_every_interval_and_notices_silence_once() {
        // A virtual clock stepping 100 ms: this side sends only heartbeats; the peer talks
        // until 3 s, then goes silent.
        let t0 = Instant::now();
        let (mut last_sent, mut last_received) = (t0, t0);
        let mut heartbeats = Vec::new();
        let mut lost = Vec::new();
        for step in 1..=100u64 {
            let now = at(t0, step * 100);
            if step * 100 <= 3000 {
                last_received = now;
            }
            let decision = tick(now, last_sent, last_received, INTERVAL, LOSS);
            assert!(decision.next_check >= now);
            if let Some(silent) = decision.lost_after {
                lost.push((step * 100, silent));
                break;
            }
            if decision.send_heartbeat {
                heartbeats.push(step * 100);
                last_sent = now;
            }
        }
        assert_eq!(heartbeats, [1000, 2000, 3000, 4000, 5000, 6000, 7000]);
        assert_eq!(lost, [(8000, LOSS)]);
    }
}
