//! The statements, schema-qualified once at connect. Each is prepared once
//! per connection (deadpool's statement cache).

use crate::codec::READ_FORMATS_SQL;
use crate::schema::quoted;

/// How the batch write statement says that a row changed under it.
pub const STALE: &str = "settle: stale batch write:";

/// How far behind the database clock, at its write, the one-round-trip
/// path's estimate of it may be (`warm_check`). The two-round-trip path
/// reads the clock after the call; the estimate is taken from the last
/// read and can lag by that read's return trip plus anything that stalled
/// the process since (a retransmission, a pause): bounded here, at the
/// cost of a fallback.
pub const MAX_CLOCK_LAG_MS: i64 = 25;

/// The database clock in Unix milliseconds.
pub(crate) const NOW_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// The durability settings in force for this transaction, as
/// `fsync/synchronous_commit`, with `/standby` when a synchronous standby
/// must confirm commits; anything but `on/on` is refused.
const DURABILITY: &str = "current_setting('fsync') || '/' || current_setting('synchronous_commit') \
     || CASE WHEN current_setting('synchronous_standby_names') = '' THEN '' ELSE '/standby' END";

/// The server's durability settings and identity: system identifier (kept
/// by a promoted standby), postmaster start time (NOT changed by a
/// crash-restart), whether it is in recovery, and its current timeline
/// (the first 8 hex digits of the current WAL file name; none on a standby).
pub const SERVER: &str = "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
       (SELECT system_identifier FROM pg_control_system())::text, \
       pg_postmaster_start_time()::text, pg_is_in_recovery(), \
       CASE WHEN pg_is_in_recovery() THEN NULL \
            ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

pub struct Sql {
    /// `BEGIN` and the settings every transaction runs under (SET LOCAL, so
    /// that a pooler in front of PostgreSQL cannot drop them).
    pub begin: String,
    /// The same for in-doubt probes: a short lock timeout, so a probe that
    /// meets the interrupted transaction still running gives up and asks again.
    pub probe_begin: String,
    /// `COMMIT`, as its own message (after a failed statement it still
    /// runs, and rolls back). PostgreSQL disables the statement timeout
    /// before it commits, so a COMMIT waiting for a synchronous standby is
    /// never cut short by it (checked by `tests/crash.rs`).
    pub commit: &'static str,
    pub rollback: &'static str,
    /// Group commit: `BEGIN` alone, then `settings` and `lock_principals` as
    /// prepared statements (no parsing per batch), pipelined before the load.
    pub batch_begin: &'static str,
    pub settings: String,
    /// `$1` keys (int8[]), `$2` exclusive? (bool[]), locked in array order.
    pub lock_principals: String,
    pub peek_owner: String,
    pub insert_record_placeholder: String,
    pub lock_record: String,
    pub insert_warnings_placeholder: String,
    pub lock_warnings: String,
    /// The clock, the durability settings in force, a fence when `$3`, and
    /// the principal rows named in `$2`.
    pub context: String,
    /// This transaction's commit token (`settle_commits`).
    pub insert_token: String,
    /// In-doubt probe: claims the token for an abort (`aborted`) unless the
    /// interrupted transaction wrote it; waits for that transaction if it is
    /// still running.
    pub probe_claim: String,
    /// In-doubt probe: whether the token present is the transaction's own or
    /// an abort marker.
    pub probe_read: String,
    /// Deletes commit tokens older than `$1` ms (at most `$2` of them).
    pub expire_tokens: String,
    /// The server's durability settings and identity.
    pub server: &'static str,
    /// The durability settings in force for the current transaction.
    pub durability: String,
    /// The current rows of records (`$1` tenants, `$2` keys) known not to decode.
    pub recheck: String,
    pub update_record: String,
    pub delete_record: String,
    pub raise_principal: String,
    pub update_warnings: String,
    pub get: String,
    pub warnings: String,
    /// A principal's row (`$1` tenant, `$2` principal).
    pub generation: String,
    pub now: String,
    pub due_leases: String,
    pub revoked_leases: String,
    pub due_collections: String,
    pub stats: String,
    /// The inspection scan: the clock, then up to `$3` records of tenant
    /// `$1` after key `$2` in key order (the primary key's index) with
    /// their owners' generations.
    pub scan: String,
    // Group commit: the same steps for many commands at once.
    pub batch_load: String,
    /// `batch_load` for one record and one principal (each client alone):
    /// the same parameters and rows, matched as `$n[1]` instead of through
    /// `unnest` (about 0.05 ms less of planning and execution a batch).
    pub batch_load_one: String,
    pub batch_write: String,
    /// `batch_write` for a batch of one record (each client alone, low
    /// concurrency), one statement per operation.
    pub batch_write_one: OneWrite,
    /// The one-round-trip path's writes: `batch_write` and
    /// `batch_write_one` checking also what the batch was decided on
    /// ([`warm_check`]; parameters [`WARM_WRITE_TYPES`]).
    pub warm_write: String,
    pub warm_write_one: OneWrite,
}

