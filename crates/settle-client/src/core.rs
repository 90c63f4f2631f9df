//! The core's commands over HTTP: [`Client::execute`] takes the same
//! `settle_core::Command` as `Ledger::execute` and answers the same
//! `settle_core::Reply`, so a worker (SPEC §11) runs unchanged over the
//! in-process ledger or a remote server. The wire types of `settle-api`
//! do the conversions both ways.

use hyper::Method;
use hyper::body::Bytes;
use settle_api::{
    BatchOp, ClaimRequest, DispatchRequest, HeartbeatRequest, ReconcileRequest, ReconcileResponse,
    ReleaseRequest, SettleRequest, WarnRequest,
};
use settle_core::{self as core, Command, Fence, InvalidInput, Reply};

use crate::call::{self, Call};
use crate::client::Client;
use crate::error::ClientError;

/// A command as one request: the single call, and the operation and key
/// that make it an entry of a §10 batch (`None` for revoke and warn, which
/// a batch cannot carry).
struct Wire {
    method: Method,
    path: String,
    body: Option<Bytes>,
    batch: Option<(BatchOp, String)>,
}

impl Wire {
    fn new<T>(c: Call<T>, batch: Option<(BatchOp, String)>) -> Wire {
        Wire {
            method: c.method,
            path: c.path,
            body: c.body,
            batch,
        }
    }
}

/// The same body as an entry of a batch.
fn keyed(op: BatchOp, key: &core::Key) -> Option<(BatchOp, String)> {
    Some((op, key.as_str().to_string()))
}

/// Appends `{"op":…,"key":…,<the single call's body fields>}` to a batch
/// body. Spliced as text, not rebuilt through `serde_json::Value`, so that
/// a result keeps its exact spelling (numbers beyond a double, as sent),
/// as the single call keeps it.
fn push_entry(out: &mut Vec<u8>, op: BatchOp, key: &str, body: &[u8]) -> Result<(), ClientError> {
    let json = |e: serde_json::Error| ClientError::Request(e.to_string());
    out.extend_from_slice(b"{\"op\":");
    serde_json::to_writer(&mut *out, &op).map_err(json)?;
    out.extend_from_slice(b",\"key\":");
    serde_json::to_writer(&mut *out, key).map_err(json)?;
    // The body is a serialized request struct: `{…}`, no whitespace around.
    debug_assert!(body.first() == Some(&b'{') && body.last() == Some(&b'}'));
    let fields = &body[1..body.len().saturating_sub(1).max(1)];
    if !fields.is_empty() {
        out.push(b',');
        out.extend_from_slice(fields);
    }
    out.push(b'}');
    Ok(())
}

/// How `cmd` goes over the wire.
fn wire(cmd: &Command) -> Result<Wire, ClientError> {
    Ok(match cmd {
        Command::Claim(c) => {
            let req = ClaimRequest::from(c);
            Wire::new(
                call::claim(c.key.as_str(), &req)?,
                keyed(BatchOp::Claim, &c.key),
            )
        }
        Command::Heartbeat(h) => {
            let req = HeartbeatRequest::from(h);
            Wire::new(
                call::heartbeat(h.key.as_str(), &req)?,
                keyed(BatchOp::Heartbeat, &h.key),
            )
        }
        Command::Dispatch(d) => {
            let req = DispatchRequest::from(d);
            Wire::new(
                call::dispatch(d.key.as_str(), &req)?,
                keyed(BatchOp::Dispatch, &d.key),
            )
        }
        Command::Settle(s) => {
            let req = SettleRequest::from(s);
            Wire::new(
                call::settle(s.key.as_str(), &req)?,
                keyed(BatchOp::Settle, &s.key),
            )
        }
        Command::Release(r) => {
            let req = ReleaseRequest::from(r);
            Wire::new(
                call::release(r.key.as_str(), &req)?,
                keyed(BatchOp::Release, &r.key),
            )
        }
        Command::Reconcile(r) => {
            let req = ReconcileRequest::from(r);
            Wire::new(
                call::reconcile(r.key.as_str(), &req)?,
                keyed(BatchOp::Reconcile, &r.key),
            )
        }
        Command::Revoke(r) => Wire::new(call::revoke(r.principal.as_str())?, None),
        Command::Warn(w) => Wire::new(
            call::warn(w.task.as_str(), w.class.as_str(), &WarnRequest::from(w))?,
            None,
        ),
        Command::Expire { .. } | Command::Collect { .. } => {
            return Err(ClientError::Request(
                "expire and collect are the server's own housekeeping, not API calls".into(),
            ));
        }
    })
}

/// Reads the answer to `cmd` as the core's reply. As with
/// `Ledger::execute`, protocol refusals and invalid input are replies.
fn read(cmd: &Command, r: &crate::Reply) -> Result<Reply, ClientError> {
    match read_success(cmd, r) {
        Err(e) => {
            if let Some(code) = e.refusal() {
                Ok(Reply::Refused(code))
            } else if let Some(invalid) = e.invalid_input() {
                Ok(Reply::Invalid(invalid))
            } else {
                Err(e)
            }
        }
        ok => ok,
    }
}

