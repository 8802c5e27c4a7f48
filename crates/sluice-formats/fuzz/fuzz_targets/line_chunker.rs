//! Fuzzes the line chunker: on any bytes it hands out every byte once, in whole records
//! within its buffer, with the file's line numbers, and skips exactly the over-long
//! records (`sluice_formats::properties`). The first two bytes pick the format, the
//! buffer size and the size of each read.
//!
//! Run (nightly and cargo-fuzz): `cd crates/sluice-formats/fuzz && cargo +nightly fuzz run line_chunker`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::RowFormat;
use sluice_formats::properties::check_chunker;

fuzz_target!(|input: &[u8]| {
    let [format_and_capacity, read, bytes @ ..] = input else { return };
    let format = match format_and_capacity & 1 {
        0 => RowFormat::Json,
        _ => RowFormat::Csv { header: false, delimiter: b',' },
    };
    let capacity = usize::from(format_and_capacity >> 1) + 1;
    check_chunker(format, bytes, capacity, usize::from(*read) + 1);
});
