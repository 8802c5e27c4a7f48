//! Fuzzes the lease decoder: it must never panic, and whatever it accepts must survive a
//! re-encode byte for byte (the encoding is canonical). Each input is decoded twice: as it
//! is (frame checks), and as a body inside a valid frame with a matching checksum, so the
//! fuzzer also reaches the body decoder.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-checkpoint/fuzz && cargo +nightly fuzz run decode_lease`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_checkpoint::{Holder, LEASE_FORMAT_VERSION, LEASE_MAGIC};

fn check(bytes: &[u8]) {
    if let Ok(holder) = Holder::decode(bytes) {
        assert_eq!(holder.encode(), bytes, "an accepted lease does not re-encode to its bytes");
    }
}

fuzz_target!(|bytes: &[u8]| {
    check(bytes);
    let mut framed = LEASE_MAGIC.to_vec();
    framed.extend_from_slice(&LEASE_FORMAT_VERSION.to_le_bytes());
    framed.extend_from_slice(bytes);
    framed.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    check(&framed);
});
