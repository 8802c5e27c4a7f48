//! From DataFusion's logical plan to the runtime's segments.
//!
//! A plan is walked bottom-up. Scans become a source table (or, for a view, the view's own
//! plan); projections and filters become fused operators evaluating DataFusion physical
//! expressions; a window call's scan adds window assignment (to the input's columns
//! that some expression of the view names, the others dropped before it and NULL after
//! it: a HOP copies each row once per window); an `Aggregate` grouped by a
//! window's `window_start` and `window_end` becomes a key-hash exchange followed by the
//! window aggregate; any other `Aggregate` becomes a key-hash exchange followed by the
//! updating group aggregate; a filter `rn <= N` over `ROW_NUMBER() OVER (…) AS rn`
//! becomes a key-hash exchange followed by TopN ([`crate::topn`]); a `Window` of aggregates
//! (`AGG(x) OVER (…)`) a key-hash exchange followed by the OVER aggregate ([`crate::over`]). Each column carries a [`Tag`] so the planner knows which
//! columns are the event time and the window bounds wherever they are renamed or
//! re-qualified.
//!
//! Each stream also carries its [`Changelog`]: sources are append-only, except a
//! changelog source (a changelog format and a `primary_key`), whose rows go through an
//! exchange by the primary key into the normalization (Flink's `ChangelogNormalize`) and
//! are updating with the primary key as upsert key; projections and
//! filters keep the mode (a projection keeps the upsert key only if it keeps every key
//! column as it is); a window aggregate needs an append-only input and stays
//! append-only; a group aggregate is updating, its `GROUP BY` columns the upsert key;
//! TopN is updating (over an updating input it keeps every row, so a retraction lets the
//! next one in); an OVER aggregate needs an
//! append-only input, is append-only and keeps the input's event time.
//! Window table functions, window aggregates and OVER aggregates over an updating stream
//! are refused (a window emitted once cannot take back what it emitted); over a
//! changelog source's updates with Flink's message, naming the source.
//!
//! Anything else is refused with an error naming the construct: the planner never runs a
//! query whose streaming meaning it does not implement.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion_common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion_common::{DFSchema, DFSchemaRef, ScalarValue};
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::logical_plan::{Projection, SubqueryAlias};
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_expr::simplify::SimplifyContext;
use datafusion_expr::{BinaryExpr, Expr, LogicalPlan, Operator};
use datafusion_optimizer::simplify_expressions::ExprSimplifier;
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};
use sluice_operators::counter::LazyCounter;
use sluice_operators::expr::{Filter, Project};
use sluice_operators::partition::{GatherPartitioner, HashPartitioner};
use sluice_operators::row_errors::{OnRowError, RowErrors};
use sluice_operators::window::{WindowAssign, WindowKind};
use sluice_runtime::{OperatorFactory, Segment, SegmentOutput, SideInput};
use sluice_types::{Changelog, SluiceError};

use crate::catalog::{Catalog, TableEntry};

/// What the planner knows of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    Plain,
    /// The event-time column of a source (watermarks are about it).
    EventTime,
    WindowStart,
    WindowEnd,
    /// A SESSION window's proto-window bounds (`[ts, ts + gap)` per row): meaningful only
    /// to the session aggregate that merges them, so nothing else may read them.
    SessionStart,
    SessionEnd,
    /// A SESSION window's `window_time` before its aggregate (`ts + gap - 1` per row).
    SessionTime,
}

impl Tag {
    fn is_session(self) -> bool {
        matches!(self, Tag::SessionStart | Tag::SessionEnd | Tag::SessionTime)
    }
}

/// A stream being planned: the finished segments and the operators of the open one.
pub(crate) struct StreamState {
    pub source: usize,
    pub table: usize,
    pub segments: Vec<Segment>,
    /// Further inputs joined into the stream's segments (a join's right side).
    pub sides: Vec<SideInput>,
    pub operators: Vec<(String, OperatorFactory)>,
    pub state: Option<String>,
    pub schema: DFSchemaRef,
    pub tags: Vec<Tag>,
    /// The policy of the flow's source for rows on which an expression fails.
    pub on_error: OnRowError,
    /// How many rows each source row has become through window assignments (HOP
    /// copies a row once per window): bounded by `windows_per_row_max`.
    pub windows_per_row: u64,
    /// Append-only or updating (with the upsert key's column positions).
    pub changelog: Changelog,
    /// A SESSION window not yet aggregated: its `PARTITION BY` columns (maybe none).
    pub session: Option<Vec<String>>,
    /// A HOP window assignment a local window aggregate may still slice.
    pub slicing: Option<HopSlicing>,
    /// The changelog sources whose updates the stream carries, as messages name them
    /// (e.g. ``the changelog source `orders` (debezium-json, primary key [id])``).
    pub changelog_sources: Vec<String>,
}

/// Which bound of a window a column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowBound {
    Start,
    End,
    Time,
}

