//! `[source.options]` of `connector = "postgres-cdc"`, validated without I/O.

use std::time::Duration;

use sluice_config::{ConfigError, Located, SourceConfig};

use super::protocol::Endpoint;
use crate::connector::{OptionDoc, forbid_item};
use crate::postgres::options::{ConnectionUrl, TableName, parse_connection, read_connection};

/// Rows of one open transaction held before they are emitted in pieces (see the
/// module's "Transactions" note).
pub const TRANSACTION_ROWS_DEFAULT: usize = 100_000;
const TRANSACTION_ROWS_MAX: i64 = 10_000_000;
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

pub(crate) const OPTIONS: &[OptionDoc] = &[
    OptionDoc {
        key: "url",
        kind: "string",
        default: "required",
        doc: "libpq connection string (host=… port=… dbname=… user=… sslmode=…) or \
              postgres://user@host:port/db?sslmode=…; the user needs the REPLICATION attribute; TLS: sslmode \
              (default prefer) and sslrootcert, see TLS below",
    },
    OptionDoc {
        key: "password_env",
        kind: "string",
        default: "none",
        doc: "the environment variable holding the password (never logged)",
    },
    OptionDoc {
        key: "tables",
        kind: "array of strings",
        default: "required",
        doc: "the tables captured, name or schema.name; each becomes a SQL table named after it",
    },
    OptionDoc {
        key: "publication",
        kind: "string",
        default: "required",
        doc: "the publication holding the tables (CREATE PUBLICATION … FOR TABLE …)",
    },
    OptionDoc {
        key: "slot",
        kind: "string",
        default: "sluice_<source name>",
        doc: "the logical replication slot (pgoutput) the changes are read from",
    },
    OptionDoc {
        key: "create_slot",
        kind: "boolean",
        default: "true",
        doc: "create the slot and read a snapshot of the tables first; false: the slot must exist, and \
              the changes after its confirmed position are read, without a snapshot",
    },
    OptionDoc {
        key: "snapshot_lanes",
        kind: "integer 1..=64",
        default: "1",
        doc: "lanes reading the snapshot in parallel, each a range of every table's blocks (needs exactly-once \
              checkpoints: the stream starts once a checkpoint holds every part)",
    },
    OptionDoc {
        key: "bounded",
        kind: "boolean",
        default: "false",
        doc: "end once the changes committed before the server's WAL position at start are read",
    },
    OptionDoc {
        key: "transaction_rows_max",
        kind: "integer 1..=10000000",
        default: "100000",
        doc: "rows of one transaction held before they are emitted in pieces (exactly once still; a checkpoint \
              may then fall inside the transaction)",
    },
    OptionDoc {
        key: "connect_timeout",
        kind: "duration",
        default: "10s",
        doc: "the longest one connection attempt takes",
    },
];

const KEYS: &[&str] = &[
    "url",
    "password_env",
    "tables",
    "publication",
    "slot",
    "create_slot",
    "snapshot_lanes",
    "bounded",
    "transaction_rows_max",
    "connect_timeout",
];

/// The validated options.
#[derive(Debug, Clone)]
pub struct CdcOptions {
    /// The connection string (may hold a password: never printed).
    pub url: ConnectionUrl,
    pub password_env: Option<String>,
    pub tables: Vec<TableName>,
    pub publication: String,
    pub slot: String,
    pub create_slot: bool,
    pub snapshot_lanes: u32,
    pub bounded: bool,
    pub transaction_rows_max: usize,
    pub connect_timeout: Duration,
}

