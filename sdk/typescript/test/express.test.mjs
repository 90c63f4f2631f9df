// SPEC §8, row by row, for the Express middleware: an Express app in this
// process whose middleware talks to a real settle server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import http from 'node:http';
import express from 'express';
import { Client, idempotency, markRetryable, fixedPrincipal, authenticatedPrincipal, middlewareCore as mw } from '@settle/client';
import { startSettle, newKey, deadUrl, notCommittedSupported, NOT_COMMITTED_MISSING } from './helpers.mjs';

let server, ledger, ncSupported;
const apps = [];
before(async () => {
  server = await startSettle();
  ledger = new Client({ url: server.url });
  ncSupported = await notCommittedSupported(ledger);
});
after(async () => {
  for (const a of apps) await new Promise((r) => a.srv.close(r));
  await server?.close();
});

/** A test app: POST /items answers what its body asks for (express.json()
 * after the middleware). `before`: middleware before it (authentication);
 * `client`: the middleware's settle client. */
async function makeApp(options = {}, { settleUrl, errorHandler = true, before, client } = {}) {
  const state = { count: 0, gate: null, entered: null };
  const namespace = options.namespace ?? newKey('ns');
  const idem = idempotency({
    client: client ?? new Client({ url: settleUrl ?? server.url }),
    namespace,
    principal: fixedPrincipal('acct-1'),
    onError: () => {},
    ...options,
  });
  const app = express();
  if (before) app.use(before);
  app.use(idem);
  app.use(express.json());
  const items = async (req, res) => {
    state.count++;
    const n = state.count;
    const b = req.body ?? {};
    state.entered?.();
    if (b.block) await state.gate;
    if (b.sleep) await new Promise((r) => setTimeout(r, b.sleep));
    if (b.raise) throw new Error('handler failed');
    if (b.raiseFirst && n === 1) throw new Error('handler failed (first run only)');
    if (b.retryable) markRetryable(res);
    res.status(b.status ?? 201).set({ Location: `/items/${n}`, 'X-Custom': 'c', 'X-Trace': `t${n}` });
    if (b.chunks) {
      res.type('text/plain');
      res.write('part1-');
      res.write(Buffer.from('part2-'));
      res.end('end');
      return;
    }
    res.type('application/json').send(JSON.stringify({ n, pad: 'x'.repeat(b.size ?? 0) }));
  };
  app.post('/items', items);
  app.patch('/items', items);
  app.put('/items', items);
  app.post('/next-error', (req, res, next) => {
    state.count++;
    next(new Error('passed to next'));
  });
  app.post('/free', (req, res) => {
    state.count++;
    res.json({ n: state.count });
  });
  if (errorHandler) app.use(idem.errorHandler);
  const srv = http.createServer(app);
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const a = { url: `http://127.0.0.1:${srv.address().port}`, srv, state, idem, namespace };
  apps.push(a);
  return a;
}

const H = { 'Idempotency-Key': 'k-1', 'content-type': 'application/json' };
const post = (a, path, body, headers = H, method = 'POST') =>
  fetch(a.url + path, { method, headers, body: typeof body === 'string' ? body : JSON.stringify(body) });

async function problem(r, status, code) {
  assert.equal(r.status, status);
  assert.equal(r.headers.get('content-type'), 'application/problem+json');
  const b = await r.json();
  assert.equal(b.code, code);
  assert.equal(b.status, status);
  assert.ok(b.type.endsWith(code));
  return b;
}

test('row: key missing → 400, handler not run', async () => {
  const a = await makeApp();
  await problem(await post(a, '/items', {}, { 'content-type': 'application/json' }), 400, 'idempotency_key_missing');
  assert.equal(a.state.count, 0);
});

test('row: malformed key or sent twice → 400 idempotency_key_invalid', async () => {
  const a = await makeApp();
  for (const raw of ['"unterminated', '"bad\\escape"', 'has space', '', '""', 'x'.repeat(256)]) {
    await problem(await post(a, '/items', {}, { 'Idempotency-Key': raw }), 400, 'idempotency_key_invalid');
  }
  const h = new Headers([['Idempotency-Key', 'a'], ['Idempotency-Key', 'a']]);
  await problem(await fetch(a.url + '/items', { method: 'POST', headers: h, body: '{}' }), 400, 'idempotency_key_invalid');
  assert.equal(a.state.count, 0);
});

test('rows: first request unchanged; replay byte for byte with Idempotent-Replayed', async () => {
  const a = await makeApp();
  const first = await post(a, '/items', '{"status": 201}');
  const fb = Buffer.from(await first.arrayBuffer());
  assert.equal(first.status, 201);
  assert.equal(first.headers.get('idempotent-replayed'), null);
  assert.equal(first.headers.get('x-trace'), 't1');
  for (let i = 0; i < 3; i++) {
    const again = await post(a, '/items', '{"status": 201}');
    assert.equal(again.status, 201);
    assert.deepEqual(Buffer.from(await again.arrayBuffer()), fb);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.headers.get('location'), '/items/1');
    assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
    assert.equal(again.headers.get('x-custom'), null);
  }
  const quoted = await post(a, '/items', '{"status": 201}', { ...H, 'Idempotency-Key': '"k-1"' });
  assert.equal(quoted.headers.get('idempotent-replayed'), 'true');
  const params = await post(a, '/items', '{"status": 201}', { ...H, 'Idempotency-Key': '"k-1";a=1; b="x;y"' });
  assert.equal(params.headers.get('idempotent-replayed'), 'true'); // RFC 8941 parameters are ignored
  await problem(await post(a, '/items', '{"status": 201}', { ...H, 'Idempotency-Key': '"k-1" ;a=1' }), 400, 'idempotency_key_invalid');
  assert.equal(a.state.count, 1);
});

