//! `settle bench --url`: `connections` keep-alive connections, each looping
//! claim (fresh key) + settle `completed` through the generic pair loop,
//! with the typed client (one dedicated connection per worker); with
//! `--batch N`, each loop sends N claims in one `POST /v1/batch` and then
//! their N settlements in another.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;
use settle_client::api::{
    BatchResponseRef, BatchResultRef, Binding, ClaimDecision, ClaimRequest, Outcome, OutcomeStatus,
    SettleRequest,
};
use settle_client::{Client, ClientError};
use settle_ledger::bench::{Limit, PairStats, PairWorker, run_workers};

use crate::exit::Failure;

/// One connection's loop.
struct HttpWorker {
    client: Client,
    prefix: String,
    claim: Arc<ClaimRequest>,
    outcome: Arc<Outcome>,
    errors: Arc<AtomicU64>,
}

impl PairWorker for HttpWorker {
    type Error = ClientError;
    /// A refused or unexpected answer counts as an error and the run goes
    /// on; no answer at all (the server is gone) ends the run.
    async fn call(&mut self, n: u64) -> Result<u64, ClientError> {
        let key = format!("{}-{n}", self.prefix);
        let fence = match self.client.claim(&key, &self.claim).await {
            Ok(ClaimDecision::Execute(g)) => g.fence,
            Ok(_) => return Ok(self.fail()),
            Err(e) => return self.failed(e),
        };
        let settle = SettleRequest {
            fence,
            fingerprint: self.claim.fingerprint.clone(),
            binding: self.claim.binding.clone(),
            outcome: Outcome::clone(&self.outcome),
        };
        match self.client.settle(&key, &settle).await {
            Ok(_) => Ok(1),
            Err(e) => self.failed(e),
        }
    }
}

impl HttpWorker {
    /// Counts a failed pair; settles none.
    fn fail(&self) -> u64 {
        self.errors.fetch_add(1, Ordering::Relaxed);
        0
    }
    /// A failed call: counted; a transport failure ends the run.
    fn failed(&self, e: ClientError) -> Result<u64, ClientError> {
        self.fail();
        if e.is_transport() { Err(e) } else { Ok(0) }
    }
}

/// The request every pair claims and settles.
fn inputs() -> Result<(ClaimRequest, Outcome), Failure> {
    let claim = ClaimRequest {
        fingerprint: "07".repeat(32),
        binding: Binding {
            principal: "bench".into(),
            scopes: vec!["pay".into()],
            generation: 0,
        },
        lease_ms: None,
        worker: None,
        marks_dispatch: false,
        retention_s: None,
        claim_id: None,
    };
    let result = RawValue::from_string(r#"{"ok":true}"#.into()).map_err(Failure::local)?;
    let outcome = Outcome {
        status: OutcomeStatus::Completed,
        result: Some(result),
        response_sha256: Some("65".repeat(32)),
        error: None,
    };
    Ok((claim, outcome))
}

/// How the bench reaches the server: the bearer token, and the PEM of a CA
/// to trust for an https:// URL.
#[derive(Clone, Copy, Default)]
pub struct Access<'a> {
    /// The tenant's token.
    pub token: Option<&'a str>,
    /// A CA certificate (PEM) to trust besides the system's roots.
    pub ca_pem: Option<&'a [u8]>,
}

/// One client on its own single keep-alive connection, connected (by a
/// health call) before the clock starts.
async fn connect(url: &str, access: Access<'_>) -> Result<Client, Failure> {
    let mut builder = Client::builder(url)
        .token(access.token.unwrap_or_default())
        .single_connection();
    if let Some(pem) = access.ca_pem {
        builder = builder.add_root_certificate_pem(pem);
    }
    let client = builder.build().map_err(Failure::usage)?;
    client.health().await.map_err(Failure::unreachable)?;
    Ok(client)
}

/// Runs the HTTP benchmark at `connections`; returns the stats and the
/// number of failed pairs.
pub async fn run(
    url: &str,
    access: Access<'_>,
    connections: usize,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<(PairStats, u64), Failure> {
    let run = super::run_id();
    let (claim, outcome) = inputs()?;
    let (claim, outcome) = (Arc::new(claim), Arc::new(outcome));
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(connections);
    for c in 0..connections.max(1) {
        workers.push(HttpWorker {
            client: connect(url, access).await?,
            prefix: format!("bench-{run}-{c}"),
            claim: claim.clone(),
            outcome: outcome.clone(),
            errors: errors.clone(),
        });
    }
    let stats = run_workers(workers, limit, progress)
        .await
        .map_err(Failure::unreachable)?;
    Ok((stats, errors.load(Ordering::Relaxed)))
}

/// One connection's loop with `POST /v1/batch`: one batch of `size` claims
/// on fresh keys, then one batch settling every key that may execute. Each
/// settled pair is timed with the two batches' latency.
struct BatchWorker {
    client: Client,
    prefix: String,
    size: usize,
    /// The claim's fields after `"key":…,` (the same for every call).
    claim_tail: Arc<str>,
    /// The settle's fields after the fence (the same for every call).
    settle_tail: Arc<str>,
    errors: Arc<AtomicU64>,
}

/// What the benchmark reads of a claim result.
#[derive(serde::Deserialize)]
struct Decision<'a> {
    decision: &'a str,
    fence: Option<u64>,
}