/// A HOP window assignment in the open segment whose rows may be assigned to slices
/// instead ([`sluice_operators::window::WindowAssign::sliced`]), for a local window
/// aggregate that gives each slice's partials to the slice's windows
/// (`aggregate::plan_window_aggregate`). That gives the same answer only while nothing
/// but the aggregate's grouping reads the window's bounds and nothing between fails on
/// a row (it would fail once instead of once per window copy): it stays valid while
/// every operator pushed after the assignment is a projection that moves the bounds as
/// plain columns or a filter that does not read them, all of expressions that cannot
/// fail ([`StreamState::follow_slicing`]; [`StreamState::sliceable`] drops it as soon as
/// any other operator or an exchange appears).
#[derive(Clone)]
pub(crate) struct HopSlicing {
    /// The assignment's place in [`StreamState::operators`].
    pub assign: usize,
    /// The sliced assignment that may replace it.
    pub sliced: (String, OperatorFactory),
    pub hop: WindowKind,
    /// The name of the `rows outside the window range` counter.
    pub outside_range: String,
    /// Where the bounds are among the stream's columns.
    pub bounds: Vec<(usize, WindowBound)>,
    /// The segments and operators of the stream when it was last followed.
    segments: usize,
    operators: usize,
}

impl StreamState {
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(self.schema.as_arrow().clone())
    }

    /// The HOP assignment that may still be sliced: only if every operator since it was
    /// followed ([`StreamState::follow_slicing`]) in the same segment; otherwise it is
    /// dropped.
    pub fn sliceable(&mut self) -> Option<&mut HopSlicing> {
        let (segments, operators) = (self.segments.len(), self.operators.len());
        if self.slicing.as_ref().is_some_and(|s| s.segments != segments || s.operators != operators) {
            self.slicing = None;
        }
        self.slicing.as_mut()
    }

    /// Before an operator computing `outputs` (a projection's expressions, or a filter's
    /// predicate with `projects` false) over the stream's columns is pushed: where the
    /// window's bounds go, or the slicing dropped if one of them reads a bound other than
    /// as a plain column (or reads a column not found). Then [`StreamState::followed`]
    /// once the operator is pushed.
    fn follow_slicing(&mut self, outputs: &[Expr], projects: bool) {
        let schema = Arc::clone(&self.schema);
        let Some(slicing) = self.sliceable() else { return };
        // Some(bound) for a column holding one, Some(None) for another, None if not found.
        let bound = |column: &datafusion_common::Column| {
            schema.index_of_column(column).ok().map(|i| slicing.bounds.iter().find(|(at, _)| *at == i).map(|b| b.1))
        };
        let mut moved = Some(Vec::new());
        for (position, expr) in outputs.iter().enumerate() {
            // An expression that may fail on a row would count it, and show it, once per
            // slice instead of once per window copy, with its slice's bounds.
            if !cannot_fail(expr) {
                moved = None;
                break;
            }
            let reads_bound = expr.column_refs().into_iter().any(|column| bound(column) != Some(None));
            if !reads_bound {
                continue;
            }
            // Reading a bound is allowed only as the plain column, moved by a projection.
            let plain = match expr.clone().unalias() {
                Expr::Column(column) if projects => bound(&column).flatten(),
                _ => None,
            };
            match (plain, moved.as_mut()) {
                (Some(which), Some(moved)) => moved.push((position, which)),
                _ => moved = None,
            }
        }
        match moved {
            Some(moved) if projects => slicing.bounds = moved,
            Some(_) => {}
            None => self.slicing = None,
        }
    }

    /// The operator [`StreamState::follow_slicing`] checked was pushed.
    fn followed(&mut self) {
        let operators = self.operators.len();
        if let Some(slicing) = self.slicing.as_mut() {
            slicing.operators = operators;
        }
    }

    /// Closes the open segment with an exchange.
    pub fn cut(&mut self, output: SegmentOutput) {
        let operators = std::mem::take(&mut self.operators);
        let state = self.state.take();
        self.segments.push(Segment { operators, state, output });
    }

    /// Ends the stream at a sink; a single-writer sink on several threads is gathered first
    /// (to `gather`, the slot that runs it).
    pub fn finish(mut self, gather: Option<u32>) -> (usize, usize, Vec<Segment>, Vec<SideInput>) {
        if let Some(slot) = gather {
            let partitioner: sluice_runtime::PartitionerFactory = Arc::new(move |_| Box::new(GatherPartitioner(slot)));
            self.cut(SegmentOutput::Exchange {
                partitioner,
                description: format!("gather → thread {slot} (single-writer sink)"),
            });
        }
        self.cut(SegmentOutput::Sink);
        (self.source, self.table, self.segments, self.sides)
    }
}

/// Whether evaluating `expr` on any row gives a value, never an error: columns, literals,
/// comparisons and boolean logic only (arithmetic may overflow or divide by zero, casts
/// and functions may fail).
fn cannot_fail(expr: &Expr) -> bool {
    match expr {
        Expr::Column(_) | Expr::Literal(..) => true,
        Expr::Alias(alias) => cannot_fail(&alias.expr),
        Expr::Not(inner)
        | Expr::IsNull(inner)
        | Expr::IsNotNull(inner)
        | Expr::IsTrue(inner)
        | Expr::IsFalse(inner)
        | Expr::IsNotTrue(inner)
        | Expr::IsNotFalse(inner) => cannot_fail(inner),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            matches!(
                op,
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
                    | Operator::And
                    | Operator::Or
                    | Operator::IsDistinctFrom
                    | Operator::IsNotDistinctFrom
            ) && cannot_fail(left)
                && cannot_fail(right)
        }
        _ => false,
    }
}

