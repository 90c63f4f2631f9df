//! HTTPS (SPEC §12 "TLS"): the rustls acceptor of `tls_cert` / `tls_key`,
//! built at start and again on every reload (the files are re-read, so a
//! renewed certificate is served without a restart). HTTP/2 and HTTP/1.1
//! are offered by ALPN.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsFiles;

/// Why the certificate files cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing, unreadable or not PEM.
    #[error("tls: cannot read {what} {path}: {reason}")]
    Read {
        /// `tls_cert` or `tls_key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The certificate file holds no certificate.
    #[error("tls: {0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("tls: the certificate and key are refused: {0}")]
    Refused(rustls::Error),
}

fn read_err(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Read {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Reads the files and builds the acceptor (HTTP/2 and HTTP/1.1 by ALPN).
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| read_err("tls_cert", &files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err("tls_cert", &files.cert, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(files.cert.clone()));
    }
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|e| read_err("tls_key", &files.key, e))?;
    // ring, not aws-lc-rs: aws-lc-rs needs cmake and doubles the TLS part
    // of a build on these 2-core machines. rustls deprecates ring's
    // provider only for its lack of post-quantum key exchange
    // (docs/operations.md, "TLS").
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Refused)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Refused)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
