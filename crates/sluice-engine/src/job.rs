//! A running pipeline: [`Job::start`] recovers from the checkpoint store (if any),
//! compiles, and runs the plan on a controller thread of its own; the handle stops it,
//! reports its status and live metrics, and returns its report.
//!
//! Start order: open the store → find the newest valid checkpoint (falling back past
//! damaged ones) → compile with that checkpoint's lane layout → refuse a different
//! topology → resolve the sinks' staged work → start the drivers. Anything that fails
//! before the drivers start is an [`EngineError`]; anything after is in the report.

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use sluice_runtime::{ClusterRun, Metrics, RunEvent, RunOutcome, RunReport, StopHandle};
use sluice_types::vnode::SlotLayout;
use sluice_types::{ErrorKind, SluiceError};

use sluice_checkpoint::Lease;

use crate::checkpointing::{self, Recovered};
use crate::cluster::{self, ClusterOptions, Formed, Listening};
use crate::compile::{CompiledPipeline, Restoring};
use crate::error::EngineError;
use crate::load::Pipeline;
use crate::materialize::Materialized;
use crate::status::{JobState, Status, StatusCell, StatusStream};

/// How to start a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Discard the checkpoint store's state first.
    pub from_scratch: bool,
}

/// A running pipeline.
pub struct Job {
    /// Its name, status, counters and stop (what other threads may share).
    handle: JobHandle,
    notices: Vec<String>,
    controller: Option<JoinHandle<RunReport>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("name", &self.handle.name).field("status", &self.status()).finish_non_exhaustive()
    }
}

impl Job {
    /// Recovers, compiles and starts `pipeline` (see the module docs).
    pub fn start(pipeline: &Pipeline, options: StartOptions) -> Result<Job, EngineError> {
        if let Some(sink) = pipeline.config.sinks.iter().find(|sink| sink.worker.is_some_and(|worker| worker > 0)) {
            let worker = sink.worker.unwrap_or_default();
            return Err(EngineError::new(
                SluiceError::user(
                    "sink.worker",
                    format!("sink `{}` runs on worker {worker}, but this run is one worker (worker 0)", sink.name),
                )
                .with_fix("run it in a cluster of more workers (--workers N), or remove `worker`"),
            ));
        }
        let Some(section) = &pipeline.config.checkpoint else {
            if options.from_scratch {
                return Err(EngineError::new(
                    SluiceError::user("run.from_scratch", "--from-scratch needs a [checkpoint] section")
                        .with_fix("there is no state to discard: remove --from-scratch"),
                ));
            }
            return Job::spawn(pipeline.compile(None)?, None, Vec::new(), None, None);
        };
        let name = &pipeline.config.pipeline.name;
        let Recovered { store, lease, manifest, mut notices } =
            checkpointing::open(section, &pipeline.base_dir, name, options.from_scratch)?;
        let prepared = (|| {
            let restoring = manifest.as_ref().map(|m| Restoring {
                lane_threads: m.lane_threads,
                layouts: m.sources.iter().map(|s| (s.name.clone(), s.layout.clone())).collect(),
            });
            let compiled = pipeline.compile(restoring.as_ref())?;
            if let Some(manifest) = &manifest {
                checkpointing::check_encodings(manifest, &section.store)?;
                checkpointing::check_fingerprint(manifest, compiled.fingerprint, &section.store)?;
                notices.push(format!("resuming from checkpoint {} in {}", manifest.epoch, section.store));
            }
            let resumed_from = manifest.as_ref().map(|m| m.epoch);
            let layout = SlotLayout::solo(compiled.options.threads);
            let recovering = checkpointing::Recovering { me: 0, layout: &layout, restored_epoch: None };
            let checkpointing = checkpointing::prepare(section, store, manifest, &compiled, &recovering, &mut notices)?;
            Ok::<_, EngineError>((compiled, checkpointing, resumed_from))
        })();
        match prepared {
            Ok((compiled, checkpointing, resumed_from)) => {
                Job::spawn(compiled, Some(checkpointing), notices, resumed_from, Some(lease))
            }
            Err(error) => {
                // Nothing runs: the next run must not find this one's lease.
                if let Err(release) = lease.release() {
                    tracing::warn!(%release, "the store's lease could not be released");
                }
                Err(error)
            }
        }
    }

