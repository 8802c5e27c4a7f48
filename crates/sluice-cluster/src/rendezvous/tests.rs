//! The rendezvous and the control sessions over real sockets on 127.0.0.1. Every wait is
//! on a channel with a generous deadline ([`WAIT`]); no test sleeps or asserts on timing.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, bounded, unbounded};
use sluice_types::ErrorKind;

use super::leader::{self, Gathering};
use super::stream::read_until;
use super::*;
use crate::auth::{Role, authenticate};
use crate::wire::{ControlMessage, FrameReader, WIRE_VERSION, frame_of};

/// How long a test waits for anything before failing.
const WAIT: Duration = Duration::from_secs(60);
const LEADER_EXCHANGE: &str = "127.0.0.1:7000";
const FINGERPRINT: &str = "fp-1";

/// Settings that never fire on a loaded machine unless a test wants them to.
fn settings() -> ControlSettings {
    ControlSettings {
        heartbeat_interval: Duration::from_millis(100),
        loss_timeout: WAIT,
        handshake_timeout: WAIT,
        write_timeout: WAIT,
        progress_interval: Duration::from_millis(500),
        events: None,
        cancel: None,
    }
}

type Led = Result<(Membership, LeaderControl), SluiceError>;
type Joined = Result<(Membership, WorkerControl), SluiceError>;

/// A leader running on its own thread.
struct Leading {
    address: String,
    outcome: Receiver<Led>,
    events: Receiver<RendezvousEvent>,
}

fn start_leader_on(
    listener: TcpListener,
    workers: usize,
    secret: Option<Secret>,
    settings: ControlSettings,
    join_timeout: Duration,
    wire_version: u16,
) -> Leading {
    let address = listener.local_addr().expect("an address").to_string();
    let (events_tx, events) = unbounded();
    let settings = ControlSettings { events: Some(events_tx), ..settings };
    let (outcome_tx, outcome) = bounded(1);
    let me = WorkerInfo::new(LEADER_EXCHANGE, 2, FINGERPRINT);
    let gathering = Gathering { workers, join_timeout, wire_version };
    thread::spawn(move || {
        let _ = outcome_tx.send(leader::lead(listener, me, secret.as_ref(), gathering, &settings));
    });
    Leading { address, outcome, events }
}

fn start_leader(workers: usize, secret: Option<Secret>, settings: ControlSettings) -> Leading {
    start_leader_on(bind(), workers, secret, settings, WAIT, WIRE_VERSION)
}

fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

fn start_joiner_as(address: &str, me: WorkerInfo, secret: Option<Secret>, wire_version: u16) -> Receiver<Joined> {
    let (outcome_tx, outcome) = bounded(1);
    let address = address.to_string();
    thread::spawn(move || {
        let _ = outcome_tx.send(joiner::join(&address, me, secret.as_ref(), WAIT, &settings(), wire_version));
    });
    outcome
}

fn start_joiner(address: &str, exchange: &str, threads: u32) -> Receiver<Joined> {
    start_joiner_as(address, WorkerInfo::new(exchange, threads, FINGERPRINT), None, WIRE_VERSION)
}

fn wait<T>(channel: &Receiver<T>, what: &str) -> T {
    channel.recv_timeout(WAIT).unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
}

fn joined(channel: &Receiver<Joined>) -> (Membership, WorkerControl) {
    wait(channel, "join outcome").unwrap_or_else(|error| panic!("the join failed: {error}"))
}

fn refused(channel: &Receiver<Joined>) -> SluiceError {
    match wait(channel, "join outcome") {
        Ok((membership, _)) => panic!("joined as {membership:?} instead of being refused"),
        Err(error) => error,
    }
}

fn led(leading: &Leading) -> (Membership, LeaderControl) {
    wait(&leading.outcome, "rendezvous outcome").unwrap_or_else(|error| panic!("the rendezvous failed: {error}"))
}

