//! Decode throughput: NEXMark bids (`auction,bidder,price,channel,url,dateTime,extra`)
//! from CSV and JSON lines into Arrow, in rows per second on one thread.
//!
//! The input is generated here: 200,000 bids of about 120 bytes per CSV row, decoded in
//! 4 MiB chunks as a file source does.

use std::hint::black_box;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_formats::{DEFAULT_CHUNK_BYTES, Decoder, DecoderOptions, LineChunker, RowFormat};

const ROWS: u64 = 200_000;
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("dateTime", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        Field::new("extra", DataType::Utf8, true),
    ]))
}

/// A deterministic pseudo-random sequence (SplitMix64).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The fields of bid `i`: auction, bidder, price, channel, url, timestamp text, extra.
fn bid(mix: &mut Mix, i: u64) -> (u64, u64, u64, &'static str, String, String, String) {
    let auction = 1000 + mix.next() % 10_000;
    let bidder = 1000 + mix.next() % 100_000;
    let price = mix.next() % 10_000_000;
    let channel = CHANNELS[(mix.next() % 4) as usize];
    let url = format!("https://www.nexmark.com/item.htm?query=1&channel_id={}", mix.next() % 1_000_000);
    let millis = i * 7;
    let timestamp = format!(
        "2026-01-01 {:02}:{:02}:{:02}.{:03}",
        millis / 3_600_000 % 24,
        millis / 60_000 % 60,
        millis / 1000 % 60,
        millis % 1000
    );
    let extra = if i.is_multiple_of(10) { "abcdefgh".to_string() } else { String::new() };
    (auction, bidder, price, channel, url, timestamp, extra)
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

/// Decodes all of `input` in 4 MiB chunks; returns the rows decoded.
fn decode_all(format: RowFormat, input: &[u8]) -> usize {
    let options = DecoderOptions { schema: bid_schema(), format, batch_size: 8192 };
    let Ok(mut decoder) = Decoder::new(options) else { panic!("decoder") };
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

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_bids");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    let csv = csv_input();
    let csv_format = RowFormat::Csv { header: false, delimiter: b',' };
    assert_eq!(decode_all(csv_format, &csv), ROWS as usize);
    group.bench_function(format!("csv_{}_bytes_per_row", csv.len() as u64 / ROWS), |b| {
        b.iter(|| decode_all(csv_format, black_box(&csv)))
    });
    let json = json_input();
    group.bench_function(format!("json_{}_bytes_per_row", json.len() as u64 / ROWS), |b| {
        b.iter(|| decode_all(RowFormat::Json, black_box(&json)))
    });
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
