// SPEC §11.10 against a real server: the Reconciler, and the client calls
// it needs (list, principal; with stats and batch).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import * as S from '@settle/client';
import { startSettle, newKey } from './helpers.mjs';

const { Client, Reconciler, fingerprint } = S;
let server, client;

before(async () => {
  server = await startSettle();
  client = new Client({ url: server.url });
});
after(async () => server?.close());

const REQ = { order: 'o-1', amount: 1000 };

/** A worker killed after it dispatched: claim (marksDispatch), dispatch,
 * and the record settles `unknown` (what the lease expiry does to it). */
async function killedAfterDispatch(key, { principal = 'svc', scopes = ['charge'] } = {}) {
  const b = { principal, scopes };
  const g = await client.claim(key, fingerprint(REQ), b, { marksDispatch: true });
  await client.dispatch(key, g.fence);
  await client.settle(key, g.fence, fingerprint(REQ), b, { status: 'unknown', error: 'the worker was killed' });
}

/** A worker killed for real: its short lease lapses after dispatch; polls
 * (with a deadline) until the ledger lists the record as reconcile required
 * (unless `listed` is false: a background reconciler may resolve it first). */
async function killedLeaseLapses(key, { listed = true } = {}) {
  const g = await client.claim(key, fingerprint(REQ), { principal: 'svc', scopes: ['charge'] }, { marksDispatch: true, leaseMs: 200 });
  await client.dispatch(key, g.fence);
  if (!listed) return;
  const until = Date.now() + 10_000;
  for (;;) {
    const { operations } = await client.list({ reconcileRequired: true, keyPrefix: key });
    if (operations.some((o) => o.key === key)) return;
    assert.ok(Date.now() < until, 'the lease did not lapse within 10 s');
    await new Promise((r) => setTimeout(r, 50)); // polling interval, not synchronisation
  }
}

const capture = () => {
  const lines = { info: [], warn: [], error: [] };
  return { lines, logger: { info: (m) => lines.info.push(m), warn: (m) => lines.warn.push(m), error: (m) => lines.error.push(m) } };
};

test('client: list (filters, pages), principal, stats, batch', async () => {
  const p = `ls-${randomUUID()}-`;
  for (let i = 0; i < 5; i++) await killedAfterDispatch(`${p}${i}`);
  const g = await client.claim(`${p}done`, fingerprint(REQ), { principal: 'svc' });
  await client.settle(`${p}done`, g.fence, fingerprint(REQ), { principal: 'svc' }, { status: 'completed', result: 1, responseSha256: 'a'.repeat(64) });
  const keys = [];
  let after;
  do {
    const page = await client.list({ reconcileRequired: true, keyPrefix: p, limit: 2, ...(after ? { after } : {}) });
    assert.ok(page.operations.length <= 2);
    keys.push(...page.operations.map((o) => o.key));
    after = page.next ?? undefined;
  } while (after);
  assert.deepEqual(keys, [0, 1, 2, 3, 4].map((i) => `${p}${i}`));
  const [first] = (await client.list({ keyPrefix: `${p}0` })).operations;
  assert.deepEqual([first.status, first.reconcileRequired, first.disputed, first.stuck, first.quarantined, first.attempts], ['unknown', true, false, false, 0, 1]);
  assert.equal(typeof first.updatedAt, 'string');
  assert.deepEqual((await client.list({ keyPrefix: p, status: ['completed'] })).operations.map((o) => o.key), [`${p}done`]);
  assert.deepEqual((await client.list({ keyPrefix: p, status: 'completed,unknown', order: 'updated', limit: 1 })).operations.length, 1);
  await assert.rejects(client.list({ limit: 0 }), S.InvalidRequest);

  const who = newKey('principal');
  assert.equal(await client.principal(who), 0);
  await client.revoke(who);
  assert.equal(await client.principal(who), 1);

  const st = await client.stats();
  assert.ok(st.byStatus.unknown >= 5 && st.reconcileRequired >= 5 && st.total >= 6);
  assert.equal(typeof st.quarantinedRecords, 'number');

  const k = newKey();
  const results = await client.batch([
    { op: 'claim', key: k, fingerprint: fingerprint(REQ), binding: { principal: 'p', scopes: [], generation: 0 } },
    { op: 'claim', key: k, fingerprint: fingerprint({ other: 1 }), binding: { principal: 'p', scopes: [], generation: 0 } },
    { op: 'get', key: newKey() },
  ]);
  assert.deepEqual(results.map((r) => r.status), [200, 409, 404]);
  assert.equal(results[0].body.decision, 'execute');
  assert.equal(results[0].error, null);
  assert.ok(results[1].error instanceof S.FingerprintMismatch);
  assert.ok(results[2].error instanceof S.NotFound);
});