test('streamed writes are captured whole and replayed', async () => {
  const a = await makeApp();
  const first = await post(a, '/items', { chunks: true });
  assert.equal(await first.text(), 'part1-part2-end');
  const again = await post(a, '/items', { chunks: true });
  assert.equal(await again.text(), 'part1-part2-end');
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
});

test('stored headers are configurable', async () => {
  const a = await makeApp({ storedHeaders: ['X-Custom'] });
  await post(a, '/items', {});
  const again = await post(a, '/items', {});
  assert.equal(again.headers.get('x-custom'), 'c');
  assert.equal(again.headers.get('x-trace'), null);
});

test('rows: 4xx stored as completed, returned 5xx stored as failed, both replayed', async () => {
  const a = await makeApp();
  for (const status of [400, 404, 422, 500, 503]) {
    const h = { ...H, 'Idempotency-Key': newKey() };
    const first = await post(a, '/items', { status }, h);
    const again = await post(a, '/items', { status }, h);
    assert.equal(first.status, status);
    assert.equal(again.status, status);
    assert.equal(await again.text(), await first.text());
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
  }
  assert.equal(a.state.count, 5);
});

test('row: key reused with another request → 422', async () => {
  const a = await makeApp();
  assert.equal((await post(a, '/items', { a: 1 })).status, 201);
  await problem(await post(a, '/items', { a: 2 }), 422, 'idempotency_key_reused');
  await problem(await post(a, '/items?x=1', { a: 1 }), 422, 'idempotency_key_reused');
  await problem(await post(a, '/items', { a: 1 }, H, 'PATCH'), 422, 'idempotency_key_reused');
  await problem(await post(a, '/free', { a: 1 }), 422, 'idempotency_key_reused');
  await problem(await post(a, '/items', '{"a":1}', { ...H, 'content-type': 'text/plain' }), 422, 'idempotency_key_reused');
  assert.equal(a.state.count, 1);
});

test('canonical JSON (the default) makes key order and whitespace irrelevant', async () => {
  const a = await makeApp();
  const first = await post(a, '/items', '{"a":1,"b":[1,2]}');
  const again = await post(a, '/items', '{ "b": [1, 2.0], "a": 1 }');
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(await again.text(), await first.text());
  assert.equal(a.state.count, 1);
});

test('canonicalJson: false fingerprints the raw bytes', async () => {
  const a = await makeApp({ canonicalJson: false });
  assert.equal((await post(a, '/items', '{"a":1,"b":[1,2]}')).status, 201);
  await problem(await post(a, '/items', '{ "b": [1, 2], "a": 1 }'), 422, 'idempotency_key_reused');
  assert.equal(a.state.count, 1);
});

test('exclude: an excluded field may change, a kept one may not', async () => {
  const a = await makeApp({ exclude: ['/client_ts'] });
  const first = await post(a, '/items', '{"a":1,"client_ts":"14:00:00","b":[1,2]}');
  assert.equal(first.status, 201);
  const reordered = await post(a, '/items', '{ "b": [1, 2], "client_ts": "14:00:09", "a": 1 }');
  assert.equal(reordered.headers.get('idempotent-replayed'), 'true');
  assert.equal(await reordered.text(), await first.text());
  await problem(await post(a, '/items', '{"a":2,"client_ts":"14:00:00","b":[1,2]}'), 422, 'idempotency_key_reused');
  assert.equal(a.state.count, 1);
});

test('fields: only the kept fields count', async () => {
  const a = await makeApp({ fields: ['/a', '/b'] });
  const first = await post(a, '/items', '{"a":1,"b":[1,2],"client_ts":"14:00:00"}');
  assert.equal(first.status, 201);
  const again = await post(a, '/items', '{"client_ts":"14:00:09","b":[1,2],"a":1}');
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  await problem(await post(a, '/items', '{"a":1,"b":[1,3],"client_ts":"14:00:00"}'), 422, 'idempotency_key_reused');
  assert.equal(a.state.count, 1);
});

test('fingerprint options are checked when the middleware is made', () => {
  const base = { client: new Client({ url: server.url }), principal: fixedPrincipal('acct-1') };
  const refused = [
    [{ fields: [] }, 'fields', 'invalid_fields'],
    [{ fields: ['a'] }, 'fields', 'invalid_fields'],
    [{ exclude: [''] }, 'exclude', 'invalid_exclude'],
    [{ exclude: ['/a~2'] }, 'exclude', 'invalid_exclude'],
    [{ fields: ['/a'], exclude: ['/b'] }, 'exclude', 'fields_and_exclude'],
    [{ canonicalJson: false, exclude: ['/a'] }, 'exclude', 'canonical_json_off'],
    [{ canonicalJson: false, fields: ['/a'] }, 'fields', 'canonical_json_off'],
    [{ canonicalJson: 'no' }, 'canonicalJson', 'invalid_canonical_json'],
  ];
  for (const [opts, option, code] of refused) {
    assert.throws(
      () => idempotency({ ...base, ...opts }),
      (e) => e instanceof mw.MiddlewareConfigError && e instanceof TypeError && e.option === option && e.code === code && e.message.includes(option),
      JSON.stringify(opts),
    );
  }
  assert.equal(typeof idempotency({ ...base, exclude: ['/ts'] }), 'function');
});

