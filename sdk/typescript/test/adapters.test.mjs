// SPEC §8, row by row, for the three adapters of the one engine: the
// Express middleware, the Fastify plugin and the Fetch API wrapper
// (withIdempotency). Every test runs the same requests against the same
// test application written for each framework, over a real settle server,
// and asserts the same answers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { Readable, pipeline } from 'node:stream';
import express from 'express';
import Fastify from 'fastify';
import { Client, EffectNotSent, idempotency as expressIdempotency, withIdempotency, markRetryable, fixedPrincipal, authenticatedPrincipal, middlewareCore as mw } from '@settle/client';
import { idempotency as fastifyIdempotency } from '@settle/client/fastify';
import { startSettle, newKey, deadUrl, notCommittedSupported, NOT_COMMITTED_MISSING } from './helpers.mjs';

let server, ledger, ncSupported;
const closers = [];
before(async () => {
  server = await startSettle();
  ledger = new Client({ url: server.url });
  ncSupported = await notCommittedSupported(ledger);
});
after(async () => {
  for (const c of closers) await c();
  await server?.close();
});

/** Alice's two tokens (before and after a refresh) and bob's: a stand-in for authentication. */
const TOKENS_OF = { 'Bearer alice-1': { id: 'alice' }, 'Bearer alice-2': { id: 'alice' }, 'Bearer bob-1': { id: 42, username: 'bob' } };

/** What the test handler does, from the request's JSON body (the same in every framework). */
async function behave(state, b) {
  state.count++;
  const n = state.count;
  state.entered?.();
  if (b.block) await state.gate;
  if (b.sleep) await new Promise((r) => setTimeout(r, b.sleep));
  if (b.raise) throw new Error('handler failed');
  if (b.notSentFirst && n === 1) throw new EffectNotSent('the upstream refused the connection: nothing was sent');
  const headers = { location: `/items/${n}`, 'x-custom': 'c', 'x-trace': `t${n}` };
  if (b.streamError) return { status: 201, headers: { ...headers, 'content-type': 'text/plain' }, failing: b.streamError };
  if (b.chunks) return { status: b.status ?? 201, headers: { ...headers, 'content-type': 'text/plain' }, chunks: ['part1-', Buffer.from('part2-'), 'end'], retryable: b.retryable };
  return { status: b.status ?? 201, headers: { ...headers, 'content-type': 'application/json' }, text: JSON.stringify({ n, pad: 'x'.repeat(b.size ?? 0) }), retryable: b.retryable };
}

/** A response body stream: `size` bytes, then an error. */
function failingStream(size) {
  return Readable.from(
    (async function* () {
      yield Buffer.alloc(size, 'a');
      throw new Error('the response body stream failed');
    })(),
  );
}

const parse = (text) => {
  if (typeof text === 'object' && text !== null) return text; // parsed by the framework
  try {
    return text ? JSON.parse(text) : {};
  } catch {
    return {};
  }
};

/** The test app of each framework: POST/PATCH/PUT /items and POST /free
 * behave as the body says; `auth`: an authentication step before the
 * middleware sets req.user from the Authorization header. */
