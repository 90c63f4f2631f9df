//! One request's run through SPEC §8's table: the key and the principal,
//! the claim (a lost answer retried with the same `claim_id`, waiting out a
//! duplicate in flight with the route's `wait`), the reconcile hook on a
//! `reconcile` lease, then dispatch and the handler beside its heartbeats,
//! with panics, timeouts and errors caught; what it leaves behind is
//! recorded by `capture.rs`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{CONTENT_TYPE, HeaderValue};
use axum::http::request::Parts;
use axum::http::{Method, Request, Response};
use futures::FutureExt as _;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use settle_core::{
    Binding, ClaimDecision, Command, Digest, Dispatch, Finding, Grant, Key, Principal, Reconcile,
    RefusalCode, Release, ReleaseReason, Reply, Scopes, Text,
};
use settle_worker::new_claim_id;
use tower::Service;

use crate::answer::{note, problem, refuse, replay, replay_hooked};
use crate::backend::{CallError, heartbeat, retry};
use crate::capture::{Read, Unsettled, read_up_to, stored_outcome};
use crate::handler::EffectNotSent;
use crate::layer::{
    BoxError, IDEMPOTENCY_KEY, ReconcileFn, ReconcileRequest, Resolution, Settings,
};
use crate::layout::{self, FingerprintInput, StoredResponse};
use crate::principal::Identity;
use crate::table::{
    self, AfterClaim, Arrival, Disposition, LedgerFailure, Problem, ReleaseOn, RoutePolicy,
};

/// One request's run.
pub(crate) struct Run<S> {
    pub(crate) settings: Arc<Settings>,
    pub(crate) inner: S,
}

/// The request as claimed.
struct Claimed {
    key: String,
    /// The principal the extractor gave (the binding holds its key-syntax form).
    principal: String,
    lkey: Key,
    fingerprint: Digest,
    binding: Binding,
    parts: Parts,
    body: Bytes,
}

