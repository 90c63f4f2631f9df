// The Reconciler of SPEC §11.10: resolves records left `unknown` (reconcile
// required) by workers that died or lost their answer, with the same
// reconcile hooks runOnce takes, chosen by key prefix. It never runs an
// effect (it does not hold the requests): it only asks the hooks.
//
//   const r = new Reconciler(client, { hooks: { 'charge-': async (key, fence) => ... } });
//   await r.sweep();          // → { seen, committed, not_committed, unavailable, skipped, errors }
//   r.start(60_000);          // or every minute in the background; r.counts; await r.stop(5_000)
//
// A hook runs with its reconcile lease heartbeated and is bounded by
// hookTimeoutMs; one that throws or runs past it counts under `errors`, the
// record is handed back with reconcile(unavailable), and the sweep goes on.
// A hook registered as `{ middleware: true, hook }` resolves records of the
// Idempotency-Key middleware (`mw-` keys) from the client's key and
// principal, parsed from the claim's `worker` field (SPEC §8), and its
// committed finding is a response, stored as the middleware stores one: a
// later retry through the middleware replays it.
import type { Client } from './client.js';
import { HookTimeout, NotFound } from './errors.js';
import type { Logger } from './express.js';
import { newClaimId } from './jcs.js';
import {
  DEFAULT_MAX_STORED_BODY,
  DEFAULT_STORED_HEADERS,
  encodeResponse,
  foundResponse,
  parseWorkerLabel,
  type MiddlewareFinding,
} from './mwcore.js';
import type { Binding, Grant, OperationRecord, Outcome } from './types.js';
import { Deadline, askHook, doneToOutcome, retrying, startHeartbeat, type Finding, type LeaseClock, type ReconcileHook, type Serializer } from './worker.js';

/** What a sweep did, record by record: every record listed is `seen` and
 * counted once more under what became of it. */
export interface ReconcileCounts {
  seen: number;
  /** The hook found the effect applied: its outcome was recorded. */
  committed: number;
  /** The hook found the effect not applied: the record's next claim executes. */
  not_committed: number;
  /** The hook could not tell: the record stays `unknown`. */
  unavailable: number;
  /** Resolved meanwhile, running, or released at once (an execute grant). */
  skipped: number;
  /** A ledger call or the hook failed (threw, or ran past hookTimeoutMs):
   * the record stays `unknown`. */
  errors: number;
}

/** What a middleware hook learns of a record of the Idempotency-Key
 * middleware, from the `worker` field of its claims (SPEC §8). */
export interface MiddlewareRecordInfo {
  /** The Idempotency-Key value the client sent; null when the record's
   * claims carry no middleware `worker` field (written by an older SDK). */
  idempotencyKey: string | null;
  /** The principal the middleware's extractor gave; null as above. */
  principal: string | null;
  /** The `worker` field it was parsed from. */
  worker: string | null;
  /** Aborted when the hook ran past hookTimeoutMs, or stop() gave up waiting. */
  signal: AbortSignal;
}

/** A hook for middleware records: the ledger key, the reconcile lease's
 * fence and what the record says of the client's request → what the
 * middleware's reconcile hook answers: `{ finding: 'committed', response }`
 * (stored as the middleware stores a response, and replayed to the
 * client's retry), 'not_committed' or 'unavailable'. */
export type MiddlewareRecordHook = (ledgerKey: string, fence: number, info: MiddlewareRecordInfo) => Promise<MiddlewareFinding> | MiddlewareFinding;

/** A hook registered for records of the Idempotency-Key middleware. */
export interface MiddlewareHookEntry {
  middleware: true;
  hook: MiddlewareRecordHook;
  /** Response headers stored besides content-type and location (as the middleware's `storedHeaders`). */
  storedHeaders?: string[];
  /** A found response's body above this is stored by its digest only (as the middleware's `maxStoredBody`; default 32 KiB). */
  maxStoredBody?: number;
}

/** A hook of the Reconciler: runOnce's hook type, or one for middleware records. */
export type ReconcilerHook = ReconcileHook | MiddlewareHookEntry;

