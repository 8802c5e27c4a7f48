//! The secret and the challenge-response: golden bytes of the preamble and the proof,
//! every outcome over real sockets on 127.0.0.1, strays, and the bind check.

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn secret(text: &str) -> Secret {
    Secret::new(text.as_bytes()).expect("a valid secret")
}

#[test]
fn golden_preamble_and_proofs() {
    let preamble = Preamble { requires_proof: true, nonce: [7; NONCE_BYTES] };
    let bytes = preamble.encode();
    assert_eq!(&bytes[..6], &[0x53, 0x4c, 0x43, 0x41, 0x01, 0x01]);
    assert_eq!(bytes[6..], [7; NONCE_BYTES]);
    assert_eq!(Preamble::decode(&bytes), Ok(preamble));
    assert_eq!(Preamble { requires_proof: false, nonce: [0; NONCE_BYTES] }.encode()[5], 0);
    // HMAC-SHA256 per RFC 2104 over the documented input, computed independently.
    let key = &secret("s3cret").key;
    let (initiator, acceptor) = ([1; NONCE_BYTES], [2; NONCE_BYTES]);
    let by_initiator = hmac::sign(key, &proof_input(Role::Initiator, &initiator, &acceptor));
    let by_acceptor = hmac::sign(key, &proof_input(Role::Acceptor, &initiator, &acceptor));
    assert_eq!(hex(by_initiator.as_ref()), "e72167f0c634da571d8e09d73b7fc802a069a3186af0d86a0c88ebb80f585a00");
    assert_eq!(hex(by_acceptor.as_ref()), "cf65b3688e768a8c2704899f4c45bf0a759ec3686199a92449776b852306d8c6");
}

#[test]
fn a_preamble_names_what_is_wrong() {
    let mut bytes = Preamble { requires_proof: false, nonce: [0; NONCE_BYTES] }.encode();
    bytes[4] = 9;
    let error = Preamble::decode(&bytes).expect_err("another version");
    assert_eq!(error.code, "cluster.auth_version");
    assert!(error.message.contains("version 9") && error.message.contains("speaks 1"), "{error}");
    bytes[4] = AUTH_VERSION;
    bytes[5] = 0x80;
    assert_eq!(Preamble::decode(&bytes).expect_err("unknown flag").code, "cluster.auth_flags");
}

/// A stream that records what it writes.
struct Recording {
    stream: TcpStream,
    written: Arc<Mutex<Vec<u8>>>,
}

impl Read for Recording {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for Recording {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.stream.write(buf)?;
        self.written.lock().expect("not poisoned").extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A connected pair on 127.0.0.1 with generous timeouts (no test relies on them firing).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let connecting = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    for stream in [&connecting, &accepted] {
        stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        stream.set_write_timeout(Some(Duration::from_secs(60))).expect("timeout");
    }
    (connecting, accepted)
}

/// Runs both sides; returns (initiator's outcome, acceptor's outcome, bytes the initiator sent).
fn both(
    initiator: Option<Secret>,
    acceptor: Option<Secret>,
) -> (Result<(), SluiceError>, Result<(), SluiceError>, Vec<u8>) {
    let (connecting, accepted) = pair();
    let written = Arc::new(Mutex::new(Vec::new()));
    let mut recording = Recording { stream: connecting, written: Arc::clone(&written) };
    let accepting = thread::spawn(move || {
        let mut accepted = accepted;
        authenticate(&mut accepted, acceptor.as_ref(), Role::Acceptor)
    });
    let initiated = authenticate(&mut recording, initiator.as_ref(), Role::Initiator);
    let accepted = accepting.join().expect("the acceptor does not panic");
    let sent = written.lock().expect("not poisoned").clone();
    (initiated, accepted, sent)
}

#[test]
fn the_same_secret_or_none_on_both_sides_is_accepted() {
    let (initiated, accepted, sent) = both(Some(secret("s3cret-value")), Some(secret("s3cret-value\n")));
    assert_eq!((initiated, accepted), (Ok(()), Ok(())));
    assert_eq!(sent.len(), PREAMBLE_BYTES + PROOF_BYTES);
    assert!(!sent.windows(b"s3cret-value".len()).any(|w| w == b"s3cret-value"), "the secret crossed the wire");
    let (initiated, accepted, sent) = both(None, None);
    assert_eq!((initiated, accepted), (Ok(()), Ok(())));
    assert_eq!(sent.len(), PREAMBLE_BYTES);
}

#[test]
fn different_secrets_are_refused_by_both_sides() {
    let (initiated, accepted, _) = both(Some(secret("one")), Some(secret("two")));
    for (outcome, me, other) in [(initiated, "connecting", "accepting"), (accepted, "accepting", "connecting")] {
        let error = outcome.expect_err("refused");
        assert_eq!(error.code, "cluster.auth_secret_mismatch");
        assert!(error.message.contains(&format!("the {other} worker proved a different cluster secret")), "{error}");
        assert!(error.message.contains(&format!("({me})")), "{error}");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("SLUICE_CLUSTER_SECRET")), "{error}");
    }
}

