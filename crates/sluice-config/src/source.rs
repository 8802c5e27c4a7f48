//! `[[source]]`: the keys every source has. `[source.options]` is kept, unread, as
//! [`Options`] for the connector to validate; so are `connector`, `format` and `schema`,
//! whose meaning depends on the connector.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Located, Position};
use crate::model::{OnError, SourceConfig};
use crate::options::Options;
use crate::pipeline::{Named, named};
use crate::reader::{Ctx, Field, Section, TableRef};

const KEYS: &[&str] = &[
    "name",
    "connector",
    "format",
    "schema",
    "event_time",
    "watermark_delay",
    "max_watermark_drift",
    "on_error",
    "materialized",
    "primary_key",
    "options",
];
/// Keys often written at the item level by mistake: they belong to a connector.
const OPTION_NOTE: &str = "connector options go under a [source.options] header; remove it here or move it there";
const NOTES: &[(&str, &str)] = &[
    ("events", OPTION_NOTE),
    ("rate", OPTION_NOTE),
    ("seed", OPTION_NOTE),
    ("first_event_rate", OPTION_NOTE),
    ("path", OPTION_NOTE),
    ("header", OPTION_NOTE),
    ("delimiter", OPTION_NOTE),
];

/// Reads the `index`-th (0-based) `[[source]]`; also returns the position of its name.
pub(crate) fn parse_source(
    ctx: &mut Ctx<'_>,
    index: usize,
    table: TableRef<'_>,
    fallback: Position,
) -> Option<(SourceConfig, Position)> {
    let item = named(ctx, "source", index, table, fallback, KEYS, NOTES);
    let sec = &item.sec;
    let connector = connector(ctx, sec, "source");
    let format =
        at_key(ctx.string(sec, "format", "a format name such as \"json\"", "e.g. format = \"json\"", |s| {
            !s.trim().is_empty()
        }));
    let schema = ctx.string(
        sec,
        "schema",
        "a non-empty column list",
        "list the columns and their SQL types, e.g. schema = \"id BIGINT, name VARCHAR\"",
        |s| !s.trim().is_empty(),
    );
    let event_time = ctx.string(
        sec,
        "event_time",
        "a column name",
        "set event_time to the name of a timestamp column, e.g. event_time = \"date_time\"",
        |s| !s.trim().is_empty(),
    );
    let watermark_delay = ctx.duration(
        sec,
        "watermark_delay",
        true,
        "set how far the watermark trails the largest event time, e.g. watermark_delay = \"4s\"",
    );
    if let (Field::Present(_, at), Field::Absent) = (&watermark_delay, &event_time) {
        ctx.error_in(
            sec,
            *at,
            "`watermark_delay` is given without `event_time`",
            "add event_time = \"<timestamp column>\", or remove `watermark_delay`",
        );
    }
    let max_watermark_drift = ctx.duration(
        sec,
        "max_watermark_drift",
        false,
        "set how far in event time a lane may run ahead of the source's slowest lane, e.g. max_watermark_drift = \"10s\"",
    );
    let on_error = ctx.choice(
        sec,
        "on_error",
        &[("skip", OnError::Skip), ("fail", OnError::Fail), ("dead-letter", OnError::DeadLetter)],
    );
    let materialized = ctx.boolean(sec, "materialized", "set materialized = true or false, or remove it");
    let primary_key = ctx.value(
        sec,
        "primary_key",
        "a non-empty list of distinct column names",
        "list the key's columns, e.g. primary_key = [\"id\"]",
        |v| {
            let names: Vec<String> =
                v.as_array()?.iter().map(|n| n.as_str().map(str::to_owned)).collect::<Option<_>>()?;
            let distinct = names.iter().enumerate().all(|(i, n)| !names[..i].contains(n));
            (!names.is_empty() && distinct && names.iter().all(|n| !n.trim().is_empty())).then_some(names)
        },
    );
    let options = options(ctx, "source", &item);
    let config = SourceConfig {
        name: item.name?.value,
        connector: connector?,
        format: format.optional()?,
        schema: schema.optional()?,
        event_time: event_time.map(|l| l.value).optional()?,
        watermark_delay: watermark_delay.or(Duration::ZERO)?,
        max_watermark_drift: max_watermark_drift.optional()?,
        on_error: on_error.or(OnError::Skip)?,
        options: options?,
        materialized: crate::sink::materialized_at(materialized)?,
        primary_key: match primary_key {
            Field::Present(names, at) => Some(Located::new(names, at)),
            Field::Absent => None,
            Field::Invalid => return None,
        },
        position: sec.position,
    };
    Some((config, item.name_position))
}

/// The required `connector` key of a `[[source]]` or `[[sink]]`.
pub(crate) fn connector(ctx: &mut Ctx<'_>, sec: &Section<'_>, kind: &str) -> Option<Located<String>> {
    let field = ctx.string(
        sec,
        "connector",
        "a connector name",
        &format!("set connector to the name of a {kind} connector"),
        |s| !s.trim().is_empty(),
    );
    let example = if kind == "source" { "\"file\" or \"nexmark\"" } else { "\"stdout\", \"file\" or \"blackhole\"" };
    ctx.required(sec, "connector", at_key(field), &format!("add connector = {example}"))
}

/// A string located at its key (where errors about its value point), not its content.
pub(crate) fn at_key(field: Field<Located<String>>) -> Field<Located<String>> {
    match field {
        Field::Present(located, at) => Field::Present(Located::new(located.value, at), at),
        other => other,
    }
}

/// `[kind.options]` as [`Options`]: the table when present, else empty options at the
/// item. None when `options` is present but not a table (the error is recorded).
pub(crate) fn options(ctx: &mut Ctx<'_>, kind: &str, item: &Named<'_>) -> Option<Options> {
    let header = format!("[{kind}.options]");
    let fix = format!("write the options under a {header} header");
    let file: Arc<str> = Arc::from(ctx.file);
    let text: Arc<str> = Arc::from(ctx.text());
    if let Some(section) = ctx.subtable(&item.sec, "options", &header, &fix) {
        return Some(Options::from_section(&file, &text, header, &section));
    }
    if item.sec.entry(ctx, "options").is_some() {
        return None;
    }
    let empty = toml_edit::Table::new();
    let section = Section {
        label: item.sec.label.clone(),
        sub: Some(header.clone()),
        table: TableRef::Table(&empty),
        position: item.sec.position,
    };
    Some(Options::from_section(&file, &text, header, &section))
}
