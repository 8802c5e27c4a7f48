//! Ad-hoc SQL over the materialized tables ([`crate::materialize`]), all read at one
//! committed checkpoint, run by DataFusion.
//!
//! Steps: [`prepare`] parses the one statement (a query; nothing that writes, creates or
//! sets anything), finds the tables it names (each must be materialized: the errors list
//! what exists) and takes a lease on the newest epoch committed on every table (waiting
//! for the first checkpoint, within the query's timeout); [`PreparedQuery::run`] pins
//! every named table at that epoch (`Materialized::pin`: the slices' parts shared, not
//! copied), releases the lease, plans the query with DataFusion (identifiers
//! case-sensitive, as in Flink; Flink's scalar functions registered) over a streaming
//! table per named table ([`TableScan`]: the slices merged batch by batch as DataFusion
//! pulls them), and collects the answer. The lease ends when the prepared query or its
//! lease is dropped, or at the deadline; the pins when the execution ends.
//!
//! Bounds: rows per answer ([`QueryLimits::max_rows`], at most [`MAX_ROWS_LIMIT`]), time
//! ([`QueryLimits::timeout`], at most [`TIMEOUT_LIMIT`]: the lease's lifetime, and the
//! execution stops at its deadline, checked around every batch of every operator:
//! [`interrupt`]; [`PreparedQuery::interrupt`] also stops it from elsewhere), the CPU
//! (one thread per query, at most [`executions::EXECUTIONS_MAX`] executing at once in the
//! process, the others waiting their turn within their deadline: [`executions`]),
//! DataFusion's working memory ([`WORKING_MEMORY`]: its operators' state), the answer's
//! bytes ([`ANSWER_BYTES_LIMIT`]) and nesting (a view's limit, `sluice_sql::check_depth`;
//! the admin API runs queries on threads with the planner's stack). The tables read are
//! not copied: a scan holds one batch of decoded rows ([`SCAN_BATCH_ROWS`]) at a time, so
//! a query's memory follows DataFusion's pool and the answer's limits, not the tables'
//! sizes (a LIMIT stops the scan early). Not bounded: one expression building a huge
//! value (`REPEAT(s, 100000000)`) allocates it before any check sees it.
//!
//! In a cluster every worker holds a slice of each table (the rows its threads keep), and
//! the worker that receives the query gathers the others' through a [`Gather`] (the admin
//! API implements it over HTTP, each worker announcing its admin address in the
//! membership). Consistency: the receiver's lease is on its newest committed epoch
//! `r_0`; it takes a lease on every other worker's newest, `r_i`, and every slice is read
//! at `e = max(r_i)`: no worker folds past its own lease, so each still has `e`
//! (waiting, within the deadline, for those that have not committed it yet; see
//! `Materialized::pin`). Every remote lease is released when the tables are read, or
//! on any failure. The other workers' slices are collected (each arrives as one answer)
//! before the execution, then streamed after this worker's own; bounds: rows gathered
//! ([`GATHER_ROWS_LIMIT`]), bytes received ([`GATHER_BYTES_LIMIT`]) and the query's
//! deadline; a worker that cannot be reached fails the query with a typed error naming
//! it, never an answer from some of the slices.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use sluice_types::{Batch, SluiceError};

use crate::materialize::{Lease, Materialized, Table, TableAt};

pub mod executions;
pub mod interrupt;

pub use executions::{Counts, Executions};
pub use interrupt::{Interrupt, Stop};

/// Rows an answer may have unless the request says otherwise.
pub const MAX_ROWS_DEFAULT: usize = 10_000;
/// The most rows a request may ask for.
pub const MAX_ROWS_LIMIT: usize = 1_000_000;
/// How long a query may take (waiting for the first checkpoint included) unless the
/// request says otherwise; also its lease's lifetime.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The longest timeout a request may ask for.
pub const TIMEOUT_LIMIT: Duration = Duration::from_secs(300);
/// DataFusion's memory pool per query (sorts, joins, aggregations).
pub const WORKING_MEMORY: usize = 512 << 20;

