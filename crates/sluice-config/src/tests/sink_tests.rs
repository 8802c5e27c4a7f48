//! `[[view]]`, `[[sink]]` and `[sink.options]`. Both start at line 7 ([`with_source`]).

use std::path::PathBuf;

use super::{check_errors, check_ok, with_source};
use crate::{FileFormat, FileMode, Position, SinkConnector, StdoutFormat};

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
    let known = "known keys: name, sql, materialized";
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
            "10:1: [[view]] \"v\": materialized views (queryable with `sluice query`) are not supported yet\n  fix: remove `materialized = true`",
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
    check_ok(&sink("stdout", ""), |c| {
        let s = &c.sinks[0];
        assert_eq!((s.name.as_str(), s.from.as_str()), ("out", "bid"));
        assert_eq!(s.position, Position::new(7, 1));
        assert_eq!(s.connector, SinkConnector::Stdout { format: StdoutFormat::Pretty });
        assert_eq!(s.connector.name(), "stdout");
    });
    check_ok(&sink("stdout", "format = \"json\""), |c| {
        assert_eq!(c.sinks[0].connector, SinkConnector::Stdout { format: StdoutFormat::Json });
    });
    check_ok(&sink("blackhole", ""), |c| assert_eq!(c.sinks[0].connector, SinkConnector::Blackhole));
    let file = |path: &str, format: FileFormat, mode: FileMode| SinkConnector::File {
        path: PathBuf::from(path),
        format,
        mode,
    };
    let cases = [
        ("[sink.options]\npath = \"out/\"", file("out/", FileFormat::Json, FileMode::Directory)),
        ("[sink.options]\npath = \"out\"", file("out", FileFormat::Json, FileMode::Directory)),
        ("[sink.options]\npath = \"out/x.json\"", file("out/x.json", FileFormat::Json, FileMode::File)),
        (
            "format = \"csv\"\n[sink.options]\npath = \"o.csv\"\nmode = \"directory\"",
            file("o.csv", FileFormat::Csv, FileMode::Directory),
        ),
        ("options = { path = \"../o\", mode = \"file\" }", file("../o", FileFormat::Json, FileMode::File)),
    ];
    for (lines, expected) in cases {
        check_ok(&sink("file", lines), |c| assert_eq!(c.sinks[0].connector, expected));
    }
}

#[test]
fn sink_errors() {
    let sk = |lines: &str| with_source(&format!("[[sink]]\n{lines}"));
    let known = "known keys: name, from, connector, format, options";
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
        (
            sink("kafka", ""),
            "10:1: [[sink]] \"out\": `connector` must be one of \"stdout\", \"file\", \"blackhole\", found \"kafka\"\n  fix: set connector to one of \"stdout\", \"file\", \"blackhole\"",
        ),
        (
            sink("stdout", "format = \"csv\""),
            "11:1: [[sink]] \"out\": `format` must be one of \"pretty\", \"json\", found \"csv\"\n  fix: set format to one of \"pretty\", \"json\"",
        ),
        (
            sink("stdout", "format = \"prety\""),
            "11:1: [[sink]] \"out\": `format` must be one of \"pretty\", \"json\", found \"prety\"\n  fix: did you mean format = \"pretty\"?",
        ),
        (
            sink("file", "format = \"pretty\"\n[sink.options]\npath = \"o\""),
            "11:1: [[sink]] \"out\": `format` must be one of \"json\", \"csv\", found \"pretty\"",
        ),
        (
            sink("blackhole", "format = \"json\""),
            "11:1: [[sink]] \"out\": `format` is not allowed here (the blackhole connector discards rows), found \"json\"\n  fix: remove `format`",
        ),
        (sink("stdout", "form = \"json\""), &form),
        (sink("stdout", "fromat = \"json\""), &fromat),
        (
            sink("stdout", "path = \"x\""),
            "11:1: unknown key `path` in [[sink]] \"out\"; known keys: name, from, connector, format, options\n  fix: connector options go under a [sink.options] header",
        ),
    ]);
}

#[test]
fn sink_option_errors() {
    check_errors(&[
        (
            sink("stdout", "[sink.options]\npath = \"x\""),
            "12:1: unknown key `path` in [sink.options] of [[sink]] \"out\"; this connector takes no options\n  fix: remove `path`",
        ),
        (
            sink("blackhole", "options = { rate = 1 }"),
            "11:13: unknown key `rate` in [sink.options] of [[sink]] \"out\"; this connector takes no options",
        ),
        (
            sink("file", ""),
            "7:1: [[sink]] \"out\": missing required key `path` in [sink.options]\n  fix: add path = \"<file or directory>\" under [sink.options]",
        ),
        (
            sink("file", "[sink.options]\npath = 1"),
            "12:1: [[sink]] \"out\": `path` must be a non-empty file or directory path, found 1",
        ),
        (
            sink("file", "[sink.options]\npath = \"o\"\nmode = \"flie\""),
            "13:1: [[sink]] \"out\": `mode` must be one of \"file\", \"directory\", found \"flie\"\n  fix: did you mean mode = \"file\"?",
        ),
        (
            sink("file", "[sink.options]\npath = \"o\"\nmode = true"),
            "13:1: [[sink]] \"out\": `mode` must be one of \"file\", \"directory\", found true",
        ),
        (
            sink("file", "[sink.options]\npath = \"o\"\nappend = true"),
            "13:1: unknown key `append` in [sink.options] of [[sink]] \"out\"; known keys: path, mode\n  fix: remove `append`",
        ),
        (
            sink("stdout", "options = \"x\""),
            "11:1: [[sink]] \"out\": `options` must be a table ([sink.options]), found \"x\"",
        ),
    ]);
}
