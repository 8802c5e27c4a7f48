//! One writer per thread: its own session, pending changes flushed in multi-row
//! statements, and (exactly-once) one transaction per epoch, prepared at the barrier.
//!
//! # Exactly-once (staged)
//!
//! The rows of epoch `e` are written in one transaction of the writer's session. At
//! barrier `e` ([`SinkWriter::pre_commit`]) the writer flushes, inserts
//! `(sink, slot, e)` into the bookkeeping table in that same transaction, and runs
//! `PREPARE TRANSACTION '<gid>'`: the changes are durable on the server but invisible,
//! and the session is free for epoch `e + 1`. The record it returns names the
//! transaction; the sink's `commit(e)` runs `COMMIT PREPARED` from another session
//! once manifest `e` is published. A writer of `e + 1` touching a key that the prepared
//! transaction of `e` holds waits for that commit (at most the session's
//! `lock_timeout`; deletes: see "Deletes of prepared rows").
//!
//! # Deletes of prepared rows
//!
//! A `DELETE` neither sees nor waits for a row that another transaction inserted and has
//! not committed, so a delete in epoch `e + 1` of a key that epoch `e` inserted would
//! miss it while `e` is still prepared, and the row would stay once `e` commits. A
//! staged delete that removed fewer rows than it had keys therefore waits for this
//! sink's transactions prepared at or before the writer's last barrier (any slot:
//! a key may move between threads) and runs again, also when none is left to wait for:
//! one may have committed after the delete's snapshot. Upserts need no such step:
//! `INSERT … ON CONFLICT` waits for a conflicting uncommitted insert by itself. Only
//! earlier barriers are waited for: another slot's transaction of the epoch being
//! written commits only after this writer reaches that barrier.
//!
//! # At-least-once
//!
//! Each flush is its own transaction; a barrier flushes, so a checkpoint's positions
//! never pass a row the server has not committed. After a crash the rows since the last
//! checkpoint are written again (appended twice; upserted to the same end).
//!
//! # Bytes
//!
//! The sink's byte counter ([`SinkWriter::take_bytes`]) counts the row values a writer
//! sends: every parameter's text (the values as [`super::rows`] formats them, NULLs none)
//! of each statement the server executed, deletes' key values included. It leaves out
//! the SQL text, the protocol's framing, the bookkeeping row and the statements that
//! failed (and the search for a rejected row): the bytes of data the table was given,
//! comparable to what a file sink encodes for the same rows. With exactly-once they are
//! counted when written into the epoch's transaction, before it is committed.
//!
//! # A row the server rejects
//!
//! A failed statement rolls back the open transaction (its rows replay from the last
//! checkpoint after a restart). When the server refused the data (SQLSTATE classes 22
//! and 23) the writer finds the row at fault by trying each row of the failed
//! statement alone in a transaction it rolls back, and the error names the table, the
//! row's values, the column and the server's reason. Nothing is dropped silently.

use std::collections::HashMap;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Statement};
use sluice_runtime::SinkWriter;
use sluice_types::{Batch, Epoch, SluiceError};

use super::client::{LOCK_TIMEOUT, Server, db_text};
use super::rows::{Pending, TextRow, parameters, show_row};
use super::table::{BOOKKEEPING_TABLE, Statements};

/// The version of [`PreparedRecord`]'s layout.
const RECORD_VERSION: u8 = 1;

/// A pre-commit record: the prepared transaction of one writer and epoch. Version 1
/// layout, little endian: `u8 version = 1, u64 epoch, u32 slot, u32 id length, the
/// transaction id (UTF-8)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRecord {
    pub epoch: u64,
    pub slot: u32,
    pub gid: String,
}

