//! The core's commands over HTTP: [`Client::execute`] takes the same
//! `settle_core::Command` as `Ledger::execute` and answers the same
//! `settle_core::Reply`, so a worker (SPEC §11) runs unchanged over the
//! in-process ledger or a remote server. The wire types of `settle-api`
//! do the conversions both ways.

use settle_api::{
    ClaimRequest, DispatchRequest, HeartbeatRequest, ReconcileRequest, ReconcileResponse,
    ReleaseRequest, SettleRequest, WarnRequest,
};
use settle_core::{self as core, Command, Fence, InvalidInput, Reply};

use crate::client::Client;
use crate::error::ClientError;

impl Client {
    /// Runs one command of the core on the server. As with
    /// `Ledger::execute`, protocol refusals (409, 404 `not_found`, 503
    /// `record_refused`) are `Ok(Reply::Refused(code))` and an invalid
    /// command (422) is `Ok(Reply::Invalid(..))`; `Err` is everything
    /// else: no answer, or a server that cannot serve (503
    /// `unavailable`, 401, ...). `Expire` and `Collect` are the server's
    /// own housekeeping, not API calls.
    pub async fn execute(&self, cmd: &Command) -> Result<Reply, ClientError> {
        match self.execute_wire(cmd).await {
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

    async fn execute_wire(&self, cmd: &Command) -> Result<Reply, ClientError> {
        Ok(match cmd {
            Command::Claim(c) => {
                let d = self.claim(c.key.as_str(), &ClaimRequest::from(c)).await?;
                Reply::Claim(answer(d.try_into())?)
            }
            Command::Heartbeat(h) => {
                let l = self
                    .heartbeat(h.key.as_str(), &HeartbeatRequest::from(h))
                    .await?;
                Reply::Heartbeat(l.into())
            }
            Command::Dispatch(d) => {
                let l = self
                    .dispatch(d.key.as_str(), &DispatchRequest::from(d))
                    .await?;
                Reply::Dispatched(core::LeaseInfo {
                    fence: Fence(l.fence),
                    lease_expires_at: l.lease_expires_at.into(),
                })
            }
            Command::Settle(s) => {
                let r = self.settle(s.key.as_str(), &SettleRequest::from(s)).await?;
                Reply::Receipt(answer(r.receipt.try_into())?)
            }
            Command::Release(r) => {
                let r = self
                    .release(r.key.as_str(), &ReleaseRequest::from(r))
                    .await?;
                Reply::Released {
                    fence: Fence(r.fence),
                }
            }
            Command::Reconcile(r) => self.reconcile_core(r).await?,
            Command::Revoke(r) => {
                let v = self.revoke(r.principal.as_str()).await?;
                Reply::Revoked {
                    principal: answer(core::Principal::new(v.principal))?,
                    generation: v.generation,
                }
            }
            Command::Warn(w) => {
                let req = WarnRequest::from(w);
                let v = self.warn(w.task.as_str(), w.class.as_str(), &req).await?;
                Reply::Warning(answer(warning(v))?)
            }
            Command::Expire { .. } | Command::Collect { .. } => {
                return Err(ClientError::Request(
                    "expire and collect are the server's own housekeeping, not API calls".into(),
                ));
            }
        })
    }

    async fn reconcile_core(&self, r: &core::Reconcile) -> Result<Reply, ClientError> {
        let v = self
            .reconcile(r.key.as_str(), &ReconcileRequest::from(r))
            .await?;
        Ok(match v {
            ReconcileResponse::Execute(d) => Reply::Claim(answer(d.try_into())?),
            ReconcileResponse::Receipt(rc) => Reply::Receipt(answer(rc.receipt.try_into())?),
            ReconcileResponse::Released(rl) => Reply::Released {
                fence: Fence(rl.fence),
            },
        })
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
                    | Code::RequestTimeout
                    | Code::PayloadTooLarge
                    | Code::Unavailable
            );
            assert_eq!(reply, expected, "{c}");
        }
    }
}
