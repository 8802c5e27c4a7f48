//! Fuzzes the control decoder: it must never panic, and whatever it accepts must encode
//! to a frame that decodes to the same message. Each input is decoded as it is (header
//! checks), and as a body behind a valid header of every kind, so the fuzzer also reaches
//! every body decoder.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-cluster/fuzz && cargo +nightly fuzz run decode_control`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_cluster::wire::{CONTROL_MAGIC, Kind, WIRE_VERSION, decode, encode};

fn check(bytes: &[u8]) {
    if let Ok(message) = decode(bytes) {
        let again = encode(&message).expect("an accepted message encodes");
        assert_eq!(decode(&again).as_ref(), Ok(&message), "an accepted message does not round-trip");
    }
}

fuzz_target!(|bytes: &[u8]| {
    check(bytes);
    for kind in Kind::ALL {
        let mut framed = CONTROL_MAGIC.to_vec();
        framed.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        framed.push(kind as u8);
        framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        framed.extend_from_slice(bytes);
        check(&framed);
    }
});
