//! The handlers of `pgwire`'s simple and extended query protocols: each statement goes
//! where `route` sends it, and its answer (or its error, with a SQLSTATE from `errors`)
//! goes back in the protocol's messages.
//!
//! Protocol notes: a query over the materialized tables first sends a NOTICE naming the
//! checkpoint every table was read at (`sluice: read at checkpoint E`), then its rows;
//! `BEGIN`/`COMMIT`/`ROLLBACK` move the transaction status the client sees, and nothing
//! else (each query reads one checkpoint: a transaction of several queries may read
//! several; the NOTICE says which). The extended protocol stores statements as their SQL
//! text (`SqlText`); `Describe` plans the query over empty tables (no lease), `Execute`
//! binds the parameters as literals (`params`) and runs it; a portal's `max_rows`
//! suspends the rows already answered, as PostgreSQL does.
//!
//! Bounds: those of the query path and the catalog; each answer's rows are encoded once
//! on the blocking pool (still holding the query's admission) and handed to `pgwire`.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use futures::sink::SinkExt;
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeResponse, DescribeStatementResponse, FieldFormat, FieldInfo, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, METADATA_DATABASE, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::data::DataRow;
use pgwire::messages::response::NoticeResponse;
use sluice_admin::Queries;
use sluice_engine::query::Interrupt;
use sluice_types::SluiceError;

use crate::auth::Startup;
use crate::errors::{info, to_pg};
use crate::route::{Route, route};
use crate::session::Settings;
use crate::{catalog, encode, params};

/// What every connection shares: the startup handler and the query handler.
pub(crate) struct Backend {
    startup: Arc<Startup>,
    handler: Arc<Handler>,
    /// The open connections, by process id and secret key: cancel requests' targets.
    cancels: Arc<DefaultCancelHandler>,
}

impl Backend {
    pub(crate) fn new(queries: Queries, token: Option<&str>, tls: Option<&crate::tls::Tls>) -> Backend {
        let connections = Arc::new(ConnectionManager::new());
        let certificate = tls.map(|tls| tls.certificate_pem.as_slice());
        Backend {
            startup: Arc::new(Startup::new(token, certificate, Arc::clone(&connections))),
            handler: Arc::new(Handler { queries, parser: Arc::new(SqlText) }),
            cancels: Arc::new(DefaultCancelHandler::new(connections)),
        }
    }
}

impl PgWireServerHandlers for Backend {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::clone(&self.handler)
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::clone(&self.handler)
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::clone(&self.startup)
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::clone(&self.cancels)
    }
}

/// A statement of the extended protocol: its SQL text, bound and routed when executed.
#[derive(Debug, Default)]
pub(crate) struct SqlText;

#[async_trait]
impl QueryParser for SqlText {
    type Statement = String;

    async fn parse_sql<C>(&self, _client: &C, sql: &str, _types: &[Option<Type>]) -> PgWireResult<Option<String>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        Ok(Some(sql.to_string()))
    }

    fn get_parameter_types(&self, _statement: &String) -> PgWireResult<Vec<Type>> {
        Ok(Vec::new())
    }

    fn get_result_schema(&self, _statement: &String, _format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        Ok(Vec::new())
    }
}

pub(crate) struct Handler {
    queries: Queries,
    parser: Arc<SqlText>,
}

/// An answer's columns and rows, and the checkpoint its tables were read at.
struct Rows {
    fields: Arc<Vec<FieldInfo>>,
    rows: Vec<DataRow>,
    epoch: Option<u64>,
}

fn settings<C: ClientInfo>(client: &C) -> Arc<Settings> {
    client.session_extensions().get_or_insert_with(Settings::default)
}

/// The database the client named (the job's name when it named none).
fn database<C: ClientInfo>(client: &C, job: &sluice_engine::JobHandle) -> String {
    client.metadata().get(METADATA_DATABASE).cloned().unwrap_or_else(|| job.name().to_string())
}

fn joined(error: tokio::task::JoinError) -> SluiceError {
    SluiceError::internal("pgwire.task", format!("a query's task failed: {error}"))
}