/// The most bytes (Arrow buffers) an answer's rows may take before it is encoded.
pub const ANSWER_BYTES_LIMIT: usize = 256 << 20;
/// The most rows a cluster's query gathers from the other workers' slices together (this
/// worker's own are streamed, not gathered).
pub const GATHER_ROWS_LIMIT: usize = 10_000_000;
/// The most bytes a cluster's query receives from the other workers together.
pub const GATHER_BYTES_LIMIT: usize = 512 << 20;
/// Rows per batch a table's scan decodes at a time (DataFusion's batch size).
pub const SCAN_BATCH_ROWS: usize = 8192;

/// Another worker of the cluster, whose slices a query gathers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: u32,
    /// Its admin API's address (`host:port`), empty when it runs without one.
    pub admin_addr: String,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.admin_addr.is_empty() {
            write!(f, "worker {} (no admin API)", self.id)
        } else {
            write!(f, "worker {} (admin API at {})", self.id, self.admin_addr)
        }
    }
}

/// A lease another worker holds for this query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteLease {
    /// The other worker's name for it.
    pub id: u64,
    /// The newest epoch committed there when it was taken.
    pub epoch: u64,
}

/// Reaches the other workers' slices (see the module docs). Every call ends by
/// `deadline`; errors name the worker.
pub trait Gather {
    /// Takes a lease on `peer`'s newest committed epoch.
    fn lease(&self, peer: &Peer, deadline: Instant) -> Result<RemoteLease, SluiceError>;
    /// `peer`'s slice of `table` at `epoch` (at or after the lease's), at most
    /// `max_bytes` received.
    fn slice(
        &self,
        peer: &Peer,
        lease: RemoteLease,
        table: &Table,
        epoch: u64,
        deadline: Instant,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, SluiceError>;
    /// Ends the lease (best effort: it also ends at its deadline).
    fn release(&self, peer: &Peer, lease: RemoteLease);
}

/// Remote leases, released when dropped.
struct Held<'a> {
    gather: &'a dyn Gather,
    leases: Vec<(&'a Peer, RemoteLease)>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for (peer, lease) in &self.leases {
            self.gather.release(peer, *lease);
        }
    }
}

/// What a query may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    pub max_rows: usize,
    pub timeout: Duration,
}

impl Default for QueryLimits {
    fn default() -> QueryLimits {
        QueryLimits { max_rows: MAX_ROWS_DEFAULT, timeout: TIMEOUT_DEFAULT }
    }
}

impl QueryLimits {
    /// The limits asked for, refused beyond [`MAX_ROWS_LIMIT`] and [`TIMEOUT_LIMIT`].
    pub fn new(max_rows: Option<u64>, timeout_ms: Option<u64>) -> Result<QueryLimits, SluiceError> {
        let max_rows = match max_rows {
            None => MAX_ROWS_DEFAULT,
            Some(rows) if rows >= 1 && rows <= MAX_ROWS_LIMIT as u64 => rows as usize,
            Some(rows) => {
                return Err(SluiceError::user(
                    "query.limits",
                    format!("max_rows = {rows} is not in 1..={MAX_ROWS_LIMIT}"),
                )
                .with_fix(format!("ask for at most {MAX_ROWS_LIMIT} rows; aggregate or filter in SQL for fewer")));
            }
        };
        let timeout = match timeout_ms {
            None => TIMEOUT_DEFAULT,
            Some(ms) if ms >= 1 && ms <= TIMEOUT_LIMIT.as_millis() as u64 => Duration::from_millis(ms),
            Some(ms) => {
                return Err(SluiceError::user(
                    "query.limits",
                    format!("timeout_ms = {ms} is not in 1..={}", TIMEOUT_LIMIT.as_millis()),
                )
                .with_fix(format!("give a timeout of at most {} s", TIMEOUT_LIMIT.as_secs())));
            }
        };
        Ok(QueryLimits { max_rows, timeout })
    }
}

/// How an answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryFormat {
    /// One JSON object per row (as sinks write them).
    JsonLines,
    /// CSV with a header.
    Csv,
    /// An Arrow IPC stream.
    ArrowIpc,
}

impl QueryFormat {
    /// The HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            QueryFormat::JsonLines => "application/x-ndjson",
            QueryFormat::Csv => "text/csv; charset=utf-8",
            QueryFormat::ArrowIpc => "application/vnd.apache.arrow.stream",
        }
    }
}

