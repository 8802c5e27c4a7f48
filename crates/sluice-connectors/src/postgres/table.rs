//! The table a sink writes: Arrow types as PostgreSQL types, the catalog check of an
//! existing table (every column there, of a compatible kind; a unique index on the
//! key for upserts), `CREATE TABLE` for a missing one, the bookkeeping table of
//! exactly-once epochs, and the statements a writer runs.
//!
//! Values travel as text parameters, each cast to its column's type (without its
//! modifier: `$1::character varying`, so that a value too long for `varchar(3)` is
//! refused by the assignment, never cut by the cast). PostgreSQL parses them as it
//! parses its own input, so a `BIGINT` column of the stream may land in an `integer`
//! column (a value out of range is a row the database rejects, reported with it).

use arrow::datatypes::{DataType, Schema, TimeUnit};
use postgres::Client;
use sluice_types::SluiceError;

use super::options::{TableName, quote_identifier};

/// The table holding, for each sink and writer, the epochs whose transaction committed.
pub const BOOKKEEPING_TABLE: &str = "sluice_sink_epochs";

/// `CREATE TABLE IF NOT EXISTS` of the bookkeeping table.
pub fn bookkeeping_ddl() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {BOOKKEEPING_TABLE} (sink text NOT NULL, slot integer NOT NULL, \
         epoch bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, slot, epoch))"
    )
}

/// A column of the table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    pub name: String,
    /// The type without modifier, for casts (`character varying`, `numeric`).
    pub cast_type: String,
    /// `pg_type.typcategory`: N numeric, S string, B boolean, D date/time, …
    pub category: char,
    pub not_null: bool,
    pub has_default: bool,
}

/// The PostgreSQL type a column of Arrow type `data_type` is created with, or None
/// when the sink cannot write it.
pub fn postgres_type(data_type: &DataType) -> Option<String> {
    let precision = |unit: &TimeUnit| match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond | TimeUnit::Nanosecond => 6,
    };
    Some(match data_type {
        DataType::Boolean => "boolean".to_owned(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".to_owned(),
        DataType::Int32 | DataType::UInt16 => "integer".to_owned(),
        DataType::Int64 | DataType::UInt32 => "bigint".to_owned(),
        DataType::UInt64 => "numeric(20, 0)".to_owned(),
        DataType::Float16 | DataType::Float32 => "real".to_owned(),
        DataType::Float64 => "double precision".to_owned(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("numeric({p}, {s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".to_owned(),
        DataType::Date32 | DataType::Date64 => "date".to_owned(),
        DataType::Timestamp(unit, None) => format!("timestamp({})", precision(unit)),
        DataType::Timestamp(unit, Some(_)) => format!("timestamptz({})", precision(unit)),
        DataType::Time32(_) | DataType::Time64(_) => "time".to_owned(),
        _ => return None,
    })
}

/// The type categories an existing column may have to hold values of `data_type`
/// (any column holds text; strings are parsed by the column's type).
fn accepted_categories(data_type: &DataType) -> Option<&'static [char]> {
    Some(match data_type {
        DataType::Boolean => &['B', 'S'],
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => return None,
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) | DataType::Time32(_) | DataType::Time64(_) => {
            &['D', 'S']
        }
        _ => &['N', 'S'],
    })
}

/// Refuses a stream column the sink cannot write, naming it and the fix.
pub fn check_writable(sink: &str, schema: &Schema) -> Result<(), SluiceError> {
    for field in schema.fields() {
        if postgres_type(field.data_type()).is_none() {
            return Err(SluiceError::user(
                "sink.postgres_type",
                format!(
                    "sink `{sink}`: column {} of type {} cannot be written to PostgreSQL",
                    field.name(),
                    field.data_type()
                ),
            )
            .with_fix(format!("CAST {} to a VARCHAR, number or timestamp in the view", field.name())));
        }
    }
    Ok(())
}

/// `CREATE TABLE IF NOT EXISTS` for rows of `schema`, with a primary key on `key`.
pub fn create_table_ddl(table: &TableName, schema: &Schema, key: &[usize]) -> String {
    let mut parts: Vec<String> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(index, field)| {
            let data_type = postgres_type(field.data_type()).expect("checked by check_writable");
            let not_null = if key.contains(&index) || !field.is_nullable() { " NOT NULL" } else { "" };
            format!("{} {data_type}{not_null}", quote_identifier(field.name()))
        })
        .collect();
    if !key.is_empty() {
        let names: Vec<String> = key.iter().map(|&k| quote_identifier(schema.field(k).name())).collect();
        parts.push(format!("PRIMARY KEY ({})", names.join(", ")));
    }
    format!("CREATE TABLE IF NOT EXISTS {} ({})", table.quoted(), parts.join(", "))
}

/// The table's oid, or None when no such table is visible.
pub fn table_oid(client: &mut Client, table: &TableName) -> Result<Option<u32>, postgres::Error> {
    let row = client.query_one("SELECT to_regclass($1)::oid", &[&table.quoted()])?;
    row.try_get::<_, Option<u32>>(0)
}

