-- settle's tables for bench/pg-bound, as the store's migrations create
-- them (crates/settle-pg/src/schema.rs: the records with their sweep,
-- stats and dispute indexes, the principals, the commit tokens), in
-- schema :"s". The raw protocol's tables are bench/pg-baseline-setup.sql's.
CREATE SCHEMA :"s";
SET search_path = :"s";
CREATE SEQUENCE settle_fence AS bigint START 1 CACHE 1 NO CYCLE;
CREATE TABLE settle_records (tenant text NOT NULL, key text NOT NULL, format smallint,
    value bytea, owner text, status smallint, reconcile boolean, lease_expires_at bigint,
    lease_generation numeric(20, 0), updated_at bigint, collect_at bigint, receipt_at bigint,
    disputed boolean, PRIMARY KEY (tenant, key));
CREATE INDEX settle_records_lease_due ON settle_records (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX settle_records_collect_due ON settle_records (collect_at)
    WHERE collect_at IS NOT NULL;
CREATE INDEX settle_records_open ON settle_records (status) WHERE status < 3;
CREATE INDEX settle_records_disputed ON settle_records (tenant) WHERE disputed;
CREATE TABLE settle_principals (tenant text NOT NULL, principal text NOT NULL,
    generation numeric(20, 0) NOT NULL, moved_at bigint NOT NULL, moves bytea,
    PRIMARY KEY (tenant, principal));
INSERT INTO settle_principals VALUES ('bench', 'w', 0, 0, NULL);
CREATE TABLE settle_commits (at bigint NOT NULL, token bytea NOT NULL,
    aborted boolean NOT NULL DEFAULT false, PRIMARY KEY (at, token));

-- The one-statement form: a function that takes the lock, checks the
-- generation after it (a VOLATILE function's queries see what committed
-- before them), writes the record (claim: a new one; settle: the update)
-- and the commit token, and fails unless both were written.
CREATE FUNCTION settle_write(claim boolean, t text, k text, v bytea, at int8, tok bytea)
RETURNS int8 LANGUAGE plpgsql VOLATILE AS $$
DECLARE n int8;
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true), set_config('lock_timeout', '5000', true),
          set_config('statement_timeout', '10000', true);
  PERFORM pg_advisory_xact_lock_shared(42);
  IF NOT EXISTS (SELECT 1 FROM settle_principals WHERE tenant = t AND principal = 'w' AND generation = 0)
  THEN RAISE EXCEPTION 'stale'; END IF;
  IF claim THEN
    INSERT INTO settle_records (tenant, key, format, value, owner, status, reconcile,
        lease_expires_at, lease_generation, updated_at, collect_at, receipt_at, disputed)
    VALUES (t, k, 1, v, 'w', 1, false, at + 30000, 0, at, NULL, NULL, false)
    ON CONFLICT DO NOTHING;
  ELSE
    UPDATE settle_records SET value = v, status = 4, lease_expires_at = NULL,
        collect_at = 99999999999, receipt_at = 99999999999, updated_at = at
    WHERE tenant = t AND key = k AND xmin::text <> '1';
  END IF;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n <> 1 THEN RAISE EXCEPTION 'stale'; END IF;
  INSERT INTO settle_commits (at, token) VALUES (at, tok);
  RETURN n;
END $$;
