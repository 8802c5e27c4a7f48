//! The broker's own rate, without Sluice: how fast the same client library Sluice uses
//! (librdkafka through `rdkafka`) writes the lines of a file to a topic, and reads a
//! topic back. `scripts/kafka-bench.sh` runs it beside Sluice's own Kafka pipelines, as
//! the ceiling they are measured against.
//!
//! ```sh
//! kafka_rate produce BROKERS TOPIC PARTITIONS FILE   # one message per line, round robin
//! kafka_rate consume BROKERS TOPIC PARTITIONS COUNT  # from the first offset until COUNT
//! ```
//!
//! Each prints one line: `messages=N bytes=B seconds=S messages_per_s=R mb_per_s=M`
//! (bytes are the values' bytes; MB are 10^6 bytes).

use std::io::BufRead;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// How long one poll, the final flush and a silent consumer may wait.
const POLL: Duration = Duration::from_millis(100);
const FLUSH: Duration = Duration::from_secs(120);
const SILENCE: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["produce", brokers, topic, partitions, file] => {
            partitions_of(partitions).and_then(|partitions| produce(brokers, topic, partitions, file))
        }
        ["consume", brokers, topic, partitions, count] => partitions_of(partitions).and_then(|partitions| {
            let count = count.parse().map_err(|_| format!("COUNT must be a number, not {count:?}"))?;
            consume(brokers, topic, partitions, count)
        }),
        _ => Err("usage: kafka_rate produce BROKERS TOPIC PARTITIONS FILE | consume BROKERS TOPIC PARTITIONS COUNT"
            .to_owned()),
    };
    match outcome {
        Ok((messages, bytes, elapsed)) => {
            let seconds = elapsed.as_secs_f64();
            println!(
                "messages={messages} bytes={bytes} seconds={seconds:.3} messages_per_s={:.0} mb_per_s={:.1}",
                messages as f64 / seconds,
                bytes as f64 / seconds / 1e6
            );
        }
        Err(error) => {
            eprintln!("kafka_rate: {error}");
            std::process::exit(1);
        }
    }
}

fn partitions_of(text: &str) -> Result<i32, String> {
    text.parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("PARTITIONS must be 1 or more, not {text:?}"))
}

/// Writes every line of `file` (read into memory first, so the disk is not measured).
fn produce(brokers: &str, topic: &str, partitions: i32, file: &str) -> Result<(u64, u64, Duration), String> {
    let reader = std::fs::File::open(file).map_err(|e| format!("opening {file}: {e}"))?;
    let lines: Vec<String> = std::io::BufReader::new(reader)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading {file}: {e}"))?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| format!("creating the producer: {e}"))?;
    let started = Instant::now();
    let mut bytes = 0u64;
    for (index, line) in lines.iter().enumerate() {
        let partition = (index % partitions as usize) as i32;
        let mut record: BaseRecord<'_, (), str> = BaseRecord::to(topic).partition(partition).payload(line.as_str());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(POLL);
                }
                Err((error, _)) => return Err(format!("sending line {}: {error}", index + 1)),
            }
        }
        bytes += line.len() as u64;
    }
    producer.flush(FLUSH).map_err(|e| format!("flushing: {e}"))?;
    Ok((lines.len() as u64, bytes, started.elapsed()))
}

/// Reads every partition from its first offset until `count` messages arrived.
fn consume(brokers: &str, topic: &str, partitions: i32, count: u64) -> Result<(u64, u64, Duration), String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "kafka-rate")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| format!("creating the consumer: {e}"))?;
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment.add_partition_offset(topic, partition, Offset::Beginning).map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| format!("assigning {topic}: {e}"))?;
    let started = Instant::now();
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut last = Instant::now();
    while messages < count {
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                messages += 1;
                bytes += message.payload().map_or(0, <[u8]>::len) as u64;
                last = Instant::now();
            }
            Some(Err(error)) => return Err(format!("reading {topic}: {error}")),
            None if last.elapsed() > SILENCE => {
                return Err(format!("{topic} held {messages} messages, not {count}: nothing more came in {SILENCE:?}"));
            }
            None => {}
        }
    }
    Ok((messages, bytes, started.elapsed()))
}
