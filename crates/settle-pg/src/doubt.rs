//! Commits whose outcome is unknown: the connection died (or went silent)
//! while COMMIT was in flight.
//!
//! Every writing transaction inserts a commit token (`settle_commits`) in
//! the same round trip as its COMMIT. To learn its fate, a probe on a
//! reserved connection tries to insert the same token, marked `aborted`:
//!
//! - while the interrupted transaction still runs, the insert waits for it
//!   (a unique-index conflict with an uncommitted row), up to a short lock
//!   timeout, and the probe asks again later;
//! - if the token is there and is the transaction's own, it committed. The
//!   probe then commits a write of its own with `synchronous_commit=on`:
//!   that commit is flushed (and acknowledged by a synchronous standby)
//!   after the one in doubt, so the answer is durable before it is given —
//!   even if the original backend was cut off while waiting for the standby
//!   and PostgreSQL kept its commit "locally";
//! - otherwise the transaction did not commit, and the probe commits the
//!   `aborted` marker: the token is taken, so a COMMIT of the interrupted
//!   transaction still on its way to the server can never succeed.
//!
//! Transaction ids are not used: after a crash or a failover PostgreSQL
//! hands out again the ids whose WAL was not durable, so `pg_xact_status`
//! of a lost transaction can report another transaction's commit
//! (reproduced by `tests/crash.rs`). The server's identity is compared only
//! to refuse deciding against a different cluster or a standby, and for the
//! log: the postmaster start time does not even change on a crash-restart.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::PgError;
use crate::session::{Server, Token};
use crate::state::{Conn, Inner};

/// What a probe learned.
enum Probe {
    Decided(bool),
    /// Ask again (why, for the error if time runs out).
    Undecided(String),
}

/// Whether the transaction that wrote `token` committed. `Ok(true)` only
/// when it did and that commit is durable; `Err` when it cannot be known
/// within `in_doubt_timeout` (never a guess). `before` is the server
/// identity known when the transaction ran.
pub(crate) async fn resolve(
    inner: &Inner,
    token: &Token,
    before: Option<&Server>,
) -> Result<bool, String> {
    let deadline = Instant::now() + inner.in_doubt_timeout;
    let mut why = String::from("no answer in time");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, probe(inner, token, before)).await {
            Ok(Probe::Decided(committed)) => {
                tracing::info!(committed, "in-doubt commit resolved by its token");
                return Ok(committed);
            }
            Ok(Probe::Undecided(reason)) => why = reason,
            // Cut short by the deadline: the previous reason stands.
            Err(_) => {}
        };
        if Instant::now() >= deadline {
            tracing::error!(reason = %why, "in-doubt commit left unresolved");
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(50).min(left)).await;
    }
}

async fn probe(inner: &Inner, token: &Token, before: Option<&Server>) -> Probe {
    match probe_once(inner, token, before).await {
        Ok(p) => p,
        Err(e) => Probe::Undecided(e),
    }
}

