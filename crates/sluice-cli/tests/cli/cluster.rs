//! Clusters of `sluice` processes on loopback: the leader prints the command the others
//! run, the workers join, rows cross processes through the exchange links, and the
//! output equals a run on one worker with as many threads. Mismatched workers are
//! refused on both sides. With checkpoints, a cluster killed at a failpoint resumes
//! exactly once, on as many workers or fewer.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Stdio};

use crate::golden::output;
use crate::harness::{Scratch, assert_fails_with, sluice_command, sorted_lines, stderr};

const NEXMARK: &str = r#"
[pipeline]
name = "cluster"
threads = THREADS

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = 60000

[[view]]
name = "counts"
sql = "SELECT auction, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end"

[[sink]]
name = "out"
from = "counts"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#;

const FILES: &str = r#"
[pipeline]
name = "cluster-files"
threads = THREADS

[[source]]
name = "events"
connector = "file"
format = "json"
schema = "k VARCHAR, v BIGINT, ts TIMESTAMP(3)"
event_time = "ts"
[source.options]
path = "events.jsonl"
split_bytes = 4096

[[view]]
name = "sums"
sql = "SELECT k, COUNT(*) AS n, SUM(v) AS total, window_start FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY k, window_start, window_end"

[[sink]]
name = "out"
from = "sums"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#;

/// A worker process and its stderr.
struct Worker {
    child: Child,
    stderr: BufReader<ChildStderr>,
    seen: String,
}

