//! An invalid command is answered `Invalid` before the store touches the
//! database, on both paths: it takes no fence from the sequence (no gap in
//! the fences) and needs no round trip (it is answered with the pools closed).

mod common;

use common::{acme, exec_fence};
use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::Store;

fn invalid_field(r: &Reply) -> &str {
    match r {
        Reply::Invalid(e) => &e.field,
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_command_costs_no_fence_and_no_round_trip() {
    invalid_commands(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_command_costs_no_fence_without_group_commit() {
    invalid_commands(false).await;
}

async fn invalid_commands(group: bool) {
    let (store, _clock, _g) = common::store_with(&common::url(), "invalid", |o| {
        o.group_commit = group;
        o.limits.max_result_bytes = 64;
    })
    .await;
    let first = exec_fence(&store, "a").await;
    // lease_ms must exceed the lease margin (100 ms by default).
    let too_short = claim_with("b", 1, binding("alice", 0), 100, false);
    for _ in 0..3 {
        let r = store.execute(&acme(), too_short.clone()).await.unwrap();
        assert_eq!(invalid_field(&r), "lease_ms");
    }
    assert_eq!(
        exec_fence(&store, "c").await,
        Fence(first.0 + 1),
        "the invalid claims took fences from the sequence"
    );
    assert_eq!(
        store.get(&acme(), &key("b")).await.unwrap(),
        Ok(None),
        "an invalid claim wrote nothing"
    );

    // With the pools closed every round trip fails: invalid commands are
    // still answered, so they never needed one.
    store.close();
    let r = store.execute(&acme(), too_short).await.unwrap();
    assert_eq!(invalid_field(&r), "lease_ms");
    let big = ResultJson::from_text(&format!("\"{}\"", "x".repeat(100)), 1024).unwrap();
    let oversized = settle(
        "a",
        first,
        1,
        binding("alice", 0),
        Outcome::completed(big, Digest([7; 32])),
    );
    let r = store.execute(&acme(), oversized).await.unwrap();
    assert_eq!(invalid_field(&r), "outcome.result");
    assert!(
        store.execute(&acme(), settle_ok("a", first)).await.is_err(),
        "a valid command needs the database"
    );
}

fn settle_ok(k: &str, f: Fence) -> Command {
    settle(k, f, 1, binding("alice", 0), completed(1))
}
