-- Tables for bench/pg-baseline.sql: the raw claim/settle protocol without
-- settle's rules (no reservation check, no principal generations, no
-- lattice, no quarantine, no audit trail).
--   psql -h 127.0.0.1 -U postgres -d test -f bench/pg-baseline-setup.sql
DROP SCHEMA IF EXISTS bench_baseline CASCADE;
CREATE SCHEMA bench_baseline;
CREATE SEQUENCE bench_baseline.fence CACHE 1;
CREATE TABLE bench_baseline.ops (
    tenant text NOT NULL,
    key text NOT NULL,
    fence bigint NOT NULL,
    status smallint NOT NULL DEFAULT 0,
    result text,
    response_sha256 bytea,
    PRIMARY KEY (tenant, key)
);
