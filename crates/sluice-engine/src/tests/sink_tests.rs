//! `[[sink]]` and `[sink.options]` as the built-in sink connectors validate them. Sinks
//! start at line 7 ([`with_source`]).

use std::path::PathBuf;

use sluice_config::Position;
use sluice_connectors::sinks::{file_options_of, stdout_format_of};
use sluice_connectors::{FileFormat, FileMode, FileSinkOptions, StdoutFormat};

use super::{check_errors, check_ok, with_source};

/// A sink "out" from `bid` to `connector` (lines 7-10), then `lines` from line 11.
fn sink(connector: &str, lines: &str) -> String {
    with_source(&format!("[[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"{connector}\"\n{lines}"))
}

#[test]
fn sinks() {
    check_ok(&sink("stdout", ""), |c| {
        let s = &c.sinks[0];
        assert_eq!((s.name.as_str(), s.from.as_str()), ("out", "bid"));
        assert_eq!(s.position, Position::new(7, 1));
        assert_eq!(stdout_format_of(s), Ok(StdoutFormat::Pretty));
        assert_eq!(s.connector.value, "stdout");
    });
    check_ok(&sink("stdout", "format = \"json\""), |c| {
        assert_eq!(stdout_format_of(&c.sinks[0]), Ok(StdoutFormat::Json));
    });
    check_ok(&sink("blackhole", ""), |c| assert_eq!(c.sinks[0].connector.value, "blackhole"));
    let file =
        |path: &str, format: FileFormat, mode: FileMode| FileSinkOptions { path: PathBuf::from(path), format, mode };
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
        check_ok(&sink("file", lines), |c| assert_eq!(file_options_of(&c.sinks[0]), Ok(expected)));
    }
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
        (
            sink("http", ""),
            "10:1: [[sink]] \"out\": `connector` must be one of \"stdout\", \"file\", \"blackhole\", \"kafka\", \"postgres\", \"delta\", found \"http\" (no sink connector has that name)\n  fix: set connector to one of \"stdout\", \"file\", \"blackhole\", \"kafka\", \"postgres\", \"delta\"",
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
            "11:1: unknown key `path` in [[sink]] \"out\"; known keys: name, from, connector, format, worker, options\n  fix: connector options go under a [sink.options] header; remove it here or move it there",
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
