//! The planned PostgreSQL sink: the table's setup (once, on the first writer's open),
//! the writers, and the commit and recovery of prepared transactions.
//!
//! # Transactions and their ids
//!
//! The staged writer of slot `s` prepares epoch `e` as the transaction
//! `sluice/{pipeline}/{sink}/{s}/{e}` and records `("{pipeline}/{sink}", s, e)` in
//! [`BOOKKEEPING_TABLE`] inside it. Hence:
//!
//! - **commit(e)** runs `COMMIT PREPARED` for each record, from the sink's own
//!   session. A transaction no longer prepared is committed iff its bookkeeping row
//!   exists: then the commit is a repetition (recovery repeats the restored epoch's),
//!   otherwise its rows are gone and the commit fails loudly. A lost connection is
//!   retried ([`COMMIT_ATTEMPTS`]): `COMMIT PREPARED` is idempotent through that check.
//! - **discard_after(e)** (recovery) rolls back every prepared transaction of this sink
//!   of an epoch after `e` (all of them on a fresh start), and removes the bookkeeping
//!   rows after `e`, whose epoch numbers the new run will use again. Rows of those epochs
//!   that were committed (recovery fell back past a damaged checkpoint) cannot be taken
//!   out of a table: that is logged as an error.
//!
//! Unlike Kafka's transactions, a prepared transaction outlives the session that
//! prepared it, so a run killed between publishing manifest `e` and committing its
//! transactions loses nothing: the restart commits them.
//!
//! The bookkeeping keeps the last [`RETAINED_EPOCHS`] epochs of each sink.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use postgres::Client;
use postgres::error::SqlState;
use sluice_runtime::{SinkFactory, SinkParallelism, SinkWriter};
use sluice_types::{Epoch, SluiceError};

use super::client::Server;
use super::options::{PostgresSinkOptions, WriteMode};
use super::rows::Pending;
use super::table::{self, BOOKKEEPING_TABLE, Statements};
use super::writer::{PostgresWriter, PreparedRecord, Staging, literal};

/// Attempts of one commit whose connection is lost.
pub const COMMIT_ATTEMPTS: u32 = 3;
/// Bookkeeping rows kept per sink and slot, older ones are removed at commits.
pub const RETAINED_EPOCHS: i64 = 1_000;
/// The longest transaction id PostgreSQL accepts, in bytes (exclusive).
const GID_BYTES_MAX: usize = 200;

/// The sink's own session and what its first open found.
#[derive(Default)]
struct Control {
    client: Option<Client>,
    /// The cast type of each column, once the table was checked (or created).
    casts: Option<Vec<String>>,
    /// Whether two-phase commit was checked and the bookkeeping table created.
    staged_ready: bool,
}

/// A planned `connector = "postgres"` sink.
pub struct PostgresSink {
    name: String,
    options: PostgresSinkOptions,
    server: Server,
    schema: SchemaRef,
    mode: WriteMode,
    /// The key columns (upsert), empty for append.
    key: Vec<usize>,
    /// `pipeline/sink`, the bookkeeping table's `sink`.
    bookkeeping_sink: String,
    /// `sluice/pipeline/sink/`.
    gid_prefix: String,
    control: Mutex<Control>,
    /// Whether the run asks for exactly-once output: only then are epochs prepared.
    exactly_once: bool,
}

impl PostgresSink {
    /// The sink `name` of `pipeline`, for rows of `schema` written with `mode` by `key`
    /// (resolved by the caller). Connects to nothing.
    pub fn new(
        pipeline: &str,
        name: &str,
        options: &PostgresSinkOptions,
        schema: &SchemaRef,
        mode: WriteMode,
        key: Vec<usize>,
    ) -> Result<PostgresSink, SluiceError> {
        table::check_writable(name, schema)?;
        let gid_prefix = format!("sluice/{pipeline}/{name}/");
        // The slot and the epoch follow: at most 10 and 20 digits and a slash.
        if gid_prefix.len() + 31 >= GID_BYTES_MAX {
            return Err(SluiceError::user(
                "sink.postgres_name",
                format!(
                    "sink `{name}` of pipeline `{pipeline}`: the names are too long for PostgreSQL transaction ids"
                ),
            )
            .with_fix("shorten the pipeline's or the sink's name (together under 160 characters)"));
        }
        Ok(PostgresSink {
            name: name.to_owned(),
            server: Server::new(name, options)?,
            options: options.clone(),
            schema: Arc::clone(schema),
            mode,
            key,
            bookkeeping_sink: format!("{pipeline}/{name}"),
            gid_prefix,
            control: Mutex::new(Control::default()),
            exactly_once: true,
        })
    }

