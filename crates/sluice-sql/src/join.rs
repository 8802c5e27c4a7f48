//! Regular joins: `a JOIN b ON a.k = b.k [AND residual]` (INNER, LEFT, RIGHT, FULL), and
//! `FROM a, b WHERE a.k = b.k …`.
//!
//! Each input is planned as a stream of its own; both are routed by the hash of their
//! join key columns (the same key encoding on both sides, so equal keys meet on one
//! thread), and the join operator (`sluice_operators::join`) keeps both sides' rows by
//! key and emits the change of the join's result for every batch, on either side. The
//! left input is the flow's trunk; the right one becomes a side input
//! ([`sluice_runtime::SideInput`]) entering the join's segment as port 1.
//!
//! Streaming meaning, as Flink's regular join: every row is kept (state grows with the
//! inputs); an INNER join of two append-only streams is append-only, any other join is
//! updating (an outer join emits a NULL-padded row and retracts it when a match comes;
//! retractions on either input retract what they joined). The output has no event time:
//! a join can emit rows older than the watermark, so its time columns are plain
//! timestamps (window functions over a join's output are refused, as in Flink).
//!
//! Refused by name: joins without an equality between a column of each side (a cross
//! join), keys that are expressions rather than columns, keys of different types, SEMI
//! and ANTI joins (`IN`/`EXISTS` subqueries), a join whose right input is itself a join
//! (write the joins left-deep: `(a JOIN b) JOIN c`), and joins of SESSION windows before
//! their aggregate.

use std::sync::Arc;

use datafusion_common::{Column, DFSchemaRef, NullEquality};
use datafusion_expr::logical_plan::{Join, JoinType};
use datafusion_expr::utils::split_conjunction;
use datafusion_expr::{BinaryExpr, Expr, Operator};
use sluice_operators::join::{JoinKind, JoinOperator, JoinSpec, output_is_append_only};
use sluice_runtime::{OperatorFactory, SideInput};
use sluice_types::{Changelog, SluiceError};

use crate::aggregate::exchange_line;
use crate::stream::{StreamPlanner, StreamState, Tag, display, physical, unaggregated_session, unsupported};