fn read_success(cmd: &Command, r: &crate::Reply) -> Result<Reply, ClientError> {
    Ok(match cmd {
        Command::Claim(_) => {
            Reply::Claim(answer(r.parse::<settle_api::ClaimDecision>()?.try_into())?)
        }
        Command::Heartbeat(_) => Reply::Heartbeat(r.parse::<settle_api::LeaseInfo>()?.into()),
        Command::Dispatch(_) => {
            let l = r.parse::<settle_api::Dispatched>()?;
            Reply::Dispatched(core::LeaseInfo {
                fence: Fence(l.fence),
                lease_expires_at: l.lease_expires_at.into(),
            })
        }
        Command::Settle(_) => Reply::Receipt(answer(
            r.parse::<settle_api::ReceiptResponse>()?.receipt.try_into(),
        )?),
        Command::Release(_) => Reply::Released {
            fence: Fence(r.parse::<settle_api::Released>()?.fence),
        },
        Command::Reconcile(_) => match r.parse::<ReconcileResponse>()? {
            ReconcileResponse::Execute(d) => Reply::Claim(answer(d.try_into())?),
            ReconcileResponse::Receipt(rc) => Reply::Receipt(answer(rc.receipt.try_into())?),
            ReconcileResponse::Released(rl) => Reply::Released {
                fence: Fence(rl.fence),
            },
        },
        Command::Revoke(_) => {
            let v = r.parse::<settle_api::Revoked>()?;
            Reply::Revoked {
                principal: answer(core::Principal::new(v.principal))?,
                generation: v.generation,
            }
        }
        Command::Warn(_) => Reply::Warning(answer(warning(r.parse()?))?),
        Command::Expire { .. } | Command::Collect { .. } => {
            return Err(ClientError::Request(
                "expire and collect are the server's own housekeeping, not API calls".into(),
            ));
        }
    })
}

impl Client {
    /// Runs one command of the core on the server. As with
    /// `Ledger::execute`, protocol refusals (409, 404 `not_found`, 503
    /// `record_refused`) are `Ok(Reply::Refused(code))` and an invalid
    /// command (422) is `Ok(Reply::Invalid(..))`; `Err` is everything
    /// else: no answer, or a server that cannot serve (503
    /// `unavailable`, 401, ...). `Expire` and `Collect` are the server's
    /// own housekeeping, not API calls.
    pub async fn execute(&self, cmd: &Command) -> Result<Reply, ClientError> {
        let w = wire(cmd)?;
        let r = self.send_raw(w.method, &w.path, w.body).await?;
        read(cmd, &r)
    }

    /// Runs many commands in one request (`POST /v1/batch`, SPEC §10), in
    /// order; each answer is what [`Client::execute`] would have answered
    /// for that command alone. The outer `Err` is the request's: no
    /// answer, or a batch the server refused as a whole (then no call was
    /// applied, or, without an answer, maybe some were). Revoke and warn
    /// cannot be batched (`ClientError::Request`, nothing sent).
    pub async fn execute_batch(
        &self,
        cmds: &[Command],
    ) -> Result<Vec<Result<Reply, ClientError>>, ClientError> {
        let mut body = b"{\"calls\":[".to_vec();
        for (i, c) in cmds.iter().enumerate() {
            let w = wire(c)?;
            let (op, key) = w
                .batch
                .ok_or_else(|| ClientError::Request(format!("{} cannot be batched", c.name())))?;
            if i > 0 {
                body.push(b',');
            }
            push_entry(&mut body, op, &key, w.body.as_deref().unwrap_or(b"{}"))?;
        }
        body.extend_from_slice(b"]}");
        let reply = self
            .send_raw(Method::POST, "/v1/batch", Some(body.into()))
            .await?;
        if !reply.is_success() {
            return Err(reply.error().into());
        }
        // Read in place: each result's body is a slice of the answer's
        // bytes (no copy, no `Box<RawValue>` per result).
        let res: settle_api::BatchResponseRef<'_> =
            serde_json::from_slice(&reply.body).map_err(|e| ClientError::UnexpectedBody {
                status: reply.status,
                reason: e.to_string(),
            })?;
        if res.results.len() != cmds.len() {
            return Err(ClientError::UnexpectedBody {
                status: 200,
                reason: format!("{} results for {} calls", res.results.len(), cmds.len()),
            });
        }
        Ok(cmds
            .iter()
            .zip(res.results)
            .map(|(cmd, r)| {
                let one = crate::Reply {
                    status: r.status,
                    content_type: if r.status == 200 {
                        "application/json"
                    } else {
                        "application/problem+json"
                    }
                    .to_string(),
                    retry_after: None,
                    body: reply.body.slice_ref(r.body.get().as_bytes()),
                };
                read(cmd, &one)
            })
            .collect())
    }
}

/// An answer that does not convert is not what this API answers.
fn answer<T>(r: Result<T, InvalidInput>) -> Result<T, ClientError> {
    r.map_err(|e| ClientError::UnexpectedBody {
        status: 200,
        reason: e.to_string(),
    })
}

fn warning(w: settle_api::Warning) -> Result<core::Warning, InvalidInput> {
    Ok(core::Warning {
        task: core::TaskId::new(w.task)?,
        class: core::WarningClass::new(w.class)?,
        count: w.count,
        detail: w.detail.map(|d| core::Text::new("detail", d)).transpose()?,
        first_at: w.first_at.into(),
        last_at: w.last_at.into(),
        saturated: w.saturated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_api::Code;

    /// The refusals `execute` answers as replies are exactly the codes
    /// that are not failures of the server.
    #[test]
    fn codes_that_are_replies() {
        for c in Code::ALL {
            let p = settle_api::Problem::new(c, "x");
            let e = ClientError::from(crate::error::HttpError {
                status: p.status,
                problem: Some(p),
                retry_after: None,
                body: Default::default(),
            });
            let reply = e.refusal().is_some() || e.invalid_input().is_some();
            let expected = !matches!(
                c,
                Code::BadRequest
                    | Code::Unauthorized
                    | Code::MethodNotAllowed
                    | Code::RequestTimeout
                    | Code::PayloadTooLarge
                    | Code::UriTooLong
                    | Code::RateLimited
                    | Code::QuotaExceeded
                    | Code::Unavailable
            );
            assert_eq!(reply, expected, "{c}");
        }
    }
}
