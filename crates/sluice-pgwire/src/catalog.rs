//! A small PostgreSQL catalog (`pg_catalog`, `information_schema`) describing the
//! job's materialized tables, queried with DataFusion: what psql's `\dt` and `\d TABLE`
//! and a BI tool's discovery queries read (`tables`, `functions`).
//!
//! Clients write catalog queries in PostgreSQL's own idioms; before planning, each is
//! rewritten into what DataFusion reads, with the same meaning here:
//! - `OPERATOR(pg_catalog.~)` and its kin → the operator itself;
//! - `x COLLATE pg_catalog.default` → `x` (one collation);
//! - casts to `regclass`, `regtype`, `regnamespace`, `oid` → the value itself (an oid),
//!   casts to `pg_catalog.text` → text;
//! - `x = ANY (ARRAY[a, b])` → `x IN (a, b)` (the catalog has no arrays); casts to
//!   `"char"`, `bpchar`, `varchar` → text;
//! - `pg_catalog.f(…)` → `f(…)`; `current_user` (and `session_user`…) → `'sluice'`;
//! - a scalar subquery whose first table is one that holds no rows here (indexes,
//!   defaults, collations… `tables::EMPTY`) → NULL, which it evaluates to.
//!
//! A query whose every branch reads from such a table, crossed or inner-joined (psql's
//! footers: policies, statistics, publications, inheritance), without grouping or
//! aggregates, has no rows:
//! it is answered so without planning, its columns named as written (`?column?` as
//! PostgreSQL names an expression).
//!
//! Bounds: the catalog has a row per table and per column; a query runs on its own
//! current-thread runtime until its interrupt fires (at [`crate::CATALOG_TIMEOUT`], or
//! when its client goes away), every operator checking it at each batch (the query
//! path's `interruptible`), with DataFusion's memory pool at [`CATALOG_MEMORY`].

mod functions;
mod tables;

use std::ops::ControlFlow;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::MemorySchemaProvider;
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::sqlparser::ast::{
    self, BinaryOperator, Expr, GroupByExpr, JoinOperator, ObjectName, ObjectNamePart, SelectItem, SetExpr,
    SetOperator, Statement, TableFactor, Value,
};
use sluice_engine::query::interrupt::interruptible;
use sluice_engine::query::{Interrupt, Stop};
use sluice_types::SluiceError;

/// DataFusion's memory pool for a catalog query.
pub const CATALOG_MEMORY: usize = 64 << 20;

/// A catalog query's answer.
pub(crate) struct CatalogAnswer {
    pub(crate) schema: SchemaRef,
    pub(crate) batches: Vec<RecordBatch>,
}

/// Answers `statement` over the catalog of `tables` in database `database`.
pub(crate) fn answer(
    mut statement: Statement,
    tables: &[(String, SchemaRef)],
    database: &str,
    interrupt: &Interrupt,
) -> Result<CatalogAnswer, SluiceError> {
    rewrite(&mut statement);
    if let Some(columns) = no_rows(&statement) {
        let fields: Vec<Field> = columns.into_iter().map(|name| Field::new(name, DataType::Utf8, true)).collect();
        return Ok(CatalogAnswer { schema: Arc::new(Schema::new(fields)), batches: Vec::new() });
    }
    let context = session(tables, database)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| SluiceError::external("query.runtime", format!("cannot start the catalog's runtime: {e}")))?;
    let stopped = || match interrupt.fired() {
        Some(Stop::Cancelled) => SluiceError::external("query.cancelled", "the catalog query was cancelled"),
        _ => SluiceError::external(
            "query.timeout",
            format!("the catalog query took longer than {} ms", crate::CATALOG_TIMEOUT.as_millis()),
        )
        .with_fix("ask for less of the catalog"),
    };
    let work = async {
        let plan = context
            .state()
            .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(statement)))
            .await
            .map_err(catalog_error)?;
        let frame = context.execute_logical_plan(plan).await.map_err(catalog_error)?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let task = frame.task_ctx();
        let physical = frame.create_physical_plan().await.map_err(catalog_error)?;
        // Every operator stops at its next batch once the interrupt fires: a cross join
        // of the catalog with itself ends at the deadline too.
        let physical = interruptible(physical, interrupt).map_err(catalog_error)?;
        let batches = datafusion::physical_plan::collect(physical, Arc::new(task)).await;
        match (batches, interrupt.fired()) {
            (Ok(batches), None) => Ok(CatalogAnswer { schema, batches }),
            (Err(error), None) => Err(catalog_error(error)),
            (_, Some(_)) => Err(stopped()),
        }
    };
    let left = interrupt.deadline().saturating_duration_since(std::time::Instant::now());
    let outcome = runtime.block_on(async move { tokio::time::timeout(left, work).await });
    drop(runtime);
    outcome.map_err(|_| stopped())?
}

