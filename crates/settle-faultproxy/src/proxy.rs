//! The accept loop, the per-request decision and the control API.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::rules::{Action, Call, LoggedCall, Rule, State};

type Answer = Response<Full<Bytes>>;

/// The prefix of the proxy's own control API; never forwarded.
const CONTROL: &str = "/__faults";

/// Hop-by-hop headers: they describe one connection, not the message.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// A fault-injecting reverse proxy in front of one upstream settle server.
/// Dropping it stops it too.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

struct Shared {
    state: Mutex<State>,
    upstream: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The service's error: close the client's connection without an answer.
#[derive(Debug, thiserror::Error)]
#[error("connection closed by settle-faultproxy")]
struct Close;

impl Proxy {
    /// Binds `listen` (port 0: any free port) and serves in front of
    /// `upstream` on the current tokio runtime, with no rules.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            upstream,
            client: Client::builder(TokioExecutor::new()).build(connector),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy { addr, shared, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces every rule; every counter and the log start over.
    pub fn set_rules(&self, rules: Vec<Rule>) {
        self.shared.state().set_rules(rules);
    }

    /// The rules in force.
    pub fn rules(&self) -> Vec<Rule> {
        self.shared.state().rules()
    }

    /// Every call seen since the rules were last set, in arrival order.
    pub fn log(&self) -> Vec<LoggedCall> {
        self.shared.state().log()
    }

    /// Stops accepting and closes every open connection.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts until aborted; aborting it drops the set, which aborts every
/// connection's task.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                Err(e) => {
                    // out of descriptors and the like: do not spin
                    tracing::warn!(error = %e, "settle-faultproxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
    // A service error (a drop or a cut) ends the connection without writing
    // a response; dropping the stream then closes the socket.
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(error = %e, "settle-faultproxy: connection ended");
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Answer, Close> {
    let path = req.uri().path().to_owned();
    if path == CONTROL || path.starts_with("/__faults/") {
        return Ok(control(&shared, req).await);
    }
    let (mut parts, body) = req.into_parts();
    // A client that goes away mid-body: nothing to count, just close.
    let body = body.collect().await.map_err(|_| Close)?.to_bytes();
    let (call, key) = Call::classify(parts.method.as_str(), &path);
    let query = parts.uri.query().map(str::to_owned);
    let (action, slot) = shared
        .state()
        .decide(call, key, parts.method.as_str(), &path, query);
    match action {
        Some(Action::CutBefore) => return Err(Close),
        Some(Action::Status {
            status,
            retry_after_s,
        }) => {
            return Ok(injected(status, retry_after_s));
        }
        Some(Action::Delay { delay_ms }) => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        Some(Action::DropAnswer) | None => {}
    }
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    parts.uri = format!("http://{}{target}", shared.upstream)
        .parse()
        .map_err(|_| Close)?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    let answer = forward(&shared, Request::from_parts(parts, Full::new(body))).await;
    if let Ok(answer) = &answer {
        shared.state().answered(slot, answer.status().as_u16());
    }
    match (action, answer) {
        (Some(Action::DropAnswer), _) => Err(Close),
        (_, Ok(answer)) => Ok(answer),
        (_, Err(e)) => {
            tracing::warn!(error = %e, "settle-faultproxy: upstream failed");
            Ok(problem(
                StatusCode::BAD_GATEWAY,
                "unavailable",
                &format!("upstream: {e}"),
            ))
        }
    }
}

/// Sends the request upstream and reads its whole answer.
async fn forward(
    shared: &Shared,
    req: Request<Full<Bytes>>,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let (mut parts, body) = shared.client.request(req).await?.into_parts();
    let body = body.collect().await?.to_bytes();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Full::new(body)))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The answer of a `status` rule: settle's problem+json shape.
fn injected(status: u16, retry_after_s: u64) -> Answer {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let code = match status.as_u16() {
        429 => "rate_limited",
        500.. => "unavailable",
        _ => "bad_request",
    };
    let mut answer = problem(status, code, "injected by settle-faultproxy");
    if matches!(status.as_u16(), 429 | 503) {
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
    }
    answer
}

fn problem(status: StatusCode, code: &str, detail: &str) -> Answer {
    let title = match status.as_u16() {
        429 => "Rate limited",
        503 => "Service unavailable",
        _ => status.canonical_reason().unwrap_or("Error"),
    };
    let body = json!({
        "type": format!("urn:settle:problem:{code}"),
        "title": title,
        "status": status.as_u16(),
        "code": code,
        "detail": detail,
    });
    let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    answer
}

fn json_answer(status: StatusCode, body: &serde_json::Value) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    answer
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesBody {
    rules: Vec<Rule>,
}

/// `/__faults/rules` (PUT, DELETE, GET) and `/__faults/log` (GET).
async fn control(shared: &Shared, req: Request<Incoming>) -> Answer {
    let error = |status, message: String| json_answer(status, &json!({ "error": message }));
    match (req.method().clone(), req.uri().path()) {
        (Method::PUT, "/__faults/rules") => {
            let body = match req.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
            };
            match serde_json::from_slice::<RulesBody>(&body) {
                Ok(RulesBody { rules }) => {
                    shared.state().set_rules(rules);
                    json_answer(StatusCode::OK, &json!({}))
                }
                Err(e) => error(StatusCode::BAD_REQUEST, format!("bad rules: {e}")),
            }
        }
        (Method::DELETE, "/__faults/rules") => {
            shared.state().set_rules(Vec::new());
            json_answer(StatusCode::OK, &json!({}))
        }
        (Method::GET, "/__faults/rules") => {
            json_answer(StatusCode::OK, &json!({ "rules": shared.state().rules() }))
        }
        (Method::GET, "/__faults/log") => {
            json_answer(StatusCode::OK, &json!({ "calls": shared.state().log() }))
        }
        (method, path) => error(
            StatusCode::NOT_FOUND,
            format!("no control route {method} {path}"),
        ),
    }
}