    fn spawn(
        compiled: CompiledPipeline,
        checkpointing: Option<sluice_runtime::Checkpointing>,
        notices: Vec<String>,
        resumed_from: Option<u64>,
        lease: Option<Lease>,
    ) -> Result<Job, EngineError> {
        let metrics = Arc::new(Metrics::for_plan(&compiled.plan, compiled.options.threads));
        let status = StatusCell::new(Status::starting(resumed_from));
        let (stop, woken) = sluice_runtime::stop_handle();
        let name = compiled.name.clone();
        let threads = compiled.options.threads;
        let handle = JobHandle {
            name,
            threads,
            metrics: Arc::new(Mutex::new(Arc::clone(&metrics))),
            stop: stop.clone(),
            status,
            explanation: Arc::new(crate::explain::explain(&compiled)),
            checkpoints: checkpointing.is_some(),
            queries: Arc::new(Mutex::new(QueryScope::Solo(Arc::clone(&compiled.materialized)))),
        };
        let status = Arc::clone(&handle.status);
        launch(handle, notices, move || {
            let report = run(compiled, checkpointing, None, (stop, woken), metrics, &status);
            // The run is over, cleanly or not: the next run may take the store.
            if let Some(Err(error)) = lease.map(Lease::release) {
                tracing::warn!(%error, "the store's lease could not be released");
            }
            report
        })
    }

    /// Forms a cluster and starts this worker's part of `pipeline` in it (see
    /// [`crate::cluster`]). Returns once the listeners are bound (`announce` hears the
    /// leader's control address then), with the job in `coordination` until the cluster
    /// formed. The job's report fails if any worker failed or was lost.
    pub fn start_cluster(
        pipeline: Pipeline,
        options: ClusterOptions,
        announce: &mut dyn FnMut(&Listening),
    ) -> Result<Job, EngineError> {
        let prepared = cluster::prepare(&pipeline, &options, announce)?;
        let name = prepared.local.name.clone();
        let threads = pipeline.config.pipeline.threads;
        let local_metrics = Arc::new(Metrics::for_plan(&prepared.local.plan, prepared.local.options.threads));
        let metrics = Arc::new(Mutex::new(Arc::clone(&local_metrics)));
        let status = StatusCell::new(Status::coordination());
        let (stop, woken) = sluice_runtime::stop_handle();
        // A stop asked while the cluster forms (or re-forms) ends the wait.
        let mut options = options;
        options.control.cancel = Some(stop.requested_flag());
        let started = std::time::Instant::now();
        let explanation = Arc::new(crate::explain::explain(&prepared.local));
        let checkpoints = pipeline.config.checkpoint.is_some();
        let handle = JobHandle {
            name,
            threads,
            metrics: Arc::clone(&metrics),
            stop: stop.clone(),
            status,
            explanation,
            checkpoints,
            queries: Arc::new(Mutex::new(QueryScope::Forming { why: None })),
        };
        let status = Arc::clone(&handle.status);
        let queries = Arc::clone(&handle.queries);
        launch(handle, Vec::new(), move || {
            let failed = |error: SluiceError, metrics: Arc<Metrics>| RunReport {
                outcome: RunOutcome::Failed { component: "cluster".into(), error },
                elapsed: started.elapsed(),
                stopped: stop.is_requested(),
                metrics,
                checkpoints: None,
            };
            let mut prepared = prepared;
            let mut round = 1;
            loop {
                let mut notices = Vec::new();
                let mut formed = match cluster::form(prepared, &pipeline, &options, &mut notices) {
                    Ok(formed) => formed,
                    Err(error) => return failed(error, Arc::clone(&local_metrics)),
                };
                // The job started before these were known: they go to the log, and the
                // resumed epoch to the status.
                for notice in &notices {
                    tracing::warn!("{notice}");
                }
                let control_listener = formed.control_listener.take();
                let (report, rejoin) =
                    run_in_cluster(formed, (stop.clone(), woken.clone()), &metrics, &status, &queries);
                let why = match &report.outcome {
                    RunOutcome::Failed { component, error } => format!("{component}: {}", error.message),
                    RunOutcome::Completed => "the run ended".to_string(),
                };
                *queries.lock().unwrap_or_else(PoisonError::into_inner) = QueryScope::Forming { why: Some(why) };
                if !rejoin || round == cluster::MAX_ROUNDS {
                    return report;
                }
                round += 1;
                // The lost worker aborted this round; the next starts clean (a wake-up
                // left by the abort is not a stop request).
                stop.rearm();
                while woken.try_recv().is_ok() {}
                status.update(|s| s.state = JobState::Coordination);
                tracing::warn!(round, "forming the cluster again (a worker was lost)");
                prepared = match cluster::prepare_again(&pipeline, &options, control_listener) {
                    Ok(prepared) => prepared,
                    Err(error) => return failed(error, report.metrics),
                };
            }
        })
    }

