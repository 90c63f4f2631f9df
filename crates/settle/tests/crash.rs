//! SPEC §6.5 over HTTP: kill -9 during concurrent load, restart, every
//! acknowledged receipt is there. The load and the check are the crash
//! harness's (`settle_ledger::crash`), through `settle-client`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::remote::Remote;
use common::*;
use settle_core::TenantId;
use settle_ledger::crash::{Acked, Load, Workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_no_acknowledged_receipt() {
    let dir = TempDir::new("kill9");
    let mut s = Server::start(dir.path(), &[]);
    // 16 workers; each stops at its first failed call (the server is gone).
    let workload = Workload::new(TenantId::default_tenant(), "svc", "crash", 16);
    let acked = Arc::new(Acked::new());
    // A client of its own: one keep-alive connection per worker.
    let load = Load::start_each(&workload, acked.clone(), |_| Arc::new(Remote(s.ep())));
    // Kill while the workers are still writing.
    acked
        .reached(300, Duration::from_secs(90), "before the kill")
        .await;
    s.kill9();
    assert!(load.ended().await.is_some(), "the workers stop at the kill");
    assert!(acked.receipts() >= 300);

    let s = Server::start(dir.path(), &[]);
    let ep = Remote(s.ep());
    let what = "after kill -9";
    acked.verify(&ep, &workload.tenant, what).await;
    acked.fences_go_on(&ep, &workload, "after", what).await;
}
