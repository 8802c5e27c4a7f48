//! A cluster job as a library caller sees it: the leader's state is `coordination` until
//! every worker joined, then it runs as worker 0 of 2; a rendezvous that never completes
//! fails the job with the reason.

use std::path::Path;
use std::time::Duration;

use crate::{ClusterOptions, ClusterRole, ControlSettings, Engine, Job, JobState, Overrides, RunOutcome};

const PIPELINE: &str = r#"
[pipeline]
name = "cluster"
threads = 1

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = 20000

[[sink]]
name = "out"
from = "bid"
connector = "blackhole"
"#;

fn pipeline(dir: &Path) -> crate::Pipeline {
    Engine::default().parse(PIPELINE, "cluster.toml", dir, Overrides::default()).expect("valid")
}

fn options(role: ClusterRole, join_timeout: Duration) -> ClusterOptions {
    ClusterOptions {
        role,
        exchange_bind: "127.0.0.1:0".parse().expect("address"),
        advertise: None,
        secret: None,
        insecure: false,
        join_timeout,
        control: ControlSettings::default(),
        from_scratch: false,
        admin_addr: None,
    }
}

#[test]
fn the_leader_is_in_coordination_until_every_worker_joined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lead = ClusterRole::Lead { workers: 2, control_bind: "127.0.0.1:0".parse().expect("address") };
    let mut address = None;
    let leader = Job::start_cluster(pipeline(dir.path()), options(lead, Duration::from_secs(60)), &mut |listening| {
        address = Some(listening.control_addr.to_string());
    })
    .expect("the leader listens");
    assert_eq!(leader.status().state, JobState::Coordination, "no worker joined yet");
    // Watched from before the worker starts, so the first state seen is `coordination`.
    let mut changes = leader.subscribe();
    let address = address.expect("the leader announced its address");
    let joiner_dir = tempfile::tempdir().expect("tempdir");
    let joiner = Job::start_cluster(
        pipeline(joiner_dir.path()),
        options(ClusterRole::Join { leader: address }, Duration::from_secs(60)),
        &mut |_| {},
    )
    .expect("the worker starts");
    let mut states = Vec::new();
    let mut worker = None;
    while states.last().is_none_or(|state: &JobState| !state.is_final()) {
        if let Some(status) = changes.next_timeout(Duration::from_secs(60)) {
            worker = worker.or(status.worker);
            states.push(status.state);
        }
    }
    assert_eq!(states.first(), Some(&JobState::Coordination));
    assert_eq!(states.last(), Some(&JobState::Completed), "{states:?}");
    assert_eq!(worker, Some((0, 2)), "the leader is worker 0 of 2");
    let (leader, joiner) = (leader.wait(), joiner.wait());
    assert_eq!((leader.outcome, joiner.outcome), (RunOutcome::Completed, RunOutcome::Completed));
    assert_eq!(leader.metrics.rows_out(), 18400, "the leader's counters cover both workers");
}

#[test]
fn a_cluster_that_never_forms_fails_the_job_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lead = ClusterRole::Lead { workers: 3, control_bind: "127.0.0.1:0".parse().expect("address") };
    let job = Job::start_cluster(pipeline(dir.path()), options(lead, Duration::from_millis(200)), &mut |_| {})
        .expect("the leader listens");
    let report = job.wait();
    let RunOutcome::Failed { component, error } = report.outcome else { panic!("the job fails") };
    assert_eq!(component, "cluster");
    assert!(error.message.contains("2 of 3 workers are missing"), "{}", error.message);
}

/// The control session a follower lost, as the session reports it.
fn session_lost(leader: &str) -> sluice_types::SluiceError {
    sluice_types::SluiceError::external(
        "cluster.peer_lost",
        format!("the control session with the leader at {leader} is lost: it closed the connection"),
    )
    .with_kind(sluice_types::ErrorKind::LostPeer)
}

/// Checks what a follower says after losing the session with the leader at `leader`,
/// given the leader's answer and whether the pipeline checkpoints: the error's code,
/// words its message has, and words its fix has and has not.
fn check(answer: Result<(), String>, checkpoints: bool, expected: (&str, &[&str], &str, &str)) {
    let leader = "10.0.0.1:7100";
    let (code, said, fix, never) = expected;
    let error = crate::cluster::leader_loss(&session_lost(leader), leader, answer, checkpoints);
    assert_eq!(error.code, code, "{error}");
    assert_eq!(error.kind, sluice_types::ErrorKind::LostPeer);
    for words in said.iter().chain([&leader, &"is lost: it closed the connection"]) {
        assert!(error.message.contains(words), "{words:?} missing: {}", error.message);
    }
    let given = error.fix.unwrap_or_default();
    assert!(given.contains(fix) && !given.contains(never), "{given}");
}

/// The finding: a follower frozen past the loss timeout (SIGSTOP, then SIGCONT) said
/// "lost the leader … restart every worker (the leader first)" while the leader ran on,
/// forming the cluster again and waiting for this worker alone. What the follower says
/// now follows what the leader's control address answers.
#[test]
fn a_follower_that_lost_its_leader_says_what_to_restart_by_whether_the_leader_answers() {
    let every = "restart every worker with the same command (the leader first)";
    let only = "restart only this worker";
    let expelled: &[&str] = &["dropped this worker", "still answers", "declared this worker lost"];
    check(Ok(()), true, ("cluster.expelled", expelled, only, every));
    check(Ok(()), false, ("cluster.run_lost", &["lost the leader", "still answers", "no checkpoints"], every, only));
    let refused = Err("nothing listens there (connection refused)".to_string());
    let gone: &[&str] = &["lost the leader", "does not answer", "connection refused"];
    check(refused, true, ("cluster.leader_lost", gone, every, only));
}

/// The same choice over real sockets: a leader that runs (here waiting for workers to
/// join, as it does while it forms the cluster again) answers; once it is gone, the
/// follower is told to restart everything.
#[test]
fn a_follower_asks_the_leaders_control_address_whether_it_runs() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let leader = listener.local_addr().expect("an address").to_string();
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let settings = ControlSettings { cancel: Some(std::sync::Arc::clone(&cancel)), ..ControlSettings::default() };
    let me = sluice_cluster::rendezvous::WorkerInfo::new("127.0.0.1:7000", 1, "fp");
    let forming = std::thread::spawn(move || {
        sluice_cluster::rendezvous::lead_with(listener, me, 3, None, Duration::from_secs(300), &settings)
    });
    let error = crate::cluster::leader_lost(&session_lost(&leader), &leader, true);
    assert_eq!(error.code, "cluster.expelled", "{error}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("restart only this worker")), "{error}");
    cancel.store(true, std::sync::atomic::Ordering::Release);
    let ended = forming.join().expect("no panic").expect_err("cancelled");
    assert_eq!(ended.code, "cluster.cancelled", "{ended}");
    let error = crate::cluster::leader_lost(&session_lost(&leader), &leader, true);
    assert_eq!(error.code, "cluster.leader_lost", "{error}");
    assert!(error.message.contains("nothing listens there"), "{error}");
}