/// The next rendezvous event that `pick` accepts (others are skipped).
fn next_event<T>(events: &Receiver<RendezvousEvent>, mut pick: impl FnMut(RendezvousEvent) -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = events.recv_timeout(left).unwrap_or_else(|_| panic!("no such rendezvous event within {WAIT:?}"));
        if let Some(picked) = pick(event) {
            return picked;
        }
    }
}

/// The leader's refusal of the next connection it refused.
fn next_refusal(events: &Receiver<RendezvousEvent>) -> (SocketAddr, SluiceError) {
    next_event(events, |event| match event {
        RendezvousEvent::Refused { peer, error } => Some((peer, error)),
        _ => None,
    })
}

fn contains_all(error: &SluiceError, parts: &[&str]) {
    let shown = error.to_string();
    for part in parts {
        assert!(shown.contains(part), "{part:?} is not in: {shown}");
    }
}

fn summary(membership: &Membership) -> Vec<(u32, String, u32)> {
    membership.members.iter().map(|m| (m.id, m.exchange_addr.clone(), m.threads)).collect()
}

fn next_control<M>(events: &Receiver<ControlEvent<M>>) -> ControlEvent<M> {
    wait(events, "control event")
}

#[test]
fn three_workers_settle_the_same_membership_and_run_a_checkpoint_round_trip() {
    let leading = start_leader(3, None, settings());
    let second = start_joiner(&leading.address, "127.0.0.1:7002", 3);
    let first = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let (membership, control) = led(&leading);
    let (first_membership, first_control) = joined(&first);
    let (second_membership, second_control) = joined(&second);
    let expected = [(0, "127.0.0.1:7000", 2), (1, "127.0.0.1:7001", 1), (2, "127.0.0.1:7002", 3)]
        .map(|(i, a, t)| (i, a.into(), t));
    assert_eq!(summary(&membership), expected);
    assert_eq!((membership.me, first_membership.me, second_membership.me), (0, 1, 2));
    for other in [&first_membership, &second_membership] {
        assert_eq!((&other.members, &other.fingerprint), (&membership.members, &membership.fingerprint));
    }
    let formed = next_event(&leading.events, |event| match event {
        RendezvousEvent::Formed { members } => Some(members),
        _ => None,
    });
    assert_eq!(formed, membership.members);
    assert_eq!(control.workers().collect::<Vec<_>>(), [1, 2]);

    let workers = [(1u32, &first_control), (2, &second_control)];
    control.broadcast(&ToWorker::Barrier { epoch: 1, final_epoch: false }).expect("barrier sent");
    for (id, worker) in workers {
        let barrier = ControlEvent::Received { peer: 0, message: ToWorker::Barrier { epoch: 1, final_epoch: false } };
        assert_eq!(next_control(worker.events()), barrier);
        worker.send(&ToLeader::Acked { epoch: 1, part: vec![id as u8; 3] }).expect("ack sent");
    }
    let mut acks = BTreeSet::new();
    for _ in 0..2 {
        match next_control(control.events()) {
            ControlEvent::Received { peer, message: ToLeader::Acked { epoch: 1, part } } => acks.insert((peer, part)),
            other => panic!("expected an ack, got {other:?}"),
        };
    }
    assert_eq!(acks, BTreeSet::from([(1, vec![1; 3]), (2, vec![2; 3])]));
    for (id, worker) in workers {
        control.send(id, &ToWorker::Commit { epoch: 1, final_epoch: false }).expect("commit sent");
        assert_eq!(
            next_control(worker.events()),
            ControlEvent::Received { peer: 0, message: ToWorker::Commit { epoch: 1, final_epoch: false } }
        );
    }
    control.broadcast(&ToWorker::Stop).expect("stop sent");
    for (id, worker) in workers {
        assert_eq!(next_control(worker.events()), ControlEvent::Received { peer: 0, message: ToWorker::Stop });
        worker.send(&ToLeader::Finished { report: format!("report {id}").into_bytes() }).expect("report sent");
    }
    let mut reports = BTreeSet::new();
    for _ in 0..2 {
        match next_control(control.events()) {
            ControlEvent::Received { peer, message: ToLeader::Finished { report } } => reports.insert((peer, report)),
            other => panic!("expected a report, got {other:?}"),
        };
    }
    assert_eq!(reports, BTreeSet::from([(1, b"report 1".to_vec()), (2, b"report 2".to_vec())]));
    assert_eq!(control.send(3, &ToWorker::Stop).expect_err("no worker 3").code, "cluster.no_such_worker");

    // The leader goes away: each worker loses it, once.
    drop(control);
    for (_, worker) in workers {
        match next_control(worker.events()) {
            ControlEvent::Lost { peer: 0, error } => {
                assert_eq!(error.kind, ErrorKind::LostPeer);
                contains_all(&error, &["the leader at", "closed the connection"]);
            }
            other => panic!("expected the leader's loss, got {other:?}"),
        }
        assert_eq!(worker.send(&ToLeader::Heartbeat).expect_err("lost").kind, ErrorKind::LostPeer);
    }
}

