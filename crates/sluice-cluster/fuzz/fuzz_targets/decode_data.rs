//! Fuzzes the data link's decoders: the frame reader and the message decoder (weights,
//! flags, Arrow IPC) must never panic on any bytes, and never allocate past the frame
//! bound. Each input is read as a stream of frames, and also decoded as the body of a
//! data frame behind a valid header, so the fuzzer reaches the IPC decoder directly.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-cluster/fuzz && cargo +nightly fuzz run decode_data`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_cluster::frame::{ChannelDecoder, Frame, MAX_FRAME_BODY_BYTES, read_frame};

fuzz_target!(|bytes: &[u8]| {
    let mut reader = bytes;
    let mut decoder = ChannelDecoder::new(None);
    while let Ok(Some(frame)) = read_frame(&mut reader) {
        if let Frame::Message { channel, kind, body } = frame {
            assert!(body.len() <= MAX_FRAME_BODY_BYTES as usize);
            let _ = decoder.decode_message(channel, kind, body);
        }
    }
    // The same bytes as a data frame's body (kind 1), with a fresh decoder.
    let _ = ChannelDecoder::new(None).decode_message(0, 1, bytes.to_vec());
});
