use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_runtime::{SinkFactory, SinkParallelism};
use sluice_types::{Batch, Domain};

use super::{BlackholeSink, FileMode, FileSink, FileSinkOptions, StdoutFormat, StdoutSink, check_sink};
use crate::FileFormat;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)]))
}

fn rows() -> RecordBatch {
    let ids = Int64Array::from(vec![1, 2]);
    let names = StringArray::from(vec![Some("a"), None]);
    RecordBatch::try_new(schema(), vec![Arc::new(ids), Arc::new(names)]).expect("batch")
}

fn file_config(path: &str, format: FileFormat, mode: FileMode) -> FileSinkOptions {
    FileSinkOptions { path: path.into(), format, mode }
}

/// The file sink "out" of `options`, relative to `base`.
fn build(options: &FileSinkOptions, base: &Path, updating: bool) -> Arc<dyn SinkFactory> {
    Arc::new(FileSink::new("out", options, base, &schema(), updating))
}

/// A byte stream shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().map_err(|_| io::Error::other("poisoned"))?.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
    }
}

/// Writes `batches` through a stdout sink into memory.
fn stdout_output(format: StdoutFormat, updating: bool, batches: &[Batch]) -> String {
    let sink = StdoutSink { name: "out".into(), format, schema: schema(), updating, upsert_key: None };
    assert_eq!(sink.parallelism(), SinkParallelism::Single);
    let captured = Captured::default();
    let mut writer = sink.writer_to(Box::new(captured.clone()));
    for batch in batches {
        writer.write(batch).expect("write");
    }
    writer.close().expect("close");
    captured.text()
}

#[test]
fn stdout_writes_json_lines_and_pretty_tables() {
    let json = stdout_output(StdoutFormat::Json, false, &[Batch::inserts(rows())]);
    assert_eq!(json, "{\"id\":1,\"name\":\"a\"}\n{\"id\":2,\"name\":null}\n");
    let pretty = stdout_output(StdoutFormat::Pretty, false, &[Batch::inserts(rows())]);
    let expected = "+----+------+\n| id | name |\n+----+------+\n| 1  | a    |\n| 2  | NULL |\n+----+------+\n";
    assert_eq!(pretty, expected);
}

#[test]
fn an_updating_stream_is_written_with_its_op_column() {
    let batch = Batch::with_weights(rows(), Int64Array::from(vec![1, -1]));
    let json = stdout_output(StdoutFormat::Json, true, &[batch]);
    assert_eq!(json, "{\"op\":\"+I\",\"id\":1,\"name\":\"a\"}\n{\"op\":\"-D\",\"id\":2,\"name\":null}\n");
}

#[test]
fn a_change_of_one_row_of_a_keyed_stream_is_written_as_an_update_pair() {
    let batch = Batch::with_weights(rows(), Int64Array::from(vec![-1, 1]));
    let sink = StdoutSink {
        name: "out".into(),
        format: StdoutFormat::Json,
        schema: schema(),
        updating: true,
        upsert_key: Some(Vec::new()),
    };
    assert_eq!(sink.describe(), "stdout(json, changelog (op column, one row))");
    let captured = Captured::default();
    let mut writer = sink.writer_to(Box::new(captured.clone()));
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    assert_eq!(captured.text(), "{\"op\":\"-U\",\"id\":1,\"name\":\"a\"}\n{\"op\":\"+U\",\"id\":2,\"name\":null}\n");
    let options = file_config("out.jsonl", FileFormat::Json, FileMode::File);
    let keyed = FileSink::new("out", &options, Path::new("/tmp"), &schema(), true).with_upsert_key(Some(vec![0]));
    assert_eq!(keyed.describe(), "file(path=out.jsonl, json, file, changelog (op column, upsert key id))");
    assert_eq!(build(&options, Path::new("/tmp"), false).describe(), "file(path=out.jsonl, json, file)");
}

/// A reader that went away.
struct ClosedPipe;

impl Write for ClosedPipe {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        Err(io::Error::from(io::ErrorKind::BrokenPipe))
    }

    fn flush(&mut self) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

#[test]
fn a_closed_stdout_is_an_external_error() {
    let sink = StdoutSink {
        name: "out".into(),
        format: StdoutFormat::Json,
        schema: schema(),
        updating: false,
        upsert_key: None,
    };
    let mut writer = sink.writer_to(Box::new(ClosedPipe));
    let error = writer.write(&Batch::inserts(rows())).expect_err("broken pipe");
    assert_eq!((error.code, error.domain), ("sink.stdout_closed", Domain::External));
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).expect("output file")
}

