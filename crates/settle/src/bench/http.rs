//! `settle bench --url`: `connections` keep-alive connections, each looping
//! claim (fresh key) + settle `completed` through the generic pair loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::Method;
use settle::client::{ClientError, Conn, Endpoint, operation_path};
use settle_ledger::bench::{Limit, PairStats, PairWorker, run_workers};

use crate::exit::Failure;

/// One connection's loop.
struct HttpWorker {
    conn: Conn,
    prefix: String,
    claim_body: Arc<[u8]>,
    errors: Arc<AtomicU64>,
}

const FINGERPRINT: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const RESPONSE_SHA256: &str = "6565656565656565656565656565656565656565656565656565656565656565";
const BINDING: &str = r#"{"principal":"bench","scopes":["pay"],"generation":0}"#;

#[derive(serde::Deserialize)]
struct ClaimAnswer {
    decision: String,
    fence: Option<u64>,
}

impl PairWorker for HttpWorker {
    type Error = ClientError;
    /// A refused or unexpected answer counts as an error and the run goes
    /// on; a broken connection ends the run.
    async fn call(&mut self, n: u64) -> Result<u64, ClientError> {
        let key = format!("{}-{n}", self.prefix);
        let r = self
            .conn
            .send(
                Method::POST,
                &operation_path(&key, "claim"),
                Some(self.claim_body.to_vec()),
            )
            .await
            .inspect_err(|_| {
                self.fail();
            })?;
        let fence = match serde_json::from_slice::<ClaimAnswer>(&r.body) {
            Ok(ClaimAnswer {
                decision,
                fence: Some(f),
            }) if decision == "execute" => f,
            _ => return Ok(self.fail()),
        };
        let body = format!(
            r#"{{"fence":{fence},"fingerprint":"{FINGERPRINT}","binding":{BINDING},"outcome":{{"status":"completed","result":{{"ok":true}},"response_sha256":"{RESPONSE_SHA256}"}}}}"#
        );
        let r = self
            .conn
            .send(
                Method::POST,
                &operation_path(&key, "settle"),
                Some(body.into_bytes()),
            )
            .await
            .inspect_err(|_| {
                self.fail();
            })?;
        Ok(if r.status == 200 { 1 } else { self.fail() })
    }
}

impl HttpWorker {
    /// Counts a failed pair; settles none.
    fn fail(&self) -> u64 {
        self.errors.fetch_add(1, Ordering::Relaxed);
        0
    }
}

/// Runs the HTTP benchmark at `connections`; returns the stats and the
/// number of failed pairs.
pub async fn run(
    url: &str,
    token: Option<&str>,
    connections: usize,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<(PairStats, u64), Failure> {
    let ep = Endpoint::new(url, token).map_err(Failure::usage)?;
    let run = super::run_id();
    let claim_body: Arc<[u8]> = format!(r#"{{"fingerprint":"{FINGERPRINT}","binding":{BINDING}}}"#)
        .into_bytes()
        .into();
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(connections);
    for c in 0..connections.max(1) {
        workers.push(HttpWorker {
            conn: ep.connect().await.map_err(Failure::unreachable)?,
            prefix: format!("bench-{run}-{c}"),
            claim_body: claim_body.clone(),
            errors: errors.clone(),
        });
    }
    let stats = run_workers(workers, limit, progress)
        .await
        .map_err(Failure::unreachable)?;
    Ok((stats, errors.load(Ordering::Relaxed)))
}