/// What the handler left behind.
enum Handled<E> {
    Response(axum::http::response::Parts, Bytes),
    /// A body past the stored limit: what was read, and the rest, unread.
    Streamed(axum::http::response::Parts, Bytes, Body),
    /// A panic, a timeout, a body that broke: the outcome is unknown.
    Failed(&'static str),
    /// The handler said nothing was done ([`EffectNotSent`]).
    NotSent,
    /// The inner service returned an error (it goes up unchanged).
    Error(E),
}

impl<S, RB> Run<S>
where
    S: Service<Request<Body>, Response = Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    RB: HttpBody<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    pub(crate) async fn request<B>(self, req: Request<B>) -> Result<Response<Body>, S::Error>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let policy = self.policy(req.method(), req.uri().path());
        let lines: Vec<&[u8]> = req
            .headers()
            .get_all(&IDEMPOTENCY_KEY)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let key = match table::arrival(policy.as_ref(), &lines) {
            Arrival::Unwrapped => return self.pass(req.map(Body::new)).await,
            Arrival::Refuse(p) => return Ok(refuse(&p, None)),
            Arrival::Wrapped { key } => key,
        };
        let policy = policy.expect("a wrapped request has a policy");
        let (parts, body) = req.into_parts();
        let Some(identity) = (self.settings.principal)(&parts) else {
            return Ok(refuse(&table::PRINCIPAL_MISSING, Some(&key)));
        };
        let body = match Limited::new(body, self.settings.max_request_body)
            .collect()
            .await
        {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Ok(refuse(&table::PAYLOAD_TOO_LARGE, Some(&key)));
            }
            Err(e) => {
                // The client went away (or sent a broken body) before its
                // request arrived: nothing was claimed.
                tracing::debug!(key, error = %e, "idempotency: the request body could not be read");
                return Ok(problem(&Problem {
                    status: 400,
                    code: "bad_request",
                    detail: "the request body could not be read",
                    retry_after: None,
                }));
            }
        };
        let claimed = match self.claimed(key, &identity, parts, body) {
            Ok(c) => c,
            Err((c, why)) => return self.unavailable(&policy, c, why).await,
        };
        self.claim(policy, claimed).await
    }

    fn policy(&self, method: &Method, path: &str) -> Option<RoutePolicy> {
        let s = &self.settings;
        match &s.routes {
            Some(f) => f(method, path).map(|mut p| {
                p.timeout = p.timeout.or(s.policy.timeout);
                p.wait = p.wait.or(s.policy.wait);
                p.release_on = p.release_on.or(s.policy.release_on);
                p
            }),
            None => s.methods.contains(method).then_some(s.policy),
        }
    }

    async fn pass(mut self, req: Request<Body>) -> Result<Response<Body>, S::Error> {
        Ok(self.inner.call(req).await?.map(Body::new))
    }

    /// The ledger key, fingerprint and binding of a request (SPEC §8
    /// scope); `Err` when the ledger types refuse them (cannot happen with
    /// the layouts, but fails closed if it does).
    #[allow(clippy::result_large_err)]
    fn claimed(
        &self,
        key: String,
        identity: &Identity,
        parts: Parts,
        body: Bytes,
    ) -> Result<Claimed, ((Parts, Bytes), String)> {
        let s = &self.settings;
        let principal = &identity.principal;
        let target = match parts.uri.query() {
            Some(q) if !q.is_empty() => format!("{}?{q}", parts.uri.path()),
            _ => parts.uri.path().to_string(),
        };
        let fp_headers: Vec<(String, Vec<u8>)> = s
            .fingerprint_headers
            .iter()
            .map(|n| {
                let lines: Vec<&[u8]> = parts
                    .headers
                    .get_all(n.as_str())
                    .iter()
                    .map(HeaderValue::as_bytes)
                    .collect();
                (n.clone(), lines.join(&b", "[..]))
            })
            .collect();
        let input = FingerprintInput {
            method: parts.method.as_str(),
            target: &target,
            content_type: parts
                .headers
                .get(CONTENT_TYPE)
                .map_or(&b""[..], HeaderValue::as_bytes),
            body: &body,
            headers: &fp_headers,
        };
        let fp = match s.canonical.as_deref() {
            Some(f) => layout::request_fingerprint(input, Some(f as layout::Canonicalize<'_>)),
            None => layout::request_fingerprint_with(input, &s.fingerprint),
        };
        let built = (|| {
            Ok::<_, settle_core::InvalidInput>((
                Key::new(layout::ledger_key(&s.namespace, principal, &key))?,
                Digest::parse("fingerprint", &fp)?,
                Binding {
                    principal: Principal::new(layout::binding_principal(principal))?,
                    scopes: Scopes::new(Vec::new())?,
                    generation: identity.generation,
                },
            ))
        })();
        match built {
            Ok((lkey, fingerprint, binding)) => Ok(Claimed {
                key,
                principal: principal.clone(),
                lkey,
                fingerprint,
                binding,
                parts,
                body,
            }),
            Err(e) => Err(((parts, body), e.to_string())),
        }
    }

    async fn claim(self, policy: RoutePolicy, c: Claimed) -> Result<Response<Body>, S::Error> {
        let s = self.settings.clone();
        let mut claim = settle_core::Claim {
            key: c.lkey.clone(),
            fingerprint: c.fingerprint,
            binding: c.binding.clone(),
            lease_ms: s.lease_ms,
            // SPEC §8: the client's key and principal, for operators and a
            // Reconciler's middleware hook.
            worker: Text::new("worker", layout::worker_label(&c.key, &c.principal)).ok(),
            marks_dispatch: true,
            retention_s: s.retention_s,
            claim_id: None,
        };
        // With the route's `wait`, a duplicate claims again until the
        // first request's outcome arrives or the wait is over.
        let until = policy.wait.map(|w| Instant::now() + w);
        // Once a request with the key is known to be running: the answer
        // when the wait ends, also when a claim fails meanwhile.
        let mut in_progress: Option<Problem> = None;
        loop {
            // A new claim, a new id; a lost answer is retried with it and
            // answered with the lease it was granted (rule 5a).
            claim.claim_id = Some(new_claim_id());
            let budget = match (&in_progress, until) {
                (Some(_), Some(u)) => s
                    .ledger_deadline
                    .min(u.saturating_duration_since(Instant::now())),
                _ => s.ledger_deadline,
            };
            let answer = retry(&s.backend, Command::Claim(claim.clone()), budget).await;
            let after = table::after_claim(answer, s.unavailable_retry_after_s);
            if let Some(p) = &in_progress
                && Self::claim_failed(&after)
            {
                // Never fail open (nor answer 503) while the first request
                // runs: the client is told to come back, as it was.
                tracing::warn!(
                    key = c.key,
                    "idempotency: a claim failed while waiting for a request in progress"
                );
                return Ok(refuse(p, Some(&c.key)));
            }
            return match after {
                AfterClaim::Execute(g) => self.execute(policy, c, g).await,
                AfterClaim::Reconcile(g) => match reconcile(&s, &c, g).await {
                    Reconciled::Execute(g) => self.execute(policy, c, g).await,
                    Reconciled::Replay(stored) => Ok(replay(stored, &c.key)),
                    Reconciled::Unknown => Ok(refuse(&table::OUTCOME_UNKNOWN, Some(&c.key))),
                },
                AfterClaim::Replay(stored, receipt) => Ok(replay_hooked(
                    s.on_replay.as_ref(),
                    stored,
                    &receipt,
                    &c.key,
                )),
                AfterClaim::InFlight {
                    retry_after_ms,
                    problem,
                } => {
                    let left = until.map_or(Duration::ZERO, |u| {
                        u.saturating_duration_since(Instant::now())
                    });
                    if left.is_zero() {
                        return Ok(refuse(&problem, Some(&c.key)));
                    }
                    note("waited");
                    tokio::time::sleep(Duration::from_millis(retry_after_ms).min(left)).await;
                    in_progress = Some(problem);
                    continue;
                }
                AfterClaim::Refuse(p) => Ok(refuse(&p, Some(&c.key))),
                AfterClaim::Unavailable(why) => {
                    self.unavailable(&policy, (c.parts, c.body), why).await
                }
            };
        }
    }

    /// A claim that could not be answered: the ledger unreachable or
    /// unavailable (a 503, a 429, a record it refuses for now).
    fn claim_failed(after: &AfterClaim) -> bool {
        match after {
            AfterClaim::Unavailable(_) => true,
            AfterClaim::Refuse(p) => p.code == "idempotency_unavailable",
            _ => false,
        }
    }

    async fn unavailable(
        self,
        policy: &RoutePolicy,
        (parts, body): (Parts, Bytes),
        why: String,
    ) -> Result<Response<Body>, S::Error> {
        let s = &self.settings;
        if policy.fail_open {
            note("fail_open");
            tracing::warn!(
                error = why,
                path = parts.uri.path(),
                "idempotency: ledger unreachable; the request runs WITHOUT idempotency (fail_open)"
            );
            return self
                .pass(Request::from_parts(parts, Body::from(body)))
                .await;
        }
        tracing::warn!(
            error = why,
            path = parts.uri.path(),
            "idempotency: ledger unreachable"
        );
        Ok(refuse(
            &table::unavailable(s.unavailable_retry_after_s),
            None,
        ))
    }

    async fn execute(
        mut self,
        policy: RoutePolicy,
        c: Claimed,
        g: Grant,
    ) -> Result<Response<Body>, S::Error> {
        let s = self.settings.clone();
        let dispatch = Command::Dispatch(Dispatch {
            key: c.lkey.clone(),
            fence: g.fence,
        });
        // A lost answer is retried under the same fence (a repeated
        // dispatch is answered 200), for the ledger deadline and at most
        // half the lease: the rest is left to hand the lease back.
        let half_lease = Duration::from_millis(s.lease_ms.get() / 2);
        if let Err(e) = retry(&s.backend, dispatch, s.ledger_deadline.min(half_lease)).await {
            return self.dispatch_failed(&policy, c, g, e).await;
        }
        let release_on = policy.release_on.unwrap_or_default();
        let mut pending = Unsettled::armed(
            s.clone(),
            c.key.clone(),
            c.lkey.clone(),
            g.fence,
            c.fingerprint,
            c.binding.clone(),
            release_on,
        );
        note("executed");
        let req = Request::from_parts(c.parts, Body::from(c.body));
        // A service may panic in `call` itself, before any future exists.
        let handler = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(f) => f,
            Err(_) => {
                pending.unknown("panic").await;
                return Ok(refuse(&table::HANDLER_FAILED, Some(&c.key)));
            }
        };
        let max_stored = s.max_stored_body;
        let handled = {
            let run = async {
                match handler.await {
                    Ok(resp) if resp.extensions().get::<EffectNotSent>().is_some() => {
                        Handled::NotSent
                    }
                    Ok(resp) => {
                        let (parts, body) = resp.into_parts();
                        match read_up_to(body, max_stored).await {
                            Ok(Read::Whole(b)) => Handled::Response(parts, b),
                            Ok(Read::Over(prefix, rest)) => Handled::Streamed(parts, prefix, rest),
                            Err(_) => Handled::Failed("response body failed"),
                        }
                    }
                    Err(e) => Handled::Error(e),
                }
            };
            let caught = AssertUnwindSafe(run).catch_unwind();
            let timed = async {
                match policy.timeout {
                    Some(t) => tokio::time::timeout(t, caught)
                        .await
                        .unwrap_or(Ok(Handled::Failed("timeout"))),
                    None => caught.await,
                }
            };
            tokio::select! {
                r = timed => r.unwrap_or(Handled::Failed("panic")),
                never = heartbeat(s.backend.clone(), c.lkey.clone(), g.fence, s.lease_ms) => match never {},
            }
        };
        match handled {
            Handled::Response(parts, body) => Ok(pending.finish(parts, body).await),
            Handled::Streamed(parts, prefix, rest) => Ok(pending.stream(parts, prefix, rest).await),
            Handled::NotSent => Ok(pending.not_sent().await),
            Handled::Failed(why) => {
                pending.unknown(why).await;
                Ok(refuse(&table::HANDLER_FAILED, Some(&c.key)))
            }
            Handled::Error(e) => {
                pending.unknown("service error").await;
                Err(e)
            }
        }
    }

    /// The dispatch mark before the handler failed; the handler never ran
    /// (SPEC §11.11 dispatch rows). The lease is handed back with
    /// `release(not_dispatched)` and the ledger decides: released → 503
    /// (or the route's fail-open, when the ledger was merely unreachable);
    /// `receipt_required` (the mark was recorded, its answers lost) → the
    /// middleware does not attest on its own inference: settle `unknown`,
    /// 500 `outcome_unknown`. A refused dispatch (`lease_expired`,
    /// `stale_fence`: the lease is gone) → 503.
    async fn dispatch_failed(
        self,
        policy: &RoutePolicy,
        c: Claimed,
        g: Grant,
        e: CallError,
    ) -> Result<Response<Body>, S::Error> {
        let s = self.settings.clone();
        let gone = matches!(
            e,
            CallError::Refused(
                RefusalCode::LeaseExpired | RefusalCode::StaleFence | RefusalCode::WrongPurpose
            )
        );
        if !gone {
            let release = Command::Release(Release {
                key: c.lkey.clone(),
                fence: g.fence,
                reason: ReleaseReason::NotDispatched,
                forget: false,
            });
            let cleanup = Duration::from_millis(s.lease_ms.get());
            match retry(&s.backend, release, cleanup).await {
                Ok(_) => {}
                Err(CallError::Refused(RefusalCode::ReceiptRequired)) => {
                    let mut pending = Unsettled::armed(
                        s.clone(),
                        c.key.clone(),
                        c.lkey.clone(),
                        g.fence,
                        c.fingerprint,
                        c.binding.clone(),
                        ReleaseOn::default(),
                    );
                    pending
                        .unknown("the dispatch mark was recorded; its answers were lost")
                        .await;
                    return Ok(refuse(&table::HANDLER_FAILED, Some(&c.key)));
                }
                Err(e) => {
                    // The lease lapses as the ledger holds it; never fail
                    // open while it may still be held.
                    tracing::warn!(key = c.key, error = %e, "idempotency: the lease could not be handed back after a failed dispatch");
                    return Ok(refuse(
                        &table::unavailable(s.unavailable_retry_after_s),
                        Some(&c.key),
                    ));
                }
            }
        }
        match table::ledger_failure(&e, s.unavailable_retry_after_s) {
            LedgerFailure::Unreachable(why) if !gone => {
                self.unavailable(policy, (c.parts, c.body), why).await
            }
            LedgerFailure::Unreachable(_) => Ok(refuse(
                &table::unavailable(s.unavailable_retry_after_s),
                Some(&c.key),
            )),
            LedgerFailure::Refused(p) => Ok(refuse(&p, Some(&c.key))),
        }
    }
}

