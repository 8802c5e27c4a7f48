//! Staged (exactly-once) file sink: visibility, idempotent commit, crash and restart.
//!
//! Each test runs a script of epochs (rows by slot) through a real sink in a temporary
//! directory and compares what is visible with a model of the committed epochs.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::FileFormat;
use crate::sinks::{BlackholeSink, FileMode, FileSink, FileSinkOptions, StdoutFormat, StdoutSink};
use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_runtime::{SinkFactory, SinkWriter};
use sluice_types::{Batch, Domain, Epoch};

use super::StagedRecord;

/// The rows of one epoch, by slot: slot `s`'s rows go to writer `s % writers`.
pub(super) type EpochRows = Vec<Vec<i64>>;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)]))
}

/// Rows `(id, "n{id}")`.
fn batch(ids: &[i64]) -> Batch {
    let names: Vec<String> = ids.iter().map(|id| format!("n{id}")).collect();
    let columns = vec![
        Arc::new(Int64Array::from(ids.to_vec())) as _,
        Arc::new(StringArray::from(names)) as arrow::array::ArrayRef,
    ];
    Batch::inserts(RecordBatch::try_new(schema(), columns).expect("batch"))
}

/// A file sink under test: its mode and format.
#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    pub(super) mode: FileMode,
    pub(super) format: FileFormat,
}

pub(super) const CASES: [Case; 4] = [
    Case { mode: FileMode::Directory, format: FileFormat::Csv },
    Case { mode: FileMode::Directory, format: FileFormat::Json },
    Case { mode: FileMode::File, format: FileFormat::Csv },
    Case { mode: FileMode::File, format: FileFormat::Json },
];

impl Case {
    fn extension(self) -> &'static str {
        match self.format {
            FileFormat::Csv => "csv",
            FileFormat::Json => "jsonl",
        }
    }

    /// The configured path, relative to the test's root directory.
    fn path(self) -> String {
        match self.mode {
            FileMode::Directory => "parts".to_string(),
            FileMode::File => format!("out.{}", self.extension()),
        }
    }

    /// Writers of a run: two in directory mode, one in file mode.
    pub(super) fn slots(self) -> u32 {
        match self.mode {
            FileMode::Directory => 2,
            FileMode::File => 1,
        }
    }

    /// A new sink instance (as a restarted process builds it).
    pub(super) fn sink(self, root: &Path) -> Arc<dyn SinkFactory> {
        let options = FileSinkOptions { path: self.path().into(), format: self.format, mode: self.mode };
        Arc::new(FileSink::new("out", &options, root, &schema(), false))
    }

    /// The target file (file mode) or directory.
    pub(super) fn target(self, root: &Path) -> PathBuf {
        root.join(self.path())
    }

    /// The staging directory.
    pub(super) fn staging(self, root: &Path) -> PathBuf {
        match self.mode {
            FileMode::Directory => root.join("parts/.staging"),
            FileMode::File => root.join(format!(".{}.staging", self.path())),
        }
    }

    fn line(self, id: i64) -> String {
        match self.format {
            FileFormat::Csv => format!("{id},n{id}\n"),
            FileFormat::Json => format!("{{\"id\":{id},\"name\":\"n{id}\"}}\n"),
        }
    }

    fn header(self) -> &'static str {
        match self.format {
            FileFormat::Csv => "id,name\n",
            FileFormat::Json => "",
        }
    }

    /// What is visible: the target's bytes in file mode; in directory mode each
    /// non-hidden file as `== NAME` and its content, by name.
    pub(super) fn visible(self, root: &Path) -> String {
        let path = root.join(self.path());
        if self.mode == FileMode::File {
            return fs::read_to_string(&path).unwrap_or_default();
        }
        let Ok(entries) = fs::read_dir(&path) else { return String::new() };
        let mut names: Vec<String> = entries.map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
        names.sort();
        let mut text = String::new();
        for name in names.iter().filter(|name| !name.starts_with('.')) {
            let _ = write!(text, "== {name}\n{}", fs::read_to_string(path.join(name)).expect("part"));
        }
        text
    }

    /// The model: what is visible once `epochs` (epoch 1 first) are committed by
    /// `writers` writers.
    pub(super) fn expected(self, writers: u32, epochs: &[EpochRows]) -> String {
        let mut text = String::new();
        for (index, rows) in epochs.iter().enumerate() {
            for writer in 0..writers as usize {
                let lines: String = rows
                    .iter()
                    .enumerate()
                    .filter(|(slot, _)| slot % writers as usize == writer)
                    .flat_map(|(_, ids)| ids.iter().map(|id| self.line(*id)))
                    .collect();
                if lines.is_empty() {
                    continue;
                }
                if self.mode == FileMode::Directory {
                    let name = format!("part-{:020}-{writer}.{}", index + 1, self.extension());
                    let _ = write!(text, "== {name}\n{}", self.header());
                } else if text.is_empty() {
                    text.push_str(self.header());
                }
                text.push_str(&lines);
            }
        }
        text
    }

    /// The files left in the staging directory.
    pub(super) fn staged_files(self, root: &Path) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.staging(root)) else { return Vec::new() };
        let mut names: Vec<String> = entries.map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
        names.sort();
        names
    }

    /// Every CSV header is the first line of a visible file, and there is one per file.
    pub(super) fn assert_one_header_per_file(self, root: &Path) {
        if self.format != FileFormat::Csv {
            return;
        }
        let visible = self.visible(root);
        let files: Vec<&str> = match self.mode {
            FileMode::File => vec![visible.as_str()],
            FileMode::Directory => {
                visible.split("== ").skip(1).map(|f| f.split_once('\n').map_or("", |s| s.1)).collect()
            }
        };
        for file in files.iter().filter(|file| !file.is_empty()) {
            assert!(file.starts_with("id,name\n"), "{file:?}");
            assert_eq!(file.matches("id,name").count(), 1, "{file:?}");
        }
    }
}

