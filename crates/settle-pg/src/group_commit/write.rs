//! Phase 4, write + commit (round trip 2), and phase 5, resolving a
//! COMMIT whose answer was lost: every changed record and the commit
//! token in one statement, `COMMIT` pipelined after it.

use settle_core::Record;
use tokio_postgres::types::ToSql;

use super::Id;
use super::load::BatchLoad;
use super::warm::WarmChecks;
use crate::PgError;
use crate::doubt::{self, Commit};
use crate::rows::RecordRow;
use crate::session::{Server, Token};
use crate::sql::{BATCH_WRITE_TYPES, STALE, WARM_WRITE_TYPES};
use crate::state::{Conn, Inner};

/// New records are written only this soon after the batch read the clock
/// (less than the shortest retention, 1 s; see `sql::batch_write`).
const INSERT_WINDOW_MS: i64 = 500;

/// The batch write found a row changed since it was read (or a new key
/// taken): nothing was written.
pub(super) fn stale(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.message().contains(STALE))
}

/// The database times a batch's write is stamped with: its commit token's
/// (the clock as read, or as estimated), and the start of its insert
/// window (when its fences were drawn).
pub(super) struct Stamps {
    pub(super) token_at: i64,
    pub(super) insert_from: i64,
}

impl Stamps {
    /// Both from the batch's own read.
    pub(super) fn read(db_now: i64) -> Stamps {
        Stamps {
            token_at: db_now,
            insert_from: db_now,
        }
    }
}

/// Every changed record of a batch as the columns of the one write
/// statement (`sql::batch_write`): `op` is `u`pdate or `d`elete
/// (compare-and-set on the `xmin` in `v`) or `i`nsert.
#[derive(Default)]
pub(super) struct BatchWrites {
    pub(super) tenant: Vec<String>,
    key: Vec<String>,
    op: Vec<&'static str>,
    v: Vec<Option<String>>,
    format: Vec<Option<i16>>,
    value: Vec<Option<Vec<u8>>>,
    owner: Vec<Option<String>>,
    status: Vec<Option<i16>>,
    reconcile: Vec<Option<bool>>,
    lease_expires_at: Vec<Option<i64>>,
    lease_generation: Vec<Option<String>>,
    updated_at: Vec<Option<i64>>,
    collect_at: Vec<Option<i64>>,
    receipt_at: Vec<Option<i64>>,
    disputed: Vec<Option<bool>>,
}

impl BatchWrites {
    pub(super) fn of(changed: &[Id], load: &BatchLoad) -> Result<BatchWrites, PgError> {
        let mut w = BatchWrites::default();
        for id in changed {
            let v = load.read_at.get(id).cloned();
            let after = match load.state.get(id).expect("changed") {
                Ok(r) => r.as_ref(),
                Err(_) => unreachable!("a record that failed to load is never changed"),
            };
            let op = match (&v, after) {
                (Some(_), Some(_)) => "u",
                (None, Some(_)) => "i",
                (Some(_), None) => "d",
                // Created and removed within the batch: nothing to write.
                (None, None) => continue,
            };
            w.tenant.push(id.0.as_str().to_string());
            w.key.push(id.1.as_str().to_string());
            w.op.push(op);
            w.v.push(v);
            match after {
                Some(r) => w.push_record(r)?,
                None => w.push_deletion(),
            }
        }
        Ok(w)
    }

    fn push_record(&mut self, r: &Record) -> Result<(), PgError> {
        let RecordRow {
            format,
            value,
            cols,
        } = RecordRow::of(r)?;
        self.format.push(Some(format));
        self.value.push(Some(value));
        self.owner.push(Some(cols.owner));
        self.status.push(Some(cols.status));
        self.reconcile.push(Some(cols.reconcile));
        self.lease_expires_at.push(cols.lease_expires_at);
        self.lease_generation.push(cols.lease_generation);
        self.updated_at.push(Some(cols.updated_at));
        self.collect_at.push(cols.collect_at);
        self.receipt_at.push(cols.receipt_at);
        self.disputed.push(Some(cols.disputed));
        Ok(())
    }

    fn push_deletion(&mut self) {
        self.format.push(None);
        self.value.push(None);
        self.owner.push(None);
        self.status.push(None);
        self.reconcile.push(None);
        self.lease_expires_at.push(None);
        self.lease_generation.push(None);
        self.updated_at.push(None);
        self.collect_at.push(None);
        self.receipt_at.push(None);
        self.disputed.push(None);
    }
}

