// The worker client contract of SPEC §11: runOnce, makeIdempotent.
//
// claim (the same key on every retry; a fresh claim_id per claim, sent
// again with each retry of that claim whose answer was lost: SPEC §4 rule
// 5a), then:
// - replay: the stored outcome, replayed = true, the effect is not called (§11.6);
// - in_flight: wait retry_after_ms with jitter and claim again, until the deadline (§11.5);
// - reconcile: ask the caller's hook (bounded by hookTimeoutMs, the lease
//   heartbeated) and report its finding; not_committed continues as execute
//   under the same fence; without a hook, or when it cannot tell,
//   ReconcileRequired; a hook that throws or times out, OutcomeUnknown
//   (§11.4, §11.11); with reconcile = 'resend', run the effect again under
//   the reconcile lease with the same key (§11.9);
// - execute: heartbeat at a third of leaseMs, call effect(ctx) (ctx.key and
//   ctx.fence go to the remote; ctx.dispatch() before the remote write with
//   marksDispatch, retried under the same fence when its answer is lost),
//   settle, retrying a settle that got no answer under the same fence (§11.3).
// Failure classes (§11.8, §11.11): EffectNotSent and, under marksDispatch,
// any error before the dispatch mark → released, the next run executes;
// EffectRefused → released not_committed; anything else → unknown. An SDK
// never attests on its own inference: after a ctx.dispatch() that failed,
// the lease is released not_dispatched and the ledger decides
// (receipt_required: it recorded the mark → settled unknown); not_committed
// only on the effect's own EffectNotSent / EffectRefused. A dispatch()
// answered, or called and not awaited, crossed the boundary.
// Refusals throw typed errors and are never retried (§11.7); 503, 429 and
// transport errors back off (honouring Retry-After) and retry until the
// deadline; the calls that hand a lease back (release, the settle after a
// failure, reconcile(unavailable)) retry past it, up to the lease's end.
import type { Client } from './client.js';
import {
  DeadlineExceeded,
  EffectNotSent,
  EffectRefused,
  HookTimeout,
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
import { canonicalize, fingerprint as computeFingerprint, newClaimId, sha256Hex } from './jcs.js';
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
   * marksDispatch; a lost answer is retried under the same fence until the
   * run's deadline). If it rejects, do not write: the SDK releases the lease
   * `not_dispatched` and lets the ledger decide (SPEC §11.11). Once it was
   * called, the effect has crossed the boundary unless it awaited a
   * rejection. A no-op without marksDispatch, and during a resend (a
   * reconcile lease cannot dispatch). */
  dispatch(): Promise<void>;
  /** The dispatch mark was recorded (answered). */
  readonly dispatched: boolean;
}

export type Effect<R = unknown> = (ctx: EffectContext) => Promise<Done<R>> | Done<R>;
/** What a reconcile hook found: the effect applied (`{ result }`, of the effect's type `R`), not applied, or it cannot tell. */
export type Finding<R = unknown> = Done<R> | 'not_committed' | 'unavailable';
/** Asked with the key and the reconcile lease's fence; `options.signal` is
 * aborted when the hook ran past `hookTimeoutMs` (its answer no longer
 * counts). The lease is heartbeated while it runs. */
export type ReconcileHook<R = unknown> = (key: string, fence: number, options: { signal: AbortSignal }) => Promise<Finding<R>> | Finding<R>;

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
  /** Bounds in_flight waits and the retries of claim, dispatch and settle
   * (default 30 000 ms; null: none). The calls that hand the lease back
   * after a failure retry past it, up to the lease's end. */
  deadlineMs?: number | null;
  /** What to do with a record left `unknown`: a hook that finds out
   * (SPEC §11.4), or 'resend' (SPEC §11.9: run the effect again with the
   * same key; only when the remote itself de-duplicates by that key). */
  reconcile?: ReconcileHook<R> | 'resend';
  /** The reconcile hook's time limit (default: leaseMs); past it, it counts
   * as unavailable and runOnce throws OutcomeUnknown (cause: HookTimeout). */
  hookTimeoutMs?: number;
  /** Encodes the values of the effect's result that are not JSON. */
  serializer?: Serializer;
  /** Called on every replay (the answer is a receipt stored before this
   * run; the effect was not called) with the stored outcome and the
   * receipt: what it returns (or resolves to) is the run's `result` (the
   * idempotent function's value) instead of the stored one. A throw
   * rejects the run; the record is not touched. */
  onReplay?: (outcome: Outcome<R>, receipt: Receipt) => R | Promise<R>;
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

