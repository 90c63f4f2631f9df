//! The statements, schema-qualified once at connect. Each is prepared once
//! per connection (deadpool's statement cache).

use crate::schema::quoted;

/// The database clock in Unix milliseconds.
const NOW_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";

pub struct Sql {
    pub begin: &'static str,
    pub commit: &'static str,
    pub rollback: &'static str,
    /// `$1` keys (int8[]), `$2` exclusive? (bool[]), locked in array order.
    pub lock_principals: String,
    pub peek_owner: String,
    pub insert_record_placeholder: String,
    pub lock_record: String,
    pub insert_warnings_placeholder: String,
    pub lock_warnings: String,
    /// The clock, the transaction id, a fence when `$3`, and the principal rows named in `$2`.
    pub context: String,
    pub update_record: String,
    pub delete_record: String,
    pub raise_principal: String,
    pub update_warnings: String,
    pub get: String,
    pub warnings: String,
    pub now: String,
    pub xact_status: &'static str,
    pub due_leases: String,
    pub revoked_leases: String,
    pub due_collections: String,
    pub stats: String,
    // Group commit: the same steps for many commands at once.
    pub batch_load: String,
    pub batch_update_records: String,
    pub batch_delete_records: String,
}

impl Sql {
    pub fn new(schema: &str) -> Sql {
        let s = quoted(schema);
        let rec = format!("{s}.settle_records");
        let pri = format!("{s}.settle_principals");
        let war = format!("{s}.settle_warnings");
        Sql {
            // READ COMMITTED explicitly: the locking argument relies on each
            // statement seeing what committed before it started.
            begin: "BEGIN ISOLATION LEVEL READ COMMITTED",
            commit: "COMMIT",
            rollback: "ROLLBACK",
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
                "SELECT c.now_ms, c.xid, c.fence, p.principal, p.generation::text, p.moved_at \
                 FROM (SELECT {NOW_MS} AS now_ms, pg_current_xact_id()::text::int8 AS xid, \
                       CASE WHEN $3 THEN nextval('{s}.settle_fence') END AS fence OFFSET 0) c \
                 LEFT JOIN {pri} p ON p.tenant = $1 AND p.principal = ANY($2::text[])"
            ),
            update_record: format!(
                "UPDATE {rec} SET format = $3, value = $4, owner = $5, status = $6, \
                 reconcile = $7, lease_expires_at = $8, lease_generation = $9::text::numeric, \
                 updated_at = $10, collect_at = $11, receipt_at = $12 \
                 WHERE tenant = $1 AND key = $2"
            ),
            delete_record: format!("DELETE FROM {rec} WHERE tenant = $1 AND key = $2"),
            // The exclusive lock makes this a plain write; the guard keeps the
            // generation monotonic even if that were ever wrong.
            raise_principal: format!(
                "INSERT INTO {pri} AS p (tenant, principal, generation, moved_at) \
                 VALUES ($1, $2, $3::text::numeric, $4) \
                 ON CONFLICT (tenant, principal) DO UPDATE \
                 SET generation = EXCLUDED.generation, moved_at = EXCLUDED.moved_at \
                 WHERE p.generation < EXCLUDED.generation"
            ),
            update_warnings: format!(
                "UPDATE {war} SET format = $3, value = $4 WHERE tenant = $1 AND task = $2"
            ),
            get: format!(
                "SELECT c.now_ms, r.format, r.value, p.generation::text, p.moved_at \
                 FROM (SELECT {NOW_MS} AS now_ms OFFSET 0) c \
                 LEFT JOIN {rec} r ON r.tenant = $1 AND r.key = $2 \
                 LEFT JOIN {pri} p ON p.tenant = r.tenant AND p.principal = r.owner"
            ),
            warnings: format!("SELECT format, value FROM {war} WHERE tenant = $1 AND task = $2"),
            now: format!("SELECT {NOW_MS}"),
            xact_status: "SELECT pg_xact_status($1::text::xid8)",
            due_leases: format!(
                "SELECT tenant, key FROM {rec} \
                 WHERE lease_expires_at <= {NOW_MS} + $1 ORDER BY lease_expires_at LIMIT $2"
            ),
            revoked_leases: format!(
                "SELECT r.tenant, r.key FROM {rec} r \
                 JOIN {pri} p ON p.tenant = r.tenant AND p.principal = r.owner \
                 WHERE r.lease_expires_at IS NOT NULL AND r.lease_generation < p.generation \
                 LIMIT $1"
            ),
            due_collections: format!(
                "SELECT tenant, key FROM {rec} \
                 WHERE collect_at <= {NOW_MS} + $1 ORDER BY collect_at LIMIT $2"
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
                   (SELECT count(*) FROM {rec}, c WHERE receipt_at > c.now_ms)"
            ),
            // One statement after the principal locks: insert placeholders
            // for keys a claim may create (in key order), lock the rows in
            // key order, then — only after both, by data dependency — read
            // the clock, draw the fences and read the principal rows.
            // Placeholders inserted here are invisible to `locked` (same
            // snapshot); they are reported through `ins` instead.
            batch_load: format!(
                "WITH ins AS ( \
                   INSERT INTO {rec} (tenant, key) \
                   SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k) ORDER BY t, k \
                   ON CONFLICT DO NOTHING RETURNING tenant, key), \
                 locked AS MATERIALIZED ( \
                   SELECT tenant, key, format, value FROM {rec} \
                   WHERE (tenant, key) IN (SELECT t, k FROM unnest($3::text[], $4::text[]) AS u(t, k)) \
                     AND (SELECT count(*) FROM ins) >= 0 \
                   ORDER BY tenant, key FOR UPDATE), \
                 l AS MATERIALIZED ( \
                   SELECT array_agg(tenant) AS lt, array_agg(key) AS lk, array_agg(format) AS lf, \
                          array_agg(value) AS lv, count(*) AS n FROM locked) \
                 SELECT l.lt, l.lk, l.lf, l.lv, \
                        (SELECT array_agg(tenant) FROM ins), (SELECT array_agg(key) FROM ins), \
                        c.now_ms, c.xid, c.fences, c.pt, c.pn, c.pg, c.pm \
                 FROM l CROSS JOIN LATERAL ( \
                   SELECT {NOW_MS} AS now_ms, pg_current_xact_id()::text::int8 AS xid, \
                          ARRAY(SELECT nextval('{s}.settle_fence') \
                                FROM generate_series(1, $5::int4)) AS fences, \
                          p.pt, p.pn, p.pg, p.pm \
                   FROM (SELECT array_agg(tenant) AS pt, array_agg(principal) AS pn, \
                                array_agg(generation::text) AS pg, array_agg(moved_at) AS pm \
                         FROM {pri} WHERE (tenant, principal) IN \
                           (SELECT t, n FROM unnest($6::text[], $7::text[]) AS u(t, n))) p \
                   WHERE l.n >= 0) c"
            ),
            batch_update_records: format!(
                "UPDATE {rec} AS r SET format = u.format, value = u.value, owner = u.owner, \
                 status = u.status, reconcile = u.reconcile, lease_expires_at = u.lease_expires_at, \
                 lease_generation = u.lease_generation::numeric, updated_at = u.updated_at, \
                 collect_at = u.collect_at, receipt_at = u.receipt_at \
                 FROM unnest($1::text[], $2::text[], $3::int2[], $4::bytea[], $5::text[], $6::int2[], \
                             $7::bool[], $8::int8[], $9::text[], $10::int8[], $11::int8[], $12::int8[]) \
                   AS u(tenant, key, format, value, owner, status, reconcile, lease_expires_at, \
                        lease_generation, updated_at, collect_at, receipt_at) \
                 WHERE r.tenant = u.tenant AND r.key = u.key"
            ),
            batch_delete_records: format!(
                "DELETE FROM {rec} WHERE (tenant, key) IN \
                 (SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k))"
            ),
        }
    }
}
