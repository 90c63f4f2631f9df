// @settle/local: the ledger in process. Memory is not durable (its receipts
// say so), a directory is (locked while open, kept across close/reopen);
// requests run off the event loop; bad input is refused before and by the
// server's own code; require() and import give the same class, a Client.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { LocalLedger, LedgerClosed } from '../index.mjs';
import { statSync, readdirSync } from 'node:fs';
import * as S from '@settle/client';

const require = createRequire(import.meta.url);
const REQ = { amount: 1000, currency: 'EUR' };
const key = () => `k-${randomUUID()}`;
const charge = async () => ({ result: { charge: 'ch_1' } });

test('in memory: a Client whose receipts say durable: false, replayed once settled', async () => {
  const l = new LocalLedger();
  try {
    assert.ok(l instanceof S.Client);
    assert.equal(l.durable, false);
    let calls = 0;
    const k = key();
    const r = await S.runOnce(l, k, REQ, async () => (calls++, { result: { charge: 'ch_1' } }), { principal: 'p' });
    assert.equal(r.replayed, false);
    assert.equal(r.receipt.durable, false);
    const again = await S.runOnce(l, k, REQ, charge, { principal: 'p' });
    assert.equal(again.replayed, true);
    assert.deepEqual(again.result, { charge: 'ch_1' });
    assert.deepEqual(again.receipt, r.receipt);
    assert.equal(calls, 1);
    assert.equal((await l.get(k)).status, 'completed');
    // another request under the same key is the server's conflict
    await assert.rejects(S.runOnce(l, k, { ...REQ, amount: 1 }, charge, { principal: 'p' }), S.FingerprintMismatch);
  } finally {
    l.close();
  }
});

test('with a directory: durable, locked while open, kept across close and reopen', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'settle-local-'));
  try {
    const k = key();
    const a = new LocalLedger({ data: join(dir, 'data') });
    assert.equal(a.durable, true);
    const r = await S.runOnce(a, k, REQ, charge, { principal: 'p' });
    assert.equal(r.receipt.durable, true);
    assert.throws(() => new LocalLedger({ data: join(dir, 'data') }), (e) => /lock|in use|busy/i.test(e.message));
    a.close();
    a.close(); // idempotent
    await assert.rejects(a.get(k), S.LedgerClosed);
    const b = new LocalLedger({ data: join(dir, 'data') });
    try {
      const again = await S.runOnce(b, k, REQ, async () => assert.fail('the effect ran twice'), { principal: 'p' });
      assert.equal(again.replayed, true);
      assert.deepEqual(again.receipt, r.receipt);
    } finally {
      b.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a request runs off the event loop: the loop turns while a durable settle is in flight', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'settle-local-'));
  const l = new LocalLedger({ data: join(dir, 'data') });
  try {
    let turns = 0;
    let done = false;
    const spin = () => {
      if (done) return;
      turns++;
      setImmediate(spin);
    };
    setImmediate(spin);
    // A synchronous native call would resolve before any setImmediate ran.
    await S.runOnce(l, key(), REQ, charge, { principal: 'p' });
    done = true;
    assert.ok(turns > 0, 'the event loop did not turn during the request');
  } finally {
    l.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad input: refused by the constructor, or by the server code with its problem', async () => {
  assert.throws(() => new LocalLedger({ data: 5 }), TypeError);
  assert.throws(() => new LocalLedger({ data: '' }), TypeError);
  assert.throws(() => new LocalLedger(null), TypeError);
  const l = new LocalLedger();
  try {
    await assert.rejects(
      l.claim(key(), 'sha256:' + 'a'.repeat(64), { principal: 'p' }),
      (e) => e instanceof S.InvalidRequest && e.status === 422 && e.field === 'fingerprint',
    );
    await assert.rejects(l.get(key()), S.NotFound);
    const r = await l.fetch('http://settle.local/v1/operations/%zz/claim', { method: 'POST', body: '{}' });
    assert.ok(S.problemError(r.status, await r.json()) instanceof S.BadRequest); // the server's answer to a bad path segment
    await assert.rejects(l.fetch('http://127.0.0.1:1/v1/operations/x'), /answers only http:\/\/settle.local/);
  } finally {
    l.close();
  }
});

test('the fetch answers every route of the HTTP API, with the server headers', async () => {
  const l = new LocalLedger();
  try {
    const r = await l.fetch(new Request('http://settle.local/v1/operations?limit=1'));
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /json/);
    assert.deepEqual(await r.json(), { operations: [], next: null });
  } finally {
    l.close();
  }
});

test('concurrent callers on one ledger: each key runs its effect once', async () => {
  const l = new LocalLedger();
  try {
    const keys = Array.from({ length: 16 }, key);
    const counts = new Map();
    const effect = (k) => async () => (counts.set(k, (counts.get(k) ?? 0) + 1), { result: { k } });
    await Promise.all(keys.flatMap((k) => [1, 2, 3].map(() => S.runOnce(l, k, REQ, effect(k), { principal: 'p' }).catch((e) => e))));
    for (const k of keys) assert.equal(counts.get(k), 1, k);
  } finally {
    l.close();
  }
});

test('require() gives the same class for CommonJS, extending its Client', () => {
  const cjs = require('@settle/local');
  const client = require('@settle/client');
  const l = new cjs.LocalLedger();
  try {
    assert.ok(l instanceof client.Client);
    assert.equal(l.durable, false);
  } finally {
    l.close();
  }
});

test('a closed ledger fails at once with LedgerClosed, never retried', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'settle-local-'));
  try {
    for (const l of [new LocalLedger(), new LocalLedger({ data: join(dir, 'data') })]) {
      l.close();
      assert.equal(LedgerClosed, S.LedgerClosed);
      // Retried until the deadline, this would be a DeadlineExceeded after a minute.
      await assert.rejects(S.runOnce(l, key(), REQ, charge, { principal: 'p', deadlineMs: 60_000 }), (e) => e instanceof LedgerClosed && !(e instanceof S.TransportError));
      await assert.rejects(l.get('k'), LedgerClosed);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('segmentBytes sizes a new directory (default 4 MiB segments), checked', () => {
  const dir = mkdtempSync(join(tmpdir(), 'settle-local-'));
  // The blocks taken, as du counts them (the index's journal is sparse).
  const size = (d) => {
    let n = 0;
    for (const e of readdirSync(d, { recursive: true, withFileTypes: true })) if (e.isFile()) n += statSync(join(e.parentPath ?? e.path, e.name)).blocks * 512;
    return n;
  };
  try {
    new LocalLedger({ data: join(dir, 'default') }).close();
    new LocalLedger({ data: join(dir, 'small'), segmentBytes: 65536 }).close();
    assert.ok(size(join(dir, 'default')) < 16 * 1024 * 1024, `${size(join(dir, 'default'))}`);
    assert.ok(size(join(dir, 'small')) < 1024 * 1024, `${size(join(dir, 'small'))}`);
    for (const bad of [100, 1.5, 2 ** 31, '4096']) assert.throws(() => new LocalLedger({ data: join(dir, 'bad'), segmentBytes: bad }), TypeError);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
