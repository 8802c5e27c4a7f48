//! `format = "debezium-json"` of the file source without the binary: the Kafka source's
//! Debezium fixture (`crate::changelog::fixtures`) as lines gives the Kafka source's rows
//! and bad events; a lane resumed at any of its positions hands out exactly the rest; the
//! options are checked as for Kafka, a file is never split, and a directory's files are
//! read by one lane in name order.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use sluice_config::{Located, OnError, Position, SourceConfig};
use sluice_runtime::metrics::SourceMetrics;
use sluice_runtime::{LaneContext, LanePoll, LaneReader, SourceFactory};
use sluice_types::SluiceError;

use super::envelopes::EnvelopeLines;
use super::{FileChangelog, FileOptions, FileSource, Tuning};
use crate::FileFormat;
use crate::changelog::fixtures::{DEBEZIUM_BAD, DEBEZIUM_EVENTS, DEBEZIUM_ROWS, rows_text};

/// Splits anything above 64 bytes into pieces of at least 16, reading 128-byte chunks.
const TINY: Tuning = Tuning { split_above_bytes: 64, min_piece_bytes: 16, chunk_bytes: 128 };

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("v", DataType::Utf8, true)]))
}

/// The fixture's events as lines, a tombstone as `kafka-console-consumer` prints it.
fn fixture_lines() -> String {
    DEBEZIUM_EVENTS.iter().map(|event| format!("{}\n", event.unwrap_or("null"))).collect()
}

/// The fixture's rows as `id|v|kind` (a file row has no event column).
fn fixture_rows() -> Vec<String> {
    DEBEZIUM_ROWS.iter().map(|(id, v, _, kind)| format!("{id}|{v}|{kind}")).collect()
}

/// The source `orders` reading `path` as `debezium-json` by primary key `id`.
fn source(dir: &Path, path: &str, on_error: OnError, threads: u32) -> Result<FileSource, SluiceError> {
    let mut config = SourceConfig::new("orders", "file");
    config.primary_key = Some(Located::new(vec!["id".to_string()], Position::new(5, 1)));
    config.on_error = on_error;
    let options = FileOptions { changelog: Some(FileChangelog::Debezium), ..FileOptions::new(path, FileFormat::Json) };
    FileSource::with_tuning(&config, &options, dir, threads, schema(), TINY, None)
}

fn open(source: &FileSource, lane: u32, start: Option<Vec<u8>>, metrics: &Arc<SourceMetrics>) -> Box<dyn LaneReader> {
    let context = LaneContext { lane, batch_size: 1, tables_needed: vec![true], metrics: Arc::clone(metrics), start };
    source.open_lane(context).expect("lane opens")
}

/// Every row a lane hands out (`id|v|kind`), and its position after each poll.
fn read(reader: &mut dyn LaneReader) -> Result<(Vec<String>, Vec<Vec<u8>>), SluiceError> {
    let (mut rows, mut positions) = (Vec::new(), Vec::new());
    loop {
        match reader.poll()? {
            LanePoll::Data { batches, .. } => {
                for (_, batch) in batches {
                    rows.extend(rows_text(&batch));
                }
                positions.push(reader.position());
            }
            LanePoll::Wait(_) => panic!("no rate"),
            LanePoll::Exhausted => return Ok((rows, positions)),
        }
    }
}

#[test]
fn debezium_lines_give_the_kafka_sources_rows_and_bad_events() {
    let mut envelopes = EnvelopeLines::new(schema(), crate::changelog::with_kinds_schema(&schema()), 2).expect("new");
    let (mut batches, mut bad) = (Vec::new(), Vec::new());
    envelopes.decode(fixture_lines().as_bytes(), 1, &mut batches, &mut bad).expect("decodes");
    let rows: Vec<String> = batches.iter().flat_map(rows_text).collect();
    assert_eq!(rows, fixture_rows());
    assert!(batches.iter().all(|batch| batch.num_rows() <= 2), "batches of at most the batch size");
    assert_eq!(bad.iter().map(|row| row.line).collect::<Vec<_>>(), DEBEZIUM_BAD, "bad events by their line");
    assert!(bad[0].reason.contains("`id`") && bad[0].text.contains("\"op\":\"u\""), "{:?}", bad[0]);
    assert!(bad[1].reason.contains("truncate"), "{:?}", bad[1]);
}