const MAX_TIMER = 2 ** 31 - 1;

/** Sleeps `ms`; an abort of `signal` ends the sleep early with its reason. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    };
    const timer = setTimeout(done, Math.min(ms, MAX_TIMER));
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

class Deadline {
  /** Epoch ms, or null: none. */
  readonly at: number | null;
  /** `ms` from now (null: no deadline); with `absolute`, `ms` is the epoch ms itself. */
  constructor(ms: number | null, absolute = false) {
    this.at = ms === null ? null : absolute ? ms : Date.now() + ms;
  }
  left(): number {
    return this.at === null ? Infinity : this.at - Date.now();
  }
  /** This deadline, or `ms` from now when that is later. */
  atLeast(ms: number): Deadline {
    const t = Date.now() + ms;
    return this.at !== null && t > this.at ? new Deadline(t, true) : this;
  }
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
 * last error). Anything else is thrown at once. `fn` is the same call every
 * time (SPEC §11.11: a lost call is retried with identical arguments). An
 * abort of `signal` ends the retries with its reason. */
export async function retrying<T>(fn: () => Promise<T>, deadline: Deadline, what: string, signal?: AbortSignal): Promise<T> {
  for (let n = 0; ; n++) {
    if (signal?.aborted) throw signal.reason;
    try {
      return await fn();
    } catch (e) {
      if (!isRetryable(e)) throw e;
      const wait = backoffMs(n, e);
      if (deadline.left() < wait) throw new DeadlineExceeded(`${what}: deadline passed after ${n + 1} tries`, { cause: e });
      await sleep(wait, signal);
    }
  }
}

/** When a lease was last renewed (the local time its claim or heartbeat was
 * sent: the lease ends no sooner than `renewedAt + leaseMs`). */
export interface LeaseClock {
  renewedAt: number;
}

export interface Heartbeat {
  stop(): void;
  /** When the lease ends unless a heartbeat gets through (local clock, epoch ms). */
  leaseEnd(): number;
}

/** Heartbeats every leaseMs/3 until stopped; aborts `controller` when the
 * lease is lost; each heartbeat answered moves `clock.renewedAt`. */
export function startHeartbeat(
  client: Client,
  key: string,
  fence: number,
  leaseMs: number,
  controller: AbortController,
  clock: LeaseClock = { renewedAt: Date.now() },
): Heartbeat {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const beat = async () => {
    if (stopped) return;
    const sent = Date.now();
    try {
      await client.heartbeat(key, fence);
      clock.renewedAt = Math.max(clock.renewedAt, sent);
    } catch (e) {
      if (!isRetryable(e)) {
        controller.abort(e); // expired, revoked or taken over: tell the effect
        return;
      }
    }
    if (!stopped) timer = setTimeout(beat, leaseMs / 3);
  };
  timer = setTimeout(beat, leaseMs / 3);
  return {
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
    leaseEnd: () => clock.renewedAt + leaseMs,
  };
}

/** Asks a reconcile hook, bounded by `timeoutMs` (SPEC §8, §11.10,
 * §11.11): past it, rejects with HookTimeout; an abort of `outer` rejects
 * with its reason. The hook gets a signal that is aborted in both cases. */
