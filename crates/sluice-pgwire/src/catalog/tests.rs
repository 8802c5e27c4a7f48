//! The catalog answers the queries psql 15 sends for `\dt` and `\d TABLE` (as `psql -E`
//! prints them) and a BI tool's discovery queries.

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::*;

fn tables() -> Vec<(String, SchemaRef)> {
    let counts = Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("n", DataType::Int64, true),
        Field::new("total", DataType::Float64, true),
    ]);
    let other = Schema::new(vec![Field::new("d", DataType::Decimal128(10, 2), true)]);
    vec![("counts".to_string(), Arc::new(counts)), ("amounts".to_string(), Arc::new(other))]
}

/// The answer to `sql`, printed as a table.
fn ask(sql: &str) -> String {
    let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").pop().expect("one");
    let interrupt = Interrupt::new(std::time::Instant::now() + crate::CATALOG_TIMEOUT);
    let answer = answer(statement, &tables(), "db", &interrupt).unwrap_or_else(|e| panic!("{e:?}"));
    let names: Vec<&str> = answer.schema.fields().iter().map(|f| f.name().as_str()).collect();
    let batches: Vec<RecordBatch> = answer.batches;
    format!("{names:?}\n{}", pretty_format_batches(&batches).expect("prints"))
}

fn check(sql: &str, expected: &[&str]) {
    let printed = ask(sql);
    for needle in expected {
        assert!(printed.contains(needle), "{needle:?} not in\n{printed}");
    }
}

#[test]
fn psql_lists_the_tables() {
    check(
        r#"SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
WHERE c.relkind IN ('r','p','')
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2;"#,
        &["| public | amounts | table | sluice |", "| public | counts  | table | sluice |"],
    );
}

#[test]
fn psql_describes_a_table() {
    check(
        r#"SELECT c.oid,
  n.nspname,
  c.relname
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname OPERATOR(pg_catalog.~) '^(counts)$' COLLATE pg_catalog.default
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 2, 3;"#,
        &["| 16385 | public  | counts  |"],
    );
    check(
        r#"SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, c.relhastriggers, c.relrowsecurity, c.relforcerowsecurity, false AS relhasoids, c.relispartition, '', c.reltablespace, CASE WHEN c.reloftype = 0 THEN '' ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, c.relpersistence, c.relreplident, am.amname
FROM pg_catalog.pg_class c
 LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)
LEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid)
WHERE c.oid = '16385';"#,
        &["| r       |", "| heap   |"],
    );
    check(
        r#"SELECT a.attname,
  pg_catalog.format_type(a.atttypid, a.atttypmod),
  (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true)
   FROM pg_catalog.pg_attrdef d
   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef),
  a.attnotnull,
  (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t
   WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> t.typcollation) AS attcollation,
  a.attidentity,
  a.attgenerated
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = '16385' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;"#,
        &["| k       | text ", "| n       | bigint ", "| total   | double precision "],
    );
    check(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a \
         WHERE a.attrelid = 16384",
        &["numeric(10,2)"],
    );
}