/// ` (state TTL 1h)` for an operator whose keys expire (`explain`), or nothing.
pub(crate) fn ttl_note(ttl: Option<std::time::Duration>) -> String {
    let Some(ttl) = ttl else { return String::new() };
    let ms = ttl.as_millis();
    let text = match ms {
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    };
    format!(" (state TTL {text})")
}

/// An expression as `explain` shows it: without the synthetic window tables' qualifiers.
pub(crate) fn display(expr: &Expr) -> String {
    let text = expr.to_string();
    let mut shown = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("__window_") {
        shown.push_str(&rest[..at]);
        let after = &rest[at + "__window_".len()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        rest = after[digits..].strip_prefix('.').unwrap_or(&after[digits..]);
    }
    shown.push_str(rest);
    readable_intervals(&shown)
}

/// `text` with DataFusion's form of interval literals
/// (`IntervalMonthDayNano("IntervalMonthDayNano { months: 0, days: 0, nanoseconds:
/// 10000000000 }")`) written as SQL writes them (`INTERVAL '10' SECOND`); any other form
/// is left as it is.
pub(crate) fn readable_intervals(text: &str) -> String {
    const OPEN: &str = "IntervalMonthDayNano(\"IntervalMonthDayNano { months: ";
    const CLOSE: &str = " }\")";
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        shown.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let parsed = after.find(CLOSE).and_then(|end| {
            let fields = after[..end].replace(" days: ", "").replace(" nanoseconds: ", "");
            let mut numbers = fields.split(',').map(|n| n.trim().parse::<i64>());
            match (numbers.next(), numbers.next(), numbers.next(), numbers.next()) {
                (Some(Ok(months)), Some(Ok(days)), Some(Ok(nanos)), None) => {
                    interval_sql(months, days, nanos).map(|sql| (sql, end + CLOSE.len()))
                }
                _ => None,
            }
        });
        match parsed {
            Some((sql, length)) => {
                shown.push_str(&sql);
                rest = &after[length..];
            }
            None => {
                shown.push_str(OPEN);
                rest = after;
            }
        }
    }
    shown.push_str(rest);
    shown
}

/// An interval of one unit as SQL writes it (`INTERVAL '10' SECOND`, `INTERVAL '1.5'
/// SECOND`, `INTERVAL '2' DAY`); None for a mix of months, days and time.
fn interval_sql(months: i64, days: i64, nanos: i64) -> Option<String> {
    let one = |value: i64, unit: &str| Some(format!("INTERVAL '{value}' {unit}"));
    match (months, days, nanos) {
        (0, 0, 0) => one(0, "SECOND"),
        (months, 0, 0) if months % 12 == 0 => one(months / 12, "YEAR"),
        (months, 0, 0) => one(months, "MONTH"),
        (0, days, 0) => one(days, "DAY"),
        (0, 0, nanos) if nanos % 3_600_000_000_000 == 0 => one(nanos / 3_600_000_000_000, "HOUR"),
        (0, 0, nanos) if nanos % 60_000_000_000 == 0 => one(nanos / 60_000_000_000, "MINUTE"),
        (0, 0, nanos) if nanos % 1_000_000_000 == 0 => one(nanos / 1_000_000_000, "SECOND"),
        (0, 0, nanos) => {
            let sign = if nanos < 0 { "-" } else { "" };
            let magnitude = nanos.unsigned_abs();
            let fraction = format!("{:09}", magnitude % 1_000_000_000);
            let fraction = fraction.trim_end_matches('0');
            Some(format!("INTERVAL '{sign}{}.{fraction}' SECOND", magnitude / 1_000_000_000))
        }
        _ => None,
    }
}

pub(crate) fn unsupported(construct: &str, fix: &str) -> SluiceError {
    SluiceError::user("sql.unsupported", format!("{construct} is not supported yet")).with_fix(fix.to_string())
}

/// Simplifies `expr` (constant folding, and the rewrites DataFusion requires before
/// execution, e.g. COALESCE → CASE), then makes it evaluable on batches of `schema`.
pub(crate) fn physical(expr: &Expr, schema: &DFSchemaRef) -> Result<Arc<dyn PhysicalExpr>, SluiceError> {
    let props = ExecutionProps::new();
    let context = SimplifyContext::builder().with_schema(Arc::clone(schema)).build();
    let simplified =
        ExprSimplifier::new(context).simplify(expr.clone()).map_err(|e| crate::df_error("sql.expression", e))?;
    create_physical_expr(&simplified, schema, &props, &PhysicalPlanningContext::default())
        .map_err(|e| crate::df_error("sql.expression", e))
}

