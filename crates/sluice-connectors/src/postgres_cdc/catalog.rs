//! What the source learns from the server before it runs (at planning, over an ordinary
//! session): `wal_level`, the publication and which tables it holds, and each table's
//! columns, primary key and `REPLICA IDENTITY`, checked so that every change the stream
//! can send is one the source can turn into rows.
//!
//! Refused, each with the fix: `wal_level` other than `logical`; a missing publication,
//! one that does not publish every insert, update and delete or that filters rows or
//! columns (PostgreSQL 15), or a table outside it; a table without a primary key; `REPLICA IDENTITY NOTHING` or
//! `USING INDEX`; `REPLICA IDENTITY DEFAULT` on a table with a column whose values may
//! be TOASTed (stored out of line: `attstorage` other than `p`), because an update that
//! leaves such a value unchanged does not send it and a DEFAULT old image does not hold
//! it either (FULL's old image does, and the source fills it from there); a column
//! type without an Arrow type here.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use postgres::{Client, NoTls};
use sluice_types::SluiceError;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::protocol::Endpoint;
use super::values::arrow_type;
use crate::postgres::options::TableName;
use crate::postgres::tls::{Side, SslMode, TlsFailure, refuses_plain};

/// One captured column as the catalog has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    pub data_type: DataType,
}

/// One captured table.
#[derive(Debug, Clone)]
pub struct CapturedTable {
    /// Its schema (namespace) and name, as the stream's Relation messages name it.
    pub namespace: String,
    pub name: String,
    pub columns: Vec<CatalogColumn>,
    /// The primary key's columns (positions in `columns`).
    pub key: Vec<usize>,
    /// `REPLICA IDENTITY FULL`: updates and deletes carry the whole old row.
    pub full_identity: bool,
}

impl CapturedTable {
    /// `schema.name`, for messages.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The Arrow schema of its rows: the key's columns NOT NULL, the others nullable (a
    /// delete under `REPLICA IDENTITY DEFAULT` carries only the key).
    pub fn schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(&c.name, c.data_type.clone(), !self.key.contains(&i)))
            .collect();
        Arc::new(Schema::new(fields))
    }
}

/// An ordinary session to `endpoint`, with the text forms `values` reads, encrypted as
/// its `sslmode` says.
pub fn connect(source: &str, endpoint: &Endpoint) -> Result<Client, SluiceError> {
    let mut config = postgres::Config::new();
    config
        .host(&endpoint.host)
        .port(endpoint.port)
        .user(&endpoint.user)
        .dbname(&endpoint.database)
        .connect_timeout(endpoint.connect_timeout)
        .application_name("sluice")
        .options("-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=3 -c bytea_output=hex");
    if let Some(password) = &endpoint.password {
        config.password(password);
    }
    let tls_error = |failure: TlsFailure| {
        failure.into_error(Side::Source, &format!("source `{source}`"), &endpoint.describe(), &endpoint.tls)
    };
    let tls = endpoint.tls.client_config().map_err(tls_error)?;
    config.ssl_mode(endpoint.tls.client_mode());
    let result = match tls {
        Some(tls) => config.connect(MakeRustlsConnect::new(tls)),
        None => config.connect(NoTls),
    };
    result.map_err(|error| match (TlsFailure::find(&error, &endpoint.host), error.as_db_error()) {
        (Some(failure), _) => tls_error(failure),
        (None, Some(db)) if endpoint.tls.mode == SslMode::Disable && refuses_plain(db.code().code(), db.message()) => {
            tls_error(TlsFailure::EncryptionRequired { detail: db.message().to_owned() })
        }
        (None, Some(db)) => SluiceError::user(
            "source.postgres_cdc.connect",
            format!(
                "source `{source}`: PostgreSQL at {} refused the connection: {}",
                endpoint.describe(),
                db.message()
            ),
        )
        .with_fix("check the user, database and password (`url`, `password_env`) and pg_hba.conf"),
        (None, None) => SluiceError::external(
            "source.postgres_cdc.unreachable",
            format!("source `{source}`: cannot connect to PostgreSQL at {}: {error}", endpoint.describe()),
        )
        .with_fix("check `url` (host and port) and that the server is running and accepts TCP connections"),
    })
}

