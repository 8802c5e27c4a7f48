//! Flink's legacy group windows, rewritten into the window table functions' form.
//!
//! `SELECT k, TUMBLE_START(ts, INTERVAL '10' SECOND), COUNT(*) FROM t GROUP BY
//! TUMBLE(ts, INTERVAL '10' SECOND), k` means the same as the window table function
//! `FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND)) … GROUP BY
//! window_start, window_end, k`, so each `SELECT` whose `GROUP BY` holds one `TUMBLE(ts,
//! size)`, `HOP(ts, slide, size)` or `SESSION(ts, gap)` is rewritten on the parsed query:
//! - its one `FROM` table `t` becomes the window call's synthetic table, aliased `t` (or
//!   the alias it had), so every column reference still resolves;
//! - the group window becomes `t.window_start, t.window_end`;
//! - `TUMBLE_START`/`HOP_START`/`SESSION_START(…)` become `t.window_start`, `*_END` become
//!   `t.window_end` and `*_ROWTIME` become `t.window_end - INTERVAL '1' MILLISECOND` (the
//!   window's last millisecond, as Flink's: an event time of the result, see
//!   `stream::column_tag`), in the select list and `HAVING`.
//!
//! Both forms are then planned onto the same operators (a legacy `SESSION` is the
//! SESSION table function without `PARTITION BY`: sessions per `GROUP BY` key). Refused by
//! name: two group windows in one `GROUP BY`, a group window over a join or a subquery
//! (make it a view), an auxiliary function whose window differs from the `GROUP BY`'s or
//! that has none, and `*_PROCTIME` (processing time is not supported). A query that
//! names no group window is returned as it was written.

use std::ops::ControlFlow;

use sluice_types::SluiceError;
use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, ObjectName, ObjectNamePart, Query,
    Select, SetExpr, Statement, TableAlias, TableFactor, visit_expressions_mut,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

use crate::stream::unsupported;
use crate::tvf::{self, WindowCall};

const KINDS: [&str; 3] = ["TUMBLE", "HOP", "SESSION"];

/// `sql` with its group windows rewritten; each adds its call to `calls` (numbered on
/// from `first_index` + the calls already there).
pub(crate) fn rewrite(sql: String, calls: &mut Vec<WindowCall>, first_index: usize) -> Result<String, SluiceError> {
    let upper = sql.to_ascii_uppercase();
    if !KINDS.iter().any(|kind| upper.contains(kind)) {
        return Ok(sql);
    }
    // A query that does not parse is left to the later steps, which report it.
    let Ok(mut statements) = Parser::new(&GenericDialect {}).try_with_sql(&sql).and_then(|mut p| p.parse_statements())
    else {
        return Ok(sql);
    };
    let [Statement::Query(query)] = statements.as_mut_slice() else { return Ok(sql) };
    let mut rewriter = Rewriter { calls, next: first_index, changed: false };
    rewriter.next += rewriter.calls.len();
    rewriter.query(query)?;
    if !rewriter.changed {
        return Ok(sql);
    }
    Ok(statements[0].to_string())
}

struct Rewriter<'a> {
    calls: &'a mut Vec<WindowCall>,
    next: usize,
    changed: bool,
}

/// A group window as written: its kind (`TUMBLE`, …), time column and intervals.
struct GroupWindow {
    kind: &'static str,
    arguments: Vec<Expr>,
}

