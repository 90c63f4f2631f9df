//! Phase 1, plan locks: what a batch locks and reads.

use settle_core::{Command, Principal, TenantId};

use super::{Id, Item, record_key};
use crate::lock::principal_key;
use crate::state::Inner;

/// Phase 1: what a batch locks (the binding principals, shared, in key
/// order) and reads (the records and the principal rows, and one fence per claim).
pub(super) struct BatchPlan {
    pub(super) lock_keys: Vec<i64>,
    /// The records, sorted, once each.
    pub(super) ids: Vec<Id>,
    /// The same, as the load's parameters.
    pub(super) id_t: Vec<String>,
    pub(super) id_k: Vec<String>,
    pub(super) claims: i32,
    /// The principals' tenants and names.
    pub(super) pr_t: Vec<String>,
    pub(super) pr_n: Vec<String>,
}

impl BatchPlan {
    pub(super) fn of(inner: &Inner, items: &[Item]) -> BatchPlan {
        let mut principals: Vec<(TenantId, Principal)> = Vec::new();
        let mut ids: Vec<Id> = Vec::new();
        let mut claims = 0i32;
        for it in items {
            let p = it
                .cmd
                .binding_principal()
                .expect("claims and settlements carry a binding");
            let pid = (it.tenant.clone(), p.clone());
            if !principals.contains(&pid) {
                principals.push(pid);
            }
            if matches!(it.cmd, Command::Claim(_)) {
                claims += 1;
            }
            ids.push((it.tenant.clone(), record_key(&it.cmd).clone()));
        }
        ids.sort();
        ids.dedup();
        let mut lock_keys: Vec<i64> = principals
            .iter()
            .map(|(t, p)| principal_key(&inner.schema, t.as_str(), p.as_str()))
            .collect();
        lock_keys.sort();
        lock_keys.dedup();
        let (id_t, id_k) = ids
            .iter()
            .map(|(t, k)| (t.as_str().to_string(), k.as_str().to_string()))
            .unzip();
        let (pr_t, pr_n) = principals
            .iter()
            .map(|(t, p)| (t.as_str().to_string(), p.as_str().to_string()))
            .unzip();
        BatchPlan {
            lock_keys,
            ids,
            id_t,
            id_k,
            claims,
            pr_t,
            pr_n,
        }
    }
}
