//! The proxy between a raw HTTP/1.1 client and a counting upstream.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use settle_faultproxy::{Action, Call, LoggedCall, Proxy, Rule, Taken};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server that counts its requests and answers 200 with what it saw.
struct Upstream {
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| answer(counter.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, count }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

async fn answer(
    count: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let seen = json!({
        "n": n,
        "method": req.method().as_str(),
        "target": req.uri().to_string(),
        "authorization": header("authorization"),
        "traceparent": header("traceparent"),
        "idempotency_key": header("idempotency-key"),
        "content_type": header("content-type"),
    });
    let body = req.into_body().collect().await?.to_bytes();
    let mut seen = seen;
    seen["body"] = Value::String(String::from_utf8(body.to_vec()).unwrap());
    let mut res = Response::new(Full::new(Bytes::from(seen.to_string())));
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    res.headers_mut()
        .insert("x-upstream", "yes".parse().unwrap());
    Ok(res)
}

async fn setup() -> (Upstream, Proxy) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream.addr)
        .await
        .unwrap();
    (upstream, proxy)
}

/// One parsed response.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A raw keep-alive HTTP/1.1 connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, method: &str, target: &str, body: &str, extra: &[(&str, &str)]) {
        let mut req = format!(
            "{method} {target} HTTP/1.1\r\nhost: settle\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in extra {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.stream.write_all(req.as_bytes()).await.unwrap();
    }

    /// Reads one response (content-length framed), or `None` if the
    /// connection closed (or reset) before any byte of it arrived.
    async fn read(&mut self) -> Option<Answer> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if !self.fill().await {
                assert!(
                    self.buf.is_empty(),
                    "partial response: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
                return None;
            }
        };
        let head = String::from_utf8(self.buf[..head_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_owned(), v.trim().to_owned())
            })
            .collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .expect("content-length");
        while self.buf.len() < head_end + 4 + len {
            assert!(self.fill().await, "connection closed mid-body");
        }
        let body = self.buf[head_end + 4..head_end + 4 + len].to_vec();
        self.buf.drain(..head_end + 4 + len);
        Some(Answer {
            status,
            headers,
            body,
        })
    }

    /// false at EOF or reset.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    async fn call(&mut self, method: &str, target: &str, body: &str) -> Option<Answer> {
        self.send(method, target, body, &[]).await;
        self.read().await
    }
}

fn actions(log: &[LoggedCall]) -> Vec<(Call, Taken, Option<u16>)> {
    log.iter()
        .map(|c| (c.call, c.action, c.upstream_status))
        .collect()
}