/// What every transaction runs under (see `PgOptions`), in milliseconds.
pub struct Settings {
    pub statement_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    pub idle_in_transaction_timeout_ms: u64,
    /// The lock timeout of an in-doubt probe.
    pub probe_lock_timeout_ms: u64,
}

/// READ COMMITTED explicitly: the locking argument relies on each
/// statement seeing what committed before it started.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The transaction's settings: set_config(…, true) is SET LOCAL; one
/// statement for all four.
fn settings_sql(lock_timeout_ms: u64, s: &Settings) -> String {
    format!(
        "SELECT set_config('synchronous_commit', 'on', true), \
                set_config('lock_timeout', '{lock_timeout_ms}', true), \
                set_config('statement_timeout', '{}', true), \
                set_config('idle_in_transaction_session_timeout', '{}', true)",
        s.statement_timeout_ms, s.idle_in_transaction_timeout_ms
    )
}

fn begin(lock_timeout_ms: u64, s: &Settings) -> String {
    format!("{BEGIN}; {}", settings_sql(lock_timeout_ms, s))
}

impl Sql {
    // The statement table: one entry per statement, nothing to split.
    #[allow(clippy::too_many_lines)]
    pub fn new(schema: &str, settings: &Settings) -> Sql {
        let s = quoted(schema);
        let com = format!("{s}.settle_commits");
        let rec = format!("{s}.settle_records");
        let pri = format!("{s}.settle_principals");
        let war = format!("{s}.settle_warnings");
        Sql {
            begin: begin(settings.lock_timeout_ms, settings),
            probe_begin: begin(settings.probe_lock_timeout_ms, settings),
            commit: "COMMIT",
            rollback: "ROLLBACK",
            batch_begin: BEGIN,
            settings: settings_sql(settings.lock_timeout_ms, settings),
            lock_principals: "SELECT CASE WHEN x THEN pg_advisory_xact_lock(k) \
                 ELSE pg_advisory_xact_lock_shared(k) END \
                 FROM unnest($1::int8[], $2::bool[]) AS t(k, x)"
                .to_string(),
            peek_owner: format!("SELECT owner FROM {rec} WHERE tenant = $1 AND key = $2"),
            insert_record_placeholder: format!(
                "INSERT INTO {rec} (tenant, key) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            lock_record: format!(
                "SELECT format, value FROM {rec} WHERE tenant = $1 AND key = $2 FOR UPDATE"
            ),
            insert_warnings_placeholder: format!(
                "INSERT INTO {war} (tenant, task) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            lock_warnings: format!(
                "SELECT format, value FROM {war} WHERE tenant = $1 AND task = $2 FOR UPDATE"
            ),
            // OFFSET 0 keeps the volatile calls in a subquery evaluated once,
            // whatever the number of principal rows joined to it.
            context: format!(
                "SELECT c.now_ms, c.durability, c.fence, p.principal, p.generation::text, p.moved_at, p.moves \
                 FROM (SELECT {NOW_MS} AS now_ms, {DURABILITY} AS durability, \
                       CASE WHEN $3 THEN nextval('{s}.settle_fence') END AS fence OFFSET 0) c \
                 LEFT JOIN {pri} p ON p.tenant = $1 AND p.principal = ANY($2::text[])"
            ),
            insert_token: format!("INSERT INTO {com} (at, token) VALUES ($1, $2)"),
            probe_claim: format!(
                "WITH ins AS (INSERT INTO {com} (at, token, aborted) VALUES ($1, $2, true) \
                   ON CONFLICT DO NOTHING RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM ins)"
            ),
            probe_read: format!("SELECT aborted FROM {com} WHERE at = $1 AND token = $2"),
            // `at` is the database's own clock (unskewed), as is NOW_MS.
            expire_tokens: format!(
                "DELETE FROM {com} WHERE (at, token) IN \
                   (SELECT at, token FROM {com} WHERE at < {NOW_MS} - $1 ORDER BY at LIMIT $2)"
            ),
            server: SERVER,
            durability: format!("SELECT {DURABILITY}"),
            recheck: format!(
                "SELECT tenant, key, format, value FROM {rec} \
                 WHERE (tenant, key) IN (SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k))"
            ),
            update_record: format!(
                "UPDATE {rec} SET format = $3, value = $4, owner = $5, status = $6, \
                 reconcile = $7, lease_expires_at = $8, lease_generation = $9::text::numeric, \
                 updated_at = $10, collect_at = $11, receipt_at = $12, disputed = $13 \
                 WHERE tenant = $1 AND key = $2"
            ),
            delete_record: format!("DELETE FROM {rec} WHERE tenant = $1 AND key = $2"),
            // The exclusive lock makes this a plain write; the guard keeps the
            // generation monotonic even if that were ever wrong.
            raise_principal: format!(
                "INSERT INTO {pri} AS p (tenant, principal, generation, moved_at, moves) \
                 VALUES ($1, $2, $3::text::numeric, $4, $5) \
                 ON CONFLICT (tenant, principal) DO UPDATE \
                 SET generation = EXCLUDED.generation, moved_at = EXCLUDED.moved_at, \
                     moves = EXCLUDED.moves \
                 WHERE p.generation < EXCLUDED.generation"
            ),
            update_warnings: format!(
                "UPDATE {war} SET format = $3, value = $4 WHERE tenant = $1 AND task = $2"
            ),
            get: format!(
                "SELECT c.now_ms, r.format, r.value, p.generation::text, p.moved_at, p.moves \
                 FROM (SELECT {NOW_MS} AS now_ms OFFSET 0) c \
                 LEFT JOIN {rec} r ON r.tenant = $1 AND r.key = $2 \
                 LEFT JOIN {pri} p ON p.tenant = r.tenant AND p.principal = r.owner"
            ),
            warnings: format!("SELECT format, value FROM {war} WHERE tenant = $1 AND task = $2"),
            generation: format!(
                "SELECT generation::text, moved_at, moves FROM {pri} WHERE tenant = $1 AND principal = $2"
            ),
            now: format!("SELECT {NOW_MS}"),
            due_leases: format!(
                "SELECT tenant, key FROM {rec} \
                 WHERE lease_expires_at <= {NOW_MS} + $1 AND format IN ({READ_FORMATS_SQL}) \
                 ORDER BY lease_expires_at LIMIT $2"
            ),
            revoked_leases: format!(
                "SELECT r.tenant, r.key FROM {rec} r \
                 JOIN {pri} p ON p.tenant = r.tenant AND p.principal = r.owner \
                 WHERE r.lease_expires_at IS NOT NULL AND r.lease_generation < p.generation \
                   AND r.format IN ({READ_FORMATS_SQL}) \
                 LIMIT $1"
            ),
            due_collections: format!(
                "SELECT tenant, key FROM {rec} \
                 WHERE collect_at <= {NOW_MS} + $1 AND format IN ({READ_FORMATS_SQL}) \
                 ORDER BY collect_at LIMIT $2"
            ),
            stats: format!(
                "WITH c AS (SELECT {NOW_MS} + $1 AS now_ms OFFSET 0) \
                 SELECT \
                   (SELECT count(*) FROM {rec} WHERE status < 3), \
                   (SELECT count(*) FROM {rec} WHERE status = 0), \
                   (SELECT count(*) FROM {rec} WHERE status = 1), \
                   (SELECT count(*) FROM {rec} WHERE status = 2), \
                   (SELECT count(*) FROM {rec} WHERE status < 3 AND reconcile), \
                   (SELECT count(*) FROM {rec}, c WHERE status < 3 \
                      AND lease_expires_at IS NULL AND greatest(c.now_ms - updated_at, 0) >= $2), \
                   (SELECT count(*) FROM {rec}, c WHERE receipt_at > c.now_ms), \
                   (SELECT count(*) FROM {rec} WHERE disputed), \
                   (SELECT count(*) FROM {rec} WHERE format NOT IN ({READ_FORMATS_SQL}))"
            ),
            scan: format!(
                "SELECT c.now_ms, r.key, r.format, r.value, p.generation::text, p.moved_at, p.moves \
                 FROM (SELECT {NOW_MS} AS now_ms OFFSET 0) c \
                 LEFT JOIN LATERAL (SELECT key, format, value, owner FROM {rec} \
                     WHERE tenant = $1 AND key > $2 AND value IS NOT NULL \
                     ORDER BY key LIMIT $3) r ON true \
                 LEFT JOIN {pri} p ON p.tenant = $1 AND p.principal = r.owner \
                 ORDER BY r.key"
            ),
            batch_load: batch_load(
                &s,
                &rec,
                &pri,
                "(tenant, principal) IN (SELECT t, n FROM unnest($4::text[], $5::text[]) AS u(t, n))",
                "(r.tenant, r.key) IN (SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k))",
            ),
            batch_load_one: batch_load(
                &s,
                &rec,
                &pri,
                "tenant = ($4::text[])[1] AND principal = ($5::text[])[1]",
                "r.tenant = ($1::text[])[1] AND r.key = ($2::text[])[1]",
            ),
            // All of a batch's writes in one statement: updates and deletes
            // compare-and-set on xmin; inserts of new records must not
            // conflict, and must happen within 500 ms of the load (shorter
            // than any retention, so no record of the same key can have been
            // created, settled and collected in between with a higher fence).
            // Anything less than every row fails the statement, so the
            // COMMIT after it is a rollback. The batch's commit token is
            // written by the same statement (one message fewer per batch).
            batch_write: batch_write(&rec, &com, ""),
            batch_write_one: OneWrite::new(&rec, &com, ""),
            warm_write: batch_write(&rec, &com, &warm_check(&s, &pri)),
            warm_write_one: OneWrite::new(&rec, &com, &warm_check(&s, &pri)),
        }
    }
}

