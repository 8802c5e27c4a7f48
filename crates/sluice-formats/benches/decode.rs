//! Decode throughput: NEXMark bids (`auction,bidder,price,channel,url,dateTime,extra`)
//! from CSV and JSON lines into Arrow on one thread.
//!
//! The input is generated here: 200,000 bids of about 190 bytes per CSV row (as
//! NEXMark's: a url with three random path segments, an `extra` of random text of 30
//! to 100 characters), decoded in 4 MiB chunks as a file source does.
//!
//! The CSV group (`decode_bids_csv`, in bytes per second) sets the decoder against the
//! ceiling of copying the same bytes (`memory_copy`: 4 MiB at a time into a reused
//! buffer), with the one-pass fast path on and off: through the chunker (`chunker_*`,
//! as the file source reads), and on the chunks alone (`decoder_*`, cut beforehand).
//! The rows per second are the bytes per second over the bytes per row in the name.

use std::hint::black_box;
use std::time::Duration;

mod common;

use common::{CHANNELS, Mix, bid_schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_formats::{DEFAULT_CHUNK_BYTES, Decoder, DecoderOptions, LineChunker, RowFormat};

const ROWS: u64 = 200_000;

/// The fields of bid `i`: auction, bidder, price, channel, url, timestamp text, extra.
fn bid(mix: &mut Mix, i: u64) -> (u64, u64, u64, &'static str, String, String, String) {
    let auction = 1000 + mix.below(10_000);
    let bidder = 1000 + mix.below(100_000);
    let price = mix.below(10_000_000);
    let channel = CHANNELS[mix.below(4) as usize];
    let url = format!(
        "https://www.nexmark.com/{}/{}/{}/item.htm?query=1&channel_id={}",
        text(mix, 5),
        text(mix, 5),
        text(mix, 5),
        mix.below(1_000_000)
    );
    let millis = i * 7;
    let timestamp = format!(
        "2026-01-01 {:02}:{:02}:{:02}.{:03}",
        millis / 3_600_000 % 24,
        millis / 60_000 % 60,
        millis / 1000 % 60,
        millis % 1000
    );
    let length = 30 + mix.below(71) as usize;
    let extra = text(mix, length);
    (auction, bidder, price, channel, url, timestamp, extra)
}

/// `length` random letters and digits.
fn text(mix: &mut Mix, length: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..length).map(|_| char::from(ALPHABET[mix.below(ALPHABET.len() as u64) as usize])).collect()
}

fn csv_input() -> Vec<u8> {
    let mut mix = Mix(42);
    let mut out = String::new();
    for i in 0..ROWS {
        let (auction, bidder, price, channel, url, timestamp, extra) = bid(&mut mix, i);
        out.push_str(&format!("{auction},{bidder},{price},{channel},{url},{timestamp},{extra}\n"));
    }
    out.into_bytes()
}

fn json_input() -> Vec<u8> {
    let mut mix = Mix(42);
    let mut out = String::new();
    for i in 0..ROWS {
        let (auction, bidder, price, channel, url, timestamp, extra) = bid(&mut mix, i);
        out.push_str(&format!(
            "{{\"auction\":{auction},\"bidder\":{bidder},\"price\":{price},\"channel\":\"{channel}\",\
             \"url\":\"{url}\",\"dateTime\":\"{timestamp}\",\"extra\":\"{extra}\"}}\n"
        ));
    }
    out.into_bytes()
}

fn decoder(format: RowFormat, fast_path: bool) -> Decoder {
    let options = DecoderOptions { schema: bid_schema(), format, batch_size: 8192 };
    let Ok(mut decoder) = Decoder::new(options) else { panic!("decoder") };
    decoder.set_fast_path(fast_path);
    decoder
}

/// Decodes all of `input` in 4 MiB chunks; returns the rows decoded.
fn decode_all(format: RowFormat, input: &[u8], fast_path: bool) -> usize {
    let mut decoder = decoder(format, fast_path);
    let mut chunker = LineChunker::for_format(input, DEFAULT_CHUNK_BYTES, format);
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let mut rows = 0;
    while let Ok(Some((chunk, first_line))) = chunker.next_chunk() {
        if decoder.decode(chunk, first_line, &mut out, &mut bad).is_err() {
            panic!("decode");
        }
        rows += out.drain(..).map(|batch| black_box(batch).num_rows()).sum::<usize>();
    }
    assert!(bad.is_empty(), "the generated input is clean");
    rows
}

