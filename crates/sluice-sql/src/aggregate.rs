//! Planning `GROUP BY` into an exchange followed by an aggregate operator.
//!
//! - `GROUP BY window_start, window_end, keys…` (both bounds of one window table
//!   function): the event-time window aggregate, append-only, over an append-only input.
//! - `GROUP BY window_start, window_end, keys…` of a SESSION window table function: the
//!   session aggregate, which merges each row's proto-window into its key's sessions. The
//!   keys are the session's partition: with `PARTITION BY`, they must be exactly its
//!   columns; without, sessions are per group key (as Flink's group-window `SESSION`).
//! - Any other `GROUP BY keys…` (or none): the updating group aggregate, over any input;
//!   its output is updating with the keys as upsert key.
//!
//! The rows are first projected to `[group columns…, arguments…]`, where the arguments
//! are each aggregate's argument and `FILTER (WHERE …)` condition (equal ones projected
//! once), so keys, arguments and conditions may be any expression; the exchange hashes
//! the keys to vnodes; the aggregate then works on column positions.

use std::sync::Arc;

use datafusion_common::{DFSchema, DFSchemaRef};
use datafusion_expr::expr::AggregateFunction as DfAggregate;
use datafusion_expr::logical_plan::Aggregate;
use datafusion_expr::{Expr, ExprSchemable};
use sluice_operators::aggregate::local::{self, LocalWindowAggregate};
use sluice_operators::aggregate::{
    AggregateFunction, AggregateSpec, GroupAggregate, GroupAggregateSpec, GroupColumn, SessionAggregate,
    WindowAggregate, WindowAggregateSpec,
};
use sluice_operators::counter::LazyCounter;
use sluice_operators::ttl::{Clock, Ttl};
use sluice_runtime::OperatorFactory;
use sluice_types::{Changelog, SluiceError};

use crate::stream::{StreamPlanner, StreamState, Tag, WindowBound, column_tag, display, unsupported};

pub(crate) fn plan_aggregate(planner: &StreamPlanner<'_>, aggregate: &Aggregate) -> Result<StreamState, SluiceError> {
    let state = planner.plan(&aggregate.input)?;
    let mut bounds: [Option<Expr>; 2] = [None, None];
    let mut keys = Vec::new();
    let mut groups = Vec::new();
    for expr in &aggregate.group_expr {
        if matches!(expr, Expr::GroupingSet(_)) {
            return Err(unsupported("GROUPING SETS, ROLLUP and CUBE", "group by one list of columns"));
        }
        match column_tag(expr, &state) {
            Tag::WindowStart | Tag::SessionStart if bounds[0].is_none() => {
                bounds[0] = Some(expr.clone());
                groups.push(GroupColumn::WindowStart);
            }
            Tag::WindowEnd | Tag::SessionEnd if bounds[1].is_none() => {
                bounds[1] = Some(expr.clone());
                groups.push(GroupColumn::WindowEnd);
            }
            _ => {
                groups.push(GroupColumn::Key(keys.len()));
                keys.push(expr.clone());
            }
        }
    }
    if let Some(partition) = state.session.clone() {
        check_session_grouping(aggregate, &state, &bounds, &keys, &partition)?;
        let [Some(start), Some(end)] = bounds else { unreachable!("checked above") };
        return plan_window_aggregate(planner, aggregate, state, [start, end], keys, groups);
    }
    match bounds {
        [Some(start), Some(end)] => plan_window_aggregate(planner, aggregate, state, [start, end], keys, groups),
        // Without both bounds a window column is an ordinary key (as in Flink).
        _ => plan_group_aggregate(planner, aggregate, state),
    }
}

/// A SESSION window is grouped by both of its bounds, and by exactly its `PARTITION BY`
/// columns when it has them (sessions are per partition, so another key would split or
/// merge them otherwise than Flink does).
fn check_session_grouping(
    aggregate: &Aggregate,
    state: &StreamState,
    bounds: &[Option<Expr>; 2],
    keys: &[Expr],
    partition: &[String],
) -> Result<(), SluiceError> {
    let session_bound = |bound: &Option<Expr>| {
        bound.as_ref().is_some_and(|expr| matches!(column_tag(expr, state), Tag::SessionStart | Tag::SessionEnd))
    };
    if !bounds.iter().all(session_bound) {
        return Err(unsupported(
            "a SESSION window grouped without both its window_start and window_end",
            "GROUP BY window_start, window_end and the session's keys",
        ));
    }
    for expr in keys.iter().chain(aggregate.aggr_expr.iter()) {
        crate::stream::refuse_session_bounds(expr, state)?;
    }
    if partition.is_empty() {
        return Ok(());
    }
    let mut names: Vec<String> = keys
        .iter()
        .map(|key| match key.clone().unalias() {
            Expr::Column(column) => column.name,
            other => display(&other),
        })
        .collect();
    let mut expected = partition.to_vec();
    names.sort();
    expected.sort();
    if names != expected {
        return Err(unsupported(
            &format!(
                "a SESSION window PARTITION BY {} grouped by the keys [{}]",
                partition.join(", "),
                names.join(", ")
            ),
            &format!("GROUP BY window_start, window_end, {} (exactly the PARTITION BY columns)", partition.join(", ")),
        ));
    }
    Ok(())
}

