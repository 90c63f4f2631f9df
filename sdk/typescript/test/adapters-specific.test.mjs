// What is particular to the Fastify plugin and the Fetch wrapper (the rows
// they share with Express are in adapters.test.mjs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Fastify from 'fastify';
import { Client, withIdempotency, fixedPrincipal, middlewareCore as mw } from '@settle/client';
import { idempotency } from '@settle/client/fastify';
import { startSettle, newKey } from './helpers.mjs';

let server, ledger;
before(async () => {
  server = await startSettle();
  ledger = new Client({ url: server.url });
});
after(async () => server?.close());

const quiet = { info() {}, warn() {}, error() {} };
const options = (extra = {}) => ({ client: ledger, namespace: newKey('ns'), principal: fixedPrincipal('acct-1'), logger: quiet, onError: () => {}, ...extra });
const rec = (o, key) => ledger.get(mw.ledgerKey(o.namespace, 'acct-1', key));

async function fastifyApp(opts, routes) {
  const app = Fastify({ logger: false });
  await app.register(idempotency(opts));
  routes(app);
  return app;
}
const inject = (app, url, key, payload = { a: 1 }) => app.inject({ method: 'POST', url, headers: { 'idempotency-key': key }, payload });

test('fastify: a schema validation failure answers before the plugin: nothing claimed, the handler not run', async () => {
  const o = options();
  let runs = 0;
  const app = await fastifyApp(o, (a) =>
    a.post('/v', { schema: { body: { type: 'object', required: ['amount'], properties: { amount: { type: 'integer' } } } } }, async () => ({ n: ++runs })),
  );
  const r = await inject(app, '/v', 'k-v', { amount: 'x' });
  assert.equal(r.statusCode, 400);
  await assert.rejects(rec(o, 'k-v'), /404|not found/i);
  assert.equal((await inject(app, '/v', 'k-v', { amount: 1 })).statusCode, 200);
  assert.equal(runs, 1);
  await app.close();
});

test('fastify: a thrown error, even with a 4xx statusCode, or reply.send(error) → 500 outcome_unknown, record unknown', async () => {
  const o = options();
  const app = await fastifyApp(o, (a) => {
    a.post('/throw', async () => {
      throw Object.assign(new Error('bad input'), { statusCode: 400 });
    });
    a.post('/send-error', async (req, reply) => reply.send(new Error('sent')));
  });
  for (const url of ['/throw', '/send-error']) {
    const r = await inject(app, url, `k${url}`);
    assert.equal(r.statusCode, 500);
    assert.equal(r.headers['content-type'], 'application/problem+json');
    assert.equal(r.json().code, 'outcome_unknown');
    assert.equal((await rec(o, `k${url}`)).status, 'unknown');
    assert.equal((await inject(app, url, `k${url}`)).json().code, 'outcome_unknown');
  }
  await app.close();
});

test('fastify: a hijacked reply is unknown to the plugin: the record becomes unknown', async () => {
  const o = options();
  let responded;
  const afterOurs = new Promise((r) => (responded = r));
  const app = await fastifyApp(o, (a) => {
    a.addHook('onResponse', async () => responded()); // runs after the plugin's own onResponse hook
    a.post('/raw', async (req, reply) => {
      reply.hijack();
      reply.raw.writeHead(201, { 'content-type': 'text/plain' });
      reply.raw.end('raw');
    });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const r = await fetch(`http://127.0.0.1:${app.server.address().port}/raw`, { method: 'POST', headers: { 'idempotency-key': 'k-raw' } });
  assert.equal(await r.text(), 'raw');
  await afterOurs;
  assert.equal((await rec(o, 'k-raw')).status, 'unknown');
  await app.close();
});

test('fastify: the plugin applies to the context it is registered in (skip-override), and only there', async () => {
  const o = options();
  const app = Fastify();
  let runs = 0;
  await app.register(async (scope) => {
    await scope.register(idempotency(o));
    scope.post('/wrapped', async () => ({ n: ++runs }));
  });
  app.post('/plain', async () => ({ n: ++runs }));
  assert.equal((await app.inject({ method: 'POST', url: '/wrapped', payload: {} })).json().code, 'idempotency_key_missing');
  assert.equal((await app.inject({ method: 'POST', url: '/plain', payload: {} })).statusCode, 200);
  await inject(app, '/wrapped', 'k-s');
  assert.equal((await inject(app, '/wrapped', 'k-s')).headers['idempotent-replayed'], 'true');
  assert.equal(runs, 2);
  await app.close();
});

test('fetch: a handler that returns something other than a Response → 500 outcome_unknown; other arguments pass through', async () => {
  const o = options();
  const seen = [];
  const h = withIdempotency(async (request, env, ctx) => {
    seen.push([env, ctx]);
    return env.bad ? 'not a response' : new Response('ok', { status: 201 });
  }, o);
  const req = (key) => new Request('http://localhost/x', { method: 'POST', headers: { 'idempotency-key': key }, body: 'b' });
  const bad = await h(req('k-bad'), { bad: true }, 'c');
  assert.equal(bad.status, 500);
  assert.equal((await bad.json()).code, 'outcome_unknown');
  assert.equal((await rec(o, 'k-bad')).status, 'unknown');
  const ok = await h(req('k-ok'), { bad: false }, 'c');
  assert.equal(ok.status, 201);
  assert.deepEqual(seen, [[{ bad: true }, 'c'], [{ bad: false }, 'c']]);
  // A GET is not wrapped: the handler runs as it is.
  const get = await h(new Request('http://localhost/x'), { bad: false }, 'c');
  assert.equal(get.status, 201);
  assert.equal(seen.length, 3);
  // The handler reads the body itself after the middleware did.
  const echo = withIdempotency(async (request) => new Response(await request.text()), o);
  assert.equal(await (await echo(req('k-echo'))).text(), 'b');
});