pub(super) fn open(sink: &Arc<dyn SinkFactory>, writers: u32) -> Vec<Box<dyn SinkWriter>> {
    (0..writers).map(|slot| sink.open(slot, writers, true).expect("open staged")).collect()
}

/// Writes `rows` (slot `s` to writer `s % writers`) without pre-committing.
pub(super) fn write_rows(writers: &mut [Box<dyn SinkWriter>], rows: &[Vec<i64>]) {
    let count = writers.len();
    for (slot, ids) in rows.iter().enumerate() {
        writers[slot % count].write(&batch(ids)).expect("write");
    }
}

/// Writes epoch `epoch`'s rows and pre-commits every writer; their records.
pub(super) fn stage(writers: &mut [Box<dyn SinkWriter>], epoch: u64, rows: &[Vec<i64>]) -> Vec<Vec<u8>> {
    write_rows(writers, rows);
    writers.iter_mut().map(|writer| writer.pre_commit(Epoch(epoch)).expect("pre-commit")).collect()
}

/// A run that never fails: every epoch staged and committed, then the writers closed.
pub(super) fn uninterrupted(case: Case, root: &Path, writers: u32, epochs: &[EpochRows]) -> String {
    let sink = case.sink(root);
    sink.discard_after(None, &[]).expect("discard");
    let mut open_writers = open(&sink, writers);
    for (index, rows) in epochs.iter().enumerate() {
        let epoch = index as u64 + 1;
        let records = stage(&mut open_writers, epoch, rows);
        sink.commit(Epoch(epoch), &records).expect("commit");
    }
    for writer in &mut open_writers {
        writer.close().expect("close");
    }
    case.visible(root)
}

/// Recovery as the runtime does it: commit the restored epoch again, discard later work.
pub(super) fn recover(sink: &Arc<dyn SinkFactory>, restored: Option<(u64, &[Vec<u8>])>) {
    if let Some((epoch, records)) = restored {
        sink.commit(Epoch(epoch), records).expect("commit again at recovery");
    }
    sink.discard_after(restored.map(|(epoch, _)| Epoch(epoch)), restored.map_or(&[], |(_, records)| records))
        .expect("discard");
}

/// A script of four epochs, one of them empty, over two slots.
fn script() -> Vec<EpochRows> {
    vec![vec![vec![1, 2], vec![3]], vec![vec![], vec![]], vec![vec![4], vec![]], vec![vec![], vec![5, 6]]]
}

#[test]
fn the_model_is_the_documented_layout() {
    let epochs = &script()[..3];
    let parts = CASES[0].expected(2, epochs);
    let part = |e: u64, slot: u32| format!("== part-{e:020}-{slot}.csv\nid,name\n");
    let expected = format!("{}1,n1\n2,n2\n{}3,n3\n{}4,n4\n", part(1, 0), part(1, 1), part(3, 0));
    assert_eq!(parts, expected);
    assert_eq!(CASES[2].expected(1, epochs), "id,name\n1,n1\n2,n2\n3,n3\n4,n4\n");
    assert_eq!(
        CASES[3].expected(1, epochs),
        "{\"id\":1,\"name\":\"n1\"}\n{\"id\":2,\"name\":\"n2\"}\n\
        {\"id\":3,\"name\":\"n3\"}\n{\"id\":4,\"name\":\"n4\"}\n"
    );
}

