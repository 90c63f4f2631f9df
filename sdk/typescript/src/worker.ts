// The worker client contract of SPEC §11: runOnce, makeIdempotent.
//
// claim (the same key on every retry), then:
// - replay: the stored outcome, replayed = true, the effect is not called (§11.6);
// - in_flight: wait retry_after_ms with jitter and claim again, until the deadline (§11.5);
// - reconcile: ask the caller's hook and report its finding; not_committed
//   continues as execute under the same fence; without a hook, ReconcileRequired (§11.4);
//   with reconcile = 'resend', run the effect again under the reconcile
//   lease with the same key (§11.9);
// - execute: heartbeat at a third of leaseMs, call effect(ctx) (ctx.key and
//   ctx.fence go to the remote; ctx.dispatch() before the remote write with
//   marksDispatch, retried under the same fence when its answer is lost),
//   settle, retrying a settle that got no answer under the same fence until
//   it answers (§11.3).
// Failure classes (§11.8): EffectNotSent and, under marksDispatch, any error
// before the dispatch mark → released, the next run executes; EffectRefused
// → released not_committed, the next run executes; anything else → unknown.
// Refusals throw typed errors and are never retried (§11.7); 503, 429 and
// transport errors back off (honouring Retry-After) and retry until the deadline.
import type { Client } from './client.js';
import {
  DeadlineExceeded,
  EffectNotSent,
  EffectRefused,
  InvalidRequest,
  OutcomeUnknown,
  ProblemError,
  ReceiptRequired,
  ReconcileRequired,
  ResultNotSerializable,
  SettleError,
  TransportError,
  Unavailable,
} from './errors.js';
import { canonicalize, fingerprint as computeFingerprint, sha256Hex } from './jcs.js';
import type { Binding, Grant, Json, Outcome, Receipt } from './types.js';

/** What an effect (or a reconcile hook that found the effect applied) returns. */
export interface Done<R = unknown> {
  result: R;
  /** The upstream's raw response; its SHA-256 is response_sha256 (default: the canonical JSON of result). */
  response?: string | Uint8Array;
  /** A definitive failure of the upstream (settled `failed`). */
  failed?: boolean;
}

export interface EffectContext {
  readonly key: string;
  readonly fence: number;
  readonly attempt: number;
  /** Aborted when a heartbeat learns that the lease ended: stop, the settle will be refused. */
  readonly signal: AbortSignal;
  /** Record the commit boundary before the remote write (required with
   * marksDispatch; a lost answer is retried under the same fence). A no-op
   * without marksDispatch, and during a resend (a reconcile lease cannot dispatch). */
  dispatch(): Promise<void>;
  readonly dispatched: boolean;
}

export type Effect<R = unknown> = (ctx: EffectContext) => Promise<Done<R>> | Done<R>;
/** What a reconcile hook found: the effect applied (`{ result }`, of the effect's type `R`), not applied, or it cannot tell. */
export type Finding<R = unknown> = Done<R> | 'not_committed' | 'unavailable';
export type ReconcileHook<R = unknown> = (key: string, fence: number) => Promise<Finding<R>> | Finding<R>;

/** Turns a value that is not JSON (a BigInt, a Map, a class instance, ...)
 * into JSON. Called for every such value inside the result, with the value;
 * what it returns is stored in its place (its own non-JSON members are
 * passed to it again). */
export type Serializer = (value: unknown) => Json;

/** The options of runOnce; `R` (the effect's result) types the reconcile hook's finding. */
export interface RunOptions<R = unknown> {
  principal: string;
  scopes?: readonly string[];
  generation?: number;
  /** JSON pointers: fingerprint only these fields of the request. */
  fields?: readonly string[];
  /** A precomputed fingerprint (instead of the request's). */
  fingerprint?: string;
  leaseMs?: number;
  marksDispatch?: boolean;
  worker?: string;
  retentionS?: number;
  /** Bounds in_flight waits and claim retries (default 30 000 ms; null: none). */
  deadlineMs?: number | null;
  /** What to do with a record left `unknown`: a hook that finds out
   * (SPEC §11.4), or 'resend' (SPEC §11.9: run the effect again with the
   * same key; only when the remote itself de-duplicates by that key). */
  reconcile?: ReconcileHook<R> | 'resend';
  /** Encodes the values of the effect's result that are not JSON. */
  serializer?: Serializer;
}