    /// `[pipeline] name`.
    pub fn name(&self) -> &str {
        self.handle.name()
    }

    /// Driver threads.
    pub fn threads(&self) -> u32 {
        self.handle.threads()
    }

    /// What recovery found worth telling (a resume, a fallback past damaged checkpoints).
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// Asks the job to stop its sources and drain (or take its final checkpoint).
    /// Idempotent; returns at once.
    pub fn stop(&self) {
        self.handle.stop();
    }

    /// A handle other threads (an HTTP API) keep to watch and stop the job while its
    /// owner waits for it.
    pub fn handle(&self) -> JobHandle {
        self.handle.clone()
    }

    /// A handle that stops the job from another thread (a signal handler).
    pub fn stop_handle(&self) -> StopHandle {
        self.handle.stop.clone()
    }

    pub fn status(&self) -> Status {
        self.handle.status()
    }

    /// The changes of the status from now on, the current status first.
    pub fn subscribe(&self) -> StatusStream {
        self.handle.subscribe()
    }

    /// The live counters (ask again after the state leaves `coordination`: a cluster's
    /// counters are made once it formed).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.handle.metrics()
    }

    /// Waits for the end and returns the report.
    pub fn wait(mut self) -> RunReport {
        let controller = self.controller.take().expect("a job is waited for once");
        match controller.join() {
            Ok(report) => report,
            Err(panic) => {
                let reason = panic_message(&*panic);
                let error = SluiceError::internal("run.panic", format!("the controller thread panicked: {reason}"));
                let outcome = RunOutcome::Failed { component: "controller".into(), error };
                self.handle.status.update(|s| {
                    s.state = JobState::Failed;
                    s.failure = Some(format!("controller: {reason}"));
                });
                RunReport {
                    outcome,
                    elapsed: Duration::ZERO,
                    stopped: self.handle.stop.is_requested(),
                    metrics: self.metrics(),
                    checkpoints: None,
                }
            }
        }
    }
}

