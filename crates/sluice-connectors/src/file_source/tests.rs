use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use sluice_config::{OnError, SourceConfig};
use sluice_runtime::metrics::SourceMetrics;
use sluice_runtime::{LaneContext, LanePoll, SourceFactory};
use sluice_types::{SluiceError, TimestampMs};

use super::{FileOptions, FileSource, LaneRange, Tuning, split};
use crate::FileFormat;

/// Splits anything above 64 bytes into pieces of at least 16, reading 256-byte chunks.
const TINY: Tuning = Tuning { split_above_bytes: 64, min_piece_bytes: 16, chunk_bytes: 256 };

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// The source "events" (event time `ts`, watermark delay 1 s) reading `path` in
/// `format` (CSV with a header line).
fn config(path: &str, format: FileFormat, on_error: OnError) -> (SourceConfig, FileOptions) {
    let mut config = SourceConfig::new("events", "file");
    config.event_time = Some("ts".into());
    config.watermark_delay = Duration::from_secs(1);
    config.on_error = on_error;
    let options = FileOptions { header: true, ..FileOptions::new(path, format) };
    (config, options)
}

/// What reading every lane of a source gave.
#[derive(Debug, Default)]
struct Read {
    /// The `id` of every row, sorted.
    ids: Vec<i64>,
    bad_rows: u64,
    /// The watermarks of each lane, in order.
    watermarks: Vec<Vec<TimestampMs>>,
    /// The first error, if a lane failed.
    error: Option<SluiceError>,
}

fn read_all(source: &FileSource, batch_size: usize) -> Read {
    let metrics = Arc::new(SourceMetrics::new("events", source.lanes()));
    let mut read = Read::default();
    for lane in 0..source.lanes() {
        let context =
            LaneContext { lane, batch_size, tables_needed: vec![true], metrics: Arc::clone(&metrics), start: None };
        let mut reader = source.open_lane(context).expect("lane opens");
        let mut watermarks = Vec::new();
        loop {
            match reader.poll() {
                Ok(LanePoll::Data { batches, watermark }) => {
                    for (table, batch) in batches {
                        assert_eq!(table, 0);
                        assert!(batch.num_rows() <= batch_size);
                        read.ids.extend(batch.column(0).as_primitive::<Int64Type>().values().iter());
                    }
                    watermarks.extend(watermark);
                }
                Ok(LanePoll::Wait(_)) => panic!("a file lane never waits"),
                Ok(LanePoll::Exhausted) => break,
                Err(error) => {
                    read.error.get_or_insert(error);
                    break;
                }
            }
        }
        read.watermarks.push(watermarks);
    }
    read.ids.sort_unstable();
    read.bad_rows = metrics.bad_rows.load(Ordering::Relaxed);
    read
}

/// A CSV row of fixed width: `000042,n00042,2026-01-01 00:00:42.000`; a bad one has an
/// id that is not a number (same width, so the layout does not depend on it).
fn csv_row(id: i64, bad: bool) -> String {
    let seconds = id % 60;
    let minutes = id / 60 % 60;
    let id_field = if bad { format!("x{:05}", id) } else { format!("{:06}", id) };
    format!("{id_field},n{id:05},2026-01-01 00:{minutes:02}:{seconds:02}.000\n")
}

/// A CSV file of `rows` rows (ids 1..=rows, on lines 2..) with the given ids bad.
fn write_csv(path: &Path, rows: i64, bad: &[i64]) {
    // The header is padded to the width of a row, so lanes can end on line starts.
    let mut text = format!("{:<36}\n", "id,name,ts");
    for id in 1..=rows {
        text.push_str(&csv_row(id, bad.contains(&id)));
    }
    std::fs::write(path, text).expect("write csv");
}

fn csv_source(dir: &Path, threads: u32, on_error: OnError, tuning: Tuning) -> FileSource {
    let (config, options) = config("data.csv", FileFormat::Csv, on_error);
    FileSource::with_tuning(&config, &options, dir, threads, schema(), tuning, None).expect("source")
}

/// The 1-based line holding byte `offset` of the file.
fn line_of(bytes: &[u8], offset: u64) -> i64 {
    bytes[..offset as usize].iter().filter(|b| **b == b'\n').count() as i64 + 1
}