/// Plans logical plans into streams over a catalog.
#[derive(Clone)]
pub(crate) struct StreamPlanner<'a> {
    pub catalog: &'a Catalog,
    /// The view being planned: counters (late rows) and run-time errors name it. A view
    /// read by this one is planned by a planner named after it.
    pub view: String,
    pub vnodes: u32,
    pub batch_size: usize,
    /// See `PlannerOptions::windows_per_row_max`.
    pub windows_per_row_max: u64,
    /// See `PlannerOptions::local_aggregation`.
    pub local_aggregation: bool,
    /// See `PlannerOptions::mini_batch_rows`.
    pub mini_batch_rows: usize,
    /// Views with a state time-to-live of their own, and everyone else's.
    pub view_ttls: &'a std::collections::HashMap<String, std::time::Duration>,
    pub default_ttl: Option<std::time::Duration>,
    /// See [`crate::SqlPlanner::set_spill`].
    pub spill: Option<Arc<sluice_operators::spill::SpillSpace>>,
    /// The names of the columns the plan being planned reads anywhere (None: unknown,
    /// everything is read); see [`StreamPlanner::plan_root`].
    pub columns_read: Option<Arc<HashSet<String>>>,
}

/// The names of the columns any expression of `plan` reads, whatever their qualifier.
fn column_names_read(plan: &LogicalPlan) -> HashSet<String> {
    let mut names = HashSet::new();
    let _ = plan.apply(|node| {
        node.apply_expressions(|expr| {
            names.extend(expr.column_refs().into_iter().map(|column| column.name.clone()));
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(TreeNodeRecursion::Continue)
    });
    names
}

impl StreamPlanner<'_> {
    /// The state time-to-live of the view being planned (its own, or the pipeline's).
    pub fn state_ttl(&self) -> Option<std::time::Duration> {
        self.view_ttls.get(&self.view).copied().or(self.default_ttl)
    }

    /// Plans a view's (or a sink's) whole `plan`: as [`StreamPlanner::plan`], knowing
    /// which columns the plan reads, so that a window table function's scan can drop the
    /// columns of its input that no expression names before assigning windows.
    pub fn plan_root(&self, plan: &LogicalPlan) -> Result<StreamState, SluiceError> {
        let planner = StreamPlanner { columns_read: Some(Arc::new(column_names_read(plan))), ..self.clone() };
        planner.plan(plan)
    }

    /// The positions of the columns of window table `name` that the plan may read (every
    /// input column an expression names, the window's columns), if `name` is a window
    /// table and the plan's columns are known.
    fn window_columns_read(&self, name: &str) -> Option<Vec<usize>> {
        let (Some(TableEntry::Window { schema, .. }), Some(read)) = (self.catalog.tables.get(name), &self.columns_read)
        else {
            return None;
        };
        let width = schema.fields().len() - 3;
        Some((0..schema.fields().len()).filter(|&i| i >= width || read.contains(schema.field(i).name())).collect())
    }

    pub fn plan(&self, plan: &LogicalPlan) -> Result<StreamState, SluiceError> {
        match plan {
            LogicalPlan::TableScan(scan) => {
                if !scan.filters.is_empty() || scan.fetch.is_some() {
                    return Err(SluiceError::internal("sql.scan", "scan with pushed-down filters or limit"));
                }
                let name = scan.table_name.table();
                let read = scan.projection.clone().or_else(|| self.window_columns_read(name));
                let (mut state, positions) = self.plan_table_reading(name, read.as_deref())?;
                let every: Vec<usize> = (0..positions.len()).collect();
                let projection = scan.projection.as_ref().unwrap_or(&every);
                if scan.projection.is_some() || positions.iter().any(Option::is_none) {
                    // A column no expression names was dropped: its place holds NULLs,
                    // which nothing reads.
                    let input = Arc::clone(&state.schema);
                    let exprs = projection
                        .iter()
                        .enumerate()
                        .map(|(out, &i)| match positions[i] {
                            Some(at) => Ok(Expr::Column(input.columns()[at].clone())),
                            None => ScalarValue::try_from(scan.projected_schema.field(out).data_type())
                                .map(|null| Expr::Literal(null, None))
                                .map_err(|e| crate::df_error("sql.scan", e)),
                        })
                        .collect::<Result<Vec<Expr>, SluiceError>>()?;
                    let tags =
                        projection.iter().map(|&i| positions[i].map_or(Tag::Plain, |at| state.tags[at])).collect();
                    // The batches' schema says the dropped columns may be NULL; the plan's
                    // (`state.schema`) stays as declared.
                    let fields = scan.projected_schema.iter().zip(projection).map(|((qualifier, field), &i)| {
                        let nullable = field.is_nullable() || positions[i].is_none();
                        (qualifier.cloned(), Arc::new(field.as_ref().clone().with_nullable(nullable)))
                    });
                    let batches = Arc::new(
                        DFSchema::new_with_metadata(fields.collect(), Default::default())
                            .map_err(|e| crate::df_error("sql.scan", e))?,
                    );
                    self.push_projection(&mut state, &exprs, batches, "scan projection")?;
                    state.tags = tags;
                    state.changelog = project_changelog(&state.changelog, |i| {
                        projection.iter().position(|&p| positions[p] == Some(i))
                    });
                }
                state.schema = Arc::clone(&scan.projected_schema);
                Ok(state)
            }
            LogicalPlan::Projection(projection) => {
                let state = match crate::topn::plan_under_projection(self, projection)? {
                    Some(state) => state,
                    None => self.plan(&projection.input)?,
                };
                self.project(state, projection)
            }
            LogicalPlan::Filter(filter) => {
                if let Some(state) = crate::topn::plan_topn(self, filter, true)? {
                    return Ok(state);
                }
                if let LogicalPlan::Join(join) = filter.input.as_ref()
                    && join.join_type == datafusion_expr::JoinType::Inner
                {
                    return crate::join::plan_join(self, join, Some(&filter.predicate));
                }
                let mut state = self.plan(&filter.input)?;
                self.push_filter(&mut state, &filter.predicate)?;
                Ok(state)
            }
            LogicalPlan::SubqueryAlias(alias) => {
                let state = self.plan(&alias.input)?;
                Ok(Self::alias(state, alias))
            }
            LogicalPlan::Aggregate(aggregate) => crate::aggregate::plan_aggregate(self, aggregate),
            LogicalPlan::Join(join) => crate::join::plan_join(self, join, None),
            LogicalPlan::Union(union) => crate::union::plan_union(self, union),
            LogicalPlan::Window(window) if crate::over::is_over_aggregate(window) => {
                crate::over::plan_over(self, window)
            }
            other => Err(refuse(other)),
        }
    }

    /// `projection` applied to `state`, a stream of its input.
    pub fn project(&self, mut state: StreamState, projection: &Projection) -> Result<StreamState, SluiceError> {
        for expr in &projection.expr {
            if !matches!(expr.clone().unalias(), Expr::Column(_)) {
                refuse_session_bounds(expr, &state)?;
            }
        }
        let tags = projection.expr.iter().map(|e| column_tag(e, &state)).collect();
        let identity = projection.expr.len() == state.schema.fields().len()
            && projection
                .expr
                .iter()
                .enumerate()
                .all(|(i, e)| matches!(e, Expr::Column(c) if state.schema.index_of_column(c).ok() == Some(i)));
        if !identity {
            let names: Vec<String> = projection.expr.iter().map(display).collect();
            self.push_projection(&mut state, &projection.expr, Arc::clone(&projection.schema), &names.join(", "))?;
        }
        let input = Arc::clone(&state.schema);
        state.changelog = project_changelog(&state.changelog, |i| {
            projection.expr.iter().position(
                |e| matches!(e.clone().unalias(), Expr::Column(c) if input.index_of_column(&c).ok() == Some(i)),
            )
        });
        state.schema = Arc::clone(&projection.schema);
        state.tags = tags;
        Ok(state)
    }

    /// `alias` applied to `state`, a stream of its input: the columns' qualifier changes.
    pub fn alias(mut state: StreamState, alias: &SubqueryAlias) -> StreamState {
        state.schema = Arc::clone(&alias.schema);
        state
    }

    /// Adds a filter by `predicate` (over the stream's schema); weights are kept.
    pub fn push_filter(&self, state: &mut StreamState, predicate: &Expr) -> Result<(), SluiceError> {
        refuse_session_bounds(predicate, state)?;
        state.follow_slicing(std::slice::from_ref(predicate), false);
        let physical_predicate = physical(predicate, &state.schema)?;
        let text = display(predicate);
        let (view, on_error) = (self.view.clone(), state.on_error);
        let line = format!("filter: {text}");
        let factory: OperatorFactory = Arc::new(move |context| {
            let errors = RowErrors::new(view.clone(), on_error, Arc::clone(&context.metrics));
            Ok(Box::new(Filter::new(Arc::clone(&physical_predicate), text.clone(), errors)))
        });
        state.operators.push((line, factory));
        state.followed();
        Ok(())
    }

    /// A stream reading a named table from its start.
    fn plan_table(&self, name: &str) -> Result<StreamState, SluiceError> {
        self.plan_table_reading(name, None).map(|(state, _)| state)
    }

    /// A stream reading a named table from its start, of which only the columns `read`
    /// (positions in the table's schema; None: all) will be read; with where each column
    /// of the table is in the stream's schema (None: not there). A window table
    /// function's table drops the columns of its input that nobody reads before window
    /// assignment, which copies each row once per window (a HOP of NEXMark q5 five
    /// times); any other table keeps every column.
    fn plan_table_reading(
        &self,
        name: &str,
        read: Option<&[usize]>,
    ) -> Result<(StreamState, Vec<Option<usize>>), SluiceError> {
        let Some(entry) = self.catalog.tables.get(name) else {
            return Err(SluiceError::internal("sql.catalog", format!("table `{name}` vanished from the catalog")));
        };
        match entry {
            TableEntry::Source { source, table, schema, event_time, on_error, changelog } => {
                let df_schema =
                    DFSchema::try_from_qualified_schema(name, schema).map_err(|e| crate::df_error("sql.schema", e))?;
                let tags = schema
                    .fields()
                    .iter()
                    .map(|f| if Some(f.name()) == event_time.as_ref() { Tag::EventTime } else { Tag::Plain })
                    .collect();
                let state = StreamState {
                    source: *source,
                    table: *table,
                    segments: Vec::new(),
                    sides: Vec::new(),
                    operators: Vec::new(),
                    state: None,
                    schema: Arc::new(df_schema),
                    tags,
                    on_error: *on_error,
                    windows_per_row: 1,
                    changelog: Changelog::AppendOnly,
                    session: None,
                    slicing: None,
                    changelog_sources: Vec::new(),
                };
                let state = match changelog {
                    Some(changelog) => self.normalize(state, name, schema, changelog),
                    None => state,
                };
                Ok((state, (0..schema.fields().len()).map(Some).collect()))
            }
            TableEntry::View { plan, schema } => {
                Ok((self.for_view(name).plan_root(plan)?, (0..schema.fields().len()).map(Some).collect()))
            }
            TableEntry::Window { input, time_column, kind, partition, schema } => {
                let (mut state, positions) = self.plan_window(input, time_column, *kind, schema, read)?;
                if let WindowKind::Session { .. } = kind {
                    let width = state.tags.len();
                    state.tags[width - 3..].copy_from_slice(&[Tag::SessionStart, Tag::SessionEnd, Tag::SessionTime]);
                    state.session = Some(partition.clone());
                }
                Ok((state, positions))
            }
        }
    }

    /// The stream of `input` followed by window assignment, its output the window
    /// table's `schema`, less the input columns not in `read` (positions in `schema`;
    /// the time column is always kept); with where each column of `schema` is in the
    /// stream's schema (None: dropped).
    fn plan_window(
        &self,
        input: &str,
        time_column: &str,
        kind: WindowKind,
        schema: &SchemaRef,
        read: Option<&[usize]>,
    ) -> Result<(StreamState, Vec<Option<usize>>), SluiceError> {
        let mut state = self.plan_table(input)?;
        if state.changelog.is_updating() {
            let construct = format!("a window table function over `{input}`");
            if let Some(error) =
                crate::changelog::changelog_input(&construct, &state, crate::changelog::CHANGELOG_WINDOW_FIX)
            {
                return Err(error);
            }
            return Err(unsupported(
                &format!("{construct}, an updating stream (its rows change)"),
                "window the rows before they are aggregated: apply the window function to the source, then GROUP BY \
                 window_start, window_end and the keys",
            ));
        }
        state.windows_per_row = self.windows_per_row(&state, input, kind)?;
        let input_schema = state.arrow_schema();
        let Some(time_index) = input_schema.fields().iter().position(|f| f.name() == time_column) else {
            let names: Vec<&str> = input_schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(SluiceError::user(
                "sql.descriptor",
                format!("DESCRIPTOR({time_column}): `{input}` has no such column (columns: {})", names.join(", ")),
            ));
        };
        if state.tags[time_index] != Tag::EventTime {
            return Err(SluiceError::user(
                "sql.descriptor",
                format!("DESCRIPTOR({time_column}): `{time_column}` of `{input}` is not an event-time attribute"),
            )
            .with_fix(format!("declare `event_time = \"{time_column}\"` on the source that `{input}` reads")));
        }
        let width = input_schema.fields().len();
        let kept: Vec<usize> =
            (0..width).filter(|&i| i == time_index || read.is_none_or(|read| read.contains(&i))).collect();
        let (time_index, output) = if kept.len() < width {
            let exprs: Vec<Expr> = kept.iter().map(|&i| Expr::Column(state.schema.columns()[i].clone())).collect();
            let fields = kept.iter().map(|&i| {
                let (qualifier, field) = state.schema.qualified_field(i);
                (qualifier.cloned(), Arc::clone(field))
            });
            let projected = Arc::new(
                DFSchema::new_with_metadata(fields.collect(), Default::default())
                    .map_err(|e| crate::df_error("sql.schema", e))?,
            );
            let names: Vec<String> = exprs.iter().map(display).collect();
            self.push_projection(&mut state, &exprs, Arc::clone(&projected), &names.join(", "))?;
            state.tags = kept.iter().map(|&i| state.tags[i]).collect();
            state.changelog = project_changelog(&state.changelog, |i| kept.iter().position(|&k| k == i));
            state.schema = projected;
            let fields = kept
                .iter()
                .map(|&i| Arc::clone(&schema.fields()[i]))
                .chain(schema.fields().iter().skip(width).cloned());
            let output = Arc::new(Schema::new(fields.collect::<Vec<_>>()));
            (kept.iter().position(|&i| i == time_index).expect("the time column is kept"), output)
        } else {
            (time_index, Arc::clone(schema))
        };
        let positions = (0..schema.fields().len())
            .map(|i| if i < width { kept.iter().position(|&k| k == i) } else { Some(kept.len() + i - width) })
            .collect();
        let counter = format!("view {}: rows without event time", self.view);
        let outside = format!("view {}: rows outside the window range", self.view);
        let (assigned, without_time, outside_range) = (Arc::clone(&output), counter.clone(), outside.clone());
        let factory: OperatorFactory = Arc::new(move |context| {
            Ok(Box::new(WindowAssign::new(
                time_index,
                kind,
                Arc::clone(&assigned),
                context.metrics.counter(&without_time),
                LazyCounter::new(Arc::clone(&context.metrics), outside_range.clone()),
            )))
        });
        let shape = match kind {
            WindowKind::Tumble { size_ms } => format!("TUMBLE(size {size_ms} ms)"),
            WindowKind::Hop { slide_ms, size_ms } => format!("HOP(slide {slide_ms} ms, size {size_ms} ms)"),
            WindowKind::Cumulate { step_ms, size_ms } => format!("CUMULATE(step {step_ms} ms, size {size_ms} ms)"),
            WindowKind::Session { gap_ms } => format!("SESSION(gap {gap_ms} ms; each row's [ts, ts + gap))"),
        };
        state.operators.push((format!("window_assign: {shape} on {time_column}"), factory));
        state.slicing = match kind.slice_ms() {
            // Sliced only when a row joins several windows (otherwise nothing is saved) and
            // the slide divides the size: then a slice is a slide, in exactly
            // `windows_per_row` windows. (A slice much shorter than the slide, as in
            // HOP(1000 ms, 1001 ms), would give nearly every row its own slice and send
            // more partial rows than the copies save.)
            Some(slice) if kind.windows_per_row() > 1 && slice == kind.slide_ms() => {
                let (sliced_output, without_time, outside_range) =
                    (Arc::clone(&output), counter.clone(), outside.clone());
                let sliced: OperatorFactory = Arc::new(move |context| {
                    let assign = WindowAssign::new(
                        time_index,
                        kind,
                        Arc::clone(&sliced_output),
                        context.metrics.counter(&without_time),
                        LazyCounter::new(Arc::clone(&context.metrics), outside_range.clone()),
                    );
                    Ok(Box::new(assign.sliced()))
                });
                let line = format!("window_assign: {shape} on {time_column}, each row to its {slice} ms slice once");
                let width = output.fields().len() - 3;
                Some(HopSlicing {
                    assign: state.operators.len() - 1,
                    sliced: (line, sliced),
                    hop: kind,
                    outside_range: outside,
                    bounds: vec![
                        (width, WindowBound::Start),
                        (width + 1, WindowBound::End),
                        (width + 2, WindowBound::Time),
                    ],
                    segments: state.segments.len(),
                    operators: state.operators.len(),
                })
            }
            _ => None,
        };
        state.tags.extend([Tag::WindowStart, Tag::WindowEnd, Tag::Plain]);
        state.schema = Arc::new(
            DFSchema::try_from_qualified_schema(input, &output).map_err(|e| crate::df_error("sql.schema", e))?,
        );
        Ok((state, positions))
    }

    /// The windows per source row after `kind` on a stream of `input`: the product over
    /// the window assignments on the way, refused past `windows_per_row_max`.
    fn windows_per_row(&self, state: &StreamState, input: &str, kind: WindowKind) -> Result<u64, SluiceError> {
        let windows = state.windows_per_row.saturating_mul(kind.windows_per_row());
        if windows <= self.windows_per_row_max {
            return Ok(windows);
        }
        Err(SluiceError::user(
            "sql.windows_per_row",
            format!(
                "`{input}` already puts each source row in {} windows, and this window table function puts each of \
                 those in {}: {windows} windows per source row; the limit is {} (each row is copied once per window)",
                state.windows_per_row,
                kind.windows_per_row(),
                self.windows_per_row_max
            ),
        )
        .with_fix("window the rows once, use larger slides, or raise `windows_per_row_max` in [pipeline]"))
    }

    pub fn push_projection(
        &self,
        state: &mut StreamState,
        exprs: &[Expr],
        output: DFSchemaRef,
        line: &str,
    ) -> Result<(), SluiceError> {
        let physical_exprs = exprs.iter().map(|e| physical(e, &state.schema)).collect::<Result<Vec<_>, _>>()?;
        state.follow_slicing(exprs, true);
        let texts: Vec<String> = exprs.iter().map(expression_text).collect();
        let schema: SchemaRef = Arc::new(Schema::new(output.as_arrow().fields().clone()));
        let (view, on_error) = (self.view.clone(), state.on_error);
        let factory: OperatorFactory = Arc::new(move |context| {
            let errors = RowErrors::new(view.clone(), on_error, Arc::clone(&context.metrics));
            Ok(Box::new(Project::new(physical_exprs.clone(), texts.clone(), Arc::clone(&schema), errors)))
        });
        state.operators.push((format!("project: {line}"), factory));
        state.followed();
        Ok(())
    }

    /// A planner for view `view`, which this one reads.
    fn for_view(&self, view: &str) -> StreamPlanner<'_> {
        StreamPlanner { view: view.to_string(), columns_read: None, ..self.clone() }
    }

    pub fn hash_exchange(&self, state: &mut StreamState, keys: Vec<usize>, description: String) {
        let vnodes = self.vnodes;
        let partitioner: sluice_runtime::PartitionerFactory =
            Arc::new(move |_| Box::new(HashPartitioner::new(keys.clone(), vnodes)));
        state.cut(SegmentOutput::Exchange { partitioner, description });
    }
}

