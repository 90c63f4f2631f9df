//! Every call of SPEC §7 (and the batch of §10) as a value: method, path
//! and body, typed by its answer. [`crate::Client::call`] sends one and
//! reads the answer as that type; [`crate::Client::send`] sends one and
//! keeps the answer as received (what `settle --json` prints).

use std::fmt::Write as _;
use std::marker::PhantomData;

use hyper::Method;
use hyper::body::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use settle_api::{
    BatchRequest, BatchResponse, ClaimDecision, ClaimRequest, DispatchRequest, Dispatched,
    EmptyRequest, Health, HeartbeatRequest, LeaseInfo, ListResponse, PrincipalGeneration,
    ReceiptResponse, ReconcileRequest, ReconcileResponse, RecordView, ReleaseRequest, Released,
    Revoked, SettleRequest, Stats, WarnRequest, Warning, Warnings,
};

use crate::error::ClientError;
use crate::reply::Reply;

/// One call, ready to send; `T` is the type of its success answer.
#[derive(Debug, Clone)]
pub struct Call<T> {
    /// The HTTP method.
    pub method: Method,
    /// The path below the server URL, segments percent-encoded.
    pub path: String,
    /// The JSON body, if the call has one.
    pub body: Option<Bytes>,
    answer: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Call<T> {
    /// A call with an already encoded body.
    pub fn new(method: Method, path: String, body: Option<Bytes>) -> Call<T> {
        Call {
            method,
            path,
            body,
            answer: PhantomData,
        }
    }

    fn post(path: String, body: &impl Serialize) -> Result<Call<T>, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Request(e.to_string()))?;
        Ok(Call::new(Method::POST, path, Some(body.into())))
    }

    /// Reads the answer to this call.
    pub fn parse(&self, reply: &Reply) -> Result<T, ClientError> {
        reply.parse()
    }
}

/// `/v1/operations/{key}/claim`: reserve the key, ask to execute.
pub fn claim(key: &str, req: &ClaimRequest) -> Result<Call<ClaimDecision>, ClientError> {
    Call::post(operation_path(key, "claim"), req)
}

/// `/v1/operations/{key}/heartbeat`: extend the lease.
pub fn heartbeat(key: &str, req: &HeartbeatRequest) -> Result<Call<LeaseInfo>, ClientError> {
    Call::post(operation_path(key, "heartbeat"), req)
}

/// `/v1/operations/{key}/dispatch`: the remote write is about to start.
pub fn dispatch(key: &str, req: &DispatchRequest) -> Result<Call<Dispatched>, ClientError> {
    Call::post(operation_path(key, "dispatch"), req)
}

/// `/v1/operations/{key}/settle`: the outcome, and the lease released.
pub fn settle(key: &str, req: &SettleRequest) -> Result<Call<ReceiptResponse>, ClientError> {
    Call::post(operation_path(key, "settle"), req)
}

/// `/v1/operations/{key}/release`: the lease ended without a receipt.
pub fn release(key: &str, req: &ReleaseRequest) -> Result<Call<Released>, ClientError> {
    Call::post(operation_path(key, "release"), req)
}

/// `/v1/operations/{key}/reconcile`: what reconciliation found.
pub fn reconcile(
    key: &str,
    req: &ReconcileRequest,
) -> Result<Call<ReconcileResponse>, ClientError> {
    Call::post(operation_path(key, "reconcile"), req)
}

/// `GET /v1/operations/{key}`: the record.
pub fn get(key: &str) -> Call<RecordView> {
    Call::new(Method::GET, operation_path(key, ""), None)
}

/// `/v1/principals/{principal}/revoke`: raise the principal's generation.
pub fn revoke(principal: &str) -> Result<Call<Revoked>, ClientError> {
    let path = format!("/v1/principals/{}/revoke", encode_segment(principal));
    Call::post(path, &EmptyRequest {})
}

/// `GET /v1/principals/{principal}`: the principal's current generation.
pub fn principal(principal: &str) -> Call<PrincipalGeneration> {
    let path = format!("/v1/principals/{}", encode_segment(principal));
    Call::new(Method::GET, path, None)
}

/// `/v1/tasks/{task}/warnings/{class}`: record a bounded warning.
pub fn warn(task: &str, class: &str, req: &WarnRequest) -> Result<Call<Warning>, ClientError> {
    let path = format!(
        "/v1/tasks/{}/warnings/{}",
        encode_segment(task),
        encode_segment(class)
    );
    Call::post(path, req)
}