test('sweep: resolves the records killed workers left unknown; leaves alone those whose hook says unavailable', async () => {
  const p = `rc-${randomUUID()}-`;
  // The remote's view: applied (committed), never applied (not_committed), cannot tell (unavailable).
  const applied = new Map([[`${p}paid-1`, { charge: 'ch_1' }], [`${p}paid-2`, { charge: 'ch_2' }], [`${p}paid-lapsed`, { charge: 'ch_3' }]]);
  const notApplied = new Set([`${p}none-1`, `${p}none-2`]);
  const keys = [`${p}paid-1`, `${p}paid-2`, `${p}none-1`, `${p}none-2`, `${p}dunno-1`, `${p}dunno-2`];
  for (const k of keys) await killedAfterDispatch(k);
  await killedLeaseLapses(`${p}paid-lapsed`);
  // Another prefix's record, and one owned by a longer prefix.
  const other = `zz-${randomUUID()}`;
  await killedAfterDispatch(other);
  await killedAfterDispatch(`${p}long-1`);

  const asked = [];
  const hook = async (key, fence) => {
    asked.push([key, fence]);
    if (applied.has(key)) return { result: applied.get(key) };
    if (notApplied.has(key)) return 'not_committed';
    return 'unavailable';
  };
  const longAsked = [];
  const { lines, logger } = capture();
  const r = new Reconciler(client, { hooks: { [p]: hook, [`${p}long-`]: (key) => (longAsked.push(key), { result: { long: true } }) }, logger, pageSize: 3 });
  const counts = await r.sweep();
  assert.deepEqual(counts, { seen: 8, committed: 4, not_committed: 2, unavailable: 2, skipped: 0, errors: 0 });
  assert.equal(asked.length, 7);
  assert.deepEqual(longAsked, [`${p}long-1`]);
  assert.deepEqual(r.counts, counts);
  assert.equal(lines.info.length, 8, 'one log line per resolution');
  assert.equal(lines.error.length, 0);

  for (const k of [`${p}paid-1`, `${p}paid-2`, `${p}paid-lapsed`]) {
    const rec = await client.get(k);
    assert.equal(rec.status, 'completed', k);
    assert.deepEqual(rec.outcome.result, applied.get(k));
    assert.equal(rec.reconcileRequired, false);
    // The claim carried the stored principal and scopes at the current generation.
    assert.deepEqual(rec.reservation.scopes, ['charge']);
  }
  for (const k of [`${p}none-1`, `${p}none-2`]) {
    const rec = await client.get(k);
    assert.equal(rec.reconcileRequired, false, k);
    assert.equal(rec.lease.worker, 'settle-reconciler');
    assert.equal(rec.lease.ended?.reason, 'released', 'the execute lease it was handed is released not_dispatched');
    assert.equal(rec.lease.dispatched, false);
    // The next run executes (it holds the request): no reconcile, no in_flight.
    let ran = 0;
    const run = await client.runOnce(k, REQ, () => (ran++, { result: { retried: true } }), { principal: 'svc', scopes: ['charge'], marksDispatch: true, deadlineMs: 2000 });
    assert.equal(run.receipt.status, 'completed');
    assert.equal(ran, 1);
  }
  for (const k of [`${p}dunno-1`, `${p}dunno-2`, other]) {
    const rec = await client.get(k);
    assert.equal(rec.status, 'unknown', k);
    assert.equal(rec.reconcileRequired, true, k); // nothing is ever guessed
  }
  // A second sweep sees only what is still unknown under the prefixes.
  assert.deepEqual(await r.sweep(), { seen: 2, committed: 0, not_committed: 0, unavailable: 2, skipped: 0, errors: 0 });
  assert.equal(r.counts.seen, 10);
  assert.equal(r.sweeps, 2);
});

