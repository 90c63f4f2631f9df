// Every SPEC §7 call through the typed client, and the typed error of every
// problem code the server answers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import * as S from '@settle/client';
import { startSettle, newKey, deadUrl, TOKENS } from './helpers.mjs';

const { Client, fingerprint, problemError } = S;
const FP = fingerprint({ charge: 'order-42', amount: 1000 });
const OTHER = fingerprint({ charge: 'order-42', amount: 2000 });
const RESP = createHash('sha256').update('{"charge":"ch_1"}').digest('hex');
const completed = (result = { charge: 'ch_1' }) => ({ status: 'completed', result, responseSha256: RESP });

let server, auth, client;
before(async () => {
  server = await startSettle();
  auth = await startSettle({ auth: true });
  client = new Client({ url: server.url });
});
after(async () => {
  await server?.close();
  await auth?.close();
});

test('claim, settle, replay, get', async () => {
  const key = newKey();
  const b = { principal: 'svc-billing', scopes: ['charge', 'refund', 'charge'] };
  const g = await client.claim(key, FP, b, { worker: 'w1', leaseMs: 5000, retentionS: 600 });
  assert.equal(g.decision, 'execute');
  assert.ok(Number.isSafeInteger(g.fence) && g.fence >= 1 && g.attempt === 1);
  const r = await client.settle(key, g.fence, FP, b, completed());
  assert.deepEqual([r.status, r.fence, r.durable, r.key, r.fingerprint, r.responseSha256], ['completed', g.fence, true, key, FP, RESP]);
  const again = await client.claim(key, FP, b);
  assert.equal(again.decision, 'replay');
  assert.deepEqual(again.outcome.result, { charge: 'ch_1' });
  assert.deepEqual(again.receipt, r);
  const rec = await client.get(key);
  assert.equal(rec.status, 'completed');
  assert.deepEqual(rec.receipt, r);
  assert.deepEqual(rec.reservation.scopes, ['charge', 'refund']);
  assert.equal(rec.lease.worker, 'w1');
  assert.deepEqual(await client.settle(key, g.fence, FP, b, completed()), r, 'rule 0: a lost acknowledgement gets the original receipt');
});

test('heartbeat, dispatch, release, in_flight, unknown, reconcile', async () => {
  const key = newKey();
  const b = { principal: 'p' };
  const g = await client.claim(key, FP, b, { marksDispatch: true });
  const hb = await client.heartbeat(key, g.fence, 20000);
  assert.equal(hb.fence, g.fence);
  const busy = await client.claim(key, FP, b);
  assert.equal(busy.decision, 'in_flight');
  assert.ok(busy.retryAfterMs >= 10 && busy.retryAfterMs <= 1000);
  assert.deepEqual(await client.release(key, g.fence), { fence: g.fence, released: true });
  const g2 = await client.claim(key, FP, b, { marksDispatch: true });
  assert.ok(g2.fence > g.fence);
  assert.equal((await client.dispatch(key, g2.fence)).dispatched, true);
  await assert.rejects(client.release(key, g2.fence), S.ReceiptRequired);
  const u = await client.settle(key, g2.fence, FP, b, { status: 'unknown', error: 'timed out after send' });
  assert.equal(u.status, 'unknown');
  const rg = await client.claim(key, FP, b);
  assert.equal(rg.decision, 'reconcile');
  await assert.rejects(client.settle(key, rg.fence, FP, b, completed()), S.WrongPurpose);
  assert.deepEqual(await client.reconcile(key, rg.fence, 'unavailable'), { fence: rg.fence, released: true });
  const rg2 = await client.claim(key, FP, b);
  const ex = await client.reconcile(key, rg2.fence, 'not_committed');
  assert.equal(ex.decision, 'execute');
  assert.equal(ex.fence, rg2.fence);
  assert.equal((await client.settle(key, ex.fence, FP, b, completed())).status, 'completed');
  const key2 = newKey();
  const g3 = await client.claim(key2, FP, b);
  await client.settle(key2, g3.fence, FP, b, { status: 'unknown' });
  const rg3 = await client.claim(key2, FP, b);
  const rc = await client.reconcile(key2, rg3.fence, 'committed', { fingerprint: FP, binding: b, outcome: completed() });
  assert.equal(rc.status, 'completed');
});

