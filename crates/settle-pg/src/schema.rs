//! Versioned schema migrations, embedded in the binary and applied at connect.
//!
//! Each migration runs once, in order, inside one transaction that holds an
//! advisory lock for the schema, so several servers starting at once apply
//! each step exactly once (the others wait, then see it done).

use tokio_postgres::Client;

use crate::PgError;
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
    // 2: a principal's newest generation moves (postcard of settle_core::Move
    // list), so a lease's revocation is dated by the move that ended it.
    r#"
    ALTER TABLE {s}.settle_principals ADD COLUMN moves bytea;
    "#,
];

/// Quotes a schema name that [`crate::PgOptions`] already validated.
pub fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Brings `schema` to [`SCHEMA_VERSION`]; idempotent and safe to race.
pub async fn migrate(client: &mut Client, schema: &str) -> Result<(), PgError> {
    let s = quoted(schema);
    let tx = client.transaction().await?;
    // Serialises concurrent starters; released at commit.
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&["settle-migrate", schema])],
    )
    .await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.settle_schema_version (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    ))
    .await?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {s}.settle_schema_version"),
            &[],
        )
        .await?
        .get(0);
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
        tx.batch_execute(&step.replace("{s}", &s)).await?;
        tx.execute(
            &format!("INSERT INTO {s}.settle_schema_version (version) VALUES ($1)"),
            &[&version],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
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