impl Handler {
    /// Answers one statement, its rows in `format`.
    async fn answer<C>(&self, client: &mut C, sql: &str, format: &Format) -> Result<Response, SluiceError>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let settings = settings(client);
        match route(sql) {
            Route::Begin => Ok(Response::TransactionStart(Tag::new("BEGIN"))),
            Route::Commit => Ok(Response::TransactionEnd(Tag::new("COMMIT"))),
            Route::Rollback => Ok(Response::TransactionEnd(Tag::new("ROLLBACK"))),
            Route::Set { name, value } => {
                settings.set(&name, &value)?;
                Ok(Response::Execution(Tag::new("SET")))
            }
            Route::Show { name } => {
                let value = settings.show(&name)?;
                Ok(Response::Query(one_text(&name, value, format)?))
            }
            Route::Accepted(tag) => {
                if tag == "DISCARD ALL" {
                    settings.reset();
                }
                Ok(Response::Execution(Tag::new(tag)))
            }
            Route::Catalog(statement) => {
                let rows = self.catalog(client, *statement, format.clone()).await?;
                Ok(Response::Query(response(rows)))
            }
            Route::Query => {
                let limits = settings.limits()?;
                let format = format.clone();
                let rows = self
                    .queries
                    .run(sql.to_string(), limits, move |answer| {
                        encoded(&answer.schema, &answer.batches, answer.epoch, &format)
                    })
                    .await?;
                if let Some(epoch) = rows.epoch {
                    let notice =
                        ErrorInfo::new("NOTICE".into(), "00000".into(), format!("sluice: read at checkpoint {epoch}"));
                    client.send(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(notice))).await.map_err(
                        |e| {
                            SluiceError::external(
                                "pgwire.send",
                                format!("the client's connection failed: {}", PgWireError::from(e)),
                            )
                        },
                    )?;
                }
                Ok(Response::Query(response(rows)))
            }
        }
    }

    /// Runs `statement` over the catalog of the job's tables, on the blocking pool.
    async fn catalog<C: ClientInfo>(
        &self,
        client: &C,
        statement: datafusion::sql::sqlparser::ast::Statement,
        format: Format,
    ) -> Result<Rows, SluiceError> {
        let job = self.queries.job().clone();
        let database = database(client, &job);
        let interrupt = Interrupt::new(std::time::Instant::now() + crate::CATALOG_TIMEOUT);
        // A client that goes away drops this future: the query stops at its next batch.
        let _cancel = Cancel(interrupt.clone());
        tokio::task::spawn_blocking(move || {
            let tables = job.materialized_schemas();
            let answer = catalog::answer(statement, &tables, &database, &interrupt)?;
            encoded(&answer.schema, &answer.batches, None, &format)
        })
        .await
        .map_err(joined)?
    }

    /// The columns `sql` answers with (none for a statement without rows), and its
    /// parameters' types where it fixes them.
    async fn describe<C: ClientInfo>(
        &self,
        client: &C,
        sql: &str,
        format: &Format,
    ) -> Result<(Vec<FieldInfo>, Vec<Option<Type>>), SluiceError> {
        match route(sql) {
            Route::Show { name } => Ok((vec![text_field(&name, format)], Vec::new())),
            Route::Catalog(_) => {
                // Parameters not bound yet are NULL (the answer keeps its columns), and
                // described as text (the catalog's values are names and kinds).
                let count = placeholders(sql);
                let unbound = params::substitute(sql, &vec!["NULL".to_string(); count])?;
                let Route::Catalog(statement) = route(&unbound) else {
                    return Ok((Vec::new(), Vec::new()));
                };
                let rows = self.catalog(client, *statement, format.clone()).await?;
                Ok((rows.fields.to_vec(), vec![Some(Type::TEXT); count]))
            }
            Route::Query => {
                let job = self.queries.job().clone();
                let text = sql.to_string();
                let (schema, parameters) =
                    tokio::task::spawn_blocking(move || job.describe_query(&text)).await.map_err(joined)??;
                let fields = encode::describe(schema.fields(), format)?;
                Ok((fields, parameters.iter().map(|p| p.as_ref().map(encode::pg_type)).collect()))
            }
            _ => Ok((Vec::new(), Vec::new())),
        }
    }
}

/// Cancels a catalog query's execution when dropped (after it finished, nothing).
struct Cancel(Interrupt);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl Handler {
    /// The parameter types a Describe of the portal's statement told the client, when
    /// it bound a value in the binary format without declaring its type (none else).
    async fn described_types<C: ClientInfo>(
        &self,
        client: &C,
        portal: &Portal<String>,
    ) -> Result<Vec<Option<Type>>, SluiceError> {
        if !params::needs_described_types(portal) {
            return Ok(Vec::new());
        }
        let (_, types) = self.describe(client, &portal.statement.statement, &Format::UnifiedText).await?;
        Ok(types)
    }
}