/// Cuts all of `input` into 4 MiB chunks without decoding them; returns the bytes and
/// line numbers handed out: the chunker's own cost.
fn chunk_all(format: RowFormat, input: &[u8]) -> u64 {
    let mut chunker = LineChunker::for_format(input, DEFAULT_CHUNK_BYTES, format);
    let mut sum = 0;
    while let Ok(Some((chunk, first_line))) = chunker.next_chunk() {
        sum += black_box(chunk).len() as u64 + first_line;
    }
    sum
}

/// `input` cut into 4 MiB chunks of whole records, with their first line numbers.
fn chunks(format: RowFormat, input: &[u8]) -> Vec<(Vec<u8>, u64)> {
    let mut chunker = LineChunker::for_format(input, DEFAULT_CHUNK_BYTES, format);
    let mut chunks = Vec::new();
    while let Ok(Some((chunk, first_line))) = chunker.next_chunk() {
        chunks.push((chunk.to_vec(), first_line));
    }
    chunks
}

/// Decodes the `chunks` with one decoder; returns the rows decoded.
fn decode_chunks(decoder: &mut Decoder, chunks: &[(Vec<u8>, u64)]) -> usize {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    let mut rows = 0;
    for (chunk, first_line) in chunks {
        if decoder.decode(chunk, *first_line, &mut out, &mut bad).is_err() {
            panic!("decode");
        }
        rows += out.drain(..).map(|batch| black_box(batch).num_rows()).sum::<usize>();
    }
    assert!(bad.is_empty(), "the generated input is clean");
    rows
}

/// Copies `input` 4 MiB at a time into `buffer`: the ceiling of any decoder.
fn copy_all(input: &[u8], buffer: &mut Vec<u8>) -> usize {
    let mut copied = 0;
    for piece in input.chunks(DEFAULT_CHUNK_BYTES) {
        buffer.clear();
        buffer.extend_from_slice(piece);
        copied += black_box(&buffer).len();
    }
    copied
}

fn decode_csv(c: &mut Criterion) {
    let csv = csv_input();
    let format = RowFormat::Csv { header: false, delimiter: b',' };
    let mut group = c.benchmark_group("decode_bids_csv");
    group.throughput(Throughput::Bytes(csv.len() as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let per_row = csv.len() as u64 / ROWS;
    let mut buffer = Vec::with_capacity(DEFAULT_CHUNK_BYTES);
    group.bench_function(format!("memory_copy_{per_row}_bytes_per_row"), |b| {
        b.iter(|| copy_all(black_box(&csv), &mut buffer))
    });
    for fast_path in [false, true] {
        let path = if fast_path { "fast" } else { "old" };
        assert_eq!(decode_all(format, &csv, fast_path), ROWS as usize);
        group.bench_function(format!("chunker_{path}_{per_row}_bytes_per_row"), |b| {
            b.iter(|| decode_all(format, black_box(&csv), fast_path))
        });
    }
    group.bench_function(format!("chunker_alone_{per_row}_bytes_per_row"), |b| {
        b.iter(|| chunk_all(format, black_box(&csv)))
    });
    let chunks = chunks(format, &csv);
    for fast_path in [false, true] {
        let path = if fast_path { "fast" } else { "old" };
        let mut decoder = decoder(format, fast_path);
        assert_eq!(decode_chunks(&mut decoder, &chunks), ROWS as usize);
        assert_eq!(decoder.slow_chunks(), 0);
        group.bench_function(format!("decoder_{path}_{per_row}_bytes_per_row"), |b| {
            b.iter(|| decode_chunks(&mut decoder, black_box(&chunks)))
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_bids");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    let csv = csv_input();
    let csv_format = RowFormat::Csv { header: false, delimiter: b',' };
    assert_eq!(decode_all(csv_format, &csv, true), ROWS as usize);
    group.bench_function(format!("csv_{}_bytes_per_row", csv.len() as u64 / ROWS), |b| {
        b.iter(|| decode_all(csv_format, black_box(&csv), true))
    });
    let json = json_input();
    group.bench_function(format!("json_{}_bytes_per_row", json.len() as u64 / ROWS), |b| {
        b.iter(|| decode_all(RowFormat::Json, black_box(&json), true))
    });
    group.finish();
}

criterion_group!(benches, decode_csv, decode);
criterion_main!(benches);