/// Blank lines, a `null` (a tombstone), CRLF line ends: no row and no bad row, and the
/// lines after them keep their numbers.
#[test]
fn tombstones_and_blank_lines_are_skipped_and_keep_line_numbers() {
    let mut envelopes = EnvelopeLines::new(schema(), crate::changelog::with_kinds_schema(&schema()), 8).expect("new");
    let chunk = "\n  \r\nnull\r\n null \n{\"after\":{\"id\":1,\"v\":\"a\"},\"op\":\"c\"}\r\n{\"op\":\"c\"}\nnul";
    let (mut batches, mut bad) = (Vec::new(), Vec::new());
    envelopes.decode(chunk.as_bytes(), 10, &mut batches, &mut bad).expect("decodes");
    assert_eq!(batches.iter().flat_map(rows_text).collect::<Vec<_>>(), ["1|a|0"]);
    let lines: Vec<u64> = bad.iter().map(|row| row.line).collect();
    assert_eq!(lines, [15, 16], "{bad:?}");
    assert!(bad[0].reason.contains("null or missing \"after\""), "{:?}", bad[0]);
}

#[test]
fn a_debezium_file_is_read_by_one_lane_with_the_bad_events_counted_or_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Larger than TINY's split size: it would be split into lanes if it were not a changelog.
    std::fs::write(dir.path().join("orders.jsonl"), fixture_lines()).expect("write");
    let skip = source(dir.path(), "orders.jsonl", OnError::Skip, 4).expect("source");
    assert_eq!(skip.lanes(), 1, "a key's changes stay in order");
    assert!(skip.describe().contains("debezium-json, updating, primary key [id]"), "{}", skip.describe());
    let metrics = Arc::new(SourceMetrics::new("orders", 1));
    let (rows, _) = read(open(&skip, 0, None, &metrics).as_mut()).expect("reads");
    assert_eq!(rows, fixture_rows());
    assert_eq!(metrics.bad_rows.load(Ordering::Relaxed), 2);
    let fail = source(dir.path(), "orders.jsonl", OnError::Fail, 4).expect("source");
    let error = read(open(&fail, 0, None, &metrics).as_mut()).expect_err("the bad update fails the lane");
    assert_eq!(error.code, "source.bad_row");
    assert!(error.message.contains("orders.jsonl:5: column `id`"), "{error}");
}

/// Exactly once: a lane resumed from the position it had after any poll (one row per
/// batch, so between the `-U` and the `+U` of an update too) hands out exactly the rows
/// it had not, across chunk boundaries and the bad events.
#[test]
fn a_lane_resumed_at_any_position_hands_out_exactly_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = fixture_lines().repeat(6);
    std::fs::write(dir.path().join("orders.jsonl"), &text).expect("write");
    assert!(text.len() > 4 * TINY.chunk_bytes, "several chunks");
    let first = source(dir.path(), "orders.jsonl", OnError::Skip, 1).expect("source");
    let metrics = Arc::new(SourceMetrics::new("orders", 1));
    let (all, positions) = read(open(&first, 0, None, &metrics).as_mut()).expect("reads");
    assert_eq!(all, (0..6).flat_map(|_| fixture_rows()).collect::<Vec<_>>());
    for (handed, position) in positions.iter().enumerate() {
        let resumed = source(dir.path(), "orders.jsonl", OnError::Skip, 1).expect("source");
        let (rest, _) = read(open(&resumed, 0, Some(position.clone()), &metrics).as_mut()).expect("reads");
        assert_eq!(rest, all[handed + 1..], "resumed after {} rows", handed + 1);
    }
}

