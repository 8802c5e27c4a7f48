//! The catalog's functions that clients call to learn about the server and its tables,
//! each answering for this server: one database, one schema of tables, one role, every
//! table visible, no comments, no defaults.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int32Type, Int64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use super::tables::{OWNER, format_type};

/// Which function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// `version()`: the server's version text.
    Version,
    /// `current_schema()`: `public`.
    CurrentSchema,
    /// `current_database()`: the database's name.
    CurrentDatabase,
    /// `pg_get_userbyid(oid)`: the one role.
    UserById,
    /// `pg_table_is_visible(oid)` and the privilege checks: true.
    True,
    /// `obj_description`, `col_description`, `pg_get_expr`, `array_to_string` (of the
    /// catalog's arrays, all NULL), `pg_table_size`…: NULL.
    Null,
    /// `format_type(type oid, modifier)`: the type's display name.
    FormatType,
    /// `pg_encoding_to_char(encoding)`: `UTF8`.
    Encoding,
    /// `current_setting(name)`: the server's fixed settings (NULL for others).
    Setting,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CatalogFunction {
    name: &'static str,
    kind: Kind,
    /// The database's name, for `current_database()`.
    database: String,
    signature: Signature,
}

impl ScalarUDFImpl for CatalogFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            Kind::True => DataType::Boolean,
            _ => DataType::Utf8,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let text = |value: &str| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(value.to_string()))));
        match self.kind {
            Kind::Version => text(&format!("PostgreSQL 15.0 (Sluice {})", env!("CARGO_PKG_VERSION"))),
            Kind::CurrentSchema => text("public"),
            Kind::CurrentDatabase => text(&self.database),
            Kind::UserById => text(OWNER),
            Kind::Encoding => text("UTF8"),
            Kind::True => Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(vec![true; args.number_rows])))),
            Kind::Null => Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
            Kind::FormatType => format_types(&args),
            Kind::Setting => settings(&args),
        }
    }
}

/// `format_type(oid, modifier)` row by row (NULL for a type it does not know).
fn format_types(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let arrays: Vec<ArrayRef> =
        args.args.iter().map(|value| value.to_array(args.number_rows)).collect::<Result<_>>()?;
    let oids = cast(&arrays[0], &DataType::Int64)?;
    let oids = oids.as_primitive::<Int64Type>();
    let modifiers = match arrays.get(1) {
        Some(modifiers) => Some(cast(modifiers, &DataType::Int32)?),
        None => None,
    };
    let names: StringArray = (0..oids.len())
        .map(|row| {
            if oids.is_null(row) {
                return None;
            }
            let modifier = modifiers
                .as_ref()
                .map(|m| m.as_primitive::<Int32Type>())
                .filter(|m| !m.is_null(row))
                .map_or(-1, |m| m.value(row));
            format_type(oids.value(row), modifier)
        })
        .collect();
    Ok(ColumnarValue::Array(Arc::new(names)))
}

/// `current_setting(name)` row by row.
fn settings(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let Some(names) = args.args.first() else {
        return Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)));
    };
    let names = cast(&names.to_array(args.number_rows)?, &DataType::Utf8)?;
    let names = names.as_string::<i32>();
    let values: StringArray = (0..names.len())
        .map(|row| if names.is_null(row) { None } else { crate::session::fixed(names.value(row)) })
        .collect();
    Ok(ColumnarValue::Array(Arc::new(values)))
}

/// Every catalog function, for a session of database `database`.
pub(crate) fn all(database: &str) -> Vec<ScalarUDF> {
    let functions: [(&'static str, Kind); 22] = [
        ("version", Kind::Version),
        ("current_schema", Kind::CurrentSchema),
        ("current_database", Kind::CurrentDatabase),
        ("pg_get_userbyid", Kind::UserById),
        ("pg_table_is_visible", Kind::True),
        ("pg_type_is_visible", Kind::True),
        ("has_table_privilege", Kind::True),
        ("has_schema_privilege", Kind::True),
        ("obj_description", Kind::Null),
        ("col_description", Kind::Null),
        ("shobj_description", Kind::Null),
        ("pg_get_expr", Kind::Null),
        ("pg_get_viewdef", Kind::Null),
        ("pg_get_indexdef", Kind::Null),
        // Every array of the catalog (ACLs, options) is NULL, and no table has a size.
        ("array_to_string", Kind::Null),
        ("pg_size_pretty", Kind::Null),
        ("pg_table_size", Kind::Null),
        ("pg_relation_size", Kind::Null),
        ("pg_total_relation_size", Kind::Null),
        ("format_type", Kind::FormatType),
        ("pg_encoding_to_char", Kind::Encoding),
        ("current_setting", Kind::Setting),
    ];
    functions
        .into_iter()
        .map(|(name, kind)| {
            ScalarUDF::new_from_impl(CatalogFunction {
                name,
                kind,
                database: database.to_string(),
                signature: Signature::one_of(
                    vec![TypeSignature::Nullary, TypeSignature::VariadicAny],
                    Volatility::Stable,
                ),
            })
        })
        .collect()
}
