//! `settle bench --url`: `connections` keep-alive connections, each looping
//! claim (fresh key) + settle `completed` through the generic pair loop,
//! with the typed client (one dedicated connection per worker).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;
use settle_client::api::{
    Binding, ClaimDecision, ClaimRequest, Outcome, OutcomeStatus, SettleRequest,
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

/// Runs the HTTP benchmark at `connections`; returns the stats and the
/// number of failed pairs.
pub async fn run(
    url: &str,
    token: Option<&str>,
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
        let client = Client::builder(url)
            .token(token.unwrap_or_default())
            .single_connection()
            .build()
            .map_err(Failure::usage)?;
        // Connect before the clock starts.
        client.health().await.map_err(Failure::unreachable)?;
        workers.push(HttpWorker {
            client,
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
