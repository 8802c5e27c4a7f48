//! The options of the PostgreSQL sink, validated without I/O.
//!
//! `url` is parsed here (a libpq key/value string or a `postgres://` URL), so a typo is
//! reported with its position before anything connects. The URL may hold a password;
//! it is kept in a [`ConnectionUrl`] whose `Debug` never shows it, and every message
//! names the server by host, port, database and user only.

use std::str::FromStr;
use std::time::Duration;

use sluice_config::{ConfigError, Located, OptionsReader, SinkConfig};

use sluice_types::SluiceError;

use super::tls::{TlsSettingError, TlsSettings, split_connection_string};
use crate::connector::{OptionDoc, forbid_item};

/// How rows reach the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Every row is inserted; only append-only streams.
    Append,
    /// Rows are inserted or updated by key (`INSERT … ON CONFLICT … DO UPDATE`);
    /// retractions delete by key.
    Upsert,
}

/// A connection string as written. It may hold a password, so `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionUrl(pub String);

impl std::fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionUrl(<hidden>)")
    }
}

/// `[sink.options]` of a PostgreSQL sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSinkOptions {
    pub url: ConnectionUrl,
    /// The environment variable holding the password, read when the sink connects.
    pub password_env: Option<String>,
    /// `table` or `schema.table`, each part as written (quoted in SQL: case kept).
    pub table: TableName,
    /// None: `append` for an append-only stream, `upsert` for an updating one.
    pub mode: Option<WriteMode>,
    /// The columns rows are upserted by; None: the stream's upsert key.
    pub key: Option<Vec<String>>,
    pub create_table: bool,
    /// The most rows buffered before they are written (and per statement).
    pub batch_rows: usize,
    pub connect_timeout: Duration,
}

/// A table's name, optionally with its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

impl TableName {
    /// Parses `table` or `schema.table` (no empty part, at most one dot).
    pub fn parse(text: &str) -> Option<TableName> {
        let parts: Vec<&str> = text.split('.').collect();
        if parts.iter().any(|p| p.is_empty() || p.contains('\0')) {
            return None;
        }
        match parts.as_slice() {
            [name] => Some(TableName { schema: None, name: (*name).to_owned() }),
            [schema, name] => Some(TableName { schema: Some((*schema).to_owned()), name: (*name).to_owned() }),
            _ => None,
        }
    }

