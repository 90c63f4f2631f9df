//! The reads a [`Reconciler`](crate::Reconciler) needs besides commands
//! (SPEC §9, §7), over the HTTP client and, with the `local` feature, the
//! in-process ledger.

use settle_core::{Digest, Key, Principal, Reservation, Scopes};

#[cfg(feature = "local")]
use crate::transport::LedgerTransport;
use crate::transport::{BoxFuture, Transport, TransportError};

/// One page of keys and the cursor of the next page (`None`: the last).
pub type KeyPage = (Vec<String>, Option<String>);

/// What a [`Reconciler`](crate::Reconciler) reads of one record before it
/// claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileRecord {
    /// What the first claim reserved: the reconcile claim repeats it.
    pub reservation: Reservation,
    /// Whether it still requires reconciliation.
    pub reconcile_required: bool,
    /// The `worker` fields of its kept attempts' leases, oldest first: a
    /// middleware record's names the client's key and principal (SPEC §8),
    /// and a reconcile claim copies it.
    pub workers: Vec<String>,
}

/// The reads a [`Reconciler`](crate::Reconciler) needs besides commands:
/// the keys that require reconciliation, a record's reservation, a
/// principal's generation (SPEC §9, §7). The HTTP client provides them, and
/// with the `local` feature the in-process ledger (`LedgerTransport`).
pub trait Inspect: Transport {
    /// One page of keys that require reconciliation and start with
    /// `prefix` (`""`: every key; the listing is asked without
    /// `key_prefix`), after the cursor of the previous page; the next cursor.
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>>;
    /// The record of `key` as a reconciler reads it (`None`: it is gone).
    fn record<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<ReconcileRecord>, TransportError>>;
    /// The principal's current generation.
    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>>;
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Fatal {
        detail: format!("the ledger answered a {what} this client cannot read: {e}"),
    }
}

/// The listing's parameters for `prefix`: `""` asks without `key_prefix`
/// (an empty `key_prefix=` is refused by the server).
pub(crate) fn list_params(prefix: &str, after: Option<&str>) -> settle_client::ListParams {
    settle_client::ListParams {
        reconcile_required: Some(true),
        key_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
        after: after.map(str::to_string),
        ..Default::default()
    }
}

impl Inspect for settle_client::Client {
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>> {
        Box::pin(async move {
            let page = self.list(&list_params(prefix, after)).await?;
            Ok((
                page.operations.into_iter().map(|o| o.key).collect(),
                page.next,
            ))
        })
    }

    fn record<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<ReconcileRecord>, TransportError>> {
        Box::pin(async move {
            let r = match self.get(key.as_str()).await {
                Ok(r) => r,
                Err(e) if e.status() == Some(404) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let res = &r.reservation;
            let reservation = Reservation {
                fingerprint: Digest::parse("fingerprint", &res.fingerprint)
                    .map_err(|e| corrupt("reservation", e))?,
                principal: Principal::new(res.principal.as_str())
                    .map_err(|e| corrupt("reservation", e))?,
                scopes: Scopes::from_strs(res.scopes.iter())
                    .map_err(|e| corrupt("reservation", e))?,
                generation: res.generation,
            };
            Ok(Some(ReconcileRecord {
                reservation,
                reconcile_required: r.reconcile_required,
                workers: r
                    .attempts
                    .into_iter()
                    .filter_map(|a| a.lease.worker)
                    .collect(),
            }))
        })
    }

    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move { Ok(self.principal(principal.as_str()).await?.generation) })
    }
}

#[cfg(feature = "local")]
impl Inspect for LedgerTransport {
    fn reconcile_required<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<KeyPage, TransportError>> {
        use settle_ledger::inspect::{Cursor, ListFilter, ListQuery, list};
        Box::pin(async move {
            let q = ListQuery {
                filter: ListFilter {
                    reconcile_required: Some(true),
                    key_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
                    ..ListFilter::default()
                },
                order: Default::default(),
                after: after
                    .map(|a| Cursor::from_text(a).ok_or_else(|| corrupt("cursor", a)))
                    .transpose()?,
                limit: 100,
                stuck_after_ms: 3_600_000,
            };
            let page = list(&**self.ledger().store(), self.tenant(), &q).await?;
            Ok((
                page.records
                    .iter()
                    .map(|r| r.key.as_str().to_string())
                    .collect(),
                page.next.map(|c| c.to_text()),
            ))
        })
    }

    fn record<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<ReconcileRecord>, TransportError>> {
        Box::pin(async move {
            match self.ledger().store().get(self.tenant(), key).await? {
                Ok(Some(r)) => Ok(Some(ReconcileRecord {
                    reservation: r.reservation.clone(),
                    reconcile_required: r.reconcile_required,
                    workers: r
                        .attempts
                        .iter()
                        .filter_map(|a| a.lease.worker.as_ref().map(|w| w.as_str().to_string()))
                        .collect(),
                })),
                Ok(None) => Ok(None),
                Err(code) => Err(TransportError::Fatal {
                    detail: format!("record {key}: {code}"),
                }),
            }
        })
    }

    fn generation<'a>(
        &'a self,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<u64, TransportError>> {
        Box::pin(async move {
            match self
                .ledger()
                .store()
                .generation(self.tenant(), principal)
                .await?
            {
                Ok(g) => Ok(g),
                Err(code) => Err(TransportError::Fatal {
                    detail: format!("principal {principal}: {code}"),
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_all_is_listed_without_key_prefix() {
        assert_eq!(list_params("", None).key_prefix, None);
        assert_eq!(list_params("mw-", None).key_prefix.as_deref(), Some("mw-"));
    }
}
