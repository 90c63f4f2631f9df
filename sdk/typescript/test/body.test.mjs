// The request body after the middleware: whatever its content type, the
// handler and any body parser after the middleware see the request exactly
// as without it (the middleware reads the body for the fingerprint, then
// puts it back into the request stream).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import express from 'express';
import { Client, idempotency, fixedPrincipal } from '@settle/client';
import { startSettle, newKey, deadUrl } from './helpers.mjs';

let server, ledger;
const servers = [];
before(async () => {
  server = await startSettle();
  ledger = new Client({ url: server.url });
});
after(async () => {
  for (const s of servers) {
    s.closeAllConnections(); // a handler left waiting for a body that never comes
    await new Promise((r) => s.close(r));
  }
  await server?.close();
});

async function listen(handler) {
  const srv = http.createServer(handler);
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  servers.push(srv);
  return `http://127.0.0.1:${srv.address().port}`;
}

const newIdem = () => idempotency({ client: ledger, namespace: newKey('ns'), principal: fixedPrincipal('acct-1'), onError: () => {} });

/** What a handler saw: req.body (Buffers as base64) and the bytes it read from the stream itself. */
function seen(req, streamed) {
  const b = req.body;
  return {
    body: Buffer.isBuffer(b) ? { buffer: b.toString('base64') } : b === undefined ? '<undefined>' : b,
    streamed: streamed === undefined ? '<not read>' : { bytes: streamed.length, base64: streamed.toString('base64') },
  };
}

// A handler that waits for a body that was swallowed would wait forever:
// each test is bounded, so that it fails instead.
const T = { timeout: 20_000 };

const readAll = async (req) => {
  const parts = [];
  for await (const c of req) parts.push(c);
  return Buffer.concat(parts);
};
const readOnData = (req) =>
  new Promise((resolve, reject) => {
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });

/** Two Express apps, the same parser and handler, one behind the middleware. */
async function pair(parser, read) {
  const make = async (idem) => {
    const app = express();
    if (idem) app.use(idem);
    if (parser) app.use(parser);
    app.post('/x', async (req, res) => {
      const streamed = read ? await read(req) : undefined;
      res.status(201).json(seen(req, streamed));
    });
    return listen(app);
  };
  return { plain: await make(null), wrapped: await make(newIdem()) };
}

/** The same request to both; what each handler saw. */
async function both(urls, contentType, body) {
  const out = [];
  for (const url of [urls.plain, urls.wrapped]) {
    const headers = { 'Idempotency-Key': newKey() };
    if (contentType) headers['content-type'] = contentType;
    const r = await fetch(url + '/x', { method: 'POST', headers, body });
    assert.equal(r.status, 201, await r.clone().text());
    out.push(await r.json());
  }
  return out;
}

const BIN = randomBytes(200 * 1024); // several chunks, over the stream's highWaterMark

const CASES = [
  ['JSON (express.json)', () => express.json(), 'application/json', '{"a":1,"b":"é","c":[true,null]}'],
  ['form (express.urlencoded)', () => express.urlencoded({ extended: false }), 'application/x-www-form-urlencoded', 'a=1&b=x%20y&c=%C3%A9'],
  ['text (express.text)', () => express.text(), 'text/plain; charset=utf-8', 'hello\nworld é'],
  ['binary (express.raw)', () => express.raw({ limit: '1mb' }), 'application/octet-stream', BIN],
  ['JSON, empty body (express.json)', () => express.json(), 'application/json', ''],
];

for (const [name, parser, ct, body] of CASES) {
  test(`body: ${name} sees the request as without the middleware`, T, async () => {
    const urls = await pair(parser());
    const [plain, wrapped] = await both(urls, ct, body);
    assert.notEqual(plain.body, '<undefined>', 'the parser parsed it (without the middleware)');
    assert.deepEqual(wrapped, plain);
  });
}