/// A query's rows, all read at one checkpoint.
#[derive(Debug)]
pub struct QueryAnswer {
    /// The checkpoint every table was read at (None when the query reads no table).
    pub epoch: Option<u64>,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl QueryAnswer {
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The rows in `format`.
    pub fn encode(&self, format: QueryFormat) -> Result<Vec<u8>, SluiceError> {
        let mut out = Vec::new();
        match format {
            QueryFormat::ArrowIpc => {
                let failed = |e: arrow::error::ArrowError| SluiceError::internal("query.encode", e.to_string());
                let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, &self.schema).map_err(failed)?;
                for batch in &self.batches {
                    writer.write(batch).map_err(failed)?;
                }
                writer.finish().map_err(failed)?;
            }
            QueryFormat::JsonLines | QueryFormat::Csv => {
                let text = match format {
                    QueryFormat::Csv => sluice_formats::OutputFormat::Csv { header: true },
                    _ => sluice_formats::OutputFormat::JsonLines,
                };
                let mut encoder = sluice_formats::Encoder::new(text, Arc::clone(&self.schema), false);
                if self.batches.is_empty() && format == QueryFormat::Csv {
                    // The header alone.
                    let empty = RecordBatch::new_empty(Arc::clone(&self.schema));
                    encoder.encode(&Batch::inserts(empty), &mut out).map_err(unencodable)?;
                }
                for batch in &self.batches {
                    encoder.encode(&Batch::inserts(batch.clone()), &mut out).map_err(unencodable)?;
                }
            }
        }
        Ok(out)
    }
}

fn unencodable(error: SluiceError) -> SluiceError {
    SluiceError::user("query.encode", format!("the answer cannot be written as text: {}", error.message))
        .with_fix("ask for format \"arrow\", or CAST the column to VARCHAR")
}

/// A query checked and holding its lease, ready to run.
pub struct PreparedQuery {
    registry: Arc<Materialized>,
    /// None for a query that reads no table.
    lease: Option<Arc<Lease>>,
    statement: Statement,
    tables: Vec<Arc<Table>>,
    limits: QueryLimits,
    /// Its deadline, and its cancellation.
    interrupt: Interrupt,
    /// Where it waits for its turn to execute.
    executions: Arc<Executions>,
    context: SessionContext,
    /// The other workers of a cluster, whose slices are gathered.
    peers: Vec<Peer>,
}

impl std::fmt::Debug for PreparedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedQuery").field("lease", &self.lease).finish_non_exhaustive()
    }
}

/// Checks `sql` against the materialized tables of `registry` and takes its lease.
pub fn prepare(registry: &Arc<Materialized>, sql: &str, limits: QueryLimits) -> Result<PreparedQuery, SluiceError> {
    let deadline = Instant::now() + limits.timeout;
    let context = session()?;
    let statement = parse_query(registry, sql)?;
    let tables = named_tables(registry, &context, &statement)?;
    let wait = deadline.saturating_duration_since(Instant::now());
    // A query that reads no table (`SELECT 1`) needs no epoch.
    let wait = if tables.is_empty() { Duration::ZERO } else { wait };
    let lease = registry.lease(wait, limits.timeout);
    let lease =
        match lease {
            None if tables.is_empty() => None,
            lease => {
                Some(lease.ok_or_else(|| {
                    SluiceError::external(
            "query.no_checkpoint",
            format!("no checkpoint was committed within {} ms: materialized tables are read at one", wait.as_millis()),
        )
        .with_fix("wait for the job's first checkpoint (GET /status: last_committed_epoch), or give a longer timeout")
                })?)
            }
        };
    Ok(PreparedQuery {
        registry: Arc::clone(registry),
        lease,
        statement,
        tables,
        limits,
        interrupt: Interrupt::new(deadline),
        executions: Arc::clone(Executions::shared()),
        context,
        peers: Vec::new(),
    })
}

