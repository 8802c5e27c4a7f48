//! Flink-dialect streaming SQL, planned with Apache DataFusion into the runtime's flows.
//!
//! Layer: above operators and the runtime (it builds their plans); below the CLI. It does
//! not know connectors: the caller registers each source's tables and turns each planned
//! stream into a flow with a sink it built.
//!
//! Steps for a view (in file order, so a view may read the sources and earlier views),
//! each on a thread with a stack sized for the deepest expression allowed ([`stack`]):
//! 1. [`tvf::rewrite`] replaces Flink's window table functions with synthetic tables, and
//!    [`group_window`] rewrites the legacy group windows (`GROUP BY TUMBLE(ts, …)`) into
//!    the same synthetic tables;
//! 2. [`ast`] parses the query and checks it before DataFusion sees it: the nesting depth
//!    of expressions, constructs refused by name (window functions other than aggregates
//!    and ROW_NUMBER, subqueries in
//!    expressions, joins, set operations), and views read before they are defined
//!    ([`views`]);
//! 3. DataFusion parses and plans the query (identifiers are case-sensitive, as in Flink)
//!    and its analyzer coerces types; [`naming`] then renames the output columns whose
//!    names repeat, as Flink does (`dateTime0`);
//! 4. [`stream`] turns the logical plan into segments of fused operators and exchanges,
//!    knowing for each stream whether it is append-only or updating (and its upsert
//!    key), and refusing, with the construct's name, anything whose streaming meaning is
//!    not implemented; a changelog source's table first goes through its normalization
//!    by primary key ([`changelog`]).

mod aggregate;
mod ast;
mod catalog;
mod changelog;
mod functions;
mod group_window;
mod join;
mod naming;
mod over;
mod schema;
pub mod stack;
mod stream;
mod topn;
pub mod tvf;
mod union;
mod views;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion_common::DataFusionError;
use datafusion_expr::LogicalPlan;
use datafusion_optimizer::Analyzer;
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use sluice_config::OnError;
use sluice_operators::row_errors::OnRowError;
use sluice_runtime::{Flow, SinkFactory, SinkParallelism, TableDef};
use sluice_types::{Changelog, SluiceError};

pub use ast::EXPRESSION_DEPTH_MAX;
pub use naming::{unique_names, uniquify};

/// The names of the tables (or views) a query reads, window table functions' inputs
/// included; names its `WITH` clauses define are left out. Empty when it does not parse.
pub fn tables_read(sql: &str) -> Result<Vec<String>, SluiceError> {
    stack::on_planning_stack(|| views::reads(sql))
}
/// Refuses a query nested deeper than a view may be ([`EXPRESSION_DEPTH_MAX`]), so that
/// planning it on a thread of [`stack::PLANNING_STACK_BYTES`] cannot overflow; any other
/// problem is left to the caller's own parse.
pub fn check_depth(sql: &str) -> Result<(), SluiceError> {
    stack::on_planning_stack(|| ast::check_depth(sql))?
}
pub use functions::flink_functions;
pub use schema::parse_schema;
pub use views::ViewDeclaration;

use catalog::{Catalog, TableEntry};
use stream::{StreamPlanner, StreamState};
use tvf::WindowCall;

/// The default of [`PlannerOptions::windows_per_row_max`].
pub const WINDOWS_PER_ROW_MAX_DEFAULT: u64 = 1000;

/// Sizes the planner bakes into operators, and the limits it enforces.
#[derive(Debug, Clone, Copy)]
pub struct PlannerOptions {
    pub threads: u32,
    pub vnodes: u32,
    pub batch_size: usize,
    /// The most windows a HOP window table function may put one row in (size / slide,
    /// rounded up): each row is copied once per window, so a small slide against a large
    /// size multiplies the rows (and memory) without bound. Default
    /// [`WINDOWS_PER_ROW_MAX_DEFAULT`].
    pub windows_per_row_max: u64,
    /// The state time-to-live of every view without its own (see
    /// [`SqlPlanner::set_state_ttl`]): regular joins, running aggregates and TopN drop a
    /// key not touched for this long. None: state is kept.
    pub state_ttl: Option<std::time::Duration>,
    /// Window aggregates in two phases where their aggregates allow it (see
    /// `sluice_operators::aggregate::local`).
    pub local_aggregation: bool,
    /// Input rows a running aggregate folds into one output of changes (see
    /// `sluice_operators::aggregate::GroupAggregate::with_mini_batch`).
    pub mini_batch_rows: usize,
}

