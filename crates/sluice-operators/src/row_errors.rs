//! What a filter or projection does when one of its expressions fails on a row.
//!
//! An expression can fail at run time on some values only: an integer division by zero,
//! a CAST of a text that is no number. The operators evaluate whole batches; when a batch
//! fails they evaluate it again row by row to find the failing rows (a slow path taken
//! only by the failing batch), and each failing row goes through [`RowErrors::failed`],
//! which follows the `on_error` policy of the source the flow reads:
//!
//! - [`OnRowError::Skip`]: the row is dropped and counted under
//!   `view NAME: rows failing an expression`; the first [`LOGGED_ROWS_MAX`] of the run
//!   (over every thread) are logged with the view, the expression and the row's values.
//! - [`OnRowError::Fail`]: the pipeline stops with a user error naming the view, the
//!   expression, the row's values and the fix.
//!
//! Messages are bounded: at most [`SHOWN_COLUMNS_MAX`] columns of the row, of at most
//! [`SHOWN_VALUE_CHARS_MAX`] characters each, and [`SHOWN_EXPRESSION_CHARS_MAX`]
//! characters of the expression and [`SHOWN_CAUSE_CHARS_MAX`] of the error.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion_common::DataFusionError;
use sluice_runtime::Metrics;
use sluice_types::SluiceError;

use crate::counter::LazyCounter;

/// How many skipped rows of one view a run logs; later ones are only counted.
pub const LOGGED_ROWS_MAX: u64 = 5;
/// How many columns of a failing row a message shows.
pub const SHOWN_COLUMNS_MAX: usize = 16;
/// How many characters of one value a message shows.
pub const SHOWN_VALUE_CHARS_MAX: usize = 64;
/// How many characters of the failing expression a message shows.
pub const SHOWN_EXPRESSION_CHARS_MAX: usize = 200;
/// How many characters of the evaluation error (which may quote the value) a message shows.
pub const SHOWN_CAUSE_CHARS_MAX: usize = 300;

/// The policy for rows on which an expression fails (the source's `on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRowError {
    /// Drop the row, count it, log the first few.
    Skip,
    /// Stop the pipeline.
    Fail,
}

/// One operator instance's handling of failing rows.
pub struct RowErrors {
    view: String,
    on_error: OnRowError,
    failing_rows: LazyCounter,
}

impl RowErrors {
    /// For the operators of view `view`, counting into `metrics`.
    pub fn new(view: impl Into<String>, on_error: OnRowError, metrics: Arc<Metrics>) -> RowErrors {
        let view = view.into();
        let failing_rows = LazyCounter::new(metrics, format!("view {view}: rows failing an expression"));
        RowErrors { view, on_error, failing_rows }
    }

    /// Expression `expression` failed with `error` on row `row` of `rows`: skip it
    /// (Ok: the caller drops the row) or fail.
    pub fn failed(
        &mut self,
        expression: &str,
        rows: &RecordBatch,
        row: usize,
        error: &DataFusionError,
    ) -> Result<(), SluiceError> {
        let values = row_text(rows, row);
        let expression = shortened(expression, SHOWN_EXPRESSION_CHARS_MAX);
        let cause = shortened(&error.strip_backtrace(), SHOWN_CAUSE_CHARS_MAX);
        match self.on_error {
            OnRowError::Skip => {
                if self.failing_rows.add(1) < LOGGED_ROWS_MAX {
                    tracing::warn!(
                        view = %self.view,
                        %expression,
                        row = %values,
                        error = %cause,
                        "a row on which an expression fails is skipped (on_error = \"skip\"); counted in `{}`",
                        self.failing_rows.name(),
                    );
                }
                Ok(())
            }
            OnRowError::Fail => Err(SluiceError::user(
                "sql.evaluation",
                format!("view `{}`: the expression `{expression}` failed on the row ({values}): {cause}", self.view),
            )
            .with_fix(
                "make the expression defined for every row (e.g. `x / NULLIF(y, 0)`, `TRY_CAST(s AS BIGINT)`), \
                 or set `on_error = \"skip\"` on the source to drop and count such rows",
            )),
        }
    }
}

/// `name = value, …` for row `row`, bounded by [`SHOWN_COLUMNS_MAX`] and
/// [`SHOWN_VALUE_CHARS_MAX`].
pub fn row_text(rows: &RecordBatch, row: usize) -> String {
    let options = FormatOptions::default().with_null("NULL");
    let schema = rows.schema();
    let mut parts = Vec::new();
    for (field, column) in schema.fields().iter().zip(rows.columns()).take(SHOWN_COLUMNS_MAX) {
        let value = match ArrayFormatter::try_new(column.as_ref(), &options) {
            Ok(formatter) => formatter.value(row).to_string(),
            Err(_) => format!("<{}>", column.data_type()),
        };
        parts.push(format!("{} = {}", field.name(), shortened(&value, SHOWN_VALUE_CHARS_MAX)));
    }
    if rows.num_columns() > SHOWN_COLUMNS_MAX {
        parts.push(format!("… {} more columns", rows.num_columns() - SHOWN_COLUMNS_MAX));
    }
    parts.join(", ")
}

/// `text`, cut after `chars` characters (marked with `…`).
fn shortened(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}
