//! The PostgreSQL wire protocol (version 3.0, through the `pgwire` crate) for ad-hoc
//! queries over a running job's materialized tables: `psql`, psycopg, JDBC and BI tools
//! connect to `--pg-bind ADDR` and run the same read-only SQL as `POST /query`.
//!
//! Layer: a front end, beside the admin API (`sluice-admin`), whose query path it uses
//! ([`sluice_admin::Queries`]: the same admission bound, lease, deadline, cancellation
//! and, in a cluster, the same gathering of every worker's slices); it depends on the
//! engine and the admin crate, and nothing depends on it but the binary.
//!
//! What a connection may send, and where it goes (`route`):
//! - a query over the materialized tables: the job's query path, every table read at one
//!   committed checkpoint, named in a NOTICE (`sluice: read at checkpoint E`);
//! - a query over `pg_catalog` or `information_schema` (or calling `version()`,
//!   `current_schema()`…): a small catalog describing the materialized tables
//!   (`catalog`), enough for `psql`'s `\dt` and `\d TABLE` and a BI tool's discovery;
//! - `BEGIN`/`COMMIT`/`ROLLBACK` (accepted; every query reads one checkpoint anyway),
//!   `SET`/`SHOW`/`RESET`/`DISCARD` (`session`: `statement_timeout` and `sluice.max_rows`
//!   are the query's limits);
//! - anything else is refused as `/query` refuses it.
//!
//! Both the simple and the extended query protocol are served; parameters (`$1`…) are
//! bound as SQL literals of their declared types before the query is checked
//! (`params`). Errors carry SQLSTATE codes (`errors`, the mapping documented there and
//! in docs/operations/pgwire.md), the Sluice code in the detail and the fix as the hint.
//!
//! Access (`auth`): on a loopback address anyone local may connect; elsewhere the admin
//! token is required as the password, through SCRAM-SHA-256 (the token never crosses
//! the network), the same rule as the admin API's. With a certificate and key, TLS is
//! served through rustls (`tls`), and SCRAM is bound to the TLS channel
//! (SCRAM-SHA-256-PLUS) for clients that ask.
//!
//! Bounds: [`CONNECTIONS_MAX`] connections at once (more are closed at once); the
//! startup and authentication within `pgwire`'s startup timeout; messages within
//! `pgwire`'s size limits; queries admitted, executed, timed and sized by the query path
//! (at most [`sluice_admin::MAX_QUERIES`] at once, shared with `/query`); an answer's
//! rows encoded once, bounded by the query's row and byte limits; a catalog query over
//! the catalog's few rows within [`CATALOG_TIMEOUT`]. A client that goes away (its
//! socket closes) ends its connection's work at once: the lease is released and the
//! execution cancelled, as over HTTP (`server`); a cancel request (psql's Ctrl-C) does
//! the same to the query it names (`auth`).

mod auth;
mod catalog;
mod encode;
mod errors;
mod handler;
mod params;
mod route;
mod server;
mod session;
mod tls;

pub use server::{CATALOG_TIMEOUT, CONNECTIONS_MAX, GRACE, PgListener, PgServer};