export interface ReconcilerOptions {
  /** Hook by key prefix (the longest matching prefix owns a key; `""`
   * covers every key): the hook type runOnce takes, or `{ middleware: true,
   * hook }` for records of the Idempotency-Key middleware (prefix `mw-`). */
  hooks: Readonly<Record<string, ReconcilerHook>>;
  /** One line per record resolved (default: warnings and errors to the console). */
  logger?: Logger;
  /** The reconcile lease (default 30 000 ms), heartbeated while a hook runs. */
  leaseMs?: number;
  /** A hook's time limit (default: leaseMs); past it, it counts under
   * `errors` and the record is handed back with reconcile(unavailable). */
  hookTimeoutMs?: number;
  /** Records per listing page (default 100). */
  pageSize?: number;
  /** The claims' `worker` label (default "settle-reconciler"); a record
   * whose claims carry the middleware's `worker` field keeps that one. */
  worker?: string;
  /** Encodes the values of a hook's result that are not JSON (as runOnce's option). */
  serializer?: Serializer;
}

type Kind = Exclude<keyof ReconcileCounts, 'seen'>;

const zero = (): ReconcileCounts => ({ seen: 0, committed: 0, not_committed: 0, unavailable: 0, skipped: 0, errors: 0 });
const defaultLogger: Logger = { info: () => {}, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };

/** The newest middleware `worker` field of the record's claims (SPEC §8:
 * reconcile claims copy it, so it survives the 32-attempt bound). */
function middlewareWorker(rec: OperationRecord): string | null {
  const fields: unknown[] = [(rec.lease as { worker?: unknown } | null)?.worker];
  for (let i = rec.attempts.length - 1; i >= 0; i--) fields.push((rec.attempts[i] as { lease?: { worker?: unknown } }).lease?.worker);
  for (const w of fields) if (parseWorkerLabel(w)) return w as string;
  return null;
}

function isMiddlewareEntry(h: ReconcilerHook): h is MiddlewareHookEntry {
  return typeof h === 'object' && h !== null && (h as MiddlewareHookEntry).middleware === true;
}

/** A sleep that an abort of `signal` ends early (resolving). */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/** The background loop: `stopping` ends it after the sweep under way (and
 * wakes its pause); `abort` also ends that sweep (stop's timeout). */
interface Loop {
  stopping: AbortController;
  abort: AbortController;
  done: Promise<void>;
}

export class Reconciler {
  /** Totals over every sweep since construction (the metrics of the background mode). */
  readonly counts: ReconcileCounts = zero();
  /** Sweeps finished. */
  sweeps = 0;
  /** The counts of the last finished sweep. */
  lastSweep: ReconcileCounts | null = null;
  private readonly client: Client;
  private readonly hooks: Readonly<Record<string, ReconcilerHook>>;
  private readonly prefixes: string[];
  private readonly log: Logger;
  private readonly leaseMs: number;
  private readonly hookTimeoutMs: number;
  private readonly pageSize: number;
  private readonly worker: string;
  private readonly serializer: Serializer | undefined;
  private loop: Loop | null = null;

  constructor(client: Client, options: ReconcilerOptions) {
    if (!client) throw new TypeError('new Reconciler(client, { hooks }) needs a settle Client');
    if (!options || !options.hooks || typeof options.hooks !== 'object') throw new TypeError('new Reconciler(client, { hooks: { [keyPrefix]: hook } })');
    for (const [p, h] of Object.entries(options.hooks)) {
      if (isMiddlewareEntry(h)) {
        if (typeof h.hook !== 'function') throw new TypeError(`the middleware hook of prefix ${JSON.stringify(p)} needs hook: (ledgerKey, fence, info) => finding`);
      } else if (typeof h !== 'function') {
        throw new TypeError(`the hook of prefix ${JSON.stringify(p)} must be a function (key, fence) => finding, or { middleware: true, hook }`);
      }
    }
    this.client = client;
    this.hooks = options.hooks;
    this.prefixes = Object.keys(options.hooks);
    this.log = options.logger ?? defaultLogger;
    this.leaseMs = options.leaseMs ?? 30_000;
    this.hookTimeoutMs = options.hookTimeoutMs ?? this.leaseMs;
    if (!(this.hookTimeoutMs > 0)) throw new RangeError('new Reconciler(client, { hookTimeoutMs }): must be > 0');
    this.pageSize = options.pageSize ?? 100;
    this.worker = options.worker ?? 'settle-reconciler';
    this.serializer = options.serializer;
  }

  /** The prefix whose hook owns `key`: the longest that matches. */
  private owner(key: string): string | null {
    let best: string | null = null;
    for (const p of this.prefixes) if (key.startsWith(p) && (best === null || p.length > best.length)) best = p;
    return best;
  }

  /** One pass over every prefix's records that need reconciliation. Never
   * rejects: a failure is counted under `errors` and logged. */
  sweep(): Promise<ReconcileCounts> {
    return this.sweepUntil(new AbortController().signal);
  }