/// The changelog after a projection: `position(i)` is where input column `i` went
/// unchanged, if it did. The upsert key survives only if every key column does.
fn project_changelog(changelog: &Changelog, position: impl Fn(usize) -> Option<usize>) -> Changelog {
    match changelog {
        Changelog::AppendOnly => Changelog::AppendOnly,
        Changelog::Updating { upsert_key } => Changelog::Updating {
            upsert_key: upsert_key.as_ref().and_then(|key| key.iter().map(|&i| position(i)).collect()),
        },
    }
}

/// An expression as run-time errors show it: as written, without the planner's own
/// aliases (`__c0`, …).
fn expression_text(expr: &Expr) -> String {
    match expr {
        Expr::Alias(alias) if alias.name.starts_with("__") => display(&alias.expr),
        _ => display(expr),
    }
}

/// The tag of an expression's value: a column keeps its tag; a window's rowtime,
/// `window_end - INTERVAL '1' MILLISECOND` (what `*_ROWTIME` is rewritten into,
/// [`crate::group_window`]), is an event time; anything else computed is plain.
///
/// The rowtime is an event time because every row of a window comes before the
/// watermark passes `window_end - 1`: a window table function's rows are on time
/// (`ts <= window_end - 1`), and the window and session aggregates emit a window when the
/// watermark reaches `window_end - 1`, before forwarding that watermark (the one before it
/// was lower, or the window would have been emitted then), as does a window join
/// ([`crate::join`]). So a later window, OVER aggregate or interval join may use it.
pub(crate) fn column_tag(expr: &Expr, state: &StreamState) -> Tag {
    match expr.clone().unalias() {
        Expr::Column(column) => state.schema.index_of_column(&column).map_or(Tag::Plain, |i| state.tags[i]),
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Minus, right })
            if column_tag(&left, state) == Tag::WindowEnd && crate::join::interval_ms(&right) == Some(1) =>
        {
            Tag::EventTime
        }
        _ => Tag::Plain,
    }
}

