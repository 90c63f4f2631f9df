//! The service edge of `settle serve` as a process (SPEC §12): HTTPS with
//! a certificate of a CA made in the test (HTTP/1.1 and HTTP/2 by ALPN; a
//! client trusting another CA is refused), the refusal of plain HTTP on a
//! network address unless `--behind-proxy`, and SIGHUP: tokens added and
//! removed and the certificate replaced without a restart, a bad file
//! changing nothing. What a reload swaps is tested on the router in
//! crates/settle-server/tests/edge.rs.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use common::{BIN, TempDir, token_sha256};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use settle_client::{Client, ClientError};
use tokio_rustls::rustls;

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

/// Writes a certificate for 127.0.0.1 and localhost that `ca` issued, and
/// its key, as `cert.pem` and `key.pem` in `dir`.
fn write_leaf(ca: &Ca, dir: &Path) {
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "settle");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    // Written whole, then renamed: a reload never reads half a file.
    for (name, text) in [("cert.pem", cert.pem()), ("key.pem", key.serialize_pem())] {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// `settle serve` with its log lines on a channel (a reload is awaited by
/// its log line, not by time).
struct Serve {
    child: Child,
    addr: String,
    log: Receiver<String>,
}

impl Serve {
    fn start(args: &[&str]) -> Result<Serve, String> {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(args)
            .env_remove("SETTLE_TENANTS")
            .env_remove("SETTLE_CONFIG")
            .env("SETTLE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, log) = channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match line.trim().strip_prefix("listening on ") {
            Some(addr) => Ok(Serve {
                addr: addr.to_string(),
                child,
                log,
            }),
            None => {
                let status = child.wait().unwrap();
                // Every line: the reader ends at the exited child's EOF.
                let text: Vec<String> = log.iter().collect();
                Err(format!("{status}: {}", text.join("\n")))
            }
        }
    }

    fn hup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// The next log line that contains one of `needles` (the server's log
    /// is the only witness that a reload ran).
    fn await_log(&self, needles: &[&str]) -> String {
        loop {
            let line = self
                .log
                .recv_timeout(Duration::from_secs(60))
                .expect("the server logs the reload");
            if needles.iter().any(|n| line.contains(n)) {
                return line;
            }
        }
    }

    fn https(&self, ca: &Ca, token: &str) -> Client {
        Client::builder(&format!("https://{}", self.addr))
            .token(token)
            .tls_only_custom_roots()
            .add_root_certificate_pem(ca.pem.as_bytes())
            .build()
            .unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn status(c: &Client, path: &str) -> Result<u16, ClientError> {
    c.send_raw(hyper::Method::GET, path, None)
        .await
        .map(|r| r.status)
}

/// The protocol ALPN settles on when a client offers `offer`.
async fn alpn(addr: &str, ca: &Ca, offer: &[&[u8]]) -> Option<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls::pki_types::CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap();
    roots.add(der).unwrap();
    #[allow(deprecated)] // ring's provider: no post-quantum key exchange, fine for a test
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = offer.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}

use rustls::pki_types::pem::PemObject as _;

#[tokio::test]
async fn https_with_a_trusted_ca_and_refused_with_another() {
    let dir = TempDir::new("tls");
    let ca = new_ca("settle test CA");
    write_leaf(&ca, dir.path());
    let (cert, key, data) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("data"),
    );
    let s = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ])
    .unwrap();

    assert_eq!(status(&s.https(&ca, ""), "/readyz").await.unwrap(), 200);
    assert_eq!(
        status(&s.https(&ca, ""), "/v1/operations/k").await.unwrap(),
        404
    );
    // Another CA: the handshake fails, nothing is sent.
    let other = new_ca("another CA");
    let e = status(&s.https(&other, ""), "/readyz").await.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = Client::new(&format!("http://{}", s.addr)).unwrap();
    assert!(status(&plain, "/readyz").await.is_err());
    // The CLI says which of these it met, each with its own exit code.
    let settle = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(args)
            .env_remove("SETTLE_CA_CERT")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let pem = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (good, bad, not_pem) = (
        pem("ca.pem", &ca.pem),
        pem("other.pem", &other.pem),
        pem("not.pem", "hello"),
    );
    let https = format!("https://{}", s.addr);
    let (code, err) = settle(&["stats", "--url", &https, "--ca-cert", &good]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = settle(&["stats", "--url", &https, "--ca-cert", &bad]);
    assert_eq!(code, Some(7), "an untrusted certificate: {err}");
    assert!(err.contains("the TLS handshake failed"), "{err}");
    let (code, err) = settle(&["stats", "--url", &format!("http://{}", s.addr)]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("the server speaks TLS: use https://"), "{err}");
    let (code, err) = settle(&["stats", "--url", &https, "--ca-cert", &not_pem]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--ca-cert") && err.contains("not.pem"),
        "{err}"
    );
    let (_, err) = settle(&[
        "stats",
        "--url",
        &format!("http://{}", s.addr),
        "--ca-cert",
        &good,
    ]);
    assert!(err.contains("warning: --ca-cert is ignored"), "{err}");
    // HTTP/2 and HTTP/1.1 are both offered by ALPN.
    assert_eq!(
        alpn(&s.addr, &ca, &[b"h2", b"http/1.1"]).await.as_deref(),
        Some(&b"h2"[..])
    );
    assert_eq!(
        alpn(&s.addr, &ca, &[b"http/1.1"]).await.as_deref(),
        Some(&b"http/1.1"[..])
    );
}

