//! Tests of the first read of a log (`log_start`, `checkpoint_read`): a state read from a
//! log checkpoint against the one the commit reader makes of every commit (on random logs,
//! and on a checkpoint written by delta-rs), the fallbacks past a missing, stale or
//! damaged pointer or checkpoint, the refusals, and a sink resuming exactly once on a
//! table whose early commits a log cleanup removed.

use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use bytes::Bytes;
use serde_json::{Value, json};
use sluice_checkpoint::ObjectDir;
use sluice_runtime::SinkFactory;
use sluice_types::Epoch;

use super::checkpoint::{self, CheckpointName, LastCheckpoint};
use super::log::{self, AddFile, Column, LogState, TableMetadata};
use super::log_start::{self, Start};
use super::table::{Decision, Table};

/// The name delta-rs and Spark give a V2 checkpoint of version 2 (a UUID).
const V2_UUID_NAME: &str = "_delta_log/00000000000000000002.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet";

/// A seeded xorshift generator: the random logs are the same on every run.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn open(path: &Path) -> ObjectDir {
    ObjectDir::open(&path.display().to_string(), Path::new("/"), &[], "Delta table", "sink.delta_io").expect("opens")
}

/// The log read by the commit reader alone: every commit from version 0, in order.
fn from_commits(path: &Path, keep_actions: bool) -> LogState {
    let mut state = LogState::new(keep_actions);
    for version in 0.. {
        let Ok(text) = std::fs::read(path.join(log::commit_path(version))) else { break };
        state.apply(version, &text).expect("a commit");
    }
    state
}

fn first_read(path: &Path, keep_actions: bool) -> Result<(LogState, Start), sluice_types::SluiceError> {
    log_start::first_read("out", &open(path), keep_actions)
}

fn metadata(partition_columns: &[&str]) -> TableMetadata {
    let column =
        |name: &str, delta_type: &str| Column { name: name.into(), delta_type: delta_type.into(), nullable: true };
    TableMetadata {
        columns: vec![column("auction", "long"), column("region", "string"), column("day", "date")],
        partition_columns: partition_columns.iter().map(|c| c.to_string()).collect(),
        invariants: Vec::new(),
    }
}

/// One random commit's actions over the live files `live` (encoded paths), which it
/// updates.
fn random_commit(random: &mut Random, version: u64, live: &mut Vec<String>, txn: &mut [u64; 3]) -> Vec<Value> {
    let mut actions = Vec::new();
    for index in 0..random.below(4) {
        let region = match random.below(4) {
            0 => None,
            1 => Some("a b/c=d%".to_string()),
            n => Some(format!("r{n}")),
        };
        let path = format!("region={}/part {version}-{index}.snappy.parquet", region.as_deref().unwrap_or("x"));
        let add = AddFile {
            path: path.clone(),
            partition_values: vec![("region".into(), region)],
            size: random.below(1 << 20),
            modification_time_ms: 1_700_000_000_000 + version as i64,
            rows: random.below(1000),
        };
        live.push(log::uri_encode(&path));
        actions.push(log::add_action(&add));
    }
    if !live.is_empty() && random.chance(30) {
        let path = live.swap_remove(random.below(live.len() as u64) as usize);
        actions.push(json!({"remove": {"path": path, "deletionTimestamp": 5, "dataChange": false}}));
    }
    for (app, newest) in txn.iter_mut().enumerate() {
        if random.chance(40) {
            // Mostly newer versions, sometimes an older one: the state keeps the highest.
            let version = if random.chance(90) { *newest + 1 + random.below(3) } else { newest.saturating_sub(1) };
            *newest = (*newest).max(version);
            actions.push(log::txn_action(&format!("sluice/p/out/{app}"), version, 7));
        }
    }
    if random.chance(5) {
        let mut meta = log::create_actions("id", &metadata(&["region"]), version as i64)[1].clone();
        meta["metaData"]["configuration"] = json!({"delta.appendOnly": "true", "note": format!("v{version}")});
        actions.push(meta);
    }
    if random.chance(5) {
        actions.push(json!({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["timestampNtz"], "writerFeatures": ["timestampNtz", "appendOnly"]}}));
    }
    actions.push(log::commit_info("WRITE", version as i64, serde_json::Map::new()));
    actions
}

