//! TLS for the PostgreSQL endpoint, through rustls (the version and `ring` provider
//! `pgwire` builds): a certificate chain and a private key read once from PEM files at
//! start; clients ask for it with PostgreSQL's SSLRequest (`sslmode=prefer` or
//! `require`), or directly (PostgreSQL 17's `sslnegotiation=direct`, ALPN
//! `postgresql`). No client certificates.
//!
//! Bounds: the files are read once; a handshake happens within `pgwire`'s startup
//! timeout.

use std::path::Path;
use std::sync::Arc;

use pgwire::tokio::TlsAcceptor;
use pgwire::tokio::tokio_rustls::rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_types::SluiceError;

/// A loaded certificate and key.
pub(crate) struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    /// The certificate chain's PEM, for SCRAM's channel binding.
    pub(crate) certificate_pem: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// Reads the PEM certificate chain at `certificate` and the private key at `key`.
    pub(crate) fn load(certificate: &Path, key: &Path) -> Result<Tls, SluiceError> {
        let unreadable = |path: &Path, what: &str, error: String| {
            SluiceError::user("pgwire.tls", format!("cannot read the {what} {}: {error}", path.display())).with_fix(
                "give PEM files with --pg-tls-cert (the certificate chain) and --pg-tls-key (its private key)",
            )
        };
        let certificate_pem =
            std::fs::read(certificate).map_err(|e| unreadable(certificate, "certificate", e.to_string()))?;
        let chain = CertificateDer::pem_slice_iter(&certificate_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unreadable(certificate, "certificate", e.to_string()))?;
        if chain.is_empty() {
            return Err(unreadable(certificate, "certificate", "no certificate in it".to_string()));
        }
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| unreadable(key, "private key", e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, private))
            .map_err(|e| {
                SluiceError::user("pgwire.tls", format!("the certificate and key cannot serve TLS: {e}"))
                    .with_fix("give the key that belongs to the certificate (PEM: PKCS#8, PKCS#1 or SEC1)")
            })?;
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Tls { acceptor: TlsAcceptor::from(Arc::new(config)), certificate_pem })
    }
}
