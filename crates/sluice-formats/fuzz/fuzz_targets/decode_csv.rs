//! Fuzzes the decoder on CSV: on any bytes it never panics and fails only on a header
//! line it must refuse; every non-blank record is one row or one bad row, whole and in
//! chunks (`sluice_formats::properties`). The first two bytes pick the header setting,
//! the chunker's buffer size and the batch size.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run decode_csv`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::RowFormat;
use sluice_formats::properties::check_decoder;

fuzz_target!(|input: &[u8]| {
    let [header_and_capacity, batch, bytes @ ..] = input else { return };
    let format = RowFormat::Csv { header: header_and_capacity & 1 == 1, delimiter: b',' };
    let capacity = usize::from(header_and_capacity >> 1) * 4 + 1;
    check_decoder(format, bytes, capacity, usize::from(batch % 16) + 1);
});