/// Refuses `expr` if it reads a SESSION window's bounds before the aggregate that makes
/// them sessions' (each row's bounds are only its own `[ts, ts + gap)` until then).
pub(crate) fn refuse_session_bounds(expr: &Expr, state: &StreamState) -> Result<(), SluiceError> {
    let reads_bounds = expr
        .column_refs()
        .into_iter()
        .any(|column| state.schema.index_of_column(column).is_ok_and(|i| state.tags[i].is_session()));
    if reads_bounds {
        return Err(unsupported(
            &format!(
                "`{}`, which reads a SESSION window's window_start, window_end or window_time outside its GROUP BY",
                display(expr)
            ),
            "aggregate the SESSION window first (GROUP BY window_start, window_end, …), then compute on the bounds \
             in an outer query or a view",
        ));
    }
    Ok(())
}

/// Refuses a view's stream that still holds a SESSION window no aggregate merged.
pub(crate) fn unaggregated_session(state: StreamState) -> Result<StreamState, SluiceError> {
    if state.session.is_some() {
        return Err(unsupported(
            "a SESSION window table function whose rows are not aggregated by GROUP BY window_start, window_end",
            "aggregate it: SELECT window_start, window_end, k, COUNT(*) FROM TABLE(SESSION(TABLE t PARTITION BY k, \
             DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY window_start, window_end, k",
        ));
    }
    Ok(state)
}