test('revoke, warn, warnings, health, ready, metrics, openapi', async () => {
  const principal = newKey('principal');
  assert.equal((await client.revoke(principal)).generation, 1);
  assert.equal((await client.revoke(principal)).generation, 2);
  const task = newKey('task');
  const w = await client.warn(task, 'slow-upstream', 'took 40 s');
  assert.deepEqual([w.task, w.class, w.count, w.detail, w.saturated], [task, 'slow-upstream', 1, 'took 40 s', false]);
  const w2 = await client.warn(task, 'slow-upstream');
  assert.deepEqual([w2.count, w2.detail], [2, 'took 40 s']);
  assert.deepEqual((await client.warnings(task)).map((x) => x.class), ['slow-upstream']);
  assert.deepEqual(await client.warnings(newKey('none')), []);
  assert.equal((await client.health()).status, 'ok');
  assert.equal((await client.ready()).status, 'ready');
  assert.match(await client.metrics(), /settle_http_requests_total/);
  assert.match((await client.openapi()).openapi, /^3\.1/);
});

test('keys are percent-encoded', async () => {
  for (const k of ["a/b", "%41", "q?x=1", "frag#1", "~t", "+p", "!'()*"]) {
    const key = k + newKey('');
    const g = await client.claim(key, FP, { principal: 'p' });
    assert.equal(g.decision, 'execute');
    assert.equal((await client.get(key)).key, key);
  }
});

test('fences and generations stay exact up to 2^53 - 1', async () => {
  const top = Number.MAX_SAFE_INTEGER;
  const key = newKey();
  const b = { principal: newKey('gen'), generation: top };
  const g = await client.claim(key, FP, b);
  assert.equal((await client.get(key)).reservation.generation, top);
  await client.settle(key, g.fence, FP, b, completed());
  await assert.rejects(client.heartbeat(key, 2 ** 53), RangeError);
  await assert.rejects(client.claim(newKey(), FP, { principal: 'p', generation: 2 ** 53 }), RangeError);
  await assert.rejects(client.dispatch(key, 1.5), RangeError);
});

test('typed refusals', async () => {
  const key = newKey();
  const b = { principal: 'p', scopes: ['s'] };
  const g = await client.claim(key, FP, b);
  const fm = await client.claim(key, OTHER, b).catch((e) => e);
  assert.ok(fm instanceof S.FingerprintMismatch && fm instanceof S.Refusal && fm.status === 409 && fm.code === 'fingerprint_mismatch');
  await assert.rejects(client.claim(key, FP, { principal: 'p', scopes: ['other'] }), S.BindingMismatch);
  await assert.rejects(client.heartbeat(key, g.fence + 1000), S.StaleFence);
  await assert.rejects(client.reconcile(key, g.fence, 'unavailable'), S.WrongPurpose);
  await assert.rejects(client.release(key, g.fence), S.ReceiptRequired);
  const r = await client.settle(key, g.fence, FP, b, completed());
  await assert.rejects(client.settle(key, r.fence, FP, b, { status: 'completed', result: { charge: 'ch_2' }, responseSha256: OTHER }), S.ResultMismatch);
  assert.equal((await client.get(key)).disputed, true);
  const principal = newKey('rev');
  await client.revoke(principal);
  await assert.rejects(client.claim(newKey(), FP, { principal, generation: 0 }), S.StaleBinding);
  const k2 = newKey();
  const g2 = await client.claim(k2, FP, { principal: 'p' }, { leaseMs: 200 });
  await new Promise((r) => setTimeout(r, 150)); // < lease_margin (100 ms) left: settle must refuse
  await assert.rejects(client.settle(k2, g2.fence, FP, { principal: 'p' }, completed()), S.LeaseExpired);
  const task = newKey('task');
  for (let i = 0; i < 64; i++) await client.warn(task, `c${i}`);
  await assert.rejects(client.warn(task, 'c64'), S.TooManyClasses);
});

