//! JSON lines decode throughput against the memory-copy ceiling, on one thread: NEXMark
//! bids (`auction,bidder,price,channel,url,dateTime,extra`) of about 190-250 bytes as
//! JSON lines, copied (the ceiling), decoded with the fast path off (the reference
//! path: Arrow's decoder with the audits) and on (`src/fast_json.rs`), in bytes of input
//! per second (MB/s); rows per second are that over the bytes per row in the group's name.
//!
//! The input is generated here: 100,000 bids, decoded in 4 MiB chunks as a file source
//! does. Run: `cargo bench -p sluice-formats --bench decode_json`.

use std::hint::black_box;
use std::time::Duration;

mod common;

use common::{CHANNELS, Mix, bid_schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_formats::{DEFAULT_CHUNK_BYTES, Decoder, DecoderOptions, LineChunker, RowFormat};

const ROWS: u64 = 100_000;
const EXTRA_CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ";

/// The bids as JSON lines, the extra field of 10 to 80 random characters.
fn input() -> Vec<u8> {
    let mut mix = Mix(42);
    let mut out = String::new();
    for i in 0..ROWS {
        let auction = 1000 + mix.below(10_000);
        let bidder = 1000 + mix.below(100_000);
        let price = mix.below(10_000_000);
        let channel = CHANNELS[mix.below(4) as usize];
        let url = format!("https://www.nexmark.com/{channel}/item.htm?query=1&channel_id={}", mix.below(1_000_000));
        let millis = i * 7;
        let date_time = format!(
            "2026-01-01 {:02}:{:02}:{:02}.{:03}",
            millis / 3_600_000 % 24,
            millis / 60_000 % 60,
            millis / 1000 % 60,
            millis % 1000
        );
        let length = 10 + mix.below(71);
        let extra: String =
            (0..length).map(|_| char::from(EXTRA_CHARS[mix.below(EXTRA_CHARS.len() as u64) as usize])).collect();
        out.push_str(&format!(
            "{{\"auction\":{auction},\"bidder\":{bidder},\"price\":{price},\"channel\":\"{channel}\",\
             \"url\":\"{url}\",\"dateTime\":\"{date_time}\",\"extra\":\"{extra}\"}}\n"
        ));
    }
    out.into_bytes()
}

/// Decodes all of `input` in 4 MiB chunks with the fast path on or off; returns the rows.
fn decode_all(input: &[u8], fast: bool) -> usize {
    let options = DecoderOptions { schema: bid_schema(), format: RowFormat::Json, batch_size: 8192 };
    let Ok(mut decoder) = Decoder::new(options) else { panic!("decoder") };
    decoder.set_fast_path(fast);
    let mut chunker = LineChunker::for_format(input, DEFAULT_CHUNK_BYTES, RowFormat::Json);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let mut rows = 0;
    while let Ok(Some((chunk, first_line))) = chunker.next_chunk() {
        if decoder.decode(chunk, first_line, &mut out, &mut bad).is_err() {
            panic!("decode");
        }
        rows += out.drain(..).map(|batch| black_box(batch).num_rows()).sum::<usize>();
    }
    assert!(bad.is_empty() && decoder.slow_chunks() == 0, "the generated input is clean");
    rows
}

fn decode_json(c: &mut Criterion) {
    let input = input();
    let bytes_per_row = input.len() as u64 / ROWS;
    assert_eq!(decode_all(&input, false), ROWS as usize);
    assert_eq!(decode_all(&input, true), ROWS as usize);
    let mut group = c.benchmark_group(format!("decode_json_bids_{bytes_per_row}_bytes_per_row"));
    group.throughput(Throughput::BytesDecimal(input.len() as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    let mut copy = vec![0u8; input.len()];
    group.bench_function("memory_copy", |b| {
        b.iter(|| {
            copy.copy_from_slice(black_box(&input));
            black_box(&copy);
        })
    });
    group.bench_function("reference", |b| b.iter(|| decode_all(black_box(&input), false)));
    group.bench_function("fast_path", |b| b.iter(|| decode_all(black_box(&input), true)));
    group.finish();
}

criterion_group!(benches, decode_json);
criterion_main!(benches);