impl PreparedRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![RECORD_VERSION];
        bytes.extend_from_slice(&self.epoch.to_le_bytes());
        bytes.extend_from_slice(&self.slot.to_le_bytes());
        bytes.extend_from_slice(&u32::try_from(self.gid.len()).expect("short id").to_le_bytes());
        bytes.extend_from_slice(self.gid.as_bytes());
        bytes
    }

    pub fn decode(sink: &str, bytes: &[u8]) -> Result<PreparedRecord, SluiceError> {
        let damaged =
            || SluiceError::internal("sink.record", format!("sink `{sink}`: a damaged PostgreSQL sink record"));
        let (&version, rest) = bytes.split_first().ok_or_else(damaged)?;
        if version != RECORD_VERSION || rest.len() < 16 {
            return Err(damaged());
        }
        let epoch = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let slot = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
        let length = u32::from_le_bytes(rest[12..16].try_into().expect("4 bytes")) as usize;
        let gid = rest.get(16..).filter(|id| id.len() == length).ok_or_else(damaged)?;
        let gid = String::from_utf8(gid.to_vec()).map_err(|_| damaged())?;
        Ok(PreparedRecord { epoch, slot, gid })
    }
}

/// The most parameters one statement may carry (the protocol counts them in 16 bits).
const PARAMETERS_MAX: usize = 65_535;

/// What a statement does to its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Insert,
    Upsert,
    Delete,
}

/// How a staged writer names its transactions.
#[derive(Debug, Clone)]
pub struct Staging {
    /// The bookkeeping table's `sink` value: `pipeline/sink`.
    pub bookkeeping_sink: String,
    pub slot: u32,
    /// The sink's prefix of transaction ids: `sluice/pipeline/sink/`.
    pub gid_prefix: String,
}

/// A writer of a `connector = "postgres"` sink.
pub struct PostgresWriter {
    pub sink: String,
    pub table: String,
    pub server: Server,
    pub client: Client,
    pub statements: Statements,
    pub column_names: Vec<String>,
    pub pending: Pending,
    pub batch_rows: usize,
    /// Some: exactly-once, one prepared transaction per epoch.
    pub staging: Option<Staging>,
    /// Whether a transaction is open on the session.
    pub open: bool,
    /// Prepared statements of full chunks, by kind and rows.
    pub cache: HashMap<(u8, usize), Statement>,
    /// Bytes of values sent since [`SinkWriter::take_bytes`] last asked (see "Bytes").
    pub bytes: u64,
    /// The epoch of the writer's last barrier: transactions of this sink prepared up to
    /// it may hold rows that a delete of the next epoch must see.
    pub barrier: Option<u64>,
}

impl PostgresWriter {
    fn rows_per_statement(&self, kind: Kind) -> usize {
        let width = match kind {
            Kind::Delete => self.statements.key().len(),
            Kind::Insert | Kind::Upsert => self.statements.column_count(),
        };
        self.batch_rows.min(PARAMETERS_MAX / width.max(1)).max(1)
    }