/// The columns of table `oid`, in order.
pub fn table_columns(client: &mut Client, oid: u32) -> Result<Vec<TableColumn>, postgres::Error> {
    let rows = client.query(
        "SELECT a.attname::text, format_type(a.atttypid, NULL), t.typcategory::text, a.attnotnull, a.atthasdef \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        &[&oid],
    )?;
    rows.iter()
        .map(|row| {
            let category: String = row.try_get(2)?;
            Ok(TableColumn {
                name: row.try_get(0)?,
                cast_type: row.try_get(1)?,
                category: category.chars().next().unwrap_or('X'),
                not_null: row.try_get(3)?,
                has_default: row.try_get(4)?,
            })
        })
        .collect()
}

/// The key columns of every unique, non-partial index of table `oid` (each sorted).
pub fn unique_keys(client: &mut Client, oid: u32) -> Result<Vec<Vec<String>>, postgres::Error> {
    let rows = client.query(
        "SELECT array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE k.n <= i.indnkeyatts) \
         FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL",
        &[&oid],
    )?;
    rows.iter()
        .map(|row| {
            let mut names: Vec<String> = row.try_get(0)?;
            names.sort();
            Ok(names)
        })
        .collect()
}

/// Checks that `columns` (the table's) can take rows of `schema`; returns the cast type
/// of each stream column, in the stream's order.
pub fn match_columns(
    sink: &str,
    table: &TableName,
    schema: &Schema,
    columns: &[TableColumn],
) -> Result<Vec<String>, SluiceError> {
    let listed = || columns.iter().map(|c| format!("{} {}", c.name, c.cast_type)).collect::<Vec<_>>().join(", ");
    let mut casts = Vec::with_capacity(schema.fields().len());
    let mut problems = Vec::new();
    for field in schema.fields() {
        let Some(column) = columns.iter().find(|c| &c.name == field.name()) else {
            problems.push(format!("column {} (stream type {}) is missing", field.name(), field.data_type()));
            continue;
        };
        if let Some(accepted) = accepted_categories(field.data_type())
            && !accepted.contains(&column.category)
        {
            problems.push(format!(
                "column {} is {} in the table but {} in the stream",
                field.name(),
                column.cast_type,
                field.data_type()
            ));
        }
        casts.push(column.cast_type.clone());
    }
    for column in columns {
        if column.not_null && !column.has_default && schema.field_with_name(&column.name).is_err() {
            problems.push(format!(
                "column {} is NOT NULL without a default, and the stream has no such column",
                column.name
            ));
        }
    }
    if problems.is_empty() {
        return Ok(casts);
    }
    let wanted: Vec<String> = schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect();
    Err(SluiceError::user(
        "sink.postgres_columns",
        format!(
            "sink `{sink}`: table {table} does not match the stream: {} (table: {}; stream: {})",
            problems.join("; "),
            listed(),
            wanted.join(", ")
        ),
    )
    .with_fix(format!(
        "make the view's columns match the table's names and types (rename with AS, CAST), \
         or ALTER TABLE {table}, or write to a new table with create_table = true"
    )))
}

/// The statements of one writer, with the values' casts.
#[derive(Debug, Clone)]
pub struct Statements {
    table: String,
    columns: Vec<String>,
    casts: Vec<String>,
    key: Vec<usize>,
}

impl Statements {
    pub fn new(table: &TableName, schema: &Schema, casts: Vec<String>, key: Vec<usize>) -> Statements {
        let columns = schema.fields().iter().map(|f| quote_identifier(f.name())).collect();
        Statements { table: table.quoted(), columns, casts, key }
    }

    /// `(params …), (…)` for `rows` tuples of the columns `indices`, numbering
    /// parameters from 1.
    fn tuples(&self, indices: &[usize], rows: usize) -> String {
        let mut text = String::new();
        let mut parameter = 1;
        for row in 0..rows {
            text.push_str(if row == 0 { "(" } else { ", (" });
            for (position, &column) in indices.iter().enumerate() {
                if position > 0 {
                    text.push_str(", ");
                }
                text.push_str(&format!("${parameter}::{}", self.casts[column]));
                parameter += 1;
            }
            text.push(')');
        }
        text
    }

    /// An `INSERT` of `rows` rows.
    pub fn insert(&self, rows: usize) -> String {
        let all: Vec<usize> = (0..self.columns.len()).collect();
        format!("INSERT INTO {} ({}) VALUES {}", self.table, self.columns.join(", "), self.tuples(&all, rows))
    }

    /// An `INSERT … ON CONFLICT (key) DO UPDATE` of `rows` rows (distinct keys).
    pub fn upsert(&self, rows: usize) -> String {
        let key: Vec<&str> = self.key.iter().map(|&k| self.columns[k].as_str()).collect();
        let updates: Vec<String> = (0..self.columns.len())
            .filter(|c| !self.key.contains(c))
            .map(|c| format!("{0} = EXCLUDED.{0}", self.columns[c]))
            .collect();
        let action =
            if updates.is_empty() { "NOTHING".to_owned() } else { format!("UPDATE SET {}", updates.join(", ")) };
        format!("{} ON CONFLICT ({}) DO {action}", self.insert(rows), key.join(", "))
    }

    /// A `DELETE` of the rows with `keys` keys.
    pub fn delete(&self, keys: usize) -> String {
        let key: Vec<&str> = self.key.iter().map(|&k| self.columns[k].as_str()).collect();
        format!("DELETE FROM {} WHERE ({}) IN ({})", self.table, key.join(", "), self.tuples(&self.key, keys))
    }

    pub fn column_count(&self) -> usize {
        self.columns.len()
    }

    pub fn key(&self) -> &[usize] {
        &self.key
    }
}