/// A failed catalog query, naming the server.
pub fn query_error(source: &str, endpoint: &Endpoint, doing: &str, error: &postgres::Error) -> SluiceError {
    let text = error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_owned());
    SluiceError::external(
        "source.postgres_cdc.query",
        format!("source `{source}`: PostgreSQL at {}: {doing} failed: {text}", endpoint.describe()),
    )
}

/// Checks the server and publication and reads every table of `tables`.
pub fn read_catalog(
    source: &str,
    endpoint: &Endpoint,
    publication: &str,
    tables: &[TableName],
) -> Result<Vec<CapturedTable>, SluiceError> {
    let mut client = connect(source, endpoint)?;
    let fail = |doing: &str, e: &postgres::Error| query_error(source, endpoint, doing, e);
    let wal_level: String =
        client.query_one("SELECT current_setting('wal_level')", &[]).map_err(|e| fail("reading wal_level", &e))?.get(0);
    if wal_level != "logical" {
        return Err(SluiceError::user(
            "source.postgres_cdc.wal_level",
            format!(
                "source `{source}`: PostgreSQL at {} has wal_level = {wal_level}, and logical replication needs \
                 wal_level = logical",
                endpoint.describe()
            ),
        )
        .with_fix(
            "set wal_level = logical (ALTER SYSTEM SET wal_level = logical, or in postgresql.conf) and restart the \
             server; max_replication_slots and max_wal_senders must be at least 1",
        ));
    }
    let published = client
        .query("SELECT pubinsert AND pubupdate AND pubdelete FROM pg_publication WHERE pubname = $1", &[&publication])
        .map_err(|e| fail("reading pg_publication", &e))?;
    let Some(row) = published.first() else {
        return Err(missing_publication(source, endpoint, publication, tables));
    };
    if !row.get::<_, bool>(0) {
        return Err(SluiceError::user(
            "source.postgres_cdc.publish",
            format!(
                "source `{source}`: publication `{publication}` does not publish every insert, update and delete, \
                 so the tables read would drift from the database's"
            ),
        )
        .with_fix(format!("ALTER PUBLICATION {} SET (publish = 'insert, update, delete')", quote(publication))));
    }
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .map_err(|e| fail("reading server_version_num", &e))?
        .get(0);
    if version >= 150_000 {
        check_publication_filters(source, endpoint, &mut client, publication)?;
    }
    tables.iter().map(|table| read_table(source, endpoint, &mut client, publication, table)).collect()
}

/// Refuses a publication that filters rows (`WHERE`) or columns of a table
/// (PostgreSQL 15 and later): the source would read only part of each table.
fn check_publication_filters(
    source: &str,
    endpoint: &Endpoint,
    client: &mut Client,
    publication: &str,
) -> Result<(), SluiceError> {
    let filtered = client
        .query(
            "SELECT c.relname::text, r.prqual IS NOT NULL FROM pg_publication_rel r \
             JOIN pg_publication p ON p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid \
             WHERE p.pubname = $1 AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL)",
            &[&publication],
        )
        .map_err(|e| query_error(source, endpoint, "reading pg_publication_rel", &e))?;
    let Some(row) = filtered.first() else { return Ok(()) };
    let table: String = row.get(0);
    let what = if row.get::<_, bool>(1) { "a row filter (WHERE)" } else { "a column list" };
    Err(SluiceError::user(
        "source.postgres_cdc.publication_filter",
        format!(
            "source `{source}`: publication `{publication}` publishes table {table} with {what}, so only part of it"
        ),
    )
    .with_fix(format!(
        "publish the whole table: ALTER PUBLICATION {} SET TABLE … without WHERE or a column list",
        quote(publication)
    )))
}

