//! Unit tests of the Delta sink: golden log actions and records, and tables written and
//! committed in a temporary directory (read back with the parquet crate).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde_json::Value;
use sluice_checkpoint::ObjectDir;
use sluice_runtime::SinkFactory;
use sluice_types::{Batch, Epoch};

use super::log::{self, AddFile, Column, LogState, TableMetadata};
use super::shared::{Input, Shared};
use super::sink::DeltaSink;
use super::table::Table;
use super::writer::PreparedFiles;
use super::{DeltaMode, DeltaOptions, layout_of};

#[test]
fn a_prepared_record_has_a_pinned_encoding() {
    let add = AddFile {
        path: "day=2026-01-01/part-a.snappy.parquet".into(),
        partition_values: Vec::new(),
        size: 1234,
        modification_time_ms: 1_700_000_000_000,
        rows: 7,
    };
    let record = PreparedFiles { epoch: 3, slot: 1, files: vec![(add, vec![Some("2026-01-01".into()), None])] };
    let bytes = record.encode();
    let golden = concat!(
        "01",
        "0300000000000000",
        "01000000",
        "01000000",
        "24000000",
        "6461793d323032362d30312d30312f706172742d612e736e617070792e70617271756574",
        "d204000000000000",
        "0700000000000000",
        "0068e5cf8b010000",
        "02000000",
        "01",
        "0a000000",
        "323032362d30312d3031",
        "00",
    );
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, golden);
    assert_eq!(PreparedFiles::decode("s", &bytes).expect("decodes"), record);
    for cut in 0..bytes.len() {
        assert!(PreparedFiles::decode("s", &bytes[..cut]).is_err(), "a record cut at {cut} is refused");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(PreparedFiles::decode("s", &longer).is_err(), "trailing bytes are refused");
}

fn metadata() -> TableMetadata {
    let column =
        |name: &str, delta_type: &str, nullable| Column { name: name.into(), delta_type: delta_type.into(), nullable };
    TableMetadata {
        columns: vec![
            column("auction", "long", false),
            column("day", "date", true),
            column("at", "timestamp_ntz", true),
        ],
        partition_columns: vec!["day".into()],
        invariants: Vec::new(),
    }
}

#[test]
fn the_first_commit_has_golden_actions() {
    let text = String::from_utf8(log::encode_commit(&log::create_actions("id-1", &metadata(), 1000))).expect("utf-8");
    let engine = concat!("sluice/", env!("CARGO_PKG_VERSION"));
    let expected = format!(
        "{{\"protocol\":{{\"minReaderVersion\":3,\"minWriterVersion\":7,\"readerFeatures\":[\"timestampNtz\"],\"writerFeatures\":[\"timestampNtz\"]}}}}\n\
         {{\"metaData\":{{\"configuration\":{{}},\"createdTime\":1000,\"format\":{{\"options\":{{}},\"provider\":\"parquet\"}},\"id\":\"id-1\",\"partitionColumns\":[\"day\"],\
         \"schemaString\":\"{{\\\"fields\\\":[{{\\\"metadata\\\":{{}},\\\"name\\\":\\\"auction\\\",\\\"nullable\\\":false,\\\"type\\\":\\\"long\\\"}},\
         {{\\\"metadata\\\":{{}},\\\"name\\\":\\\"day\\\",\\\"nullable\\\":true,\\\"type\\\":\\\"date\\\"}},\
         {{\\\"metadata\\\":{{}},\\\"name\\\":\\\"at\\\",\\\"nullable\\\":true,\\\"type\\\":\\\"timestamp_ntz\\\"}}],\\\"type\\\":\\\"struct\\\"}}\"}}}}\n\
         {{\"commitInfo\":{{\"engineInfo\":\"{engine}\",\"operation\":\"CREATE TABLE\",\"operationParameters\":{{}},\"timestamp\":1000}}}}\n"
    );
    assert_eq!(text, expected);
    let mut state = LogState::default();
    state.apply(0, text.as_bytes()).expect("applies");
    assert_eq!(state.metadata, Some(metadata()));
}

