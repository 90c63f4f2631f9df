//! SPEC §6.5 over HTTP: kill -9 during concurrent load, restart, every
//! acknowledged receipt is there.

mod common;

use std::sync::Arc;

use ack::Acked;
use common::*;
use hyper::Method;
use serde_json::Value;
use settle_client::operation_path;

mod ack {
    use std::sync::Mutex;

    use serde_json::Value;

    /// Receipts the server acknowledged, with a notification at a threshold.
    pub struct Acked {
        pub list: Mutex<Vec<(String, Value)>>,
        pub reached: tokio::sync::Notify,
        pub threshold: usize,
    }

    impl Acked {
        pub fn push(&self, key: String, receipt: Value) {
            let mut l = self.list.lock().unwrap();
            l.push((key, receipt));
            if l.len() == self.threshold {
                self.reached.notify_one();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_acknowledged_receipt() {
    let dir = TempDir::new("kill9");
    let mut s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    let acked = Arc::new(Acked {
        list: Default::default(),
        reached: tokio::sync::Notify::new(),
        threshold: 300,
    });
    let mut workers = Vec::new();
    for w in 0..16 {
        // A client of its own: one keep-alive connection per worker.
        let conn = s.ep();
        let acked = acked.clone();
        let b = b.clone();
        workers.push(tokio::spawn(async move {
            for n in 0.. {
                let key = format!("crash-{w}-{n}");
                let body = serde_json::to_vec(&claim_body(1, &b)).unwrap();
                let Ok(r) = conn
                    .send_raw(
                        Method::POST,
                        &operation_path(&key, "claim"),
                        Some(body.into()),
                    )
                    .await
                else {
                    return;
                };
                let Some(fence) = r.json()["fence"].as_u64() else {
                    return;
                };
                let body = serde_json::to_vec(&settle_body(fence, 1, &b, completed(1))).unwrap();
                let Ok(r) = conn
                    .send_raw(
                        Method::POST,
                        &operation_path(&key, "settle"),
                        Some(body.into()),
                    )
                    .await
                else {
                    return;
                };
                if r.status != 200 {
                    return;
                }
                acked.push(key, r.json()["receipt"].clone());
            }
        }));
    }
    // Kill while the workers are still writing.
    acked.reached.notified().await;
    s.kill9();
    for w in workers {
        w.await.unwrap();
    }
    let acked: Vec<(String, Value)> = acked.list.lock().unwrap().clone();
    assert!(acked.len() >= 300);

    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    for (key, receipt) in &acked {
        let r = get(&ep, &operation_path(key, "")).await;
        assert_eq!(r.status, 200, "acknowledged {key} lost after kill -9");
        let rec = r.json();
        assert_eq!(rec["status"], "completed", "{key}");
        assert_eq!(&rec["receipt"], receipt, "{key}");
    }
}
