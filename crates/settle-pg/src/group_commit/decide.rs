//! Phase 3, decide: the core, applied to the batch's commands in arrival
//! order.

use settle_core::{
    Command, Ctx, Fence, OpState, Principals, Record, RefusalCode, Reply, Timestamp, apply,
    principals_needed,
};
use settle_ledger::StoreError;

use super::load::BatchLoad;
use super::{Fate, Id, Item, record_key};
use crate::rows;
use crate::state::{Inner, answers_a_commit, now_from};

/// What the core decided for one command of a batch.
// Short-lived, one per command; boxing the record would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Decided {
    /// Answered without applying (refused, run alone, or failed).
    Fate(Fate),
    Applied {
        reply: Reply,
        fence_used: bool,
        /// The record after it, when it changed.
        changed: Option<Option<Record>>,
    },
}

/// Phase 3: the core, applied to the commands in arrival order, each
/// seeing the state the previous ones left. Returns each command's fate
/// and the records that changed.
/// The third: whether every command was applied and changed its record.
pub(super) fn decide_batch(
    inner: &Inner,
    items: &[Item],
    load: &mut BatchLoad,
) -> (Vec<Fate>, Vec<Id>, bool) {
    let now = now_from(inner, load.db_now);
    let mut fates = Vec::with_capacity(items.len());
    let mut changed: Vec<Id> = Vec::new();
    let mut all_changed = true;
    let mut next = load.fences.next();
    for it in items {
        match decide_one(inner, it, load, now, next) {
            Decided::Fate(f) => {
                all_changed = false;
                fates.push(f);
            }
            Decided::Applied {
                reply,
                fence_used,
                changed: after,
            } => {
                if fence_used {
                    next = load.fences.next();
                }
                match after {
                    Some(record) => {
                        let id = (it.tenant.clone(), record_key(&it.cmd).clone());
                        load.state.insert(id.clone(), Ok(record));
                        if !changed.contains(&id) {
                            changed.push(id);
                        }
                    }
                    None => all_changed = false,
                }
                fates.push(Fate::Reply(reply));
            }
        }
    }
    (fates, changed, all_changed)
}

/// One command of a batch, with `next` the fence a claim would get.
fn decide_one(
    inner: &Inner,
    it: &Item,
    load: &BatchLoad,
    now: Timestamp,
    next: Option<Fence>,
) -> Decided {
    let id = (it.tenant.clone(), record_key(&it.cmd).clone());
    let current = match load.state.get(&id).expect("loaded") {
        Ok(r) => r.clone(),
        Err(_) => return Decided::Fate(Fate::Reply(Reply::Refused(RefusalCode::RecordRefused))),
    };
    let own = it.cmd.binding_principal().expect("binding");
    if principals_needed(&it.cmd, current.as_ref()).any(|p| p != own) {
        // The owner is another principal, whose lock the batch lacks.
        return Decided::Fate(Fate::Alone);
    }
    let mut ps = Principals::new();
    let g = load
        .principal_rows
        .get(&(it.tenant.as_str().to_string(), own.as_str().to_string()))
        .map(|r| r.state)
        .unwrap_or_default();
    ps.insert(own.clone(), g);
    let mut st = OpState {
        record: current,
        principals: ps,
        warnings: Vec::new(),
    };
    let is_claim = matches!(it.cmd, Command::Claim(_));
    let next_fence = if is_claim {
        next.unwrap_or(Fence(0))
    } else {
        Fence(0)
    };
    if is_claim && let Some(behind) = rows::fence_behind(next_fence, st.record.as_ref()) {
        return Decided::Fate(Fate::Failed(StoreError::Corrupt(behind)));
    }
    let ctx = Ctx {
        now,
        next_fence,
        limits: inner.limits,
    };
    let applied = apply(&mut st, &it.cmd, &ctx);
    if st.principals.dirty().next().is_some() {
        // Raising a generation needs the exclusive lock: on its own.
        return Decided::Fate(Fate::Alone);
    }
    if applied.fence_used && !is_claim {
        return Decided::Fate(Fate::Failed(StoreError::Corrupt(
            "a settlement granted a lease".into(),
        )));
    }
    if load.standby && !applied.changed && answers_a_commit(&applied.reply) {
        // Read from a commit a synchronous standby may not have confirmed:
        // the per-command path answers it after a confirmed commit of its
        // own (`state::answers_a_commit`).
        return Decided::Fate(Fate::Alone);
    }
    Decided::Applied {
        reply: applied.reply,
        fence_used: applied.fence_used,
        changed: applied.changed.then_some(st.record),
    }
}
