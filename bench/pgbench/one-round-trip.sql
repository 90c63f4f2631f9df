-- settle's writes, each command in ONE round trip (pipelined): BEGIN, the
-- transaction's settings, the principal's shared lock, one statement that
-- checks the generation, writes the record (a 400-byte value, as a settled
-- record's) and the commit token, and COMMIT. No read round trip: the
-- best a client that validates instead of reading could do.
\set k random(1, 2000000000)
\set t random(1, 2000000000)
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT set_config('synchronous_commit', 'on', true), set_config('lock_timeout', '5000', true),
    set_config('statement_timeout', '10000', true), set_config('idle_in_transaction_session_timeout', '30000', true);
SELECT pg_advisory_xact_lock_shared(42);
WITH ins AS (INSERT INTO settle_records (tenant, key, format, value, owner, status, reconcile,
        lease_expires_at, lease_generation, updated_at, collect_at, receipt_at, disputed)
    SELECT 'bench', :client_id || '-' || :k, 1::int2, decode(repeat('07', 400), 'hex'), 'w', 1::int2, false,
        :t + 30000, 0::numeric, :t, NULL::int8, NULL::int8, false
    WHERE floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 > 0
      AND EXISTS (SELECT 1 FROM settle_principals WHERE tenant = 'bench' AND principal = 'w' AND generation = 0)
    ON CONFLICT DO NOTHING RETURNING 1),
  tok AS (INSERT INTO settle_commits (at, token) VALUES (:t, int8send(:k)) RETURNING 1)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM tok);
COMMIT;
\endpipeline
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT set_config('synchronous_commit', 'on', true), set_config('lock_timeout', '5000', true),
    set_config('statement_timeout', '10000', true), set_config('idle_in_transaction_session_timeout', '30000', true);
SELECT pg_advisory_xact_lock_shared(42);
WITH upd AS (UPDATE settle_records AS r SET value = decode(repeat('07', 400), 'hex'), status = 4,
        lease_expires_at = NULL, collect_at = 99999999999, receipt_at = 99999999999, updated_at = 1
    WHERE r.tenant = 'bench' AND r.key = :client_id || '-' || :k AND r.xmin::text <> '1'
      AND EXISTS (SELECT 1 FROM settle_principals WHERE tenant = 'bench' AND principal = 'w' AND generation = 0)
    RETURNING 1),
  tok AS (INSERT INTO settle_commits (at, token) VALUES (:t + 1, int8send(:k)) RETURNING 1)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM tok);
COMMIT;
\endpipeline