    /// Stages (prepares epochs) only when `exactly_once`: an at-least-once run needs no
    /// two-phase commit from the server.
    pub fn with_exactly_once(mut self, exactly_once: bool) -> PostgresSink {
        self.exactly_once = exactly_once;
        self
    }

    fn control(&self) -> Result<MutexGuard<'_, Control>, SluiceError> {
        self.control.lock().map_err(|_| {
            SluiceError::internal(
                "sink.postgres",
                format!("sink `{}`: a thread panicked holding its session", self.name),
            )
        })
    }

    /// Runs `step` on the sink's session, connecting first when needed; a session
    /// whose connection broke is dropped, so the next call reconnects.
    fn with_session<T>(
        &self,
        control: &mut Control,
        step: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<Result<T, postgres::Error>, SluiceError> {
        if control.client.as_ref().is_none_or(Client::is_closed) {
            control.client = Some(self.server.connect(&self.name)?);
        }
        let client = control.client.as_mut().expect("connected above");
        let result = step(client);
        if let Err(error) = &result
            && error.as_db_error().is_none()
        {
            control.client = None;
        }
        Ok(result)
    }

    /// Once per process: checks two-phase commit and creates the bookkeeping table
    /// (staged), checks or creates the table, and returns the columns' casts.
    fn setup(&self, staged: bool) -> Result<Vec<String>, SluiceError> {
        let mut control = self.control()?;
        if staged && !control.staged_ready {
            let prepared = self
                .with_session(&mut control, |client| {
                    let row = client.query_one("SELECT current_setting('max_prepared_transactions')::int", &[])?;
                    let prepared: i32 = row.try_get(0)?;
                    client.batch_execute(&table::bookkeeping_ddl())?;
                    Ok(prepared)
                })?
                .map_err(|e| self.server.error(&self.name, "creating the bookkeeping table", &e))?;
            if prepared == 0 {
                return Err(self.no_two_phase());
            }
            control.staged_ready = true;
        }
        if let Some(casts) = &control.casts {
            return Ok(casts.clone());
        }
        let casts = self.check_table(&mut control)?;
        control.casts = Some(casts.clone());
        Ok(casts)
    }

    fn no_two_phase(&self) -> SluiceError {
        SluiceError::external(
            "sink.postgres_two_phase",
            format!(
                "sink `{}`: PostgreSQL at {} has max_prepared_transactions = 0, and exactly-once output \
                 prepares one transaction per writer and checkpoint (two-phase commit)",
                self.name, self.server.description
            ),
        )
        .with_fix(
            "set max_prepared_transactions to at least twice the sink's threads in postgresql.conf and restart \
             the server, or set guarantee = \"at-least-once\" under [checkpoint]",
        )
    }

    /// Checks the table (creating it when missing and `create_table`); the casts.
    fn check_table(&self, control: &mut Control) -> Result<Vec<String>, SluiceError> {
        let table = &self.options.table;
        let checking = format!("checking table {table}");
        let ddl = table::create_table_ddl(table, &self.schema, &self.key);
        let create = self.options.create_table;
        let found = self
            .with_session(control, |client| {
                let mut oid = table::table_oid(client, table)?;
                if oid.is_none() && create {
                    client.batch_execute(&ddl)?;
                    tracing::info!(sink = %self.name, "postgres sink: created table {table}");
                    oid = table::table_oid(client, table)?;
                }
                let Some(oid) = oid else { return Ok(None) };
                Ok(Some((table::table_columns(client, oid)?, table::unique_keys(client, oid)?)))
            })?
            .map_err(|e| self.server.error(&self.name, &checking, &e))?;
        let Some((columns, unique)) = found else {
            return Err(SluiceError::user(
                "sink.postgres_table_missing",
                format!(
                    "sink `{}`: table {table} does not exist in PostgreSQL at {}",
                    self.name, self.server.description
                ),
            )
            .with_fix(format!("create it ({ddl}), or set create_table = true under [sink.options]")));
        };
        let casts = table::match_columns(&self.name, table, &self.schema, &columns)?;
        if self.mode == WriteMode::Upsert {
            let mut names: Vec<String> = self.key.iter().map(|&k| self.schema.field(k).name().clone()).collect();
            let shown = names.join(", ");
            names.sort();
            if !unique.contains(&names) {
                return Err(SluiceError::user(
                    "sink.postgres_key_index",
                    format!(
                        "sink `{}`: table {table} has no primary key or unique index on ({shown}), which upserts need",
                        self.name
                    ),
                )
                .with_fix(format!(
                    "ALTER TABLE {table} ADD PRIMARY KEY ({shown}), or set `key` to the columns of its primary key"
                )));
            }
        }
        Ok(casts)
    }

    /// Commits one prepared transaction, or recognises it as committed before.
    fn commit_one(&self, control: &mut Control, record: &PreparedRecord) -> Result<(), SluiceError> {
        let commit = format!("COMMIT PREPARED {}", literal(&record.gid));
        let mut attempt = 1;
        loop {
            let result = self.with_session(control, |client| client.batch_execute(&commit));
            let error = match result {
                Ok(Ok(())) => {
                    tracing::info!(sink = %self.name, epoch = record.epoch, "postgres sink: committed {}", record.gid);
                    return self.prune(control, record);
                }
                Ok(Err(error)) => error,
                Err(error) if attempt < COMMIT_ATTEMPTS => {
                    tracing::warn!(sink = %self.name, "postgres sink: {error}; retrying the commit");
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(250));
                    continue;
                }
                Err(error) => return Err(error),
            };
            if error.as_db_error().is_none() && attempt < COMMIT_ATTEMPTS {
                tracing::warn!(sink = %self.name, "postgres sink: lost the connection committing {}; retrying", record.gid);
                attempt += 1;
                continue;
            }
            if error.code() != Some(&SqlState::UNDEFINED_OBJECT) {
                return Err(self.server.error(&self.name, &format!("committing {}", record.gid), &error));
            }
            return self.check_committed(control, record);
        }
    }

    /// A transaction no longer prepared: committed iff its bookkeeping row exists.
    fn check_committed(&self, control: &mut Control, record: &PreparedRecord) -> Result<(), SluiceError> {
        let query = format!("SELECT count(*) FROM {BOOKKEEPING_TABLE} WHERE sink = $1 AND slot = $2 AND epoch = $3");
        let (slot, epoch) = (record.slot as i32, record.epoch as i64);
        let found: i64 = self
            .with_session(control, |client| {
                client.query_one(query.as_str(), &[&self.bookkeeping_sink, &slot, &epoch])?.try_get(0)
            })?
            .map_err(|e| self.server.error(&self.name, "reading the bookkeeping table", &e))?;
        if found > 0 {
            tracing::debug!(sink = %self.name, "postgres sink: {} was committed before", record.gid);
            return Ok(());
        }
        Err(SluiceError::external(
            "sink.postgres_transaction_lost",
            format!(
                "sink `{}`: the prepared transaction {} (epoch {}) is gone from PostgreSQL at {} and was never committed: \
                 someone rolled it back, and its rows are not in table {}",
                self.name, record.gid, record.epoch, self.server.description, self.options.table
            ),
        )
        .with_fix("do not roll back transactions named sluice/… by hand; rerun the pipeline from an empty checkpoint store to rebuild the table"))
    }

    /// Removes bookkeeping rows more than [`RETAINED_EPOCHS`] before `record`'s epoch.
    fn prune(&self, control: &mut Control, record: &PreparedRecord) -> Result<(), SluiceError> {
        let statement = format!("DELETE FROM {BOOKKEEPING_TABLE} WHERE sink = $1 AND slot = $2 AND epoch < $3");
        let (slot, before) = (record.slot as i32, record.epoch as i64 - RETAINED_EPOCHS);
        if before <= 0 {
            return Ok(());
        }
        self.with_session(control, |client| {
            client.execute(statement.as_str(), &[&self.bookkeeping_sink, &slot, &before])
        })?
        .map_err(|e| self.server.error(&self.name, "pruning the bookkeeping table", &e))?;
        Ok(())
    }

    /// The epoch of a prepared transaction of this sink, from its id.
    fn epoch_of(&self, gid: &str) -> Option<u64> {
        let rest = gid.strip_prefix(&self.gid_prefix)?;
        let (_slot, epoch) = rest.split_once('/')?;
        epoch.parse().ok()
    }
}