#[test]
fn a_solo_leader_returns_at_once() {
    let (membership, control) = leader::lead(
        bind(),
        WorkerInfo::new(LEADER_EXCHANGE, 4, FINGERPRINT),
        None,
        Gathering { workers: 1, join_timeout: WAIT, wire_version: WIRE_VERSION },
        &settings(),
    )
    .expect("solo");
    assert_eq!(summary(&membership), [(0, LEADER_EXCHANGE.to_string(), 4)]);
    assert!(membership.is_leader());
    assert_eq!(control.workers().count(), 0);
    assert_eq!(control.broadcast(&ToWorker::Stop), Ok(()));
    assert_eq!(control.events().try_recv(), Err(crossbeam_channel::TryRecvError::Empty));
}

#[test]
fn settings_are_checked() {
    let bad = ControlSettings { loss_timeout: Duration::from_millis(100), ..settings() };
    let error = lead_with(bind(), WorkerInfo::new(LEADER_EXCHANGE, 1, FINGERPRINT), 2, None, WAIT, &bad);
    assert_eq!(error.expect_err("refused").code, "cluster.settings");
    let zero = ControlSettings { write_timeout: Duration::ZERO, ..settings() };
    let error = join_with("127.0.0.1:1", WorkerInfo::new("a:1", 1, FINGERPRINT), None, WAIT, &zero);
    assert_eq!(error.expect_err("refused").code, "cluster.settings");
}

#[test]
fn a_wire_version_mismatch_is_refused_by_both_sides() {
    let (ours, newer) = (WIRE_VERSION, WIRE_VERSION + 1);
    let speaks = |version: u16| format!("speaks version {version}");
    let leader_speaks = |version: u16| format!("the leader speaks version {version}");
    // A joiner on a newer version: the leader refuses, names both, keeps waiting.
    let leading = start_leader(2, None, settings());
    let joining = start_joiner_as(&leading.address, WorkerInfo::new("127.0.0.1:7001", 1, FINGERPRINT), None, newer);
    let error = refused(&joining);
    assert_eq!(error.code, "cluster.refused");
    contains_all(&error, &[&speaks(newer), &leader_speaks(ours), "same sluice version"]);
    let (_, error) = next_refusal(&leading.events);
    assert_eq!(error.code, "cluster.wire_version");
    contains_all(&error, &["the joining worker at 127.0.0.1:", &speaks(newer), &leader_speaks(ours)]);
    let good = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let (membership, _control) = led(&leading);
    assert_eq!(joined(&good).0.members, membership.members);

    // A leader on a newer version, a joiner on this build's.
    let leading = start_leader_on(bind(), 2, None, settings(), WAIT, newer);
    let error = refused(&start_joiner(&leading.address, "127.0.0.1:7001", 1));
    contains_all(&error, &[&speaks(ours), &leader_speaks(newer)]);
    let (_, error) = next_refusal(&leading.events);
    contains_all(&error, &[&speaks(ours), &leader_speaks(newer)]);
}

