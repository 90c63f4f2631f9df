//! A real `settle serve` process on an ephemeral port.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use hyper::Method;
use serde_json::Value;
use settle_client::{Bytes, Client, Reply, api, operation_path};

pub const BIN: &str = env!("CARGO_BIN_EXE_settle");

static N: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "settle-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `settle serve --listen 127.0.0.1:0 --data DIR ARGS...` and
    /// waits for the `listening on ADDR` line.
    pub fn start(data: &Path, args: &[&str]) -> Server {
        Server::start_env(data, args, &[])
    }

    /// Like [`Server::start`], with extra environment variables.
    pub fn start_env(data: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.envs(env.iter().copied());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(args)
            .env_remove("SETTLE_TENANTS")
            .env_remove("SETTLE_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("SETTLE_TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().expect("spawn settle serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("settle serve did not start: {line:?}")
            })
            .to_string();
        Server { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of its own (its own connections).
    pub fn ep(&self) -> Client {
        Client::new(&self.url()).unwrap()
    }

    pub fn ep_token(&self, token: &str) -> Client {
        Client::builder(&self.url()).token(token).build().unwrap()
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn fp(n: u8) -> String {
    hex::encode([n; 32])
}

/// The request bodies are built from the `settle-api` types (what every
/// client sends) and handed to the tests as JSON values, so a test may
/// still break one field on purpose.
fn value<T: serde::Serialize>(body: &T) -> Value {
    serde_json::to_value(body).unwrap()
}

pub fn binding(p: &str, generation: u64) -> Value {
    value(&api::Binding {
        principal: p.to_string(),
        scopes: vec!["pay".to_string()],
        generation,
    })
}

fn api_binding(b: &Value) -> api::Binding {
    serde_json::from_value(b.clone()).expect("a binding body")
}

pub fn claim_body(f: u8, b: &Value) -> Value {
    value(&api::ClaimRequest {
        fingerprint: fp(f),
        binding: api_binding(b),
        lease_ms: None,
        worker: None,
        marks_dispatch: false,
        retention_s: None,
    })
}

pub fn completed(n: u8) -> Value {
    value(&api::Outcome {
        status: api::OutcomeStatus::Completed,
        result: Some(
            serde_json::value::RawValue::from_string(format!(r#"{{"charge":{n}}}"#)).unwrap(),
        ),
        response_sha256: Some(fp(100 + n)),
        error: None,
    })
}

pub fn settle_body(fence: u64, f: u8, b: &Value, outcome: Value) -> Value {
    let outcome: api::Outcome = serde_json::from_value(outcome).expect("an outcome body");
    value(&api::SettleRequest {
        fence,
        fingerprint: fp(f),
        binding: api_binding(b),
        outcome,
    })
}

pub async fn post(ep: &Client, path: &str, body: Value) -> Reply {
    let body = Bytes::from(serde_json::to_vec(&body).unwrap());
    ep.send_raw(Method::POST, path, Some(body)).await.unwrap()
}

pub async fn post_raw(ep: &Client, path: &str, body: &[u8]) -> Reply {
    ep.send_raw(Method::POST, path, Some(Bytes::copy_from_slice(body)))
        .await
        .unwrap()
}

pub async fn get(ep: &Client, path: &str) -> Reply {
    if VIA_BATCH.try_with(|b| *b).unwrap_or(false)
        && let Some(seg) = path.strip_prefix("/v1/operations/")
        && !seg.contains('/')
        && let Some(key) = percent_decode(seg)
    {
        let call = api::BatchCall::new(api::BatchOp::Get, key, &api::EmptyRequest {});
        return batch_one(ep, call).await;
    }
    ep.send_raw(Method::GET, path, None).await.unwrap()
}

pub async fn op(ep: &Client, key: &str, call: &str, body: Value) -> Reply {
    if VIA_BATCH.try_with(|b| *b).unwrap_or(false)
        && let Value::Object(fields) = &body
    {
        let op: api::BatchOp =
            serde_json::from_value(Value::String(call.into())).expect("a batch op");
        let call = api::BatchCall {
            op,
            key: key.into(),
            fields: fields.clone(),
        };
        return batch_one(ep, call).await;
    }
    post(ep, &operation_path(key, call), body).await
}

tokio::task_local! {
    /// Set: [`op`] and [`get`] of an operation go through `POST /v1/batch`
    /// (one call per batch) instead of their single routes, so the same
    /// scenario checks that a batch slot answers what the single call does.
    pub static VIA_BATCH: bool;
}

/// Sends one call as a batch and returns its slot as if it were the single call's answer.
pub async fn batch_one(ep: &Client, call: api::BatchCall) -> Reply {
    let req = api::BatchRequest { calls: vec![call] };
    let r = post(ep, "/v1/batch", serde_json::to_value(&req).unwrap()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.content_type, "application/json");
    // Raw bodies: a slot keeps the single call's exact bytes.
    let v: api::BatchResponse = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v.results.len(), 1, "{v:?}");
    let status = v.results[0].status;
    Reply {
        status,
        content_type: if status == 200 {
            "application/json"
        } else {
            "application/problem+json"
        }
        .to_string(),
        retry_after: None,
        body: Bytes::from(v.results[0].body.get().to_string()),
    }
}

/// Decodes `%XX` escapes (the test's own paths are well formed).
fn percent_decode(seg: &str) -> Option<String> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(seg.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Claims `key` and expects `execute`; returns the fence.
pub async fn execute(ep: &Client, key: &str, f: u8, b: &Value) -> u64 {
    let r = op(ep, key, "claim", claim_body(f, b)).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    match r.parse::<api::ClaimDecision>() {
        Ok(api::ClaimDecision::Execute(g)) => g.fence,
        other => panic!("expected execute, got {other:?}"),
    }
}

/// Asserts a problem+json answer with this status and code.
#[track_caller]
pub fn assert_problem(r: &Reply, status: u16, code: &str) {
    assert_eq!(
        (r.status, r.problem().map(|p| p.code.as_str())),
        (status, Some(code)),
        "body: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.content_type, "application/problem+json");
    let v = r.json();
    assert_eq!(v["status"], status);
    assert!(v["title"].is_string() && v["type"].is_string() && v["detail"].is_string());
}

/// Sends raw bytes on a fresh connection and returns the status code.
pub async fn raw_status(addr: &str, request: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

pub fn token_sha256(token: &str) -> String {
    settle_server::auth::token_sha256(token)
}

/// Reads a 200 answer as the `settle-api` type `T` and checks that the type
/// writes it back byte for byte (the server's bodies are these types).
#[track_caller]
pub fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(r: &Reply) -> T {
    assert_eq!(r.status, 200, "body: {}", String::from_utf8_lossy(&r.body));
    let v: T = r.parse().expect("the body reads as its settle-api type");
    // A response body ends with a newline; a batch slot's body (which
    // `op` hands back in the via_batch tests) has none.
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(
        serde_json::to_string(&v).unwrap(),
        body.strip_suffix('\n').unwrap_or(&body),
        "the settle-api type writes the body back unchanged"
    );
    v
}
