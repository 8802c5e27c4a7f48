//! The `debezium-json` decode rate per core against plain `json`, through the code the
//! Kafka source runs on each poll (`kafka::rows::RowBuilder::build`, a poll of
//! `batch_size` messages into one batch), without a broker: the same NEXMark-like bids as
//! plain JSON values, as Debezium create events (`op` "c", `before` null, `after` the
//! row, with a `source` block and `ts_ms` as Debezium's PostgreSQL connector writes
//! them), and as Debezium update events (`op` "u", `before` and `after`: two rows each,
//! -U and +U), and as upsert messages (the key a JSON object of the bid's auction and
//! bidder, the value the row), decoded on one thread.
//!
//! ```sh
//! cargo build --release -p sluice-connectors --features kafka --example decode_rate
//! decode_rate [MESSAGES] [REPEATS]    # default 1000000 messages, 5 repeats of each format
//! ```
//!
//! Each repeat of each format (alternated) prints one line: `format=F messages=N rows=R
//! bytes=B seconds=S rows_per_s=… mb_per_s=…` (bytes are the messages' values; MB are 10^6
//! bytes); then the median of each.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sluice_connectors::kafka::options::KafkaFormat;
use sluice_connectors::kafka::rows::{Message, RowBuilder};

const BATCH_SIZE: usize = 8192;
const CHANNELS: [&str; 4] = ["apple", "google", "facebook", "baidu"];

/// A small deterministic generator (splitmix64).
struct Mix(u64);

impl Mix {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// The bids as JSON objects (the columns of `schema()`), the extra field of 10 to 80
/// characters, as `sluice-formats`' decode benchmark makes them.
fn rows(n: usize) -> Vec<String> {
    let mut mix = Mix(42);
    (0..n as u64)
        .map(|i| {
            let channel = CHANNELS[mix.below(4) as usize];
            let millis = i * 7;
            let extra: String = (0..10 + mix.below(71)).map(|_| char::from(b'a' + mix.below(26) as u8)).collect();
            format!(
                "{{\"auction\":{},\"bidder\":{},\"price\":{},\"channel\":\"{channel}\",\"url\":\
                 \"https://www.nexmark.com/{channel}/item.htm?query=1&channel_id={}\",\"dateTime\":\
                 \"2026-01-01 {:02}:{:02}:{:02}.{:03}\",\"extra\":\"{extra}\"}}",
                1000 + mix.below(10_000),
                1000 + mix.below(100_000),
                mix.below(10_000_000),
                mix.below(1_000_000),
                millis / 3_600_000 % 24,
                millis / 60_000 % 60,
                millis / 1000 % 60,
                millis % 1000
            )
        })
        .collect()
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, true),
        Field::new("bidder", DataType::Int64, true),
        Field::new("price", DataType::Int64, true),
        Field::new("channel", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("dateTime", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("extra", DataType::Utf8, true),
    ]))
}

/// Debezium's `source` block and `ts_ms` for the `i`th change.
fn source_block(i: usize) -> String {
    format!(
        "\"source\":{{\"version\":\"2.7.0.Final\",\"connector\":\"postgresql\",\"name\":\"shop\",\"ts_ms\":{ts},\
         \"snapshot\":\"false\",\"db\":\"shop\",\"schema\":\"public\",\"table\":\"bids\",\"txId\":{tx},\
         \"lsn\":{lsn}}},\"ts_ms\":{ts}",
        ts = 1_767_225_600_000u64 + i as u64,
        tx = 1000 + i,
        lsn = 30_000_000 + 200 * i
    )
}

fn messages(values: Vec<String>) -> Vec<Message> {
    keyed(values.into_iter().map(|value| (None, value)).collect())
}

/// Messages of `(key, value)`s.
fn keyed(values: Vec<(Option<String>, String)>) -> Vec<Message> {
    values
        .into_iter()
        .enumerate()
        .map(|(offset, (key, value))| Message {
            value: Some(value.into_bytes()),
            key: key.map(String::into_bytes),
            partition: 0,
            offset: offset as i64,
            timestamp: None,
            headers: Vec::new(),
        })
        .collect()
}

/// Decodes every message, a poll of BATCH_SIZE at a time: (rows, seconds).
fn decode(format: KafkaFormat, messages: &[Message]) -> (usize, f64) {
    let mut builder = match RowBuilder::new(schema(), format, "bids", BATCH_SIZE) {
        Ok(builder) => builder,
        Err(error) => panic!("a row builder: {error}"),
    };
    let started = Instant::now();
    let mut rows = 0;
    for poll in messages.chunks(BATCH_SIZE) {
        let (batch, bad) = match builder.build(poll) {
            Ok(built) => built,
            Err(error) => panic!("decoding: {error}"),
        };
        assert!(bad.is_empty(), "bad messages: {:?}", &bad[..1]);
        rows += black_box(batch).map_or(0, |b| b.num_rows());
    }
    (rows, started.elapsed().as_secs_f64())
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let count = args.first().copied().unwrap_or(1_000_000);
    let repeats = args.get(1).copied().unwrap_or(5);
    let plain = rows(count);
    let created: Vec<String> = plain
        .iter()
        .enumerate()
        .map(|(i, row)| format!("{{\"before\":null,\"after\":{row},{},\"op\":\"c\"}}", source_block(i)))
        .collect();
    // An update's before image: the row with another price (the after image's row).
    let updated: Vec<String> = plain
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let before = row.replacen("\"price\":", "\"price\":1", 1);
            format!("{{\"before\":{before},\"after\":{row},{},\"op\":\"u\"}}", source_block(i))
        })
        .collect();
    // An upsert: the key is the row's auction and bidder, the value the whole row.
    let upserts: Vec<(Option<String>, String)> = plain
        .iter()
        .map(|row| {
            let field = |name: &str| {
                let start = row.find(&format!("\"{name}\":")).expect("a bid's field") + name.len() + 3;
                let end = start + row[start..].find(',').expect("a field after it");
                row[start..end].to_string()
            };
            (Some(format!("{{\"auction\":{},\"bidder\":{}}}", field("auction"), field("bidder"))), row.clone())
        })
        .collect();
    let formats = [
        ("json", KafkaFormat::Json, messages(plain)),
        ("upsert", KafkaFormat::Upsert, keyed(upserts)),
        ("debezium-json-c", KafkaFormat::DebeziumJson, messages(created)),
        ("debezium-json-u", KafkaFormat::DebeziumJson, messages(updated)),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); formats.len()];
    for _ in 0..=repeats {
        for (index, (name, format, messages)) in formats.iter().enumerate() {
            let bytes: usize = messages.iter().map(|m| m.value.as_ref().map_or(0, Vec::len)).sum();
            let (rows, seconds) = decode(*format, messages);
            println!(
                "format={name} messages={} rows={rows} bytes={bytes} seconds={seconds:.3} rows_per_s={:.0} \
                 messages_per_s={:.0} mb_per_s={:.1}",
                messages.len(),
                rows as f64 / seconds,
                messages.len() as f64 / seconds,
                bytes as f64 / seconds / 1e6
            );
            rates[index].push(rows as f64 / seconds);
        }
    }
    for ((name, _, _), rates) in formats.iter().zip(&rates) {
        // The first pass of each warms up; the median of the rest.
        let mut counted = rates[1..].to_vec();
        counted.sort_by(f64::total_cmp);
        println!(
            "median {name}: {:.0} rows/s (min {:.0}, max {:.0}, {} repeats)",
            counted[counted.len() / 2],
            counted[0],
            counted[counted.len() - 1],
            counted.len()
        );
    }
}
