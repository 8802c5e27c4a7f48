//! Planning TopN and deduplication, as Flink users write them:
//!
//! ```sql
//! SELECT … FROM (
//!   SELECT …, ROW_NUMBER() OVER (PARTITION BY p ORDER BY o DESC) AS rn FROM t
//! ) WHERE rn <= 3          -- or rn < 4, or rn = 1 (deduplication), and other conditions
//! ```
//!
//! DataFusion plans this as a `Filter` over (projections and aliases over) a `Window`
//! node computing `ROW_NUMBER()`. The filter's bound on the rank becomes N; the window's
//! input is exchanged by the partition columns' hash and ranked by the TopN operator,
//! whose output has the window's schema (the input's columns, then the rank); the
//! projections and aliases between the window and the filter are then applied as
//! usual, and any other condition of the filter after them. Partition and order columns
//! must be columns of the window's input (compute expressions in a view first), and the
//! input must be append-only.
//!
//! Whether the rank is read downstream decides how changes are sent (see
//! `sluice_operators::topn`): a projection directly above the filter that drops it
//! makes the TopN send only rows that enter or leave.
//!
//! The output is updating; its upsert key is (partition columns, rank) when the rank is
//! kept, the partition columns for a deduplication (N = 1) without it, none otherwise.

use std::sync::Arc;

use datafusion_common::ScalarValue;
use datafusion_expr::expr::WindowFunctionParams;
use datafusion_expr::logical_plan::{Filter, Projection, Window};
use datafusion_expr::utils::{conjunction, split_conjunction};
use datafusion_expr::{BinaryExpr, Expr, LogicalPlan, Operator as BinaryOperator};
use sluice_operators::topn::{SortColumn, TOPN_LIMIT_MAX, TopN, TopNSpec};
use sluice_operators::ttl::{Clock, Ttl};
use sluice_runtime::OperatorFactory;
use sluice_types::{Changelog, SluiceError};

use crate::stream::{StreamPlanner, StreamState, Tag, display, unsupported};

/// The nodes between a filter and its window (top first), and the window.
struct Shape<'a> {
    between: Vec<&'a LogicalPlan>,
    window: &'a Window,
}

/// The nodes under `filter`, if they lead to a window through projections and aliases.
fn shape(filter: &Filter) -> Option<Shape<'_>> {
    let mut between = Vec::new();
    let mut node = filter.input.as_ref();
    loop {
        match node {
            LogicalPlan::Projection(projection) => {
                between.push(node);
                node = projection.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(alias) => {
                between.push(node);
                node = alias.input.as_ref();
            }
            LogicalPlan::Window(window) => return Some(Shape { between, window }),
            _ => return None,
        }
    }
}

/// Whether `expr` (over `filter`'s input) reads the rank.
fn reads_rank(expr: &Expr, filter: &Filter, shape: &Shape<'_>, rank: usize) -> bool {
    expr.column_refs().iter().any(|column| {
        let index = filter.input.schema().index_of_column(column).ok();
        index.and_then(|index| trace(shape, index)) == Some(rank)
    })
}

/// Where column `index` of `filter`'s input comes from in the window's output, if it is
/// passed down unchanged through the nodes between.
fn trace(shape: &Shape<'_>, mut index: usize) -> Option<usize> {
    for node in &shape.between {
        if let LogicalPlan::Projection(projection) = node {
            let Expr::Column(column) = projection.expr.get(index)?.clone().unalias() else { return None };
            index = projection.input.schema().index_of_column(&column).ok()?;
        }
    }
    Some(index)
}

/// Whether `expr` is (a cast of) the filter input's column that traces to the rank.
fn is_rank(expr: &Expr, filter: &Filter, shape: &Shape<'_>, rank: usize) -> bool {
    let mut expr = expr;
    while let Expr::Cast(cast) = expr {
        expr = &cast.expr;
    }
    let Expr::Column(column) = expr else { return false };
    let index = filter.input.schema().index_of_column(column).ok();
    index.and_then(|index| trace(shape, index)) == Some(rank)
}

/// The integer value of a literal (or of a cast of one).
fn literal(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Literal(value, _) => match value.cast_to(&arrow::datatypes::DataType::Int64).ok()? {
            ScalarValue::Int64(Some(value)) => Some(value),
            _ => None,
        },
        Expr::Cast(cast) => literal(&cast.expr),
        _ => None,
    }
}

/// N, if `conjunct` bounds the rank: `rn <= N`, `rn < N + 1`, `rn = 1` (either side).
fn bound(conjunct: &Expr, filter: &Filter, shape: &Shape<'_>, rank: usize) -> Option<i64> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else { return None };
    let (op, value) = if is_rank(left, filter, shape, rank) {
        (*op, literal(right)?)
    } else if is_rank(right, filter, shape, rank) {
        (op.swap()?, literal(left)?)
    } else {
        return None;
    };
    match op {
        BinaryOperator::LtEq => Some(value),
        BinaryOperator::Lt => Some(value - 1),
        BinaryOperator::Eq if value == 1 => Some(1),
        _ => None,
    }
}

