//! Versioned schema migrations, embedded in the binary and applied at connect.
//!
//! Each migration runs once, in order, inside one transaction that holds an
//! advisory lock for the schema, so several servers starting at once apply
//! each step exactly once (the others wait, then see it done).

use std::future::Future;
use std::time::Duration;

use tokio_postgres::Client;

use crate::PgError;
use crate::codec;
use crate::lock::lock_key;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// Migration `i` (1-based) brings the schema from version `i - 1` to `i`.
/// `{s}` is the quoted schema name. Never edit a released step: add one.
const MIGRATIONS: &[&str] = &[
    // 1: records, principals, warnings and the fence sequence.
    r#"
    -- CACHE 1: every nextval is globally ordered in time, so a lease granted
    -- after another one (under the record lock) always gets a larger fence.
    CREATE SEQUENCE {s}.settle_fence AS bigint START 1 CACHE 1 NO CYCLE;

    CREATE TABLE {s}.settle_records (
        tenant text NOT NULL,
        key text NOT NULL,
        -- NULL format/value: a placeholder inserted only to lock a key that has
        -- no record yet; it never outlives its transaction.
        format smallint,
        value bytea,
        owner text,
        status smallint,
        reconcile boolean,
        lease_expires_at bigint,
        lease_generation numeric(20, 0),
        updated_at bigint,
        collect_at bigint,
        receipt_at bigint,
        PRIMARY KEY (tenant, key)
    );
    -- Sweep: open leases by expiry, terminal records by retention.
    CREATE INDEX settle_records_lease_due ON {s}.settle_records (lease_expires_at)
        WHERE lease_expires_at IS NOT NULL;
    CREATE INDEX settle_records_collect_due ON {s}.settle_records (collect_at)
        WHERE collect_at IS NOT NULL;
    -- Stats: open (non-terminal) records.
    CREATE INDEX settle_records_open ON {s}.settle_records (status)
        WHERE status < 3;

    CREATE TABLE {s}.settle_principals (
        tenant text NOT NULL,
        principal text NOT NULL,
        generation numeric(20, 0) NOT NULL,
        moved_at bigint NOT NULL,
        PRIMARY KEY (tenant, principal)
    );

    CREATE TABLE {s}.settle_warnings (
        tenant text NOT NULL,
        task text NOT NULL,
        format smallint,
        value bytea,
        PRIMARY KEY (tenant, task)
    );
    "#,
    // 2: commit tokens (in-doubt commits are resolved by a token that cannot
    // be reused, never by transaction id), the disputed flag as a column
    // so the gauge is counted from the store (filled in by `backfill_2`),
    // and a principal's newest generation moves (postcard of
    // settle_core::Move list), so a lease's revocation is dated by the
    // move that ended it.
    r#"
    ALTER TABLE {s}.settle_principals ADD COLUMN moves bytea;

    CREATE TABLE {s}.settle_commits (
        -- The database clock (ms) when the transaction read it; tokens are
        -- deleted by the sweep some minutes later.
        at bigint NOT NULL,
        -- 16 random bytes, written by the transaction it identifies.
        token bytea NOT NULL,
        -- Written by an in-doubt probe that found no such token: the
        -- transaction did not commit and now never can.
        aborted boolean NOT NULL DEFAULT false,
        PRIMARY KEY (at, token)
    );

    ALTER TABLE {s}.settle_records ADD COLUMN disputed boolean;
    CREATE INDEX settle_records_disputed ON {s}.settle_records (tenant) WHERE disputed;
    "#,
];

/// Quotes a schema name that [`crate::PgOptions`] already validated.
pub fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// One round trip of the migration, under the client-side deadline (a
/// COMMIT waiting for an absent synchronous standby must not hang `connect`).
async fn within<T>(
    d: Duration,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, PgError> {
    Ok(tokio::time::timeout(d, fut)
        .await
        .map_err(|_| PgError::Timeout(d))??)
}

/// Brings `schema` to [`SCHEMA_VERSION`]; idempotent and safe to race. Each
/// round trip is bounded by `d`.
pub async fn migrate(client: &mut Client, schema: &str, d: Duration) -> Result<(), PgError> {
    let s = quoted(schema);
    let tx = within(d, client.transaction()).await?;
    // Serialises concurrent starters; released at commit.
    within(
        d,
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&lock_key(&["settle-migrate", schema])],
        ),
    )
    .await?;
    let create = format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.settle_schema_version (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    );
    within(d, tx.batch_execute(&create)).await?;
    let version_sql = format!("SELECT coalesce(max(version), 0) FROM {s}.settle_schema_version");
    let current: i32 = within(d, tx.query_one(&version_sql, &[])).await?.get(0);
    if current > SCHEMA_VERSION {
        // A newer build migrated this database; this one must not write to it.
        return Err(PgError::SchemaTooNew {
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, step) in MIGRATIONS.iter().enumerate() {
        let version = i as i32 + 1;
        if version <= current {
            continue;
        }
        within(d, tx.batch_execute(&step.replace("{s}", &s))).await?;
        if version == 2 {
            backfill_2(&tx, &s, d).await?;
        }
        let record = format!("INSERT INTO {s}.settle_schema_version (version) VALUES ($1)");
        within(d, tx.execute(&record, &[&version])).await?;
    }
    within(d, tx.commit()).await?;
    Ok(())
}

/// Fills `disputed` for the records written before version 2, in key
/// order and in chunks (memory stays bounded on a large table). A record
/// that does not decode keeps NULL (it is counted as undecodable instead).
async fn backfill_2(
    tx: &tokio_postgres::Transaction<'_>,
    s: &str,
    d: Duration,
) -> Result<(), PgError> {
    const CHUNK: i64 = 5000;
    let read = format!(
        "SELECT tenant, key, format, value FROM {s}.settle_records \
         WHERE value IS NOT NULL AND (tenant, key) > ($1, $2) \
         ORDER BY tenant, key LIMIT $3"
    );
    let read = within(d, tx.prepare(&read)).await?;
    let write = format!(
        "UPDATE {s}.settle_records r SET disputed = u.d \
         FROM unnest($1::text[], $2::text[], $3::bool[]) AS u(t, k, d) \
         WHERE r.tenant = u.t AND r.key = u.k"
    );
    let write = within(d, tx.prepare(&write)).await?;
    let (mut after_t, mut after_k) = (String::new(), String::new());
    loop {
        let rows = within(d, tx.query(&read, &[&after_t, &after_k, &CHUNK])).await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after_t = last.get(0);
        after_k = last.get(1);
        let (mut tenants, mut keys, mut flags) = (Vec::new(), Vec::new(), Vec::new());
        for r in &rows {
            if let Ok(Some(rec)) = codec::decode_record(r.get(2), r.get::<_, Option<&[u8]>>(3)) {
                tenants.push(r.get::<_, String>(0));
                keys.push(r.get::<_, String>(1));
                flags.push(rec.disputed);
            }
        }
        within(d, tx.execute(&write, &[&tenants, &keys, &flags])).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_per_version() {
        assert_eq!(MIGRATIONS.len() as i32, SCHEMA_VERSION);
        for m in MIGRATIONS {
            assert!(m.contains("{s}."), "every object is schema-qualified");
        }
    }
}
