//! The whole document: the top-level keys, each section in file order, and the
//! checks that span sections (unique names).

use toml_edit::{Item, Table, Value};

use crate::checkpoint::parse_checkpoint;
use crate::error::Position;
use crate::model::{PipelineConfig, SinkConfig, SourceConfig, ViewConfig};
use crate::pipeline::parse_pipeline;
use crate::reader::{Ctx, Section, TOP_LEVEL, TableRef};
use crate::sink::{parse_sink, parse_view};
use crate::source::parse_source;

const TOP_KEYS: &[&str] = &["pipeline", "checkpoint", "source", "view", "sink"];
const NOTES: &[(&str, &str)] = &[];

/// Reads the document's root table.
pub(crate) fn parse_root(ctx: &mut Ctx<'_>, root: &Table) -> Option<PipelineConfig> {
    let top =
        Section { label: TOP_LEVEL.to_owned(), sub: None, table: TableRef::Table(root), position: Position::new(1, 1) };
    ctx.check_keys(&top, TOP_KEYS, NOTES);
    let fix = "write it as a [pipeline] section";
    let pipeline = match ctx.subtable(&top, "pipeline", "[pipeline]", fix) {
        Some(sec) => parse_pipeline(ctx, &sec),
        None => {
            if top.entry(ctx, "pipeline").is_none() && !ctx.was_suggested(&top, "pipeline") {
                ctx.error(
                    None,
                    "missing [pipeline] section".to_owned(),
                    "add a [pipeline] section with the pipeline's name, e.g. name = \"hot-items\"",
                );
            }
            None
        }
    };
    let checkpoint = match ctx.subtable(&top, "checkpoint", "[checkpoint]", "write it as a [checkpoint] section") {
        Some(sec) => parse_checkpoint(ctx, &sec).map(Some),
        None => Some(None),
    };
    let sources = items(ctx, &top, "source", true, parse_source);
    let views = items(ctx, &top, "view", false, parse_view);
    let sinks = items(ctx, &top, "sink", true, parse_sink);
    check_names(ctx, &sources, &views);
    if let Some(checkpoint) = &checkpoint {
        check_materialized(ctx, checkpoint.as_ref(), &sources, &views);
    }
    check_sink_names(ctx, &sinks);
    Some(PipelineConfig {
        // Without a usable [pipeline] or [checkpoint] the configuration stands only to let
        // later layers check the rest (parse_partial); parse_all reports the errors.
        pipeline: pipeline.unwrap_or_else(|| crate::model::PipelineSection::named("")),
        checkpoint: checkpoint.flatten(),
        sources: sources.into_iter().map(|(s, _)| s).collect(),
        views: views.into_iter().map(|(v, _)| v).collect(),
        sinks: sinks.into_iter().map(|(s, _)| s).collect(),
    })
}

type ParseItem<T> = fn(&mut Ctx<'_>, usize, TableRef<'_>, Position) -> Option<(T, Position)>;

/// Reads every `[[kind]]` table; returns those that are valid with their name's
/// position.
fn items<T>(
    ctx: &mut Ctx<'_>,
    top: &Section<'_>,
    kind: &str,
    required: bool,
    parse: ParseItem<T>,
) -> Vec<(T, Position)> {
    let missing = format!("no [[{kind}]] section: a pipeline needs at least one {kind}");
    let Some(entry) = top.entry(ctx, kind) else {
        if required && !ctx.was_suggested(top, kind) {
            let fix = format!("add a [[{kind}]] section");
            ctx.error(None, missing, &fix);
        }
        return Vec::new();
    };
    let tables: Vec<TableRef<'_>> = match entry.item {
        Item::ArrayOfTables(array) => array.iter().map(TableRef::Table).collect(),
        Item::Value(Value::Array(array)) if array.iter().all(Value::is_inline_table) => {
            array.iter().filter_map(Value::as_inline_table).map(TableRef::Inline).collect()
        }
        _ => {
            let found = ctx.describe(entry.item);
            let message = format!("`{kind}` must be an array of tables, found {found}");
            let fix = format!("write each {kind} under its own [[{kind}]] header (two brackets)");
            ctx.error_in(top, entry.position, &message, &fix);
            return Vec::new();
        }
    };
    if tables.is_empty() && required {
        let fix = format!("add a [[{kind}]] section");
        ctx.error(Some(entry.position), missing, &fix);
    }
    tables.into_iter().enumerate().filter_map(|(index, table)| parse(ctx, index, table, entry.position)).collect()
}