#[test]
fn an_epoch_commit_has_golden_add_and_txn_actions() {
    let add = AddFile {
        path: "day=a%3Ab/part 1.snappy.parquet".into(),
        partition_values: vec![("day".into(), Some("a:b".into())), ("k".into(), None)],
        size: 10,
        modification_time_ms: 5,
        rows: 2,
    };
    let actions = [log::add_action(&add), log::txn_action("sluice/p/s/0", 4, 6)];
    let text = String::from_utf8(log::encode_commit(&actions)).expect("utf-8");
    assert_eq!(
        text,
        "{\"add\":{\"dataChange\":true,\"modificationTime\":5,\"partitionValues\":{\"day\":\"a:b\",\"k\":null},\
         \"path\":\"day=a%253Ab/part%201.snappy.parquet\",\"size\":10,\"stats\":\"{\\\"numRecords\\\":2}\"}}\n\
         {\"txn\":{\"appId\":\"sluice/p/s/0\",\"lastUpdated\":6,\"version\":4}}\n"
    );
    let mut state = LogState::default();
    state.apply(0, text.as_bytes()).expect("applies");
    state.apply(1, log::encode_commit(&[log::txn_action("sluice/p/s/0", 2, 7)]).as_slice()).expect("applies");
    assert_eq!(state.transactions.get("sluice/p/s/0"), Some(&4), "the newest version of an app is its highest");
    assert_eq!(state.version, Some(1));
}

#[test]
fn partition_directories_and_commit_names_escape_as_delta_readers_expect() {
    assert_eq!(log::partition_directory("day", Some("2026-01-01")), "day=2026-01-01");
    assert_eq!(log::partition_directory("c", Some("a/b=c")), "c=a%2Fb%3Dc");
    assert_eq!(log::partition_directory("c", None), "c=__HIVE_DEFAULT_PARTITION__");
    assert_eq!(log::commit_path(12), "_delta_log/00000000000000000012.json");
    assert_eq!(log::commit_version("_delta_log/00000000000000000012.json"), Some(12));
    assert_eq!(log::commit_version("_delta_log/00000000000000000012.checkpoint.parquet"), None);
    assert_eq!(log::commit_version("_delta_log/_last_checkpoint"), None);
}

#[test]
fn types_a_delta_table_cannot_hold_are_refused_naming_the_column() {
    let schema =
        Schema::new(vec![Field::new("span", DataType::Interval(arrow::datatypes::IntervalUnit::DayTime), true)]);
    let error = layout_of(&schema, false, &[]).expect_err("refused");
    assert_eq!(error.code, "sink.delta_type");
    assert!(error.message.contains("column `span`"), "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("CAST `span`")), "{error}");
    let schema =
        Schema::new(vec![Field::new("price", DataType::Float64, true), Field::new("a", DataType::Int64, true)]);
    let error = layout_of(&schema, false, &["price".into()]).expect_err("refused");
    assert!(error.message.contains("partition column `price`"), "{error}");
    let error = layout_of(&schema, false, &["nope".into()]).expect_err("refused");
    assert!(error.message.contains("`nope`, which is not a column"), "{error}");
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("region", DataType::Utf8, true),
        Field::new("at", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]))
}

fn options(path: &Path, target_file_bytes: usize) -> DeltaOptions {
    DeltaOptions {
        path: path.display().to_string(),
        partition_by: vec!["region".into()],
        mode: Some(DeltaMode::Append),
        target_file_bytes,
        row_group_rows: 4,
        storage: Vec::new(),
        checkpoint_interval: 2,
        compact_files: 0,
    }
}

fn sink_at(path: &Path, pipeline: &str, target_file_bytes: usize) -> DeltaSink {
    let options = options(path, target_file_bytes);
    let layout = layout_of(&schema(), false, &options.partition_by).expect("layout");
    let dir = ObjectDir::open(&options.path, Path::new("/"), &[], "Delta table", "sink.delta_io").expect("opens");
    let shared = Shared::new(
        "out",
        pipeline,
        Table::new("out", dir, options.checkpoint_interval, options.compact_files > 0),
        layout,
        options,
        Input { schema: schema(), updating: false, upsert_key: None },
    );
    DeltaSink::new(shared, true)
}

fn batch(rows: &[(i64, Option<&str>)]) -> Batch {
    let auctions = Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let regions = StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
    let at = arrow::array::TimestampMillisecondArray::from(rows.iter().map(|r| r.0 * 1000).collect::<Vec<_>>());
    Batch::inserts(
        RecordBatch::try_new(schema(), vec![Arc::new(auctions), Arc::new(regions), Arc::new(at)]).expect("batch"),
    )
}

