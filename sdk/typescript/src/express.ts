// idempotency({ client, ... }): SPEC §8 as Express-compatible middleware
// (Express 4/5, Connect, or plain node:http through `wrap`), on a remote
// `settle serve`.
//
//   const idem = idempotency({ client, principal: authenticatedPrincipal() });
//   app.use(idem);                 // before the routes and before body parsers
//   app.use(express.json());       // body parsers see the request as without it
//   app.post('/payments', handler);
//   app.use(idem.errorHandler);    // after the routes, before your error handlers
//
// Express hands an error that a handler throws (or passes to next(err)) to
// the error-handling middleware that follows, never back to an earlier
// middleware: `idem.errorHandler` is where such an escaped failure becomes
// `unknown` (SPEC §8). Without it, Express's default handler would answer a
// plain 500 that the middleware would store and replay as a returned 5xx.
import type { IncomingMessage, ServerResponse } from 'node:http';
import * as mw from './mwcore.js';
import type {
  CoreOptions,
  CoreRun,
  Logger,
  MiddlewareFinding,
  MiddlewareReconcileHook as CoreReconcileHook,
  Principal,
  PrincipalExtractor as CorePrincipalExtractor,
  ReconciledResponse,
  ReconcileRequestInfo,
  RoutePolicy,
} from './mwcore.js';

export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';
export type { Logger, MiddlewareFinding, Principal, ReconciledResponse, ReconcileRequestInfo, RoutePolicy };

/** The `principal` option of the Express middleware: `req` → its caller. */
export type PrincipalExtractor = CorePrincipalExtractor<IncomingMessage>;
/** The `reconcile` option of the Express middleware. */
export type MiddlewareReconcileHook = CoreReconcileHook<IncomingMessage>;

/** The options of the Express middleware: those of every adapter (`CoreOptions`), on Node's request. */
export type IdempotencyOptions = CoreOptions<IncomingMessage>;

type Next = (err?: unknown) => void;
type Req = IncomingMessage & { body?: unknown; rawBody?: Buffer; originalUrl?: string; _body?: boolean; user?: unknown; [STATE]?: State };
type Res = ServerResponse;