/// The error of a publication that does not exist.
pub fn missing_publication(source: &str, endpoint: &Endpoint, publication: &str, tables: &[TableName]) -> SluiceError {
    let names: Vec<String> = tables.iter().map(TableName::quoted).collect();
    SluiceError::user(
        "source.postgres_cdc.publication",
        format!("source `{source}`: PostgreSQL at {} has no publication `{publication}`", endpoint.describe()),
    )
    .with_fix(format!("CREATE PUBLICATION {} FOR TABLE {}", quote(publication), names.join(", ")))
}

fn quote(name: &str) -> String {
    crate::postgres::options::quote_identifier(name)
}

fn read_table(
    source: &str,
    endpoint: &Endpoint,
    client: &mut Client,
    publication: &str,
    table: &TableName,
) -> Result<CapturedTable, SluiceError> {
    let fail = |doing: &str, e: &postgres::Error| query_error(source, endpoint, doing, e);
    let quoted = table.quoted();
    let found = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
            &[&quoted],
        )
        .map_err(|e| fail("reading pg_class", &e))?;
    let Some(row) = found.first() else {
        return Err(SluiceError::user(
            "source.postgres_cdc.table",
            format!("source `{source}`: PostgreSQL at {} has no table {table}", endpoint.describe()),
        )
        .with_fix("name an existing table in `tables` (schema.name, or name on the search_path)"));
    };
    let oid: u32 = row.get(0);
    let namespace: String = row.get(1);
    let name: String = row.get(2);
    let identity: String = row.get(3);
    let qualified = format!("{namespace}.{name}");
    let in_publication = client
        .query(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &namespace, &name],
        )
        .map_err(|e| fail("reading pg_publication_tables", &e))?;
    if in_publication.is_empty() {
        return Err(SluiceError::user(
            "source.postgres_cdc.publication_table",
            format!("source `{source}`: table {qualified} is not in publication `{publication}`"),
        )
        .with_fix(format!("ALTER PUBLICATION {} ADD TABLE {quoted}", quote(publication))));
    }
    let rows = client
        .query(
            "SELECT attname::text, atttypid, atttypmod, attstorage::text FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .map_err(|e| fail("reading pg_attribute", &e))?;
    let mut columns = Vec::with_capacity(rows.len());
    let mut toastable = Vec::new();
    for row in &rows {
        let column_name: String = row.get(0);
        let type_oid: u32 = row.get(1);
        let type_modifier: i32 = row.get(2);
        let storage: String = row.get(3);
        let data_type = arrow_type(type_oid, type_modifier).map_err(|why| {
            SluiceError::user(
                "source.postgres_cdc.column_type",
                format!("source `{source}`: column `{column_name}` of table {qualified}: {why}"),
            )
            .with_fix(
                "capture columns of types boolean, smallint, integer, bigint, real, double precision, \
                 numeric(p, s) with p <= 38, text, varchar, char, uuid, json, jsonb, bytea, date, timestamp or \
                 timestamptz (ALTER TABLE … ALTER COLUMN … TYPE …), or leave the table out of `tables`",
            )
        })?;
        if storage != "p" {
            toastable.push(column_name.clone());
        }
        columns.push(CatalogColumn { name: column_name, type_oid, type_modifier, data_type });
    }
    let key_rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.n",
            &[&oid],
        )
        .map_err(|e| fail("reading the primary key", &e))?;
    let key: Vec<usize> = key_rows
        .iter()
        .filter_map(|row| {
            let column: String = row.get(0);
            columns.iter().position(|c| c.name == column)
        })
        .collect();
    if key.is_empty() {
        return Err(SluiceError::user(
            "source.postgres_cdc.primary_key",
            format!(
                "source `{source}`: table {qualified} has no primary key, which its changes are read by \
                 (the view keeps each key's current row)"
            ),
        )
        .with_fix(format!("ALTER TABLE {quoted} ADD PRIMARY KEY (<columns>)")));
    }
    let full_identity = match identity.as_str() {
        "f" => true,
        "d" if toastable.is_empty() => false,
        "d" => {
            return Err(SluiceError::user(
                "source.postgres_cdc.replica_identity",
                format!(
                    "source `{source}`: table {qualified} has REPLICA IDENTITY DEFAULT and columns whose values may be \
                     stored out of line (TOAST: {}); an update that leaves such a value unchanged sends neither it \
                     nor the old row, so the row could not be written whole",
                    toastable.join(", ")
                ),
            )
            .with_fix(format!("ALTER TABLE {quoted} REPLICA IDENTITY FULL")));
        }
        other => {
            let what = if other == "n" { "NOTHING" } else { "USING INDEX" };
            return Err(SluiceError::user(
                "source.postgres_cdc.replica_identity",
                format!(
                    "source `{source}`: table {qualified} has REPLICA IDENTITY {what}, so its updates and deletes do \
                     not carry the primary key"
                ),
            )
            .with_fix(format!("ALTER TABLE {quoted} REPLICA IDENTITY FULL (or DEFAULT)")));
        }
    };
    Ok(CapturedTable { namespace, name, columns, key, full_identity })
}

