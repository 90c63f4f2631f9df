// SPEC §11.8–9 against a real server: the failure classes of runOnce and
// makeIdempotent (not sent, refused, unknown), a lost dispatch answer, a
// result that cannot be stored, 429 from settle, and resend.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as S from '@settle/client';
import { startSettle, newKey } from './helpers.mjs';

const { Client, makeIdempotent } = S;
let server, client;

before(async () => {
  server = await startSettle();
  client = new Client({ url: server.url });
});
after(async () => server?.close());

/** A payment provider that records charges by idempotency key (as
 * Stripe does): a second charge with the same key returns the first. */
function provider() {
  const byKey = new Map();
  return {
    applied: 0,
    charge(key, amount) {
      if (byKey.has(key)) return byKey.get(key);
      this.applied++;
      const c = { id: `ch_${this.applied}`, amount };
      byKey.set(key, c);
      return c;
    },
    find: (key) => byKey.get(key) ?? null,
  };
}

/** The calls a client makes, by their last path segment. */
function counted(fetchImpl = fetch) {
  const calls = [];
  const c = new Client({
    url: server.url,
    fetch: async (url, init) => {
      calls.push(new URL(url).pathname.split('/').pop());
      return fetchImpl(url, init);
    },
  });
  c.count = (call) => calls.filter((x) => x === call).length;
  return c;
}

test('marksDispatch: an error thrown before ctx.dispatch() is "not sent": released, the next call runs', async () => {
  const id = newKey('order');
  let runs = 0;
  const charge = makeIdempotent(
    async (orderId, amount, ctx) => {
      runs++;
      if (runs === 1) throw new Error('the card service is down'); // before the dispatch mark
      await ctx.dispatch();
      return { charged: amount };
    },
    { client, key: (orderId) => `charge-${orderId}`, principal: 'svc', marksDispatch: true },
  );
  const e = await charge(id, 100).catch((x) => x);
  assert.equal(e.message, 'the card service is down'); // the error itself, not OutcomeUnknown
  const rec = await client.get(`charge-${id}`);
  assert.equal(rec.status, 'pending');
  assert.equal(rec.reconcileRequired, false);
  assert.equal(rec.lease.ended?.reason, 'released', JSON.stringify(rec.raw.lease)); // release(not_dispatched)
  assert.equal(rec.lease.dispatched, false);
  assert.deepEqual(await charge(id, 100), { charged: 100 }); // no ReconcileRequired: it runs
  assert.equal(runs, 2);
  assert.equal((await client.get(`charge-${id}`)).status, 'completed');
});

test('EffectNotSent after the dispatch mark → release not_committed, the next call runs', async () => {
  const key = newKey('charge');
  let runs = 0;
  const charge = makeIdempotent(
    async (ctx) => {
      runs++;
      await ctx.dispatch();
      if (runs === 1) throw new S.EffectNotSent('connection refused before the request was written');
      return 'ok';
    },
    { client, key: () => key, principal: 'svc', marksDispatch: true },
  );
  await assert.rejects(charge(), S.EffectNotSent);
  const rec = await client.get(key);
  assert.equal(rec.status, 'pending');
  assert.equal(rec.reconcileRequired, false);
  assert.equal(rec.lease.ended?.reason, 'not_committed');
  assert.equal(await charge(), 'ok');
  assert.equal(runs, 2);
});

test('a failure after the dispatch mark → unknown; the reconcile hook resolves it, the effect ran once', async () => {
  const id = newKey('order');
  const psp = provider();
  let runs = 0;
  const options = {
    client,
    key: (orderId) => `charge-${orderId}`,
    principal: 'svc',
    marksDispatch: true,
    reconcile: (key) => {
      const found = psp.find(key);
      return found ? { result: found } : 'not_committed';
    },
  };
  const charge = makeIdempotent(async (orderId, amount, ctx) => {
    runs++;
    await ctx.dispatch();
    psp.charge(ctx.key, amount);
    throw new Error('connection reset after the charge was sent'); // the answer is lost
  }, options);
  const e = await charge(id, 100).catch((x) => x);
  assert.ok(e instanceof S.OutcomeUnknown, String(e));
  assert.match(e.message, /connection reset/);
  const rec = await client.get(`charge-${id}`);
  assert.equal(rec.status, 'unknown');
  assert.equal(rec.reconcileRequired, true);
  assert.match(rec.attempts[0].error, /connection reset after the charge was sent/);
  // The retry: the hook asks the provider, finds the charge, records it.
  const r = await charge.run(id, 100);
  assert.equal(r.reconciled, true);
  assert.deepEqual(r.outcome.result, { id: 'ch_1', amount: 100 });
  assert.deepEqual(await charge(id, 100), { id: 'ch_1', amount: 100 }); // a replay now
  assert.equal(runs, 1);
  assert.equal(psp.applied, 1);
  assert.equal((await client.get(`charge-${id}`)).status, 'completed');
});