/// A leader that authenticates (no secret), reads a registration, answers with
/// `answer(register)`, then reports what the joiner sent back.
fn fake_leader(answer: impl FnOnce(&Register) -> Vec<u8> + Send + 'static) -> (String, Receiver<ControlMessage>) {
    let listener = bind();
    let address = listener.local_addr().expect("an address").to_string();
    let (reply_tx, reply) = bounded(1);
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        stream.set_read_timeout(Some(WAIT)).expect("timeout");
        authenticate(&mut stream, None, Role::Acceptor).expect("authenticated");
        let mut reader = FrameReader::new(WIRE_VERSION);
        let Ok(ControlMessage::Register(register)) = read_until(&stream, &mut reader, Instant::now() + WAIT) else {
            panic!("no registration");
        };
        stream.write_all(&answer(&register)).expect("answered");
        if let Ok(message) = read_until(&stream, &mut reader, Instant::now() + WAIT) {
            let _ = reply_tx.send(message);
        }
    });
    (address, reply)
}

fn welcome_for(register: &Register, fingerprint: &str) -> Welcome {
    let others = [(register.exchange_addr.clone(), register.threads, register.admin_addr.clone())];
    Welcome { members: Membership::settle((LEADER_EXCHANGE, 2, ""), &others), you: 1, fingerprint: fingerprint.into() }
}

#[test]
fn a_joiner_checks_the_welcome_and_tells_the_leader_why_it_refuses() {
    let newer = WIRE_VERSION + 1;
    let (address, reply) =
        fake_leader(move |register| frame_of(&welcome_for(register, FINGERPRINT), newer).expect("frame"));
    let error = refused(&start_joiner(&address, "127.0.0.1:7001", 1));
    assert_eq!(error.code, "cluster.wire_version");
    let (theirs, ours) = (format!("speaks version {newer}"), format!("speaks version {WIRE_VERSION}"));
    contains_all(&error, &["the leader at", &theirs, &format!("this joining worker {ours}")]);
    let ControlMessage::Refusal(text) = wait(&reply, "the joiner's refusal") else { panic!("not a refusal") };
    assert!(text.contains(&theirs) && text.contains(&ours), "{text}");

    let (address, reply) =
        fake_leader(|register| frame_of(&welcome_for(register, "fp-9"), WIRE_VERSION).expect("frame"));
    let error = refused(&start_joiner(&address, "127.0.0.1:7001", 1));
    assert_eq!(error.code, "cluster.fingerprint_mismatch");
    contains_all(&error, &["has fingerprint fp-9", "has fp-1", "same pipeline.toml"]);
    let ControlMessage::Refusal(text) = wait(&reply, "the joiner's refusal") else { panic!("not a refusal") };
    assert!(text.contains("fp-9") && text.contains("fp-1"), "{text}");

    let (address, _reply) = fake_leader(|register| {
        let mut welcome = welcome_for(register, FINGERPRINT);
        welcome.you = 0;
        frame_of(&welcome, WIRE_VERSION).expect("frame")
    });
    let error = refused(&start_joiner(&address, "127.0.0.1:7001", 1));
    assert_eq!(error.code, "cluster.bad_welcome");
}

#[test]
fn a_fingerprint_mismatch_is_refused_by_both_sides() {
    let leading = start_leader(2, None, settings());
    let other = WorkerInfo::new("127.0.0.1:7001", 1, "fp-2");
    let error = refused(&start_joiner_as(&leading.address, other, None, WIRE_VERSION));
    assert_eq!(error.code, "cluster.refused");
    contains_all(&error, &["has fingerprint fp-2", "the leader has fp-1", "same pipeline.toml and the same vnodes"]);
    let (_, error) = next_refusal(&leading.events);
    assert_eq!(error.code, "cluster.fingerprint_mismatch");
    contains_all(&error, &["exchange 127.0.0.1:7001", "fp-2", "fp-1"]);
    let good = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let (membership, _control) = led(&leading);
    assert_eq!(joined(&good).0.members, membership.members);
}