test('sweep: the current generation of the principal; an execute grant is released not_dispatched and skipped; a failing hook is an error', async () => {
  const p = `rg-${randomUUID()}-`;
  const principal = newKey('moved');
  await killedAfterDispatch(`${p}a`, { principal });
  await client.revoke(principal); // generation 1: a claim at 0 would be stale_binding
  await killedAfterDispatch(`${p}b`);
  await killedAfterDispatch(`${p}c`);
  // `b` is resolved by someone else between the listing and the claim:
  // the reconciler's claim then gets an execute lease.
  const racing = new Client({
    url: server.url,
    fetch: async (url, init) => {
      if (String(url).endsWith(`/${encodeURIComponent(`${p}b`)}/claim`) && !racing.raced) {
        racing.raced = true;
        const g = await client.claim(`${p}b`, fingerprint(REQ), { principal: 'svc', scopes: ['charge'] });
        assert.equal(g.decision, 'reconcile');
        const ex = await client.reconcile(`${p}b`, g.fence, 'not_committed');
        await client.release(`${p}b`, ex.fence, 'not_committed');
      }
      return fetch(url, init);
    },
  });
  const { lines, logger } = capture();
  const r = new Reconciler(racing, {
    hooks: {
      [p]: (key) => {
        if (key.endsWith('c')) throw new Error('the provider lookup failed');
        return { result: { ok: key } };
      },
    },
    logger,
  });
  assert.deepEqual(await r.sweep(), { seen: 3, committed: 1, not_committed: 0, unavailable: 0, skipped: 1, errors: 1 });
  const a = await client.get(`${p}a`);
  assert.equal(a.status, 'completed');
  assert.equal(a.reservation.generation, 1);
  const b = await client.get(`${p}b`);
  assert.equal(b.status, 'unknown'); // no downgrade (SPEC §4), but no longer reconcile required
  assert.equal(b.reconcileRequired, false);
  assert.equal(b.lease.worker, 'settle-reconciler');
  assert.equal(b.lease.ended?.reason, 'released'); // not_dispatched: it never dispatched
  assert.equal(b.lease.dispatched, false);
  const c = await client.get(`${p}c`);
  assert.equal(c.status, 'unknown');
  assert.equal(c.reconcileRequired, true);
  assert.equal(lines.error.length, 1);
  assert.match(lines.error[0], /hook failed/);
});

test('background: start(interval) resolves records as they appear; counts on the object; stop()', async () => {
  const p = `bg-${randomUUID()}-`;
  const { lines, logger } = capture();
  const r = new Reconciler(client, { hooks: { [p]: (key) => ({ result: { found: key } }) }, logger });
  r.start(100);
  try {
    assert.equal(r.running, true);
    assert.throws(() => r.start(100), /already running/);
    await killedAfterDispatch(`${p}1`);
    await killedLeaseLapses(`${p}2`, { listed: false });
    const until = Date.now() + 15_000;
    while (r.counts.committed < 2) {
      assert.ok(Date.now() < until, `not resolved in time: ${JSON.stringify(r.counts)}`);
      await new Promise((res) => setTimeout(res, 50)); // polling interval, not synchronisation
    }
  } finally {
    await r.stop();
  }
  assert.equal(r.running, false);
  assert.equal(r.counts.committed, 2);
  assert.ok(r.sweeps >= 1);
  for (const k of [`${p}1`, `${p}2`]) assert.equal((await client.get(k)).status, 'completed');
  assert.equal(lines.info.filter((l) => l.includes('committed')).length, 2);
  const done = r.sweeps;
  await new Promise((res) => setTimeout(res, 300)); // three intervals: no sweep after stop()
  assert.equal(r.sweeps, done);
});

