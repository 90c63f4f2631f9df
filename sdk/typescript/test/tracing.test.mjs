// SPEC §12, Traces: every request to settle carries the caller's W3C trace
// context (traceparent, tracestate) when @opentelemetry/api is installed and
// a span is active, and no trace header otherwise, from the ES module and
// the CommonJS builds; without @opentelemetry/api the client works and
// sends none. The requests are captured by a `fetch` stub: no settle server.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cpSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { context, propagation, trace, TraceFlags } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { TraceState, W3CTraceContextPropagator } from '@opentelemetry/core';
import { Client, runOnce } from '@settle/client';

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const RECORD = {
  key: 'k',
  status: 'pending',
  rank: 0,
  reservation: { fingerprint: '0'.repeat(64), principal: 'svc', scopes: [], generation: 0 },
  lease: null,
  outcome: null,
  receipt: null,
  reconcile_required: false,
  disputed: false,
  attempts: [],
  quarantine: [],
  created_at: '2026-01-01T00:00:00Z',
  updated_at: '2026-01-01T00:00:00Z',
  expires_at: null,
};

// What an OpenTelemetry SDK registers (NodeSDK, NodeTracerProvider.register()).
before(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
});

/** A fetch stub answering `answer(url, init)` (default: a record) that keeps the headers of each request. */
function capture(answer = () => RECORD) {
  const sent = [];
  const stub = async (url, init) => {
    sent.push({ path: new URL(url).pathname, headers: { ...init.headers } });
    return new Response(JSON.stringify(answer(new URL(url).pathname, init)), { status: 200, headers: { 'content-type': 'application/json' } });
  };
  return { sent, stub, last: () => sent.at(-1).headers };
}

/** Runs `fn` with an active span of a new trace; resolves to [its result, the span context]. */
async function inSpan(fn, traceState) {
  const sc = { traceId: randomBytes(16).toString('hex'), spanId: randomBytes(8).toString('hex'), traceFlags: TraceFlags.SAMPLED, isRemote: false, traceState };
  const ctx = trace.setSpan(context.active(), trace.wrapSpanContext(sc));
  return [await context.with(ctx, fn), sc];
}

for (const [format, load] of [
  ['ES module', async () => import('@settle/client')],
  ['CommonJS', async () => createRequire(import.meta.url)('@settle/client')],
]) {
  test(`${format} build: traceparent of the active span, nothing without one`, async () => {
    const S = await load();
    const { stub, last } = capture();
    const client = new S.Client({ url: 'http://settle.test', fetch: stub });
    await client.get('k');
    assert.equal(last().traceparent, undefined);
    assert.equal(last().tracestate, undefined);
    const [, sc] = await inSpan(() => client.get('k'));
    assert.equal(last().traceparent, `00-${sc.traceId}-${sc.spanId}-01`);
    assert.equal(last().tracestate, undefined, 'no tracestate in the context: none sent');
    await client.get('k');
    assert.equal(last().traceparent, undefined, 'outside the span again');
  });
}

test('tracestate of the active context is sent', async () => {
  const { stub, last } = capture();
  const client = new Client({ url: 'http://settle.test', fetch: stub });
  const [, sc] = await inSpan(() => client.get('k'), new TraceState('vendor=opaque,other=1'));
  assert.equal(last().traceparent, `00-${sc.traceId}-${sc.spanId}-01`);
  assert.equal(last().tracestate, 'vendor=opaque,other=1');
});

test('concurrent calls each carry their own caller\'s trace', async () => {
  const { stub, sent } = capture();
  const client = new Client({ url: 'http://settle.test', fetch: stub });
  const runs = await Promise.all([1, 2, 3, 4].map((n) => inSpan(() => client.get(`k${n}`))));
  for (const [, sc] of runs) {
    const mine = sent.filter((r) => r.headers.traceparent?.includes(sc.traceId));
    assert.equal(mine.length, 1, sc.traceId);
  }
});

test('runOnce: the claim, the heartbeats and the release carry the caller\'s trace', async () => {
  let beat;
  const beaten = new Promise((r) => (beat = r));
  const { stub, sent } = capture((path) => {
    const op = path.split('/').pop();
    if (op === 'claim') return { decision: 'execute', fence: 1, attempt: 1, lease_expires_at: '2026-01-01T00:00:30Z' };
    if (op === 'heartbeat') {
      beat();
      return { fence: 1, lease_expires_at: '2026-01-01T00:00:30Z' };
    }
    assert.equal(op, 'release', path);
    return { fence: 1, released: true };
  });
  const client = new Client({ url: 'http://settle.test', fetch: stub });
  const [, sc] = await inSpan(() =>
    assert.rejects(
      runOnce(client, 'k', { a: 1 }, async () => {
        await beaten; // a lease of 30 ms: a heartbeat every 10 ms
        throw new Error('stopped before the dispatch mark: the lease is released');
      }, { principal: 'svc', leaseMs: 30, marksDispatch: true }),
      /stopped before the dispatch mark/,
    ),
  );
  const ops = sent.map((r) => r.path.split('/').pop());
  assert.ok(ops[0] === 'claim' && ops.at(-1) === 'release' && ops.includes('heartbeat'), ops.join(' '));
  assert.deepEqual(new Set(sent.map((r) => r.headers.traceparent)), new Set([`00-${sc.traceId}-${sc.spanId}-01`]));
});