/// The table's rows as (auction, region), sorted: every committed file read back.
fn table_rows(path: &Path) -> Vec<(i64, Option<String>)> {
    let mut state = LogState::default();
    let mut adds: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
    for version in 0.. {
        let Ok(text) = std::fs::read(path.join(log::commit_path(version))) else { break };
        state.apply(version, &text).expect("a commit");
        for line in String::from_utf8(text).expect("utf-8").lines() {
            let action: Value = serde_json::from_str(line).expect("json");
            if let Some(add) = action.get("add") {
                adds.insert(add["path"].as_str().expect("path").to_string(), add.clone());
            }
            if let Some(remove) = action.get("remove") {
                adds.remove(remove["path"].as_str().expect("path")).expect("a removed file was live");
            }
        }
    }
    let mut rows = Vec::new();
    for add in adds.into_values() {
        let relative = add["path"].as_str().expect("path").replace("%25", "%");
        let region = add["partitionValues"]["region"].as_str().map(str::to_string);
        let file = std::fs::File::open(path.join(&relative)).expect("a committed file exists");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet")
            .build()
            .expect("reader");
        for batch in reader {
            let batch = batch.expect("batch");
            assert_eq!(batch.schema().field(1).data_type(), &DataType::Timestamp(TimeUnit::Microsecond, None));
            let auctions = batch.column(0).as_any().downcast_ref::<Int64Array>().expect("auction");
            for row in 0..batch.num_rows() {
                assert!(!auctions.is_null(row));
                rows.push((auctions.value(row), region.clone()));
            }
        }
    }
    rows.sort();
    rows
}

fn check_rows(path: &Path, expected: &[(i64, Option<&str>)]) {
    let mut expected: Vec<(i64, Option<String>)> = expected.iter().map(|(a, r)| (*a, r.map(str::to_string))).collect();
    expected.sort();
    assert_eq!(table_rows(path), expected);
}

#[test]
fn staged_epochs_become_visible_once_each_at_their_commit() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1 << 20);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    writer.write(&batch(&[(1, Some("eu")), (2, Some("us")), (3, None)])).expect("writes");
    let record = writer.pre_commit(Epoch(1)).expect("pre-commits");
    check_rows(dir.path(), &[]);
    sink.commit(Epoch(1), std::slice::from_ref(&record)).expect("commits");
    let expected = [(1, Some("eu")), (2, Some("us")), (3, None)];
    check_rows(dir.path(), &expected);
    sink.commit(Epoch(1), std::slice::from_ref(&record)).expect("a repeated commit");
    check_rows(dir.path(), &expected);

    // An epoch without rows adds no commit.
    let empty = writer.pre_commit(Epoch(2)).expect("pre-commits");
    let versions = std::fs::read_dir(dir.path().join("_delta_log")).expect("log").count();
    sink.commit(Epoch(2), &[empty]).expect("commits nothing");
    assert_eq!(std::fs::read_dir(dir.path().join("_delta_log")).expect("log").count(), versions);

    // A restart from epoch 1: the files of epoch 3, never committed, stay invisible.
    writer.write(&batch(&[(4, Some("eu"))])).expect("writes");
    let _lost = writer.pre_commit(Epoch(3)).expect("pre-commits");
    let restarted = sink_at(dir.path(), "p", 1 << 20);
    restarted.commit(Epoch(1), std::slice::from_ref(&record)).expect("recovery repeats the restored commit");
    restarted.discard_after(Some(Epoch(1)), std::slice::from_ref(&record)).expect("recovers");
    check_rows(dir.path(), &expected);
    let mut writer = restarted.open(0, 1, true).expect("opens");
    writer.write(&batch(&[(4, Some("eu"))])).expect("writes");
    let record = writer.pre_commit(Epoch(3)).expect("pre-commits");
    restarted.commit(Epoch(3), &[record]).expect("commits");
    check_rows(dir.path(), &[(1, Some("eu")), (2, Some("us")), (3, None), (4, Some("eu"))]);
}

#[test]
fn files_roll_at_the_target_size() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    for auction in 0..5 {
        writer.write(&batch(&[(auction, Some("eu"))])).expect("writes");
    }
    let record = writer.pre_commit(Epoch(1)).expect("pre-commits");
    let files = PreparedFiles::decode("out", &record).expect("decodes").files;
    assert_eq!(files.len(), 5, "each write reached the target size and finished its file");
    sink.commit(Epoch(1), &[record]).expect("commits");
    check_rows(dir.path(), &[(0, Some("eu")), (1, Some("eu")), (2, Some("eu")), (3, Some("eu")), (4, Some("eu"))]);
}

