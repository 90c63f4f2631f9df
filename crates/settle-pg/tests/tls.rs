//! TLS to PostgreSQL (SPEC §12 "TLS", `src/tls.rs`) against a real server:
//! a throwaway cluster with `ssl = on` and a certificate for `localhost`
//! issued by a CA made here. Each `sslmode` connects (or refuses to) as
//! libpq's would, through the store's own connections (the first one of
//! `connect`, the pools', an export's and an import's).
//!
//! Unlike the crash tests this one does not skip without PostgreSQL's
//! server programs: it fails.

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{Cluster, Pg};
use common::{acme, exec_fence, options};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use settle_ledger::export::export_to;
use settle_ledger::{Clock, Store, StoreError};
use settle_pg::{PgOptions, PgStore};

/// A certificate authority made for this test.
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

/// A server certificate naming only `localhost` (so that connecting to
/// 127.0.0.1 shows whether the name is checked), and its key, in PEM.
fn server_cert(ca: &Ca) -> (String, String) {
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The TLS cluster, and the files the client side reads.
struct Setup {
    cluster: Cluster,
    ca: PathBuf,
    other_ca: PathBuf,
    _files: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let pg = Pg::find().unwrap_or_else(|why| {
            panic!("the TLS test needs PostgreSQL's server programs and does not skip: {why}")
        });
        let ca = new_ca("settle test CA");
        let other = new_ca("another CA");
        let (cert, key) = server_cert(&ca);
        let cluster = Cluster::create_with(
            &pg,
            "tls",
            &[
                "ssl = on",
                "ssl_cert_file = 'server.crt'",
                "ssl_key_file = 'server.key'",
            ],
            |c| {
                c.write_private("server.crt", cert.as_bytes());
                c.write_private("server.key", key.as_bytes());
                // A password user whose SCRAM exchange must bind to the
                // TLS session (channel_binding=require below).
                c.prepend_hba(&[
                    "hostssl all scram 127.0.0.1/32 scram-sha-256",
                    "host all scram 127.0.0.1/32 reject",
                ]);
            },
        );
        let files = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: &str| {
            let p = files.path().join(name);
            std::fs::write(&p, pem).unwrap();
            p
        };
        Setup {
            ca: write("ca.pem", &ca.pem),
            other_ca: write("other ca.pem", &other.pem),
            cluster,
            _files: files,
        }
    }

    /// A URL as `user` to `host` (the TCP connection always goes to
    /// 127.0.0.1: `hostaddr`), with `params` added.
    fn url(&self, user: &str, host: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "&" };
        format!(
            "postgres://{user}@{host}:{}/postgres?hostaddr=127.0.0.1{sep}{params}",
            self.cluster.port
        )
    }
}