/// This worker's part of a formed cluster, with the control session supervised beside
/// it; the report fails if any worker failed or was lost, and the flag says whether the
/// cluster re-forms (a lost worker, with checkpoints).
fn run_in_cluster(
    formed: Formed,
    stop: (StopHandle, crossbeam_channel::Receiver<()>),
    metrics_cell: &Mutex<Arc<Metrics>>,
    status: &Arc<StatusCell>,
    queries: &Mutex<QueryScope>,
) -> (RunReport, bool) {
    let Formed {
        compiled,
        part,
        control,
        membership,
        cancel_links,
        checkpointing,
        route,
        lease,
        resumed_from,
        loss_timeout,
        ..
    } = formed;
    let rejoin = checkpointing.is_some();
    let metrics = Arc::new(Metrics::for_plan(&compiled.plan, compiled.options.threads));
    *metrics_cell.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&metrics);
    let peers = membership
        .members
        .iter()
        .filter(|m| m.id != membership.me)
        .map(|m| crate::query::Peer { id: m.id, admin_addr: m.admin_addr.clone() })
        .collect();
    *queries.lock().unwrap_or_else(PoisonError::into_inner) =
        QueryScope::Cluster { registry: Arc::clone(&compiled.materialized), peers };
    let workers = membership.len();
    status.update(|s| {
        s.state = JobState::Starting;
        s.worker = Some((membership.me, workers));
        s.resumed_from = resumed_from;
    });
    let (stop, woken) = stop;
    let (done, local_done) = crossbeam_channel::bounded(1);
    let supervised = cluster::Supervised {
        stop: stop.clone(),
        cancel_links,
        local_done,
        metrics: Arc::clone(&metrics),
        local: part.layout.slots_of(part.worker),
        workers,
        shutdown_timeout: compiled.options.shutdown_timeout,
        route,
        rejoin,
        loss_timeout,
        status: Arc::clone(status),
    };
    let supervisor = std::thread::Builder::new()
        .name("sluice-cluster-control".into())
        .spawn(move || cluster::supervise(control, supervised));
    let mut report = run(compiled, checkpointing, Some(part), (stop.clone(), woken), metrics, status);
    let local = match &report.outcome {
        RunOutcome::Completed => Ok(()),
        RunOutcome::Failed { component, error } => {
            Err((format!("{component}: {error}"), error.kind == ErrorKind::LostPeer))
        }
    };
    // Capacity one, sent once.
    let _ = done.send(local);
    let (failure, rejoin) = match supervisor.map(|thread| thread.join()) {
        Ok(Ok(supervision)) => (supervision.failure, supervision.rejoin),
        Ok(Err(panic)) => {
            (Some(("cluster control".into(), SluiceError::internal("run.panic", panic_message(&*panic)))), false)
        }
        Err(error) => (Some(("cluster control".into(), SluiceError::external("run.thread", error.to_string()))), false),
    };
    // The cluster's failure names the lost or failed worker; a local failure that only
    // echoes it (a link that closed) yields to it.
    let echo = match &report.outcome {
        RunOutcome::Completed => true,
        RunOutcome::Failed { error, .. } => error.kind == ErrorKind::LostPeer,
    };
    if let (true, Some((component, error))) = (echo, failure) {
        report.outcome = RunOutcome::Failed { component, error };
    }
    // Every worker reported its end (or was lost): the next run may take the store.
    if let Some(Err(error)) = lease.map(Lease::release) {
        tracing::warn!(%error, "the store's lease could not be released");
    }
    // A stop requested meanwhile ends the job instead.
    (report, rejoin && !stop.is_requested())
}

/// Shows the sources paused (`paused`) or read again in the state, and returns the state:
/// `running` becomes `paused` and back; any other state stays.
pub(crate) fn show_paused(status: &StatusCell, paused: bool) -> JobState {
    let mut state = JobState::Running;
    status.update(|s| {
        s.state = match (s.state, paused) {
            (JobState::Running, true) => JobState::Paused,
            (JobState::Paused, false) => JobState::Running,
            (other, _) => other,
        };
        state = s.state;
    });
    state
}

/// What [`Job::handle`] gives: the job's name, status, counters and stop, shareable
/// across threads.
#[derive(Clone)]
pub struct JobHandle {
    name: String,
    threads: u32,
    /// The live counters: a cluster job's are replaced once the cluster formed (their
    /// shape depends on every worker's threads).
    metrics: Arc<Mutex<Arc<Metrics>>>,
    stop: StopHandle,
    status: Arc<StatusCell>,
    /// The dataflow it runs (this worker's compilation of it).
    explanation: Arc<crate::explain::Explanation>,
    /// Whether it takes checkpoints (a `[checkpoint]` section).
    checkpoints: bool,
    /// What a query reads: a cluster's job changes it as its rounds start and end.
    queries: Arc<Mutex<QueryScope>>,
}

/// The leader's id in a cluster's membership (the joiners are numbered from 1).
const LEADER_ID: u32 = 0;

/// What a query received by a job reads.
#[derive(Clone)]
enum QueryScope {
    /// A job on one worker: its tables hold every row.
    Solo(Arc<Materialized>),
    /// A cluster's job before a round runs: while it forms, or forms again after
    /// `why` (a lost worker).
    Forming { why: Option<String> },
    /// A cluster's round: this worker's slices, and the other workers to gather from.
    Cluster { registry: Arc<Materialized>, peers: Vec<crate::query::Peer> },
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle").field("name", &self.name).finish_non_exhaustive()
    }
}