/// The rows of an answer, encoded in `format`.
fn encoded(
    schema: &arrow::datatypes::SchemaRef,
    batches: &[arrow::array::RecordBatch],
    epoch: Option<u64>,
    format: &Format,
) -> Result<Rows, SluiceError> {
    let fields = Arc::new(encode::describe(schema.fields(), format)?);
    let rows = encode::rows(batches, &fields)?;
    Ok(Rows { fields, rows, epoch })
}

fn response(rows: Rows) -> QueryResponse {
    QueryResponse::new(rows.fields, futures::stream::iter(rows.rows.into_iter().map(Ok)))
}

fn text_field(name: &str, format: &Format) -> FieldInfo {
    let wire = if format.is_binary(0) { FieldFormat::Binary } else { FieldFormat::Text };
    FieldInfo::new(name.to_string(), None, None, Type::TEXT, wire)
}

/// A one-row, one-column text answer (`SHOW`).
fn one_text(name: &str, value: String, format: &Format) -> Result<QueryResponse, SluiceError> {
    let fields = Arc::new(vec![text_field(name, format)]);
    let mut encoder = pgwire::api::results::DataRowEncoder::new(Arc::clone(&fields));
    encoder
        .encode_field(&value)
        .map_err(|e| SluiceError::internal("pgwire.encode", format!("a setting's value: {e}")))?;
    let row = encoder.take_row();
    Ok(QueryResponse::new(fields, futures::stream::iter(vec![Ok(row)])))
}

/// The SQL of each statement of a simple query (several separated by `;`).
fn statements(sql: &str) -> Vec<String> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
        Ok(parsed) if parsed.len() > 1 => parsed.iter().map(ToString::to_string).collect(),
        // One statement, or one the query path will judge: as written.
        _ => vec![sql.to_string()],
    }
}

#[async_trait]
impl SimpleQueryHandler for Handler {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut responses = Vec::new();
        for sql in statements(query) {
            match self.answer(client, &sql, &Format::UnifiedText).await {
                Ok(response) => responses.push(response),
                Err(error) => {
                    // The statements after a failed one are not run, as in PostgreSQL.
                    responses.push(Response::Error(Box::new(info(&error))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Handler {
    type Statement = String;
    type QueryParser = SqlText;

    fn query_parser(&self) -> Arc<SqlText> {
        Arc::clone(&self.parser)
    }

    async fn do_query<C>(&self, client: &mut C, portal: &Portal<String>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let described = self.described_types(client, portal).await.map_err(to_pg)?;
        let sql = params::bind(&portal.statement.statement, portal, &described).map_err(to_pg)?;
        self.answer(client, &sql, &portal.result_column_format).await.map_err(to_pg)
    }

    async fn do_describe_statement<C>(
        &self,
        client: &mut C,
        statement: &StoredStatement<String>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let count = placeholders(&statement.statement);
        let (fields, inferred) =
            self.describe(client, &statement.statement, &Format::UnifiedText).await.map_err(to_pg)?;
        if fields.is_empty() && count == 0 {
            return Ok(DescribeStatementResponse::no_data());
        }
        // The client's declared types first, then what the query fixes, else text.
        let parameters = (0..count.max(statement.parameter_types.len()))
            .map(|index| {
                statement
                    .parameter_types
                    .get(index)
                    .cloned()
                    .flatten()
                    .or_else(|| inferred.get(index).cloned().flatten())
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        Ok(DescribeStatementResponse::new(parameters, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<String>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let described = self.described_types(client, portal).await.map_err(to_pg)?;
        let sql = params::bind(&portal.statement.statement, portal, &described).map_err(to_pg)?;
        let (fields, _) = self.describe(client, &sql, &portal.result_column_format).await.map_err(to_pg)?;
        if fields.is_empty() {
            return Ok(DescribePortalResponse::no_data());
        }
        Ok(DescribePortalResponse::new(fields))
    }
}

/// The highest `$n` in `sql`.
fn placeholders(sql: &str) -> usize {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else { return 0 };
    tokens
        .iter()
        .filter_map(|token| match token {
            Token::Placeholder(name) => name.strip_prefix('$')?.parse::<usize>().ok(),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}
