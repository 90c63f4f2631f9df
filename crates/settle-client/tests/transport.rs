//! The client's transports (the pool, and one dedicated connection)
//! against scripted HTTP servers: connection reuse, replaced connections,
//! timeouts, connect failures, the bearer token, and typed problems.
//! (Every call against a real `settle serve`: crates/settle/tests/client.rs.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use settle_client::api::{Code, HealthStatus};
use settle_client::{Client, ClientBuilder, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

/// The two transports.
const MODES: [&str; 2] = ["pool", "single"];

/// A client of `url` on the transport `mode`.
fn builder(url: &str, mode: &str) -> ClientBuilder {
    let b = Client::builder(url);
    if mode == "single" {
        b.single_connection()
    } else {
        b
    }
}

/// A server that answers every request with `answer`, counting
/// connections and recording each request's head.
struct Scripted {
    url: String,
    accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

/// `close`: the server closes each connection right after its first
/// answer, without saying so (the client believes it is kept).
async fn scripted(answer: &'static str, close: bool) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (a, h) = (accepted.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(conn, answer, close, h.clone()));
        }
    });
    Scripted {
        url,
        accepted,
        heads,
    }
}

/// Reads requests (head, then a Content-Length body) and answers each.
async fn serve(mut conn: TcpStream, answer: &str, close: bool, heads: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = find(&buf, b"\r\n\r\n") else {
            if !read_more(&mut conn, &mut buf).await {
                return;
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let l = l.to_ascii_lowercase();
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while buf.len() < end + 4 + len {
            if !read_more(&mut conn, &mut buf).await {
                return;
            }
        }
        buf.drain(..end + 4 + len);
        heads.lock().await.push(head);
        if conn.write_all(answer.as_bytes()).await.is_err() || close {
            return;
        }
    }
}

async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match conn.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A whole HTTP/1.1 answer (kept for the test's lifetime).
fn answer(status: &str, headers: &str, body: &str) -> &'static str {
    let text = format!(
        "HTTP/1.1 {status}\r\n{headers}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    Box::leak(text.into_boxed_str())
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"status\":\"ok\"}";

#[tokio::test]
async fn sequential_calls_reuse_one_keep_alive_connection() {
    for mode in MODES {
        let s = scripted(OK, false).await;
        let client = builder(&s.url, mode).build().unwrap();
        for _ in 0..5 {
            assert_eq!(client.health().await.unwrap().status, HealthStatus::Ok);
        }
        // Clones share the connection(s).
        client.clone().health().await.unwrap();
        assert_eq!(s.accepted.load(Ordering::SeqCst), 1, "{mode}");
        assert_eq!(s.heads.lock().await.len(), 6, "{mode}");
    }
}

#[tokio::test]
async fn concurrent_calls_on_one_connection_take_turns() {
    let s = scripted(OK, false).await;
    let client = Client::builder(&s.url).single_connection().build().unwrap();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.health().await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(s.accepted.load(Ordering::SeqCst), 1);
}

/// A connection the server closed behind the client's back is replaced;
/// no call fails for it.
#[tokio::test]
async fn a_connection_the_server_closed_is_replaced() {
    for mode in MODES {
        let s = scripted(OK, true).await;
        let client = builder(&s.url, mode).build().unwrap();
        for i in 0..4 {
            let r = client.health().await;
            assert!(r.is_ok(), "{mode}, call {i}: {r:?}");
        }
        assert_eq!(s.accepted.load(Ordering::SeqCst), 4, "{mode}");
    }
}

#[tokio::test]
async fn the_bearer_token_goes_with_every_call() {
    for mode in MODES {
        let s = scripted(OK, false).await;
        let client = builder(&s.url, mode).token("s3cret").build().unwrap();
        client.health().await.unwrap();
        let head = s.heads.lock().await[0].to_ascii_lowercase();
        assert!(head.starts_with("get /healthz http/1.1"), "{mode}: {head}");
        assert!(head.contains("authorization: bearer s3cret"), "{head}");
        assert!(head.contains("host: 127.0.0.1:"), "{head}");
        // And is never printed.
        assert!(!format!("{client:?}").contains("s3cret"));
    }
    // Without one, no header at all.
    let s = scripted(OK, false).await;
    Client::new(&s.url).unwrap().health().await.unwrap();
    let head = s.heads.lock().await[0].to_ascii_lowercase();
    assert!(!head.contains("authorization"));
}

#[tokio::test]
async fn a_silent_server_is_a_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            // Hold every connection open without answering.
            conns.push(listener.accept().await.unwrap().0);
        }
    });
    for mode in MODES {
        let client = builder(&url, mode)
            .request_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let e = client.health().await.unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{mode}: {e:?}");
        assert!(e.is_transport() && e.is_retryable());
    }
    held.abort();
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for mode in MODES {
        let url = format!("http://127.0.0.1:{port}");
        let e = builder(&url, mode)
            .build()
            .unwrap()
            .get("k")
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Connect { .. }), "{mode}: {e:?}");
        let line = e.to_string();
        let start = format!("cannot connect to 127.0.0.1:{port}: ");
        assert!(line.starts_with(&start), "{mode}: {line}");
        assert!(line.to_lowercase().contains("refused"), "{mode}: {line}");
    }
}

#[tokio::test]
async fn an_error_answer_is_a_typed_problem() {
    let unavailable = answer(
        "503 Service Unavailable",
        "content-type: application/problem+json\r\nretry-after: 2",
        r#"{"type":"urn:settle:problem:unavailable","title":"Service unavailable","status":503,"detail":"overloaded","code":"unavailable","correlation_id":"0000abcd-000001"}"#,
    );
    let s = scripted(unavailable, false).await;
    let e = Client::new(&s.url).unwrap().get("k").await.unwrap_err();
    let h = e.http().expect("an HTTP error");
    assert_eq!((h.status, h.code()), (503, Some(Code::Unavailable)));
    assert_eq!(h.detail(), "overloaded");
    assert_eq!(h.correlation_id(), Some("0000abcd-000001"));
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    assert!(e.is_retryable() && !e.is_transport());
    assert_eq!(
        e.to_string(),
        "unavailable (503 unavailable): overloaded (correlation_id 0000abcd-000001); retry after 2 s"
    );
    // A body that is not a problem (a proxy) keeps its status and bytes.
    let proxy = answer("502 Bad Gateway", "content-type: text/html", "oops!");
    let s = scripted(proxy, false).await;
    let e = Client::new(&s.url).unwrap().get("k").await.unwrap_err();
    let h = e.http().unwrap();
    assert_eq!(
        (h.status, h.problem.is_none(), &h.body[..]),
        (502, true, &b"oops!"[..])
    );
}

#[tokio::test]
async fn a_success_that_is_not_the_answer_is_unexpected() {
    let s = scripted(OK, false).await;
    let e = Client::new(&s.url).unwrap().get("k").await.unwrap_err();
    assert!(
        matches!(e, ClientError::UnexpectedBody { status: 200, .. }),
        "{e:?}"
    );
}
