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
