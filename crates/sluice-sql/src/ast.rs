//! Checks on the parsed query, before DataFusion sees it.
//!
//! DataFusion plans expressions by recursion, with large stack frames; an expression
//! nested thousands of levels deep (`a + a + … + a`, deeply nested parentheses or
//! function calls) overflows any stack, and the process aborts. So a view is parsed and
//! checked here first:
//!
//! - **Nesting depth.** The parser's own recursion is bounded by
//!   [`PARSER_RECURSION_MAX`] (it stops nested parentheses, function calls, CASE and
//!   subqueries); chains of infix operators are built by a loop, so the tree they make is
//!   measured: every expression's nesting depth must be at most [`EXPRESSION_DEPTH_MAX`]
//!   (`sql.too_deep`).
//! - **Constructs refused by name**: window functions (`… OVER (…)`) other than
//!   `ROW_NUMBER()` (TopN's) and the aggregates COUNT, SUM, MIN, MAX, AVG (OVER
//!   aggregates), whose shapes the stream planner checks; subqueries in
//!   expressions (`IN (SELECT …)`, `EXISTS (…)`, scalar subqueries), and set
//!   operations other than `UNION ALL` (`UNION`, `INTERSECT`, `EXCEPT`) (`sql.unsupported`).
//! - **`UNION ALL`** of at most [`UNION_INPUTS_MAX`] inputs per view (`sql.too_many_unions`).
//! - **Joins** at most [`JOINS_MAX`] per view: DataFusion's planning of joins alone grows
//!   quadratically (minutes and a gigabyte for 5000 joins) (`sql.too_many_joins`).
//! - **The tables read**, so the planner can tell a view that reads a view defined below
//!   it (see `views.rs`).
//!
//! The walk uses no recursion that grows with the input: sqlparser's visitor recurses
//! once per level, so the walk cuts every expression subtree [`CUT_LEVELS`] below where
//! the visit entered it, sets it aside and visits it later from a list. The visitor
//! therefore never recurses more than `CUT_LEVELS` expression levels, whatever the depth,
//! and the tree is taken apart as it goes (it is dropped in shallow pieces; dropping a
//! deep tree recurses too). A chain of set operations (`… UNION … UNION …`, as deep as
//! it is long) is taken out of its query the same way and split link by link. The checked tree is consumed: the caller parses the text
//! again for DataFusion (parsing is cheap next to planning).
//!
//! The parser itself recurses up to [`PARSER_RECURSION_MAX`] levels with large frames in
//! a debug build: parse on the planning thread (`stack.rs`), as the planner does.

use std::ops::ControlFlow;

use sluice_types::SluiceError;
use sqlparser::ast::{
    Expr, FunctionArguments, ObjectName, ObjectNamePart, Query, SetExpr, SetOperator, SetQuantifier, Statement, Value,
    Values, VisitMut, VisitorMut,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};

use crate::stream::unsupported;

/// The deepest expression a view may contain: levels of nested operators, parentheses,
/// function calls or CASE (`a + b` is 2 levels, `a + b + c` is 3). Planning and
/// evaluation need stack in proportion (see `stack.rs`).
pub const EXPRESSION_DEPTH_MAX: usize = 500;

/// The parser's recursion limit: the expression limit plus the levels a statement, a
/// query and a select use around their expressions.
pub const PARSER_RECURSION_MAX: usize = EXPRESSION_DEPTH_MAX + 16;

/// How many expression levels the checking visitor descends before it sets a subtree
/// aside (its recursion bound).
const CUT_LEVELS: usize = 32;

/// The most joins one view may hold (over all its subqueries; `FROM a, b` is one).
pub const JOINS_MAX: usize = 8;

/// The most inputs the `UNION ALL`s of one view may have together.
pub const UNION_INPUTS_MAX: usize = 16;

/// What the check learned of a query.
#[derive(Debug, Default)]
pub(crate) struct QueryShape {
    /// Every table name the query reads (the last part of each name), in order, once.
    pub relations: Vec<String>,
    /// Names the query's `WITH` clauses define (they shadow tables).
    pub ctes: Vec<String>,
}

