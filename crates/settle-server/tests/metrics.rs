//! The counters and gauges `/metrics` shows, on the router in process over
//! the embedded store. The recorder is process-wide: this file's one test
//! is alone in its test binary, so the counts it checks are its own.

mod common;

use common::*;
use serde_json::json;
use settle_server::config::Settings;

#[tokio::test]
async fn metrics_count_requests_decisions_and_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Settings::default());
    let ep = s.ep();
    let b = binding("svc", 0);
    let fence = execute(&ep, "m1", 1, &b).await;
    op(
        &ep,
        "m1",
        "settle",
        settle_body(fence + 99, 1, &b, completed(1)),
    )
    .await; // stale_fence, quarantined
    op(&ep, "m1", "settle", settle_body(fence, 1, &b, completed(1))).await;
    op(&ep, "m1", "settle", settle_body(fence, 1, &b, completed(2))).await; // result_mismatch
    let fence = execute(&ep, "m2", 1, &b).await;
    op(
        &ep,
        "m2",
        "settle",
        settle_body(fence, 1, &b, json!({"status": "unknown"})),
    )
    .await;
    get(&ep, "/nowhere").await;

    let r = get(&ep, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/plain"));
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(text.contains("settle_http_requests_total{"));
    assert!(text.contains(r#"route="claim""#) && text.contains(r#"status="200""#));
    assert!(text.contains(r#"route="unmatched""#) && text.contains(r#"status="404""#));
    assert!(text.contains(r#"decision="execute""#));
    assert!(text.contains(r#"decision="stale_fence""#));
    assert_eq!(value("settle_quarantined_total{call=\"settle\"}"), 2.0);
    assert_eq!(value("settle_disputed_total"), 1.0);
    assert_eq!(value("settle_records_unknown"), 1.0);
    assert_eq!(value("settle_records_reconcile_required"), 1.0);
    assert!(text.contains("settle_records_stuck"));
    assert!(
        text.contains("settle_commit_batch_size_bucket"),
        "commit histogram from the store"
    );
    assert!(text.contains("settle_commit_duration_seconds_bucket"));
    // No tenant or key labels.
    assert!(!text.contains("tenant=") && !text.contains("key="));
    assert!(!text.contains("m1") && !text.contains("m2"));
}
