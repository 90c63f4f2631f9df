//! HTTPS (SPEC §12 "TLS"): the rustls settings of an `https://` URL. The
//! server's certificate is checked against the platform's trusted roots
//! and the CA certificates added with
//! [`ClientBuilder::add_root_certificate_pem`](crate::ClientBuilder::add_root_certificate_pem)
//! (or those alone, with
//! [`ClientBuilder::tls_only_custom_roots`](crate::ClientBuilder::tls_only_custom_roots)).
//!
//! The platform's roots (rustls-native-certs), not a list compiled in
//! (webpki-roots): a private CA that an operator installed on the machine
//! is then trusted as curl and the Python and Node clients trust it, and
//! the list follows the system's updates instead of this binary's build.

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, TrustAnchor};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use crate::error::ClientError;

/// Which CAs a client trusts.
#[derive(Clone, Default)]
pub(crate) struct Trust {
    /// The PEM text given to `add_root_certificate_pem`, one entry a call.
    pems: Vec<Vec<u8>>,
    /// The platform's roots are not trusted, only `pems`.
    only_custom: bool,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trust")
            .field("added_pems", &self.pems.len())
            .field("only_custom", &self.only_custom)
            .finish()
    }
}

impl Trust {
    pub fn add_pem(&mut self, pem: &[u8]) {
        self.pems.push(pem.to_vec());
    }

    pub fn only_custom(&mut self) {
        self.only_custom = true;
    }

    /// The added CA certificates, each checked (for any URL: a bad PEM is
    /// an error whatever the scheme).
    pub fn custom_roots(&self) -> Result<RootCertStore, ClientError> {
        let mut store = RootCertStore::empty();
        for (i, pem) in self.pems.iter().enumerate() {
            let bad = |reason: String| {
                ClientError::Tls(format!(
                    "the PEM of add_root_certificate_pem call {}: {reason}",
                    i + 1
                ))
            };
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| bad(format!("is not valid PEM ({e})")))?;
                store
                    .add(cert)
                    .map_err(|e| bad(format!("holds a certificate rustls refuses ({e})")))?;
                found += 1;
            }
            if found == 0 {
                return Err(bad(
                    "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
                ));
            }
        }
        Ok(store)
    }

    /// The client settings of an `https://` URL: `custom` (from
    /// [`Trust::custom_roots`]) and, unless only those, the platform's roots.
    pub fn config(&self, mut roots: RootCertStore) -> Result<ClientConfig, ClientError> {
        let mut platform_error = None;
        if !self.only_custom {
            let (anchors, error) = platform_roots();
            roots.extend(anchors.iter().cloned());
            platform_error = error.as_deref();
        }
        if roots.is_empty() {
            return Err(ClientError::Tls(if self.only_custom {
                "tls_only_custom_roots without add_root_certificate_pem trusts no CA".into()
            } else {
                format!(
                    "no trusted root certificate: the platform has none{} and none was added \
                     with add_root_certificate_pem",
                    platform_error.map_or(String::new(), |e| format!(" ({e})"))
                )
            }));
        }
        // ring, not aws-lc-rs: aws-lc-rs needs cmake and doubles the TLS
        // part of a build on the 2-core build machines. rustls deprecates
        // ring's provider only for its lack of post-quantum key exchange.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // No ALPN: HTTP/1.1, which every server speaks without it (and
        // hyper-rustls requires it empty for an HTTP/1.1-only connector).
        Ok(config)
    }
}

/// The platform's trusted roots, read once per process (a load generator
/// builds many clients; the store is a few hundred files), and the first
/// reason some could not be read. Certificates rustls cannot use are
/// skipped, as every TLS client does with a system store.
fn platform_roots() -> &'static (Vec<TrustAnchor<'static>>, Option<String>) {
    static ROOTS: OnceLock<(Vec<TrustAnchor<'static>>, Option<String>)> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(found.certs);
        (store.roots, found.errors.first().map(ToString::to_string))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pem_without_a_usable_certificate_is_refused() {
        for pem in [
            &b""[..],
            b"not a certificate",
            b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            let mut t = Trust::default();
            t.add_pem(pem);
            let e = t.custom_roots().unwrap_err();
            assert!(
                matches!(&e, ClientError::Tls(m) if m.contains("add_root_certificate_pem call 1")),
                "{e}"
            );
        }
        let mut t = Trust::default();
        t.only_custom();
        let e = t.config(t.custom_roots().unwrap()).unwrap_err();
        assert!(e.to_string().contains("trusts no CA"), "{e}");
    }
}
