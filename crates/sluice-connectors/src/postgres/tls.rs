//! TLS for PostgreSQL connections (the `postgres` sink and the `postgres-cdc` source),
//! with libpq's settings read from the connection string, as libpq reads them:
//! `sslmode` and `sslrootcert`, in a key/value string (`sslmode=verify-full`) or as
//! query parameters of a `postgres://` URI (`?sslmode=verify-full&sslrootcert=…`).
//! They are taken out of the string here ([`split_connection_string`]) because the
//! `postgres` client knows only `disable`/`prefer`/`require` and no `sslrootcert`; it
//! parses the rest.
//!
//! # The modes (libpq's semantics)
//!
//! | `sslmode` | encrypted | server verified |
//! |---|---|---|
//! | `disable` | never | no |
//! | `prefer` (default) | if the server accepts (its answer to SSLRequest), else plain | no |
//! | `require` | always (a server that refuses fails the connection) | no (but: below) |
//! | `verify-ca` | always | its certificate chains to a root of `sslrootcert` |
//! | `verify-full` | always | as `verify-ca`, and the certificate names the host |
//!
//! As in libpq, `require` with an `sslrootcert` file behaves as `verify-ca`. Without
//! verification, the session is encrypted but an active attacker can stand in for the
//! server; `verify-full` is the mode that prevents it. `prefer` is the default because it
//! is libpq's (a connection string that works with `psql` works here) and it never
//! breaks a server without TLS; it offers no protection against an active attacker.
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system`: the operating system's
//! trust store (as libpq 16 reads it), which is also the default of `verify-ca` and
//! `verify-full` when `sslrootcert` is absent (libpq reads `~/.postgresql/root.crt`
//! instead; Sluice reads no file under the home directory).
//!
//! Not supported, and refused by name: client certificates (`sslcert`, `sslkey`,
//! `sslpassword`), `sslcrl`/`sslcrldir`, `sslmode=allow`. The handshake is rustls with
//! its ring provider, TLS 1.2 or 1.3.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sluice_types::SluiceError;

/// libpq's `sslmode`, without `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const NAMES: [(&'static str, SslMode); 5] = [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, mode)| *mode == self).map_or("prefer", |(name, _)| name)
    }
}

/// Where the CA certificates of `verify-ca`/`verify-full` come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCertificates {
    /// The operating system's trust store (`sslrootcert=system`, or none given).
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// The TLS settings of one connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// `sslrootcert` as written; None: not given.
    pub root_certificates: Option<RootCertificates>,
}

impl Default for TlsSettings {
    fn default() -> TlsSettings {
        TlsSettings { mode: SslMode::Prefer, root_certificates: None }
    }
}

/// What the server's certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verification {
    None,
    Chain,
    ChainAndHost,
}

impl TlsSettings {
    /// Whether the session is encrypted even when the server does not offer TLS
    /// (a refusal then fails the connection).
    pub fn requires_tls(&self) -> bool {
        matches!(self.mode, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull)
    }

    fn verification(&self) -> Verification {
        match (self.mode, &self.root_certificates) {
            (SslMode::VerifyFull, _) => Verification::ChainAndHost,
            (SslMode::VerifyCa, _) | (SslMode::Require, Some(RootCertificates::File(_))) => Verification::Chain,
            _ => Verification::None,
        }
    }

    /// The `postgres` client's own mode: `verify-*` encrypt as `require` does (their
    /// verification is the TLS configuration's).
    pub fn client_mode(&self) -> postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => postgres::config::SslMode::Require,
        }
    }

    /// The mode and roots as the docs write them, for messages.
    pub fn describe(&self) -> String {
        match (&self.root_certificates, self.verification()) {
            (_, Verification::None) => format!("sslmode={}", self.mode.name()),
            (Some(RootCertificates::File(path)), _) => {
                format!("sslmode={} sslrootcert={}", self.mode.name(), path.display())
            }
            (_, _) => format!("sslmode={} sslrootcert=system", self.mode.name()),
        }
    }

    /// The client configuration of these settings; None under `disable`. Reads
    /// `sslrootcert` (or the system's store) when the mode verifies.
    pub fn client_config(&self) -> Result<Option<ClientConfig>, TlsFailure> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFailure::Handshake { detail: e.to_string() })?;
        let algorithms = provider.signature_verification_algorithms;
        let verifier: Arc<dyn ServerCertVerifier> = match self.verification() {
            Verification::None => Arc::new(NamesUnchecked { roots: None, algorithms }),
            Verification::Chain => Arc::new(NamesUnchecked { roots: Some(Arc::new(self.roots()?)), algorithms }),
            Verification::ChainAndHost => {
                WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider).build().map_err(|e| {
                    TlsFailure::RootCertificatesInvalid { source: self.roots_name(), detail: e.to_string() }
                })?
            }
        };
        Ok(Some(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth()))
    }

    fn roots_name(&self) -> String {
        match &self.root_certificates {
            Some(RootCertificates::File(path)) => format!("sslrootcert={}", path.display()),
            _ => "the system's trust store".to_owned(),
        }
    }

    fn roots(&self) -> Result<RootCertStore, TlsFailure> {
        let mut roots = RootCertStore::empty();
        match &self.root_certificates {
            Some(RootCertificates::File(path)) => {
                let unreadable = |detail: String| TlsFailure::RootCertificatesUnreadable { path: path.clone(), detail };
                let pem = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
                for certificate in CertificateDer::pem_slice_iter(&pem) {
                    let certificate = certificate.map_err(|e| unreadable(format!("not PEM: {e}")))?;
                    roots.add(certificate).map_err(|e| unreadable(format!("a certificate is not valid: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(unreadable("it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned()));
                }
            }
            _ => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                    return Err(TlsFailure::RootCertificatesInvalid {
                        source: self.roots_name(),
                        detail: format!("no certificate found ({})", errors.join("; ")),
                    });
                }
            }
        }
        Ok(roots)
    }
}

