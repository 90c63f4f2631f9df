// SPEC §12, TLS: `new Client({ url, ca })` trusts the given CA for an https
// URL, against an HTTPS server started here whose certificate is signed by
// a CA made here (openssl). With that CA the call succeeds; with Node's
// default roots or another CA it fails with TransportError because the
// certificate is not verified. No settle server is needed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:https';
import { once } from 'node:events';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, NotFound, RateLimited, TransportError } from '@settle/client';

const RECORD = {
  key: 'k',
  status: 'running',
  rank: 0,
  reservation: { fingerprint: '0'.repeat(64), principal: 'svc', scopes: [], generation: 0 },
  lease: { fence: 1, worker: 'w1', expires_at: '2026-01-01T00:00:30Z' },
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

let dir, server, url, caPem, otherCaPem;

const openssl = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });

/** A self-signed CA: its certificate (PEM) in NAME.pem, its key in NAME.key. */
function makeCA(name) {
  writeFileSync(
    join(dir, `${name}.cnf`),
    `[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3_ca\n[dn]\nCN = ${name}\n` +
      '[v3_ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\nsubjectKeyIdentifier = hash\n',
  );
  openssl('req', '-x509', '-config', `${name}.cnf`, '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.pem`, '-days', '2');
  return readFileSync(join(dir, `${name}.pem`), 'utf8');
}

/** A certificate for 127.0.0.1 and localhost signed by CA `ca`: { key, cert } (PEM). */
function issue(ca) {
  writeFileSync(
    join(dir, 'server.cnf'),
    '[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = settle test server\n' +
      '[v3_srv]\nbasicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n' +
      'subjectAltName = IP:127.0.0.1, DNS:localhost\nsubjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n',
  );
  openssl('req', '-new', '-config', 'server.cnf', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', 'server.key', '-out', 'server.csr');
  openssl('x509', '-req', '-in', 'server.csr', '-CA', `${ca}.pem`, '-CAkey', `${ca}.key`, '-set_serial', '0x' + randomBytes(8).toString('hex'), '-days', '2', '-extfile', 'server.cnf', '-extensions', 'v3_srv', '-out', 'server.pem');
  return { key: readFileSync(join(dir, 'server.key')), cert: readFileSync(join(dir, 'server.pem')) };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'settle-tls-'));
  caPem = makeCA('settle-test-ca');
  otherCaPem = makeCA('another-ca');
  server = createServer(issue('settle-test-ca'), async (req, res) => {
    const answer = (status, body, headers = {}) => {
      res.writeHead(status, { 'content-type': status === 200 ? 'application/json' : 'application/problem+json', ...headers });
      res.end(JSON.stringify(body));
    };
    const route = `${req.method} ${req.url}`;
    if (route === 'GET /v1/operations/k') return answer(200, RECORD);
    if (route === 'POST /v1/operations/k/heartbeat') {
      // echoes the fence and lease of the JSON body it read
      let text = '';
      for await (const chunk of req) text += chunk;
      const body = JSON.parse(text);
      return answer(200, { fence: body.fence, lease_expires_at: `+${body.lease_ms}ms` });
    }
    if (route === 'GET /v1/stats') return answer(429, { status: 429, code: 'rate_limited', title: 'slow down' }, { 'retry-after': '3' });
    if (route === 'GET /v1/operations/hang') return; // never answers (the client's timeout ends it)
    return answer(404, { status: 404, code: 'not_found', title: 'not found' });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `https://127.0.0.1:${server.address().port}`;
});

after(async () => {
  if (server) {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A TransportError whose cause is the TLS verification of the server's certificate. */
function unverified(e) {
  assert.ok(e instanceof TransportError, `not a TransportError: ${e}`);
  const code = e.cause?.cause?.code ?? e.cause?.code;
  assert.match(String(code), /CERT|SIGNATURE|ISSUER/, `not a certificate verification failure: ${e.message} (${code})`);
  return true;
}

test('with the CA of the server certificate, the call succeeds (string, Buffer, array)', async () => {
  for (const ca of [caPem, Buffer.from(caPem), [otherCaPem, caPem]]) {
    const rec = await new Client({ url, ca }).get('k');
    assert.deepEqual([rec.key, rec.status], ['k', 'running']);
  }
});

test('with the CA: a JSON body, problem answers, Retry-After and the timeout behave as with fetch', async () => {
  const client = new Client({ url, ca: caPem, timeoutMs: 300 });
  assert.deepEqual(await client.heartbeat('k', 7, 5000), { fence: 7, leaseExpiresAt: '+5000ms' });
  await assert.rejects(client.get('missing'), (e) => e instanceof NotFound && e.status === 404);
  await assert.rejects(client.stats(), (e) => e instanceof RateLimited && e.retryAfterS === 3);
  await assert.rejects(client.get('hang'), (e) => e instanceof TransportError && /GET \/v1\/operations\/hang/.test(e.message));
  assert.equal((await client.get('k')).key, 'k', 'the client still works after a timeout');
});

test('with the default roots or another CA, the certificate is refused: TransportError', async () => {
  await assert.rejects(new Client({ url }).get('k'), unverified);
  await assert.rejects(new Client({ url, ca: otherCaPem }).get('k'), unverified);
});

test('the CommonJS build trusts the given CA too', async () => {
  const cjs = createRequire(import.meta.url)('@settle/client');
  assert.notEqual(cjs.Client, Client, 'the CommonJS build is another module');
  assert.equal((await new cjs.Client({ url, ca: caPem }).get('k')).key, 'k');
  await assert.rejects(new cjs.Client({ url, ca: otherCaPem }).get('k'), (e) => e instanceof cjs.TransportError);
});

test('ca is checked when the client is made, and excludes fetch', () => {
  for (const ca of ['', [], [caPem, 42], 42, Buffer.alloc(0)]) {
    assert.throws(() => new Client({ url, ca }), TypeError, JSON.stringify(ca));
  }
  assert.throws(() => new Client({ url, ca: caPem, fetch }), /give one of them/);
});