/// A data file's row groups hold at most `row_group_rows` rows (4 here), however the rows
/// arrive.
#[test]
fn row_groups_hold_at_most_row_group_rows() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1 << 20);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    let rows: Vec<(i64, Option<&str>)> = (0..10).map(|auction| (auction, Some("eu"))).collect();
    writer.write(&batch(&rows[..7])).expect("writes");
    writer.write(&batch(&rows[7..])).expect("writes");
    let record = writer.pre_commit(Epoch(1)).expect("pre-commits");
    let files = PreparedFiles::decode("out", &record).expect("decodes").files;
    assert_eq!(files.len(), 1, "one partition, under the target size");
    let file = std::fs::File::open(dir.path().join(&files[0].0.path)).expect("the file");
    let metadata = parquet::file::reader::SerializedFileReader::new(file).expect("parquet");
    let groups: Vec<i64> = parquet::file::reader::FileReader::metadata(&metadata)
        .row_groups()
        .iter()
        .map(|group| group.num_rows())
        .collect();
    assert_eq!(groups, [4, 4, 2]);
    sink.commit(Epoch(1), &[record]).expect("commits");
    check_rows(dir.path(), &rows);
}

#[test]
fn a_second_run_on_the_table_is_fenced() {
    let dir = tempfile::tempdir().expect("dir");
    let first = sink_at(dir.path(), "p", 1 << 20);
    first.discard_after(None, &[]).expect("a fresh table");
    let mut writer = first.open(0, 1, true).expect("opens");
    writer.write(&batch(&[(1, Some("eu"))])).expect("writes");
    let record = writer.pre_commit(Epoch(1)).expect("pre-commits");
    first.commit(Epoch(1), &[record]).expect("commits");

    // A fresh run (no checkpoint) of the same pipeline is refused.
    let second = sink_at(dir.path(), "p", 1 << 20);
    let error = second.discard_after(None, &[]).expect_err("refused");
    assert_eq!(error.code, "sink.delta_fenced");
    assert!(error.message.contains("already holds epochs up to 1"), "{error}");

    // A run that recovered the same epoch, racing the first: whichever commits second fails.
    let racing = sink_at(dir.path(), "p", 1 << 20);
    racing.discard_after(Some(Epoch(1)), &[]).expect("recovers");
    writer.write(&batch(&[(2, Some("eu"))])).expect("writes");
    let record = writer.pre_commit(Epoch(2)).expect("pre-commits");
    first.commit(Epoch(2), &[record]).expect("the first run commits");
    let mut other = racing.open(0, 1, true).expect("opens");
    other.write(&batch(&[(3, Some("us"))])).expect("writes");
    let record = other.pre_commit(Epoch(2)).expect("pre-commits");
    let error = racing.commit(Epoch(2), &[record]).expect_err("fenced");
    assert_eq!(error.code, "sink.delta_fenced", "{error}");
    check_rows(dir.path(), &[(1, Some("eu")), (2, Some("eu"))]);

    // Another pipeline's sink has other ids, and appends beside it.
    let neighbour = sink_at(dir.path(), "q", 1 << 20);
    neighbour.discard_after(None, &[]).expect("its own ids are fresh");
}

#[test]
fn an_existing_table_with_other_columns_is_refused_naming_them() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1 << 20);
    drop(sink.open(0, 1, true).expect("creates the table"));
    let other = Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Float64, false),
        Field::new("region", DataType::Utf8, true),
        Field::new("extra", DataType::Utf8, true),
    ]));
    let options = options(dir.path(), 1 << 20);
    let layout = layout_of(&other, false, &options.partition_by).expect("layout");
    let objects = ObjectDir::open(&options.path, Path::new("/"), &[], "Delta table", "sink.delta_io").expect("opens");
    let shared = Shared::new(
        "out",
        "p",
        Table::new("out", objects, options.checkpoint_interval, options.compact_files > 0),
        layout,
        options,
        Input { schema: other, updating: false, upsert_key: None },
    );
    let error = DeltaSink::new(shared, true).open(0, 1, true).err().expect("refused");
    assert_eq!(error.code, "sink.delta_schema");
    for needle in [
        "column `auction`: the table has long, the view writes double",
        "column `extra` (string) is not in the table",
        "column `at` (timestamp_ntz) of the table",
    ] {
        assert!(error.message.contains(needle), "{needle}: {error}");
    }
    assert!(error.fix.is_some());
}