test('middleware records: a { middleware: true } hook gets the client\'s key and principal from the worker field; reconcile claims copy that field; a committed response is stored the middleware\'s way and replayed by it (issue 47)', async () => {
  const namespace = newKey('ns');
  const idemKey = 'order/7"x"';
  const principal = 'Ana María <ana@example.com>'; // the binding's form is sha256:…, the worker field carries it
  const lkey = S.middlewareCore.ledgerKey(namespace, principal, idemKey);
  const body = Buffer.from('{"amount":10}');
  const fp = S.middlewareCore.requestFingerprint('POST', '/charges', 'application/json', body);
  const binding = { principal: S.middlewareCore.bindingPrincipal(principal), scopes: [] };
  const worker = S.middlewareCore.workerLabel(idemKey, principal);
  assert.equal(worker, 'idempotency-key=order%2F7%22x%22 principal=Ana%20Mar%C3%ADa%20%3Cana%40example.com%3E');
  assert.match(binding.principal, /^sha256:/);
  // What the middleware leaves when its handler dies after the dispatch mark.
  const g = await client.claim(lkey, fp, binding, { marksDispatch: true, worker });
  await client.dispatch(lkey, g.fence);
  await client.settle(lkey, g.fence, fp, binding, { status: 'unknown', error: 'the handler died' });
  const seen = [];
  let answer = 'unavailable';
  const r = new Reconciler(client, {
    hooks: {
      [lkey]: {
        middleware: true,
        hook: (key, fence, info) => {
          seen.push({ key, fence, idempotencyKey: info.idempotencyKey, principal: info.principal, worker: info.worker });
          return answer;
        },
      },
    },
    logger: capture().logger,
  });
  assert.deepEqual(await r.sweep(), { seen: 1, committed: 0, not_committed: 0, unavailable: 1, skipped: 0, errors: 0 });
  assert.deepEqual({ ...seen[0], fence: 0 }, { key: lkey, fence: 0, idempotencyKey: idemKey, principal, worker });
  let rec = await client.get(lkey);
  assert.equal(rec.attempts.at(-1).lease.worker, worker, 'the reconcile claim copied the worker field');
  answer = { finding: 'committed', response: { status: 201, headers: { location: '/charges/ch_1', 'x-not-stored': 'x' }, body: { charge: 'ch_1' } } };
  assert.deepEqual(await r.sweep(), { seen: 1, committed: 1, not_committed: 0, unavailable: 0, skipped: 0, errors: 0 });
  assert.equal(seen[1].idempotencyKey, idemKey, 'parsed again from the copied field');
  rec = await client.get(lkey);
  assert.equal(rec.status, 'completed');
  const stored = S.middlewareCore.decodeResponse(rec.outcome.result);
  assert.equal(stored.status, 201);
  assert.deepEqual(Object.fromEntries(stored.headers), { location: '/charges/ch_1', 'content-type': 'application/json' });
  assert.deepEqual(JSON.parse(stored.body.toString()), { charge: 'ch_1' });
  // The client's retry through the middleware: the stored response, replayed.
  let runs = 0;
  const idem = S.idempotency({ client, namespace, principal: S.fixedPrincipal(principal), logger: capture().logger });
  const srv = http.createServer(idem.wrap((req, res) => (runs++, res.end('ran'))));
  await new Promise((res) => srv.listen(0, '127.0.0.1', res));
  try {
    const again = await fetch(`http://127.0.0.1:${srv.address().port}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': '"order/7\\"x\\""', 'content-type': 'application/json' },
      body,
    });
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.headers.get('location'), '/charges/ch_1');
    assert.deepEqual(await again.json(), { charge: 'ch_1' });
    assert.equal(runs, 0);
  } finally {
    await new Promise((res) => srv.close(res));
  }
});

test('background: a second start() is refused; stop(timeout) returns within it while a hook hangs; start() stays refused until the abandoned sweep wound down, which hands the record back (issue 47)', async () => {
  const key = newKey('hang');
  await killedAfterDispatch(key);
  let entered;
  const started = new Promise((res) => (entered = res));
  let aborted = null;
  const r = new Reconciler(client, {
    hooks: {
      [key]: (k, fence, { signal }) => {
        if (aborted) return 'unavailable'; // the next loop's sweep
        entered();
        signal.addEventListener('abort', () => (aborted = signal.reason));
        return new Promise(() => {}); // never answers
      },
    },
    hookTimeoutMs: 60_000,
    logger: capture().logger,
  });
  r.start(50);
  assert.throws(() => r.start(50), /already running/);
  await started;
  const t0 = Date.now();
  assert.equal(await r.stop(300), false, 'the sweep had not ended');
  assert.ok(Date.now() - t0 < 300 + 200, `stop(300) took ${Date.now() - t0} ms`);
  assert.ok(aborted, 'the hook was told (its signal aborted)');
  await r.stop(); // the abandoned sweep winds down
  assert.equal(r.running, false);
  assert.equal(r.counts.errors, 1);
  const rec = await client.get(key);
  assert.equal(rec.status, 'unknown');
  assert.equal(rec.reconcileRequired, true);
  assert.equal(rec.lease.ended?.reason, 'unavailable', 'handed back at once, not left to lapse');
  r.start(50); // a new loop may start now
  assert.equal(await r.stop(5_000), true);
});