impl Rewriter<'_> {
    fn query(&mut self, query: &mut Query) -> Result<(), SluiceError> {
        if let Some(with) = &mut query.with {
            for table in &mut with.cte_tables {
                self.query(&mut table.query)?;
            }
        }
        self.set_expr(&mut query.body)
    }

    fn set_expr(&mut self, body: &mut SetExpr) -> Result<(), SluiceError> {
        match body {
            SetExpr::Select(select) => self.select(select),
            SetExpr::Query(query) => self.query(query),
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left)?;
                self.set_expr(right)
            }
            _ => Ok(()),
        }
    }

    fn factor(&mut self, factor: &mut TableFactor) -> Result<(), SluiceError> {
        match factor {
            TableFactor::Derived { subquery, .. } => self.query(subquery),
            _ => Ok(()),
        }
    }

    fn select(&mut self, select: &mut Select) -> Result<(), SluiceError> {
        for from in &mut select.from {
            self.factor(&mut from.relation)?;
            for join in &mut from.joins {
                self.factor(&mut join.relation)?;
            }
        }
        let GroupByExpr::Expressions(keys, _) = &mut select.group_by else { return Ok(()) };
        let found: Vec<(usize, GroupWindow)> = keys
            .iter()
            .enumerate()
            .filter_map(|(index, key)| group_window(key).map(|window| (index, window)))
            .collect();
        let (position, window) = match <[(usize, GroupWindow); 1]>::try_from(found) {
            Ok([found]) => found,
            Err(found) if found.is_empty() => return Ok(()),
            Err(_) => {
                return Err(unsupported("two group windows in one GROUP BY", "group by one TUMBLE, HOP or SESSION"));
            }
        };
        let (call, qualifier) = self.window_input(select, &window)?;
        let column = |name: &str| Expr::CompoundIdentifier(vec![qualifier.clone(), Ident::new(name)]);
        let GroupByExpr::Expressions(keys, _) = &mut select.group_by else { unreachable!("matched above") };
        keys.splice(position..=position, [column("window_start"), column("window_end")]);
        let mut error = None;
        let mut replace = |expr: &mut Expr| match auxiliary(expr, &window, &qualifier) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                error = Some(e);
                ControlFlow::Break(())
            }
        };
        let _ = visit_expressions_mut(&mut select.projection, &mut replace);
        let _ = visit_expressions_mut(&mut select.having, &mut replace);
        if let Some(error) = error {
            return Err(error);
        }
        self.calls.push(call);
        self.next += 1;
        self.changed = true;
        Ok(())
    }

    /// Replaces the select's one table by the window call's table; returns the call and
    /// the name the window's columns are qualified with.
    fn window_input(&mut self, select: &mut Select, window: &GroupWindow) -> Result<(WindowCall, Ident), SluiceError> {
        let not_a_table = || {
            unsupported(
                &format!("GROUP BY {}(…) over a join or a subquery", window.kind),
                "define the rows to window as a view, then GROUP BY the group window in a query of that view",
            )
        };
        let [from] = select.from.as_mut_slice() else { return Err(not_a_table()) };
        if !from.joins.is_empty() {
            return Err(not_a_table());
        }
        let TableFactor::Table { name, alias, args: None, .. } = &mut from.relation else { return Err(not_a_table()) };
        let Some(ObjectNamePart::Identifier(table)) = name.0.last().cloned() else { return Err(not_a_table()) };
        let time = match window.arguments.first() {
            Some(Expr::Identifier(column)) => column.clone(),
            Some(Expr::CompoundIdentifier(parts)) if !parts.is_empty() => parts[parts.len() - 1].clone(),
            _ => {
                return Err(SluiceError::user(
                    "sql.window_syntax",
                    format!("GROUP BY {}(…): the first argument must be the event-time column", window.kind),
                )
                .with_fix(format!("write {}(ts, INTERVAL '10' SECOND)", window.kind)));
            }
        };
        let intervals: Vec<String> = window.arguments[1..].iter().map(ToString::to_string).collect();
        let text = format!("TABLE({}(TABLE {table}, DESCRIPTOR({time}), {}))", window.kind, intervals.join(", "));
        let (_, mut calls) = tvf::rewrite(&text, self.next)?;
        let mut call = calls.pop().expect("the text holds one window call");
        call.text = format!("GROUP BY {}({})", window.kind, arguments_text(&window.arguments));
        let qualifier = alias.as_ref().map_or_else(|| table.clone(), |alias| alias.name.clone());
        *name = ObjectName::from(vec![Ident::new(&call.table)]);
        if alias.is_none() {
            *alias = Some(TableAlias { explicit: true, name: qualifier.clone(), columns: Vec::new(), at: None });
        }
        Ok((call, qualifier))
    }
}

fn arguments_text(arguments: &[Expr]) -> String {
    arguments.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The plain (unquoted, one-part) name of a function call, upper-cased, and its
/// arguments when each is a plain expression.
fn call_of(expr: &Expr) -> Option<(String, Vec<Expr>)> {
    let Expr::Function(function) = expr else { return None };
    let [ObjectNamePart::Identifier(name)] = function.name.0.as_slice() else { return None };
    if name.quote_style.is_some() {
        return None;
    }
    let FunctionArguments::List(list) = &function.args else { return Some((name.value.to_ascii_uppercase(), vec![])) };
    let arguments = list
        .args
        .iter()
        .map(|argument| match argument {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) => Some(expr.clone()),
            _ => None,
        })
        .collect::<Option<Vec<Expr>>>()?;
    Some((name.value.to_ascii_uppercase(), arguments))
}

/// `expr` as a group window, if it is one.
fn group_window(expr: &Expr) -> Option<GroupWindow> {
    let (name, arguments) = call_of(expr)?;
    let kind = KINDS.into_iter().find(|kind| *kind == name)?;
    Some(GroupWindow { kind, arguments })
}

