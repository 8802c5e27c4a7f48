//! `[pipeline]`, and the `name` key shared by `[[source]]`, `[[view]]` and `[[sink]]`.

use crate::error::{Located, Position};
use crate::model::{
    DEFAULT_BATCH_SIZE, DEFAULT_MINI_BATCH_ROWS, DEFAULT_QUEUE_BATCHES, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STATE_MEMORY_MIB, DEFAULT_VNODES, DEFAULT_WINDOWS_PER_ROW_MAX, PipelineSection,
};
use crate::reader::{Ctx, Field, Section, TableRef, is_identifier};

const KEYS: &[&str] = &[
    "name",
    "threads",
    "vnodes",
    "shutdown_timeout",
    "batch_size",
    "queue_batches",
    "windows_per_row_max",
    "state_ttl",
    "local_aggregation",
    "mini_batch_rows",
    "state_memory_mib",
    "state_dir",
    "spill_dir",
];

/// Reads `[pipeline]`.
pub(crate) fn parse_pipeline(ctx: &mut Ctx<'_>, sec: &Section<'_>) -> Option<PipelineSection> {
    ctx.check_keys(sec, KEYS, &[]);
    let name = ctx.string(
        sec,
        "name",
        "a name of letters, digits, `_` and `-`",
        "use letters, digits, `_` and `-`, e.g. name = \"hot-items\"",
        is_pipeline_name,
    );
    let name = ctx.required(sec, "name", name, "add name = \"my-pipeline\" under [pipeline]");
    let threads = ctx
        .integer(
            sec,
            "threads",
            1..=1024,
            "set threads to the number of driver threads per worker, e.g. threads = 4 \
             (default: the number of cores)",
        )
        .or_else(default_threads);
    let vnodes = ctx
        .integer(
            sec,
            "vnodes",
            1..=65536,
            "set vnodes to the number of key-space partitions, e.g. vnodes = 256 (the default)",
        )
        .or(DEFAULT_VNODES);
    let shutdown_timeout = ctx
        .duration(sec, "shutdown_timeout", false, "e.g. shutdown_timeout = \"30s\" (the default)")
        .or(DEFAULT_SHUTDOWN_TIMEOUT);
    let batch_size = ctx
        .integer(
            sec,
            "batch_size",
            1..=1_048_576,
            "set batch_size to rows per batch, e.g. batch_size = 8192 (the default)",
        )
        .or(DEFAULT_BATCH_SIZE);
    let queue_batches = ctx
        .integer(
            sec,
            "queue_batches",
            1..=4096,
            "set queue_batches to the capacity of each exchange queue in batches, \
             e.g. queue_batches = 16 (the default)",
        )
        .or(DEFAULT_QUEUE_BATCHES);
    let windows_per_row_max = ctx
        .integer(
            sec,
            "windows_per_row_max",
            1..=1_000_000,
            "set windows_per_row_max to the most windows one row may fall into (a HOP window's size / slide), \
             e.g. windows_per_row_max = 1000 (the default)",
        )
        .or(DEFAULT_WINDOWS_PER_ROW_MAX);
    let state_ttl = ctx.duration(sec, "state_ttl", false, STATE_TTL_FIX).optional();
    let local_aggregation = ctx
        .boolean(
            sec,
            "local_aggregation",
            "local_aggregation = true (the default) folds each batch per window and key before the exchange; \
             false aggregates every row after it",
        )
        .or(true);
    let mini_batch_rows = ctx
        .integer(
            sec,
            "mini_batch_rows",
            1..=16_777_216,
            "set mini_batch_rows to the input rows a running aggregate folds into one output of changes, \
             e.g. mini_batch_rows = 50000 (the default); 1 emits after every batch",
        )
        .or(DEFAULT_MINI_BATCH_ROWS);
    let state_memory_mib = ctx
        .integer(
            sec,
            "state_memory_mib",
            0..=1_048_576,
            "set state_memory_mib to the MiB of state kept in memory before the rest spills to disk, \
             e.g. state_memory_mib = 1024 (the default)",
        )
        .or(DEFAULT_STATE_MEMORY_MIB);
    let directory = |ctx: &mut Ctx<'_>, key: &str| {
        ctx.string(
            sec,
            key,
            "a directory path",
            "set state_dir to a local directory for state beyond state_memory_mib and the runs a checkpoint writes \
             before their upload, e.g. state_dir = \"/var/lib/sluice\" (default: the system's temporary directory)",
            |s| !s.trim().is_empty(),
        )
    };
    // `spill_dir` is the older name of `state_dir`.
    let state_dir = match (directory(ctx, "state_dir"), directory(ctx, "spill_dir")) {
        (Field::Present(_, _), Field::Present(_, position)) => {
            let message = "spill_dir is the older name of state_dir: set one of them";
            ctx.error_in(sec, position, message, "remove spill_dir and keep state_dir");
            Field::Invalid
        }
        (Field::Absent, older) => older,
        (newer, _) => newer,
    };
    let state_dir = state_dir.optional();
    Some(PipelineSection {
        name: name?.value,
        threads: threads?,
        vnodes: vnodes?,
        shutdown_timeout: shutdown_timeout?,
        batch_size: batch_size?,
        queue_batches: queue_batches?,
        windows_per_row_max: windows_per_row_max?,
        state_ttl: state_ttl?,
        local_aggregation: local_aggregation?,
        mini_batch_rows: mini_batch_rows?,
        state_memory_mib: state_memory_mib?,
        state_dir: state_dir?.map(|dir| dir.value),
    })
}

