//! The one-round-trip path: a batch decided on what this process knows
//! (`known.rs`) and written in one round trip whose statement checks all
//! of it; phases 1, 3 and 4 with the load replaced by that knowledge.

use settle_core::Command;

use super::decide::decide_batch;
use super::load::BatchLoad;
use super::plan::BatchPlan;
use super::write::{BatchWrites, Stamps, write_and_commit_batch};
use super::{Fate, Id, Item, record_key, remember};
use crate::PgError;
use crate::known::PrincipalRow;
use crate::state::{Conn, Inner, now_from, transient};

/// The one-round-trip path: a batch whose every record, principal, clock
/// and fence this process knows (`known.rs`) is decided on that, and sent
/// as `BEGIN`, the settings, the principals' shared locks, one write that
/// checks everything it was decided on (records by `xmin`, a new key
/// free and inside the insert window of its fence's draw, principal rows
/// as known, the clock estimate not ahead, the settings in force) and
/// `COMMIT`, pipelined. `None`: not taken, or a check failed (nothing was
/// written): the two-round-trip path runs. Taken only when every command
/// changes its record: an answer without a write (a replay, a refusal, an
/// in-flight answer) must come from a read.
pub(super) async fn warm_batch(
    inner: &Inner,
    items: &[Item],
    plan: &BatchPlan,
) -> Option<Result<Vec<Fate>, PgError>> {
    let known = &inner.known;
    if !known.is_on() {
        return None;
    }
    {
        // Keys known not to decode are refused by the read path only.
        let undecodable = inner.undecodable();
        if plan.ids.iter().any(|id| undecodable.contains(id)) {
            return None;
        }
    }
    let settled: Vec<&Id> = items
        .iter()
        .filter(|it| !matches!(it.cmd, Command::Claim(_)))
        .map(|it| (&it.tenant, record_key(&it.cmd)))
        .filter_map(|(t, k)| plan.ids.iter().find(|(a, b)| a == t && b == k))
        .collect();
    let principals: Vec<(String, String)> = plan
        .pr_t
        .iter()
        .cloned()
        .zip(plan.pr_n.iter().cloned())
        .collect();
    let server = inner.seen.get();
    let mut warm = known.warm(
        plan.ids.iter().map(|id| (id, settled.contains(&id))),
        &principals,
        plan.claims as usize,
        server.as_ref(),
    )?;
    let now = now_from(inner, warm.db_ms);
    // Never decided at a time before what it decides on.
    let behind = warm
        .records
        .values()
        .any(|(r, _)| r.as_ref().is_some_and(|r| r.updated_at > now))
        || warm.principals.values().any(|p| p.state.moved_at > now);
    let mut load = BatchLoad::known(&mut warm);
    let (fates, changed, all_changed) = decide_batch(inner, items, &mut load);
    let writes = match BatchWrites::of(&changed, &load) {
        Ok(w) if !behind && all_changed && !w.tenant.is_empty() => w,
        // An answer that writes nothing is given from a read.
        _ => return None,
    };
    let rows: Vec<&PrincipalRow> = principals.iter().map(|p| &load.principal_rows[p]).collect();
    let checks = WarmChecks {
        plan,
        generation: rows.iter().map(|r| r.generation.clone()).collect(),
        moved_at: rows.iter().map(|r| r.moved_at).collect(),
        moves: rows.iter().map(|r| r.moves.clone()).collect(),
        db_ms: warm.db_ms,
        fences_last: warm.fences_last.map(|f| f.0 as i64),
    };
    let conn = match Conn::get(&inner.pool, inner.client_timeout).await {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let seen = inner.seen.get();
    if seen != server {
        // A new connection met another server (a failover, a restart): what
        // was learnt before is not checked against it. Nothing was sent.
        return None;
    }
    let stamps = Stamps {
        token_at: warm.db_ms,
        insert_from: warm.fences_db_ms,
    };
    inner.known.sending();
    let committed =
        write_and_commit_batch(inner, conn, &writes, stamps, seen.as_ref(), Some(&checks)).await;
    let done = match committed {
        Ok(x) => {
            remember(inner, Some(&x), &changed, &mut load);
            // What the next block is sized on.
            known.granted(warm.fences_last, plan.claims as usize);
            Ok(fates)
        }
        Err(e) => Err(e),
    };
    warm_outcome(inner, plan, &principals, done)
}

/// What a one-round-trip attempt's outcome means: the batch's fates, an
/// error for the caller's retry policy, or `None` (nothing was written:
/// run the two-round-trip path).
fn warm_outcome(
    inner: &Inner,
    plan: &BatchPlan,
    principals: &[(String, String)],
    done: Result<Vec<Fate>, PgError>,
) -> Option<Result<Vec<Fate>, PgError>> {
    let known = &inner.known;
    match done {
        Ok(fates) => {
            known.count(true);
            Some(Ok(fates))
        }
        Err(PgError::Raced(_)) => {
            known.count(false);
            known.stale(&plan.ids, principals);
            None
        }
        // A database error only this statement could meet (it did not
        // commit: its COMMIT was answered): the two-round-trip path serves
        // from now on.
        Err(e) if matches!(&e, PgError::Db(db) if db.as_db_error().is_some()) && !transient(&e) => {
            tracing::warn!(error = %e,
                "the one-round-trip write failed; group commit reads first from now on");
            known.turn_off();
            None
        }
        Err(e) => {
            known.forget(&plan.ids);
            Some(Err(e))
        }
    }
}

/// What the one-round-trip write also sends: the batch's locks (taken in
/// the same round trip) and the principal rows it was decided on, with
/// its clock estimate (checked by `sql::warm_check`).
pub(super) struct WarmChecks<'a> {
    pub(super) plan: &'a BatchPlan,
    pub(super) generation: Vec<Option<String>>,
    pub(super) moved_at: Vec<Option<i64>>,
    pub(super) moves: Vec<Option<Vec<u8>>>,
    pub(super) db_ms: i64,
    pub(super) fences_last: Option<i64>,
}