/// Registers tables and views, then plans the stream behind any of them.
pub struct SqlPlanner {
    catalog: Catalog,
    options: PlannerOptions,
    /// Views with a state time-to-live of their own.
    view_ttls: std::collections::HashMap<String, std::time::Duration>,
    /// Where state beyond the memory budget goes (None: it stays in memory).
    spill: Option<Arc<sluice_operators::spill::SpillSpace>>,
    windows: usize,
    declared: views::DeclaredViews,
}

/// A planned stream, ready to be ended by a sink.
pub struct PlannedStream {
    state: StreamState,
    /// The rows' schema, as the sink will receive them.
    pub schema: SchemaRef,
    /// Whether rows can be retractions (weight -1): the sink then writes an op column.
    pub updating: bool,
    /// Append-only or updating, with the upsert key's columns when known.
    pub changelog: Changelog,
}

impl PlannedStream {
    /// Ends the stream at `sink`, gathering to one thread first if the sink has one writer;
    /// that writer runs on slot `sink_slot` (0 unless a cluster places it elsewhere).
    pub fn into_flow(self, sink: Arc<dyn SinkFactory>, threads: u32, sink_slot: u32) -> Flow {
        assert!(sink_slot < threads.max(1), "sink slot {sink_slot} of {threads}");
        let gather = (sink.parallelism() == SinkParallelism::Single && threads > 1).then_some(sink_slot);
        let (source, table, segments, sides) = self.state.finish(gather);
        Flow { source, table, segments, sides, sink, sink_slot, tap: None }
    }
}

impl SqlPlanner {
    pub fn new(options: PlannerOptions) -> SqlPlanner {
        SqlPlanner {
            catalog: Catalog::new(),
            options,
            view_ttls: std::collections::HashMap::new(),
            spill: None,
            windows: 0,
            declared: views::DeclaredViews::default(),
        }
    }

    /// Declares every view of the pipeline, in file order, before the first
    /// [`Self::add_view`], so that a view reading a view defined below it, or a cycle of
    /// views, is reported as such (with the location texts) rather than as an unknown table.
    pub fn declare_views(&mut self, views: impl IntoIterator<Item = ViewDeclaration>) {
        self.declared.declare(views);
    }

    /// Makes a source's tables visible to queries. `on_error` is the source's policy for
    /// rows on which a view's expression fails at run time (division by zero, a failing
    /// CAST): skip (drop and count) or fail (stop the pipeline).
    pub fn add_source(&mut self, source: usize, tables: &[TableDef], on_error: OnError) -> Result<(), SluiceError> {
        let on_error = match on_error {
            // A row a view's expression fails on is no longer a message: there is nothing
            // to write to a dead-letter topic, so it is skipped and counted.
            OnError::Skip | OnError::DeadLetter => OnRowError::Skip,
            OnError::Fail => OnRowError::Fail,
        };
        for (index, table) in tables.iter().enumerate() {
            if self.catalog.tables.contains_key(&table.name) {
                return Err(SluiceError::user(
                    "sql.duplicate_table",
                    format!("two sources provide a table `{}`", table.name),
                )
                .with_fix("rename one of the sources"));
            }
            if let Some(changelog) = &table.changelog {
                changelog::check_changelog_table(&table.name, &table.schema, changelog)?;
            }
            let entry = TableEntry::Source {
                source,
                table: index,
                schema: Arc::clone(&table.schema),
                event_time: table.event_time.clone(),
                on_error,
                changelog: table.changelog.clone(),
            };
            self.catalog.tables.insert(table.name.clone(), entry);
        }
        Ok(())
    }

    /// The names of every table and view, for messages.
    pub fn table_names(&self) -> Vec<&str> {
        self.catalog.table_names()
    }