/// A verifier that never compares the certificate's names with the host: `prefer` and
/// `require` (`roots` None: any certificate) and `verify-ca` (`roots`: the certificate
/// chains to one of them and is valid now). The handshake's signatures are checked
/// either way (against the certificate presented), so the session is encrypted to
/// whoever holds its key.
#[derive(Debug)]
struct NamesUnchecked {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NamesUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let certificate = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(&certificate, roots, intermediates, now, self.algorithms.all)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, certificate, signature, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, certificate, signature, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why a TLS connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsFailure {
    /// `sslrootcert`'s file cannot be read, or holds no valid certificate.
    RootCertificatesUnreadable { path: PathBuf, detail: String },
    /// The roots cannot verify anything (the system's store is empty, …).
    RootCertificatesInvalid { source: String, detail: String },
    /// The server answered `N` to SSLRequest, under a mode that requires TLS.
    ServerRefused,
    /// The certificate does not name the host (`verify-full`).
    HostnameMismatch { host: String, detail: String },
    /// The certificate does not chain to a root, has expired, or is not one.
    CertificateRejected { detail: String },
    /// The handshake failed otherwise (protocol versions, a closed connection, …).
    Handshake { detail: String },
    /// `sslmode=disable`, and the server accepts only encrypted connections.
    EncryptionRequired { detail: String },
}

/// Which connector a failure is reported for: its codes and the option it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Sink,
    Source,
}

impl TlsFailure {
    /// A handshake's error, classified: a certificate error names the check that failed.
    pub fn of_handshake(error: &rustls::Error, host: &str) -> TlsFailure {
        match error {
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => TlsFailure::HostnameMismatch { host: host.to_owned(), detail: error.to_string() },
            rustls::Error::InvalidCertificate(_) => TlsFailure::CertificateRejected { detail: error.to_string() },
            other => TlsFailure::Handshake { detail: other.to_string() },
        }
    }

    /// The failure found among `error`'s sources (a rustls error, or the client's
    /// "server does not support TLS"), if any.
    pub fn find(error: &(dyn std::error::Error + 'static), host: &str) -> Option<TlsFailure> {
        let mut cause = Some(error);
        while let Some(current) = cause {
            if let Some(tls) = current.downcast_ref::<rustls::Error>() {
                return Some(TlsFailure::of_handshake(tls, host));
            }
            if current.to_string().contains("server does not support TLS") {
                return Some(TlsFailure::ServerRefused);
            }
            // An `io::Error`'s `source` skips the error it wraps (rustls's, for one).
            cause = match current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => current.source(),
            };
        }
        None
    }

