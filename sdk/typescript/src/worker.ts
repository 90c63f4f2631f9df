// The worker client contract of SPEC §11: runOnce.
//
// claim (the same key on every retry), then:
// - replay: the stored outcome, replayed = true, the effect is not called (§11.6);
// - in_flight: wait retry_after_ms with jitter and claim again, until the deadline (§11.5);
// - reconcile: ask the caller's hook and report its finding; not_committed
//   continues as execute under the same fence; without a hook, ReconcileRequired (§11.4);
// - execute: heartbeat at a third of leaseMs, call effect(ctx) (ctx.key and
//   ctx.fence go to the remote; ctx.dispatch() before the remote write with
//   marksDispatch), settle, retrying a settle that got no answer under the
//   same fence until it answers (§11.3).
// Refusals throw typed errors and are never retried (§11.7); 503 and
// transport errors back off and retry until the deadline.
import type { Client } from './client.js';
import {
  DeadlineExceeded,
  EffectNotSent,
  EffectRefused,
  InvalidRequest,
  OutcomeUnknown,
  ReceiptRequired,
  ReconcileRequired,
  SettleError,
  TransportError,
  Unavailable,
} from './errors.js';
import { canonicalize, fingerprint as computeFingerprint, sha256Hex } from './jcs.js';
import type { Binding, Grant, Outcome, Receipt } from './types.js';

/** What an effect (or a reconcile hook that found the effect applied) returns. */
export interface Done {
  result: unknown;
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
  /** Record the commit boundary before the remote write (required with marksDispatch). */
  dispatch(): Promise<void>;
  readonly dispatched: boolean;
}

export type Effect<_R = unknown> = (ctx: EffectContext) => Promise<Done> | Done;
export type Finding = Done | 'not_committed' | 'unavailable';
export type ReconcileHook = (key: string, fence: number) => Promise<Finding> | Finding;

export interface RunOptions {
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
  reconcile?: ReconcileHook;
}

export interface RunResult {
  outcome: Outcome;
  receipt: Receipt;
  /** Stored before this run; the effect was not called. */
  replayed: boolean;
  fence: number | null;
  /** The reconcile hook found the effect applied and recorded it. */
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

function backoffMs(n: number, e: unknown): number {
  const base = Math.min(1000, 50 * 2 ** Math.min(n, 10));
  let wait = base / 2 + (Math.random() * base) / 2;
  if (e instanceof Unavailable && e.retryAfterS) wait = Math.max(wait, Math.min(e.retryAfterS, 5) * 1000);
  return wait;
}

/** Retry `fn` on 503 `unavailable` and transport errors until the deadline. */
export async function retrying<T>(fn: () => Promise<T>, deadline: Deadline, what: string): Promise<T> {
  for (let n = 0; ; n++) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof TransportError || e instanceof Unavailable)) throw e;
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
      if (!(e instanceof TransportError || e instanceof Unavailable)) {
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

export function doneToOutcome(d: Done): Outcome {
  if (!d || typeof d !== 'object' || !('result' in d)) throw new TypeError('the effect must return { result, response?, failed? }');
  const canonical = canonicalize(d.result); // validates the result before anything is stored
  const raw = d.response ?? canonical;
  return { status: d.failed ? 'failed' : 'completed', result: d.result, responseSha256: sha256Hex(raw) };
}

const UNKNOWN: Outcome = { status: 'unknown', error: 'the effect failed after it may have reached the remote' };

/** SPEC §11: run `effect` at most once for `key`. */
export async function runOnce(client: Client, key: string, request: unknown, effect: Effect, options: RunOptions): Promise<RunResult> {
  const fp = options.fingerprint ?? computeFingerprint(request, options.fields);
  const binding: Binding = { principal: options.principal, scopes: options.scopes ?? [], generation: options.generation ?? 0 };
  const leaseMs = options.leaseMs ?? 30_000;
  const marksDispatch = options.marksDispatch ?? false;
  const dl = new Deadline(options.deadlineMs === undefined ? 30_000 : options.deadlineMs);
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
      return { outcome: dec.outcome, receipt: dec.receipt, replayed: true, fence: null, reconciled: false };
    }
    if (dec.decision === 'in_flight') {
      const wait = dec.retryAfterMs * (1 + Math.random() * 0.25); // at or above the server's hint
      if (dl.left() < wait) throw new DeadlineExceeded(`operation ${JSON.stringify(key)} still in flight at the deadline`);
      await sleep(wait);
      continue;
    }
    let grant: Grant = dec;
    if (grant.decision === 'reconcile') {
      const found = await reconcileStep(client, key, grant, fp, binding, leaseMs, dl, options.reconcile);
      if ('outcome' in found) return found;
      grant = found;
    }
    return executeStep(client, key, grant, fp, binding, leaseMs, marksDispatch, dl, effect);
  }
}