/// The lines around every lane boundary: the line holding the boundary's last byte
/// before it, and the one holding its first byte.
fn boundary_lines(path: &Path, ranges: &[LaneRange]) -> Vec<i64> {
    let bytes = std::fs::read(path).expect("read back");
    let mut lines: Vec<i64> = ranges
        .iter()
        .filter(|range| range.start > 0)
        .flat_map(|range| [line_of(&bytes, range.start - 1), line_of(&bytes, range.start)])
        .collect();
    lines.dedup();
    lines
}

#[test]
fn a_directory_of_json_files_is_read_once_in_name_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("nested")).expect("mkdir");
    let row = |id: i64| format!("{{\"id\":{id},\"name\":\"n{id}\",\"ts\":\"2026-01-01 00:00:{:02}\"}}\n", id % 60);
    let file = |ids: std::ops::Range<i64>| ids.map(row).collect::<String>();
    std::fs::write(data.join("b.json"), file(10..20)).expect("write");
    std::fs::write(data.join("a.json"), file(0..10)).expect("write");
    std::fs::write(data.join("c.jsonl"), file(20..25)).expect("write");
    std::fs::write(data.join(".hidden.json"), file(100..110)).expect("write");
    std::fs::write(data.join("nested/d.json"), file(200..210)).expect("write");

    let (config, options) = config("data", FileFormat::Json, OnError::Fail);
    let source = FileSource::new(&config, &options, dir.path(), 2, schema(), None).expect("source");
    let names: Vec<String> =
        source.files().iter().map(|f| f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string()).collect();
    assert_eq!(names, ["a.json", "b.json", "c.jsonl"]);
    assert_eq!(source.lanes(), 3);
    assert_eq!(source.describe(), "file(path=data, json, 3 files)");
    assert_eq!(source.tables()[0].name, "events");

    let read = read_all(&source, 4);
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.ids, (0..25).collect::<Vec<_>>());
    // Lane 0 reads a.json: event times up to 00:00:09, minus the 1 s delay.
    let base = 1_767_225_600_000;
    assert_eq!(read.watermarks[0].last(), Some(&(base + 8_000)));
    assert!(read.watermarks.iter().all(|w| w.windows(2).all(|p| p[0] <= p[1])));
}

#[test]
fn a_split_csv_file_reads_every_row_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    let bad = [7, 150, 151, 299];
    write_csv(&path, 300, &bad);
    let whole = read_all(&csv_source(dir.path(), 1, OnError::Skip, Tuning::default()), 64);
    assert_eq!(whole.bad_rows, 4);
    assert_eq!(whole.ids.len(), 296);
    for threads in [2, 3, 7, 16] {
        let source = csv_source(dir.path(), threads, OnError::Skip, TINY);
        assert_eq!(source.lanes(), threads, "one file split into {threads} lanes");
        let read = read_all(&source, 64);
        assert!(read.error.is_none());
        assert_eq!(read.ids, whole.ids, "{threads} lanes read every row exactly once");
        assert_eq!(read.bad_rows, 4);
    }
}

#[test]
fn bad_rows_near_lane_boundaries_report_their_file_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    // 301 lines of 37 bytes: 7 lanes end on line starts, 4 and 9 inside lines.
    write_csv(&path, 300, &[]);
    for threads in [4, 7, 9] {
        let ranges = csv_source(dir.path(), threads, OnError::Fail, TINY).ranges().to_vec();
        for line in boundary_lines(&path, &ranges) {
            let id = line - 1;
            write_csv(&path, 300, &[id]);
            let source = csv_source(dir.path(), threads, OnError::Fail, TINY);
            assert_eq!(source.ranges(), ranges.as_slice(), "bad rows do not move boundaries");
            let read = read_all(&source, 16);
            let error = read.error.expect("the bad row fails the lane");
            let text = csv_row(id, true);
            let expected = format!("{}:{line}: ", path.display());
            assert!(error.message.contains(&expected), "line {line}: {}", error.message);
            assert!(error.message.contains(text.trim_end()), "{}", error.message);
        }
    }
}

