//! Fuzzes the changelog envelopes (Debezium events, upsert messages): on any bytes they
//! give rows or a reason, never a panic, and the rows' kinds follow the envelope
//! (`sluice_formats::properties::check_changelog_envelopes`).
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run changelog_envelopes`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::properties::check_changelog_envelopes;

fuzz_target!(|input: &[u8]| check_changelog_envelopes(input));
