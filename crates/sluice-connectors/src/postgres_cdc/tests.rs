//! Tests of the `postgres-cdc` source that need no server: its options. The decoder's
//! golden vectors are in `pgoutput_tests.rs`; the server tests are the CLI's
//! (`sluice-cli/tests/cli/postgres_cdc.rs`).

use sluice_config::{SourceConfig, parse_partial};

use super::options::{CdcOptions, TRANSACTION_ROWS_DEFAULT, default_slot, options_of};

fn config(item: &str, options: &str) -> SourceConfig {
    let text = format!(
        "[pipeline]\nname = \"p\"\n[[source]]\nname = \"shop\"\nconnector = \"postgres-cdc\"\n{item}[source.options]\n{options}"
    );
    let (config, _) = parse_partial(&text, "p.toml");
    config.expect("parses").sources.remove(0)
}

fn options(item: &str, text: &str) -> Result<CdcOptions, String> {
    options_of(&config(item, text))
        .map_err(|errors| errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))
}

const REQUIRED: &str = "url = \"postgres://sluice:secret@127.0.0.1:5432/app\"\ntables = [\"public.orders\", \"customers\"]\npublication = \"shop\"\n";

#[test]
fn options_are_read_with_their_defaults() {
    let read = options("", REQUIRED).expect("valid");
    assert_eq!(read.tables.len(), 2);
    assert_eq!((read.slot.as_str(), read.create_slot, read.bounded), ("sluice_shop", true, false));
    assert_eq!(read.transaction_rows_max, TRANSACTION_ROWS_DEFAULT);
    assert!(!format!("{read:?}").contains("secret"), "the password never shows: {read:?}");
    let read = options(
        "",
        &format!("{REQUIRED}slot = \"s1\"\ncreate_slot = false\nbounded = true\ntransaction_rows_max = 7\n"),
    )
    .expect("valid");
    assert_eq!((read.slot.as_str(), read.create_slot, read.bounded, read.transaction_rows_max), ("s1", false, true, 7));
    assert_eq!(default_slot("My-Shop"), "sluice_my_shop");
}

#[test]
fn bad_options_are_each_named_with_a_fix() {
    let check = |item: &str, text: &str, needles: &[&str]| {
        let message = options(item, text).expect_err("refused");
        for needle in needles {
            assert!(message.contains(needle), "{text:?}: {needle:?} not in {message}");
        }
        assert!(!message.contains("secret"), "the password never shows: {message}");
    };
    check("", "tables = [\"t\"]\npublication = \"p\"\n", &["url"]);
    check("", "url = \"host=h\"\npublication = \"p\"\n", &["tables"]);
    check("", "url = \"host=h\"\ntables = [\"t\"]\n", &["publication", "CREATE PUBLICATION"]);
    check("", &format!("{REQUIRED}slot = \"Bad-Slot\"\n"), &["slot", "lower-case"]);
    check("", "url = \"host=h\"\ntables = [\"a.t\", \"b.t\"]\npublication = \"p\"\n", &["tables", "distinct"]);
    check("", "url = \"host=h\"\ntables = []\npublication = \"p\"\n", &["tables"]);
    check("", &format!("{REQUIRED}lanes = 2\n"), &["lanes"]);
    check("schema = \"id BIGINT\"\n", REQUIRED, &["schema", "catalog"]);
    check("primary_key = [\"id\"]\n", REQUIRED, &["primary_key", "catalog"]);
    check("format = \"json\"\n", REQUIRED, &["format"]);
}
