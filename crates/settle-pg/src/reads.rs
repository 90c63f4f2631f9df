//! The reads: `get`, the inspection `scan`, `warnings`, `generation`,
//! `now`, `health` and `stats`, each one statement (or one round trip)
//! under the retry policy of read-only queries (`state::read`).

use std::collections::HashSet;

use settle_core::{
    Key, Principals, Record, RefusalCode, TaskId, TenantId, Timestamp, Warning, view_at,
};
use settle_ledger::StoreStats;
use settle_ledger::inspect::Scan;
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::codec::{self, principal_state};
use crate::session::Server;
use crate::state::{Inner, check_durability, now_from, read, read_on};

pub async fn get(
    inner: &Inner,
    tenant: &TenantId,
    key: &Key,
) -> Result<Result<Option<Record>, RefusalCode>, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.get).await?;
        // One statement, one snapshot: the record and its owner's
        // generation as of the same instant, and the clock read after it.
        let row = conn
            .within(
                conn.client()
                    .query_one(&st, &[&tenant.as_str(), &key.as_str()]),
            )
            .await??;
        conn.done();
        let now = now_from(inner, row.get(0));
        let Ok(record) = crate::rows::loaded_record(inner, tenant, key, row.get(1), row.get(2))
        else {
            return Ok(Err(RefusalCode::RecordRefused));
        };
        let mut principals = Principals::new();
        if let Some(r) = &record {
            principals.insert(
                r.reservation.principal.clone(),
                principal_state(row.get(3), row.get(4), row.get(5))?,
            );
        }
        Ok(view_at(record.as_ref(), &principals, now))
    })
    .await
}

/// The inspection scan ([`settle_ledger::Store::scan`]): one statement,
/// one snapshot, over the primary key's index.
pub async fn scan(
    inner: &Inner,
    tenant: &TenantId,
    after: Option<&Key>,
    max: usize,
) -> Result<Scan, PgError> {
    let max = max.clamp(1, 10_000);
    let limit = max as i64;
    // Keys are never empty, so '' is before every key.
    let after = after.map_or("", Key::as_str);
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.scan).await?;
        let rows = conn
            .within(
                conn.client()
                    .query(&st, &[&tenant.as_str(), &after, &limit]),
            )
            .await??;
        conn.done();
        let now = now_from(inner, rows.first().map_or(0, |r| r.get(0)));
        let mut records = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            let Some(k) = row.get::<_, Option<String>>(1) else {
                continue;
            };
            let key = Key::new(k).map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?;
            last = Some(key.clone());
            let record = match codec::decode_record(row.get(2), row.get::<_, Option<&[u8]>>(3)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                // Not listed; counted by the gauges and refused on access.
                Err(e) => {
                    inner.refuse_undecodable(tenant, &key, &e);
                    continue;
                }
            };
            let mut principals = Principals::new();
            principals.insert(
                record.reservation.principal.clone(),
                principal_state(row.get(4), row.get(5), row.get(6))?,
            );
            match view_at(Some(&record), &principals, now) {
                Ok(Some(view)) => records.push(view),
                Ok(None) => {}
                // Refused under §6.9: listed as stored.
                Err(_) => records.push(record),
            }
        }
        let next = if rows.len() >= max { last } else { None };
        Ok(Scan { records, next, now })
    })
    .await
}

pub async fn warnings(
    inner: &Inner,
    tenant: &TenantId,
    task: &TaskId,
) -> Result<Vec<Warning>, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.warnings).await?;
        let row = conn
            .within(
                conn.client()
                    .query_opt(&st, &[&tenant.as_str(), &task.as_str()]),
            )
            .await??;
        conn.done();
        match row {
            Some(r) => codec::decode_warnings(r.get(0), r.get::<_, Option<&[u8]>>(1)),
            None => Ok(Vec::new()),
        }
    })
    .await
}