#[test]
fn secrets_must_match_on_both_sides() {
    let secret = |text: &str| Some(Secret::new(text.as_bytes()).expect("a secret"));
    let leading = start_leader(2, secret("right"), settings());
    let join = |secret: Option<Secret>| {
        start_joiner_as(&leading.address, WorkerInfo::new("127.0.0.1:7001", 1, FINGERPRINT), secret, WIRE_VERSION)
    };

    let error = refused(&join(secret("wrong")));
    assert_eq!(error.code, "cluster.auth_secret_mismatch");
    contains_all(
        &error,
        &["authenticating with the leader at", "the accepting worker proved a different cluster secret"],
    );
    let (_, error) = next_refusal(&leading.events);
    assert_eq!(error.code, "cluster.auth_secret_mismatch");
    contains_all(&error, &["control connection from 127.0.0.1:", "the connecting worker proved a different"]);

    let error = refused(&join(None));
    assert_eq!(error.code, "cluster.auth_missing_secret");
    contains_all(&error, &["the accepting worker requires a cluster secret and this worker (connecting) has none"]);
    let (_, error) = next_refusal(&leading.events);
    contains_all(&error, &["this worker (accepting) has a cluster secret and the connecting worker has none"]);

    let good = join(secret("right"));
    let (membership, _control) = led(&leading);
    assert_eq!(joined(&good).0.members, membership.members);

    // A leader without a secret refuses a joiner with one, and the joiner refuses it.
    let leading = start_leader(2, None, settings());
    let error = refused(&start_joiner_as(
        &leading.address,
        WorkerInfo::new("127.0.0.1:7001", 1, FINGERPRINT),
        secret("right"),
        WIRE_VERSION,
    ));
    contains_all(&error, &["this worker (connecting) has a cluster secret and the accepting worker has none"]);
    let (_, error) = next_refusal(&leading.events);
    contains_all(&error, &["the connecting worker requires a cluster secret and this worker (accepting) has none"]);
}

/// 64 bytes from a seeded generator, never starting like a preamble.
fn random_bytes(seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut bytes: Vec<u8> = (0..64)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect();
    if bytes[0] == b'S' {
        bytes[0] = 0;
    }
    bytes
}

#[test]
fn strays_are_logged_and_dropped_and_the_rendezvous_goes_on() {
    let leading = start_leader(2, None, ControlSettings { handshake_timeout: Duration::from_secs(1), ..settings() });
    let connect = || TcpStream::connect(&leading.address).expect("connect");
    let mut noisy = connect();
    noisy.write_all(&random_bytes(7)).expect("write");
    let mut http = connect();
    http.write_all(b"GET /status HTTP/1.1\r\nHost: leader\r\n\r\n").expect("write");
    let silent = connect();
    let strays = [&noisy, &http, &silent].map(|stream| stream.local_addr().expect("an address"));

    let good = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let (membership, _control) = led(&leading);
    assert_eq!(joined(&good).0.members, membership.members);

    // Each stray is refused once, saying what it sent (the silent one after its deadline,
    // possibly after the cluster formed).
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < strays.len() {
        let (peer, error) = next_refusal(&leading.events);
        if strays.contains(&peer) {
            assert!(seen.insert(peer, error).is_none(), "{peer} refused twice");
        }
    }
    let noisy_error = &seen[&strays[0]];
    assert_eq!(noisy_error.code, "cluster.auth_not_a_worker");
    contains_all(noisy_error, &["control connection from", "not a Sluice worker: it sent \""]);
    contains_all(&seen[&strays[1]], &["not a Sluice worker: it sent \"GET /status HTTP/1.1\\r\\n"]);
    assert_eq!(seen[&strays[2]].code, "cluster.auth_timeout");
    contains_all(&seen[&strays[2]], &["sent 0 bytes of its auth preamble and then nothing in time"]);
}

