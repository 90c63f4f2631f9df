//! TLS to PostgreSQL (SPEC §12 "TLS"): the `sslmode` and `sslrootcert`
//! parameters of the connection URL.
//!
//! settle reads both itself and removes them before tokio-postgres parses
//! the rest (tokio-postgres knows neither `verify-ca`, `verify-full` nor
//! `sslrootcert`). The modes follow libpq's:
//!
//! | `sslmode` | TLS | the server's certificate |
//! | --- | --- | --- |
//! | absent, `disable` | never (exactly as without TLS support) | — |
//! | `allow` | refused: settle does not try without TLS first and then with it | — |
//! | `prefer` | if the server offers it, else an unencrypted session | not verified; with `sslrootcert`, its chain is (as `verify-ca`) |
//! | `require` | always | not verified; with `sslrootcert`, its chain is (as `verify-ca`, as libpq does) |
//! | `verify-ca` | always | chain verified against `sslrootcert`; the host name is not checked |
//! | `verify-full` | always | chain verified against `sslrootcert`, and the host name against the certificate's subject alternative names |
//!
//! - `sslrootcert` is a PEM file of one or more CA certificates, read once
//!   when the store connects (a replaced file takes effect when the store
//!   is opened again). `verify-ca` and `verify-full` require it (libpq's
//!   default `~/.postgresql/root.crt` is not read). `sslrootcert=system`
//!   trusts the platform's roots instead, with `verify-full` only (as in
//!   libpq 16).
//! - `sslrootcert` without `sslmode` is refused rather than ignored: a URL
//!   without `sslmode` connects without TLS, which is surely not what its
//!   author meant. With `disable` it is ignored, as in libpq.
//! - `prefer` differs from libpq in one way: a TLS handshake that fails
//!   (a certificate that does not verify against `sslrootcert`) is an
//!   error, not a retry without TLS.
//! - Verification is webpki's (rustls): names come from the certificate's
//!   subject alternative names only, never its common name, and a
//!   certificate that is itself a CA (the self-signed `openssl req -x509`
//!   kind) is not accepted as the server's — issue the server a
//!   certificate from a CA, as in PostgreSQL's documentation, or use
//!   `require` without `sslrootcert`.
//! - Unix-socket hosts never use TLS in PostgreSQL: `prefer` connects
//!   without, the stricter modes fail.
//! - The handshake offers ALPN `postgresql` (as libpq 17 does; needed by
//!   `sslnegotiation=direct`, which tokio-postgres reads itself) and sends
//!   the host name as SNI. The `tls-server-end-point` channel binding is
//!   supported, so SCRAM authentication binds itself to the TLS session
//!   (`channel_binding=prefer`, tokio-postgres's default; `require` to
//!   insist on it). The certificate is hashed as PostgreSQL's server
//!   hashes it, by its signature algorithm (`stream.rs`).
//!
//! rustls with the *ring* provider (not aws-lc-rs, which needs cmake and
//! doubles the TLS part of a build), TLS 1.2 and 1.3. Client certificates
//! (`sslcert`, `sslkey`) and `sslcrl` are not supported (tokio-postgres
//! rejects them as unknown options).

mod params;
mod stream;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use tokio_postgres::config::SslMode;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::PgError;
pub use stream::MakeRustls;

