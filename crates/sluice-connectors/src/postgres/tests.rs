//! Tests of the PostgreSQL sink that need no server: options, the mode and key a
//! stream gets, the pre-commit record's encoding, statements, and how weighted rows
//! become changes (the server tests are in the CLI's integration tests,
//! `tests/cli/postgres.rs`).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_config::{SinkConfig, parse_partial};
use sluice_types::Batch;

use super::options::{PostgresSinkOptions, TableName, WriteMode, sink_options_of};
use super::rows::Pending;
use super::table::{Statements, create_table_ddl};
use super::{PreparedRecord, resolve_mode};
use crate::connector::SinkContext;

pub(super) fn config(options: &str) -> SinkConfig {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[sink]]\nname = \"out\"\nfrom = \"v\"\nconnector = \"postgres\"\n[sink.options]\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    config.expect("parses").sinks.remove(0)
}

fn options(text: &str) -> Result<PostgresSinkOptions, String> {
    sink_options_of(&config(text)).map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

const URL: &str = "url = \"postgres://sluice:secret@127.0.0.1:5432/app\"\n";

#[test]
fn options_are_read_with_their_defaults() {
    let read = options(&format!("{URL}table = \"public.counts\"\n")).expect("valid");
    assert_eq!(read.table, TableName { schema: Some("public".into()), name: "counts".into() });
    assert_eq!(read.table.quoted(), "\"public\".\"counts\"");
    assert_eq!((read.mode, read.key.clone(), read.create_table, read.batch_rows), (None, None, false, 1000));
    assert!(!format!("{read:?}").contains("secret"), "the password never shows: {read:?}");
    let read = options(
        "url = \"host=127.0.0.1 port=5433 dbname=app user=u\"\npassword_env = \"PW\"\ntable = \"t\"\nmode = \"upsert\"\n\
         key = [\"a\", \"b\"]\ncreate_table = true\nbatch_rows = 5\nconnect_timeout = \"2s\"\n",
    )
    .expect("valid");
    assert_eq!(read.mode, Some(WriteMode::Upsert));
    assert_eq!(read.key, Some(vec!["a".to_owned(), "b".to_owned()]));
    assert_eq!((read.create_table, read.batch_rows, read.password_env.as_deref()), (true, 5, Some("PW")));
}

#[test]
fn bad_options_are_each_named_with_a_fix() {
    let check = |text: &str, needles: &[&str]| {
        let message = options(text).expect_err("refused");
        for needle in needles {
            assert!(message.contains(needle), "{text:?}: {needle:?} not in {message}");
        }
        assert!(!message.contains("secret"), "the password never shows: {message}");
    };
    check("table = \"t\"\n", &["url", "add url"]);
    check(URL, &["table", "add table"]);
    check("url = \"postgres://u:secret@[bad\"\ntable = \"t\"\n", &["`url` must be", "e.g. url"]);
    check(&format!("{URL}table = \"a.b.c\"\n"), &["`table` must be"]);
    check(&format!("{URL}table = \"t\"\nmode = \"merge\"\n"), &["`mode` must be", "append", "upsert"]);
    check(&format!("{URL}table = \"t\"\nkey = [\"a\", \"a\"]\n"), &["`key` must be"]);
    check(&format!("{URL}table = \"t\"\nmode = \"append\"\nkey = \"a\"\n"), &["mode = \"upsert\""]);
    check(&format!("{URL}table = \"t\"\nbatch_rows = 0\n"), &["batch_rows"]);
    check(&format!("{URL}table = \"t\"\npasword_env = \"X\"\n"), &["password_env"]);
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("n", DataType::Int64, true),
        Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]))
}

fn resolve(text: &str, updating: bool, upsert_key: Option<Vec<usize>>) -> Result<(WriteMode, Vec<usize>), String> {
    let config = config(&format!("{URL}table = \"t\"\n{text}"));
    let options = sink_options_of(&config).expect("valid");
    let context = SinkContext {
        pipeline: "p",
        config: &config,
        base_dir: Path::new("."),
        schema: schema(),
        updating,
        upsert_key,
        exactly_once: true,
        checkpoint_span: None,
    };
    resolve_mode("out", &options, &context).map_err(|e| e.to_string())
}

