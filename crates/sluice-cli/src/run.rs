//! `sluice run`: the job, the signals, the admin API, the progress line and the exit
//! report.
//!
//! Signals: the first Ctrl-C / SIGTERM asks the job to stop its sources and drain, or,
//! with checkpoints, to take a final checkpoint that keeps open windows (bounded by
//! `shutdown_timeout`); a second one exits at once with status 1, naming what was
//! abandoned.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[cfg(not(feature = "pgwire"))]
use crate::no_pgwire::{PgListener, PgServer};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use sluice_admin::{AdminListener, AdminServer, Queries};
use sluice_engine::{
    ClusterOptions, ClusterRole, ControlSettings, Engine, EngineError, Job, JobState, Listening, Overrides,
    RendezvousEvent, RunOutcome, Secret, StartOptions, StopHandle,
};
#[cfg(feature = "pgwire")]
use sluice_pgwire::{PgListener, PgServer};
use sluice_types::{ErrorKind, SluiceError};

use crate::progress::Progress;
use crate::report;

/// How often the progress line is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

/// Running on several workers (hosts), each with the same pipeline file.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Lead a cluster of N workers (this one included); prints the command the others run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024), conflicts_with = "join")]
    workers: Option<u32>,
    /// Join the cluster whose leader listens at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    join: Option<String>,
    /// Where the leader listens for joining workers.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7400", conflicts_with = "join")]
    control_bind: SocketAddr,
    /// Where this worker listens for the other workers' data links (port 0: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    exchange_bind: SocketAddr,
    /// The HOST:PORT other workers dial to reach this worker's data links, when it is not
    /// the --exchange-bind address (a wildcard bind, a NAT).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// A file holding the cluster's shared secret (else the SLUICE_CLUSTER_SECRET variable):
    /// every worker proves it knows it, and it never crosses the network.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
    /// Listen on a non-loopback control or exchange address without a secret (anyone who
    /// can reach the port could then join the cluster, or open a data link, and receive
    /// its data).
    #[arg(long)]
    insecure: bool,
    /// How long the leader waits for every worker to join, and a worker for the leader.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = sluice_engine::config::parse_duration)]
    join_timeout: Duration,
}

impl ClusterArgs {
    /// The engine's cluster options, or None for a run on this worker alone.
    fn options(&self, from_scratch: bool, admin: Option<SocketAddr>) -> Result<Option<ClusterOptions>, EngineError> {
        let role = match (&self.join, self.workers) {
            (Some(leader), _) => ClusterRole::Join { leader: leader.clone() },
            (None, Some(workers)) if workers > 1 => {
                ClusterRole::Lead { workers: workers as usize, control_bind: self.control_bind }
            }
            (None, _) => return Ok(None),
        };
        let secret = Secret::resolve(self.secret_file.as_deref()).map_err(EngineError::new)?;
        Ok(Some(ClusterOptions {
            role,
            exchange_bind: self.exchange_bind,
            advertise: self.advertise.clone(),
            secret,
            insecure: self.insecure,
            join_timeout: self.join_timeout,
            control: ControlSettings { events: Some(rendezvous_printer()), ..ControlSettings::default() },
            from_scratch,
            admin_addr: admin.map(|admin| self.admin_addr(admin)),
        }))
    }

    /// The address other workers reach this worker's admin API on: the bound one, or on
    /// a wildcard bind, the --advertise host with the admin port.
    fn admin_addr(&self, admin: SocketAddr) -> String {
        let host = self.advertise.as_deref().and_then(|advertise| advertise.rsplit_once(':')).map(|(host, _)| host);
        match host {
            Some(host) if admin.ip().is_unspecified() => format!("{host}:{}", admin.port()),
            _ => admin.to_string(),
        }
    }
}