    /// The name quoted for SQL: `"schema"."table"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_identifier(schema), quote_identifier(&self.name)),
            None => quote_identifier(&self.name),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// An identifier quoted for SQL (`"` doubled inside).
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The most rows per batch: a statement holds at most 65,535 parameters.
pub const BATCH_ROWS_MAX: i64 = 10_000;
const BATCH_ROWS_DEFAULT: usize = 1_000;
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

pub(crate) const SINK_OPTIONS: &[OptionDoc] = &[
    OptionDoc {
        key: "url",
        kind: "string",
        default: "required",
        doc: "libpq connection string (host=… port=… dbname=… user=… sslmode=…) or \
              postgres://user@host:port/db?sslmode=…; TLS: sslmode (default prefer) and sslrootcert, see TLS below",
    },
    OptionDoc {
        key: "password_env",
        kind: "string",
        default: "none",
        doc: "the environment variable holding the password (never logged)",
    },
    OptionDoc { key: "table", kind: "string", default: "required", doc: "the table written: name or schema.name" },
    OptionDoc {
        key: "mode",
        kind: "\"append\" or \"upsert\"",
        default: "append for an append-only stream, upsert for an updating one",
        doc: "insert every row, or insert/update/delete by key",
    },
    OptionDoc {
        key: "key",
        kind: "string or array of strings",
        default: "the stream's upsert key",
        doc: "the columns rows are upserted by (a unique index of the table)",
    },
    OptionDoc {
        key: "create_table",
        kind: "boolean",
        default: "false",
        doc: "create the table from the stream's columns when it is missing",
    },
    OptionDoc { key: "batch_rows", kind: "integer 1..=10000", default: "1000", doc: "rows per write statement" },
    OptionDoc {
        key: "connect_timeout",
        kind: "duration",
        default: "10s",
        doc: "the longest one connection attempt takes",
    },
];

const URL_EXAMPLE: &str =
    "e.g. url = \"host=127.0.0.1 port=5432 dbname=app user=sluice\" or url = \"postgres://sluice@127.0.0.1:5432/app\"";

const KEYS: &[&str] = &["url", "password_env", "table", "mode", "key", "create_table", "batch_rows", "connect_timeout"];

/// The validated options of a `connector = "postgres"` sink, or every problem.
pub fn sink_options_of(config: &SinkConfig) -> Result<PostgresSinkOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let found = config.format.as_ref().map(|f| format!("\"{}\"", f.value)).unwrap_or_default();
    let why = "the postgres connector writes rows as table rows";
    forbid_item(config.format.as_ref(), "format", &found, options, why, "remove `format`", &mut errors);
    let mut reader = options.read();
    reader.check_keys(KEYS);
    let (url, password_env) = read_connection(&mut reader, "sink");
    let table = reader.value(
        "table",
        "a table name or schema.name",
        "e.g. table = \"hot_items\" or table = \"public.hot_items\"",
        |value| value.as_str().and_then(TableName::parse),
    );
    let table = reader.required("table", table, "add table = \"<name>\" under [sink.options]");
    let mode = reader.choice("mode", &[("append", WriteMode::Append), ("upsert", WriteMode::Upsert)]);
    let key = crate::connector::key_columns(&mut reader);
    let create_table = reader.boolean("create_table", "set create_table = true or create_table = false");
    let batch_rows = reader.integer::<usize>("batch_rows", 1..=BATCH_ROWS_MAX, "e.g. batch_rows = 1000");
    let connect_timeout = reader.duration("connect_timeout", false, "e.g. connect_timeout = \"10s\"");
    let mode = mode.optional();
    let key = key.optional();
    if let (Some(Some(WriteMode::Append)), Some(Some(_))) = (mode, &key) {
        reader.error(
            "key",
            "`key` applies to mode = \"upsert\" only, and mode = \"append\" is set",
            "remove `key`, or set mode = \"upsert\"",
        );
    }
    let parsed = (|| {
        Some(PostgresSinkOptions {
            url: url?,
            password_env: password_env?,
            table: table?,
            mode: mode?,
            key: key.clone()?,
            create_table: create_table.or(false)?,
            batch_rows: batch_rows.or(BATCH_ROWS_DEFAULT)?,
            connect_timeout: connect_timeout.or(CONNECT_TIMEOUT_DEFAULT)?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// `url` and `password_env` of a PostgreSQL connector's `[SECTION.options]` (`section`:
/// `source` or `sink`): the URL read as any string and parsed after, so that a refused
/// value (which may hold a password) is never echoed. `None`: a problem was reported.
pub(crate) fn read_connection(
    reader: &mut OptionsReader<'_>,
    section: &str,
) -> (Option<ConnectionUrl>, Option<Option<String>>) {
    let url = reader.string("url", "a connection string", URL_EXAMPLE, |s| !s.trim().is_empty());
    let fix = format!("add url = \"postgres://USER@HOST:PORT/DATABASE\" under [{section}.options]");
    let url = reader.required("url", url, &fix);
    let url = url.and_then(|url| match url_parses(&url.value) {
        Ok(true) => Some(ConnectionUrl(url.value)),
        Ok(false) => {
            let message = "`url` must be a libpq connection string or a postgres:// URL naming at least a host \
                           (the value is not shown: it may hold a password)";
            reader.error("url", message, URL_EXAMPLE);
            None
        }
        Err(tls) => {
            let (message, fix) = tls.message();
            reader.error("url", &message, &fix);
            None
        }
    });
    let password_env = reader.string(
        "password_env",
        "the name of an environment variable",
        "e.g. password_env = \"PGPASSWORD\"",
        |s| !s.is_empty() && !s.contains('=') && !s.contains('\0'),
    );
    (url, password_env.optional().map(|name| name.map(|p: Located<String>| p.value)))
}

/// Whether the client parses `text` and it names a host to connect to; its TLS
/// settings' error, if they have one.
fn url_parses(text: &str) -> Result<bool, TlsSettingError> {
    let split = split_connection_string(text)?;
    Ok(postgres::Config::from_str(&split.client_text).is_ok_and(|config| !config.get_hosts().is_empty()))
}

/// `url` parsed by the client, with its TLS settings taken out first and the client's
/// own mode set from them (`verify-*` encrypt as `require` does; the verification is
/// the TLS configuration's). `what` names the connector in errors.
pub fn parse_connection(
    url: &ConnectionUrl,
    code: &'static str,
    what: &str,
) -> Result<(postgres::Config, TlsSettings), SluiceError> {
    let refused = |message: String, fix: String| SluiceError::user(code, format!("{what}: {message}")).with_fix(fix);
    let split = split_connection_string(&url.0).map_err(|e| {
        let (message, fix) = e.message();
        refused(message, fix)
    })?;
    let mut config = postgres::Config::from_str(&split.client_text).map_err(|e| {
        refused(
            format!("`url` is not a connection string: {e}"),
            "e.g. url = \"postgres://USER@HOST:PORT/DATABASE\"".into(),
        )
    })?;
    config.ssl_mode(split.tls.client_mode());
    Ok((config, split.tls))
}
