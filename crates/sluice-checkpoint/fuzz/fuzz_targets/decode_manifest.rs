//! Fuzzes the manifest decoder: it must never panic, and whatever it accepts must be
//! self-consistent and survive a re-encode unchanged. Each input is decoded twice: as it
//! is (frame checks), and as a body inside a valid frame with a matching checksum, so the
//! fuzzer also reaches the body decoder and the consistency checks.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-checkpoint/fuzz && cargo +nightly fuzz run decode_manifest`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_checkpoint::{FORMAT_VERSION, MAGIC, decode, encode};

fn check(bytes: &[u8]) {
    if let Ok(manifest) = decode(bytes) {
        assert!(manifest.check().is_ok(), "decode accepted an inconsistent manifest");
        let again = decode(&encode(&manifest));
        assert_eq!(again.ok().as_ref(), Some(&manifest), "an accepted manifest does not round-trip");
    }
}

fuzz_target!(|bytes: &[u8]| {
    check(bytes);
    let mut framed = MAGIC.to_vec();
    framed.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    framed.extend_from_slice(bytes);
    framed.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    check(&framed);
});