async function reconcileStep(
  client: Client,
  key: string,
  grant: Grant,
  fp: string,
  binding: Binding,
  leaseMs: number,
  dl: Deadline,
  hook: ReconcileHook | undefined,
): Promise<RunResult | Grant> {
  const ac = new AbortController();
  const stop = startHeartbeat(client, key, grant.fence, leaseMs, ac);
  const sdl = settleDeadline(dl, leaseMs);
  try {
    let finding: Finding;
    try {
      finding = hook ? await hook(key, grant.fence) : 'unavailable';
    } catch (e) {
      await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile');
      throw e;
    }
    if (typeof finding === 'object') {
      const outcome = doneToOutcome(finding);
      const r = await retrying(
        () => client.reconcile(key, grant.fence, 'committed', { fingerprint: fp, binding, outcome }),
        sdl,
        'reconcile',
      );
      return { outcome, receipt: r as Receipt, replayed: false, fence: grant.fence, reconciled: true };
    }
    if (finding === 'not_committed') {
      return (await retrying(() => client.reconcile(key, grant.fence, 'not_committed'), sdl, 'reconcile')) as Grant;
    }
    await retrying(() => client.reconcile(key, grant.fence, 'unavailable'), sdl, 'reconcile');
    throw new ReconcileRequired(key, grant.fence);
  } finally {
    stop();
  }
}

async function release(client: Client, key: string, fence: number, reason: 'not_dispatched' | 'not_committed', fp: string, binding: Binding, dl: Deadline) {
  try {
    await retrying(() => client.release(key, fence, reason), dl, 'release');
  } catch (e) {
    // not_dispatched refused (dispatch was recorded), or a server without
    // release(not_committed): the safe record is unknown.
    if (!(e instanceof ReceiptRequired || e instanceof InvalidRequest)) throw e;
    await retrying(() => client.settle(key, fence, fp, binding, UNKNOWN), dl, 'settle');
  }
}

async function executeStep(
  client: Client,
  key: string,
  grant: Grant,
  fp: string,
  binding: Binding,
  leaseMs: number,
  marksDispatch: boolean,
  dl: Deadline,
  effect: Effect,
): Promise<RunResult> {
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
      if (marksDispatch && !dispatched) await client.dispatch(key, grant.fence);
      dispatched = true;
    },
  };
  const stop = startHeartbeat(client, key, grant.fence, leaseMs, ac);
  const sdl = settleDeadline(dl, leaseMs);
  try {
    let outcome: Outcome;
    try {
      outcome = doneToOutcome(await effect(ctx));
    } catch (e) {
      if (e instanceof EffectNotSent) {
        await release(client, key, grant.fence, marksDispatch && !dispatched ? 'not_dispatched' : 'not_committed', fp, binding, sdl);
        throw e;
      }
      if (e instanceof EffectRefused) {
        await release(client, key, grant.fence, 'not_committed', fp, binding, sdl);
        throw e;
      }
      if (marksDispatch && !dispatched) {
        await release(client, key, grant.fence, 'not_dispatched', fp, binding, sdl); // nothing could have been sent
        throw e;
      }
      const receipt = await retrying(() => client.settle(key, grant.fence, fp, binding, UNKNOWN), sdl, 'settle');
      throw new OutcomeUnknown(key, receipt, e);
    }
    const receipt = await retrying(() => client.settle(key, grant.fence, fp, binding, outcome), sdl, 'settle');
    return { outcome, receipt, replayed: false, fence: grant.fence, reconciled: false };
  } finally {
    stop();
  }
}

export { Deadline, SettleError };