export async function askHook<T>(ask: (signal: AbortSignal) => Promise<T> | T, timeoutMs: number, outer?: AbortSignal): Promise<T> {
  const ac = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const onOuter = () => ac.abort(outer!.reason);
  try {
    return await new Promise<T>((resolve, reject) => {
      ac.signal.addEventListener('abort', () => reject(ac.signal.reason), { once: true });
      if (outer) {
        if (outer.aborted) return ac.abort(outer.reason);
        outer.addEventListener('abort', onOuter, { once: true });
      }
      if (timeoutMs < MAX_TIMER) timer = setTimeout(() => ac.abort(new HookTimeout(timeoutMs)), Math.max(0, timeoutMs));
      Promise.resolve()
        .then(() => ask(ac.signal))
        .then(resolve, reject);
    });
  } finally {
    if (timer) clearTimeout(timer);
    outer?.removeEventListener('abort', onOuter);
  }
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

function clip(msg: string): string {
  return msg.length > MAX_ERROR ? msg.slice(0, MAX_ERROR - 1) + '…' : msg;
}

function messageOf(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function unknownOutcome(e: unknown): Outcome {
  const what = messageOf(e);
  const msg = e instanceof ResultNotSerializable ? what : `the effect failed after it may have reached the remote: ${what}`;
  return { status: 'unknown', error: clip(msg) };
}

/** A 409 problem of the ledger (lease_expired, stale_fence, ...): the lease is not ours any more. */
function isRefusal(e: unknown): boolean {
  return e instanceof ProblemError && e.status === 409;
}

interface Step {
  client: Client;
  key: string;
  fp: string;
  binding: Binding;
  leaseMs: number;
  marksDispatch: boolean;
  dl: Deadline;
  hookTimeoutMs: number;
  serializer: Serializer | undefined;
}

/** The deadline of a call that must be answered for the run to go on
 * (dispatch, the settle of the outcome, a reconcile finding): the run's,
 * and at least a third of the lease from now (one retry window even for an
 * effect that ran past the run's deadline). */
function callDeadline(s: Step): Deadline {
  return s.dl.atLeast(s.leaseMs / 3);
}

/** The deadline of a call that hands the lease back (release, the settle of
 * `unknown` after a failure, reconcile(unavailable)): past the run's, up to
 * the lease's end, so that the record is not left held. */
function cleanupDeadline(s: Step, hb: Heartbeat): Deadline {
  const end = hb.leaseEnd();
  return s.dl.at !== null && s.dl.at > end ? s.dl : new Deadline(end, true);
}

/** SPEC §11: run `effect` at most once for `key`. */
export async function runOnce<R = unknown>(client: Client, key: string, request: unknown, effect: Effect<R>, options: RunOptions<R>): Promise<RunResult<R>> {
  const fp = options.fingerprint ?? computeFingerprint(request, options.fields);
  const binding: Binding = { principal: options.principal, scopes: options.scopes ?? [], generation: options.generation ?? 0 };
  const leaseMs = options.leaseMs ?? 30_000;
  const marksDispatch = options.marksDispatch ?? false;
  const dl = new Deadline(options.deadlineMs === undefined ? 30_000 : options.deadlineMs);
  const hookTimeoutMs = options.hookTimeoutMs ?? leaseMs;
  const step: Step = { client, key, fp, binding, leaseMs, marksDispatch, dl, hookTimeoutMs, serializer: options.serializer };
  for (;;) {
    // One claim: one claim_id, sent again only by the retries of this claim
    // (its answer was lost: the ledger answers with the same grant).
    const claimId = newClaimId();
    const clock: LeaseClock = { renewedAt: Date.now() };
    const dec = await retrying(
      () =>
        client.claim(key, fp, binding, {
          leaseMs,
          marksDispatch,
          claimId,
          ...(options.worker !== undefined ? { worker: options.worker } : {}),
          ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
        }),
      dl,
      'claim',
    );
    if (dec.decision === 'replay') {
      const outcome = dec.outcome as Outcome<R>;
      const result = options.onReplay ? await options.onReplay(outcome, dec.receipt) : (outcome.result as R);
      return { result, outcome, receipt: dec.receipt, replayed: true, fence: null, reconciled: false };
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
        options.reconcile === 'resend' ? await resendStep(step, grant, effect, clock) : await reconcileStep<R>(step, grant, options.reconcile, clock);
      if ('outcome' in found) return found as RunResult<R>;
      grant = found;
    }
    return executeStep(step, grant, effect, clock);
  }
}

/** Hands a reconcile lease back (the record stays `unknown`); a failure to
 * do so leaves the lease to lapse, with the same effect. */
async function handBackReconcile(s: Step, fence: number, hb: Heartbeat): Promise<void> {
  try {
    await retrying(() => s.client.reconcile(s.key, fence, 'unavailable'), cleanupDeadline(s, hb), 'reconcile');
  } catch {
    // the reconcile lease lapses: the record stays unknown all the same
  }
}

async function reconcileStep<R>(s: Step, grant: Grant, hook: ReconcileHook<R> | undefined, clock: LeaseClock): Promise<RunResult<R> | Grant> {
  const { client, key, fp, binding, leaseMs } = s;
  const fence = grant.fence;
  const hb = startHeartbeat(client, key, fence, leaseMs, new AbortController(), clock);
  try {
    let finding: Finding<R>;
    try {
      finding = hook ? await askHook((signal) => hook(key, fence, { signal }), s.hookTimeoutMs) : 'unavailable';
    } catch (e) {
      // A hook that throws or runs past hookTimeoutMs cannot tell: unavailable.
      await handBackReconcile(s, fence, hb);
      throw new OutcomeUnknown(key, null, e);
    }
    if (typeof finding === 'object' && finding !== null) {
      let outcome: Outcome<R>;
      try {
        outcome = doneToOutcome(finding, s.serializer);
      } catch (e) {
        await handBackReconcile(s, fence, hb);
        throw e;
      }
      let r: unknown;
      try {
        r = await retrying(() => client.reconcile(key, fence, 'committed', { fingerprint: fp, binding, outcome }), callDeadline(s), 'reconcile');
      } catch (e) {
        if (e instanceof InvalidRequest) {
          await handBackReconcile(s, fence, hb); // refused 422 (a result over max_result_bytes): it stays unknown
          throw new OutcomeUnknown(key, null, e, outcome);
        }
        if (e instanceof DeadlineExceeded) throw new OutcomeUnknown(key, null, e, outcome);
        throw e;
      }
      return { result: outcome.result as R, outcome, receipt: r as Receipt, replayed: false, fence, reconciled: true };
    }
    if (finding === 'not_committed') {
      return (await retrying(() => client.reconcile(key, fence, 'not_committed'), callDeadline(s), 'reconcile')) as Grant;
    }
    await handBackReconcile(s, fence, hb);
    throw new ReconcileRequired(key, fence, hook ? 'the reconcile hook could not tell (unavailable)' : 'no reconcile hook was given');
  } finally {
    hb.stop();
  }
}

/** SPEC §11.9: the effect again, with the same key, under the reconcile
 * lease (the remote de-duplicates by the key); its dispatch() is a local
 * no-op. Success → committed; any failure → unavailable. */
async function resendStep<R>(s: Step, grant: Grant, effect: Effect<R>, clock: LeaseClock): Promise<RunResult<R>> {
  const { client, key, fp, binding, leaseMs } = s;
  const ac = new AbortController();
  const hb = startHeartbeat(client, key, grant.fence, leaseMs, ac, clock);
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
      await handBackReconcile(s, grant.fence, hb);
      throw new ReconcileRequired(key, grant.fence, `the resend failed: ${messageOf(e)}`, { cause: e });
    }
    const r = await retrying(() => client.reconcile(key, grant.fence, 'committed', { fingerprint: fp, binding, outcome }), callDeadline(s), 'reconcile');
    return { result: outcome.result as R, outcome, receipt: r as Receipt, replayed: false, fence: grant.fence, reconciled: true };
  } finally {
    hb.stop();
  }
}

