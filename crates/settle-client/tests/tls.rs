//! HTTPS (SPEC §12 "TLS"): both transports against an HTTPS server started
//! here (tokio-rustls and hyper), whose certificate a CA made in the test
//! issued. The CA added with `add_root_certificate_pem` is trusted;
//! another CA, the platform's roots alone, or a certificate for another
//! name are refused before anything is sent; a PEM without a certificate
//! fails `build()`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use settle_client::api::{Code, HealthStatus, Problem};
use settle_client::{Client, ClientBuilder, ClientError};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

/// The two transports.
const MODES: [&str; 2] = ["pool", "single"];

/// A client of `url` on the transport `mode`.
fn builder(url: &str, mode: &str) -> ClientBuilder {
    let b = Client::builder(url);
    if mode == "single" {
        b.single_connection()
    } else {
        b
    }
}

/// A certificate authority made for one test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn new_ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A server certificate for `names` (DNS names or IP addresses) that
/// `ca` issued, and its key.
fn leaf(ca: &Ca, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params.distinguished_name.push(DnType::CommonName, "settle");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.der().clone(), key)
}

/// An HTTPS server on 127.0.0.1 answering `GET /healthz` as settle does
/// (and anything else with a settle 404 problem), counting TCP
/// connections and the requests that reached it.
struct Server {
    port: u16,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Server {
    fn url(&self, host: &str) -> String {
        format!("https://{host}:{}", self.port)
    }
}

async fn https_server(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> Server {
    // ring, as the client and settle-server use (rustls deprecates it only
    // for its lack of post-quantum key exchange).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (a, r) = (accepted.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            let (acceptor, r) = (acceptor.clone(), r.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req| {
                    r.fetch_add(1, Ordering::SeqCst);
                    answer(req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Server {
        port,
        accepted,
        requests,
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = if req.uri().path() == "/healthz" {
        (200, "application/json", br#"{"status":"ok"}"#.to_vec())
    } else {
        let p = Problem::new(Code::NotFound, "no operation has this key");
        let body = serde_json::to_vec(&p).unwrap();
        (404, "application/problem+json", body)
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap())
}

#[tokio::test]
async fn a_private_ca_added_as_pem_is_trusted_on_both_transports() {
    let ca = new_ca("settle test CA");
    let (cert, key) = leaf(&ca, &["localhost", "127.0.0.1"]);
    for mode in MODES {
        let s = https_server(cert.clone(), key.clone_key()).await;
        // By IP address and by name (the certificate holds both).
        for host in ["127.0.0.1", "localhost"] {
            let client = builder(&s.url(host), mode)
                .add_root_certificate_pem(ca.pem.as_bytes())
                .build()
                .unwrap();
            assert_eq!(client.authority(), format!("{host}:{}", s.port));
            for _ in 0..3 {
                let h = client.health().await;
                assert_eq!(h.unwrap().status, HealthStatus::Ok, "{mode} {host}");
            }
            // The server's problems come through as over http.
            let e = client.get("k").await.unwrap_err();
            assert_eq!(e.code(), Some(Code::NotFound), "{mode} {host}: {e}");
        }
        // One kept-alive TLS connection per client (localhost may try
        // [::1] first, where nothing listens: not counted here).
        assert_eq!(s.accepted.load(Ordering::SeqCst), 2, "{mode}");
        assert_eq!(s.requests.load(Ordering::SeqCst), 8, "{mode}");
    }
}

#[tokio::test]
async fn only_the_added_ca_is_trusted_with_tls_only_custom_roots() {
    let ca = new_ca("settle test CA");
    let (cert, key) = leaf(&ca, &["127.0.0.1"]);
    let s = https_server(cert, key).await;
    for mode in MODES {
        let client = builder(&s.url("127.0.0.1"), mode)
            .tls_only_custom_roots()
            .add_root_certificate_pem(ca.pem.as_bytes())
            .build()
            .unwrap();
        client.health().await.unwrap();
    }
    // Without a CA to trust, there is nothing to check the server against.
    let e = Client::builder(&s.url("127.0.0.1"))
        .tls_only_custom_roots()
        .build()
        .unwrap_err();
    assert!(matches!(e, ClientError::Tls(_)), "{e:?}");
}

/// A refused certificate is a connect error: the server never sees the
/// request.
fn assert_refused(r: Result<settle_client::api::Health, ClientError>, what: &str) {
    let e = r.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{what}: {e:?}");
    assert!(e.is_transport() && e.is_retryable(), "{what}");
    assert!(e.is_tls_failure(), "{what}: {e:?}");
    let line = e.to_string();
    assert!(
        line.starts_with("cannot connect to 127.0.0.1:") && line.contains("certificate"),
        "{what}: {line}"
    );
}

#[tokio::test]
async fn a_certificate_of_an_untrusted_ca_is_refused() {
    let ca = new_ca("settle test CA");
    let other = new_ca("another CA");
    let (cert, key) = leaf(&ca, &["localhost", "127.0.0.1"]);
    let s = https_server(cert, key).await;
    for mode in MODES {
        let url = s.url("127.0.0.1");
        // Another CA (alone, or with the platform's roots).
        for only_custom in [false, true] {
            let mut b = builder(&url, mode).add_root_certificate_pem(other.pem.as_bytes());
            if only_custom {
                b = b.tls_only_custom_roots();
            }
            let r = b.build().unwrap().health().await;
            assert_refused(r, &format!("{mode}, another CA, only {only_custom}"));
        }
        // The platform's roots alone (a machine without any fails build()).
        match builder(&url, mode).build() {
            Ok(client) => assert_refused(client.health().await, &format!("{mode}, platform")),
            Err(e) => assert!(matches!(e, ClientError::Tls(_)), "{mode}: {e:?}"),
        }
    }
    assert_eq!(s.requests.load(Ordering::SeqCst), 0);
    assert!(s.accepted.load(Ordering::SeqCst) >= 4);
}

#[tokio::test]
async fn the_name_in_the_certificate_is_checked() {
    let ca = new_ca("settle test CA");
    // Trusted CA, but a certificate for another server.
    let (cert, key) = leaf(&ca, &["settle.example"]);
    let s = https_server(cert, key).await;
    for mode in MODES {
        let client = builder(&s.url("127.0.0.1"), mode)
            .add_root_certificate_pem(ca.pem.as_bytes())
            .build()
            .unwrap();
        assert_refused(client.health().await, mode);
    }
    assert_eq!(s.requests.load(Ordering::SeqCst), 0);
}

#[test]
fn a_pem_without_a_certificate_fails_build() {
    let key = KeyPair::generate().unwrap().serialize_pem();
    let ca = new_ca("settle test CA");
    let truncated = &ca.pem[..ca.pem.len() / 2];
    for url in ["https://127.0.0.1:7411", "http://127.0.0.1:7411"] {
        for mode in MODES {
            for pem in ["", "not a certificate", key.as_str(), truncated] {
                let e = builder(url, mode)
                    .add_root_certificate_pem(ca.pem.as_bytes())
                    .add_root_certificate_pem(pem.as_bytes())
                    .build()
                    .unwrap_err();
                assert!(matches!(e, ClientError::Tls(_)), "{url} {mode}: {e:?}");
                let line = e.to_string();
                assert!(
                    line.starts_with(
                        "invalid TLS settings: the PEM of add_root_certificate_pem call 2"
                    ),
                    "{line}"
                );
            }
        }
    }
}