  private async sweepUntil(signal: AbortSignal): Promise<ReconcileCounts> {
    const c = zero();
    for (const prefix of this.prefixes) {
      if (signal.aborted) break;
      const hook = this.hooks[prefix] as ReconcilerHook;
      let after: string | undefined;
      do {
        let page;
        try {
          page = await retrying(
            () =>
              this.client.list({
                reconcileRequired: true,
                // "" covers every key: the listing is asked without key_prefix.
                ...(prefix !== '' ? { keyPrefix: prefix } : {}),
                limit: this.pageSize,
                ...(after !== undefined ? { after } : {}),
              }),
            new Deadline(this.leaseMs),
            'list',
            signal,
          );
        } catch (e) {
          if (signal.aborted) break;
          c.errors++;
          this.log.error(`reconciler: listing the records of prefix ${JSON.stringify(prefix)} failed`, e);
          break;
        }
        for (const op of page.operations) {
          if (signal.aborted) break;
          if (this.owner(op.key) !== prefix) continue; // a longer prefix's hook owns it
          c.seen++;
          c[await this.one(op.key, hook, signal)]++;
        }
        after = page.next ?? undefined;
      } while (after !== undefined && !signal.aborted);
    }
    for (const k of Object.keys(c) as (keyof ReconcileCounts)[]) this.counts[k] += c[k];
    this.sweeps++;
    this.lastSweep = c;
    return c;
  }

  private async one(key: string, hook: ReconcilerHook, signal: AbortSignal): Promise<Kind> {
    const { client, leaseMs } = this;
    const dl = () => new Deadline(leaseMs);
    let fence: number | null = null;
    try {
      const rec = await retrying(() => client.get(key), dl(), 'get', signal);
      if (!rec.reconcileRequired) {
        this.log.info(`reconciler: ${key} skipped (resolved meanwhile)`);
        return 'skipped';
      }
      const { fingerprint, principal, scopes } = rec.reservation;
      const generation = await retrying(() => client.principal(principal), dl(), 'principal', signal);
      const binding: Binding = { principal, scopes, generation };
      const mwWorker = middlewareWorker(rec);
      // One claim_id: a retry of a claim whose answer was lost gets the same grant (SPEC §4 rule 5a).
      const claimId = newClaimId();
      const clock: LeaseClock = { renewedAt: Date.now() };
      const dec = await retrying(
        () => client.claim(key, fingerprint, binding, { marksDispatch: true, leaseMs, worker: mwWorker ?? this.worker, claimId }),
        dl(),
        'claim',
        signal,
      );
      if (dec.decision === 'execute') {
        // Someone resolved it meanwhile: this lease never dispatched.
        await retrying(() => client.release(key, dec.fence, 'not_dispatched'), dl(), 'release');
        this.log.info(`reconciler: ${key} skipped (resolved meanwhile; execute lease ${dec.fence} released)`);
        return 'skipped';
      }
      if (dec.decision !== 'reconcile') {
        this.log.info(`reconciler: ${key} skipped (${dec.decision})`);
        return 'skipped';
      }
      fence = dec.fence;
      const f = fence;
      const hb = startHeartbeat(client, key, f, leaseMs, new AbortController(), clock);
      // The calls that hand the lease back retry up to the lease's end.
      const cleanup = () => new Deadline(Math.max(hb.leaseEnd(), Date.now() + 1000), true);
      const unavailable = () => retrying(() => client.reconcile(key, f, 'unavailable'), cleanup(), 'reconcile');
      try {
        let outcome: Outcome;
        let finding: Finding | 'committed';
        try {
          if (isMiddlewareEntry(hook)) {
            const parsed = parseWorkerLabel(mwWorker);
            const found: MiddlewareFinding = await askHook(
              (s) => hook.hook(key, f, { idempotencyKey: parsed?.idempotencyKey ?? null, principal: parsed?.principal ?? null, worker: mwWorker, signal: s }),
              this.hookTimeoutMs,
              signal,
            );
            finding = typeof found === 'object' && found !== null && found.finding === 'committed' ? 'committed' : (found as Finding);
            outcome = finding === 'committed' ? this.storedResponse(found as { finding: 'committed'; response: unknown }, hook) : ({} as Outcome);
          } else {
            const found = await askHook((s) => hook(key, f, { signal: s }), this.hookTimeoutMs, signal);
            finding = typeof found === 'object' && found !== null ? 'committed' : found;
            outcome = finding === 'committed' ? doneToOutcome(found as Exclude<Finding, string>, this.serializer) : ({} as Outcome);
          }
        } catch (e) {
          await unavailable().catch((e2) => this.log.warn(`reconciler: reconcile(unavailable) of ${key} failed: ${String(e2)}`));
          const why = e instanceof HookTimeout ? 'ran past hookTimeoutMs' : signal.aborted ? 'was abandoned by stop()' : 'failed';
          this.log.error(`reconciler: the hook ${why} for ${key} (fence ${f}); it stays unknown`, e);
          return 'errors';
        }
        if (finding === 'committed') {
          await retrying(() => client.reconcile(key, f, 'committed', { fingerprint, binding, outcome }), dl(), 'reconcile');
          this.log.info(`reconciler: ${key} committed (fence ${f}, ${outcome.status})`);
          return 'committed';
        }
        if (finding === 'not_committed') {
          const g = (await retrying(() => client.reconcile(key, f, 'not_committed'), dl(), 'reconcile')) as Grant;
          // The execute lease it is handed never dispatched: the next claim executes.
          await retrying(() => client.release(key, g.fence, 'not_dispatched'), cleanup(), 'release');
          this.log.info(`reconciler: ${key} not_committed (fence ${f}); the next run executes`);
          return 'not_committed';
        }
        if (finding !== 'unavailable') this.log.error(`reconciler: the hook for ${key} returned ${JSON.stringify(finding)}; taken as unavailable`);
        await unavailable();
        this.log.info(`reconciler: ${key} unavailable (fence ${f}); it stays unknown`);
        return 'unavailable';
      } finally {
        hb.stop();
      }
    } catch (e) {
      if (e instanceof NotFound && fence === null) {
        this.log.info(`reconciler: ${key} skipped (collected meanwhile)`);
        return 'skipped';
      }
      this.log.error(`reconciler: ${key}${fence === null ? '' : ` (fence ${fence})`} failed; it stays as it was`, e);
      return 'errors';
    }
  }