/// The materialized tables `statement` names, each once; an error naming the table
/// when one is not materialized or does not exist.
fn named_tables(
    registry: &Materialized,
    context: &SessionContext,
    statement: &Statement,
) -> Result<Vec<Arc<Table>>, SluiceError> {
    let references =
        context.state().resolve_table_references(statement).map_err(|e| bad_sql(registry, df_message(&e)))?;
    let mut tables: Vec<Arc<Table>> = Vec::new();
    for reference in references {
        let name = reference.table();
        let known =
            (reference.schema().is_none() && reference.catalog().is_none()).then(|| registry.table(name)).flatten();
        match known {
            Some(table) if !tables.iter().any(|t| t.name == table.name) => tables.push(Arc::clone(table)),
            Some(_) => {}
            None if registry.others().iter().any(|other| other == name) => {
                return Err(SluiceError::user(
                    "query.not_materialized",
                    format!("table `{name}` is not materialized; {}", listing(registry)),
                )
                .with_fix(format!(
                    "add materialized = true to the [[view]] (or [[source]]) that defines `{name}`, and run the \
                     pipeline again"
                )));
            }
            None => {
                return Err(SluiceError::user(
                    "query.unknown_table",
                    format!("no table `{reference}`; {}", listing(registry)),
                )
                .with_fix("name a materialized table (names are case-sensitive)"));
            }
        }
    }
    Ok(tables)
}

/// Checks that `sql` is one query (nothing that writes, creates or sets anything) within
/// the nesting limit, and parses it.
fn parse_query(registry: &Materialized, sql: &str) -> Result<Statement, SluiceError> {
    sluice_sql::check_depth(sql)?;
    let mut statements =
        DFParser::parse_sql_with_dialect(sql, &GenericDialect {}).map_err(|e| bad_sql(registry, e.to_string()))?;
    if statements.len() != 1 {
        return Err(bad_sql(registry, format!("{} statements; one query is expected", statements.len())));
    }
    let statement = statements.pop_front().expect("one statement");
    let is_query = matches!(&statement, Statement::Statement(inner) if matches!(**inner, datafusion::sql::sqlparser::ast::Statement::Query(_)));
    if !is_query {
        return Err(SluiceError::user("query.statement", format!("only queries are answered, not `{statement}`"))
            .with_fix("write a SELECT (or WITH … SELECT) over the materialized tables"));
    }
    Ok(statement)
}

/// What a query would answer, without reading anything: its columns, and the types of
/// its parameters (`$1`, `$2`…; None where the query does not fix one). Planned as
/// [`prepare`] and [`PreparedQuery::run`] plan it, over empty tables of the same
/// schemas: no lease, no checkpoint needed (a client's `Describe`).
pub fn describe(
    registry: &Arc<Materialized>,
    sql: &str,
) -> Result<(SchemaRef, Vec<Option<arrow::datatypes::DataType>>), SluiceError> {
    let statement = parse_query(registry, sql)?;
    let context = session()?;
    named_tables(registry, &context, &statement)?;
    for name in registry.names() {
        let Some(table) = registry.table(name) else { continue };
        let empty = MemTable::try_new(Arc::clone(&table.schema), vec![Vec::new()])
            .map_err(|e| SluiceError::internal("query.table", df_message(&e)))?;
        context
            .register_table(table.name.as_str(), Arc::new(empty))
            .map_err(|e| SluiceError::internal("query.table", df_message(&e)))?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| SluiceError::external("query.runtime", format!("cannot start the query's runtime: {e}")))?;
    let plan = runtime.block_on(context.state().statement_to_plan(statement)).map_err(|e| query_error(&e))?;
    let parameters = plan.get_parameter_types().map_err(|e| query_error(&e))?;
    let plan = sluice_sql::unique_names(plan)?;
    let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
    // `$1` is parameter 1: the list in order, a gap where a number is unused.
    let count = parameters.keys().filter_map(|id| id.strip_prefix('$')?.parse::<usize>().ok()).max().unwrap_or(0);
    let types = (1..=count).map(|n| parameters.get(&format!("${n}")).cloned().flatten()).collect();
    Ok((schema, types))
}

impl PreparedQuery {
    /// The checkpoint the query reads (None when it reads no table).
    pub fn epoch(&self) -> Option<u64> {
        self.lease.as_ref().map(|lease| lease.epoch)
    }

