//! The import (SPEC §12): an export file into an empty schema.
//!
//! The file is verified whole first (a damaged, truncated or newer file is
//! refused before anything is written). A target that holds rows is
//! refused next, before the schema is migrated (a refused import changes
//! nothing, not even an older store's schema version). Then one transaction locks the
//! three tables against writers, checks that they are empty, inserts every
//! entity (rows built as the write paths build them, `rows.rs` and
//! `codec.rs`), moves the fence sequence past every fence the file saw, and
//! commits: a killed importer leaves the target empty (the server rolls
//! the transaction back), a finished one leaves it complete.
//!
//! The file is read a second time to insert, on a blocking thread that
//! decodes and encodes the next batch while the previous one is inserted;
//! that pass checks every line again and must end on the same digest.

use std::fs::File;
use std::future::Future;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use settle_ledger::StoreError;
use settle_ledger::export::{CHUNK, ImportError, ImportReport};
use settle_portable::{Entity, Reader, Summary};
use tokio::sync::mpsc;
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use crate::codec::{self, FORMAT, PrincipalColumns};
use crate::rows::RecordRow;
use crate::schema::quoted;
use crate::sql::Sql;
use crate::state::check_durability;
use crate::{PgError, PgOptions, session};

/// How far the file is read ahead of the inserts (in batches).
const READ_AHEAD: usize = 2;

/// The tables whose rows make a target non-empty, and what the refusal
/// calls them.
const TABLES: [(&str, &str); 3] = [
    ("settle_records", "records"),
    ("settle_principals", "principals"),
    ("settle_warnings", "warnings"),
];

/// Imports the export `file` into the schema of `opts` on the database at
/// `url` (SPEC §12, `settle import --store`): only into an empty schema,
/// all of it or nothing. Refuses a schema that holds rows before anything
/// else, then migrates it as opening a store does. The next fence the store grants is at least the file's
/// [`Summary::import_floor`] with `margin` (never below the sequence's
/// current position). Calls `progress(entities, bytes read)` after each
/// batch inserted.
pub async fn import(
    url: &str,
    opts: PgOptions,
    file: &Path,
    margin: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<ImportReport, ImportError> {
    let summary = verify(file.to_path_buf()).await?;
    // Bounded before any work (SPEC §12): refused, nothing written.
    let floor = summary.import_floor(margin)?;
    // At most settle_portable::MAX_FENCE_FLOOR (< 2^53): the sequence's range.
    let floor = i64::try_from(floor).expect("import_floor is below 2^53");
    let checked = crate::Checked::connect(url, &opts)
        .await
        .map_err(StoreError::from)?;
    // Checked again, under the tables' lock, in the transaction below: a
    // writer may come between. This check only keeps a refused import from
    // migrating the target first.
    Target::new(&checked.client, &opts).refuse_held().await?;
    let (cfg, tls, _) = checked.migrate(&opts).await.map_err(StoreError::from)?;
    let (client, driver) = session::connect(&cfg, &tls)
        .await
        .map_err(|e| StoreError::from(PgError::from(e)))?;
    let target = Target::new(&client, &opts);
    let r = target
        .run(file.to_path_buf(), &summary, floor, &mut progress)
        .await;
    // Whatever happened, the session ends here; a transaction still open
    // (after an error) is rolled back by the server.
    drop(client);
    let _ = driver.await;
    let fence_floor = r?;
    progress(
        summary.records + summary.principals + summary.warning_tasks,
        summary.bytes,
    );
    Ok(ImportReport {
        summary,
        fence_floor: fence_floor as u64,
    })
}

/// Reads the whole file and checks it, off the async threads.
async fn verify(path: PathBuf) -> Result<Summary, ImportError> {
    tokio::task::spawn_blocking(move || {
        let f = File::open(&path)?;
        Ok(settle_portable::verify(BufReader::with_capacity(
            1 << 20,
            f,
        ))?)
    })
    .await
    .map_err(|e| ImportError::Io(std::io::Error::other(format!("verifying the file: {e}"))))?
}

/// The target schema on the import's own connection.
struct Target<'a> {
    client: &'a Client,
    schema: String,
    sql: Sql,
    timeout: Duration,
}