/// A table of `commits` random commits after version 0, written by a sink's `Table`
/// with a log checkpoint every `interval` versions.
fn random_table(path: &Path, seed: u64, commits: u64, interval: u64) {
    let mut random = Random(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let table = Table::new("out", open(path), interval, true);
    table.ensure("id", &metadata(&["region"]), 1).expect("creates");
    let (mut live, mut txn) = (Vec::new(), [0; 3]);
    for version in 1..=commits {
        let actions = random_commit(&mut random, version, &mut live, &mut txn);
        let written = table.commit(|_| Ok(Decision::Commit(actions.clone()))).expect("commits");
        assert_eq!(written, Some(version));
    }
}

/// Removes the commits (and checkpoints) older than `version`, as a log cleanup does.
fn clean_up_before(path: &Path, version: u64) {
    for entry in std::fs::read_dir(path.join(log::LOG_DIR)).expect("log") {
        let name = format!("{}/{}", log::LOG_DIR, entry.expect("entry").file_name().to_string_lossy());
        let older = log::commit_version(&name)
            .or_else(|| checkpoint::checkpoint_name(&name).map(CheckpointName::version))
            .is_some_and(|v| v < version);
        if older {
            std::fs::remove_file(path.join(&name)).expect("removes");
        }
    }
}

fn write(path: &Path, relative: &str, bytes: &[u8]) {
    std::fs::write(path.join(relative), bytes).expect("writes");
}

#[test]
fn checkpoint_names_and_pointers_parse_as_delta_writers_make_them() {
    let name = |relative: &str| checkpoint::checkpoint_name(relative);
    assert_eq!(name(&checkpoint::checkpoint_path(12)), Some(CheckpointName::Single { version: 12 }));
    assert_eq!(name(&checkpoint::part_path(12, 2, 3)), Some(CheckpointName::Part { version: 12, part: 2, parts: 3 }));
    assert_eq!(
        name("_delta_log/00000000000000000012.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet"),
        Some(CheckpointName::Uuid { version: 12 })
    );
    for other in [
        "_delta_log/00000000000000000012.json",
        "_delta_log/12.checkpoint.parquet",
        "_delta_log/00000000000000000012.checkpoint.0000000004.0000000003.parquet",
        "_delta_log/_sidecars/00000000000000000012.checkpoint.parquet",
        "_delta_log/00000000000000000012.crc",
        "_delta_log/_last_checkpoint",
    ] {
        assert_eq!(name(other), None, "{other}");
    }
    let pointer = checkpoint::parse_last_checkpoint(&checkpoint::last_checkpoint(7, 11)).expect("ours");
    assert_eq!(pointer, LastCheckpoint { version: 7, size: Some(11), parts: None, v2: false });
    let theirs = br#"{"version":5,"size":30,"parts":2,"sizeInBytes":14558,"numOfAddFiles":9}"#;
    let pointer = checkpoint::parse_last_checkpoint(theirs).expect("delta-rs's");
    assert_eq!(pointer, LastCheckpoint { version: 5, size: Some(30), parts: Some(2), v2: false });
    for damaged in [&b"{\"version\":"[..], b"{\"size\":3}", b"{\"version\":-1}", b"{\"version\":2,\"parts\":0}"] {
        assert!(checkpoint::parse_last_checkpoint(damaged).is_err(), "{}", String::from_utf8_lossy(damaged));
    }
}

/// The oracle: on random logs, the state read from the newest log checkpoint and the
/// commits after it equals the state the commit reader makes of every commit, with and
/// without the live actions, and still does once the commits before the checkpoint are
/// removed, whatever `_last_checkpoint` says.
#[test]
fn a_state_read_from_a_checkpoint_equals_the_one_read_from_every_commit() {
    for seed in 0..40 {
        let dir = tempfile::tempdir().expect("dir");
        let mut random = Random(seed * 7 + 3);
        let interval = 1 + random.below(6);
        let commits = interval + random.below(30);
        random_table(dir.path(), seed, commits, interval);
        let newest_checkpoint = commits / interval * interval;
        let case = format!("seed {seed}: {commits} commits, a checkpoint every {interval}");
        for keep_actions in [true, false] {
            let expected = from_commits(dir.path(), keep_actions);
            let (state, start) = first_read(dir.path(), keep_actions).expect("reads");
            assert_eq!(start, Start::Checkpoint(newest_checkpoint), "{case}");
            assert_eq!(state, expected, "{case}, keep_actions {keep_actions}");
        }
        let expected = from_commits(dir.path(), true);
        assert_eq!(expected.version, Some(commits));
        clean_up_before(dir.path(), newest_checkpoint);
        let pointer = match random.below(3) {
            0 => Some(checkpoint::last_checkpoint(newest_checkpoint.saturating_sub(interval), 1)),
            1 => Some(b"{\"version\": ".to_vec()),
            _ => None,
        };
        match &pointer {
            Some(bytes) => write(dir.path(), &checkpoint::last_checkpoint_path(), bytes),
            None => std::fs::remove_file(dir.path().join(checkpoint::last_checkpoint_path())).expect("removes"),
        }
        let (state, start) = first_read(dir.path(), true).expect("reads after the cleanup");
        assert_eq!(start, Start::Checkpoint(newest_checkpoint), "{case}, cleaned up");
        assert_eq!(state, expected, "{case}, cleaned up, pointer {pointer:?}");
        let table = Table::new("out", open(dir.path()), 0, true);
        assert_eq!(table.latest().expect("the table reads it"), expected, "{case}");
    }
}

/// `value` without the object members that are null, except a partition value's.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(_, member)| !member.is_null())
                .map(|(name, member)| {
                    let member = if name == "partitionValues" { member.clone() } else { without_nulls(member) };
                    (name.clone(), member)
                })
                .collect(),
        ),
        Value::Array(values) => Value::Array(values.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

fn comparable(state: &LogState) -> LogState {
    let mut state = state.clone();
    if let Some(live) = &mut state.actions {
        live.protocol = live.protocol.as_ref().map(without_nulls);
        live.metadata = live.metadata.as_ref().map(without_nulls);
        live.files.values_mut().for_each(|add| *add = without_nulls(add));
    }
    state
}

/// A copy of the log delta-rs wrote and checkpointed (`testdata/`, made by its script).
fn delta_rs_table() -> tempfile::TempDir {
    fixture_table("delta-rs-checkpoint")
}

/// A copy of the log of the table `testdata/{name}`.
fn fixture_table(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("dir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/delta/testdata").join(name).join(log::LOG_DIR);
    std::fs::create_dir(dir.path().join(log::LOG_DIR)).expect("log dir");
    for entry in std::fs::read_dir(source).expect("the fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(log::LOG_DIR).join(entry.file_name())).expect("copies");
    }
    dir
}

#[test]
fn a_log_checkpoint_written_by_delta_rs_reads_as_its_commits_do() {
    let dir = delta_rs_table();
    let expected = from_commits(dir.path(), true);
    let expected_without_actions = from_commits(dir.path(), false);
    assert_eq!(expected.version, Some(6));
    assert_eq!(expected.transactions.get("sluice/p/out/0"), Some(&3));
    let live = expected.actions.as_ref().expect("kept");
    assert!(live.files.len() > 5, "{live:?}");
    assert!(live.files.values().any(|add| add["partitionValues"]["k"].is_null()), "a NULL partition value");
    let (state, start) = first_read(dir.path(), true).expect("reads");
    assert_eq!(start, Start::Checkpoint(5));
    assert_eq!(comparable(&state), comparable(&expected));
    clean_up_before(dir.path(), 5);
    let (state, _) = first_read(dir.path(), true).expect("reads without the early commits");
    assert_eq!(comparable(&state), comparable(&expected));
    let (state, _) = first_read(dir.path(), false).expect("reads without the live actions");
    assert_eq!(state, expected_without_actions);
}

/// The checkpoint of `version` split into two parts (`{v}.checkpoint.{i}.{2}.parquet`),
/// as a multi-part writer names them; the single file removed.
fn split_in_two_parts(path: &Path, version: u64) {
    let single = path.join(checkpoint::checkpoint_path(version));
    let bytes = Bytes::from(std::fs::read(&single).expect("the checkpoint"));
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .expect("parquet")
        .build()
        .expect("reader");
    let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
    let batch = arrow::compute::concat_batches(&checkpoint::schema(), &batches).expect("concat");
    let half = batch.num_rows() / 2;
    for (part, rows) in [(1, batch.slice(0, half)), (2, batch.slice(half, batch.num_rows() - half))] {
        let mut writer = parquet::arrow::ArrowWriter::try_new(Vec::new(), checkpoint::schema(), None).expect("writer");
        writer.write(&rows).expect("writes");
        write(path, &checkpoint::part_path(version, part, 2), &writer.into_inner().expect("finishes"));
    }
    std::fs::remove_file(single).expect("removes");
}

/// What a first read of a table of 8 commits with checkpoints at 3 and 6 does after
/// `damage`: the start it reads from, or the refusal's code and what its message says.
fn check(damage: impl FnOnce(&Path), expected: Result<Start, &[&str]>) {
    let dir = tempfile::tempdir().expect("dir");
    random_table(dir.path(), 11, 8, 3);
    let oracle = from_commits(dir.path(), true);
    damage(dir.path());
    match (first_read(dir.path(), true), expected) {
        (Ok((state, start)), Ok(expected)) => {
            assert_eq!(start, expected);
            assert_eq!(state, oracle, "the state is the commits' whatever the start");
        }
        (Err(error), Err(needles)) => {
            assert_eq!(error.code, "sink.delta_log_start", "{error}");
            assert!(error.message.contains(&open(dir.path()).url().to_string()), "names the table: {error}");
            for needle in needles {
                assert!(
                    error.message.contains(needle) || error.fix.as_deref().is_some_and(|f| f.contains(needle)),
                    "{needle}: {error}"
                );
            }
        }
        (outcome, expected) => panic!("expected {expected:?}, got {outcome:?}"),
    }
}

fn remove(path: &Path, relative: &str) {
    std::fs::remove_file(path.join(relative)).expect("removes");
}

#[test]
fn a_missing_stale_or_damaged_pointer_or_checkpoint_falls_back_to_what_the_log_holds() {
    let pointer = checkpoint::last_checkpoint_path();
    check(|_| {}, Ok(Start::Checkpoint(6)));
    check(|p| remove(p, &pointer), Ok(Start::Checkpoint(6)));
    check(|p| write(p, &pointer, b"not json"), Ok(Start::Checkpoint(6)));
    // Stale (its writer stopped before the pointer), the commits before the newer one gone.
    check(
        |p| {
            write(p, &pointer, &checkpoint::last_checkpoint(3, 1));
            clean_up_before(p, 6);
        },
        Ok(Start::Checkpoint(6)),
    );
    // Stale, its checkpoint still there but the commits after it gone: read from the
    // pointer, the log would seem to end at version 3.
    check(
        |p| {
            write(p, &pointer, &checkpoint::last_checkpoint(3, 1));
            (0..6).filter(|v| *v != 3).for_each(|v| remove(p, &log::commit_path(v)));
        },
        Ok(Start::Checkpoint(6)),
    );
    // A pointer larger than any is not read.
    check(|p| write(p, &pointer, &vec![b' '; (1 << 20) + 1]), Ok(Start::Checkpoint(6)));
    // A pointer to a checkpoint the log does not hold.
    check(|p| write(p, &pointer, &checkpoint::last_checkpoint(8, 1)), Ok(Start::Checkpoint(6)));
    // A damaged checkpoint: the one before it, or the commits from version 0.
    check(|p| write(p, &checkpoint::checkpoint_path(6), b"PAR1 garbage"), Ok(Start::Checkpoint(3)));
    check(
        |p| {
            write(p, &checkpoint::checkpoint_path(6), b"");
            remove(p, &checkpoint::checkpoint_path(3));
        },
        Ok(Start::Commits),
    );
    // A checkpoint without its metaData is not a table's state.
    check(
        |p| {
            let mut state = from_commits(p, true);
            state.actions.as_mut().expect("kept").metadata = None;
            write(p, &checkpoint::checkpoint_path(6), &checkpoint::encode(&state).expect("encodes").0);
        },
        Ok(Start::Checkpoint(3)),
    );
    // Multi-part: read when every part is there, passed over when one is missing.
    check(
        |p| {
            split_in_two_parts(p, 6);
            clean_up_before(p, 6);
        },
        Ok(Start::Checkpoint(6)),
    );
    check(
        |p| {
            split_in_two_parts(p, 6);
            remove(p, &checkpoint::part_path(6, 2, 2));
        },
        Ok(Start::Checkpoint(3)),
    );
    // A V2 checkpoint named by a UUID is not read.
    check(
        |p| {
            std::fs::rename(
                p.join(checkpoint::checkpoint_path(6)),
                p.join("_delta_log/00000000000000000006.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet"),
            )
            .expect("renames");
        },
        Ok(Start::Checkpoint(3)),
    );
}

#[test]
fn a_log_that_cannot_be_read_from_its_start_is_refused_naming_the_versions_and_the_fix() {
    // The only checkpoint after the gap is damaged: neither it nor version 0 can start.
    check(
        |p| {
            clean_up_before(p, 6);
            write(p, &checkpoint::checkpoint_path(6), b"garbage");
        },
        Err(&[
            "commits run from version 6 to 8",
            "version 6: ",
            "not Parquet",
            "restore the missing commits",
            "00000000000000000005.checkpoint.parquet",
        ]),
    );
    // A hole after the older checkpoint, the newer one damaged: no start reaches version 8.
    check(
        |p| {
            remove(p, &log::commit_path(5));
            write(p, &checkpoint::checkpoint_path(6), b"garbage");
        },
        Err(&["with versions missing before 6", "version 3: commits after it are missing"]),
    );
    // Commits removed without any checkpoint left.
    check(
        |p| clean_up_before(p, 7),
        Err(&["commits run from version 7 to 8", "no log checkpoint", "_last_checkpoint names version 6"]),
    );
    // Only a pointer: a log, not an empty table.
    check(|p| clean_up_before(p, 10), Err(&["it has no commits", "_last_checkpoint names version 6"]));
    // An empty log is a table to create.
    let dir = tempfile::tempdir().expect("dir");
    assert_eq!(first_read(dir.path(), true).expect("reads"), (LogState::new(true), Start::Empty));
}

#[test]
fn a_checkpoint_larger_than_the_bound_is_passed_over_unread() {
    let dir = tempfile::tempdir().expect("dir");
    random_table(dir.path(), 5, 4, 2);
    let small = |path: &Path| log_start::first_read_within("out", &open(path), true, 64);
    let (state, start) = small(dir.path()).expect("reads the commits instead");
    assert_eq!((state, start), (from_commits(dir.path(), true), Start::Commits));
    clean_up_before(dir.path(), 4);
    let error = small(dir.path()).expect_err("refused");
    assert!(error.message.contains("version 4: it holds"), "{error}");
    assert!(error.message.contains("bytes, more than the 64 read here"), "{error}");
}

fn sink_at(path: &Path, interval: u64) -> super::sink::DeltaSink {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("auction", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("region", arrow::datatypes::DataType::Utf8, true),
    ]));
    let options = super::DeltaOptions {
        path: path.display().to_string(),
        partition_by: vec!["region".into()],
        mode: Some(super::DeltaMode::Append),
        target_file_bytes: 1 << 20,
        row_group_rows: 16,
        storage: Vec::new(),
        checkpoint_interval: interval,
        compact_files: 0,
    };
    let layout = super::layout_of(&schema, false, &options.partition_by).expect("layout");
    let table = Table::new("out", open(path), interval, false);
    let input = super::shared::Input { schema: schema.clone(), updating: false, upsert_key: None };
    super::sink::DeltaSink::new(super::shared::Shared::new("out", "p", table, layout, options, input), true)
}

