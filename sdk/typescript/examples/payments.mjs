// The payments example of issue 10 item 4, on Express 5 (a devDependency of
// this package) with the idempotency middleware of @settle/client:
//
//   cd sdk/typescript && npm install
//   node sdk/typescript/examples/payments.mjs --listen 127.0.0.1:PORT --settle-url URL [--settle-token T] [--settle-ca FILE]
//   node sdk/typescript/examples/payments.mjs --listen 127.0.0.1:PORT --local DIR     # the ledger in process (@settle/local)
//
// POST /payments (requires Idempotency-Key), body
// {"amount": <int>, "currency": "<str>", "delay_ms": <int, optional>,
// "crash_after_charge": <bool, optional>}: the handler first counts the
// execution (every run counts), then sleeps delay_ms, charges the payment
// provider under the request's idempotency key, and answers 201
// {"id": "pay_<n>", "amount", "currency"} with Location: /payments/pay_<n>.
// Amount 0 → 400 from the handler (stored and replayed); a negative amount →
// the handler throws before charging (500 outcome_unknown; the retry's
// reconcile hook finds no payment: not_committed, the handler runs again);
// crash_after_charge → the handler throws after the provider recorded the
// payment (as if the process died there: 500 outcome_unknown; the retry's
// reconcile hook finds the payment and answers with it, 201, without
// charging again). GET /executions → {"count": n} and GET /provider →
// {"payments": n}, not wrapped. --listen accepts port 0; "listening on
// HOST:PORT" is printed once the server accepts connections.
//
// The payment provider is a fake in this process that records payments by
// idempotency key, as real ones do (Stripe's Idempotency-Key): a second
// charge with the same key returns the first payment. That is what makes
// the reconcile hook possible: asked about a request whose outcome is
// unknown, it looks the key up at the provider: a payment → committed, with
// the response the handler would have sent; none → not_committed (the
// provider is the authority: nothing was charged, the handler may run).
//
// The example has one caller, the account "acct-1" (fixedPrincipal). An
// application with users names the authenticated account instead:
// principal: authenticatedPrincipal() reads req.user (Passport), never a
// token, so that a retry after a token refresh replays.
import express from 'express';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { Client, fixedPrincipal, idempotency, middlewareCore } from '@settle/client';

const { values } = parseArgs({
  options: {
    listen: { type: 'string', default: '127.0.0.1:8080' },
    'settle-url': { type: 'string' },
    'settle-token': { type: 'string' },
    'settle-ca': { type: 'string' },
    local: { type: 'string' },
    namespace: { type: 'string', default: 'payments-example' },
  },
});
if (!values['settle-url'] === (values.local === undefined)) {
  console.error('usage: node examples/payments.mjs --listen HOST:PORT (--settle-url URL [--settle-token T] [--settle-ca FILE] | --local DIR)');
  process.exit(2);
}
const sep = values.listen.lastIndexOf(':');
const host = values.listen.slice(0, sep).replace(/^\[|\]$/g, '');
const port = Number(values.listen.slice(sep + 1));

/** The fake payment provider: payments recorded by idempotency key. */
const provider = {
  payments: new Map(),
  charge(idempotencyKey, payment) {
    const found = this.payments.get(idempotencyKey);
    if (found) return found; // the same key: the first payment, nothing charged twice
    this.payments.set(idempotencyKey, payment);
    return payment;
  },
  find(idempotencyKey) {
    return this.payments.get(idempotencyKey) ?? null;
  },
};

/** The key the provider sees: the account and the request's Idempotency-Key. */
const providerKey = (req) => `acct-1/${middlewareCore.parseIdempotencyKey([req.headers['idempotency-key']])}`;
const created = (payment) => ({
  status: 201,
  headers: { 'content-type': 'application/json; charset=utf-8', location: `/payments/${payment.id}` },
  body: JSON.stringify(payment),
});

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

const client = await openLedger();
const idem = idempotency({
  client,
  namespace: values.namespace,
  principal: fixedPrincipal('acct-1'),
  routes: (method, path) => (method === 'POST' && path === '/payments' ? { required: true } : null),
  onError: (err) => console.error('payments: handler failed:', err.message),
  // A retry found the record unknown (the first run failed after it may have
  // charged): ask the provider whether a payment with this key exists.
  reconcile: (ledgerKey, fence, req) => {
    const payment = provider.find(providerKey(req)); // the key the handler charged under
    return payment ? { finding: 'committed', response: created(payment) } : 'not_committed';
  },
});

let executions = 0;
const app = express();
app.use(idem); // before the body parser: it reads the body for the fingerprint and puts it back
app.use(express.json());

app.post('/payments', async (req, res) => {
  executions += 1; // first, on every run, whatever happens next
  const n = executions;
  const body = req.body;
  if (!body || typeof body !== 'object' || Array.isArray(body)) return res.status(400).json({ error: 'the body must be a JSON object' });
  const { amount, currency, delay_ms: delayMs = 0, crash_after_charge: crash = false } = body;
  if (!Number.isInteger(amount)) return res.status(400).json({ error: 'amount must be an integer' });
  if (typeof currency !== 'string') return res.status(400).json({ error: 'currency must be a string' });
  if (!Number.isInteger(delayMs) || delayMs < 0) return res.status(400).json({ error: 'delay_ms must be a non-negative integer' });
  if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
  if (amount === 0) return res.status(400).json({ error: 'amount must not be zero' });
  if (amount < 0) throw new Error(`negative amount ${amount}`); // an escaped failure, before charging
  const payment = provider.charge(providerKey(req), { id: `pay_${n}`, amount, currency });
  if (crash) throw new Error('crashed after the provider recorded the payment'); // as if killed here
  const r = created(payment);
  res.status(r.status).set(r.headers).send(r.body);
});

app.get('/executions', (req, res) => res.json({ count: executions }));
app.get('/provider', (req, res) => res.json({ payments: provider.payments.size }));

app.use(idem.errorHandler); // an escaped error of a wrapped request → unknown

const server = app.listen(port, host, () => {
  const a = server.address();
  console.log(`listening on ${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`);
});
server.on('error', (e) => {
  console.error(`payments: ${e.message}`);
  process.exit(1);
});
const shutdown = () => server.close(() => process.exit(0));
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
