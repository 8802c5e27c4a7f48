//! `[[view]]`, and `[[sink]]`: the keys every sink has; `[sink.options]` is kept as
//! [`crate::Options`] for the connector to validate.

use crate::error::Position;
use crate::model::{SinkConfig, ViewConfig};
use crate::pipeline::named;
use crate::reader::{Ctx, Field, TableRef, is_identifier};
use crate::source::{at_key, connector, options};

const VIEW_KEYS: &[&str] = &["name", "sql", "materialized", "state_ttl"];
const SINK_KEYS: &[&str] = &["name", "from", "connector", "format", "worker", "options"];
const OPTION: &str = "connector options go under a [sink.options] header; remove it here or move it there";
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
    let materialized = ctx.boolean(sec, "materialized", "set materialized = true or false, or remove it");
    let state_ttl = ctx.duration(sec, "state_ttl", false, crate::pipeline::STATE_TTL_FIX).optional();
    let config = ViewConfig {
        name: item.name?.value,
        sql: sql?,
        materialized: materialized_at(materialized)?,
        state_ttl: state_ttl?,
        position: sec.position,
    };
    Some((config, item.name_position))
}

/// Where `materialized = true` is written (None for false or absent); None twice when
/// the value is not a boolean (already reported).
pub(crate) fn materialized_at(field: Field<bool>) -> Option<Option<Position>> {
    match field {
        Field::Present(true, at) => Some(Some(at)),
        Field::Present(false, _) | Field::Absent => Some(None),
        Field::Invalid => None,
    }
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
    let connector = connector(ctx, sec, "sink");
    let format =
        at_key(ctx.string(sec, "format", "a format name such as \"json\"", "e.g. format = \"json\"", |s| {
            !s.trim().is_empty()
        }));
    let worker = ctx
        .integer::<u32>(
            sec,
            "worker",
            0..=1023,
            "set worker to the id of the worker that runs this sink (0 is the leader)",
        )
        .optional();
    let options = options(ctx, "sink", &item);
    let config = SinkConfig {
        name: item.name?.value,
        from: from?.value,
        connector: connector?,
        format: format.optional()?,
        worker: worker?,
        options: options?,
        position: sec.position,
    };
    Some((config, item.name_position))
}