    fn code(&self, side: Side) -> &'static str {
        match (self, side) {
            (
                TlsFailure::RootCertificatesUnreadable { .. } | TlsFailure::RootCertificatesInvalid { .. },
                Side::Sink,
            ) => "sink.postgres_tls_root_cert",
            (
                TlsFailure::RootCertificatesUnreadable { .. } | TlsFailure::RootCertificatesInvalid { .. },
                Side::Source,
            ) => "source.postgres_cdc.tls_root_cert",
            (TlsFailure::ServerRefused, Side::Sink) => "sink.postgres_tls_refused",
            (TlsFailure::ServerRefused, Side::Source) => "source.postgres_cdc.tls_refused",
            (TlsFailure::HostnameMismatch { .. }, Side::Sink) => "sink.postgres_tls_hostname",
            (TlsFailure::HostnameMismatch { .. }, Side::Source) => "source.postgres_cdc.tls_hostname",
            (TlsFailure::CertificateRejected { .. }, Side::Sink) => "sink.postgres_tls_certificate",
            (TlsFailure::CertificateRejected { .. }, Side::Source) => "source.postgres_cdc.tls_certificate",
            (TlsFailure::Handshake { .. }, Side::Sink) => "sink.postgres_tls_handshake",
            (TlsFailure::Handshake { .. }, Side::Source) => "source.postgres_cdc.tls_handshake",
            (TlsFailure::EncryptionRequired { .. }, Side::Sink) => "sink.postgres_tls_required",
            (TlsFailure::EncryptionRequired { .. }, Side::Source) => "source.postgres_cdc.tls_required",
        }
    }

    /// The error reported: `who` the connector (`sink `out``), `server` the server's
    /// description, `settings` those in force.
    pub fn into_error(self, side: Side, who: &str, server: &str, settings: &TlsSettings) -> SluiceError {
        let code = self.code(side);
        let configuration = self.is_configuration();
        let mode = settings.describe();
        let (message, fix) = match self {
            TlsFailure::RootCertificatesUnreadable { path, detail } => (
                format!("{who}: cannot read sslrootcert={} ({detail})", path.display()),
                "set sslrootcert in `url` to a readable PEM file of the CA certificates that signed the server's \
                 certificate (or sslrootcert=system for the system's trust store)"
                    .to_owned(),
            ),
            TlsFailure::RootCertificatesInvalid { source, detail } => (
                format!("{who}: the CA certificates of {source} cannot verify the server: {detail}"),
                "set sslrootcert in `url` to a PEM file of the CA certificates that signed the server's certificate"
                    .to_owned(),
            ),
            TlsFailure::ServerRefused => (
                format!("{who}: PostgreSQL at {server} refused TLS (it answered SSLRequest with N), and {mode} requires it"),
                "turn on ssl in the server's postgresql.conf (ssl = on, ssl_cert_file, ssl_key_file), or, on a trusted \
                 network only, set sslmode=prefer or sslmode=disable in `url`"
                    .to_owned(),
            ),
            TlsFailure::HostnameMismatch { host, detail } => (
                format!(
                    "{who}: the certificate of PostgreSQL at {server} does not name the host {host} ({mode}): {detail}"
                ),
                "connect by a name the certificate holds (its subject alternative names), or issue the server a \
                 certificate naming this host; sslmode=verify-ca skips the name check"
                    .to_owned(),
            ),
            TlsFailure::CertificateRejected { detail } => (
                format!("{who}: the certificate of PostgreSQL at {server} failed verification ({mode}): {detail}"),
                "set sslrootcert in `url` to the PEM file of the CA that signed the server's certificate; \
                 sslmode=require encrypts without verifying"
                    .to_owned(),
            ),
            TlsFailure::Handshake { detail } => (
                format!("{who}: the TLS handshake with PostgreSQL at {server} failed ({mode}): {detail}"),
                "check the server's ssl settings and log (TLS 1.2 or 1.3 is needed)".to_owned(),
            ),
            TlsFailure::EncryptionRequired { detail } => (
                format!("{who}: PostgreSQL at {server} accepts only encrypted connections, and {mode} is set: {detail}"),
                "set sslmode=verify-full (with sslrootcert) or sslmode=require in `url`".to_owned(),
            ),
        };
        match configuration {
            true => SluiceError::user(code, message),
            false => SluiceError::external(code, message),
        }
        .with_fix(fix)
    }

    fn is_configuration(&self) -> bool {
        !matches!(self, TlsFailure::Handshake { .. })
    }
}

/// Whether a server's error (SQLSTATE `code`, `message`) is pg_hba.conf refusing an
/// unencrypted connection: it has only `hostssl` lines for this client. The server's
/// message says "no encryption" (in English; a translated one is reported as it is).
pub fn refuses_plain(code: &str, message: &str) -> bool {
    code == "28000" && message.contains("no encryption")
}

/// A connection string without its TLS settings, and those settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitConnection {
    /// What the `postgres` client parses.
    pub client_text: String,
    pub tls: TlsSettings,
}

/// A TLS setting of the connection string the client cannot honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSettingError {
    /// `sslmode` has a value outside the five.
    Mode(String),
    /// `sslrootcert` is empty.
    EmptyRootCertificates,
    /// A libpq key this client does not support.
    Unsupported(&'static str),
}

