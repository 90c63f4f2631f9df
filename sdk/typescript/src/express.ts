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
import type { Client } from './client.js';
import { BindingMismatch, FingerprintMismatch, InvalidRequest, ReceiptRequired } from './errors.js';
import * as mw from './mwcore.js';
import type { Binding, Grant, InFlight } from './types.js';
import { Deadline, retrying, startHeartbeat } from './worker.js';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export interface RoutePolicy {
  /** A request without a key gets 400 (else it runs unwrapped). Default true. */
  required?: boolean;
  /** Ledger unreachable (no answer, or a 503 `unavailable`): run the handler
   * without idempotency (logged) instead of 503. A refusal of the ledger
   * (`stale_binding`, `record_refused`, 429, 401, ...) never runs it. */
  failOpen?: boolean;
  /** The handler counts as failed (unknown) after this many ms. Default: none. */
  timeoutMs?: number | null;
  /** Seconds a duplicate of a request still running waits for its outcome
   * (claiming again after the ledger's retry hint) before it answers 409
   * `request_in_progress`: the outcome, if it arrives, is replayed (default
   * 0: no wait). */
  wait?: number;
}

export interface Logger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string, err?: unknown): void;
}

/** What a principal extractor finds: the caller's account (generation 0),
 * the account with its generation, or null/undefined when the request has
 * no identity (401 `idempotency_principal_missing`). */
export type Principal = string | { principal: string; generation?: number } | null | undefined;

/** The response a middleware reconcile hook found: what the first request's
 * handler answered (e.g. rebuilt from the upstream's record). A body that is
 * neither a string nor bytes is sent as JSON (content-type
 * application/json unless given). */
export interface ReconciledResponse {
  status: number;
  headers?: Record<string, string> | ReadonlyArray<readonly [string, string]>;
  body?: string | Uint8Array | unknown;
}

/** What a middleware reconcile hook found (SPEC §8): the effect applied,
 * with the response to store and replay; not applied (the handler runs
 * under the same fence); or it cannot tell (409 `outcome_unknown`). */
export type MiddlewareFinding = 'not_committed' | 'unavailable' | { finding: 'committed'; response: ReconciledResponse };

/** What the middleware knows of the retried request, for a reconcile hook. */
export interface ReconcileRequestInfo {
  /** The Idempotency-Key the client sent (unquoted). */
  idempotencyKey: string;
  /** The principal the extractor found (before bindingPrincipal). */
  principal: string;
  /** The request body's bytes (the stream itself is left for the handler). */
  body: Buffer;
}

/** Asked when a retry finds the record `unknown`: the ledger key, the
 * reconcile lease's fence, the retried request (read its headers; do not
 * consume its stream, the handler may still need it) and `info` (the key,
 * the principal and the body's bytes). */
export type MiddlewareReconcileHook = (
  ledgerKey: string,
  fence: number,
  req: IncomingMessage,
  info: ReconcileRequestInfo,
) => Promise<MiddlewareFinding> | MiddlewareFinding;

/** The `principal` option: the request → its caller. It must name the
 * caller's account, stable across credential refresh: never a token or a
 * header value (a retry sent after an OAuth refresh must replay). */
export type PrincipalExtractor = (req: IncomingMessage) => Principal | Promise<Principal>;

export interface IdempotencyOptions {
  client: Client;
  /** Required: who the caller is (see `fixedPrincipal`, `authenticatedPrincipal`). */
  principal: PrincipalExtractor;
  /** Part of every ledger key (default "default"). */
  namespace?: string;
  /** Methods wrapped when `routes` is not given (default POST, PATCH). */
  methods?: string[];
  /** Per-route policy by method and path; null/undefined: not wrapped. */
  routes?: (method: string, path: string) => RoutePolicy | null | undefined;
  /** Headers stored and replayed besides content-type and location. */
  storedHeaders?: string[];
  /** Request headers that are part of the fingerprint. */
  fingerprintHeaders?: string[];
  /** RFC 8785 canonical JSON bodies in the fingerprint, so that key order
   * and whitespace never make a retry a mismatch (default true; false: the
   * raw bytes count). */
  canonicalJson?: boolean;
  /** Only these RFC 6901 pointers of a JSON body count in the fingerprint
   * (the object {pointer: value} of those that resolve). Not with `exclude`. */
  fields?: string[];
  /** These RFC 6901 pointers of a JSON body do not count in the
   * fingerprint (e.g. a client timestamp). Not with `fields`. */
  exclude?: string[];
  /** Responses above this are settled with their digest and not replayed (default 32 KiB). */
  maxStoredBody?: number;
  /** Request bodies above this get 413 (default 1 MiB). */
  maxRequestBody?: number;
  leaseMs?: number;
  retentionS?: number;
  timeoutMs?: number | null;
  failOpen?: boolean;
  /** Seconds a duplicate waits for the running request's outcome (RoutePolicy.wait; default 0). */
  wait?: number;
  unavailableRetryAfterS?: number;
  /** Resolves a record left unknown when a retry arrives (SPEC §8):
   * `{ finding: 'committed', response }` stores and replays that response,
   * 'not_committed' runs the handler under the same fence, 'unavailable'
   * (or a throw) answers 409 `outcome_unknown`. */
  reconcile?: MiddlewareReconcileHook;
  /** Called with every escaped failure (default: console.error). */
  onError?: (err: unknown, req: IncomingMessage) => void;
  logger?: Logger;
}

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
const RETRYABLE = Symbol.for('settle.idempotency.retryable');