/** A stand-in for Passport: req.user from the bearer token. Two tokens of
 * alice (before and after an OAuth refresh), one of bob. */
const TOKENS_OF = { 'Bearer alice-1': { id: 'alice' }, 'Bearer alice-2': { id: 'alice' }, 'Bearer bob-1': { id: 42, username: 'bob' } };
const auth = (req, res, next) => {
  const u = TOKENS_OF[req.headers.authorization];
  if (u) req.user = u;
  next();
};

test('principals do not collide', async () => {
  const a = await makeApp({ principal: authenticatedPrincipal() }, { before: auth });
  const r1 = await post(a, '/items', {}, { ...H, Authorization: 'Bearer alice-1' });
  const r2 = await post(a, '/items', {}, { ...H, Authorization: 'Bearer bob-1' });
  assert.deepEqual([(await r1.json()).n, (await r2.json()).n], [1, 2]);
  const b = await makeApp({ principal: (req) => req.headers['x-account'] });
  const r3 = await post(b, '/items', {}, { ...H, 'X-Account': 'acct-a' });
  const r4 = await post(b, '/items', {}, { ...H, 'X-Account': 'acct-b' });
  assert.deepEqual([(await r3.json()).n, (await r4.json()).n], [1, 2]);
});

test('principal: the option is required; the error names it and the helpers', () => {
  for (const bad of [{}, { principal: undefined }, { principal: 'acct-1' }]) {
    assert.throws(
      () => idempotency({ client: ledger, ...bad }),
      (e) => e instanceof TypeError && /\bprincipal\b/.test(e.message) && e.message.includes('fixedPrincipal') && e.message.includes('authenticatedPrincipal'),
    );
  }
  assert.throws(() => fixedPrincipal('acct-1', -1), RangeError);
  assert.throws(() => fixedPrincipal('acct-1', 1.5), RangeError);
  assert.throws(() => fixedPrincipal(7), TypeError);
});

test('principal: a retry with a refreshed token replays (same user, another Authorization)', async () => {
  const a = await makeApp({ principal: authenticatedPrincipal() }, { before: auth });
  const first = await post(a, '/items', {}, { ...H, Authorization: 'Bearer alice-1' });
  assert.equal(first.status, 201);
  const again = await post(a, '/items', {}, { ...H, Authorization: 'Bearer alice-2' });
  assert.equal(again.status, 201);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(await again.text(), await first.text());
  assert.equal(a.state.count, 1);
  // The default pick is user.id ?? user.username, as a string.
  await post(a, '/items', {}, { ...H, Authorization: 'Bearer bob-1' });
  const rec = await ledger.get(mw.ledgerKey(a.namespace, '42', 'k-1'));
  assert.equal(rec.reservation.principal, '42');
});

test('principal: no identity → 401 idempotency_principal_missing, handler not run', async () => {
  const a = await makeApp({ principal: authenticatedPrincipal() }, { before: auth });
  const b = await problem(await post(a, '/items', {}, { ...H, Authorization: 'Bearer expired' }), 401, 'idempotency_principal_missing');
  assert.equal(b.title, 'Idempotency principal missing');
  assert.equal(b.detail, 'no principal was found for this request (see the principal option)');
  await problem(await post(a, '/items', {}), 401, 'idempotency_principal_missing');
  const c = await makeApp({ principal: () => undefined });
  await problem(await post(c, '/items', {}), 401, 'idempotency_principal_missing');
  const d = await makeApp({ principal: authenticatedPrincipal() }, { before: (req, res, next) => ((req.user = { name: 'no id' }), next()) });
  await problem(await post(d, '/items', {}), 401, 'idempotency_principal_missing');
  assert.equal(a.state.count + c.state.count + d.state.count, 0);
  assert.equal(a.idem.stats.idempotency_principal_missing, 2);
  // A route that runs without a key needs no principal.
  const e = await makeApp({ principal: authenticatedPrincipal(), routes: () => ({ required: false }) });
  assert.equal((await post(e, '/items', {}, { 'content-type': 'application/json' })).status, 201);
});

test('principal: a custom pick, an async extractor, and the generation', async () => {
  const p = newKey('acct');
  const pick = authenticatedPrincipal((user) => ({ principal: user.account, generation: user.gen }));
  const a = await makeApp({ principal: pick }, { before: (req, res, next) => ((req.user = { account: p, gen: 0 }), next()) });
  assert.equal((await post(a, '/items', {})).status, 201);
  const rec = await ledger.get(mw.ledgerKey(a.namespace, p, 'k-1'));
  assert.equal(rec.reservation.principal, p);
  assert.equal(rec.reservation.generation, 0);
  await ledger.revoke(p); // generation 1
  // Moved forward: the same account at generation 1 replays, and runs new requests.
  const c = await makeApp({ principal: fixedPrincipal(p, 1), namespace: a.namespace });
  const again = await post(c, '/items', {});
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  const d = await makeApp({ principal: async () => ({ principal: p, generation: 1 }), namespace: a.namespace });
  const k = newKey();
  assert.equal((await post(d, '/items', {}, { ...H, 'Idempotency-Key': k })).status, 201);
  assert.equal((await ledger.get(mw.ledgerKey(a.namespace, p, k))).reservation.generation, 1);
  assert.equal(a.state.count + c.state.count + d.state.count, 2);
});

