//! What only the engine can check, knowing the connectors: tables a source provides
//! under other names (nexmark's person, auction and bid) against views and other
//! sources; connector options in inline and dotted tables; every problem of a file,
//! parser's and connectors' alike, reported at once in file order.

use sluice_config::Position;

use super::{all_problems, check_error, check_errors, check_ok, nexmark, with_sink, with_source};

const SINK: &str = "[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"stdout\"\n";
const PIPELINE: &str = "[pipeline]\nname = \"p\"\n";

#[test]
fn tables_provided_under_other_names_collide_with_views_and_sources() {
    let two = |a: &str, b: &str| with_sink(&format!("{a}\n{b}"));
    let file = |name: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nconnector = \"file\"\nformat = \"json\"\nschema = \"a INT\"\noptions.path = \"x\"\n"
        )
    };
    let view = |name: &str| format!("[[view]]\nname = \"{name}\"\nsql = \"SELECT 1\"\n");
    check_errors(&[
        (
            with_source(&view("bid")),
            "7:1: [[view]] \"bid\": name \"bid\" is a table of source \"nx\" (line 4)\n  fix: choose another name",
        ),
        (
            with_source(&file("Person")),
            "7:1: [[source]] \"Person\": name \"Person\" is a table of source \"nx\" (line 4)",
        ),
        (
            two(&nexmark(""), &nexmark("").replace("\"nx\"", "\"nx2\"")),
            "12:1: [[source]] \"nx2\": name \"person\" is a table of source \"nx\" (line 8)",
        ),
    ]);
    // One problem per item, not one per table.
    assert_eq!(all_problems(&two(&nexmark(""), &nexmark("").replace("\"nx\"", "\"nx2\""))).len(), 1);
}

#[test]
fn options_in_inline_and_dotted_tables() {
    let inline = format!(
        "source = [{{ name = \"nx\", connector = \"nexmark\", options = {{ events = 5 }} }}]\n{PIPELINE}{SINK}"
    );
    check_ok(&inline, |c| {
        assert_eq!(c.sources[0].position, Position::new(1, 11));
        let options = sluice_connectors::nexmark::options_of(&c.sources[0]).expect("valid");
        assert_eq!(options.events, Some(5));
    });
    let bad = format!(
        "source = [{{ name = \"nx\", connector = \"nexmark\", options = {{ rate = \"fast\" }} }}]\n{PIPELINE}{SINK}"
    );
    check_error(&bad, "1:61: [[source]] \"nx\": `rate` must be a number > 0, found \"fast\"");
    let dotted = with_sink(&nexmark("options.events = 7\noptions.seed = 3\n"));
    check_ok(&dotted, |c| {
        let options = sluice_connectors::nexmark::options_of(&c.sources[0]).expect("valid");
        assert_eq!((options.events, options.seed), (Some(7), 3));
    });
    check_error(
        &with_sink(&nexmark("options.evnts = 7\n")),
        "11:9: unknown key `evnts` in [source.options] of [[source]] \"nx\"",
    );
}

#[test]
fn parser_and_connector_problems_come_together_in_file_order() {
    let source = "[[source]]\nname = \"nx\"\nconnector = \"nexmark\"\n";
    let toml = format!("[pipeline]\nname = \"p\"\nthreads = 0\n{source}rate = 1\n{SINK}format = \"xml\"\n");
    // threads = 0 and the stray `rate` are the parser's; the stdout format the connector's.
    let positions: Vec<Option<Position>> = all_problems(&toml).iter().map(|p| p.position).collect();
    assert_eq!(positions, [Some(Position::new(3, 1)), Some(Position::new(7, 1)), Some(Position::new(12, 1))]);
    let toml = format!("{PIPELINE}{source}[source.options]\nevents = 0\n{SINK}format = \"xml\"\nname2 = 1\n");
    let lines: Vec<usize> = all_problems(&toml).iter().filter_map(|p| p.position.map(|p| p.line)).collect();
    assert_eq!(lines, [7, 12, 13], "{:#?}", all_problems(&toml));
}

#[test]
fn a_full_file_loads() {
    let toml = r#"
[pipeline]
name = "hot-items"
threads = 2
vnodes = 128
shutdown_timeout = "5s"
batch_size = 1024
queue_batches = 4

[[source]]
name = "bids"
connector = "file"
format = "csv"
schema = "auction BIGINT, price BIGINT, date_time TIMESTAMP(3)"
event_time = "date_time"
watermark_delay = "4s"
on_error = "fail"
[source.options]
path = "data/bids.csv"
header = false
delimiter = "|"

[[view]]
name = "hot_items"
sql = """
SELECT auction, COUNT(*) AS n FROM bids GROUP BY auction
"""
materialized = false

[[sink]]
name = "out"
from = "hot_items"
connector = "file"
format = "csv"
[sink.options]
path = "out/hot_items.csv"
"#;
    check_ok(toml, |c| {
        assert_eq!(c.pipeline.vnodes, 128);
        let s = &c.sources[0];
        assert_eq!(s.position, Position::new(10, 1));
        assert_eq!(s.schema.as_ref().map(|l| l.position), Some(Position::new(14, 11)));
        let options = sluice_connectors::file_source::options_of(s).expect("valid");
        assert_eq!((options.header, options.delimiter), (false, b'|'));
        assert_eq!(options.path.to_str(), Some("data/bids.csv"));
        assert_eq!(c.views[0].sql.position, Position::new(26, 1));
        assert_eq!(c.views[0].sql.locate(1, 27), Position::new(26, 27));
        assert_eq!(c.sinks[0].connector.value, "file");
    });
}