/// Why the TLS parameters of a connection URL cannot be used. No
/// connection was attempted.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `sslmode` has a value libpq does not know.
    #[error(
        "sslmode={0:?} is not a TLS mode: use disable, prefer, require, verify-ca or verify-full"
    )]
    UnknownMode(String),
    /// `sslmode=allow` (try without TLS, then with): not supported.
    #[error(
        "sslmode=allow is not supported (settle never tries without TLS first): use disable, \
         prefer, require, verify-ca or verify-full"
    )]
    Allow,
    /// `verify-ca` or `verify-full` without `sslrootcert`.
    #[error(
        "sslmode={0} needs sslrootcert: the file of the CA certificates (PEM) to verify the \
         server's certificate with, or sslrootcert=system (with verify-full) for the \
         platform's trusted roots"
    )]
    NoRootCert(&'static str),
    /// `sslrootcert` without `sslmode`.
    #[error(
        "sslrootcert is given without sslmode, which would connect without TLS: add \
         sslmode=verify-full (or verify-ca, require)"
    )]
    RootCertWithoutMode,
    /// `sslrootcert=system` with a mode that does not check the host name.
    #[error("sslrootcert=system needs sslmode=verify-full, not sslmode={0}")]
    SystemNeedsVerifyFull(&'static str),
    /// A TLS parameter's value is not valid percent-encoded UTF-8.
    #[error("the value of {0} in the URL is not valid percent-encoded UTF-8")]
    Encoding(String),
    /// The `sslrootcert` file cannot be used.
    #[error("sslrootcert {}: {reason}", path.display())]
    RootCert {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `sslrootcert=system` and the platform has no usable root.
    #[error("sslrootcert=system: the platform has no trusted root certificate{0}")]
    NoSystemRoots(String),
    /// rustls refused the settings (never expected with its own provider).
    #[error("TLS settings: {0}")]
    Config(String),
}

/// How connections are made: without TLS, or with rustls. Cheap to clone.
#[derive(Clone)]
pub enum Tls {
    /// tokio-postgres's `NoTls`: no TLS code runs at all.
    Off,
    /// TLS, with the settings of the URL.
    Rustls(MakeRustls),
}

/// The `sslmode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode, TlsError> {
        Ok(match s {
            "disable" => Mode::Disable,
            "allow" => return Err(TlsError::Allow),
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => return Err(TlsError::UnknownMode(other.to_string())),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted CA certificates come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    /// A PEM file.
    File(PathBuf),
    /// The platform's trusted roots (`sslrootcert=system`).
    System,
}

/// What is checked of the server's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing (but the handshake's own signatures).
    Nothing,
    /// The chain up to a trusted root, not the name.
    Chain(Roots),
    /// The chain and the host name.
    Full(Roots),
}

/// The TLS settings of a URL, decided but not loaded (no file read yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The URL without its TLS parameters.
    pub rest: String,
    /// What tokio-postgres is told; None: its default, left as it was
    /// (no `sslmode` given; with [`Tls::Off`] that means no TLS).
    pub ssl_mode: Option<SslMode>,
    /// None: no TLS code at all ([`Tls::Off`]).
    pub check: Option<Check>,
}

impl Settings {
    /// Reads the TLS parameters of `url` (a URL or key/value pairs).
    pub fn parse(url: &str) -> Result<Settings, TlsError> {
        let split = params::split(url)?;
        let mode = split.sslmode.as_deref().map(Mode::parse).transpose()?;
        let roots = match split.sslrootcert.as_deref() {
            None | Some("") => None,
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(PathBuf::from(path))),
        };
        let (ssl_mode, check) = match (mode, roots) {
            (None, None) => (None, None),
            (None, Some(_)) => return Err(TlsError::RootCertWithoutMode),
            (Some(Mode::Disable), _) => (Some(SslMode::Disable), None),
            (Some(m @ (Mode::VerifyCa | Mode::VerifyFull)), None) => {
                return Err(TlsError::NoRootCert(m.name()));
            }
            (Some(m), Some(Roots::System)) if m != Mode::VerifyFull => {
                return Err(TlsError::SystemNeedsVerifyFull(m.name()));
            }
            (Some(Mode::Prefer), roots) => (
                Some(SslMode::Prefer),
                Some(roots.map_or(Check::Nothing, Check::Chain)),
            ),
            (Some(Mode::Require), roots) => (
                Some(SslMode::Require),
                Some(roots.map_or(Check::Nothing, Check::Chain)),
            ),
            (Some(Mode::VerifyCa), Some(roots)) => {
                (Some(SslMode::Require), Some(Check::Chain(roots)))
            }
            (Some(Mode::VerifyFull), Some(roots)) => {
                (Some(SslMode::Require), Some(Check::Full(roots)))
            }
        };
        Ok(Settings {
            rest: split.rest,
            ssl_mode,
            check,
        })
    }

    /// The connector: loads the roots and builds the rustls settings.
    pub fn connector(&self) -> Result<Tls, TlsError> {
        let Some(check) = &self.check else {
            return Ok(Tls::Off);
        };
        // ring, not aws-lc-rs (see the module docs); rustls deprecates
        // ring's provider only for its lack of post-quantum key exchange.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut config = match check {
            Check::Full(roots) => builder
                .with_root_certificates(load(roots)?)
                .with_no_client_auth(),
            Check::Chain(roots) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier {
                    roots: Some(Arc::new(load(roots)?)),
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth(),
            Check::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier {
                    roots: None,
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Tls::Rustls(MakeRustls::new(Arc::new(config))))
    }
}