/// The admin HTTP API of the run (crates/sluice-admin).
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Where the admin HTTP API listens (port 0: any free port), or `off`. Off loopback
    /// it requires a token (--admin-token-file or SLUICE_ADMIN_TOKEN).
    #[arg(long, value_name = "ADDR|off", default_value = "127.0.0.1:0")]
    admin_bind: String,
    /// A file holding the admin API's bearer token (else the SLUICE_ADMIN_TOKEN variable):
    /// callers send it as `Authorization: Bearer <token>`.
    #[arg(long, value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
    /// Another name the admin API answers to (repeatable): a request's Host must name
    /// the bound address (or localhost on loopback), the --advertise host or one of
    /// these, which stops pages whose name was re-pointed here (DNS rebinding).
    #[arg(long, value_name = "NAME")]
    admin_host: Vec<String>,
    /// Where the PostgreSQL wire protocol listens for ad-hoc queries (psql, psycopg, JDBC,
    /// BI tools; crates/sluice-pgwire, the `pgwire` build feature), or `off` (the default).
    /// Off loopback it requires the admin token, which clients give as their password
    /// (SCRAM-SHA-256).
    #[arg(long, value_name = "ADDR|off", default_value = "off")]
    pg_bind: String,
    /// A PEM file with the certificate chain the PostgreSQL endpoint serves TLS with
    /// (with --pg-tls-key); clients ask for TLS with sslmode=require.
    #[arg(long, value_name = "PATH", requires = "pg_tls_key")]
    pg_tls_cert: Option<PathBuf>,
    /// A PEM file with the private key of --pg-tls-cert.
    #[arg(long, value_name = "PATH", requires = "pg_tls_cert")]
    pg_tls_key: Option<PathBuf>,
}

/// The admin API's settings, checked before the job starts.
struct AdminSettings {
    bind: SocketAddr,
    token: Option<String>,
}

impl AdminArgs {
    /// The address and token, or None for `--admin-bind off`.
    fn settings(&self) -> Result<Option<AdminSettings>, EngineError> {
        if self.admin_bind.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let bind: SocketAddr = self.admin_bind.parse().map_err(|_| {
            EngineError::new(
                SluiceError::user("run.admin_bind", format!("--admin-bind {:?} is not an address", self.admin_bind))
                    .with_fix("give IP:PORT (e.g. 127.0.0.1:9400, port 0: any free port), or `off`"),
            )
        })?;
        let token = self.token()?;
        sluice_admin::check_access(bind, token.as_deref()).map_err(EngineError::new)?;
        Ok(Some(AdminSettings { bind, token }))
    }

    /// The PostgreSQL endpoint's listener, bound (before the job starts), or None for
    /// `--pg-bind off`.
    fn pg_listener(&self) -> Result<Option<PgListener>, EngineError> {
        if self.pg_bind.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let bind: SocketAddr = self.pg_bind.parse().map_err(|_| {
            EngineError::new(
                SluiceError::user("run.pg_bind", format!("--pg-bind {:?} is not an address", self.pg_bind))
                    .with_fix("give IP:PORT (e.g. 127.0.0.1:5432, port 0: any free port), or `off`"),
            )
        })?;
        let listener = PgListener::bind(bind, self.token()?).map_err(EngineError::new)?;
        match (&self.pg_tls_cert, &self.pg_tls_key) {
            (Some(certificate), Some(key)) => listener.with_tls(certificate, key).map(Some).map_err(EngineError::new),
            _ => Ok(Some(listener)),
        }
    }

    /// The token from --admin-token-file (trimmed), else SLUICE_ADMIN_TOKEN, else None.
    fn token(&self) -> Result<Option<String>, EngineError> {
        let Some(path) = &self.admin_token_file else {
            return Ok(std::env::var("SLUICE_ADMIN_TOKEN").ok());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            EngineError::new(
                SluiceError::user("run.admin_token_file", format!("cannot read {}: {e}", path.display()))
                    .with_fix("give a readable file holding the token with --admin-token-file"),
            )
        })?;
        Ok(Some(text.trim().to_string()))
    }
}

/// What `sluice run` was asked besides the pipeline.
pub struct RunOptions<'a> {
    pub from_scratch: bool,
    pub cluster: &'a ClusterArgs,
    pub admin: &'a AdminArgs,
    pub quiet: bool,
}

/// Starts the admin API for `job` on its listener; a failure stops the job (it has not
/// run for anyone).
fn serve_admin(job: &Job, listener: Option<AdminListener>, quiet: bool) -> Result<Option<AdminServer>, SluiceError> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let server = listener.serve(job.handle())?;
    if !quiet {
        eprintln!("sluice: admin API on http://{}", server.addr());
    }
    Ok(Some(server))
}