test('failOpen: a revoked principal gets 403 idempotency_forbidden; the completed request does not run again', async () => {
  const p = newKey('acct');
  const a = await makeApp({ principal: fixedPrincipal(p), failOpen: true });
  assert.equal((await post(a, '/items', {})).status, 201);
  await ledger.revoke(p);
  const r = await post(a, '/items', {});
  const b = await problem(r, 403, 'idempotency_forbidden');
  assert.equal(b.title, 'Idempotency forbidden');
  assert.equal(b.detail, "the ledger refused this caller's binding (its principal was revoked or moved on)");
  assert.equal(r.headers.get('retry-after'), null);
  await problem(await post(a, '/items', {}, { ...H, 'Idempotency-Key': newKey() }), 403, 'idempotency_forbidden');
  assert.equal(a.state.count, 1);
  assert.equal(a.idem.stats.idempotency_forbidden, 2);
  assert.equal(a.idem.stats.fail_open, undefined);
});

test('the ledger key, worker label and fingerprint are those of MIDDLEWARE-KEYS.md', async () => {
  const a = await makeApp({ principal: fixedPrincipal('acct-7') });
  await post(a, '/items', '{}', { 'Idempotency-Key': 'order-7', Authorization: 'Bearer alice-1', 'content-type': 'application/json' });
  const principal = 'acct-7';
  const len = (s) => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(Buffer.byteLength(s));
    return Buffer.concat([b, Buffer.from(s)]);
  };
  const lkey = 'mw-' + createHash('sha256').update(Buffer.concat([len(a.namespace), len(principal), len('order-7')])).digest('hex');
  const rec = await ledger.get(lkey);
  assert.equal(rec.status, 'completed');
  assert.equal(rec.attempts[0].lease.worker, `idempotency-key=order-7 principal=${principal}`);
  assert.ok(rec.attempts[0].lease.marks_dispatch && rec.attempts[0].lease.dispatched);
  assert.equal(rec.reservation.fingerprint, mw.requestFingerprint('POST', '/items', 'application/json', Buffer.from('{}')));
});

test('row: same key while running → 409 request_in_progress with Retry-After', async () => {
  const a = await makeApp();
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  const first = post(a, '/items', { block: true });
  await entered;
  const busy = await post(a, '/items', { block: true });
  await problem(busy, 409, 'request_in_progress');
  assert.ok(Number(busy.headers.get('retry-after')) >= 1);
  open();
  assert.equal((await first).status, 201);
  assert.equal(a.state.count, 1);
});

test('row: 50 concurrent duplicates → exactly one execution', async () => {
  const a = await makeApp();
  const rs = await Promise.all(Array.from({ length: 50 }, () => post(a, '/items', { sleep: 200 })));
  assert.equal(a.state.count, 1);
  const bodies = await Promise.all(rs.map((r) => r.text()));
  const created = rs.map((r, i) => [r, bodies[i]]).filter(([r]) => r.status === 201);
  const others = rs.map((r, i) => [r, bodies[i]]).filter(([r]) => r.status !== 201);
  assert.ok(created.length >= 1);
  assert.equal(new Set(created.map(([, b]) => b)).size, 1);
  assert.equal(created.filter(([r]) => r.headers.get('idempotent-replayed') === null).length, 1);
  for (const [r, b] of others) {
    assert.equal(r.status, 409);
    assert.equal(JSON.parse(b).code, 'request_in_progress');
  }
});

test('row: a thrown error → 500 outcome_unknown, then 409 outcome_unknown', async () => {
  const a = await makeApp();
  await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
  for (let i = 0; i < 2; i++) await problem(await post(a, '/items', { raise: true }), 409, 'outcome_unknown');
  assert.equal(a.state.count, 1);
});

test('row: an error passed to next(err) → unknown', async () => {
  const a = await makeApp();
  await problem(await post(a, '/next-error', {}), 500, 'outcome_unknown');
  await problem(await post(a, '/next-error', {}), 409, 'outcome_unknown');
  assert.equal(a.state.count, 1);
});

test('row: the handler timeout → unknown', async () => {
  const a = await makeApp({ timeoutMs: 200 });
  await problem(await post(a, '/items', { sleep: 1500 }), 500, 'outcome_unknown');
  await problem(await post(a, '/items', { sleep: 1500 }), 409, 'outcome_unknown');
  assert.equal(a.state.count, 1);
});

test('a reconcile hook resolves unknown', async () => {
  const found = [];
  const a = await makeApp({ reconcile: (lkey) => (found.push(lkey), 'not_committed') });
  await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
  await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown'); // the retry ran the handler again
  assert.equal(found.length, 1);
  assert.equal(a.state.count, 2);
});