impl Worker {
    fn start(scratch: &Scratch, args: &[&str]) -> Worker {
        let mut child = sluice_command(scratch.dir.path())
            .args(["run", "pipeline.toml"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        Worker { child, stderr, seen: String::new() }
    }

    /// Reads stderr until a line contains `needle` (or it ends); returns that line.
    fn until(&mut self, needle: &str) -> String {
        loop {
            let mut line = String::new();
            let read = self.stderr.read_line(&mut line).expect("stderr");
            self.seen.push_str(&line);
            if read == 0 || line.contains(needle) {
                return line;
            }
        }
    }

    /// Waits for the exit; returns the code and everything written to stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        self.until("\u{0}");
        (self.child.wait().expect("wait").code(), self.seen)
    }
}

/// Starts a leader of `workers` on an ephemeral control port; returns it and the
/// address its printed join command names.
fn lead(scratch: &Scratch, workers: usize, extra: &[&str]) -> (Worker, String) {
    let count = workers.to_string();
    let mut args = vec!["--workers", &count, "--control-bind", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut leader = Worker::start(scratch, &args);
    let line = leader.until("--join ");
    let address = line
        .split("--join ")
        .nth(1)
        .unwrap_or_else(|| panic!("no join command in:\n{}", leader.seen))
        .trim()
        .to_string();
    (leader, address)
}

/// Runs `pipeline` on one worker per entry of `threads` (worker i with `threads[i]`
/// threads, as hosts with different cores), each in its own directory holding `files`;
/// returns the merged output of every worker.
fn cluster_output(pipeline: &str, threads: &[u32], files: &[(&str, &str)]) -> Vec<String> {
    cluster_run(pipeline, threads, files).0
}

/// [`cluster_output`], and the leader's stderr (its exit report covers every worker).
fn cluster_run(pipeline: &str, threads: &[u32], files: &[(&str, &str)]) -> (Vec<String>, String) {
    let scratches: Vec<Scratch> = threads.iter().map(|_| Scratch::new()).collect();
    for (scratch, threads) in scratches.iter().zip(threads) {
        scratch.write("pipeline.toml", &pipeline.replace("THREADS", &threads.to_string()));
        for (name, text) in files {
            scratch.write(name, text);
        }
    }
    let (leader, address) = lead(&scratches[0], threads.len(), &[]);
    let joiners: Vec<Worker> = scratches[1..].iter().map(|s| Worker::start(s, &["--join", &address])).collect();
    let mut leader_report = String::new();
    for (index, worker) in std::iter::once(leader).chain(joiners).enumerate() {
        let (code, seen) = worker.finish();
        assert_eq!(code, Some(0), "worker {index}:\n{seen}");
        if index == 0 {
            leader_report = seen;
        }
    }
    let mut lines: Vec<String> = scratches.iter().flat_map(|s| sorted_lines(&output(s, "out"))).collect();
    lines.sort();
    (lines, leader_report)
}

/// The same pipeline on one worker with `threads` threads.
fn solo_output(pipeline: &str, threads: u32, files: &[(&str, &str)]) -> Vec<String> {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline.replace("THREADS", &threads.to_string()));
    for (name, text) in files {
        scratch.write(name, text);
    }
    let run = scratch.sluice(&["--quiet", "run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    sorted_lines(&output(&scratch, "out"))
}

fn events() -> String {
    (0..6000)
        .map(|i| {
            let millis = i * 3;
            format!(
                "{{\"k\": \"k{}\", \"v\": {i}, \"ts\": \"2026-01-01 00:00:{:02}.{:03}\"}}\n",
                i % 17,
                millis / 1000,
                millis % 1000
            )
        })
        .collect()
}

#[test]
fn two_workers_of_nexmark_write_what_one_worker_with_two_threads_writes() {
    let solo = solo_output(NEXMARK, 2, &[]);
    assert!(solo.len() > 1000, "a real workload: {} windows", solo.len());
    let (lines, report) = cluster_run(NEXMARK, &[1, 1], &[]);
    assert_eq!(lines, solo);
    // 60000 events hold 55200 bids; the leader's report adds the joiner's counts.
    assert!(report.contains("source nexmark: 55200 rows in"), "{report}");
    assert!(report.contains(&format!("sink out: {} rows out", solo.len())), "{report}");
    // Rows crossed the link both ways (the joiner's direction comes in its report).
    for direction in ["exchange worker 0 to 1: bytes sent: ", "exchange worker 1 to 0: bytes sent: "] {
        let line =
            report.lines().find(|line| line.contains(direction)).unwrap_or_else(|| panic!("{direction}\n{report}"));
        let bytes: u64 = line.rsplit(": ").next().and_then(|n| n.trim().parse().ok()).expect("a count");
        assert!(bytes > 0, "{line}");
    }
}

#[test]
fn three_workers_of_file_lanes_write_what_one_worker_with_three_threads_writes() {
    let events = events();
    let files = [("events.jsonl", events.as_str())];
    let solo = solo_output(FILES, 3, &files);
    assert!(solo.len() > 300, "{} windows", solo.len());
    assert_eq!(cluster_output(FILES, &[1, 1, 1], &files), solo);
}

#[test]
fn workers_with_different_thread_counts_write_what_one_worker_with_all_their_threads_writes() {
    let events = events();
    let files = [("events.jsonl", events.as_str())];
    let solo = solo_output(FILES, 4, &files);
    assert_eq!(cluster_output(FILES, &[1, 3], &files), solo);
    assert_eq!(cluster_output(NEXMARK, &[3, 1], &[]), solo_output(NEXMARK, 4, &[]));
}

#[test]
fn a_reachable_exchange_address_without_a_secret_is_refused_before_the_run() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &NEXMARK.replace("THREADS", "1"));
    for role in [&["--workers", "2"][..], &["--join", "127.0.0.1:1"][..]] {
        let mut args = vec!["run", "pipeline.toml", "--exchange-bind", "0.0.0.0:0"];
        args.extend(role);
        let run = scratch.sluice(&args);
        assert_fails_with(&run, &["the exchange address 0.0.0.0:0", "--exchange-bind", "--insecure"]);
    }
}

#[test]
fn a_worker_with_another_pipeline_is_refused_by_both_sides() {
    let (leading, joining) = (Scratch::new(), Scratch::new());
    leading.write("pipeline.toml", &NEXMARK.replace("THREADS", "1"));
    joining
        .write("pipeline.toml", &NEXMARK.replace("THREADS", "1").replace("INTERVAL '1' SECOND", "INTERVAL '2' SECOND"));
    let (mut leader, address) = lead(&leading, 2, &["--join-timeout", "20s"]);
    let joiner = Worker::start(&joining, &["--join", &address]);
    let (code, seen) = joiner.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(
        seen.contains("fingerprint") && seen.contains("pipeline.toml"),
        "the joiner names the mismatch and the fix:\n{seen}"
    );
    leader.until("fingerprint");
    let (code, seen) = leader.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("fingerprint"), "the leader logs the refusal:\n{seen}");
    assert!(seen.contains("1 of 2 workers are missing"), "then gives up naming who is missing:\n{seen}");
}

/// FILES with exactly-once checkpoints every 10 ms into `shared`'s `state` and output in
/// its `out` (absolute paths: every worker reaches the same store and directory), ten
/// rows per batch so that a run takes many checkpoints, and 30 ms windows (as long as a
/// batch of rows) so that almost every checkpoint has output staged on every worker.
fn checkpointed_files(shared: &Scratch) -> String {
    let store = format!(
        "\n[checkpoint]\ninterval = \"10ms\"\nstore = \"file://{}\"\n\n[[source]]",
        shared.path("state").display()
    );
    FILES
        .replace("THREADS", "1")
        .replace("INTERVAL '1' SECOND", "INTERVAL '30' MILLISECOND")
        .replacen("[pipeline]\n", "[pipeline]\nbatch_size = 10\n", 1)
        .replacen("\n[[source]]", &store, 1)
        .replace("path = \"out/\"", &format!("path = \"{}/\"", shared.path("out").display()))
}

