-- The raw protocol (bench/pg-baseline.sql): two autocommit statements a pair.
\set k random(1, 2000000000)
INSERT INTO ops (tenant, key, fence) VALUES ('bench', :client_id || '-' || :k, nextval('fence'))
    ON CONFLICT DO NOTHING RETURNING fence;
UPDATE ops SET status = 4, result = '{"charge":1}',
    response_sha256 = '\x0707070707070707070707070707070707070707070707070707070707070707'
    WHERE tenant = 'bench' AND key = :client_id || '-' || :k AND fence = currval('fence') AND status = 0;
