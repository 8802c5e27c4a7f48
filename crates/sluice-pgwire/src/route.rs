//! Where a statement goes: the session (transaction control, settings), the catalog
//! (`pg_catalog`, `information_schema`, the functions clients call to learn about the
//! server), or the job's query path (everything else, which refuses what is not a
//! query over the materialized tables, with `/query`'s errors).
//!
//! A statement is read with PostgreSQL's dialect; one that does not read that way goes
//! to the query path, whose dialect (DataFusion's) decides, so no query `/query` answers
//! is refused here.

use datafusion::sql::sqlparser::ast::{Expr, ObjectName, Statement, visit_expressions, visit_relations};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use std::ops::ControlFlow;

/// The schemas of the catalog.
pub(crate) const CATALOG_SCHEMAS: [&str; 2] = ["pg_catalog", "information_schema"];

/// Functions only the catalog answers.
const CATALOG_FUNCTIONS: [&str; 14] = [
    "current_user",
    "session_user",
    "current_role",
    "user",
    "version",
    "current_schema",
    "current_schemas",
    "current_database",
    "current_setting",
    "format_type",
    "obj_description",
    "col_description",
    "has_table_privilege",
    "has_schema_privilege",
];

/// What a statement is.
#[derive(Debug)]
pub(crate) enum Route {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`.
    Commit,
    /// `ROLLBACK`, `ABORT`.
    Rollback,
    /// `SET name = value` (or `TO`); `SET SESSION …`.
    Set { name: String, value: String },
    /// `SHOW name`.
    Show { name: String },
    /// `RESET`, `DISCARD`, `DEALLOCATE`, `CLOSE`: nothing to undo here; the tag.
    Accepted(&'static str),
    /// A query over the catalog, with its parsed form.
    Catalog(Box<Statement>),
    /// Anything else: the job's query path.
    Query,
}

/// Reads `sql` (one statement; several go to the query path, which refuses them).
pub(crate) fn route(sql: &str) -> Route {
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Route::Query;
    };
    if statements.len() != 1 {
        return Route::Query;
    }
    let Some(statement) = statements.pop() else { return Route::Query };
    match statement {
        Statement::StartTransaction { .. } => Route::Begin,
        Statement::Commit { .. } => Route::Commit,
        Statement::Rollback { .. } => Route::Rollback,
        Statement::Set(set) => setting(&set),
        Statement::ShowVariable { variable } => {
            Route::Show { name: variable.iter().map(|i| i.value.to_lowercase()).collect::<Vec<_>>().join(" ") }
        }
        Statement::Discard { .. } => Route::Accepted("DISCARD ALL"),
        Statement::Deallocate { .. } => Route::Accepted("DEALLOCATE"),
        Statement::Close { .. } => Route::Accepted("CLOSE CURSOR"),
        Statement::Query(_) if reads_catalog(&statement) => Route::Catalog(Box::new(statement)),
        _ => Route::Query,
    }
}

/// `SET`: the name and the value as text (`RESET` names nothing).
fn setting(set: &datafusion::sql::sqlparser::ast::Set) -> Route {
    use datafusion::sql::sqlparser::ast::Set;
    match set {
        Set::SingleAssignment { variable, values, .. } => Route::Set {
            name: variable.to_string().to_lowercase(),
            value: values.iter().map(|v| v.to_string().trim_matches('\'').to_string()).collect::<Vec<_>>().join(", "),
        },
        Set::SetTimeZone { value, .. } => {
            Route::Set { name: "timezone".to_string(), value: value.to_string().trim_matches('\'').to_string() }
        }
        _ => Route::Accepted("SET"),
    }
}

/// Whether `statement` names a catalog table or calls a catalog function.
fn reads_catalog(statement: &Statement) -> bool {
    let relation = visit_relations(statement, |name: &ObjectName| {
        if is_catalog_table(name) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    });
    if relation.is_break() {
        return true;
    }
    let function = visit_expressions(statement, |expr: &Expr| match expr {
        Expr::Function(function) if is_catalog_function(&function.name) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    function.is_break()
}

/// `pg_catalog.x`, `information_schema.x`, or an unqualified `pg_x` (PostgreSQL finds
/// `pg_catalog` first on every search path).
fn is_catalog_table(name: &ObjectName) -> bool {
    let parts: Vec<String> = name.0.iter().map(|part| part.to_string().to_lowercase()).collect();
    match parts.as_slice() {
        [table] => table.starts_with("pg_"),
        [.., schema, _] => CATALOG_SCHEMAS.contains(&schema.as_str()),
        [] => false,
    }
}

fn is_catalog_function(name: &ObjectName) -> bool {
    let parts: Vec<String> = name.0.iter().map(|part| part.to_string().to_lowercase()).collect();
    match parts.as_slice() {
        [schema, _] if schema == "pg_catalog" => true,
        [function] => CATALOG_FUNCTIONS.contains(&function.as_str()) || function.starts_with("pg_"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_go_where_they_are_answered() {
        assert!(matches!(route("BEGIN"), Route::Begin));
        assert!(matches!(route("commit"), Route::Commit));
        assert!(matches!(route("ROLLBACK"), Route::Rollback));
        assert!(
            matches!(route("SET statement_timeout = 500"), Route::Set { name, value } if name == "statement_timeout" && value == "500")
        );
        assert!(matches!(route("SHOW server_version"), Route::Show { name } if name == "server_version"));
        assert!(matches!(route("SELECT * FROM pg_catalog.pg_class"), Route::Catalog(_)));
        assert!(matches!(route("SELECT table_name FROM information_schema.tables"), Route::Catalog(_)));
        assert!(matches!(route("SELECT version()"), Route::Catalog(_)));
        assert!(matches!(route("SELECT k, n FROM counts WHERE n > 1"), Route::Query));
        assert!(matches!(route("INSERT INTO counts VALUES (1)"), Route::Query));
        assert!(matches!(route("SELECT 1; SELECT 2"), Route::Query));
    }
}
