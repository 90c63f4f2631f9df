//! The two ledgers every run_once scenario runs against: the in-process
//! `Ledger` over a `MemStore`, and a real settle server (the embedded
//! store in a temporary directory) started in this process on an
//! ephemeral port and reached with `settle_client::Client`. Plus `Tap`, a
//! transport in between that counts calls and loses answers on request.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use settle_core::{Command, Principal, Reply, Revoke};
use settle_ledger::{Ledger, MemStore};
use settle_server::{Config, OpenedStore, run};
use settle_worker::{BoxFuture, LedgerTransport, Transport, TransportError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestLedger {
    pub transport: Arc<dyn Transport>,
    /// The client of an HTTP ledger.
    pub client: Option<settle_client::Client>,
    /// The in-process ledger's transport.
    pub local: Option<LedgerTransport>,
    server: Option<(oneshot::Sender<()>, JoinHandle<()>, tempfile::TempDir)>,
}

impl TestLedger {
    pub fn in_process() -> TestLedger {
        let ledger = Ledger::new(Arc::new(MemStore::default()));
        let local = LedgerTransport::new(ledger);
        TestLedger {
            transport: Arc::new(local.clone()),
            client: None,
            local: Some(local),
            server: None,
        }
    }

    /// `settle serve` reached through a `Batching` transport over the
    /// client: every call goes in a §10 batch.
    pub async fn over_http_batched() -> TestLedger {
        let mut l = TestLedger::over_http().await;
        let client = l.client.clone().expect("an HTTP ledger");
        l.transport = Arc::new(settle_worker::Batching::new(
            client,
            settle_worker::BatchOptions {
                max_calls: 50,
                max_in_flight: 2,
            },
        ));
        l
    }

    /// `settle serve` (auth off, the embedded store) in this process.
    pub async fn over_http() -> TestLedger {
        let dir = tempfile::tempdir().expect("a temp dir");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an ephemeral port");
        let addr = listener.local_addr().unwrap();
        let config = Config::local(addr, dir.path().to_path_buf());
        // The binary picks the engine; here it is the embedded store.
        let store = settle_embedded::EmbeddedStore::open(
            dir.path(),
            settle_embedded::EmbeddedOptions {
                limits: config.limits(),
                ..Default::default()
            },
        )
        .expect("open the embedded store");
        let closer = store.clone();
        let opened = OpenedStore::new(store, move || closer.close());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, opened, listener, async {
            let _ = stopped.await;
        }));
        let client = settle_client::Client::new(&format!("http://{addr}")).unwrap();
        TestLedger {
            transport: Arc::new(client.clone()),
            client: Some(client),
            local: None,
            server: Some((stop, handle, dir)),
        }
    }

    pub async fn stop(self) {
        if let Some((stop, handle, _dir)) = self.server {
            let _ = stop.send(());
            handle.await.expect("the server shut down");
        }
    }

    /// A reconciler over this ledger (SPEC §11.10), without hooks.
    pub fn reconciler(&self) -> settle_worker::Reconciler {
        match (&self.local, &self.client) {
            (Some(l), _) => settle_worker::Reconciler::new(l.clone()),
            (_, Some(c)) => settle_worker::Reconciler::new(c.clone()),
            _ => unreachable!("a ledger is in process or over HTTP"),
        }
    }

    /// Revokes the principal's leases (SPEC §4 revoke): the generation moves.
    pub async fn revoke(&self, principal: &str) {
        let cmd = Command::Revoke(Revoke {
            principal: Principal::new(principal).unwrap(),
        });
        match self.transport.execute(cmd).await {
            Ok(Reply::Revoked { .. }) => {}
            other => panic!("revoke answered {other:?}"),
        }
    }
}

/// Runs one scenario against both ledgers, as three tests (HTTP single
/// calls and HTTP batches).
#[macro_export]
macro_rules! both_ledgers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_process() {
                let l = $crate::common::TestLedger::in_process();
                super::$name(&l).await;
                l.stop().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http() {
                let l = $crate::common::TestLedger::over_http().await;
                super::$name(&l).await;
                l.stop().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http_batched() {
                let l = $crate::common::TestLedger::over_http_batched().await;
                super::$name(&l).await;
                l.stop().await;
            }
        }
    )*};
}

/// A transport between the worker and the ledger: counts calls, can drop
/// heartbeats (as a partition would) and lose the answers of settles that
/// the ledger did apply (a lost acknowledgement).
pub struct Tap {
    inner: Arc<dyn Transport>,
    pub drop_heartbeats: AtomicBool,
    /// How many more settle answers to lose after the ledger applied them.
    pub lose_settle_answers: AtomicUsize,
    /// Answer every call with "no answer", without forwarding it.
    pub black_hole: AtomicBool,
    pub claims: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub settles: AtomicUsize,
    pub heartbeats: AtomicUsize,
    pub releases: Mutex<Vec<String>>,
    pub lost_answers: Mutex<Vec<Reply>>,
    pub in_flight_seen: tokio::sync::Notify,
}

impl Tap {
    pub fn new(inner: Arc<dyn Transport>) -> Arc<Tap> {
        Arc::new(Tap {
            inner,
            drop_heartbeats: AtomicBool::new(false),
            lose_settle_answers: AtomicUsize::new(0),
            black_hole: AtomicBool::new(false),
            claims: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            settles: AtomicUsize::new(0),
            heartbeats: AtomicUsize::new(0),
            releases: Mutex::new(Vec::new()),
            lost_answers: Mutex::new(Vec::new()),
            in_flight_seen: tokio::sync::Notify::new(),
        })
    }

    fn no_answer(what: &str) -> TransportError {
        TransportError::NoAnswer {
            detail: format!("the tap lost the {what}"),
        }
    }

    async fn forward(&self, cmd: Command) -> Result<Reply, TransportError> {
        match &cmd {
            Command::Claim(_) => {
                self.claims.fetch_add(1, Ordering::SeqCst);
            }
            Command::Heartbeat(_) => {
                self.heartbeats.fetch_add(1, Ordering::SeqCst);
                if self.drop_heartbeats.load(Ordering::SeqCst) {
                    return Err(Tap::no_answer("heartbeat"));
                }
            }
            Command::Settle(_) => {
                self.settles.fetch_add(1, Ordering::SeqCst);
            }
            Command::Release(r) => {
                self.releases
                    .lock()
                    .unwrap()
                    .push(r.reason.as_str().to_owned());
            }
            _ => {}
        }
        if self.black_hole.load(Ordering::SeqCst) {
            return Err(Tap::no_answer("request"));
        }
        let is_settle = matches!(cmd, Command::Settle(_));
        let reply = self.inner.execute(cmd).await?;
        if matches!(
            reply,
            Reply::Claim(settle_core::ClaimDecision::InFlight { .. })
        ) {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            self.in_flight_seen.notify_waiters();
        }
        if is_settle
            && self
                .lose_settle_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            self.lost_answers.lock().unwrap().push(reply);
            return Err(Tap::no_answer("settle answer"));
        }
        Ok(reply)
    }
}

impl Transport for Tap {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        Box::pin(self.forward(cmd))
    }
}