/// Replaces `expr` if it is an auxiliary function (`TUMBLE_START(…)`, …) of `window`.
fn auxiliary(expr: &mut Expr, window: &GroupWindow, qualifier: &Ident) -> Result<(), SluiceError> {
    let Some((name, arguments)) = call_of(expr) else { return Ok(()) };
    let Some((kind, part)) = name.split_once('_') else { return Ok(()) };
    if !KINDS.contains(&kind) || !["START", "END", "ROWTIME", "PROCTIME"].contains(&part) {
        return Ok(());
    }
    if part == "PROCTIME" {
        return Err(unsupported(&format!("{name}(…) (processing time)"), &format!("use {kind}_ROWTIME")));
    }
    let (written, grouped) = (arguments_text(&arguments), arguments_text(&window.arguments));
    if kind != window.kind || written != grouped {
        return Err(SluiceError::user(
            "sql.group_window",
            format!("{name}({written}) names another window than the GROUP BY's {}({grouped})", window.kind),
        )
        .with_fix(format!("write {}_{part}({grouped})", window.kind)));
    }
    let column = |name: &str| Expr::CompoundIdentifier(vec![qualifier.clone(), Ident::new(name)]);
    *expr = match part {
        "START" => column("window_start"),
        "END" => column("window_end"),
        _ => {
            let text = format!("{} - INTERVAL '1' MILLISECOND", column("window_end"));
            Parser::new(&GenericDialect {})
                .try_with_sql(&text)
                .and_then(|mut parser| parser.parse_expr())
                .map_err(|e| SluiceError::internal("sql.group_window", format!("{text}: {e}")))?
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_operators::window::WindowKind;

    fn check(sql: &str, expected: &str, kinds: &[WindowKind]) {
        let mut calls = Vec::new();
        let rewritten = rewrite(sql.to_string(), &mut calls, 3).expect("rewrite");
        assert_eq!(rewritten, expected);
        assert_eq!(calls.iter().map(|c| c.kind).collect::<Vec<_>>(), kinds);
    }

    fn check_error(sql: &str, expected: &str) {
        let error = rewrite(sql.to_string(), &mut Vec::new(), 0).expect_err("refused").to_string();
        assert!(error.contains(expected), "{error}");
    }

    #[test]
    fn group_windows_become_window_table_functions() {
        check(
            "SELECT k, TUMBLE_START(ts, INTERVAL '10' SECOND) AS s, COUNT(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '10' SECOND), k",
            "SELECT k, t.window_start AS s, COUNT(*) FROM __window_3 AS t GROUP BY t.window_start, t.window_end, k",
            &[WindowKind::Tumble { size_ms: 10_000 }],
        );
        check(
            "SELECT HOP_END(b.ts, INTERVAL '2' SECOND, INTERVAL '6' SECOND), MAX(price) FROM bid AS b \
             GROUP BY HOP(b.ts, INTERVAL '2' SECOND, INTERVAL '6' SECOND) HAVING HOP_START(b.ts, INTERVAL '2' SECOND, \
             INTERVAL '6' SECOND) > TIMESTAMP '2026-01-01 00:00:00'",
            "SELECT b.window_end, MAX(price) FROM __window_3 AS b GROUP BY b.window_start, b.window_end \
             HAVING b.window_start > TIMESTAMP '2026-01-01 00:00:00'",
            &[WindowKind::Hop { slide_ms: 2_000, size_ms: 6_000 }],
        );
        check(
            "SELECT SESSION_ROWTIME(ts, INTERVAL '1' MINUTE) FROM t GROUP BY SESSION(ts, INTERVAL '1' MINUTE), k",
            "SELECT t.window_end - INTERVAL '1' MILLISECOND FROM __window_3 AS t GROUP BY t.window_start, t.window_end, k",
            &[WindowKind::Session { gap_ms: 60_000 }],
        );
        check(
            "SELECT * FROM (SELECT k, COUNT(*) AS n FROM `t` GROUP BY TUMBLE(`ts`, INTERVAL '1' SECOND), k) WHERE n > 1",
            "SELECT * FROM (SELECT k, COUNT(*) AS n FROM __window_3 AS `t` GROUP BY `t`.window_start, `t`.window_end, k) \
             WHERE n > 1",
            &[WindowKind::Tumble { size_ms: 1_000 }],
        );
    }

    #[test]
    fn queries_without_group_windows_are_left_as_written() {
        for sql in ["SELECT hop FROM t", "SELECT k, COUNT(*) FROM t GROUP BY k", "SELECT * FROM __window_0 w"] {
            check(sql, sql, &[]);
        }
    }

    #[test]
    fn unsupported_group_windows_are_refused_by_name() {
        check_error(
            "SELECT COUNT(*) FROM a JOIN b ON a.x = b.x GROUP BY TUMBLE(ts, INTERVAL '1' SECOND)",
            "GROUP BY TUMBLE(…) over a join or a subquery is not supported yet",
        );
        check_error(
            "SELECT COUNT(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' SECOND), HOP(ts, INTERVAL '1' SECOND, INTERVAL '2' SECOND)",
            "two group windows in one GROUP BY",
        );
        check_error(
            "SELECT TUMBLE_END(ts, INTERVAL '2' SECOND) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' SECOND)",
            "TUMBLE_END(ts, INTERVAL '2' SECOND) names another window than the GROUP BY's TUMBLE(ts, INTERVAL '1' SECOND)",
        );
        check_error(
            "SELECT TUMBLE_PROCTIME(ts, INTERVAL '1' SECOND) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' SECOND)",
            "TUMBLE_PROCTIME(…) (processing time)",
        );
        check_error("SELECT COUNT(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MONTH)", "has no fixed length");
    }
}
