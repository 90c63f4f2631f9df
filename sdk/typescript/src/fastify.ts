// idempotency({ client, ... }) for Fastify (SPEC §8): a plugin built on the
// same engine as the Express middleware (mwcore.ts), with the same answers
// and problem codes.
//
//   import { idempotency } from '@settle/client/fastify';
//   const idem = idempotency({ client, principal: authenticatedPrincipal() });
//   await app.register(idem);          // after authentication, before the routes
//   app.post('/payments', async (request, reply) => reply.code(201).send(payment));
//
// How it sits in Fastify's lifecycle:
// - preParsing: the body's bytes are recorded while the content-type parser
//   reads them (only for requests with an Idempotency-Key header); the
//   parser, the validation and the handler see the request as without it;
// - preHandler: the key, the principal, the fingerprint and the claim; a
//   problem or a replay is sent from here (the handler does not run);
// - onError: an error thrown by the handler (or sent with reply.send(err))
//   is an escaped failure: the record becomes `unknown`, the answer 500
//   `outcome_unknown`;
// - onSend: the handler's serialized response is settled before it leaves;
// - onResponse: a response that left without onSend (reply.hijack()) makes
//   the record `unknown`.
// The plugin sets Symbol.for('skip-override'): its hooks apply to the
// context it is registered in (no fastify-plugin needed).
import type { IncomingMessage } from 'node:http';
import { Readable, Transform } from 'node:stream';
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import * as mw from './mwcore.js';
import type { CoreOptions, CoreResponse, CoreRun } from './mwcore.js';

export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';

/** The options of the Fastify plugin: those of every adapter, on a FastifyRequest. */
export type FastifyIdempotencyOptions = CoreOptions<FastifyRequest>;

/** The plugin: `await app.register(idem)`. */
export type FastifyIdempotencyPlugin = FastifyPluginAsync & {
  /** Replays and refusals by kind (SPEC §8: counted). */
  readonly stats: Record<string, number>;
};

interface State {
  /** The body's bytes, recorded as the parser read them. */
  parts: Buffer[];
  size: number;
  ended: boolean;
  run: CoreRun | null;
  over: boolean;
  /** onSend ran for the run's response. */
  sending: boolean;
  escaped: { err: unknown } | null;
  timer: NodeJS.Timeout | undefined;
  /** The timeout's failure, once the handler ran too long. */
  timedOut: Promise<CoreResponse> | null;
}

async function payloadBytes(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8');
  if (payload instanceof Uint8Array) return Buffer.from(payload);
  if (payload instanceof Readable || (typeof payload === 'object' && typeof (payload as { pipe?: unknown }).pipe === 'function')) {
    const parts: Buffer[] = [];
    for await (const c of payload as AsyncIterable<unknown>) parts.push(typeof c === 'string' ? Buffer.from(c) : Buffer.from(c as Uint8Array));
    return Buffer.concat(parts);
  }
  return Buffer.from(String(payload), 'utf8');
}

/** Headers of the reply as [name, value] pairs (lower-case names). */
function replyHeaders(reply: FastifyReply): [string, string][] {
  const out: [string, string][] = [];
  for (const [n, v] of Object.entries(reply.getHeaders())) {
    if (v === undefined) continue;
    out.push([n.toLowerCase(), Array.isArray(v) ? v.join(', ') : String(v)]);
  }
  return out;
}