/// The write of a batch of any size (see `Sql::batch_write`), with `check`.
fn batch_write(rec: &str, com: &str, check: &str) -> String {
    with_token(
        com,
        &format!(
            "w AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], \
                       $4::text[], $5::int2[], $6::bytea[], $7::text[], $8::int2[], $9::bool[], \
                       $10::int8[], $11::text[], $12::int8[], $13::int8[], $14::int8[], \
                       $15::bool[]) \
                     AS w(tenant, key, op, v, format, value, owner, status, reconcile, \
                          lease_expires_at, lease_generation, updated_at, collect_at, receipt_at, \
                          disputed)), \
                 upd AS (UPDATE {rec} AS r SET format = w.format, value = w.value, \
                       owner = w.owner, status = w.status, reconcile = w.reconcile, \
                       lease_expires_at = w.lease_expires_at, \
                       lease_generation = w.lease_generation::numeric, updated_at = w.updated_at, \
                       collect_at = w.collect_at, receipt_at = w.receipt_at, disputed = w.disputed \
                     FROM w WHERE w.op = 'u' AND r.tenant = w.tenant AND r.key = w.key \
                       AND r.xmin::text = w.v RETURNING 1), \
                 ins AS (INSERT INTO {rec} ({RECORD_COLUMNS}) \
                     SELECT tenant, key, format, value, owner, status, reconcile, lease_expires_at, \
                       lease_generation::numeric, updated_at, collect_at, receipt_at, disputed \
                     FROM w WHERE op = 'i' AND {NOW_MS} < $16 \
                     ON CONFLICT DO NOTHING RETURNING 1), \
                 del AS (DELETE FROM {rec} AS r USING w WHERE w.op = 'd' AND r.tenant = w.tenant \
                       AND r.key = w.key AND r.xmin::text = w.v RETURNING 1)"
        ),
        "(SELECT count(*) FROM upd) + (SELECT count(*) FROM ins) \
                 + (SELECT count(*) FROM del)",
        check,
    )
}