/// A worker's directory with the checkpointed pipeline and its input.
fn checkpointed_worker(shared: &Scratch) -> Scratch {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &checkpointed_files(shared));
    scratch.write("events.jsonl", &events());
    scratch
}

/// The output of the checkpointed pipeline run to its end, uninterrupted, alone.
fn checkpointed_reference() -> Vec<String> {
    let shared = Scratch::new();
    let worker = checkpointed_worker(&shared);
    let run = worker.sluice(&["--quiet", "run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let lines = sorted_lines(&output(&shared, "out"));
    assert!(lines.len() > 100, "a real workload: {} windows", lines.len());
    lines
}

/// One epoch per batch (each lane waits for the next barrier after every batch), and a
/// SIGKILL at `crash` when given.
fn failpoints(crash: Option<&str>) -> String {
    match crash {
        Some(crash) => format!("source.barrier_after_batch=return;{crash}"),
        None => "source.barrier_after_batch=return".to_string(),
    }
}

impl Worker {
    fn start_with(scratch: &Scratch, args: &[&str], failpoints: &str) -> Worker {
        let mut child = sluice_command(scratch.dir.path())
            .args(["run", "pipeline.toml"])
            .args(args)
            .env("SLUICE_FAILPOINTS", failpoints)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        Worker { child, stderr, seen: String::new() }
    }
}

/// Leads `leading` and joins `joining` to it, each with its failpoints.
fn start_pair(
    leading: &Scratch,
    leader_failpoints: &str,
    joining: &Scratch,
    joiner_failpoints: &str,
) -> (Worker, Worker) {
    let mut leader =
        Worker::start_with(leading, &["--workers", "2", "--control-bind", "127.0.0.1:0"], leader_failpoints);
    let line = leader.until("--join ");
    let address =
        line.split("--join ").nth(1).unwrap_or_else(|| panic!("no join in:\n{}", leader.seen)).trim().to_string();
    let joiner = Worker::start_with(joining, &["--join", &address], joiner_failpoints);
    (leader, joiner)
}

/// Runs a leader and a joiner to their ends, both successfully; returns what each said.
fn resume_pair(leading: &Scratch, joining: &Scratch) -> (String, String) {
    let (leader, joiner) = start_pair(leading, &failpoints(None), joining, &failpoints(None));
    let (leader_code, leader_seen) = leader.finish();
    let (joiner_code, joiner_seen) = joiner.finish();
    let both = format!("leader:\n{leader_seen}\njoiner:\n{joiner_seen}");
    assert_eq!((leader_code, joiner_code), (Some(0), Some(0)), "{both}");
    (leader_seen, joiner_seen)
}

fn killed(worker: Worker, who: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let mut worker = worker;
    worker.until("\u{0}");
    let status = worker.child.wait().expect("wait");
    assert_eq!(status.signal(), Some(9), "the {who} was to die at its failpoint:\n{}", worker.seen);
    worker.seen
}

/// The leader dies right after publishing checkpoint 100 (windows closed on both
/// workers by then), before any sink committed it;
/// the other worker fails naming the lost leader. Both restart: every worker commits
/// its own staged output of checkpoint 100, resumes its lanes and state, and the output
/// equals an uninterrupted run's (nothing lost, nothing twice).
#[test]
fn a_cluster_resumes_exactly_once_after_its_leader_dies_between_publish_and_commit() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let (leading, joining) = (checkpointed_worker(&shared), checkpointed_worker(&shared));
    let crash = failpoints(Some("checkpoint.after_publish=99*off->return(kill)"));
    let (leader, joiner) = start_pair(&leading, &crash, &joining, &failpoints(None));
    killed(leader, "leader");
    let (code, seen) = joiner.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("lost the leader"), "{seen}");

    let (leader_seen, joiner_seen) = resume_pair(&leading, &joining);
    assert!(leader_seen.contains("resuming from checkpoint 100"), "{leader_seen}");
    assert!(joiner_seen.contains("resuming from checkpoint 100"), "{joiner_seen}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// A joining worker dies after writing its state for checkpoint 100, before the leader
/// could publish it. The leader waits for it to come back; restarted with the same
/// command, it joins, both resume from checkpoint 99 (the part of 100 that the lost
/// worker wrote is never named by a manifest) and the output is exactly once.
#[test]
fn a_cluster_resumes_exactly_once_after_a_worker_dies_while_writing_its_state() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let (leading, joining) = (checkpointed_worker(&shared), checkpointed_worker(&shared));
    let crash = failpoints(Some("checkpoint.after_state_written=99*off->return(kill)"));
    let (mut leader, joiner) = start_pair(&leading, &failpoints(None), &joining, &crash);
    let address =
        leader.seen.split("--join ").nth(1).expect("a join command").lines().next().unwrap_or("").trim().to_string();
    killed(joiner, "joining worker");
    leader.until("forming the cluster again");
    let joiner = Worker::start_with(&joining, &["--join", &address], &failpoints(None));
    let (leader_code, leader_seen) = leader.finish();
    let (joiner_code, joiner_seen) = joiner.finish();
    let both = format!("leader:\n{leader_seen}\njoiner:\n{joiner_seen}");
    assert_eq!((leader_code, joiner_code), (Some(0), Some(0)), "{both}");
    assert!(leader_seen.contains("worker 1 was lost"), "the leader names the lost worker:\n{both}");
    assert!(joiner_seen.contains("resuming from checkpoint 99"), "{both}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// Three workers; one dies while writing its state for checkpoint 100. The leader tells
/// the other to stop and join again, forms the cluster anew once the dead worker is
/// restarted with the same command, and all three resume from checkpoint 99 and run to
/// the end: the output equals an uninterrupted run's, and every process exits 0.
#[test]
fn a_lost_worker_restarted_with_the_same_command_rejoins_and_the_cluster_resumes() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let workers: Vec<Scratch> = (0..3).map(|_| checkpointed_worker(&shared)).collect();
    let mut leader =
        Worker::start_with(&workers[0], &["--workers", "3", "--control-bind", "127.0.0.1:0"], &failpoints(None));
    let line = leader.until("--join ");
    let address = line.split("--join ").nth(1).expect("a join command").trim().to_string();
    let survivor = Worker::start_with(&workers[1], &["--join", &address], &failpoints(None));
    let crash = failpoints(Some("checkpoint.after_state_written=99*off->return(kill)"));
    let doomed = Worker::start_with(&workers[2], &["--join", &address], &crash);
    killed(doomed, "third worker");
    leader.until("forming the cluster again");
    let restarted = Worker::start_with(&workers[2], &["--join", &address], &failpoints(None));
    let mut seen = Vec::new();
    let mut codes = Vec::new();
    for worker in [leader, survivor, restarted] {
        let (code, text) = worker.finish();
        codes.push(code);
        seen.push(text);
    }
    let all = seen.join("\n-----\n");
    assert_eq!(codes, [Some(0), Some(0), Some(0)], "{all}");
    assert!(seen[0].contains("was lost"), "the leader says which worker it lost:\n{all}");
    assert!(seen[2].contains("resuming from checkpoint 99"), "{all}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// A follower frozen (SIGSTOP) past the loss timeout, then thawed (SIGCONT): the leader,
/// alive, forms the cluster again and waits for it. The follower does not say that the
/// leader is gone and every worker needs a restart: it says that it itself did not run,
/// and that only it needs restarting; restarted alone, it joins again and the output is
/// an uninterrupted run's.
#[test]
fn a_frozen_follower_says_that_only_it_needs_restarting() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let workers: Vec<Scratch> = (0..2).map(|_| checkpointed_worker(&shared)).collect();
    // The follower says when its tenth checkpoint's state is written: it runs by then.
    let noted = failpoints(Some("checkpoint.after_state_written=9*off->1*return(note)"));
    let (mut leader, mut follower) = start_pair(&workers[0], &failpoints(None), &workers[1], &noted);
    follower.until("failpoint checkpoint.after_state_written reached");
    let signal = |name: &str, worker: &Worker| {
        let status = std::process::Command::new("kill").args([name, &worker.child.id().to_string()]).status();
        assert!(status.is_ok_and(|status| status.success()), "kill {name}");
    };
    signal("-STOP", &follower);
    leader.until("forming the cluster again");
    signal("-CONT", &follower);
    let (code, said) = follower.finish();
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("did not run for") && said.contains("restart only this worker"), "{said}");
    assert!(!said.contains("restart every worker with the same command (the leader first)"), "{said}");
    let line = leader.seen.lines().find(|line| line.contains("--join ")).expect("the join command").to_string();
    let address = line.split("--join ").nth(1).expect("an address").trim().to_string();
    let restarted = Worker::start_with(&workers[1], &["--join", &address], &failpoints(None));
    let (leader_code, leader_said) = leader.finish();
    let (restarted_code, restarted_said) = restarted.finish();
    assert_eq!((leader_code, restarted_code), (Some(0), Some(0)), "{leader_said}\n-----\n{restarted_said}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// The leader dies right after publishing checkpoint 100: neither worker committed it. The
/// pipeline resumes on one worker, fewer than wrote the checkpoint: it restores every
/// vnode and lane, commits its own staged output of checkpoint 100 and the lost worker's
/// (in the shared directory), and the output equals an uninterrupted run's.
#[test]
fn a_cluster_checkpoint_resumes_on_fewer_workers() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let (leading, joining) = (checkpointed_worker(&shared), checkpointed_worker(&shared));
    let crash = failpoints(Some("checkpoint.after_publish=99*off->return(kill)"));
    let (leader, joiner) = start_pair(&leading, &crash, &joining, &failpoints(None));
    killed(leader, "leader");
    let (code, seen) = joiner.finish();
    assert_eq!(code, Some(1), "{seen}");

    let run = leading.sluice(&["run", "pipeline.toml"]);
    let text = stderr(&run);
    assert!(run.status.success(), "{text}");
    assert!(text.contains("resuming from checkpoint 100"), "{text}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// One worker alone dies right after publishing checkpoint 100; the pipeline resumes on
/// two workers (more than wrote the checkpoint): each restores the vnodes and lanes its
/// slots now own, the leader commits the staged output of checkpoint 100, and the output
/// equals an uninterrupted run's.
#[test]
fn a_solo_checkpoint_resumes_on_more_workers() {
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let (leading, joining) = (checkpointed_worker(&shared), checkpointed_worker(&shared));
    let crashed = sluice_command(leading.dir.path())
        .args(["run", "pipeline.toml"])
        .env("SLUICE_FAILPOINTS", failpoints(Some("checkpoint.after_publish=99*off->return(kill)")))
        .stdout(Stdio::null())
        .output()
        .expect("run sluice");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&crashed.status), Some(9), "{}", stderr(&crashed));
    let (leader_seen, joiner_seen) = resume_pair(&leading, &joining);
    assert!(leader_seen.contains("resuming from checkpoint 100"), "{leader_seen}");
    assert!(joiner_seen.contains("resuming from checkpoint 100"), "{joiner_seen}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference);
}

/// An endless pipeline (a rate-limited source without an event count).
fn endless() -> String {
    NEXMARK.replace("THREADS", "1").replace("events = 60000", "rate = 2000")
}

/// Starts a leader and one joiner of `endless()`, both running.
fn running_pair() -> (Scratch, Scratch, Worker, Worker) {
    let (leading, joining) = (Scratch::new(), Scratch::new());
    leading.write("pipeline.toml", &endless());
    joining.write("pipeline.toml", &endless());
    let (mut leader, address) = lead(&leading, 2, &[]);
    let mut joiner = Worker::start(&joining, &["--join", &address]);
    leader.until("running pipeline");
    joiner.until("running pipeline");
    (leading, joining, leader, joiner)
}

fn kill(worker: &Worker) {
    let status = std::process::Command::new("kill").args(["-KILL", &worker.child.id().to_string()]).status();
    assert!(status.expect("kill").success());
}

#[test]
fn a_killed_worker_fails_the_leader_naming_it() {
    let (_leading, _joining, leader, joiner) = running_pair();
    kill(&joiner);
    let (code, seen) = leader.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(
        seen.contains("in worker 1:") && seen.contains("lost"),
        "the leader's outcome names the lost worker:\n{seen}"
    );
    assert!(!seen.contains("panic"), "a lost peer is no panic:\n{seen}");
    let _ = joiner.finish();
}

#[test]
fn a_killed_leader_fails_every_worker_saying_how_to_restart() {
    let (_leading, _joining, leader, joiner) = running_pair();
    kill(&leader);
    let (code, seen) = joiner.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("lost the leader") && seen.contains("restart"), "{seen}");
    let _ = leader.finish();
}

const DEADLINE_SECONDS: u64 = 60;

/// Backpressure across hosts: the leader's sink (stdout, which runs on the leader and
/// gathers every row) stops being read, so the leader stops taking rows from the link;
/// the joiner's credit runs out, its queues fill, and its driver stops polling its lane.
/// The joiner notes every poll of its lane (a failpoint); an unthrottled NEXMark lane
/// that is still polled is polled many times a second, so a whole second without a poll
/// means the lane paused. A lane that never pauses fails at the deadline (checked: with
/// the leader's stdout read, the test fails). The joiner's memory is measured then.
#[test]
fn a_blocked_sink_on_the_leader_pauses_the_other_workers_lanes_within_bounded_memory() {
    let pipeline = NEXMARK
        .replace("THREADS", "1")
        .replace("events = 60000", "first_event_rate = 1000000")
        .replace(
            "sql = \"SELECT auction, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end\"",
            "sql = \"SELECT auction, price FROM bid\"",
        )
        .replace("connector = \"file\"", "connector = \"stdout\"")
        .replace("[sink.options]\npath = \"out/\"\n", "");
    let (leading, joining) = (Scratch::new(), Scratch::new());
    leading.write("pipeline.toml", &pipeline);
    joining.write("pipeline.toml", &pipeline);
    let mut leader = sluice_command(leading.dir.path())
        .args(["run", "pipeline.toml", "--workers", "2", "--control-bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the leader");
    let mut leader_err = BufReader::new(leader.stderr.take().expect("stderr"));
    let address = loop {
        let mut line = String::new();
        assert!(leader_err.read_line(&mut line).expect("stderr") > 0, "the leader ended before printing its address");
        if let Some(address) = line.split("--join ").nth(1) {
            break address.trim().to_string();
        }
    };
    let mut joiner = sluice_command(joining.dir.path())
        .args(["run", "pipeline.toml", "--join", &address])
        .env("SLUICE_FAILPOINTS", "source.poll=return(note)")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the joiner");
    // Rows reach the leader's stdout; from now on nobody reads it.
    let mut stdout = BufReader::new(leader.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("a row");
    assert!(first.contains("auction"), "{first:?}");
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&polls);
    let joiner_err = joiner.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(joiner_err).lines().map_while(Result::ok) {
            if line.contains("failpoint source.poll reached") {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    // Paused: a second without a single poll (an unthrottled lane that is polled at all
    // is polled many times a second). Never pausing fails at the deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(DEADLINE_SECONDS);
    let mut last = polls.load(std::sync::atomic::Ordering::Relaxed);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let now = polls.load(std::sync::atomic::Ordering::Relaxed);
        if now == last && now > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the joiner kept polling its lane while the leader's sink was blocked: {now} polls"
        );
        last = now;
    }
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", joiner.id()))
        .expect("the joiner's status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .expect("VmRSS");
    let _ = leader.kill();
    let _ = joiner.kill();
    let _ = (leader.wait(), joiner.wait());

    assert!(rss_kib < 512 * 1024, "the joiner's memory grew to {} MiB", rss_kib / 1024);
}

#[test]
fn a_single_writer_sink_runs_on_the_worker_it_names() {
    let pipeline = NEXMARK
        .replace("THREADS", "1")
        .replace("path = \"out/\"", "path = \"out.jsonl\"")
        .replace("connector = \"file\"\nformat = \"json\"", "connector = \"file\"\nformat = \"json\"\nworker = 1");
    assert!(pipeline.contains("worker = 1"), "{pipeline}");
    let (leading, joining) = (Scratch::new(), Scratch::new());
    leading.write("pipeline.toml", &pipeline);
    joining.write("pipeline.toml", &pipeline);
    let (leader, address) = lead(&leading, 2, &[]);
    let joiner = Worker::start(&joining, &["--join", &address]);
    for (name, worker) in [("leader", leader), ("joiner", joiner)] {
        let (code, seen) = worker.finish();
        assert_eq!(code, Some(0), "{name}:\n{seen}");
    }
    assert!(!leading.path("out.jsonl").exists(), "the leader writes nothing");
    let written = sorted_lines(&joining.read("out.jsonl"));
    let solo = Scratch::new();
    solo.write("pipeline.toml", &NEXMARK.replace("THREADS", "2").replace("path = \"out/\"", "path = \"out.jsonl\""));
    assert!(solo.sluice(&["--quiet", "run", "pipeline.toml"]).status.success());
    assert_eq!(written, sorted_lines(&solo.read("out.jsonl")), "worker 1 wrote every row");

    // One worker has no worker 1; a sink with one part per thread cannot be placed.
    let alone = Scratch::new();
    alone.write("pipeline.toml", &pipeline);
    let run = alone.sluice(&["run", "pipeline.toml"]);
    crate::harness::assert_fails_with(&run, &["sink `out` runs on worker 1", "--workers"]);
    let sharded = Scratch::new();
    sharded.write("pipeline.toml", &pipeline.replace("path = \"out.jsonl\"", "path = \"out/\""));
    let run = sharded.sluice(&["validate", "pipeline.toml"]);
    crate::harness::assert_fails_with(&run, &["`worker = 1`", "one part per thread"]);
}

#[test]
fn a_worker_reading_another_input_file_is_refused() {
    let (leading, joining) = (Scratch::new(), Scratch::new());
    for scratch in [&leading, &joining] {
        scratch.write("pipeline.toml", &FILES.replace("THREADS", "1"));
    }
    let events = events();
    leading.write("events.jsonl", &events);
    joining.write("events.jsonl", &events.replacen("\"v\": 0,", "\"v\": 1,", 1));
    let (mut leader, address) = lead(&leading, 2, &["--join-timeout", "20s"]);
    let joiner = Worker::start(&joining, &["--join", &address]);
    let (code, seen) = joiner.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("inputs") && seen.contains("the same input files"), "{seen}");
    leader.until("refused");
    let _ = leader.child.kill();
    let _ = leader.finish();
}

#[test]
fn the_kubernetes_manifests_pipeline_is_valid() {
    let manifest = std::fs::read_to_string(crate::harness::crate_dir().join("../../deploy/kubernetes/sluice.yaml"))
        .expect("deploy/kubernetes/sluice.yaml");
    let block = manifest.split("pipeline.toml: |\n").nth(1).expect("the ConfigMap's pipeline").split("\n---").next();
    let pipeline: String = block
        .expect("a block")
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    assert!(pipeline.contains("[pipeline]"), "{pipeline}");
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &pipeline);
    let validated = scratch.sluice(&["validate", "pipeline.toml"]);
    assert!(validated.status.success(), "{}", stderr(&validated));
}

/// The Kubernetes guide's restart path: a pod killed for its memory is restarted with the
/// same command, on the same host name, in a new pid namespace. The killed run (here in a
/// pid namespace of its own, under `unshare`, dying right after publishing a checkpoint)
/// leaves its lease, which nobody refreshes any more; the restart breaks it once its
/// heartbeat has been silent for its expiry, without `sluice checkpoints unlock`, and
/// resumes exactly once. Skipped where pid namespaces cannot be made.
#[test]
fn a_run_killed_in_another_container_resumes_without_unlock() {
    let probe = std::process::Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).output();
    if !probe.is_ok_and(|probe| probe.status.success()) {
        eprintln!("SKIPPED: cannot make a pid namespace here (unshare --pid needs root)");
        return;
    }
    let reference = checkpointed_reference();
    let shared = Scratch::new();
    let worker = checkpointed_worker(&shared);
    // `sh` is the namespace's first process: a first process ignores the SIGKILL it
    // raises itself, and the failpoint's kill must land on sluice.
    let killed = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", "\"$0\" \"$@\"; exit $?"])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["--quiet", "run", "pipeline.toml"])
        .current_dir(worker.dir.path())
        .env("SLUICE_FAILPOINTS", failpoints(Some("checkpoint.after_publish=3*off->return(kill)")))
        .output()
        .expect("run sluice under unshare");
    assert!(
        stderr(&killed).contains("killing the process"),
        "the first run dies at its failpoint: {}",
        stderr(&killed)
    );
    let restarted = worker.sluice(&["--quiet", "run", "pipeline.toml"]);
    let text = stderr(&restarted);
    assert!(restarted.status.success(), "{text}");
    assert!(text.contains("broke the stale lease") && text.contains("did not refresh it"), "{text}");
    assert_eq!(sorted_lines(&output(&shared, "out")), reference, "the restart resumes exactly once");
}