const FRAMEWORKS = {
  async express(options, state, { auth }) {
    const idem = expressIdempotency(options);
    const app = express();
    if (auth) app.use((req, res, next) => ((req.user = TOKENS_OF[req.headers.authorization]), next()));
    app.use(idem);
    app.use(express.text({ type: () => true }));
    const items = async (req, res) => {
      const out = await behave(state, parse(req.body));
      if (out.retryable) markRetryable(res);
      res.statusCode = out.status;
      for (const [n, v] of Object.entries(out.headers)) res.setHeader(n, v); // as sent (res.set would add a charset)
      if (out.failing) return pipeline(failingStream(out.failing), res, () => {});
      for (const c of out.chunks ?? []) res.write(c);
      res.end(out.chunks ? undefined : out.text);
    };
    for (const m of ['post', 'patch', 'put']) app[m]('/items', items);
    app.post('/free', items);
    app.use(idem.errorHandler);
    const srv = http.createServer(app);
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    closers.push(() => new Promise((r) => srv.close(r)));
    return { url: `http://127.0.0.1:${srv.address().port}`, stats: idem.stats };
  },

  async fastify(options, state, { auth }) {
    const idem = fastifyIdempotency(options);
    const app = Fastify();
    if (auth) app.addHook('onRequest', async (req) => void (req.user = TOKENS_OF[req.headers.authorization]));
    await app.register(idem);
    const items = async (request, reply) => {
      const out = await behave(state, parse(request.body));
      if (out.retryable) markRetryable(reply);
      reply.code(out.status).headers(out.headers);
      if (out.failing) return failingStream(out.failing);
      return out.chunks ? Readable.from(out.chunks) : out.text;
    };
    for (const m of ['post', 'patch', 'put']) app[m]('/items', items);
    app.post('/free', items);
    await app.listen({ port: 0, host: '127.0.0.1' });
    closers.push(() => app.close());
    return { url: `http://127.0.0.1:${app.server.address().port}`, stats: idem.stats };
  },

  async fetch(options, state, { auth }) {
    const handler = async (request) => {
      const path = new URL(request.url).pathname;
      if (path !== '/items' && path !== '/free') return new Response('not found', { status: 404 });
      const out = await behave(state, parse(await request.text()));
      const body = out.failing
        ? Readable.toWeb(failingStream(out.failing))
        : out.chunks
        ? new ReadableStream({
            start(c) {
              for (const x of out.chunks) c.enqueue(typeof x === 'string' ? new TextEncoder().encode(x) : new Uint8Array(x));
              c.close();
            },
          })
        : out.text;
      const response = new Response(body, { status: out.status, headers: out.headers });
      return out.retryable ? markRetryable(response) : response;
    };
    // No req.user in the Fetch API: the test's authentication is an extractor of the request.
    const opts = auth && options.principal === AUTHENTICATED ? { ...options, principal: (req) => TOKENS_OF[req.headers.get('authorization')]?.id?.toString() } : options;
    const wrapped = withIdempotency(handler, opts);
    const srv = http.createServer(async (req, res) => {
      const headers = new Headers();
      for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
      const body = req.method === 'GET' || req.method === 'HEAD' ? undefined : Readable.toWeb(req);
      const response = await wrapped(new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers, body, duplex: 'half' }));
      res.statusCode = response.status;
      response.headers.forEach((v, n) => res.setHeader(n, v));
      res.end(Buffer.from(await response.arrayBuffer()));
    });
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    closers.push(() => new Promise((r) => srv.close(r)));
    return { url: `http://127.0.0.1:${srv.address().port}`, stats: wrapped.stats };
  },
};

const AUTHENTICATED = authenticatedPrincipal();
/** Each adapter's factory, for configuration errors. */
const FRAMEWORK_FACTORIES = { express: expressIdempotency, fastify: fastifyIdempotency, fetch: (o) => withIdempotency(async () => new Response(''), o) };
/** The request header `name`, whatever the framework's request. */
const header = (req, name) => (typeof req.headers.get === 'function' ? req.headers.get(name) : req.headers[name]);

async function makeApp(kind, options = {}, { settleUrl, client, auth = false } = {}) {
  const state = { count: 0, gate: null, entered: null };
  const namespace = options.namespace ?? newKey('ns');
  const full = {
    client: client ?? new Client({ url: settleUrl ?? server.url }),
    namespace,
    principal: fixedPrincipal('acct-1'),
    onError: () => {},
    logger: { info() {}, warn() {}, error() {} },
    ...options,
  };
  const a = await FRAMEWORKS[kind](full, state, { auth });
  return { ...a, state, namespace };
}

const H = { 'Idempotency-Key': 'k-1', 'content-type': 'application/json' };
const post = (a, path, body, headers = H, method = 'POST') =>
  fetch(a.url + path, { method, headers, body: typeof body === 'string' ? body : JSON.stringify(body) });

async function problem(r, status, code) {
  assert.equal(r.status, status, `expected ${status} ${code}`);
  assert.equal(r.headers.get('content-type'), 'application/problem+json');
  const b = await r.json();
  assert.equal(b.code, code);
  assert.equal(b.status, status);
  assert.equal(b.type, `urn:settle:problem:${code}`);
  return b;
}

