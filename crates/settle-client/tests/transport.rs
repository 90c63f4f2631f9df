//! The client's transport against scripted HTTP servers: connection reuse,
//! timeouts, connect failures, the bearer token, and typed problems.
//! (Every call against a real `settle serve`: crates/settle/tests/client.rs.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use settle_client::api::{Code, HealthStatus};
use settle_client::{Client, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

/// A server that answers every request on a connection with `answer`,
/// counting connections and recording each request's head.
struct Scripted {
    url: String,
    accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

async fn scripted(answer: &'static str) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (a, h) = (accepted.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(conn, answer, h.clone()));
        }
    });
    Scripted {
        url,
        accepted,
        heads,
    }
}

/// Reads requests (head, then a Content-Length body) and answers each.
async fn serve(mut conn: TcpStream, answer: &'static str, heads: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = find(&buf, b"\r\n\r\n") else {
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while buf.len() < end + 4 + len {
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + len);
        heads.lock().await.push(head);
        if conn.write_all(answer.as_bytes()).await.is_err() {
            return;
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
    let s = scripted(OK).await;
    let client = Client::new(&s.url).unwrap();
    for _ in 0..5 {
        assert_eq!(client.health().await.unwrap().status, HealthStatus::Ok);
    }
    // Clones share the pool.
    client.clone().health().await.unwrap();
    assert_eq!(s.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(s.heads.lock().await.len(), 6);
}

#[tokio::test]
async fn the_bearer_token_goes_with_every_call() {
    let s = scripted(OK).await;
    let client = Client::builder(&s.url).token("s3cret").build().unwrap();
    client.health().await.unwrap();
    let head = s.heads.lock().await[0].clone();
    assert!(head.starts_with("GET /healthz HTTP/1.1"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer s3cret"),
        "{head}"
    );
    // And is never printed.
    assert!(!format!("{client:?}").contains("s3cret"));
    // Without one, no header at all.
    let s = scripted(OK).await;
    Client::new(&s.url).unwrap().health().await.unwrap();
    assert!(
        !s.heads.lock().await[0]
            .to_ascii_lowercase()
            .contains("authorization")
    );
}

#[tokio::test]
async fn a_silent_server_is_a_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        // Hold the connection open without answering.
        let mut conn = conn;
        let mut sink = Vec::new();
        let _ = conn.read_to_end(&mut sink).await;
    });
    let client = Client::builder(&url)
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let e = client.health().await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    assert!(e.is_transport() && e.is_retryable());
    held.abort();
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
    let e = client.get("k").await.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
    let line = e.to_string();
    assert!(
        line.starts_with(&format!("cannot connect to 127.0.0.1:{port}: ")),
        "{line}"
    );
    assert!(line.to_lowercase().contains("refused"), "{line}");
}

#[tokio::test]
async fn an_error_answer_is_a_typed_problem() {
    let unavailable = answer(
        "503 Service Unavailable",
        "content-type: application/problem+json\r\nretry-after: 2",
        r#"{"type":"urn:settle:problem:unavailable","title":"Service unavailable","status":503,"detail":"overloaded","code":"unavailable","correlation_id":"0000abcd-000001"}"#,
    );
    let s = scripted(unavailable).await;
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
    let s = scripted(proxy).await;
    let e = Client::new(&s.url).unwrap().get("k").await.unwrap_err();
    let h = e.http().unwrap();
    assert_eq!(
        (h.status, h.problem.is_none(), &h.body[..]),
        (502, true, &b"oops!"[..])
    );
}

#[tokio::test]
async fn a_success_that_is_not_the_answer_is_unexpected() {
    let s = scripted(OK).await;
    let e = Client::new(&s.url).unwrap().get("k").await.unwrap_err();
    assert!(
        matches!(e, ClientError::UnexpectedBody { status: 200, .. }),
        "{e:?}"
    );
}