/// A view whose column may be NULL does not write into a table whose column is NOT NULL
/// (readers trust it); the other way round is fine.
#[test]
fn a_nullable_column_is_refused_for_a_not_null_one_of_the_table() {
    let column = |nullable: bool| Column { name: "auction".into(), delta_type: "long".into(), nullable };
    let table = |nullable: bool| TableMetadata {
        columns: vec![column(nullable)],
        partition_columns: Vec::new(),
        invariants: Vec::new(),
    };
    let error = super::check_schema("out", "file:///t", &table(false), &table(true)).expect_err("refused");
    assert_eq!(error.code, "sink.delta_schema");
    assert!(error.message.contains("column `auction`: the table's is NOT NULL, the view's may be NULL"), "{error}");
    super::check_schema("out", "file:///t", &table(true), &table(false)).expect("a NOT NULL view fits");
    super::check_schema("out", "file:///t", &table(false), &table(false)).expect("the same");
}

#[test]
fn a_table_asking_for_writer_features_the_sink_does_not_maintain_is_refused() {
    let check = |protocol: &str| {
        let dir = tempfile::tempdir().expect("dir");
        let mut actions =
            log::create_actions("id", &layout_of(&schema(), false, &["region".into()]).expect("layout").metadata, 1);
        actions[0] = serde_json::from_str(protocol).expect("json");
        std::fs::create_dir_all(dir.path().join("_delta_log")).expect("log dir");
        std::fs::write(dir.path().join(log::commit_path(0)), log::encode_commit(&actions)).expect("write");
        sink_at(dir.path(), "p", 1 << 20).open(0, 1, true).err()
    };
    let accepted = r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["timestampNtz"],"writerFeatures":["timestampNtz","appendOnly"]}}"#;
    assert!(check(accepted).is_none(), "known features are accepted");
    let refused = r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["timestampNtz","deletionVectors"],"writerFeatures":["timestampNtz","deletionVectors"]}}"#;
    let error = check(refused).expect("refused");
    assert_eq!(error.code, "sink.delta_protocol");
    assert!(error.message.contains("the writer features deletionVectors"), "{error}");
    let error = check(r#"{"protocol":{"minReaderVersion":1,"minWriterVersion":4}}"#).expect("refused");
    assert!(error.message.contains("writer version 4"), "{error}");
    // A reader feature the writer features leave out (against the protocol) is refused too.
    let error = check(r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":2,"readerFeatures":["v2Checkpoint"]}}"#)
        .expect("refused");
    assert!(error.message.contains("the reader features v2Checkpoint"), "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("DROP FEATURE v2Checkpoint")), "{error}");
}

/// A table another engine upgraded (here to V2 log checkpoints) after this sink uploaded an
/// epoch's files gets no commit: a recovery's commit of the restored epoch, which comes
/// before any writer's setup, is refused naming the table, the feature and the fix.
#[test]
fn a_table_upgraded_to_a_feature_the_sink_does_not_maintain_gets_no_commit_not_even_a_recovery() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1 << 20);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    writer.write(&batch(&[(1, Some("eu"))])).expect("writes");
    let record = writer.pre_commit(Epoch(1)).expect("pre-commits");
    let upgrade = r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["timestampNtz","v2Checkpoint"],"writerFeatures":["timestampNtz","v2Checkpoint"]}}"#;
    std::fs::write(dir.path().join(log::commit_path(1)), format!("{upgrade}\n")).expect("another engine commits");

    let restarted = sink_at(dir.path(), "p", 1 << 20);
    let error = restarted.commit(Epoch(1), &[record]).expect_err("refused");
    assert_eq!(error.code, "sink.delta_protocol", "{error}");
    assert!(error.message.contains("requires the writer features v2Checkpoint"), "{error}");
    assert!(error.message.contains(&format!("Delta table file://{}", dir.path().display())), "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("DROP FEATURE v2Checkpoint")), "{error}");
    assert!(!dir.path().join(log::commit_path(2)).exists(), "nothing was committed");
}