#[test]
fn plain_http_on_a_network_address_needs_behind_proxy_and_bad_certificates_stop_the_start() {
    let dir = TempDir::new("edge-refusals");
    let data = dir.path().join("data");
    let tenant = format!("acme={}", token_sha256("tok"));
    let e = Serve::start(&[
        "--listen",
        "0.0.0.0:0",
        "--data",
        data.to_str().unwrap(),
        "--tenant",
        &tenant,
    ])
    .err()
    .expect("refused");
    assert!(e.contains("--behind-proxy"), "{e}");

    let s = Serve::start(&[
        "--listen",
        "0.0.0.0:0",
        "--data",
        data.to_str().unwrap(),
        "--tenant",
        &tenant,
        "--behind-proxy",
    ])
    .expect("starts behind a proxy");
    drop(s);

    // A certificate file that is not PEM stops the start, naming it.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let e = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--tls-cert",
        bad.to_str().unwrap(),
        "--tls-key",
        bad.to_str().unwrap(),
    ])
    .err()
    .expect("refused");
    assert!(e.contains("bad.pem"), "{e}");
}

#[tokio::test]
async fn sighup_rotates_tokens_and_the_certificate_and_a_bad_file_changes_nothing() {
    let dir = TempDir::new("reload");
    let ca = new_ca("first CA");
    write_leaf(&ca, dir.path());
    let config = dir.path().join("settle.toml");
    let tenants = |tokens: &[&str]| {
        let list: Vec<String> = tokens
            .iter()
            .map(|t| format!("\"{}\"", token_sha256(t)))
            .collect();
        format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n[[tenants]]\nname = \"acme\"\ntoken_sha256 = [{}]\n",
            dir.path().join("cert.pem").display(),
            dir.path().join("key.pem").display(),
            list.join(", ")
        )
    };
    std::fs::write(&config, tenants(&["old"])).unwrap();
    let data = dir.path().join("data");
    let s = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ])
    .unwrap();
    let path = "/v1/operations/k";
    assert_eq!(status(&s.https(&ca, "old"), path).await.unwrap(), 404);
    assert_eq!(status(&s.https(&ca, "new"), path).await.unwrap(), 401);

    // Add a token.
    std::fs::write(&config, tenants(&["old", "new"])).unwrap();
    s.hup();
    s.await_log(&["configuration reloaded"]);
    assert_eq!(status(&s.https(&ca, "old"), path).await.unwrap(), 404);
    assert_eq!(status(&s.https(&ca, "new"), path).await.unwrap(), 404);

    // Remove the old one, and serve a certificate of another CA.
    let ca2 = new_ca("second CA");
    write_leaf(&ca2, dir.path());
    std::fs::write(&config, tenants(&["new"])).unwrap();
    s.hup();
    s.await_log(&["configuration reloaded"]);
    assert_eq!(status(&s.https(&ca2, "old"), path).await.unwrap(), 401);
    assert_eq!(status(&s.https(&ca2, "new"), path).await.unwrap(), 404);
    assert!(
        status(&s.https(&ca, "new"), path).await.is_err(),
        "the first CA's certificate is gone"
    );

    // A bad file: refused, logged, nothing changes.
    std::fs::write(
        &config,
        "[[tenants]]\nname = \"acme\"\ntoken_sha256 = \"zz\"\n",
    )
    .unwrap();
    s.hup();
    let line = s.await_log(&["reload refused", "configuration reloaded"]);
    assert!(line.contains("reload refused"), "{line}");
    assert_eq!(status(&s.https(&ca2, "new"), path).await.unwrap(), 404);
    assert_eq!(status(&s.https(&ca2, "old"), path).await.unwrap(), 401);

    // Both outcomes are counted.
    let m = s
        .https(&ca2, "")
        .send_raw(hyper::Method::GET, "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    for (result, n) in [("applied", 2), ("refused", 1)] {
        let line = format!("settle_config_reloads_total{{result=\"{result}\"}} {n}");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
}
