//! Golden vectors: the canonical form and the fingerprint of a fixed pipeline are pinned,
//! so a dependency upgrade that changes either (a type's name, a hash) fails here instead
//! of refusing every checkpoint written by an earlier build.

use std::path::Path;

use arrow::datatypes::{DataType, Field, TimeUnit};

use super::*;
use crate::Engine;
use crate::load::Overrides;

const PIPELINE: &str = r#"
[pipeline]
name = "fp"
vnodes = 64
threads = 3

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT NOT NULL, price DECIMAL(10, 2), ts TIMESTAMP(3)"
event_time = "ts"
watermark_delay = "2s"
[source.options]
path = "events.jsonl"

[[view]]
name = "sums"
sql = "SELECT k, SUM(v) AS total, window_start FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY k, window_start, window_end"

[[sink]]
name = "out"
from = "sums"
connector = "blackhole"
"#;

fn compile(text: &str, dir: &Path) -> crate::CompiledPipeline {
    let pipeline = Engine::default().parse(text, "p.toml", dir, Overrides::default()).expect("valid");
    pipeline.compile(None).expect("compiles")
}

#[test]
fn the_canonical_form_and_fingerprint_of_a_pipeline_are_pinned() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("write");
    let compiled = compile(PIPELINE, dir.path());
    let pipeline = Engine::default().parse(PIPELINE, "p.toml", dir.path(), Overrides::default()).expect("valid");
    let form = canonical_form(&pipeline.config, &compiled.plan).expect("form");
    let sql = "SELECT k, SUM(v) AS total, window_start FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), \
               INTERVAL '1' MINUTE)) GROUP BY k, window_start, window_end";
    let expected = format!(
        "sluice-topology 1\n\
         vnodes 64\n\
         source 6:events connector 4:file watermark_delay_ms 2000\n\
         table 6:events event_time 2:ts\n\
         column 1:k VARCHAR null\n\
         column 1:v BIGINT not null\n\
         column 5:price DECIMAL(10, 2) null\n\
         column 2:ts TIMESTAMP(3) not null\n\
         view 4:sums sql {}:{sql}\n\
         sink 3:out from 4:sums connector 9:blackhole\n",
        sql.len()
    );
    assert_eq!(form, expected);
    // XXH3-64 (seed 0) of that text, checked against an independent implementation.
    assert_eq!(compiled.fingerprint.to_string(), "3dca10e87a20a4b6");
}

#[test]
fn threads_and_paths_do_not_change_the_fingerprint_but_the_topology_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("write");
    std::fs::write(dir.path().join("other.jsonl"), "").expect("write");
    let base = compile(PIPELINE, dir.path()).fingerprint;
    let same = [PIPELINE.replace("threads = 3", "threads = 1"), PIPELINE.replace("events.jsonl", "other.jsonl")];
    for text in same {
        assert_eq!(compile(&text, dir.path()).fingerprint, base);
    }
    let changed = [
        PIPELINE.replace("vnodes = 64", "vnodes = 128"),
        PIPELINE.replace("SUM(v)", "MAX(v)"),
        PIPELINE.replace("v BIGINT NOT NULL", "v BIGINT"),
        PIPELINE.replace("\"2s\"", "\"3s\""),
        PIPELINE.replace("name = \"out\"", "name = \"out2\""),
    ];
    for text in changed {
        assert_ne!(compile(&text, dir.path()).fingerprint, base, "{text}");
    }
}

#[test]
fn types_have_flink_names() {
    let cases = [
        (DataType::Int32, "INT"),
        (DataType::Utf8View, "VARCHAR"),
        (DataType::Timestamp(TimeUnit::Microsecond, None), "TIMESTAMP(6)"),
        (DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), "TIMESTAMP(3) WITH TIME ZONE 3:UTC"),
        (DataType::Decimal128(38, 9), "DECIMAL(38, 9)"),
        (DataType::List(std::sync::Arc::new(Field::new("x", DataType::Float64, true))), "ARRAY<DOUBLE>"),
    ];
    for (data_type, name) in cases {
        assert_eq!(canonical_type(&data_type).expect("a name"), name);
    }
}
