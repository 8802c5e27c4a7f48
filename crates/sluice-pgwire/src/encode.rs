//! Arrow columns as PostgreSQL columns: each Arrow type's PostgreSQL type (its OID in the
//! RowDescription), and every value in the format the client asked for, text or binary.
//!
//! | Arrow | PostgreSQL |
//! |---|---|
//! | Boolean | bool |
//! | Int8, Int16, UInt8 | int2 |
//! | Int32, UInt16 | int4 |
//! | Int64, UInt32, UInt64 (refused above 2^63 - 1) | int8 |
//! | Float16, Float32 | float4 |
//! | Float64 | float8 |
//! | Utf8, LargeUtf8, Utf8View | text |
//! | Binary, LargeBinary, BinaryView | bytea |
//! | Date32, Date64 | date |
//! | Timestamp without a zone | timestamp |
//! | Timestamp with a zone | timestamptz |
//! | Decimal | numeric (text format only) |
//! | any other | text, as Arrow prints it (text format only) |
//!
//! Bounds: the rows encoded are the answer's, which the query path bounded (rows and
//! bytes); one buffer per row.

use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::Type;
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::error::PgWireResult;
use pgwire::messages::data::DataRow;
use sluice_types::SluiceError;

/// The PostgreSQL type of an Arrow type.
pub(crate) fn pg_type(data_type: &DataType) -> Type {
    match data_type {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Type::BYTEA,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
            Type::NUMERIC
        }
        _ => Type::TEXT,
    }
}

/// Whether values of `data_type` can be sent in the binary format.
fn has_binary(data_type: &DataType) -> bool {
    match pg_type(data_type) {
        Type::NUMERIC => false,
        Type::TEXT => matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View),
        _ => true,
    }
}

/// The RowDescription of `fields`, each in the format `format` gives its position.
pub(crate) fn describe(fields: &[Arc<Field>], format: &Format) -> Result<Vec<FieldInfo>, SluiceError> {
    fields
        .iter()
        .enumerate()
        .map(|(index, field)| {
            let wire = format_for(format, index);
            if wire == FieldFormat::Binary && !has_binary(field.data_type()) {
                return Err(SluiceError::user(
                    "pgwire.unsupported",
                    format!("column `{}` ({}) cannot be sent in the binary format", field.name(), field.data_type()),
                )
                .with_fix(format!("ask for text results, or CAST(\"{}\" AS VARCHAR)", field.name())));
            }
            Ok(FieldInfo::new(field.name().clone(), None, None, pg_type(field.data_type()), wire))
        })
        .collect()
}

/// The format of column `index` (a short format list means text for the rest).
fn format_for(format: &Format, index: usize) -> FieldFormat {
    match format {
        Format::Individual(codes) if index >= codes.len() => FieldFormat::Text,
        format => format.format_for(index),
    }
}

/// Every row of `batches` as DataRows described by `fields`.
pub(crate) fn rows(batches: &[RecordBatch], fields: &Arc<Vec<FieldInfo>>) -> Result<Vec<DataRow>, SluiceError> {
    let total = batches.iter().map(RecordBatch::num_rows).sum();
    let mut rows = Vec::with_capacity(total);
    let mut encoder = DataRowEncoder::new(Arc::clone(fields));
    let options = FormatOptions::default()
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f%:z"))
        .with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"));
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|column| ArrayFormatter::try_new(column.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SluiceError::internal("pgwire.encode", format!("cannot format the answer: {e}")))?;
        for row in 0..batch.num_rows() {
            for (column, formatter) in batch.columns().iter().zip(&formatters) {
                cell(&mut encoder, column.as_ref(), formatter, row).map_err(|e| {
                    SluiceError::user("pgwire.encode", format!("a value cannot be sent: {e}"))
                        .with_fix("CAST the column to VARCHAR")
                })?;
            }
            rows.push(encoder.take_row());
        }
    }
    Ok(rows)
}