#[test]
fn staged_rows_stay_invisible_until_their_epoch_commits() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let sink = case.sink(root.path());
        let mut writers = open(&sink, case.slots());
        let epochs = script();
        let records = stage(&mut writers, 1, &epochs[0]);
        write_rows(&mut writers, &epochs[2]);
        assert_eq!(case.visible(root.path()), "", "{case:?}: nothing before the commit");
        sink.commit(Epoch(1), &records).expect("commit");
        assert_eq!(case.visible(root.path()), case.expected(case.slots(), &epochs[..1]), "{case:?}");
    }
}

#[test]
fn several_epochs_with_empty_ones_commit_in_order() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let epochs = script();
        let visible = uninterrupted(case, root.path(), case.slots(), &epochs);
        assert_eq!(visible, case.expected(case.slots(), &epochs), "{case:?}");
        assert_eq!(case.staged_files(root.path()), Vec::<String>::new(), "{case:?}: nothing left staged");
        case.assert_one_header_per_file(root.path());
        let sink = case.sink(root.path());
        let mut writers = open(&sink, case.slots());
        let records = stage(&mut writers, 5, &[vec![], vec![]]);
        match case.mode {
            FileMode::Directory => assert!(records.iter().all(Vec::is_empty), "{case:?}: empty records"),
            FileMode::File => {
                // Only the target's committed length, for recovery to cut back to.
                let marker = StagedRecord::decode(&records[0]).expect("a length marker");
                assert!(marker.is_length_marker(), "{case:?}: {marker:?}");
                assert_eq!(marker.length_after(), Some(case.visible(root.path()).len() as u64), "{case:?}");
                sink.commit(Epoch(5), &records).expect("a marker commits nothing");
            }
        }
        assert_eq!(case.staged_files(root.path()), Vec::<String>::new(), "{case:?}: and stages no file");
    }
}

#[test]
fn committing_an_epoch_again_changes_nothing() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let sink = case.sink(root.path());
        let mut writers = open(&sink, case.slots());
        let epochs = script();
        let first = stage(&mut writers, 1, &epochs[0]);
        sink.commit(Epoch(1), &first).expect("commit");
        let once = case.visible(root.path());
        sink.commit(Epoch(1), &first).expect("commit again");
        assert_eq!(case.visible(root.path()), once, "{case:?}");
        let third = stage(&mut writers, 3, &epochs[2]);
        sink.commit(Epoch(3), &third).expect("commit");
        sink.commit(Epoch(3), &third).expect("commit again");
        sink.commit(Epoch(1), &first).expect("an earlier epoch again");
        assert_eq!(case.visible(root.path()), case.expected(case.slots(), &epochs[..3]), "{case:?}");
    }
}

#[test]
fn a_crash_leaves_the_committed_epochs_and_a_restart_completes_the_run() {
    let epochs = script();
    for case in CASES {
        for committed in [1, 2] {
            let root = tempfile::tempdir().expect("tempdir");
            let sink = case.sink(root.path());
            sink.discard_after(None, &[]).expect("fresh start");
            let mut writers = open(&sink, case.slots());
            let first = stage(&mut writers, 1, &epochs[0]);
            sink.commit(Epoch(1), &first).expect("commit 1");
            let second = stage(&mut writers, 2, &[vec![7], vec![8]]);
            if committed == 2 {
                sink.commit(Epoch(2), &second).expect("commit 2");
            }
            write_rows(&mut writers, &epochs[2]);
            drop(writers);

            let context = format!("{case:?}, crash after committing {committed}");
            let sink = case.sink(root.path());
            let records = if committed == 2 { &second } else { &first };
            recover(&sink, Some((committed, records)));
            let done: Vec<EpochRows> = [epochs[0].clone(), vec![vec![7], vec![8]]][..committed as usize].to_vec();
            assert_eq!(case.visible(root.path()), case.expected(case.slots(), &done), "{context}");
            assert_eq!(case.staged_files(root.path()), Vec::<String>::new(), "{context}");

            let mut writers = open(&sink, case.slots());
            let mut all = done.clone();
            for epoch in committed + 1..=4 {
                let rows = if epoch == 2 { vec![vec![7], vec![8]] } else { epochs[epoch as usize - 1].clone() };
                let records = stage(&mut writers, epoch, &rows);
                sink.commit(Epoch(epoch), &records).expect("commit after restart");
                all.push(rows);
            }
            writers.iter_mut().for_each(|writer| writer.close().expect("close"));
            let clean = tempfile::tempdir().expect("tempdir");
            let reference = uninterrupted(case, clean.path(), case.slots(), &all);
            assert_eq!(case.visible(root.path()), reference, "{context}");
            case.assert_one_header_per_file(root.path());
        }
    }
}

