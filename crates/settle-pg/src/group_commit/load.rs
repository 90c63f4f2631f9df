//! Phase 2, load (round trip 1): the principal locks and one read of
//! everything else; what it read beyond the batch's needs goes to
//! [`Known`](crate::known::Known) for the one-round-trip path.

use std::collections::HashMap;
use std::time::Instant;

use settle_core::{Fence, Key, PrincipalState, Record, TenantId};
use tokio_postgres::types::ToSql;

use super::plan::BatchPlan;
use super::{Abort, Id};
use crate::PgError;
use crate::codec::principal_state;
use crate::known::PrincipalRow;
use crate::rows;
use crate::state::{Conn, Inner};

/// What a batch read, under its locks.
pub(super) struct BatchLoad {
    /// The database clock (ms), as read.
    pub(super) db_now: i64,
    /// A synchronous standby must confirm commits (read by the load; the
    /// one-round-trip path answers nothing without a write of its own).
    pub(super) standby: bool,
    /// The fences taken for the claims, in increasing order.
    pub(super) fences: std::vec::IntoIter<Fence>,
    /// Each record as read, then as the batch's commands leave it; a record
    /// that does not decode refuses its own commands only (record_refused).
    pub(super) state: HashMap<Id, Result<Option<Record>, PgError>>,
    /// The `xmin` each stored record was read at.
    pub(super) read_at: HashMap<Id, String>,
    /// The principal rows by (tenant, principal), with their states (a
    /// principal without a row is absent: generation 0). The one-round-trip
    /// path checks the rows as they are.
    pub(super) principal_rows: HashMap<(String, String), PrincipalRow>,
}

/// What a load read beyond what its batch decides on: the fences drawn
/// past its claims, and the clock read again at the load's end (the
/// closest reading to its answer). Both are for the one-round-trip path.
struct Ahead {
    fences: Vec<Fence>,
    read_end: i64,
}

impl BatchLoad {
    /// What the one-round-trip path decides on: what the process knows,
    /// as if it had been read (taken out of `warm`).
    pub(super) fn known(warm: &mut crate::known::Warm) -> BatchLoad {
        let mut load = BatchLoad {
            db_now: warm.db_ms,
            standby: false,
            fences: std::mem::take(&mut warm.fences).into_iter(),
            state: HashMap::new(),
            read_at: HashMap::new(),
            principal_rows: std::mem::take(&mut warm.principals),
        };
        for (id, (r, x)) in std::mem::take(&mut warm.records) {
            if let Some(x) = x {
                load.read_at.insert(id.clone(), x);
            }
            load.state.insert(id, Ok(r));
        }
        load
    }

    /// Every principal the batch locked, as read: its row, or no row.
    fn principal_rows(&self, plan: &BatchPlan) -> Vec<((String, String), PrincipalRow)> {
        plan.pr_t
            .iter()
            .zip(&plan.pr_n)
            .map(|(t, n)| {
                let id = (t.clone(), n.clone());
                let row = self
                    .principal_rows
                    .get(&id)
                    .cloned()
                    .unwrap_or(PrincipalRow {
                        generation: None,
                        moved_at: None,
                        moves: None,
                        state: PrincipalState::default(),
                    });
                (id, row)
            })
            .collect()
    }
}