/// As on Kafka, a primary key is required; a file is never split, so `split_bytes` is
/// refused; `header` and `delimiter` are CSV's.
#[test]
fn debezium_json_needs_a_primary_key_and_refuses_csv_and_split_options() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("orders.jsonl"), fixture_lines()).expect("write");
    let mut config = SourceConfig::new("orders", "file");
    config.on_error = OnError::Skip;
    let options =
        FileOptions { changelog: Some(FileChangelog::Debezium), ..FileOptions::new("orders.jsonl", FileFormat::Json) };
    let error = FileSource::with_tuning(&config, &options, dir.path(), 1, schema(), TINY, None).expect_err("no key");
    assert_eq!(error.code, "source.primary_key_missing");
    assert!(error.message.contains("format = \"debezium-json\""), "{error}");
    for (option, expected) in [
        ("split_bytes = 1024", "a changelog file is read by one lane"),
        ("header = true", "applies to csv files only"),
        ("delimiter = \";\"", "applies to csv files only"),
    ] {
        let text = format!(
            "[pipeline]\nname = \"p\"\n[[source]]\nname = \"s\"\nconnector = \"file\"\nformat = \"debezium-json\"\n\
             schema = \"id BIGINT\"\nprimary_key = [\"id\"]\n[source.options]\npath = \"x\"\n{option}\n"
        );
        let (parsed, _) = sluice_config::parse_partial(&text, "p.toml");
        let errors = super::options_of(&parsed.expect("parses").sources[0]).expect_err(option);
        let message = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
        assert!(message.contains(expected), "{option}: {message}");
    }
}

/// Key 100's Debezium update from `before` to `after`, as a line.
fn update_of_100(before: &str, after: &str) -> String {
    format!(
        "{{\"before\":{{\"id\":100,\"v\":\"{before}\"}},\"after\":{{\"id\":100,\"v\":\"{after}\"}},\"op\":\"u\"}}\n"
    )
}

/// A directory's files are read by one lane, one after another in name order, so a key's
/// changes may span files (as the `file` sink's parts of successive epochs hold them),
/// however many threads there are; a lane resumed at any position, in any file, hands
/// out exactly the rest.
#[test]
fn a_debezium_directory_is_read_by_one_lane_in_name_order_and_resumes_anywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("dump")).expect("mkdir");
    let created = "{\"before\":null,\"after\":{\"id\":100,\"v\":\"a\"},\"op\":\"c\"}\n";
    let files = [
        ("part-1.jsonl", format!("{}{created}", fixture_lines())),
        ("part-2.jsonl", format!("{}{}", update_of_100("a", "b"), fixture_lines())),
        ("part-3.jsonl", update_of_100("b", "c")),
    ];
    // Written last to first: the order read is the names'.
    for (name, text) in files.iter().rev() {
        std::fs::write(dir.path().join("dump").join(name), text).expect("write");
    }
    let metrics = Arc::new(SourceMetrics::new("orders", 1));
    let one_by_one: Vec<String> = files
        .iter()
        .flat_map(|(name, _)| {
            let file = source(dir.path(), &format!("dump/{name}"), OnError::Skip, 1).expect("source");
            read(open(&file, 0, None, &metrics).as_mut()).expect("reads").0
        })
        .collect();
    let chained = source(dir.path(), "dump", OnError::Skip, 8).expect("source");
    assert_eq!(
        chained.ranges().iter().map(|range| (range.file, range.start)).collect::<Vec<_>>(),
        [(0, 0), (1, 0), (2, 0)]
    );
    assert_eq!(chained.lanes(), 1, "one lane keeps a key's changes in order across files");
    let (all, positions) = read(open(&chained, 0, None, &metrics).as_mut()).expect("reads");
    assert_eq!(all, one_by_one);
    let key_100: Vec<&str> = all.iter().map(String::as_str).filter(|row| row.starts_with("100|")).collect();
    assert_eq!(key_100, ["100|a|0", "100|a|1", "100|b|2", "100|b|1", "100|c|2"]);
    for (handed, position) in positions.iter().enumerate() {
        let resumed = source(dir.path(), "dump", OnError::Skip, 8).expect("source");
        let (rest, _) = read(open(&resumed, 0, Some(position.clone()), &metrics).as_mut()).expect("reads");
        assert_eq!(rest, all[handed + 1..], "resumed after {} rows", handed + 1);
    }
}
