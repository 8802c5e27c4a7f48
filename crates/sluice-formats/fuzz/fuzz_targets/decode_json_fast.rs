//! Fuzzes the JSON fast path: on any bytes the decoder gives the same batches, bad rows,
//! errors and slow chunks with the fast path as without it, whole and in chunks
//! (`sluice_formats::properties::check_json_fast_path`). The first two bytes pick the
//! chunker's buffer size and the batch size.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run decode_json_fast`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::properties::check_json_fast_path;

fuzz_target!(|input: &[u8]| {
    let [capacity, batch, bytes @ ..] = input else { return };
    check_json_fast_path(bytes, usize::from(*capacity) * 4 + 1, usize::from(batch % 16) + 1);
});