test('a linked install (npm install ./sdk/typescript) uses the application\'s @opentelemetry/api, from both builds', () => {
  // The package (dist and package.json, no node_modules) outside the
  // application, linked into it: Node resolves from the package's real
  // path, where @opentelemetry/api is not; the application has it.
  const dir = mkdtempSync(join(tmpdir(), 'settle-linked-'));
  try {
    const pkg = join(dir, 'client');
    mkdirSync(pkg);
    cpSync(join(PKG, 'package.json'), join(pkg, 'package.json'));
    cpSync(join(PKG, 'dist'), join(pkg, 'dist'), { recursive: true });
    const app = join(dir, 'app');
    mkdirSync(join(app, 'node_modules/@settle'), { recursive: true });
    writeFileSync(join(app, 'package.json'), '{ "name": "app", "private": true }');
    symlinkSync(pkg, join(app, 'node_modules/@settle/client'), 'dir');
    symlinkSync(join(PKG, 'node_modules/@opentelemetry'), join(app, 'node_modules/@opentelemetry'), 'dir');
    const script = (load) => `
      const S = ${load};
      const api = require('@opentelemetry/api');
      api.context.setGlobalContextManager(new (require('@opentelemetry/context-async-hooks').AsyncLocalStorageContextManager)().enable());
      api.propagation.setGlobalPropagator(new (require('@opentelemetry/core').W3CTraceContextPropagator)());
      const sent = [];
      const fetch = async (url, init) => (sent.push(init.headers.traceparent ?? null), new Response('{"status":"ok"}', { status: 200 }));
      const client = new S.Client({ url: 'http://settle.test', fetch });
      const sc = { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: 1 };
      await api.context.with(api.trace.setSpan(api.context.active(), api.trace.wrapSpanContext(sc)), () => client.health());
      await client.health();
      let mine = 'resolves';
      try { require(require.resolve('@settle/client').replace(/dist.*$/, 'node_modules/@opentelemetry/api')); } catch { mine = 'missing'; }
      console.log(JSON.stringify({ mine, sent }));
    `;
    const run = (args) => JSON.parse(execFileSync(process.execPath, args, { cwd: app, encoding: 'utf8' }));
    const cjs = run(['-e', `(async () => { ${script("require('@settle/client')")} })()`]);
    const esm = run(['--input-type=module', '-e', `import { createRequire } from 'node:module'; const require = createRequire(process.cwd() + '/'); ${script("await import('@settle/client')")}`]);
    for (const out of [cjs, esm]) {
      assert.equal(out.mine, 'missing', 'the package itself has no @opentelemetry/api');
      assert.deepEqual(out.sent, ['00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', null]);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('without @opentelemetry/api installed, both builds work and send no trace header', () => {
  // The package alone (dist and package.json) in a project of its own, where
  // @opentelemetry/api does not resolve.
  const dir = mkdtempSync(join(tmpdir(), 'settle-notrace-'));
  try {
    const pkg = join(dir, 'node_modules/@settle/client');
    mkdirSync(pkg, { recursive: true });
    cpSync(join(PKG, 'package.json'), join(pkg, 'package.json'));
    cpSync(join(PKG, 'dist'), join(pkg, 'dist'), { recursive: true });
    const script = (load) => `
      const S = ${load};
      const sent = [];
      const fetch = async (url, init) => (sent.push(init.headers), new Response('{"status":"ok"}', { status: 200 }));
      await new S.Client({ url: 'http://settle.test', fetch }).health();
      let api = 'resolves';
      try { require.resolve('@opentelemetry/api'); } catch { api = 'missing'; }
      console.log(JSON.stringify({ api, headers: sent }));
    `;
    const run = (args) => JSON.parse(execFileSync(process.execPath, args, { cwd: dir, encoding: 'utf8' }));
    const cjs = run(['-e', `(async () => { ${script("require('@settle/client')")} })()`]);
    const esm = run(['--input-type=module', '-e', `import { createRequire } from 'node:module'; const require = createRequire(process.cwd() + '/'); ${script("await import('@settle/client')")}`]);
    for (const out of [cjs, esm]) {
      assert.equal(out.api, 'missing');
      assert.equal(out.headers.length, 1);
      assert.ok(out.headers[0]['user-agent'] && !('traceparent' in out.headers[0]), JSON.stringify(out.headers[0]));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