#[test]
fn a_duplicate_exchange_address_is_refused_and_the_rendezvous_goes_on() {
    let leading = start_leader(3, None, settings());
    let first = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    next_event(&leading.events, |event| matches!(event, RendezvousEvent::Joined { .. }).then_some(()));

    let error = refused(&start_joiner(&leading.address, "127.0.0.1:7001", 1));
    assert_eq!(error.code, "cluster.refused");
    contains_all(&error, &["exchange address 127.0.0.1:7001 is registered twice", "--exchange-bind", "--advertise"]);
    let (_, error) = next_refusal(&leading.events);
    assert_eq!(error.code, "cluster.duplicate_exchange");
    contains_all(&error, &["127.0.0.1:7001", "must differ per worker"]);

    let error = refused(&start_joiner(&leading.address, LEADER_EXCHANGE, 1));
    contains_all(&error, &["exchange address 127.0.0.1:7000 is registered twice", "and by the leader"]);
    next_refusal(&leading.events);

    let third = start_joiner(&leading.address, "127.0.0.1:7002", 1);
    let (membership, _control) = led(&leading);
    assert_eq!(membership.len(), 3);
    assert_eq!(joined(&first).0.members, membership.members);
    assert_eq!(joined(&third).0.members, membership.members);

    // After formation a late joiner is refused with a reason.
    let error = refused(&start_joiner(&leading.address, "127.0.0.1:7003", 1));
    contains_all(&error, &["already formed with 3 workers", "is one too many"]);
}

#[test]
fn the_join_timeout_names_how_many_are_missing_and_the_joins_seen() {
    // A registration already waiting in the listener's backlog when the leader starts.
    let listener = bind();
    let _early = raw_registration(&listener.local_addr().expect("an address").to_string(), "127.0.0.1:7001");

    let leading = start_leader_on(listener, 3, None, settings(), Duration::from_secs(2), WIRE_VERSION);
    let error = match wait(&leading.outcome, "rendezvous outcome") {
        Ok(_) => panic!("formed with a worker missing"),
        Err(error) => error,
    };
    assert_eq!(error.code, "cluster.join_timeout");
    contains_all(
        &error,
        &[
            "1 of 3 workers are missing after 2 s",
            "joins were seen from [127.0.0.1:7001 (from 127.0.0.1:",
            &format!("sluice run PIPELINE --join {}", leading.address),
        ],
    );

    // With nobody at all.
    let leading = start_leader_on(bind(), 2, None, settings(), Duration::from_millis(200), WIRE_VERSION);
    let error = wait(&leading.outcome, "rendezvous outcome").expect_err("timed out");
    contains_all(&error, &["1 of 2 workers are missing after 200 ms; no join was seen"]);
}

#[test]
fn a_joiner_gives_up_on_an_absent_leader_naming_it() {
    let address = bind().local_addr().expect("an address").to_string(); // bound, then closed
    let me = WorkerInfo::new("127.0.0.1:7001", 1, FINGERPRINT);
    let error = join_with(&address, me.clone(), None, Duration::from_millis(300), &settings()).expect_err("gave up");
    assert_eq!(error.code, "cluster.leader_unreachable");
    contains_all(&error, &[&format!("could not connect to the leader at {address} within 300 ms"), "attempts"]);
    let error = join_with("no-port", me, None, WAIT, &settings()).expect_err("refused");
    assert_eq!(error.code, "cluster.leader_address");
}

