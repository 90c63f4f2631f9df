//! `Batching`: a pool's concurrent calls go as §10 batches, each call gets
//! its own single-call answer, and a batch without an answer fails every
//! call in it the same way. (Every `run_once` scenario also runs through
//! it: the `over_http_batched` tests of run_once.rs.)

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use settle_core::testkit::{binding, claim};
use settle_core::{ClaimDecision, Command, Principal, Reply, Revoke};
use settle_ledger::{Ledger, MemStore};
use settle_worker::{
    BatchAnswers, BatchOptions, BatchTransport, Batching, BoxFuture, Done, EffectContext,
    LedgerTransport, RunOptions, Transport, TransportError, run_once,
};
use tokio::sync::Semaphore;

/// A ledger in process that takes batches, holding each batch until the
/// test lets it through, and records the size of each batch.
struct Gated {
    ledger: LedgerTransport,
    gate: Semaphore,
    sizes: std::sync::Mutex<Vec<usize>>,
    fail: bool,
}

impl Gated {
    fn new(fail: bool) -> Gated {
        Gated {
            ledger: LedgerTransport::new(Ledger::new(Arc::new(MemStore::default()))),
            gate: Semaphore::new(0),
            sizes: std::sync::Mutex::new(Vec::new()),
            fail,
        }
    }
}

impl Transport for Gated {
    fn execute(&self, cmd: Command) -> BoxFuture<'_, Result<Reply, TransportError>> {
        self.ledger.execute(cmd)
    }
}

impl BatchTransport for Gated {
    fn execute_batch(
        &self,
        cmds: Vec<Command>,
    ) -> BoxFuture<'_, Result<BatchAnswers, TransportError>> {
        Box::pin(async move {
            self.sizes.lock().unwrap().push(cmds.len());
            self.gate.acquire().await.unwrap().forget();
            if self.fail {
                return Err(TransportError::NoAnswer {
                    detail: "lost".into(),
                });
            }
            let mut out = Vec::new();
            for c in cmds {
                out.push(self.ledger.execute(c).await);
            }
            Ok(out)
        })
    }
}

/// Waits (without sleeping) until `n` calls are queued behind the batch on the wire.
async fn until_queued<T: BatchTransport + 'static>(b: &Batching<T>, n: u64) {
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while b.queued() < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the calls were queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_while_a_batch_is_on_the_wire_go_together_in_the_next() {
    let b = Batching::new(
        Gated::new(false),
        BatchOptions {
            max_calls: 100,
            max_in_flight: 1,
        },
    );
    let first = {
        let b = b.clone();
        tokio::spawn(async move { b.execute(claim("k0", 1, binding("alice", 0))).await })
    };
    // The first call goes alone, at once: nothing waits for company.
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while b.inner().sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let rest: Vec<_> = (1..=20)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move {
                b.execute(claim(&format!("k{i}"), 1, binding("alice", 0)))
                    .await
            })
        })
        .collect();
    until_queued(&b, 20).await;
    b.inner().gate.add_permits(2);
    let mut fences = BTreeSet::new();
    for t in std::iter::once(first).chain(rest) {
        match t.await.unwrap() {
            Ok(Reply::Claim(ClaimDecision::Execute(g))) => assert!(fences.insert(g.fence)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(*b.inner().sizes.lock().unwrap(), vec![1, 20]);
    assert_eq!((b.batches_sent(), b.calls_sent(), b.queued()), (2, 21, 0));
    assert_eq!(fences.len(), 21, "each call got its own answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_hold_at_most_max_calls() {
    let b = Batching::new(
        Gated::new(false),
        BatchOptions {
            max_calls: 7,
            max_in_flight: 1,
        },
    );
    let first = {
        let b = b.clone();
        tokio::spawn(async move { b.execute(claim("k", 1, binding("alice", 0))).await })
    };
    let rest: Vec<_> = (0..16)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move {
                b.execute(claim(&format!("m{i}"), 1, binding("alice", 0)))
                    .await
            })
        })
        .collect();
    until_queued(&b, 16).await;
    b.inner().gate.add_permits(10);
    for t in std::iter::once(first).chain(rest) {
        assert!(matches!(t.await.unwrap(), Ok(Reply::Claim(_))));
    }
    let sizes = b.inner().sizes.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 17);
    assert!(sizes.iter().all(|&n| n <= 7), "{sizes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_without_an_answer_fails_every_call_in_it_alike() {
    let b = Batching::new(Gated::new(true), BatchOptions::default());
    b.inner().gate.add_permits(1);
    let r = b.execute(claim("k", 1, binding("alice", 0))).await;
    assert!(matches!(r, Err(TransportError::NoAnswer { .. })), "{r:?}");
    // Revoke cannot be batched: it goes alone, through the inner transport.
    let r = b
        .execute(Command::Revoke(Revoke {
            principal: Principal::new("alice").unwrap(),
        }))
        .await;
    assert!(matches!(r, Ok(Reply::Revoked { .. })), "{r:?}");
    assert_eq!(b.batches_sent(), 1);
}