export interface RunResult<R = unknown> {
  /** The result, on the first run as on a replay: `outcome.result`, the
   * stored JSON form of what the effect returned (a Date is its ISO
   * string; the serializer's output, if one ran). Typed `R`: give the
   * effect a JSON-shaped result type for the type to hold on a replay. */
  result: R;
  /** What was settled (or replayed): `outcome.result` is the stored JSON
   * form of the effect's result (the serializer's output, if one ran). */
  outcome: Outcome<R>;
  receipt: Receipt;
  /** Stored before this run; the effect was not called. */
  replayed: boolean;
  fence: number | null;
  /** The record was `unknown` and is now resolved: the reconcile hook found
   * the effect applied, or a resend (SPEC §11.9) succeeded. */
  reconciled: boolean;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

class Deadline {
  readonly at: number | null;
  constructor(ms: number | null) {
    this.at = ms === null ? null : Date.now() + ms;
  }
  left(): number {
    return this.at === null ? Infinity : this.at - Date.now();
  }
}

function settleDeadline(d: Deadline, leaseMs: number): Deadline {
  // A settle without an answer is retried at least as long as the lease
  // could still be held, and to the caller's deadline when that is later.
  const s = new Deadline(leaseMs + 1000);
  return d.at !== null && s.at !== null && d.at > s.at ? d : s;
}

/** No answer, 503 `unavailable` or a 429 of settle: worth the same call again later. */
export function isRetryable(e: unknown): boolean {
  return e instanceof TransportError || e instanceof Unavailable || (e instanceof ProblemError && e.status === 429);
}

function backoffMs(n: number, e: unknown): number {
  const base = Math.min(1000, 50 * 2 ** Math.min(n, 10));
  let wait = base / 2 + (Math.random() * base) / 2;
  // Retry-After is honoured: never sooner than the server asked.
  if (e instanceof ProblemError && e.retryAfterS !== null && Number.isFinite(e.retryAfterS) && e.retryAfterS > 0) {
    wait = Math.max(wait, e.retryAfterS * 1000);
  }
  return wait;
}

/** Retry `fn` on no answer, 503 `unavailable` and 429 (honouring
 * Retry-After) until the deadline; then DeadlineExceeded (`cause`: the
 * last error). Anything else is thrown at once. */
export async function retrying<T>(fn: () => Promise<T>, deadline: Deadline, what: string): Promise<T> {
  for (let n = 0; ; n++) {
    try {
      return await fn();
    } catch (e) {
      if (!isRetryable(e)) throw e;
      const wait = backoffMs(n, e);
      if (deadline.left() < wait) throw new DeadlineExceeded(`${what}: deadline passed after ${n + 1} tries`, { cause: e });
      await sleep(wait);
    }
  }
}

/** Heartbeats every leaseMs/3 until stopped; aborts `controller` when the lease is lost. */
export function startHeartbeat(client: Client, key: string, fence: number, leaseMs: number, controller: AbortController): () => void {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const beat = async () => {
    if (stopped) return;
    try {
      await client.heartbeat(key, fence);
    } catch (e) {
      if (!isRetryable(e)) {
        controller.abort(e); // expired, revoked or taken over: tell the effect
        return;
      }
    }
    if (!stopped) timer = setTimeout(beat, leaseMs / 3);
  };
  timer = setTimeout(beat, leaseMs / 3);
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}

function typeName(v: unknown): string {
  switch (typeof v) {
    case 'bigint':
      return 'BigInt';
    case 'symbol':
      return 'Symbol';
    case 'function':
      return 'function';
    case 'undefined':
      return 'undefined';
    case 'number':
      return String(v); // NaN, Infinity, -Infinity
    case 'string':
      return 'string with a lone surrogate';
    default: {
      const ctor = (Object.getPrototypeOf(v) as { constructor?: { name?: string } } | null)?.constructor?.name;
      return ctor || 'object';
    }
  }
}

function hasLoneSurrogate(s: string): boolean {
  return /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

const pointerToken = (k: string) => k.replace(/~/g, '~0').replace(/\//g, '~1');

function encodeValue(v: unknown, serializer: Serializer | undefined, path: string, depth: number, fromSerializer: boolean): Json {
  if (depth > 1000) throw new ResultNotSerializable('value nested deeper than 1000', path);
  if (v === null || typeof v === 'boolean') return v;
  if (typeof v === 'number' && Number.isFinite(v)) return v;
  if (typeof v === 'string' && !hasLoneSurrogate(v)) return v;
  if (typeof v === 'object') {
    const withJson = v as { toJSON?: () => unknown };
    if (typeof withJson.toJSON === 'function') return encodeValue(withJson.toJSON(), serializer, path, depth + 1, false); // Date, as JSON.stringify
    if (Array.isArray(v)) {
      // An undefined element is null, as in JSON.stringify.
      return v.map((item, i) => (item === undefined ? null : encodeValue(item, serializer, `${path}/${i}`, depth + 1, false)));
    }
    const proto = Object.getPrototypeOf(v) as unknown;
    if (proto === Object.prototype || proto === null) {
      const out: { [k: string]: Json } = {};
      for (const [k, item] of Object.entries(v)) {
        if (item === undefined) continue; // an undefined member is absent, as in JSON.stringify
        out[k] = encodeValue(item, serializer, `${path}/${pointerToken(k)}`, depth + 1, false);
      }
      return out;
    }
  }
  // Not JSON: a BigInt, a Map, a Set, a class instance, NaN, a function, ...
  if (serializer && !fromSerializer) {
    let json: unknown;
    try {
      json = serializer(v);
    } catch (e) {
      throw new ResultNotSerializable(typeName(v), path, { cause: e });
    }
    return encodeValue(json, serializer, path, depth + 1, true);
  }
  if (fromSerializer) throw new ResultNotSerializable(`${typeName(v)} (returned by the serializer)`, path);
  throw new ResultNotSerializable(typeName(v), path);
}

/** The JSON form of an effect's result: plain objects, arrays, strings,
 * finite numbers, booleans and null as they are (`toJSON` honoured, an
 * undefined member left out, an undefined result null); anything else goes
 * through `serializer`, or throws ResultNotSerializable naming its type. */
export function encodeResult(value: unknown, serializer?: Serializer): Json {
  return value === undefined ? null : encodeValue(value, serializer, '', 0, false);
}

export function doneToOutcome<R>(d: Done<R>, serializer?: Serializer): Outcome<R> {
  if (!d || typeof d !== 'object' || !('result' in d)) throw new TypeError('the effect must return { result, response?, failed? }');
  const result = encodeResult(d.result, serializer);
  const canonical = canonicalize(result); // validates the result before anything is stored
  const raw = d.response ?? canonical;
  return { status: d.failed ? 'failed' : 'completed', result: result as R, responseSha256: sha256Hex(raw) };
}

const MAX_ERROR = 1000;

function unknownOutcome(e: unknown): Outcome {
  const what = e instanceof Error ? e.message : String(e);
  const msg =
    e instanceof ResultNotSerializable ? what : `the effect failed after it may have reached the remote: ${what}`;
  return { status: 'unknown', error: msg.length > MAX_ERROR ? msg.slice(0, MAX_ERROR - 1) + '…' : msg };
}

interface Step {
  client: Client;
  key: string;
  fp: string;
  binding: Binding;
  leaseMs: number;
  marksDispatch: boolean;
  dl: Deadline;
  serializer: Serializer | undefined;
}

/** SPEC §11: run `effect` at most once for `key`. */
export async function runOnce<R = unknown>(client: Client, key: string, request: unknown, effect: Effect<R>, options: RunOptions<R>): Promise<RunResult<R>> {
  const fp = options.fingerprint ?? computeFingerprint(request, options.fields);
  const binding: Binding = { principal: options.principal, scopes: options.scopes ?? [], generation: options.generation ?? 0 };
  const leaseMs = options.leaseMs ?? 30_000;
  const marksDispatch = options.marksDispatch ?? false;
  const dl = new Deadline(options.deadlineMs === undefined ? 30_000 : options.deadlineMs);
  const step: Step = { client, key, fp, binding, leaseMs, marksDispatch, dl, serializer: options.serializer };
  for (;;) {
    const dec = await retrying(
      () =>
        client.claim(key, fp, binding, {
          leaseMs,
          marksDispatch,
          ...(options.worker !== undefined ? { worker: options.worker } : {}),
          ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
        }),
      dl,
      'claim',
    );
    if (dec.decision === 'replay') {
      const outcome = dec.outcome as Outcome<R>;
      return { result: outcome.result as R, outcome, receipt: dec.receipt, replayed: true, fence: null, reconciled: false };
    }
    if (dec.decision === 'in_flight') {
      const wait = dec.retryAfterMs * (1 + Math.random() * 0.25); // at or above the server's hint
      if (dl.left() < wait) throw new DeadlineExceeded(`operation ${JSON.stringify(key)} still in flight at the deadline`);
      await sleep(wait);
      continue;
    }
    let grant: Grant = dec;
    if (grant.decision === 'reconcile') {
      const found =
        options.reconcile === 'resend' ? await resendStep(step, grant, effect) : await reconcileStep<R>(step, grant, options.reconcile);
      if ('outcome' in found) return found as RunResult<R>;
      grant = found;
    }
    return executeStep(step, grant, effect);
  }
}

async function reconcileStep<R>(s: Step, grant: Grant, hook: ReconcileHook<R> | undefined): Promise<RunResult<R> | Grant> {
  const { client, key, fp, binding, leaseMs } = s;
  const ac = new AbortController();
  const stop = startHeartbeat(client, key, grant.fence, leaseMs, ac);
  const sdl = settleDeadline(s.dl, leaseMs);
  try {
    let finding: Finding<R>;
    try {
      finding = hook ? await hook(key, grant.fence) : 'unavailable';
    } catch (e) {
      await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile');
      throw e;
    }
    if (typeof finding === 'object') {
      let outcome: Outcome<R>;
      try {
        outcome = doneToOutcome(finding, s.serializer);
      } catch (e) {
        await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile'); // hand the lease back
        throw e;
      }
      const r = await retrying(
        () => client.reconcile(key, grant.fence, 'committed', { fingerprint: fp, binding, outcome }),
        sdl,
        'reconcile',
      );
      return { result: outcome.result as R, outcome, receipt: r as Receipt, replayed: false, fence: grant.fence, reconciled: true };
    }
    if (finding === 'not_committed') {
      return (await retrying(() => client.reconcile(key, grant.fence, 'not_committed'), sdl, 'reconcile')) as Grant;
    }
    await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile');
    throw new ReconcileRequired(key, grant.fence, hook ? 'the reconcile hook could not tell (unavailable)' : 'no reconcile hook was given');
  } finally {
    stop();
  }
}

/** SPEC §11.9: the effect again, with the same key, under the reconcile
 * lease (the remote de-duplicates by the key); its dispatch() is a local
 * no-op. Success → committed; any failure → unavailable. */
async function resendStep<R>(s: Step, grant: Grant, effect: Effect<R>): Promise<RunResult<R>> {
  const { client, key, fp, binding, leaseMs } = s;
  const ac = new AbortController();
  const stop = startHeartbeat(client, key, grant.fence, leaseMs, ac);
  const sdl = settleDeadline(s.dl, leaseMs);
  let marked = false;
  const ctx: EffectContext = {
    key,
    fence: grant.fence,
    attempt: grant.attempt,
    signal: ac.signal,
    get dispatched() {
      return marked;
    },
    async dispatch() {
      marked = true; // a reconcile lease cannot dispatch: nothing to record
    },
  };
  try {
    let outcome: Outcome<R>;
    try {
      outcome = doneToOutcome(await effect(ctx), s.serializer);
    } catch (e) {
      await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile');
      const what = e instanceof Error ? e.message : String(e);
      throw new ReconcileRequired(key, grant.fence, `the resend failed: ${what}`, { cause: e });
    }
    const r = await retrying(() => client.reconcile(key, grant.fence, 'committed', { fingerprint: fp, binding, outcome }), sdl, 'reconcile');
    return { result: outcome.result as R, outcome, receipt: r as Receipt, replayed: false, fence: grant.fence, reconciled: true };
  } finally {
    stop();
  }
}

/** Hands back an execute lease without a receipt, for an effect that sent
 * nothing (or whose remote refused it for certain). */
async function release(s: Step, fence: number, reason: 'not_dispatched' | 'not_committed', sdl: Deadline, cause: unknown): Promise<void> {
  const { client, key, fp, binding } = s;
  try {
    await retrying(() => client.release(key, fence, reason), sdl, 'release');
    return;
  } catch (e) {
    // receipt_required: the ledger recorded a dispatch whose answer was
    // lost (ctx.dispatch() threw: the effect was told not to send);
    // invalid_request: a server without release(not_committed).
    if (!(e instanceof ReceiptRequired || e instanceof InvalidRequest)) throw e;
    if (e instanceof ReceiptRequired) {
      try {
        await retrying(() => client.release(key, fence, 'not_committed'), sdl, 'release'); // true: nothing was sent
        return;
      } catch (e2) {
        if (!(e2 instanceof InvalidRequest)) throw e2;
      }
    }
  }
  await retrying(() => client.settle(key, fence, fp, binding, unknownOutcome(cause)), sdl, 'settle'); // the safe record
}

async function executeStep<R>(s: Step, grant: Grant, effect: Effect<R>): Promise<RunResult<R>> {
  const { client, key, fp, binding, leaseMs, marksDispatch } = s;
  const ac = new AbortController();
  let dispatched = false;
  const ctx: EffectContext = {
    key,
    fence: grant.fence,
    attempt: grant.attempt,
    signal: ac.signal,
    get dispatched() {
      return dispatched;
    },
    async dispatch() {
      // A dispatch whose answer was lost is retried under the same fence
      // (the ledger answers a repeated dispatch alike), for half the lease.
      if (marksDispatch && !dispatched) await retrying(() => client.dispatch(key, grant.fence), new Deadline(leaseMs / 2), 'dispatch');
      dispatched = true;
    },
  };
  const stop = startHeartbeat(client, key, grant.fence, leaseMs, ac);
  const sdl = settleDeadline(s.dl, leaseMs);
  try {
    let outcome: Outcome<R>;
    try {
      outcome = doneToOutcome(await effect(ctx), s.serializer);
    } catch (e) {
      const beforeMark = marksDispatch && !dispatched; // §11.8: nothing could have been sent
      if (e instanceof EffectNotSent) {
        await release(s, grant.fence, beforeMark ? 'not_dispatched' : 'not_committed', sdl, e);
        throw e;
      }
      if (e instanceof EffectRefused) {
        await release(s, grant.fence, 'not_committed', sdl, e);
        throw e;
      }
      if (beforeMark) {
        await release(s, grant.fence, 'not_dispatched', sdl, e);
        throw e;
      }
      const receipt = await retrying(() => client.settle(key, grant.fence, fp, binding, unknownOutcome(e)), sdl, 'settle');
      throw new OutcomeUnknown(key, receipt, e);
    }
    const receipt = await retrying(() => client.settle(key, grant.fence, fp, binding, outcome), sdl, 'settle');
    return { result: outcome.result as R, outcome, receipt, replayed: false, fence: grant.fence, reconciled: false };
  } finally {
    stop();
  }
}

/** The options of makeIdempotent: every option runOnce takes, and how to
 * get the key (and the fingerprinted request) from the arguments. */
export interface IdempotentOptions<A extends unknown[], R = unknown> {
  client: Client;
  /** The operation's key, from the arguments: the same on every retry of the same logical call. */
  key: (...args: A) => string;
  principal: string;
  scopes?: readonly string[];
  generation?: number;
  marksDispatch?: boolean;
  reconcile?: ReconcileHook<R> | 'resend';
  leaseMs?: number;
  retentionS?: number;
  deadlineMs?: number | null;
  serializer?: Serializer;
  worker?: string;
  /** The value fingerprinted (default: the arguments, as a JSON array). */
  request?: (...args: A) => unknown;
  /** JSON pointers into the request: fingerprint only these. */
  fields?: readonly string[];
}

/** A function made idempotent: the original arguments (without the
 * context), the function's result; `run` gives the whole RunResult. */
export interface IdempotentFunction<A extends unknown[], R> {
  (...args: A): Promise<R>;
  run(...args: A): Promise<RunResult<R>>;
}

/** SPEC §11.8: `fn` run at most once per key, through runOnce. `fn` gets
 * the original arguments and, last, the EffectContext (`ctx.dispatch()`
 * marks the commit boundary under marksDispatch; `ctx.key` and `ctx.fence`
 * go to the remote). The returned function resolves to `fn`'s result, or,
 * when the call was already settled, to the stored result (its JSON form:
 * the serializer's output, if one ran). Failures follow runOnce. */
export function makeIdempotent<A extends unknown[], R>(
  fn: (...args: [...A, EffectContext]) => R | Promise<R>,
  options: IdempotentOptions<A, R>,
): IdempotentFunction<A, R> {
  if (typeof fn !== 'function') throw new TypeError('makeIdempotent(fn, options): fn must be a function');
  if (!options || !options.client || typeof options.key !== 'function' || typeof options.principal !== 'string') {
    throw new TypeError('makeIdempotent(fn, { client, key: (...args) => string, principal, ... })');
  }
  const { client, key, request, ...rest } = options;
  const run = async (args: A): Promise<{ r: RunResult<R>; produced: { value: R } | null }> => {
    let produced: { value: R } | null = null;
    const r = await runOnce<R>(
      client,
      key(...args),
      request ? request(...args) : args,
      async (ctx) => {
        produced = null;
        const value = await fn(...args, ctx);
        produced = { value };
        return { result: value };
      },
      rest,
    );
    return { r, produced };
  };
  const wrapped = (async (...args: A) => {
    const { r, produced } = await run(args);
    return produced && !r.replayed && !r.reconciled ? (produced as { value: R }).value : (r.outcome.result as R);
  }) as IdempotentFunction<A, R>;
  wrapped.run = async (...args: A) => (await run(args)).r;
  return wrapped;
}

export { Deadline, SettleError };