#[test]
fn a_joiner_retries_until_the_leader_is_up() {
    // The port is free when the joiner starts (its first attempts are normally refused),
    // then the leader binds it.
    let address = bind().local_addr().expect("an address");
    let joiner = start_joiner(&address.to_string(), "127.0.0.1:7001", 1);
    let leading = start_leader_on(TcpListener::bind(address).expect("rebind"), 2, None, settings(), WAIT, WIRE_VERSION);
    let (membership, _control) = led(&leading);
    assert_eq!(joined(&joiner).0.members, membership.members);
}

/// Opens a control connection that registers `exchange` without a secret, without
/// waiting for the leader (the auth preamble and the frame wait in its socket).
fn raw_registration(address: &str, exchange: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connect");
    // The auth preamble without a secret (module `auth`): magic, version 1, no flags, a nonce.
    let mut preamble = b"SLCA\x01\x00".to_vec();
    preamble.extend_from_slice(&[0; 32]);
    stream.write_all(&preamble).expect("preamble");
    let register = WorkerInfo::new(exchange, 1, FINGERPRINT).register();
    stream.write_all(&frame_of(&register, WIRE_VERSION).expect("frame")).expect("register");
    stream
}

#[test]
fn a_registration_whose_connection_closed_is_forgotten() {
    let leading = start_leader(3, None, settings());
    let gone = raw_registration(&leading.address, "127.0.0.1:7001");
    next_event(&leading.events, |event| matches!(event, RendezvousEvent::Joined { .. }).then_some(()));
    drop(gone);
    // The same address registers again (a restarted worker): accepted, the old one left.
    let again = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let left = next_event(&leading.events, |event| match event {
        RendezvousEvent::Left { exchange_addr, .. } => Some(exchange_addr),
        _ => None,
    });
    assert_eq!(left, "127.0.0.1:7001");
    let other = start_joiner(&leading.address, "127.0.0.1:7002", 1);
    let (membership, _control) = led(&leading);
    assert_eq!(membership.len(), 3);
    assert_eq!(joined(&again).0.members, membership.members);
    assert_eq!(joined(&other).0.members, membership.members);
}

/// Drains the leader's events after worker `id`'s reader ended: no second `Lost` for it.
fn assert_no_more_losses(control: &mut LeaderControl, id: u32) {
    control.join_reader(id);
    for event in control.events().try_iter() {
        assert!(!matches!(event, ControlEvent::Lost { peer, .. } if peer == id), "a second loss of worker {id}");
    }
}

#[test]
fn a_dropped_worker_is_lost_exactly_once() {
    let leading = start_leader(3, None, settings());
    let first = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let second = start_joiner(&leading.address, "127.0.0.1:7002", 1);
    let (_, mut control) = led(&leading);
    let (_, first_control) = joined(&first);
    let (_, second_control) = joined(&second);

    drop(first_control);
    match next_control(control.events()) {
        ControlEvent::Lost { peer: 1, error } => {
            assert_eq!(error.kind, ErrorKind::LostPeer);
            contains_all(&error, &["worker 1 (exchange 127.0.0.1:7001", "closed the connection"]);
        }
        other => panic!("expected worker 1's loss, got {other:?}"),
    }
    assert_eq!(control.send(1, &ToWorker::Stop).expect_err("lost").kind, ErrorKind::LostPeer);
    assert!(control.broadcast(&ToWorker::Barrier { epoch: 2, final_epoch: false }).is_err(), "worker 1 is lost");
    assert_eq!(
        next_control(second_control.events()),
        ControlEvent::Received { peer: 0, message: ToWorker::Barrier { epoch: 2, final_epoch: false } }
    );
    assert_no_more_losses(&mut control, 1);
}

#[test]
fn a_silent_worker_is_lost_exactly_once() {
    let quick = ControlSettings {
        heartbeat_interval: Duration::from_millis(50),
        loss_timeout: Duration::from_millis(500),
        ..settings()
    };
    let leading = start_leader(2, None, quick);
    let joiner = start_joiner(&leading.address, "127.0.0.1:7001", 1);
    let (_, mut control) = led(&leading);
    let (_, mut worker) = joined(&joiner);

    worker.go_silent();
    match next_control(control.events()) {
        ControlEvent::Lost { peer: 1, error } => {
            assert_eq!(error.kind, ErrorKind::LostPeer);
            contains_all(&error, &["worker 1", "nothing arrived for", "the loss timeout is 500 ms"]);
        }
        other => panic!("expected worker 1's loss, got {other:?}"),
    }
    assert_no_more_losses(&mut control, 1);
    drop(worker);
}