test("reconcile: 'resend' resolves unknown through the remote's own de-duplication", async () => {
  const psp = provider();
  let runs = 0;
  const key = newKey('charge');
  const charge = makeIdempotent(
    async (amount, ctx) => {
      runs++;
      await ctx.dispatch(); // under the reconcile lease: a local no-op
      const c = psp.charge(ctx.key, amount); // the remote de-duplicates by ctx.key
      if (runs === 1) throw new Error('timeout reading the answer');
      return c;
    },
    { client, key: () => key, principal: 'svc', marksDispatch: true, reconcile: 'resend' },
  );
  await assert.rejects(charge(250), S.OutcomeUnknown);
  assert.equal((await client.get(key)).status, 'unknown');
  const r = await charge.run(250);
  assert.equal(r.reconciled, true);
  assert.equal(r.replayed, false);
  assert.deepEqual(r.outcome.result, { id: 'ch_1', amount: 250 });
  assert.equal(runs, 2);
  assert.equal(psp.applied, 1, 'applied once: the resend was de-duplicated by the remote');
  const rec = await client.get(key);
  assert.equal(rec.status, 'completed');
  assert.equal(rec.reconcileRequired, false);
  assert.equal(rec.receipt.fence, r.fence);

  // A resend that fails is reported unavailable: the record stays unknown.
  const key2 = newKey('charge');
  let n = 0;
  const failing = makeIdempotent(
    async (ctx) => {
      n++;
      await ctx.dispatch();
      throw new Error(n === 1 ? 'lost' : 'the remote is down');
    },
    { client, key: () => key2, principal: 'svc', marksDispatch: true, reconcile: 'resend' },
  );
  await assert.rejects(failing(), S.OutcomeUnknown);
  const e = await failing().catch((x) => x);
  assert.ok(e instanceof S.ReconcileRequired, String(e));
  assert.equal(e.cause.message, 'the remote is down');
  const rec2 = await client.get(key2);
  assert.equal(rec2.status, 'unknown');
  assert.equal(rec2.reconcileRequired, true);
  assert.notEqual(rec2.lease.ended, null, 'the reconcile lease was handed back');
  assert.equal((await client.claim(key2, rec2.reservation.fingerprint, { principal: 'svc' })).decision, 'reconcile');
});

test('runOnce: a dispatch whose answer is lost is retried under the same fence; the effect runs once', async () => {
  let lost = 1;
  const c = counted(async (url, init) => {
    const r = await fetch(url, init);
    if (String(url).endsWith('/dispatch') && lost-- > 0) {
      await r.arrayBuffer();
      throw new TypeError('fetch failed: connection reset after the ledger answered (test)');
    }
    return r;
  });
  const key = newKey();
  let runs = 0;
  const r = await c.runOnce(key, { a: 1 }, async (ctx) => {
    runs++;
    await ctx.dispatch();
    return { result: { sent: true } };
  }, { principal: 'p', marksDispatch: true });
  assert.equal(r.receipt.status, 'completed');
  assert.equal(c.count('dispatch'), 2);
  assert.equal(runs, 1);
  const rec = await client.get(key);
  assert.equal(rec.status, 'completed');
  assert.equal(rec.attempts.length, 1);
});

test('a result that cannot be stored (BigInt) before the dispatch mark: the error names the type, the key stays usable, a serializer settles it', async () => {
  const key = newKey('quote');
  const options = { client, key: () => key, principal: 'svc', marksDispatch: true };
  let runs = 0;
  const quote = async (amount) => {
    runs++;
    return { amount: BigInt(amount) * 10n ** 18n, currency: 'WEI' }; // no dispatch: nothing was sent
  };
  const e = await makeIdempotent(quote, options)(3).catch((x) => x);
  assert.ok(e instanceof S.ResultNotSerializable, String(e));
  assert.match(e.message, /BigInt/);
  assert.match(e.message, /\/amount/);
  assert.match(e.message, /serializer/);
  assert.equal(e.typeName, 'BigInt');
  const rec = await client.get(key);
  assert.equal(rec.status, 'pending');
  assert.equal(rec.reconcileRequired, false);
  const withSerializer = makeIdempotent(quote, { ...options, serializer: (v) => (typeof v === 'bigint' ? v.toString() : null) });
  const r = await withSerializer.run(3);
  assert.equal(r.receipt.status, 'completed');
  assert.deepEqual(r.outcome.result, { amount: '3000000000000000000', currency: 'WEI' });
  assert.equal(runs, 2);
  const again = await withSerializer.run(3);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.outcome.result, { amount: '3000000000000000000', currency: 'WEI' });
  assert.equal(runs, 2);
});

