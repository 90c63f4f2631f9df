-- settle's writes, each command ONE autocommit statement (as the raw
-- protocol's): a function doing the settings, the lock, the generation
-- check, the record and the commit token (setup.sql).
\set k random(1, 2000000000)
\set t random(1, 2000000000)
SELECT settle_write(true, 'bench', :client_id || '-' || :k, decode(repeat('07', 400), 'hex'), :t, int8send(:k));
SELECT settle_write(false, 'bench', :client_id || '-' || :k, decode(repeat('07', 400), 'hex'), :t + 1, int8send(:k));
