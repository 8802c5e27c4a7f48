//! The TLS settings of connection strings, and the failures reported before any
//! connection (the handshakes are tested against a real server in the CLI's tests,
//! `tests/cli/postgres_tls.rs`).

use std::path::PathBuf;

use super::*;

fn check(text: &str, client_text: &str, mode: SslMode, root_certificates: Option<RootCertificates>) {
    let split = split_connection_string(text).unwrap_or_else(|e| panic!("{text}: {e:?}"));
    assert_eq!(split.client_text, client_text, "{text}");
    assert_eq!(split.tls, TlsSettings { mode, root_certificates }, "{text}");
}

#[test]
fn key_value_strings_give_their_tls_settings_and_the_rest_to_the_client() {
    let file = || Some(RootCertificates::File(PathBuf::from("/etc/ca.pem")));
    check("host=h port=5432", "host=h port=5432", SslMode::Prefer, None);
    check("host=h sslmode=disable", "host=h", SslMode::Disable, None);
    check("sslmode = require host=h", "host=h", SslMode::Require, None);
    check("host=h sslmode=verify-full sslrootcert=/etc/ca.pem user=u", "host=h user=u", SslMode::VerifyFull, file());
    check("host=h sslmode='verify-ca' sslrootcert='/etc/ca.pem'", "host=h", SslMode::VerifyCa, file());
    check("host=h sslrootcert=system", "host=h", SslMode::Prefer, Some(RootCertificates::System));
    // The last of a repeated key wins, as in libpq.
    check("sslmode=disable host=h sslmode=verify-full", "host=h", SslMode::VerifyFull, None);
    // Quoted values with spaces and escapes are kept whole for the client.
    check(
        "password='a b\\'c' sslrootcert='/my ca/ca.pem' host=h",
        "password='a b\\'c' host=h",
        SslMode::Prefer,
        Some(RootCertificates::File(PathBuf::from("/my ca/ca.pem"))),
    );
}

#[test]
fn uris_give_their_tls_settings_and_the_rest_to_the_client() {
    let file = || Some(RootCertificates::File(PathBuf::from("/etc/my ca.pem")));
    check("postgres://u@h:5432/db", "postgres://u@h:5432/db", SslMode::Prefer, None);
    check("postgres://u@h/db?sslmode=require", "postgres://u@h/db", SslMode::Require, None);
    check(
        "postgresql://u:p@h/db?connect_timeout=3&sslmode=verify-full&sslrootcert=%2Fetc%2Fmy%20ca.pem&application_name=x",
        "postgresql://u:p@h/db?connect_timeout=3&application_name=x",
        SslMode::VerifyFull,
        file(),
    );
}

#[test]
fn settings_the_client_cannot_honour_are_refused_by_name() {
    let refused = |text: &str| split_connection_string(text).expect_err(text);
    assert_eq!(refused("host=h sslmode=verify"), TlsSettingError::Mode("verify".to_owned()));
    assert_eq!(refused("postgres://h/db?sslmode=allow"), TlsSettingError::Mode("allow".to_owned()));
    assert_eq!(refused("host=h sslrootcert=''"), TlsSettingError::EmptyRootCertificates);
    assert_eq!(refused("host=h sslcert=/c.pem"), TlsSettingError::Unsupported("sslcert"));
    assert_eq!(refused("postgres://h/db?sslkey=%2Fk.pem"), TlsSettingError::Unsupported("sslkey"));
    for error in [refused("host=h sslmode=allow"), refused("host=h sslmode=x"), refused("host=h sslcrl=c")] {
        let (message, fix) = error.message();
        assert!(message.contains("`url`") && !fix.is_empty(), "{message} / {fix}");
    }
    // A malformed string goes to the client whole, which reports it.
    check("host=h sslmode", "host=h sslmode", SslMode::Prefer, None);
    check("host='h", "host='h", SslMode::Prefer, None);
}

#[test]
fn require_with_a_root_file_verifies_the_chain_as_libpq_does() {
    let settings = |mode, root_certificates| TlsSettings { mode, root_certificates };
    let file = Some(RootCertificates::File(PathBuf::from("/ca.pem")));
    assert_eq!(settings(SslMode::Require, None).verification(), Verification::None);
    assert_eq!(settings(SslMode::Require, Some(RootCertificates::System)).verification(), Verification::None);
    assert_eq!(settings(SslMode::Require, file.clone()).verification(), Verification::Chain);
    assert_eq!(settings(SslMode::Prefer, file.clone()).verification(), Verification::None);
    assert_eq!(settings(SslMode::VerifyCa, None).verification(), Verification::Chain);
    assert_eq!(settings(SslMode::VerifyFull, file).verification(), Verification::ChainAndHost);
    assert!(settings(SslMode::Disable, None).client_config().expect("no roots read").is_none());
    assert!(settings(SslMode::Require, None).client_config().expect("no roots read").is_some());
}

