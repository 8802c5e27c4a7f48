//! A client that goes away while its query holds a lease releases it, as over HTTP
//! (`sluice-cli/tests/cli/query.rs`, `a_lease_ends_when_its_client_goes_away`): the
//! query stops at a failpoint right after its lease was taken, the `psql` process is
//! killed, and the job's lease count goes back to 0; later queries are answered. The same
//! for a query cancelled by psql's Ctrl-C (a cancel request). A test
//! binary of its own: the failpoint is the process's.

mod common;

use std::time::Instant;

use common::{DEADLINE, Served, TOTALS, psql_command, stderr, stdout};

#[test]
fn a_lease_ends_when_its_client_goes_away_mid_answer_or_cancels() {
    let served = Served::start(None);
    let handle = served.job().handle();
    let wait_for = |want: usize| {
        let deadline = Instant::now() + DEADLINE;
        while handle.query_leases() != want {
            assert!(Instant::now() < deadline, "leases never became {want}: {}", handle.query_leases());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    assert_eq!(handle.query_leases(), 0);
    // The next query holds its lease and stops at the failpoint (until it is removed).
    sluice_types::failpoint::fail::cfg("query.leased", "1*pause").expect("failpoint");
    // The lease would otherwise live for the query's timeout: longer than the deadline.
    let query = ["-c", "SET statement_timeout = '300s'", "-c", "SELECT k, n, total FROM totals ORDER BY k"];
    let mut client = psql_command(served.addr(), None, &query)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("runs psql");
    wait_for(1);
    // The client vanishes while the query holds the lease: its socket closes.
    client.kill().expect("kill psql");
    client.wait().expect("psql ends");
    wait_for(0);
    // The paused execution goes on (its lease is gone) and later queries are answered.
    sluice_types::failpoint::fail::remove("query.leased");
    let after = served.psql(None, &["-A", "-t", "-c", "SELECT k, n, total FROM totals ORDER BY k"]);
    assert!(after.status.success(), "{}", stderr(&after));
    assert_eq!(stdout(&after), TOTALS);
    assert_eq!(handle.query_leases(), 0);

    // psql's Ctrl-C sends a cancel request on a connection of its own: the query ends
    // (57014) and its lease with it.
    sluice_types::failpoint::fail::cfg("query.leased", "1*pause").expect("failpoint");
    let client = psql_command(served.addr(), None, &query)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs psql");
    wait_for(1);
    let interrupted = std::process::Command::new("kill").args(["-INT", &client.id().to_string()]).status();
    assert!(interrupted.expect("runs kill").success());
    let cancelled = client.wait_with_output().expect("psql ends");
    wait_for(0);
    sluice_types::failpoint::fail::remove("query.leased");
    assert!(!cancelled.status.success());
    assert!(stderr(&cancelled).contains("canceling statement due to user request"), "{}", stderr(&cancelled));
}
