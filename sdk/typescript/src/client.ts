// The typed HTTP client of SPEC §7, on the built-in fetch (on node:https with
// a custom CA, tls.ts); every request carries the caller's W3C trace context
// when @opentelemetry/api is installed (trace.ts).
import { problemError, TransportError } from './errors.js';
import { checkCA, fetchTrusting, type CACertificates } from './tls.js';
import { injectTraceContext } from './trace.js';
import {
  type BatchCall,
  type BatchResult,
  type Binding,
  type ClaimDecision,
  type Dispatched,
  type Grant,
  type LeaseInfo,
  type ListParams,
  type OperationPage,
  type OperationRecord,
  type Outcome,
  type Receipt,
  type Released,
  type Revoked,
  type Stats,
  type WarningRecord,
  claimFromWire,
  outcomeToWire,
  receiptFromWire,
  recordFromWire,
  statsFromWire,
  summaryFromWire,
  warningFromWire,
} from './types.js';
import { runOnce, type Effect, type RunOptions, type RunResult } from './worker.js';

function query(params: ListParams): string {
  const q: string[] = [];
  const add = (name: string, v: string) => q.push(`${name}=${encodeURIComponent(v)}`);
  if (params.status !== undefined) add('status', typeof params.status === 'string' ? params.status : params.status.join(','));
  for (const [name, v] of [
    ['reconcile_required', params.reconcileRequired],
    ['disputed', params.disputed],
    ['stuck', params.stuck],
    ['quarantined', params.quarantined],
  ] as const) {
    if (v !== undefined) add(name, v ? 'true' : 'false');
  }
  if (params.keyPrefix !== undefined) add('key_prefix', params.keyPrefix);
  if (params.order !== undefined) add('order', params.order);
  if (params.limit !== undefined) add('limit', String(params.limit));
  if (params.after !== undefined && params.after !== null) add('after', String(params.after));
  return q.length ? '?' + q.join('&') : '';
}

export interface ClientOptions {
  /** Base URL of a `settle serve`, e.g. http://127.0.0.1:7411 */
  url: string;
  /** Bearer token of the tenant (omit when authentication is off). */
  token?: string;
  /** Per-request timeout (default 10 000 ms). */
  timeoutMs?: number;
  /** A fetch implementation (default: the global fetch). Tests and proxies plug in here. */
  fetch?: typeof fetch;
  headers?: Record<string, string>;
  /** The CA certificate(s) to trust for an https `url`, PEM (a string or a
   * Buffer, one or a bundle, or an array of them), instead of Node's default
   * roots: a private CA, or the server's self-signed certificate. Requests
   * then go through a fetch on node:https whose Agent trusts them (loaded
   * on the first request). Not with `fetch` (set the trust of your own
   * fetch there); unused for an http `url`. */
  ca?: CACertificates;
}

export interface ClaimOptions {
  leaseMs?: number;
  worker?: string;
  marksDispatch?: boolean;
  retentionS?: number;
  /** SPEC §4 claim rule 5a: a random id of this claim (16–64 of
   * `[A-Za-z0-9_-]`, see `newClaimId`), sent again only when the same claim
   * is retried because its answer was lost; the ledger then answers with the
   * same grant instead of `in_flight`. runOnce, the middlewares and the
   * Reconciler draw one per claim. */
  claimId?: string;
}

export interface ReleaseOptions {
  /** SPEC §4 `release(…, forget)`: remove the record when nothing of it
   * remains (pending, never settled, no flag, no quarantine), so that its
   * key may be claimed afresh; else `receipt_required` and nothing changes. */
  forget?: boolean;
}

export { newClaimId } from './jcs.js';

export type ReconcileAnswer = Grant | Receipt | Released;

/** Every byte but the unreserved ones percent-encoded (SPEC §7 path segments). */
function seg(s: string): string {
  if (typeof s !== 'string') throw new TypeError('a path segment must be a string');
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
}

/** SPEC §2: fences and generations are integers in [0, 2^53 − 1]. */
function uint(name: string, v: number): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw new RangeError(`${name} must be an integer in [0, 2^53 - 1], got ${String(v)}`);
  }
  return v;
}

function bindingToWire(b: Binding): Record<string, unknown> {
  if (!b || typeof b.principal !== 'string') throw new TypeError('binding.principal must be a string');
  return { principal: b.principal, scopes: [...(b.scopes ?? [])], generation: uint('binding.generation', b.generation ?? 0) };
}

type W = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

