// The payments example (issue 10 item 4), run exactly as documented:
// node sdk/typescript/examples/payments.mjs --listen 127.0.0.1:PORT --settle-url URL [--settle-token T]
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { REPO, startSettle, spawnListening, stop, newKey, deadUrl, TOKENS, ledgerArgs } from './helpers.mjs';

const EXAMPLE = join(REPO, 'sdk/typescript/examples/payments.mjs');
let server, auth, example;

function startExample(settle, token) {
  const args = [EXAMPLE, '--listen', '127.0.0.1:0', ...(typeof settle === 'string' ? ['--settle-url', settle] : ledgerArgs(settle))];
  if (token) args.push('--settle-token', token);
  return spawnListening(process.execPath, args);
}

before(async () => {
  server = await startSettle();
  auth = await startSettle({ auth: true });
  example = await startExample(server);
});
after(async () => {
  if (example) await stop(example.proc);
  await server?.close();
  await auth?.close();
});

async function executions(url) {
  const r = await fetch(url + '/executions');
  assert.equal(r.status, 200);
  const b = await r.json();
  assert.deepEqual(Object.keys(b), ['count']);
  return b.count;
}

const pay = (url, key, body) =>
  fetch(url + '/payments', { method: 'POST', headers: { 'content-type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}) }, body: JSON.stringify(body) });

test('create and replay', async () => {
  const before = await executions(example.url);
  const key = newKey();
  const first = await pay(example.url, key, { amount: 1000, currency: 'EUR' });
  const fb = await first.text();
  assert.equal(first.status, 201);
  const n = before + 1;
  assert.deepEqual(JSON.parse(fb), { id: `pay_${n}`, amount: 1000, currency: 'EUR' });
  assert.equal(first.headers.get('location'), `/payments/pay_${n}`);
  assert.equal(first.headers.get('idempotent-replayed'), null);
  const again = await pay(example.url, key, { amount: 1000, currency: 'EUR' });
  assert.equal(again.status, 201);
  assert.equal(await again.text(), fb);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('location'), `/payments/pay_${n}`);
  assert.equal(await executions(example.url), n);
});

test('missing key → 400; reuse → 422', async () => {
  const before = await executions(example.url);
  const r = await pay(example.url, null, { amount: 1, currency: 'EUR' });
  assert.equal(r.status, 400);
  assert.equal((await r.json()).code, 'idempotency_key_missing');
  const key = newKey();
  assert.equal((await pay(example.url, key, { amount: 1, currency: 'EUR' })).status, 201);
  const re = await pay(example.url, key, { amount: 2, currency: 'EUR' });
  assert.equal(re.status, 422);
  assert.equal((await re.json()).code, 'idempotency_key_reused');
  assert.equal(await executions(example.url), before + 1);
});

test('amount 0 → a stored 400', async () => {
  const before = await executions(example.url);
  const key = newKey();
  const first = await pay(example.url, key, { amount: 0, currency: 'EUR' });
  assert.equal(first.status, 400);
  const fb = await first.text();
  const again = await pay(example.url, key, { amount: 0, currency: 'EUR' });
  assert.equal(again.status, 400);
  assert.equal(await again.text(), fb);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(await executions(example.url), before + 1);
});

async function payments(url) {
  const r = await fetch(url + '/provider');
  assert.equal(r.status, 200);
  return (await r.json()).payments;
}

test('negative amount: the handler throws before charging → 500 outcome_unknown; the hook finds no payment, the retry runs again', async () => {
  const before = await executions(example.url);
  const paid = await payments(example.url);
  const key = newKey();
  const r = await pay(example.url, key, { amount: -5, currency: 'EUR' });
  assert.equal(r.status, 500);
  assert.equal((await r.json()).code, 'outcome_unknown');
  const again = await pay(example.url, key, { amount: -5, currency: 'EUR' });
  assert.equal(again.status, 500); // not_committed: the handler ran again (and threw again)
  assert.equal((await again.json()).code, 'outcome_unknown');
  assert.equal(await executions(example.url), before + 2);
  assert.equal(await payments(example.url), paid);
});

test('a handler killed after the provider recorded the payment: the retry is resolved by the reconcile hook, charged once', async () => {
  const before = await executions(example.url);
  const paid = await payments(example.url);
  const key = newKey();
  const body = { amount: 4200, currency: 'EUR', crash_after_charge: true };
  const r = await pay(example.url, key, body);
  assert.equal(r.status, 500);
  assert.equal((await r.json()).code, 'outcome_unknown');
  assert.equal(await payments(example.url), paid + 1, 'the provider recorded the payment');
  const n = before + 1;
  const again = await pay(example.url, key, body);
  assert.equal(again.status, 201);
  assert.deepEqual(await again.json(), { id: `pay_${n}`, amount: 4200, currency: 'EUR' });
  assert.equal(again.headers.get('location'), `/payments/pay_${n}`);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  const third = await pay(example.url, key, body);
  assert.equal(third.status, 201);
  assert.equal(third.headers.get('idempotent-replayed'), 'true');
  assert.equal(await executions(example.url), n, 'the handler ran once');
  assert.equal(await payments(example.url), paid + 1, 'charged once');
});

test('50 concurrent duplicates → exactly one execution', async () => {
  const before = await executions(example.url);
  const key = newKey();
  const rs = await Promise.all(Array.from({ length: 50 }, () => pay(example.url, key, { amount: 700, currency: 'USD', delay_ms: 300 })));
  const bodies = await Promise.all(rs.map((r) => r.text()));
  assert.equal(await executions(example.url), before + 1);
  const created = rs.map((r, i) => [r, bodies[i]]).filter(([r]) => r.status === 201);
  assert.ok(created.length >= 1);
  assert.equal(new Set(created.map(([, b]) => b)).size, 1);
  assert.equal(created.filter(([r]) => r.headers.get('idempotent-replayed') === null).length, 1);
  for (const [r, b] of rs.map((r, i) => [r, bodies[i]]).filter(([r]) => r.status !== 201)) {
    assert.equal(r.status, 409);
    assert.equal(JSON.parse(b).code, 'request_in_progress');
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
  }
});

test('ledger unreachable → 503 idempotency_unavailable', async () => {
  const ex = await startExample(await deadUrl());
  try {
    const r = await pay(ex.url, newKey(), { amount: 1, currency: 'EUR' });
    assert.equal(r.status, 503);
    assert.equal((await r.json()).code, 'idempotency_unavailable');
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
    assert.equal(await executions(ex.url), 0);
  } finally {
    await stop(ex.proc);
  }
});

test('with a token', async () => {
  const ex = await startExample(auth.url, TOKENS.alpha);
  try {
    const key = newKey();
    assert.equal((await pay(ex.url, key, { amount: 3, currency: 'EUR' })).status, 201);
    assert.equal((await pay(ex.url, key, { amount: 3, currency: 'EUR' })).headers.get('idempotent-replayed'), 'true');
  } finally {
    await stop(ex.proc);
  }
  const bad = await startExample(auth.url, 'wrong-token');
  try {
    const r = await pay(bad.url, newKey(), { amount: 3, currency: 'EUR' });
    assert.equal(r.status, 503);
  } finally {
    await stop(bad.proc);
  }
});
