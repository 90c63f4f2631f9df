//! A `settle serve` as a target of the crash harness (`settle_ledger::crash`):
//! its commands go through `Client::execute`, which answers like
//! `Store::execute`, and its records through `GET /v1/operations/{key}`.

use settle_client::Client;
use settle_client::api::{RecordStatus, RecordView};
use settle_core::{Command, Key, Receipt, RefusalCode, Reply, Status, TenantId};
use settle_ledger::BoxFuture;
use settle_ledger::crash::{Seen, Target};

/// The server behind a client; the tenant is the client's (its token).
pub struct Remote(pub Client);

impl Target for Remote {
    fn run<'a>(&'a self, _: &'a TenantId, cmd: Command) -> BoxFuture<'a, Result<Reply, String>> {
        Box::pin(async move { self.0.execute(&cmd).await.map_err(|e| e.to_string()) })
    }

    fn look<'a>(
        &'a self,
        _: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Seen>, String>> {
        Box::pin(async move {
            match self.0.get(key.as_str()).await {
                Ok(view) => seen(view).map(Some),
                Err(e) if e.refusal() == Some(RefusalCode::NotFound) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// The record view in the core's terms (the receipts convert losslessly).
fn seen(view: RecordView) -> Result<Seen, String> {
    let receipt = |rc: Option<settle_client::api::Receipt>| {
        rc.map(Receipt::try_from)
            .transpose()
            .map_err(|e| format!("{}: a receipt that does not convert: {e}", view.key))
    };
    Ok(Seen {
        status: match view.status {
            RecordStatus::Pending | RecordStatus::Running => Status::Pending,
            RecordStatus::Unknown => Status::Unknown,
            RecordStatus::Conflict => Status::Conflict,
            RecordStatus::Failed => Status::Failed,
            RecordStatus::Completed => Status::Completed,
        },
        receipt: receipt(view.receipt.clone())?,
        attempts: view
            .attempts
            .iter()
            .map(|a| {
                Ok((
                    settle_core::Fence(a.lease.fence),
                    receipt(a.receipt.clone())?,
                ))
            })
            .collect::<Result<_, String>>()?,
    })
}