#[test]
fn a_fallback_past_committed_epochs_removes_their_visible_output() {
    // Epochs 1..=4 commit; recovery then restores epoch `restored` (a newer manifest was
    // damaged) and replays the rest: the output must equal an uninterrupted run's. The
    // script's epoch 2 has no rows, so restoring it relies on the file-mode length marker.
    let epochs = script();
    for case in CASES {
        for restored in [1u64, 2, 3] {
            let root = tempfile::tempdir().expect("tempdir");
            let sink = case.sink(root.path());
            sink.discard_after(None, &[]).expect("fresh start");
            let mut writers = open(&sink, case.slots());
            let mut records = Vec::new();
            for (index, rows) in epochs.iter().enumerate() {
                let epoch = index as u64 + 1;
                records.push(stage(&mut writers, epoch, rows));
                sink.commit(Epoch(epoch), records.last().expect("staged")).expect("commit");
            }
            drop(writers);

            let context = format!("{case:?}, restored epoch {restored}");
            recover(&sink, Some((restored, &records[restored as usize - 1])));
            let done = &epochs[..restored as usize];
            assert_eq!(case.visible(root.path()), case.expected(case.slots(), done), "{context}");
            let mut writers = open(&sink, case.slots());
            for epoch in restored + 1..=epochs.len() as u64 {
                let records = stage(&mut writers, epoch, &epochs[epoch as usize - 1]);
                sink.commit(Epoch(epoch), &records).expect("commit after restart");
            }
            writers.iter_mut().for_each(|writer| writer.close().expect("close"));
            let clean = tempfile::tempdir().expect("tempdir");
            assert_eq!(
                case.visible(root.path()),
                uninterrupted(case, clean.path(), case.slots(), &epochs),
                "{context}"
            );
            case.assert_one_header_per_file(root.path());
        }
    }
}

#[test]
fn a_file_recommit_cuts_a_partly_or_wholly_appended_epoch() {
    for case in CASES.into_iter().filter(|case| case.mode == FileMode::File) {
        for cut in ["half", "whole", "whole and more"] {
            let root = tempfile::tempdir().expect("tempdir");
            let sink = case.sink(root.path());
            let mut writers = open(&sink, 1);
            let epochs = script();
            let first = stage(&mut writers, 1, &epochs[0]);
            sink.commit(Epoch(1), &first).expect("commit");
            let third = stage(&mut writers, 3, &epochs[2]);
            let staged = case.staging(root.path()).join(format!("epoch-{:020}-part-0.{}", 3, case.extension()));
            let bytes = fs::read(&staged).expect("staged file");
            let appended = match cut {
                "half" => bytes[..bytes.len() / 2].to_vec(),
                "whole" => bytes.clone(),
                _ => [bytes.as_slice(), b"9,n9\n"].concat(),
            };
            let mut file = fs::File::options().append(true).open(case.target(root.path())).expect("target");
            file.write_all(&appended).expect("append");
            drop(file);
            sink.commit(Epoch(3), &third).expect("commit after a crash mid-append");
            assert_eq!(case.visible(root.path()), case.expected(1, &epochs[..3]), "{case:?}, {cut}");
        }
    }
}

#[test]
fn a_staged_file_missing_at_commit_is_a_loud_error() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let sink = case.sink(root.path());
        let mut writers = open(&sink, case.slots());
        let records = stage(&mut writers, 1, &script()[0]);
        let name = format!("epoch-{:020}-part-0.{}", 1, case.extension());
        fs::remove_file(case.staging(root.path()).join(&name)).expect("remove staged");
        let error = sink.commit(Epoch(1), &records).expect_err("data loss");
        assert_eq!((error.code, error.domain), ("sink.staged_missing", Domain::External), "{case:?}");
        assert!(error.message.contains(&name), "{case:?}: {}", error.message);
        assert!(error.fix.is_some());
    }
}