    /// Its lease, to release it from elsewhere (a client that went away).
    pub fn lease(&self) -> Option<Arc<Lease>> {
        self.lease.clone()
    }

    /// Its deadline and cancellation: [`Interrupt::cancel`] stops the query from another
    /// thread (the admin API's, when its client goes away or it answered 504).
    pub fn interrupt(&self) -> Interrupt {
        self.interrupt.clone()
    }

    /// The same query, gathering the slices of `peers` too (a cluster's other workers).
    pub fn with_peers(self, peers: Vec<Peer>) -> PreparedQuery {
        PreparedQuery { peers, ..self }
    }

    /// The same query, taking its turn to execute at `executions` rather than at the
    /// process's ([`Executions::shared`]).
    pub fn with_executions(self, executions: Arc<Executions>) -> PreparedQuery {
        PreparedQuery { executions, ..self }
    }

    /// Reads the tables at the lease's epoch and runs the query (on one worker).
    pub fn run(self) -> Result<QueryAnswer, SluiceError> {
        self.run_gathering(None)
    }

    /// Reads the tables, every worker's slices through `gather` in a cluster, and runs
    /// the query.
    pub fn run_gathering(self, gather: Option<&dyn Gather>) -> Result<QueryAnswer, SluiceError> {
        sluice_types::failpoint!("query.leased");
        let limit = self.limits.timeout;
        // Held until the execution's runtime is dropped, below.
        let turn = self.executions.enter(&self.interrupt).map_err(|stop| executions::stop_error(stop, limit))?;
        let epoch = match &self.lease {
            Some(lease) => Some(self.read_tables(lease, gather)?),
            None => None,
        };
        // Every table is pinned at the epoch: the lease is no longer needed.
        if let Some(lease) = &self.lease {
            lease.release();
        }
        let max_rows = self.limits.max_rows;
        let (schema, batches) = execute(self.context, self.statement, max_rows, &self.interrupt, limit)?;
        drop(turn);
        let answer = QueryAnswer { epoch, schema, batches };
        if answer.rows() > max_rows {
            return Err(SluiceError::user("query.too_many_rows", format!("the answer has more than {max_rows} rows"))
                .with_fix(format!(
                    "add a LIMIT or a narrower WHERE, or ask for more rows (max_rows, at most {MAX_ROWS_LIMIT})"
                )));
        }
        Ok(answer)
    }
}

/// Plans and executes `statement` on a runtime of its own (one thread: this one), at
/// most `max_rows + 1` rows, until `interrupt` fires (`timeout` is for its message). The
/// runtime, and every task DataFusion spawned on it, is dropped before this returns.
fn execute(
    context: SessionContext,
    statement: Statement,
    max_rows: usize,
    interrupt: &Interrupt,
    timeout: Duration,
) -> Result<(SchemaRef, Vec<RecordBatch>), SluiceError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| SluiceError::external("query.runtime", format!("cannot start the query's runtime: {e}")))?;
    // What stops the query, if it stopped, else a table's read error, else `error` as the SQL's.
    let failed = |error: &DataFusionError| match interrupt.fired() {
        Some(stop) => executions::stop_error(stop, timeout),
        None => carried(error).unwrap_or_else(|| query_error(error)),
    };
    let work = async {
        let state = context.state();
        let plan = state.statement_to_plan(statement).await.map_err(|e| query_error(&e))?;
        datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| query_error(&e))?;
        // Two columns of one name are renamed as in a view (`dateTime0`), so that a
        // JSON line keeps both.
        let plan = sluice_sql::unique_names(plan)?;
        let frame = datafusion::dataframe::DataFrame::new(state, plan);
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let frame = frame.limit(0, Some(max_rows + 1)).map_err(|e| query_error(&e))?;
        let task = frame.task_ctx();
        let physical = frame.create_physical_plan().await.map_err(|e| query_error(&e))?;
        // Every operator stops at its next batch once the interrupt fires.
        let physical = interrupt::interruptible(physical, interrupt).map_err(|e| query_error(&e))?;
        let mut stream = datafusion::physical_plan::execute_stream(physical, Arc::new(task)).map_err(|e| failed(&e))?;
        // Batch by batch: the answer's bytes are checked between batches.
        let (mut batches, mut bytes) = (Vec::new(), 0usize);
        while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            let batch = batch.map_err(|e| failed(&e))?;
            bytes = bytes.saturating_add(batch.get_array_memory_size());
            if bytes > ANSWER_BYTES_LIMIT {
                return Err(answer_too_large());
            }
            batches.push(batch);
        }
        if let Some(stop) = interrupt.fired() {
            return Err(executions::stop_error(stop, timeout));
        }
        Ok::<_, SluiceError>((schema, batches))
    };
    let left = interrupt.deadline().saturating_duration_since(Instant::now());
    // The timer ends the planning too, which no operator's check covers.
    let outcome = runtime.block_on(async move { tokio::time::timeout(left, work).await });
    drop(runtime);
    outcome.map_err(|_| timed_out(timeout))?
}

