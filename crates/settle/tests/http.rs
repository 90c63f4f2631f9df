//! SPEC §7 against a real `settle serve` process: what needs the process
//! or a TCP connection (start-up, the CLI's view, the HTTP parser and slow
//! clients, shutdown, what survives a restart or a SIGKILL). The HTTP
//! behaviour of the router (answers, bad input, auth, batches, metrics) is
//! tested in process, in `crates/settle-server/tests/`.

mod common;

use common::*;
use hyper::Method;
use serde_json::{Value, json};
use settle_client::operation_path;

#[tokio::test]
async fn auth_off_needs_loopback() {
    let dir = TempDir::new("open");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.path())
        .env_remove("SETTLE_TENANTS")
        .env_remove("SETTLE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "it must not listen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tenants"), "{err}");

    // On loopback without tenants everything is tenant `default`, no token needed,
    // and a token is ignored rather than refused.
    let s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    execute(&s.ep(), "k", 1, &b).await;
    let r = get(&s.ep_token("anything"), "/v1/operations/k").await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn sigterm_stops_gracefully_and_the_data_survives() {
    let dir = TempDir::new("term");
    let mut s = Server::start(dir.path(), &[]);
    let b = binding("svc", 0);
    let fence = execute(&s.ep(), "k", 1, &b).await;
    let receipt = op(
        &s.ep(),
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(1)),
    )
    .await
    .json();
    // One record of each kind `inspect` lists.
    op(
        &s.ep(),
        "k",
        "settle",
        settle_body(fence, 1, &b, completed(2)),
    )
    .await; // disputed, quarantined
    let f2 = execute(&s.ep(), "u", 1, &b).await;
    op(
        &s.ep(),
        "u",
        "settle",
        settle_body(f2, 1, &b, json!({"status": "unknown"})),
    )
    .await;
    execute(&s.ep(), "r", 1, &b).await;
    // An idle keep-alive connection must not hold shutdown up.
    let idle = s.ep();
    assert_eq!(
        idle.send_raw(Method::GET, "/healthz", None)
            .await
            .unwrap()
            .status,
        200
    );
    let status = s.terminate();
    assert!(status.success(), "{status:?}");

    let out = std::process::Command::new(BIN)
        .args(["inspect", "--json", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], 3, "{v}");
    assert_eq!(v["by_status"]["completed"], 1);
    assert_eq!(v["by_status"]["unknown"], 1);
    assert_eq!(v["by_status"]["running"], 1);
    assert_eq!(v["unknown"], json!(["default/u"]));
    assert_eq!(v["reconcile_required"], json!(["default/u"]));
    assert_eq!(v["disputed"], json!(["default/k"]));
    assert_eq!(v["quarantined"], json!(["default/k (1)"]));
    assert_eq!(v["refused"], json!([]));
    assert_eq!(v["violations"], json!([]));
    // `check` passes on this store.
    let out = std::process::Command::new(BIN)
        .args(["check", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // With no grace, the unknown record without a lease counts as stuck.
    let out = std::process::Command::new(BIN)
        .args(["inspect", "--json", "--stuck-after-s", "0", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stuck"], json!(["default/u"]));

    let s = Server::start(dir.path(), &[]);
    let r = op(&s.ep(), "k", "claim", claim_body(1, &b)).await.json();
    assert_eq!(r["decision"], "replay");
    assert_eq!(r["receipt"], receipt["receipt"]);
}

#[tokio::test]
async fn a_record_from_the_future_is_refused_with_503() {
    let dir = TempDir::new("future");
    let b = binding("svc", 0);
    {
        // Write a receipt with the store's clock one hour ahead, then stop.
        let mut s = Server::start(dir.path(), &["--clock-skew-ms", "3600000"]);
        let fence = execute(&s.ep(), "k", 1, &b).await;
        let r = op(
            &s.ep(),
            "k",
            "settle",
            settle_body(fence, 1, &b, completed(1)),
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(s.terminate().success());
    }
    let mut s = Server::start(dir.path(), &[]);
    assert_problem(
        &op(&s.ep(), "k", "claim", claim_body(1, &b)).await,
        503,
        "record_refused",
    );
    assert_problem(
        &get(&s.ep(), "/v1/operations/k").await,
        503,
        "record_refused",
    );
    assert!(s.terminate().success());
    // `check` reports it and fails (SPEC §6.9).
    let out = std::process::Command::new(BIN)
        .args(["check", "--json", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["refused"], json!(["default/k"]));
}

#[tokio::test]
async fn cli_prints_summaries_and_documented_exit_codes() {
    let dir = TempDir::new("cli");
    let s = Server::start(dir.path(), &[]);
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(1);
    let claim = [
        "claim",
        "cli-1",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ];
    let out = run(&claim);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("execute  fence="), "{text}");
    let out = run(&[&claim[..], &["--json"]].concat());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["decision"], "in_flight");
    let out = run(&["get", "missing"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));
    let other = fp(2);
    let out = run(&[
        "claim",
        "cli-1",
        "--fingerprint",
        &other,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ]);
    assert_eq!(out.status.code(), Some(5));
    let out = run(&["warn", "t", "c", "--detail", "d"]);
    assert_eq!(out.status.code(), Some(0));
    let out = run(&["get", "x", "--url", "http://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(3));
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("slow");
    let s = Server::start(dir.path(), &["--request-timeout-ms", "200"]);
    // A body that never finishes: 408 request_timeout.
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    c.write_all(
        b"POST /v1/operations/k/claim HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"fi",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = c.read(&mut chunk).await.unwrap_or(0);
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || String::from_utf8_lossy(&buf).contains("request_timeout") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server never gave up on the slow body");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"));
    // Headers that never finish: the connection is closed.
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    c.write_all(b"POST /v1/operations/k/claim HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed =
        tokio::time::timeout(std::time::Duration::from_secs(30), c.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the server never closed a connection with a slow head"
    );
    // Nothing was written and the server is fine.
    assert_problem(&get(&s.ep(), "/v1/operations/k").await, 404, "not_found");
}

/// Receipts the server answered to settle calls, by its metrics.
async fn settle_receipts(s: &Server) -> f64 {
    let m = String::from_utf8(get(&s.ep(), "/metrics").await.body.to_vec()).unwrap();
    m.lines()
        .find(|l| {
            l.starts_with("settle_decisions_total")
                && l.contains("call=\"settle\"")
                && l.contains("decision=\"receipt\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// `settle bench --url U --batch N`: pairs through `POST /v1/batch`, each
/// counted pair settled on the server.
#[tokio::test]
async fn bench_runs_in_batches_over_http() {
    let dir = TempDir::new("bench-batch");
    let s = Server::start(dir.path(), &[]);
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--url",
            &s.url(),
            "--batch",
            "8",
            "--connections",
            "2",
            "--duration",
            "0.3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["batch"].as_u64()),
        (Some("http_batch"), Some(8))
    );
    assert_eq!(v["errors"], 0);
    let pairs = v["pairs"].as_u64().unwrap();
    assert!(
        pairs > 0 && pairs.is_multiple_of(8),
        "whole batches of pairs: {v}"
    );
    let receipts = settle_receipts(&s).await;
    assert!(receipts >= pairs as f64);
}

#[tokio::test]
async fn bench_runs_over_http_and_in_process() {
    let dir = TempDir::new("bench");
    let s = Server::start(dir.path(), &[]);
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--url",
            &s.url(),
            "--connections",
            "4",
            "--duration",
            "0.3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "http");
    assert_eq!(v["errors"], 0);
    assert!(v["pairs"].as_u64().unwrap() > 0);
    for f in ["pairs_per_s", "p50_ms", "p99_ms", "p999_ms"] {
        assert!(v[f].as_f64().unwrap() > 0.0, "{f}: {v}");
    }
    assert!(v.get("cpu_us_per_pair").is_none(), "{v}");
    // Every counted pair was settled on the server.
    let receipts = settle_receipts(&s).await;
    assert!(receipts >= v["pairs"].as_f64().unwrap());

    let data = TempDir::new("bench-data");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--concurrency",
            "4",
            "--duration",
            "0.3",
            "--json",
            "--data",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "in_process");
    assert!(v["pairs"].as_u64().unwrap() > 0);
    // In process, the CPU the process spent per pair (Linux: /proc);
    // over HTTP the client's CPU says nothing of the server's: absent.
    if cfg!(target_os = "linux") {
        // (In clock ticks: a run this short may have taken none.)
        assert!(v["cpu_us_per_pair"].as_f64().unwrap() >= 0.0, "{v}");
    }
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_request_finish() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("inflight");
    let mut s = Server::start(dir.path(), &[]);
    let body = serde_json::to_vec(&claim_body(1, &binding("svc", 0))).unwrap();
    let (first, rest) = body.split_at(10);
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    let head = format!(
        "POST /v1/operations/late/claim HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(first).await.unwrap();
    // Make sure the server is reading this request before shutdown starts.
    c.flush().await.unwrap();
    let (st, _) = raw_status(
        &s.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(st, 200);

    let pid = s.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Shutdown has begun once the listener stops accepting.
    let mut refused = false;
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(&s.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(refused, "the server kept accepting after SIGTERM");
    // The in-flight request still completes.
    c.write_all(rest).await.unwrap();
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"decision\":\"execute\""), "{text}");
    assert!(s.child.wait().unwrap().success());

    // And it was committed before the store closed.
    let s = Server::start(dir.path(), &[]);
    let r = get(&s.ep(), "/v1/operations/late").await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn bench_lists_of_concurrency_and_the_fill_mode_report_each_run() {
    let data = TempDir::new("bench-list");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--concurrency",
            "1,4",
            "--duration",
            "0.2",
            "--json",
            "--data",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["concurrency"], 1);
    assert_eq!(runs[1]["concurrency"], 4);

    let fill = TempDir::new("bench-fill");
    let out = std::process::Command::new(BIN)
        .args([
            "bench",
            "--records",
            "500",
            "--concurrency",
            "16",
            "--json",
            "--data",
        ])
        .arg(fill.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_fill = lines.iter().rev().find(|v| v["mode"] == "fill").unwrap();
    assert_eq!(last_fill["records"], 500);
    assert!(last_fill["rss_mib"].as_f64().unwrap() > 0.0);
    let reopen = lines.iter().find(|v| v["mode"] == "reopen").unwrap();
    assert_eq!(reopen["found"], true);
    // The records really are in the store.
    let mut settled = 0;
    settle_embedded::scan(fill.path(), |_, r| {
        if r.status == settle_core::Status::Completed {
            settled += 1;
        }
    })
    .unwrap();
    assert_eq!(settled, 500);
}

// ---------------------------------------------------------------- the CLI over the wire, bad requests

/// Through the CLI: `settle release KEY --fence F --reason
/// not_committed` (over HTTP: crates/settle-server/tests/http_calls.rs).
#[tokio::test]
async fn release_not_committed_through_the_cli() {
    let dir = TempDir::new("notcommitted");
    let s = Server::start(dir.path(), &[]);
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(1);
    let out = run(&[
        "claim",
        "cli-nc",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--json",
    ]);
    let fence = serde_json::from_slice::<Value>(&out.stdout).unwrap()["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = run(&[
        "release",
        "cli-nc",
        "--fence",
        &fence,
        "--reason",
        "not_committed",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("released  fence={fence}")
    );
    let out = run(&[
        "release", "cli-nc", "--fence", &fence, "--reason", "whatever",
    ]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

/// Through the CLI: it sends `--result` as written and
/// prints the replay as received, byte for byte (over HTTP:
/// crates/settle-server/tests/http_calls.rs).
#[tokio::test]
async fn the_cli_sends_results_as_written_and_prints_replays_as_received() {
    let dir = TempDir::new("rawresult");
    let s = Server::start(dir.path(), &[]);
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SETTLE_URL", s.url())
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap()
    };
    let f = fp(2);
    let claim = [
        "claim",
        "cli-raw",
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
    ];
    let out = run(&[&claim[..], &["--json"]].concat());
    let fence = serde_json::from_slice::<Value>(&out.stdout).unwrap()["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let digest = fp(9);
    let out = run(&[
        "settle",
        "cli-raw",
        "--fence",
        &fence,
        "--fingerprint",
        &f,
        "--principal",
        "svc",
        "--scope",
        "pay",
        "--status",
        "completed",
        "--result",
        "{\"x\": 0.30000000000000004441}",
        "--response-sha256",
        &digest,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&claim);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("result: {\"x\":0.30000000000000004441}"),
        "{text}"
    );
    let out = run(&[&claim[..], &["--json"]].concat());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("\"result\":{\"x\":0.30000000000000004441}"),
        "{text}"
    );
}

/// Bad input only the HTTP parser sees, and a body without a declared
/// length (the rest of bad input: crates/settle-server/tests/bad_input.rs).
#[tokio::test]
async fn bad_requests_on_the_wire_get_4xx() {
    let dir = TempDir::new("bad");
    let s = Server::start(
        dir.path(),
        &["--max-body-bytes", "4096", "--max-result-bytes", "100"],
    );
    let path = operation_path("fresh", "claim");
    // A raw byte outside 0x21–0x7E never reaches a handler; the HTTP parser answers 400.
    let (st, _) = raw_status(
        &s.addr,
        b"POST /v1/operations/a\xffb/claim HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    assert_eq!(st, 400);
    // 413: over max_body_bytes without a declared length.
    let chunked = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        5000,
        "x".repeat(5000)
    );
    let (st, text) = raw_status(&s.addr, chunked.as_bytes()).await;
    assert_eq!(st, 413, "{text}");
    assert!(text.contains("payload_too_large"));
}

/// SPEC §10: every result of a batch is durable before the response (what
/// a batch answers: crates/settle-server/tests/batch.rs).
#[tokio::test]
async fn batch_results_are_durable_before_the_response() {
    let dir = TempDir::new("batch");
    let mut s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [
            batch_call("claim", "b/1", claim_body(1, &b)),
            batch_call("claim", "b%41", claim_body(1, &b)),
        ]}),
    )
    .await;
    let v = r.json();
    let f1 = v["results"][0]["body"]["fence"].as_u64().unwrap();
    let f2 = v["results"][1]["body"]["fence"].as_u64().unwrap();
    let r = post(
        &ep,
        "/v1/batch",
        json!({"calls": [
            batch_call("settle", "b/1", settle_body(f1, 1, &b, completed(1))),
            batch_call("settle", "b%41", settle_body(f2, 1, &b, completed(2))),
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // Acknowledged means durable: SIGKILL, restart, the receipts are there.
    s.kill9();
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    for key in ["b/1", "b%41"] {
        let rec = get(&ep, &operation_path(key, "")).await;
        assert_eq!(rec.json()["status"], "completed", "{key}");
    }
}

/// An over-long request target answers 414 problem+json,
/// code `uri_too_long`, like every other error: over the server's limit
/// (8 KiB) and over hyper's own (64 KiB, which hyper refuses before the
/// server sees a request, with an empty body until the server replaced it).
#[tokio::test]
async fn an_over_long_target_is_414_problem_json() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = TempDir::new("uri");
    let s = Server::start(dir.path(), &[]);
    for len in [9_000usize, 70_000] {
        let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
        let req = format!(
            "GET /v1/operations/{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            "a".repeat(len)
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out);
        let (head, body) = text.split_once("\r\n\r\n").expect("a response");
        assert!(head.starts_with("HTTP/1.1 414 "), "{len}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{len}: {head}"
        );
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{len}: {e}: {body:?}"));
        assert_eq!(
            (v["status"].as_u64(), v["code"].as_str()),
            (Some(414), Some("uri_too_long")),
            "{len}"
        );
        assert!(body.ends_with("}\n"), "{len}: {body:?}");
    }
    // The server still serves.
    assert_eq!(get(&s.ep(), "/healthz").await.status, 200);
}