/// The aggregates' specs and the expressions of their arguments and conditions, which
/// are projected after the `first_column` group columns. Equal expressions (unless
/// volatile) are projected once: NEXMark q15 counts the distinct bidders under four
/// filters that other aggregates repeat, and COUNT(DISTINCT)s of one column share their
/// values in the operator.
fn aggregate_specs(aggregate: &Aggregate, first_column: usize) -> Result<(Vec<AggregateSpec>, Vec<Expr>), SluiceError> {
    let mut specs = Vec::new();
    let mut arguments = Vec::new();
    let column_of = |expr: Expr, arguments: &mut Vec<Expr>| {
        let same = (!expr.is_volatile()).then(|| arguments.iter().position(|a| *a == expr)).flatten();
        first_column
            + same.unwrap_or_else(|| {
                arguments.push(expr);
                arguments.len() - 1
            })
    };
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(function) = expr.clone().unalias() else {
            return Err(SluiceError::internal(
                "sql.aggregate",
                format!("aggregate expression {expr} is not a function call"),
            ));
        };
        let (kind, argument) = aggregate_spec(&function)?;
        let argument = argument.map(|argument| column_of(argument, &mut arguments));
        let filter = function.params.filter.as_deref().cloned().map(|condition| column_of(condition, &mut arguments));
        specs.push(AggregateSpec { function: kind, argument, filter });
    }
    Ok((specs, arguments))
}

/// Projects `exprs` (named `__c0`, `__c1`, …) onto the stream: the aggregate's input.
/// `explain` shows `what` and the expressions.
fn project_inputs(
    planner: &StreamPlanner<'_>,
    state: &mut StreamState,
    exprs: Vec<Expr>,
    what: &str,
) -> Result<DFSchemaRef, SluiceError> {
    let shown: Vec<String> = exprs.iter().map(display).collect();
    let line = format!("{what}: {}", shown.join(", "));
    let exprs: Vec<Expr> = exprs.into_iter().enumerate().map(|(i, e)| e.alias(format!("__c{i}"))).collect();
    let fields = exprs
        .iter()
        .map(|e| e.to_field(&state.schema).map_err(|e| crate::df_error("sql.aggregate", e)))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = Arc::new(
        DFSchema::new_with_metadata(fields, Default::default()).map_err(|e| crate::df_error("sql.aggregate", e))?,
    );
    planner.push_projection(state, &exprs, Arc::clone(&schema), &line)?;
    Ok(schema)
}

/// The exchange's line in `explain`.
pub(crate) fn exchange_line(planner: &StreamPlanner<'_>, key_names: &[String]) -> String {
    if key_names.is_empty() {
        "all rows → one vnode (no key)".to_string()
    } else {
        format!("hash({}) → {} vnodes", key_names.join(", "), planner.vnodes)
    }
}