impl JobHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This worker's driver threads.
    pub fn threads(&self) -> u32 {
        self.threads
    }

    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// The changes of the status from now on, the current status first.
    pub fn subscribe(&self) -> StatusStream {
        StatusStream::new(Arc::clone(&self.status))
    }

    /// The live counters (see [`Job::metrics`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Asks the job to stop (see [`Job::stop`]).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// The dataflow graph it runs, as `sluice explain` shows it.
    pub fn explanation(&self) -> Arc<crate::explain::Explanation> {
        Arc::clone(&self.explanation)
    }

    /// Pauses the sources: no lane is read until [`JobHandle::resume`]; rows in flight
    /// drain and checkpoints go on. In a cluster, asked of any worker, every worker's
    /// sources pause (this one's at once, the others' once the leader's word reaches
    /// them). Refused for a job that ended; idempotent otherwise. Returns the state
    /// after it (this worker's).
    pub fn pause(&self) -> Result<JobState, SluiceError> {
        self.set_paused(true)
    }

    /// Reads the sources again after [`JobHandle::pause`]; refused as `pause` is.
    pub fn resume(&self) -> Result<JobState, SluiceError> {
        self.set_paused(false)
    }

    fn set_paused(&self, paused: bool) -> Result<JobState, SluiceError> {
        let status = self.status();
        if status.state.is_final() {
            return Err(SluiceError::user("job.ended", format!("the job has {}", status.state.name()))
                .with_fix("start it again"));
        }
        // In a cluster the control session carries the flag to (or through) the leader,
        // which tells every worker (see `cluster::supervise`).
        if paused {
            self.stop.pause()
        } else {
            self.stop.resume()
        }
        Ok(show_paused(&self.status, paused))
    }

    /// Takes a checkpoint now and waits, at most `timeout`, until it is committed;
    /// returns its epoch (the first that started after the request). Refused without a
    /// `[checkpoint]` section, on a worker that follows a leader, when too many requests
    /// wait, and when the job ends first.
    pub fn checkpoint(&self, timeout: Duration) -> Result<u64, SluiceError> {
        if !self.checkpoints {
            return Err(SluiceError::user("checkpoint.unavailable", "this job takes no checkpoints")
                .with_fix("add a [checkpoint] section to the pipeline and run it again"));
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut changes = self.subscribe();
        let answer = self.stop.request_checkpoint().ok_or_else(|| {
            SluiceError::external(
                "checkpoint.requests_busy",
                format!("{} checkpoint requests already wait", sluice_runtime::controller::MAX_CHECKPOINT_REQUESTS),
            )
            .with_fix("wait for them to be answered, then ask again")
        })?;
        let follower = |status: &Status| status.worker.is_some_and(|(me, _)| me != 0);
        let epoch = loop {
            match answer.recv_timeout(Duration::from_millis(100)) {
                Ok(epoch) => break epoch,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if std::time::Instant::now() < deadline => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Err(request_timeout(timeout)),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) if follower(&self.status()) => {
                    return Err(SluiceError::user(
                        "checkpoint.not_leader",
                        "this worker follows its cluster's leader, which decides the checkpoints",
                    )
                    .with_fix("ask the leader's admin API (worker 0)"));
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(ended_before(None)),
            }
        };
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(status) = changes.next_timeout(left) else { return Err(request_timeout(timeout)) };
            if status.last_committed_epoch.is_some_and(|committed| committed >= epoch) {
                return Ok(epoch);
            }
            if status.state.is_final() {
                return Err(ended_before(Some(epoch)));
            }
        }
    }
}