/// TopN for `filter`, if it filters a `ROW_NUMBER()` window; an error names a window
/// that is not a TopN Sluice runs. `rank_needed`: whether anything above reads the rank.
pub(crate) fn plan_topn(
    planner: &StreamPlanner<'_>,
    filter: &Filter,
    rank_needed: bool,
) -> Result<Option<StreamState>, SluiceError> {
    let Some(shape) = shape(filter) else { return Ok(None) };
    let window = shape.window;
    if crate::over::is_over_aggregate(window) {
        return Ok(None);
    }
    let input_width = window.input.schema().fields().len();
    let refuse = |what: &str| {
        unsupported(
            &format!("{what} (TopN is ROW_NUMBER() OVER (PARTITION BY columns ORDER BY columns) filtered by rn <= N)"),
            "write TopN as Flink does: SELECT … FROM (SELECT …, ROW_NUMBER() OVER (PARTITION BY … ORDER BY …) AS rn \
             FROM t) WHERE rn <= 3; compute expressions in a view first",
        )
    };
    let [Expr::WindowFunction(function)] = window.window_expr.as_slice() else {
        return Err(refuse("several window functions over one input"));
    };
    if !function.fun.name().eq_ignore_ascii_case("row_number") || !function.params.args.is_empty() {
        return Err(refuse(&format!("the window function {}", function.fun.name())));
    }
    let mut limit = None;
    let mut residual = Vec::new();
    for conjunct in split_conjunction(&filter.predicate) {
        match bound(conjunct, filter, &shape, input_width) {
            Some(n) if limit.is_none() => limit = Some(n),
            _ => residual.push(conjunct.clone()),
        }
    }
    let rank_needed = rank_needed || residual.iter().any(|c| reads_rank(c, filter, &shape, input_width));
    let Some(limit) = limit else {
        return Err(refuse(&format!("a filter on ROW_NUMBER() other than rn <= N: {}", display(&filter.predicate))));
    };
    if limit < 1 || limit as u64 > TOPN_LIMIT_MAX as u64 {
        return Err(SluiceError::user(
            "sql.topn_limit",
            format!("TopN keeps {limit} rows per partition; it must keep 1 to {TOPN_LIMIT_MAX}"),
        )
        .with_fix(format!("filter by rn <= N with N between 1 and {TOPN_LIMIT_MAX}")));
    }
    let (partition, order) = columns(window, &function.params, &refuse)?;
    let mut state = planner.plan(&window.input).and_then(crate::stream::unaggregated_session)?;
    push_topn(planner, &mut state, window, partition, order, limit as usize, rank_needed)?;
    for node in shape.between.iter().rev() {
        state = match node {
            LogicalPlan::Projection(projection) => planner.project(state, projection)?,
            LogicalPlan::SubqueryAlias(alias) => StreamPlanner::alias(state, alias),
            _ => unreachable!("shape() walks only projections and aliases"),
        };
    }
    if let Some(residual) = conjunction(residual) {
        planner.push_filter(&mut state, &residual)?;
    }
    Ok(Some(state))
}

/// The input columns of `PARTITION BY` and `ORDER BY` (each must name a column).
fn columns(
    window: &Window,
    params: &WindowFunctionParams,
    refuse: &dyn Fn(&str) -> SluiceError,
) -> Result<(Vec<usize>, Vec<SortColumn>), SluiceError> {
    let column_of = |expr: &Expr| match expr.clone().unalias() {
        Expr::Column(column) => window.input.schema().index_of_column(&column).ok(),
        _ => None,
    };
    let partition = params
        .partition_by
        .iter()
        .map(column_of)
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| refuse("PARTITION BY an expression"))?;
    let order = params
        .order_by
        .iter()
        .map(|sort| {
            column_of(&sort.expr).map(|column| SortColumn {
                column,
                descending: !sort.asc,
                nulls_first: sort.nulls_first,
            })
        })
        .collect::<Option<Vec<SortColumn>>>()
        .ok_or_else(|| refuse("ORDER BY an expression"))?;
    if order.is_empty() {
        return Err(refuse("ROW_NUMBER() without ORDER BY"));
    }
    Ok((partition, order))
}

