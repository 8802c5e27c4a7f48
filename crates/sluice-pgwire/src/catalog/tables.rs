//! The catalog's tables, built from the materialized tables' names and schemas: every
//! materialized table is an ordinary table (`relkind` `r`) of the schema `public`, owned
//! by `sluice`, numbered from [`FIRST_TABLE_OID`] in name order, with its columns and
//! their types. Only the columns clients read are there (psql's, and a BI tool's
//! discovery queries); tables PostgreSQL has and Sluice has nothing for (indexes,
//! constraints, policies…) are empty ([`EMPTY`]).

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use pgwire::api::Type;
use sluice_types::SluiceError;

use crate::encode::pg_type;

/// The oid of `pg_catalog`.
pub(crate) const PG_CATALOG_OID: i64 = 11;
/// The oid of `public`, where the materialized tables are.
pub(crate) const PUBLIC_OID: i64 = 2200;
/// The oid of `information_schema`.
const INFORMATION_SCHEMA_OID: i64 = 13_000;
/// The first materialized table's oid (PostgreSQL's first user oid).
pub(crate) const FIRST_TABLE_OID: i64 = 16_384;
/// The one role's oid and name.
pub(crate) const OWNER_OID: i64 = 10;
pub(crate) const OWNER: &str = "sluice";
/// The default collation's oid (a text column's `attcollation`).
const DEFAULT_COLLATION: i64 = 100;

/// Tables of `pg_catalog` that hold no rows here, with the columns clients read.
pub(crate) const EMPTY: [(&str, &[&str]); 16] = [
    ("pg_attrdef", &["oid", "adrelid", "adnum", "adbin"]),
    ("pg_collation", &["oid", "collname"]),
    ("pg_constraint", &["oid", "conname", "conrelid", "contype", "conkey", "connamespace"]),
    ("pg_description", &["objoid", "classoid", "objsubid", "description"]),
    ("pg_index", &["indexrelid", "indrelid", "indisprimary", "indisunique", "indkey"]),
    ("pg_inherits", &["inhrelid", "inhparent", "inhseqno"]),
    ("pg_policy", &["oid", "polname", "polrelid"]),
    ("pg_proc", &["oid", "proname", "pronamespace"]),
    ("pg_publication", &["oid", "pubname"]),
    ("pg_publication_namespace", &["oid", "pnpubid", "pnnspid"]),
    ("pg_publication_rel", &["oid", "prpubid", "prrelid"]),
    ("pg_rewrite", &["oid", "rulename", "ev_class"]),
    ("pg_statistic_ext", &["oid", "stxrelid", "stxname"]),
    ("pg_trigger", &["oid", "tgname", "tgrelid"]),
    ("pg_views", &["schemaname", "viewname", "viewowner", "definition"]),
    ("pg_matviews", &["schemaname", "matviewname", "matviewowner", "definition"]),
];

/// The types a column of a materialized table may have: oid, name, length, PostgreSQL's
/// display name (`format_type`).
const TYPES: [(Type, i64, &str); 13] = [
    (Type::BOOL, 1, "boolean"),
    (Type::INT2, 2, "smallint"),
    (Type::INT4, 4, "integer"),
    (Type::INT8, 8, "bigint"),
    (Type::FLOAT4, 4, "real"),
    (Type::FLOAT8, 8, "double precision"),
    (Type::TEXT, -1, "text"),
    (Type::VARCHAR, -1, "character varying"),
    (Type::BYTEA, -1, "bytea"),
    (Type::DATE, 4, "date"),
    (Type::TIMESTAMP, 8, "timestamp without time zone"),
    (Type::TIMESTAMPTZ, 8, "timestamp with time zone"),
    (Type::NUMERIC, -1, "numeric"),
];

/// PostgreSQL's display name of type `oid` with modifier `modifier`.
pub(crate) fn format_type(oid: i64, modifier: i32) -> Option<String> {
    let (_, _, name) = TYPES.iter().find(|(t, _, _)| i64::from(t.oid()) == oid)?;
    if oid == i64::from(Type::NUMERIC.oid()) && modifier >= 4 {
        let modifier = modifier - 4;
        return Some(format!("numeric({},{})", modifier >> 16, modifier & 0xffff));
    }
    Some((*name).to_string())
}