/// The columns of a record row, in the order the write statements insert them.
const RECORD_COLUMNS: &str = "tenant, key, format, value, owner, status, reconcile, \
     lease_expires_at, lease_generation, updated_at, collect_at, receipt_at, disputed";

/// A batch write statement: the common table expressions `ctes` that write
/// the rows, then the batch's commit token, then the check — `rows` (the
/// rows written) must be `$17` and the token written, or the statement
/// fails with [`STALE`] and the COMMIT after it rolls back.
///
/// Its second column is the transaction's id as the rows' `xmin` (what a
/// later write compares them with). `check` is a further condition the
/// statement must meet (the one-round-trip path's, [`warm_check`]), or empty.
fn with_token(com: &str, ctes: &str, rows: &str, check: &str) -> String {
    format!(
        "WITH {ctes}, \
         tok AS (INSERT INTO {com} (at, token) VALUES ($18, $19) RETURNING xmin::text AS x) \
         SELECT CASE WHEN n = $17 AND t = 1 {check} THEN n \
                ELSE ('{STALE} ' || n || ' of ' || $17 || ' rows')::int8 END, x \
         FROM (SELECT {rows} AS n, (SELECT count(*) FROM tok) AS t, \
                      (SELECT min(x) FROM tok) AS x) x"
    )
}

