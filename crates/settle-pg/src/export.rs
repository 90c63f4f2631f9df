//! The export (SPEC §12, [`settle_ledger::Store::export`]): one consistent
//! snapshot of every record, principal and warning task, read on a
//! connection of its own while writes go on, and streamed in the portable
//! format's canonical order.
//!
//! The snapshot is one `REPEATABLE READ READ ONLY` transaction: its first
//! statement fixes what every later statement sees. Three cursors over it
//! (records, principals, warning tasks) are fetched [`CHUNK`] rows at a
//! time, so memory stays bounded however large the tables are; each chunk
//! is decoded with the engine's own codec and handed on by a spawned task.

use std::future::Future;
use std::time::Duration;

use settle_core::{Key, Principal, TaskId, TenantId};
use settle_ledger::export::CHUNK;
use settle_ledger::{Part, Snapshot, StoreError};
use settle_portable::Entity;
use tokio::sync::mpsc::Sender;
use tokio_postgres::{Client, Row, Statement};

use crate::PgError;
use crate::codec::{self, principal_state};
use crate::schema::quoted;
use crate::session;
use crate::state::{Inner, read};

/// The engine's name in an export's header.
pub const ENGINE: &str = "postgres";

/// The cursors of an export, in the canonical order of their sections.
const CURSORS: [&str; 3] = [
    "settle_export_records",
    "settle_export_principals",
    "settle_export_warnings",
];

/// The fence counter: the value the sequence's next `nextval` returns, read
/// without taking one (sequences are read outside any snapshot, so this is
/// the counter now, whatever the transaction).
pub fn floor_sql(schema: &str) -> String {
    format!(
        "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END \
         FROM {}.settle_fence",
        quoted(schema)
    )
}

/// [`settle_ledger::Store::fence_floor`]: every fence granted so far is
/// below it.
pub async fn fence_floor(inner: &Inner) -> Result<u64, PgError> {
    let sql = floor_sql(&inner.schema);
    read(inner, |conn| {
        let sql = &sql;
        async move {
            let st = conn.prepare(sql).await?;
            let row = conn.within(conn.client().query_one(&st, &[])).await??;
            conn.done();
            counter(&row)
        }
    })
    .await
}

fn counter(row: &Row) -> Result<u64, PgError> {
    let n: i64 = row.try_get(0)?;
    u64::try_from(n).map_err(|_| PgError::Corrupt(format!("fence sequence at {n}")))
}

/// The snapshot's transaction. The `SELECT` is its first statement, so it
/// fixes the snapshot. The export's statements are reads that take as long
/// as the tables are large (the first fetch sorts a whole table), and
/// between fetches the session waits for the consumer (a file, a backup
/// client): neither is cut short by the store's timeouts. Sequential scans
/// are allowed again (the store's connections price them out for key
/// lookups; a whole-table read wants one).
const BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
     SELECT set_config('statement_timeout', '0', true), \
            set_config('idle_in_transaction_session_timeout', '0', true), \
            set_config('enable_seqscan', 'on', true)";

/// Declares the three cursors over the snapshot. `COLLATE "C"` orders by
/// bytes, as Rust's `str` does (the canonical order, `Entity::order`),
/// whatever the database's collation.
fn declare_sql(schema: &str) -> String {
    let s = quoted(schema);
    let [rec, pri, war] = CURSORS;
    format!(
        "DECLARE {rec} NO SCROLL CURSOR FOR \
           SELECT tenant, key, format, value FROM {s}.settle_records \
           ORDER BY tenant COLLATE \"C\", key COLLATE \"C\"; \
         DECLARE {pri} NO SCROLL CURSOR FOR \
           SELECT tenant, principal, generation::text, moved_at, moves FROM {s}.settle_principals \
           ORDER BY tenant COLLATE \"C\", principal COLLATE \"C\"; \
         DECLARE {war} NO SCROLL CURSOR FOR \
           SELECT tenant, task, format, value FROM {s}.settle_warnings \
           ORDER BY tenant COLLATE \"C\", task COLLATE \"C\""
    )
}

/// Opens the snapshot and starts streaming it.
pub async fn export(inner: &Inner) -> Result<Snapshot, PgError> {
    let mut cfg = inner.cfg.clone();
    // No client-side deadline bounds a fetch (see BEGIN): a peer that went
    // away is noticed by keepalives within about a minute instead.
    cfg.keepalives_interval(Duration::from_secs(10))
        .keepalives_retries(3);
    let (client, driver) = session::connect(&cfg, &inner.tls).await?;
    let d = inner.client_timeout;
    within(d, client.batch_execute(BEGIN)).await?;
    // Read after the snapshot was fixed (by BEGIN's SELECT): every fence a
    // record in the snapshot holds was taken (nextval) before that record's
    // transaction committed, so before the snapshot, so before this read;
    // and a sequence is read as it is now, not as of the snapshot. The
    // floor is therefore above every fence in the snapshot. Read before
    // the snapshot, it could miss a fence taken and committed in between.
    let floor = counter(&within(d, client.query_one(&floor_sql(&inner.schema), &[])).await?)?;
    within(d, client.batch_execute(&declare_sql(&inner.schema))).await?;
    let mut fetches = Vec::with_capacity(CURSORS.len());
    for c in CURSORS {
        let fetch = format!("FETCH FORWARD {CHUNK} FROM {c}");
        fetches.push(within(d, client.prepare(&fetch)).await?);
    }
    let (snap, tx) = Snapshot::channel(ENGINE, floor, crate::known::FENCES_PER_CLAIM_MAX);
    tokio::spawn(async move {
        // Only a stream that ran to its end says so.
        let r = stream(&client, &fetches, &tx).await;
        let _ = tx.send(r.map(|()| Part::End)).await;
        // Dropping the client ends the session, and with it the read-only
        // transaction (nothing to commit).
        drop(client);
        let _ = driver.await;
    });
    Ok(snap)
}

