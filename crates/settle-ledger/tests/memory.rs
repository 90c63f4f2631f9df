//! The in-memory store passes the backend conformance suite.

use std::sync::Arc;

use settle_core::Limits;
use settle_ledger::conformance::Fixture;
use settle_ledger::{Clock, MemStore};

async fn fixture() -> Fixture {
    let clock = Clock::system();
    Fixture::new(
        Arc::new(MemStore::new(Limits::default(), clock.clone())),
        clock,
    )
}

settle_ledger::conformance_tests!(fixture());

/// `key_prefix` starts the scan at the prefix. Behind
/// more records than one page looks at (`SCAN_BUDGET`), the first page of
/// `key_prefix=mw-` is the prefix's records, not an empty page with a
/// cursor (`settle list --key-prefix mw-` printed 32 empty pages first).
#[tokio::test]
async fn a_key_prefix_starts_the_scan_at_the_prefix() {
    use settle_core::TenantId;
    use settle_core::testkit::*;
    use settle_ledger::Store as _;
    use settle_ledger::inspect::{ListFilter, ListQuery, SCAN_BUDGET, list};
    let store = MemStore::default();
    let t = TenantId::new("acme").unwrap();
    for i in 0..SCAN_BUDGET + 10 {
        store
            .execute(&t, claim(&format!("a-{i:06}"), 1, binding("p", 0)))
            .await
            .unwrap();
    }
    for i in 0..3 {
        store
            .execute(&t, claim(&format!("mw-{i}"), 1, binding("p", 0)))
            .await
            .unwrap();
    }
    store
        .execute(&t, claim("z", 1, binding("p", 0)))
        .await
        .unwrap();
    let q = ListQuery {
        filter: ListFilter {
            key_prefix: Some("mw-".into()),
            ..ListFilter::default()
        },
        order: Default::default(),
        after: None,
        limit: 10,
        stuck_after_ms: 1000,
    };
    let page = list(&store, &t, &q).await.unwrap();
    let keys: Vec<&str> = page.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["mw-0", "mw-1", "mw-2"]);
    assert_eq!(page.next, None, "the listing ends past the prefix");
}
