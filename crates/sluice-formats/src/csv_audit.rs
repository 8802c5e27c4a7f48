//! Exact values in CSV rows: a decimal or timestamp field whose text does not fit its
//! column exactly is a bad row, never a changed value.
//!
//! Arrow's CSV decoder keeps the first `scale` decimal places of a DECIMAL field (`1.239`
//! is 1.23 in a DECIMAL(10, 2)) and reads some text that is no number as 0 (`e5`); it
//! keeps the digits of a timestamp column's unit from the fraction of seconds
//! (`2026-01-01 00:00:00.1239` is `.123` in a TIMESTAMP(3)), and never more than nine.
//! Every other type it parses strictly (`9.5` fails a BIGINT), and a decimal beyond its
//! precision fails too.
//!
//! So a [`CsvAudit`] reads the text of the decimal and timestamp fields exactly
//! ([`crate::exact::text_misfit`]). It takes the fields as Arrow's decoder reads them
//! (quoted, with doubled quotes, delimiters and line breaks inside) by decoding them with
//! that decoder as VARCHAR columns, projected to the columns at risk. A misfit sends the
//! chunk to the decoder's record-by-record path, where the audit of each record names
//! it.
//!
//! # The quick test
//!
//! The audit is a second pass of Arrow's decoder over the chunk, so a chunk first
//! takes a quick, complete test ([`CsvAudit::may_misfit`]): a timestamp's
//! text is cut only when some `.` in the chunk is followed by more digits than the
//! column holds (`exact::has_long_fraction`), which a chunk of timestamps written with
//! their column's digits passes. A decimal can be cut from text of many shapes
//! (`1231e-3`, `e5`, `+.`, which Arrow reads as 0), so a schema with a decimal column
//! always runs the audit, as for JSON (see [`crate::json_numbers`]); the cost of that
//! second pass has not been measured.

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::diagnose::misfit_reason;
use crate::exact::{fraction_digits, has_long_fraction, text_misfit};

/// The most rows the audit decodes into one batch.
const AUDIT_BATCH_ROWS: usize = 1024;

/// A column whose values Arrow may read changed.
#[derive(Debug)]
struct AuditedColumn {
    index: usize,
    name: String,
    data_type: DataType,
}

/// Checks the text of the decimal and timestamp fields of CSV records; see the module
/// doc.
#[derive(Debug)]
pub(crate) struct CsvAudit {
    delimiter: u8,
    /// The schema with every column a nullable VARCHAR: the fields' text.
    text_schema: SchemaRef,
    columns: Vec<AuditedColumn>,
    /// A decimal column is at risk from any value: the quick test does not apply.
    has_decimal: bool,
    /// The fewest digits of fractional seconds a timestamp column holds, if any.
    fraction_digits: Option<u8>,
}

impl CsvAudit {
    /// The audit of `schema`'s columns in records of fields separated by `delimiter`,
    /// or `None` when no column is at risk.
    pub(crate) fn new(schema: &Schema, delimiter: u8) -> Option<CsvAudit> {
        let columns: Vec<AuditedColumn> = (schema.fields().iter().enumerate())
            .filter(|(_, field)| {
                matches!(field.data_type(), DataType::Timestamp(_, _)) || is_decimal(field.data_type())
            })
            .map(|(index, field)| AuditedColumn {
                index,
                name: field.name().clone(),
                data_type: field.data_type().clone(),
            })
            .collect();
        if columns.is_empty() {
            return None;
        }
        let text_fields: Vec<Field> =
            schema.fields().iter().map(|field| Field::new(field.name(), DataType::Utf8, true)).collect();
        let has_decimal = columns.iter().any(|column| is_decimal(&column.data_type));
        let fraction_digits = (columns.iter())
            .filter_map(|column| match column.data_type {
                DataType::Timestamp(unit, _) => Some(fraction_digits(unit)),
                _ => None,
            })
            .min();
        let text_schema = Arc::new(Schema::new(text_fields));
        Some(CsvAudit { delimiter, text_schema, columns, has_decimal, fraction_digits })
    }

    /// The quick, complete test: `false` when no value of `bytes` can be read changed
    /// by Arrow's decoder.
    pub(crate) fn may_misfit(&self, bytes: &[u8]) -> bool {
        self.has_decimal || self.fraction_digits.is_some_and(|digits| has_long_fraction(bytes, digits))
    }