/// Starts the PostgreSQL endpoint for `job` on its listener, sharing the admin API's
/// query path (its admission bound) when the API is on; a failure stops the job.
fn serve_pg(
    job: &Job,
    listener: Option<PgListener>,
    admin: Option<&AdminServer>,
    token: Option<&str>,
    quiet: bool,
) -> Result<Option<PgServer>, SluiceError> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let queries = admin.map_or_else(|| Queries::new(job.handle(), token), AdminServer::queries);
    let server = listener.serve(queries)?;
    if !quiet {
        let addr = server.addr();
        eprintln!("sluice: PostgreSQL endpoint on {addr} (psql -h {} -p {})", addr.ip(), addr.port());
    }
    Ok(Some(server))
}

/// Prints the leader's rendezvous as it goes (who joined, who was refused and why), on
/// a thread of its own; the returned sender is what the rendezvous reports to.
fn rendezvous_printer() -> crossbeam_channel::Sender<RendezvousEvent> {
    // Bounded: the rendezvous never blocks on it (events that do not fit are dropped).
    let (events, printed) = crossbeam_channel::bounded(256);
    let spawned = std::thread::Builder::new().name("sluice-rendezvous-log".into()).spawn(move || {
        for event in printed {
            match event {
                RendezvousEvent::Joined { exchange_addr, host, present, workers, .. } => {
                    eprintln!("sluice: worker {exchange_addr} (host {host}) joined: {present} of {workers} present");
                }
                RendezvousEvent::Refused { peer, error } => eprintln!("sluice: refused a join from {peer}: {error}"),
                RendezvousEvent::Left { exchange_addr, .. } => {
                    eprintln!("sluice: worker {exchange_addr} left before the cluster formed");
                }
                RendezvousEvent::Formed { members } => eprintln!("sluice: all {} workers joined", members.len()),
            }
        }
    });
    if let Err(error) = spawned {
        tracing::warn!(%error, "the rendezvous will not be shown");
    }
    events
}