fn catalog_error(error: datafusion::error::DataFusionError) -> SluiceError {
    SluiceError::user("query.sql", format!("the catalog cannot answer this query: {}", error.strip_backtrace()))
        .with_fix("the catalog (pg_catalog, information_schema) holds the tables, columns and types clients list")
}

/// A session holding the catalog's tables (also under `public`, where an unqualified
/// `pg_class` is found) and functions.
fn session(tables: &[(String, SchemaRef)], database: &str) -> Result<SessionContext, SluiceError> {
    let config = SessionConfig::new().with_target_partitions(1).with_information_schema(false);
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(CATALOG_MEMORY, 1.0)
        .build_arc()
        .map_err(|e| SluiceError::internal("pgwire.catalog", e.to_string()))?;
    let context = SessionContext::new_with_config_rt(config, runtime);
    let internal = |e: datafusion::error::DataFusionError| SluiceError::internal("pgwire.catalog", e.to_string());
    let catalog = context
        .catalog("datafusion")
        .ok_or_else(|| SluiceError::internal("pgwire.catalog", "DataFusion's default catalog is missing"))?;
    for schema in crate::route::CATALOG_SCHEMAS {
        catalog.register_schema(schema, Arc::new(MemorySchemaProvider::new())).map_err(internal)?;
    }
    let mut sorted = tables.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for table in tables::build(&sorted, database)? {
        let memory = MemTable::try_new(table.batch.schema(), vec![vec![table.batch]]).map_err(internal)?;
        let memory = Arc::new(memory);
        context.register_table(TableReference::partial(table.schema, table.name), memory.clone()).map_err(internal)?;
        if table.schema == "pg_catalog" {
            context.register_table(TableReference::partial("public", table.name), memory).map_err(internal)?;
        }
    }
    for function in functions::all(database) {
        context.register_udf(function);
    }
    Ok(context)
}

/// Rewrites PostgreSQL's idioms into DataFusion's (see the module docs).
fn rewrite(statement: &mut Statement) {
    let _ = ast::visit_expressions_mut(statement, |expr: &mut Expr| {
        let replacement = match expr {
            Expr::BinaryOp { op, .. } => {
                if let BinaryOperator::PGCustomBinaryOperator(parts) = op
                    && let Some(operator) = parts.last().and_then(|symbol| plain_operator(symbol))
                {
                    *op = operator;
                }
                None
            }
            Expr::Collate { expr: inner, .. } => Some((**inner).clone()),
            Expr::Cast { expr: inner, data_type, .. } => match cast_target(data_type) {
                Cast::Keep => None,
                Cast::Drop => Some((**inner).clone()),
                Cast::Text => {
                    *data_type = ast::DataType::Text;
                    None
                }
            },
            // `current_user` and its kin, without parentheses: the one role.
            Expr::Function(function)
                if matches!(function.args, ast::FunctionArguments::None)
                    && ["current_user", "session_user", "current_role", "user"]
                        .contains(&last_part(&function.name).as_str()) =>
            {
                Some(Expr::Value(Value::SingleQuotedString(tables::OWNER.to_string()).into()))
            }
            Expr::Function(function) => {
                strip_catalog(&mut function.name);
                None
            }
            Expr::Subquery(query) if no_rows_body(&query.body).is_some() => Some(Expr::Value(Value::Null.into())),
            // `x = ANY (ARRAY[a, b])` (no arrays here) → `x IN (a, b)`.
            Expr::AnyOp { left, compare_op: BinaryOperator::Eq, right, .. } => {
                array_elements(right).map(|list| Expr::InList { expr: left.clone(), list, negated: false })
            }
            _ => None,
        };
        if let Some(replacement) = replacement {
            *expr = replacement;
        }
        ControlFlow::<()>::Continue(())
    });
}

/// The elements of an `ARRAY[…]` literal (in parentheses or not).
fn array_elements(expr: &Expr) -> Option<Vec<Expr>> {
    match expr {
        Expr::Nested(inner) => array_elements(inner),
        Expr::Array(array) => Some(array.elem.clone()),
        _ => None,
    }
}

fn plain_operator(symbol: &str) -> Option<BinaryOperator> {
    Some(match symbol {
        "~" => BinaryOperator::PGRegexMatch,
        "~*" => BinaryOperator::PGRegexIMatch,
        "!~" => BinaryOperator::PGRegexNotMatch,
        "!~*" => BinaryOperator::PGRegexNotIMatch,
        "=" => BinaryOperator::Eq,
        "<>" => BinaryOperator::NotEq,
        "<" => BinaryOperator::Lt,
        ">" => BinaryOperator::Gt,
        _ => return None,
    })
}

