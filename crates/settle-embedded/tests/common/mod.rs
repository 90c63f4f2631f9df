//! Helpers shared by the tests that hold checkpoints at a gate or write
//! until segments are sealed (each test binary uses some of them).
#![allow(dead_code)]

use std::sync::Arc;

use settle_core::testkit::*;
use settle_core::{ClaimDecision, Receipt, Reply, TenantId};
use settle_embedded::{EmbeddedStore, Faults};
use settle_ledger::Store;

pub fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// Log segments on disk.
pub fn logs(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count()
}

/// Lets held checkpoints go when dropped (also when a test panics), so
/// the store's threads can finish.
pub struct Release(pub Arc<Faults>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release_checkpoints();
    }
}

/// Claims `key` and settles it completed; panics on any other answer.
pub async fn claim_and_settle(store: &EmbeddedStore, key: &str) -> Receipt {
    let fence = match store
        .execute(&tenant(), claim(key, 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{key}: {other:?}"),
    };
    match store
        .execute(
            &tenant(),
            settle(key, fence, 1, binding("alice", 0), completed(1)),
        )
        .await
        .unwrap()
    {
        Reply::Receipt(r) => r,
        other => panic!("{key}: {other:?}"),
    }
}
