//! The payments example served over real HTTP (the router its `main`
//! serves, on an ephemeral port), over the embedded ledger and a remote
//! `settle serve`: the walk-through of the README.

mod common;

#[allow(dead_code)]
#[path = "../examples/payments.rs"]
mod payments;

use axum::body::Bytes;
use common::{Ledgers, Mode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;

struct Http {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Http {
    async fn connect(addr: std::net::SocketAddr) -> Http {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        Http { sender }
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> (u16, hyper::HeaderMap, Bytes) {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        self.sender.ready().await.unwrap();
        let resp = self.sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, headers, body)
    }
}

async fn walk_through(mode: Mode) {
    let ledgers = Ledgers::start(mode).await;
    let (router, state) = payments::app(ledgers.layer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut http = Http::connect(addr).await;
    let pay = r#"{"amount": 10, "currency": "EUR"}"#;

    let (s, h, first) = http.send("POST", "/payments", Some("order-1"), pay).await;
    assert_eq!(s, 201);
    assert_eq!(h["location"], "/payments/pay_1");
    assert!(h.get("idempotent-replayed").is_none());
    let (s, h, again) = http.send("POST", "/payments", Some("order-1"), pay).await;
    assert_eq!((s, &again), (201, &first), "the same bytes");
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(h["location"], "/payments/pay_1");

    let other = r#"{"amount": 11, "currency": "EUR"}"#;
    let (s, _, body) = http.send("POST", "/payments", Some("order-1"), other).await;
    assert_eq!(s, 422);
    assert!(String::from_utf8_lossy(&body).contains("idempotency_key_reused"));

    let neg = r#"{"amount": -1, "currency": "EUR"}"#;
    let (s, _, _) = http.send("POST", "/payments", Some("neg"), neg).await;
    assert_eq!(s, 500);
    let (s, _, body) = http.send("POST", "/payments", Some("neg"), neg).await;
    assert_eq!(s, 409);
    assert!(String::from_utf8_lossy(&body).contains("outcome_unknown"));

    let (s, _, _) = http.send("POST", "/payments", None, pay).await;
    assert_eq!(s, 400);

    let (s, _, body) = http.send("GET", "/executions", None, "").await;
    assert_eq!(s, 200);
    assert_eq!(&body[..], br#"{"count":2}"#);
    assert_eq!(state.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_over_http_embedded() {
    walk_through(Mode::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_over_http_remote() {
    walk_through(Mode::Remote).await;
}