test('a result that cannot be stored after the dispatch mark → unknown, with the message on the attempt', async () => {
  const key = newKey();
  class Payment {
    constructor(id) {
      this.id = id;
    }
  }
  const e = await client
    .runOnce(key, {}, async (ctx) => {
      await ctx.dispatch();
      return { result: { payment: new Payment('p1'), seen: new Map([['a', 1]]) } };
    }, { principal: 'p', marksDispatch: true })
    .catch((x) => x);
  assert.ok(e instanceof S.OutcomeUnknown, String(e));
  assert.ok(e.cause instanceof S.ResultNotSerializable);
  assert.match(e.message, /Payment at \/payment/);
  const rec = await client.get(key);
  assert.equal(rec.status, 'unknown');
  assert.match(rec.attempts[0].error, /a Payment at \/payment, which cannot be stored as JSON; register a serializer/);
  // Never silently run again: the next run needs reconciliation, and the
  // error says how to resolve it and how to find what waits.
  await assert.rejects(
    client.runOnce(key, {}, () => assert.fail('ran again'), { principal: 'p', marksDispatch: true }),
    (e) => e instanceof S.ReconcileRequired && /reconcile hook/.test(e.message) && /Reconciler/.test(e.message) && /settle list --status unknown/.test(e.message),
  );
});

test('encodeResult: JSON as it is; the serializer for every value that is not', () => {
  const d = new Date('2024-01-02T03:04:05.000Z');
  assert.deepEqual(S.encodeResult({ a: [1, undefined, 'x'], b: undefined, d, n: null }), { a: [1, null, 'x'], d: d.toISOString(), n: null });
  assert.equal(S.encodeResult(undefined), null);
  for (const [v, name] of [[1n, 'BigInt'], [new Map(), 'Map'], [new Set([1]), 'Set'], [NaN, 'NaN'], [() => 1, 'function'], [Symbol('s'), 'Symbol'], ['\ud800', 'lone surrogate']]) {
    assert.throws(() => S.encodeResult({ v }), (e) => e instanceof S.ResultNotSerializable && e.message.includes(name) && e.path === '/v', name);
  }
  const ser = (v) => (v instanceof Map ? Object.fromEntries(v) : typeof v === 'bigint' ? Number(v) : String(v));
  assert.deepEqual(S.encodeResult({ m: new Map([['k', 2n]]) }, ser), { m: { k: 2 } });
  assert.throws(() => S.encodeResult(1n, () => 2n), /returned by the serializer/);
});

/** A problem+json answer of settle. */
const problemAnswer = (status, code, headers = {}) =>
  new Response(JSON.stringify({ type: `urn:settle:problem:${code}`, title: 'Rate limited', status, detail: 'slow down', code }), {
    status,
    headers: { 'content-type': 'application/problem+json', ...headers },
  });

test('a 429 from settle is retried like 503, honouring Retry-After, until the deadline', async () => {
  let limited = 1;
  const c = counted((url, init) =>
    String(url).endsWith('/claim') && limited-- > 0 ? Promise.resolve(problemAnswer(429, 'rate_limited', { 'retry-after': '1' })) : fetch(url, init),
  );
  const t0 = Date.now();
  const r = await c.runOnce(newKey(), { a: 1 }, () => ({ result: { ok: true } }), { principal: 'p' });
  assert.equal(r.receipt.status, 'completed');
  assert.equal(c.count('claim'), 2);
  assert.ok(Date.now() - t0 >= 1000, 'waited the Retry-After second');
  // Until the deadline: a Retry-After past it ends the wait at once.
  const always = counted(() => Promise.resolve(problemAnswer(429, 'rate_limited', { 'retry-after': '5' })));
  const e = await always.runOnce(newKey(), {}, () => assert.fail('ran'), { principal: 'p', deadlineMs: 1000 }).catch((x) => x);
  assert.ok(e instanceof S.DeadlineExceeded, String(e));
  assert.ok(e.cause instanceof S.RateLimited && e.cause.status === 429 && e.cause.retryAfterS === 5);
});