#[test]
fn a_record_longer_than_the_buffer_in_a_mid_file_lane_reports_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    let mut text = String::from("id,name,ts\n");
    for id in 1..=100 {
        if id == 80 {
            text.push_str(&format!("{id},{},2026-01-01\n", "y".repeat(400)));
        } else {
            text.push_str(&csv_row(id, false));
        }
    }
    std::fs::write(&path, text).expect("write");
    let source = csv_source(dir.path(), 3, OnError::Fail, TINY);
    assert_eq!(source.lanes(), 3);
    let error = read_all(&source, 16).error.expect("fails");
    assert!(error.message.contains(&format!("{}:81: record longer than", path.display())), "{}", error.message);
}

#[test]
fn the_fail_policy_names_file_line_reason_text_and_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_csv(&dir.path().join("data.csv"), 20, &[12]);
    let source = csv_source(dir.path(), 1, OnError::Fail, Tuning::default());
    let read = read_all(&source, 100);
    let error = read.error.expect("fails");
    assert_eq!(error.code, "source.bad_row");
    assert_eq!(error.domain, sluice_types::Domain::User);
    assert!(error.message.starts_with("bad row at "), "{}", error.message);
    assert!(error.message.contains("data.csv:13: "), "{}", error.message);
    assert!(error.message.contains("`id`"), "the reason names the column: {}", error.message);
    assert!(error.message.contains("x00012,n00012"), "{}", error.message);
    let fix = error.fix.expect("a fix");
    assert!(fix.contains("set on_error = \"skip\" to count and skip bad rows"), "{fix}");
    assert_eq!(read.bad_rows, 1);
}

#[test]
fn skipped_rows_are_counted_and_the_rest_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_csv(&dir.path().join("data.csv"), 50, &[1, 2, 3, 4, 5, 6, 7, 50]);
    let read = read_all(&csv_source(dir.path(), 1, OnError::Skip, Tuning::default()), 10);
    assert!(read.error.is_none());
    assert_eq!(read.bad_rows, 8);
    assert_eq!(read.ids, (8..50).collect::<Vec<_>>());
}

#[test]
fn a_missing_path_or_an_empty_directory_is_a_user_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, options) = config("nowhere/data.csv", FileFormat::Csv, OnError::Skip);
    let error = FileSource::new(&config, &options, dir.path(), 1, schema(), None).expect_err("missing");
    assert_eq!(error.code, "source.path");
    assert!(
        error.message.contains("nowhere/data.csv") && error.message.contains("does not exist"),
        "{}",
        error.message
    );
    assert!(error.fix.is_some_and(|fix| fix.contains("path")));

    std::fs::create_dir(dir.path().join("empty")).expect("mkdir");
    std::fs::write(dir.path().join("empty/.keep"), "").expect("write");
    let (config, options) = self::config("empty", FileFormat::Json, OnError::Skip);
    let error = FileSource::new(&config, &options, dir.path(), 1, schema(), None).expect_err("empty");
    assert!(error.message.contains("holds no data file"), "{}", error.message);
}

#[test]
fn an_event_time_that_is_not_a_timestamp_column_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_csv(&dir.path().join("data.csv"), 1, &[]);
    let (mut config, options) = config("data.csv", FileFormat::Csv, OnError::Skip);
    config.event_time = Some("id".into());
    let error = FileSource::new(&config, &options, dir.path(), 1, schema(), None).expect_err("not a timestamp");
    assert_eq!(error.code, "source.event_time");
    config.event_time = Some("nope".into());
    assert!(FileSource::new(&config, &options, dir.path(), 1, schema(), None).is_err());
}

#[test]
fn a_lane_of_an_unneeded_table_reads_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_csv(&dir.path().join("data.csv"), 5, &[]);
    let source = csv_source(dir.path(), 1, OnError::Skip, Tuning::default());
    let metrics = Arc::new(SourceMetrics::new("events", 1));
    let context = LaneContext { lane: 0, batch_size: 8, tables_needed: vec![false], metrics, start: None };
    let mut lane = source.open_lane(context).expect("opens");
    assert!(matches!(lane.poll(), Ok(LanePoll::Exhausted)));
}