test('invalid_request, not_found, payload_too_large, bad_request', async () => {
  const e = await client.claim(newKey(), FP, { principal: 'p' }, { leaseMs: 5 }).catch((x) => x);
  assert.ok(e instanceof S.InvalidRequest && e.status === 422 && e.field === 'lease_ms');
  await assert.rejects(client.claim('bad key', FP, { principal: 'p' }), S.InvalidRequest);
  await assert.rejects(client.get(newKey()), (x) => x instanceof S.NotFound && x.status === 404);
  // A server with a small body limit: a small body is written whole before
  // the server answers 413 and closes (a 1 MiB upload races that close).
  const small = await startSettle({ args: ['--max-body-bytes', '300'] });
  try {
    await assert.rejects(new Client({ url: small.url }).claim(newKey(), FP, { principal: 'p' }, { worker: 'w'.repeat(400) }), S.PayloadTooLarge);
  } finally {
    await small.close();
  }
  const resp = await fetch(server.url + '/v1/operations/%zz/claim', { method: 'POST', body: '{}' });
  assert.ok(problemError(resp.status, await resp.json()) instanceof S.BadRequest);
});

test('every problem code has its class', () => {
  const table = [
    [400, 'bad_request', S.BadRequest], [401, 'unauthorized', S.Unauthorized], [404, 'not_found', S.NotFound],
    [408, 'request_timeout', S.RequestTimeout], [413, 'payload_too_large', S.PayloadTooLarge], [422, 'invalid_request', S.InvalidRequest],
    [409, 'fingerprint_mismatch', S.FingerprintMismatch], [409, 'binding_mismatch', S.BindingMismatch], [409, 'stale_binding', S.StaleBinding],
    [409, 'stale_fence', S.StaleFence], [409, 'lease_expired', S.LeaseExpired], [409, 'wrong_purpose', S.WrongPurpose],
    [409, 'result_mismatch', S.ResultMismatch], [409, 'receipt_required', S.ReceiptRequired], [409, 'too_many_classes', S.TooManyClasses],
    [503, 'record_refused', S.RecordRefused], [503, 'unavailable', S.Unavailable], [409, 'future_refusal', S.Refusal], [418, 'teapot', S.ProblemError],
  ];
  for (const [status, code, cls] of table) {
    const e = problemError(status, { code, title: 't', detail: 'd', status });
    assert.equal(e.constructor, cls, code);
    assert.equal(e.code, code);
    assert.equal(e.status, status);
  }
  const u = problemError(503, { code: 'unavailable', correlation_id: 'c-1' }, 2);
  assert.ok(u instanceof S.Unavailable && u.retryAfterS === 2 && u.correlationId === 'c-1');
  assert.ok(problemError(502, '<html>') instanceof S.ProblemError);
});

test('transport errors', async () => {
  const c = new Client({ url: await deadUrl(), timeoutMs: 2000 });
  await assert.rejects(c.health(), S.TransportError);
});

test('tokens and tenant isolation', async () => {
  await assert.rejects(new Client({ url: auth.url }).get('k'), (e) => e instanceof S.Unauthorized && e.status === 401);
  await assert.rejects(new Client({ url: auth.url, token: 'wrong' }).claim(newKey(), FP, { principal: 'p' }), S.Unauthorized);
  const a = new Client({ url: auth.url, token: TOKENS.alpha });
  const b = new Client({ url: auth.url, token: TOKENS.beta });
  const key = newKey();
  assert.equal((await a.claim(key, FP, { principal: 'p' })).decision, 'execute');
  await assert.rejects(b.get(key), S.NotFound);
  assert.equal((await b.claim(key, OTHER, { principal: 'p' })).decision, 'execute');
});