#[test]
fn a_cancelled_rendezvous_ends_on_both_sides() {
    // A leader of three with one worker joined: both wait, until each is given up.
    let leader_cancel = Arc::new(AtomicBool::new(false));
    let leading = start_leader(3, None, ControlSettings { cancel: Some(Arc::clone(&leader_cancel)), ..settings() });
    let joiner_cancel = Arc::new(AtomicBool::new(false));
    let (outcome_tx, outcome) = bounded(1);
    let (address, cancel) = (leading.address.clone(), Arc::clone(&joiner_cancel));
    thread::spawn(move || {
        let me = WorkerInfo::new("127.0.0.1:7001", 1, FINGERPRINT);
        let settings = ControlSettings { cancel: Some(cancel), ..settings() };
        let _ = outcome_tx.send(joiner::join(&address, me, None, WAIT, &settings, WIRE_VERSION));
    });
    next_event(&leading.events, |event| matches!(event, RendezvousEvent::Joined { .. }).then_some(()));
    joiner_cancel.store(true, Ordering::SeqCst);
    let error = refused(&outcome);
    assert_eq!(error.code, "cluster.cancelled", "{error}");
    contains_all(&error, &["stopped while waiting for the leader"]);
    leader_cancel.store(true, Ordering::SeqCst);
    let error = wait(&leading.outcome, "leader outcome").expect_err("cancelled");
    assert_eq!(error.code, "cluster.cancelled", "{error}");
    // A worker whose leader is not up gives up too.
    let cancel = Arc::new(AtomicBool::new(true));
    let me = WorkerInfo::new("127.0.0.1:7002", 1, FINGERPRINT);
    let settings = ControlSettings { cancel: Some(cancel), ..settings() };
    let error = joiner::join("127.0.0.1:1", me, None, WAIT, &settings, WIRE_VERSION).expect_err("cancelled");
    assert_eq!(error.code, "cluster.cancelled", "{error}");
}

/// What a worker that lost its leader learns from the leader's control address: a
/// running leader (forming or leading a cluster) answers with its preamble; a frozen one
/// (its kernel accepts, the process never writes) and a gone one (nothing listens) do
/// not, and the reason says which.
#[test]
fn a_probe_tells_a_running_leader_from_a_frozen_or_gone_one() {
    let forming = start_leader(3, Some(Secret::new(b"0123456789abcdef0123").expect("secret")), settings());
    assert_eq!(leader_answers(&forming.address, WAIT), Ok(()));
    // A listener that never accepts: the kernel completes the connection, nobody writes.
    let frozen = bind();
    let frozen_address = frozen.local_addr().expect("an address").to_string();
    let silent = leader_answers(&frozen_address, Duration::from_millis(200)).expect_err("frozen");
    assert!(silent.contains("said nothing"), "{silent}");
    let gone_address = bind().local_addr().expect("an address").to_string();
    let refused = leader_answers(&gone_address, WAIT).expect_err("gone");
    assert!(refused.contains("nothing listens there"), "{refused}");
    // Something else on the port: not taken for a leader.
    let other = bind();
    let other_address = other.local_addr().expect("an address").to_string();
    let answering = thread::spawn(move || {
        let (mut stream, _) = other.accept().expect("accept");
        stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").expect("write");
    });
    let stranger = leader_answers(&other_address, WAIT).expect_err("not a worker");
    assert!(stranger.contains("not a Sluice worker"), "{stranger}");
    answering.join().expect("no panic");
    drop(frozen);
}