fn plan_window_aggregate(
    planner: &StreamPlanner<'_>,
    aggregate: &Aggregate,
    mut state: StreamState,
    [start, end]: [Expr; 2],
    keys: Vec<Expr>,
    groups: Vec<GroupColumn>,
) -> Result<StreamState, SluiceError> {
    if state.changelog.is_updating() {
        if let Some(error) =
            crate::changelog::changelog_input("a window aggregate", &state, crate::changelog::CHANGELOG_WINDOW_FIX)
        {
            return Err(error);
        }
        return Err(unsupported(
            "a window aggregate over an updating stream",
            "aggregate the source's rows in windows; a window is emitted once and cannot take back rows",
        ));
    }
    let (aggregates, arguments) = aggregate_specs(aggregate, 2 + keys.len())?;
    let mut pre_exprs = vec![start, end];
    pre_exprs.extend(keys.iter().cloned());
    pre_exprs.extend(arguments);
    let pre_schema = project_inputs(planner, &mut state, pre_exprs, "window, keys and aggregate arguments")?;
    let key_names: Vec<String> = keys.iter().map(display).collect();
    let key_columns: Vec<usize> = (2..2 + keys.len()).collect();
    let input_schema = Arc::new(pre_schema.as_arrow().clone());
    let spec = WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: key_columns.clone(),
        groups: groups.clone(),
        aggregates,
        output: Arc::new(aggregate.schema.as_arrow().clone()),
        batch_size: planner.batch_size,
        late_weights: None,
    };
    let names: Vec<String> = aggregate.aggr_expr.iter().map(display).collect();
    let by_keys = if keys.is_empty() { String::new() } else { format!(", {}", key_names.join(", ")) };
    let session = state.session.take().is_some();
    // Two phases where the partials merge exactly: each batch folded per window and key
    // before the exchange (see `sluice_operators::aggregate::local`).
    let split = !session && planner.local_aggregation && local::can_split(&spec.aggregates);
    let (spec, input_schema) = if split {
        // A HOP assignment whose bounds only this grouping reads (they lead the
        // aggregate's input) gives each row once, to its slice; the local aggregate gives
        // each slice's partials to the slice's windows.
        let sliced = match state.sliceable() {
            Some(slicing)
                if slicing.bounds == [(0, WindowBound::Start), (1, WindowBound::End)]
                    && local::can_slice(&spec, &input_schema) =>
            {
                let slicing = state.slicing.take().expect("sliceable");
                state.operators[slicing.assign] = slicing.sliced;
                Some((slicing.hop, slicing.outside_range))
            }
            _ => None,
        };
        let (local_spec, local_input) = (spec.clone(), Arc::clone(&input_schema));
        let mut shape = String::new();
        if let Some((hop, _)) = &sliced {
            let slice = hop.slice_ms().expect("a HOP window");
            shape = format!(", each {slice} ms slice to its windows");
        }
        let factory: OperatorFactory = Arc::new(move |context| {
            let local = LocalWindowAggregate::new(local_spec.clone(), &local_input)?;
            Ok(Box::new(match &sliced {
                Some((hop, outside)) => {
                    local.sliced(*hop, LazyCounter::new(Arc::clone(&context.metrics), outside.clone()))
                }
                None => local,
            }))
        });
        let line = format!("local_window_aggregate: [{}] by window{by_keys}, per batch{shape}", names.join(", "));
        state.operators.push((line, factory));
        (local::merging_spec(&spec), local::partial_schema(&spec, &input_schema))
    } else {
        (spec, input_schema)
    };
    planner.hash_exchange(&mut state, key_columns, exchange_line(planner, &key_names));
    let counter = format!("view {}: late rows", planner.view);
    let (operator, unit) = if session { ("session_aggregate", "session") } else { ("window_aggregate", "window") };
    let merging = if split { " (merging the partials)" } else { "" };
    let line = format!("{operator}: [{}] by {unit}{by_keys}{merging}", names.join(", "));
    let spill = planner.spill.clone();
    let factory: OperatorFactory = Arc::new(move |context| {
        let late = context.metrics.counter(&counter);
        let (spec, vnodes) = (spec.clone(), context.vnodes);
        let written = || sluice_operators::spill::spilled_bytes(&context.metrics);
        if session {
            let aggregate = SessionAggregate::new(spec, &input_schema, late, vnodes)?;
            Ok(Box::new(match &spill {
                Some(space) => aggregate.with_spill(Arc::clone(space), written()),
                None => aggregate,
            }))
        } else {
            let aggregate = WindowAggregate::new(spec, &input_schema, late, vnodes)?;
            Ok(Box::new(match &spill {
                Some(space) => aggregate.with_spill(Arc::clone(space), written()),
                None => aggregate,
            }))
        }
    });
    state.operators.push((line, factory));
    state.state = Some(format!(
        "open {unit}s × keys ({})",
        if keys.is_empty() { "no key".to_string() } else { key_names.join(", ") }
    ));
    state.schema = Arc::clone(&aggregate.schema);
    state.tags = groups
        .iter()
        .map(|g| match g {
            GroupColumn::WindowStart => Tag::WindowStart,
            GroupColumn::WindowEnd => Tag::WindowEnd,
            GroupColumn::Key(_) => Tag::Plain,
        })
        .chain(aggregate.aggr_expr.iter().map(|_| Tag::Plain))
        .collect();
    Ok(state)
}