/// A materialized table is read at committed checkpoints, the only points at which
/// every table (on every thread and worker) reflects the same input: a pipeline
/// without checkpoints has no such point, and one without aligned barriers
/// (at-least-once) has none that is exact. Both are refused rather than answered
/// inconsistently.
fn check_materialized(
    ctx: &mut Ctx<'_>,
    checkpoint: Option<&crate::model::CheckpointSection>,
    sources: &[(SourceConfig, Position)],
    views: &[(ViewConfig, Position)],
) {
    let marked = sources
        .iter()
        .filter_map(|(s, _)| s.materialized.map(|at| (format!("[[source]] \"{}\"", s.name), at)))
        .chain(views.iter().filter_map(|(v, _)| v.materialized.map(|at| (format!("[[view]] \"{}\"", v.name), at))));
    for (label, at) in marked {
        match checkpoint {
            None => ctx.error(
                Some(at),
                format!(
                    "{label}: `materialized = true` needs a [checkpoint] section: queries read materialized tables \
                     at committed checkpoints, the only points where every table reflects the same input"
                ),
                "add a [checkpoint] section, e.g. [checkpoint] interval = \"1s\" and store = \"file://./state\"; \
                 or remove `materialized`",
            ),
            Some(c) if c.guarantee != crate::model::Guarantee::ExactlyOnce => ctx.error(
                Some(at),
                format!(
                    "{label}: `materialized = true` needs guarantee = \"exactly-once\": at-least-once checkpoints \
                     do not align their barriers, so tables read at one checkpoint could disagree"
                ),
                "set guarantee = \"exactly-once\" in [checkpoint], or remove `materialized`",
            ),
            Some(_) => {}
        }
    }
}

/// A name claimed in the SQL namespace.
struct Claim<'c> {
    name: &'c str,
    label: String,
    position: Position,
}

/// Source and view names are unique (ignoring ASCII case, as unquoted SQL
/// identifiers). Tables a connector provides under other names (nexmark's) are checked
/// by the engine, which knows the connectors.
fn check_names(ctx: &mut Ctx<'_>, sources: &[(SourceConfig, Position)], views: &[(ViewConfig, Position)]) {
    let claims: Vec<Claim<'_>> = sources
        .iter()
        .map(|(s, at)| claim("source", &s.name, *at))
        .chain(views.iter().map(|(v, at)| claim("view", &v.name, *at)))
        .collect();
    report_duplicates(ctx, &claims, "give every source and view its own name");
}

fn check_sink_names(ctx: &mut Ctx<'_>, sinks: &[(SinkConfig, Position)]) {
    let claims: Vec<Claim<'_>> = sinks.iter().map(|(s, at)| claim("sink", &s.name, *at)).collect();
    report_duplicates(ctx, &claims, "give every sink its own name");
}

fn claim<'c>(kind: &str, name: &'c str, position: Position) -> Claim<'c> {
    Claim { name, label: format!("[[{kind}]] \"{name}\""), position }
}

/// Reports each claim whose name an earlier claim already has, at the later one.
fn report_duplicates(ctx: &mut Ctx<'_>, claims: &[Claim<'_>], fix: &str) {
    for (i, later) in claims.iter().enumerate() {
        let first = claims[..i].iter().find(|c| c.name.eq_ignore_ascii_case(later.name));
        if let Some(first) = first {
            ctx.error(
                Some(later.position),
                format!(
                    "{}: name \"{}\" is already used by {} at line {}",
                    later.label, later.name, first.label, first.position.line
                ),
                fix,
            );
        }
    }
}