impl SinkFactory for PostgresSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn parallelism(&self) -> SinkParallelism {
        SinkParallelism::PerThread
    }

    fn open(&self, slot: u32, _slots: u32, staged: bool) -> Result<Box<dyn SinkWriter>, SluiceError> {
        let casts = self.setup(staged)?;
        let key = (self.mode == WriteMode::Upsert).then_some(self.key.as_slice());
        let staging = staged.then(|| Staging {
            bookkeeping_sink: self.bookkeeping_sink.clone(),
            slot,
            gid_prefix: self.gid_prefix.clone(),
        });
        Ok(Box::new(PostgresWriter {
            sink: self.name.clone(),
            table: self.options.table.to_string(),
            server: self.server.clone(),
            client: self.server.connect_writer(&self.name)?,
            statements: Statements::new(&self.options.table, &self.schema, casts, self.key.clone()),
            column_names: self.schema.fields().iter().map(|f| f.name().clone()).collect(),
            pending: Pending::new(&self.schema, key)?,
            batch_rows: self.options.batch_rows,
            staging,
            open: false,
            cache: Default::default(),
            bytes: 0,
            barrier: None,
        }))
    }

    fn describe(&self) -> String {
        let how = match self.mode {
            WriteMode::Append => "append".to_owned(),
            WriteMode::Upsert => {
                let names: Vec<&str> = self.key.iter().map(|&k| self.schema.field(k).name().as_str()).collect();
                format!("upsert by {}", names.join(", "))
            }
        };
        format!("postgres(table={}, {how}, server={})", self.options.table, self.server.description)
    }

    fn exactly_once(&self) -> bool {
        self.exactly_once
    }

    fn commit(&self, _epoch: Epoch, records: &[Vec<u8>]) -> Result<(), SluiceError> {
        let mut control = self.control()?;
        for bytes in records.iter().filter(|r| !r.is_empty()) {
            let record = PreparedRecord::decode(&self.name, bytes)?;
            self.commit_one(&mut control, &record)?;
        }
        Ok(())
    }

    fn discard_after(&self, epoch: Option<Epoch>, _records: &[Vec<u8>]) -> Result<(), SluiceError> {
        let mut control = self.control()?;
        let after = epoch.map_or(0, |e| e.0);
        let gids: Vec<String> = self
            .with_session(&mut control, |client| {
                let rows =
                    client.query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[])?;
                rows.iter().map(|row| row.try_get::<_, String>(0)).collect()
            })?
            .map_err(|e| self.server.error(&self.name, "listing prepared transactions", &e))?;
        for gid in gids.into_iter().filter(|gid| self.epoch_of(gid).is_some_and(|e| e > after)) {
            let rollback = format!("ROLLBACK PREPARED {}", literal(&gid));
            match self.with_session(&mut control, |client| client.batch_execute(&rollback))? {
                Ok(()) => {
                    tracing::info!(sink = %self.name, "postgres sink: rolled back {gid} (after the restored epoch)")
                }
                Err(error) if error.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                Err(error) => return Err(self.server.error(&self.name, &format!("rolling back {gid}"), &error)),
            }
        }
        self.forget_after(&mut control, epoch)
    }
}

