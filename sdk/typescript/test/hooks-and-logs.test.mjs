// onReplay (runOnce, makeIdempotent, the middlewares) and makeIdempotent's
// client given as a function, beside the shared vectors' replay.* scenarios.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as S from '@settle/client';
import { startSettle, newKey } from './helpers.mjs';

const { Client, makeIdempotent, fixedPrincipal, withIdempotency } = S;
let server, client;

before(async () => {
  server = await startSettle();
  client = new Client({ url: server.url });
});
after(async () => server?.close());

/** A Client whose calls are counted (to see which client a run used). */
function counted() {
  const calls = [];
  const c = new Client({ url: server.url, fetch: (url, init) => (calls.push(new URL(url).pathname), fetch(url, init)) });
  return { c, calls };
}

// A module-level function: its client is whatever `app.ledger` is at each call.
const app = { ledger: null };
const charge = makeIdempotent(async (order) => ({ charged: order.id }), { client: () => app.ledger, key: (order) => order.id, principal: 'p' });

test('makeIdempotent: client as a function is called on every run', async () => {
  const k = newKey();
  const a = counted();
  const b = counted();
  app.ledger = a.c;
  assert.deepEqual(await charge({ id: k }), { charged: k });
  app.ledger = b.c; // what a test fixture does: another ledger, the same function
  const again = await charge.run({ id: k });
  assert.equal(again.replayed, true);
  assert.deepEqual(again.result, { charged: k });
  assert.ok(a.calls.length > 0 && b.calls.length > 0, JSON.stringify([a.calls, b.calls]));
});

test('runOnce: onReplay is called on a replay only, and its answer is the result', async () => {
  const k = newKey();
  const seen = [];
  const onReplay = (outcome, receipt) => {
    seen.push([outcome, receipt]);
    return { fromHook: outcome.result };
  };
  const first = await S.runOnce(client, k, { a: 1 }, () => ({ result: { n: 1 } }), { principal: 'p', onReplay });
  assert.deepEqual(first.result, { n: 1 });
  assert.equal(seen.length, 0);
  const again = await S.runOnce(client, k, { a: 1 }, () => ({ result: { n: 2 } }), { principal: 'p', onReplay });
  assert.equal(again.replayed, true);
  assert.deepEqual(again.result, { fromHook: { n: 1 } });
  assert.deepEqual(again.outcome.result, { n: 1 }); // the stored outcome is unchanged
  assert.equal(seen.length, 1);
  assert.equal(seen[0][1].key, k);
  assert.equal(seen[0][1].status, 'completed');
});

test('runOnce: a throwing onReplay rejects the run; the record is untouched', async () => {
  const k = newKey();
  await S.runOnce(client, k, 1, () => ({ result: 1 }), { principal: 'p' });
  await assert.rejects(
    S.runOnce(client, k, 1, () => ({ result: 1 }), {
      principal: 'p',
      onReplay: () => {
        throw new RangeError('hook');
      },
    }),
    RangeError,
  );
  assert.equal((await client.get(k)).status, 'completed');
});

test('withIdempotency (fetch): an async onReplay replaces the replayed response', async () => {
  let calls = 0;
  const got = [];
  const handler = withIdempotency(
    async () => {
      calls++;
      return new Response(JSON.stringify({ paid: calls }), { status: 201, headers: { 'content-type': 'application/json' } });
    },
    {
      client,
      principal: fixedPrincipal('acct'),
      onReplay: async (response, receipt) => {
        got.push([response, receipt]);
        return { status: 200, headers: { 'x-replayed-by': 'hook' }, body: { again: JSON.parse(response.body.toString()) } };
      },
    },
  );
  const key = newKey();
  const req = () => new Request('http://app.test/pay', { method: 'POST', headers: { 'idempotency-key': key, 'content-type': 'application/json' }, body: '{"a":1}' });
  const first = await handler(req());
  assert.equal(first.status, 201);
  assert.deepEqual(await first.json(), { paid: 1 });
  const again = await handler(req());
  assert.equal(again.status, 200);
  assert.deepEqual(await again.json(), { again: { paid: 1 } });
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('x-replayed-by'), 'hook');
  assert.equal(calls, 1);
  assert.equal(got.length, 1);
  assert.equal(got[0][0].status, 201);
  assert.equal(got[0][1].status, 'completed');
});

test('the middleware log lines name the error class, as Python does', async () => {
  class PaymentDeclined extends Error {}
  class NothingSent extends S.EffectNotSent {}
  const lines = [];
  const logger = { info: (m) => lines.push(m), warn: (m) => lines.push(m), error: (m) => lines.push(m) };
  const failing = (err) =>
    withIdempotency(
      async () => {
        throw err;
      },
      { client, principal: fixedPrincipal('acct'), logger, onError: () => {} },
    );
  const key = newKey();
  const req = () => new Request('http://app.test/pay', { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' });
  assert.equal((await failing(new PaymentDeclined('card 4242 declined'))(req())).status, 500);
  assert.ok(lines.some((l) => l === `idempotency: key ${key} failed (PaymentDeclined); outcome unknown`), lines.join('\n'));
  const key2 = newKey();
  const req2 = new Request('http://app.test/pay', { method: 'POST', headers: { 'idempotency-key': key2 }, body: '{}' });
  assert.equal((await failing(new NothingSent('not sent'))(req2)).status, 503);
  assert.ok(lines.some((l) => l === `idempotency: the handler of key ${key2} raised NothingSent: released not_committed`), lines.join('\n'));
});
