//! A real `settle serve` process on an ephemeral port.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use hyper::Method;
use serde_json::Value;
pub use settle_client::testkit::*;
use settle_client::{Bytes, Client, Reply, operation_path};

pub mod pg;
pub mod remote;

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
            .env_remove("SETTLE_ADMIN_TOKEN_SHA256")
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
    ep.send_raw(Method::GET, path, None).await.unwrap()
}

pub async fn op(ep: &Client, key: &str, call: &str, body: Value) -> Reply {
    post(ep, &operation_path(key, call), body).await
}

/// Claims `key` and expects `execute`; returns the fence.
pub async fn execute(ep: &Client, key: &str, f: u8, b: &Value) -> u64 {
    executed(&op(ep, key, "claim", claim_body(f, b)).await)
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
