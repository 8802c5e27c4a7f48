//! Planning OVER aggregates, as Flink users write them:
//!
//! ```sql
//! SELECT seller, price,
//!        AVG(price) OVER (PARTITION BY seller ORDER BY dateTime
//!                         ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS recent
//! FROM bid
//! ```
//!
//! DataFusion plans this as a `Window` node whose functions are aggregates (a `WINDOW w
//! AS (…)` clause gives the same node). Accepted: COUNT(*), COUNT, SUM, MIN, MAX and
//! AVG, any number of them sharing one window (PARTITION BY optional, any expressions;
//! ORDER BY exactly one event-time attribute, ascending; the frame `ROWS BETWEEN n
//! PRECEDING AND CURRENT ROW`, `RANGE BETWEEN INTERVAL … PRECEDING AND CURRENT ROW`, or
//! either with `UNBOUNDED PRECEDING`, which is also the frame when none is written).
//! Windows with different PARTITION BY or ORDER BY are separate `Window` nodes, each
//! planned as its own operator over the one below. Everything else is refused by name:
//! other frames (FOLLOWING, GROUPS), ORDER BY anything but one ascending event-time
//! column, aggregates with different frames over one window, DISTINCT or FILTER in an
//! OVER aggregate, other window functions, and an updating input.
//!
//! The window's input columns, then the partition expressions and arguments that are
//! not input columns, are projected; the exchange hashes the partition columns to
//! vnodes (everything to one vnode without PARTITION BY); `sluice_operators::over`
//! emits each row once the watermark passes it, with the aggregates appended: the
//! output is the window's schema, append-only, and keeps the input's event time (its
//! rows come out in watermark order, each above the watermark forwarded before it).

use std::sync::Arc;

use datafusion_common::{DFSchema, ScalarValue};
use datafusion_expr::logical_plan::Window;
use datafusion_expr::{Expr, ExprSchemable, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition};
use sluice_operators::aggregate::{AggregateFunction, AggregateSpec};
use sluice_operators::over::{OVER_ROWS_MAX, OverAggregate, OverFrame, OverSpec};
use sluice_runtime::OperatorFactory;
use sluice_types::SluiceError;

use crate::stream::{StreamPlanner, StreamState, Tag, display, unsupported};

/// The shape every refusal points to.
const FIX: &str = "write COUNT, SUM, MIN, MAX or AVG OVER (PARTITION BY … ORDER BY event_time ROWS BETWEEN 10 \
                   PRECEDING AND CURRENT ROW), or RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW, \
                   over an append-only stream whose ORDER BY column is a source's event_time";

/// Whether `window` computes aggregates (an OVER aggregate) rather than ROW_NUMBER.
pub(crate) fn is_over_aggregate(window: &Window) -> bool {
    window.window_expr.iter().any(|expr| {
        matches!(expr.clone().unalias(), Expr::WindowFunction(function)
            if matches!(function.fun, WindowFunctionDefinition::AggregateUDF(_)))
    })
}

/// An expression as explained: a column by its name.
fn shown(expr: &Expr) -> String {
    match expr.clone().unalias() {
        Expr::Column(column) => column.name,
        other => display(&other),
    }
}