#[test]
fn a_file_sink_writes_one_file_creating_its_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file_config("out/sub/result.json", FileFormat::Json, FileMode::File);
    check_sink(&config, dir.path()).expect("writable");
    assert!(!dir.path().join("out").exists(), "checking creates nothing");
    let sink = build(&config, dir.path(), false);
    assert_eq!(sink.parallelism(), SinkParallelism::Single);
    assert_eq!(sink.describe(), "file(path=out/sub/result.json, json, file)");
    let mut writer = sink.open(0, 1, false).expect("open");
    writer.write(&Batch::inserts(rows())).expect("write");
    writer.write(&Batch::inserts(rows().slice(0, 1))).expect("write");
    writer.close().expect("close");
    let expected = "{\"id\":1,\"name\":\"a\"}\n{\"id\":2,\"name\":null}\n{\"id\":1,\"name\":\"a\"}\n";
    assert_eq!(read(&dir.path().join("out/sub/result.json")), expected);
}

#[test]
fn a_directory_sink_writes_one_csv_part_per_slot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).expect("mkdir");
    std::fs::write(parts.join("part-5.csv"), "stale").expect("write");
    std::fs::write(parts.join("notes.txt"), "kept").expect("write");
    let config = file_config("parts", FileFormat::Csv, FileMode::Directory);
    let sink = build(&config, dir.path(), false);
    assert_eq!(sink.parallelism(), SinkParallelism::PerThread);
    for slot in 0..2 {
        let mut writer = sink.open(slot, 2, false).expect("open");
        writer.write(&Batch::inserts(rows().slice(slot as usize, 1))).expect("write");
        writer.write(&Batch::inserts(rows().slice(0, 1))).expect("write");
        writer.close().expect("close");
    }
    assert_eq!(read(&parts.join("part-0.csv")), "id,name\n1,a\n1,a\n");
    assert_eq!(read(&parts.join("part-1.csv")), "id,name\n2,\n1,a\n");
    assert!(!parts.join("part-5.csv").exists(), "a stale part of a wider run is removed");
    assert!(parts.join("notes.txt").exists());
}

#[test]
fn a_directory_sink_writes_json_parts_with_the_op_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file_config("parts", FileFormat::Json, FileMode::Directory);
    let sink = build(&config, dir.path(), true);
    let mut writer = sink.open(3, 4, false).expect("open");
    writer.write(&Batch::with_weights(rows().slice(1, 1), Int64Array::from(vec![-1]))).expect("write");
    writer.close().expect("close");
    assert_eq!(read(&dir.path().join("parts/part-3.jsonl")), "{\"op\":\"-D\",\"id\":2,\"name\":null}\n");
}

#[test]
fn an_unwritable_path_fails_early_with_the_path_reason_and_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("blocker"), "a regular file").expect("write");
    for (path, mode) in [("blocker/out.json", FileMode::File), ("blocker/parts", FileMode::Directory)] {
        let config = file_config(path, FileFormat::Json, mode);
        let error = check_sink(&config, dir.path()).expect_err("not writable");
        assert_eq!(error.code, "sink.path");
        assert!(error.message.contains("blocker") && error.message.contains("not a directory"), "{}", error.message);
        assert!(error.fix.is_some());
        let sink = build(&config, dir.path(), false);
        let Err(error) = sink.open(0, 1, false) else { panic!("opening {path} must fail") };
        assert_eq!(error.code, "sink.path");
        assert!(error.message.contains("blocker"), "{}", error.message);
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("writable")));
    }
    std::fs::create_dir(dir.path().join("taken")).expect("mkdir");
    let config = file_config("taken", FileFormat::Json, FileMode::File);
    let error = check_sink(&config, dir.path()).expect_err("a directory is no file");
    assert!(error.message.contains("is a directory"), "{}", error.message);
}

#[test]
fn a_blackhole_takes_everything_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = BlackholeSink { name: "void".into() };
    assert_eq!((sink.parallelism(), sink.describe()), (SinkParallelism::PerThread, "blackhole".to_string()));
    let before = std::env::current_dir().expect("cwd");
    for staged in [false, true] {
        let mut writer = sink.open(1, 2, staged).expect("open");
        writer.write(&Batch::inserts(rows())).expect("write");
        assert_eq!(writer.pre_commit(sluice_types::Epoch(1)).expect("pre-commit"), Vec::<u8>::new());
        writer.close().expect("close");
    }
    assert_eq!(std::env::current_dir().expect("cwd"), before);
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "nothing was written");
    assert!(!sink.exactly_once(), "a blackhole cannot stage");
}