/// What the one-round-trip path's write checks beyond the batch write's:
/// that it decided on the principal rows as they are (`$20`–`$24`:
/// tenants, principals, and the generation, `moved_at` and moves it knew,
/// all NULL for no row) — read after the batch's shared locks, so every
/// committed move is seen, as the load's read is —, that its estimate of
/// the database clock (`$25`) is not ahead of the clock nor more than
/// [`MAX_CLOCK_LAG_MS`] behind it (so the time it decided at is never
/// more than that before the call, whatever delayed it), and that the
/// transaction runs durable (the load's read-back, here) and, for a batch
/// with claims, that no fence was drawn since its block was (`$26`, the
/// block's last fence, is still the sequence's): fences taken from the
/// block are then above every fence granted before, store-wide (SPEC §2).
/// `pg_sequence_last_value`, not a `SELECT` from the sequence: connections
/// price sequential scans out, and that price made the planner compile the
/// statement with JIT (200 ms an execution).
fn warm_check(s: &str, pri: &str) -> String {
    format!(
        "AND {DURABILITY} = 'on/on' AND $25 <= {NOW_MS} AND {NOW_MS} - $25 <= {MAX_CLOCK_LAG_MS} \
         AND ($26::int8 IS NULL OR pg_sequence_last_value('{s}.settle_fence'::regclass) = $26) \
         AND NOT EXISTS (SELECT 1 FROM unnest($20::text[], $21::text[], $22::text[], \
               $23::int8[], $24::bytea[]) AS c(t, n, g, m, v) \
             LEFT JOIN {pri} p ON p.tenant = c.t AND p.principal = c.n \
             WHERE p.generation::text IS DISTINCT FROM c.g \
                OR p.moved_at IS DISTINCT FROM c.m OR p.moves IS DISTINCT FROM c.v)"
    )
}

/// The group commit's read: the clock, the durability settings, `$3`
/// fences, the principal rows matching `principals` (aggregated: one row
/// whatever their number) and the records matching `records` (one row
/// each, or one row of NULLs). Group commit reads without row locks (one
/// snapshot, taken after the principal locks) and validates at write time:
/// each row is written only if its xmin is still the one read. The last
/// column reads the clock again, as late in the statement as it can: the
/// one-round-trip path estimates the clock from it.
fn batch_load(s: &str, rec: &str, pri: &str, principals: &str, records: &str) -> String {
    format!(
        "SELECT c.now_ms, c.durability, c.fences, p.pt, p.pn, p.pg, p.pm, \
                r.tenant, r.key, r.format, r.value, r.xmin::text, p.pv, {NOW_MS} \
         FROM (SELECT {NOW_MS} AS now_ms, {DURABILITY} AS durability, \
               ARRAY(SELECT nextval('{s}.settle_fence') \
                     FROM generate_series(1, $3::int4)) AS fences OFFSET 0) c \
         CROSS JOIN (SELECT array_agg(tenant) AS pt, array_agg(principal) AS pn, \
                            array_agg(generation::text) AS pg, array_agg(moved_at) AS pm, \
                            array_agg(moves) AS pv \
                     FROM {pri} WHERE {principals}) p \
         LEFT JOIN {rec} r ON {records}"
    )
}