/// A column's type modifier (a decimal's precision and scale, else -1).
fn modifier(data_type: &DataType) -> i32 {
    match data_type {
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => ((i32::from(*p) << 16) | i32::from(*s as u8)) + 4,
        _ => -1,
    }
}

/// One catalog table: its name, its schema and its rows.
pub(crate) struct CatalogTable {
    pub(crate) schema: &'static str,
    pub(crate) name: &'static str,
    pub(crate) batch: RecordBatch,
}

fn text(values: Vec<Option<String>>) -> ArrayRef {
    Arc::new(StringArray::from(values))
}

fn texts(values: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

fn longs(values: Vec<i64>) -> ArrayRef {
    Arc::new(Int64Array::from(values))
}

fn ints(values: Vec<i32>) -> ArrayRef {
    Arc::new(Int32Array::from(values))
}

fn flags(value: bool, rows: usize) -> ArrayRef {
    Arc::new(BooleanArray::from(vec![value; rows]))
}

fn repeat_text(value: &str, rows: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![value; rows]))
}

fn repeat_long(value: i64, rows: usize) -> ArrayRef {
    Arc::new(Int64Array::from(vec![value; rows]))
}

fn null_text(rows: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![None::<&str>; rows]))
}

/// A batch of `columns` (name, array), every column nullable.
fn batch(columns: Vec<(&str, ArrayRef)>) -> Result<RecordBatch, SluiceError> {
    let fields: Vec<Field> =
        columns.iter().map(|(name, array)| Field::new(*name, array.data_type().clone(), true)).collect();
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    RecordBatch::try_new(schema, columns.into_iter().map(|(_, array)| array).collect())
        .map_err(|e| SluiceError::internal("pgwire.catalog", format!("a catalog table: {e}")))
}

/// A table of text columns without rows.
pub(crate) fn empty(columns: &[&str]) -> Result<RecordBatch, SluiceError> {
    batch(columns.iter().map(|name| (*name, null_text(0))).collect())
}

/// Every catalog table describing `tables` (sorted by name), in database `database`.
pub(crate) fn build(tables: &[(String, SchemaRef)], database: &str) -> Result<Vec<CatalogTable>, SluiceError> {
    let pg = |name, batch| CatalogTable { schema: "pg_catalog", name, batch };
    let info = |name, batch| CatalogTable { schema: "information_schema", name, batch };
    let mut built = vec![
        pg("pg_namespace", namespaces()?),
        pg("pg_class", classes(tables)?),
        pg("pg_attribute", attributes(tables)?),
        pg("pg_type", types()?),
        pg("pg_am", batch(vec![("oid", longs(vec![2])), ("amname", texts(&["heap"])), ("amtype", texts(&["t"]))])?),
        pg("pg_database", database_rows(database)?),
        pg("pg_roles", roles()?),
        pg("pg_user", roles()?),
        pg("pg_tables", pg_tables(tables)?),
        info("schemata", schemata(database)?),
        info("tables", information_tables(tables, database)?),
        info("columns", information_columns(tables, database)?),
        info("views", empty(&["table_catalog", "table_schema", "table_name", "view_definition"])?),
    ];
    for (name, columns) in EMPTY {
        built.push(pg(name, empty(columns)?));
    }
    Ok(built)
}

fn namespaces() -> Result<RecordBatch, SluiceError> {
    batch(vec![
        ("oid", longs(vec![PG_CATALOG_OID, PUBLIC_OID, INFORMATION_SCHEMA_OID])),
        ("nspname", texts(&["pg_catalog", "public", "information_schema"])),
        ("nspowner", repeat_long(OWNER_OID, 3)),
        ("nspacl", null_text(3)),
    ])
}