/// The exchange by the partition columns and the TopN operator, on a stream of the
/// window's input; afterwards the stream has the window's schema.
fn push_topn(
    planner: &StreamPlanner<'_>,
    state: &mut StreamState,
    window: &Window,
    partition: Vec<usize>,
    order: Vec<SortColumn>,
    limit: usize,
    rank_in_output: bool,
) -> Result<(), SluiceError> {
    let input_schema = Arc::new(window.input.schema().as_arrow().clone());
    let names = |columns: &mut dyn Iterator<Item = usize>| -> Vec<String> {
        columns.map(|c| input_schema.field(c).name().clone()).collect()
    };
    let partition_names = names(&mut partition.iter().copied());
    let description = if partition.is_empty() {
        "all rows → one vnode (no PARTITION BY)".to_string()
    } else {
        format!("hash({}) → {} vnodes", partition_names.join(", "), planner.vnodes)
    };
    planner.hash_exchange(state, partition.clone(), description);
    let order_text: Vec<String> = order
        .iter()
        .map(|s| format!("{}{}", input_schema.field(s.column).name(), if s.descending { " DESC" } else { "" }))
        .collect();
    let line = format!(
        "topn: first {limit} by {} per {}{}",
        order_text.join(", "),
        if partition.is_empty() { "stream".to_string() } else { partition_names.join(", ") },
        if rank_in_output { "" } else { " (rank not read)" }
    );
    let width = input_schema.fields().len();
    let upsert_key = match (rank_in_output, limit) {
        (true, _) => Some(partition.iter().copied().chain([width]).collect()),
        (false, 1) => Some(partition.clone()),
        (false, _) => None,
    };
    // Over an updating input a retraction lets the next row in: every row is kept.
    let retracting = state.changelog.is_updating();
    // A window TopN (partitioned by a window's bounds, over append-only input) frees a
    // window's partitions once the watermark passes its end.
    let tagged = |tag: Tag| partition.iter().copied().find(|&c| state.tags.get(c) == Some(&tag));
    let window_end = match (tagged(Tag::WindowStart), tagged(Tag::WindowEnd)) {
        (Some(_), Some(end)) if !retracting => Some(end),
        _ => None,
    };
    let spec = TopNSpec {
        partition,
        order,
        limit,
        output: Arc::new(window.schema.as_arrow().clone()),
        rank_in_output,
        retracting,
        window_end,
    };
    let ignored = format!("view {}: ignored retractions", planner.view);
    let late = format!("view {}: late rows", planner.view);
    let ttl = planner.state_ttl();
    let spill = planner.spill.clone();
    let spills = spill.is_some();
    let factory: OperatorFactory = Arc::new(move |context| {
        let mut topn = TopN::new(spec.clone(), &input_schema, context.vnodes)?;
        if let Some(space) = &spill {
            topn = topn.with_spill(Arc::clone(space), sluice_operators::spill::spilled_bytes(&context.metrics));
        }
        if retracting {
            topn = topn.with_ignored_counter(context.metrics.counter(&ignored));
        }
        if let Some(ttl) = ttl {
            topn = topn.with_ttl(Ttl::new(ttl, Clock::system()));
        }
        if window_end.is_some() {
            topn = topn.with_late_counter(context.metrics.counter(&late));
        }
        Ok(Box::new(topn))
    });
    let line = if retracting { format!("{line} (updating input: every row kept)") } else { line };
    let line = format!("{line}{}", crate::stream::ttl_note(ttl));
    // Partitions spill too but for a window TopN's (freed as the watermark passes) and
    // with a TTL (an evicted partition would outlive it).
    let what = if window_end.is_none() && ttl.is_none() { "partitions and kept rows" } else { "kept rows" };
    let line = if spills { format!("{line} ({what} spill to disk beyond state_memory_mib)") } else { line };
    let line = if window_end.is_some() {
        format!("{line} (window TopN: freed as the watermark passes each window)")
    } else {
        line
    };
    state.operators.push((line, factory));
    let partitions = if partition_names.is_empty() { "one, no key".to_string() } else { partition_names.join(", ") };
    state.state = Some(if retracting {
        format!("every row per partition ({partitions}), the first {limit} emitted")
    } else {
        format!("the first {limit} rows per partition ({partitions})")
    });
    state.schema = Arc::clone(&window.schema);
    state.tags = state.tags.iter().copied().take(width).chain([Tag::Plain]).collect();
    state.changelog = Changelog::Updating { upsert_key };
    Ok(())
}

/// TopN under `projection`, when the projection's input is a TopN's filter: the rank is
/// read only if the projection keeps it.
pub(crate) fn plan_under_projection(
    planner: &StreamPlanner<'_>,
    projection: &Projection,
) -> Result<Option<StreamState>, SluiceError> {
    let LogicalPlan::Filter(filter) = projection.input.as_ref() else { return Ok(None) };
    let Some(shape) = shape(filter) else { return Ok(None) };
    let rank = shape.window.input.schema().fields().len();
    let rank_needed = projection.expr.iter().any(|expr| reads_rank(expr, filter, &shape, rank));
    plan_topn(planner, filter, rank_needed)
}