#[test]
fn large_files_are_split_until_threads_are_used() {
    let tuning = Tuning::default();
    let mib = 1 << 20;
    let ranges = split(&[100 * mib, mib], 4, tuning);
    let files: Vec<usize> = ranges.iter().map(|r| r.file).collect();
    assert_eq!(files, [0, 0, 0, 1]);
    assert_eq!((ranges[0].start, ranges[2].end, ranges[3].end), (0, 100 * mib, mib));
    assert!(ranges[..3].windows(2).all(|w| w[0].end == w[1].start), "contiguous pieces");
    // More files than threads: one lane per file.
    assert_eq!(split(&[20 * mib; 8], 4, tuning).len(), 8);
    // Small files are never split.
    assert_eq!(split(&[8 * mib, 100], 16, tuning).len(), 2);
    // Pieces never go below the minimum.
    assert_eq!(split(&[9 * mib], 64, tuning).len(), 9);
}

/// A CSV file of `rows` rows whose `name` is quoted and spans three lines, with a
/// delimiter and doubled quotes in it: most bytes are inside quotes.
fn write_multi_line_csv(path: &Path, rows: i64) {
    let mut text = String::from("id,name,ts\n");
    for id in 1..=rows {
        let seconds = id % 60;
        text.push_str(&format!(
            "{id},\"n{id}\nsecond line, with a comma\r\nthird \"\"quoted\"\" line\",2026-01-01 00:00:{seconds:02}.000\n"
        ));
    }
    std::fs::write(path, text).expect("write csv");
}

#[test]
fn a_split_csv_file_never_starts_a_lane_inside_a_quoted_field_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    write_multi_line_csv(&path, 300);
    let bytes = std::fs::read(&path).expect("read back");
    for threads in [2, 3, 5, 8, 16] {
        let source = csv_source(dir.path(), threads, OnError::Fail, TINY);
        assert_eq!(source.lanes(), threads);
        for range in source.ranges().iter().filter(|range| range.start > 0) {
            let before = &bytes[..range.start as usize];
            let quotes = before.iter().filter(|b| **b == b'"').count();
            assert!(before.ends_with(b"\n") && quotes % 2 == 0, "{threads} lanes: {range:?} starts inside a record");
        }
        let read = read_all(&source, 16);
        assert!(read.error.is_none(), "{threads} lanes: {:?}", read.error);
        assert_eq!(read.ids, (1..=300).collect::<Vec<_>>(), "{threads} lanes read every row exactly once");
    }
}

/// Planning a CSV source with a header over `dir`, expecting a `source.csv_header` error.
fn header_error(dir: &Path, path: &str) -> SluiceError {
    let (config, options) = config(path, FileFormat::Csv, OnError::Skip);
    let error = FileSource::new(&config, &options, dir, 4, schema(), None).expect_err("the header does not match");
    assert_eq!(error.code, "source.csv_header");
    assert_eq!(error.domain, sluice_types::Domain::User);
    let fix = error.fix.clone().expect("a fix");
    assert_eq!(fix, "rename the column in `schema`, or set header = false if the file has no header line");
    error
}

#[test]
fn a_csv_header_that_does_not_match_the_schema_fails_planning_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    std::fs::write(&path, "id,nme,ts\n1,a,2026-01-01 00:00:00\n").expect("write");
    let error = header_error(dir.path(), "data.csv");
    let expected = format!(
        "{}: the CSV header does not match the schema: line 1 names column 2 \"nme\", the schema names it \"name\"",
        path.display()
    );
    assert!(error.message.starts_with(&expected), "{}", error.message);
    // One bad file of a directory fails the source and is named.
    let data = dir.path().join("dir");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("a.csv"), "id,name,ts\n1,a,2026-01-01 00:00:00\n").expect("write");
    std::fs::write(data.join("b.csv"), "id,name\n1,a\n").expect("write");
    let error = header_error(dir.path(), "dir");
    assert!(
        error.message.contains("b.csv: ") && error.message.contains("column 3 \"ts\" is missing"),
        "{}",
        error.message
    );
}

#[test]
fn a_data_row_where_the_csv_header_should_be_fails_planning_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("data.csv"), csv_row(1, false) + &csv_row(2, false)).expect("write");
    let error = header_error(dir.path(), "data.csv");
    assert!(
        error.message.contains("line 1 names column 1 \"000001\", the schema names it \"id\""),
        "{}",
        error.message
    );
}

/// The fix of a header line read as data (`header = false`).
const FORGOTTEN_HEADER_FIX: &str = "set header = true; if that line really is data, rename a column in `schema`";