fn classes(tables: &[(String, SchemaRef)]) -> Result<RecordBatch, SluiceError> {
    let rows = tables.len();
    let oids = (0..rows).map(|i| FIRST_TABLE_OID + i as i64).collect();
    let columns = tables.iter().map(|(_, schema)| schema.fields().len() as i32).collect();
    batch(vec![
        ("oid", longs(oids)),
        ("relname", text(tables.iter().map(|(name, _)| Some(name.clone())).collect())),
        ("relnamespace", repeat_long(PUBLIC_OID, rows)),
        ("relkind", repeat_text("r", rows)),
        ("relowner", repeat_long(OWNER_OID, rows)),
        ("relam", repeat_long(2, rows)),
        ("relchecks", ints(vec![0; rows])),
        ("relnatts", ints(columns)),
        ("relhasindex", flags(false, rows)),
        ("relhasrules", flags(false, rows)),
        ("relhastriggers", flags(false, rows)),
        ("relhassubclass", flags(false, rows)),
        ("relrowsecurity", flags(false, rows)),
        ("relforcerowsecurity", flags(false, rows)),
        ("relispartition", flags(false, rows)),
        ("relisshared", flags(false, rows)),
        ("reltablespace", repeat_long(0, rows)),
        ("reloftype", repeat_long(0, rows)),
        ("reltoastrelid", repeat_long(0, rows)),
        ("relpersistence", repeat_text("p", rows)),
        ("relreplident", repeat_text("d", rows)),
        ("reloptions", null_text(rows)),
        ("relacl", null_text(rows)),
        ("relpartbound", null_text(rows)),
    ])
}

fn attributes(tables: &[(String, SchemaRef)]) -> Result<RecordBatch, SluiceError> {
    let (mut relids, mut names, mut types, mut modifiers, mut numbers, mut not_null, mut collations, mut lengths) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (index, (_, schema)) in tables.iter().enumerate() {
        for (number, field) in schema.fields().iter().enumerate() {
            let pg = pg_type(field.data_type());
            relids.push(FIRST_TABLE_OID + index as i64);
            names.push(Some(field.name().clone()));
            types.push(i64::from(pg.oid()));
            modifiers.push(modifier(field.data_type()));
            numbers.push(number as i32 + 1);
            not_null.push(!field.is_nullable());
            collations.push(if pg == Type::TEXT { DEFAULT_COLLATION } else { 0 });
            lengths.push(TYPES.iter().find(|(t, _, _)| *t == pg).map_or(-1, |(_, length, _)| *length as i32));
        }
    }
    let rows = relids.len();
    batch(vec![
        ("attrelid", longs(relids)),
        ("attname", text(names)),
        ("atttypid", longs(types)),
        ("atttypmod", ints(modifiers)),
        ("attnum", ints(numbers)),
        ("attlen", ints(lengths)),
        ("attnotnull", Arc::new(BooleanArray::from(not_null))),
        ("attisdropped", flags(false, rows)),
        ("atthasdef", flags(false, rows)),
        ("attislocal", flags(true, rows)),
        ("attinhcount", ints(vec![0; rows])),
        ("attcollation", longs(collations)),
        ("attidentity", repeat_text("", rows)),
        ("attgenerated", repeat_text("", rows)),
    ])
}

fn types() -> Result<RecordBatch, SluiceError> {
    let rows = TYPES.len();
    let collation = |t: &Type| if *t == Type::TEXT || *t == Type::VARCHAR { DEFAULT_COLLATION } else { 0 };
    batch(vec![
        ("oid", longs(TYPES.iter().map(|(t, _, _)| i64::from(t.oid())).collect())),
        ("typname", text(TYPES.iter().map(|(t, _, _)| Some(t.name().to_string())).collect())),
        ("typnamespace", repeat_long(PG_CATALOG_OID, rows)),
        ("typlen", ints(TYPES.iter().map(|(_, length, _)| *length as i32).collect())),
        ("typtype", repeat_text("b", rows)),
        ("typcollation", longs(TYPES.iter().map(|(t, _, _)| collation(t)).collect())),
        ("typbasetype", repeat_long(0, rows)),
        ("typelem", repeat_long(0, rows)),
        ("typrelid", repeat_long(0, rows)),
        ("typnotnull", flags(false, rows)),
    ])
}