/** Blocks the next request whose body has `block: true` until open() is called. */
function gate(a) {
  let open;
  a.state.gate = new Promise((r) => (open = r));
  const entered = new Promise((r) => (a.state.entered = r));
  return { entered, open };
}

const record = (a, key = 'k-1', principal = 'acct-1') => ledger.get(mw.ledgerKey(a.namespace, principal, key));

for (const kind of Object.keys(FRAMEWORKS)) {
  test(`${kind}: key missing → 400; malformed or sent twice → 400 idempotency_key_invalid; handler not run`, async () => {
    const a = await makeApp(kind);
    await problem(await post(a, '/items', {}, { 'content-type': 'application/json' }), 400, 'idempotency_key_missing');
    for (const raw of ['"unterminated', 'has space', 'x'.repeat(256), '"k" ;a=1']) {
      await problem(await post(a, '/items', {}, { ...H, 'Idempotency-Key': raw }), 400, 'idempotency_key_invalid');
    }
    const twice = new Headers([['Idempotency-Key', 'a'], ['Idempotency-Key', 'a'], ['content-type', 'application/json']]);
    await problem(await fetch(a.url + '/items', { method: 'POST', headers: twice, body: '{}' }), 400, 'idempotency_key_invalid');
    assert.equal(a.state.count, 0);
    // Not wrapped: another method, or an optional key.
    assert.equal((await post(a, '/items', {}, { 'content-type': 'application/json' }, 'PUT')).status, 201);
    const b = await makeApp(kind, { routes: () => ({ required: false }) });
    assert.equal((await post(b, '/items', {}, { 'content-type': 'application/json' })).status, 201);
  });

  test(`${kind}: first run unchanged; replay byte for byte with Idempotent-Replayed; stored headers only`, async () => {
    const a = await makeApp(kind);
    const first = await post(a, '/items', '{"status": 201}');
    const fb = await first.text();
    assert.equal(first.status, 201);
    assert.equal(first.headers.get('idempotent-replayed'), null);
    assert.equal(first.headers.get('x-trace'), 't1');
    for (const key of ['k-1', '"k-1"', '"k-1";v=1']) {
      const again = await post(a, '/items', '{"status": 201}', { ...H, 'Idempotency-Key': key });
      assert.equal(again.status, 201);
      assert.equal(await again.text(), fb);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal(again.headers.get('location'), '/items/1');
      assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
      assert.equal(again.headers.get('content-length'), String(Buffer.byteLength(fb)));
      assert.equal(again.headers.get('x-custom'), null);
    }
    assert.equal(a.state.count, 1);
    assert.equal((await record(a)).status, 'completed');
    assert.equal(a.stats.replayed, 3);
    assert.equal(a.stats.executed, 1);
    const b = await makeApp(kind, { storedHeaders: ['X-Custom'] });
    await post(b, '/items', {});
    assert.equal((await post(b, '/items', {})).headers.get('x-custom'), 'c');
  });

  test(`${kind}: a streamed response is captured whole and replayed`, async () => {
    const a = await makeApp(kind);
    assert.equal(await (await post(a, '/items', { chunks: true })).text(), 'part1-part2-end');
    const again = await post(a, '/items', { chunks: true });
    assert.equal(await again.text(), 'part1-part2-end');
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(a.state.count, 1);
  });

  test(`${kind}: same key, another request → 422 idempotency_key_reused; nothing stored`, async () => {
    const a = await makeApp(kind);
    assert.equal((await post(a, '/items', { a: 1 })).status, 201);
    await problem(await post(a, '/items', { a: 2 }), 422, 'idempotency_key_reused');
    await problem(await post(a, '/items?x=1', { a: 1 }), 422, 'idempotency_key_reused');
    await problem(await post(a, '/items', { a: 1 }, H, 'PATCH'), 422, 'idempotency_key_reused');
    await problem(await post(a, '/free', { a: 1 }), 422, 'idempotency_key_reused');
    await problem(await post(a, '/items', '{"a":1}', { ...H, 'content-type': 'text/plain' }), 422, 'idempotency_key_reused');
    assert.equal(a.state.count, 1);
    // The fingerprint is MIDDLEWARE-KEYS.md's, whatever the framework.
    assert.equal((await record(a)).reservation.fingerprint, mw.requestFingerprint('POST', '/items', 'application/json', Buffer.from('{"a":1}')));
    const c = await makeApp(kind, { canonicalJson: true });
    await post(c, '/items', '{"a":1,"b":[1,2]}');
    assert.equal((await post(c, '/items', '{ "b": [1, 2.0], "a": 1 }')).headers.get('idempotent-replayed'), 'true');
  });

  test(`${kind}: fields / exclude / canonicalJson reach the fingerprint`, async () => {
    const a = await makeApp(kind, { exclude: ['/sent_at'] });
    await post(a, '/items', { a: 1, sent_at: 't1' });
    assert.equal((await post(a, '/items', { sent_at: 't2', a: 1 })).headers.get('idempotent-replayed'), 'true'); // canonical by default
    await problem(await post(a, '/items', { a: 2, sent_at: 't1' }), 422, 'idempotency_key_reused');
    const f = await makeApp(kind, { fields: ['/a'] });
    await post(f, '/items', { a: 1, note: 'x' });
    assert.equal((await post(f, '/items', { a: 1, note: 'y' })).headers.get('idempotent-replayed'), 'true');
    const raw = await makeApp(kind, { canonicalJson: false });
    await post(raw, '/items', '{"a":1,"b":2}');
    await problem(await post(raw, '/items', '{"b":2,"a":1}'), 422, 'idempotency_key_reused');
    assert.throws(() => FRAMEWORK_FACTORIES[kind]({ client: ledger, principal: fixedPrincipal('a'), fields: ['/a'], exclude: ['/b'] }), /fields|exclude/);
  });

  test(`${kind}: same key while running → 409 request_in_progress with Retry-After; wait replays the outcome`, async () => {
    const a = await makeApp(kind, { leaseMs: 8000 });
    const g = gate(a);
    const first = post(a, '/items', { block: true });
    try {
      await g.entered;
      const busy = await post(a, '/items', { block: true });
      await problem(busy, 409, 'request_in_progress');
      const ra = Number(busy.headers.get('retry-after'));
      assert.ok(ra >= 7 && ra <= 8, `Retry-After ${ra}: the running lease's time left`);
    } finally {
      g.open();
    }
    assert.equal((await first).status, 201);
    // wait: the duplicate claims again after the ledger's hint until the outcome arrives.
    let sawInFlight;
    const inFlight = new Promise((r) => (sawInFlight = r));
    const client = new Client({
      url: server.url,
      fetch: async (url, init) => {
        const r = await fetch(url, init);
        if (String(url).endsWith('/claim') && (await r.clone().json()).decision === 'in_flight') sawInFlight();
        return r;
      },
    });
    const b = await makeApp(kind, { wait: 10 }, { client });
    const g2 = gate(b);
    const one = post(b, '/items', { block: true });
    await g2.entered;
    const two = post(b, '/items', { block: true }); // waits for the outcome
    await inFlight;
    g2.open();
    const [r1, r2] = await Promise.all([one, two]);
    assert.equal(r1.status, 201);
    assert.equal(r2.status, 201);
    assert.equal(r2.headers.get('idempotent-replayed'), 'true');
    assert.equal(await r2.text(), await r1.text());
    assert.equal(b.state.count, 1);
  });

  test(`${kind}: 20 concurrent duplicates → one execution`, async () => {
    const a = await makeApp(kind);
    const rs = await Promise.all(Array.from({ length: 20 }, () => post(a, '/items', { sleep: 200 })));
    assert.equal(a.state.count, 1);
    const fresh = rs.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === null);
    assert.equal(fresh.length, 1);
    for (const r of rs.filter((r) => r.status !== 201)) await problem(r, 409, 'request_in_progress');
  });

  test(`${kind}: the handler throws → 500 outcome_unknown, record unknown, then 409 outcome_unknown`, async () => {
    const errors = [];
    const a = await makeApp(kind, { onError: (e, req) => errors.push([e.message, typeof req]) });
    await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
    const rec = await record(a);
    assert.equal(rec.status, 'unknown');
    assert.equal(rec.reconcileRequired, true);
    await problem(await post(a, '/items', { raise: true }), 409, 'outcome_unknown');
    assert.equal(a.state.count, 1);
    assert.deepEqual(errors, [['handler failed', 'object']]);
    const t = await makeApp(kind, { timeoutMs: 200 });
    await problem(await post(t, '/items', { sleep: 1500 }), 500, 'outcome_unknown');
    assert.equal((await record(t)).status, 'unknown');
    await problem(await post(t, '/items', { sleep: 1500 }), 409, 'outcome_unknown');
    assert.equal(t.state.count, 1);
  });

  test(`${kind}: the reconcile hook: not_committed runs again; committed replays the found response`, async () => {
    const asked = [];
    const a = await makeApp(kind, {
      reconcile: (lkey, fence, req, info) => {
        const { signal, headers, ...rest } = info;
        assert.ok(signal instanceof AbortSignal);
        assert.equal(headers['idempotency-key'], header(req, 'idempotency-key'));
        assert.equal(headers['content-type'], 'application/json');
        asked.push({ lkey, key: header(req, 'idempotency-key'), info: { ...rest, body: info.body.toString() } });
        return info.idempotencyKey === 'k-1' ? 'not_committed' : { finding: 'committed', response: { status: 201, headers: { location: '/found' }, body: { found: true } } };
      },
    });
    await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
    await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown'); // not_committed: ran again
    assert.equal(a.state.count, 2);
    assert.deepEqual(asked[0], { lkey: mw.ledgerKey(a.namespace, 'acct-1', 'k-1'), key: 'k-1', info: { idempotencyKey: 'k-1', principal: 'acct-1', method: 'POST', path: '/items', body: '{"raise":true}' } });
    const h = { ...H, 'Idempotency-Key': 'k-2' };
    await problem(await post(a, '/items', { raise: true }, h), 500, 'outcome_unknown');
    const found = await post(a, '/items', { raise: true }, h);
    assert.equal(found.status, 201);
    assert.equal(found.headers.get('idempotent-replayed'), 'true');
    assert.equal(found.headers.get('location'), '/found');
    assert.deepEqual(await found.json(), { found: true });
    assert.equal((await record(a, 'k-2')).status, 'completed');
    assert.equal(a.state.count, 3);
    assert.equal(a.stats.reconciled, 1);
  });

  test(`${kind}: the principal: the extractor gets the request; none → 401; a refreshed token replays`, async () => {
    const a = await makeApp(kind, { principal: (req) => header(req, 'x-account') });
    const r1 = await post(a, '/items', {}, { ...H, 'X-Account': 'acct-a' });
    const r2 = await post(a, '/items', {}, { ...H, 'X-Account': 'acct-b' });
    assert.deepEqual([(await r1.json()).n, (await r2.json()).n], [1, 2]);
    await problem(await post(a, '/items', {}), 401, 'idempotency_principal_missing');
    assert.equal(a.state.count, 2);
    const b = await makeApp(kind, { principal: AUTHENTICATED }, { auth: true });
    const first = await post(b, '/items', {}, { ...H, Authorization: 'Bearer alice-1' });
    const again = await post(b, '/items', {}, { ...H, Authorization: 'Bearer alice-2' });
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(await again.text(), await first.text());
    await problem(await post(b, '/items', {}, { ...H, Authorization: 'Bearer expired' }), 401, 'idempotency_principal_missing');
    assert.equal((await record(b, 'k-1', 'alice')).reservation.principal, 'alice');
    assert.equal(b.state.count, 1);
  });

  test(`${kind}: a revoked principal → 403 idempotency_forbidden, even with failOpen`, async () => {
    const p = newKey('acct');
    const a = await makeApp(kind, { principal: fixedPrincipal(p), failOpen: true });
    assert.equal((await post(a, '/items', {})).status, 201);
    await ledger.revoke(p);
    const r = await post(a, '/items', {});
    await problem(r, 403, 'idempotency_forbidden');
    assert.equal(r.headers.get('retry-after'), null);
    assert.equal(a.state.count, 1);
    const b = await makeApp(kind, { principal: fixedPrincipal(p, 1), namespace: a.namespace });
    assert.equal((await post(b, '/items', {})).headers.get('idempotent-replayed'), 'true');
  });

  test(`${kind}: a returned 5xx is stored failed and replayed; 4xx completed`, async () => {
    const a = await makeApp(kind);
    for (const [status, stored] of [[500, 'failed'], [503, 'failed'], [400, 'completed'], [404, 'completed']]) {
      const h = { ...H, 'Idempotency-Key': `s-${status}` };
      const first = await post(a, '/items', { status }, h);
      const again = await post(a, '/items', { status }, h);
      assert.equal(first.status, status);
      assert.equal(again.status, status);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal(await again.text(), await first.text());
      assert.equal((await record(a, `s-${status}`)).status, stored);
    }
    assert.equal(a.state.count, 4);
  });

  for (const status of [408, 409, 425, 429, 'marked']) {
    test(`${kind}: ${status === 'marked' ? 'a response marked retryable' : status} → not stored, released; the retry runs the handler`, async (t) => {
      const a = await makeApp(kind);
      const body = status === 'marked' ? { status: 503, retryable: true } : { status };
      assert.equal((await post(a, '/items', body)).status, body.status);
      const again = await post(a, '/items', body);
      if (!ncSupported) {
        await problem(again, 409, 'outcome_unknown');
        return t.skip(NOT_COMMITTED_MISSING);
      }
      assert.equal(again.status, body.status);
      assert.equal(again.headers.get('idempotent-replayed'), null);
      assert.equal(a.state.count, 2);
      assert.equal(a.stats.not_committed, 2);
    });
  }

  test(`${kind}: a response over maxStoredBody goes out whole; replays 409 response_not_stored`, async () => {
    const a = await makeApp(kind, { maxStoredBody: 1000 });
    const first = await post(a, '/items', { size: 5000 });
    assert.equal(first.status, 201);
    assert.ok((await first.text()).length > 5000);
    await problem(await post(a, '/items', { size: 5000 }), 409, 'response_not_stored');
    assert.equal(a.state.count, 1);
    assert.equal((await record(a)).status, 'completed');
  });

  test(`${kind}: a streamed response over maxStoredBody whose body fails → 500 outcome_unknown, record unknown (issue 47)`, async () => {
    const a = await makeApp(kind, { maxStoredBody: 1000 });
    const r = await post(a, '/items', { streamError: 5000 });
    await problem(r, 500, 'outcome_unknown');
    const rec = await record(a);
    assert.equal(rec.status, 'unknown', JSON.stringify(rec.raw.lease));
    assert.equal(rec.reconcileRequired, true);
    await problem(await post(a, '/items', { streamError: 5000 }), 409, 'outcome_unknown');
    assert.equal(a.state.count, 1);
  });

  test(`${kind}: the handler's EffectNotSent → released not_committed, 503 idempotency_unavailable, Retry-After: 1; the retry runs it (issue 47)`, async () => {
    const a = await makeApp(kind);
    const r = await post(a, '/items', { notSentFirst: true });
    await problem(r, 503, 'idempotency_unavailable');
    assert.equal(r.headers.get('retry-after'), '1');
    const rec = await record(a);
    assert.equal(rec.status, 'pending');
    assert.equal(rec.reconcileRequired, false);
    assert.equal(rec.lease.ended?.reason, 'not_committed');
    const again = await post(a, '/items', { notSentFirst: true });
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), null);
    assert.equal(a.state.count, 2);
  });

  test(`${kind}: releaseOn adds 422: released with forget, no record; the corrected request with the same key runs (issue 47)`, async () => {
    const a = await makeApp(kind, { releaseOn: [408, 409, 425, 429, 422] });
    assert.equal((await post(a, '/items', { status: 422 })).status, 422);
    await assert.rejects(record(a), /not found|404/i);
    const fixed = await post(a, '/items', { status: 201, fixed: true });
    assert.equal(fixed.status, 201);
    assert.equal(fixed.headers.get('idempotent-replayed'), null);
    assert.equal((await record(a)).status, 'completed');
    // A default status is released without forget: the record stays, the same request runs again.
    const h = { ...H, 'Idempotency-Key': 'k-409' };
    assert.equal((await post(a, '/items', { status: 409 }, h)).status, 409);
    assert.equal((await record(a, 'k-409')).lease.ended?.reason, 'not_committed');
    assert.equal(a.state.count, 3);
  });

  test(`${kind}: a reconcile hook past hookTimeoutMs counts as unavailable: 409 outcome_unknown, the lease handed back (issue 47)`, async () => {
    let aborted = null;
    const a = await makeApp(kind, {
      hookTimeoutMs: 200,
      reconcile: (lkey, fence, req, info) =>
        new Promise(() => {
          info.signal.addEventListener('abort', () => (aborted = info.signal.reason));
        }),
    });
    await problem(await post(a, '/items', { raise: true }), 500, 'outcome_unknown');
    await problem(await post(a, '/items', { raise: true }), 409, 'outcome_unknown');
    assert.ok(aborted instanceof Error && aborted.name === 'HookTimeout', String(aborted));
    const rec = await record(a);
    assert.equal(rec.status, 'unknown');
    assert.equal(rec.lease.ended?.reason, 'unavailable');
    assert.equal(a.state.count, 1);
  });

  test(`${kind}: a request body over maxRequestBody → 413, nothing claimed`, async () => {
    const a = await makeApp(kind, { maxRequestBody: 100 });
    await problem(await post(a, '/items', { pad: 'x'.repeat(200) }), 413, 'payload_too_large');
    assert.equal(a.state.count, 0);
    await assert.rejects(record(a), /not found|404/i);
    assert.equal((await post(a, '/items', { pad: 'x' })).status, 201);
  });

  test(`${kind}: settle unreachable → 503 idempotency_unavailable (fail closed); failOpen runs the handler`, async () => {
    const a = await makeApp(kind, {}, { settleUrl: await deadUrl() });
    const r = await post(a, '/items', {});
    await problem(r, 503, 'idempotency_unavailable');
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(a.state.count, 0);
    const b = await makeApp(kind, { failOpen: true }, { settleUrl: await deadUrl() });
    assert.equal((await post(b, '/items', {})).status, 201);
    assert.equal(b.state.count, 1);
    assert.equal(b.stats.fail_open, 1);
  });

  test(`${kind}: the lease is heartbeated while a slow handler runs`, async () => {
    const a = await makeApp(kind, { leaseMs: 400 });
    assert.equal((await post(a, '/items', { sleep: 1000 })).status, 201);
    const rec = await record(a);
    assert.equal(rec.status, 'completed', 'settled: the lease (400 ms) did not lapse during the 1 s handler');
    assert.equal(rec.attempts.length, 1);
    assert.equal((await post(a, '/items', { sleep: 1000 })).headers.get('idempotent-replayed'), 'true');
    assert.equal(a.state.count, 1);
  });
}

test('the three adapters answer the same sequence of requests alike', async () => {
  const seq = [
    [{ a: 1 }, H],
    [{ a: 1 }, H],
    [{ a: 2 }, H],
    [{ status: 503 }, { ...H, 'Idempotency-Key': 'k-5xx' }],
    [{ status: 503 }, { ...H, 'Idempotency-Key': 'k-5xx' }],
    [{}, { 'content-type': 'application/json' }],
    [{}, { ...H, 'Idempotency-Key': 'bad key' }],
  ];
  const seen = {};
  for (const kind of Object.keys(FRAMEWORKS)) {
    const a = await makeApp(kind);
    seen[kind] = [];
    for (const [body, headers] of seq) {
      const r = await post(a, '/items', body, headers);
      // The media type: Fastify adds "; charset=utf-8" to a string it sends (stored and replayed as sent).
      const media = r.headers.get('content-type').split(';')[0];
      seen[kind].push([r.status, media, r.headers.get('idempotent-replayed'), r.headers.get('location'), r.headers.get('retry-after'), await r.text()]);
    }
  }
  assert.deepEqual(seen.fastify, seen.express);
  assert.deepEqual(seen.fetch, seen.express);
});