fn rows(epoch: u64) -> sluice_types::Batch {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("auction", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("region", arrow::datatypes::DataType::Utf8, true),
    ]));
    let auctions = arrow::array::Int64Array::from(vec![epoch as i64, 100 + epoch as i64]);
    let regions = arrow::array::StringArray::from(vec![Some("eu"), None]);
    sluice_types::Batch::inserts(
        RecordBatch::try_new(schema, vec![Arc::new(auctions), Arc::new(regions)]).expect("batch"),
    )
}

/// The auctions of every file the commit reader finds live, sorted.
fn committed_auctions(path: &Path) -> Vec<i64> {
    let state = from_commits(path, true);
    let mut auctions = Vec::new();
    for add in state.actions.expect("kept").files.values() {
        let relative = log::uri_decode(add["path"].as_str().expect("path"));
        let file = std::fs::File::open(path.join(relative)).expect("a committed file");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet")
            .build()
            .expect("reader");
        for batch in reader {
            let batch = batch.expect("batch");
            let column = batch.column(0).as_any().downcast_ref::<arrow::array::Int64Array>().expect("auction");
            auctions.extend(column.values().iter().copied());
        }
    }
    auctions.sort();
    auctions
}

/// A restart on a table whose commits before its newest log checkpoint were removed:
/// the restored epoch, whose txn only the checkpoint holds, is not committed again; the
/// next epochs are committed once; a fresh run is fenced by the txn it finds there.
#[test]
fn a_sink_resumes_exactly_once_on_a_table_whose_early_commits_were_cleaned_up() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), 2);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    let mut records = Vec::new();
    for epoch in 1..=4 {
        writer.write(&rows(epoch)).expect("writes");
        let record = writer.pre_commit(Epoch(epoch)).expect("pre-commits");
        sink.commit(Epoch(epoch), std::slice::from_ref(&record)).expect("commits");
        records.push(record);
    }
    // Versions 1..=4 are epochs 1..=4; checkpoints at 2 and 4. Clean up before 4, keeping
    // the removed commits aside for the oracle.
    let removed: Vec<(String, Vec<u8>)> = (0..4)
        .map(|v| (log::commit_path(v), std::fs::read(dir.path().join(log::commit_path(v))).expect("commit")))
        .collect();
    clean_up_before(dir.path(), 4);

    let fresh = sink_at(dir.path(), 2);
    let error = fresh.discard_after(None, &[]).expect_err("a run without a checkpoint is fenced");
    assert_eq!(error.code, "sink.delta_fenced", "{error}");

    let restarted = sink_at(dir.path(), 2);
    restarted.commit(Epoch(4), std::slice::from_ref(&records[3])).expect("recovery commits the restored epoch");
    restarted.discard_after(Some(Epoch(4)), &[]).expect("recovers");
    assert!(!dir.path().join(log::commit_path(5)).exists(), "epoch 4 is in the log: not committed again");
    let mut writer = restarted.open(0, 1, true).expect("opens");
    for epoch in 5..=6 {
        writer.write(&rows(epoch)).expect("writes");
        let record = writer.pre_commit(Epoch(epoch)).expect("pre-commits");
        restarted.commit(Epoch(epoch), std::slice::from_ref(&record)).expect("commits");
        restarted.commit(Epoch(epoch), &[record]).expect("a repeated commit is skipped");
    }
    for (relative, bytes) in removed {
        write(dir.path(), &relative, &bytes);
    }
    let expected: Vec<i64> = (1..=6).chain(101..=106).collect();
    assert_eq!(committed_auctions(dir.path()), expected, "every epoch once");
}

