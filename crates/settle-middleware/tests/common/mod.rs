//! One service behind the middleware, over the embedded ledger in this
//! process or over a real `settle serve` (the server's own `run`, on an
//! ephemeral port, in this process), and the requests the tests send.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use serde_json::Value;
use settle_client::Client;
use settle_core::{Key, TenantId};
use settle_embedded::EmbeddedStore;
use settle_ledger::Ledger;
use settle_middleware::{IdempotencyLayer, principal};

/// The principal every test layer acts for.
pub const PRINCIPAL: &str = "acct-1";
use tower::ServiceExt as _;

/// Which ledger the layer talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    Remote,
}

/// A ledger for one test, removed with it.
pub struct Ledgers {
    pub mode: Mode,
    _dir: tempfile::TempDir,
    embedded: Option<(Ledger, Arc<EmbeddedStore>)>,
    remote: Option<(Client, tokio::sync::oneshot::Sender<()>, String)>,
}

impl Ledgers {
    pub async fn start(mode: Mode) -> Ledgers {
        let dir = tempfile::tempdir().unwrap();
        match mode {
            Mode::Embedded => {
                let store = EmbeddedStore::open(dir.path(), Default::default()).unwrap();
                Ledgers {
                    mode,
                    embedded: Some((Ledger::new(store.clone()), store)),
                    remote: None,
                    _dir: dir,
                }
            }
            Mode::Remote => {
                let (client, stop, url) = serve(dir.path().to_path_buf()).await;
                Ledgers {
                    mode,
                    embedded: None,
                    remote: Some((client, stop, url)),
                    _dir: dir,
                }
            }
        }
    }

    /// A layer over this ledger (the namespace of the example).
    pub fn layer(&self) -> IdempotencyLayer {
        let l = match (&self.embedded, &self.remote) {
            (Some((ledger, _)), _) => IdempotencyLayer::embedded(
                ledger.clone(),
                TenantId::default_tenant(),
                principal::fixed(PRINCIPAL),
            ),
            (_, Some((client, _, _))) => {
                IdempotencyLayer::remote(client.clone(), principal::fixed(PRINCIPAL))
            }
            _ => unreachable!(),
        };
        l.namespace("payments-example")
    }

    /// The ledger as a transport (to wrap, or to act on it directly).
    pub fn transport(&self) -> Arc<dyn settle_middleware::Transport> {
        match (&self.embedded, &self.remote) {
            (Some((ledger, _)), _) => Arc::new(settle_worker::LedgerTransport::for_tenant(
                ledger.clone(),
                TenantId::default_tenant(),
            )),
            (_, Some((client, _, _))) => Arc::new(client.clone()),
            _ => unreachable!(),
        }
    }

    /// Revokes a principal (its generation moves up by one).
    pub async fn revoke(&self, principal: &str) {
        let cmd = settle_core::Command::Revoke(settle_core::Revoke {
            principal: settle_core::Principal::new(principal).unwrap(),
        });
        let reply = self.transport().execute(cmd).await.unwrap();
        assert!(
            matches!(reply, settle_core::Reply::Revoked { .. }),
            "{reply:?}"
        );
    }

    /// A layer whose ledger is unreachable: the embedded store closed
    /// (every call fails as storage), or a server address nobody listens on.
    pub async fn unreachable(&self) -> IdempotencyLayer {
        if let Some((_, store)) = &self.embedded {
            let s = store.clone();
            tokio::task::spawn_blocking(move || s.close())
                .await
                .unwrap();
            return self.layer();
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dead = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
        IdempotencyLayer::remote(dead, principal::fixed(PRINCIPAL)).namespace("payments-example")
    }

    /// A Reconciler over this ledger (no hooks yet).
    pub fn reconciler(&self) -> settle_worker::Reconciler {
        match (&self.embedded, &self.remote) {
            (Some((ledger, _)), _) => {
                settle_worker::Reconciler::new(settle_worker::LedgerTransport::for_tenant(
                    ledger.clone(),
                    TenantId::default_tenant(),
                ))
            }
            (_, Some((client, _, _))) => settle_worker::Reconciler::new(client.clone()),
            _ => unreachable!(),
        }
    }

    /// The `worker` field of each kept attempt's lease, oldest first.
    pub async fn workers(&self, lkey: &str) -> Vec<Option<String>> {
        if let Some((ledger, _)) = &self.embedded {
            let r = ledger
                .get(&TenantId::default_tenant(), &Key::new(lkey).unwrap())
                .await
                .unwrap();
            return r
                .attempts
                .iter()
                .map(|a| a.lease.worker.as_ref().map(|w| w.as_str().to_string()))
                .collect();
        }
        let (client, _, _) = self.remote.as_ref().unwrap();
        let r = client.get(lkey).await.unwrap();
        r.attempts.into_iter().map(|a| a.lease.worker).collect()
    }

    /// The record of a ledger key: `status` and `reconcile_required`.
    pub async fn record(&self, lkey: &str) -> (String, bool) {
        if let Some((ledger, _)) = &self.embedded {
            let r = ledger
                .get(&TenantId::default_tenant(), &Key::new(lkey).unwrap())
                .await
                .unwrap();
            return (r.status.as_str().to_string(), r.reconcile_required);
        }
        let (client, _, _) = self.remote.as_ref().unwrap();
        let v = serde_json::to_value(client.get(lkey).await.unwrap()).unwrap();
        (
            v["status"].as_str().unwrap().to_string(),
            v["reconcile_required"].as_bool().unwrap(),
        )
    }
}

/// `settle serve` in this process on 127.0.0.1:0, until the sender fires.
async fn serve(dir: PathBuf) -> (Client, tokio::sync::oneshot::Sender<()>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let config = settle_server::Config::local(addr, dir.clone());
    // The binary picks the engine; here it is the embedded store.
    let store = settle_embedded::EmbeddedStore::open(
        &dir,
        settle_embedded::EmbeddedOptions {
            limits: config.limits(),
            ..Default::default()
        },
    )
    .unwrap();
    let closer = store.clone();
    let opened = settle_server::OpenedStore::new(store, move || closer.close());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(settle_server::run(config, opened, listener, async {
        let _ = rx.await;
    }));
    let url = format!("http://{addr}");
    (Client::new(&url).unwrap(), tx, url)
}

/// An answer as the client sees it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or("").to_string()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// Sends one request to the router.
pub async fn send(router: &Router, req: Request<Body>) -> Answer {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Answer {
        status,
        headers,
        body,
    }
}

/// `POST path` with an `Idempotency-Key` (if any) and a JSON body.
pub fn post(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::post(path).header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

/// The ledger key of `key` for the tests' principal.
pub fn lkey(key: &str) -> String {
    settle_middleware::layout::ledger_key("payments-example", PRINCIPAL, key)
}
