//! The sweep: expires due and revoked leases and collects records past
//! their retention through the core (`expire`, `collect`), and deletes
//! commit tokens past their retention.

use std::collections::HashSet;

use settle_core::{Command, Key, RefusalCode, Reply, TenantId};
use settle_ledger::SweepReport;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::state::{Inner, read};

/// Candidates examined per sweep pass and kind.
const SWEEP_BATCH: i64 = 1000;

/// How long commit tokens are kept: far longer than any transaction can
/// live after its client gave up (statement, lock and idle-in-transaction
/// timeouts, each at most `MAX_TIMEOUT`) and than any probe looks for one.
pub const TOKEN_RETENTION_MS: i64 = 10 * 60 * 1000;

/// Tokens deleted per sweep pass.
const TOKEN_SWEEP_BATCH: i64 = 20_000;

fn ids(rows: Vec<Row>) -> Result<Vec<(TenantId, Key)>, PgError> {
    rows.into_iter()
        .map(|r| {
            let t = TenantId::new(r.get::<_, String>(0))
                .map_err(|e| PgError::Corrupt(format!("stored tenant: {e}")))?;
            let k = Key::new(r.get::<_, String>(1))
                .map_err(|e| PgError::Corrupt(format!("stored key: {e}")))?;
            Ok((t, k))
        })
        .collect()
}

/// Finds candidates with indexed queries, then runs `expire`/`collect`
/// through the core, each in its own transaction (the core decides; a
/// candidate that changed meanwhile is simply left alone). A record that
/// does not decode is skipped (and counted in `stats`), never a reason to
/// stop; commit tokens past their retention are deleted.
pub async fn sweep(inner: &Inner) -> Result<SweepReport, PgError> {
    let skew = inner.clock.skew_ms();
    let bad: HashSet<(TenantId, Key)> = inner.undecodable().clone();
    // Records in an unknown format are never candidates (the queries ask
    // for the current format); known undecodable ones are fetched over and skipped.
    let limit = SWEEP_BATCH + bad.len() as i64;
    let (due, revoked, collect) = read(inner, |conn| async move {
        let c = conn.client();
        let with_skew: [&(dyn ToSql + Sync); 2] = [&skew, &limit];
        let only_limit: [&(dyn ToSql + Sync); 1] = [&limit];
        let (due, revoked, collect) = conn
            .within(async {
                futures::join!(
                    c.query(&inner.sql.due_leases, &with_skew),
                    c.query(&inner.sql.revoked_leases, &only_limit),
                    c.query(&inner.sql.due_collections, &with_skew),
                )
            })
            .await?;
        let (due, revoked, collect) = (due?, revoked?, collect?);
        conn.done();
        Ok((ids(due)?, ids(revoked)?, ids(collect)?))
    })
    .await?;
    let mut report = SweepReport::default();
    let mut seen = HashSet::new();
    for (t, key) in due.into_iter().chain(revoked) {
        if bad.contains(&(t.clone(), key.clone())) || !seen.insert((t.clone(), key.clone())) {
            continue;
        }
        if let Reply::Expired { ended: true } =
            sweep_one(inner, &t, Command::Expire { key }).await?
        {
            report.expired += 1;
        }
    }
    for (t, key) in collect {
        if bad.contains(&(t.clone(), key.clone())) {
            continue;
        }
        if let Reply::Collected { removed: true } =
            sweep_one(inner, &t, Command::Collect { key }).await?
        {
            report.collected += 1;
        }
    }
    let expired_tokens = read(inner, |conn| async move {
        let st = conn.prepare(&inner.sql.expire_tokens).await?;
        let n = conn
            .within(
                conn.client()
                    .execute(&st, &[&TOKEN_RETENTION_MS, &TOKEN_SWEEP_BATCH]),
            )
            .await??;
        conn.done();
        Ok(n)
    })
    .await?;
    if expired_tokens > 0 {
        tracing::debug!(expired_tokens, "sweep deleted old commit tokens");
    }
    Ok(report)
}

/// One sweep command. A problem of this one record (it does not decode,
/// a stored field is corrupt) is logged and skipped; anything else (the
/// database is unreachable) stops the pass.
async fn sweep_one(inner: &Inner, t: &TenantId, cmd: Command) -> Result<Reply, PgError> {
    match crate::command::execute(inner, t, &cmd).await {
        Err(e @ PgError::Corrupt(_)) => {
            tracing::error!(tenant = t.as_str(), command = cmd.name(), error = %e,
                "the sweep skipped a record it cannot process");
            Ok(Reply::Refused(RefusalCode::RecordRefused))
        }
        other => other,
    }
}
