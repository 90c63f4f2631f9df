// A Next.js App Router route handler behind withIdempotency: in a Next.js
// application this file is app/payments/route.ts (the same code, typed);
// it only needs the Fetch API, so Hono (`app.post('/payments', (c) =>
// POST(c.req.raw))`), Bun.serve and Deno.serve take it as it is.
//
//   SETTLE_URL=http://127.0.0.1:7411 [SETTLE_TOKEN=...]
//
// POST /payments with Idempotency-Key and {"amount", "currency"}: 201 with
// the payment; a retry with the same key replays it (Idempotent-Replayed:
// true) without charging again. The caller's account comes from a header
// that the application's authentication sets (Next.js middleware after
// verifying the session): never from a token, so that a retry after a token
// refresh replays. Runs in the Node.js runtime (not the Edge runtime: the
// SDK uses node:crypto).
import { Client, withIdempotency } from '@settle/client';

const client = new Client({ url: process.env.SETTLE_URL ?? 'http://127.0.0.1:7411', token: process.env.SETTLE_TOKEN });
let charges = 0;

async function createPayment(request) {
  const { amount, currency } = await request.json();
  if (!Number.isInteger(amount) || typeof currency !== 'string') {
    return Response.json({ error: 'amount (integer) and currency (string) are required' }, { status: 400 });
  }
  const payment = { id: `pay_${++charges}`, amount, currency }; // charge the provider here, with the Idempotency-Key
  return Response.json(payment, { status: 201, headers: { location: `/payments/${payment.id}` } });
}

export const POST = withIdempotency(createPayment, {
  client,
  namespace: 'payments',
  principal: (request) => request.headers.get('x-account-id'), // set by your authentication; none → 401
});

/** For the example's test: how many times the handler charged. */
export const chargeCount = () => charges;
