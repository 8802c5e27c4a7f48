//! `[[view]]`, `[[sink]]` and `[sink.options]`. Both start at line 7 ([`with_source`]).

use super::{check_errors, check_ok, with_source};
use crate::Position;

/// A view "v" with `sql = "SELECT 1"` (lines 7-9), then `lines` from line 10.
fn view(lines: &str) -> String {
    with_source(&format!("[[view]]\nname = \"v\"\nsql = \"SELECT 1\"\n{lines}"))
}

/// A sink "out" from `bid` to `connector` (lines 7-10), then `lines` from line 11.
fn sink(connector: &str, lines: &str) -> String {
    with_source(&format!("[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"{connector}\"\n{lines}"))
}

#[test]
fn views() {
    check_ok(&view("materialized = false"), |c| {
        let v = &c.views[0];
        assert_eq!(v.name, "v");
        assert_eq!(v.position, Position::new(7, 1));
        assert_eq!(v.sql.value, "SELECT 1");
        // `sql = "` is 7 characters: the query starts at column 8.
        assert_eq!(v.sql.position, Position::new(9, 8));
    });
    let vw = |lines: &str| with_source(&format!("[[view]]\n{lines}"));
    let known = "known keys: name, sql, materialized, state_ttl";
    let query = format!("9:1: unknown key `query` in [[view]] \"v\"; {known}\n  fix: remove `query`");
    let mat =
        format!("10:1: unknown key `materialised` in [[view]] \"v\"; {known}\n  fix: did you mean `materialized`?");
    check_errors(&[
        (vw("name = \"v\""), "7:1: [[view]] \"v\": missing required key `sql`\n  fix: add the query"),
        (vw("sql = \"SELECT 1\""), "7:1: [[view]] #1: missing required key `name`\n  fix: add name = \"view_1\""),
        (
            vw("name = \"hot items\"\nsql = \"SELECT 1\""),
            "8:1: [[view]] #1: `name` must be a SQL identifier ([A-Za-z_][A-Za-z0-9_]*), found \"hot items\"\n  fix: use letters, digits and `_`, not starting with a digit, e.g. name = \"hot_items\"",
        ),
        (vw("name = \"v\"\nsql = \"\""), "9:1: [[view]] \"v\": `sql` must be a non-empty SQL query, found \"\""),
        (
            vw("name = \"v\"\nsql = \"\"\"\n  \n\"\"\""),
            "9:1: [[view]] \"v\": `sql` must be a non-empty SQL query, found \"\"\" \"\"\"",
        ),
        (vw("name = \"v\"\nsql = 5"), "9:1: [[view]] \"v\": `sql` must be a non-empty SQL query, found 5"),
        (
            view("materialized = true"),
            "10:1: [[view]] \"v\": `materialized = true` needs a [checkpoint] section: queries read materialized tables at committed checkpoints, the only points where every table reflects the same input\n  fix: add a [checkpoint] section, e.g. [checkpoint] interval = \"1s\" and store = \"file://./state\"; or remove `materialized`",
        ),
        (view("materialized = \"no\""), "10:1: [[view]] \"v\": `materialized` must be true or false, found \"no\""),
        (vw("name = \"v\"\nquery = \"SELECT 1\"\nsql = \"SELECT 1\""), &query),
        (view("materialised = true"), &mat),
    ]);
}

#[test]
fn multi_line_sql_positions() {
    let basic = with_source("[[view]]\nname = \"v\"\nsql = \"\"\"\nSELECT *\n  FROM bid\"\"\"\n");
    check_ok(&basic, |c| {
        let sql = &c.views[0].sql;
        assert_eq!(sql.value, "SELECT *\n  FROM bid");
        // The newline right after `"""` is trimmed: the query starts on line 10.
        assert_eq!(sql.position, Position::new(10, 1));
        assert_eq!(sql.locate(2, 3), Position::new(11, 3));
    });
    let same_line = with_source("[[view]]\nname = \"v\"\nsql = '''SELECT *\nFROM bid'''\n");
    check_ok(&same_line, |c| {
        assert_eq!(c.views[0].sql.position, Position::new(9, 10));
        assert_eq!(c.views[0].sql.locate(1, 8), Position::new(9, 17));
    });
    let crlf = with_source("[[view]]\r\nname = \"v\"\r\nsql = \"\"\"\r\nSELECT 1\"\"\"\r\n");
    check_ok(&crlf, |c| assert_eq!(c.views[0].sql.position, Position::new(10, 1)));
    let indented = with_source("[[view]]\nname = \"v\"\n  sql   =   \"SELECT 1\"\n");
    check_ok(&indented, |c| assert_eq!(c.views[0].sql.position, Position::new(9, 14)));
}

#[test]
fn sinks() {
    check_ok(&sink("file", "format = \"csv\"\n[sink.options]\npath = \"o.csv\""), |c| {
        let s = &c.sinks[0];
        assert_eq!((s.name.as_str(), s.from.as_str()), ("out", "bid"));
        assert_eq!(s.position, Position::new(7, 1));
        assert_eq!((s.connector.value.as_str(), s.connector.position), ("file", Position::new(10, 1)));
        assert_eq!(s.format.as_ref().map(|f| f.value.as_str()), Some("csv"));
        assert_eq!(s.options.keys(), ["path"]);
    });
}

#[test]
fn sink_errors() {
    let sk = |lines: &str| with_source(&format!("[[sink]]\n{lines}"));
    let known = "known keys: name, from, connector, format, worker, options";
    let form = format!("11:1: unknown key `form` in [[sink]] \"out\"; {known}\n  fix: did you mean `from`?");
    let fromat = format!("11:1: unknown key `fromat` in [[sink]] \"out\"; {known}\n  fix: did you mean `format`?");
    check_errors(&[
        (sk("from = \"bid\"\nconnector = \"stdout\""), "7:1: [[sink]] #1: missing required key `name`"),
        (
            sk("name = \"out\"\nconnector = \"stdout\""),
            "7:1: [[sink]] \"out\": missing required key `from`\n  fix: add from = \"<table or view>\"",
        ),
        (
            sk("name = \"out\"\nfrom = \"hot-items\"\nconnector = \"stdout\""),
            "9:1: [[sink]] \"out\": `from` must be the name of a source table or a view, found \"hot-items\"",
        ),
        (
            sk("name = \"out\"\nfrom = \"bid\""),
            "7:1: [[sink]] \"out\": missing required key `connector`\n  fix: add connector = \"stdout\", \"file\" or \"blackhole\"",
        ),
        (sink("stdout", "form = \"json\""), &form),
        (sink("stdout", "fromat = \"json\""), &fromat),
        (
            sink("stdout", "path = \"x\""),
            "11:1: unknown key `path` in [[sink]] \"out\"; known keys: name, from, connector, format, worker, options\n  fix: connector options go under a [sink.options] header; remove it here or move it there",
        ),
        (
            sink("stdout", "options = \"x\""),
            "11:1: [[sink]] \"out\": `options` must be a table ([sink.options]), found \"x\"",
        ),
    ]);
}