#[test]
fn the_mode_and_key_follow_the_stream_unless_set() {
    assert_eq!(resolve("", false, None), Ok((WriteMode::Append, vec![])));
    assert_eq!(resolve("", true, Some(vec![0])), Ok((WriteMode::Upsert, vec![0])));
    assert_eq!(resolve("key = [\"n\", \"k\"]\n", true, Some(vec![0])), Ok((WriteMode::Upsert, vec![1, 0])));
    assert_eq!(resolve("mode = \"upsert\"\nkey = \"k\"\n", false, None), Ok((WriteMode::Upsert, vec![0])));
    let refused = resolve("mode = \"append\"\n", true, Some(vec![0])).expect_err("refused");
    assert!(
        refused.contains("updating stream") && refused.contains("mode = \\\"upsert\\\"")
            || refused.contains("mode = \"upsert\""),
        "{refused}"
    );
    let refused = resolve("", true, None).expect_err("refused");
    assert!(refused.contains("without a known upsert key") && refused.contains("k, n, t"), "{refused}");
    let refused = resolve("", true, Some(vec![])).expect_err("refused");
    assert!(refused.contains("one row at a time"), "{refused}");
    let refused = resolve("key = \"zz\"\n", true, Some(vec![0])).expect_err("refused");
    assert!(refused.contains("zz") && refused.contains("k, n, t"), "{refused}");
}

#[test]
fn prepared_records_are_pinned_by_a_golden_vector() {
    let record = PreparedRecord { epoch: 3, slot: 1, gid: "ab".to_owned() };
    let golden = [1, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'a', b'b'];
    assert_eq!(record.encode(), golden);
    assert_eq!(PreparedRecord::decode("s", &golden).expect("decodes"), record);
    for cut in 0..golden.len() {
        assert!(PreparedRecord::decode("s", &golden[..cut]).is_err(), "cut at {cut}");
    }
    let mut other_version = golden;
    other_version[0] = 2;
    assert!(PreparedRecord::decode("s", &other_version).is_err());
}

#[test]
fn statements_cast_each_value_to_its_column_type() {
    let table = TableName { schema: None, name: "My \"t\"".into() };
    let casts = vec!["text".to_owned(), "bigint".to_owned(), "timestamp without time zone".to_owned()];
    let statements = Statements::new(&table, &schema(), casts, vec![0]);
    assert_eq!(
        statements.upsert(2),
        "INSERT INTO \"My \"\"t\"\"\" (\"k\", \"n\", \"t\") VALUES ($1::text, $2::bigint, $3::timestamp without time zone), \
         ($4::text, $5::bigint, $6::timestamp without time zone) ON CONFLICT (\"k\") DO UPDATE SET \"n\" = EXCLUDED.\"n\", \
         \"t\" = EXCLUDED.\"t\""
    );
    assert_eq!(statements.delete(2), "DELETE FROM \"My \"\"t\"\"\" WHERE (\"k\") IN (($1::text), ($2::text))");
    assert_eq!(
        create_table_ddl(&table, &schema(), &[0]),
        "CREATE TABLE IF NOT EXISTS \"My \"\"t\"\"\" (\"k\" text NOT NULL, \"n\" bigint, \"t\" timestamp(3), PRIMARY KEY (\"k\"))"
    );
}

fn batch(rows: &[(&str, i64, i64)]) -> Batch {
    let keys = StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let values = Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false), Field::new("n", DataType::Int64, true)]));
    let rows_batch = RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(values)]).expect("batch");
    Batch::with_weights(rows_batch, Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>()))
}

#[test]
fn changes_of_a_key_collapse_to_the_last_and_appends_repeat_by_weight() {
    let schema = batch(&[]).rows.schema();
    let mut pending = Pending::new(&schema, Some(&[0])).expect("pending");
    // +I a, -U a / +U a, +I b, -D b, +I c, -D c / +I c.
    pending
        .add("s", &batch(&[("a", 1, 1), ("a", 1, -1), ("a", 2, 1), ("b", 1, 1), ("b", 1, -1), ("c", 1, 1)]))
        .expect("added");
    pending.add("s", &batch(&[("c", 1, -1), ("c", 5, 1), ("d", 9, -1)])).expect("added");
    assert_eq!(pending.len(), 4);
    let (mut upserts, mut deletes) = pending.take();
    upserts.sort();
    deletes.sort();
    let text = |values: &[&str]| values.iter().map(|v| Some((*v).to_owned())).collect::<Vec<_>>();
    assert_eq!(upserts, vec![text(&["a", "2"]), text(&["c", "5"])]);
    assert_eq!(deletes, vec![text(&["b"]), text(&["d"])]);
    assert!(pending.is_empty());
    let mut append = Pending::new(&schema, None).expect("pending");
    append.add("s", &batch(&[("a", 1, 2), ("b", 2, 1)])).expect("added");
    assert_eq!(append.take().0, vec![text(&["a", "1"]), text(&["a", "1"]), text(&["b", "2"])]);
    assert!(append.add("s", &batch(&[("a", 1, -1)])).is_err(), "a retraction cannot be appended");
}