async fn probe_once(
    inner: &Inner,
    token: &Token,
    before: Option<&Server>,
) -> Result<Probe, String> {
    let sql = &inner.sql;
    let conn = Conn::get(&inner.doubt_pool, inner.client_timeout)
        .await
        .map_err(|e| e.to_string())?;
    let c = conn.client();
    let claim = conn
        .prepare(&sql.probe_claim)
        .await
        .map_err(|e| e.to_string())?;
    let read = conn
        .prepare(&sql.probe_read)
        .await
        .map_err(|e| e.to_string())?;
    let mark = conn
        .prepare(&sql.insert_token)
        .await
        .map_err(|e| e.to_string())?;
    let token_bytes: &[u8] = &token.bytes;
    let claim_params: [&(dyn ToSql + Sync); 2] = [&token.at, &token_bytes];

    // One round trip: the settings, who the server is, and the claim.
    let r = conn
        .within(async {
            futures::join!(
                c.batch_execute(&sql.probe_begin),
                Server::read(c, sql.server),
                c.query_one(&claim, &claim_params),
            )
        })
        .await
        .map_err(|e| e.to_string())?;
    let (r_begin, r_server, r_claim) = r;
    if let Err(e) = r_begin {
        return Err(e.to_string());
    }
    let now = r_server.map_err(|e| e.to_string())?;
    if let Some(before) = before {
        if now.system_identifier != before.system_identifier {
            // Another cluster altogether: its table says nothing about ours.
            conn.rollback(sql).await;
            return Ok(Probe::Undecided(format!(
                "the database is another cluster (system identifier {}, the commit ran on {})",
                now.system_identifier, before.system_identifier
            )));
        }
        let changes = now.changes_since(before);
        if !changes.is_empty() {
            // A restart or a failover: the token decides against the new
            // server's history, which is the one every later call sees.
            tracing::warn!(changes = %changes.join(", "), "in-doubt commit: the server changed");
        }
    }
    if now.in_recovery {
        conn.rollback(sql).await;
        return Ok(Probe::Undecided(
            "the server is a standby in recovery".into(),
        ));
    }
    let inserted = match r_claim {
        Ok(row) => row.get::<_, bool>(0),
        Err(e) => {
            let still_running = e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
            conn.rollback(sql).await;
            return Ok(Probe::Undecided(if still_running {
                "the interrupted transaction is still running".into()
            } else {
                e.to_string()
            }));
        }
    };

    let committed = if inserted {
        // No token: the transaction did not commit. The marker commits below.
        false
    } else {
        let aborted: bool = conn
            .within(c.query_one(&read, &[&token.at, &token_bytes]))
            .await
            .and_then(|r| r.map_err(Into::into))
            .map_err(|e| e.to_string())?
            .get(0);
        if !aborted {
            // Make the commit found durable before answering: a write of
            // our own committed after it (flushed, and acknowledged by a
            // synchronous standby when there is one).
            let probe = Token::new(token.at);
            let probe_bytes: &[u8] = &probe.bytes;
            conn.within(c.execute(&mark, &[&probe.at, &probe_bytes]))
                .await
                .and_then(|r| r.map_err(Into::into))
                .map_err(|e| e.to_string())?;
        }
        !aborted
    };
    // COMMIT may wait for a synchronous standby; bounded by the caller's deadline.
    match c.batch_execute(sql.commit).await {
        Ok(()) => {
            conn.done();
            Ok(Probe::Decided(committed))
        }
        Err(e) => Err(format!("the probe's commit failed: {e}")),
    }
}

/// How a transaction's last round trip (its writes, its token and COMMIT)
/// ended.
pub(crate) enum Commit<W> {
    /// The server answered COMMIT; `W` is what the writes returned (if one
    /// failed, that COMMIT was a rollback).
    Answered(W),
    /// The answer was lost, and the token says it committed (durably).
    Committed,
    /// It did not commit: a class-40 error on COMMIT, or the token says so.
    /// Nothing happened; the command may run again.
    NotCommitted(PgError),
}

/// Classifies the outcome `r` of the commit round trip on `conn`; a lost
/// answer is resolved by `token`, never by transaction id.
pub(crate) async fn finish<W>(
    inner: &Inner,
    conn: Conn,
    r: Result<(W, Result<(), tokio_postgres::Error>), PgError>,
    token: &Token,
    before: Option<&Server>,
) -> Result<Commit<W>, PgError> {
    let lost = match r {
        Ok((writes, Ok(()))) => {
            conn.done();
            return Ok(Commit::Answered(writes));
        }
        Ok((_, Err(e))) => {
            if e.code().is_some_and(|c| c.code().starts_with("40")) {
                // A rollback-class error on COMMIT: definitely not committed.
                return Ok(Commit::NotCommitted(e.into()));
            }
            e.to_string()
        }
        Err(e) => e.to_string(),
    };
    // The connection died, went silent or the server ended the session
    // while COMMIT was in flight: it may have committed. Close it (a late
    // COMMIT on it could still arrive; the probe's marker defeats it) and ask.
    drop(conn);
    tracing::warn!(error = %lost, "COMMIT got no answer; resolving it by its token");
    let r = resolve(inner, token, before).await;
    let slot = match &r {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(_) => 2,
    };
    inner.in_doubt[slot].fetch_add(1, Ordering::Relaxed);
    match r {
        Ok(true) => Ok(Commit::Committed),
        Ok(false) => Ok(Commit::NotCommitted(PgError::NotCommitted(lost))),
        Err(reason) => Err(PgError::InDoubt {
            reason: format!("COMMIT got no answer ({lost}) and {reason}"),
        }),
    }
}