/// The frame of `window`, in milliseconds for RANGE.
fn frame(window: &datafusion_expr::WindowFrame) -> Result<OverFrame, SluiceError> {
    if !matches!(window.end_bound, WindowFrameBound::CurrentRow) {
        return Err(unsupported(&format!("the window frame `{window}` (it must end at CURRENT ROW)"), FIX));
    }
    let preceding = match &window.start_bound {
        WindowFrameBound::CurrentRow => Some(ScalarValue::UInt64(Some(0))),
        WindowFrameBound::Preceding(value) if value.is_null() => None,
        WindowFrameBound::Preceding(value) => Some(value.clone()),
        WindowFrameBound::Following(_) => {
            return Err(unsupported(&format!("the window frame `{window}` (FOLLOWING rows)"), FIX));
        }
    };
    match window.units {
        WindowFrameUnits::Rows => {
            let Some(value) = preceding else { return Ok(OverFrame::Rows(None)) };
            let rows = match value.cast_to(&arrow::datatypes::DataType::UInt64) {
                Ok(ScalarValue::UInt64(Some(rows))) => rows,
                _ => return Err(unsupported(&format!("ROWS BETWEEN {value} PRECEDING"), FIX)),
            };
            if rows > OVER_ROWS_MAX as u64 {
                return Err(SluiceError::user(
                    "sql.over_rows",
                    format!(
                        "ROWS BETWEEN {rows} PRECEDING keeps {rows} rows per partition; the limit is {OVER_ROWS_MAX}"
                    ),
                )
                .with_fix(format!("use at most {OVER_ROWS_MAX} PRECEDING, or a RANGE frame")));
            }
            Ok(OverFrame::Rows(Some(rows as usize)))
        }
        WindowFrameUnits::Range => {
            let Some(value) = preceding else { return Ok(OverFrame::Range(None)) };
            let millis = match &value {
                ScalarValue::UInt64(Some(0)) => Some(0),
                ScalarValue::IntervalMonthDayNano(Some(interval))
                    if interval.months == 0 && interval.nanoseconds % 1_000_000 == 0 =>
                {
                    i64::from(interval.days)
                        .checked_mul(86_400_000)
                        .and_then(|d| d.checked_add(interval.nanoseconds / 1_000_000))
                }
                ScalarValue::IntervalDayTime(Some(interval)) => i64::from(interval.days)
                    .checked_mul(86_400_000)
                    .and_then(|d| d.checked_add(i64::from(interval.milliseconds))),
                _ => None,
            };
            match millis {
                Some(millis) if millis >= 0 => Ok(OverFrame::Range(Some(millis))),
                _ => Err(unsupported(
                    &format!(
                        "RANGE BETWEEN {value} PRECEDING (an interval of days, hours, minutes, seconds or milliseconds)"
                    ),
                    FIX,
                )),
            }
        }
        WindowFrameUnits::Groups => Err(unsupported("GROUPS window frames", FIX)),
    }
}

/// The frame as `explain` shows it.
fn frame_text(frame: OverFrame) -> String {
    match frame {
        OverFrame::Rows(None) => "ROWS UNBOUNDED PRECEDING".to_string(),
        OverFrame::Rows(Some(rows)) => format!("ROWS {rows} PRECEDING"),
        OverFrame::Range(None) => "RANGE UNBOUNDED PRECEDING".to_string(),
        OverFrame::Range(Some(millis)) => format!("RANGE {millis} ms PRECEDING"),
    }
}