/// One round trip of the snapshot's setup, under the client-side deadline.
async fn within<T>(
    d: Duration,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, PgError> {
    Ok(tokio::time::timeout(d, fut)
        .await
        .map_err(|_| PgError::Timeout(d))??)
}

/// Makes one section's entity of a row (`None`: a placeholder, no entity).
type Decoder = fn(&Row) -> Result<Option<Entity>, PgError>;

/// Sends every section's rows, decoded, a chunk at a time; stops early (and
/// `Ok`) once the receiver is gone.
async fn stream(
    client: &Client,
    fetches: &[Statement],
    tx: &Sender<Result<Part, StoreError>>,
) -> Result<(), StoreError> {
    let decoders: [Decoder; 3] = [record_entity, principal_entity, warnings_entity];
    for (fetch, decode) in fetches.iter().zip(decoders) {
        loop {
            let rows = client.query(fetch, &[]).await.map_err(PgError::from)?;
            let mut chunk = Vec::with_capacity(rows.len());
            for row in &rows {
                if let Some(e) = decode(row)? {
                    chunk.push(e);
                }
            }
            if !chunk.is_empty() && tx.send(Ok(Part::Entities(chunk))).await.is_err() {
                return Ok(());
            }
            if rows.len() < CHUNK {
                break;
            }
        }
    }
    Ok(())
}

fn corrupt(what: &str, tenant: &str, name: &str, e: impl std::fmt::Display) -> PgError {
    PgError::Corrupt(format!("{what} {tenant:?}/{name:?}: {e}"))
}

fn tenant_of(what: &str, tenant: &str, name: &str) -> Result<TenantId, PgError> {
    TenantId::new(tenant).map_err(|e| corrupt(what, tenant, name, e))
}

/// A stored value's columns: `None` for a placeholder row (both NULL: a
/// row inserted only to lock a name, which never commits); one NULL
/// without the other is damage.
fn stored<'a>(
    row: &'a Row,
    what: &str,
    tenant: &str,
    name: &str,
) -> Result<Option<(i16, &'a [u8])>, PgError> {
    match (row.try_get(2)?, row.try_get(3)?) {
        (Some(f), Some(v)) => Ok(Some((f, v))),
        (None, None) => Ok(None),
        _ => Err(corrupt(what, tenant, name, "format or value is NULL")),
    }
}

fn record_entity(row: &Row) -> Result<Option<Entity>, PgError> {
    let (tenant, key): (&str, &str) = (row.try_get(0)?, row.try_get(1)?);
    let Some((format, value)) = stored(row, "record", tenant, key)? else {
        return Ok(None);
    };
    let record = codec::decode_record(Some(format), Some(value))
        .map_err(|e| corrupt("record", tenant, key, e))?
        .ok_or_else(|| corrupt("record", tenant, key, "no record"))?;
    // The order and the import go by the record's own key: it must be the row's.
    if Key::new(key).ok().as_ref() != Some(&record.key) {
        return Err(corrupt("record", tenant, key, "holds another key"));
    }
    Ok(Some(Entity::Record {
        tenant: tenant_of("record", tenant, key)?,
        record,
    }))
}

fn principal_entity(row: &Row) -> Result<Option<Entity>, PgError> {
    let (tenant, name): (&str, &str) = (row.try_get(0)?, row.try_get(1)?);
    let state = principal_state(row.try_get(2)?, row.try_get(3)?, row.try_get(4)?)
        .map_err(|e| corrupt("principal", tenant, name, e))?;
    Ok(Some(Entity::Principal {
        tenant: tenant_of("principal", tenant, name)?,
        principal: Principal::new(name).map_err(|e| corrupt("principal", tenant, name, e))?,
        state,
    }))
}

fn warnings_entity(row: &Row) -> Result<Option<Entity>, PgError> {
    let (tenant, task): (&str, &str) = (row.try_get(0)?, row.try_get(1)?);
    let Some((format, value)) = stored(row, "warnings of", tenant, task)? else {
        return Ok(None);
    };
    let warnings = codec::decode_warnings(Some(format), Some(value))
        .map_err(|e| corrupt("warnings of", tenant, task, e))?;
    Ok(Some(Entity::Warnings {
        tenant: tenant_of("warnings of", tenant, task)?,
        task: TaskId::new(task).map_err(|e| corrupt("task", tenant, task, e))?,
        warnings,
    }))
}
