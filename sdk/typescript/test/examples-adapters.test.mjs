// The Fastify and Next.js-style examples, run as documented.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { REPO, startSettle, spawnListening, stop, newKey, ledgerArgs } from './helpers.mjs';

let server;
before(async () => {
  server = await startSettle();
});
after(async () => server?.close());

const json = (key, body) => ({ method: 'POST', headers: { 'content-type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}) }, body: JSON.stringify(body) });

test('examples/fastify-payments.mjs: create, replay, a crash after the charge reconciled by the hook', async () => {
  const ex = await spawnListening(process.execPath, [join(REPO, 'sdk/typescript/examples/fastify-payments.mjs'), '--listen', '127.0.0.1:0', ...ledgerArgs(server)]);
  try {
    const pay = (key, body) => fetch(ex.url + '/payments', json(key, body));
    const count = async () => (await (await fetch(ex.url + '/executions')).json()).count;
    const k = newKey();
    const first = await pay(k, { amount: 1000, currency: 'EUR' });
    assert.equal(first.status, 201);
    const again = await pay(k, { amount: 1000, currency: 'EUR' });
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(await again.text(), await first.text());
    assert.equal(await count(), 1);
    assert.equal((await pay(null, { amount: 1, currency: 'EUR' })).status, 400);
    const crash = newKey();
    assert.equal((await pay(crash, { amount: 5, currency: 'EUR', crash_after_charge: true })).status, 500);
    const healed = await pay(crash, { amount: 5, currency: 'EUR', crash_after_charge: true });
    assert.equal(healed.status, 201);
    assert.equal(healed.headers.get('idempotent-replayed'), 'true');
    assert.equal((await healed.json()).amount, 5);
    assert.equal(await count(), 2, 'the hook answered; the handler did not run again');
  } finally {
    await stop(ex.proc);
  }
});

test('examples/next-route-handler.mjs: POST is called as Next.js calls a route handler', async () => {
  process.env.SETTLE_URL = server.url;
  const { POST, chargeCount } = await import('../examples/next-route-handler.mjs');
  const k = newKey();
  const req = (key = k, account = 'acct-7') =>
    new Request('http://localhost/payments', { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-account-id': account }, body: '{"amount":1000,"currency":"EUR"}' });
  const ctx = { params: Promise.resolve({}) };
  const first = await POST(req(), ctx);
  assert.equal(first.status, 201);
  const again = await POST(req(), ctx);
  assert.equal(again.status, 201);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('location'), first.headers.get('location'));
  assert.equal(await again.text(), await first.text());
  assert.equal(chargeCount(), 1);
  const other = await POST(req(k, 'acct-8'), ctx); // another account: another key scope
  assert.equal(other.headers.get('idempotent-replayed'), null);
  assert.equal(chargeCount(), 2);
  const anonymous = new Request('http://localhost/payments', { method: 'POST', headers: { 'idempotency-key': k }, body: '{}' });
  assert.equal((await POST(anonymous, ctx)).status, 401);
  assert.equal(POST.stats.replayed, 1);
});