/// A pool of workers over a real server: 60 runs on 30 keys, every key's
/// effect once, in fewer requests than calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_workers_over_http_executes_each_key_once_in_batches() {
    let l = common::TestLedger::over_http().await;
    let b = Batching::new(
        l.client.clone().unwrap(),
        BatchOptions {
            max_calls: 100,
            max_in_flight: 1,
        },
    );
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..30).map(|_| AtomicUsize::new(0)).collect());
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let (b, runs) = (b.clone(), runs.clone());
            tokio::spawn(async move {
                let k = i % 30;
                run_once(
                    &b,
                    &format!("pool-{k}"),
                    &json!({"amount": k}),
                    async move |ctx: &EffectContext<'_>| {
                        runs[k].fetch_add(1, Ordering::SeqCst);
                        Ok(Done::completed(json!({"fence": ctx.fence().0})))
                    },
                    &RunOptions::new("svc-pool"),
                )
                .await
            })
        })
        .collect();
    let mut outcomes = std::collections::BTreeMap::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap().unwrap();
        // Both runs of a key answer the one outcome.
        let prev = outcomes.insert(i % 30, r.outcome.clone());
        assert!(prev.is_none_or(|p| p == r.outcome), "key {}", i % 30);
    }
    for (k, n) in runs.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), 1, "key {k} executed once");
    }
    assert!(
        b.batches_sent() < b.calls_sent(),
        "{} batches for {} calls",
        b.batches_sent(),
        b.calls_sent()
    );
    drop(b);
    l.stop().await;
}

/// `Client::execute_batch` keeps a result's spelling exactly as the single
/// settle call does (numbers beyond a double included): the batch body is
/// spliced from the single call's body, not rebuilt through a JSON value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_settle_stores_the_result_as_sent() {
    use settle_core::testkit::settle;
    use settle_core::{Digest, Outcome, ResultJson};
    let l = common::TestLedger::over_http().await;
    let client = l.client.clone().unwrap();
    let text = r#"{"amount":1.10000000000000000000001,"big":123456789012345678901234567890}"#;
    let outcome = Outcome::completed(ResultJson::from_text(text, 4096).unwrap(), Digest([7; 32]));
    let mut results = Vec::new();
    for (k, batched) in [("exact-single", false), ("exact-batched", true)] {
        let cmd = claim(k, 1, binding("alice", 0));
        let fence = match client.execute(&cmd).await.unwrap() {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("{other:?}"),
        };
        let cmd = settle(k, fence, 1, binding("alice", 0), outcome.clone());
        let reply = if batched {
            let mut r = client.execute_batch(&[cmd]).await.unwrap();
            assert_eq!(r.len(), 1);
            r.remove(0).unwrap()
        } else {
            client.execute(&cmd).await.unwrap()
        };
        assert!(matches!(reply, Reply::Receipt(_)), "{reply:?}");
        let got = client.send(&settle_client::calls::get(k)).await.unwrap();
        let v: serde_json::Value = got.json();
        assert!(
            String::from_utf8_lossy(&got.body).contains(text),
            "{k}: {}",
            String::from_utf8_lossy(&got.body)
        );
        results.push(v["outcome"]["result"].clone());
    }
    assert_eq!(results[0], results[1]);
    l.stop().await;
}
