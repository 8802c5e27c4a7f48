//! Sends on the runtime's bounded control channels, without blocking and without
//! dropping a message.
//!
//! Every control channel has a capacity that the protocol provably never exceeds (each
//! channel's argument is at its creation); [`post`] sends with `try_send`, so a thread
//! never blocks on one. A full channel would mean the argument is wrong: a bug, reported
//! as an assertion. A closed channel means the receiver has already ended, which each
//! caller handles (and documents) itself.

use crossbeam_channel::{Sender, TrySendError};

/// What became of a posted message.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Posted {
    Delivered,
    /// The receiver is gone (it ended); the message has no one to act on it.
    ReceiverGone,
}

/// Sends `message` on a channel whose capacity `why` argues is enough.
pub(crate) fn post<T: std::fmt::Debug>(sender: &Sender<T>, message: T, why: &str) -> Posted {
    match sender.try_send(message) {
        Ok(()) => Posted::Delivered,
        Err(TrySendError::Disconnected(_)) => Posted::ReceiverGone,
        Err(TrySendError::Full(message)) => {
            panic!("a bounded control channel is full, so its capacity argument is wrong ({why}); dropping {message:?}")
        }
    }
}
