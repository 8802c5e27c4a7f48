//! Declared schemas (`schema = "auction BIGINT, price BIGINT, ts TIMESTAMP(3)"`) → Arrow.
//!
//! Types follow Flink's SQL names: BOOLEAN, TINYINT, SMALLINT, INT/INTEGER, BIGINT,
//! FLOAT/REAL, DOUBLE, DECIMAL(p, s), VARCHAR/STRING/CHAR/TEXT, DATE, TIMESTAMP(p)
//! (p = 0..3 → milliseconds, 4..6 → microseconds, 7..9 → nanoseconds), with an optional
//! `NOT NULL`. The event-time column is made NOT NULL (a row without one is a bad row).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_types::SluiceError;
use sqlparser::ast::{ColumnOption, DataType as SqlType, ExactNumberInfo, Statement, TimezoneInfo};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

/// Parses a column list; `event_time`, when given, must name one of its columns.
pub fn parse_schema(columns: &str, event_time: Option<&str>) -> Result<SchemaRef, SluiceError> {
    let sql = format!("CREATE TABLE t ({columns})");
    let statements = Parser::parse_sql(&GenericDialect {}, &sql).map_err(|e| {
        SluiceError::user("config.schema", format!("schema `{columns}` is not a SQL column list: {e}"))
            .with_fix("write `name TYPE, name TYPE`, e.g. `auction BIGINT, price BIGINT, date_time TIMESTAMP(3)`")
    })?;
    let only_columns = |what: String| {
        SluiceError::user("config.schema", format!("schema `{columns}` {what}")).with_fix(
            "write only `name TYPE [NOT NULL], …`: constraints, defaults and keys are not part of a source's schema",
        )
    };
    let table = match statements.as_slice() {
        [Statement::CreateTable(table)] => table,
        _ => return Err(only_columns("is not one column list".into())),
    };
    // Anything parsed besides the columns (table constraints, PARTITION BY, options)
    // shows in the statement as written back.
    let listed: Vec<String> = table.columns.iter().map(ToString::to_string).collect();
    if table.to_string() != format!("CREATE TABLE t ({})", listed.join(", ")) {
        return Err(only_columns(format!("has more than a column list: `{table}`")));
    }
    let mut fields: Vec<Field> = Vec::new();
    for column in &table.columns {
        let name = column.name.value.clone();
        if fields.iter().any(|field| *field.name() == name) {
            return Err(SluiceError::user("config.schema", format!("schema column `{name}` is declared twice"))
                .with_fix("give every column its own name"));
        }
        if let Some(other) =
            column.options.iter().find(|o| !matches!(o.option, ColumnOption::NotNull | ColumnOption::Null))
        {
            return Err(only_columns(format!(
                "gives column `{name}` `{}`, which a schema does not take",
                other.option
            )));
        }
        let data_type = arrow_type(&column.data_type).map_err(|e| e.context(format!("schema column `{name}`")))?;
        let not_null = column.options.iter().any(|o| matches!(o.option, ColumnOption::NotNull));
        let is_event_time = event_time == Some(name.as_str());
        fields.push(Field::new(name, data_type, !(not_null || is_event_time)));
    }
    if let Some(event_time) = event_time {
        match fields.iter().find(|f| f.name() == event_time) {
            None => {
                let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
                return Err(SluiceError::user(
                    "config.event_time",
                    format!(
                        "event_time = \"{event_time}\" is not a column of the schema (columns: {})",
                        names.join(", ")
                    ),
                ));
            }
            Some(field) if !matches!(field.data_type(), DataType::Timestamp(..)) => {
                return Err(SluiceError::user(
                    "config.event_time",
                    format!("event_time column `{event_time}` is {}, not a TIMESTAMP", field.data_type()),
                )
                .with_fix(format!("declare it as `{event_time} TIMESTAMP(3)`")));
            }
            Some(_) => {}
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

fn precision_unit(precision: Option<u64>) -> TimeUnit {
    match precision.unwrap_or(3) {
        0..=3 => TimeUnit::Millisecond,
        4..=6 => TimeUnit::Microsecond,
        _ => TimeUnit::Nanosecond,
    }
}

fn arrow_type(sql: &SqlType) -> Result<DataType, SluiceError> {
    Ok(match sql {
        SqlType::Boolean | SqlType::Bool => DataType::Boolean,
        SqlType::TinyInt(_) => DataType::Int8,
        SqlType::SmallInt(_) => DataType::Int16,
        SqlType::Int(_) | SqlType::Integer(_) => DataType::Int32,
        SqlType::BigInt(_) => DataType::Int64,
        SqlType::Float(_) | SqlType::Real => DataType::Float32,
        SqlType::Double(_) | SqlType::DoublePrecision => DataType::Float64,
        SqlType::Decimal(info) | SqlType::Numeric(info) => {
            let (precision, scale) = match *info {
                ExactNumberInfo::PrecisionAndScale(p, s) => (p, s as u64),
                ExactNumberInfo::Precision(p) => (p, 0),
                ExactNumberInfo::None => (38, 18),
            };
            if !(1..=38).contains(&precision) || scale > precision {
                return Err(SluiceError::user(
                    "config.schema_type",
                    format!("{sql} is out of range: the precision is 1 to 38, the scale at most the precision"),
                )
                .with_fix("declare e.g. DECIMAL(18, 2)"));
            }
            DataType::Decimal128(precision as u8, scale as i8)
        }
        SqlType::Varchar(_) | SqlType::Char(_) | SqlType::Text | SqlType::String(_) | SqlType::CharVarying(_) => {
            DataType::Utf8
        }
        SqlType::Date => DataType::Date32,
        SqlType::Timestamp(precision, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            DataType::Timestamp(precision_unit(*precision), None)
        }
        other => {
            return Err(SluiceError::user("config.schema_type", format!("type {other} is not supported"))
                .with_fix("use BOOLEAN, INT, BIGINT, DOUBLE, DECIMAL(p,s), VARCHAR, DATE or TIMESTAMP(3)"));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anything_but_names_types_and_not_null_is_refused() {
        for (schema, says) in [
            ("a BIGINT, b VARCHAR); CREATE TABLE u (z INT", "is not one column list"),
            ("a BIGINT, b VARCHAR, CONSTRAINT c CHECK (a > 0)", "has more than a column list"),
            ("a BIGINT, PRIMARY KEY (a)", "has more than a column list"),
            ("a BIGINT, b VARCHAR) PARTITION BY (a", "has more than a column list"),
            ("a BIGINT PRIMARY KEY, b VARCHAR", "gives column `a` `PRIMARY KEY`"),
            ("a BIGINT, b VARCHAR DEFAULT 5", "gives column `b` `DEFAULT 5`"),
            ("a BIGINT, a VARCHAR", "`a` is declared twice"),
            ("a DECIMAL(1000, 2)", "out of range"),
            ("a DECIMAL(10, 12)", "out of range"),
        ] {
            let error = parse_schema(schema, None).expect_err(schema);
            assert!(error.to_string().contains(says), "{schema}: {error}");
        }
        let schema = parse_schema("a BIGINT NULL, b DECIMAL(38, 38) NOT NULL", None).expect("names, types, NULL");
        assert_eq!(schema.field(1).data_type(), &DataType::Decimal128(38, 38));
    }

    #[test]
    fn flink_types_map_to_arrow() {
        let schema = parse_schema(
            "a BIGINT NOT NULL, b VARCHAR, c DOUBLE, d TIMESTAMP(3), e INT, f DECIMAL(10, 2), g BOOLEAN, h STRING, i TIMESTAMP(6)",
            Some("d"),
        )
        .expect("schema");
        let described: Vec<String> =
            schema.fields().iter().map(|f| format!("{} {} {}", f.name(), f.data_type(), f.is_nullable())).collect();
        assert_eq!(
            described,
            [
                "a Int64 false",
                "b Utf8 true",
                "c Float64 true",
                "d Timestamp(ms) false",
                "e Int32 true",
                "f Decimal128(10, 2) true",
                "g Boolean true",
                "h Utf8 true",
                "i Timestamp(µs) true",
            ]
        );
    }

    #[test]
    fn errors_name_the_column_and_the_fix() {
        let error = parse_schema("a BIGINT, ts VARCHAR", Some("ts")).expect_err("not a timestamp").to_string();
        assert!(error.contains("`ts` is Utf8, not a TIMESTAMP") && error.contains("ts TIMESTAMP(3)"), "{error}");
        let error = parse_schema("a BIGINT", Some("ts")).expect_err("missing").to_string();
        assert!(error.contains("columns: a"), "{error}");
        let error = parse_schema("a BIGINT,, b", None).expect_err("syntax").to_string();
        assert!(error.contains("not a SQL column list"), "{error}");
    }
}