/// A join across workers: both inputs are routed by the key's hash to the worker that
/// owns its vnode, each through its own exchange, so the rows of a key meet wherever
/// they were read.
const NEXMARK_JOIN: &str = r#"
[pipeline]
name = "cluster-join"
threads = THREADS

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = 60000

[[view]]
name = "sellers"
sql = "SELECT P.name, P.city, A.id, A.category FROM auction AS A INNER JOIN person AS P ON A.seller = P.id WHERE A.category < 12"

[[sink]]
name = "out"
from = "sellers"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#;

#[test]
fn two_workers_join_what_one_worker_with_two_threads_joins() {
    let solo = solo_output(NEXMARK_JOIN, 2, &[]);
    assert!(solo.len() > 1000, "a real workload: {} joined rows", solo.len());
    assert_eq!(cluster_output(NEXMARK_JOIN, &[1, 1], &[]), solo);
}

/// Sends SIGTERM to the `stopped` worker ("leader" or "joiner") and checks that both
/// then drain and exit 0; returns each one's stderr and both together for messages.
fn stop_one_of(stopped: &str, leader: Worker, joiner: Worker) -> (String, String, String) {
    let target = if stopped == "leader" { &leader } else { &joiner };
    let status = std::process::Command::new("kill").args(["-TERM", &target.child.id().to_string()]).status();
    assert!(status.expect("kill").success());
    let (leader_code, leader_seen) = leader.finish();
    let (joiner_code, joiner_seen) = joiner.finish();
    let both = format!("{stopped} stopped\nleader:\n{leader_seen}\njoiner:\n{joiner_seen}");
    assert_eq!((leader_code, joiner_code), (Some(0), Some(0)), "{both}");
    assert!(leader_seen.contains("stopped and drained") && joiner_seen.contains("stopped and drained"), "{both}");
    (leader_seen, joiner_seen, both)
}

