// @settle/client/testing: startSettle starts a real server and cleans up;
// its errors say what to do; localLedger says how to install @settle/local.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import Fastify from 'fastify';
import { Client, Unauthorized } from '@settle/client';
import { idempotency, fixedPrincipal } from '@settle/client/fastify';
import { startSettle, settleBinary, localLedger } from '@settle/client/testing';
import './helpers.mjs'; // fails early with a clear message when SETTLE_BIN is not built

/** Runs fn with process.env changed as given (undefined: removed), then restores it. */
async function withEnv(changes, fn) {
  const saved = Object.fromEntries(Object.keys(changes).map((k) => [k, process.env[k]]));
  for (const [k, v] of Object.entries(changes)) v === undefined ? delete process.env[k] : (process.env[k] = v);
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) v === undefined ? delete process.env[k] : (process.env[k] = v);
  }
}

test('startSettle: a real server on a free port with a temporary data directory; stop() ends it and removes the directory', async () => {
  const settle = await startSettle();
  assert.match(settle.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.ok(existsSync(settle.dataDir));
  const client = settle.client();
  assert.ok(client instanceof Client);
  assert.equal((await client.health()).status, 'ok');
  const g = await client.claim('k', 'f'.repeat(64), { principal: 'p' });
  assert.equal(g.decision, 'execute');
  const other = await startSettle();
  assert.notEqual(other.url, settle.url);
  assert.equal((await other.client().claim('k', 'f'.repeat(64), { principal: 'p' })).decision, 'execute', 'a fresh ledger each time');
  await other[Symbol.asyncDispose](); // what `await using` calls
  assert.notEqual(other.process.exitCode ?? other.process.signalCode, null);
  await settle.stop();
  await settle.stop(); // twice is fine
  assert.notEqual(settle.process.exitCode ?? settle.process.signalCode, null);
  assert.equal(existsSync(settle.dataDir), false);
  await assert.rejects(client.health(), (e) => e.name === 'TransportError');
});

test('startSettle: tenants turn authentication on; client({ token }) is the tenant', async () => {
  const settle = await startSettle({ tenants: { alpha: 'token-alpha-0123456789' } });
  try {
    await assert.rejects(settle.client().stats(), Unauthorized);
    assert.equal((await settle.client({ token: 'token-alpha-0123456789' }).stats()).total, 0);
  } finally {
    await settle.stop();
  }
});

test('startSettle: without a binary, the error names SETTLE_BIN and PATH', async () => {
  await withEnv({ SETTLE_BIN: undefined, PATH: '/nonexistent' }, async () => {
    assert.throws(() => settleBinary(), (e) => /SETTLE_BIN/.test(e.message) && /PATH/.test(e.message) && /cargo build --release -p settle/.test(e.message));
    await assert.rejects(startSettle(), /SETTLE_BIN is not set and `settle` is not on PATH/);
  });
  await withEnv({ SETTLE_BIN: '/nonexistent/settle' }, async () => {
    await assert.rejects(startSettle(), (e) => e.message.includes('"/nonexistent/settle" (SETTLE_BIN) is not an executable file') && /PATH/.test(e.message));
  });
});

test('testing your code: an idempotent Fastify endpoint against startSettle (the README example)', async () => {
  const settle = await startSettle();
  const app = Fastify();
  let charges = 0;
  await app.register(idempotency({ client: settle.client(), principal: fixedPrincipal('acct-1') }));
  app.post('/payments', async (req, reply) => reply.code(201).send({ id: `pay_${++charges}` }));
  try {
    const send = () => app.inject({ method: 'POST', url: '/payments', headers: { 'idempotency-key': 'order-42' }, payload: { amount: 1000 } });
    const [first, again] = [await send(), await send()];
    assert.equal(first.statusCode, 201);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(again.body, first.body);
    assert.equal(charges, 1);
  } finally {
    await app.close();
    await settle.stop();
  }
});

test('localLedger: without @settle/local, the error says how to install it', async () => {
  let installed = true;
  try {
    await import('@settle/local');
  } catch {
    installed = false;
  }
  if (installed) {
    const ledger = await localLedger();
    try {
      assert.equal(typeof ledger.claim, 'function'); // a Client (possibly of another copy of @settle/client)
    } finally {
      await ledger.close();
    }
    return;
  }
  await assert.rejects(localLedger(), (e) => e.message.includes('npm install ./sdk/typescript-local') && e.message.includes('@settle/local'));
});
