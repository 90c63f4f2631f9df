// Compiled (never run) by types.test.mjs with tsc --strict: the types of
// makeIdempotent and runOnce survive. Every @ts-expect-error line must be
// an error: if a type widened to any/unknown, the line would compile and
// tsc would report the unused directive.
import Fastify from 'fastify';
import {
  Client,
  Reconciler,
  fixedPrincipal,
  makeIdempotent,
  runOnce,
  withIdempotency,
  type EffectContext,
  type IdempotentFunction,
  type ReconcileCounts,
  type RunResult,
} from '@settle/client';
import { idempotency as fastifyIdempotency } from '@settle/client/fastify';
import { startSettle } from '@settle/client/testing';

declare const client: Client;
interface Charge {
  id: string;
  amount: number;
}

const charge = makeIdempotent(
  async (orderId: string, amount: number, ctx: EffectContext): Promise<Charge> => {
    await ctx.dispatch();
    return { id: `${orderId}-${ctx.fence}`, amount };
  },
  {
    client,
    key: (orderId, amount) => `charge-${orderId.toUpperCase()}-${amount.toFixed(0)}`, // the argument types reach key
    principal: 'svc',
    scopes: ['charge'],
    marksDispatch: true,
    reconcile: 'resend',
    leaseMs: 5000,
    retentionS: 600,
    deadlineMs: null,
    serializer: (v) => String(v),
  },
);

// The wrapped function: the original arguments without the context, Promise of the result.
export const p: Promise<Charge> = charge('o-1', 100);
export const same: IdempotentFunction<[string, number], Charge> = charge;
export const whole: Promise<RunResult<Charge>> = charge.run('o-1', 100);
export const amount: Promise<number> = charge('o-1', 100).then((c) => c.amount);

// @ts-expect-error the first argument is a string
charge(1, 100);
// @ts-expect-error both arguments are required
charge('o-1');
// @ts-expect-error the context is not an argument of the wrapped function
charge('o-1', 100, {} as EffectContext);
// @ts-expect-error the result is a Charge, not a string
export const wrong: Promise<string> = charge('o-1', 100);

makeIdempotent(async (orderId: string, ctx: EffectContext) => orderId.length + ctx.attempt, {
  client,
  principal: 'p',
  // @ts-expect-error key gets the wrapped function's arguments (a string)
  key: (orderId: number) => String(orderId),
});

// @ts-expect-error reconcile is a hook or 'resend'
makeIdempotent(async (ctx: EffectContext) => ctx.key, { client, key: () => 'k', principal: 'p', reconcile: 'retry' });
// @ts-expect-error a hook's finding is Done, 'not_committed' or 'unavailable'
makeIdempotent(async (ctx: EffectContext) => ctx.key, { client, key: () => 'k', principal: 'p', reconcile: () => 'maybe' });
// @ts-expect-error a misspelt option
makeIdempotent(async (ctx: EffectContext) => ctx.key, { client, key: () => 'k', principal: 'p', marksDispach: true });
// @ts-expect-error principal is required
makeIdempotent(async (ctx: EffectContext) => ctx.key, { client, key: () => 'k' });

// runOnce: Effect<R> → RunResult<R>.
export const r1: Promise<RunResult<{ n: number }>> = runOnce(client, 'k', {}, async () => ({ result: { n: 1 } }), { principal: 'p' });
const r2 = client.runOnce('k', {}, () => ({ result: 'text' }), { principal: 'p', reconcile: 'resend' });
export const r2ok: Promise<RunResult<string>> = r2;
export const n2: Promise<string | undefined> = r2.then((r) => r.outcome.result);
// @ts-expect-error the result is a string
export const r2bad: Promise<RunResult<number>> = r2;

// The reconciler takes the same hook type; sweep() resolves to the counts.
export const counts: Promise<ReconcileCounts> = new Reconciler(client, {
  hooks: { 'charge-': async (key, fence) => (key.length > fence ? { result: { found: true } } : 'not_committed') },
}).sweep();
export const seen: Promise<number> = counts.then((c) => c.seen + c.committed + c.not_committed + c.unavailable + c.skipped + c.errors);

// The result type on the first run and on a replay: RunResult<R>.result is R.
const r3 = client.runOnce('k', {}, async () => ({ result: { id: 'c', amount: 1 } }), { principal: 'p' });
export const res3: Promise<{ id: string; amount: number }> = r3.then((r) => r.result);
export const replayed3: Promise<boolean> = r3.then((r) => r.replayed);
// @ts-expect-error the result is { id, amount }, not a string
export const res3bad: Promise<string> = r3.then((r) => r.result);
// The reconcile hook finds a result of the effect's type.
export const r4 = client.runOnce('k', {}, async () => ({ result: { id: 'c' } }), {
  principal: 'p',
  reconcile: async (key) => ({ result: { id: key } }),
});
client.runOnce('k', {}, async () => ({ result: { id: 'c' } }), {
  principal: 'p',
  // @ts-expect-error the hook finds a number where the effect returns { id }
  reconcile: async () => ({ result: 42 }),
});
makeIdempotent(async (orderId: string, ctx: EffectContext): Promise<Charge> => ({ id: orderId + ctx.key, amount: 1 }), {
  client,
  key: (orderId) => orderId,
  principal: 'p',
  // @ts-expect-error the hook of makeIdempotent finds a Charge, not a string
  reconcile: async () => ({ result: 'charged' }),
});
// The client: a replay's stored result and a record's outcome, typed by the caller.
export const claimed: Promise<string | undefined> = client
  .claim<Charge>('k', 'f'.repeat(64), { principal: 'p' })
  .then((d) => (d.decision === 'replay' ? d.outcome.result?.id : undefined));
export const stored: Promise<number | undefined> = client.get<Charge>('k').then((rec) => rec.outcome?.result?.amount);

// The Fetch wrapper keeps the handler's arguments (Next.js's context) and needs a Response.
export const POST = withIdempotency(
  async (request: Request, ctx: { params: Promise<{ id: string }> }) => Response.json({ id: (await ctx.params).id, url: request.url }, { status: 201 }),
  { client, principal: (request) => request.headers.get('x-account') },
);
export const answered: Promise<Response> = POST(new Request('http://localhost/p'), { params: Promise.resolve({ id: '1' }) });
// @ts-expect-error the context argument is kept
POST(new Request('http://localhost/p'));
// @ts-expect-error the handler must return a Response
withIdempotency(async () => 'text', { client, principal: fixedPrincipal('a') });
// The Fastify plugin: the extractor gets a FastifyRequest.
export const plugin = fastifyIdempotency({ client, principal: (req) => String(req.headers['x-account']), wait: 2 });
Fastify().register(plugin);
export const fastifyStats: Record<string, number> = plugin.stats;
// @ts-expect-error a Fetch API extractor does not fit the Fastify plugin
fastifyIdempotency({ client, principal: (req: Request) => req.headers.get('x') });
// The testing helpers.
export const server: Promise<string> = startSettle({ tenants: { a: 'token' } }).then((s) => s.client({ token: 'token' }).url);