export class Client {
  readonly url: string;
  private readonly token: string | undefined;
  private readonly timeoutMs: number;
  /** undefined until the fetch trusting `ca` is loaded (`tlsFetch`). */
  private fetchImpl: typeof fetch | undefined;
  private tlsFetch: (() => Promise<typeof fetch>) | undefined;
  private readonly extraHeaders: Record<string, string>;

  constructor(options: ClientOptions) {
    if (!options || typeof options.url !== 'string') throw new TypeError('new Client({ url, token? })');
    this.url = options.url.replace(/\/+$/, '');
    this.token = options.token;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.extraHeaders = options.headers ?? {};
    const ca = options.ca;
    if (ca !== undefined) {
      checkCA(ca);
      if (options.fetch) throw new TypeError('new Client({ ca, fetch }): give one of them (with your own fetch, set its TLS trust there)');
    }
    if (ca !== undefined && /^https:/i.test(this.url)) {
      let loading: Promise<typeof fetch> | undefined;
      this.tlsFetch = () => (loading ??= fetchTrusting(ca).then((f) => (this.fetchImpl = f)));
    } else {
      this.fetchImpl = options.fetch ?? fetch;
    }
  }

  private async send(method: string, path: string, body?: unknown, raw = false): Promise<any> {
    const headers: Record<string, string> = {
      accept: 'application/json',
      'user-agent': 'settle-client-typescript/0.2',
      ...this.extraHeaders,
    };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const traced = injectTraceContext(headers);
    if (traced) await traced;
    const { status, text, retryAfter } = await this.exchange(method, path, headers, body === undefined ? undefined : JSON.stringify(body));
    if (status === 200) return raw ? text : JSON.parse(text);
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // a non-JSON error (a proxy's HTML page): kept as text
    }
    const ra = retryAfter;
    throw problemError(status, parsed, ra !== null && !Number.isNaN(Number(ra)) ? Number(ra) : null);
  }

  /** One request and its answer: the status, the body's text and
   * `Retry-After`; `TransportError` when no answer arrived. What every
   * call goes through (`@settle/local` answers it in process). */
  protected async exchange(
    method: string,
    path: string,
    headers: Record<string, string>,
    body: string | undefined,
  ): Promise<{ status: number; text: string; retryAfter: string | null }> {
    const fetchImpl = this.fetchImpl ?? (await this.tlsFetch!());
    try {
      const resp = await fetchImpl(this.url + path, {
        method,
        headers,
        body,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      return { status: resp.status, text: await resp.text(), retryAfter: resp.headers.get('retry-after') };
    } catch (e) {
      // fetch's own message is "fetch failed": the reason (refused, reset, a
      // certificate not trusted) is its cause's.
      const cause = (e as { cause?: { message?: unknown } })?.cause?.message;
      const why = (e as Error)?.message ?? String(e);
      throw new TransportError(`${method} ${path}: ${why}${typeof cause === 'string' && cause ? ` (${cause})` : ''}`, { cause: e });
    }
  }

  /** `R`: the type of a replay's stored result (not checked: the ledger holds JSON). */
  async claim<R = unknown>(key: string, fingerprint: string, binding: Binding, options: ClaimOptions = {}): Promise<ClaimDecision<R>> {
    const body: W = { fingerprint, binding: bindingToWire(binding) };
    if (options.leaseMs !== undefined) body.lease_ms = options.leaseMs;
    if (options.worker !== undefined) body.worker = options.worker;
    if (options.marksDispatch) body.marks_dispatch = true;
    if (options.retentionS !== undefined) body.retention_s = options.retentionS;
    if (options.claimId !== undefined) body.claim_id = options.claimId;
    return claimFromWire(await this.send('POST', `/v1/operations/${seg(key)}/claim`, body)) as ClaimDecision<R>;
  }

  async heartbeat(key: string, fence: number, leaseMs?: number): Promise<LeaseInfo> {
    const body: W = { fence: uint('fence', fence) };
    if (leaseMs !== undefined) body.lease_ms = leaseMs;
    const d = await this.send('POST', `/v1/operations/${seg(key)}/heartbeat`, body);
    return { fence: d.fence, leaseExpiresAt: d.lease_expires_at };
  }

  async dispatch(key: string, fence: number): Promise<Dispatched> {
    const d = await this.send('POST', `/v1/operations/${seg(key)}/dispatch`, { fence: uint('fence', fence) });
    return { fence: d.fence, leaseExpiresAt: d.lease_expires_at, dispatched: d.dispatched };
  }

  async settle(key: string, fence: number, fingerprint: string, binding: Binding, outcome: Outcome): Promise<Receipt> {
    const d = await this.send('POST', `/v1/operations/${seg(key)}/settle`, {
      fence: uint('fence', fence),
      fingerprint,
      binding: bindingToWire(binding),
      outcome: outcomeToWire(outcome),
    });
    return receiptFromWire(d.receipt);
  }

  async release(
    key: string,
    fence: number,
    reason: 'not_dispatched' | 'not_committed' | null = 'not_dispatched',
    options: ReleaseOptions = {},
  ): Promise<Released> {
    const body: W = { fence: uint('fence', fence) };
    if (reason !== null) body.reason = reason;
    if (options.forget) body.forget = true;
    const d = await this.send('POST', `/v1/operations/${seg(key)}/release`, body);
    return { fence: d.fence, released: d.released };
  }

  async reconcile(
    key: string,
    fence: number,
    finding: 'committed' | 'not_committed' | 'unavailable',
    options: { fingerprint?: string; binding?: Binding; outcome?: Outcome } = {},
  ): Promise<ReconcileAnswer> {
    const body: W = { fence: uint('fence', fence), finding };
    if (options.fingerprint !== undefined) body.fingerprint = options.fingerprint;
    if (options.binding !== undefined) body.binding = bindingToWire(options.binding);
    if (options.outcome !== undefined) body.outcome = outcomeToWire(options.outcome);
    const d = await this.send('POST', `/v1/operations/${seg(key)}/reconcile`, body);
    if (d.receipt) return receiptFromWire(d.receipt);
    if (d.decision) return claimFromWire(d) as Grant;
    return { fence: d.fence, released: d.released };
  }

  /** `R`: the type of the stored result (not checked: the ledger holds JSON). */
  async get<R = unknown>(key: string): Promise<OperationRecord<R>> {
    return recordFromWire(await this.send('GET', `/v1/operations/${seg(key)}`)) as OperationRecord<R>;
  }

  /** SPEC §9: one page of the tenant's records, filtered; pass `next` as
   * `after` (with the same filters) for the next page, until it is null. */
  async list(params: ListParams = {}): Promise<OperationPage> {
    const d = await this.send('GET', `/v1/operations${query(params)}`);
    return { operations: (d.operations as W[]).map(summaryFromWire), next: d.next === null || d.next === undefined ? null : String(d.next) };
  }

  /** SPEC §9: the tenant's counts by status and flag. */
  async stats(): Promise<Stats> {
    return statsFromWire(await this.send('GET', '/v1/stats'));
  }

  /** SPEC §10: several calls in one request, applied in order (not
   * atomically); one result per call, each what the single call would have
   * answered. */
  async batch(calls: readonly BatchCall[]): Promise<BatchResult[]> {
    const d = await this.send('POST', '/v1/batch', { calls });
    return (d.results as W[]).map((r) => ({
      status: r.status,
      body: r.body,
      error: r.status === 200 ? null : problemError(r.status, r.body),
    }));
  }

  /** SPEC §7: the principal's current generation (0 for one never seen). */
  async principal(principal: string): Promise<number> {
    const d = await this.send('GET', `/v1/principals/${seg(principal)}`);
    return uint('generation', d.generation);
  }

  async revoke(principal: string): Promise<Revoked> {
    const d = await this.send('POST', `/v1/principals/${seg(principal)}/revoke`, {});
    return { principal: d.principal, generation: d.generation };
  }

  async warn(task: string, cls: string, detail?: string): Promise<WarningRecord> {
    const body: W = detail === undefined ? {} : { detail };
    return warningFromWire(await this.send('POST', `/v1/tasks/${seg(task)}/warnings/${seg(cls)}`, body));
  }

  async warnings(task: string): Promise<WarningRecord[]> {
    const d = await this.send('GET', `/v1/tasks/${seg(task)}/warnings`);
    return (d.warnings as W[]).map(warningFromWire);
  }

  async health(): Promise<{ status: string }> {
    return this.send('GET', '/healthz');
  }

  async ready(): Promise<{ status: string }> {
    return this.send('GET', '/readyz');
  }

  async metrics(): Promise<string> {
    return this.send('GET', '/metrics', undefined, true);
  }

  async openapi(): Promise<Record<string, unknown>> {
    return this.send('GET', '/openapi.json');
  }

  /** SPEC §11: run `effect` at most once for `key` (see runOnce). */
  runOnce<R = unknown>(key: string, request: unknown, effect: Effect<R>, options: RunOptions<R>): Promise<RunResult<R>> {
    return runOnce(this, key, request, effect, options);
  }
}

export { seg as encodeSegment };