/// The parameters' types of `batch_write` and every [`OneWrite`]
/// statement, given at prepare time: a one-record statement leaves some
/// of them unused, and PostgreSQL cannot infer the type of an unused one.
pub const BATCH_WRITE_TYPES: [tokio_postgres::types::Type; 19] = {
    use tokio_postgres::types::Type;
    [
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT2_ARRAY,
        Type::BYTEA_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT2_ARRAY,
        Type::BOOL_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8_ARRAY,
        Type::BOOL_ARRAY,
        Type::INT8,
        Type::INT8,
        Type::INT8,
        Type::BYTEA,
    ]
};

/// [`BATCH_WRITE_TYPES`], then what [`warm_check`] compares.
pub static WARM_WRITE_TYPES: std::sync::LazyLock<Vec<tokio_postgres::types::Type>> =
    std::sync::LazyLock::new(|| {
        use tokio_postgres::types::Type;
        let mut t = BATCH_WRITE_TYPES.to_vec();
        t.extend([
            Type::TEXT_ARRAY,
            Type::TEXT_ARRAY,
            Type::TEXT_ARRAY,
            Type::INT8_ARRAY,
            Type::BYTEA_ARRAY,
            Type::INT8,
            Type::INT8,
        ]);
        t
    });

/// The write of a batch of one record: `batch_write`'s parameters (arrays
/// of one, read as `$n[1]` instead of through `unnest` and a materialised
/// row set) and checks, one statement per operation. A statement with all
/// three DML parts costs the executor's set-up of all three (each opens
/// the table's five indexes) whichever runs: measured 0.17 ms against
/// 0.10 ms for the insert alone.
pub struct OneWrite {
    pub insert: String,
    pub update: String,
    pub delete: String,
}

impl OneWrite {
    fn new(rec: &str, com: &str, check: &str) -> OneWrite {
        let tail = |part: &str| {
            with_token(
                com,
                &format!("w AS ({part})"),
                "(SELECT count(*) FROM w)",
                check,
            )
        };
        OneWrite {
            update: tail(&format!(
                "UPDATE {rec} AS r SET format = ($5::int2[])[1], \
                   value = ($6::bytea[])[1], owner = ($7::text[])[1], \
                   status = ($8::int2[])[1], reconcile = ($9::bool[])[1], \
                   lease_expires_at = ($10::int8[])[1], \
                   lease_generation = (($11::text[])[1])::numeric, \
                   updated_at = ($12::int8[])[1], collect_at = ($13::int8[])[1], \
                   receipt_at = ($14::int8[])[1], disputed = ($15::bool[])[1] \
                 WHERE ($3::text[])[1] = 'u' AND r.tenant = ($1::text[])[1] \
                   AND r.key = ($2::text[])[1] AND r.xmin::text = ($4::text[])[1] \
                 RETURNING 1"
            )),
            insert: tail(&format!(
                "INSERT INTO {rec} ({RECORD_COLUMNS}) \
                 SELECT ($1::text[])[1], ($2::text[])[1], ($5::int2[])[1], \
                   ($6::bytea[])[1], ($7::text[])[1], ($8::int2[])[1], ($9::bool[])[1], \
                   ($10::int8[])[1], (($11::text[])[1])::numeric, ($12::int8[])[1], \
                   ($13::int8[])[1], ($14::int8[])[1], ($15::bool[])[1] \
                 WHERE ($3::text[])[1] = 'i' AND {NOW_MS} < $16 \
                 ON CONFLICT DO NOTHING RETURNING 1"
            )),
            delete: tail(&format!(
                "DELETE FROM {rec} AS r WHERE ($3::text[])[1] = 'd' \
                   AND r.tenant = ($1::text[])[1] AND r.key = ($2::text[])[1] \
                   AND r.xmin::text = ($4::text[])[1] RETURNING 1"
            )),
        }
    }

    /// The statement for `op` (`i`, `u` or `d`, as `batch_write`'s `$3`).
    pub fn of(&self, op: &str) -> &str {
        match op {
            "i" => &self.insert,
            "u" => &self.update,
            "d" => &self.delete,
            other => unreachable!("batch write op {other:?}"),
        }
    }
}