/// Phase 2, round trip 1: `BEGIN`, the transaction's settings, the
/// principal locks (in key order) and one statement reading everything
/// else, pipelined (the prepared statements cost no parsing). The read
/// starts after the locks are held, so its snapshot has every committed
/// generation.
pub(super) async fn load_batch(
    inner: &Inner,
    conn: &Conn,
    plan: &BatchPlan,
) -> Result<BatchLoad, Abort> {
    let (sql, c) = (&inner.sql, conn.client());
    let settings_st = conn.prepare(&sql.settings).await?;
    let lock_st = conn.prepare(&sql.lock_principals).await?;
    let load_st = conn
        .prepare(if plan.ids.len() == 1 && plan.pr_t.len() == 1 {
            &sql.batch_load_one
        } else {
            &sql.batch_load
        })
        .await?;
    // Shared locks only, taken in array (= key) order.
    let shared = vec![false; plan.lock_keys.len()];
    // A block of fences beyond the batch's own, for the one-round-trip path
    // (sized on what the last one gave: `known::Draws`).
    let draw = plan.claims + inner.known.fences_wanted(plan.claims);
    let load_params: [&(dyn ToSql + Sync); 5] =
        [&plan.id_t, &plan.id_k, &draw, &plan.pr_t, &plan.pr_n];
    let sent = Instant::now();
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let lock_params: [&(dyn ToSql + Sync); 2] = [&plan.lock_keys, &shared];
    // Past the deadline nothing has committed: the connection is dropped.
    let (r_begin, r_settings, r_lock, r_load) = conn
        .within(async {
            futures::join!(
                c.batch_execute(sql.batch_begin),
                c.execute(&settings_st, &no_params),
                c.execute(&lock_st, &lock_params),
                c.query(&load_st, &load_params)
            )
        })
        .await?;
    let rows = match r_begin.and(r_settings).and(r_lock).and(r_load) {
        Ok(rows) => rows,
        Err(e) if e.as_db_error().is_some() => return Err(Abort::rollback(e.into())),
        Err(e) => return Err(Abort::from(PgError::from(e))),
    };
    let answered = Instant::now();
    let (load, ahead) = read_batch(inner, plan, &rows)?;
    inner.known.loaded(
        load.db_now,
        ahead.read_end,
        sent,
        answered,
        ahead.fences,
        load.principal_rows(plan),
    );
    Ok(load)
}

/// Checks the durability settings read inside the transaction and decodes
/// the load: clock, fences and principals from the first row, one record
/// per row.
/// Returns what was read for the one-round-trip path apart.
fn read_batch(
    inner: &Inner,
    plan: &BatchPlan,
    rows: &[tokio_postgres::Row],
) -> Result<(BatchLoad, Ahead), Abort> {
    let ids = &plan.ids;
    let first = rows
        .first()
        .ok_or_else(|| PgError::Corrupt("the load returned no row".into()))?;
    let (db_now, standby) = rows::loaded_clock(first).map_err(Abort::rollback)?;
    let read_end: i64 = first.get(13);
    let mut fences: Vec<i64> = first.get(2);
    fences.sort_unstable();
    let mut fences: Vec<Fence> = fences.into_iter().map(|f| Fence(f as u64)).collect();
    // The lowest go to the batch's claims.
    let extra = fences.split_off((plan.claims as usize).min(fences.len()));
    let mut raw = HashMap::new();
    let pt: Vec<String> = first.get::<_, Option<Vec<String>>>(3).unwrap_or_default();
    let pn: Vec<String> = first.get::<_, Option<Vec<String>>>(4).unwrap_or_default();
    let pg: Vec<Option<String>> = first.get::<_, Option<_>>(5).unwrap_or_default();
    let pm: Vec<Option<i64>> = first.get::<_, Option<_>>(6).unwrap_or_default();
    let pv: Vec<Option<Vec<u8>>> = first.get::<_, Option<_>>(12).unwrap_or_default();
    let pv = pv.into_iter().chain(std::iter::repeat(None));
    for ((((t, p), g), m), v) in pt.into_iter().zip(pn).zip(pg).zip(pm).zip(pv) {
        let state = principal_state(g.clone(), m, v.clone())?;
        raw.insert(
            (t, p),
            PrincipalRow {
                generation: g,
                moved_at: m,
                moves: v,
                state,
            },
        );
    }
    let mut state = HashMap::new();
    let mut read_at = HashMap::new();
    for r in rows {
        let (Some(t), Some(k)) = (r.get::<_, Option<String>>(7), r.get::<_, Option<String>>(8))
        else {
            continue;
        };
        let id = (
            TenantId::new(t).map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?,
            Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?,
        );
        let rec = rows::loaded_record(inner, &id.0, &id.1, r.get(9), r.get(10));
        read_at.insert(id.clone(), r.get(11));
        state.insert(id, rec);
    }
    for id in ids {
        state.entry(id.clone()).or_insert(Ok(None));
    }
    Ok((
        BatchLoad {
            db_now,
            standby,
            fences: fences.into_iter(),
            state,
            read_at,
            principal_rows: raw,
        },
        Ahead {
            fences: extra,
            read_end,
        },
    ))
}