impl PreparedQuery {
    /// Reads every named table at one epoch (this worker's slices, and in a cluster the
    /// other workers' through `gather`) into the session; returns the epoch.
    fn read_tables(&self, lease: &Lease, gather: Option<&dyn Gather>) -> Result<u64, SluiceError> {
        let mut held = None;
        let mut epoch = lease.epoch;
        if !self.peers.is_empty() {
            let gather = gather.ok_or_else(|| {
                SluiceError::internal("query.gather", "a cluster's query was run without a way to reach the workers")
            })?;
            let held = held.insert(Held { gather, leases: Vec::with_capacity(self.peers.len()) });
            for peer in &self.peers {
                let remote = gather.lease(peer, self.interrupt.deadline())?;
                held.leases.push((peer, remote));
                epoch = epoch.max(remote.epoch);
            }
        }
        let (mut rows, mut bytes) = (0usize, 0usize);
        for table in &self.tables {
            let wait = self.interrupt.deadline().saturating_duration_since(Instant::now());
            let at = self.registry.pin(table, lease, epoch, wait)?;
            let mut gathered = Vec::new();
            if let Some(held) = &held {
                for (peer, remote) in &held.leases {
                    let left = GATHER_BYTES_LIMIT.saturating_sub(bytes);
                    let slice = held.gather.slice(peer, *remote, table, epoch, self.interrupt.deadline(), left)?;
                    bytes += slice.iter().map(RecordBatch::get_array_memory_size).sum::<usize>();
                    rows += slice.iter().map(RecordBatch::num_rows).sum::<usize>();
                    if rows > GATHER_ROWS_LIMIT || bytes > GATHER_BYTES_LIMIT {
                        return Err(too_large());
                    }
                    for batch in slice {
                        // Of the table's own schema, as this worker's rows are.
                        let batch =
                            RecordBatch::try_new(Arc::clone(&table.schema), batch.columns().to_vec()).map_err(|e| {
                                SluiceError::internal("query.table", format!("{peer}'s slice of `{}`: {e}", table.name))
                            })?;
                        gathered.push(batch);
                    }
                }
            }
            let scan: Arc<dyn PartitionStream> = Arc::new(TableScan { at, gathered: Arc::new(gathered) });
            let streaming = StreamingTable::try_new(Arc::clone(&table.schema), vec![scan])
                .map_err(|e| SluiceError::internal("query.table", df_message(&e)))?;
            self.context
                .register_table(table.name.as_str(), Arc::new(streaming))
                .map_err(|e| SluiceError::internal("query.table", df_message(&e)))?;
        }
        // Every table is pinned or gathered: `held` releases the other workers' leases as
        // it drops.
        Ok(epoch)
    }
}

/// One table as a query reads it: this worker's slices at the epoch, pinned, merged batch
/// by batch as DataFusion pulls them, then the other workers' slices, gathered. Each
/// execution (a table named twice is scanned twice) reads it from its start.
#[derive(Debug)]
struct TableScan {
    at: Arc<TableAt>,
    gathered: Arc<Vec<RecordBatch>>,
}

impl PartitionStream for TableScan {
    fn schema(&self) -> &SchemaRef {
        &self.at.table().schema
    }