#[test]
fn a_secret_on_one_side_only_is_refused_by_both_sides() {
    let (initiated, accepted, _) = both(Some(secret("one")), None);
    let (with, without) = (initiated.expect_err("refused"), accepted.expect_err("refused"));
    assert_eq!((with.code, without.code), ("cluster.auth_missing_secret", "cluster.auth_missing_secret"));
    assert!(with.message.contains("this worker (connecting) has a cluster secret and the accepting worker has none"));
    assert!(without.message.contains("the connecting worker requires a cluster secret and this worker (accepting)"));
    let (initiated, accepted, _) = both(None, Some(secret("one")));
    let (without, with) = (initiated.expect_err("refused"), accepted.expect_err("refused"));
    assert!(with.message.contains("this worker (accepting) has a cluster secret and the connecting worker has none"));
    assert!(without.message.contains("the accepting worker requires a cluster secret and this worker (connecting)"));
    assert!(without.fix.as_deref().is_some_and(|fix| fix.contains("--secret-file")), "{without}");
}

#[test]
fn a_stray_is_refused_with_what_it_sent() {
    let (mut connecting, mut accepted) = pair();
    connecting.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let error = authenticate(&mut accepted, None, Role::Acceptor).expect_err("refused");
    assert_eq!(error.code, "cluster.auth_not_a_worker");
    assert!(error.message.contains("GET / HTTP/1.1\\r\\n"), "{error}");
    // A peer that closes early, and one that sends nothing.
    let (connecting, mut accepted) = pair();
    drop(connecting);
    assert_eq!(authenticate(&mut accepted, None, Role::Acceptor).expect_err("closed").code, "cluster.auth_closed");
    let (_connecting, mut accepted) = pair();
    accepted.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    let error = authenticate(&mut accepted, None, Role::Acceptor).expect_err("silent");
    assert_eq!(error.code, "cluster.auth_timeout");
    assert!(error.message.contains("sent 0 bytes of its auth preamble"), "{error}");
}

#[test]
fn secrets_are_trimmed_checked_and_never_shown() {
    for empty in ["", " \n\t ", "\n"] {
        assert_eq!(Secret::new(empty.as_bytes()).expect_err("empty").code, "cluster.secret_empty");
    }
    let shown = format!("{:?}", secret("hunter2"));
    assert!(!shown.contains("hunter2"), "{shown}");
    let sign = |secret: &Secret| hmac::sign(&secret.key, b"x").as_ref().to_vec();
    assert_eq!(sign(&secret("  hunter2\n")), sign(&secret("hunter2")));
    assert_ne!(sign(&secret("hunter3")), sign(&secret("hunter2")));

    assert!(matches!(Secret::from_env_value(None), Ok(None)));
    let from_env = Secret::from_env_value(Some("hunter2\n".into())).expect("valid").expect("set");
    assert_eq!(sign(&from_env), sign(&secret("hunter2")));
    let error = Secret::from_env_value(Some(" ".into())).expect_err("whitespace");
    assert!(error.message.starts_with("SLUICE_CLUSTER_SECRET: "), "{error}");

    let dir = std::env::temp_dir().join(format!("sluice-secret-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("secret");
    std::fs::write(&file, "hunter2\n").expect("write");
    let from_file = Secret::resolve(Some(&file)).expect("valid").expect("set");
    assert_eq!(sign(&from_file), sign(&secret("hunter2")));
    std::fs::write(&file, "\n").expect("write");
    let error = Secret::from_file(&file).expect_err("empty file");
    assert!(error.message.contains("secret file") && error.message.contains("empty"), "{error}");
    std::fs::write(&file, vec![b'a'; MAX_SECRET_BYTES + 1]).expect("write");
    assert_eq!(Secret::from_file(&file).expect_err("too large").code, "cluster.secret_file");
    let missing = Secret::from_file(&dir.join("missing")).expect_err("missing");
    assert_eq!(missing.code, "cluster.secret_file");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_reachable_control_address_needs_a_secret_or_insecure() {
    let addr = |text: &str| text.parse::<SocketAddr>().expect("an address");
    let key = secret("s");
    for loopback in ["127.0.0.1:7000", "[::1]:7000", "[::ffff:127.0.0.1]:7000"] {
        assert_eq!(check_control_bind(addr(loopback), None, false), Ok(()), "{loopback}");
    }
    for reachable in ["0.0.0.0:7000", "10.1.2.3:7000", "[::]:7000"] {
        let error = check_control_bind(addr(reachable), None, false).expect_err("refused");
        assert_eq!(error.code, "cluster.insecure_bind");
        assert!(error.message.contains(reachable) && error.message.contains("could join the cluster"), "{error}");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("--secret-file")), "{error}");
        assert_eq!(check_control_bind(addr(reachable), Some(&key), false), Ok(()));
        assert_eq!(check_control_bind(addr(reachable), None, true), Ok(()));
    }
}

#[test]
fn a_reachable_exchange_address_needs_a_secret_or_insecure() {
    let addr = |text: &str| text.parse::<SocketAddr>().expect("an address");
    assert_eq!(check_exchange_bind(addr("127.0.0.1:0"), None, false), Ok(()));
    for reachable in ["0.0.0.0:7500", "10.1.2.3:0"] {
        let error = check_exchange_bind(addr(reachable), None, false).expect_err("refused");
        assert_eq!(error.code, "cluster.insecure_bind");
        assert!(error.message.contains(reachable) && error.message.contains("exchange address"), "{error}");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("--exchange-bind")), "{error}");
        assert_eq!(check_exchange_bind(addr(reachable), Some(&secret("s")), false), Ok(()));
        assert_eq!(check_exchange_bind(addr(reachable), None, true), Ok(()));
    }
}