    /// Plans view `name` and registers it; its errors name the construct at fault.
    pub fn add_view(&mut self, name: &str, sql: &str) -> Result<(), SluiceError> {
        stack::on_planning_stack(|| self.plan_view(name, sql))?
    }

    /// Ends `stream` with an operator keyed by the whole row: an exchange by the hash of
    /// every column (the key encoding's placement hash, as for GROUP BY keys), then
    /// `operator`, whose state can therefore be split by each row's vnode. `state`
    /// describes that state for `explain`.
    pub fn push_keyed_by_row(
        &self,
        stream: &mut PlannedStream,
        operator: (String, sluice_runtime::OperatorFactory),
        state: String,
    ) {
        let columns = stream.schema.fields().len();
        let description = format!("hash(every column) → {} vnodes", self.options.vnodes);
        self.stream_planner("").hash_exchange(&mut stream.state, (0..columns).collect(), description);
        stream.state.operators.push(operator);
        stream.state.state = Some(state);
    }

    /// The stream of table or view `table`, for a sink named `sink`.
    pub fn plan_stream(&self, table: &str, sink: &str) -> Result<PlannedStream, SluiceError> {
        stack::on_planning_stack(|| self.plan_stream_here(table, sink))?
    }

    fn plan_view(&mut self, name: &str, sql: &str) -> Result<(), SluiceError> {
        let context = |e: SluiceError| e.context(format!("view `{name}`"));
        let (rewritten, mut calls) = tvf::rewrite(sql, self.windows).map_err(context)?;
        let rewritten = group_window::rewrite(rewritten, &mut calls, self.windows).map_err(context)?;
        let shape = ast::check(&rewritten).map_err(context)?;
        let inputs = calls.iter().map(|call| &call.input);
        for read in inputs.chain(&shape.relations) {
            if self.catalog.tables.contains_key(read) || shape.ctes.contains(read) {
                continue;
            }
            if let Some(error) = self.declared.misordered(name, read) {
                return Err(error);
            }
        }
        // Names leave Sluice unqualified: two columns of one name are renamed as Flink does.
        let plan = self.plan_query(&rewritten, calls).and_then(naming::unique_names).map_err(context)?;
        let planner = self.stream_planner(name);
        planner.plan_root(&plan).and_then(stream::unaggregated_session).map_err(context)?;
        let schema = Arc::new(plan.schema().as_arrow().clone());
        self.catalog.tables.insert(name.to_string(), TableEntry::View { plan: Arc::new(plan), schema });
        Ok(())
    }

    fn plan_stream_here(&self, table: &str, sink: &str) -> Result<PlannedStream, SluiceError> {
        let Some(entry) = self.catalog.tables.get(table) else {
            return Err(SluiceError::user(
                "sql.unknown_table",
                format!(
                    "sink `{sink}`: from = \"{table}\" names no table or view; the tables are: {}",
                    self.table_names().join(", ")
                ),
            )
            .with_fix("set `from` to one of those names"));
        };
        let planner = self.stream_planner(table);
        let state = match entry {
            TableEntry::View { plan, .. } => planner.plan_root(plan)?,
            _ => {
                let scan = datafusion_expr::LogicalPlanBuilder::scan(
                    table,
                    Arc::new(datafusion_expr::logical_plan::builder::LogicalTableSource::new(entry.schema())),
                    None,
                )
                .and_then(|b| b.build())
                .map_err(|e| df_error("sql.plan", e))?;
                planner.plan(&scan)?
            }
        };
        let schema = state.arrow_schema();
        let changelog = state.changelog.clone();
        Ok(PlannedStream { state, schema, updating: changelog.is_updating(), changelog })
    }