/// Plans `join`; `filter` is a WHERE predicate directly above an inner join, whose
/// conjuncts are join conditions too (`FROM a, b WHERE a.k = b.k`).
pub(crate) fn plan_join(
    planner: &StreamPlanner<'_>,
    join: &Join,
    filter: Option<&Expr>,
) -> Result<StreamState, SluiceError> {
    let kind = match join.join_type {
        JoinType::Inner => JoinKind::Inner,
        JoinType::Left => JoinKind::Left,
        JoinType::Right => JoinKind::Right,
        JoinType::Full => JoinKind::Full,
        other => {
            return Err(unsupported(
                &format!("a {other} join (from an IN or EXISTS subquery)"),
                "write it as a join: FROM a JOIN b ON a.k = b.k (with SELECT DISTINCT keys of b if b has duplicates)",
            ));
        }
    };
    if join.null_equality != NullEquality::NullEqualsNothing {
        return Err(unsupported("a join on IS NOT DISTINCT FROM", "join on `=`: NULL keys never match"));
    }
    if filter.is_some() {
        assert_eq!(kind, JoinKind::Inner, "a WHERE is a join condition only above an inner join");
    }
    let left_schema = Arc::clone(join.left.schema());
    let right_schema = Arc::clone(join.right.schema());
    // Every condition: the `ON`/`USING` pairs, the join's filter, the WHERE above it.
    let mut conditions: Vec<Expr> = join.on.iter().map(|(l, r)| l.clone().eq(r.clone())).collect();
    for predicate in join.filter.iter().chain(filter) {
        conditions.extend(split_conjunction(predicate).into_iter().cloned());
    }
    let mut left_keys = Vec::new();
    let mut right_keys = Vec::new();
    let mut key_names = (Vec::new(), Vec::new());
    let mut residual = Vec::new();
    let mut expression_key = None;
    for condition in conditions {
        match equi_key(&condition, &left_schema, &right_schema) {
            Condition::Key(l, r) => {
                let (lf, rf) = (left_schema.field(l), right_schema.field(r));
                if lf.data_type() != rf.data_type() {
                    return Err(unsupported(
                        &format!(
                            "the join key `{}` whose sides have different types ({} and {})",
                            display(&condition),
                            lf.data_type(),
                            rf.data_type()
                        ),
                        "CAST one side to the other's type in a subquery or view, as a column, and join on it",
                    ));
                }
                left_keys.push(l);
                right_keys.push(r);
                key_names.0.push(display(&Expr::Column(Column::from(left_schema.qualified_field(l)))));
                key_names.1.push(display(&Expr::Column(Column::from(right_schema.qualified_field(r)))));
            }
            Condition::ExpressionKey => {
                expression_key.get_or_insert_with(|| display(&condition));
                residual.push(condition);
            }
            Condition::Other => residual.push(condition),
        }
    }
    if let (true, Some(key)) = (left_keys.is_empty(), expression_key) {
        return Err(unsupported(
            &format!("the join key `{key}`, an expression"),
            "compute the key as a column in a subquery or view (SELECT …, CAST(x AS BIGINT) AS k FROM t) and join on it",
        ));
    }
    if left_keys.is_empty() {
        return Err(unsupported(
            "a join without an equality between a column of each input (a cross join)",
            "join on equal keys: FROM a JOIN b ON a.k = b.k",
        ));
    }
    let mut left = unaggregated_session(planner.plan(&join.left)?)?;
    let mut right = unaggregated_session(planner.plan(&join.right)?)?;
    if !right.sides.is_empty() {
        return Err(unsupported(
            "a join whose right input is itself a join",
            "write the joins left-deep: (a JOIN b ON …) JOIN c ON …, or join in a view and read the view on the left",
        ));
    }
    let output_schema: DFSchemaRef = Arc::clone(&join.schema);
    let residual_text = residual.iter().map(display).collect::<Vec<_>>().join(" AND ");
    let residual = match residual.into_iter().reduce(Expr::and) {
        Some(predicate) => Some(physical(&predicate, &output_schema)?),
        None => None,
    };
    planner.hash_exchange(&mut left, left_keys.clone(), exchange_line(planner, &key_names.0));
    planner.hash_exchange(&mut right, right_keys.clone(), exchange_line(planner, &key_names.1));
    let append_only = output_is_append_only(kind, !left.changelog.is_updating(), !right.changelog.is_updating());
    let spec = JoinSpec {
        kind,
        left_schema: left.arrow_schema(),
        right_schema: right.arrow_schema(),
        output_schema: Arc::new(output_schema.as_arrow().clone()),
        left_keys,
        right_keys,
        residual,
        vnodes: planner.vnodes,
        expiry: [None, None],
        late_rows: format!("view {}: late rows", planner.view),
    };
    let pairs: Vec<String> = key_names.0.iter().zip(&key_names.1).map(|(l, r)| format!("{l} = {r}")).collect();
    let mut line = format!("join: {} ON {}", kind_name(kind), pairs.join(" AND "));
    if !residual_text.is_empty() {
        line.push_str(&format!(" AND {residual_text}"));
    }
    let factory: OperatorFactory = Arc::new(move |context| Ok(Box::new(JoinOperator::new(spec.clone(), context)?)));
    let into = left.segments.len();
    left.sides.push(SideInput { source: right.source, table: right.table, segments: right.segments, into, port: 1 });
    left.operators.push((line, factory));
    left.state = Some(format!("rows of both inputs by key ({})", pairs.join(", ")));
    left.tags = vec![Tag::Plain; output_schema.fields().len()];
    left.schema = output_schema;
    left.windows_per_row = left.windows_per_row.max(right.windows_per_row);
    left.changelog = if append_only { Changelog::AppendOnly } else { Changelog::Updating { upsert_key: None } };
    Ok(left)
}

fn kind_name(kind: JoinKind) -> &'static str {
    match kind {
        JoinKind::Inner => "INNER",
        JoinKind::Left => "LEFT",
        JoinKind::Right => "RIGHT",
        JoinKind::Full => "FULL",
    }
}

/// What one condition of a join is.
enum Condition {
    /// `column = column`, one column of each input (their positions).
    Key(usize, usize),
    /// An equality across the inputs on something other than two columns.
    ExpressionKey,
    /// Anything else: a residual predicate.
    Other,
}

fn equi_key(condition: &Expr, left: &DFSchemaRef, right: &DFSchemaRef) -> Condition {
    let Expr::BinaryExpr(BinaryExpr { left: a, op: Operator::Eq, right: b }) = condition else {
        return Condition::Other;
    };
    let side = |expr: &Expr| -> (bool, bool) {
        let columns = expr.column_refs();
        let in_left = !columns.is_empty() && columns.iter().all(|c| left.index_of_column(c).is_ok());
        let in_right = !columns.is_empty() && columns.iter().all(|c| right.index_of_column(c).is_ok());
        (in_left, in_right)
    };
    let ((a_left, a_right), (b_left, b_right)) = (side(a), side(b));
    let (left_expr, right_expr) = if a_left && b_right && !a_right {
        (a, b)
    } else if b_left && a_right && !b_right {
        (b, a)
    } else {
        return Condition::Other;
    };
    match (left_expr.as_ref(), right_expr.as_ref()) {
        (Expr::Column(l), Expr::Column(r)) => match (left.index_of_column(l), right.index_of_column(r)) {
            (Ok(l), Ok(r)) => Condition::Key(l, r),
            _ => Condition::Other,
        },
        _ => Condition::ExpressionKey,
    }
}