/// A stop of a checkpointed cluster, asked of either worker: every worker takes the final
/// checkpoint and leaves cleanly (its drivers exit without ending their outputs, so the
/// links are closed rather than drained; a drain waited out the shutdown timeout and
/// failed the run).
#[test]
fn a_stopped_checkpointed_cluster_exits_cleanly_on_every_worker() {
    for stopped in ["leader", "joiner"] {
        let shared = Scratch::new();
        let pipeline = endless().replacen(
            "\n[[source]]",
            &format!(
                "\n[checkpoint]\ninterval = \"50ms\"\nstore = \"file://{}\"\n\n[[source]]",
                shared.path("state").display()
            ),
            1,
        );
        let (leading, joining) = (Scratch::new(), Scratch::new());
        leading.write("pipeline.toml", &pipeline);
        joining.write("pipeline.toml", &pipeline);
        let (mut leader, mut joiner) = start_pair(&leading, "", &joining, "");
        leader.until("running pipeline");
        joiner.until("running pipeline");
        let (leader_seen, joiner_seen, both) = stop_one_of(stopped, leader, joiner);
        // The leader publishes (it knows the sizes); the joiner only committed.
        assert!(leader_seen.contains(" published (last epoch "), "{both}");
        assert!(joiner_seen.contains(" committed as the leader published them (last epoch "), "{both}");
    }
}