/// A first read lists `_delta_log/` from `_last_checkpoint`'s version on, so what it lists
/// follows the commits since the newest log checkpoint, not the log's length; a stale
/// pointer lists a little more (the newer checkpoint is found); a pointer whose checkpoint
/// cannot start the read, or none, lists the whole log. Each read is the commits' state.
#[test]
fn the_first_read_lists_the_log_from_the_last_checkpoint_on() {
    let dir = tempfile::tempdir().expect("dir");
    // Versions 0..=64, a checkpoint every 10 (10..=60), the pointer at 60.
    random_table(dir.path(), 3, 64, 10);
    let oracle = from_commits(dir.path(), true);
    let whole = 65 + 6 + 1;
    let listed = |expected: Start| {
        let objects = open(dir.path());
        let (state, start) = log_start::first_read("out", &objects, true).expect("reads");
        assert_eq!(start, expected);
        assert_eq!(state, oracle, "the state is the commits' whatever the listing");
        objects.listed_entries()
    };
    assert_eq!(listed(Start::Checkpoint(60)), 5 + 1 + 1, "commits 60..=64, the checkpoint of 60, the pointer");
    let pointer = checkpoint::last_checkpoint_path();
    write(dir.path(), &pointer, &checkpoint::last_checkpoint(40, 1));
    assert_eq!(listed(Start::Checkpoint(60)), 25 + 3 + 1, "stale: from version 40 on");
    write(dir.path(), &pointer, &checkpoint::last_checkpoint(60, 1));
    write(dir.path(), &checkpoint::checkpoint_path(60), b"garbage");
    assert_eq!(listed(Start::Checkpoint(50)), 7 + whole, "from 60 on, then the whole log for an older one");
    remove(dir.path(), &pointer);
    assert_eq!(listed(Start::Checkpoint(50)), whole - 1, "no pointer: the whole log");
}