#[test]
fn psql_footers_over_empty_tables_have_no_rows() {
    let printed = ask(r#"SELECT pubname
     , NULL
     , NULL
FROM pg_catalog.pg_publication p
     JOIN pg_catalog.pg_publication_namespace pn ON p.oid = pn.pnpubid
     JOIN pg_catalog.pg_class pc ON pc.relnamespace = pn.pnnspid
WHERE pc.oid ='16385' and pg_catalog.pg_relation_is_publishable('16385')
UNION
SELECT pubname
     , pg_get_expr(pr.prqual, c.oid)
     , (CASE WHEN pr.prattrs IS NOT NULL THEN
         (SELECT string_agg(attname, ', ')
           FROM pg_catalog.generate_series(0, pg_catalog.array_upper(pr.prattrs::pg_catalog.int2[], 1)) s,
                pg_catalog.pg_attribute
          WHERE attrelid = pr.prrelid AND attnum = prattrs[s])
        ELSE NULL END) FROM pg_catalog.pg_publication p
     JOIN pg_catalog.pg_publication_rel pr ON p.oid = pr.prpubid
     JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid
WHERE pr.prrelid = '16385'
UNION
SELECT pubname
     , NULL
     , NULL
FROM pg_catalog.pg_publication p
WHERE p.puballtables AND pg_catalog.pg_relation_is_publishable('16385')
ORDER BY 1;"#);
    assert!(printed.starts_with(r#"["pubname", "?column?", "?column?"]"#), "{printed}");
    let printed = ask("SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i \
         WHERE c.oid = i.inhparent AND i.inhrelid = '16385' ORDER BY inhseqno;");
    assert!(printed.starts_with(r#"["oid"]"#), "{printed}");
    let printed = ask(
        "SELECT c.oid::pg_catalog.regclass, c.relkind, inhdetachpending, pg_catalog.pg_get_expr(c.relpartbound, c.oid) \
         FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i WHERE c.oid = i.inhrelid AND i.inhparent = '16385' \
         ORDER BY pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', c.oid::pg_catalog.regclass::pg_catalog.text;",
    );
    assert!(printed.starts_with(r#"["oid", "relkind", "inhdetachpending", "pg_get_expr"]"#), "{printed}");
    // An aggregate over no rows has a row: planned, not short-cut.
    check("SELECT COUNT(*) AS n FROM pg_catalog.pg_index", &["| 0 |"]);
}

#[test]
fn a_bi_tool_discovers_tables_and_columns() {
    check(
        "SELECT table_schema, table_name, table_type FROM information_schema.tables \
         WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY table_name",
        &["| public       | amounts    | BASE TABLE |", "| public       | counts     | BASE TABLE |"],
    );
    check(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
         WHERE table_name = 'counts' ORDER BY ordinal_position",
        &["| k           | text             | NO          |", "| total       | double precision | YES         |"],
    );
    check("SELECT version(), current_database(), current_schema()", &["PostgreSQL 15.0 (Sluice", "| db "]);
    check("SELECT current_user AS who", &["| sluice |"]);
    // SQLAlchemy's table names, and settings asked on connect.
    check(
        "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind = ANY (ARRAY['r'::\"char\", 'p', 'f', 'v', 'm']) ORDER BY 1",
        &["| amounts |", "| counts  |"],
    );
    check(
        "SELECT current_setting('server_version') AS v, current_setting('standard_conforming_strings') AS s",
        &["| 15.0 | on |"],
    );
}

#[test]
fn psql_lists_databases_and_sizes() {
    check(
        r#"SELECT d.datname as "Name",
       pg_catalog.pg_get_userbyid(d.datdba) as "Owner",
       pg_catalog.pg_encoding_to_char(d.encoding) as "Encoding",
       d.datcollate as "Collate",
       d.datctype as "Ctype",
       d.daticulocale as "ICU Locale",
       CASE d.datlocprovider WHEN 'c' THEN 'libc' WHEN 'i' THEN 'icu' END AS "Locale Provider",
       pg_catalog.array_to_string(d.datacl, E'\n') AS "Access privileges"
FROM pg_catalog.pg_database d
ORDER BY 1;"#,
        &["| db   | sluice | UTF8     | C       | C     |            | libc            |"],
    );
    check(
        "SELECT c.relname, pg_catalog.pg_size_pretty(pg_catalog.pg_table_size(c.oid)) as \"Size\", \
         pg_catalog.obj_description(c.oid, 'pg_class') as \"Description\" FROM pg_catalog.pg_class c ORDER BY 1",
        &["| counts  |      |             |"],
    );
}

/// A cross join of the catalog with itself, large enough to run for hours, stops at its
/// deadline (every operator checks the interrupt at each batch).
#[test]
fn a_huge_catalog_query_stops_at_its_deadline() {
    let sql = "SELECT a.typlen + b.typlen + c.typlen + j.typlen AS s FROM pg_catalog.pg_type a, pg_catalog.pg_type b, \
               pg_catalog.pg_type c, \
               pg_catalog.pg_type d, pg_catalog.pg_type e, pg_catalog.pg_type f, pg_catalog.pg_type g, \
               pg_catalog.pg_type h, pg_catalog.pg_type i, pg_catalog.pg_type j ORDER BY s DESC LIMIT 1";
    let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").pop().expect("one");
    let interrupt = Interrupt::new(std::time::Instant::now() + std::time::Duration::from_millis(300));
    let error = answer(statement, &tables(), "db", &interrupt).err().expect("stopped");
    assert_eq!(error.code, "query.timeout", "{error:?}");
}