/// Phase 4, round trip 2: every changed record and the batch's commit
/// token in one statement, then `COMMIT`, pipelined; then phase 5. On the
/// one-round-trip path (`warm`), `BEGIN`, the settings and the locks go
/// first in the same round trip, and the statement checks what the batch
/// was decided on. Returns the transaction's id as its rows' `xmin` when
/// the COMMIT was answered (`None`: resolved committed in doubt).
pub(super) async fn write_and_commit_batch(
    inner: &Inner,
    conn: Conn,
    w: &BatchWrites,
    stamps: Stamps,
    seen: Option<&Server>,
    warm: Option<&WarmChecks<'_>>,
) -> Result<Option<String>, PgError> {
    let (sql, c) = (&inner.sql, conn.client());
    let write_st = match (warm, w.op.as_slice()) {
        (None, [op]) => conn.prepare_typed(sql.batch_write_one.of(op), &BATCH_WRITE_TYPES),
        (None, _) => conn.prepare_typed(&sql.batch_write, &BATCH_WRITE_TYPES),
        (Some(_), [op]) => conn.prepare_typed(sql.warm_write_one.of(op), &WARM_WRITE_TYPES),
        (Some(_), _) => conn.prepare_typed(&sql.warm_write, &WARM_WRITE_TYPES),
    }
    .await?;
    let expected = w.tenant.len() as i64;
    let insert_deadline = stamps.insert_from + INSERT_WINDOW_MS;
    // The batch's commit token, written by the same statement as the rows:
    // after a lost COMMIT answer its presence (never the transaction id)
    // says whether the batch committed.
    let token = Token::new(stamps.token_at);
    let token_bytes: &[u8] = &token.bytes;
    let mut write_params: Vec<&(dyn ToSql + Sync)> = vec![
        &w.tenant,
        &w.key,
        &w.op,
        &w.v,
        &w.format,
        &w.value,
        &w.owner,
        &w.status,
        &w.reconcile,
        &w.lease_expires_at,
        &w.lease_generation,
        &w.updated_at,
        &w.collect_at,
        &w.receipt_at,
        &w.disputed,
        &insert_deadline,
        &expected,
        &token.at,
        &token_bytes,
    ];
    let r = match warm {
        None => {
            conn.within(async {
                futures::join!(
                    c.query_one(&write_st, &write_params),
                    crate::bugs::commit(c.batch_execute(sql.commit))
                )
            })
            .await
        }
        Some(k) => {
            write_params.extend([
                &k.plan.pr_t as &(dyn ToSql + Sync),
                &k.plan.pr_n,
                &k.generation,
                &k.moved_at,
                &k.moves,
                &k.db_ms,
                &k.fences_last,
            ]);
            let settings_st = conn.prepare(&sql.settings).await?;
            let lock_st = conn.prepare(&sql.lock_principals).await?;
            let shared = vec![false; k.plan.lock_keys.len()];
            let no_params: [&(dyn ToSql + Sync); 0] = [];
            let lock_params: [&(dyn ToSql + Sync); 2] = [&k.plan.lock_keys, &shared];
            conn.within(async {
                let (b, st, l, wr, cm) = futures::join!(
                    c.batch_execute(sql.batch_begin),
                    c.execute(&settings_st, &no_params),
                    c.execute(&lock_st, &lock_params),
                    c.query_one(&write_st, &write_params),
                    crate::bugs::commit(c.batch_execute(sql.commit))
                );
                // The first failure is the cause (the statements after it
                // fail as "transaction aborted"; the COMMIT rolls back).
                let first = b.and(st).and(l).map(|_| ());
                (first.and(wr), cm)
            })
            .await
        }
    };
    resolve_batch_commit(inner, conn, r, &token, seen, expected).await
}

/// What the batch's commit round trip returns: the write's row (rows and
/// token in one statement), and COMMIT's answer.
type BatchCommitRound = (
    Result<tokio_postgres::Row, tokio_postgres::Error>,
    Result<(), tokio_postgres::Error>,
);

/// Phase 5: what the commit round trip says. A lost answer is resolved by
/// the token (`doubt.rs`); an answered COMMIT after a failed write was a
/// rollback (a row changed under the batch: `Raced`).
async fn resolve_batch_commit(
    inner: &Inner,
    conn: Conn,
    r: Result<BatchCommitRound, PgError>,
    token: &Token,
    seen: Option<&Server>,
    expected: i64,
) -> Result<Option<String>, PgError> {
    match doubt::finish(inner, conn, r, token, seen).await? {
        Commit::Answered(write_result) => match write_result {
            Ok(row) if row.get::<_, i64>(0) == expected => Ok(Some(row.get(1))),
            Ok(row) => Err(PgError::Corrupt(format!(
                "a batch write reported {} rows, expected {expected}",
                row.get::<_, i64>(0)
            ))),
            // The COMMIT was a rollback: nothing happened.
            Err(e) if stale(&e) => Err(PgError::Raced(e.to_string())),
            Err(e) => Err(e.into()),
        },
        Commit::Committed => Ok(None),
        Commit::NotCommitted(e) => Err(e),
    }
}
