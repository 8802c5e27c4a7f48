//! Fuzzes the manifest decoder with arbitrary bytes: it must never panic, and whatever it
//! accepts must be self-consistent and survive a re-encode unchanged.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-checkpoint/fuzz && cargo +nightly fuzz run decode_manifest`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(manifest) = sluice_checkpoint::decode(bytes) {
        assert!(manifest.check().is_ok(), "decode accepted an inconsistent manifest");
        let again = sluice_checkpoint::decode(&sluice_checkpoint::encode(&manifest));
        assert_eq!(again.ok().as_ref(), Some(&manifest), "an accepted manifest does not round-trip");
    }
});