for (const [name, read] of [
  ['for await (const c of req)', readAll],
  ["req.on('data')", readOnData],
]) {
  test(`body: a handler reading the stream itself (${name}) gets every byte`, T, async () => {
    const urls = await pair(null, read);
    for (const [ct, body] of [
      ['application/octet-stream', BIN],
      ['application/json', '{"a":1}'],
      ['text/plain', 'x'],
      [null, ''],
    ]) {
      const [plain, wrapped] = await both(urls, ct, body);
      assert.equal(plain.streamed.bytes, Buffer.byteLength(body));
      assert.deepEqual(wrapped, plain);
    }
  });
}

test('body: a chunked request (no content-length) arriving in pieces', T, async () => {
  const urls = await pair(express.raw({ limit: '1mb', type: () => true }));
  const send = (url) =>
    new Promise((resolve, reject) => {
      const req = http.request(url + '/x', { method: 'POST', headers: { 'Idempotency-Key': newKey(), 'content-type': 'application/x-custom' } }, (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(Buffer.concat(parts).toString()) }));
      });
      req.on('error', reject);
      // Each piece is written once the previous one was flushed to the socket.
      const pieces = [BIN.subarray(0, 1000), BIN.subarray(1000, 70_000), BIN.subarray(70_000)];
      const next = () => (pieces.length ? req.write(pieces.shift(), next) : req.end());
      next();
    });
  const plain = await send(urls.plain);
  const wrapped = await send(urls.wrapped);
  assert.equal(plain.status, 201);
  assert.equal(wrapped.status, 201);
  assert.deepEqual(wrapped.body, plain.body);
  assert.equal(Buffer.from(plain.body.body.buffer, 'base64').length, BIN.length);
});

test('body: plain node:http (wrap) reads the stream as without the middleware', T, async () => {
  const handler = async (req, res) => {
    const got = req.headers['x-read'] === 'data' ? await readOnData(req) : await readAll(req);
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify(seen(req, got)));
  };
  const urls = { plain: await listen(handler), wrapped: await listen(newIdem().wrap(handler)) };
  for (const how of ['iterate', 'data']) {
    for (const [ct, body] of [
      ['application/json', '{"a":1}'],
      ['application/x-www-form-urlencoded', 'a=1&b=2'],
      ['application/octet-stream', BIN],
    ]) {
      const out = [];
      for (const url of [urls.plain, urls.wrapped]) {
        const r = await fetch(url + '/x', { method: 'POST', headers: { 'Idempotency-Key': newKey(), 'content-type': ct, 'x-read': how }, body });
        assert.equal(r.status, 201);
        out.push(await r.json());
      }
      assert.equal(out[0].streamed.bytes, Buffer.byteLength(body));
      assert.deepEqual(out[1], out[0]);
    }
  }
});

test('body: a replay and a fail-open run keep the body too', T, async () => {
  const app = express();
  let runs = 0;
  app.use(idempotency({ client: ledger, namespace: newKey('ns'), principal: fixedPrincipal('acct-1'), onError: () => {} }));
  app.use(express.urlencoded({ extended: false }));
  app.post('/x', (req, res) => {
    runs++;
    res.status(201).json(req.body);
  });
  const url = await listen(app);
  const h = { 'Idempotency-Key': newKey(), 'content-type': 'application/x-www-form-urlencoded' };
  const first = await fetch(url + '/x', { method: 'POST', headers: h, body: 'a=1' });
  assert.deepEqual(await first.json(), { a: '1' });
  const again = await fetch(url + '/x', { method: 'POST', headers: h, body: 'a=1' });
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(await again.json(), { a: '1' });
  assert.equal(runs, 1);
  // failOpen with the ledger unreachable: the handler runs, with its body.
  const open = express();
  open.use(idempotency({ client: new Client({ url: await deadUrl() }), principal: fixedPrincipal('acct-1'), failOpen: true, logger: { info() {}, warn() {}, error() {} } }));
  open.use(express.urlencoded({ extended: false }));
  open.post('/x', (req, res) => res.status(201).json(req.body));
  const r = await fetch((await listen(open)) + '/x', { method: 'POST', headers: h, body: 'a=2' });
  assert.equal(r.status, 201);
  assert.deepEqual(await r.json(), { a: '2' });
});