/// The refusal of a table with the `v2Checkpoint` feature: the table, the feature, the fix.
fn assert_v2_refusal(error: &sluice_types::SluiceError, path: &Path) {
    assert_eq!(error.code, "sink.delta_protocol", "{error}");
    assert!(error.message.contains(open(path).url()), "names the table: {error}");
    assert!(error.message.contains("v2Checkpoint"), "names the feature: {error}");
    let fix = error.fix.as_deref().unwrap_or_default();
    assert!(fix.contains("new Delta table path") && fix.contains("DROP FEATURE v2Checkpoint"), "{error}");
}

/// A table delta-rs gave the `v2Checkpoint` feature and a V2 checkpoint (`testdata/`):
/// the checkpoint is never read (its rows hold the same state: the commits are read
/// instead), whether named as a classic one or by a UUID; the sink refuses the table
/// naming the feature, and commits nothing to it; once the commits before the checkpoint
/// are gone, the first read refuses it the same way.
#[test]
fn a_v2_checkpoint_is_never_read_and_its_table_is_refused_naming_the_feature() {
    for uuid_named in [false, true] {
        let dir = fixture_table("delta-rs-v2-checkpoint");
        if uuid_named {
            std::fs::rename(dir.path().join(checkpoint::checkpoint_path(2)), dir.path().join(V2_UUID_NAME))
                .expect("renames");
        }
        let expected = from_commits(dir.path(), true);
        assert!(expected.protocol.as_ref().expect("a protocol").requires(log::V2_CHECKPOINT));
        assert_eq!(expected.transactions.get("sluice/p/out/0"), Some(&1));
        let (state, start) = first_read(dir.path(), true).expect("reads the commits");
        assert_eq!((start, state), (Start::Commits, expected), "uuid_named {uuid_named}");

        let error = sink_at(dir.path(), 2).open(0, 1, true).err().expect("the sink refuses the table");
        assert_v2_refusal(&error, dir.path());
        assert!(error.message.contains("requires the writer features v2Checkpoint"), "{error}");
        let table = Table::new("out", open(dir.path()), 2, true);
        let error = table.commit(|_| Ok(Decision::Commit(Vec::new()))).expect_err("no commit");
        assert_v2_refusal(&error, dir.path());
        assert!(!dir.path().join(log::commit_path(4)).exists(), "nothing was committed");

        clean_up_before(dir.path(), 2);
        let error = first_read(dir.path(), true).expect_err("refused without the commits");
        assert_v2_refusal(&error, dir.path());
        assert!(error.message.contains("version 2: "), "{error}");
        assert!(error.message.contains("a V2 checkpoint"), "{error}");
    }
}