    fn begin(&mut self) -> Result<(), SluiceError> {
        if !self.open {
            self.client
                .batch_execute("BEGIN")
                .map_err(|e| self.server.error(&self.sink, "beginning a transaction", &e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Writes everything pending (in the open transaction; unstaged, committing it).
    fn flush(&mut self) -> Result<(), SluiceError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let upsert = matches!(self.pending, Pending::Upsert { .. });
        let (rows, deletes) = self.pending.take();
        self.begin()?;
        self.apply(Kind::Delete, &deletes)?;
        self.apply(if upsert { Kind::Upsert } else { Kind::Insert }, &rows)?;
        if self.staging.is_none() {
            self.client.batch_execute("COMMIT").map_err(|e| self.server.error(&self.sink, "committing rows", &e))?;
            self.open = false;
        }
        Ok(())
    }

    /// Runs `kind` over `rows` in bounded chunks; on failure, rolls back and reports.
    /// A staged delete that missed some of its keys while earlier epochs are still
    /// prepared waits for them and runs again (see "Deletes of prepared rows").
    fn apply(&mut self, kind: Kind, rows: &[TextRow]) -> Result<(), SluiceError> {
        let chunk_rows = self.rows_per_statement(kind);
        for chunk in rows.chunks(chunk_rows) {
            let full = chunk.len() == chunk_rows;
            let mut result = self.execute(kind, chunk, full);
            if kind == Kind::Delete
                && matches!(result, Ok(deleted) if deleted < chunk.len() as u64)
                && self.wait_for_prepared()?
            {
                result = self.execute(kind, chunk, full);
            }
            if let Err(error) = result {
                return Err(self.failed(kind, chunk, &error));
            }
            self.bytes += value_bytes(chunk);
        }
        Ok(())
    }

    /// Waits until no transaction of this sink prepared at an epoch up to the writer's
    /// last barrier is still prepared; whether a delete that missed keys must run again
    /// (staged, after a barrier: one may have committed since the delete's snapshot,
    /// even if none is left to wait for). Each is waited for through its bookkeeping
    /// row: inserting the same key, in a savepoint rolled back after, waits for the
    /// transaction holding it to end (at most `lock_timeout`).
    fn wait_for_prepared(&mut self) -> Result<bool, SluiceError> {
        let (Some(staging), Some(barrier)) = (self.staging.clone(), self.barrier) else { return Ok(false) };
        let listing = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
                       AND left(gid, length($1)) = $1";
        let gids: Vec<String> = self
            .client
            .query(listing, &[&staging.gid_prefix])
            .and_then(|rows| rows.iter().map(|row| row.try_get(0)).collect())
            .map_err(|e| self.server.error(&self.sink, "listing prepared transactions", &e))?;
        let earlier: Vec<(i32, i64)> = gids
            .iter()
            .filter_map(|gid| {
                let (slot, epoch) = gid.strip_prefix(&staging.gid_prefix)?.split_once('/')?;
                Some((slot.parse().ok()?, epoch.parse().ok()?))
            })
            .filter(|&(_, epoch): &(i32, i64)| u64::try_from(epoch).is_ok_and(|e| e <= barrier))
            .collect();
        let wait =
            format!("INSERT INTO {BOOKKEEPING_TABLE} (sink, slot, epoch) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING");
        for (slot, epoch) in &earlier {
            tracing::debug!(sink = %self.sink, slot, epoch, "postgres sink: a delete waits for a prepared epoch");
            let waited = self.client.batch_execute("SAVEPOINT sluice_wait").and_then(|()| {
                self.client.execute(wait.as_str(), &[&staging.bookkeeping_sink, slot, epoch])?;
                self.client.batch_execute("ROLLBACK TO SAVEPOINT sluice_wait; RELEASE SAVEPOINT sluice_wait")
            });
            if let Err(error) = waited {
                return Err(self.failed(Kind::Delete, &[], &error));
            }
        }
        Ok(true)
    }

    fn execute(&mut self, kind: Kind, rows: &[TextRow], cache: bool) -> Result<u64, postgres::Error> {
        let sql = match kind {
            Kind::Insert => self.statements.insert(rows.len()),
            Kind::Upsert => self.statements.upsert(rows.len()),
            Kind::Delete => self.statements.delete(rows.len()),
        };
        let values = parameters(rows);
        let references: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        if !cache {
            return self.client.execute(sql.as_str(), &references);
        }
        let id = (kind as u8, rows.len());
        let statement = match self.cache.get(&id) {
            Some(statement) => statement.clone(),
            None => {
                let statement = self.client.prepare(&sql)?;
                self.cache.insert(id, statement.clone());
                statement
            }
        };
        self.client.execute(&statement, &references)
    }

    /// The error of a failed statement over `rows`, after rolling the transaction back.
    fn failed(&mut self, kind: Kind, rows: &[TextRow], error: &postgres::Error) -> SluiceError {
        let _ = self.client.batch_execute("ROLLBACK");
        self.open = false;
        let Some(db) = error.as_db_error() else {
            return self.server.error(&self.sink, &format!("writing to table {}", self.table), error);
        };
        let code = db.code().code();
        if db.code() == &SqlState::LOCK_NOT_AVAILABLE {
            return SluiceError::external(
                "sink.postgres_lock_timeout",
                format!(
                    "sink `{}`: a write to table {} waited {}s for rows locked by another transaction, such as \
                     the prepared transaction of an epoch whose checkpoint failed: {}",
                    self.sink,
                    self.table,
                    LOCK_TIMEOUT.as_secs(),
                    db_text(db)
                ),
            )
            .with_fix("check the checkpoint store and pg_prepared_xacts; restart the run from its last checkpoint");
        }
        if !(code.starts_with("22") || code.starts_with("23")) {
            return self.server.error(&self.sink, &format!("writing to table {}", self.table), error);
        }
        let (row, reason) = match self.culprit(kind, rows) {
            Some((row, reason)) => (Some(row), reason),
            None => (None, db_text(db)),
        };
        let names: Vec<&str> = match kind {
            Kind::Delete => self.statements.key().iter().map(|&k| self.column_names[k].as_str()).collect(),
            Kind::Insert | Kind::Upsert => self.column_names.iter().map(String::as_str).collect(),
        };
        let column = db.column().map(|c| format!(" (column {c})")).unwrap_or_default();
        let what = match row {
            Some(row) => format!("the row {}", show_row(&names, row)),
            None => format!("a statement of {} rows", rows.len()),
        };
        SluiceError::user(
            "sink.postgres_rejected",
            format!("sink `{}`: table {} rejected {what}{column}: {reason}", self.sink, self.table),
        )
        .with_fix(
            "change the column's type or constraint so it holds the value, or change the view (CAST, a filter); \
             the rows since the last checkpoint were rolled back and replay when the run restarts",
        )
    }

    /// The first of `rows` the server refuses alone, with its reason (each tried in a
    /// transaction rolled back after it).
    fn culprit<'r>(&mut self, kind: Kind, rows: &'r [TextRow]) -> Option<(&'r TextRow, String)> {
        for row in rows {
            self.client.batch_execute("BEGIN").ok()?;
            let result = self.execute(kind, std::slice::from_ref(row), false);
            self.client.batch_execute("ROLLBACK").ok()?;
            if let Err(error) = result {
                return Some((row, error.as_db_error().map_or_else(|| error.to_string(), db_text)));
            }
        }
        None
    }
}

impl SinkWriter for PostgresWriter {
    fn write(&mut self, batch: &Batch) -> Result<(), SluiceError> {
        sluice_types::failpoint!("sink.write");
        self.pending.add(&self.sink, batch)?;
        if self.pending.len() >= self.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, epoch: Epoch) -> Result<Vec<u8>, SluiceError> {
        self.flush()?;
        self.barrier = Some(epoch.0);
        let Some(staging) = self.staging.clone() else { return Ok(Vec::new()) };
        if !self.open {
            return Ok(Vec::new());
        }
        let gid = format!("{}{}/{}", staging.gid_prefix, staging.slot, epoch.0);
        let record = format!("INSERT INTO {BOOKKEEPING_TABLE} (sink, slot, epoch) VALUES ($1, $2, $3)");
        let slot = i32::try_from(staging.slot).expect("slots fit an integer");
        let epoch_number = i64::try_from(epoch.0).expect("epochs fit a bigint");
        let recorded = self.client.execute(record.as_str(), &[&staging.bookkeeping_sink, &slot, &epoch_number]);
        let prepared =
            recorded.and_then(|_| self.client.batch_execute(&format!("PREPARE TRANSACTION {}", literal(&gid))));
        if let Err(error) = prepared {
            let _ = self.client.batch_execute("ROLLBACK");
            self.open = false;
            return Err(self.server.error(
                &self.sink,
                &format!("preparing transaction {gid} of epoch {}", epoch.0),
                &error,
            ));
        }
        self.open = false;
        tracing::debug!(sink = %self.sink, epoch = epoch.0, "postgres sink: prepared {gid}");
        Ok(PreparedRecord { epoch: epoch.0, slot: staging.slot, gid }.encode())
    }

    /// Unstaged: writes what is pending. Staged: the runtime pre-commits the last rows
    /// before closing, so an open transaction holds rows no epoch owns; it is rolled
    /// back.
    fn close(&mut self) -> Result<(), SluiceError> {
        if self.staging.is_none() {
            return self.flush();
        }
        if self.open {
            self.client.batch_execute("ROLLBACK").map_err(|e| self.server.error(&self.sink, "rolling back", &e))?;
            self.open = false;
        }
        Ok(())
    }

    fn take_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.bytes)
    }
}

/// The bytes of `rows`' values as sent (their text; a NULL has none).
fn value_bytes(rows: &[TextRow]) -> u64 {
    rows.iter().flatten().flatten().map(|value| value.len() as u64).sum()
}

/// A string literal for SQL (`'` doubled inside).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
