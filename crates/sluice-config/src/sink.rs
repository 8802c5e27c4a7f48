//! `[[view]]`, and `[[sink]]` with its connector-specific `[sink.options]`.

use std::path::PathBuf;

use toml_edit::Table;

use crate::error::Position;
use crate::model::{FileFormat, FileMode, SinkConfig, SinkConnector, StdoutFormat, ViewConfig};
use crate::pipeline::named;
use crate::reader::{Ctx, Field, Section, TableRef, is_identifier};
use crate::source::{FILE_FORMATS, options_section};

const VIEW_KEYS: &[&str] = &["name", "sql", "materialized"];
const SINK_KEYS: &[&str] = &["name", "from", "connector", "format", "options"];
const FILE_OPTIONS: &[&str] = &["path", "mode"];
const OPTION: &str = "connector options go under a [sink.options] header";
const NOTES: &[(&str, &str)] = &[("path", OPTION), ("mode", OPTION)];

/// Reads the `index`-th (0-based) `[[view]]`; also returns the position of its name.
pub(crate) fn parse_view(
    ctx: &mut Ctx<'_>,
    index: usize,
    table: TableRef<'_>,
    fallback: Position,
) -> Option<(ViewConfig, Position)> {
    let item = named(ctx, "view", index, table, fallback, VIEW_KEYS, &[]);
    let sec = &item.sec;
    let sql = ctx.string(
        sec,
        "sql",
        "a non-empty SQL query",
        "write the query, e.g. sql = \"SELECT * FROM bid\" (use \"\"\"...\"\"\" for several lines)",
        |s| !s.trim().is_empty(),
    );
    let sql = ctx.required(
        sec,
        "sql",
        sql,
        "add the query, e.g. sql = \"SELECT * FROM bid\" (use \"\"\"...\"\"\" for several lines)",
    );
    let materialized = ctx.boolean(sec, "materialized", "set materialized = false or remove it");
    if let Field::Present(true, at) = materialized {
        ctx.error_in(
            sec,
            at,
            "materialized views (queryable with `sluice query`) are not supported yet",
            "remove `materialized = true`",
        );
        return None;
    }
    let config = ViewConfig { name: item.name?.value, sql: sql?, position: sec.position };
    Some((config, item.name_position))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stdout,
    File,
    Blackhole,
}

/// Reads the `index`-th (0-based) `[[sink]]`; also returns the position of its name.
pub(crate) fn parse_sink(
    ctx: &mut Ctx<'_>,
    index: usize,
    table: TableRef<'_>,
    fallback: Position,
) -> Option<(SinkConfig, Position)> {
    let item = named(ctx, "sink", index, table, fallback, SINK_KEYS, NOTES);
    let sec = &item.sec;
    let from = ctx.string(
        sec,
        "from",
        "the name of a source table or a view",
        "set from to the table or view to write, e.g. from = \"hot_items\"",
        is_identifier,
    );
    let from = ctx.required(sec, "from", from, "add from = \"<table or view>\"");
    let kind =
        ctx.choice(sec, "connector", &[("stdout", Kind::Stdout), ("file", Kind::File), ("blackhole", Kind::Blackhole)]);
    let kind = ctx.required(sec, "connector", kind, "add connector = \"stdout\", \"file\" or \"blackhole\"");
    let empty = Table::new();
    let opts = options_section(ctx, "sink", &item, &empty);
    let connector = match kind? {
        Kind::Stdout => {
            ctx.check_keys(&opts, &[], &[]);
            let formats = [("pretty", StdoutFormat::Pretty), ("json", StdoutFormat::Json)];
            let format = ctx.choice(sec, "format", &formats).or(StdoutFormat::Pretty);
            SinkConnector::Stdout { format: format? }
        }
        Kind::File => file(ctx, sec, &opts)?,
        Kind::Blackhole => {
            ctx.check_keys(&opts, &[], &[]);
            ctx.forbid(sec, "format", "the blackhole connector discards rows", "remove `format`");
            SinkConnector::Blackhole
        }
    };
    let config = SinkConfig { name: item.name?.value, from: from?.value, connector, position: sec.position };
    Some((config, item.name_position))
}

fn file(ctx: &mut Ctx<'_>, sec: &Section<'_>, opts: &Section<'_>) -> Option<SinkConnector> {
    let format = ctx.choice(sec, "format", FILE_FORMATS).or(FileFormat::Json);
    ctx.check_keys(opts, FILE_OPTIONS, &[]);
    let path = ctx.string(
        opts,
        "path",
        "a non-empty file or directory path",
        "set path to a file or a directory, e.g. path = \"out/hot_items\"",
        |s| !s.is_empty(),
    );
    let path = ctx.required(
        opts,
        "path",
        path,
        "add path = \"<file or directory>\" under [sink.options] \
         (relative paths are relative to the pipeline file)",
    );
    let mode = ctx.choice(opts, "mode", &[("file", FileMode::File), ("directory", FileMode::Directory)]);
    let path = path?;
    let mode = mode.or_else(|| FileMode::default_for(&path.value))?;
    Some(SinkConnector::File { path: PathBuf::from(path.value), format: format?, mode })
}