impl JobHandle {
    /// Checks `sql` against the materialized tables and takes a lease on the newest
    /// checkpoint committed on all of them (see [`crate::query`]); run it with
    /// [`PreparedQuery::run`](crate::query::PreparedQuery::run).
    pub fn prepare_query(
        &self,
        sql: &str,
        limits: crate::query::QueryLimits,
    ) -> Result<crate::query::PreparedQuery, SluiceError> {
        match self.query_scope() {
            QueryScope::Solo(registry) => crate::query::prepare(&registry, sql, limits),
            QueryScope::Cluster { registry, peers } => {
                Ok(crate::query::prepare(&registry, sql, limits)?.with_peers(peers))
            }
            QueryScope::Forming { why } => Err(forming(why)),
        }
    }

    /// The leader of the cluster this worker follows, once it formed (None alone, on
    /// the leader, and while the cluster forms).
    pub fn leader(&self) -> Option<crate::query::Peer> {
        self.peers().into_iter().find(|peer| peer.id == LEADER_ID)
    }

    /// The other workers of this worker's cluster, once it formed (none alone).
    pub fn peers(&self) -> Vec<crate::query::Peer> {
        match self.query_scope() {
            QueryScope::Cluster { peers, .. } => peers,
            QueryScope::Solo(_) | QueryScope::Forming { .. } => Vec::new(),
        }
    }