test('a reconcile hook whose found result cannot be stored: ResultNotSerializable, the reconcile lease is handed back at once', async () => {
  const key = newKey();
  await assert.rejects(client.runOnce(key, {}, () => { throw new Error('lost'); }, { principal: 'p' }), S.OutcomeUnknown);
  const e = await client.runOnce(key, {}, () => assert.fail('ran'), { principal: 'p', reconcile: () => ({ result: { amount: 5n } }) }).catch((x) => x);
  assert.ok(e instanceof S.ResultNotSerializable && /BigInt at \/amount/.test(e.message), String(e));
  const rec = await client.get(key);
  assert.equal(rec.status, 'unknown');
  assert.notEqual(rec.lease.ended, null, 'handed back, not left to lapse');
  const r = await client.runOnce(key, {}, () => assert.fail('ran'), { principal: 'p', reconcile: () => ({ result: { amount: 5n } }), serializer: String });
  assert.equal(r.reconciled, true);
  assert.deepEqual(r.outcome.result, { amount: '5' });
});

test('a reconcile hook runs at most hookTimeoutMs (default: the lease), heartbeated: past it, reconcile(unavailable) and OutcomeUnknown caused by HookTimeout (issue 47)', async () => {
  const key = newKey();
  const fp = S.fingerprint({ a: 1 });
  const g = await client.claim(key, fp, { principal: 'p' });
  await client.settle(key, g.fence, fp, { principal: 'p' }, { status: 'unknown' });
  let signal = null;
  const t0 = Date.now();
  const e = await client
    .runOnce(key, { a: 1 }, () => assert.fail('the effect ran'), {
      principal: 'p',
      leaseMs: 600, // hookTimeoutMs defaults to it
      reconcile: (k, fence, options) => {
        signal = options.signal;
        return new Promise(() => {});
      },
    })
    .catch((x) => x);
  assert.ok(e instanceof S.OutcomeUnknown, String(e));
  assert.ok(e.cause instanceof S.HookTimeout, String(e.cause));
  assert.equal(e.cause.timeoutMs, 600);
  assert.ok(Date.now() - t0 < 3000);
  assert.equal(signal.aborted, true);
  const rec = await client.get(key);
  assert.equal(rec.status, 'unknown');
  assert.equal(rec.lease.ended?.reason, 'unavailable');
  // A hook that throws: the same (the hook's error as the cause).
  const e2 = await client
    .runOnce(key, { a: 1 }, () => assert.fail('the effect ran'), { principal: 'p', reconcile: () => { throw new Error('lookup failed'); } })
    .catch((x) => x);
  assert.ok(e2 instanceof S.OutcomeUnknown && /lookup failed/.test(e2.cause.message), String(e2));
});

test('the calls that hand a lease back retry past the run\'s deadline, up to the lease\'s end (issue 47)', async () => {
  let refusals = 2;
  const c = counted(async (url, init) => {
    if (String(url).endsWith('/release') && refusals-- > 0) {
      return new Response(JSON.stringify({ status: 503, code: 'unavailable', detail: 'test' }), { status: 503, headers: { 'content-type': 'application/problem+json', 'retry-after': '1' } });
    }
    return fetch(url, init);
  });
  const key = newKey();
  const e = await c
    .runOnce(key, {}, async () => {
      throw new S.EffectNotSent('nothing was sent');
    }, { principal: 'p', deadlineMs: 300, leaseMs: 5000 })
    .catch((x) => x);
  assert.ok(e instanceof S.EffectNotSent, String(e));
  assert.equal(c.count('release'), 3, 'retried after the 300 ms deadline, with Retry-After: 1');
  const rec = await client.get(key);
  assert.equal(rec.lease.ended?.reason, 'not_committed', 'released, not left to lapse');
});

test('settle refused 422 (a result over max_result_bytes) → settled unknown at once with that error; OutcomeUnknown carries the refusal and the outcome (issue 47)', async () => {
  const key = newKey();
  const e = await client.runOnce(key, {}, () => ({ result: { pad: 'x'.repeat(70_000) } }), { principal: 'p' }).catch((x) => x);
  assert.ok(e instanceof S.OutcomeUnknown, String(e));
  assert.ok(e.cause instanceof S.InvalidRequest, String(e.cause));
  assert.equal(e.outcome.status, 'completed');
  assert.equal(e.receipt.status, 'unknown');
  const rec = await client.get(key);
  assert.equal(rec.status, 'unknown');
  assert.match(rec.attempts[0].error, /could not be recorded: 422 invalid_request/);
});