/// The fix for a bad `state_ttl`, in `[pipeline]` or a `[[view]]`.
pub(crate) const STATE_TTL_FIX: &str =
    "e.g. state_ttl = \"1h\": keys not touched for that long may be dropped (remove it to keep state forever)";

/// The number of cores, within 1..=1024.
pub fn default_threads() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    u32::try_from(cores.clamp(1, 1024)).unwrap_or(1)
}

fn is_pipeline_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One `[[source]]`, `[[view]]` or `[[sink]]` table, with its name read.
#[derive(Debug)]
pub(crate) struct Named<'a> {
    pub(crate) sec: Section<'a>,
    pub(crate) name: Option<Located<String>>,
    /// Position of the `name` key (the header when absent).
    pub(crate) name_position: Position,
}

/// Reads the `name` of the `index`-th (0-based) `[[kind]]` table and checks that
/// its keys are all in `known` (`notes`: fixes for keys that belong elsewhere).
pub(crate) fn named<'a>(
    ctx: &mut Ctx<'_>,
    kind: &str,
    index: usize,
    table: TableRef<'a>,
    fallback: Position,
    known: &[&str],
    notes: &[(&str, &str)],
) -> Named<'a> {
    let mut sec = Section {
        label: format!("[[{kind}]] #{}", index + 1),
        sub: None,
        table,
        position: ctx.table_position(table, fallback),
    };
    let example = sec
        .entry(ctx, "name")
        .and_then(|e| e.item.as_str())
        .map_or_else(|| format!("{kind}_{}", index + 1), to_identifier);
    let fix = format!("use letters, digits and `_`, not starting with a digit, e.g. name = \"{example}\"");
    let field = ctx.string(&sec, "name", "a SQL identifier ([A-Za-z_][A-Za-z0-9_]*)", &fix, is_identifier);
    let name_position = match &field {
        Field::Present(_, p) => *p,
        _ => sec.position,
    };
    if let Field::Present(name, _) = &field {
        sec.label = format!("[[{kind}]] \"{}\"", name.value);
    }
    ctx.check_keys(&sec, known, notes);
    let name = ctx.required(&sec, "name", field, &format!("add name = \"{example}\""));
    Named { sec, name, name_position }
}

/// `s` with every character that is not allowed in an identifier replaced by `_`.
fn to_identifier(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}