#[test]
fn an_unreadable_or_empty_root_file_is_a_typed_error_naming_sslrootcert() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    for path in [missing, not_pem] {
        let settings =
            TlsSettings { mode: SslMode::VerifyFull, root_certificates: Some(RootCertificates::File(path.clone())) };
        let failure = settings.client_config().expect_err("refused");
        assert!(
            matches!(&failure, TlsFailure::RootCertificatesUnreadable { path: p, .. } if *p == path),
            "{failure:?}"
        );
        let error = failure.into_error(Side::Sink, "sink `out`", "h:5432/db as u", &settings);
        assert_eq!(error.code, "sink.postgres_tls_root_cert");
        assert!(error.message.contains("sslrootcert=") && error.message.contains(&path.display().to_string()));
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("sslrootcert")), "{error:?}");
    }
}

#[test]
fn handshake_errors_are_classified_by_the_check_that_failed() {
    let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
    assert!(
        matches!(TlsFailure::of_handshake(&name, "db.example"), TlsFailure::HostnameMismatch { host, .. } if host == "db.example")
    );
    let issuer = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
    assert!(matches!(TlsFailure::of_handshake(&issuer, "h"), TlsFailure::CertificateRejected { .. }));
    let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, issuer);
    assert!(matches!(TlsFailure::find(&wrapped, "h"), Some(TlsFailure::CertificateRejected { .. })));
    let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    assert_eq!(TlsFailure::find(&plain, "h"), None);
}

/// A server on `127.0.0.1:0` that answers each connection's SSLRequest with `N` and
/// closes it; its address. The answers are counted by the thread's end.
fn server_refusing_tls(connections: usize) -> (std::net::SocketAddr, std::thread::JoinHandle<usize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let thread = std::thread::spawn(move || {
        let mut answered = 0;
        for _ in 0..connections {
            let (mut socket, _) = listener.accept().expect("accept");
            let mut request = [0u8; 8];
            socket.read_exact(&mut request).expect("the SSLRequest");
            assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], "an SSLRequest");
            socket.write_all(b"N").expect("answer");
            answered += 1;
        }
        answered
    });
    (address, thread)
}

#[test]
fn a_server_refusing_tls_fails_modes_that_require_it_and_is_plain_under_prefer() {
    use crate::postgres_cdc::transport::{OpenError, Transport};
    let (address, server) = server_refusing_tls(4);
    let open = |mode| {
        let socket = std::net::TcpStream::connect(address).expect("connect");
        let settings = TlsSettings { mode, root_certificates: None };
        Transport::open(socket, "127.0.0.1", &settings, std::time::Duration::from_secs(10))
    };
    for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
        match open(mode) {
            Err(OpenError::Tls(TlsFailure::ServerRefused)) => {}
            Err(other) => panic!("{mode:?}: {other:?}"),
            Ok(_) => panic!("{mode:?}: plain connection accepted"),
        }
    }
    assert!(matches!(open(SslMode::Prefer), Ok(Transport::Plain(_))), "prefer falls back to plain");
    assert_eq!(server.join().expect("the server"), 4);
}

#[test]
fn the_sink_reports_a_refusal_of_tls_under_require_without_retrying() {
    use crate::postgres::client::Server;
    let (address, server) = server_refusing_tls(1);
    let config = super::super::tests::config(&format!(
        "url = \"postgres://u@127.0.0.1:{}/db?sslmode=require\"\ntable = \"t\"\n",
        address.port()
    ));
    let options = super::super::options::sink_options_of(&config).expect("valid options");
    let Err(error) = Server::new("out", &options).expect("parses").connect("out") else {
        panic!("a plain session was accepted under sslmode=require");
    };
    assert_eq!(error.code, "sink.postgres_tls_refused", "{error:?}");
    assert!(error.message.contains("sslmode=require"), "{error:?}");
    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("ssl = on")), "{error:?}");
    assert_eq!(server.join().expect("the server"), 1, "one attempt: a refusal is not retried");
}