fn plan_group_aggregate(
    planner: &StreamPlanner<'_>,
    aggregate: &Aggregate,
    mut state: StreamState,
) -> Result<StreamState, SluiceError> {
    let keys = &aggregate.group_expr;
    let (aggregates, arguments) = aggregate_specs(aggregate, keys.len())?;
    let mut pre_exprs = keys.clone();
    pre_exprs.extend(arguments);
    let pre_schema = project_inputs(planner, &mut state, pre_exprs, "keys and aggregate arguments")?;
    let key_names: Vec<String> = keys.iter().map(display).collect();
    let key_columns: Vec<usize> = (0..keys.len()).collect();
    planner.hash_exchange(&mut state, key_columns.clone(), exchange_line(planner, &key_names));
    let input_schema = Arc::new(pre_schema.as_arrow().clone());
    let spec = GroupAggregateSpec {
        keys: key_columns.clone(),
        aggregates,
        output: Arc::new(aggregate.schema.as_arrow().clone()),
        append_only_input: !state.changelog.is_updating(),
    };
    let counter = format!("view {}: ignored retractions", planner.view);
    let names: Vec<String> = aggregate.aggr_expr.iter().map(display).collect();
    let ttl = planner.state_ttl();
    let mini_batch_rows = planner.mini_batch_rows;
    // Groups beyond the memory budget go to disk; not with a TTL (an evicted group
    // would outlive it): those stay in memory until they expire.
    let spill = planner.spill.clone().filter(|_| ttl.is_none());
    let line = format!(
        "group_aggregate (updating): [{}]{}{}{}{}",
        names.join(", "),
        if keys.is_empty() { String::new() } else { format!(" by {}", key_names.join(", ")) },
        crate::stream::ttl_note(ttl),
        if mini_batch_rows > 1 {
            format!(", changes in mini-batches of up to {mini_batch_rows} input rows")
        } else {
            String::new()
        },
        if spill.is_some() { " (groups spill to disk beyond state_memory_mib)" } else { "" }
    );

    let factory: OperatorFactory = Arc::new(move |context| {
        let ignored = LazyCounter::new(Arc::clone(&context.metrics), counter.clone());
        let aggregate =
            GroupAggregate::new(spec.clone(), &input_schema, ignored, context.vnodes)?.with_mini_batch(mini_batch_rows);
        Ok(Box::new(match (ttl, &spill) {
            (Some(ttl), _) => aggregate.with_ttl(Ttl::new(ttl, Clock::system())),
            (None, Some(space)) => {
                aggregate.with_spill(Arc::clone(space), sluice_operators::spill::spilled_bytes(&context.metrics))
            }
            (None, None) => aggregate,
        }))
    });
    state.operators.push((line, factory));
    state.state = Some(format!(
        "groups ({}), with each MIN/MAX's values and COUNT(DISTINCT)'s",
        if keys.is_empty() { "one, no key".to_string() } else { key_names.join(", ") }
    ));
    state.schema = Arc::clone(&aggregate.schema);
    state.tags = vec![Tag::Plain; aggregate.schema.fields().len()];
    state.changelog = Changelog::Updating { upsert_key: Some(key_columns) };
    Ok(state)
}

/// Maps a DataFusion aggregate call to ours, with the argument expression to project.
fn aggregate_spec(call: &DfAggregate) -> Result<(AggregateFunction, Option<Expr>), SluiceError> {
    let params = &call.params;
    if !params.order_by.is_empty() {
        return Err(unsupported("ORDER BY inside an aggregate", "remove the ORDER BY"));
    }
    function_of(call.func.name(), &params.args, params.distinct)
}

/// The aggregate function `name` over `args` (DISTINCT or not), with the argument
/// expression to project; shared with OVER aggregates.
pub(crate) fn function_of(
    name: &str,
    args: &[Expr],
    distinct: bool,
) -> Result<(AggregateFunction, Option<Expr>), SluiceError> {
    let name = name.to_ascii_lowercase();
    let argument = match args {
        [] => None,
        [argument] => Some(argument.clone()),
        _ => return Err(unsupported(&format!("{name} with several arguments"), "use one argument")),
    };
    // `COUNT(*)` reaches OVER aggregates as a wildcard argument.
    #[allow(deprecated)]
    let is_literal = matches!(&argument, Some(Expr::Literal(value, _)) if !value.is_null())
        || matches!(&argument, Some(Expr::Wildcard { .. }));
    let function = match (name.as_str(), distinct) {
        ("count", false) if argument.is_none() || is_literal => return Ok((AggregateFunction::CountRows, None)),
        ("count", false) => AggregateFunction::Count,
        ("count", true) => AggregateFunction::CountDistinct,
        ("sum", false) => AggregateFunction::Sum,
        ("min", _) => AggregateFunction::Min,
        ("max", _) => AggregateFunction::Max,
        ("avg" | "mean", false) => AggregateFunction::Avg,
        (_, true) => {
            return Err(unsupported(
                &format!("{}(DISTINCT …)", name.to_uppercase()),
                "use COUNT(DISTINCT …), or drop DISTINCT",
            ));
        }
        _ => {
            return Err(unsupported(
                &format!("the aggregate function {}", name.to_uppercase()),
                "use COUNT, COUNT(DISTINCT), SUM, MIN, MAX or AVG",
            ));
        }
    };
    Ok((function, argument))
}