/** The Fastify plugin of the SPEC §8 middleware. */
export function idempotency(options: FastifyIdempotencyOptions): FastifyIdempotencyPlugin {
  const engine = mw.createEngine(options, 'idempotency');
  const states = new WeakMap<FastifyRequest, State>();

  function stateOf(request: FastifyRequest): State {
    let st = states.get(request);
    if (!st) {
      st = { parts: [], size: 0, ended: false, run: null, over: false, sending: false, escaped: null, timer: undefined, timedOut: null };
      states.set(request, st);
    }
    return st;
  }

  /** Replace the reply's answer: status, content headers and body. */
  function setAnswer(reply: FastifyReply, r: CoreResponse): Buffer {
    reply.removeHeader('content-type');
    reply.removeHeader('content-length');
    reply.code(r.status);
    for (const [n, v] of r.headers) reply.header(n, v);
    return r.body;
  }

  /** The body as the parser read it (or empty, for a request that has none). */
  function bodyOf(request: FastifyRequest, st: State | undefined, max: number): Uint8Array | 'too_large' {
    if (!st || (!st.ended && st.size === 0 && !hasBody(request.raw))) return Buffer.alloc(0);
    if (st.size > max) return 'too_large';
    if (!st.ended) {
      throw new Error(
        'idempotency: the request body was not read before the handler (the fingerprint needs it): ' +
          'a route behind the idempotency plugin needs a content-type parser that reads the whole body',
      );
    }
    return Buffer.concat(st.parts);
  }

  const plugin = async function settleIdempotency(instance: FastifyInstance): Promise<void> {
    instance.addHook('preParsing', async (request, _reply, payload) => {
      if (request.headers['idempotency-key'] === undefined) return payload;
      const st = stateOf(request);
      let received = 0;
      const tee = new Transform({
        transform(chunk: Buffer, _enc, cb) {
          received += chunk.length;
          (tee as unknown as { receivedEncodedLength: number }).receivedEncodedLength = received;
          st.size += chunk.length;
          if (st.size <= engine.maxRequestBody) st.parts.push(chunk);
          cb(null, chunk);
        },
        flush(cb) {
          st.ended = true;
          cb();
        },
      });
      payload.on('error', (e) => tee.destroy(e));
      return payload.pipe(tee);
    });

    instance.addHook('preHandler', async (request, reply) => {
      const st = states.get(request);
      const { path, target } = mw.pathAndTarget(request.url);
      const begun = await engine.begin({
        req: request,
        method: request.method,
        path,
        target,
        headerValues: (name) => mw.rawHeaderValues(request.raw, name),
        headerEntries: () => mw.rawHeaderEntries(request.raw),
        body: async (max) => bodyOf(request, st, max),
      });
      if (begun.kind === 'unwrapped') return;
      if (begun.kind === 'answer') {
        const body = setAnswer(reply, begun.response);
        return reply.send(body);
      }
      const run = begun.run;
      const s = stateOf(request);
      s.run = run;
      if (run.timeoutMs != null) {
        const ms = run.timeoutMs;
        s.timer = setTimeout(() => {
          if (s.over) return;
          s.over = true;
          s.timedOut = run.fail(new Error(`handler timed out after ${ms} ms`), true);
          void s.timedOut.then((problem) => {
            if (!s.sending && !reply.sent) reply.send(setAnswer(reply, problem));
          });
        }, ms);
      }
    });

    instance.addHook('onError', async (request, _reply, error) => {
      const st = states.get(request);
      if (st?.run && !st.over && !st.escaped) st.escaped = { err: error };
    });

    instance.addHook('onSend', async (request, reply, payload) => {
      const st = states.get(request);
      if (!st?.run) return payload;
      st.sending = true;
      if (st.timedOut) return setAnswer(reply, await st.timedOut);
      if (st.over) return payload;
      st.over = true;
      if (st.timer) clearTimeout(st.timer);
      if (st.escaped) return setAnswer(reply, await st.run.fail(st.escaped.err, false));
      let body: Buffer;
      try {
        body = await payloadBytes(payload);
      } catch (err) {
        // The response body (a stream) failed before it ended: an escaped failure.
        return setAnswer(reply, await st.run.fail(err, false));
      }
      await st.run.respond(reply.statusCode, replyHeaders(reply), body, mw.isMarkedRetryable(reply, reply.raw));
      return body;
    });

    instance.addHook('onResponse', async (request) => {
      const st = states.get(request);
      if (!st?.run || st.over) return;
      // The response left without onSend (the handler hijacked the reply):
      // what it answered is unknown to the middleware.
      st.over = true;
      if (st.timer) clearTimeout(st.timer);
      await st.run.fail(new Error('the response was sent without the onSend hook (reply.hijack())'), false);
    });
  } as unknown as FastifyIdempotencyPlugin & Record<symbol, unknown>;

  plugin[Symbol.for('skip-override')] = true;
  plugin[Symbol.for('fastify.display-name')] = 'settle-idempotency';
  Object.defineProperty(plugin, 'stats', { value: engine.stats, enumerable: true });
  return plugin;
}

function hasBody(raw: IncomingMessage): boolean {
  const te = raw.headers['transfer-encoding'];
  const cl = raw.headers['content-length'];
  return te !== undefined || (cl !== undefined && cl !== '0');
}