impl TlsSettingError {
    /// The message and fix (the values are not secret: a mode, a key's name).
    pub fn message(&self) -> (String, String) {
        let modes = "disable, prefer, require, verify-ca or verify-full";
        match self {
            TlsSettingError::Mode(value) if value == "allow" => (
                "`url` has sslmode=allow, which this client does not support".to_owned(),
                format!("set sslmode to one of {modes} (prefer: TLS when the server offers it)"),
            ),
            TlsSettingError::Mode(value) => {
                (format!("`url` has sslmode={value:?}, which is not a mode"), format!("set sslmode to one of {modes}"))
            }
            TlsSettingError::EmptyRootCertificates => (
                "`url` has an empty sslrootcert".to_owned(),
                "set sslrootcert to a PEM file of CA certificates, or to system".to_owned(),
            ),
            TlsSettingError::Unsupported(key) => (
                format!("`url` sets {key}, which this client does not support (no client certificates, no CRLs)"),
                format!("remove {key} from `url`"),
            ),
        }
    }
}

/// libpq's TLS keys this client refuses by name.
const UNSUPPORTED_KEYS: [&str; 5] = ["sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir"];

/// Takes `sslmode` and `sslrootcert` out of a connection string (key/value or URI; the
/// last of a repeated key wins, as in libpq). A string that does not parse is returned
/// whole, for the client to report.
pub fn split_connection_string(text: &str) -> Result<SplitConnection, TlsSettingError> {
    let trimmed = text.trim_start();
    let (uri_base, pieces) = if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let (base, query) = trimmed.split_once('?').unwrap_or((trimmed, ""));
        let pieces = query
            .split('&')
            .filter(|part| !part.is_empty())
            .map(|part| {
                let (key, value) = part.split_once('=').unwrap_or((part, ""));
                Piece { key: percent_decode(key), value: percent_decode(value), text: part }
            })
            .collect();
        (Some(base), pieces)
    } else {
        match key_value_pieces(text) {
            Some(pieces) => (None, pieces),
            None => return Ok(SplitConnection { client_text: text.to_owned(), tls: TlsSettings::default() }),
        }
    };
    let mut tls = TlsSettings::default();
    let mut kept = Vec::with_capacity(pieces.len());
    for Piece { key, value, text } in &pieces {
        if let Some(unsupported) = UNSUPPORTED_KEYS.iter().find(|k| **k == key) {
            return Err(TlsSettingError::Unsupported(unsupported));
        }
        if key != "sslmode" && key != "sslrootcert" {
            kept.push(*text);
        }
        if key == "sslmode" {
            tls.mode = SslMode::NAMES
                .iter()
                .find(|(name, _)| name == value)
                .map(|(_, mode)| *mode)
                .ok_or_else(|| TlsSettingError::Mode(value.clone()))?;
        } else if key == "sslrootcert" {
            tls.root_certificates = match value.as_str() {
                "" => return Err(TlsSettingError::EmptyRootCertificates),
                "system" => Some(RootCertificates::System),
                path => Some(RootCertificates::File(PathBuf::from(path))),
            };
        }
    }
    let client_text = match uri_base {
        Some(base) if kept.is_empty() => base.to_owned(),
        Some(base) => format!("{base}?{}", kept.join("&")),
        None => kept.join(" "),
    };
    Ok(SplitConnection { client_text, tls })
}

/// One `key=value` of a connection string: the key and value decoded, and the text
/// it was written as.
#[derive(Debug)]
struct Piece<'a> {
    key: String,
    value: String,
    text: &'a str,
}

/// The pairs of a key/value string, as libpq splits them (spaces around `=`; a value in
/// single quotes, `\` escaping the next character); None when it is malformed.
fn key_value_pieces(text: &str) -> Option<Vec<Piece<'_>>> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut at = 0;
    let skip_spaces = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    loop {
        at = skip_spaces(at);
        if at == bytes.len() {
            return Some(pieces);
        }
        let start = at;
        while at < bytes.len() && bytes[at] != b'=' && !bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        let key = text[start..at].to_owned();
        at = skip_spaces(at);
        if key.is_empty() || bytes.get(at) != Some(&b'=') {
            return None;
        }
        at = skip_spaces(at + 1);
        let mut value = Vec::new();
        if bytes.get(at) == Some(&b'\'') {
            at += 1;
            loop {
                match bytes.get(at)? {
                    b'\'' => break,
                    b'\\' => {
                        value.push(*bytes.get(at + 1)?);
                        at += 2;
                    }
                    byte => {
                        value.push(*byte);
                        at += 1;
                    }
                }
            }
            at += 1;
        } else {
            while at < bytes.len() && !bytes[at].is_ascii_whitespace() {
                if bytes[at] == b'\\' {
                    at += 1;
                }
                value.push(*bytes.get(at)?);
                at += 1;
            }
        }
        let value = String::from_utf8(value).ok()?;
        pieces.push(Piece { key, value, text: &text[start..at] });
    }
}

/// `%XX` decoded; a malformed escape is kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[at], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
