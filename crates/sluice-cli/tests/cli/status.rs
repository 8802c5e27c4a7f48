//! `sluice status --addr`: against a running pipeline, its lines (stdout is a pipe: plain
//! lines) name the state and the counters and keep coming; it ends with the job, exit 0;
//! with a token required, it needs the token; a wrong address is an error naming it.
//! Every wait is on a line or an exit.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Instant;

use crate::admin::{DEADLINE, PIPELINE, Running, request_with};
use crate::harness::{Scratch, assert_fails_with, sluice_command};

#[test]
fn status_follows_a_running_job_to_its_end() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    scratch.write("token", "watch-token\n");
    let mut run = Running::start(&scratch, &["run", "pipeline.toml", "--admin-token-file", "token"]);
    let addr = run.admin_addr().to_string();
    let mut watcher = sluice_command(scratch.dir.path())
        .args(["status", "--addr", &addr, "--token-file", "token"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice status");
    let out = watcher.stdout.take().expect("stdout");
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    // Lines until the job runs and one shows rows moving at a rate (heartbeat lines carry
    // the counters, once the API sampled them twice).
    while !seen
        .iter()
        .any(|l: &String| l.starts_with("running") && l.contains("in nexmark") && l.contains("/s, watermark lag"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).unwrap_or_else(|_| panic!("no running line in time: {seen:#?}"));
        seen.push(line);
    }
    let running = seen.last().expect("a line");
    assert!(
        running.contains("alone") && running.contains("checkpoint none") && running.contains("out out"),
        "{running}"
    );
    let (code, answer) = request_with(run.admin_addr_known(), "POST", "/stop", Some("watch-token"));
    assert_eq!(code, 202, "{answer}");
    // It ends with the job: its last line is the final state.
    let mut rest = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => rest.push(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("sluice status did not end with the job: {rest:#?}"),
        }
    }
    let status = watcher.wait().expect("wait for sluice status");
    assert_eq!(status.code(), Some(0), "{rest:#?}");
    assert!(rest.last().is_some_and(|l| l.starts_with("completed")), "{rest:#?}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "{text}");
}

#[test]
fn status_without_the_token_or_at_a_wrong_address_says_what_to_do() {
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    scratch.write("token", "watch-token\n");
    let mut run = Running::start(&scratch, &["run", "pipeline.toml", "--admin-token-file", "token"]);
    let addr = run.admin_addr().to_string();
    let refused = scratch.sluice(&["status", "--addr", &addr]);
    assert_fails_with(&refused, &["unauthorized", "--token-file"]);
    let closed = scratch.sluice(&["status", "--addr", "127.0.0.1:1"]);
    assert_fails_with(&closed, &["127.0.0.1:1", "--addr"]);
    let (code, answer) = request_with(run.admin_addr_known(), "POST", "/stop", Some("watch-token"));
    assert_eq!(code, 202, "{answer}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "{text}");
}