/// `GET /v1/tasks/{task}/warnings`: a task's warnings.
pub fn warnings(task: &str) -> Call<Warnings> {
    let path = format!("/v1/tasks/{}/warnings", encode_segment(task));
    Call::new(Method::GET, path, None)
}

/// `POST /v1/batch` (SPEC §10): many calls in one request, one result each.
pub fn batch(req: &BatchRequest) -> Result<Call<BatchResponse>, ClientError> {
    Call::post("/v1/batch".to_string(), req)
}

/// The query of `GET /v1/operations` (SPEC §9); `None` fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListParams {
    /// Statuses (`pending` includes `running`).
    pub status: Vec<String>,
    /// Records that do or do not require reconciliation.
    pub reconcile_required: Option<bool>,
    /// Disputed or undisputed records.
    pub disputed: Option<bool>,
    /// Stuck or not stuck records.
    pub stuck: Option<bool>,
    /// Records with or without quarantined evidence.
    pub quarantined: Option<bool>,
    /// Keys starting with this.
    pub key_prefix: Option<String>,
    /// `key` (default), `updated` or `attention` (SPEC §9).
    pub order: Option<String>,
    /// Page size, 1-1000.
    pub limit: Option<u32>,
    /// The previous page's `next`.
    pub after: Option<String>,
}

impl ListParams {
    /// The query string (without `?`), every value percent-encoded.
    pub fn query(&self) -> String {
        let mut q: Vec<String> = Vec::new();
        if !self.status.is_empty() {
            let s: Vec<String> = self.status.iter().map(|s| encode_segment(s)).collect();
            q.push(format!("status={}", s.join(",")));
        }
        for (name, v) in [
            ("reconcile_required", self.reconcile_required),
            ("disputed", self.disputed),
            ("stuck", self.stuck),
            ("quarantined", self.quarantined),
        ] {
            if let Some(v) = v {
                q.push(format!("{name}={v}"));
            }
        }
        if let Some(p) = &self.key_prefix {
            q.push(format!("key_prefix={}", encode_segment(p)));
        }
        if let Some(o) = &self.order {
            q.push(format!("order={}", encode_segment(o)));
        }
        if let Some(n) = self.limit {
            q.push(format!("limit={n}"));
        }
        if let Some(a) = &self.after {
            q.push(format!("after={}", encode_segment(a)));
        }
        q.join("&")
    }
}

/// `GET /v1/operations`: one page of the tenant's operations (SPEC §9).
pub fn list(params: &ListParams) -> Call<ListResponse> {
    let q = params.query();
    let path = if q.is_empty() {
        "/v1/operations".to_string()
    } else {
        format!("/v1/operations?{q}")
    };
    Call::new(Method::GET, path, None)
}

/// `GET /v1/stats`: the tenant's counts (SPEC §9).
pub fn stats() -> Call<Stats> {
    Call::new(Method::GET, "/v1/stats".into(), None)
}

/// `GET /healthz`: the process answers.
pub fn health() -> Call<Health> {
    Call::new(Method::GET, "/healthz".into(), None)
}

/// `GET /readyz`: the store answers too.
pub fn ready() -> Call<Health> {
    Call::new(Method::GET, "/readyz".into(), None)
}

/// Percent-encodes one path segment (everything but unreserved
/// characters), so that any key reaches the server as itself (SPEC §7).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `/v1/operations/{key}/{call}` (the record itself when `call` is empty).
pub fn operation_path(key: &str, call: &str) -> String {
    if call.is_empty() {
        format!("/v1/operations/{}", encode_segment(key))
    } else {
        format!("/v1/operations/{}/{call}", encode_segment(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries_are_encoded() {
        assert_eq!(list(&ListParams::default()).path, "/v1/operations");
        let p = ListParams {
            status: vec!["pending".into(), "unknown".into()],
            stuck: Some(true),
            key_prefix: Some("a&b".into()),
            limit: Some(5),
            after: Some("6b".into()),
            ..ListParams::default()
        };
        assert_eq!(
            list(&p).path,
            "/v1/operations?status=pending,unknown&stuck=true&key_prefix=a%26b&limit=5&after=6b"
        );
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("order-1"), "order-1");
        assert_eq!(encode_segment("a/b#c%d?"), "a%2Fb%23c%25d%3F");
        assert_eq!(operation_path("k 1", "claim"), "/v1/operations/k%201/claim");
        assert_eq!(get("a/b").path, "/v1/operations/a%2Fb");
        assert_eq!(
            warn("t", "c/1", &WarnRequest::default()).unwrap().path,
            "/v1/tasks/t/warnings/c%2F1"
        );
    }
}