#[test]
fn a_csv_header_read_as_data_fails_planning_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("a.csv"), csv_row(1, false)).expect("write");
    std::fs::write(data.join("b.csv"), format!("\u{feff}id, name ,\"ts\"\r\n{}", csv_row(2, false))).expect("write");
    let (mut config, mut options) = config("data", FileFormat::Csv, OnError::Skip);
    options.header = false;
    config.event_time = None;
    let varchar = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", DataType::Utf8, false),
    ]));
    // A bad row with the declared types, a silent data row with VARCHAR columns.
    for schema in [schema(), varchar] {
        let error = FileSource::new(&config, &options, dir.path(), 4, schema, None).expect_err("a header read as data");
        assert_eq!(error.code, "source.csv_header");
        assert_eq!(error.domain, sluice_types::Domain::User);
        assert_eq!(error.fix.as_deref(), Some(FORGOTTEN_HEADER_FIX));
        let file = format!("{}: ", data.join("b.csv").display());
        assert!(error.message.starts_with(&file) && error.message.contains("header = false"), "{}", error.message);
    }
    std::fs::write(data.join("b.csv"), csv_row(2, false)).expect("write");
    let source = FileSource::new(&config, &options, dir.path(), 4, schema(), None).expect("only data rows");
    let read = read_all(&source, 8);
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.ids, [1, 2]);
}

#[test]
fn a_csv_header_read_as_data_from_a_pipe_fails_its_lane_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("events.csv");
    make_fifo(&fifo);
    let (config, mut options) = config("events.csv", FileFormat::Csv, OnError::Skip);
    options.header = false;
    let source = FileSource::new(&config, &options, dir.path(), 1, schema(), None).expect("planning reads nothing");
    let writer = feed(&fifo, format!("id,name,ts\n{}", csv_row(1, false)));
    let read = read_all(&source, 8);
    let _ = writer.join();
    let error = read.error.expect("the header line is refused");
    assert_eq!(error.code, "source.csv_header");
    assert_eq!(error.fix.as_deref(), Some(FORGOTTEN_HEADER_FIX));
    assert!(error.message.contains("events.csv"), "{}", error.message);
}

#[test]
fn csv_headers_with_quotes_spaces_a_byte_order_mark_or_no_rows_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("a.csv"), format!(" \"id\" , name ,ts\r\n{}", csv_row(1, false))).expect("write");
    std::fs::write(data.join("b.csv"), format!("\u{feff}id,name,ts\n{}", csv_row(2, false))).expect("write");
    std::fs::write(data.join("c.csv"), "").expect("write");
    let (config, options) = config("data", FileFormat::Csv, OnError::Fail);
    let source = FileSource::new(&config, &options, dir.path(), 1, schema(), None).expect("the headers match");
    let read = read_all(&source, 8);
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.ids, [1, 2]);
}

#[test]
fn a_byte_order_mark_at_the_start_of_a_file_is_skipped_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let row = |id: i64| format!("{{\"id\":{id},\"name\":\"n{id}\",\"ts\":\"2026-01-01 00:00:{:02}\"}}\n", id % 60);
    let text: String = std::iter::once("\u{feff}".to_string()).chain((1..=40).map(row)).collect();
    std::fs::write(dir.path().join("data.json"), text).expect("write");
    let (json, json_options) = config("data.json", FileFormat::Json, OnError::Fail);
    for (threads, tuning) in [(1, Tuning::default()), (4, TINY)] {
        let source =
            FileSource::with_tuning(&json, &json_options, dir.path(), threads, schema(), tuning, None).expect("source");
        assert_eq!(source.lanes(), threads);
        let read = read_all(&source, 8);
        assert!(read.error.is_none(), "{threads} lanes: {:?}", read.error);
        assert_eq!(read.ids, (1..=40).collect::<Vec<_>>());
    }
    // A CSV file without a header, split at its first record after the mark.
    std::fs::write(
        dir.path().join("data.csv"),
        format!("\u{feff}{}", (1..=40).map(|id| csv_row(id, false)).collect::<String>()),
    )
    .expect("write");
    let (csv, mut csv_options) = config("data.csv", FileFormat::Csv, OnError::Fail);
    csv_options.header = false;
    for threads in [1, 3, 16] {
        let source =
            FileSource::with_tuning(&csv, &csv_options, dir.path(), threads, schema(), TINY, None).expect("source");
        let read = read_all(&source, 8);
        assert!(read.error.is_none(), "{threads} lanes: {:?}", read.error);
        assert_eq!(read.ids, (1..=40).collect::<Vec<_>>(), "{threads} lanes");
    }
}

