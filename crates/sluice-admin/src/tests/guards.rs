//! The API against a hostile browser page and slow clients: cross-site requests, a
//! rebound Host and non-JSON POSTs are refused while the job runs on; idle, slow and
//! surplus connections are closed, and `/healthz` answers while 100 slow ones are open.
//! Every wait is on an event (an answer, a closed connection) with a deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use sluice_engine::JobState;

use super::{DEADLINE, PIPELINE, Served, http};

/// What a cross-site page sends: its own Origin, a simple request's Content-Type.
fn cross_site(addr: SocketAddr, path: &str, body_type: &str) -> http::Reply {
    http::request(addr, "POST", path, &[("Origin", "http://evil.example"), ("Content-Type", body_type)])
}

#[test]
fn cross_site_requests_are_refused_and_the_job_runs_on() {
    let served = Served::start(None);
    served.wait_for(JobState::Running);
    let addr = served.addr();
    for path in ["/stop", "/pause", "/checkpoint", "/query", "/internal/status"] {
        for body_type in ["text/plain", "application/x-www-form-urlencoded", "application/json"] {
            let refused = cross_site(addr, path, body_type);
            assert_eq!(refused.code, 403, "{path} {body_type}: {}", refused.body);
            assert!(refused.json()["error"].as_str().is_some_and(|e| e.contains("evil.example")), "{}", refused.body);
        }
        // A page whose name was re-pointed at 127.0.0.1 (DNS rebinding): same-origin to
        // the browser, but its Host is its own name.
        let rebound = http::request(
            addr,
            "POST",
            path,
            &[("Host", "evil.example:80"), ("Origin", "http://evil.example:80"), ("Content-Type", "application/json")],
        );
        assert_eq!(rebound.code, 403, "{path}: {}", rebound.body);
        // Not a browser, but not JSON either.
        let plain = http::request(addr, "POST", path, &[("Content-Type", "text/plain")]);
        assert_eq!(plain.code, 415, "{path}: {}", plain.body);
        assert!(plain.json()["fix"].as_str().is_some_and(|fix| fix.contains("application/json")), "{}", plain.body);
    }
    let read = http::request(addr, "GET", "/status", &[("Host", "evil.example")]);
    assert_eq!(read.code, 403, "a rebound page reads nothing: {}", read.body);
    let navigated = http::request(addr, "GET", "/status", &[("Sec-Fetch-Site", "cross-site")]);
    assert_eq!(navigated.code, 403, "{}", navigated.body);
    assert_eq!(served.job().status().state, JobState::Running, "nothing stopped or paused the job");
    // The page's own requests pass: same origin, JSON.
    let own_origin = format!("http://{addr}");
    let own = [("Origin", own_origin.as_str()), ("Sec-Fetch-Site", "same-origin")];
    assert_eq!(http::request(addr, "GET", "/status", &own[1..]).code, 200);
    let stop = http::request(addr, "POST", "/stop", &[&own[..], &[("Content-Type", "application/json")]].concat());
    assert_eq!(stop.code, 202, "{}", stop.body);
    let localhost = http::request(addr, "GET", "/healthz", &[("Host", &format!("localhost:{}", addr.port()))]);
    assert_eq!(localhost.code, 200, "{}", localhost.body);
}

/// A connection that sent the start of a request's head and no more.
fn slow(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    stream.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").as_bytes()).expect("send");
    stream
}

/// Whether the server closed `stream` without answering (an end or a reset), waiting
/// at most the test's deadline; false when it answered.
fn closed_unanswered(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted) => {
            true
        }
        Err(e) => panic!("the server neither answered nor closed the connection: {e}"),
    }
}

#[test]
fn healthz_answers_while_100_slow_connections_are_open() {
    let served = Served::start(None);
    let addr = served.addr();
    let open: Vec<TcpStream> = (0..100).map(|_| slow(addr)).collect();
    let health = http::get(addr, "/healthz");
    assert_eq!((health.code, health.body.trim()), (200, "ok"));
    let status = http::get(addr, "/status");
    assert_eq!(status.code, 200, "{}", status.body);
    drop(open);
}

#[test]
fn connections_past_the_per_peer_cap_are_closed_at_once() {
    // A head timeout far beyond the test's run: only the cap closes connections here.
    let limits = crate::Limits {
        connections_max: 8,
        connections_per_peer_max: 3,
        header_timeout: DEADLINE * 10,
        body_timeout: DEADLINE * 10,
    };
    let served = Served::start_limited(PIPELINE, &[], None, limits);
    let addr = served.addr();
    let held: Vec<TcpStream> = (0..3).map(|_| slow(addr)).collect();
    // A whole request, but a fourth connection from this peer: closed unanswered.
    let mut surplus = TcpStream::connect(addr).expect("connect");
    surplus.set_read_timeout(Some(DEADLINE)).expect("timeout");
    // The server may close it before the request is written; either way it is refused.
    let _ = surplus.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes());
    assert!(closed_unanswered(&mut surplus), "a connection past the per-peer cap was served");
    drop(held);
}

#[test]
fn a_head_or_body_that_never_ends_is_cut_off() {
    let limits = crate::Limits {
        header_timeout: Duration::from_millis(200),
        body_timeout: Duration::from_millis(200),
        ..crate::Limits::default()
    };
    let served = Served::start_limited(PIPELINE, &[], None, limits);
    let addr = served.addr();
    let mut idle = TcpStream::connect(addr).expect("connect");
    idle.set_read_timeout(Some(DEADLINE)).expect("timeout");
    assert!(closed_unanswered(&mut idle), "a connection that sends nothing is closed");
    let mut slowloris = slow(addr);
    assert!(closed_unanswered(&mut slowloris), "a head that never ends is closed");
    // A body that never comes: the query answers why (400), rather than wait forever.
    let mut body = TcpStream::connect(addr).expect("connect");
    body.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let head = format!(
        "POST /query HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\
         Connection: close\r\n\r\n{{\"sql\":"
    );
    body.write_all(head.as_bytes()).expect("send");
    let mut answer = String::new();
    // The server answers, then closes; a reset after the answer is fine.
    let _ = body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("did not arrive within 200 ms"), "{answer}");
}