    fn execute(&self, _: Arc<TaskContext>) -> SendableRecordBatchStream {
        let local =
            self.at.rows(SCAN_BATCH_ROWS).map(|batch| batch.map_err(|e| DataFusionError::External(Box::new(e))));
        let gathered = Arc::clone(&self.gathered);
        let remote = (0..gathered.len()).map(move |index| Ok(gathered[index].clone()));
        let rows = futures::stream::iter(local.chain(remote));
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.at.table().schema), rows))
    }
}

/// The Sluice error that `error` carries (a table's read failed), if it carries one.
fn carried(error: &DataFusionError) -> Option<SluiceError> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(sluice) = error.downcast_ref::<SluiceError>() {
            return Some(sluice.clone());
        }
        cause = error.source();
    }
    None
}

/// The query ran past its deadline: `limit`, its timeout (from the request, not what was
/// left of it when the run started).
pub fn timed_out(limit: Duration) -> SluiceError {
    SluiceError::external("query.timeout", format!("the query took longer than {} ms", limit.as_millis()))
        .with_fix("give a longer timeout (timeout_ms), or read less")
}

/// The answer's rows take more than [`ANSWER_BYTES_LIMIT`].
fn answer_too_large() -> SluiceError {
    SluiceError::user(
        "query.answer_too_large",
        format!("the answer's rows take more than {} MiB", ANSWER_BYTES_LIMIT >> 20),
    )
    .with_fix("add a LIMIT or a narrower WHERE, or select fewer or shorter columns")
}

/// The tables a query reads hold more than it may gather.
pub fn too_large() -> SluiceError {
    SluiceError::user(
        "query.gather_too_large",
        format!(
            "the tables the query reads hold more than {GATHER_ROWS_LIMIT} rows or {} MiB across the workers",
            GATHER_BYTES_LIMIT >> 20
        ),
    )
    .with_fix("materialize a smaller view (aggregate or filter in the pipeline) and query that")
}

/// A session that only reads the tables registered in it.
fn session() -> Result<SessionContext, SluiceError> {
    let mut config = SessionConfig::new().with_target_partitions(1).with_information_schema(false);
    config.options_mut().sql_parser.enable_ident_normalization = false;
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(WORKING_MEMORY, 1.0)
        .build_arc()
        .map_err(|e| SluiceError::internal("query.session", df_message(&e)))?;
    let context = SessionContext::new_with_config_rt(config, runtime);
    for function in sluice_sql::flink_functions() {
        context.register_udf((*function).clone());
    }
    Ok(context)
}

/// What tables a query may name, for messages.
fn listing(registry: &Materialized) -> String {
    let materialized = registry.names();
    let materialized = if materialized.is_empty() { "none".to_string() } else { materialized.join(", ") };
    let others = registry.others();
    if others.is_empty() {
        format!("the materialized tables are: {materialized}")
    } else {
        format!("the materialized tables are: {materialized} (not materialized: {})", others.join(", "))
    }
}

fn bad_sql(registry: &Materialized, message: String) -> SluiceError {
    let message = message.strip_prefix("SQL error: ").unwrap_or(&message);
    let message = message.strip_prefix("ParserError(\"").and_then(|m| m.strip_suffix("\")")).unwrap_or(message);
    SluiceError::user("query.sql", format!("the SQL cannot be read: {message}"))
        .with_fix(format!("write one SELECT over the materialized tables; {}", listing(registry)))
}

/// An error of planning or running the query: the user's SQL, as DataFusion words it.
fn query_error(error: &datafusion::error::DataFusionError) -> SluiceError {
    match error {
        datafusion::error::DataFusionError::ResourcesExhausted(_) => SluiceError::user(
            "query.memory",
            format!("the query needs more than {} MiB of working memory: {}", WORKING_MEMORY >> 20, df_message(error)),
        )
        .with_fix("aggregate or filter more before sorting or joining"),
        _ => SluiceError::user("query.sql", df_message(error)).with_fix("correct the query"),
    }
}

fn df_message(error: &datafusion::error::DataFusionError) -> String {
    let message = error.strip_backtrace();
    ["Error during planning: ", "Schema error: ", "This feature is not implemented: ", "SQL error: "]
        .iter()
        .fold(message, |message, prefix| message.strip_prefix(prefix).map(str::to_string).unwrap_or(message))
}

#[cfg(test)]
mod tests;