enum Cast {
    Keep,
    Drop,
    Text,
}

/// What a cast to `data_type` becomes.
fn cast_target(data_type: &ast::DataType) -> Cast {
    let name = match data_type {
        ast::DataType::Custom(name, _) => last_part(name),
        ast::DataType::Regclass => "regclass".to_string(),
        _ => return Cast::Keep,
    };
    match name.as_str() {
        "regclass" | "regtype" | "regnamespace" | "regproc" | "regprocedure" | "oid" => Cast::Drop,
        "text" | "name" | "char" | "bpchar" | "varchar" => Cast::Text,
        _ => Cast::Keep,
    }
}

/// The last part of `name`, lower-cased, without quotes (`"char"` is `char`).
fn last_part(name: &ObjectName) -> String {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(ident)) => ident.value.to_lowercase(),
        Some(part) => part.to_string().to_lowercase(),
        None => String::new(),
    }
}

/// `pg_catalog.f` → `f`.
fn strip_catalog(name: &mut ObjectName) {
    let qualified = name.0.len() == 2
        && matches!(&name.0[0], ObjectNamePart::Identifier(schema) if schema.value.eq_ignore_ascii_case("pg_catalog"));
    if qualified {
        name.0.remove(0);
    }
}

/// The columns of a query that has no rows (see the module docs), else None.
fn no_rows(statement: &Statement) -> Option<Vec<String>> {
    let Statement::Query(query) = statement else { return None };
    no_rows_body(&query.body)
}

fn no_rows_body(body: &SetExpr) -> Option<Vec<String>> {
    match body {
        SetExpr::Select(select) => {
            // The FROM items are crossed: one without rows leaves none.
            let empty = select.from.iter().any(empty_item);
            let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(keys, _) if keys.is_empty());
            if !empty || grouped || select.having.is_some() || aggregates(&select.projection) {
                return None;
            }
            select.projection.iter().map(column_name).collect()
        }
        SetExpr::SetOperation { op: SetOperator::Union, left, right, .. } => {
            let names = no_rows_body(left)?;
            no_rows_body(right)?;
            Some(names)
        }
        SetExpr::Query(query) => no_rows_body(&query.body),
        _ => None,
    }
}

/// Whether a FROM item has no rows: its table holds none, or it joins one without rows
/// by an inner or cross join, and no right or full join could bring rows back.
fn empty_item(item: &ast::TableWithJoins) -> bool {
    let kept = item.joins.iter().any(|join| {
        matches!(join.join_operator, JoinOperator::Right(_) | JoinOperator::RightOuter(_) | JoinOperator::FullOuter(_))
    });
    let inner_empty = item.joins.iter().any(|join| {
        matches!(join.join_operator, JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::CrossJoin(_))
            && empty_relation(&join.relation)
    });
    !kept && (empty_relation(&item.relation) || inner_empty)
}

/// Whether `relation` is a catalog table that holds no rows here.
fn empty_relation(relation: &TableFactor) -> bool {
    let TableFactor::Table { name, .. } = relation else { return false };
    tables::EMPTY.iter().any(|(table, _)| last_part(name) == *table)
}

/// Whether the select list calls an aggregate (which answers a row over no rows), not
/// counting those inside its subqueries (which answer per row).
fn aggregates(projection: &[SelectItem]) -> bool {
    let mut finder = Aggregates { depth: 0 };
    ast::Visit::visit(&projection.to_vec(), &mut finder).is_break()
}

struct Aggregates {
    /// How many queries deep the visit is.
    depth: usize,
}

impl ast::Visitor for Aggregates {
    type Break = ();

    fn pre_visit_query(&mut self, _query: &ast::Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &ast::Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        const AGGREGATES: [&str; 10] =
            ["count", "sum", "min", "max", "avg", "string_agg", "array_agg", "bool_and", "bool_or", "every"];
        match expr {
            Expr::Function(function) if self.depth == 0 && AGGREGATES.contains(&last_part(&function.name).as_str()) => {
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        }
    }
}

/// A select item's column name as PostgreSQL gives it (None for a wildcard).
fn column_name(item: &SelectItem) -> Option<String> {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
        SelectItem::UnnamedExpr(expr) => Some(match expr {
            Expr::Identifier(ident) => ident.value.clone(),
            Expr::CompoundIdentifier(idents) => idents.last().map_or("?column?".into(), |i| i.value.clone()),
            Expr::Function(function) => last_part(&function.name),
            Expr::Cast { expr, .. } => match &**expr {
                Expr::Identifier(ident) => ident.value.clone(),
                Expr::CompoundIdentifier(idents) => idents.last().map_or("?column?".into(), |i| i.value.clone()),
                _ => "?column?".into(),
            },
            _ => "?column?".into(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