export interface IdempotencyMiddleware {
  (req: IncomingMessage, res: ServerResponse, next: Next): void;
  /** Express error middleware: an escaped error of a wrapped request → unknown. */
  errorHandler: (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void;
  /** Replays and refusals by kind (SPEC §8: counted). */
  readonly stats: Record<string, number>;
  /** Plain node:http: run `handler` behind the middleware; a throw or rejection is an escaped failure. */
  wrap(handler: (req: IncomingMessage, res: ServerResponse) => unknown): (req: IncomingMessage, res: ServerResponse) => void;
}

const STATE = Symbol.for('settle.idempotency');

interface State {
  active: boolean;
  fail(err: unknown): void;
}

export function idempotency(options: IdempotencyOptions): IdempotencyMiddleware {
  const engine = mw.createEngine(options, 'idempotency');

  function send(res: Res, r: mw.CoreResponse): void {
    for (const n of res.getHeaderNames()) res.removeHeader(n);
    res.statusCode = r.status;
    for (const [n, v] of r.headers) res.setHeader(n, v);
    res.end(r.body);
  }

  /** The whole request body (the fingerprint needs it), put back into the
   * request stream once read: the handler and any body parser after the
   * middleware read the request exactly as without it. */
  async function readBody(req: Req, maxRequestBody: number): Promise<Buffer | 'too_large'> {
    if (req.readableEnded || req._body) {
      // A body parser ran first: use the raw bytes it kept, else its result.
      if (Buffer.isBuffer(req.rawBody)) return req.rawBody;
      return Buffer.from(req.body === undefined ? '' : typeof req.body === 'string' ? req.body : JSON.stringify(req.body));
    }
    const encoding = req.readableEncoding; // set by an earlier setEncoding: read() gives strings
    const parts: Buffer[] = [];
    const texts: string[] = [];
    let size = 0;
    await new Promise<void>((resolve, reject) => {
      const cleanup = () => {
        req.off('readable', onReadable);
        req.off('error', onError);
        req.off('close', onClose);
      };
      const onError = (e: unknown) => {
        cleanup();
        reject(e);
      };
      const onClose = () => onError(new Error('the request was aborted before its body arrived'));
      // Paused mode: read() what arrives, and stop before the end is read
      // (req.complete: the parser has pushed the end). The stream's 'end' is
      // not emitted as long as data is put back before the next tick.
      const onReadable = () => {
        while (req.readableLength > 0) {
          const chunk: unknown = req.read();
          if (chunk === null) break;
          const b = typeof chunk === 'string' ? Buffer.from(chunk, encoding ?? 'utf8') : (chunk as Buffer);
          size += b.length;
          if (size <= maxRequestBody) {
            parts.push(b);
            if (typeof chunk === 'string') texts.push(chunk);
          }
        }
        if (!req.complete || req.readableLength > 0) return;
        cleanup();
        if (size <= maxRequestBody && size > 0) {
          if (encoding) req.unshift(texts.join(''), encoding);
          else req.unshift(Buffer.concat(parts));
        }
        resolve();
      };
      req.on('error', onError);
      req.on('close', onClose);
      if (req.complete && req.readableLength === 0) {
        cleanup();
        resolve(); // no body, or it was all read before: nothing to put back
      } else {
        req.on('readable', onReadable);
      }
    });
    // Removing the 'readable' listener hands the stream back (no reading
    // mode) on the next tick: before anything downstream attaches.
    await new Promise<void>((r) => process.nextTick(r));
    if (size > maxRequestBody) return 'too_large';
    return Buffer.concat(parts);
  }

  async function handle(req: Req, res: Res, next: Next): Promise<void> {
    const { path, target } = mw.pathAndTarget(req.originalUrl ?? req.url ?? '/');
    const begun = await engine.begin({
      req,
      method: req.method ?? 'GET',
      path,
      target,
      headerValues: (name) => mw.rawHeaderValues(req, name),
      headerEntries: () => mw.rawHeaderEntries(req),
      body: (max) => readBody(req, max),
    });
    if (begun.kind === 'unwrapped') return next();
    if (begun.kind === 'answer') return send(res, begun.response);
    await execute(req, res, next, begun.run);
  }

  /** Runs the rest of the chain (next()) with the response captured: nothing
   * reaches the client until the outcome is settled. */
  async function execute(req: Req, res: Res, next: Next, run: CoreRun): Promise<void> {
    const chunks: Buffer[] = [];
    const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders, destroy: res.destroy };
    type Result = { kind: 'response' } | { kind: 'escaped'; err: unknown; timeout: boolean };
    let settleResult!: (r: Result) => void;
    const done = new Promise<Result>((resolve) => (settleResult = resolve));
    let over = false;
    const finish = (r: Result) => {
      if (over) return;
      over = true;
      state.active = false;
      settleResult(r);
    };
    const state: State = { active: true, fail: (err) => finish({ kind: 'escaped', err, timeout: false }) };
    req[STATE] = state;
    const toBuf = (chunk: unknown, encoding?: unknown): Buffer | null => {
      if (chunk === undefined || chunk === null || typeof chunk === 'function') return null;
      if (Buffer.isBuffer(chunk)) return chunk;
      if (chunk instanceof Uint8Array) return Buffer.from(chunk);
      return Buffer.from(String(chunk), typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
    };
    const r = res as unknown as Record<string, unknown>;
    // Capture: nothing reaches the client until the outcome is settled.
    r.writeHead = function (status: number, a?: unknown, b?: unknown) {
      if (over) return res;
      res.statusCode = status;
      if (typeof a === 'string') res.statusMessage = a;
      const h = typeof a === 'object' && a !== null ? a : b;
      if (Array.isArray(h)) {
        for (let i = 0; i + 1 < h.length; i += 2) res.setHeader(String(h[i]), h[i + 1] as string);
      } else if (h && typeof h === 'object') {
        for (const [n, v] of Object.entries(h as Record<string, string | string[]>)) res.setHeader(n, v);
      }
      return res;
    };
    r.write = function (chunk: unknown, encoding?: unknown, cb?: unknown) {
      if (!over) {
        const buf = toBuf(chunk, encoding);
        if (buf) chunks.push(buf);
      }
      const callback = typeof encoding === 'function' ? encoding : cb;
      if (typeof callback === 'function') process.nextTick(callback as () => void);
      return true;
    };
    r.end = function (chunk?: unknown, encoding?: unknown, cb?: unknown) {
      if (!over) {
        const buf = toBuf(chunk, encoding);
        if (buf) chunks.push(buf);
        finish({ kind: 'response' });
      }
      const callback = [chunk, encoding, cb].find((x) => typeof x === 'function');
      if (typeof callback === 'function') process.nextTick(callback as () => void);
      return res;
    };
    r.flushHeaders = function () {};
    // A response destroyed before it ended (stream.pipeline() of a body
    // stream that errored, whatever its size): an escaped failure, answered
    // 500 outcome_unknown if the connection can still take it.
    r.destroy = function (err?: unknown) {
      if (!over) {
        finish({ kind: 'escaped', err: err ?? new Error('the response was destroyed before it ended'), timeout: false });
        return res;
      }
      return orig.destroy.call(res, err as Error | undefined);
    };
    let timer: NodeJS.Timeout | undefined;
    if (run.timeoutMs != null) {
      const ms = run.timeoutMs;
      timer = setTimeout(() => finish({ kind: 'escaped', err: new Error(`handler timed out after ${ms} ms`), timeout: true }), ms);
    }
    try {
      next();
    } catch (e) {
      finish({ kind: 'escaped', err: e, timeout: false });
    }
    const result = await done;
    if (timer) clearTimeout(timer);
    const restore = () => {
      // Later writes of an abandoned handler go nowhere; ours use the originals.
      res.writeHead = orig.writeHead;
      res.write = orig.write;
      res.end = orig.end;
      res.flushHeaders = orig.flushHeaders;
      res.destroy = orig.destroy;
    };
    if (result.kind === 'escaped') {
      const problem = await run.fail(result.err, result.timeout);
      restore();
      if (!res.headersSent) send(res, problem);
      if (result.timeout) {
        // Swallow whatever the abandoned handler writes later.
        const sink = res as unknown as Record<string, unknown>;
        sink.write = () => true;
        sink.end = () => res;
        sink.writeHead = () => res;
        sink.setHeader = () => res;
        sink.appendHeader = () => res;
        sink.removeHeader = () => {};
      }
      return;
    }
    const body = Buffer.concat(chunks);
    const headers: [string, string][] = [];
    for (const [n, v] of Object.entries(res.getHeaders())) {
      if (v === undefined) continue;
      headers.push([n, Array.isArray(v) ? v.join(', ') : String(v)]);
    }
    await run.respond(res.statusCode, headers, body, mw.isMarkedRetryable(res));
    restore();
    res.end(body);
  }

  const middleware = ((req: IncomingMessage, res: ServerResponse, next: Next) => {
    handle(req as Req, res, next).catch((e) => next(e));
  }) as IdempotencyMiddleware;

  middleware.errorHandler = (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => {
    const st = (req as Req)[STATE];
    if (st && st.active) {
      st.fail(err);
      return;
    }
    next(err);
  };

  Object.defineProperty(middleware, 'stats', { value: engine.stats, enumerable: true });

  middleware.wrap = (handler) => (req, res) => {
    const fallback = (err?: unknown) => {
      if (err !== undefined) return middleware.errorHandler(err, req, res, () => {
        if (!res.headersSent) {
          res.statusCode = 500;
          res.end();
        }
      });
      // next(): run the handler; a throw or rejection is an escaped failure.
      try {
        Promise.resolve(handler(req, res)).catch((e) => fallback(e ?? new Error('rejected')));
      } catch (e) {
        fallback(e ?? new Error('thrown undefined'));
      }
    };
    middleware(req, res, fallback);
  };

  return middleware;
}