interface State {
  active: boolean;
  fail(err: unknown): void;
}

/** Mark the response as saying nothing happened: not stored, the lease is
 * released with not_committed, and a retry runs the handler again. */
export function markRetryable(res: ServerResponse): void {
  (res as unknown as Record<symbol, boolean>)[RETRYABLE] = true;
}

function headerValues(req: IncomingMessage, name: string): string[] {
  const out: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) if ((raw[i] as string).toLowerCase() === name) out.push(raw[i + 1] as string);
  return out;
}

function pathOf(req: Req): string {
  const u = req.originalUrl ?? req.url ?? '/';
  const q = u.indexOf('?');
  return q === -1 ? u : u.slice(0, q);
}

function targetOf(req: Req): string {
  const u = req.originalUrl ?? req.url ?? '/';
  return u.endsWith('?') ? u.slice(0, -1) : u; // "/p?" and "/p" are one target, as in ASGI
}

function checkGeneration(g: unknown): number {
  if (typeof g !== 'number' || !Number.isSafeInteger(g) || g < 0) {
    throw new RangeError(`a principal's generation must be an integer in [0, 2^53 - 1], got ${String(g)}`);
  }
  return g;
}

/** The principal and generation an extractor found, or null (no identity). */
function principalParts(found: Principal): { principal: string; generation: number } | null {
  if (found === null || found === undefined) return null;
  if (typeof found === 'string') return { principal: found, generation: 0 };
  if (typeof found === 'object' && typeof found.principal === 'string') {
    return { principal: found.principal, generation: found.generation === undefined ? 0 : checkGeneration(found.generation) };
  }
  throw new TypeError(`the principal extractor must return a string, { principal, generation? }, null or undefined, not ${String(found)}`);
}

/** The `principal` of an application with one caller: every request is
 * `name` (at `generation`; move it forward after revoking `name`). */
export function fixedPrincipal(name: string, generation = 0): PrincipalExtractor {
  if (typeof name !== 'string') throw new TypeError('fixedPrincipal(name): the name must be a string');
  const found = { principal: name, generation: checkGeneration(generation) };
  return () => found;
}

/** The `principal` from the authenticated identity that an earlier
 * middleware put in `req.user` (the Passport/Express convention): no
 * `req.user` → null (401 `idempotency_principal_missing`). The principal is
 * `pick(user)` when given (a string, `{ principal, generation? }` or null),
 * else `String(user.id ?? user.username)` (null when it has neither). It
 * must name the account, never a token. */
export function authenticatedPrincipal(pick?: (user: any) => Principal | Promise<Principal>): PrincipalExtractor { // eslint-disable-line @typescript-eslint/no-explicit-any
  if (pick !== undefined && typeof pick !== 'function') throw new TypeError('authenticatedPrincipal(pick?): pick must be a function of req.user');
  return (req) => {
    const user = (req as Req).user;
    if (user === null || user === undefined) return null;
    if (pick) return pick(user);
    if (typeof user !== 'object') return null;
    const u = user as { id?: unknown; username?: unknown };
    const id = u.id ?? u.username;
    return id === null || id === undefined ? null : String(id);
  };
}

const silent: Logger = { info: () => {}, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };

export function idempotency(options: IdempotencyOptions): IdempotencyMiddleware {
  const client = options.client;
  if (!client) throw new TypeError('idempotency({ client }) needs a settle Client');
  const extractPrincipal = options.principal;
  if (typeof extractPrincipal !== 'function') {
    throw new TypeError(
      "idempotency({ principal }) is required: a function of the request that names the caller's account " +
        '(never a token or a header value), e.g. principal: fixedPrincipal("acct-1") for an application with one caller, ' +
        'or principal: authenticatedPrincipal() for req.user',
    );
  }
  const unavailableRetryAfterS = options.unavailableRetryAfterS ?? 1;
  const namespace = options.namespace ?? 'default';
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  const stored = [...new Set([...mw.DEFAULT_STORED_HEADERS, ...(options.storedHeaders ?? []).map((h) => h.toLowerCase())])];
  const fpHeaders = (options.fingerprintHeaders ?? []).map((h) => h.toLowerCase());
  // Checked here: a bad combination throws mw.MiddlewareConfigError naming the option.
  const fpOptions = mw.fingerprintOptions({ canonicalJson: options.canonicalJson, fields: options.fields, exclude: options.exclude });
  const maxStoredBody = options.maxStoredBody ?? mw.DEFAULT_MAX_STORED_BODY;
  const maxRequestBody = options.maxRequestBody ?? 1024 * 1024;
  const leaseMs = options.leaseMs ?? 30_000;
  const log = options.logger ?? silent;
  const onError = options.onError ?? ((err: unknown) => console.error('idempotency: handler failed', err));
  const checkWait = (w: number | undefined): number => {
    if (w === undefined) return 0;
    if (typeof w !== 'number' || !Number.isFinite(w) || w < 0) throw new RangeError(`the wait option is seconds >= 0, got ${String(w)}`);
    return w;
  };
  const defaultPolicy: RoutePolicy = {
    required: true,
    failOpen: options.failOpen ?? false,
    timeoutMs: options.timeoutMs ?? null,
    wait: checkWait(options.wait),
  };
  const stats: Record<string, number> = {};
  const count = (k: string) => {
    stats[k] = (stats[k] ?? 0) + 1;
  };

  function policyOf(method: string, path: string): RoutePolicy | null {
    if (options.routes) {
      const p = options.routes(method, path);
      if (!p) return null;
      return {
        required: p.required ?? true,
        failOpen: p.failOpen ?? false,
        timeoutMs: p.timeoutMs ?? defaultPolicy.timeoutMs ?? null,
        wait: p.wait === undefined ? (defaultPolicy.wait ?? 0) : checkWait(p.wait),
      };
    }
    return methods.has(method.toUpperCase()) ? defaultPolicy : null;
  }

  function send(res: Res, status: number, headers: [string, string][], body: Buffer): void {
    for (const n of res.getHeaderNames()) res.removeHeader(n);
    res.statusCode = status;
    for (const [n, v] of headers) res.setHeader(n, v);
    res.setHeader('content-length', String(body.length));
    res.end(body);
  }

  function problem(res: Res, status: number, code: string, detail: string, extra: [string, string][] = []): void {
    send(res, status, [['content-type', 'application/problem+json'], ...extra], mw.problemBody(status, code, detail));
  }

  function refuse(res: Res, status: number, code: string, detail: string, key: string | null): void {
    count(code);
    log.info(`idempotency: ${code} for key ${key}`);
    problem(res, status, code, detail);
  }

  /** The whole request body (the fingerprint needs it), put back into the
   * request stream once read: the handler and any body parser after the
   * middleware read the request exactly as without it. */
  async function readBody(req: Req): Promise<Buffer | 'too_large'> {
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
    const method = (req.method ?? 'GET').toUpperCase();
    const policy = policyOf(method, pathOf(req));
    if (!policy) return next();
    let key: string | null;
    try {
      key = mw.parseIdempotencyKey(headerValues(req, 'idempotency-key'));
    } catch (e) {
      const k = e as mw.KeyHeaderError;
      return refuse(res, 400, k.code, k.message, null);
    }
    if (key === null) {
      if (!policy.required) return next();
      return refuse(res, 400, 'idempotency_key_missing', 'this route requires an Idempotency-Key header', null);
    }
    const who = principalParts(await extractPrincipal(req));
    if (who === null) return refuse(res, 401, 'idempotency_principal_missing', mw.PRINCIPAL_MISSING_DETAIL, key);
    const body = await readBody(req);
    if (body === 'too_large') return refuse(res, 413, 'payload_too_large', 'the request body is over the idempotency limit', key);
    const fp = mw.requestFingerprint(
      method,
      targetOf(req),
      req.headers['content-type'] ?? '',
      body,
      fpHeaders.map((h) => [h, headerValues(req, h).join(', ')] as const),
      fpOptions,
    );
    const { principal, generation } = who;
    const lkey = mw.ledgerKey(namespace, principal, key);
    const binding: Binding = { principal: mw.bindingPrincipal(principal), scopes: [], generation };

    let dec;
    // A duplicate of a request still running waits up to policy.wait
    // seconds for its outcome, claiming again after the ledger's hint.
    const waiting = new Deadline((policy.wait ?? 0) * 1000);
    for (;;) {
      try {
        dec = await client.claim(lkey, fp, binding, {
          leaseMs,
          worker: mw.workerLabel(key, principal),
          marksDispatch: true,
          ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
        });
      } catch (e) {
        if (e instanceof FingerprintMismatch || e instanceof BindingMismatch) {
          return refuse(res, 422, 'idempotency_key_reused', 'this Idempotency-Key was used for another request', key);
        }
        return ledgerFailed(res, next, policy, key, e, 'claim');
      }
      if (dec.decision !== 'in_flight' || waiting.left() <= 0) break;
      await sleep(Math.min(dec.retryAfterMs, waiting.left()));
    }
    if (dec.decision === 'replay') return replay(res, key, dec.outcome.result);
    if (dec.decision === 'in_flight') {
      count('request_in_progress');
      log.info(`idempotency: key ${key} in progress`);
      return problem(res, 409, 'request_in_progress', 'a request with this Idempotency-Key is still being processed', [
        ['retry-after', inProgressRetryAfter(dec)],
      ]);
    }
    let grant: Grant = dec;
    if (grant.decision === 'reconcile') {
      const g = await reconcile(req, res, lkey, grant, key, fp, binding, { idempotencyKey: key, principal, body });
      if (g === 'answered') return;
      if (!g) return refuse(res, 409, 'outcome_unknown', 'an earlier request with this Idempotency-Key failed with an unknown outcome', key);
      grant = g;
    }
    // A dispatch whose answer was lost is retried under the same fence (the
    // ledger answers a repeated dispatch alike), for half the lease: the
    // rest is left for handing the lease back.
    const fence = grant.fence;
    const lease = new Deadline(leaseMs);
    try {
      await retrying(() => client.dispatch(lkey, fence), new Deadline(leaseMs / 2), 'dispatch');
    } catch (e) {
      await releaseUndispatched(lkey, fence, key, lease);
      return ledgerFailed(res, next, policy, key, e, 'dispatch');
    }
    await execute(req, res, next, policy, key, lkey, fp, binding, grant.fence);
  }

  /** Hands back a lease whose handler never ran, after a dispatch that
   * failed: `not_dispatched`, or, when the ledger had recorded the dispatch
   * after all (its answer was lost: `receipt_required`), `not_committed`
   * (true: the handler did not run). */
  async function releaseUndispatched(lkey: string, fence: number, key: string, lease: Deadline): Promise<void> {
    try {
      await retrying(() => client.release(lkey, fence, 'not_dispatched'), lease, 'release');
      return;
    } catch (e) {
      if (!(e instanceof ReceiptRequired)) {
        // The lease lapses; with no dispatch recorded nothing is flagged.
        log.warn(`idempotency: release(not_dispatched) of key ${key} failed: ${String(e)}`);
        return;
      }
    }
    try {
      await retrying(() => client.release(lkey, fence, 'not_committed'), lease, 'release');
    } catch (e) {
      log.error(
        `idempotency: the dispatch of key ${key} was recorded but the handler did not run, and release(not_committed) failed: ` +
          'the record becomes unknown when its lease lapses',
        e,
      );
    }
  }

  /** `Retry-After` of request_in_progress: the time the running lease has
   * left, in whole seconds, at least 1 and at least the ledger's hint. */
  function inProgressRetryAfter(d: InFlight): string {
    return String(mw.inProgressRetryAfterS(d.retryAfterMs, d.leaseExpiresAt));
  }

  /** SPEC §8: a retry found the record `unknown` (a reconcile lease).
   * Returns the execute grant under the same fence (not_committed: run the
   * handler), 'answered' (the found response was settled and replayed), or
   * null (409 `outcome_unknown`: the record stays unknown). */
  async function reconcile(
    req: Req,
    res: Res,
    lkey: string,
    grant: Grant,
    key: string,
    fp: string,
    binding: Binding,
    info: ReconcileRequestInfo,
  ): Promise<Grant | 'answered' | null> {
    const fence = grant.fence;
    const lease = new Deadline(leaseMs);
    let finding: MiddlewareFinding = 'unavailable';
    if (options.reconcile) {
      const stopHeartbeat = startHeartbeat(client, lkey, fence, leaseMs, new AbortController());
      try {
        finding = await options.reconcile(lkey, fence, req, info);
      } catch (e) {
        log.error(`idempotency: reconcile hook failed for key ${key}`, e);
        finding = 'unavailable';
      } finally {
        stopHeartbeat();
      }
    }
    let found: { status: number; headers: [string, string][]; body: Buffer } | null = null;
    if (typeof finding === 'object' && finding !== null && finding.finding === 'committed') {
      try {
        found = foundResponse(finding.response);
      } catch (e) {
        log.error(`idempotency: the reconcile hook of key ${key} found an invalid response; taken as unavailable`, e);
        finding = 'unavailable';
      }
    } else if (finding !== 'not_committed' && finding !== 'unavailable') {
      log.error(`idempotency: the reconcile hook of key ${key} returned ${JSON.stringify(finding)}; taken as unavailable`);
      finding = 'unavailable';
    }
    try {
      if (found) {
        const { result, responseSha256 } = mw.encodeResponse(found.status, found.headers, found.body, stored_(), maxStoredBody);
        const status = found.status;
        await retrying(
          () => client.reconcile(lkey, fence, 'committed', { fingerprint: fp, binding, outcome: { status: status >= 500 ? 'failed' : 'completed', result, responseSha256 } }),
          lease,
          'reconcile',
        );
        count('reconciled');
        log.info(`idempotency: key ${key} reconciled: the hook found its response (${status})`);
        replay(res, key, result);
        return 'answered';
      }
      if (finding === 'not_committed') {
        const ans = await retrying(() => client.reconcile(lkey, fence, 'not_committed'), lease, 'reconcile');
        if ('decision' in ans) {
          log.info(`idempotency: key ${key} reconciled: not committed, the handler runs (fence ${fence})`);
          return ans;
        }
        return null;
      }
      await retrying(() => client.reconcile(lkey, fence, 'unavailable'), lease, 'reconcile');
    } catch (e) {
      // The reconcile lease lapses: the record stays unknown.
      log.warn(`idempotency: reconcile of key ${key} failed: ${String(e)}`);
    }
    return null;
  }

  /** A hook's response as status, headers and body bytes. */
  function foundResponse(r: ReconciledResponse): { status: number; headers: [string, string][]; body: Buffer } {
    if (!r || typeof r !== 'object' || !Number.isInteger(r.status) || r.status < 100 || r.status > 599) {
      throw new TypeError('a committed finding needs response: { status (100-599), headers?, body? }');
    }
    const headers: [string, string][] = (Array.isArray(r.headers) ? r.headers : Object.entries(r.headers ?? {})).map(
      ([n, v]) => [String(n).toLowerCase(), String(v)] as [string, string],
    );
    let body: Buffer;
    if (r.body === undefined || r.body === null) body = Buffer.alloc(0);
    else if (typeof r.body === 'string') body = Buffer.from(r.body, 'utf8');
    else if (r.body instanceof Uint8Array) body = Buffer.from(r.body);
    else {
      body = Buffer.from(JSON.stringify(r.body), 'utf8');
      if (!headers.some(([n]) => n === 'content-type')) headers.push(['content-type', 'application/json']);
    }
    return { status: r.status, headers, body };
  }

  async function execute(req: Req, res: Res, next: Next, policy: RoutePolicy, key: string, lkey: string, fp: string, binding: Binding, fence: number): Promise<void> {
    count('executed');
    const chunks: Buffer[] = [];
    const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
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
    const ac = new AbortController();
    const stopHeartbeat = startHeartbeat(client, lkey, fence, leaseMs, ac);
    let timer: NodeJS.Timeout | undefined;
    if (policy.timeoutMs != null) {
      timer = setTimeout(() => finish({ kind: 'escaped', err: new Error(`handler timed out after ${policy.timeoutMs} ms`), timeout: true }), policy.timeoutMs);
    }
    try {
      next();
    } catch (e) {
      finish({ kind: 'escaped', err: e, timeout: false });
    }
    const result = await done;
    if (timer) clearTimeout(timer);
    stopHeartbeat();
    const restore = () => {
      // Later writes of an abandoned handler go nowhere; ours use the originals.
      res.writeHead = orig.writeHead;
      res.write = orig.write;
      res.end = orig.end;
      res.flushHeaders = orig.flushHeaders;
    };
    if (result.kind === 'escaped') {
      await settleUnknown(lkey, fence, fp, binding, key, result.timeout ? 'timeout' : 'error');
      if (!result.timeout) onError(result.err, req);
      restore();
      if (!res.headersSent) problem(res, 500, 'outcome_unknown', 'the request failed; its outcome is unknown and must be reconciled');
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
    const status = res.statusCode;
    const body = Buffer.concat(chunks);
    const headers: [string, string][] = [];
    for (const [n, v] of Object.entries(res.getHeaders())) {
      if (v === undefined) continue;
      headers.push([n, Array.isArray(v) ? v.join(', ') : String(v)]);
    }
    const retryable = mw.NOT_COMMITTED_STATUSES.has(status) || (res as unknown as Record<symbol, boolean>)[RETRYABLE] === true;
    if (retryable) {
      await releaseNotCommitted(lkey, fence, fp, binding, key);
    } else {
      const { result: stored, responseSha256 } = mw.encodeResponse(status, headers, body, stored_(), maxStoredBody);
      try {
        await retrying(
          () => client.settle(lkey, fence, fp, binding, { status: status >= 500 ? 'failed' : 'completed', result: stored, responseSha256 }),
          new Deadline(leaseMs + 1000),
          'settle',
        );
      } catch (e) {
        // The response goes out anyway (the effect happened); the record
        // becomes unknown when its lease lapses.
        log.error(`idempotency: the response of key ${key} could not be settled`, e);
      }
    }
    restore();
    res.end(body);
  }

  const stored_ = () => stored;

  async function releaseNotCommitted(lkey: string, fence: number, fp: string, binding: Binding, key: string): Promise<void> {
    count('not_committed');
    try {
      await retrying(() => client.release(lkey, fence, 'not_committed'), new Deadline(leaseMs), 'release');
    } catch (e) {
      if (e instanceof InvalidRequest) {
        // A server without release(not_committed) (SPEC §4): the safe record is unknown.
        log.warn(`idempotency: the ledger refused release(not_committed) for key ${key}; settling unknown`);
        await settleUnknown(lkey, fence, fp, binding, key, 'not_committed unsupported');
      } else {
        log.error(`idempotency: release of key ${key} failed`, e);
      }
    }
  }

  async function settleUnknown(lkey: string, fence: number, fp: string, binding: Binding, key: string, why: string): Promise<void> {
    count('outcome_unknown');
    log.warn(`idempotency: key ${key} failed (${why}); outcome unknown`);
    try {
      await retrying(
        () => client.settle(lkey, fence, fp, binding, { status: 'unknown', error: `handler failed: ${why}` }),
        new Deadline(leaseMs + 1000),
        'settle',
      );
    } catch (e) {
      log.error(`idempotency: settle unknown of key ${key} failed`, e); // the lease lapses after dispatch: unknown anyway
    }
  }

  function replay(res: Res, key: string, result: unknown): void {
    const s = mw.decodeResponse(result);
    if (!s || s.body === null) {
      return refuse(res, 409, 'response_not_stored', 'this request completed but its response was too large to store; it will not run again', key);
    }
    count('replayed');
    log.info(`idempotency: replay of key ${key}`);
    send(res, s.status, [...s.headers, ['idempotent-replayed', 'true']], s.body);
  }

  /** A claim or dispatch that failed (SPEC §8): only a ledger that gave no
   * answer or a 503 `unavailable` lets a failOpen route run the handler; a
   * refusal never does. */
  function ledgerFailed(res: Res, next: Next, policy: RoutePolicy, key: string, err: unknown, call: string): void {
    const f = mw.classifyLedgerError(err, unavailableRetryAfterS);
    if (policy.failOpen && f.failOpen) {
      count('fail_open');
      log.warn(`idempotency: ledger unreachable (${String(err)}); key ${key} runs WITHOUT idempotency (failOpen)`);
      return next();
    }
    count(f.code);
    if (f.unexpected) log.error(`idempotency: unexpected answer of the ledger to the ${call} of key ${key}`, err);
    else log.warn(`idempotency: the ${call} of key ${key} failed (${f.code}): ${String(err)}`);
    problem(res, f.status, f.code, f.detail, f.retryAfter === null ? [] : [['retry-after', String(f.retryAfter)]]);
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

  Object.defineProperty(middleware, 'stats', { value: stats, enumerable: true });

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