/// The OVER aggregate of `window` on a stream of its input.
pub(crate) fn plan_over(planner: &StreamPlanner<'_>, window: &Window) -> Result<StreamState, SluiceError> {
    let mut functions = Vec::new();
    for expr in &window.window_expr {
        let Expr::WindowFunction(function) = expr.clone().unalias() else {
            return Err(SluiceError::internal("sql.over", format!("window expression {expr} is not a function call")));
        };
        let name = function.fun.name().to_uppercase();
        if !matches!(function.fun, WindowFunctionDefinition::AggregateUDF(_)) {
            return Err(unsupported(&format!("the window function {name} beside OVER aggregates"), FIX));
        }
        if function.params.distinct {
            return Err(unsupported(&format!("{name}(DISTINCT …) OVER (…)"), FIX));
        }
        if function.params.filter.is_some() {
            return Err(unsupported(&format!("FILTER (WHERE …) in {name}(…) OVER (…)"), FIX));
        }
        functions.push(*function);
    }
    let first = &functions[0].params;
    let same_window = functions.iter().all(|f| {
        f.params.partition_by == first.partition_by
            && f.params.order_by == first.order_by
            && f.params.window_frame == first.window_frame
    });
    if !same_window {
        return Err(unsupported(
            "OVER aggregates over different frames in one SELECT",
            "give every OVER aggregate of a SELECT the same frame, or compute each frame in its own view",
        ));
    }
    let order = match first.order_by.as_slice() {
        [] => return Err(unsupported("an OVER aggregate without ORDER BY", FIX)),
        [sort] => sort,
        _ => return Err(unsupported("an OVER aggregate ordered by several columns", FIX)),
    };
    if !order.asc {
        return Err(unsupported(&format!("an OVER aggregate ORDER BY {} DESC", shown(&order.expr)), FIX));
    }
    let frame = frame(&first.window_frame)?;

    let mut state = planner.plan(&window.input).and_then(crate::stream::unaggregated_session)?;
    if state.changelog.is_updating() {
        let fix = "compute it with a GROUP BY of the partition (an updating result), or over an append-only source";
        if let Some(error) = crate::changelog::changelog_input("an OVER aggregate", &state, fix) {
            return Err(error);
        }
        return Err(unsupported(
            "an OVER aggregate over an updating stream",
            "compute OVER aggregates on the source's rows, before they are aggregated",
        ));
    }
    let input = Arc::clone(window.input.schema());
    let width = input.fields().len();
    let time = match order.expr.clone().unalias() {
        Expr::Column(column) => input.index_of_column(&column).ok(),
        _ => None,
    };
    let Some(time) = time.filter(|&index| state.tags[index] == Tag::EventTime) else {
        return Err(unsupported(
            &format!("an OVER aggregate ORDER BY `{}`, which is not an event-time attribute", display(&order.expr)),
            &format!("{FIX}; declare `event_time` on the source"),
        ));
    };

    // Input columns, then the partition expressions and arguments that are not columns.
    let mut extra: Vec<Expr> = Vec::new();
    let mut column_of = |expr: &Expr| -> usize {
        if let Expr::Column(column) = expr.clone().unalias()
            && let Ok(index) = input.index_of_column(&column)
        {
            return index;
        }
        extra.push(expr.clone());
        width + extra.len() - 1
    };
    let partition: Vec<usize> = first.partition_by.iter().map(&mut column_of).collect();
    let mut aggregates = Vec::new();
    let mut names = Vec::new();
    for function in &functions {
        let (kind, argument) = crate::aggregate::function_of(function.fun.name(), &function.params.args, false)?;
        names.push(match (&kind, &argument) {
            (AggregateFunction::CountRows, _) | (_, None) => "COUNT(*)".to_string(),
            (_, Some(argument)) => format!("{}({})", function.fun.name().to_uppercase(), shown(argument)),
        });
        let argument = argument.as_ref().map(&mut column_of);
        aggregates.push(AggregateSpec { function: kind, argument, filter: None });
    }
    let input_schema = if extra.is_empty() {
        Arc::new(input.as_arrow().clone())
    } else {
        let mut exprs: Vec<Expr> = input.columns().into_iter().map(Expr::Column).collect();
        let count = exprs.len();
        exprs.extend(extra.into_iter().enumerate().map(|(i, e)| e.alias(format!("__c{}", count + i))));
        let fields = exprs
            .iter()
            .map(|e| e.to_field(&state.schema).map_err(|e| crate::df_error("sql.over", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let schema = Arc::new(
            DFSchema::new_with_metadata(fields, Default::default()).map_err(|e| crate::df_error("sql.over", e))?,
        );
        planner.push_projection(&mut state, &exprs, Arc::clone(&schema), "partition keys and OVER arguments")?;
        Arc::new(schema.as_arrow().clone())
    };

    let partition_names: Vec<String> = first.partition_by.iter().map(shown).collect();
    let description = if partition.is_empty() {
        "all rows → one vnode (no PARTITION BY)".to_string()
    } else {
        format!("hash({}) → {} vnodes", partition_names.join(", "), planner.vnodes)
    };
    planner.hash_exchange(&mut state, partition.clone(), description);
    let line = format!(
        "over_aggregate: [{}]{} ORDER BY {} {}",
        names.join(", "),
        if partition.is_empty() { String::new() } else { format!(" PARTITION BY {}", partition_names.join(", ")) },
        shown(&order.expr),
        frame_text(frame)
    );
    let spec = OverSpec {
        time,
        partition,
        passthrough: width,
        aggregates,
        frame,
        output: Arc::new(window.schema.as_arrow().clone()),
        batch_size: planner.batch_size,
    };
    let counter = format!("view {}: late rows", planner.view);
    let spill = planner.spill.clone();
    let factory: OperatorFactory = Arc::new(move |context| {
        let late = context.metrics.counter(&counter);
        let over = OverAggregate::new(spec.clone(), &input_schema, late, context.vnodes)?;
        Ok(Box::new(match &spill {
            Some(space) => over.with_spill(Arc::clone(space), sluice_operators::spill::spilled_bytes(&context.metrics)),
            None => over,
        }))
    });
    state.operators.push((line, factory));
    let kept = match frame {
        OverFrame::Rows(Some(rows)) => format!("the last {rows} rows' arguments"),
        OverFrame::Range(Some(millis)) => format!("the arguments of rows within {millis} ms"),
        OverFrame::Rows(None) | OverFrame::Range(None) => "running accumulators".to_string(),
    };
    state.state = Some(format!(
        "rows waiting for the watermark and {kept}, per partition ({})",
        if partition_names.is_empty() { "one, no key".to_string() } else { partition_names.join(", ") }
    ));
    state.schema = Arc::clone(&window.schema);
    state.tags = state.tags.iter().copied().take(width).chain(functions.iter().map(|_| Tag::Plain)).collect();
    Ok(state)
}
