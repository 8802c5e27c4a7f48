//! `[[source]]` and its connector-specific `[source.options]`.
//!
//! A nexmark source generates the three NEXMark tables `person`, `auction` and `bid`
//! (the source's `name` is only its name in reports); a file source provides one
//! table named after the source, with the `schema` given.

use std::path::PathBuf;
use std::time::Duration;

use toml_edit::Table;

use crate::error::{Located, Position};
use crate::model::{DEFAULT_FIRST_EVENT_RATE, FileFormat, OnError, SourceConfig, SourceConnector};
use crate::pipeline::{Named, named};
use crate::reader::{Ctx, Field, Section, TableRef};

const KEYS: &[&str] =
    &["name", "connector", "format", "schema", "event_time", "watermark_delay", "on_error", "options"];
const NEXMARK_OPTIONS: &[&str] = &["events", "rate", "seed", "first_event_rate"];
const FILE_OPTIONS: &[&str] = &["path", "header", "delimiter", "rate"];
const OPTION: &str = "connector options go under a [source.options] header";
const NOTES: &[(&str, &str)] = &[
    ("events", OPTION),
    ("rate", OPTION),
    ("seed", OPTION),
    ("first_event_rate", OPTION),
    ("path", OPTION),
    ("header", OPTION),
    ("delimiter", OPTION),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Nexmark,
    File,
}

pub(crate) const FILE_FORMATS: &[(&str, FileFormat)] = &[("json", FileFormat::Json), ("csv", FileFormat::Csv)];

/// Reads the `index`-th (0-based) `[[source]]`; also returns the position of its name.
pub(crate) fn parse_source(
    ctx: &mut Ctx<'_>,
    index: usize,
    table: TableRef<'_>,
    fallback: Position,
) -> Option<(SourceConfig, Position)> {
    let item = named(ctx, "source", index, table, fallback, KEYS, NOTES);
    let sec = &item.sec;
    let kind = ctx.choice(sec, "connector", &[("nexmark", Kind::Nexmark), ("file", Kind::File)]);
    let kind = ctx.required(sec, "connector", kind, "add connector = \"nexmark\" or \"file\"");
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
    let on_error = ctx.choice(sec, "on_error", &[("skip", OnError::Skip), ("fail", OnError::Fail)]);
    let empty = Table::new();
    let options = options_section(ctx, "source", &item, &empty);
    let (connector, schema) = match kind? {
        Kind::Nexmark => nexmark(ctx, sec, &options),
        Kind::File => file(ctx, sec, &options),
    }?;
    let config = SourceConfig {
        name: item.name?.value,
        connector,
        schema,
        event_time: event_time.map(|l| l.value).optional()?,
        watermark_delay: watermark_delay.or(Duration::ZERO)?,
        on_error: on_error.or(OnError::Skip)?,
        position: sec.position,
    };
    Some((config, item.name_position))
}

/// `[source.options]`, or an empty table standing for it when absent (or invalid).
pub(crate) fn options_section<'a>(ctx: &mut Ctx<'_>, kind: &str, item: &Named<'a>, empty: &'a Table) -> Section<'a> {
    let header = format!("[{kind}.options]");
    let fix = format!("write the options under a {header} header");
    ctx.subtable(&item.sec, "options", &header, &fix).unwrap_or(Section {
        label: item.sec.label.clone(),
        sub: Some(header),
        table: TableRef::Table(empty),
        position: item.sec.position,
    })
}

type Connector = (SourceConnector, Option<Located<String>>);

fn nexmark(ctx: &mut Ctx<'_>, sec: &Section<'_>, opts: &Section<'_>) -> Option<Connector> {
    ctx.forbid(sec, "format", "the nexmark connector generates its events itself", "remove `format`");
    ctx.forbid(sec, "schema", "nexmark tables person, auction and bid have fixed schemas", "remove `schema`");
    ctx.check_keys(opts, NEXMARK_OPTIONS, &[]);
    let events = ctx.integer(
        opts,
        "events",
        1..=i64::MAX,
        "set events to the number of events to generate, e.g. events = 1000000, \
         or remove it for an unbounded stream",
    );
    let rate = ctx.positive_number(opts, "rate", "set rate to events per second, e.g. rate = 100000");
    let seed = ctx.integer(opts, "seed", 0..=i64::MAX, "set seed to an integer, e.g. seed = 42");
    let first_event_rate = ctx.integer(
        opts,
        "first_event_rate",
        1..=i64::MAX,
        "set first_event_rate to events per second of event time, e.g. first_event_rate = 10000",
    );
    let rate = rate.optional()?;
    // With a rate limit and no explicit spacing, event time follows the wall clock.
    let spacing = rate.map_or(DEFAULT_FIRST_EVENT_RATE, |rate| (rate.round() as u64).max(1));
    let connector = SourceConnector::Nexmark {
        events: events.optional()?,
        rate,
        seed: seed.or(0)?,
        first_event_rate: first_event_rate.or(spacing)?,
    };
    Some((connector, None))
}

fn file(ctx: &mut Ctx<'_>, sec: &Section<'_>, opts: &Section<'_>) -> Option<Connector> {
    let format = ctx.choice(sec, "format", FILE_FORMATS);
    let format = ctx.required(sec, "format", format, "add format = \"json\" or \"csv\"");
    let schema = ctx.string(
        sec,
        "schema",
        "a non-empty column list",
        "list the columns and their SQL types, e.g. schema = \"id BIGINT, name VARCHAR\"",
        |s| !s.trim().is_empty(),
    );
    let schema = ctx.required(
        sec,
        "schema",
        schema,
        "add the columns and their SQL types, e.g. schema = \"id BIGINT, name VARCHAR\"",
    );
    ctx.check_keys(opts, FILE_OPTIONS, &[]);
    let path = ctx.string(
        opts,
        "path",
        "a non-empty file or directory path",
        "set path to a file or a directory, e.g. path = \"data/bids.json\"",
        |s| !s.is_empty(),
    );
    let path = ctx.required(
        opts,
        "path",
        path,
        "add path = \"<file or directory>\" under [source.options] \
         (relative paths are relative to the pipeline file)",
    );
    let header = ctx.boolean(opts, "header", "set header = true or header = false");
    let delimiter = ctx.value(
        opts,
        "delimiter",
        "a single ASCII character such as \",\" or \"\\t\"",
        "e.g. delimiter = \";\"",
        |v| match v.as_str()?.as_bytes() {
            [b] if b.is_ascii() && !matches!(b, b'\n' | b'\r' | b'"') => Some(*b),
            _ => None,
        },
    );
    let rate = ctx.positive_number(
        opts,
        "rate",
        "set rate to rows per second, e.g. rate = 1000, or remove it to read at full speed",
    );
    if format == Some(FileFormat::Json) {
        csv_only(ctx, opts, "header", header.is_present());
        csv_only(ctx, opts, "delimiter", delimiter.is_present());
    }
    let connector = SourceConnector::File {
        path: PathBuf::from(path?.value),
        format: format?,
        header: header.or(true)?,
        delimiter: delimiter.or(b',')?,
        rate: rate.optional()?,
    };
    Some((connector, Some(schema?)))
}

fn csv_only(ctx: &mut Ctx<'_>, opts: &Section<'_>, key: &str, present: bool) {
    if present {
        let fix = format!("remove `{key}`, or set format = \"csv\"");
        ctx.forbid(opts, key, "it applies to csv files only, and format is \"json\"", &fix);
    }
}