/// Encodes the value at `row` of `column`.
fn cell(encoder: &mut DataRowEncoder, column: &dyn Array, text: &ArrayFormatter, row: usize) -> PgWireResult<()> {
    use arrow::datatypes::*;
    if column.is_null(row) {
        return encoder.encode_field(&None::<i64>);
    }
    match column.data_type() {
        DataType::Boolean => encoder.encode_field(&column.as_boolean().value(row)),
        DataType::Int8 => encoder.encode_field(&i16::from(column.as_primitive::<Int8Type>().value(row))),
        DataType::Int16 => encoder.encode_field(&column.as_primitive::<Int16Type>().value(row)),
        DataType::UInt8 => encoder.encode_field(&i16::from(column.as_primitive::<UInt8Type>().value(row))),
        DataType::Int32 => encoder.encode_field(&column.as_primitive::<Int32Type>().value(row)),
        DataType::UInt16 => encoder.encode_field(&i32::from(column.as_primitive::<UInt16Type>().value(row))),
        DataType::Int64 => encoder.encode_field(&column.as_primitive::<Int64Type>().value(row)),
        DataType::UInt32 => encoder.encode_field(&i64::from(column.as_primitive::<UInt32Type>().value(row))),
        DataType::UInt64 => {
            let value = column.as_primitive::<UInt64Type>().value(row);
            let value = i64::try_from(value)
                .map_err(|_| pgwire::error::PgWireError::ApiError(format!("{value} does not fit a bigint").into()))?;
            encoder.encode_field(&value)
        }
        DataType::Float16 => encoder.encode_field(&column.as_primitive::<Float16Type>().value(row).to_f32()),
        DataType::Float32 => encoder.encode_field(&column.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => encoder.encode_field(&column.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => encoder.encode_field(&column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => encoder.encode_field(&column.as_string::<i64>().value(row)),
        DataType::Utf8View => encoder.encode_field(&column.as_string_view().value(row)),
        DataType::Binary => encoder.encode_field(&column.as_binary::<i32>().value(row)),
        DataType::LargeBinary => encoder.encode_field(&column.as_binary::<i64>().value(row)),
        DataType::BinaryView => encoder.encode_field(&column.as_binary_view().value(row)),
        DataType::Date32 => match column.as_primitive::<Date32Type>().value_as_date(row) {
            Some(date) => encoder.encode_field(&date),
            None => encoder.encode_field(&None::<i64>),
        },
        DataType::Date64 => match column.as_primitive::<Date64Type>().value_as_date(row) {
            Some(date) => encoder.encode_field(&date),
            None => encoder.encode_field(&None::<i64>),
        },
        DataType::Timestamp(unit, zone) => {
            let time = match unit {
                TimeUnit::Second => column.as_primitive::<TimestampSecondType>().value_as_datetime(row),
                TimeUnit::Millisecond => column.as_primitive::<TimestampMillisecondType>().value_as_datetime(row),
                TimeUnit::Microsecond => column.as_primitive::<TimestampMicrosecondType>().value_as_datetime(row),
                TimeUnit::Nanosecond => column.as_primitive::<TimestampNanosecondType>().value_as_datetime(row),
            };
            match (time, zone) {
                (None, _) => encoder.encode_field(&None::<i64>),
                (Some(time), None) => encoder.encode_field(&time),
                // A zoned timestamp's values are UTC instants.
                (Some(time), Some(_)) => encoder.encode_field(&time.and_utc()),
            }
        }
        _ => encoder.encode_field(&text.value(row).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Schema;

    #[test]
    fn a_batch_becomes_rows_with_nulls_and_text() {
        let schema =
            Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true), Field::new("n", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(Int64Array::from(vec![Some(1), Some(-2)])),
            ],
        )
        .expect("batch");
        let fields = Arc::new(describe(schema.fields(), &Format::UnifiedText).expect("fields"));
        assert_eq!(fields[0].datatype(), &Type::TEXT);
        assert_eq!(fields[1].datatype(), &Type::INT8);
        let rows = rows(&[batch], &fields).expect("rows");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].field_count, 2);
    }

    #[test]
    fn a_column_without_a_binary_form_is_refused_in_binary() {
        let fields = vec![Arc::new(Field::new("d", DataType::Decimal128(10, 2), true))];
        let refused = describe(&fields, &Format::UnifiedBinary).expect_err("refused");
        assert_eq!(refused.code, "pgwire.unsupported");
        assert!(describe(&fields, &Format::UnifiedText).is_ok());
    }
}