impl<'a> Target<'a> {
    fn new(client: &'a Client, opts: &PgOptions) -> Target<'a> {
        Target {
            client,
            schema: opts.schema.clone(),
            sql: Sql::new(&opts.schema, &opts.settings()),
            timeout: opts.client_timeout,
        }
    }

    /// One round trip under the client-side deadline.
    async fn within<T>(
        &self,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, PgError> {
        Ok(tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| PgError::Timeout(self.timeout))??)
    }

    /// The transaction: lock, check empty, insert, move the fence sequence,
    /// commit. Returns the next fence the store will grant.
    async fn run(
        &self,
        path: PathBuf,
        verified: &Summary,
        floor: i64,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<i64, ImportError> {
        self.begin().await.map_err(StoreError::from)?;
        self.check_empty().await?;
        let statements = self.prepare().await.map_err(StoreError::from)?;
        let (tx, mut rx) = mpsc::channel(READ_AHEAD);
        // Dropped with `rx` on an early return: the reader then stops.
        let reader = tokio::task::spawn_blocking(move || read_batches(&path, &tx));
        let mut read = None;
        while let Some(msg) = rx.recv().await {
            match msg? {
                Msg::Batch(b) => {
                    self.insert(&statements, &b)
                        .await
                        .map_err(StoreError::from)?;
                    progress(b.entities, b.bytes);
                }
                Msg::End(s) => read = Some(s),
            }
        }
        let _ = reader.await;
        // The file was verified before; it must not have changed since.
        match read {
            Some(s) if s.sha256 == verified.sha256 => {}
            _ => {
                return Err(settle_portable::Error::Damaged {
                    offset: 0,
                    reason: "the file changed while it was imported".into(),
                }
                .into());
            }
        }
        let next = self.set_fence(floor).await.map_err(StoreError::from)?;
        self.commit().await?;
        Ok(next)
    }

    /// Opens the transaction with the store's settings and refuses a
    /// server that would not make its commit durable.
    async fn begin(&self) -> Result<(), PgError> {
        self.within(self.client.batch_execute(&self.sql.begin))
            .await?;
        let row = self
            .within(self.client.query_one(&self.sql.durability, &[]))
            .await?;
        check_durability(row.try_get(0)?).map(|_| ())
    }

    /// Locks the tables against every writer until commit (readers go on),
    /// then checks that none holds a row.
    async fn check_empty(&self) -> Result<(), ImportError> {
        let s = quoted(&self.schema);
        let lock = format!(
            "LOCK TABLE {s}.settle_records, {s}.settle_principals, {s}.settle_warnings \
             IN EXCLUSIVE MODE"
        );
        self.within(self.client.batch_execute(&lock))
            .await
            .map_err(StoreError::from)?;
        self.refuse_held().await
    }

    /// Refuses the target if any of its tables holds a row. A table that
    /// does not exist (yet) holds none: the schema may be new, or a store
    /// of any version, read without migrating it.
    async fn refuse_held(&self) -> Result<(), ImportError> {
        let s = quoted(&self.schema);
        let names = TABLES.map(|(table, _)| format!("{s}.{table}"));
        let exist = self
            .within(self.client.query_one(
                "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, \
                        to_regclass($3) IS NOT NULL",
                &[&names[0], &names[1], &names[2]],
            ))
            .await
            .map_err(StoreError::from)?;
        let present: Vec<usize> = (0..TABLES.len()).filter(|&i| exist.get(i)).collect();
        if present.is_empty() {
            return Ok(());
        }
        let any = present
            .iter()
            .map(|&i| format!("EXISTS (SELECT 1 FROM {})", names[i]))
            .collect::<Vec<_>>()
            .join(", ");
        let row = self
            .within(self.client.query_one(&format!("SELECT {any}"), &[]))
            .await
            .map_err(StoreError::from)?;
        let held: Vec<&str> = present
            .iter()
            .enumerate()
            .filter(|&(col, _)| row.get::<_, bool>(col))
            .map(|(_, &i)| TABLES[i].1)
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        Err(ImportError::NotEmpty(format!(
            "schema {:?} holds {}",
            self.schema,
            held.join(" and ")
        )))
    }

    async fn prepare(&self) -> Result<[tokio_postgres::Statement; 3], PgError> {
        let s = quoted(&self.schema);
        let records = format!(
            "INSERT INTO {s}.settle_records (tenant, key, format, value, owner, status, \
               reconcile, lease_expires_at, lease_generation, updated_at, collect_at, \
               receipt_at, disputed) \
             SELECT tenant, key, format, value, owner, status, reconcile, lease_expires_at, \
               lease_generation::numeric, updated_at, collect_at, receipt_at, disputed \
             FROM unnest($1::text[], $2::text[], $3::int2[], $4::bytea[], $5::text[], \
               $6::int2[], $7::bool[], $8::int8[], $9::text[], $10::int8[], $11::int8[], \
               $12::int8[], $13::bool[]) \
             AS w(tenant, key, format, value, owner, status, reconcile, lease_expires_at, \
               lease_generation, updated_at, collect_at, receipt_at, disputed)"
        );
        let principals = format!(
            "INSERT INTO {s}.settle_principals (tenant, principal, generation, moved_at, moves) \
             SELECT tenant, principal, generation::numeric, moved_at, moves \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[]) \
             AS w(tenant, principal, generation, moved_at, moves)"
        );
        let warnings = format!(
            "INSERT INTO {s}.settle_warnings (tenant, task, format, value) \
             SELECT tenant, task, format, value \
             FROM unnest($1::text[], $2::text[], $3::int2[], $4::bytea[]) \
             AS w(tenant, task, format, value)"
        );
        Ok([
            self.within(self.client.prepare(&records)).await?,
            self.within(self.client.prepare(&principals)).await?,
            self.within(self.client.prepare(&warnings)).await?,
        ])
    }

    /// Inserts a batch (a statement per table it has rows for); each must
    /// insert every row it was given.
    async fn insert(&self, st: &[tokio_postgres::Statement; 3], b: &Batch) -> Result<(), PgError> {
        let r = &b.records;
        let record_params: [&(dyn ToSql + Sync); 13] = [
            &r.tenant,
            &r.key,
            &r.format,
            &r.value,
            &r.owner,
            &r.status,
            &r.reconcile,
            &r.lease_expires_at,
            &r.lease_generation,
            &r.updated_at,
            &r.collect_at,
            &r.receipt_at,
            &r.disputed,
        ];
        let p = &b.principals;
        let principal_params: [&(dyn ToSql + Sync); 5] = [
            &p.tenant,
            &p.principal,
            &p.generation,
            &p.moved_at,
            &p.moves,
        ];
        let w = &b.warnings;
        let warning_params: [&(dyn ToSql + Sync); 4] = [&w.tenant, &w.task, &w.format, &w.value];
        for (st, params, n) in [
            (&st[0], &record_params[..], r.tenant.len()),
            (&st[1], &principal_params[..], p.tenant.len()),
            (&st[2], &warning_params[..], w.tenant.len()),
        ] {
            if n == 0 {
                continue;
            }
            let inserted = self.within(self.client.execute(st, params)).await?;
            if inserted != n as u64 {
                return Err(PgError::Corrupt(format!(
                    "an import batch inserted {inserted} rows of {n}"
                )));
            }
        }
        Ok(())
    }

    /// Moves the fence sequence so that the next fence is `floor` (or
    /// leaves it where it is, if already past). `setval` is not undone by a
    /// rollback: done last, so an import that fails earlier leaves the
    /// sequence as it was, and one whose COMMIT fails leaves it only higher
    /// (harmless: fences must only grow).
    async fn set_fence(&self, floor: i64) -> Result<i64, PgError> {
        let s = quoted(&self.schema);
        let set = format!(
            "SELECT setval('{s}.settle_fence', \
               greatest($1::int8, CASE WHEN is_called THEN last_value + 1 ELSE last_value END), \
               false) \
             FROM {s}.settle_fence"
        );
        let row = self.within(self.client.query_one(&set, &[&floor])).await?;
        Ok(row.try_get(0)?)
    }

    /// Commits. A COMMIT whose answer is lost leaves the outcome unknown:
    /// the target is then either empty or complete (a second import says
    /// which: refused as not empty, or run again).
    async fn commit(&self) -> Result<(), ImportError> {
        match self
            .within(self.client.batch_execute(self.sql.commit))
            .await
        {
            Ok(()) => Ok(()),
            Err(PgError::Db(e)) if e.as_db_error().is_some() => {
                Err(StoreError::from(PgError::Db(e)).into())
            }
            Err(e) => Err(StoreError::InDoubt(format!(
                "the import's COMMIT got no answer ({e}): the target is either empty or \
                 holds the whole file"
            ))
            .into()),
        }
    }
}

/// What the reader thread sends.
enum Msg {
    Batch(Box<Batch>),
    /// The file was read to its trailer, which checked.
    End(Summary),
}

/// Up to [`CHUNK`] entities as column arrays, and how far the file was read.
#[derive(Default)]
struct Batch {
    records: RecordCols,
    principals: PrincipalCols,
    warnings: WarningCols,
    /// Entities read so far (this batch included).
    entities: u64,
    /// Bytes read so far.
    bytes: u64,
}

#[derive(Default)]
struct RecordCols {
    tenant: Vec<String>,
    key: Vec<String>,
    format: Vec<i16>,
    value: Vec<Vec<u8>>,
    owner: Vec<String>,
    status: Vec<i16>,
    reconcile: Vec<bool>,
    lease_expires_at: Vec<Option<i64>>,
    lease_generation: Vec<Option<String>>,
    updated_at: Vec<i64>,
    collect_at: Vec<Option<i64>>,
    receipt_at: Vec<Option<i64>>,
    disputed: Vec<bool>,
}

#[derive(Default)]
struct PrincipalCols {
    tenant: Vec<String>,
    principal: Vec<String>,
    generation: Vec<String>,
    moved_at: Vec<i64>,
    moves: Vec<Vec<u8>>,
}

#[derive(Default)]
struct WarningCols {
    tenant: Vec<String>,
    task: Vec<String>,
    format: Vec<i16>,
    value: Vec<Vec<u8>>,
}

impl Batch {
    /// Adds one entity, encoded as the write paths encode it.
    fn push(&mut self, e: Entity) -> Result<(), PgError> {
        match e {
            Entity::Record { tenant, record } => {
                let RecordRow {
                    format,
                    value,
                    cols,
                } = RecordRow::of(&record)?;
                let r = &mut self.records;
                r.tenant.push(tenant.as_str().to_string());
                r.key.push(record.key.as_str().to_string());
                r.format.push(format);
                r.value.push(value);
                r.owner.push(cols.owner);
                r.status.push(cols.status);
                r.reconcile.push(cols.reconcile);
                r.lease_expires_at.push(cols.lease_expires_at);
                r.lease_generation.push(cols.lease_generation);
                r.updated_at.push(cols.updated_at);
                r.collect_at.push(cols.collect_at);
                r.receipt_at.push(cols.receipt_at);
                r.disputed.push(cols.disputed);
            }
            Entity::Principal {
                tenant,
                principal,
                state,
            } => {
                let c = PrincipalColumns::of(&state)?;
                let p = &mut self.principals;
                p.tenant.push(tenant.as_str().to_string());
                p.principal.push(principal.as_str().to_string());
                p.generation.push(c.generation);
                p.moved_at.push(c.moved_at);
                p.moves.push(c.moves);
            }
            Entity::Warnings {
                tenant,
                task,
                warnings,
            } => {
                let w = &mut self.warnings;
                w.tenant.push(tenant.as_str().to_string());
                w.task.push(task.as_str().to_string());
                w.format.push(FORMAT);
                w.value.push(codec::encode(&warnings)?);
            }
        }
        Ok(())
    }
}

/// The reader thread: the file's entities in batches, then its summary.
/// Stops when the receiver is gone (the import failed).
fn read_batches(path: &Path, tx: &mpsc::Sender<Result<Msg, ImportError>>) {
    let send = |m| tx.blocking_send(m).is_ok();
    let mut reader = match File::open(path) {
        Ok(f) => match Reader::new(BufReader::with_capacity(1 << 20, f)) {
            Ok(r) => r,
            Err(e) => {
                send(Err(e.into()));
                return;
            }
        },
        Err(e) => {
            send(Err(e.into()));
            return;
        }
    };
    let mut batch = Batch::default();
    let mut n = 0u64;
    let mut in_batch = 0;
    loop {
        let e = match reader.next_entity() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                send(Err(e.into()));
                return;
            }
        };
        if let Err(e) = batch.push(e) {
            send(Err(StoreError::from(e).into()));
            return;
        }
        n += 1;
        in_batch += 1;
        if in_batch == CHUNK {
            batch.entities = n;
            batch.bytes = reader.offset();
            if !send(Ok(Msg::Batch(Box::new(std::mem::take(&mut batch))))) {
                return;
            }
            in_batch = 0;
        }
    }
    if in_batch > 0 {
        batch.entities = n;
        batch.bytes = reader.offset();
        if !send(Ok(Msg::Batch(Box::new(batch)))) {
            return;
        }
    }
    if let Some(s) = reader.summary() {
        send(Ok(Msg::End(s.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI and the server run an import on a spawned task.
    #[test]
    fn an_import_can_run_on_another_thread() {
        fn send<T: Send>(_: &T) {}
        let f = import("", PgOptions::default(), Path::new(""), 0, |_, _| {});
        send(&f);
    }
}