/// The tables' columns as a checkpoint records them: a line per table,
/// `schema.name` then `column:type oid:type modifier` each, tab-separated.
pub fn layout(tables: &[CapturedTable]) -> Vec<u8> {
    let lines: Vec<String> = tables
        .iter()
        .map(|table| {
            let mut line = table.qualified();
            for column in &table.columns {
                line.push_str(&format!("\t{}:{}:{}", column.name, column.type_oid, column.type_modifier));
            }
            line
        })
        .collect();
    lines.join("\n").into_bytes()
}

/// Refuses a restart whose tables differ from those its checkpoint recorded.
pub fn check_layout(source: &str, recorded: &[u8], tables: &[CapturedTable]) -> Result<(), SluiceError> {
    let recorded = String::from_utf8_lossy(recorded);
    for table in tables {
        let qualified = table.qualified();
        let Some(line) = recorded.lines().find(|line| line.split('\t').next() == Some(qualified.as_str())) else {
            continue;
        };
        let before: Vec<(&str, &str)> = line.split('\t').skip(1).filter_map(|column| column.split_once(':')).collect();
        let now: Vec<(String, String)> =
            table.columns.iter().map(|c| (c.name.clone(), format!("{}:{}", c.type_oid, c.type_modifier))).collect();
        let changes = column_changes(
            before.iter().map(|(name, kind)| (*name, *kind)),
            now.iter().map(|(name, kind)| (name.as_str(), kind.as_str())),
        );
        if !changes.is_empty() {
            return Err(schema_change(source, &qualified, "since the checkpoint", &changes));
        }
    }
    Ok(())
}

/// What changed between two column lists of `(name, type)`.
pub fn column_changes<'a>(
    before: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    now: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> Vec<String> {
    let mut changes = Vec::new();
    for (name, kind) in now.clone() {
        match before.clone().find(|(known, _)| *known == name) {
            None => changes.push(format!("column `{name}` added")),
            Some((_, known)) if known != kind => changes.push(format!("column `{name}` changed type")),
            Some(_) => {}
        }
    }
    for (name, _) in before.clone() {
        if !now.clone().any(|(column, _)| column == name) {
            changes.push(format!("column `{name}` dropped or renamed"));
        }
    }
    if changes.is_empty() && !before.map(|(name, _)| name).eq(now.map(|(name, _)| name)) {
        changes.push("columns reordered".to_owned());
    }
    changes
}

/// The error of a captured table whose columns changed (`when`: where it was seen).
pub fn schema_change(source: &str, table: &str, when: &str, changes: &[String]) -> SluiceError {
    SluiceError::user(
        "source.postgres_cdc.schema_change",
        format!(
            "source `{source}`: table {table} changed {when}: {}; the run's tables, views and state have the \
             columns read when it started",
            changes.join(", ")
        ),
    )
    .with_fix(
        "revert the change, or start the pipeline afresh with the new columns (a new state directory, and the \
         slot dropped: SELECT pg_drop_replication_slot('<slot>'))",
    )
}
