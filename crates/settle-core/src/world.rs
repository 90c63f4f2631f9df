//! A whole ledger as plain data: every tenant's records, principals and
//! warnings plus the fence counter, driven through [`apply`].
//!
//! It is the reference engine: the in-memory store wraps it in a lock, and
//! the model-based tests drive it directly. Time is an argument.

use std::collections::HashMap;

use crate::command::{Command, Target};
use crate::record::{PrincipalState, Record, Warning};
use crate::refusal::RefusalCode;
use crate::rules::{Applied, Ctx, Limits, OpState, Principals, apply, principals_needed, view_at};
use crate::types::{Fence, Key, Principal, TaskId, TenantId, Timestamp};

/// All state of a ledger, in memory.
#[derive(Clone, Debug)]
pub struct World {
    /// Every tenant's operation records.
    pub records: HashMap<(TenantId, Key), Record>,
    /// Every tenant's principal generations; absent means generation 0.
    pub principals: HashMap<(TenantId, Principal), PrincipalState>,
    /// Every tenant's warnings, per task.
    pub warnings: HashMap<(TenantId, TaskId), Vec<Warning>>,
    /// The next fence to grant (fences start at 1).
    pub next_fence: u64,
    /// The limits every command runs under.
    pub limits: Limits,
}

impl Default for World {
    fn default() -> Self {
        World::new(Limits::default())
    }
}

impl World {
    /// An empty ledger whose first lease gets fence 1.
    pub fn new(limits: Limits) -> World {
        World {
            records: HashMap::new(),
            principals: HashMap::new(),
            warnings: HashMap::new(),
            next_fence: 1,
            limits,
        }
    }

    fn principal(&self, tenant: &TenantId, p: &Principal) -> PrincipalState {
        self.principals
            .get(&(tenant.clone(), p.clone()))
            .copied()
            .unwrap_or_default()
    }

    /// Loads exactly what `cmd` targets, applies the rules at `now`, stores the result.
    pub fn execute(&mut self, tenant: &TenantId, cmd: &Command, now: Timestamp) -> Applied {
        let mut state = OpState::default();
        let record_id = match cmd.target() {
            Target::Record(key) => {
                let id = (tenant.clone(), key.clone());
                state.record = self.records.get(&id).cloned();
                Some(id)
            }
            Target::Principal(_) => None,
            Target::Task(task) => {
                state.warnings = self
                    .warnings
                    .get(&(tenant.clone(), task.clone()))
                    .cloned()
                    .unwrap_or_default();
                None
            }
        };
        let mut principals = Principals::new();
        for p in principals_needed(cmd, state.record.as_ref()) {
            principals.insert(p.clone(), self.principal(tenant, p));
        }
        state.principals = principals;

        let ctx = Ctx {
            now,
            next_fence: Fence(self.next_fence),
            limits: self.limits,
        };
        let applied = apply(&mut state, cmd, &ctx);
        if applied.fence_used {
            self.next_fence += 1;
        }
        for (p, st) in state.principals.dirty() {
            self.principals.insert((tenant.clone(), p.clone()), *st);
        }
        if applied.changed {
            match cmd.target() {
                Target::Record(_) => {
                    let id = record_id.expect("record target");
                    match state.record {
                        Some(r) => {
                            self.records.insert(id, r);
                        }
                        None => {
                            self.records.remove(&id);
                        }
                    }
                }
                Target::Task(task) => {
                    self.warnings
                        .insert((tenant.clone(), task.clone()), state.warnings);
                }
                Target::Principal(_) => {}
            }
        }
        applied
    }

    /// The `get` view at `now` (lazy expiry applied to a copy, nothing written).
    pub fn get(
        &self,
        tenant: &TenantId,
        key: &Key,
        now: Timestamp,
    ) -> Result<Option<Record>, RefusalCode> {
        let r = self.records.get(&(tenant.clone(), key.clone()));
        let mut principals = Principals::new();
        if let Some(r) = r {
            let p = &r.reservation.principal;
            principals.insert(p.clone(), self.principal(tenant, p));
        }
        view_at(r, &principals, now)
    }

    /// The warnings of a task.
    pub fn warnings(&self, tenant: &TenantId, task: &TaskId) -> Vec<Warning> {
        self.warnings
            .get(&(tenant.clone(), task.clone()))
            .cloned()
            .unwrap_or_default()
    }

    /// The current generation of a principal.
    pub fn generation(&self, tenant: &TenantId, p: &Principal) -> u64 {
        self.principal(tenant, p).generation
    }
}