fn refuse(plan: &LogicalPlan) -> SluiceError {
    let (construct, fix) = match plan {
        LogicalPlan::Sort(_) => ("ORDER BY on a stream", "remove ORDER BY (TopN via ROW_NUMBER arrives later)"),
        LogicalPlan::Limit(_) => ("LIMIT on a stream", "remove LIMIT"),
        LogicalPlan::Window(_) => (
            "ROW_NUMBER() OVER (…) without a filter `rn <= N` (or `rn = 1`) on it in the enclosing query",
            "write TopN as Flink does: SELECT … FROM (SELECT …, ROW_NUMBER() OVER (PARTITION BY … ORDER BY …) AS rn \
             FROM t) WHERE rn <= 3",
        ),
        LogicalPlan::Distinct(_) => ("SELECT DISTINCT", "use GROUP BY window_start, window_end and the columns"),
        LogicalPlan::Values(_) => ("VALUES", "read rows from a source"),
        LogicalPlan::EmptyRelation(_) => ("SELECT without FROM", "select from a source table or view"),
        LogicalPlan::Subquery(_) => ("a subquery expression", "move the subquery into a view"),
        LogicalPlan::Unnest(_) => ("UNNEST", "flatten the data before it reaches Sluice"),
        LogicalPlan::RecursiveQuery(_) => ("WITH RECURSIVE", "remove the recursion"),
        _ => return unsupported(&format!("the plan node `{}`", plan.display()), "simplify the query"),
    };
    unsupported(construct, fix)
}