impl BatchWorker {
    async fn send(&self, body: String) -> Result<settle_client::Reply, ClientError> {
        let r = self
            .client
            .send_raw(
                settle_client::Method::POST,
                "/v1/batch",
                Some(settle_client::Bytes::from(body)),
            )
            .await?;
        if !r.is_success() {
            return Err(r.error().into());
        }
        Ok(r)
    }

    /// The answer's results, read in place.
    fn results<'a>(
        &self,
        r: &'a settle_client::Reply,
    ) -> Result<Vec<BatchResultRef<'a>>, ClientError> {
        serde_json::from_slice::<BatchResponseRef<'a>>(&r.body)
            .map(|b| b.results)
            .map_err(|e| ClientError::UnexpectedBody {
                status: r.status,
                reason: e.to_string(),
            })
    }
}

impl PairWorker for BatchWorker {
    type Error = ClientError;
    async fn call(&mut self, n: u64) -> Result<u64, ClientError> {
        // Keys are `{prefix}-{n}-{i}`: plain ASCII, no JSON escaping needed.
        // Written in place: no format! and its String per call.
        let key = |body: &mut String, i: usize| {
            body.push_str(&self.prefix);
            let _ = write!(body, "-{n}-{i}");
        };
        let mut body = String::with_capacity(16 + self.size * (self.claim_tail.len() + 64));
        body.push_str(r#"{"calls":["#);
        for i in 0..self.size {
            if i > 0 {
                body.push(',');
            }
            body.push_str(r#"{"op":"claim","key":""#);
            key(&mut body, i);
            body.push_str(r#"","#);
            body.push_str(&self.claim_tail);
            body.push('}');
        }
        body.push_str("]}");
        let reply = match self.send(body).await {
            Ok(r) => r,
            Err(e) => return self.failed(e, self.size),
        };
        let claims = match self.results(&reply) {
            Ok(r) => r,
            Err(e) => return self.failed(e, self.size),
        };
        let mut body = String::with_capacity(16 + self.size * (self.settle_tail.len() + 64));
        body.push_str(r#"{"calls":["#);
        let mut sent = 0;
        for (i, r) in claims.iter().enumerate() {
            if r.status != 200 {
                continue;
            }
            let fence = match serde_json::from_str::<Decision>(r.body.get()) {
                Ok(Decision {
                    decision: "execute",
                    fence: Some(f),
                }) => f,
                _ => continue,
            };
            if sent > 0 {
                body.push(',');
            }
            sent += 1;
            body.push_str(r#"{"op":"settle","key":""#);
            key(&mut body, i);
            let _ = write!(body, r#"","fence":{fence},"#);
            body.push_str(&self.settle_tail);
            body.push('}');
        }
        body.push_str("]}");
        let failed_claims = (self.size - sent) as u64;
        self.errors.fetch_add(failed_claims, Ordering::Relaxed);
        if sent == 0 {
            return Ok(0);
        }
        let reply = match self.send(body).await {
            Ok(r) => r,
            Err(e) => return self.failed(e, sent),
        };
        let settles = match self.results(&reply) {
            Ok(r) => r,
            Err(e) => return self.failed(e, sent),
        };
        let ok = settles.iter().filter(|r| r.status == 200).count() as u64;
        self.errors
            .fetch_add(settles.len() as u64 - ok, Ordering::Relaxed);
        Ok(ok)
    }
}

impl BatchWorker {
    /// A failed batch: its pairs are counted; a transport failure ends the run.
    fn failed(&self, e: ClientError, pairs: usize) -> Result<u64, ClientError> {
        self.errors.fetch_add(pairs as u64, Ordering::Relaxed);
        if e.is_transport() { Err(e) } else { Ok(0) }
    }
}

/// Runs the batch benchmark: `connections` connections, each sending
/// batches of `size` claims then `size` settlements; returns the stats
/// (per settled pair) and the number of failed pairs.
pub async fn run_batch(
    url: &str,
    access: Access<'_>,
    connections: usize,
    size: usize,
    limit: Limit,
    progress: Arc<AtomicU64>,
) -> Result<(PairStats, u64), Failure> {
    let run = super::run_id();
    let (claim, outcome) = inputs()?;
    let fields = |v: serde_json::Value| -> Result<String, Failure> {
        // `{"a":…,"b":…}` without its braces: the fields beside op and key.
        let s = serde_json::to_string(&v).map_err(Failure::local)?;
        Ok(s[1..s.len() - 1].to_string())
    };
    let claim_tail: Arc<str> =
        fields(serde_json::to_value(&claim).map_err(Failure::local)?)?.into();
    let settle_tail: Arc<str> = fields(serde_json::json!({
        "fingerprint": claim.fingerprint,
        "binding": claim.binding,
        "outcome": outcome,
    }))?
    .into();
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(connections);
    for c in 0..connections.max(1) {
        workers.push(BatchWorker {
            client: connect(url, access).await?,
            prefix: format!("bench-{run}-{c}"),
            size: size.max(1),
            claim_tail: claim_tail.clone(),
            settle_tail: settle_tail.clone(),
            errors: errors.clone(),
        });
    }
    let stats = run_workers(workers, limit, progress)
        .await
        .map_err(Failure::unreachable)?;
    Ok((stats, errors.load(Ordering::Relaxed)))
}
