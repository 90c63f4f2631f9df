// The payments endpoint on Fastify 5 (a devDependency of this package),
// behind the idempotency plugin of @settle/client/fastify:
//
//   cd sdk/typescript && npm install
//   node sdk/typescript/examples/fastify-payments.mjs --listen 127.0.0.1:PORT --settle-url URL [--settle-token T] [--settle-ca FILE]
//   node sdk/typescript/examples/fastify-payments.mjs --listen 127.0.0.1:PORT --local DIR     # the ledger in process (@settle/local)
//
// POST /payments (requires Idempotency-Key), body {"amount": <int>,
// "currency": "<str>", "crash_after_charge": <bool, optional>}: charges a
// fake provider that records payments by idempotency key (as real ones do)
// and answers 201 {"id", "amount", "currency"} with Location. Amount 0 →
// 400 (stored and replayed). crash_after_charge → the handler throws after
// the provider recorded the payment: 500 outcome_unknown; the retry's
// reconcile hook finds the payment and answers with it (201, replayed),
// charged once. GET /executions → {"count": n}, not wrapped. Port 0 picks
// a free port; "listening on HOST:PORT" is printed when ready.
import Fastify from 'fastify';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { Client, middlewareCore } from '@settle/client';
import { idempotency, fixedPrincipal } from '@settle/client/fastify';

const { values } = parseArgs({
  options: { listen: { type: 'string', default: '127.0.0.1:8080' }, 'settle-url': { type: 'string' }, 'settle-token': { type: 'string' }, 'settle-ca': { type: 'string' }, local: { type: 'string' } },
});
if (!values['settle-url'] === (values.local === undefined)) {
  console.error('usage: node examples/fastify-payments.mjs --listen HOST:PORT (--settle-url URL [--settle-token T] [--settle-ca FILE] | --local DIR)');
  process.exit(2);
}

/** The ledger: a settle server (--settle-url), or with --local DIR the ledger
 * in this process (@settle/local, durable in DIR; in this repository, the
 * sibling folder sdk/typescript-local when the package is not installed). */
async function openLedger() {
  if (values.local === undefined) {
    // --settle-ca: the CA (PEM) to trust for an https settle URL
    const ca = values['settle-ca'] === undefined ? undefined : readFileSync(values['settle-ca']);
    return new Client({ url: values['settle-url'], token: values['settle-token'], ca });
  }
  const { LocalLedger } = await import('@settle/local').catch((e) => {
    if (e?.code !== 'ERR_MODULE_NOT_FOUND') throw e;
    return import('../../typescript-local/index.mjs');
  });
  return new LocalLedger({ data: values.local });
}

/** The fake provider: payments recorded by idempotency key. */
const payments = new Map();
const providerKey = (request) => `acct-1/${middlewareCore.parseIdempotencyKey([request.headers['idempotency-key']])}`;
const created = (p) => ({ status: 201, headers: { 'content-type': 'application/json; charset=utf-8', location: `/payments/${p.id}` }, body: JSON.stringify(p) });

const app = Fastify();
// An application with users would authenticate first (an onRequest hook, @fastify/jwt)
// and use authenticatedPrincipal(): request.user, never a token.
await app.register(
  idempotency({
    client: await openLedger(),
    namespace: 'payments-example',
    principal: fixedPrincipal('acct-1'),
    routes: (method, path) => (method === 'POST' && path === '/payments' ? {} : null),
    onError: (err) => console.error('payments: handler failed:', err.message),
    // A retry found the record unknown: did the provider record a payment under this key?
    reconcile: (ledgerKey, fence, request) => {
      const p = payments.get(providerKey(request));
      return p ? { finding: 'committed', response: created(p) } : 'not_committed';
    },
  }),
);

let executions = 0;
app.post('/payments', async (request, reply) => {
  const n = ++executions;
  const { amount, currency, crash_after_charge: crash = false } = request.body ?? {};
  if (!Number.isInteger(amount) || typeof currency !== 'string') return reply.code(400).send({ error: 'amount (integer) and currency (string) are required' });
  if (amount === 0) return reply.code(400).send({ error: 'amount must not be zero' });
  const key = providerKey(request);
  if (!payments.has(key)) payments.set(key, { id: `pay_${n}`, amount, currency }); // the same key: the first payment
  if (crash) throw new Error('crashed after the provider recorded the payment');
  const r = created(payments.get(key));
  return reply.code(r.status).headers(r.headers).send(r.body);
});
app.get('/executions', async () => ({ count: executions }));

const sep = values.listen.lastIndexOf(':');
await app.listen({ host: values.listen.slice(0, sep).replace(/^\[|\]$/g, ''), port: Number(values.listen.slice(sep + 1)) });
const a = app.server.address();
console.log(`listening on ${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`);
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => app.close().then(() => process.exit(0)));