/// Parses a view's SQL as exactly one query.
pub(crate) fn parse(sql: &str) -> Result<Statement, SluiceError> {
    let statements = Parser::new(&GenericDialect {})
        .with_recursion_limit(PARSER_RECURSION_MAX)
        .try_with_sql(sql)
        .and_then(|mut parser| parser.parse_statements())
        .map_err(|error| match error {
            ParserError::RecursionLimitExceeded => too_deep(None),
            other => SluiceError::user("sql.syntax", format!("SQL syntax error: {other}")),
        })?;
    match <[Statement; 1]>::try_from(statements) {
        Ok([statement @ Statement::Query(_)]) => Ok(statement),
        Ok([other]) => Err(SluiceError::user("sql.not_a_query", format!("a view is one SELECT query, not `{other}`"))),
        Err(statements) => Err(SluiceError::user(
            "sql.not_a_query",
            format!("a view is exactly one SELECT query; found {} statements", statements.len()),
        )),
    }
}

/// Parses and checks `sql` (see the module doc); the tree is consumed.
pub(crate) fn check(sql: &str) -> Result<QueryShape, SluiceError> {
    let walk = walk(sql)?;
    if walk.deepest > EXPRESSION_DEPTH_MAX {
        return Err(too_deep(Some(walk.deepest)));
    }
    match walk.refused {
        Some(error) => Err(error),
        None => Ok(walk.shape),
    }
}

/// Refuses `sql` when it is nested deeper than [`EXPRESSION_DEPTH_MAX`] (or than the
/// parser allows); whatever else it is, is left to the caller.
pub(crate) fn check_depth(sql: &str) -> Result<(), SluiceError> {
    match walk(sql) {
        Ok(walk) if walk.deepest > EXPRESSION_DEPTH_MAX => Err(too_deep(Some(walk.deepest))),
        Err(error) if error.code == "sql.too_deep" => Err(error),
        Ok(_) | Err(_) => Ok(()),
    }
}

/// The tables `sql` reads, whatever else the check would refuse.
pub(crate) fn shape(sql: &str) -> Result<QueryShape, SluiceError> {
    Ok(walk(sql)?.shape)
}

fn walk(sql: &str) -> Result<Walk, SluiceError> {
    let mut statement = parse(sql)?;
    let mut walk = Walk::default();
    let _ = statement.visit(&mut walk);
    loop {
        if let Some((mut subtree, above)) = walk.set_aside.pop() {
            walk.above = above;
            let _ = subtree.visit(&mut walk);
        } else if let Some(body) = walk.set_operations.pop() {
            match body {
                SetExpr::SetOperation { left, right, .. } => {
                    for side in [*left, *right] {
                        walk.set_operation(&side);
                        walk.set_operations.push(side);
                    }
                }
                mut other => {
                    walk.above = 0;
                    let _ = other.visit(&mut walk);
                }
            }
        } else {
            return Ok(walk);
        }
    }
}

/// `depth`: the depth found, when known (None: the parser stopped past the limit).
fn too_deep(depth: Option<usize>) -> SluiceError {
    let found = match depth {
        Some(depth) => format!("an expression is nested {depth} levels deep"),
        None => "the query is nested deeper than the parser allows (parentheses, function calls, CASE or \
                 subqueries)"
            .to_string(),
    };
    SluiceError::user("sql.too_deep", format!("{found}; the limit is {EXPRESSION_DEPTH_MAX} levels")).with_fix(
        "split the expression: compute parts as columns of an earlier view, write a long chain of \
             `x = 1 OR x = 2 …` as `x IN (1, 2, …)`, or flatten nested CASEs into one CASE with several WHENs",
    )
}

/// The visitor's state; see the module doc.
#[derive(Default)]
struct Walk {
    /// Levels above the subtree being visited (0 for the statement itself).
    above: usize,
    /// Expression levels the visitor is below the subtree's root.
    level: usize,
    deepest: usize,
    /// Subtrees cut off, each with the levels above it.
    set_aside: Vec<(Expr, usize)>,
    /// Set operations taken out of their query, to split.
    set_operations: Vec<SetExpr>,
    joins: usize,
    /// `UNION ALL`s seen (each adds one input).
    unions: usize,
    refused: Option<SluiceError>,
    shape: QueryShape,
}