/// The connection settings of `url`: tokio-postgres's, and how to use TLS.
pub fn config(url: &str) -> Result<(tokio_postgres::Config, Tls), PgError> {
    let settings = Settings::parse(url)?;
    let mut cfg = tokio_postgres::Config::from_str(&settings.rest)
        .map_err(|e| PgError::Url(crate::with_causes(&e)))?;
    if let Some(mode) = settings.ssl_mode {
        cfg.ssl_mode(mode);
    }
    Ok((cfg, settings.connector()?))
}

/// The trusted roots.
fn load(roots: &Roots) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let bad = |reason: String| TlsError::RootCert {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| bad(format!("is not valid PEM ({e})")))?;
                store
                    .add(cert)
                    .map_err(|e| bad(format!("holds a certificate rustls refuses ({e})")))?;
            }
            if store.is_empty() {
                return Err(bad(
                    "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
                ));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            // Certificates rustls cannot use are skipped, as every TLS
            // client does with a system store.
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(TlsError::NoSystemRoots(
                    found
                        .errors
                        .first()
                        .map_or(String::new(), |e| format!(" ({e})")),
                ));
            }
        }
    }
    Ok(store)
}

/// The certificate check of `prefer`, `require` and `verify-ca`: the chain
/// up to `roots` when given, never the name. The handshake's signatures
/// are always verified (they prove the server holds the certificate's key).
///
/// Built on rustls's chain check itself, not by excusing name errors of
/// its full verifier: nothing here depends on the order in which that
/// verifier checks things. (rustls 0.23's `WebPkiServerVerifier` runs
/// this same chain check, then the name check; a wrapper excusing its
/// `NotValidForName` and `NotValidForNameContext` would behave the same
/// today but would still implement the four methods below, which the
/// check without roots needs anyway.)
#[derive(Debug)]
struct Verifier {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Settings {
        Settings::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn error(url: &str) -> TlsError {
        match Settings::parse(url) {
            Ok(s) => panic!("{url} was accepted: {s:?}"),
            Err(e) => e,
        }
    }

    fn file(p: &str) -> Roots {
        Roots::File(PathBuf::from(p))
    }

    const BASE: &str = "postgres://u:p@db.example:5433/settle";

    #[test]
    fn no_sslmode_is_no_tls_and_the_url_is_untouched() {
        for url in [
            BASE.to_string(),
            format!("{BASE}?application_name=x&connect_timeout=3"),
            "host=db user=u".to_string(),
        ] {
            let s = parse(&url);
            assert_eq!(s.rest, url);
            assert_eq!(s.ssl_mode, None);
            assert_eq!(s.check, None);
            assert!(matches!(s.connector().unwrap(), Tls::Off));
            // tokio-postgres's default, which with NoTls is no TLS.
            let (cfg, tls) = config(&url).unwrap();
            assert_eq!(cfg.get_ssl_mode(), SslMode::Prefer);
            assert!(matches!(tls, Tls::Off));
        }
    }

