-- One claim+settle pair of the raw protocol, as a pgbench script: claim
-- takes a fresh key and a fence from a sequence; settle writes the result
-- only if the fence still matches (the fence check). Two autocommit
-- statements, synchronous_commit=on (the server default).
--
--   psql -h 127.0.0.1 -U postgres -d test -f bench/pg-baseline-setup.sql
--   pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 64 -j 2 -T 10 -f bench/pg-baseline.sql test
--
-- The same two statements are driven from Rust, through the same client
-- and pool as settle, by `settle bench --store` (which is what the
-- reported ratio uses):
--   settle bench --store postgres://postgres@127.0.0.1:5432/test --concurrency 8,16,32,64 --duration 10 --json
\set k random(1, 2000000000)
INSERT INTO bench_baseline.ops (tenant, key, fence)
    VALUES ('bench', :client_id || '-' || :k, nextval('bench_baseline.fence'))
    ON CONFLICT DO NOTHING RETURNING fence;
UPDATE bench_baseline.ops SET status = 4, result = '{"charge":1}', response_sha256 = '\x0707070707070707070707070707070707070707070707070707070707070707'
    WHERE tenant = 'bench' AND key = :client_id || '-' || :k
      AND fence = currval('bench_baseline.fence') AND status = 0;
