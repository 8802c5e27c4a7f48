//! Fuzzes the CSV record finder: on any bytes it never panics, and it finds the same
//! record ends whole, in pieces and after a skip (`sluice_formats::properties`). The
//! first byte picks the delimiter and the size of the pieces.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run csv_records`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::properties::check_csv_records;

fuzz_target!(|input: &[u8]| {
    let Some((&knobs, bytes)) = input.split_first() else { return };
    let delimiter = [b',', b';', b'\t', b'|'][usize::from(knobs & 3)];
    check_csv_records(bytes, delimiter, usize::from(knobs >> 2) + 1);
});