    #[test]
    fn disable_is_no_tls_and_ignores_sslrootcert() {
        for url in [
            format!("{BASE}?sslmode=disable"),
            format!("{BASE}?sslmode=disable&sslrootcert=/nonexistent/ca.pem"),
            format!("{BASE}?sslrootcert=system&sslmode=disable"),
        ] {
            let s = parse(&url);
            assert_eq!(s.rest, BASE, "{url}");
            assert_eq!(s.ssl_mode, Some(SslMode::Disable));
            assert_eq!(s.check, None);
            let (cfg, tls) = config(&url).unwrap();
            assert_eq!(cfg.get_ssl_mode(), SslMode::Disable);
            assert!(matches!(tls, Tls::Off), "{url}: no file is read");
        }
    }

    #[test]
    fn each_mode() {
        let cases = [
            ("prefer", None, SslMode::Prefer, Check::Nothing),
            (
                "prefer",
                Some("/ca.pem"),
                SslMode::Prefer,
                Check::Chain(file("/ca.pem")),
            ),
            ("require", None, SslMode::Require, Check::Nothing),
            // libpq: require with a root certificate verifies the chain.
            (
                "require",
                Some("/ca.pem"),
                SslMode::Require,
                Check::Chain(file("/ca.pem")),
            ),
            (
                "verify-ca",
                Some("/ca.pem"),
                SslMode::Require,
                Check::Chain(file("/ca.pem")),
            ),
            (
                "verify-full",
                Some("/ca.pem"),
                SslMode::Require,
                Check::Full(file("/ca.pem")),
            ),
            (
                "verify-full",
                Some("system"),
                SslMode::Require,
                Check::Full(Roots::System),
            ),
            (
                "verify-full",
                Some("./system"),
                SslMode::Require,
                Check::Full(file("./system")),
            ),
        ];
        for (mode, root, ssl_mode, check) in cases {
            let url = match root {
                Some(r) => format!("{BASE}?sslmode={mode}&sslrootcert={r}"),
                None => format!("{BASE}?sslmode={mode}"),
            };
            let s = parse(&url);
            assert_eq!(s.rest, BASE, "{url}");
            assert_eq!(s.ssl_mode, Some(ssl_mode), "{url}");
            assert_eq!(s.check, Some(check), "{url}");
        }
    }

    #[test]
    fn refused_combinations_say_why() {
        let e = error(&format!("{BASE}?sslmode=verify-everything"));
        assert!(matches!(&e, TlsError::UnknownMode(m) if m == "verify-everything"));
        let msg = e.to_string();
        assert!(msg.contains("\"verify-everything\""), "{msg}");
        for allowed in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            assert!(msg.contains(allowed), "{msg}");
        }
        assert!(
            matches!(error(&format!("{BASE}?sslmode=")), TlsError::UnknownMode(m) if m.is_empty())
        );
        // libpq spells modes in lowercase only.
        assert!(matches!(
            error(&format!("{BASE}?sslmode=REQUIRE")),
            TlsError::UnknownMode(_)
        ));
        assert!(matches!(
            error(&format!("{BASE}?sslmode=allow")),
            TlsError::Allow
        ));
        for mode in ["verify-ca", "verify-full"] {
            assert!(matches!(
                error(&format!("{BASE}?sslmode={mode}")),
                TlsError::NoRootCert(m) if m == mode
            ));
            // An empty sslrootcert is none.
            assert!(matches!(
                error(&format!("{BASE}?sslmode={mode}&sslrootcert=")),
                TlsError::NoRootCert(_)
            ));
        }
        assert!(matches!(
            error(&format!("{BASE}?sslrootcert=/ca.pem")),
            TlsError::RootCertWithoutMode
        ));
        for mode in ["prefer", "require", "verify-ca"] {
            assert!(matches!(
                error(&format!("{BASE}?sslmode={mode}&sslrootcert=system")),
                TlsError::SystemNeedsVerifyFull(m) if m == mode
            ));
        }
        assert!(matches!(
            error(&format!("{BASE}?sslmode=require&sslrootcert=%ff%fe")),
            TlsError::Encoding(p) if p == "sslrootcert"
        ));
    }

