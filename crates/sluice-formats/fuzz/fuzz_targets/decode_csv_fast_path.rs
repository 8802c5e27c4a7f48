//! Fuzzes the CSV decoder's one-pass fast path against its general path: on any bytes
//! the decoder gives the same rows, bad rows, outcome and slow chunks with the fast
//! path on and off, whole and in chunks (`sluice_formats::properties::check_fast_path`).
//! The first two bytes pick the header setting, the delimiter, the chunker's buffer
//! size and the batch size.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run decode_csv_fast_path`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::RowFormat;
use sluice_formats::properties::{check_fast_path, fast_path_schema};

fuzz_target!(|input: &[u8]| {
    let [setting, batch, bytes @ ..] = input else { return };
    let delimiter = [b',', b';', b'\t', b'|'][usize::from(setting & 3)];
    let format = RowFormat::Csv { header: setting & 4 == 4, delimiter };
    // 0: the input whole, in one chunk.
    let capacity = usize::from(setting >> 3) * 8;
    check_fast_path(&fast_path_schema(), format, bytes, capacity, usize::from(batch % 16) + 1);
});
