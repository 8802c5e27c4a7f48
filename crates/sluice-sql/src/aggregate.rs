//! Planning `GROUP BY window_start, window_end, keys…` into exchange + window aggregate.
//!
//! The rows are first projected to `[window_start, window_end, keys…, arguments…]`, so
//! keys and arguments may be any expression; the exchange hashes the keys to vnodes; the
//! window aggregate then works on column positions. A `GROUP BY` without both window
//! bounds would be an updating (retracting) aggregate, which is refused for now.

use std::sync::Arc;

use datafusion_common::DFSchema;
use datafusion_expr::expr::AggregateFunction as DfAggregate;
use datafusion_expr::logical_plan::Aggregate;
use datafusion_expr::{Expr, ExprSchemable};
use sluice_operators::aggregate::{
    AggregateFunction, AggregateSpec, GroupColumn, WindowAggregate, WindowAggregateSpec,
};
use sluice_runtime::OperatorFactory;
use sluice_types::SluiceError;

use crate::stream::{StreamPlanner, StreamState, Tag, column_tag, display, unsupported};

pub(crate) fn plan_aggregate(planner: &StreamPlanner<'_>, aggregate: &Aggregate) -> Result<StreamState, SluiceError> {
    let mut state = planner.plan(&aggregate.input)?;
    let mut bounds: [Option<Expr>; 2] = [None, None];
    let mut keys = Vec::new();
    let mut groups = Vec::new();
    for expr in &aggregate.group_expr {
        if matches!(expr, Expr::GroupingSet(_)) {
            return Err(unsupported("GROUPING SETS, ROLLUP and CUBE", "group by one list of columns"));
        }
        match column_tag(expr, &state) {
            Tag::WindowStart if bounds[0].is_none() => {
                bounds[0] = Some(expr.clone());
                groups.push(GroupColumn::WindowStart);
            }
            Tag::WindowEnd if bounds[1].is_none() => {
                bounds[1] = Some(expr.clone());
                groups.push(GroupColumn::WindowEnd);
            }
            _ => {
                groups.push(GroupColumn::Key(keys.len()));
                keys.push(expr.clone());
            }
        }
    }
    let [Some(start), Some(end)] = bounds else {
        return Err(unsupported(
            "GROUP BY without window_start and window_end (a non-windowed, updating aggregate)",
            "aggregate over a window table function: FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) \
             … GROUP BY window_start, window_end, …",
        ));
    };
    let mut aggregates = Vec::new();
    let mut arguments = Vec::new();
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(function) = expr.clone().unalias() else {
            return Err(SluiceError::internal(
                "sql.aggregate",
                format!("aggregate expression {expr} is not a function call"),
            ));
        };
        let (function, argument) = aggregate_spec(&function)?;
        let argument = argument.map(|argument| {
            arguments.push(argument);
            2 + keys.len() + arguments.len() - 1
        });
        aggregates.push(AggregateSpec { function, argument, filter: None });
    }
    let mut pre_exprs = vec![start, end];
    pre_exprs.extend(keys.iter().cloned());
    pre_exprs.extend(arguments);
    let pre_exprs: Vec<Expr> = pre_exprs.into_iter().enumerate().map(|(i, e)| e.alias(format!("__c{i}"))).collect();
    let pre_fields = pre_exprs
        .iter()
        .map(|e| e.to_field(&state.schema).map_err(|e| crate::df_error("sql.aggregate", e)))
        .collect::<Result<Vec<_>, _>>()?;
    let pre_schema = Arc::new(
        DFSchema::new_with_metadata(pre_fields, Default::default()).map_err(|e| crate::df_error("sql.aggregate", e))?,
    );
    let key_names: Vec<String> = keys.iter().map(display).collect();
    planner.push_projection(&mut state, &pre_exprs, Arc::clone(&pre_schema), "window, keys and aggregate arguments")?;
    let key_columns: Vec<usize> = (2..2 + keys.len()).collect();
    let description = if keys.is_empty() {
        "all rows → one vnode (no key)".to_string()
    } else {
        format!("hash({}) → {} vnodes", key_names.join(", "), planner.vnodes)
    };
    planner.hash_exchange(&mut state, key_columns.clone(), description);
    let input_schema = Arc::new(pre_schema.as_arrow().clone());
    let spec = WindowAggregateSpec {
        window_start: 0,
        window_end: 1,
        keys: key_columns,
        groups: groups.clone(),
        aggregates,
        output: Arc::new(aggregate.schema.as_arrow().clone()),
        batch_size: planner.batch_size,
    };
    let counter = format!("view {}: late rows", planner.view);
    let names: Vec<String> = aggregate.aggr_expr.iter().map(display).collect();
    let line = format!(
        "window_aggregate: [{}] by window{}",
        names.join(", "),
        if keys.is_empty() { String::new() } else { format!(", {}", key_names.join(", ")) }
    );
    let factory: OperatorFactory = Arc::new(move |context| {
        let late = context.metrics.counter(&counter);
        Ok(Box::new(WindowAggregate::new(spec.clone(), &input_schema, late, context.vnodes)?))
    });
    state.operators.push((line, factory));
    state.state = Some(format!(
        "open windows × keys ({})",
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

/// Maps a DataFusion aggregate call to ours, with the argument expression to project.
fn aggregate_spec(call: &DfAggregate) -> Result<(AggregateFunction, Option<Expr>), SluiceError> {
    let params = &call.params;
    let name = call.func.name().to_ascii_lowercase();
    if params.filter.is_some() {
        return Err(unsupported("FILTER (WHERE …) on an aggregate", "filter the rows in a WHERE clause of a view"));
    }
    if !params.order_by.is_empty() {
        return Err(unsupported("ORDER BY inside an aggregate", "remove the ORDER BY"));
    }
    let argument = match params.args.as_slice() {
        [] => None,
        [argument] => Some(argument.clone()),
        _ => return Err(unsupported(&format!("{name} with several arguments"), "use one argument")),
    };
    let is_literal = matches!(&argument, Some(Expr::Literal(value, _)) if !value.is_null());
    let function = match (name.as_str(), params.distinct) {
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