/// Makes a named pipe at `path` with the `mkfifo` program.
fn make_fifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Writes `text` into the pipe at `path` from a thread: the write blocks until a reader
/// opens the pipe, and the reader sees the end of file when the thread is done.
fn feed(path: &Path, text: String) -> std::thread::JoinHandle<std::io::Result<()>> {
    let path = path.to_path_buf();
    std::thread::spawn(move || std::fs::write(path, text))
}

#[test]
fn a_named_pipe_is_read_as_one_streaming_lane_to_its_end_regression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("events.csv");
    make_fifo(&fifo);
    // More than a pipe holds (64 KiB), after a byte order mark and a header.
    let rows: String = (1..=5000).map(|id| csv_row(id, false)).collect();
    let (config, options) = config("events.csv", FileFormat::Csv, OnError::Fail);
    let source = FileSource::with_tuning(&config, &options, dir.path(), 4, schema(), TINY, None)
        .expect("planning reads nothing");
    assert!(source.is_streaming());
    assert_eq!(source.ranges(), [LaneRange { file: 0, start: 0, end: u64::MAX }]);
    assert_eq!(source.describe(), "file(path=events.csv, csv, 1 file, streaming)");
    let writer = feed(&fifo, format!("\u{feff}id,name,ts\n{rows}"));
    let read = read_all(&source, 64);
    assert!(writer.join().expect("writer").is_ok());
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.ids, (1..=5000).collect::<Vec<_>>(), "every row, once");

    // A streaming lane cannot resume from a position.
    let metrics = Arc::new(SourceMetrics::new("events", 1));
    let start = Some(vec![0u8; 24]);
    let context = LaneContext { lane: 0, batch_size: 8, tables_needed: vec![true], metrics, start };
    let error = source.open_lane(context).err().expect("no resume");
    assert_eq!(error.code, "source.not_resumable");
    assert!(error.message.contains("events.csv") && error.message.contains("not a regular file"), "{}", error.message);

    // Its CSV header is checked when the lane reads it.
    let writer = feed(&fifo, format!("id,nom,ts\n{rows}"));
    let read = read_all(&source, 64);
    let _ = writer.join();
    let error = read.error.expect("the header does not match");
    assert_eq!(error.code, "source.csv_header");
    assert!(error.message.contains("events.csv") && error.message.contains("\"nom\""), "{}", error.message);
}

#[test]
fn a_regular_file_is_not_streaming() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_csv(&dir.path().join("data.csv"), 5, &[]);
    assert!(!csv_source(dir.path(), 2, OnError::Skip, Tuning::default()).is_streaming());
}

/// A source over `data.jsonl` of one-row-per-line JSON with ids, 4-byte pieces when split.
mod resume {
    use super::*;

    const SPLIT: Tuning = Tuning { split_above_bytes: 16, min_piece_bytes: 4, chunk_bytes: 256 };

    fn lines(ids: std::ops::Range<i64>) -> String {
        ids.map(|id| format!("{{\"id\":{id},\"name\":\"n\",\"ts\":{}}}\n", 1_767_225_600_000 + id)).collect()
    }

    fn source(dir: &Path, recorded: Option<&[u8]>) -> Result<FileSource, SluiceError> {
        let (config, options) = config("data.jsonl", FileFormat::Json, OnError::Fail);
        FileSource::with_tuning(&config, &options, dir, 3, schema(), SPLIT, recorded)
    }