#[test]
fn every_second_version_writes_a_log_checkpoint_of_the_live_state() {
    let dir = tempfile::tempdir().expect("dir");
    let sink = sink_at(dir.path(), "p", 1 << 20);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    for epoch in 1..=4 {
        writer.write(&batch(&[(epoch, Some("eu")), (epoch + 10, Some("us"))])).expect("writes");
        let record = writer.pre_commit(Epoch(epoch as u64)).expect("pre-commits");
        sink.commit(Epoch(epoch as u64), &[record]).expect("commits");
    }
    let pointer: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("_delta_log/_last_checkpoint")).expect("a checkpoint was written"),
    )
    .expect("json");
    // Versions 1..=4 are the epochs; 2 and 4 are checkpointed. Rows: protocol, metaData,
    // one txn and the 8 files (two partitions per epoch).
    assert_eq!(pointer, serde_json::json!({"version": 4, "size": 11}));
    let file =
        std::fs::File::open(dir.path().join("_delta_log/00000000000000000004.checkpoint.parquet")).expect("file");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
    let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
    assert_eq!(batch.schema(), super::checkpoint::schema());
    let adds =
        batch.column_by_name("add").expect("add").as_any().downcast_ref::<arrow::array::StructArray>().expect("struct");
    let paths = adds.column_by_name("path").expect("path").as_any().downcast_ref::<StringArray>().expect("strings");
    let live: Vec<&str> = (0..batch.num_rows()).filter(|&row| adds.is_valid(row)).map(|row| paths.value(row)).collect();
    assert_eq!(live.len(), 8);
    assert!(live.iter().all(|path| path.starts_with("region=")), "{live:?}");
    let txn =
        batch.column_by_name("txn").expect("txn").as_any().downcast_ref::<arrow::array::StructArray>().expect("struct");
    let versions = txn.column_by_name("version").expect("v").as_any().downcast_ref::<Int64Array>().expect("longs");
    let newest: Vec<i64> =
        (0..batch.num_rows()).filter(|&row| txn.is_valid(row)).map(|row| versions.value(row)).collect();
    assert_eq!(newest, [4]);
    check_rows(
        dir.path(),
        &[
            (1, Some("eu")),
            (2, Some("eu")),
            (3, Some("eu")),
            (4, Some("eu")),
            (11, Some("us")),
            (12, Some("us")),
            (13, Some("us")),
            (14, Some("us")),
        ],
    );
}

#[test]
fn a_partition_with_enough_small_files_is_compacted_into_one() {
    let dir = tempfile::tempdir().expect("dir");
    let mut options = options(dir.path(), 1 << 20);
    options.compact_files = 3;
    options.checkpoint_interval = 0;
    let layout = layout_of(&schema(), false, &options.partition_by).expect("layout");
    let objects = ObjectDir::open(&options.path, Path::new("/"), &[], "Delta table", "sink.delta_io").expect("opens");
    let table = Table::new("out", objects, 0, true);
    let input = Input { schema: schema(), updating: false, upsert_key: None };
    let sink = DeltaSink::new(Shared::new("out", "p", table, layout, options, input), true);
    sink.discard_after(None, &[]).expect("a fresh table");
    let mut writer = sink.open(0, 1, true).expect("opens");
    let mut expected = Vec::new();
    for epoch in 1..=4 {
        let rows = [(epoch, Some("eu")), (epoch + 10, Some("us"))];
        expected.extend(rows);
        writer.write(&batch(&rows)).expect("writes");
        let record = writer.pre_commit(Epoch(epoch as u64)).expect("pre-commits");
        sink.commit(Epoch(epoch as u64), &[record]).expect("commits");
    }
    check_rows(dir.path(), &expected);
    let mut live: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut removed = 0;
    for version in 0.. {
        let Ok(text) = std::fs::read_to_string(dir.path().join(log::commit_path(version))) else { break };
        for line in text.lines() {
            let action: Value = serde_json::from_str(line).expect("json");
            if let Some(add) = action.get("add") {
                *live.entry(add["partitionValues"]["region"].as_str().expect("region").to_string()).or_default() += 1;
            }
            if let Some(remove) = action.get("remove") {
                assert_eq!(remove["dataChange"], Value::Bool(false));
                *live.get_mut(remove["partitionValues"]["region"].as_str().expect("region")).expect("live") -= 1;
                removed += 1;
            }
        }
    }
    // One compaction follows a commit: after epoch 3, eu's 3 small files became one;
    // after epoch 4, us's 4 (eu then held 2, below the minimum).
    assert_eq!(removed, 7);
    assert_eq!(live, [("eu".to_string(), 2), ("us".to_string(), 1)].into_iter().collect());
}