    /// Why a value of `bytes` (whole CSV records, the last ending with a line break)
    /// does not fit its column, e.g. ``column `d`: expected DECIMAL(10, 2), found
    /// "1.239" (more than 2 decimal places)``; `None` when every value fits, or when
    /// Arrow's decoder cannot read `bytes` (it then fails the decode itself).
    pub(crate) fn first_misfit(&self, bytes: &[u8]) -> Option<String> {
        let projection = self.columns.iter().map(|column| column.index).collect();
        let mut decoder = arrow::csv::ReaderBuilder::new(self.text_schema.clone())
            .with_header(false)
            .with_delimiter(self.delimiter)
            .with_projection(projection)
            .with_batch_size(AUDIT_BATCH_ROWS)
            .build_decoder();
        let mut rest = bytes;
        loop {
            let read = decoder.decode(rest).ok()?;
            rest = &rest[read..];
            // Arrow's decoder stops reading when a batch is full.
            let batch = decoder.flush().ok()?;
            if let Some(reason) = batch.as_ref().and_then(|batch| self.batch_misfit(batch)) {
                return Some(reason);
            }
            if rest.is_empty() || (read == 0 && batch.is_none()) {
                return None;
            }
        }
    }

    /// The reason of the first value of a column of `batch` (the audited columns as
    /// text) that does not fit.
    fn batch_misfit(&self, batch: &RecordBatch) -> Option<String> {
        for (column, texts) in self.columns.iter().zip(batch.columns()) {
            let texts = texts.as_string_opt::<i32>()?;
            for text in texts.iter().flatten() {
                if let Some(misfit) = text_misfit(&column.data_type, text.as_bytes()) {
                    return Some(misfit_reason(&column.name, &column.data_type, &format!("{text:?}"), misfit));
                }
            }
        }
        None
    }
}

fn is_decimal(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Decimal32(_, _) | DataType::Decimal64(_, _) | DataType::Decimal128(_, _) | DataType::Decimal256(_, _)
    )
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::TimeUnit;

    use super::*;

    fn audit() -> CsvAudit {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("note", DataType::Utf8, true),
        ]);
        CsvAudit::new(&schema, b',').expect("ts is at risk")
    }

    #[test]
    fn the_quick_test_passes_timestamps_with_their_columns_digits() {
        let audit = audit();
        assert!(!audit.may_misfit(b"1,2026-01-01 00:00:00.123,a.b\n2,2026-01-01,\n"));
        assert!(audit.may_misfit(b"1,2026-01-01 00:00:00.1230,\n"), "a fourth digit, even a zero, is looked at");
        assert!(audit.may_misfit(b"1,,pi is 3.14159\n"), "the test does not know columns");
        let none = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        assert!(CsvAudit::new(&none, b',').is_none());
    }

    #[test]
    fn fields_are_read_as_the_decoder_reads_them() {
        let audit = audit();
        let misfit = |bytes: &str| audit.first_misfit(bytes.as_bytes());
        assert_eq!(misfit("1,2026-01-01 00:00:00.1230,x\n2,\"2026-01-01 00:00:00.12\",\"a\nb\"\n"), None);
        assert_eq!(
            misfit("1,,\"pi, 3.14159\"\n2,\"2026-01-01 00:00:00.1239\",\n").as_deref(),
            Some(
                "column `ts`: expected TIMESTAMP(3), found \"2026-01-01 00:00:00.1239\" (more than 3 digits of fractional seconds)"
            )
        );
        assert_eq!(misfit("1,2026-01-01 00:00:00.1239\n"), None, "a record Arrow rejects is left to it");
    }

    #[test]
    fn many_records_are_read_in_batches() {
        let audit = audit();
        let mut bytes: String =
            (0..AUDIT_BATCH_ROWS * 2 + 5).map(|id| format!("{id},2026-01-01 00:00:00.5,\n")).collect();
        assert_eq!(audit.first_misfit(bytes.as_bytes()), None);
        bytes.push_str("9,2026-01-01 00:00:00.0001,\n");
        assert!(audit.first_misfit(bytes.as_bytes()).is_some());
    }
}