/// A stop of a cluster without checkpoints, asked of either worker, stops the whole
/// cluster: every worker's sources stop, everything read drains, and every worker exits 0
/// (a joiner once stopped its own sources only, and waited out the shutdown timeout for
/// inputs from the leader that never ended).
#[test]
fn a_stop_asked_of_any_worker_drains_the_whole_cluster() {
    for stopped in ["joiner", "leader"] {
        let (_leading, _joining, leader, joiner) = running_pair();
        stop_one_of(stopped, leader, joiner);
    }
}

/// A leader whose workers never join gives back the checkpoint store's lease: the next
/// run, from any host, finds the store free (no stale lease to break or unlock).
#[test]
fn a_cluster_that_never_formed_leaves_no_lease() {
    let shared = Scratch::new();
    let leading = checkpointed_worker(&shared);
    let (leader, _address) = lead(&leading, 2, &["--join-timeout", "1s"]);
    // Taken before the join command is printed.
    let lease = shared.path("state").join("lease");
    assert!(lease.exists(), "the waiting leader holds the lease at {}", lease.display());
    let (code, seen) = leader.finish();
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("missing"), "{seen}");
    assert!(!lease.exists(), "the lease was left behind at {}:\n{seen}", lease.display());
}

/// A stop asked while the cluster forms ends the wait at once: a leader waiting for its
/// workers, and a worker whose leader is not up (or is still gathering the others), each
/// leave within the test's deadline instead of at `--join-timeout` (ten minutes here).
#[test]
fn a_stop_while_the_cluster_forms_ends_the_wait() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &endless());
    let (mut leader, address) = lead(&scratch, 3, &["--join-timeout", "10m"]);
    let joining = Scratch::new();
    joining.write("pipeline.toml", &endless());
    // One of the two workers joins: it waits for the leader to gather the third.
    let mut waiting = Worker::start(&joining, &["--join", &address, "--join-timeout", "10m"]);
    leader.until("2 of 3 present");
    // A worker whose leader never comes up.
    let nowhere = Scratch::new();
    nowhere.write("pipeline.toml", &endless());
    let mut lonely = Worker::start(&nowhere, &["--join", "127.0.0.1:1", "--join-timeout", "10m"]);
    // Its signal handling is in place once the admin API is announced.
    lonely.until("admin API on");
    waiting.until("admin API on");
    // The workers first (the leader stopping would end the waiting worker's wait too).
    for (worker, waited) in [
        (lonely, "stopped while connecting to the leader at 127.0.0.1:1"),
        (waiting, "stopped while waiting for the leader"),
        (leader, "stopped while waiting for workers to join"),
    ] {
        let status = std::process::Command::new("kill").args(["-TERM", &worker.child.id().to_string()]).status();
        assert!(status.expect("kill").success());
        let (code, seen) = worker.finish();
        assert_eq!(code, Some(1), "{seen}");
        assert!(seen.contains(waited), "{seen}");
        assert!(!seen.contains("second"), "one signal is a first one:\n{seen}");
    }
}