/** Where a run's ctx.dispatch() stood when the effect ended. */
type DispatchState = { s: 'none' } | { s: 'pending' } | { s: 'done' } | { s: 'failed'; error: unknown };

/** How a lease was handed back: released, or settled `unknown` (with its
 * receipt, or null when even that failed and the lease lapses: `unknown`). */
type HandedBack = { released: true } | { released: false; receipt: unknown };

async function executeStep<R>(s: Step, grant: Grant, effect: Effect<R>, clock: LeaseClock): Promise<RunResult<R>> {
  const { client, key, fp, binding, leaseMs, marksDispatch } = s;
  const fence = grant.fence;
  const lost = new AbortController(); // the lease was lost (a heartbeat was refused)
  // The run is over: a dispatch() still retrying stops. Made by the first
  // dispatch() that goes to the ledger (most runs never need one).
  let over: AbortController | undefined;
  let dispatch: DispatchState = { s: 'none' };
  let dispatching: Promise<void> | null = null;
  const ctx: EffectContext = {
    key,
    fence,
    attempt: grant.attempt,
    signal: lost.signal,
    get dispatched() {
      return dispatch.s === 'done';
    },
    dispatch() {
      if (!marksDispatch || dispatch.s === 'done') {
        dispatch = { s: 'done' };
        return Promise.resolve();
      }
      if (dispatch.s === 'pending' && dispatching) return dispatching;
      dispatch = { s: 'pending' };
      // A dispatch whose answer was lost is retried under the same fence
      // (the ledger answers a repeated dispatch alike).
      over ??= new AbortController();
      const p = retrying(() => client.dispatch(key, fence), callDeadline(s), 'dispatch', over.signal).then(
        () => {
          dispatch = { s: 'done' };
        },
        (e: unknown) => {
          dispatch = { s: 'failed', error: e };
          throw e;
        },
      );
      p.catch(() => {}); // a dispatch() the effect does not await never becomes an unhandled rejection
      dispatching = p;
      return p;
    },
  };
  const hb = startHeartbeat(client, key, fence, leaseMs, lost, clock);

  /** The settle of `unknown` that hands the lease back; null when it could not be done (the lease lapses: `unknown`). */
  const settleUnknown = async (outcome: Outcome, sdl: Deadline): Promise<unknown> => {
    try {
      return await retrying(() => client.settle(key, fence, fp, binding, outcome), sdl, 'settle');
    } catch {
      return null;
    }
  };

  /** Releases the lease; `callerWord`: the effect itself said nothing was
   * applied (EffectNotSent / EffectRefused), which alone allows
   * `not_committed` after the ledger refused `not_dispatched`. */
  const handBack = async (reason: 'not_dispatched' | 'not_committed', callerWord: boolean, cause: unknown, nothingMarked: boolean): Promise<HandedBack> => {
    const sdl = cleanupDeadline(s, hb);
    try {
      await retrying(() => client.release(key, fence, reason), sdl, 'release');
      return { released: true };
    } catch (e) {
      if (e instanceof ReceiptRequired && reason === 'not_dispatched' && callerWord) {
        // The ledger recorded the mark; the caller attests nothing was applied.
        return handBackNotCommitted(cause, sdl);
      }
      if (e instanceof ReceiptRequired || e instanceof InvalidRequest) {
        // receipt_required: the ledger recorded the dispatch mark, so what
        // happened is unknown (never inferred: SPEC §11.11); invalid_request:
        // a server without release(not_committed). The safe record: unknown.
        return { released: false, receipt: await settleUnknown(unknownOutcome(cause), sdl) };
      }
      // No answer up to the lease's end, or the lease ended otherwise: it
      // lapses. With marksDispatch and nothing marked, nothing changes.
      return nothingMarked ? { released: true } : { released: false, receipt: null };
    }
  };
  const handBackNotCommitted = async (cause: unknown, sdl: Deadline): Promise<HandedBack> => {
    try {
      await retrying(() => client.release(key, fence, 'not_committed'), sdl, 'release');
      return { released: true };
    } catch (e) {
      if (e instanceof InvalidRequest) return { released: false, receipt: await settleUnknown(unknownOutcome(cause), sdl) };
      return { released: false, receipt: null };
    }
  };

  /** The effect threw `e` (or its result cannot be stored): SPEC §11.8, §11.11. */
  const failed = async (e: unknown): Promise<never> => {
    const d = dispatch; // where ctx.dispatch() stood when the effect ended
    if (d.s === 'pending') over?.abort(new Error('the run is over')); // called and not awaited: the boundary is crossed
    if (d.s === 'failed' && isRefusal(d.error)) throw e; // the ledger refused the mark: the lease is not ours (lease_expired, stale_fence)
    const nothingMarked = marksDispatch && d.s === 'none';
    if (e instanceof EffectNotSent || e instanceof EffectRefused) {
      const reason = e instanceof EffectNotSent && marksDispatch && d.s !== 'done' ? 'not_dispatched' : 'not_committed';
      const r = await handBack(reason, true, e, nothingMarked);
      if (!r.released) throw new OutcomeUnknown(key, r.receipt, e);
      throw e;
    }
    if (marksDispatch && (d.s === 'none' || d.s === 'failed')) {
      // Before the mark (nothing could have been sent), or the mark's call
      // failed: release not_dispatched and let the ledger decide.
      const r = await handBack('not_dispatched', false, e, nothingMarked);
      if (!r.released) throw new OutcomeUnknown(key, r.receipt, e);
      if (d.s === 'failed' && e === d.error) {
        throw new EffectNotSent(`ctx.dispatch() did not reach settle (${messageOf(e)}); the lease was released not_dispatched: nothing was sent`, { cause: e });
      }
      throw e;
    }
    // After the boundary (or without marksDispatch): unknown.
    throw new OutcomeUnknown(key, await settleUnknown(unknownOutcome(e), cleanupDeadline(s, hb)), e);
  };

  try {
    let outcome: Outcome<R>;
    try {
      outcome = doneToOutcome(await effect(ctx), s.serializer);
    } catch (e) {
      return await failed(e);
    }
    if ((dispatch as DispatchState).s === 'pending') over?.abort(new Error('the run is over')); // not awaited: crossed
    let receipt: Receipt;
    try {
      receipt = await retrying(() => client.settle(key, fence, fp, binding, outcome), callDeadline(s), 'settle');
    } catch (e) {
      if (e instanceof InvalidRequest) {
        // Refused 422 (e.g. a result over max_result_bytes): settled unknown at once, with that error.
        const r = await settleUnknown({ status: 'unknown', error: clip(`the outcome could not be recorded: ${e.message}`) }, cleanupDeadline(s, hb));
        throw new OutcomeUnknown(key, r, e, outcome);
      }
      // Unanswered until the deadline: the lease lapses → unknown (or the
      // receipt, if a settle whose answer was lost was applied).
      if (e instanceof DeadlineExceeded) throw new OutcomeUnknown(key, null, e, outcome);
      throw e;
    }
    return { result: outcome.result as R, outcome, receipt, replayed: false, fence, reconciled: false };
  } finally {
    hb.stop();
    if (over && !over.signal.aborted) over.abort(new Error('the run is over'));
  }
}