  /** A middleware hook's committed response, as the middleware stores one. */
  private storedResponse(found: { response: unknown }, entry: MiddlewareHookEntry): Outcome {
    const r = foundResponse(found.response as Parameters<typeof foundResponse>[0]);
    const names = [...new Set([...DEFAULT_STORED_HEADERS, ...(entry.storedHeaders ?? []).map((h) => h.toLowerCase())])];
    const { result, responseSha256 } = encodeResponse(r.status, r.headers, r.body, names, entry.maxStoredBody ?? DEFAULT_MAX_STORED_BODY);
    return { status: r.status >= 500 ? 'failed' : 'completed', result, responseSha256 };
  }

  /** Whether the background mode runs: from start() until its loop ended
   * (after stop(), once the sweep under way wound down). */
  get running(): boolean {
    return this.loop !== null;
  }

  /** Sweeps now and then every `intervalMs` after each sweep ends, until
   * stop(). Throws while a loop runs, also one that stop() gave up waiting
   * for and that is still winding down. */
  start(intervalMs: number): void {
    if (!(intervalMs > 0)) throw new RangeError('start(intervalMs): intervalMs must be positive');
    if (this.loop) throw new Error('the reconciler is already running (a loop stopped with a timeout may still be winding down)');
    const loop: Loop = { stopping: new AbortController(), abort: new AbortController(), done: Promise.resolve() };
    const run = async () => {
      while (!loop.stopping.signal.aborted) {
        try {
          await this.sweepUntil(loop.abort.signal);
        } catch (e) {
          this.log.error('reconciler: sweep failed', e);
        }
        await pause(intervalMs, loop.stopping.signal);
      }
    };
    this.loop = loop;
    loop.done = run().finally(() => {
      if (this.loop === loop) this.loop = null;
    });
  }

  /** Stops the background mode. Resolves true once the sweep under way (if
   * any) ended, or, after `timeoutMs`, false: that sweep is then abandoned
   * (a hook still running is handed back with reconcile(unavailable) in the
   * background and counted under `errors`) and start() keeps refusing until
   * it wound down. Without a timeout, waits for the sweep to end. */
  async stop(timeoutMs?: number): Promise<boolean> {
    const loop = this.loop;
    if (!loop) return true;
    loop.stopping.abort();
    if (timeoutMs === undefined) {
      await loop.done;
      return true;
    }
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), Math.max(0, timeoutMs))));
    const ended = await Promise.race([loop.done.then(() => true), timedOut]);
    clearTimeout(timer);
    if (!ended) {
      loop.abort.abort(new Error('stop(): the sweep was abandoned at its timeout'));
      this.log.warn(`reconciler: stop(${timeoutMs}) gave up waiting for the sweep under way; it is abandoned`);
    }
    return ended;
  }
}