/// What reporting the hook's finding led to.
enum Reconciled {
    /// `not_committed`: the same fence, now an execute lease.
    Execute(Grant),
    /// `committed`: the hook's response, settled; answer it as a replay
    /// (its whole body, also when only its digest was stored).
    Replay(StoredResponse),
    /// `unavailable`, the hook failed, or the report failed: 409
    /// `outcome_unknown`.
    Unknown,
}

/// Asks the hook, isolated and bounded: a panic (when called or while it
/// runs), an error or no answer within `timeout` is an error.
async fn ask_hook(
    hook: &ReconcileFn,
    req: ReconcileRequest,
    timeout: Duration,
) -> Result<Resolution, BoxError> {
    let asked = match std::panic::catch_unwind(AssertUnwindSafe(|| hook(req))) {
        Ok(f) => f,
        Err(_) => return Err("the reconcile hook panicked".into()),
    };
    match tokio::time::timeout(timeout, AssertUnwindSafe(asked).catch_unwind()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err("the reconcile hook panicked".into()),
        Err(_) => Err(format!(
            "the reconcile hook did not answer within its hook_timeout ({} ms)",
            timeout.as_millis()
        )
        .into()),
    }
}

/// A `reconcile` lease (SPEC §8): the hook gets the whole retried request
/// with the client's key and principal, under heartbeats and bounded by
/// `hook_timeout`; its finding is reported (a lost answer retried).
async fn reconcile(s: &Arc<Settings>, c: &Claimed, g: Grant) -> Reconciled {
    let lease = Duration::from_millis(s.lease_ms.get());
    let resolution = match &s.reconcile {
        None => Resolution::Unavailable,
        Some(hook) => {
            let req = ReconcileRequest {
                ledger_key: c.lkey.as_str().to_string(),
                fence: g.fence,
                method: c.parts.method.clone(),
                uri: c.parts.uri.clone(),
                headers: c.parts.headers.clone(),
                body: c.body.clone(),
                idempotency_key: c.key.clone(),
                principal: c.principal.clone(),
            };
            let asked = ask_hook(hook, req, s.hook_timeout.unwrap_or(lease));
            let found = tokio::select! {
                biased;
                r = asked => r,
                never = heartbeat(s.backend.clone(), c.lkey.clone(), g.fence, s.lease_ms) => match never {},
            };
            found.unwrap_or_else(|e| {
                tracing::error!(key = c.key, error = %e, "idempotency: the reconcile hook failed; the outcome stays unknown");
                Resolution::Unavailable
            })
        }
    };
    let mut answer = None;
    let finding = match resolution {
        Resolution::Committed(r) => match committed(s, c, &r) {
            Ok((f, stored)) => {
                answer = Some(stored);
                f
            }
            Err(e) => {
                tracing::error!(key = c.key, error = %e, "idempotency: the hook's response cannot be stored");
                Finding::Unavailable
            }
        },
        Resolution::NotCommitted => Finding::NotCommitted,
        Resolution::Unavailable => Finding::Unavailable,
    };
    let cmd = Command::Reconcile(Reconcile {
        key: c.lkey.clone(),
        fence: g.fence,
        finding,
    });
    match retry(&s.backend, cmd, lease).await {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => Reconciled::Execute(g),
        Ok(Reply::Receipt(_)) => answer.map_or(Reconciled::Unknown, Reconciled::Replay),
        Ok(_) => Reconciled::Unknown,
        Err(e) => {
            tracing::warn!(key = c.key, error = %e, "idempotency: reconcile got no answer");
            Reconciled::Unknown
        }
    }
}

/// The hook's response as a `committed` finding, stored as a handler's
/// (over `max_stored_body`: its digest), and the answer to this request:
/// the stored headers and the hook's whole body.
fn committed(
    s: &Settings,
    c: &Claimed,
    r: &crate::layer::HookResponse,
) -> Result<(Finding, StoredResponse), settle_core::InvalidInput> {
    let (result, digest) = layout::encode_response(
        r.status,
        &r.headers,
        &r.body,
        &s.stored_headers,
        s.max_stored_body,
    );
    // A hook reports what happened: a status that would be released for a
    // handler's response is stored like any other.
    let d = match table::disposition(r.status, false, &ReleaseOn::none()) {
        Disposition::Failed => Disposition::Failed,
        _ => Disposition::Completed,
    };
    let finding = Finding::committed(
        c.fingerprint,
        c.binding.clone(),
        stored_outcome(d, &result, &digest)?,
    )?;
    let headers = layout::decode_response(&result).map_or_else(Vec::new, |st| st.headers);
    Ok((
        finding,
        StoredResponse {
            status: r.status,
            headers,
            body: Some(r.body.to_vec()),
        },
    ))
}