impl Walk {
    /// Checks one link of a chain of set operations: only `UNION ALL`, and not too many.
    fn set_operation(&mut self, body: &SetExpr) {
        let SetExpr::SetOperation { op, set_quantifier, .. } = body else { return };
        if !matches!((op, set_quantifier), (SetOperator::Union, SetQuantifier::All)) {
            let name = match set_quantifier {
                SetQuantifier::None => op.to_string(),
                quantifier => format!("{op} {quantifier}"),
            };
            self.refuse(unsupported(
                &name,
                "use UNION ALL (and GROUP BY every column to drop duplicates), or one view per input",
            ));
            return;
        }
        self.unions += 1;
        if self.unions + 1 > UNION_INPUTS_MAX {
            self.refuse(
                SluiceError::user(
                    "sql.too_many_unions",
                    format!(
                        "the view's UNION ALL has more than {UNION_INPUTS_MAX} inputs; the limit is {UNION_INPUTS_MAX}"
                    ),
                )
                .with_fix("union fewer inputs per view: union views of unions"),
            );
        }
    }

    /// Keeps the first refusal.
    fn refuse(&mut self, error: SluiceError) {
        self.refused.get_or_insert(error);
    }
}

impl VisitorMut for Walk {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        for cte in query.with.iter().flat_map(|with| &with.cte_tables) {
            self.shape.ctes.push(cte.alias.name.value.clone());
        }
        match query.body.as_ref() {
            SetExpr::SetOperation { .. } => {
                self.set_operation(query.body.as_ref());
                let empty = SetExpr::Values(Values { explicit_row: false, value_keyword: false, rows: Vec::new() });
                self.set_operations.push(std::mem::replace(query.body.as_mut(), empty));
            }
            SetExpr::Select(select) => {
                let tables: usize = select.from.iter().map(|from| 1 + from.joins.len()).sum();
                self.joins += tables.saturating_sub(1);
                if self.joins > JOINS_MAX {
                    self.refuse(
                        SluiceError::user(
                            "sql.too_many_joins",
                            format!("the view joins more than {JOINS_MAX} times; the limit is {JOINS_MAX} joins"),
                        )
                        .with_fix("split the joins over several views, each reading the one before"),
                    );
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<()> {
        if let Some(ObjectNamePart::Identifier(name)) = relation.0.last()
            && !self.shape.relations.contains(&name.value)
        {
            self.shape.relations.push(name.value.clone());
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        self.level += 1;
        self.deepest = self.deepest.max(self.above + self.level);
        if let Some(error) = refusal(expr) {
            self.refuse(error);
        }
        if self.level >= CUT_LEVELS {
            let subtree = std::mem::replace(expr, Expr::value(Value::Null));
            self.set_aside.push((subtree, self.above + self.level - 1));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _expr: &mut Expr) -> ControlFlow<()> {
        self.level -= 1;
        ControlFlow::Continue(())
    }
}

/// The functions a query may call with `OVER (…)`: TopN's ROW_NUMBER and the
/// aggregates of OVER aggregates.
const OVER_FUNCTIONS: [&str; 7] = ["row_number", "count", "sum", "min", "max", "avg", "mean"];

/// The error for an expression refused by name, if it is one.
fn refusal(expr: &Expr) -> Option<SluiceError> {
    let subquery_fix = "join the other table instead (`FROM a JOIN b ON a.k = b.k`); for a fixed list of values \
                        write `x IN (1, 2, 3)`";
    let refused = match expr {
        // ROW_NUMBER() OVER (…) is TopN's and aggregates OVER (…) the OVER aggregate's; the
        // stream planner checks their shapes.
        Expr::Function(function)
            if function.over.is_some()
                && !OVER_FUNCTIONS.iter().any(|name| function.name.to_string().eq_ignore_ascii_case(name)) =>
        {
            return Some(
                SluiceError::user(
                    "sql.unsupported",
                    format!(
                        "{}(…) OVER (…): window functions other than COUNT, SUM, MIN, MAX, AVG and TopN's \
                         ROW_NUMBER are not supported yet",
                        function.name
                    ),
                )
                .with_fix(
                    "aggregate over a window: COUNT, SUM, MIN, MAX or AVG OVER (PARTITION BY … ORDER BY ts ROWS \
                     BETWEEN 10 PRECEDING AND CURRENT ROW), or over a window table function: FROM \
                     TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) … GROUP BY window_start, \
                     window_end; for TopN, filter ROW_NUMBER() OVER (PARTITION BY … ORDER BY …) by <= N in the \
                     enclosing query",
                ),
            );
        }
        Expr::Function(function) if matches!(function.args, FunctionArguments::Subquery(_)) => {
            format!("a subquery as the argument of {}(…)", function.name)
        }
        Expr::InSubquery { negated, .. } => {
            format!("a subquery in an expression (`{}IN (SELECT …)`)", if *negated { "NOT " } else { "" })
        }
        Expr::Exists { negated, .. } => {
            format!("a subquery in an expression (`{}EXISTS (SELECT …)`)", if *negated { "NOT " } else { "" })
        }
        Expr::Subquery(_) => "a scalar subquery in an expression (`(SELECT …)`)".to_string(),
        _ => return None,
    };
    Some(SluiceError::user("sql.unsupported", format!("{refused} is not supported yet")).with_fix(subquery_fix))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check's error code, or "ok"; on the planning thread, like the planner (the
    /// parser's recursion needs it).
    fn code(sql: &str) -> &'static str {
        crate::stack::on_planning_stack(|| check(sql).map_or_else(|e| e.code, |_| "ok")).expect("planning thread")
    }

    #[test]
    fn depth_counts_every_level_of_every_form() {
        let chain = |terms: usize| vec!["a"; terms].join(" + ");
        assert_eq!(code(&format!("SELECT {} FROM t", chain(EXPRESSION_DEPTH_MAX))), "ok");
        assert_eq!(code(&format!("SELECT {} FROM t", chain(EXPRESSION_DEPTH_MAX + 1))), "sql.too_deep");
        let nested = |levels: usize| format!("{}a{}", "abs(".repeat(levels - 1), ")".repeat(levels - 1));
        assert_eq!(code(&format!("SELECT 1 FROM t WHERE {} > 0", nested(EXPRESSION_DEPTH_MAX - 1))), "ok");
        assert_eq!(code(&format!("SELECT {} FROM t", nested(EXPRESSION_DEPTH_MAX + 1))), "sql.too_deep");
        let parens = format!("SELECT {}a{} FROM t", "(".repeat(5_000), ")".repeat(5_000));
        assert_eq!(code(&parens), "sql.too_deep", "the parser stops first");
    }

    #[test]
    fn the_depth_found_is_named_even_far_past_the_limit() {
        let sql = format!("SELECT {} FROM t", vec!["a"; 20_000].join(" + "));
        let error = check(&sql).expect_err("too deep");
        assert_eq!(
            error.message,
            format!("an expression is nested 20000 levels deep; the limit is {EXPRESSION_DEPTH_MAX} levels")
        );
    }

    #[test]
    fn many_joins_and_set_operations_are_refused_before_datafusion() {
        assert!(check("SELECT * FROM a JOIN b ON a.k = b.k").is_ok());
        assert!(check("SELECT * FROM a, b").is_ok());
        let tables: Vec<String> = (0..=JOINS_MAX).map(|i| format!("t{i}")).collect();
        assert!(check(&format!("SELECT * FROM {}", tables.join(", "))).is_ok(), "{JOINS_MAX} joins are allowed");
        let many = format!("SELECT * FROM {} JOIN u ON u.k = t0.k", tables.join(", "));
        assert_eq!(code(&many), "sql.too_many_joins");
        let nested = format!("SELECT * FROM (SELECT * FROM {}) AS x JOIN u ON u.k = x.k", tables.join(", "));
        assert_eq!(code(&nested), "sql.too_many_joins", "joins in subqueries count too");
        let unions = vec!["SELECT a FROM t"; 20_000].join(" UNION ALL ");
        let error = crate::stack::on_planning_stack(|| check(&unions)).expect("thread").expect_err("refused");
        assert_eq!(error.code, "sql.too_many_unions", "{error}");
        let allowed = vec!["SELECT a FROM t"; UNION_INPUTS_MAX].join(" UNION ALL ");
        assert!(check(&allowed).is_ok());
        let error = check("SELECT a FROM t UNION SELECT a FROM u").expect_err("refused");
        assert!(error.message.starts_with("UNION is not supported"), "{error}");
        let error = check("SELECT a FROM t UNION ALL (SELECT a FROM u UNION SELECT a FROM v)").expect_err("refused");
        assert!(error.message.starts_with("UNION is not supported"), "a nested UNION is found too: {error}");
        let error = check("SELECT 1 FROM t INTERSECT SELECT 1 FROM t").expect_err("refused");
        assert!(error.message.starts_with("INTERSECT"), "{error}");
    }

    #[test]
    fn relations_and_ctes_are_collected() {
        let shape = shape("WITH w AS (SELECT * FROM a) SELECT * FROM w, b WHERE x IN (1, 2)").expect("parses");
        assert_eq!(shape.relations, ["a", "w", "b"]);
        assert_eq!(shape.ctes, ["w"]);
    }
}
