//! Fuzzes the decoder on JSON lines: on any bytes it never fails or panics; every
//! non-blank line is one row or one bad row, whole and in chunks
//! (`sluice_formats::properties`). The first two bytes pick the chunker's buffer size
//! and the batch size.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run decode_json`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::RowFormat;
use sluice_formats::properties::check_decoder;

fuzz_target!(|input: &[u8]| {
    let [capacity, batch, bytes @ ..] = input else { return };
    check_decoder(RowFormat::Json, bytes, usize::from(*capacity) * 4 + 1, usize::from(batch % 16) + 1);
});