    fn query_scope(&self) -> QueryScope {
        self.queries.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// This worker's materialized tables (its slices, in a cluster).
    fn registry(&self) -> Option<Arc<Materialized>> {
        match self.query_scope() {
            QueryScope::Solo(registry) | QueryScope::Cluster { registry, .. } => Some(registry),
            QueryScope::Forming { .. } => None,
        }
    }

    /// Takes a lease on this worker's newest committed epoch (waiting at most `timeout`
    /// for the first), ending after `timeout`: another worker of the cluster gathering
    /// this worker's slices for a query ([`crate::materialize::Lease::read_slice`]).
    pub fn lease_slices(&self, timeout: Duration) -> Result<Arc<crate::materialize::Lease>, SluiceError> {
        let registry = match self.query_scope() {
            QueryScope::Solo(registry) | QueryScope::Cluster { registry, .. } => registry,
            QueryScope::Forming { why } => return Err(forming(why)),
        };
        registry.lease(timeout, timeout).ok_or_else(|| {
            SluiceError::external(
                "query.no_checkpoint",
                format!("no checkpoint was committed on this worker within {} ms", timeout.as_millis()),
            )
            .with_fix("wait for the job's first checkpoint, or give a longer timeout")
        })
    }

    /// Prepares and runs `sql` (see [`JobHandle::prepare_query`]).
    pub fn query(
        &self,
        sql: &str,
        limits: crate::query::QueryLimits,
    ) -> Result<crate::query::QueryAnswer, SluiceError> {
        self.prepare_query(sql, limits)?.run()
    }

    /// The materialized tables' names and schemas (empty while a cluster forms).
    pub fn materialized_schemas(&self) -> Vec<(String, arrow::datatypes::SchemaRef)> {
        let Some(registry) = self.registry() else { return Vec::new() };
        registry
            .names()
            .into_iter()
            .filter_map(|name| registry.table(name))
            .map(|t| (t.name.clone(), Arc::clone(&t.schema)))
            .collect()
    }

    /// What `sql` would answer (its columns, its parameters' types) without running it
    /// ([`crate::query::describe`]).
    #[allow(clippy::type_complexity)]
    pub fn describe_query(
        &self,
        sql: &str,
    ) -> Result<(arrow::datatypes::SchemaRef, Vec<Option<arrow::datatypes::DataType>>), SluiceError> {
        match self.query_scope() {
            QueryScope::Solo(registry) | QueryScope::Cluster { registry, .. } => crate::query::describe(&registry, sql),
            QueryScope::Forming { why } => Err(forming(why)),
        }
    }

    /// Query leases live now.
    pub fn query_leases(&self) -> usize {
        self.registry().map_or(0, |m| m.leases())
    }

    /// Whether the sources wait for a checkpoint's commit now (the materialized tables'
    /// rows since the last commit are over their share of the state budget), and the
    /// seconds they waited so far.
    pub fn sources_held(&self) -> (bool, f64) {
        self.registry().map_or((false, 0.0), |m| {
            let (held, total) = m.held_back();
            (held, total.as_secs_f64())
        })
    }

    /// The materialized tables' names.
    pub fn materialized_tables(&self) -> Vec<String> {
        self.registry().map_or_else(Vec::new, |m| m.names().into_iter().map(String::from).collect())
    }
}

/// A cluster's job between rounds answers no query.
fn forming(why: Option<String>) -> SluiceError {
    let message = match why {
        None => "the cluster is forming: queries are answered once every worker runs".to_string(),
        Some(why) => format!("the cluster is not running a round (it forms again, or ended) after: {why}"),
    };
    SluiceError::external("query.cluster_forming", message)
        .with_fix("ask again once GET /status says running; restart a lost worker with the same command")
}

fn request_timeout(timeout: Duration) -> SluiceError {
    SluiceError::external(
        "checkpoint.request_timeout",
        format!("the checkpoint was not committed within {} s", timeout.as_secs()),
    )
    .with_fix("see the job's log for failed checkpoints; ask again later")
}

fn ended_before(epoch: Option<u64>) -> SluiceError {
    let what = epoch.map_or_else(|| "the checkpoint".to_string(), |epoch| format!("checkpoint {epoch}"));
    SluiceError::external("checkpoint.job_ended", format!("the job ended before {what} was committed"))
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The controller thread: runs the plan (this worker's part of it in a cluster),
/// keeping the status up to date until the final state, which the caller sets.
fn run(
    compiled: CompiledPipeline,
    checkpointing: Option<sluice_runtime::Checkpointing>,
    part: Option<ClusterRun>,
    stop: (StopHandle, crossbeam_channel::Receiver<()>),
    metrics: Arc<Metrics>,
    status: &StatusCell,
) -> RunReport {
    compiled.materialized.hold_with(&stop.0);
    let paused = stop.0.clone();
    let mut observe = |event: RunEvent| match event {
        // A pause asked for while the job started holds from its first poll.
        RunEvent::Started => status.update(|s| {
            s.state = if paused.is_paused() { JobState::Paused } else { JobState::Running };
        }),
        RunEvent::Stopping => status.update(|s| s.state = JobState::Stopping),
        RunEvent::Committed { epoch, record } => status.update(|s| {
            s.last_committed_epoch = Some(epoch);
            s.last_checkpoint = record;
        }),
    };
    sluice_runtime::run_part(&compiled.plan, &compiled.options, checkpointing, part, stop, metrics, &mut observe)
}

/// Starts the job's controller thread on `body`, which runs it and returns its report;
/// the report's outcome then becomes the job's final state.
fn launch(
    handle: JobHandle,
    notices: Vec<String>,
    body: impl FnOnce() -> RunReport + Send + 'static,
) -> Result<Job, EngineError> {
    let status = Arc::clone(&handle.status);
    let watched = handle.clone();
    let controller = std::thread::Builder::new()
        .name("sluice-controller".into())
        .spawn(move || {
            // A panic (a bug) still ends the job in a final state, so that whoever
            // watches its status sees the failure instead of waiting forever.
            let started = std::time::Instant::now();
            let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|panic| {
                let error = SluiceError::internal(
                    "run.panic",
                    format!("the controller thread panicked: {}", panic_message(&*panic)),
                );
                RunReport {
                    outcome: RunOutcome::Failed { component: "controller".into(), error },
                    elapsed: started.elapsed(),
                    stopped: watched.stop.is_requested(),
                    metrics: watched.metrics(),
                    checkpoints: None,
                }
            });
            finish(&status, &report);
            report
        })
        .map_err(|e| EngineError::new(SluiceError::external("run.thread", format!("cannot start a thread: {e}"))))?;
    Ok(Job { handle, notices, controller: Some(controller) })
}

/// Publishes the report's outcome as the final state.
fn finish(status: &StatusCell, report: &RunReport) {
    status.update(|s| match &report.outcome {
        RunOutcome::Completed => s.state = JobState::Completed,
        RunOutcome::Failed { component, error } => {
            s.state = JobState::Failed;
            s.failure = Some(format!("{component}: {error}"));
        }
    });
}