/// A principal's current generation (0 without a row).
pub async fn generation(
    inner: &Inner,
    tenant: &TenantId,
    principal: &settle_core::Principal,
) -> Result<u64, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.generation).await?;
        let row = conn
            .within(
                conn.client()
                    .query_opt(&st, &[&tenant.as_str(), &principal.as_str()]),
            )
            .await??;
        conn.done();
        Ok(match row {
            Some(r) => principal_state(r.get(0), r.get(1), r.get(2))?.generation,
            None => 0,
        })
    })
    .await
}

pub async fn now(inner: &Inner) -> Result<Timestamp, PgError> {
    read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.now).await?;
        let row = conn.within(conn.client().query_one(&st, &[])).await??;
        conn.done();
        Ok(now_from(inner, row.get(0)))
    })
    .await
}

/// Readiness: the database answers within the deadline, is writable (not a
/// standby), runs with `fsync=on`, and a transaction of this store really
/// runs with `synchronous_commit=on`. Asked on a reserved connection: a
/// pool busy with commands is overloaded, not unready.
pub async fn health(inner: &Inner) -> Result<(), PgError> {
    let server = read_on(inner, &inner.doubt_pool, |conn| async move {
        let c = conn.client();
        let (b, server, durability) = conn
            .within(async {
                futures::join!(
                    c.batch_execute(&inner.sql.begin),
                    Server::read(c, inner.sql.server),
                    c.query_one(&inner.sql.durability, &[]),
                )
            })
            .await?;
        b?;
        let server = server?;
        let durability: String = durability?.get(0);
        conn.rollback(&inner.sql).await;
        check_durability(&durability)?;
        Ok(server)
    })
    .await?;
    if let Some(refusal) = server.refusal() {
        return Err(PgError::NotDurable(refusal));
    }
    if server.in_recovery {
        return Err(PgError::NotWritable(
            "the server is a standby in recovery".into(),
        ));
    }
    Ok(())
}

pub async fn stats(inner: &Inner, stuck_after_ms: u64) -> Result<StoreStats, PgError> {
    let skew = inner.clock.skew_ms();
    let stuck = i64::try_from(stuck_after_ms).unwrap_or(i64::MAX);
    let (tenants, keys): (Vec<String>, Vec<String>) = inner
        .undecodable()
        .iter()
        .map(|(t, k)| (t.as_str().to_string(), k.as_str().to_string()))
        .unzip();
    let (row, recheck) = read(inner, |conn| {
        let (tenants, keys) = (&tenants, &keys);
        async move {
            let c = conn.client();
            let stats_params: [&(dyn ToSql + Sync); 2] = [&skew, &stuck];
            let recheck_params: [&(dyn ToSql + Sync); 2] = [tenants, keys];
            let (row, recheck) = conn
                .within(async {
                    futures::join!(
                        c.query_one(&inner.sql.stats, &stats_params),
                        c.query(&inner.sql.recheck, &recheck_params),
                    )
                })
                .await?;
            let (row, recheck) = (row?, recheck?);
            conn.done();
            Ok((row, recheck))
        }
    })
    .await?;
    // Known undecodable records of the current format (others are counted by
    // SQL): dropped from the set once fixed or deleted by an operator.
    let mut still_bad = HashSet::new();
    for r in &recheck {
        if r.get::<_, Option<i16>>(2).is_some_and(codec::reads_format)
            && codec::decode_record(r.get(2), r.get::<_, Option<&[u8]>>(3)).is_err()
            && let (Ok(t), Ok(k)) = (
                TenantId::new(r.get::<_, String>(0)),
                Key::new(r.get::<_, String>(1)),
            )
        {
            still_bad.insert((t, k));
        }
    }
    let garbled = still_bad.len() as u64;
    inner.undecodable().retain(|id| still_bad.contains(id));
    let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    Ok(StoreStats {
        open: n(0),
        pending: n(1),
        unknown: n(2),
        conflict: n(3),
        reconcile_required: n(4),
        stuck: n(5),
        refused: n(6),
        disputed: n(7),
        undecodable: n(8) + garbled,
    })
}