#[tokio::test]
async fn forwards_keep_alive_requests_with_headers_and_bodies() {
    let (upstream, proxy) = setup().await;
    let mut conn = Conn::open(proxy.addr()).await;
    let headers = [
        ("authorization", "Bearer t0ken"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("idempotency-key", "abc"),
        ("content-type", "application/json"),
    ];
    conn.send("POST", "/v1/operations/k1/claim", r#"{"a":1}"#, &headers)
        .await;
    let first = conn.read().await.expect("first answer");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-upstream"), Some("yes"));
    assert_eq!(first.header("connection"), None);
    let seen = first.json();
    assert_eq!(seen["authorization"], "Bearer t0ken");
    assert_eq!(seen["traceparent"], headers[1].1);
    assert_eq!(seen["idempotency_key"], "abc");
    assert_eq!(seen["content_type"], "application/json");
    assert_eq!(seen["body"], r#"{"a":1}"#);
    assert_eq!(seen["target"], "/v1/operations/k1/claim");
    // the same connection serves the next request
    let second = conn
        .call("GET", "/v1/operations?limit=2&state=open", "")
        .await
        .expect("second answer");
    assert_eq!(second.json()["target"], "/v1/operations?limit=2&state=open");
    assert_eq!(upstream.count(), 2);
    assert_eq!(
        actions(&proxy.log()),
        [
            (Call::Claim, Taken::Forwarded, Some(200)),
            (Call::List, Taken::Forwarded, Some(200))
        ]
    );
    assert_eq!(proxy.log()[1].path, "/v1/operations");
    assert_eq!(proxy.log()[1].query.as_deref(), Some("limit=2&state=open"));
    assert_eq!(proxy.log()[0].query, None);
    proxy.stop().await;
}

#[tokio::test]
async fn drop_answer_applies_upstream_and_closes_without_a_byte() {
    let (upstream, proxy) = setup().await;
    proxy.set_rules(vec![Rule::new(Call::Claim, Action::DropAnswer).nth(2)]);
    let mut conn = Conn::open(proxy.addr()).await;
    assert_eq!(
        conn.call("POST", "/v1/operations/k1/claim", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    // other calls do not count towards the claim rule
    assert_eq!(
        conn.call("GET", "/v1/operations/k1", "")
            .await
            .unwrap()
            .status,
        200
    );
    assert!(
        conn.call("POST", "/v1/operations/k2/claim", "{}")
            .await
            .is_none(),
        "the answer was dropped"
    );
    assert_eq!(upstream.count(), 3, "the server saw the dropped claim");
    // times = 1: the next claim, on a new connection, goes through
    let mut conn = Conn::open(proxy.addr()).await;
    assert_eq!(
        conn.call("POST", "/v1/operations/k3/claim", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        actions(&proxy.log()),
        [
            (Call::Claim, Taken::Forwarded, Some(200)),
            (Call::Get, Taken::Forwarded, Some(200)),
            (Call::Claim, Taken::DropAnswer, Some(200)),
            (Call::Claim, Taken::Forwarded, Some(200)),
        ]
    );
    proxy.stop().await;
}

#[tokio::test]
async fn cut_before_forwards_nothing() {
    let (upstream, proxy) = setup().await;
    proxy.set_rules(vec![Rule::new(Call::Settle, Action::CutBefore)]);
    let mut conn = Conn::open(proxy.addr()).await;
    assert!(
        conn.call("POST", "/v1/operations/k/settle", r#"{"fence":1}"#)
            .await
            .is_none()
    );
    assert_eq!(upstream.count(), 0);
    let log = proxy.log();
    assert_eq!(actions(&log), [(Call::Settle, Taken::CutBefore, None)]);
    assert_eq!(
        (log[0].key.as_deref(), log[0].method.as_str()),
        (Some("k"), "POST")
    );
    proxy.stop().await;
}

#[tokio::test]
async fn status_rules_answer_problems_without_forwarding() {
    let (upstream, proxy) = setup().await;
    proxy.set_rules(vec![
        Rule::new(
            Call::Claim,
            Action::Status {
                status: 503,
                retry_after_s: 2,
            },
        ),
        Rule::new(
            Call::Batch,
            Action::Status {
                status: 429,
                retry_after_s: 1,
            },
        ),
    ]);
    let mut conn = Conn::open(proxy.addr()).await;
    let a = conn
        .call("POST", "/v1/operations/k/claim", "{}")
        .await
        .unwrap();
    assert_eq!((a.status, a.header("retry-after")), (503, Some("2")));
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let problem = a.json();
    assert_eq!(
        (problem["status"].as_u64(), problem["code"].as_str()),
        (Some(503), Some("unavailable"))
    );
    assert_eq!(problem["detail"], "injected by settle-faultproxy");
    // the connection stays open after an injected answer
    let b = conn.call("POST", "/v1/batch", "{}").await.unwrap();
    assert_eq!((b.status, b.header("retry-after")), (429, Some("1")));
    assert_eq!(b.json()["code"], "rate_limited");
    assert_eq!(upstream.count(), 0);
    assert_eq!(
        conn.call("POST", "/v1/operations/k/claim", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(upstream.count(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn times_all_fires_on_every_call_from_the_nth() {
    let (upstream, proxy) = setup().await;
    let mut conn = Conn::open(proxy.addr()).await;
    let rules =
        r#"{"rules":[{"call":"heartbeat","nth":2,"times":"all","action":"status","status":503}]}"#;
    assert_eq!(
        conn.call("PUT", "/__faults/rules", rules)
            .await
            .unwrap()
            .status,
        200
    );
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            conn.call("POST", "/v1/operations/k/heartbeat", "{}")
                .await
                .unwrap()
                .status,
        );
    }
    assert_eq!(statuses, [200, 503, 503, 503]);
    assert_eq!(
        conn.call("POST", "/v1/operations/k/settle", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(upstream.count(), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn key_rules_match_the_decoded_key() {
    let (upstream, proxy) = setup().await;
    proxy.set_rules(vec![
        Rule::new(Call::Claim, Action::CutBefore)
            .key("order 7/a")
            .always(),
    ]);
    let mut conn = Conn::open(proxy.addr()).await;
    assert_eq!(
        conn.call("POST", "/v1/operations/order%207%2Fb/claim", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    assert!(
        conn.call("POST", "/v1/operations/order%207%2Fa/claim", "{}")
            .await
            .is_none()
    );
    assert_eq!(upstream.count(), 1);
    let log = proxy.log();
    assert_eq!(log[1].key.as_deref(), Some("order 7/a"));
    assert_eq!(log[1].path, "/v1/operations/order%207%2Fa/claim");
    proxy.stop().await;
}

#[tokio::test]
async fn the_control_api_sets_rules_reads_the_log_and_refuses_bad_rules() {
    let (upstream, proxy) = setup().await;
    let mut conn = Conn::open(proxy.addr()).await;
    let rules = json!({"rules": [
        {"call": "*", "key": "k", "nth": 2, "times": null, "action": "drop_answer"},
        {"call": "get", "action": "delay", "delay_ms": 1},
    ]});
    let put = conn
        .call("PUT", "/__faults/rules", &rules.to_string())
        .await
        .unwrap();
    assert_eq!((put.status, put.json()), (200, json!({})));
    assert_eq!(proxy.rules().len(), 2);
    for bad in [
        r#"{"rules":[{"call":"claim","action":"explode"}]}"#,
        r#"{"rules":[{"call":"claim","action":"drop_answer","color":"red"}]}"#,
        r#"{"rules":[{"call":"claim","action":"status"}]}"#,
        r#"{"rules":[{"call":"claim","action":"status","status":200}]}"#,
        r#"{"rulez":[]}"#,
        "not json",
    ] {
        let refused = conn.call("PUT", "/__faults/rules", bad).await.unwrap();
        assert_eq!(refused.status, 400, "{bad}");
        assert!(
            refused.json()["error"]
                .as_str()
                .unwrap()
                .contains("bad rules")
        );
    }
    assert_eq!(proxy.rules().len(), 2, "a refused body changes nothing");
    assert_eq!(
        conn.call("GET", "/v1/operations/k", "")
            .await
            .unwrap()
            .status,
        200
    );
    assert!(
        conn.call("POST", "/v1/operations/k/claim", "{}")
            .await
            .is_none()
    );
    let mut conn = Conn::open(proxy.addr()).await;
    let log = conn.call("GET", "/__faults/log", "").await.unwrap().json();
    assert_eq!(
        log,
        json!({"calls": [
            {"call": "get", "key": "k", "method": "GET", "path": "/v1/operations/k",
             "query": null, "action": "delay", "upstream_status": 200},
            {"call": "claim", "key": "k", "method": "POST", "path": "/v1/operations/k/claim",
             "query": null, "action": "drop_answer", "upstream_status": 200},
        ]})
    );
    assert_eq!(
        conn.call("DELETE", "/__faults/rules", "")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        conn.call("GET", "/__faults/rules", "")
            .await
            .unwrap()
            .json(),
        json!({"rules": []})
    );
    assert_eq!(
        conn.call("GET", "/__faults/log", "").await.unwrap().json(),
        json!({"calls": []})
    );
    assert_eq!(
        conn.call("GET", "/__faults/nothing", "")
            .await
            .unwrap()
            .status,
        404
    );
    assert_eq!(upstream.count(), 2, "control calls are never forwarded");
    proxy.stop().await;
}

#[tokio::test]
async fn delay_waits_then_forwards() {
    let (upstream, proxy) = setup().await;
    proxy.set_rules(vec![Rule::new(Call::Get, Action::Delay { delay_ms: 100 })]);
    let mut conn = Conn::open(proxy.addr()).await;
    let started = Instant::now();
    assert_eq!(
        conn.call("GET", "/v1/operations/k", "")
            .await
            .unwrap()
            .status,
        200
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(upstream.count(), 1);
    assert_eq!(
        actions(&proxy.log()),
        [(Call::Get, Taken::Delay, Some(200))]
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_client_gone_mid_request_harms_no_one_and_connections_run_concurrently() {
    let (upstream, proxy) = setup().await;
    // a batch held for a minute does not hold anyone else up
    proxy.set_rules(vec![Rule::new(
        Call::Batch,
        Action::Delay { delay_ms: 60_000 },
    )]);
    let addr = proxy.addr();
    let mut held = Conn::open(addr).await;
    held.send("POST", "/v1/batch", "{}", &[]).await;
    // until the proxy has taken the batch in (and is holding it)
    while proxy.log().is_empty() {
        tokio::task::yield_now().await;
    }
    assert_eq!(actions(&proxy.log()), [(Call::Batch, Taken::Delay, None)]);
    // half a request, then gone
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(
        b"POST /v1/operations/k/claim HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"a\"",
    )
    .await
    .unwrap();
    drop(half);
    let mut conn = Conn::open(addr).await;
    assert_eq!(
        conn.call("POST", "/v1/operations/k/claim", "{}")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(upstream.count(), 1);
    // stopping closes the held connection too
    proxy.stop().await;
    assert!(held.read().await.is_none());
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_problem() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), dead)
        .await
        .unwrap();
    let answer = Conn::open(proxy.addr())
        .await
        .call("GET", "/v1/operations", "")
        .await
        .unwrap();
    assert_eq!(
        (answer.status, answer.json()["code"].as_str()),
        (502, Some("unavailable"))
    );
    assert_eq!(
        actions(&proxy.log()),
        [(Call::List, Taken::Forwarded, None)]
    );
    proxy.stop().await;
}