/// `path`, percent-encoded for a URL query.
fn encoded(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_str().unwrap().bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn opts(app: &str) -> PgOptions {
    PgOptions {
        pool_size: 2,
        application_name: app.to_string(),
        ..options("settle", Clock::system())
    }
}

async fn open(url: &str) -> Result<PgStore, StoreError> {
    PgStore::connect(url, opts("settle-tls")).await
}

/// Whether the session of a pooled connection of `store` uses TLS.
async fn pooled_ssl(store: &PgStore) -> bool {
    let c = store.pool().get().await.unwrap();
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Opens a store on `url` and tells whether its sessions use TLS.
async fn ssl_of(url: &str) -> bool {
    let store = open(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let ssl = pooled_ssl(&store).await;
    store.close();
    ssl
}

/// Opening a store on `url` fails, with a message holding `needle`.
async fn refused(url: &str, needle: &str) {
    match open(url).await {
        Ok(_) => panic!("{url} connected"),
        Err(StoreError::Database(msg)) => {
            assert!(msg.contains(needle), "{url}: {msg:?} lacks {needle:?}")
        }
        Err(other) => panic!("{url}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_against_a_tls_server() {
    let s = tokio::task::spawn_blocking(Setup::new).await.unwrap();
    let ca = format!("sslrootcert={}", encoded(&s.ca));
    let other = format!("sslrootcert={}", encoded(&s.other_ca));
    let bad_cert = "invalid peer certificate";

    // Without sslmode, or with disable: no TLS, as before.
    assert!(!ssl_of(&s.url("postgres", "localhost", "")).await);
    assert!(!ssl_of(&s.url("postgres", "localhost", "sslmode=disable")).await);
    // disable ignores sslrootcert (libpq).
    let url = s.url("postgres", "localhost", &format!("sslmode=disable&{other}"));
    assert!(!ssl_of(&url).await);

    // prefer: TLS when the server has it.
    assert!(ssl_of(&s.url("postgres", "localhost", "sslmode=prefer")).await);

    // require: TLS, no certificate needed; with one, the chain is
    // verified (libpq), the name is not.
    assert!(ssl_of(&s.url("postgres", "127.0.0.1", "sslmode=require")).await);
    assert!(ssl_of(&s.url("postgres", "127.0.0.1", &format!("sslmode=require&{ca}"))).await);
    refused(
        &s.url("postgres", "localhost", &format!("sslmode=require&{other}")),
        bad_cert,
    )
    .await;

    // verify-ca: the chain, not the name (the certificate names only
    // localhost).
    assert!(ssl_of(&s.url("postgres", "127.0.0.1", &format!("sslmode=verify-ca&{ca}"))).await);
    refused(
        &s.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-ca&{other}"),
        ),
        bad_cert,
    )
    .await;

    // verify-full: the chain and the name.
    assert!(
        ssl_of(&s.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-full&{ca}")
        ))
        .await
    );
    refused(
        &s.url(
            "postgres",
            "127.0.0.1",
            &format!("sslmode=verify-full&{ca}"),
        ),
        "not valid for name",
    )
    .await;
    refused(
        &s.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-full&{other}"),
        ),
        bad_cert,
    )
    .await;
    // The platform's roots do not hold this test's CA (or there are none).
    assert!(
        open(&s.url(
            "postgres",
            "localhost",
            "sslmode=verify-full&sslrootcert=system"
        ))
        .await
        .is_err()
    );

    // Refused before connecting, naming what is wrong.
    refused(
        &s.url("postgres", "localhost", "sslmode=verify-full"),
        "needs sslrootcert",
    )
    .await;
    refused(
        &s.url("postgres", "localhost", "sslmode=bogus"),
        "\"bogus\"",
    )
    .await;

    channel_binding(&s, &ca).await;
    store_end_to_end(&s, &ca).await;
}

/// SCRAM over TLS binds to the session (tls-server-end-point): with
/// `channel_binding=require` the server checks the client's hash of its
/// certificate, so a wrong one fails authentication.
async fn channel_binding(s: &Setup, ca: &str) {
    let side = s.cluster.client().await.unwrap();
    side.batch_execute("CREATE ROLE scram LOGIN SUPERUSER PASSWORD 'sesame'")
        .await
        .unwrap();
    for tls in [
        format!("sslmode=verify-full&{ca}"),
        "sslmode=require".to_string(),
    ] {
        let url = s.url(
            "scram:sesame",
            "localhost",
            &format!("{tls}&channel_binding=require"),
        );
        assert!(ssl_of(&url).await, "{url}");
    }
    // tokio-postgres refuses channel_binding=require without a SCRAM
    // exchange, so the connections above did bind; a wrong password is
    // refused (no trust line applies), and so is the user without TLS.
    let url = s.url("scram:wrong", "localhost", "sslmode=require");
    refused(&url, "password authentication failed").await;
    refused(
        &s.url("scram:sesame", "localhost", "sslmode=disable"),
        "rejects",
    )
    .await;
}

/// The store itself over verify-full: a claim, an export (a connection of
/// its own), an import (another), and every session of the store on TLS.
async fn store_end_to_end(s: &Setup, ca: &str) {
    let url = s.url(
        "postgres",
        "localhost",
        &format!("sslmode=verify-full&{ca}"),
    );
    let store = PgStore::connect(&url, opts("settle-tls-e2e"))
        .await
        .unwrap();
    let fence = exec_fence(&store, "k1").await;
    assert!(
        store
            .get(&acme(), &settle_core::testkit::key("k1"))
            .await
            .unwrap()
            .unwrap()
            .is_some()
    );
    let (bytes, summary) = export_to(&store, Vec::new(), |_, _| {}).await.unwrap();
    assert_eq!(summary.records, 1);

    let side = s.cluster.client().await.unwrap();
    let row = side
        .query_one(
            "SELECT count(*) FILTER (WHERE ssl), count(*) FROM pg_stat_ssl \
             JOIN pg_stat_activity USING (pid) WHERE application_name = 'settle-tls-e2e'",
            &[],
        )
        .await
        .unwrap();
    let (tls, all): (i64, i64) = (row.get(0), row.get(1));
    assert!(all >= 1 && tls == all, "{tls} of {all} sessions use TLS");
    store.close();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("export.settle");
    std::fs::write(&file, bytes).unwrap();
    let mut o = opts("settle-tls-import");
    o.schema = "imported".into();
    let report = settle_pg::import(&url, o.clone(), &file, 0, |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.summary.records, 1);
    assert!(report.fence_floor > fence.0);
    let imported = PgStore::connect(&url, o).await.unwrap();
    assert!(pooled_ssl(&imported).await);
    assert!(
        imported
            .get(&acme(), &settle_core::testkit::key("k1"))
            .await
            .unwrap()
            .unwrap()
            .is_some()
    );
    imported.close();
}

/// Channel binding with a server certificate signed with
/// ecdsa-with-SHA512 (made by openssl: tests/fixtures/tls/README.md;
/// rcgen cannot sign so with ring): PostgreSQL hashes it with SHA-512, and
/// so must the client, or `channel_binding=require` fails. `require`
/// without `sslrootcert`: ring's webpki does not verify that signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_binding_with_an_ecdsa_with_sha512_certificate() {
    let cluster = tokio::task::spawn_blocking(|| {
        let pg = Pg::find().unwrap_or_else(|why| {
            panic!("the TLS test needs PostgreSQL's server programs and does not skip: {why}")
        });
        Cluster::create_with(
            &pg,
            "tls-sha512",
            &[
                "ssl = on",
                "ssl_cert_file = 'server.crt'",
                "ssl_key_file = 'server.key'",
            ],
            |c| {
                c.write_private(
                    "server.crt",
                    include_bytes!("fixtures/tls/ecdsa-sha512.crt"),
                );
                c.write_private(
                    "server.key",
                    include_bytes!("fixtures/tls/ecdsa-sha512.key"),
                );
                c.prepend_hba(&["hostssl all scram 127.0.0.1/32 scram-sha-256"]);
            },
        )
    })
    .await
    .unwrap();
    let side = cluster.client().await.unwrap();
    side.batch_execute("CREATE ROLE scram LOGIN SUPERUSER PASSWORD 'sesame'")
        .await
        .unwrap();
    let url = format!(
        "postgres://scram:sesame@localhost:{}/postgres?hostaddr=127.0.0.1\
         &sslmode=require&channel_binding=require",
        cluster.port
    );
    assert!(ssl_of(&url).await, "{url}");
}