    #[test]
    fn values_and_keys_are_percent_decoded() {
        let s = parse(&format!(
            "{BASE}?sslmode=verify%2Dfull&sslrootcert=%2Fetc%2Fmy%20certs%2Fca+1%25.pem"
        ));
        assert_eq!(s.check, Some(Check::Full(file("/etc/my certs/ca+1%.pem"))));
        // A '%' not followed by two hex digits stays, as in tokio-postgres.
        let s = parse(&format!("{BASE}?ssl%6Dode=require&sslrootcert=/a%zz%4"));
        assert_eq!(s.check, Some(Check::Chain(file("/a%zz%4"))));
        assert_eq!(s.rest, BASE);
    }

    #[test]
    fn the_rest_keeps_every_other_parameter_in_order() {
        let url = "postgresql://u:p%3F@h1:5432,h2:5433/db?application_name=a%26b&sslmode=verify-full\
                   &connect_timeout=3&sslrootcert=/ca.pem&options=-c%20x%3Dy&sslmode=verify-ca";
        let s = parse(url);
        // The last sslmode wins, as in libpq and tokio-postgres.
        assert_eq!(s.check, Some(Check::Chain(file("/ca.pem"))));
        assert_eq!(
            s.rest,
            "postgresql://u:p%3F@h1:5432,h2:5433/db?application_name=a%26b&connect_timeout=3\
             &options=-c%20x%3Dy"
        );
        let cfg = tokio_postgres::Config::from_str(&s.rest).unwrap();
        assert_eq!(cfg.get_application_name(), Some("a&b"));
        assert_eq!(cfg.get_options(), Some("-c x=y"));
        assert_eq!(
            cfg.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        assert_eq!(cfg.get_ports(), [5432, 5433]);

        // Only TLS parameters: no '?' left.
        assert_eq!(parse(&format!("{BASE}?sslmode=require")).rest, BASE);
        assert_eq!(parse("postgres://h?sslmode=require").rest, "postgres://h");
        // A '?' (and '&', '=') in the password is the password's.
        let s = parse("postgres://u:a?b&sslmode=x@h/db?sslmode=require");
        assert_eq!(s.rest, "postgres://u:a?b&sslmode=x@h/db");
        assert_eq!(s.ssl_mode, Some(SslMode::Require));
        // No query at all.
        assert_eq!(parse("postgres://u@h/db").rest, "postgres://u@h/db");
        // What tokio-postgres rejects is left for it to reject.
        let s = parse(&format!("{BASE}?sslmode=require&broken"));
        assert_eq!(s.rest, format!("{BASE}?broken"));
        assert!(matches!(
            config(&format!("{BASE}?sslmode=disable&broken")),
            Err(PgError::Url(_))
        ));
        assert!(matches!(
            config(&format!("{BASE}?sslmode=disable&nope=1")),
            Err(PgError::Url(_))
        ));
    }

    #[test]
    fn key_value_strings_are_read_as_tokio_postgres_reads_them() {
        let s = parse(
            "host=localhost sslmode = verify-full user=u sslrootcert='/my certs/it\\'s.pem' \
             dbname=db",
        );
        assert_eq!(s.check, Some(Check::Full(file("/my certs/it's.pem"))));
        assert_eq!(s.ssl_mode, Some(SslMode::Require));
        let cfg = tokio_postgres::Config::from_str(&s.rest).unwrap();
        assert_eq!(cfg.get_user(), Some("u"));
        assert_eq!(cfg.get_dbname(), Some("db"));
        let s = parse("sslmode=require\thost=h password='a b'");
        assert_eq!(s.check, Some(Check::Nothing));
        let cfg = tokio_postgres::Config::from_str(&s.rest).unwrap();
        assert_eq!(cfg.get_password(), Some(&b"a b"[..]));
        let s = parse("host=h sslrootcert=/a\\ b.pem sslmode=verify-ca");
        assert_eq!(s.check, Some(Check::Chain(file("/a b.pem"))));
        assert_eq!(s.rest.split_whitespace().collect::<Vec<_>>(), ["host=h"]);
        assert!(matches!(error("host=h sslmode=allow"), TlsError::Allow));
        // Unparseable: left to tokio-postgres.
        assert!(matches!(
            config("host=h password='open"),
            Err(PgError::Url(_))
        ));
    }

    #[test]
    fn the_root_file_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let url = format!(
            "{BASE}?sslmode=verify-full&sslrootcert={}",
            missing.display()
        );
        let e = config(&url).err().unwrap();
        let msg = e.to_string();
        assert!(msg.contains("missing.pem"), "{msg}");
        assert!(
            matches!(e, PgError::Tls(TlsError::RootCert { .. })),
            "{msg}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let url = format!("{BASE}?sslmode=verify-ca&sslrootcert={}", empty.display());
        let msg = config(&url).err().unwrap().to_string();
        assert!(msg.contains("holds no certificate"), "{msg}");

        let ca = rcgen::generate_simple_self_signed(vec!["ca".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        for mode in ["prefer", "require", "verify-ca", "verify-full"] {
            let url = format!("{BASE}?sslmode={mode}&sslrootcert={}", good.display());
            let (_, tls) = config(&url).unwrap();
            assert!(matches!(tls, Tls::Rustls(_)), "{mode}");
        }
        let (_, tls) = config(&format!("{BASE}?sslmode=require")).unwrap();
        assert!(matches!(tls, Tls::Rustls(_)));
    }

    #[test]
    fn channel_binding_hashes_by_the_signature_algorithm() {
        use sha2::Digest;
        for (alg, len) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, 32),
            (&rcgen::PKCS_ECDSA_P384_SHA384, 48),
        ] {
            let key = rcgen::KeyPair::generate_for(alg).unwrap();
            let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            let der = cert.der().as_ref();
            let hash = stream::end_point_hash(der).unwrap();
            assert_eq!(hash.len(), len);
            let expected = match len {
                32 => sha2::Sha256::digest(der).to_vec(),
                _ => sha2::Sha384::digest(der).to_vec(),
            };
            assert_eq!(hash, expected);
        }
        // Ed25519 names no hash: no channel binding.
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(stream::end_point_hash(cert.der().as_ref()), None);
    }

    /// The algorithms rcgen cannot sign with under ring, from certificates
    /// made by `openssl req -x509` (tests/fixtures/tls/README.md): the
    /// hash PostgreSQL's server binds with, or none.
    #[test]
    fn channel_binding_of_other_signature_algorithms() {
        use sha2::Digest;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
        for (file, len) in [
            ("ecdsa-sha512.crt", Some(64)),
            ("rsa-sha512.crt", Some(64)),
            // RFC 5929 §4.1: MD5 and SHA-1 become SHA-256.
            ("ecdsa-sha1.crt", Some(32)),
            ("rsa-md5.crt", Some(32)),
            // RSA-PSS: no hash in the signature algorithm's OID (module docs).
            ("rsa-pss-sha256.crt", None),
        ] {
            let pem = std::fs::read(dir.join(file)).unwrap();
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            let der = der.as_ref();
            let expected = match len {
                None => None,
                Some(32) => Some(sha2::Sha256::digest(der).to_vec()),
                Some(_) => Some(sha2::Sha512::digest(der).to_vec()),
            };
            assert_eq!(stream::end_point_hash(der), expected, "{file}");
        }
    }
}