/** The options of makeIdempotent: every option runOnce takes, and how to
 * get the key (and the fingerprinted request) from the arguments. */
export interface IdempotentOptions<A extends unknown[], R = unknown> {
  /** The client, or a function that returns it, called on every run
   * (`client: () => app.ledger`): a module-level function then uses the
   * ledger current at the call, e.g. a test's. */
  client: Client | (() => Client);
  /** The operation's key, from the arguments: the same on every retry of the same logical call. */
  key: (...args: A) => string;
  principal: string;
  scopes?: readonly string[];
  generation?: number;
  marksDispatch?: boolean;
  reconcile?: ReconcileHook<R> | 'resend';
  hookTimeoutMs?: number;
  leaseMs?: number;
  retentionS?: number;
  deadlineMs?: number | null;
  serializer?: Serializer;
  worker?: string;
  /** The value fingerprinted (default: the arguments, as a JSON array). */
  request?: (...args: A) => unknown;
  /** JSON pointers into the request: fingerprint only these. */
  fields?: readonly string[];
  /** Called on every replay; its answer is the call's value (see RunOptions.onReplay). */
  onReplay?: (outcome: Outcome<R>, receipt: Receipt) => R | Promise<R>;
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
      typeof client === 'function' ? client() : client,
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
    return produced && !r.replayed && !r.reconciled ? (produced as { value: R }).value : r.result;
  }) as IdempotentFunction<A, R>;
  wrapped.run = async (...args: A) => (await run(args)).r;
  return wrapped;
}

export { Deadline, SettleError };