    /// Reads every lane from the positions of `first` after it read everything, i.e. what
    /// a resumed run reads.
    fn ids_after_the_end_of(first: &FileSource, resumed: &FileSource) -> Vec<i64> {
        let metrics = Arc::new(SourceMetrics::new("events", first.lanes()));
        let mut ids = Vec::new();
        for lane in 0..first.lanes() {
            let context = LaneContext {
                lane,
                batch_size: 100,
                tables_needed: vec![true],
                metrics: Arc::clone(&metrics),
                start: None,
            };
            let mut reader = first.open_lane(context).expect("lane");
            while let LanePoll::Data { .. } = reader.poll().expect("poll") {}
            let start = Some(reader.position());
            let context =
                LaneContext { lane, batch_size: 100, tables_needed: vec![true], metrics: Arc::clone(&metrics), start };
            let mut reader = resumed.open_lane(context).expect("lane");
            loop {
                match reader.poll().expect("poll") {
                    LanePoll::Data { batches, .. } => {
                        for (_, batch) in batches {
                            ids.extend(batch.column(0).as_primitive::<Int64Type>().values().iter().copied());
                        }
                    }
                    LanePoll::Wait(_) => panic!("no rate"),
                    LanePoll::Exhausted => break,
                }
            }
        }
        ids.sort_unstable();
        ids
    }

    #[test]
    fn an_appended_file_resumes_with_exactly_the_new_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("data.jsonl");
        std::fs::write(&file, lines(0..30)).expect("write");
        let first = source(dir.path(), None).expect("source");
        assert!(first.lanes() > 1, "the file is read by several lanes");
        let recorded = first.layout();
        let mut more = std::fs::OpenOptions::new().append(true).open(&file).expect("open");
        std::io::Write::write_all(&mut more, lines(30..45).as_bytes()).expect("append");
        let resumed = source(dir.path(), Some(&recorded)).expect("an append resumes");
        assert_eq!(resumed.ranges().len(), first.ranges().len(), "the lanes are the recorded ones");
        assert_eq!(ids_after_the_end_of(&first, &resumed), (30..45).collect::<Vec<_>>());
        assert_ne!(resumed.layout(), recorded, "the new layout records the grown file");
    }

    #[test]
    fn a_rewritten_shrunk_or_new_input_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("data.jsonl");
        std::fs::write(&file, lines(0..30)).expect("write");
        let recorded = source(dir.path(), None).expect("source").layout();
        let refused = |what: &str| {
            let error = source(dir.path(), Some(&recorded)).expect_err(what);
            assert_eq!(error.code, "source.input_changed", "{what}: {error}");
            assert!(error.message.contains("data.jsonl") && error.fix.is_some(), "{what}: {error}");
            error.message
        };
        std::fs::write(&file, lines(100..130)).expect("rewrite");
        assert!(refused("a rewrite of the same size").contains("rewritten"));
        std::fs::write(&file, lines(0..10)).expect("shrink");
        assert!(refused("a shorter file").contains("shrank"));
        let mut grown = lines(0..30);
        grown.insert_str(0, "{\"id\":-1,\"name\":\"n\",\"ts\":1}\n");
        std::fs::write(&file, grown).expect("prepend");
        assert!(refused("rows put before the old ones").contains("rewritten"));
        let mut incomplete = lines(0..30);
        incomplete.pop();
        std::fs::write(&file, &incomplete).expect("write");
        let cut = source(dir.path(), None).expect("source").layout();
        std::fs::write(&file, incomplete + "\n" + &lines(30..31)).expect("complete the line");
        let error = source(dir.path(), Some(&cut)).expect_err("an incomplete line grew");
        assert!(error.message.contains("incomplete"), "{error}");
    }

    #[test]
    fn a_new_or_removed_file_of_a_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("data")).expect("mkdir");
        std::fs::write(dir.path().join("data/a.jsonl"), lines(0..5)).expect("write");
        let (config, options) = config("data", FileFormat::Json, OnError::Fail);
        let plan = |recorded: Option<&[u8]>| {
            FileSource::with_tuning(&config, &options, dir.path(), 1, schema(), SPLIT, recorded)
        };
        let recorded = plan(None).expect("source").layout();
        std::fs::write(dir.path().join("data/b.jsonl"), lines(5..9)).expect("write");
        let error = plan(Some(&recorded)).expect_err("a new file");
        assert!(error.message.contains("b.jsonl") && error.message.contains("appeared"), "{error}");
        std::fs::remove_file(dir.path().join("data/b.jsonl")).expect("rm");
        assert!(plan(Some(&recorded)).is_ok(), "as recorded again");
        let damaged = plan(Some(&recorded[..recorded.len() - 3])).expect_err("a damaged layout");
        assert_eq!(damaged.code, "source.layout");
    }
}
