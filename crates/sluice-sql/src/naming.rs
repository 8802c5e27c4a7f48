//! Unique output column names, as Flink gives them.
//!
//! A query may yield two columns of one name (NEXMark q20: `B.dateTime` and
//! `A.dateTime`). DataFusion keeps both, told apart by their tables' qualifiers, but a
//! name that leaves Sluice (a JSON object's key, a CSV header, a Kafka record's field,
//! a PostgreSQL column, a `/query` answer, a materialized table's schema, `explain`)
//! has no qualifier, and a JSON reader keeps only one of two equal keys. Flink's planner
//! (Calcite's `SqlValidatorUtil.uniquify`) renames, left to right, every name already
//! used by appending the first number from 0 up that makes it unused (`dateTime`,
//! `dateTime0`; `a`, `a`, `a0` becomes `a`, `a0`, `a00`), comparing names exactly
//! (case-sensitive, as Flink's identifiers). [`unique_names`] does the same with one
//! projection at the root of a query's plan: the duplicated columns aliased, or a
//! projection of every column put on top.
//!
//! Bounds: one pass over the columns; at most one attempt per column already used.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion_expr::logical_plan::Projection;
use datafusion_expr::{Expr, LogicalPlan};
use sluice_types::SluiceError;

/// `names`, each name already used renamed as Calcite does.
pub fn uniquify<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut used: HashSet<String> = HashSet::new();
    let mut unique = Vec::new();
    for name in names {
        let mut candidate = name.to_string();
        let mut attempt = 0u64;
        while used.contains(&candidate) {
            candidate = format!("{name}{attempt}");
            attempt += 1;
        }
        used.insert(candidate.clone());
        unique.push(candidate);
    }
    unique
}

/// `plan` whose output columns have unique names ([`uniquify`]); unchanged when they do
/// already.
pub fn unique_names(plan: LogicalPlan) -> Result<LogicalPlan, SluiceError> {
    let names: Vec<String> = plan.schema().fields().iter().map(|field| field.name().clone()).collect();
    let unique = uniquify(names.iter().map(String::as_str));
    if unique == names {
        return Ok(plan);
    }
    let renamed = |expr: Expr, (name, new): (&String, &String)| {
        if name == new {
            expr
        } else {
            match expr {
                Expr::Alias(alias) => alias.expr.alias(new),
                expr => expr.alias(new),
            }
        }
    };
    let (exprs, input) = match plan {
        LogicalPlan::Projection(projection) => (projection.expr, projection.input),
        other => {
            let columns = other.schema().columns().into_iter().map(Expr::Column).collect();
            (columns, Arc::new(other))
        }
    };
    let exprs = exprs.into_iter().zip(names.iter().zip(&unique)).map(|(expr, names)| renamed(expr, names)).collect();
    Projection::try_new(exprs, input).map(LogicalPlan::Projection).map_err(|e| crate::df_error("sql.column_names", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `names` become `expected`.
    fn check(names: &[&str], expected: &[&str]) {
        assert_eq!(uniquify(names.iter().copied()), expected, "{names:?}");
    }

    #[test]
    fn each_name_already_used_gets_the_first_free_number_as_calcite_gives_it() {
        check(
            &["auction", "dateTime", "extra", "dateTime", "extra"],
            &["auction", "dateTime", "extra", "dateTime0", "extra0"],
        );
        check(&["a", "a", "a"], &["a", "a0", "a1"]);
        check(&["a", "a", "a0"], &["a", "a0", "a00"]);
        check(&["a0", "a", "a"], &["a0", "a", "a1"]);
        check(&["A", "a"], &["A", "a"]);
        check(&["x", "y"], &["x", "y"]);
    }
}