/// A slot name PostgreSQL accepts: lower-case letters, digits and `_`, at most 63.
fn valid_slot(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The default slot of source `name`: `sluice_` and the name, made a valid slot name.
pub fn default_slot(name: &str) -> String {
    let mut slot: String = format!("sluice_{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect();
    slot.truncate(63);
    slot
}

/// The validated options of a `connector = "postgres-cdc"` source, or every problem.
pub fn options_of(config: &SourceConfig) -> Result<CdcOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let catalog = "the postgres-cdc connector reads the schema and primary key from the catalog";
    let found = config.format.as_ref().map(|f| format!("\"{}\"", f.value)).unwrap_or_default();
    forbid_item(config.format.as_ref(), "format", &found, options, catalog, "remove `format`", &mut errors);
    let found = config.schema.as_ref().map(|s| format!("\"{}\"", s.value)).unwrap_or_default();
    forbid_item(config.schema.as_ref(), "schema", &found, options, catalog, "remove `schema`", &mut errors);
    let found = config.primary_key.as_ref().map(|k| format!("{:?}", k.value)).unwrap_or_default();
    forbid_item(
        config.primary_key.as_ref(),
        "primary_key",
        &found,
        options,
        catalog,
        "remove `primary_key`",
        &mut errors,
    );
    let mut reader = options.read();
    reader.check_keys(KEYS);
    let (url, password_env) = read_connection(&mut reader, "source");
    let tables = reader.value(
        "tables",
        "an array of distinct table names (name or schema.name)",
        "e.g. tables = [\"public.orders\", \"public.customers\"]",
        |value| {
            let names: Vec<TableName> =
                value.as_array()?.iter().map(|v| v.as_str().and_then(TableName::parse)).collect::<Option<_>>()?;
            let mut short: Vec<&str> = names.iter().map(|t| t.name.as_str()).collect();
            short.sort_unstable();
            short.dedup();
            (!names.is_empty() && short.len() == names.len()).then_some(names)
        },
    );
    let tables = reader.required("tables", tables, "add tables = [\"<table>\", …] under [source.options]");
    let publication = reader.string("publication", "a publication's name", "e.g. publication = \"sluice\"", |s| {
        !s.is_empty() && !s.contains('\0')
    });
    let publication = reader.required(
        "publication",
        publication,
        "add publication = \"<name>\" under [source.options] (CREATE PUBLICATION <name> FOR TABLE …)",
    );
    let slot = reader.string(
        "slot",
        "a slot name: lower-case letters, digits and _, at most 63",
        "e.g. slot = \"sluice_orders\"",
        valid_slot,
    );
    let create_slot = reader.boolean("create_slot", "set create_slot = true or create_slot = false");
    let snapshot_lanes = reader.integer::<u32>("snapshot_lanes", 1..=64, "e.g. snapshot_lanes = 4");
    let bounded = reader.boolean("bounded", "set bounded = true or bounded = false");
    let transaction_rows_max =
        reader.integer::<usize>("transaction_rows_max", 1..=TRANSACTION_ROWS_MAX, "e.g. transaction_rows_max = 100000");
    let connect_timeout = reader.duration("connect_timeout", false, "e.g. connect_timeout = \"10s\"");
    let parsed = (|| {
        Some(CdcOptions {
            url: url?,
            password_env: password_env?,
            tables: tables?,
            publication: publication?.value,
            slot: slot.optional()?.map_or_else(|| default_slot(&config.name), |s: Located<String>| s.value),
            create_slot: create_slot.or(true)?,
            snapshot_lanes: snapshot_lanes.or(1)?,
            bounded: bounded.or(false)?,
            transaction_rows_max: transaction_rows_max.or(TRANSACTION_ROWS_DEFAULT)?,
            connect_timeout: connect_timeout.or(CONNECT_TIMEOUT_DEFAULT)?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

impl CdcOptions {
    /// Where to connect, with the password read from `password_env` now.
    pub fn endpoint(&self, source: &str) -> Result<Endpoint, sluice_types::SluiceError> {
        let (config, tls) = parse_connection(&self.url, "source.postgres_cdc.url", &format!("source `{source}`"))?;
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(host)) => host.clone(),
            _ => {
                return Err(sluice_types::SluiceError::user(
                    "source.postgres_cdc.url",
                    format!("source `{source}`: `url` names no TCP host"),
                )
                .with_fix("name a host, e.g. host=127.0.0.1 (a Unix socket is not supported)"));
            }
        };
        let password = match &self.password_env {
            Some(variable) => Some(std::env::var(variable).map_err(|_| {
                sluice_types::SluiceError::user(
                    "source.postgres_cdc.password",
                    format!("source `{source}`: password_env names {variable}, which is not set (or not UTF-8)"),
                )
                .with_fix(format!("export {variable}=… before running, or remove `password_env`"))
            })?),
            None => config.get_password().map(|p| String::from_utf8_lossy(p).into_owned()),
        };
        let user = config.get_user().unwrap_or("postgres").to_owned();
        Ok(Endpoint {
            host,
            port: config.get_ports().first().copied().unwrap_or(5432),
            database: config.get_dbname().map_or_else(|| user.clone(), str::to_owned),
            user,
            password,
            connect_timeout: config.get_connect_timeout().copied().unwrap_or(self.connect_timeout),
            tls,
        })
    }
}