impl PostgresSink {
    /// Removes the bookkeeping rows of epochs after `epoch` (all on a fresh start).
    fn forget_after(&self, control: &mut Control, epoch: Option<Epoch>) -> Result<(), SluiceError> {
        let after = epoch.map_or(0, |e| e.0) as i64;
        let statement = format!("DELETE FROM {BOOKKEEPING_TABLE} WHERE sink = $1 AND epoch > $2");
        let exists = format!("SELECT to_regclass('{BOOKKEEPING_TABLE}') IS NOT NULL");
        let removed = self
            .with_session(control, |client| {
                if !client.query_one(exists.as_str(), &[])?.try_get::<_, bool>(0)? {
                    return Ok(0);
                }
                client.execute(statement.as_str(), &[&self.bookkeeping_sink, &after])
            })?
            .map_err(|e| self.server.error(&self.name, "cleaning the bookkeeping table", &e))?;
        if removed > 0 && epoch.is_some() {
            tracing::error!(
                sink = %self.name,
                "postgres sink `{}`: {removed} writer epochs after the restored epoch {after} were committed to table {} \
                 (recovery fell back past a damaged checkpoint); their changes stay in the table and the run writes \
                 those epochs again",
                self.name, self.options.table
            );
        }
        Ok(())
    }
}