pub fn run(engine: &Engine, path: &Path, overrides: Overrides, options: RunOptions) -> Result<ExitCode, EngineError> {
    let RunOptions { from_scratch, cluster, admin, quiet } = options;
    let admin_args = admin;
    let pipeline = engine.load(path, overrides)?;
    // Bound before the job starts: a cluster's worker announces its address to the others.
    let admin = match admin.settings()? {
        Some(AdminSettings { bind, token }) => {
            let mut hosts = admin.admin_host.clone();
            hosts.extend(cluster.advertise.clone());
            Some(AdminListener::bind(bind, token).map_err(EngineError::new)?.with_hosts(hosts))
        }
        None => None,
    };
    let pg = admin_args.pg_listener()?;
    let checkpoints = pipeline.config.checkpoint.is_some();
    let writes_stdout = pipeline.writes_stdout();
    let clustered = cluster.join.is_some() || cluster.workers.is_some_and(|workers| workers > 1);
    let job = match cluster.options(from_scratch, admin.as_ref().map(AdminListener::addr))? {
        None => Job::start(&pipeline, StartOptions { from_scratch })?,
        Some(options) => {
            if from_scratch && !checkpoints {
                return Err(EngineError::new(
                    SluiceError::user("run.from_scratch", "--from-scratch needs a [checkpoint] section")
                        .with_fix("there is no state to discard: remove --from-scratch"),
                ));
            }
            let secret_hint = if options.secret.is_some() { " (with the same secret)" } else { "" };
            let mut announce = |listening: &Listening| {
                eprintln!(
                    "sluice: leading a cluster of {} workers; waiting for {} to join. On each, run{secret_hint}:\n  sluice run {} --join {}",
                    listening.workers,
                    listening.workers - 1,
                    path.display(),
                    listening.control_addr
                );
            };
            if let ClusterRole::Join { leader } = &options.role
                && !quiet
            {
                eprintln!("sluice: joining the cluster led by {leader}");
            }
            Job::start_cluster(pipeline, options, &mut announce)?
        }
    };
    for notice in job.notices() {
        if !quiet || notice.starts_with("warning") {
            eprintln!("sluice: {notice}");
        }
    }
    install_signals(job.stop_handle(), checkpoints)?;
    let admin = match serve_admin(&job, admin, quiet) {
        Ok(admin) => admin,
        Err(error) => {
            job.stop();
            job.wait();
            return Err(EngineError::new(error));
        }
    };
    let token = match pg.as_ref().map(|_| admin_args.token()).transpose() {
        Ok(token) => token.flatten(),
        Err(error) => {
            job.stop();
            job.wait();
            return Err(error);
        }
    };
    let pg = match serve_pg(&job, pg, admin.as_ref(), token.as_deref(), quiet) {
        Ok(pg) => pg,
        Err(error) => {
            job.stop();
            job.wait();
            return Err(EngineError::new(error));
        }
    };
    let live = !quiet && std::io::stderr().is_terminal() && !(writes_stdout && std::io::stdout().is_terminal());
    let stop = if checkpoints { "stops with a final checkpoint" } else { "stops and drains" };
    let running = |worker: Option<(u32, usize)>| {
        if quiet {
            return;
        }
        let place = worker.map_or_else(String::new, |(me, workers)| format!(" as worker {me} of {workers}"));
        if let Some(epoch) = job.status().resumed_from.filter(|_| clustered) {
            eprintln!("sluice: resuming from checkpoint {epoch}");
        }
        eprintln!("sluice: running pipeline \"{}\"{place} on {} thread(s); Ctrl-C {stop}", job.name(), job.threads());
    };
    if !clustered {
        running(None);
    }
    let mut progress = Progress::new(live, quiet);
    let mut metrics = job.metrics();
    let started = Instant::now();
    let mut changes = job.subscribe();
    // A cluster job waits in `coordination` until every worker joined.
    let mut formed = !clustered;
    loop {
        let changed = changes.next_timeout(PROGRESS_INTERVAL);
        if let Some(status) = &changed
            && !formed
            && status.state != JobState::Coordination
        {
            formed = true;
            metrics = job.metrics();
            if !status.state.is_final() {
                running(status.worker);
            }
        }
        if changed.is_some_and(|status| status.state.is_final()) {
            break;
        }
        if formed {
            progress.update(&metrics, started.elapsed());
        }
    }
    let name = job.name().to_string();
    let report = job.wait();
    // The run is over: open status streams have had their final line.
    if let Some(pg) = pg {
        pg.shutdown();
    }
    if let Some(admin) = admin {
        admin.shutdown();
    }
    progress.finish();
    if let RunOutcome::Failed { component, error } = &report.outcome
        && component == "cluster"
    {
        // The cluster never formed (a refusal, a timeout): an error, not a run's report.
        eprintln!("error: {error}");
        return Ok(ExitCode::FAILURE);
    }
    if let RunOutcome::Failed { error, .. } = &report.outcome
        && error.kind == ErrorKind::OutputClosed
    {
        // The reader of the output went away (`| head`): quietly done, as other tools.
        return Ok(ExitCode::SUCCESS);
    }
    if !quiet || report.outcome != RunOutcome::Completed {
        eprint!("{}", report::render(&name, &report));
    }
    Ok(match report.outcome {
        RunOutcome::Completed => ExitCode::SUCCESS,
        RunOutcome::Failed { .. } => ExitCode::FAILURE,
    })
}

/// The first Ctrl-C / SIGTERM stops the job (a final checkpoint when `checkpoints`, else a
/// drain that flushes open windows); a second exits at once. Signals are counted here: a
/// stop asked otherwise (the admin API, another worker of the cluster, which a Ctrl-C in
/// a terminal running every worker also reaches) does not make the first one a second.
fn install_signals(stop: StopHandle, checkpoints: bool) -> Result<(), EngineError> {
    let failed = |e: std::io::Error| {
        EngineError::new(SluiceError::external("run.signals", format!("cannot install signal handlers: {e}")))
    };
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(failed)?;
    std::thread::Builder::new()
        .name("sluice-signals".into())
        .spawn(move || {
            let mut received = 0u32;
            for signal in signals.forever() {
                received += 1;
                let name = if signal == SIGINT { "interrupt" } else { "SIGTERM" };
                if received > 1 {
                    eprintln!(
                        "\nsluice: second {name}: exiting now; rows in flight and unflushed sink output were abandoned"
                    );
                    std::process::exit(1);
                }
                let what = match (stop.is_requested(), checkpoints) {
                    (true, _) => "already stopping",
                    (false, true) => "stopping sources and taking a final checkpoint",
                    (false, false) => "stopping sources and draining",
                };
                eprintln!("\nsluice: {name}: {what} (again to exit at once)");
                stop.stop();
            }
        })
        .map_err(failed)?;
    Ok(())
}
