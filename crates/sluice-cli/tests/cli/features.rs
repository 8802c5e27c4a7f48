//! A build without a connector's cargo feature refuses a pipeline that names the
//! connector with the flag that builds it, in `sluice validate` as in `sluice run`: never
//! an unknown connector, never a panic. Each test runs in a build that leaves its
//! feature out: the default features (`cargo nextest run -p sluice-cli features::`, which
//! `scripts/test.sh` runs besides the suite with every feature); the build with the
//! feature runs the connector's own tests instead.

use crate::harness::{Scratch, assert_fails_with};

/// `item` (a `[[source]]` or `[[sink]]` table with its options) in a pipeline that is
/// otherwise valid, validated and run: both refuse it naming `feature`.
#[cfg(any(not(feature = "kafka"), not(feature = "postgres"), not(feature = "delta")))]
fn check_left_out(item: &str, feature: &str) {
    let scratch = Scratch::new();
    let pipeline = format!(
        "[pipeline]\nname = \"p\"\n\n[[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n\
         [source.options]\nevents = 10\n\n{item}"
    );
    scratch.write("p.toml", &pipeline);
    let flag = format!("--features {feature}");
    let named = format!("cargo feature `{feature}`");
    for command in ["validate", "run"] {
        let output = scratch.sluice(&[command, "p.toml"]);
        assert_fails_with(&output, &["is not in this build of sluice", &named, &flag]);
    }
}

#[cfg(not(feature = "kafka"))]
#[test]
fn a_kafka_source_names_the_kafka_feature() {
    let item = "[[source]]\nname = \"orders\"\nconnector = \"kafka\"\nformat = \"json\"\nschema = \"id BIGINT\"\n\
                [source.options]\nbrokers = \"127.0.0.1:9\"\ntopic = \"orders\"\n\n\
                [[sink]]\nname = \"out\"\nfrom = \"orders\"\nconnector = \"blackhole\"\n";
    check_left_out(item, "kafka");
}

#[cfg(not(feature = "postgres"))]
#[test]
fn a_postgres_sink_and_a_cdc_source_name_the_postgres_feature() {
    let sink = "[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"postgres\"\n\
                [sink.options]\nurl = \"postgres://127.0.0.1/db\"\ntable = \"bids\"\n";
    check_left_out(sink, "postgres");
    let source = "[[source]]\nname = \"db\"\nconnector = \"postgres-cdc\"\n\
                  [source.options]\nurl = \"postgres://127.0.0.1/db\"\n\n\
                  [[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"blackhole\"\n";
    check_left_out(source, "postgres");
}

#[cfg(not(feature = "delta"))]
#[test]
fn a_delta_sink_names_the_delta_feature() {
    let item = "[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"delta\"\n[sink.options]\npath = \"lake\"\n";
    check_left_out(item, "delta");
}

#[cfg(not(feature = "cloud"))]
#[test]
fn an_object_store_checkpoint_names_the_cloud_feature() {
    let scratch = Scratch::new();
    let pipeline = "[pipeline]\nname = \"p\"\n\n[checkpoint]\nstore = \"s3://bucket/checkpoints\"\n\n\
                    [[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n[source.options]\nevents = 10\n\n\
                    [[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"blackhole\"\n";
    scratch.write("p.toml", pipeline);
    let output = scratch.sluice(&["run", "p.toml"]);
    assert_fails_with(&output, &["cargo feature `cloud`", "--features cloud"]);
}

#[cfg(not(feature = "pgwire"))]
#[test]
fn pg_bind_names_the_pgwire_feature() {
    let scratch = Scratch::new();
    let pipeline = "[pipeline]\nname = \"p\"\n\n[[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n\
                    [source.options]\nevents = 10\n\n[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"blackhole\"\n";
    scratch.write("p.toml", pipeline);
    let output = scratch.sluice(&["run", "p.toml", "--pg-bind", "127.0.0.1:0"]);
    assert_fails_with(&output, &["cargo feature `pgwire`", "--features pgwire"]);
}

#[cfg(not(feature = "kafka"))]
#[test]
fn sluice_connectors_names_the_feature_of_a_left_out_connector() {
    let output = Scratch::new().sluice(&["connectors", "kafka"]);
    assert_fails_with(&output, &["cargo feature `kafka`", "--features kafka"]);
}