test('reconcile hook, committed: the found response is settled and replayed; the hook gets the ledger key, the fence and the request', async () => {
  const asked = [];
  const found = {
    'k-1': { status: 201, headers: { 'content-type': 'application/json', location: '/items/found', 'x-trace': 'not stored' }, body: '{"found":true}' },
    'k-2': { status: 502, headers: [['content-type', 'text/plain']], body: Buffer.from('upstream failed') },
    'k-3': { status: 200, body: { json: 'object' } },
  };
  const a = await makeApp({
    reconcile: (lkey, fence, req, info) => {
      const { signal, headers, ...rest } = info;
      asked.push({ lkey, fence, key: req.headers['idempotency-key'], method: req.method, url: req.url, info: { ...rest, body: info.body.toString(), idem: headers['idempotency-key'], aborted: signal.aborted } });
      return { finding: 'committed', response: found[req.headers['idempotency-key']] };
    },
  });
  await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
  const r = await post(a, '/items', { raise: true });
  assert.equal(r.status, 201);
  assert.equal(await r.text(), '{"found":true}');
  assert.equal(r.headers.get('idempotent-replayed'), 'true');
  assert.equal(r.headers.get('location'), '/items/found');
  assert.equal(r.headers.get('x-trace'), null);
  const lkey = mw.ledgerKey(a.namespace, 'acct-1', 'k-1');
  assert.equal(asked.length, 1);
  assert.deepEqual({ ...asked[0], fence: undefined }, {
    lkey,
    fence: undefined,
    key: 'k-1',
    method: 'POST',
    url: '/items',
    info: { idempotencyKey: 'k-1', principal: 'acct-1', method: 'POST', path: '/items', body: '{"raise":true}', idem: 'k-1', aborted: false },
  });
  const rec = await ledger.get(lkey);
  assert.equal(rec.status, 'completed');
  assert.equal(rec.reconcileRequired, false);
  assert.equal(rec.receipt.fence, asked[0].fence);
  const again = await post(a, '/items', { raise: true });
  assert.equal(await again.text(), '{"found":true}');
  assert.equal(asked.length, 1, 'a replay: the hook is not asked again');
  // A found 5xx is stored failed (as a returned 5xx); a JSON body is sent as JSON.
  for (const [k, status, status2, text, type] of [
    ['k-2', 502, 'failed', 'upstream failed', 'text/plain'],
    ['k-3', 200, 'completed', '{"json":"object"}', 'application/json'],
  ]) {
    const h = { ...H, 'Idempotency-Key': k };
    await problem(await post(a, '/items', { raise: true }, h), 500, 'outcome_unknown');
    const f = await post(a, '/items', { raise: true }, h);
    assert.equal(f.status, status);
    assert.equal(await f.text(), text);
    assert.equal(f.headers.get('content-type'), type);
    assert.equal((await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', k))).status, status2);
    assert.equal((await post(a, '/items', { raise: true }, h)).status, status);
  }
  assert.equal(a.state.count, 3);
});

test('reconcile hook, not_committed: the handler runs under the same fence', async () => {
  const fences = [];
  const a = await makeApp({ reconcile: (lkey, fence) => (fences.push(fence), 'not_committed') });
  await problem(await post(a, '/items', { raiseFirst: true }), 500, 'outcome_unknown');
  const r = await post(a, '/items', { raiseFirst: true });
  assert.equal(r.status, 201);
  assert.equal(r.headers.get('idempotent-replayed'), null);
  assert.equal(a.state.count, 2);
  const rec = await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', 'k-1'));
  assert.equal(rec.status, 'completed');
  assert.equal(fences.length, 1);
  assert.equal(rec.receipt.fence, fences[0], 'settled under the reconcile lease turned execute lease');
  assert.equal((await post(a, '/items', { raiseFirst: true })).headers.get('idempotent-replayed'), 'true');
});

test('reconcile hook, unavailable (or a throw, or a bad answer): 409 outcome_unknown, the record stays unknown', async () => {
  let answer = 'unavailable';
  let asked = 0;
  const { log, logger } = capture();
  const a = await makeApp({
    logger,
    reconcile: () => {
      asked++;
      if (answer === 'throw') throw new Error('the provider lookup failed');
      return answer;
    },
  });
  await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
  for (const next of ['unavailable', 'throw', 'committed?', { finding: 'committed', response: { status: 99 } }]) {
    answer = next;
    await problem(await post(a, '/items', { raise: true }), 409, 'outcome_unknown');
  }
  assert.equal(asked, 4);
  assert.equal(a.state.count, 1);
  assert.equal(log.error.length, 3, JSON.stringify(log));
  const rec = await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', 'k-1'));
  assert.equal(rec.status, 'unknown');
  assert.equal(rec.reconcileRequired, true);
  assert.equal(rec.lease.ended?.reason !== undefined, true, 'each reconcile lease was handed back');
});

/** A settle client that reports when one of its claims is answered in_flight. */
function watchingClient() {
  let told;
  const inFlight = new Promise((r) => (told = r));
  const c = new Client({
    url: server.url,
    fetch: async (url, init) => {
      const r = await fetch(url, init);
      if (String(url).endsWith('/claim') && (await r.clone().text()).includes('"in_flight"')) told();
      return r;
    },
  });
  return { c, inFlight };
}

test('wait: a duplicate waits for the running request and replays its response', async () => {
  const { c, inFlight } = watchingClient();
  const a = await makeApp({ wait: 10 }, { client: c });
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  const first = post(a, '/items', { block: true });
  let second;
  try {
    await entered;
    second = post(a, '/items', { block: true });
    await inFlight; // the duplicate is waiting
  } finally {
    open();
  }
  const [r1, r2] = await Promise.all([first, second]);
  assert.equal(r1.status, 201);
  assert.equal(r2.status, 201);
  assert.equal(r2.headers.get('idempotent-replayed'), 'true');
  assert.equal(await r2.text(), await r1.text());
  assert.equal(a.state.count, 1);
});

test('wait: the first released not_committed → the waiting duplicate runs the handler', async (t) => {
  if (!ncSupported) return t.skip(NOT_COMMITTED_MISSING);
  const { c, inFlight } = watchingClient();
  const a = await makeApp({ routes: () => ({ wait: 10 }) }, { client: c });
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  const first = post(a, '/items', { block: true, status: 429 });
  let second;
  try {
    await entered;
    second = post(a, '/items', { block: true, status: 429 });
    await inFlight;
  } finally {
    open();
  }
  const [r1, r2] = await Promise.all([first, second]);
  assert.equal(r1.status, 429);
  assert.equal(r2.status, 429);
  assert.equal(r2.headers.get('idempotent-replayed'), null);
  assert.equal(a.state.count, 2, 'the duplicate got an execute lease and ran');
});

test('wait: no outcome within the wait → 409 request_in_progress', async () => {
  const a = await makeApp({ wait: 1 });
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  const first = post(a, '/items', { block: true });
  try {
    await entered;
    const t0 = Date.now();
    await problem(await post(a, '/items', { block: true }), 409, 'request_in_progress');
    assert.ok(Date.now() - t0 >= 1000, 'it waited the second');
  } finally {
    open();
  }
  assert.equal((await first).status, 201);
  assert.equal(a.state.count, 1);
  assert.throws(() => idempotency({ client: ledger, principal: fixedPrincipal('a'), wait: -1 }), RangeError);
});

test('Retry-After of request_in_progress is the time the running lease has left', async () => {
  const a = await makeApp({ leaseMs: 8000 });
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  const first = post(a, '/items', { block: true });
  try {
    await entered;
    const busy = await post(a, '/items', { block: true });
    await problem(busy, 409, 'request_in_progress');
    const ra = Number(busy.headers.get('retry-after'));
    assert.ok(ra >= 7 && ra <= 8, `Retry-After ${ra} (lease 8 s; the ledger's hint is at most 1 s)`);
  } finally {
    open();
  }
  await first;
  assert.equal(mw.inProgressRetryAfterS(1000, new Date(Date.now() + 2500).toISOString()), 3);
  assert.equal(mw.inProgressRetryAfterS(1000, new Date(Date.now() - 500).toISOString()), 1);
  assert.equal(mw.inProgressRetryAfterS(10, null), 1);
});

test('a 429 from settle on the settle of a response is retried (Retry-After honoured); the response goes out once settled', async () => {
  let limited = 1;
  let settles = 0;
  const c = new Client({
    url: server.url,
    fetch: async (url, init) => {
      if (String(url).endsWith('/settle')) {
        settles++;
        if (limited-- > 0) {
          return new Response(JSON.stringify({ type: 'urn:settle:problem:rate_limited', title: 'Rate limited', status: 429, detail: 'slow down', code: 'rate_limited' }), {
            status: 429,
            headers: { 'content-type': 'application/problem+json', 'retry-after': '1' },
          });
        }
      }
      return fetch(url, init);
    },
  });
  const a = await makeApp({ logger: capture().logger }, { client: c });
  const t0 = Date.now();
  assert.equal((await post(a, '/items', {})).status, 201);
  assert.ok(Date.now() - t0 >= 1000);
  assert.equal(settles, 2);
  assert.equal((await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', 'k-1'))).status, 'completed');
  assert.equal((await post(a, '/items', {})).headers.get('idempotent-replayed'), 'true');
});

for (const status of [408, 409, 425, 429]) {
  test(`row: a ${status} says nothing happened → not stored, the retry runs the handler`, async (t) => {
    const a = await makeApp();
    const first = await post(a, '/items', { status });
    assert.equal(first.status, status);
    const again = await post(a, '/items', { status });
    if (!ncSupported) {
      await problem(again, 409, 'outcome_unknown'); // the SDK's safe fallback on such a server
      t.skip(NOT_COMMITTED_MISSING);
      return;
    }
    assert.equal(again.status, status);
    assert.equal(again.headers.get('idempotent-replayed'), null);
    assert.equal(a.state.count, 2);
  });
}

test('a response marked retryable is not stored', async (t) => {
  const a = await makeApp();
  await post(a, '/items', { retryable: true, status: 503 });
  const again = await post(a, '/items', { retryable: true, status: 503 });
  if (!ncSupported) {
    await problem(again, 409, 'outcome_unknown');
    t.skip(NOT_COMMITTED_MISSING);
    return;
  }
  assert.equal(again.headers.get('idempotent-replayed'), null);
  assert.equal(a.state.count, 2);
});

test('row: a large body is settled with its digest; a replay is 409 response_not_stored', async () => {
  const a = await makeApp({ maxStoredBody: 1000 });
  const first = await post(a, '/items', { size: 5000 });
  assert.equal(first.status, 201);
  assert.ok((await first.text()).length > 5000);
  await problem(await post(a, '/items', { size: 5000 }), 409, 'response_not_stored');
  assert.equal(a.state.count, 1);
  const h = { ...H, 'Idempotency-Key': 'small' };
  const small = await (await post(a, '/items', { size: 900 }, h)).text();
  assert.equal(await (await post(a, '/items', { size: 900 }, h)).text(), small);
});

test('the default body limit is 32 KiB and fits the server', async () => {
  const a = await makeApp();
  const first = await post(a, '/items', { size: 32 * 1024 - 30 });
  const fb = await first.text();
  assert.ok(fb.length <= 32 * 1024);
  const again = await post(a, '/items', { size: 32 * 1024 - 30 });
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(await again.text(), fb);
});

test('row: ledger unreachable → 503 idempotency_unavailable, handler not run; failOpen runs it', async () => {
  const a = await makeApp({}, { settleUrl: await deadUrl() });
  const r = await post(a, '/items', {});
  await problem(r, 503, 'idempotency_unavailable');
  assert.ok(Number(r.headers.get('retry-after')) >= 1);
  assert.equal(a.state.count, 0);
  const b = await makeApp({ routes: (m) => (m === 'POST' ? { failOpen: true } : null) }, { settleUrl: await deadUrl() });
  assert.equal((await post(b, '/items', {})).status, 201);
  assert.equal(b.state.count, 1);
});

/** A settle client whose answers to `path` calls (claim, dispatch) are replaced by `answer()`. */
function fakeClient(path, answer) {
  return new Client({
    url: server.url,
    fetch: async (url, init) => (String(url).endsWith(`/${path}`) ? answer() : fetch(url, init)),
  });
}
const problemAnswer = (status, code, headers = {}) =>
  new Response(JSON.stringify({ type: `urn:settle:problem:${code}`, title: code, status, detail: code, code }), {
    status,
    headers: { 'content-type': 'application/problem+json', ...headers },
  });
const capture = () => {
  const log = { warn: [], error: [] };
  return { log, logger: { info() {}, warn: (m) => log.warn.push(m), error: (m) => log.error.push(m) } };
};

test('failOpen: a refusal of the claim never runs the handler (record_refused, 429, invalid_request, a proxy page)', async () => {
  const cases = [
    [() => problemAnswer(503, 'record_refused'), '7', false],
    [() => problemAnswer(429, 'too_many_requests', { 'retry-after': '2.5' }), '3', false],
    [() => problemAnswer(429, 'too_many_requests', { 'retry-after': '0' }), '1', false],
    [() => new Response('slow down', { status: 429 }), '7', false],
    [() => problemAnswer(422, 'invalid_request'), '7', true],
    [() => problemAnswer(409, 'wrong_purpose'), '7', true],
    [() => new Response('<html>bad gateway</html>', { status: 502 }), '7', true],
    [() => new Response('{"decision":"surprise"}', { status: 200 }), '7', true],
  ];
  for (const [answer, retryAfter, unexpected] of cases) {
    const { log, logger } = capture();
    const a = await makeApp({ failOpen: true, unavailableRetryAfterS: 7, logger }, { client: fakeClient('claim', answer) });
    const r = await post(a, '/items', {});
    const b = await problem(r, 503, 'idempotency_unavailable');
    assert.equal(b.title, 'Idempotency unavailable');
    assert.equal(r.headers.get('retry-after'), retryAfter);
    assert.equal(a.state.count, 0);
    assert.equal(a.idem.stats.fail_open, undefined);
    assert.equal(log.error.length, unexpected ? 1 : 0, JSON.stringify(log));
  }
});

test('failOpen: a 401 from settle (a wrong token) → 503, handler not run', async () => {
  const authd = await startSettle({ auth: true });
  try {
    const { log, logger } = capture();
    const a = await makeApp({ failOpen: true, logger }, { client: new Client({ url: authd.url, token: 'wrong-token' }) });
    await problem(await post(a, '/items', {}), 503, 'idempotency_unavailable');
    assert.equal(a.state.count, 0);
    assert.equal(log.error.length, 1);
  } finally {
    await authd.close();
  }
});

test('failOpen: only no answer or a 503 unavailable runs the handler', async () => {
  const a = await makeApp({ failOpen: true, logger: capture().logger }, { client: fakeClient('claim', () => problemAnswer(503, 'unavailable')) });
  assert.equal((await post(a, '/items', {})).status, 201);
  const b = await makeApp({ failOpen: true, logger: capture().logger }, { settleUrl: await deadUrl() });
  assert.equal((await post(b, '/items', {})).status, 201);
  assert.deepEqual([a.state.count, b.state.count, a.idem.stats.fail_open, b.idem.stats.fail_open], [1, 1, 1, 1]);
});

test('failOpen: a refused dispatch never runs the handler; the lease is handed back', async () => {
  const a = await makeApp({ failOpen: true, logger: capture().logger }, { client: fakeClient('dispatch', () => problemAnswer(503, 'record_refused')) });
  await problem(await post(a, '/items', {}), 503, 'idempotency_unavailable');
  assert.equal(a.state.count, 0);
  // Released not_dispatched: the retry, with a ledger that accepts the dispatch, runs at once.
  const b = await makeApp({ namespace: a.namespace });
  assert.equal((await post(b, '/items', {})).status, 201);
  assert.equal(b.state.count, 1);
});

/** A settle client that loses the answers of the dispatch calls that `lose(n)` (1-based) picks: the call reaches the ledger. */
function losingClient(lose) {
  let n = 0;
  const c = new Client({
    url: server.url,
    fetch: async (url, init) => {
      const r = await fetch(url, init);
      if (String(url).endsWith('/dispatch') && lose(++n)) {
        await r.arrayBuffer();
        throw new TypeError('fetch failed: the connection was reset (test)');
      }
      return r;
    },
  });
  c.dispatches = () => n;
  return c;
}

test('dispatch: a lost answer is retried under the same fence; the handler runs once', async () => {
  const client = losingClient((n) => n === 1);
  const a = await makeApp({ logger: capture().logger }, { client });
  const first = await post(a, '/items', {});
  assert.equal(first.status, 201);
  assert.equal(a.state.count, 1);
  assert.equal(client.dispatches(), 2);
  const rec = await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', 'k-1'));
  assert.equal(rec.status, 'completed');
  assert.equal(rec.attempts.length, 1);
  assert.equal((await post(a, '/items', {})).headers.get('idempotent-replayed'), 'true');
  assert.equal(a.state.count, 1);
});

test('dispatch: every answer lost (the mark was recorded) → settled unknown, 500 outcome_unknown; never released not_committed on the SDK\'s own inference (issue 47)', async () => {
  const client = losingClient(() => true);
  const a = await makeApp({ leaseMs: 2000, ledgerDeadlineMs: 500, logger: capture().logger }, { client });
  await problem(await post(a, '/items', {}), 500, 'outcome_unknown');
  assert.equal(a.state.count, 0);
  assert.ok(client.dispatches() >= 2, 'retried');
  const rec = await ledger.get(mw.ledgerKey(a.namespace, 'acct-1', 'k-1'));
  assert.equal(rec.status, 'unknown', JSON.stringify(rec.raw));
  assert.equal(rec.reconcileRequired, true);
  assert.equal(rec.lease.ended?.reason, 'settled', JSON.stringify(rec.raw));
  // The retry does not run the handler: the ledger decides, a hook or an operator resolves it.
  const b = await makeApp({ namespace: a.namespace });
  await problem(await post(b, '/items', {}), 409, 'outcome_unknown');
  assert.equal(b.state.count, 0);
});

test('route selection', async () => {
  const a = await makeApp({ routes: (m, p) => (m === 'POST' && p === '/items' ? { required: false } : null) });
  assert.equal((await post(a, '/items', {}, { 'content-type': 'application/json' })).status, 201); // optional key
  assert.equal((await post(a, '/free', {})).status, 200);
  await post(a, '/items', {});
  assert.equal((await post(a, '/items', {})).headers.get('idempotent-replayed'), 'true');
  const put = await post(a, '/items', {}, H, 'PUT');
  assert.equal(put.headers.get('idempotent-replayed'), null);
  assert.equal(a.state.count, 4);
});

test('the lease is heartbeated while a slow handler runs', async () => {
  const a = await makeApp({ leaseMs: 400 });
  assert.equal((await post(a, '/items', { sleep: 1000 })).status, 201);
  assert.equal((await post(a, '/items', { sleep: 1000 })).headers.get('idempotent-replayed'), 'true');
  assert.equal(a.state.count, 1);
});

test('replays and refusals are counted', async () => {
  const a = await makeApp();
  await post(a, '/items', {});
  await post(a, '/items', {});
  await post(a, '/items', { z: 1 });
  await post(a, '/items', {}, { 'content-type': 'application/json' });
  assert.equal(a.idem.stats.replayed, 1);
  assert.equal(a.idem.stats.idempotency_key_reused, 1);
  assert.equal(a.idem.stats.idempotency_key_missing, 1);
  assert.equal(a.idem.stats.executed, 1);
});

test('plain node:http through wrap()', async () => {
  let n = 0;
  const idem = idempotency({ client: ledger, namespace: newKey('ns'), principal: fixedPrincipal('acct-1'), onError: () => {} });
  const srv = http.createServer(
    idem.wrap(async (req, res) => {
      n++;
      let raw = '';
      for await (const c of req) raw += c;
      if (JSON.parse(raw).raise) throw new Error('boom');
      res.writeHead(201, { 'content-type': 'application/json', location: `/x/${n}` });
      res.end(JSON.stringify({ n }));
    }),
  );
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${srv.address().port}`;
  try {
    const h = { ...H, 'Idempotency-Key': newKey() };
    const first = await fetch(url, { method: 'POST', headers: h, body: '{}' });
    assert.equal(first.status, 201);
    const again = await fetch(url, { method: 'POST', headers: h, body: '{}' });
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(again.headers.get('location'), '/x/1');
    const h2 = { ...H, 'Idempotency-Key': newKey() };
    await problem(await fetch(url, { method: 'POST', headers: h2, body: '{"raise":true}' }), 500, 'outcome_unknown');
    await problem(await fetch(url, { method: 'POST', headers: h2, body: '{"raise":true}' }), 409, 'outcome_unknown');
    assert.equal(n, 2);
  } finally {
    await new Promise((r) => srv.close(r));
  }
});

test('a request body over the limit → 413, nothing claimed', async () => {
  const a = await makeApp({ maxRequestBody: 100 });
  await problem(await post(a, '/items', { pad: 'x'.repeat(200) }), 413, 'payload_too_large');
  assert.equal(a.state.count, 0);
  assert.equal((await post(a, '/items', { pad: 'x' })).status, 201);
});
