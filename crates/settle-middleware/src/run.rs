//! One request's run through SPEC §8's table: the key and the principal,
//! the claim (waiting out a duplicate in flight with the route's `wait`),
//! the reconcile hook on a `reconcile` lease, then dispatch and the handler
//! beside its heartbeats, with panics, timeouts and errors caught; what it
//! leaves behind is recorded by `capture.rs`.

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
use tower::Service;

use crate::answer::{note, problem, refuse, replay};
use crate::backend::{CallError, call, heartbeat, retry};
use crate::capture::{Read, Unsettled, read_up_to, stored_outcome};
use crate::layer::{BoxError, IDEMPOTENCY_KEY, Resolution, Settings};
use crate::layout::{self, FingerprintInput, StoredResponse};
use crate::principal::Identity;
use crate::table::{self, AfterClaim, Arrival, Disposition, LedgerFailure, Problem, RoutePolicy};

/// One request's run.
pub(crate) struct Run<S> {
    pub(crate) settings: Arc<Settings>,
    pub(crate) inner: S,
}

/// The request as claimed.
struct Claimed {
    key: String,
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
        let s = &self.settings;
        let principal = c.binding.principal.as_str();
        let worker = Text::new(
            "worker",
            format!("idempotency-key={} principal={principal}", c.key),
        )
        .ok();
        let claim = settle_core::Claim {
            key: c.lkey.clone(),
            fingerprint: c.fingerprint,
            binding: c.binding.clone(),
            lease_ms: s.lease_ms,
            worker,
            marks_dispatch: true,
            retention_s: s.retention_s,
            claim_id: None,
        };
        // With the route's `wait`, a duplicate claims again until the
        // first request's outcome arrives or the wait is over.
        let until = policy.wait.map(|w| Instant::now() + w);
        let mut answer = call(&*s.backend, Command::Claim(claim.clone())).await;
        loop {
            return match table::after_claim(answer, s.unavailable_retry_after_s) {
                AfterClaim::Execute(g) => self.execute(policy, c, g).await,
                AfterClaim::Reconcile(g) => match reconcile(&self.settings, &c, g).await {
                    Reconciled::Execute(g) => self.execute(policy, c, g).await,
                    Reconciled::Replay(stored) => Ok(replay(stored, &c.key)),
                    Reconciled::Unknown => Ok(refuse(&table::OUTCOME_UNKNOWN, Some(&c.key))),
                },
                AfterClaim::Replay(stored) => Ok(replay(stored, &c.key)),
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
                    answer = call(&*s.backend, Command::Claim(claim.clone())).await;
                    continue;
                }
                AfterClaim::Refuse(p) => Ok(refuse(&p, Some(&c.key))),
                AfterClaim::Unavailable(why) => {
                    self.unavailable(&policy, (c.parts, c.body), why).await
                }
            };
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
        // A lost answer is retried under the same fence (dispatch is
        // idempotent), for half the lease: the other half is left to hand
        // the lease back if the ledger stays silent.
        let half_lease = Duration::from_millis(s.lease_ms.get() / 2);
        if let Err(e) = retry(&s.backend, dispatch, half_lease).await {
            // The handler never ran. Hand the lease back: `not_dispatched`
            // while no dispatch is recorded; if one was (its answer lost),
            // `not_committed`, which is true: nothing was applied.
            let release = |reason| {
                Command::Release(Release {
                    key: c.lkey.clone(),
                    fence: g.fence,
                    reason,
                    forget: false,
                })
            };
            if let Err(CallError::Refused(RefusalCode::ReceiptRequired)) =
                call(&*s.backend, release(ReleaseReason::NotDispatched)).await
            {
                let _ = call(&*s.backend, release(ReleaseReason::NotCommitted)).await;
            }
            return match table::ledger_failure(&e, s.unavailable_retry_after_s) {
                LedgerFailure::Unreachable(why) => {
                    self.unavailable(&policy, (c.parts, c.body), why).await
                }
                LedgerFailure::Refused(p) => Ok(refuse(&p, Some(&c.key))),
            };
        }
        let mut pending = Unsettled::armed(
            s.clone(),
            c.key.clone(),
            c.lkey.clone(),
            g.fence,
            c.fingerprint,
            c.binding.clone(),
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
}

/// What reporting the hook's finding led to.
enum Reconciled {
    /// `not_committed`: the same fence, now an execute lease.
    Execute(Grant),
    /// `committed`: the hook's response, settled; replay it.
    Replay(StoredResponse),
    /// `unavailable` (or the report failed): 409 `outcome_unknown`.
    Unknown,
}

/// A `reconcile` lease: the hook's finding, reported.
async fn reconcile(s: &Settings, c: &Claimed, g: Grant) -> Reconciled {
    let resolution = match &s.reconcile {
        Some(hook) => {
            match AssertUnwindSafe(hook(c.lkey.as_str(), g.fence, &c.parts))
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => {
                    tracing::error!(key = c.key, "idempotency: the reconcile hook panicked");
                    Resolution::Unavailable
                }
            }
        }
        None => Resolution::Unavailable,
    };
    let mut stored = None;
    let finding = match resolution {
        Resolution::Committed(r) => {
            let (result, digest) = layout::encode_response(
                r.status,
                &r.headers,
                &r.body,
                &s.stored_headers,
                s.max_stored_body,
            );
            let d = match table::disposition(r.status, false) {
                Disposition::Failed => Disposition::Failed,
                _ => Disposition::Completed,
            };
            let committed = stored_outcome(d, &result, &digest)
                .and_then(|o| Finding::committed(c.fingerprint, c.binding.clone(), o));
            match committed {
                Ok(f) => {
                    stored = layout::decode_response(&result);
                    f
                }
                Err(e) => {
                    tracing::error!(key = c.key, error = %e, "idempotency: the hook's response cannot be stored");
                    Finding::Unavailable
                }
            }
        }
        Resolution::NotCommitted => Finding::NotCommitted,
        Resolution::Unavailable => Finding::Unavailable,
    };
    let cmd = Command::Reconcile(Reconcile {
        key: c.lkey.clone(),
        fence: g.fence,
        finding,
    });
    match call(&*s.backend, cmd).await {
        Ok(Reply::Claim(ClaimDecision::Execute(g))) => Reconciled::Execute(g),
        Ok(Reply::Receipt(_)) => match stored {
            Some(st) if st.body.is_some() => Reconciled::Replay(st),
            _ => Reconciled::Unknown,
        },
        Ok(_) => Reconciled::Unknown,
        Err(e) => {
            tracing::warn!(key = c.key, error = %e, "idempotency: reconcile got no answer");
            Reconciled::Unknown
        }
    }
}