    fn stream_planner(&self, view: &str) -> StreamPlanner<'_> {
        StreamPlanner {
            catalog: &self.catalog,
            view: view.to_string(),
            vnodes: self.options.vnodes,
            batch_size: self.options.batch_size,
            windows_per_row_max: self.options.windows_per_row_max,
            local_aggregation: self.options.local_aggregation,
            mini_batch_rows: self.options.mini_batch_rows,
            view_ttls: &self.view_ttls,
            default_ttl: self.options.state_ttl,
            spill: self.spill.clone(),
            columns_read: None,
        }
    }

    /// Lets the operators that can (a regular join's append-only sides) spill their
    /// state within `space` (by default all state stays in memory).
    pub fn set_spill(&mut self, space: Arc<sluice_operators::spill::SpillSpace>) {
        self.spill = Some(space);
    }

    /// Gives view `view` a state time-to-live of its own (over the pipeline's).
    pub fn set_state_ttl(&mut self, view: &str, ttl: std::time::Duration) {
        self.view_ttls.insert(view.to_string(), ttl);
    }

    /// Registers the window calls' synthetic tables, then lets DataFusion parse, plan and
    /// analyze the rewritten (and already checked) query.
    fn plan_query(&mut self, rewritten: &str, calls: Vec<WindowCall>) -> Result<LogicalPlan, SluiceError> {
        self.windows += calls.len();
        for call in calls {
            self.check_windows_per_row(&call)?;
            let Some(input) = self.catalog.tables.get(&call.input) else {
                return Err(SluiceError::user(
                    "sql.unknown_table",
                    format!(
                        "TABLE {} in a window function: no such table or view; the tables are: {}",
                        call.input,
                        self.table_names().join(", ")
                    ),
                ));
            };
            let schema = Catalog::window_schema(&input.schema());
            let entry = TableEntry::Window {
                input: call.input,
                time_column: call.time_column,
                kind: call.kind,
                partition: call.partition,
                schema,
            };
            self.catalog.tables.insert(call.table, entry);
        }
        let statement = ast::parse(rewritten)?;
        // Flink's literals: `0.908` is an exact DECIMAL(3, 3), not a DOUBLE.
        let parser_options =
            ParserOptions { enable_ident_normalization: false, parse_float_as_decimal: true, ..ParserOptions::new() };
        let plan = SqlToRel::new_with_options(&self.catalog, parser_options)
            .sql_statement_to_plan(statement)
            .map_err(|e| df_error("sql.plan", e))?;
        Analyzer::new().execute_and_check(plan, self.catalog.options(), |_, _| {}).map_err(|e| df_error("sql.plan", e))
    }

    /// Refuses a HOP that puts a row in more than `windows_per_row_max` windows.
    fn check_windows_per_row(&self, call: &WindowCall) -> Result<(), SluiceError> {
        let windows = call.kind.windows_per_row();
        let limit = self.options.windows_per_row_max;
        if windows <= limit {
            return Ok(());
        }
        let (size, slide) = (call.kind.size_ms(), call.kind.slide_ms());
        let slide_min = size.unsigned_abs().div_ceil(limit.max(1));
        Err(SluiceError::user(
            "sql.windows_per_row",
            format!(
                "{} puts each row in {windows} windows (size {size} ms / slide {slide} ms); the limit is {limit} \
                 windows per row (each row is copied once per window)",
                call.text
            ),
        )
        .with_fix(format!(
            "use a slide of at least {slide_min} ms (size / {limit}), or raise `windows_per_row_max` in [pipeline]"
        )))
    }
}

/// DataFusion's error as Sluice's, without DataFusion's category prefixes.
pub(crate) fn df_error(code: &'static str, error: DataFusionError) -> SluiceError {
    let mut message = error.strip_backtrace();
    for prefix in ["Error during planning: ", "Schema error: ", "This feature is not implemented: ", "Optimizer rule"] {
        if let Some(rest) = message.strip_prefix(prefix) {
            message = rest.to_string();
        }
    }
    let lower = message.to_ascii_lowercase();
    let error = SluiceError::user(code, message);
    let group_window_names = ["'tumble", "'hop", "'session", "tumble_", "hop_", "session_"];
    if group_window_names.iter().any(|f| lower.contains(f)) {
        return error.with_fix(
            "group windows and their functions (TUMBLE_START, …) go in a query whose GROUP BY has the window: \
             SELECT k, TUMBLE_START(ts, INTERVAL '10' SECOND), COUNT(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '10' \
             SECOND), k",
        );
    }
    error
}

#[cfg(test)]
mod changelog_tests;
#[cfg(test)]
mod tests;