#[test]
fn a_fresh_start_removes_staged_work_and_the_earlier_output() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let parts = root.path().join("parts");
        fs::create_dir(&parts).expect("mkdir");
        fs::write(parts.join(format!("part-0.{}", case.extension())), "an unstaged run").expect("write");
        fs::write(parts.join("notes.txt"), "kept").expect("write");
        let sink = case.sink(root.path());
        let mut writers = open(&sink, case.slots());
        let records = stage(&mut writers, 1, &script()[0]);
        sink.commit(Epoch(1), &records).expect("commit");
        stage(&mut writers, 2, &script()[2]);
        write_rows(&mut writers, &script()[3]);
        drop(writers);
        sink.discard_after(None, &[]).expect("discard all");
        let left = if case.mode == FileMode::Directory { "== notes.txt\nkept" } else { "" };
        assert_eq!(case.visible(root.path()), left, "{case:?}");
        assert_eq!(case.staged_files(root.path()), Vec::<String>::new(), "{case:?}");
        assert!(parts.join("notes.txt").exists(), "only output files are removed");
    }
}

#[test]
fn a_restarted_writer_never_writes_into_a_dead_writers_file() {
    let case = CASES[0];
    let root = tempfile::tempdir().expect("tempdir");
    let sink = case.sink(root.path());
    let mut dead = open(&sink, 1);
    write_rows(&mut dead, &[vec![1]]);
    drop(dead);
    let mut writers = open(&sink, 1);
    write_rows(&mut writers, &[vec![2]]);
    let in_progress = case.staged_files(root.path());
    assert_eq!(in_progress.len(), 2, "{in_progress:?}");
    assert!(in_progress.iter().all(|name| name.starts_with("part-0-") && name.ends_with(".inprogress")));
    let records = writers[0].pre_commit(Epoch(1)).expect("pre-commit");
    sink.commit(Epoch(1), &[records]).expect("commit");
    assert_eq!(case.visible(root.path()), case.expected(1, &[vec![vec![2]]]));
    sink.discard_after(Some(Epoch(1)), &[]).expect("discard");
    assert_eq!(case.staged_files(root.path()), Vec::<String>::new());
}

#[test]
fn closing_with_rows_after_the_last_pre_commit_is_an_error() {
    for case in CASES {
        let root = tempfile::tempdir().expect("tempdir");
        let sink = case.sink(root.path());
        let mut writers = open(&sink, 1);
        stage(&mut writers, 1, &[vec![1]]);
        writers[0].close().expect("everything was pre-committed");
        let mut writers = open(&sink, 1);
        write_rows(&mut writers, &[vec![2]]);
        let error = writers[0].close().expect_err("rows of no epoch");
        assert_eq!((error.code, error.domain), ("sink.unstaged_rows", Domain::Internal), "{case:?}");
    }
}

#[test]
fn records_round_trip_and_foreign_records_are_refused() {
    let record = StagedRecord {
        epoch: 7,
        slot: 0,
        file: "epoch-00000000000000000007-part-0.csv".into(),
        size: 42,
        length_before: Some(100),
    };
    let bytes = record.encode();
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        r#"{"v":1,"epoch":7,"slot":0,"file":"epoch-00000000000000000007-part-0.csv","size":42,"length_before":100}"#
    );
    assert_eq!(StagedRecord::decode(&bytes).expect("decode"), record);
    let directory = StagedRecord { length_before: None, slot: 3, ..record.clone() };
    assert_eq!(StagedRecord::decode(&directory.encode()).expect("decode"), directory);
    for bad in [&b"not json"[..], br#"{"v":2,"epoch":7,"slot":0,"file":"f","size":1}"#, br#"{"v":1}"#] {
        let error = StagedRecord::decode(bad).expect_err("refused");
        assert_eq!((error.code, error.domain), ("sink.record", Domain::Internal));
    }
    let root = tempfile::tempdir().expect("tempdir");
    let sink = CASES[2].sink(root.path());
    let error = sink.commit(Epoch(8), &[bytes]).expect_err("the record of another epoch");
    assert_eq!(error.code, "sink.record");
}

#[test]
fn only_the_file_sink_is_exactly_once() {
    let root = tempfile::tempdir().expect("tempdir");
    assert!(CASES[0].sink(root.path()).exactly_once());
    let stdout: Arc<dyn SinkFactory> = Arc::new(StdoutSink {
        name: "o".into(),
        format: StdoutFormat::Json,
        schema: schema(),
        updating: false,
        upsert_key: None,
    });
    let blackhole: Arc<dyn SinkFactory> = Arc::new(BlackholeSink { name: "o".into() });
    for sink in [stdout, blackhole] {
        assert!(!sink.exactly_once(), "{}", sink.name());
        let mut writer = sink.open(0, 1, true).expect("staged is ignored");
        assert_eq!(writer.pre_commit(Epoch(1)).expect("pre-commit"), Vec::<u8>::new());
        writer.close().expect("close");
        sink.commit(Epoch(1), &[]).expect("nothing to commit");
    }
}