fn database_rows(database: &str) -> Result<RecordBatch, SluiceError> {
    batch(vec![
        ("oid", longs(vec![1])),
        ("datname", texts(&[database])),
        ("datdba", longs(vec![OWNER_OID])),
        ("encoding", ints(vec![6])),
        ("datcollate", texts(&["C"])),
        ("datctype", texts(&["C"])),
        ("datistemplate", flags(false, 1)),
        ("datallowconn", flags(true, 1)),
        ("datlocprovider", texts(&["c"])),
        ("daticulocale", null_text(1)),
        ("datacl", null_text(1)),
    ])
}

fn roles() -> Result<RecordBatch, SluiceError> {
    batch(vec![
        ("oid", longs(vec![OWNER_OID])),
        ("rolname", texts(&[OWNER])),
        ("usename", texts(&[OWNER])),
        ("rolsuper", flags(false, 1)),
        ("rolcanlogin", flags(true, 1)),
    ])
}

fn pg_tables(tables: &[(String, SchemaRef)]) -> Result<RecordBatch, SluiceError> {
    let rows = tables.len();
    batch(vec![
        ("schemaname", repeat_text("public", rows)),
        ("tablename", text(tables.iter().map(|(name, _)| Some(name.clone())).collect())),
        ("tableowner", repeat_text(OWNER, rows)),
        ("tablespace", null_text(rows)),
        ("hasindexes", flags(false, rows)),
        ("hasrules", flags(false, rows)),
        ("hastriggers", flags(false, rows)),
        ("rowsecurity", flags(false, rows)),
    ])
}

fn schemata(database: &str) -> Result<RecordBatch, SluiceError> {
    batch(vec![
        ("catalog_name", repeat_text(database, 3)),
        ("schema_name", texts(&["pg_catalog", "public", "information_schema"])),
        ("schema_owner", repeat_text(OWNER, 3)),
    ])
}

fn information_tables(tables: &[(String, SchemaRef)], database: &str) -> Result<RecordBatch, SluiceError> {
    let rows = tables.len();
    batch(vec![
        ("table_catalog", repeat_text(database, rows)),
        ("table_schema", repeat_text("public", rows)),
        ("table_name", text(tables.iter().map(|(name, _)| Some(name.clone())).collect())),
        ("table_type", repeat_text("BASE TABLE", rows)),
        ("is_insertable_into", repeat_text("NO", rows)),
    ])
}

fn information_columns(tables: &[(String, SchemaRef)], database: &str) -> Result<RecordBatch, SluiceError> {
    let (mut table_names, mut names, mut positions, mut nullable, mut data_types, mut udt_names) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (table, schema) in tables {
        for (number, field) in schema.fields().iter().enumerate() {
            let pg = pg_type(field.data_type());
            table_names.push(Some(table.clone()));
            names.push(Some(field.name().clone()));
            positions.push(number as i32 + 1);
            nullable.push(Some(if field.is_nullable() { "YES" } else { "NO" }.to_string()));
            data_types.push(format_type(i64::from(pg.oid()), -1));
            udt_names.push(Some(pg.name().to_string()));
        }
    }
    let rows = names.len();
    batch(vec![
        ("table_catalog", repeat_text(database, rows)),
        ("table_schema", repeat_text("public", rows)),
        ("table_name", text(table_names)),
        ("column_name", text(names)),
        ("ordinal_position", ints(positions)),
        ("column_default", null_text(rows)),
        ("is_nullable", text(nullable)),
        ("data_type", text(data_types)),
        ("udt_name", text(udt_names)),
        ("character_maximum_length", Arc::new(Int32Array::from(vec![None::<i32>; rows]))),
        ("numeric_precision", Arc::new(Int32Array::from(vec![None::<i32>; rows]))),
        ("numeric_scale", Arc::new(Int32Array::from(vec![None::<i32>; rows]))),
    ])
}
