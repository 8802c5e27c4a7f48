//! Sluice's errors as PostgreSQL errors: a SQLSTATE code chosen by the error's stable
//! code (or, failing that, its domain), the message, the Sluice code in the detail and
//! the fix as the hint. The mapping (also in docs/operations/pgwire.md):
//!
//! | Sluice code | SQLSTATE | PostgreSQL's name |
//! |---|---|---|
//! | `query.sql` (the SQL cannot be read) | 42601 | syntax_error |
//! | `query.sql` (planning: a column, a function, a type) | 42000 | syntax_error_or_access_rule_violation |
//! | `query.unknown_table` | 42P01 | undefined_table |
//! | `query.not_materialized` | 55000 | object_not_in_prerequisite_state |
//! | `query.statement` (not a query) | 25006 | read_only_sql_transaction |
//! | `query.limits`, `pgwire.setting` | 22023 | invalid_parameter_value |
//! | `pgwire.parameter` | 22P02 | invalid_text_representation |
//! | `pgwire.unsupported` | 0A000 | feature_not_supported |
//! | `query.too_many_rows`, `query.answer_too_large`, `query.gather_too_large` | 54000 | program_limit_exceeded |
//! | `query.memory` | 53200 | out_of_memory |
//! | `query.busy` | 53000 | insufficient_resources |
//! | `query.timeout`, `query.cancelled` | 57014 | query_canceled |
//! | `query.no_checkpoint`, `query.cluster_forming` | 57P03 | cannot_connect_now |
//! | `query.lease_expired` | 40001 | serialization_failure (ask again) |
//! | `query.worker_*`, `query.gather` | 58000 | system_error |
//! | any other: user / external / internal | 42000 / 58000 / XX000 | |

use pgwire::error::{ErrorInfo, PgWireError};
use sluice_types::{Domain, SluiceError};

/// The SQLSTATE of `error`.
pub(crate) fn sqlstate(error: &SluiceError) -> &'static str {
    match error.code {
        "query.sql" if error.message.starts_with("the SQL cannot be read") => "42601",
        "query.unknown_table" => "42P01",
        "query.not_materialized" => "55000",
        "query.statement" => "25006",
        "query.limits" | "pgwire.setting" => "22023",
        "pgwire.parameter" => "22P02",
        "pgwire.unsupported" => "0A000",
        "query.too_many_rows" | "query.answer_too_large" | "query.gather_too_large" => "54000",
        "query.memory" => "53200",
        "query.busy" => "53000",
        "query.timeout" | "query.cancelled" => "57014",
        "query.no_checkpoint" | "query.cluster_forming" => "57P03",
        "query.lease_expired" => "40001",
        code if code.starts_with("query.worker_") || code == "query.gather" => "58000",
        _ => match error.domain {
            Domain::User => "42000",
            Domain::External => "58000",
            Domain::Internal => "XX000",
        },
    }
}

/// `error` as PostgreSQL's error fields.
pub(crate) fn info(error: &SluiceError) -> ErrorInfo {
    // A field ends at a NUL: one inside a value (quoted from the client's bytes) would
    // cut the message short.
    let clean = |text: &str| text.replace('\0', "\\0");
    let mut info = ErrorInfo::new("ERROR".to_string(), sqlstate(error).to_string(), clean(&error.message));
    info.detail = Some(format!("sluice error code: {}", error.code));
    info.hint = error.fix.as_deref().map(clean);
    info
}

/// `error` as the handler's failure, which `pgwire` sends as an ErrorResponse.
pub(crate) fn to_pg(error: SluiceError) -> PgWireError {
    PgWireError::UserError(Box::new(info(&error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(error: SluiceError, expected: &str) {
        assert_eq!(sqlstate(&error), expected, "{error:?}");
    }

    #[test]
    fn codes_map_to_the_documented_sqlstates() {
        check(SluiceError::user("query.sql", "the SQL cannot be read: x"), "42601");
        check(SluiceError::user("query.sql", "No field named y"), "42000");
        check(SluiceError::user("query.unknown_table", "no table `t`"), "42P01");
        check(SluiceError::user("query.not_materialized", "table `t` is not materialized"), "55000");
        check(SluiceError::user("query.statement", "only queries"), "25006");
        check(SluiceError::user("query.too_many_rows", "more"), "54000");
        check(SluiceError::external("query.timeout", "longer"), "57014");
        check(SluiceError::external("query.no_checkpoint", "none"), "57P03");
        check(SluiceError::external("query.worker_unreachable", "worker 1"), "58000");
        check(SluiceError::external("query.busy", "4 queries"), "53000");
        check(SluiceError::internal("query.table", "x"), "XX000");
    }

    #[test]
    fn a_nul_in_a_message_is_written_out() {
        let error = SluiceError::user("query.sql", "bad \0 byte");
        assert_eq!(info(&error).message, "bad \\0 byte");
    }

    #[test]
    fn the_fix_is_the_hint_and_the_code_is_in_the_detail() {
        let error = SluiceError::user("query.unknown_table", "no table `t`").with_fix("name a materialized table");
        let info = info(&error);
        assert_eq!(info.hint.as_deref(), Some("name a materialized table"));
        assert_eq!(info.detail.as_deref(), Some("sluice error code: query.unknown_table"));
        assert_eq!(info.severity, "ERROR");
    }
}
